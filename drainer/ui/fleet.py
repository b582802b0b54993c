"""The dashboard's fleet view (``drainer ui`` with ``--fleet-url``): every tenant with its
next due time, last run, outcome and error, read from the fleet's control database only
(one short connection a page load, as every page); no tenant is connected to."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from drainer.ui.data import Read
from drainer.ui.html import Safe, dl, h, join, page, table, tag, when

if TYPE_CHECKING:
    from collections.abc import Mapping

    from drainer.settings import Settings
    from drainer.ui.html import Frame


class FleetPage:
    """``/fleet``: an :class:`~drainer.ui.routes.ExtraPage`."""

    path = "/fleet"
    title = "Fleet"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def read(self) -> tuple[dict[str, Any], Read]:
        """``drainer fleet status``'s data, and the page's read of the control database."""
        from drainer.fleet.control import Control, connect_control
        from drainer.fleet.status import fleet_status
        from drainer.fleet.tenants import listed_names

        started = time.monotonic()
        with connect_control(self.settings) as conn:
            control = Control(conn, self.settings.schema_name)
            control.check()
            status = fleet_status(control, listed_names(self.settings, conn))
        return status, Read(datetime.now(timezone.utc), time.monotonic() - started)

    def render(self, query: Mapping[str, str], frame: Frame) -> str:
        status, read = self.read()
        return page(frame, "fleet", "Fleet", fleet_body(status), read)


def fleet_body(status: dict[str, Any]) -> Safe:
    """The tenants' table (failing ones first) and the counts."""
    tenants = sorted(status["tenants"], key=lambda t: (t["failures"] == 0, t["tenant"]))
    rows: list[list[Any]] = [[
        t["tenant"],
        "now" if t["due_now"] else (when(t["next_due_at"]) if t["next_due_at"]
                                    else "no known work"),
        when(t["last_finished_at"]) if t["last_finished_at"] else "never",
        t["outcome"] or "-", t["failures"], t["error"] or "",
        t["schema_version"] if t["schema_version"] is not None else "-",
        "yes" if t["leased_by"] else ""] for t in tenants]
    rows += [[n, "now", "never (not in the control table)", "-", 0, "", "-", ""]
             for n in status["never_seen"]]
    c = status["counts"]
    return join([
        dl([("tenants", c["tenants"]), ("due now", c["due_now"]),
            ("never drained", c["never_drained"]), ("failing", c["failing"]),
            ("being drained", c["leased"])]),
        table(("tenant", "next due", "last run", "outcome", "failures", "error", "schema",
               "being drained"), rows, numeric=(4, 6)),
        tag("p", h("Read from the fleet's control database only: no tenant database is "
                   "connected to for this page."), class_="muted")])
