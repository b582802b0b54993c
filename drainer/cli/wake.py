"""Waking on demand: ``drainer serve`` (POST /drain) and ``drainer next-wake`` (for
platforms that take a one-shot schedule); the address flags serve and ``schedule
--listen`` share. The HTTP server (drainer/serve.py) is imported only when serve runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import print_json
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.settings import Settings

# the command's log lines carry the name of the module it runs
logger = logging.getLogger("drainer.serve")


def port_number(text: str) -> int:
    """argparse ``type=`` of --port: 0 (any free one) to 65535; else a usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0 to 65535): {text}")
    return value


def listen_address(args: argparse.Namespace, default_host: str | None,
                   default_port: int | None) -> tuple[str, int] | None:
    """--listen HOST:PORT or --host/--port (both forms on serve and schedule), or None.

    ``default_host``/``default_port``: serve's (it always listens); schedule has none, so
    it listens only when --listen or --port is given.
    """
    from drainer.serve import parse_listen

    if args.listen is not None:
        if args.host is not None or args.port is not None:
            raise ConfigError("give --listen HOST:PORT or --host/--port, not both")
        return parse_listen(args.listen)
    if args.port is None and default_port is None:
        if args.host is not None:
            raise ConfigError("--host needs --port (or use --listen HOST:PORT)")
        return None
    host = args.host if args.host is not None else default_host or "127.0.0.1"
    port = args.port if args.port is not None else default_port
    assert port is not None
    return host, port


# -- next-wake ------------------------------------------------------------------------------------


def configure_next_wake(sub: Any) -> None:
    p = add_command(sub, "next-wake", "Print when the next drain is needed (ISO 8601, UTC), "
                    "for one-shot schedules (EventBridge Scheduler at(), Cloud Tasks).",
                    next_wake_command, description=(
                        "Print when the next drain is needed, in UTC: now if jobs are due, "
                        "else the earliest of the next queued job and the next occurrence "
                        "of the app's recurring definitions; nothing (exit 0) when there is "
                        "neither. One connection that syncs the definitions (as a drain's "
                        "start does) and reads the queue; --offline computes from the "
                        "definitions alone without connecting."))
    p.add_argument("--offline", action="store_true", help="Do not connect: the next fire "
                   "time of the recurring definitions only (retries and enqueued jobs are "
                   "not seen).")
    p.add_argument("--json", action="store_true", help="One JSON object: next_wake_at, "
                   "reason, remaining_due, next_due_at, next_recurring_at, recurring_key.")


def next_wake_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer.status import next_wake

    found = next_wake(settings, offline=args.offline)
    if args.json:
        print_json(found.as_dict())
    elif found.at is not None:
        sys.stdout.write(f"{found.at:%Y-%m-%dT%H:%M:%SZ}\n")
        sys.stdout.flush()
    return 0


# -- serve ----------------------------------------------------------------------------------------


def configure_serve(sub: Any) -> None:
    p = add_command(sub, "serve", "HTTP trigger: POST /drain starts a drain; GET /healthz "
                    "never touches the database.", serve_command)
    p.add_argument("--host", metavar="HOST", help="Address to listen on "
                   "[default: 127.0.0.1].")
    p.add_argument("--port", type=port_number, metavar="PORT", help="Port [default: $PORT "
                   "(set by Cloud Run and Knative), else 8080; 0 picks a free one].")
    p.add_argument("--listen", metavar="HOST:PORT", help="Host and port in one (schedule "
                   "--listen's form); instead of --host/--port.")
    p.add_argument("--no-auth", action="store_true",
                   help="Accept POST /drain without a bearer token (only behind something "
                   "that authenticates; by default serve refuses to start without "
                   "DRAINER_TRIGGER_TOKEN).")
    p.add_argument("--fleet", action="store_true", help="Drain a fleet's tenants instead of "
                   "one database: POST /drain?tenant=NAME marks the tenant due on the "
                   "control database (DRAINER_FLEET_URL), then a coalesced fleet run drains "
                   "the due tenants (docs/fleet.md).")


def serve_command(args: argparse.Namespace, settings: Settings) -> int:
    from drainer._signals import stop_on_signals
    from drainer.drain import resolve_queues
    from drainer.registry import default_registry
    from drainer.serve import make_server, serve_until, trigger_token

    address = listen_address(args, "127.0.0.1", _env_port())
    assert address is not None
    token = trigger_token(settings, args.no_auth)
    if args.fleet:
        from drainer.cli.fleet import fleet_trigger

        server, what = fleet_trigger(settings, address, token)
    else:
        settings.dsn  # noqa: B018 - a missing database URL is a configuration error (exit 2)
        queues = resolve_queues(settings, default_registry)  # loads the app; exit 2 if wrong
        server = make_server(settings, *address, token=token)
        what = f"queues: {', '.join(queues)}"
    stop_requested = threading.Event()

    def stopping(name: str) -> None:
        logger.info("received %s: no new drains; the running one finishes or releases "
                       "its jobs", name)

    with stop_on_signals(stop_requested, stopping):
        started = serve_until(server, stop_requested, grace=settings.grace,
                              note=f"{what}; no database connection until a drain is "
                              "requested")
    logger.info("stopped after %d drain(s)", started)
    return 0


def _env_port() -> int:
    """$PORT (Cloud Run, Knative), else serve's default port."""
    from drainer.serve import DEFAULT_PORT

    raw = os.environ.get("PORT")
    if not raw:
        return DEFAULT_PORT
    try:
        return port_number(raw)
    except argparse.ArgumentTypeError:
        raise ConfigError(f"PORT is not a port number: {raw!r}") from None
