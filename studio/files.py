"""Writing output files whole or not at all: a hidden partial file renamed over the target."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from studio.errors import OutputError

__all__ = ["check_writable_folder", "unused_name", "write_atomic"]


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")


def write_atomic(path: str | Path, data: str | bytes, make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` through a partial file in the same folder, so a failure
    (full disk, read-only folder) leaves the old file or none, never half of one. OutputError
    naming the path and the reason."""
    p = Path(path)
    tmp = _partial(p)
    try:
        if make_parents:
            p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, p)
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):  # gone already, or the folder refuses even this
            tmp.unlink(missing_ok=True)


def check_writable_folder(path: str | Path, option: str) -> None:
    """OutputError (naming ``option``) unless a file can be created in the folder ``path``:
    checked by creating and removing a probe, before any long work."""
    folder = Path(path)
    probe = _partial(folder / "probe")
    try:
        probe.write_bytes(b"")
    except OSError as e:
        raise OutputError(
            f"{option}: cannot write in {folder} ({e.strerror or e}); pick another folder"
        ) from None
    with contextlib.suppress(OSError):
        probe.unlink()


def unused_name(path: str | Path) -> Path:
    """``path`` itself when nothing is there, else the first free ``stem_2.ext``,
    ``stem_3.ext``, ... beside it (an existing numeric suffix counts on): a name to suggest
    instead of overwriting a file."""
    p = Path(path)
    if not p.exists():
        return p
    stem, _, number = p.stem.rpartition("_")
    if not (stem and number.isdigit()):
        stem, number = p.stem, "1"
    n = int(number) + 1
    while (candidate := p.with_name(f"{stem}_{n}{p.suffix}")).exists():
        n += 1
    return candidate
