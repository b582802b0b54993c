"""``drainer ui``: the dashboard, served (``--host``, ``--port``) or written as files
(``--static DIR``)."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import emit, seconds_arg
from drainer.cli.wake import port_number
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.registry import Registry
    from drainer.settings import Settings

logger = logging.getLogger("drainer.ui")

#: Where drainer ui listens unless told.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def configure_ui(sub: Any) -> None:
    p = add_command(sub, "ui", "A dashboard in the browser that reads the database only "
                    "when a page is loaded.", ui_command, description=(
                        "Serve the dashboard: queues (due, delayed, running, failed, done, "
                        "paused, limits, oldest due), jobs with filters and pages, one job "
                        "whole, runs, recurring series and the awake timeline; retry, "
                        "cancel, pause/resume and limits, each confirmed. One short database "
                        "connection per page load, closed before the page is sent; nothing "
                        "in between. Actions need DRAINER_UI_TOKEN (16+ characters); so "
                        "does viewing when listening on anything but loopback. --static "
                        "DIR writes the same pages as files instead."))
    p.add_argument("--host", metavar="HOST", default=DEFAULT_HOST,
                   help=f"Address to listen on [default: {DEFAULT_HOST}]; any other than "
                   "loopback needs DRAINER_UI_TOKEN for viewing too.")
    p.add_argument("--port", type=port_number, metavar="PORT", default=DEFAULT_PORT,
                   help=f"Port [default: {DEFAULT_PORT}; 0 picks a free one].")
    p.add_argument("--static", metavar="DIR", help="Write the pages as files into DIR (no "
                   "server, readable without JavaScript) and exit: for a CronJob or CI to "
                   "publish.")
    p.add_argument("--sample-seconds", metavar="DURATION", default="0",
                   help="With --static: sample pg_stat_activity this long for the awake "
                   "timeline (1s to 60s; 0: no sample) [default: 0].")
    p.add_argument("--allow-always-on", action="store_true",
                   help="Let pages auto-refresh more often than the compute's idle timeout "
                   "(which keeps it awake while a page is open).")
    p.add_argument("--allowed-host", metavar="NAME", action="append", default=[],
                   help="A host name the server answers for besides loopback ones (behind a "
                   "reverse proxy; repeatable). Viewing then needs DRAINER_UI_TOKEN too.")
    p.add_argument("--secure-cookie", action="store_true",
                   help="Mark the sign-in cookie Secure (behind a proxy that serves HTTPS).")


def _registry(settings: Settings) -> Registry:
    from drainer.app import load_app
    from drainer.registry import default_registry

    if settings.app:
        load_app(settings.app)
    return default_registry


def ui_command(args: argparse.Namespace, settings: Settings) -> int:
    settings.dsn  # noqa: B018 - a missing database URL is a configuration error (exit 2)
    registry = _registry(settings)
    if args.static is not None:
        return _static(args, settings, registry)
    from drainer._signals import stop_on_signals
    from drainer.ui import Dashboard, make_ui_server, serve_ui
    from drainer.ui.auth import Guard, check_token
    from drainer.ui.refresh import RefreshPolicy
    from drainer.waking import fmt_seconds, idle_timeout_of

    token = check_token(settings.ui_token.get_secret_value() if settings.ui_token else None)
    guard = Guard(token, bind_host=args.host, allowed_hosts=args.allowed_host)
    idle = idle_timeout_of(settings)
    policy = RefreshPolicy(idle, allow_always_on=args.allow_always_on)
    extra = _extra_pages(settings)
    dashboard = Dashboard(settings, guard=guard, refresh=policy, registry=registry,
                          extra_pages=extra, secure_cookie=args.secure_cookie)
    server = make_ui_server(dashboard, args.host, args.port)
    host, port = server.server_address[:2]
    logger.info("listening on http://%s:%d/; no database connection until a page is "
                "loaded; auto-refresh off by default, never more often than every %s (idle "
                "timeout %s, %s); actions %s", host, port, fmt_seconds(policy.minimum),
                fmt_seconds(idle.seconds), idle.source,
                "need the UI token" if guard.has_token else "off (DRAINER_UI_TOKEN unset)",
                extra={"port": port})
    stop = threading.Event()
    with stop_on_signals(stop, lambda name: logger.info("received %s: stopping", name)):
        serve_ui(server, stop)
    return 0


def _extra_pages(settings: Settings) -> list[Any]:
    """The fleet view when --fleet-url / DRAINER_FLEET_URL is given."""
    if settings.fleet_url is None:
        return []
    from drainer.fleet.control import control_settings
    from drainer.ui.fleet import FleetPage

    control_settings(settings)  # its password masked in every output
    return [FleetPage(settings)]


def _static(args: argparse.Namespace, settings: Settings, registry: Registry) -> int:
    from drainer.ui import write_static
    from drainer.ui.data import MAX_SAMPLE_S

    sample = seconds_arg("--sample-seconds", args.sample_seconds)
    if sample != 0 and not 1 <= sample <= MAX_SAMPLE_S:
        raise ConfigError(f"--sample-seconds: 0, or 1s to {MAX_SAMPLE_S:.0f}s")
    written = write_static(settings, args.static, registry=registry, sample_s=sample,
                           extra_pages=_extra_pages(settings))
    emit({"directory": args.static, "pages": len(written)},
         lambda r: f"wrote {r['pages']} pages to {r['directory']} (open index.html)",
         as_json=False)
    return 0
