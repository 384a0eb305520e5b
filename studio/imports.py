"""Modules imported ahead, on a thread, while the main thread waits on the device.

A new process pays for every heavy import on its main thread the first time a stage needs
the module (SciPy's signal module for the smoothing, Inductor and Triton to load compiled
engines: about a second each on a GPU machine). A stage that keeps the GPU busy while its
thread mostly waits (LMDM's window graphs) can have them imported beside it instead. Beside a
stage whose thread runs Python (loading networks, HuBERT's op-by-op runner) the imports only
take the interpreter from it.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Sequence


def import_aside(names: Sequence[str]) -> threading.Thread:
    """Import ``names`` in order on a daemon thread (started; those not installed are
    skipped). A later ``import`` of one of them on another thread waits for this one's."""
    todo = [n for n in names if n not in sys.modules]

    def run() -> None:
        for name in todo:
            try:
                importlib.import_module(name)
            except ImportError:
                continue

    thread = threading.Thread(target=run, name="import-aside", daemon=True)
    thread.start()
    return thread
