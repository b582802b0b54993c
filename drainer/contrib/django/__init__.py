"""Enqueue from Django (4.2+, psycopg 3), and run drainer with Django's database.

In a view, inside ``transaction.atomic()`` the job commits or rolls back with the
view's writes::

    from django.db import transaction
    from drainer.contrib.django import enqueue

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue("emails", {"order": order.pk})

With ``trigger=settings`` (a :class:`drainer.settings.Settings` with ``trigger_url``) one
drain trigger is fired through ``transaction.on_commit``: after the outermost atomic
block commits, never after a rollback. Add ``"drainer.contrib.django"`` to INSTALLED_APPS
for ``manage.py drainer <drainer command> ...`` (see
:mod:`drainer.contrib.django.management.commands.drainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from drainer.job import DEFAULT_MAX_ATTEMPTS
from drainer.settings import DEFAULT_SCHEMA, DEFAULT_TABLE

if TYPE_CHECKING:
    import psycopg

    from drainer.job import QueueRef
    from drainer.producer import EnqueueResult, JobSpec
    from drainer.settings import Settings

__all__ = ["database_url", "enqueue", "enqueue_many", "migrate_schema", "psycopg_connection"]

#: Keys of DATABASES[...]["OPTIONS"] that Django's backend takes for itself (not libpq's).
_DJANGO_OPTIONS = frozenset({
    "isolation_level", "server_side_binding", "assume_role", "pool", "cursor_factory",
    "context", "prepare_threshold",
})

_POSTGRES_ENGINES = ("postgresql", "postgis")


def psycopg_connection(using: str = "default") -> psycopg.Connection[Any]:
    """The psycopg 3 connection under Django's connection ``using`` (opened if need be).

    Inside ``transaction.atomic()`` it is in Django's transaction; outside, in autocommit.
    """
    import psycopg
    from django.db import connections

    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            f"drainer.contrib.django needs Django's PostgreSQL backend on psycopg 3; "
            f"DATABASES[{using!r}] has {type(raw).__module__}.{type(raw).__qualname__}"
        )
    return raw


def _on_commit(settings: Settings | None, using: str) -> None:
    if settings is None:
        return
    from django.db import transaction

    from drainer.trigger import fire_after_commit

    transaction.on_commit(partial(fire_after_commit, settings), using=using)


def enqueue(queue: QueueRef, payload: Any, *, run_at: datetime | None = None, priority: int = 0,
            max_attempts: int = DEFAULT_MAX_ATTEMPTS, dedup_key: str | None = None,
            schema: str = DEFAULT_SCHEMA, table: str = DEFAULT_TABLE, using: str = "default",
            trigger: Settings | None = None) -> int | None:
    """:func:`drainer.producer.enqueue` on Django's connection ``using``.

    Inside ``transaction.atomic(using=using)`` the job is part of that transaction; outside,
    it commits at once (Django's autocommit). ``queue`` is a queue name or a ``@task``
    handler (its queue: no name to misspell). Returns the job id (None for a dedup_key
    already queued or running).
    """
    from drainer.job import queue_of
    from drainer.producer import enqueue as _enqueue

    job_id = _enqueue(psycopg_connection(using), queue_of(queue), payload, run_at=run_at,
                      priority=priority, max_attempts=max_attempts, dedup_key=dedup_key,
                      schema=schema, table=table)
    if job_id is not None:
        _on_commit(trigger, using)
    return job_id


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]] | Iterable[Any], *,
                 queue: QueueRef | None = None, schema: str = DEFAULT_SCHEMA,
                 table: str = DEFAULT_TABLE, using: str = "default",
                 trigger: Settings | None = None, **options: Any) -> EnqueueResult:
    """:func:`drainer.producer.enqueue_many` (COPY) on Django's connection ``using``; with
    ``queue=`` (a name or a ``@task`` handler), ``jobs`` are payloads on that queue, with
    the ``options`` of :func:`enqueue`."""
    from drainer.job import queue_of
    from drainer.producer import enqueue_many as _enqueue_many

    result = _enqueue_many(psycopg_connection(using), jobs,
                           queue=None if queue is None else queue_of(queue), schema=schema,
                           table=table, **options)
    if result.enqueued:
        _on_commit(trigger, using)
    return result


def database_url(using: str = "default") -> str:
    """A libpq connection string (key=value) for ``DATABASES[using]``.

    NAME, USER, PASSWORD, HOST, PORT and the libpq keys of OPTIONS (sslmode, service,
    options, ...); Django's own OPTIONS (isolation_level, pool, ...) are left out.
    """
    from django.db import connections
    from psycopg.conninfo import make_conninfo

    from drainer.errors import ConfigError

    conf = connections[using].settings_dict
    engine = str(conf.get("ENGINE", ""))
    if not engine.rsplit(".", 1)[-1].startswith(_POSTGRES_ENGINES):
        raise ConfigError(f"DATABASES[{using!r}] is not PostgreSQL (ENGINE {engine!r})")
    params: dict[str, Any] = {
        "dbname": conf.get("NAME"), "user": conf.get("USER"),
        "password": conf.get("PASSWORD"), "host": conf.get("HOST"), "port": conf.get("PORT"),
    }
    for key, value in (conf.get("OPTIONS") or {}).items():
        if key not in _DJANGO_OPTIONS and isinstance(value, str | int) \
                and not isinstance(value, bool):
            params[key] = value
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def migrate_schema(schema: str = DEFAULT_SCHEMA, table: str = DEFAULT_TABLE
                   ) -> Callable[[Any, Any], None]:
    """A function for ``migrations.RunPython``: ``drainer migrate`` in a Django migration.

    ::

        operations = [migrations.RunPython(migrate_schema(), migrations.RunPython.noop)]

    It runs drainer's own migrations (idempotent, recorded in drainer's bookkeeping table)
    on the migration's connection, inside its transaction.
    """
    def forward(apps: Any, schema_editor: Any) -> None:
        from drainer.migrate import migrate

        wrapper = schema_editor.connection
        wrapper.ensure_connection()
        migrate(wrapper.connection, schema, table)

    forward.__name__ = f"drainer_migrate_{schema}_{table}"
    return forward
