"""``POST /drain?tenant=NAME`` (``drainer serve --fleet``, ``drainer schedule --fleet
--listen``): the trigger after commit for a fleet.

The request marks the named tenants due on the control database (:func:`due`, before it
is answered: a 202 means the mark is written, so the tenant is drained by this process's
run or, if that fails, by the next fleet wake), then asks for a coalesced fleet run,
which drains the due tenants (these, and any other one due by then) and no other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from drainer._redact import redact
from drainer.errors import DrainerError, SchemaError

if TYPE_CHECKING:
    from drainer.settings import Settings

#: What a screen answers instead of starting a drain: (status, body[, headers]).
Answer = tuple[Any, ...]
Screen = Callable[[str], "Answer | None"]

_ONE_DATABASE = ("tenant=: this server drains one database; start it with --fleet "
                 "(and DRAINER_FLEET_URL) to drain a fleet's tenants")


class TenantMarks:
    """Marks tenants due on the control database, one short connection a request; only
    names of this process's tenants (its file or query, its shard)."""

    def __init__(self, settings: Settings, names: Sequence[str] | None) -> None:
        self.settings = settings
        self.names = None if names is None else frozenset(names)

    def __call__(self, names: Sequence[str]) -> None:
        import psycopg

        from drainer.fleet.control import connect_control
        from drainer.fleet.marks import due, due_params
        from drainer.fleet.tenants import load_tenants
        from drainer.fleet.tenants import names as names_of

        due_params(names, None)  # ValueError: a bad name, before any connection
        with connect_control(self.settings) as conn:
            known = self.names
            if known is None:
                known = frozenset(names_of(load_tenants(self.settings, conn)[0]))
            unknown = [n for n in names if n not in known]
            if unknown:
                raise LookupError(f"no tenant {unknown[0]!r} among this process's tenants")
            try:
                due(conn, names, schema=self.settings.schema_name)
            except psycopg.errors.UndefinedTable:
                raise SchemaError("the fleet's control table is not set up: run `drainer "
                                  "fleet migrate` first") from None
            except psycopg.Error as exc:
                raise DrainerError(f"the control database: {type(exc).__name__}: "
                                   f"{' '.join(str(exc).split())}") from None


def tenant_screen(mark: Callable[[Sequence[str]], None] | None) -> Screen:
    """What POST /drain does with its ``tenant`` parameters before a drain is asked for:
    without a fleet (``mark`` None) a tenant is refused (400); with one, a tenant is
    required and marked due (400 bad name, 404 not this process's tenant, 503 control
    database unreachable or not set up)."""

    def screen(query: str) -> Answer | None:
        names = list(dict.fromkeys(parse_qs(query).get("tenant", [])))
        if mark is None:
            return (400, {"error": _ONE_DATABASE}) if names else None
        if not names:
            return 400, {"error": "name the tenant: POST /drain?tenant=NAME (this server "
                         "drains a fleet)"}
        try:
            mark(names)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        except LookupError as exc:
            return 404, {"error": str(exc.args[0])}
        except DrainerError as exc:
            return 503, {"error": redact(str(exc)), "exit_code": exc.exit_code}, {
                "Retry-After": "5"}
        return None

    return screen

