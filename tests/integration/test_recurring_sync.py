"""The recurring_sync statement on the real database, with an injected clock."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from drainer import db
from drainer.recurring import Definition, SyncResult, define
from drainer.recurring import sync as recurring_sync
from drainer.settings import Settings

UTC = timezone.utc
T0 = datetime(2026, 12, 1, 9, 0, 30, tzinfo=UTC)  # a Tuesday


def sync(q: db.Queries, definitions: list[Definition], queues: list[str], now: datetime
         ) -> SyncResult:
    return recurring_sync(q, definitions, queues, now)


def _q(pg_url: str, settings: Settings) -> db.Queries:
    conn = psycopg.connect(pg_url, autocommit=True)
    return db.Queries(conn, settings.schema_name, settings.table)


def _rows(conn: psycopg.Connection[Any], settings: Settings) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL(
        "SELECT recurring_key, queue, status, scheduled_for, run_at, payload, dedup_key "
        "FROM {} WHERE recurring_key IS NOT NULL ORDER BY recurring_key, scheduled_for")
        .format(sql.Identifier(settings.schema_name, settings.table))).fetchall()


def _at(h: int, m: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 12, day, h, m, tzinfo=UTC)


def _finish(conn: psycopg.Connection[Any], settings: Settings, key: str, upto: datetime
            ) -> None:
    """What a drain at ``upto`` does to the due occurrences: runs them."""
    conn.execute(sql.SQL(
        "UPDATE {} SET status = 'done', finished_at = now(), attempts = 1 "
        "WHERE recurring_key = %s AND status = 'queued' AND run_at <= %s").format(
        sql.Identifier(settings.schema_name, settings.table)), [key, upto])


@pytest.fixture
def q(pg_url: str, migrated: Settings) -> Any:
    queries = _q(pg_url, migrated)
    yield queries
    queries.conn.close()


def test_inserts_the_next_occurrence_once(q: db.Queries, conn: psycopg.Connection[Any],
                                          migrated: Settings) -> None:
    hourly = define("a", "0 * * * *", payload={"x": 1})
    first = sync(q, [hourly], ["a"], now=T0)
    again = sync(q, [hourly], ["a"], now=T0 + timedelta(minutes=1))
    assert (first.inserted, again.inserted) == (1, 0)
    [(key, queue, status, at, run_at, payload, dedup)] = _rows(conn, migrated)
    assert (key, queue, status, at, run_at) == ("a", "a", "queued", _at(10), _at(10))
    assert payload == {"x": 1, "scheduled_for": "2026-12-01T10:00:00+00:00"}
    assert dedup is None  # the occurrence is (recurring_key, scheduled_for), nothing else


def test_the_next_one_after_an_occurrence_ran(q: db.Queries, conn: psycopg.Connection[Any],
                                              migrated: Settings) -> None:
    hourly = define("a", "0 * * * *")
    sync(q, [hourly], ["a"], now=T0)
    later = _at(10, 0) + timedelta(seconds=5)
    assert sync(q, [hourly], ["a"], now=later).inserted == 1  # 11:00; 10:00 is due
    _finish(conn, migrated, "a", later)
    assert sync(q, [hourly], ["a"], now=later).inserted == 0  # ran: not created again
    assert [(r[2], r[3]) for r in _rows(conn, migrated)] == [
        ("done", _at(10)), ("queued", _at(11))]


def test_a_cancelled_occurrence_is_not_created_again(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    hourly = define("a", "0 * * * *")
    sync(q, [hourly], ["a"], now=T0)
    conn.execute(sql.SQL("UPDATE {} SET status = 'cancelled', last_error = 'cancelled' "
                         "WHERE recurring_key = 'a'").format(
        sql.Identifier(migrated.schema_name, "jobs")))
    assert sync(q, [hourly], ["a"], now=T0).inserted == 0
    # the series goes on after it
    assert sync(q, [hourly], ["a"], now=_at(10, 1)).inserted == 1


def test_changed_definition_rewrites_the_future_occurrence(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    sync(q, [define("a", "0 * * * *", payload={"v": 1})], ["a", "b"], now=T0)
    moved = define("a", "0 * * * *", key="a", payload={"v": 2}, priority=5)
    assert sync(q, [moved], ["a", "b"], now=T0).changed == 1
    [row] = _rows(conn, migrated)
    assert row[5]["v"] == 2 and row[3] == _at(10)
    # a new cron: the old future fire time goes, the new one comes
    result = sync(q, [define("a", "30 * * * *", payload={"v": 2})], ["a"], now=T0)
    assert (result.rescheduled, result.inserted) == (1, 1)
    assert [r[3] for r in _rows(conn, migrated)] == [_at(9, 30)]


def test_each_occurrence_keeps_its_definition_schedule(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    """What `drainer status` shows without the app: written at insert, rewritten when the
    schedule changes (a new catch-up policy does not change the occurrence's hash), and
    filled in on an occurrence written before the column existed."""
    jobs = sql.Identifier(migrated.schema_name, "jobs")

    def schedules() -> list[Any]:
        return [r[0] for r in conn.execute(sql.SQL(
            "SELECT recurring_schedule FROM {} ORDER BY id").format(jobs)).fetchall()]

    sync(q, [define("a", "0 * * * *", timezone="Europe/Berlin")], ["a"], now=T0)
    assert schedules() == [{"cron": "0 * * * *", "timezone": "Europe/Berlin",
                            "catch_up": "latest"}]
    again = sync(q, [define("a", "0 * * * *", timezone="Europe/Berlin", catch_up="all")],
                 ["a"], now=T0)
    assert again.changed == 1 and schedules()[0]["catch_up"] == "all"
    conn.execute(sql.SQL("UPDATE {} SET recurring_schedule = NULL").format(jobs))
    later = sync(q, [define("a", "0 * * * *", timezone="Europe/Berlin", catch_up="all")],
                 ["a"], now=T0)
    assert later.changed == 1 and schedules()[0]["cron"] == "0 * * * *"
    assert sync(q, [define("a", "0 * * * *", timezone="Europe/Berlin", catch_up="all")],
                ["a"], now=T0).changed == 0


def test_removed_definition_leaves_no_future_row(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    keep, drop = define("a", "0 * * * *"), define("a", "*/5 * * * *", key="five")
    sync(q, [keep, drop], ["a"], now=T0)
    assert len(_rows(conn, migrated)) == 2
    assert sync(q, [keep], ["a"], now=T0).removed == 1
    assert [r[0] for r in _rows(conn, migrated)] == ["a"]
    # the last definition gone too: nothing left in the queue
    assert sync(q, [], ["a"], now=T0).removed == 1
    assert _rows(conn, migrated) == []


def test_other_deployments_definitions_are_untouched(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    """Deployment A serves queue a, deployment B serves b (another --app or --queue)."""
    a, b = define("a", "0 * * * *"), define("b", "*/10 * * * *")
    sync(q, [a], ["a"], now=T0)
    sync(q, [b], ["b"], now=T0)
    for _ in range(3):
        assert sync(q, [a], ["a"], now=T0).removed == 0
        assert sync(q, [b], ["b"], now=T0).removed == 0
    assert [r[0] for r in _rows(conn, migrated)] == ["a", "b"]


def _gap(q: db.Queries, definition: Definition) -> None:
    """The 10:00 occurrence exists; then nothing ran until 13:20."""
    sync(q, [definition], [definition.queue], now=T0)


@pytest.mark.parametrize(("policy", "expected"), [
    ("latest", [("queued", _at(13)), ("queued", _at(14))]),
    ("skip", [("queued", _at(14))]),
    ("all", [("queued", _at(10)), ("queued", _at(11)), ("queued", _at(12)),
             ("queued", _at(13)), ("queued", _at(14))]),
])
def test_catch_up_policies(q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings,
                           policy: str, expected: list[tuple[str, datetime]]) -> None:
    hourly = define("a", "0 * * * *", catch_up=policy)
    _gap(q, hourly)
    late = _at(13, 20)
    sync(q, [hourly], ["a"], now=late)
    rows = _rows(conn, migrated)
    assert [(r[2], r[3]) for r in rows] == expected
    # a second sync (or eight at once) changes nothing
    assert sum(sync(q, [hourly], ["a"], now=late).as_dict().values()) == 0
    assert _rows(conn, migrated) == rows


def test_catch_up_all_is_bounded(q: db.Queries, conn: psycopg.Connection[Any],
                                 migrated: Settings) -> None:
    hourly = define("a", "0 * * * *", catch_up="all", catch_up_max=3)
    _gap(q, hourly)
    sync(q, [hourly], ["a"], now=_at(13, 20, day=2))  # a day later
    times = [r[3] for r in _rows(conn, migrated)]
    # the first missed one (10:00 yesterday) stays; the latest 3 fire times; the next one
    assert times == [_at(10), _at(11, day=2), _at(12, day=2), _at(13, day=2), _at(14, day=2)]


def test_a_retrying_occurrence_is_not_caught_up(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    hourly = define("a", "0 * * * *", catch_up="skip")
    _gap(q, hourly)
    conn.execute(sql.SQL("UPDATE {} SET attempts = 1, fence = 1, last_error = 'boom'").format(
        sql.Identifier(migrated.schema_name, "jobs")))
    sync(q, [hourly], ["a"], now=_at(13, 20))
    assert [r[3] for r in _rows(conn, migrated)] == [_at(10), _at(14)]


def test_eight_concurrent_syncs_create_each_occurrence_once(
        pg_url: str, migrated: Settings, conn: psycopg.Connection[Any]) -> None:
    definitions = [define(f"q{i % 3}", "*/5 * * * *", key=f"k{i}", catch_up=policy)
                   for i, policy in enumerate(["latest", "all", "skip"] * 4)]
    queues = ["q0", "q1", "q2"]
    first = _q(pg_url, migrated)
    sync(first, definitions, queues, now=T0)
    first.conn.close()
    errors: list[BaseException] = []
    late = T0 + timedelta(minutes=31)  # six fire times missed
    barrier = threading.Barrier(8)

    def one() -> None:
        q = _q(pg_url, migrated)
        try:
            barrier.wait()
            for step in range(5):
                sync(q, definitions, queues, now=late + timedelta(seconds=step))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            q.conn.close()

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = _rows(conn, migrated)
    keys = [(r[0], r[3]) for r in rows]
    assert len(keys) == len(set(keys))
    per_policy = {d.key: sum(1 for r in rows if r[0] == d.key) for d in definitions}
    for d in definitions:
        # latest: one run for the window + the next; skip: the next; all: the first missed
        # one, the five after it, the next
        assert per_policy[d.key] == {"latest": 2, "skip": 1, "all": 7}[d.catch_up], d.key


def test_the_sync_leaves_running_jobs_to_the_reaper(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    """The drain reaps in run_start; the sync touches only never-claimed occurrences."""
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue, status, attempts, locked_until) VALUES "
                         "('a', 'running', 1, now() - interval '1 minute')").format(table))
    result = sync(q, [define("a", "@hourly")], ["a"], T0)
    assert result.inserted == 1
    assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE status = 'running'")
                        .format(table)).fetchone() == (1,)


def test_the_sync_reads_only_the_occurrences_index(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    """Next to 20,000 ordinary queued jobs the sync reads the few queued occurrences."""
    table = sql.Identifier(migrated.schema_name, "jobs")
    conn.execute(sql.SQL("INSERT INTO {} (queue) SELECT 'a' FROM generate_series(1, 20000)")
                 .format(table))
    sync(q, [define("a", "@hourly")], ["a"], now=T0)
    conn.execute(sql.SQL("ANALYZE {}").format(table))
    from drainer.recurring import sync_params

    plan = "\n".join(r[0] for r in q.conn.execute(
        "EXPLAIN " + q.text("recurring_sync"),
        sync_params([define("a", "@hourly")], ["a"], T0)).fetchall())
    assert "jobs_recurring_queued_idx" in plan, plan
    assert "Seq Scan on jobs" not in plan, plan


def test_status_lists_series_with_next_fire_time_and_last_outcome(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    from drainer.cli.status import render_status
    from drainer.registry import Registry
    from drainer.status import collect_status

    reg = Registry()
    reg.task("digest", cron="0 8 * * *", timezone="Europe/Berlin")(lambda job: None)
    reg.recurring("digest", "*/5 * * * *", key="five")
    now = datetime.now(UTC)
    sync(q, list(reg.schedules.values()), ["digest"], now=now - timedelta(minutes=6))
    sync(q, list(reg.schedules.values()), ["digest"], now=now)
    _finish(conn, migrated, "five", now)  # its due occurrence ran
    sync(q, [define("gone", "@hourly")], ["gone"], now=now)  # another deployment's series
    st = collect_status(migrated, reg)
    series = {s["key"]: s for s in st["recurring"]}
    assert set(series) == {"digest", "five", "gone"}
    five = series["five"]
    assert five["last_status"] == "done" and five["next_in_table"] and five["served"]
    assert datetime.fromisoformat(five["next_at"]) > now
    assert series["digest"]["cron"] == "0 8 * * *" and series["digest"]["last_status"] is None
    assert series["gone"]["defined"] is False and series["gone"]["served"] is False
    text = render_status(st)
    assert "recurring" in text and "0 8 * * * (Europe/Berlin)" in text and "done" in text


def test_a_producers_dedup_key_cannot_suppress_an_occurrence(
        q: db.Queries, conn: psycopg.Connection[Any], migrated: Settings) -> None:
    """Occurrences are identified by their own columns (recurring_key, scheduled_for), which
    the producer role cannot write: a user's dedup_key of any text is only the user's."""
    from drainer.producer import enqueue

    for key in ("recurring:a:2026-12-01T10:00:00Z", "a"):
        assert enqueue(conn, "other", {}, dedup_key=key, schema=migrated.schema_name,
                       table=migrated.table) is not None
    result = sync(q, [define("a", "0 * * * *")], ["a"], now=T0)
    assert result.inserted == 1
    [(key, queue, status, at, _run_at, _payload, dedup)] = _rows(conn, migrated)
    assert (key, queue, status, at, dedup) == ("a", "a", "queued", _at(10), None)
