"""``drainer ui`` in headless Chromium: every page of the ~200-job demo, the actions with
and without the token, a cross-site form, and the pages' screenshots (left in
/tmp/ui-shots/ for a person to look at)."""

from __future__ import annotations

import re

import pytest

from tests.browser._cdp import Browser
from tests.browser._demo import HOSTILE, SERIES, Demo
from tests.browser.conftest import TOKEN, jobs_table, shot, start_ui, stop_ui

pytestmark = pytest.mark.slow


def _cells(browser: Browser, row_text: str) -> list[str]:
    """The cells of the first table row whose first cell is ``row_text``."""
    cells = browser.evaluate(
        "Array.from(document.querySelectorAll('tr')).map(r => Array.from(r.cells)"
        ".map(c => c.innerText.trim())).filter(c => c[0] === " + repr(row_text) + ")[0]")
    assert cells is not None, f"no row {row_text!r} in {browser.text()[:2000]}"
    return [str(c) for c in cells]


def test_the_queues_page_shows_each_queues_figures_as_the_table_has_them(
        ui: str, demo: Demo, demo_url: str, browser: Browser) -> None:
    browser.open(ui + "/")
    text = browser.text()
    assert "Read the database at" in text and "one connection" in text
    assert "Auto-refresh off" in text
    counts = {(q, s): n for q, s, n in jobs_table(
        demo_url, "SELECT queue, status, count(*) FROM {} GROUP BY 1, 2")}
    due = dict(jobs_table(demo_url, "SELECT queue, count(*) FROM {} WHERE status = 'queued' "
                          "AND run_at <= now() GROUP BY 1"))
    for queue in ("emails", "webhooks", "reports", "fanout", "nightly"):
        cells = _cells(browser, queue)
        queued = counts.get((queue, "queued"), 0)
        assert cells[1:7] == [str(due.get(queue, 0)), str(queued - due.get(queue, 0)),
                              str(counts.get((queue, "running"), 0)),
                              str(counts.get((queue, "failed"), 0)),
                              str(counts.get((queue, "cancelled"), 0)),
                              str(counts.get((queue, "done"), 0))], (queue, cells)
    assert sum(n for (_q, s), n in counts.items() if s == "cancelled") == 1  # the demo's
    assert _cells(browser, "webhooks")[7] == "paused"
    assert "max 2 running (operator)" in _cells(browser, "reports")[8]
    assert "100/m (operator)" in _cells(browser, "reports")[8]
    assert _cells(browser, "webhooks")[11] == "1"  # the dead run's expired lease
    assert "RuntimeError: renderer crashed" in _cells(browser, "reports")[12]
    shot(browser, "queues")


def test_a_failed_job_is_shown_whole(ui: str, demo: Demo, browser: Browser) -> None:
    browser.open(f"{ui}/jobs?status=failed&error=page+3")
    assert f"Job {demo.failed_id}" not in browser.text()
    browser.click(f'a[href="/jobs/{demo.failed_id}"]')
    assert browser.url().endswith(f"/jobs/{demo.failed_id}")
    text = browser.text()
    for expected in ("failed", "reports", '"flaky": true', "Traceback (most recent call last)",
                     "RuntimeError: renderer crashed on page 3", demo.run_id,
                     "1 (claims so far"):
        assert expected in text, expected
    shot(browser, "job-failed")


def test_a_done_job_shows_its_result_and_follow_ups(ui: str, demo: Demo, demo_url: str,
                                                    browser: Browser) -> None:
    browser.open(f"{ui}/jobs/{demo.fanout_id}")
    text = browser.text()
    assert '"followups": 1' in text
    assert "Jobs created by the statement that completed this job" in text
    [(followup,)] = jobs_table(demo_url, "SELECT id FROM {} WHERE payload->>'from' = %s",
                               str(demo.fanout_id))
    browser.click(f'a[href="/jobs/{followup}"]')
    assert f'"from": {demo.fanout_id}' in browser.text()


def test_a_job_enqueued_in_a_span_shows_its_trace_id(ui: str, demo: Demo,
                                                      browser: Browser) -> None:
    browser.open(f"{ui}/jobs/{demo.traced_id}")
    text = browser.text()
    match = re.search(r"traceparent\": \"00-([0-9a-f]{32})-[0-9a-f]{16}-0[0-9]", text)
    assert match, text
    assert f"trace id\t{match[1]}" in text or f"trace id\n{match[1]}" in text, text[:1500]


def test_a_payload_and_an_error_holding_markup_are_shown_as_text(
        ui: str, demo: Demo, browser: Browser) -> None:
    browser.open(f"{ui}/jobs/{demo.hostile_id}")
    assert browser.evaluate("document.title") == f"Job {demo.hostile_id} · drainer"
    assert browser.evaluate("document.querySelectorAll('script, img').length") == 0
    text = browser.text()
    assert HOSTILE in text  # the payload, in its JSON, as typed
    assert f"renderer crashed on {HOSTILE}" in text


def test_the_jobs_list_filters_and_pages(ui: str, demo: Demo, demo_url: str,
                                         browser: Browser) -> None:
    browser.open(ui + "/jobs")
    first = browser.evaluate("Array.from(document.querySelectorAll('td:first-child a'))"
                             ".map(a => +a.innerText)")
    newest = [r[0] for r in jobs_table(demo_url, "SELECT id FROM {} ORDER BY id DESC "
                                       "LIMIT 50")]
    assert first == newest
    browser.click('a[href^="/jobs?before="]')  # older →
    second = browser.evaluate("Array.from(document.querySelectorAll('td:first-child a'))"
                              ".map(a => +a.innerText)")
    assert second == [r[0] for r in jobs_table(
        demo_url, "SELECT id FROM {} ORDER BY id DESC OFFSET 50 LIMIT 50")]
    browser.click('a[href^="/jobs?after="]')  # ← newer
    assert browser.evaluate("Array.from(document.querySelectorAll('td:first-child a'))"
                            ".map(a => +a.innerText)") == newest
    # the filter form: queue and text in the error, as a person types them
    browser.open(ui + "/jobs")
    browser.type_into('input[name="queue"]', "reports")
    browser.type_into('input[name="error"]', "CRASHED")
    browser.click("form.filters button")
    ids = browser.evaluate("Array.from(document.querySelectorAll('td:first-child a'))"
                           ".map(a => +a.innerText)")
    assert ids == [r[0] for r in jobs_table(
        demo_url, "SELECT id FROM {} WHERE queue = 'reports' AND last_error ILIKE "
        "'%%crashed%%' ORDER BY id DESC")]
    assert "Jobs: queue reports, error contains 'CRASHED'" in browser.text()


def test_a_run_shows_what_it_claimed_did_and_left(ui: str, demo: Demo, demo_url: str,
                                                  browser: Browser) -> None:
    browser.open(ui + "/runs")
    assert "died-7f3a" in browser.text()
    browser.click(f'a[href="/runs/{demo.run_id}"]')
    text = browser.text()
    [(claimed, done, failed)] = jobs_table(
        demo_url, "SELECT count(*), count(*) FILTER (WHERE status = 'done'), count(*) "
        "FILTER (WHERE status = 'failed') FROM {} WHERE run_id = %s", demo.run_id)
    assert re.search(rf"claimed\s+{claimed}\s+done\s+{done}\s+failed\s+{failed}\s", text), \
        text[:1500]
    assert "Its jobs" in text
    shot(browser, "run")
    browser.open(ui + "/runs/died-7f3a")
    assert re.search(r"lease expired\s+1\s", browser.text())


def test_the_recurring_series_show_their_next_fire_time_and_last_outcome(
        ui: str, demo: Demo, demo_url: str, browser: Browser) -> None:
    browser.open(ui + "/recurring")
    cells = _cells(browser, SERIES)
    [(next_at, last_id)] = jobs_table(
        demo_url, "SELECT (SELECT scheduled_for FROM {0} WHERE recurring_key = %s AND "
        "status = 'queued'), (SELECT max(id) FROM {0} WHERE recurring_key = %s AND status = "
        "'done')", SERIES, SERIES)
    assert cells[3].startswith(f"{next_at:%Y-%m-%d %H:%M:%S}Z"), cells
    assert cells[4].startswith("done for ") and f"job {last_id}" in cells[4], cells
    shot(browser, "recurring")


def test_the_awake_timeline_is_sampled_only_when_asked(ui: str, browser: Browser) -> None:
    browser.open(ui + "/awake")
    assert "This page did not read the database." in browser.text()
    assert browser.evaluate("document.querySelectorAll('svg').length") == 0
    browser.evaluate("document.querySelector('input[name=seconds]').value = ''")
    browser.type_into('input[name="seconds"]', "2")
    browser.click('button[name="sample"]')
    assert browser.evaluate("document.querySelectorAll('svg rect.awake-band').length") >= 1
    assert "Who kept the compute awake, and why" in browser.text()
    shot(browser, "awake")


def test_retry_is_refused_without_the_token_and_done_with_it(
        ui: str, demo: Demo, demo_url: str, browser: Browser) -> None:
    [(failed_id,)] = jobs_table(demo_url, "SELECT min(id) FROM {} WHERE status = 'failed' "
                                "AND queue = 'reports' AND id <> %s AND payload ? 'flaky'",
                                demo.failed_id)
    browser.open(f"{ui}/jobs/{failed_id}")
    browser.click('a.act[href^="/confirm/retry"]')
    assert "Sign in" in browser.text()  # not signed in: the confirm step asks first
    browser.type_into('input[name="token"]', "wrong-" + TOKEN)
    browser.click("form button")
    assert "wrong token" in browser.text()
    assert jobs_table(demo_url, "SELECT status FROM {} WHERE id = %s", failed_id) == [
        ("failed",)]
    browser.type_into('input[name="token"]', TOKEN)
    browser.click("form button")
    text = browser.text()
    assert f"Retry job {failed_id}?" in text and "retried\n1" in text.replace("\t", "\n")
    assert jobs_table(demo_url, "SELECT status FROM {} WHERE id = %s", failed_id) == [
        ("failed",)]  # the confirm step's dry run changed nothing
    shot(browser, "confirm-retry")
    browser.click('button[name="confirm"]')
    assert f"Retry job {failed_id}: done" in browser.text()
    assert jobs_table(demo_url, "SELECT status, attempts FROM {} WHERE id = %s",
                      failed_id) == [("queued", 0)]
    assert TOKEN not in browser.html()
    # fenced as the CLI's: a second retry of the same job retries nothing
    browser.open(f"{ui}/confirm/retry?job={failed_id}")
    browser.click('button[name="confirm"]')
    assert re.search(r"retried\s+0\s", browser.text()) and re.search(
        r"not failed\s+1\s", browser.text()), browser.text()


def test_a_form_on_another_site_cannot_act(ui: str, demo: Demo, demo_url: str,
                                           browser: Browser, tmp_path: object) -> None:
    [(queued_id,)] = jobs_table(demo_url, "SELECT min(id) FROM {} WHERE status = 'queued' "
                                "AND queue = 'webhooks'")
    browser.open(ui + "/login")
    browser.type_into('input[name="token"]', TOKEN)
    browser.click("form button")
    assert "sign out" in browser.text()
    from pathlib import Path

    evil = Path(str(tmp_path)) / "evil.html"
    evil.write_text(f'<form method="post" action="{ui}/act/cancel"><input name="job" '
                    f'value="{queued_id}"><input name="confirm" value="yes"><input '
                    'name="csrf" value="guessed"><button id="go">win a prize</button></form>')
    browser.open(evil.as_uri())
    browser.click("#go")
    assert "Refused" in browser.text() or "Sign in" in browser.text(), browser.text()
    assert jobs_table(demo_url, "SELECT status FROM {} WHERE id = %s", queued_id) == [
        ("queued",)]


def test_without_a_token_the_pages_show_and_no_action_is_offered(
        demo: Demo, demo_url: str, browser: Browser) -> None:
    proc, base = start_ui(demo_url, token=None)
    try:
        browser.open(f"{base}/jobs/{demo.failed_id}")
        assert "Actions are off: start drainer ui with DRAINER_UI_TOKEN set" in browser.text()
        assert browser.evaluate("document.querySelectorAll('a.act, form[method=post]')"
                                ".length") == 0
        browser.open(f"{base}/confirm/retry?job={demo.failed_id}")
        assert "Actions are off" in browser.text()
    finally:
        stop_ui(proc)
