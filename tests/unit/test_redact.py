"""Secrets out of messages: values are masked, the words of a message that equal a secret
are not (masking them garbles the message and shows which word the secret is), and the
secrets can be added from several threads while others redact."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from drainer import _redact
from drainer._redact import redact, remember_secret
from drainer.cli import main


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    saved = _redact._secrets
    yield
    _redact._secrets = saved


@pytest.mark.parametrize("token", ["short", "token", "print", "at", "16"])
def test_serve_says_why_a_word_token_is_refused_without_garbling_the_message(
        token: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--database-url", "postgresql://h/db", "--trigger-token", token])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "***" not in err, err
    assert f"DRAINER_TRIGGER_TOKEN is too short ({len(token)} characters)" in err
    assert "print(secrets.token_urlsafe(32))" in err


def test_a_word_secret_is_masked_where_it_stands_as_a_value() -> None:
    remember_secret("short")
    assert redact("DRAINER_TRIGGER_TOKEN is too short") == "DRAINER_TRIGGER_TOKEN is too short"
    assert redact("token=short&x=1") == "token=***&x=1"
    assert redact("invalid value 'short' for x") == "invalid value '***' for x"
    assert redact('got "short"') == 'got "***"'
    assert redact("Authorization: Bearer short") == "Authorization: Bearer ***"
    assert redact("drainer serve --trigger-token short --port 1") == (
        "drainer serve --trigger-token *** --port 1")
    assert redact("short") == "***"
    assert redact("shorter shortly") == "shorter shortly"


def test_a_secret_that_is_no_word_is_masked_wherever_it_stands() -> None:
    remember_secret("Tok3n-Value-9")
    remember_secret("p4ss")
    assert redact("bad Tok3n-Value-9 here and xTok3n-Value-9x") == "bad *** here and x***x"
    assert redact("auth p4ss failed; p4ssword stays") == "auth *** failed; p4ssword stays"


def test_secrets_added_from_many_threads_are_all_masked() -> None:
    added = [f"tenant-{i}-Pw{i:04d}" for i in range(400)]
    errors: list[BaseException] = []
    start = threading.Barrier(9)

    def add(chunk: list[str]) -> None:
        start.wait()
        for s in chunk:
            remember_secret(s)

    def read() -> None:
        start.wait()
        try:
            for s in added:
                redact(f"connect to {s} failed")
        except BaseException as exc:  # any error while the set changes fails the test
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(added[i::8],)) for i in range(8)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(redact(f"url with {s}") == "url with ***" for s in added)
