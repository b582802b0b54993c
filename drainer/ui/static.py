"""``drainer ui --static DIR``: the dashboard's pages written as files, for a CronJob or CI
to publish, so that looking at them wakes nothing.

The same pages as the server's (drainer/ui/pages.py), with links between files and no
forms: the queues, the job lists the queues page links to (all jobs, by status, by queue
and status), each job on them, the runs and each of them, the recurring series and the
awake timeline (sampled only with ``sample_s``). Read through one connection, closed
before the first file is written (the queues' figures and a sample each take one more).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drainer.errors import ConfigError
from drainer.ui import data
from drainer.ui.data import STATUSES, JobFilter, Read, Snapshot
from drainer.ui.html import Frame, relative_times

if TYPE_CHECKING:
    from drainer.db import Queries
    from drainer.registry import Registry
    from drainer.settings import Settings
    from drainer.ui.routes import ExtraPage

#: Pages of the whole job list written at most (newest first).
MAX_LIST_PAGES = 10


def safe_name(text: str) -> str:
    """A file-name part for any text: letters, digits, - and _ kept, the rest as ~hex."""
    return re.sub(r"[^A-Za-z0-9_-]", lambda m: "".join(f"~{b:02x}" for b in
                                                         m[0].encode("utf-8")), text)


@dataclass
class StaticLinks:
    """The files of a static site (html.Links): None for a page that was not written."""

    lists: dict[JobFilter, str] = field(default_factory=dict)
    jobs_written: set[int] = field(default_factory=set)
    runs_written: set[str] = field(default_factory=set)

    def queues(self) -> str:
        return "index.html"

    def jobs(self, f: JobFilter) -> str | None:
        return self.lists.get(f)

    def job(self, job_id: int) -> str | None:
        return f"job-{job_id}.html" if job_id in self.jobs_written else None

    def runs(self, page: int = 1) -> str | None:
        return "runs.html" if page == 1 else None

    def run(self, run_id: str) -> str | None:
        return f"run-{safe_name(run_id)}.html" if run_id in self.runs_written else None

    def recurring(self) -> str:
        return "recurring.html"

    def awake(self) -> str:
        return "awake.html"


def _list_name(f: JobFilter, page: int) -> str:
    parts = ["jobs"]
    if f.queue is not None:
        parts.append("q-" + safe_name(f.queue))
    if f.status is not None:
        parts.append(f.status)
    if page > 1:
        parts.append(f"p{page}")
    return "-".join(parts) + ".html"


def _lists_wanted(status: dict[str, Any]) -> list[JobFilter]:
    """The job lists the queues page and the jobs page link to."""
    wanted = [JobFilter(), *(JobFilter(status=s) for s in STATUSES)]
    for name, q in status["queues"].items():
        wanted.append(JobFilter(queue=name))
        wanted += [JobFilter(queue=name, status=s) for s in ("running", "failed", "done")
                   if q[s]]
    return wanted


@dataclass
class _Reads:
    lists: list[tuple[JobFilter, str, data.JobsPage]] = field(default_factory=list)
    jobs: dict[int, data.JobView] = field(default_factory=dict)
    runs: data.RunsPage | None = None
    run_views: dict[str, data.RunView] = field(default_factory=dict)
    recurring: list[dict[str, Any]] = field(default_factory=list)


def _read_all(settings: Settings, q: Queries, status: dict[str, Any],
              registry: Registry | None) -> _Reads:
    out = _Reads()
    for wanted in _lists_wanted(status):
        f: JobFilter | None = wanted
        pages = MAX_LIST_PAGES if wanted == JobFilter() else 1
        for n in range(1, pages + 1):
            if f is None:
                break
            page = data.jobs(settings, f, q).data
            out.lists.append((f, _list_name(wanted, n), page))
            f = page.older
    out.runs = data.runs(settings, 1, q).data
    for r in out.runs.rows:
        out.run_views[r["run_id"]] = data.run(settings, r["run_id"], shared=q).data
    out.recurring = data.recurring(settings, registry, q).data
    ids = {row["id"] for _f, _n, page in out.lists for row in page.rows}
    ids |= {s[k] for s in out.recurring for k in ("next_id", "last_id") if s.get(k)}
    for job_id in sorted(ids):
        out.jobs[job_id] = data.job(settings, job_id, q).data
    return out


def extra_file(page: ExtraPage) -> str:
    """The file an extra page (the fleet view) is written to."""
    return safe_name(page.path.strip("/")) + ".html"


def write_static(settings: Settings, directory: str | Path, *,
                 registry: Registry | None = None, sample_s: float = 0.0,
                 extra_pages: Sequence[ExtraPage] = ()) -> list[Path]:
    """Read everything, close the connection, write the pages; the files written. Each of
    ``extra_pages`` (the fleet view) reads its own database as it renders, after that."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--static: cannot create {out}: {exc.strerror or exc}") from None
    queues = data.queues(settings, registry)
    started = time.monotonic()
    with data.one_connection(settings) as q:
        reads = _read_all(settings, q, queues.data, registry)
    read = Read(datetime.now(timezone.utc), time.monotonic() - started)
    awake = data.awake(settings, sample_s) if sample_s > 0 else None
    links = StaticLinks(jobs_written=set(reads.jobs), runs_written=set(reads.run_views))
    for i, (f, name, page) in enumerate(reads.lists):
        links.lists[f] = name
        if i and page.newer is not None and reads.lists[i - 1][2].older == f:
            links.lists[page.newer] = reads.lists[i - 1][1]
    frame = Frame(links, static=True,
                  extra_nav=[(p.title, extra_file(p)) for p in extra_pages])
    token = relative_times.set(False)
    try:
        files = _render(frame, queues, reads, read, awake, sample_s, registry)
        files.update({extra_file(p): p.render({}, frame) for p in extra_pages})
    finally:
        relative_times.reset(token)
    written = []
    for name, html in files.items():
        path = out / name
        try:
            path.write_text(html, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--static: cannot write {path}: {exc.strerror or exc}"
                              ) from None
        written.append(path)
    return written


def _render(frame: Frame, queues: Snapshot[dict[str, Any]], reads: _Reads, read: Read,
            awake: Snapshot[Any] | None, sample_s: float, registry: Registry | None
            ) -> dict[str, str]:
    from drainer.ui.job_pages import job_page, run_page
    from drainer.ui.pages import awake_page, jobs_page, queues_page, recurring_page, runs_page
    from drainer.ui.routes import attempts_limits

    assert reads.runs is not None
    files: dict[str, str] = {
        "index.html": queues_page(frame, queues),
        "runs.html": runs_page(frame, Snapshot(reads.runs, read)),
        "recurring.html": recurring_page(frame, Snapshot(reads.recurring, read)),
        "awake.html": awake_page(frame, awake, awake.read if awake else Read.nothing(),
                                 sample_s),
    }
    for _f, name, page in reads.lists:
        files[name] = jobs_page(frame, Snapshot(page, read))
    limits = attempts_limits(registry)
    for job_id, view in reads.jobs.items():
        files[f"job-{job_id}.html"] = job_page(frame, Snapshot(view, read), job_id, limits)
    for run_id, rv in reads.run_views.items():
        files[f"run-{safe_name(run_id)}.html"] = run_page(frame, Snapshot(rv, read), run_id)
    return files
