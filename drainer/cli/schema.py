"""``drainer migrate``: create or upgrade the jobs table, or print the roles' grants."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from drainer.cli._base import add_command
from drainer.cli._output import print_json
from drainer.errors import ConfigError

if TYPE_CHECKING:
    from drainer.settings import Settings


def configure_migrate(sub: Any) -> None:
    p = add_command(sub, "migrate", "Create or upgrade the jobs table (idempotent; adopts a "
                    "table made from the DDL of 'Postgres as a job queue: using FOR UPDATE "
                    "SKIP LOCKED correctly').", migrate_command)
    p.add_argument("--notify-trigger", action="store_true",
                   help="Also install the AFTER INSERT trigger that pg_notify('drainer', "
                   "queue)s, for `drainer worker`.")
    p.add_argument("--print-grants", action="store_true",
                   help="Print the SQL that creates the least-privilege drainer and producer "
                   "roles for this schema and table (as deploy/sql/roles.sql), without "
                   "connecting, and exit.")
    p.add_argument("--drainer-role", default="drainer", metavar="NAME",
                   help="With --print-grants: the role drainer runs as [default: drainer].")
    p.add_argument("--producer-role", default="drainer_producer", metavar="NAME",
                   help="With --print-grants: the role producers enqueue as "
                   "[default: drainer_producer].")
    p.add_argument("--maintain", action="store_true",
                   help="With --print-grants: also GRANT MAINTAIN (PostgreSQL 17+), so "
                   "drainer may VACUUM the table it does not own.")


def migrate_command(args: argparse.Namespace, settings: Settings) -> int:
    if args.print_grants:
        from drainer.grants import render_grants

        try:
            sys.stdout.write(render_grants(
                settings.schema_name, settings.table, drainer_role=args.drainer_role,
                producer_role=args.producer_role, maintain=args.maintain))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return 0

    from drainer.db import connect
    from drainer.migrate import install_notify_trigger, migrate

    with connect(settings) as conn:
        result = migrate(conn, settings.schema_name, settings.table)
        if args.notify_trigger:
            install_notify_trigger(conn, settings.schema_name, settings.table)
            result.notify_trigger = True
    print_json(result.as_dict())
    return 0
