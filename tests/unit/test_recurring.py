"""Recurring definitions and their occurrences, with an injected clock (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import drainer
from drainer.cron import iter_fire_times, next_fire_times
from drainer.errors import ConfigError
from drainer.job import Job
from drainer.recurring import (
    CATCH_UP_MAX,
    SCHEDULED_FOR_KEY,
    Definition,
    define,
    fire_times_before,
    next_fire,
    occurrence_times,
    sync_params,
)
from drainer.registry import Registry

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def next_times(d: Definition, now: datetime, n: int) -> list[datetime]:
    """The definition's next ``n`` fire times after ``now``, in UTC."""
    return [t.astimezone(UTC) for t in next_fire_times(d.spec, d.tz, now, n)]


def params(definition: Any, now: datetime) -> dict[str, Any]:
    [row] = sync_params([definition], [definition.queue], now)["definitions"].obj
    return dict(row)


# -- declaring ------------------------------------------------------------------------------------


def test_task_with_cron_declares_a_recurring_job_keyed_by_its_queue() -> None:
    reg = Registry()

    @reg.task("digest", cron="0 8 * * *", timezone="Europe/Berlin")
    def digest(job: Job) -> None: ...

    [definition] = reg.schedules.values()
    assert (definition.key, definition.queue, definition.timezone) == (
        "digest", "digest", "Europe/Berlin")
    assert reg.tasks["digest"].func is digest


def test_recurring_with_a_key_and_a_payload() -> None:
    reg = Registry()
    weekday = reg.recurring("digest", "0 8 * * mon-fri", key="weekday-digest",
                            payload={"kind": "short"}, timezone="Europe/Berlin")
    weekend = reg.recurring("digest", "0 10 * * sat,sun", key="weekend-digest")
    assert set(reg.schedules) == {"weekday-digest", "weekend-digest"}
    assert weekday.payload == {"kind": "short"} and weekend.timezone == "UTC"


def test_drainer_recurring_is_callable_after_the_module_is_imported() -> None:
    import drainer.recurring as module

    reg = Registry()
    assert drainer.recurring is module and callable(module)
    drainer.recurring("q", "@hourly", key="via-package", registry=reg)
    assert set(reg.schedules) == {"via-package"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "61 * * * *"}, "minute '61' is out of range"),
    ({"cron": "* * *"}, "5 fields"),
    ({"cron": "0 0 30 2 *"}, "never fires"),
    ({"cron": "@daily", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ({"cron": "@daily", "catch_up": "some"}, "catch_up must be one of latest, all, skip"),
    ({"cron": "@daily", "catch_up_max": 0}, "catch_up_max"),
    ({"cron": "@daily", "payload": {SCHEDULED_FOR_KEY: 1}}, "is drainer's"),
    ({"cron": "@daily", "payload": {"x": object()}}, "not JSON"),
])
def test_bad_definitions_are_refused_in_one_line(kwargs: dict[str, Any], message: str
                                                 ) -> None:
    cron = kwargs.pop("cron")
    with pytest.raises(ConfigError, match=message) as info:
        Registry().recurring("q", cron, **kwargs)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_a_key_used_twice_is_refused() -> None:
    reg = Registry()
    reg.task("digest", cron="0 8 * * *")(lambda job: None)
    with pytest.raises(ConfigError, match="recurring key 'digest' is used twice"):
        reg.recurring("digest", "0 9 * * *")
    with pytest.raises(ConfigError, match="invalid cron"):
        reg.task("other", cron="0 25 * * *")


def test_a_bad_definition_fails_the_app_import_with_exit_2(tmp_path: Any,
                                                          monkeypatch: Any) -> None:
    from drainer.app import load_app
    from drainer.registry import default_registry

    (tmp_path / "bad_recurring_app.py").write_text(
        "import drainer\ndrainer.recurring('q', '0 8 * * *', timezone='Nowhere/Town')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="Nowhere/Town") as info:
        load_app("bad_recurring_app")
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert not default_registry.schedules


# -- fire times and occurrences -------------------------------------------------------------------


def test_occurrence_is_keyed_by_definition_and_utc_fire_time() -> None:
    d = define("digest", "0 8 * * *", key="digest", timezone="Europe/Berlin",
               payload={"a": 1})
    row = params(d, utc(2026, 12, 1, 6, 0))
    assert row["next_at"] == "2026-12-01T07:00:00+00:00"
    assert row["next_payload"] == {"a": 1, "scheduled_for": "2026-12-01T08:00:00+01:00"}
    assert row["latest_at"] == "2026-11-30T07:00:00+00:00"
    job = Job(1, "digest", row["next_payload"], 1, 5, None)
    assert job.scheduled_for == datetime(2026, 12, 1, 8, tzinfo=BERLIN)
    assert Job(2, "x", {"scheduled_for": "soon"}, 1, 5, None).scheduled_for is None
    assert Job(3, "x", [1], 1, 5, None).scheduled_for is None


def test_spring_forward_gap_runs_once_when_the_clocks_jump() -> None:
    """Europe/Berlin, 29 March 2026: 02:00 CET -> 03:00 CEST; 02:30 does not exist."""
    d = define("q", "30 2 * * *", timezone="Europe/Berlin")
    row = params(d, utc(2026, 3, 28, 23, 0))
    assert row["next_at"] == "2026-03-29T01:00:00+00:00"  # 03:00 CEST, the jump
    assert row["next_payload"]["scheduled_for"] == "2026-03-29T03:00:00+02:00"
    after = next_times(d, utc(2026, 3, 28, 23, 0), 3)
    assert after == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30), utc(2026, 3, 31, 0, 30)]
    # looking back from later that day finds the same single occurrence
    assert d.latest_at(utc(2026, 3, 29, 12, 0)) == utc(2026, 3, 29, 1, 0)
    assert fire_times_before(d.spec, d.tz, utc(2026, 3, 30, 12, 0), 2) == after[:2]


def test_fall_back_repeat_runs_once_at_its_first_occurrence() -> None:
    """Europe/Berlin, 25 October 2026: 03:00 CEST -> 02:00 CET; 02:30 happens twice."""
    d = define("q", "30 2 * * *", timezone="Europe/Berlin")
    times = next_times(d, utc(2026, 10, 24, 12, 0), 3)
    assert times == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30),
                     utc(2026, 10, 27, 1, 30)]
    assert d.latest_at(utc(2026, 10, 25, 2, 0)) == utc(2026, 10, 25, 0, 30)
    assert d.payload_for(times[0])["scheduled_for"] == "2026-10-25T02:30:00+02:00"


def test_wildcard_hours_follow_the_clock_across_dst() -> None:
    hourly = define("q", "0 * * * *", timezone="Europe/Berlin")
    fall = next_times(hourly, utc(2026, 10, 24, 23, 30), 4)
    # 02:00 CEST and 02:00 CET are two instants an hour apart: two occurrences
    assert fall == [utc(2026, 10, 25, h) for h in (0, 1, 2, 3)]
    spring = next_times(hourly, utc(2026, 3, 28, 23, 30), 3)
    assert spring == [utc(2026, 3, 29, h) for h in (0, 1, 2)]  # 01:00 CET, 03:00, 04:00 CEST


@pytest.mark.parametrize("expr", ["*/7 * * * *", "30 2 * * *", "0 8 * * mon-fri",
                                  "15 1-3 * * *", "0 0 last * *", "0 3 1 * mon"])
@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/Havana", "UTC"])
def test_looking_back_finds_what_looking_forward_did(expr: str, zone: str) -> None:
    d = define("q", expr, timezone=zone)
    start = utc(2025, 9, 1, 0, 0)
    forward = []
    for t in iter_fire_times(d.spec, d.tz, start):
        if t > utc(2026, 11, 15):
            break
        forward.append(t.astimezone(UTC))
    for at in (utc(2026, 3, 29, 2, 10), utc(2026, 10, 25, 1, 45), utc(2026, 11, 1, 5, 0)):
        seen = [t for t in forward if t <= at]
        assert fire_times_before(d.spec, d.tz, at, 5) == seen[-5:], at


def test_next_fire_of_the_served_definitions() -> None:
    a, b = define("a", "0 * * * *"), define("b", "*/10 * * * *")
    now = utc(2026, 12, 1, 9, 1)
    assert next_fire([a, b], ["a", "b"], now) == utc(2026, 12, 1, 9, 10)
    assert next_fire([a, b], ["a"], now) == utc(2026, 12, 1, 10)
    assert next_fire([a, b], ["c"], now) is None


# -- what a sync sends ----------------------------------------------------------------------------


def test_sync_sends_only_the_served_queues_in_key_order() -> None:
    defs = [define("b", "@hourly", key="z"), define("a", "@hourly", key="y"),
            define("c", "@hourly", key="x")]
    sent = sync_params(defs, ["a", "b"], utc(2026, 12, 1))
    assert [r["key"] for r in sent["definitions"].obj] == ["y", "z"]
    assert sent["queues"] == ["a", "b"] and sent["missed"].obj == []


def test_catch_up_all_sends_the_latest_missed_fire_times_bounded() -> None:
    d = define("a", "*/5 * * * *", catch_up="all", catch_up_max=4)
    sent = sync_params([d], ["a"], utc(2026, 12, 1, 9, 31))["missed"].obj
    assert [m["at"] for m in sent] == [f"2026-12-01T09:{m}:00+00:00" for m in (15, 20, 25, 30)]
    assert sent[0]["payload"] == {"scheduled_for": "2026-12-01T09:15:00+00:00"}
    assert define("a", "@hourly", catch_up="all").catch_up_max == CATCH_UP_MAX


@pytest.mark.parametrize("policy", ["latest", "skip"])
def test_latest_and_skip_send_no_missed_list(policy: str) -> None:
    d = define("a", "*/5 * * * *", catch_up=policy)
    row = params(d, utc(2026, 12, 1, 9, 31))
    assert row["latest_at"] == "2026-12-01T09:30:00+00:00" and row["catch_up"] == policy
    assert sync_params([d], ["a"], utc(2026, 12, 1, 9, 31))["missed"].obj == []


def test_the_hash_changes_with_what_an_occurrence_holds() -> None:
    base = define("a", "0 8 * * *", payload={"v": 1})
    same = define("a", "0 8 * * *", payload={"v": 1}, catch_up="all")
    assert base.content_hash == same.content_hash  # the policy is not in the row
    for changed in (define("a", "0 8 * * *", payload={"v": 2}),
                    define("b", "0 8 * * *", key="a", payload={"v": 1}),
                    define("a", "0 8 * * *", payload={"v": 1}, priority=3),
                    define("a", "0 8 * * *", payload={"v": 1}, max_attempts=1),
                    define("a", "0 8 * * *", payload={"v": 1}, timezone="Europe/Berlin")):
        assert changed.content_hash != base.content_hash, changed


def test_the_clock_is_injected_not_read() -> None:
    d = define("a", "0 0 1 1 *")
    for now in (utc(2020, 6, 1), utc(2031, 12, 31, 23, 59)):
        row = params(d, now)
        assert datetime.fromisoformat(row["next_at"]) > now
        assert datetime.fromisoformat(row["latest_at"]) <= now
        assert datetime.fromisoformat(row["next_at"]) - datetime.fromisoformat(
            row["latest_at"]) <= timedelta(days=366)


def test_occurrence_times_of_the_served_definitions() -> None:
    defs = [define("a", "*/20 * * * *"), define("b", "0 * * * *"), define("c", "* * * * *")]
    start, end = utc(2026, 12, 1, 9, 0), utc(2026, 12, 1, 10, 0, 1)
    times = occurrence_times(defs, ["a", "b"], start, end)
    assert times == [utc(2026, 12, 1, 9, m).timestamp() for m in (20, 40)] + [
        utc(2026, 12, 1, 10).timestamp()]  # 10:00 once though two definitions fire
    assert len(occurrence_times(defs, ["c"], start, end, limit=7)) == 7
