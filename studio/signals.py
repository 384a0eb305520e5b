"""The signals that stop a command (SIGINT, SIGTERM, SIGHUP): handlers set for a while, then
the previous ones back, in one place."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # each ends a command like Ctrl-C


@contextlib.contextmanager
def handled(handler: Callable[[int, Any], None]) -> Iterator[dict[int, Any]]:
    """``handler`` for the stop signals inside, on the main thread (elsewhere nothing
    changes); one the parent left ignored (``nohup``) stays ignored. Yields the handlers it
    replaced, which are put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    before: dict[int, Any] = {}
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_IGN, None):
            before[sig] = signal.signal(sig, handler)
    try:
        yield before
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
