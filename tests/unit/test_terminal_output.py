"""What a terminal shows of a run: the progress line's end, and text log lines."""

from __future__ import annotations


def test_the_progress_line_ends_with_the_final_figures() -> None:
    import io

    from drainer.cli._progress import ProgressLine
    from drainer.drain.report import RunReport

    out = io.StringIO()
    line = ProgressLine(out, min_interval=3600, show_after=0)
    report = RunReport(run_id="r", queues=["q"])
    report.claimed, report.succeeded = 10, 1
    line(report)  # drawn
    report.succeeded = 10
    line(report)  # throttled: not drawn
    line.close()
    text = out.getvalue()
    assert text.endswith("\n")
    assert "done 10" in text.rsplit("\r", 1)[-1], repr(text)


def test_text_logs_print_the_error_once() -> None:
    import logging

    from drainer.logs import TextFormatter

    record = logging.makeLogRecord({
        "msg": "job %d failed (attempt 1/5): %s", "args": (9, "ValueError: boom {}"),
        "levelno": logging.INFO, "levelname": "INFO", "run_id": "2d4f67f77be4",
        "error": "ValueError: boom {}", "attempt": 1})
    line = TextFormatter().format(record)
    assert line.count("ValueError: boom {}") == 1, line
    assert "run_id=2d4f67f77be4" in line and "attempt=1" in line
