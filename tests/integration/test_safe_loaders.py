"""Values PostgreSQL stores that Python cannot load come back as values, not errors."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest

from drainer.db.loaders import TIME_MAX, TIME_MIN, UndecodablePayload, register_safe_loaders

DEEP = "(repeat('[', 5000) || repeat(']', 5000))::jsonb"


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("literal", "expected"), [
    ("'-infinity'", TIME_MIN), ("'0044-03-15 BC'", TIME_MIN),
    ("'infinity'", TIME_MAX), ("'20000-01-01'", TIME_MAX),
])
def test_out_of_range_times_load_at_the_ends(pg_url: str, literal: str, expected: datetime,
                                             binary: bool) -> None:
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.DataError):  # what psycopg does on its own
            conn.execute(f"SELECT {literal}::timestamptz", binary=binary).fetchone()
        conn.rollback()
        register_safe_loaders(conn.adapters)
        row = conn.execute(f"SELECT {literal}::timestamptz, now()", binary=binary).fetchone()
        assert row is not None
        assert row[0] == expected
        assert abs((row[1] - datetime.now(timezone.utc)).total_seconds()) < 60


@pytest.mark.parametrize("binary", [False, True])
def test_a_payload_json_cannot_decode_is_an_undecodable_payload(pg_url: str,
                                                                 binary: bool) -> None:
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(RecursionError):
            conn.execute(f"SELECT {DEEP}", binary=binary).fetchone()
        conn.rollback()
        register_safe_loaders(conn.adapters)
        rows = conn.execute(f"SELECT {DEEP} UNION ALL SELECT '{{\"a\": 1}}'::jsonb",
                            binary=binary).fetchall()
    bad, good = rows[0][0], rows[1][0]
    assert isinstance(bad, UndecodablePayload)
    assert bad.error.startswith("RecursionError")
    assert str(bad).startswith("<undecodable payload: RecursionError")
    assert good == {"a": 1}
