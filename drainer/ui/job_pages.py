"""One job whole, one run, and the pages around the actions: confirm, result, sign-in and
errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drainer.ui.actions import Action, actions_note, button, confirm_body, report
from drainer.ui.data import FOLLOWUP_WINDOW
from drainer.ui.html import (
    Frame,
    Safe,
    dl,
    h,
    join,
    link,
    page,
    pill,
    pre_json,
    table,
    tag,
    when,
)
from drainer.ui.pages import RUN_HEADERS, job_rows, run_row

if TYPE_CHECKING:
    from drainer.ui.data import JobView, Read, RunView, Snapshot


def trace_id(trace_context: dict[str, Any] | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``)."""
    parent = (trace_context or {}).get("traceparent")
    parts = parent.split("-") if isinstance(parent, str) else []
    return parts[1] if len(parts) == 4 else None


def _followups(frame: Frame, view: JobView) -> Safe:
    job = view.job
    assert job is not None
    if job["status"] != "done":
        return tag("p", "A job's follow-ups (job.enqueue) are inserted when it succeeds; "
                   "this one has not (yet).", class_="muted")
    if not view.followups:
        return tag("p", "None found: drainer does not record which job enqueued a "
                   "follow-up; a follow-up is created by the statement that completes its "
                   f"job, and none of the {FOLLOWUP_WINDOW:,} jobs after this one was.",
                   class_="muted")
    whose = ("this job's (it was the only job completed by that statement)"
             if view.completed_with == 1 else
             f"this job's or those of the {view.completed_with} jobs completed by the "
             "same statement (drainer does not record which job enqueued one)")
    rows = [[link(frame.links.job(f["id"]), f["id"]), f["queue"], pill(f["status"]),
             when(f["created_at"])] for f in view.followups]
    return join([tag("p", f"Jobs created by the statement that completed this job: {whose}.",
                     class_="muted"),
                 table(("id", "queue", "status", "created"), rows, numeric=(0,))])


def _attempts(job: dict[str, Any], task_limit: int | None) -> str:
    if task_limit is not None:
        return (f"{job['attempts']} of {task_limit} (the task's max_attempts; the row's "
                f"column says {job['max_attempts']})")
    return (f"{job['attempts']} of {job['max_attempts']} (the row's max_attempts; a task's "
            "max_attempts overrides it at run time: start drainer ui with --app to show it)")


def _job_fields(frame: Frame, job: dict[str, Any], task_limit: int | None) -> Safe:
    attempts = _attempts(job, task_limit)
    lease = when(job["locked_until"])
    if job["lease_expired"]:
        lease = join([lease, " (expired: the next run's reaper returns it)"])
    tid = trace_id(job["trace_context"])
    return dl([
        ("status", pill(job["status"])), ("queue", job["queue"]), ("attempts", attempts),
        ("fence", f"{job['fence']} (claims so far; every outcome is fenced on it)"),
        ("run", link(frame.links.run(job["run_id"]), job["run_id"]) if job["run_id"]
         else "- (never claimed)"),
        ("priority", job["priority"]), ("run at", when(job["run_at"])),
        ("created", when(job["created_at"])), ("finished", when(job["finished_at"])),
        ("lease until", lease), ("dedup key", job["dedup_key"]),
        ("snoozes", f"{job['snoozes']} (last {job['snoozed_at'] or '-'})"),
        ("suspect", "yes: it was reaped, it is claimed only where it starts at once"
         if job["suspect"] else "no"),
        ("rate limited until", when(job["rate_limited_until"])),
        ("recurring", f"{job['recurring_key']} for {job['scheduled_for']}"
         if job["recurring_key"] else "-"),
        ("trace id", tid or "- (enqueued outside a traced span)"),
    ])


def job_page(frame: Frame, snap: Snapshot[JobView], job_id: int,
             attempts_limits: dict[str, int | None] | None = None) -> str:
    """``attempts_limits``: each queue's task max_attempts (the app's, with --app)."""
    job = snap.data.job
    if job is None:
        return page(frame, "jobs", f"Job {job_id}",
                    tag("p", f"No job {job_id} in the table (archived or purged, or never "
                        "there).", class_="note bad"), snap.read)
    acts = join([button(frame, "retry…", "retry", job=job["id"])
                 if job["status"] in ("failed", "cancelled") else "",
                 button(frame, "cancel…", "cancel", job=job["id"])
                 if job["status"] in ("queued", "running") else ""], " ")
    error = (tag("pre", job["last_error"]) if job["last_error"] is not None
             else tag("p", "none", class_="muted"))
    result = (pre_json(job["result"]) if job["result"] is not None
              else tag("p", "none (the handler returned nothing, or has not run)",
                       class_="muted"))
    body = join([
        actions_note(frame), tag("p", acts) if acts else "",
        _job_fields(frame, job, (attempts_limits or {}).get(job["queue"])),
        tag("h2", "Payload"), pre_json(job["payload"]),
        tag("h2", "Result"), result,
        tag("h2", "Last error and traceback"), error,
        tag("h2", "Trace context"), pre_json(job["trace_context"])
        if job["trace_context"] else tag("p", "none", class_="muted"),
        tag("h2", "Follow-ups"), _followups(frame, snap.data),
    ])
    return page(frame, "jobs", f"Job {job['id']}", body, snap.read)


def run_page(frame: Frame, snap: Snapshot[RunView], run_id: str) -> str:
    s = snap.data.summary
    if s is None:
        body = tag("p", "No job in the table names this run (it claimed nothing, its jobs "
                   "were claimed again by later runs, or were archived).", class_="note")
    else:
        row = run_row(frame, s)
        body = join([dl(zip(RUN_HEADERS[1:], row[1:], strict=True)),
                     tag("h2", "Its jobs"), job_rows(frame, snap.data.jobs, show_run=False)])
    return page(frame, "runs", f"Run {run_id}", body, snap.read)


# -- actions and the rest -------------------------------------------------------------------------


def confirm_page(frame: Frame, action: Action, preview: dict[str, Any] | None,
                 read: Read) -> str:
    return page(frame, "", action.title() + "?", confirm_body(frame, action, preview), read)


def result_page(frame: Frame, action: Action, result: dict[str, Any], read: Read) -> str:
    back = (frame.links.job(action.job) if action.job is not None else frame.links.queues())
    body = join([report(result), tag("p", link(back, "back"))])
    return page(frame, "", action.title() + ": done", body, read)


def login_page(frame: Frame, next_path: str, error: str | None, read: Read) -> str:
    note = tag("p", error, class_="note bad") if error else ""
    why = ("Viewing and actions need the UI token here." if frame.view_needs_token
           else "Actions (retry, cancel, pause, limits) need the UI token.")
    form = Safe(
        '<form method="post" action="/login">'
        f'<input type="hidden" name="next" value="{h(next_path)}">'
        '<label>DRAINER_UI_TOKEN <input type="password" name="token" '
        'autocomplete="current-password" size="40" autofocus></label> '
        '<button>sign in</button></form>'
        '<p class="muted">The browser keeps a signed cookie (HttpOnly, SameSite=Strict, 12 h), '
        "not the token.</p>")
    return page(frame, "", "Sign in", join([note, tag("p", why), form]), read)


def error_page(frame: Frame, title: str, message: str, read: Read) -> str:
    return page(frame, "", title, tag("p", message, class_="note bad"), read)
