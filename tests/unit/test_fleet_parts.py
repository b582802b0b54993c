"""The fleet's parts that need no database: tenants files, shards, the report, failures."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from drainer._redact import redact
from drainer.drain import RunReport
from drainer.errors import ConfigError, DatabaseUnavailable, SchemaError
from drainer.fleet._sql import STATEMENTS, statement
from drainer.fleet.run import FleetReport, TenantLine, classify
from drainer.fleet.tenants import (
    Shard,
    Tenant,
    parse_shard,
    parse_tenants,
    select,
    shard_from,
    shard_of,
    tenants_query,
)

# -- the tenants file -----------------------------------------------------------------------------


def test_a_tenants_file_has_names_urls_comments_and_references() -> None:
    text = ("# the fleet\n"
            "\n"
            "acme   postgresql://app:${ACME_PW}@db.example/acme   # the first\n"
            "globex\thost=db.example dbname=globex password=${GLOBEX_PW}\n"
            "  initech postgresql+psycopg://app@db.example/initech\n")
    tenants = parse_tenants(text, environ={"ACME_PW": "s3cret-acme-pw", "GLOBEX_PW": "g-pw-9"})
    assert [t.name for t in tenants] == ["acme", "globex", "initech"]
    assert tenants[0].url == "postgresql://app:s3cret-acme-pw@db.example/acme"
    assert tenants[1].url == "host=db.example dbname=globex password=g-pw-9"
    assert tenants[2].url == "postgresql://app@db.example/initech"  # libpq's form
    # the passwords are secrets now, and a tenant's repr never shows its URL
    assert redact(f"failed: {tenants[0].url}") == "failed: postgresql://app:***@db.example/acme"
    assert "s3cret" not in repr(tenants[0]) and "s3cret" not in str(tenants)


def test_a_file_reference_reads_a_mounted_secret(tmp_path: Path) -> None:
    secret = tmp_path / "acme"
    secret.write_text("from-a-file-pw\n")
    (t,) = parse_tenants(f"acme postgresql://app:${{file:{secret}}}@h/acme\n")
    assert t.url == "postgresql://app:from-a-file-pw@h/acme"
    with pytest.raises(ConfigError, match=r"line 1: tenant 'x': cannot read \$\{file:"):
        parse_tenants(f"x postgresql://app:${{file:{tmp_path / 'missing'}}}@h/x\n")


@pytest.mark.parametrize(("text", "message"), [
    ("-lead postgresql://h/a\n", "line 1: invalid tenant name '-lead'"),
    ("a" * 64 + " postgresql://h/a\n", "invalid tenant name"),
    ("ok postgresql://h/a\nok postgresql://h/b\n", "line 2: tenant 'ok' is listed twice "
     "(first on line 1)"),
    ("lonely # no url\n", "line 1: tenant 'lonely' has no URL"),
    ("x postgresql://u:${UNSET_VAR}@h/x\n", r"tenant 'x': ${UNSET_VAR} is not set"),
    ("x postgresql://u:${not a name}@h/x\n", "is not a variable name"),
])
def test_a_bad_line_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_tenants(text, environ={})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_unset_variable_is_named_never_a_value() -> None:
    with pytest.raises(ConfigError) as err:
        parse_tenants("x postgresql://u:${PW}@h/${DB}\n", environ={"PW": "visible-pw-123"})
    assert "${DB}" in str(err.value) and "visible-pw-123" not in str(err.value)


def test_tenants_query_names_a_table_or_runs_a_query() -> None:
    what, composed = tenants_query("ops.tenants")
    assert what == "table ops.tenants"
    assert composed.as_string(None) == 'SELECT name, url FROM "ops"."tenants" ORDER BY name'
    what, composed = tenants_query("SELECT slug AS name, dsn AS url FROM accounts;")
    assert what == "query" and isinstance(composed, sql.SQL)


# -- shards ---------------------------------------------------------------------------------------


def test_a_shard_is_a_stable_hash_of_the_name() -> None:
    # pinned: a change of the hash would move every tenant of a running fleet to another pod
    assert [shard_of(n, 4) for n in ("acme", "globex", "initech", "t00")] == [0, 3, 3, 0]
    assert [shard_of(n, 1000) for n in ("acme", "globex")] == [872, 599]
    import hashlib

    assert shard_of("acme", 7) == int.from_bytes(
        hashlib.sha256(b"acme").digest()[:8], "big") % 7


def test_adding_tenants_moves_no_tenant_to_another_shard() -> None:
    before = [Tenant(f"tenant-{i}", "x") for i in range(200)]
    after = before + [Tenant(f"new-{i}", "x") for i in range(50)]
    for index in range(4):
        shard = Shard(index, 4)
        kept = {t.name for t in select(after, shard)} & {t.name for t in before}
        assert kept == {t.name for t in select(before, shard)}
    # every tenant is in exactly one shard, and the shards are not lopsided
    sizes = [len(select(after, Shard(i, 4))) for i in range(4)]
    assert sum(sizes) == len(after) and min(sizes) > len(after) / 8


def test_the_shard_comes_from_the_flag_or_from_kubernetes() -> None:
    assert shard_from("1/3", None, {}) == Shard(1, 3)
    assert shard_from(None, 5, {"JOB_COMPLETION_INDEX": "4"}) == Shard(4, 5)
    assert shard_from(None, None, {}) is None
    assert shard_from("0/2", 5, {"JOB_COMPLETION_INDEX": "4"}) == Shard(0, 2)
    with pytest.raises(ConfigError, match="JOB_COMPLETION_INDEX is not"):
        shard_from(None, 3, {})
    with pytest.raises(ConfigError, match="DRAINER_FLEET_SHARD_COUNT is not"):
        shard_from(None, None, {"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(ConfigError, match="JOB_COMPLETION_INDEX of --shard-count"):
        shard_from(None, 3, {"JOB_COMPLETION_INDEX": "3"})


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_is_a_usage_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(text)


# -- the report -----------------------------------------------------------------------------------


def test_a_tenant_line_adds_its_turns_and_the_totals_add_the_lines() -> None:
    deep, failed = TenantLine("deep"), TenantLine("down")
    first = RunReport(run_id="r1", queues=["q"], claimed=10, succeeded=9, retried=1,
                      remaining_due=4, deadline_hit=True, stopped_by="max_runtime",
                      duration_s=1.0, connected_s=0.9)
    second = RunReport(run_id="r2", queues=["q"], claimed=4, succeeded=4, duration_s=0.5,
                       connected_s=0.4)
    deep.add(first)
    assert deep.outcome == "work_left"
    deep.add(second)
    assert (deep.outcome, deep.turns, deep.counts["claimed"], deep.counts["succeeded"]) == \
        ("drained", 2, 14, 13)
    assert (deep.remaining_due, deep.duration_s, deep.connected_s) == (0, 1.5, 1.3)
    failed.fail(DatabaseUnavailable("cannot connect: postgresql://u:pw-in-error-77@h/x"), 0.2)
    assert (failed.outcome, failed.exit_code) == ("unavailable", 3)
    report = FleetReport("fleet", None, listed=100, lines=[deep, failed], busy=["b"],
                         left=["l1", "l2"])
    totals = report.totals()
    assert (totals["tenants_due"], totals["tenants_drained"], totals["tenants_failed"],
            totals["tenants_busy"], totals["tenants_left"], totals["claimed"]) == \
        (4, 1, 1, 1, 2, 14)
    assert report.failed == [failed] and report.as_dict()["deadline_hit"]


@pytest.mark.parametrize(("exc", "outcome", "code"), [
    (DatabaseUnavailable("x"), "unavailable", 3),
    (SchemaError("x"), "schema", 4),
    (ConfigError("x"), "config", 2),
    (psycopg.errors.QueryCanceled("x"), "timeout", 5),
    (psycopg.OperationalError("lost"), "unavailable", 3),
    (ValueError("x"), "error", 1),
])
def test_a_failure_is_classified_as_run_once_would_exit(exc: Exception, outcome: str,
                                                        code: int) -> None:
    assert classify(exc) == (outcome, code)


def test_every_control_statement_composes_and_pastes_no_identifier() -> None:
    for name, text in STATEMENTS.items():
        assert "drainer." not in text and "fleet_tenants" not in text, name
        statement(name, "ops").as_string(None)
