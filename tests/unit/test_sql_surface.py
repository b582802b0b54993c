"""The SQL surface: one file, every named statement, identifiers never pasted."""

from __future__ import annotations

from drainer.db import QUERIES

LIFECYCLE = {
    "claim_batch", "complete_many", "complete_many_and_claim", "fail_many", "extend_many",
    "release_many", "reap_expired", "archive_delete", "archive_move", "queue_summary",
    "status_counts", "enqueue",
}


def test_every_lifecycle_statement_is_named() -> None:
    assert set(QUERIES) >= LIFECYCLE


def test_claim_uses_skip_locked_cte_and_lease() -> None:
    claim = QUERIES["claim_batch"]
    assert "FOR UPDATE SKIP LOCKED" in claim
    assert claim.lstrip().startswith("WITH next AS")
    assert "locked_until = now() + make_interval" in claim
    assert "{jobs}" in claim


def test_fenced_statements_check_status_and_attempts() -> None:
    # issue 20 item 4: the fence is the claim's token (fence), not attempts, which retry
    # resets
    for name in ("complete_many", "fail_many", "extend_many", "release_many",
                 "delete_completed_many", "lock_running"):
        text = QUERIES[name]
        assert "status = 'running'" in text, name
        assert "fence = " in text, name
        assert "attempts = o." not in text, name
    # the combined statement's status is a parameter, always 'running' (see queries.sql)
    combined = QUERIES["complete_many_and_claim"]
    assert "j.status = %(running)s::text AND j.fence = o.fence" in combined
    # nothing resets the fence
    for name, text in QUERIES.items():
        assert "fence = 0" not in text and "fence = NULL" not in text, name


def test_no_table_name_is_pasted() -> None:
    for name, text in QUERIES.items():
        assert "drainer.jobs" not in text and '"jobs"' not in text, name


def test_package_exports_the_functions() -> None:
    import drainer
    import drainer.producer  # importing the module must not shadow the function

    assert callable(drainer.enqueue) and callable(drainer.enqueue_many)
    assert callable(drainer.run_once) and callable(drainer.task)


def test_combined_statement_claims_exactly_like_claim_batch() -> None:
    """queries.sql cannot include one block in another: keep the two claims identical."""

    def next_cte(text: str) -> str:
        start = text.index("next AS (")
        return " ".join(text[start:text.index(")", text.index("FOR UPDATE SKIP LOCKED"))]
                        .split())

    assert next_cte(QUERIES["complete_many_and_claim"]) == next_cte(QUERIES["claim_batch"])
