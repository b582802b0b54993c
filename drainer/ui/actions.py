"""The dashboard's actions: retry, cancel, pause, resume and limits, each in two steps.

A page links to ``GET /confirm/<action>?...``, which says what the action will do (for
retry and cancel: the library's own dry run) and holds the form that ``POST``s it to
``/act/<action>``. Performing one calls the functions ``drainer retry``, ``cancel``,
``pause``, ``resume`` and ``limit`` call (drainer/ops.py), so it is fenced as theirs are:
retry takes failed jobs only (a job named: a cancelled one too) and skips those whose
cancelled owner still holds a lease,
cancel takes queued and running jobs only, and a running job's owner learns it at its
next heartbeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from drainer.errors import ConfigError
from drainer.ui.html import Frame, Safe, dl, h, join, tag

if TYPE_CHECKING:
    from drainer.settings import Settings

ACTIONS = ("retry", "cancel", "pause", "resume", "limit")
#: The largest job id (the id column is a bigint).
MAX_JOB_ID = 2**63 - 1


def _job_id(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_JOB_ID:
        raise ConfigError(f"job: not a job id: {text[:40]!r}")
    return int(text)


def _flag(text: str | None) -> bool:
    return (text or "").lower() in ("1", "on", "true", "yes")


@dataclass(frozen=True)
class Action:
    """One action and what it is on: a job (retry, cancel) or a queue (retry its failed
    jobs, pause, resume, limit)."""

    kind: str
    job: int | None = None
    queue: str | None = None
    max_running: int | None = None
    rate: str | None = None
    clear_max_running: bool = False
    clear_rate: bool = False

    @classmethod
    def parse(cls, kind: str, params: Mapping[str, str]) -> Action:
        """From the query or the form; ConfigError (a 400 page) for anything malformed."""
        from drainer.queue_limits import parse_max_running, parse_rate

        if kind not in ACTIONS:
            raise ConfigError(f"no such action: {kind[:40]!r}")
        job = _job_id(params.get("job"))
        queue = (params.get("queue") or "").strip() or None
        if kind == "retry" and (job is None) == (queue is None):
            raise ConfigError("retry: name a job or a queue (its failed jobs)")
        if kind == "cancel" and (job is None or queue is not None):
            raise ConfigError("cancel: name a job")
        if kind in ("pause", "resume", "limit") and (queue is None or job is not None):
            raise ConfigError(f"{kind}: name a queue")
        max_running = rate = None
        try:
            if (params.get("max_running") or "").strip():
                max_running = parse_max_running(params["max_running"])
            if (params.get("rate") or "").strip():
                rate = str(parse_rate(params["rate"].strip()))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        clear = _flag(params.get("clear"))
        action = cls(kind, job, queue, max_running, rate,
                     clear or _flag(params.get("clear_max_running")),
                     clear or _flag(params.get("clear_rate")))
        if kind == "limit" and ((max_running is not None and action.clear_max_running)
                                or (rate is not None and action.clear_rate)):
            raise ConfigError("limit: set a limit or clear it, not both")
        if kind == "limit" and not (max_running or rate or action.clear_max_running
                                    or action.clear_rate):
            raise ConfigError("limit: give a max running, a rate, or clear them")
        return action

    def fields(self) -> dict[str, str]:
        """The action as form fields (and query parameters)."""
        out = {"job": self.job, "queue": self.queue, "max_running": self.max_running,
               "rate": self.rate, "clear_max_running": "1" if self.clear_max_running else None,
               "clear_rate": "1" if self.clear_rate else None}
        return {k: str(v) for k, v in out.items() if v is not None}

    def title(self) -> str:
        if self.kind == "retry" and self.job is not None:
            return f"Retry job {self.job}"
        if self.kind == "retry":
            return f"Retry the failed jobs of queue {self.queue}"
        if self.kind == "cancel":
            return f"Cancel job {self.job}"
        return f"{self.kind.capitalize()} queue {self.queue}"

    def explain(self) -> str:
        """What it does, in the words of the CLI's help."""
        return {
            "retry": "Failed jobs go back to queued, attempts reset to 0, due now (as "
                     "`drainer retry`). Jobs whose dedup key is held by another queued or "
                     "running job, and jobs cancelled while running whose owner's lease has "
                     "not run out, are skipped.",
            "cancel": "A queued or running job becomes cancelled, last_error 'cancelled' "
                      "(as `drainer cancel`): a retry of the queue's failed jobs leaves it, a "
                      "retry of the job takes it back. A running job's owner learns it at "
                      "its next heartbeat and its outcome is not written. Finished jobs are "
                      "left alone.",
            "pause": "No drainer claims this queue's jobs from its next run on (a run reads "
                     "the paused queues once, at its start); jobs keep arriving and wait "
                     "(as `drainer pause`).",
            "resume": "Drainers claim this queue's jobs again from their next run (as "
                      "`drainer resume`).",
            "limit": "The operator's limits of the queue, across all drainers, from each "
                     "drainer's next run; they override the settings' and the task's (as "
                     "`drainer limit`). Cleared: the setting's or the task's applies again.",
        }[self.kind]

    def changes(self) -> list[tuple[str, str]]:
        if self.kind != "limit":
            return []
        out = []
        if self.max_running is not None:
            out.append(("max_running", f"set to {self.max_running}"))
        if self.rate is not None:
            out.append(("rate", f"set to {self.rate}"))
        if self.clear_max_running:
            out.append(("max_running", "cleared (the setting's or the task's applies)"))
        if self.clear_rate:
            out.append(("rate", "cleared (the setting's or the task's applies)"))
        return out

    def preview(self, settings: Settings) -> dict[str, Any] | None:
        """What it would do now (retry, cancel: the library's dry run; limit: the limits as
        they are), from one connection; None for pause and resume (nothing to read)."""
        from drainer import ops

        if self.kind == "retry":
            return ops.retry_jobs(settings, ids=[self.job] if self.job else None,
                                  queue=self.queue, dry_run=True)
        if self.kind == "cancel":
            assert self.job is not None
            return ops.cancel_jobs(settings, [self.job], dry_run=True)
        if self.kind == "limit":
            assert self.queue is not None
            return ops.limit(settings, [self.queue])
        return None

    def perform(self, settings: Settings) -> dict[str, Any]:
        """Do it, through the CLI's own library functions; their report."""
        from drainer import ops

        if self.kind == "retry":
            return ops.retry_jobs(settings, ids=[self.job] if self.job else None,
                                  queue=self.queue)
        if self.kind == "cancel":
            assert self.job is not None
            return ops.cancel_jobs(settings, [self.job])
        assert self.queue is not None
        if self.kind == "pause":
            return ops.pause(settings, [self.queue])
        if self.kind == "resume":
            return ops.resume(settings, [self.queue])
        return ops.limit(settings, [self.queue], max_running=self.max_running,
                         rate=self.rate, clear_max_running=self.clear_max_running,
                         clear_rate=self.clear_rate)


def confirm_href(kind: str, **params: Any) -> str:
    return f"/confirm/{kind}?" + urlencode({k: v for k, v in params.items() if v is not None})


def button(frame: Frame, label: str, kind: str, **params: Any) -> Safe:
    """A link to an action's confirm step; nothing where actions are off (a static page,
    no UI token set)."""
    if frame.static or frame.actions not in ("on", "sign-in"):
        return Safe("")
    return tag("a", label, href=confirm_href(kind, **params), class_="act")


def actions_note(frame: Frame) -> Safe:
    """Why the page has no action links, if it has none."""
    if frame.static:
        return Safe('<p class="note">A static page: actions (retry, cancel, pause, limits) '
                    "are on <code>drainer ui</code>.</p>")
    if frame.actions in ("on", "sign-in"):
        return Safe("")
    return tag("p", f"Actions are off: {frame.actions}.", class_="note")


def report(result: Mapping[str, Any]) -> Safe:
    """The library's report of an action (counts, ids, limits), as a definition list."""
    items: list[tuple[str, Any]] = []
    for key, value in result.items():
        if key == "limits" and isinstance(value, list):
            for e in value:
                items.append((f"limits of {e['queue']}",
                              f"max_running {e['max_running'] or '-'}, rate "
                              f"{e['rate_limit'] or '-'} (operator's; '-': the setting's or "
                              "the task's applies)"))
        elif isinstance(value, list):
            items.append((key.replace("_", " "), ", ".join(map(str, value)) or "-"))
        else:
            items.append((key.replace("_", " "), value))
    return dl(items)


def confirm_body(frame: Frame, action: Action, preview: Mapping[str, Any] | None) -> Safe:
    """The confirm step: what the action does, what it would do now, and its form."""
    hidden = join(Safe(f'<input type="hidden" name="{h(k)}" value="{h(v)}">')
                  for k, v in action.fields().items())
    parts = [tag("p", action.explain())]
    if action.changes():
        parts.append(tag("h2", "Changes"))
        parts.append(dl(action.changes()))
    if preview is not None:
        parts.append(tag("h2", "Limits now" if action.kind == "limit"
                         else "What it would do now (a dry run: nothing changed yet)"))
        parts.append(report(preview))
    parts.append(Safe(
        f'<form method="post" action="/act/{h(action.kind)}">{hidden}'
        f'<input type="hidden" name="csrf" value="{h(frame.csrf)}">'
        f'<button type="submit" name="confirm" value="yes">{h(action.title())}</button> '
        '<a href="/">no, back to the queues</a></form>'))
    return join(parts)
