"""The database: connections (:mod:`.connect`), what an error means (:mod:`.errors`),
drainer's named statements (:mod:`.statements`, one method each in :mod:`.queries`), the
text forms parameters are sent in (:mod:`.encoders`), the loaders that never fail a whole
result (:mod:`.loaders`) and the claim pipeline (:mod:`._pipeline`)."""

from __future__ import annotations

from drainer.db._pipeline import ClaimPipeline, sync_round_trip
from drainer.db.connect import (
           connect,
           keepalive_options,
           one_line,
           prepared_statement_clash,
           server_condition,
           timeout_kind,
)
from drainer.db.queries import ClaimedRow, Queries, claim_order
from drainer.db.statements import QUERIES, identifiers, regclass_literal

__all__ = ["QUERIES", "ClaimPipeline", "ClaimedRow", "Queries", "claim_order", "connect",
           "identifiers", "keepalive_options", "one_line",
           "prepared_statement_clash", "regclass_literal", "server_condition",
           "sync_round_trip", "timeout_kind"]
