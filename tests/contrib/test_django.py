"""drainer.contrib.django against the real PostgreSQL and Django (psycopg 3 backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

django = pytest.importorskip("django")

from drainer.producer import JobSpec  # noqa: E402
from drainer.settings import Settings  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.contrib._server import Counter  # noqa: E402
from tests.contrib.conftest import count_jobs  # noqa: E402

SETTINGS = "tests.contrib.django_project.settings"
MANAGE = ROOT / "tests" / "contrib" / "django_project" / "manage.py"


@pytest.fixture(scope="module", autouse=True)
def django_ready(pg_url: str) -> Iterator[None]:
    """Django set up once; the variables it sets (TZ, ...) put back for the other tests."""
    saved = dict(os.environ)
    os.environ["DRAINER_TEST_DATABASE_URL"] = pg_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    django.setup()
    yield
    os.environ.clear()
    os.environ.update(saved)
    time.tzset()


@pytest.fixture
def shop(migrated: Settings, pg_url: str) -> Iterator[str]:
    """The test's schema, migrated, with the shop's orders table."""
    from django.db import connections

    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(f'CREATE TABLE "{migrated.schema_name}".orders (id int PRIMARY KEY)')
    yield migrated.schema_name
    connections.close_all()  # the schema fixture drops the schema next


def _orders(pg_url: str, schema: str) -> int:
    with psycopg.connect(pg_url) as c:
        row = c.execute(f'SELECT count(*) FROM "{schema}".orders').fetchone()
        assert row is not None
        return int(row[0])


def test_atomic_commit_writes_the_order_and_one_job(shop: str, pg_url: str) -> None:
    from tests.contrib.django_project.shop.views import place_order

    assert isinstance(place_order(1, schema=shop), int)
    assert (_orders(pg_url, shop), count_jobs(pg_url, shop)) == (1, 1)


def test_atomic_rollback_writes_neither(shop: str, pg_url: str) -> None:
    from django.db import transaction

    from drainer.contrib.django import enqueue, enqueue_many
    from tests.contrib.django_project.shop.views import place_order

    with pytest.raises(RuntimeError):
        place_order(2, schema=shop, fail=True)
    with transaction.atomic():
        enqueue_many([JobSpec("shop-emails", {"order": i}) for i in range(5)], schema=shop)
        enqueue_many([{"order": i} for i in range(5)], queue="shop-emails", schema=shop)
        enqueue("shop-emails", {"order": 9}, schema=shop)
        transaction.set_rollback(True)
    assert (_orders(pg_url, shop), count_jobs(pg_url, shop)) == (0, 0)


def test_outside_atomic_it_commits_at_once(shop: str, pg_url: str) -> None:
    from drainer.contrib.django import enqueue, enqueue_many

    enqueue("shop-emails", {"order": 3}, schema=shop)
    got = enqueue_many([{"queue": "shop-emails", "payload": {"order": 4}}], schema=shop)
    assert got.enqueued == 1
    got = enqueue_many([{"order": 5}, {"order": 6}], queue="shop-emails", schema=shop)
    assert got.enqueued == 2
    assert count_jobs(pg_url, shop) == 4


def test_trigger_fires_on_commit_only(shop: str, trig: Settings, counter: Counter,
                                      pg_url: str) -> None:
    from django.db import transaction

    from drainer.contrib.django import enqueue
    from tests.contrib.django_project.shop.views import place_order

    with transaction.atomic():
        place_order(10, schema=shop, trigger=trig)  # a nested atomic: a savepoint
        enqueue("shop-emails", {"order": 11}, schema=shop, trigger=trig)
        assert counter.posts == 0  # not before the outermost commit
    assert counter.posts == 2  # one on_commit callback each enqueue
    with pytest.raises(RuntimeError):
        place_order(12, schema=shop, trigger=trig, fail=True)
    assert counter.posts == 2
    assert count_jobs(pg_url, shop) == 2


def test_many_threads_of_views(shop: str, pg_url: str) -> None:
    from django.db import connections

    from tests.contrib.django_project.shop.views import place_order

    errors: list[BaseException] = []

    def work(w: int) -> None:
        try:
            for i in range(50):
                place_order(w * 1000 + i, schema=shop)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's connections

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert (_orders(pg_url, shop), count_jobs(pg_url, shop)) == (400, 400)


def test_database_url_and_migrate_schema_in_a_django_migration(pg_url: str,
                                                               schema: str) -> None:
    from django.db import connection

    from drainer.contrib.django import database_url, migrate_schema
    from drainer.migrate import latest_version

    dsn = database_url()
    assert "application_name=drainer-django-tests" in dsn
    with psycopg.connect(dsn) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.commit()
    # What RunPython(migrate_schema(...)) does inside `manage.py migrate`.
    with connection.schema_editor() as editor:
        migrate_schema(schema, "jobs")(None, editor)
        migrate_schema(schema, "jobs")(None, editor)  # idempotent
    with psycopg.connect(dsn) as c:
        row = c.execute(f'SELECT max(version) FROM "{schema}".drainer_migrations').fetchone()
    assert row == (latest_version(),)


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("DRAINER_") and k not in ("DATABASE_URL",
                                                          "DJANGO_SETTINGS_MODULE")}
    base.update({"PYTHONPATH": str(ROOT), "DRAINER_CONNECT_RETRIES": "0",
                 "DRAINER_TEST_DATABASE_URL": os.environ["DRAINER_TEST_DATABASE_URL"]})
    base.update(env)
    return subprocess.run([sys.executable, str(MANAGE), "drainer", *args], env=base,
                          capture_output=True, text=True, timeout=60, cwd=ROOT / "tests")


def test_manage_py_drainer_migrate_and_run_once(schema: str, pg_url: str) -> None:
    proc = _manage("migrate", "--schema", schema)
    assert proc.returncode == 0, proc.stderr
    with psycopg.connect(pg_url) as c:
        from drainer.producer import enqueue

        for i in range(3):
            enqueue(c, "shop-emails", {"order": i}, schema=schema)
    # No --app: the handlers are the installed apps' jobs.py.
    proc = _manage("run-once", "--schema", schema)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["claimed"], report["succeeded"], report["remaining_due"]) == (3, 3, 0)
    # drainer's exit codes come through: 2 for a usage error, 2 for an unknown alias.
    assert _manage("run-once", "--no-such-flag").returncode == 2
    bad = _manage("--database", "nope", "status", "--schema", schema)
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_manage_py_drainer_names_itself_in_usage_and_errors() -> None:
    proc = _manage("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: manage.py drainer "), proc.stdout[:200]
    proc = _manage("run-once", "--help")
    assert proc.stdout.startswith("usage: manage.py drainer run-once "), proc.stdout[:200]
    proc = _manage("run-once", "--no-such-flag")
    assert proc.returncode == 2
    assert proc.stderr.startswith("manage.py drainer run-once: error: unrecognized arguments: "
                                  "--no-such-flag (see manage.py drainer run-once --help)")
    proc = _manage("retry", "--queue", "q", "--schema", "no_such_schema_here")
    assert proc.stderr.strip().splitlines()[-1].startswith("manage.py drainer retry: "), \
        proc.stderr


def test_call_command_runs_drainer_in_process_and_raises_on_its_exit_code(
        schema: str, pg_url: str) -> None:
    """call_command (Django's in-process API, e.g. in a data migration or a test) migrates
    the schema on DATABASES[alias]; drainer's non-zero exit code is a CommandError with it."""
    from django.core.management import CommandError, call_command

    from drainer.migrate import latest_version

    def version() -> object:
        with psycopg.connect(pg_url) as c:
            return c.execute(f'SELECT max(version) FROM "{schema}".drainer_migrations'
                             ).fetchone()

    call_command("drainer", "migrate", "--schema", schema)
    assert version() == (latest_version(),)
    call_command("drainer", "--database", "default", "migrate", "--schema", schema)
    assert version() == (latest_version(),)
    with pytest.raises(CommandError) as err:
        call_command("drainer", "--database", "nope", "status", "--schema", schema)
    assert err.value.returncode == 2


def test_a_task_handler_stands_for_its_queue(shop: str, pg_url: str) -> None:
    from django.db import transaction

    from drainer.contrib.django import enqueue
    from drainer.registry import Registry

    reg = Registry()

    @reg.task("shop-invoices")
    def send_invoice(job: object) -> None:
        pass

    with transaction.atomic():
        enqueue(send_invoice, {"order": 1}, schema=shop)
    with pytest.raises(TypeError, match="@task handler"):
        enqueue(object(), {}, schema=shop)  # type: ignore[arg-type]
    assert count_jobs(pg_url, shop, "shop-invoices") == 1
