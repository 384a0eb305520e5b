"""studio.signals: the stop signals' handlers set for a while, an inherited ignore kept."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from studio.signals import handled


def test_handlers_are_set_inside_and_put_back_after():
    got: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with handled(lambda signum, _frame: got.append(signum)) as replaced:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signal.SIGTERM in replaced and replaced[signal.SIGTERM] == before
    assert got == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) == before


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with handled(lambda *_: pytest.fail("handled an ignored signal")) as replaced:
            assert signal.SIGHUP not in replaced
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_off_the_main_thread_nothing_changes():
    seen: list[dict] = []

    def elsewhere() -> None:
        with handled(lambda *_: None) as replaced:
            seen.append(replaced)

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert seen == [{}]
