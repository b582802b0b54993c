"""The run report pushed to a Prometheus Pushgateway: a real one, and a stdlib server."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from drainer import Job, run_once
from drainer.producer import JobSpec, enqueue_many
from drainer.registry import Registry
from drainer.settings import Settings
from tests.conftest import make_settings, missing_component

PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")

_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*)\})?'
    r' (?P<value>[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|\+Inf|-Inf))'
    r'(?: (?P<ts>-?[0-9]+))?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')


def parse_exposition(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A strict reader of the Prometheus text format 0.0.4: every line must be valid,
    every sample must follow its family's HELP and TYPE lines."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: dict[str, str] = {}
    helped: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            helped.add(line.split(" ", 3)[2])
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "untyped", "summary", "histogram"), line
            typed[name] = kind
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, f"not a valid sample line: {line!r}"
        name = m.group("name")
        family = name
        for suffix in ("_sum", "_count", "_bucket"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and typed.get(base) in ("summary", "histogram"):
                family = base
        assert family in typed and family in helped, f"{name} without HELP/TYPE"
        labels = frozenset(_LABEL.findall(m.group("labels") or ""))
        key = (name, labels)
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(m.group("value"))
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def fill(conn: psycopg.Connection[Any], s: Settings, ok: int, bad: int) -> None:
    enqueue_many(conn, [JobSpec("ok", {}) for _ in range(ok)]
                 + [JobSpec("bad", {}) for _ in range(bad)], schema=s.schema_name)


@pytest.fixture
def handlers(registry: Registry) -> Registry:
    @registry.task("ok")
    def ok(job: Job) -> None:
        pass

    @registry.task("bad")
    def bad(job: Job) -> None:
        raise RuntimeError("nope")

    return registry


class _Recorder(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    status = 200

    def do_PUT(self) -> None:
        self._record()

    def do_POST(self) -> None:
        self._record()

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append({"method": self.command, "path": self.path,
                              "content_type": self.headers.get("Content-Type"),
                              "body": body.decode()})
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, Any]], type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"requests": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests, handler
    finally:
        server.shutdown()
        server.server_close()


def test_push_reaches_a_stdlib_server_in_exposition_format(
        pg_url: str, schema: str, conn: psycopg.Connection[Any], handlers: Registry,
        recorder: tuple[str, list[dict[str, Any]], type[_Recorder]]) -> None:
    from drainer.migrate import migrate

    url, requests, _ = recorder
    s = make_settings(pg_url, schema, pushgateway_url=url, pushgateway_instance="cron-a")
    migrate(conn, s.schema_name, s.table)
    fill(conn, s, ok=3, bad=2)
    report = run_once(s, registry=handlers)
    assert (report.succeeded, report.retried) == (3, 2)
    [req] = requests
    assert req["method"] == "PUT"  # replaces the group: the gateway holds the last run
    assert req["path"] == "/metrics/job/drainer/instance/cron-a"
    assert req["content_type"].startswith("text/plain; version=0.0.4")
    samples = parse_exposition(req["body"])
    assert value(samples, "drainer_run_jobs", outcome="claimed") == 5
    assert value(samples, "drainer_run_jobs", outcome="succeeded") == 3
    assert value(samples, "drainer_run_jobs", outcome="retried") == 2
    assert value(samples, "drainer_run_jobs", outcome="failed") == 0
    assert value(samples, "drainer_run_remaining_due_jobs") == 0
    assert value(samples, "drainer_run_next_due_timestamp_seconds") > time.time()
    assert value(samples, "drainer_run_duration_seconds") == pytest.approx(report.duration_s)
    assert value(samples, "drainer_run_deadline_hit") == 0
    assert value(samples, "drainer_run_info", queues="bad,ok",
                 table=f"{schema}.jobs") == 1
    assert abs(value(samples, "drainer_last_run_timestamp_seconds") - time.time()) < 30


def test_failed_push_is_a_warning_not_a_failed_run(
        pg_url: str, schema: str, conn: psycopg.Connection[Any], handlers: Registry,
        recorder: tuple[str, list[dict[str, Any]], type[_Recorder]],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from drainer.migrate import migrate

    caplog.set_level("WARNING", logger="drainer")
    url, requests, handler = recorder
    handler.status = 500
    for target in (url, f"http://127.0.0.1:{free_port()}"):  # an error, nobody listening
        s = make_settings(pg_url, schema, pushgateway_url=target)
        migrate(conn, s.schema_name, s.table)
        fill(conn, s, ok=1, bad=0)
        caplog.clear()
        report = run_once(s, registry=handlers)
        assert report.succeeded == 1
        assert "pushing metrics failed" in caplog.text
    assert len(requests) == 1
    # without prometheus-client: a warning that says how to install it
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    caplog.clear()
    assert run_once(s, registry=handlers).claimed == 0
    assert "pip install prometheus-client" in caplog.text


@pytest.fixture
def pushgateway(tmp_path: Any) -> Iterator[str]:
    if PUSHGATEWAY is None:
        missing_component("prometheus-pushgateway", "apt-get install prometheus-pushgateway; "
                          "the stdlib server test covers the push meanwhile")
    port = free_port()
    proc = subprocess.Popen(
        [PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file=",
         "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "pushgateway did not become ready"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


def gateway_samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return parse_exposition(text)


def test_push_to_a_real_pushgateway(pg_url: str, schema: str, conn: psycopg.Connection[Any],
                                    handlers: Registry, pushgateway: str) -> None:
    from drainer.migrate import migrate

    s = make_settings(pg_url, schema, pushgateway_url=pushgateway)
    migrate(conn, s.schema_name, s.table)
    fill(conn, s, ok=4, bad=1)
    run_once(s, registry=handlers)
    host = socket.gethostname()
    got = gateway_samples(pushgateway)
    assert value(got, "drainer_run_jobs", job="drainer", instance=host,
                 outcome="succeeded") == 4
    assert value(got, "drainer_run_jobs", job="drainer", instance=host, outcome="retried") == 1
    # the gateway's own record of the push, per group
    assert value(got, "push_failure_time_seconds", job="drainer", instance=host) == 0
    assert value(got, "push_time_seconds", job="drainer", instance=host) > 0
    # a second run replaces the group: no stale outcome from the first run survives
    fill(conn, s, ok=2, bad=0)
    run_once(s, registry=handlers)
    got = gateway_samples(pushgateway)
    assert value(got, "drainer_run_jobs", job="drainer", instance=host,
                 outcome="succeeded") == 2
    assert value(got, "drainer_run_jobs", job="drainer", instance=host, outcome="retried") == 0
    # another instance gets a group of its own
    other = make_settings(pg_url, schema, pushgateway_url=pushgateway,
                          pushgateway_instance="nightly")
    run_once(other, registry=handlers)
    got = gateway_samples(pushgateway)
    assert value(got, "drainer_run_jobs", instance="nightly", outcome="succeeded") == 0
    assert value(got, "drainer_run_jobs", instance=host, outcome="succeeded") == 2
