"""``drainer ui``: a dashboard that reads the database only when a person loads a page.

Server-rendered pages (queues, jobs, one job whole, runs, recurring series, the awake
timeline of ``drainer audit --html``) with retry, cancel, pause/resume and limits, each
confirmed and performed by the library functions of the CLI's commands. One short
connection per page load, closed before the page is sent; no polling; auto-refresh off
unless asked for, and never more often than the compute's idle timeout allows.
``write_static`` writes the same pages as files.

The parts: data.py (what each page reads), pages.py and job_pages.py (HTML from it),
actions.py (the confirm step and the calls into drainer.ops), auth.py (token, sign-in
cookie, CSRF, Origin/Host), refresh.py (the auto-refresh rule), routes.py (the requests'
answers; :class:`~drainer.ui.routes.ExtraPage` adds a page, as the fleet view will),
server.py (them on drainer's guarded HTTP server), static.py.
"""

from __future__ import annotations

from drainer.ui.routes import Dashboard, ExtraPage
from drainer.ui.server import make_ui_server, serve_ui
from drainer.ui.static import write_static

__all__ = ["Dashboard", "ExtraPage", "make_ui_server", "serve_ui", "write_static"]
