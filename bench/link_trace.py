"""Where a drain across a link waits: one drain traced, statement by statement.

    python -m bench.link_trace [JOBS] [RTT_MS] [--events]

Drains JOBS no-op jobs (default 20,000) in this process through bench/proxy.py at RTT_MS
(default 10; 0: directly), with the drain's statements recorded as they go: each claim
(in step, with completions, or ahead in the pipeline), its size, how many jobs came back,
how many statements were in flight when it went, and how long its read waited. Prints a
summary (statements by kind, claim sizes, the time the drain spent waiting on reads) and,
with ``--events``, every statement. It changes nothing in the drain: the hooks wrap the
pipeline's and the connection's methods and pass everything through.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Any

from bench.core import ab_database, fill, prepare_tree
from bench.link import via
from bench.proxy import DelayProxy

SERVER = os.environ.get("BENCH_SERVER_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class Trace:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.waited: collections.Counter[str] = collections.Counter()

    def note(self, kind: str, **kw: Any) -> None:
        self.events.append((time.monotonic() - self.t0, kind, kw))


def hook(trace: Trace) -> None:
    from drainer.db import _pipeline, queries

    send, receive = _pipeline.ClaimPipeline.send, _pipeline.ClaimPipeline.receive

    def traced_send(self: Any, ids: Any, fences: Any, queue: str, batch_size: int,
                    *a: Any, **kw: Any) -> None:
        trace.note("ahead", size=batch_size, done=len(ids), in_flight=self.in_flight)
        send(self, ids, fences, queue, batch_size, *a, **kw)

    def traced_receive(self: Any) -> Any:
        t = time.monotonic()
        out = receive(self)
        w = time.monotonic() - t
        trace.waited["pipeline read"] += w
        trace.note("read", got=len(out[1]), done=len(out[0]), waited_ms=round(w * 1e3, 2),
                   left=self.in_flight)
        return out

    _pipeline.ClaimPipeline.send = traced_send  # type: ignore[method-assign]
    _pipeline.ClaimPipeline.receive = traced_receive  # type: ignore[method-assign]
    exec_ = queries.Queries._exec

    def traced_exec(self: Any, name: str, params: Any = None) -> Any:
        t = time.monotonic()
        cur = exec_(self, name, params)
        w = time.monotonic() - t
        trace.waited[name] += w
        p = params or {}
        trace.note(name, size=p.get("batch_size"), done=len(p.get("ids") or ()),
                   got=cur.rowcount, waited_ms=round(w * 1e3, 2))
        return cur

    queries.Queries._exec = traced_exec  # type: ignore[method-assign]
    import drainer.db
    from drainer.drain import end, start

    def timed(owner: Any, name: str) -> None:
        f = getattr(owner, name)

        def wrapped(*a: Any, **kw: Any) -> Any:
            t = time.monotonic()
            out = f(*a, **kw)
            w = time.monotonic() - t
            trace.waited[name] += w
            trace.note(name, waited_ms=round(w * 1e3, 2))
            return out

        setattr(owner, name, wrapped)

    timed(drainer.db, "connect")
    timed(start, "send")
    timed(end, "finish")


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    n = int(args[0]) if args else 20_000
    rtt = float(args[1]) if len(args) > 1 else 10.0
    url = ab_database(SERVER, "drainer_bench_link_trace")
    schema = "b_link_trace"
    tree = os.path.dirname(os.path.dirname(os.path.abspath(__import__("drainer").__file__)))
    prepare_tree(tree, url, schema)
    fill(url, schema, n)
    proxy = DelayProxy(rtt, ("127.0.0.1", 5432)) if rtt > 0 else None
    if proxy is not None:
        proxy.start()
    try:
        from drainer.drain import run_once
        from drainer.settings import Settings

        settings = Settings(database_url=url if proxy is None else via(url, proxy),
                            schema_name=schema, app="bench.noop_app")
        trace = Trace()
        hook(trace)
        t = time.perf_counter()
        report = run_once(settings)
        wall = time.perf_counter() - t
    finally:
        if proxy is not None:
            proxy.settle()
            sessions = proxy.take()
            proxy.stop()
    kinds = collections.Counter(k for _t, k, _kw in trace.events if k != "read")
    print(f"{report.succeeded:,} jobs in {wall:.3f} s ({report.succeeded / wall:,.0f} jobs/s), "
          f"RTT {rtt:g} ms = {wall * 1e3 / rtt if rtt else 0:.0f} round trips")
    if proxy is not None:
        print(f"proxy: {sum(s.statements for s in sessions)} statements, "
              f"{sum(s.parses for s in sessions)} parses, {len(sessions)} sessions")
    print("statements:", dict(kinds))
    sizes = [kw["size"] for _t, k, kw in trace.events if kw.get("size")]
    print("claim sizes:", sizes)
    print("waited (s):", {k: round(v, 3) for k, v in trace.waited.items()})
    if "--events" in argv:
        for t, k, kw in trace.events:
            print(f"{t * 1e3:9.1f} ms {k:28s} {kw}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
