"""Files read into the page cache ahead of their use, by a thread of their own.

A new process of the Ditto engine reads some 2-3 GB of weights (HuBERT's ONNX file alone is
1.26 GB). From a cold page cache (the first render after a reboot, or after other work pushed
them out) HuBERT's file took 0.7-1.9 s to read on this project's machines; read on a thread
while the interpreter imports torch and the command checks its inputs (1.5-3 s), the engine
then finds it in memory. A file already cached costs a copy (0.1 s per GB here) on another
core. The thread holds the interpreter only between reads of 16 MB.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CHUNK", "read_ahead"]

CHUNK = 16 << 20  # bytes per read: few enough calls that the interpreter is hardly held


_READ: set[tuple[str, int, int]] = set()  # (path, size, mtime) this process has read ahead
_READ_LOCK = threading.Lock()


def read_ahead(paths: Iterable[str | Path]) -> threading.Thread:
    """Read every file of ``paths`` once, on a daemon thread (started, returned): a file this
    process read ahead before (unchanged) is not read again (a batch checks its engine, then
    opens it), what cannot be read is passed over (the reader that needs it says why)."""
    thread = threading.Thread(
        target=_read_all, args=([Path(p) for p in paths],), name="read-ahead", daemon=True
    )
    thread.start()
    return thread


def _read_all(paths: list[Path]) -> None:
    buffer = bytearray(CHUNK)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                key = (str(path), st.st_size, st.st_mtime_ns)
                with _READ_LOCK:
                    if key in _READ:
                        continue
                    _READ.add(key)
                while f.readinto(buffer):
                    pass
        except OSError:
            continue
