"""The dashboard's pages, each a pure function of what it read (drainer/ui/data.py) to
HTML: queues, jobs, runs, recurring series and the awake timeline. One job whole and one
run are in drainer/ui/job_pages.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drainer.ui.actions import actions_note, button
from drainer.ui.data import STATUSES, JobFilter, JobsPage
from drainer.ui.html import (
    Frame,
    Safe,
    dl,
    h,
    join,
    link,
    page,
    pill,
    seconds,
    size,
    table,
    tag,
    when,
)

if TYPE_CHECKING:
    from drainer.audit import AuditResult
    from drainer.ui.data import Read, RunsPage, Snapshot


# -- queues ---------------------------------------------------------------------------------------


def _limits_text(lim: dict[str, Any] | None) -> str:
    if lim is None:
        return "-"
    parts = []
    if lim["max_running"] is not None:
        parts.append(f"max {lim['max_running']} running ({lim['max_running_from']})")
    if lim["rate_limit"] is not None:
        parts.append(f"{lim['rate_limit']} ({lim['rate_limit_from']})")
    if lim.get("rate_next_at"):
        parts.append(f"window full until {lim['rate_next_at']}")
    return "; ".join(parts) or "-"


def _queue_row(frame: Frame, name: str, q: dict[str, Any], lim: dict[str, Any] | None
               ) -> list[Any]:
    links = frame.links

    def count(status: str, n: int) -> Safe:
        return link(links.jobs(JobFilter(queue=name, status=status)) if n else None, n)

    top = q["top_failed_error"]
    acts = join([button(frame, "resume" if q["paused"] else "pause",
                        "resume" if q["paused"] else "pause", queue=name),
                 button(frame, f"retry {q['failed']} failed", "retry", queue=name)
                 if q["failed"] else Safe("")], " ")
    return [link(links.jobs(JobFilter(queue=name)), name), q["due"],
            q["queued"] - q["due"], count("running", q["running"]),
            count("failed", q["failed"]), count("cancelled", q.get("cancelled", 0)),
            count("done", q["done"]),
            pill("paused") if q["paused"] else "no", _limits_text(lim),
            seconds(q["oldest_due_age_s"]), when(q["next_due_at"]), q["expired_leases"],
            "-" if top is None else f"{top['jobs']}× {top['error'] or '(no last_error)'}",
            acts]


def _limit_form(frame: Frame, queues: list[str]) -> Safe:
    if frame.static or frame.actions not in ("on", "sign-in") or not queues:
        return Safe("")
    options = join(tag("option", q, value=q) for q in queues)
    return Safe(
        '<div class="act"><h2>Set a queue\'s limits</h2>'
        '<form method="get" action="/confirm/limit">'
        f'<select name="queue">{options}</select> max running <input name="max_running" '
        'size="4"> rate <input name="rate" size="7" placeholder="10/m"> '
        '<label><input type="checkbox" name="clear" value="1"> clear the operator\'s'
        '</label> <button>review…</button></form></div>')


def queues_page(frame: Frame, snap: Snapshot[dict[str, Any]]) -> str:
    st = snap.data
    lims = {lim["queue"]: lim for lim in st.get("queue_limits") or []}
    rows = [_queue_row(frame, name, q, lims.get(name)) for name, q in st["queues"].items()]
    t = st["totals"]
    rows.append([Safe("<b>all</b>"), t["due"], t["queued"] - t["due"], t["running"],
                 t["failed"], t.get("cancelled", 0), t["done"], len(st["paused_queues"]), "",
                 seconds(st["oldest_due_age_s"]), when(st["next_due_at"]),
                 t["expired_leases"], "", ""])
    body = [actions_note(frame),
            table(("queue", "due", "delayed", "running", "failed", "cancelled", "done",
                   "paused", "limits", "oldest due", "next due", "expired leases",
                   "most common error", ""), rows, numeric=(1, 2, 3, 4, 5, 6, 11)),
            _limit_form(frame, list(st["queues"])),
            tag("h2", "The jobs table"),
            dl([("table", f"{st['schema']}.{st['table']} (schema version "
                          f"{st['schema_version']})"),
                ("size", f"{size(st['table_bytes'])} + indexes {size(st['index_bytes'])}"),
                ("dead tuples", f"{st['n_dead_tup']} (live {st['n_live_tup']})"),
                ("last autovacuum", st["last_autovacuum"] or "never"),
                ("last vacuum", st["last_vacuum"] or "never"),
                ("other drainer sessions", st["drainer_sessions"]),
                ("oldest open transaction", "none" if st["oldest_xact_age_s"] is None
                 else seconds(st["oldest_xact_age_s"]))])]
    return page(frame, "queues", "Queues", join(body), snap.read)


# -- jobs -----------------------------------------------------------------------------------------


def job_rows(frame: Frame, jobs: JobsPage, *, show_run: bool = True) -> Safe:
    links = frame.links
    rows = []
    for r in jobs.rows:
        status = join([pill(r["status"]), Safe(" due") if r["due"] else
                       Safe(" delayed") if r["status"] == "queued" else ""])
        row = [link(links.job(r["id"]), r["id"]), r["queue"], status,
               f"{r['attempts']}/{r['max_attempts']}", when(r["run_at"]),
               when(r["finished_at"])]
        if show_run:
            row.append(link(links.run(r["run_id"]), r["run_id"]) if r["run_id"] else "-")
        row.append(r["error"] or "")
        rows.append(row)
    headers = ["id", "queue", "status", "attempts", "run at", "finished",
               *(["run"] if show_run else []), "last error (first line)"]
    pager = join([link(links.jobs(jobs.newer), "← newer") if jobs.newer else "",
                  link(links.jobs(jobs.older), "older →") if jobs.older else ""], " · ")
    first = links.jobs(jobs.filter.first_page())
    back = link(first, "newest") if jobs.filter.before or jobs.filter.after else ""
    return join([table(headers, rows, numeric=(0,)),
                 tag("p", join([pager, Safe(" · ") if pager and back else "", back]))])


def _filter_form(frame: Frame, f: JobFilter) -> Safe:
    if frame.static:
        pages = [(s, frame.links.jobs(JobFilter(status=s))) for s in STATUSES]
        return tag("p", join([h("Static pages: "), join(
            (link(href, s) for s, href in pages if href), " · ")]), class_="muted")
    options = join(tag("option", s or "any status", value=s,
                       selected="selected" if s == (f.status or "") else None)
                   for s in ("", *STATUSES))
    return Safe(
        '<form class="filters" method="get" action="/jobs">'
        f'queue <input name="queue" value="{h(f.queue or "")}"> '
        f'<select name="status">{options}</select> '
        f'run <input name="run" value="{h(f.run_id or "")}"> '
        f'error contains <input name="error" value="{h(f.error or "")}"> '
        '<button>filter</button> <a href="/jobs">clear</a></form>')


def jobs_page(frame: Frame, snap: Snapshot[JobsPage]) -> str:
    f = snap.data.filter
    said = [f"queue {f.queue}" if f.queue else "", f"status {f.status}" if f.status else "",
            f"run {f.run_id}" if f.run_id else "", f"error contains {f.error!r}" if f.error
            else ""]
    title = "Jobs" + (": " + ", ".join(s for s in said if s) if any(said) else "")
    body = join([_filter_form(frame, f), job_rows(frame, snap.data)])
    return page(frame, "jobs", title, body, snap.read)


# -- runs -----------------------------------------------------------------------------------------

RUNS_NOTE = (
    "A run is one drain (its run_id is the run report's). Each job keeps the id of the run "
    "that last claimed it: what a run claimed (its jobs), did (done, failed, cancelled) and "
    "left (queued again for a retry, a snooze or a release; running under a live lease, or "
    "under an expired one that the next run's reaper returns). A job claimed again by a "
    "later run counts for that run only; a run that claimed nothing leaves no trace here.")


def run_row(frame: Frame, r: dict[str, Any]) -> list[Any]:
    return [link(frame.links.run(r["run_id"]), r["run_id"]), ", ".join(r["queues"]),
            r["claimed"], r["done"], r["failed"], r["cancelled"], r["left_queued"],
            r["left_running"], r["left_expired"], r["attempts"],
            when(r["first_finished_at"]), when(r["last_finished_at"])]


RUN_HEADERS = ("run", "queues", "claimed", "done", "failed", "cancelled", "left queued",
               "left running", "lease expired", "attempts", "first finished",
               "last finished")


def runs_page(frame: Frame, snap: Snapshot[RunsPage]) -> str:
    rp = snap.data
    pager = join([link(frame.links.runs(rp.page - 1), "← newer") if rp.page > 1 else "",
                  link(frame.links.runs(rp.page + 1), "older →") if rp.more else ""], " · ")
    body = join([tag("p", RUNS_NOTE, class_="muted"),
                 table(RUN_HEADERS, (run_row(frame, r) for r in rp.rows),
                       numeric=range(2, 10)), tag("p", pager)])
    return page(frame, "runs", "Runs", body, snap.read)


# -- recurring ------------------------------------------------------------------------------------


def _schedule(s: dict[str, Any]) -> str:
    if s["cron"] is None:
        return "- (start drainer ui with --app to show the definitions)" \
            if s["defined"] is None else "-"
    text = f"{s['cron']} ({s['timezone']})"
    if s["defined"] is False:
        return "not in the app: its future occurrences go at the next drain"
    return text + (" (unserved: no handler)" if s["served"] is False else "")


def recurring_page(frame: Frame, snap: Snapshot[list[dict[str, Any]]]) -> str:
    links = frame.links
    rows = []
    for s in snap.data:
        nxt = join([when(s["next_at"]), Safe(" ") if s["next_at"] else "",
                    link(links.job(s["next_id"]), f"job {s['next_id']}") if s["next_id"]
                    else Safe(' <span class="muted">(after the next drain)</span>')
                    if s["next_at"] else ""])
        last = Safe("-") if s["last_status"] is None else join([
            pill(s["last_status"]), " for ", when(s["last_scheduled_for"]), " ",
            link(links.job(s["last_id"]), f"job {s['last_id']}") if s["last_id"] else "",
            f": {s['last_error'].splitlines()[0][:200]}"
            if s["last_status"] == "failed" and s["last_error"] else ""])
        rows.append([s["key"], s["queue"] or "-", _schedule(s), nxt, last,
                     s["done"] or 0, s["failed"] or 0])
    body = join([tag("p", "Each series' next occurrence is an ordinary queued job; every "
                 "drain creates the one after it. Last outcome: its latest finished "
                 "occurrence.", class_="muted"),
                 table(("series", "queue", "schedule", "next fire time", "last outcome",
                        "done", "failed"), rows, numeric=(5, 6))])
    return page(frame, "recurring", "Recurring series", body, snap.read)


# -- the awake timeline ---------------------------------------------------------------------------


def awake_page(frame: Frame, snap: Snapshot[AuditResult] | None, read: Read,
               default_s: float) -> str:
    from drainer.audit.html import render_section

    explain = tag("p", "What kept the database compute awake: pg_stat_activity sampled "
                  "every 0.5 s and judged by the rules of a serverless compute's activity "
                  "monitor (as `drainer audit --html`). Sampling holds this page's one "
                  "connection open for as long as it samples, and that connection is "
                  "activity too; nothing is sampled until you ask.", class_="muted")
    form = Safe("") if frame.static else Safe(
        '<form method="get" action="/awake">sample for <input name="seconds" size="4" '
        f'value="{default_s:g}"> seconds (at most 60) <button name="sample" value="1">'
        "sample now</button></form>")
    if snap is None:
        none = tag("p", "Not sampled on this page (drainer ui --static --sample-seconds N "
                   "writes one)." if frame.static else "Not sampled yet.", class_="note")
        return page(frame, "awake", "Awake timeline", join([explain, form, none]), read)
    section = Safe(render_section(f"{snap.data.duration_s:.0f} s from {snap.data.started_at}",
                                  snap.data))
    return page(frame, "awake", "Awake timeline", join([explain, form, section]), snap.read)
