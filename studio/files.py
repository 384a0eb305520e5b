"""Writing output files whole or not at all, and the checks made on an output before any work.

:func:`write_atomic` writes through a hidden partial file in the target's folder, flushed to
the disk (``fsync`` of the file, then of the folder where the system allows it) before it is
renamed over the target: after a crash or a power cut the old file or the new one is there,
never half of one. :func:`write_json` adds ``-`` for stdout. :func:`check_output_file` is what
every output option checks first: a file name the file system takes, a folder that exists and
takes files, and never one of the command's inputs (symlinks and hard links followed).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from studio.errors import InputError, OutputError

__all__ = [
    "STDOUT",
    "check_file_name",
    "check_not_input",
    "check_output_file",
    "check_writable_folder",
    "is_stdout",
    "read_json",
    "unused_name",
    "write_atomic",
    "write_json",
]

STDOUT = "-"  # an output option given this writes to stdout
NAME_MAX = 255  # bytes in one file name where the system cannot say (ext4, xfs, btrfs, APFS)


def _name_max(folder: Path) -> int:
    """The longest file name, in bytes, that ``folder``'s file system takes."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return NAME_MAX


def _hidden(path: Path, tag: str) -> Path:
    """A hidden sibling ``.<name>.<pid>.<random>.<tag>``, the name shortened so that the whole
    fits in a file name even when ``path``'s own name is as long as the system allows."""
    tail = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.{tag}"
    room = NAME_MAX - 1 - len(tail)
    name = os.fsdecode(os.fsencode(path.name)[:room])
    return path.with_name(f".{name}{tail}")


def _partial(path: Path) -> Path:
    return _hidden(path, "partial")


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename) to the disk; a no-op where folders cannot be
    opened (Windows) or synced (some network file systems)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` through a partial file in the same folder, synced to the disk
    and renamed over the target, so a failure (full disk, read-only folder, power cut) leaves
    the old file or none, never half of one. OutputError naming the path and the reason.

    A target that exists and is not a regular file (``/dev/null``, ``/dev/stdout``, a FIFO)
    is written to as it is: renaming over it would replace the device with a file."""
    p = Path(path)
    payload = data if isinstance(data, bytes) else data.encode("utf-8")
    if _special(p):
        try:
            with open(p, "wb") as f:
                f.write(payload)
        except OSError as e:
            raise OutputError(f"cannot write {p}: {_reason(e)}") from None
        return
    tmp = _partial(p)
    try:
        if make_parents:
            p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        _fsync_folder(p.parent)
    except OSError as e:
        raise OutputError(f"cannot write {p}: {_reason(e)}") from None
    finally:
        with contextlib.suppress(OSError):  # gone already, or the folder refuses even this
            tmp.unlink(missing_ok=True)


def _special(path: Path) -> bool:
    """Whether ``path`` exists and is not a regular file or a folder (a device, a FIFO)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def is_stdout(path: str | os.PathLike[str] | None) -> bool:
    """Whether an output option names stdout (``-``)."""
    return path is not None and os.fspath(path) == STDOUT


def write_json(path: str | os.PathLike[str], data: Any, make_parents: bool = False) -> None:
    """``data`` as indented JSON: to stdout for ``-``, else atomically to ``path``."""
    text = json.dumps(data, indent=2) + "\n"
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(path, text, make_parents=make_parents)


def _reason(e: OSError) -> str:
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return e.strerror or str(e)


def check_file_name(path: str | Path, option: str) -> None:
    """OutputError (naming ``option``) when ``path``'s file name is longer than its folder's
    file system takes: "file name too long", not a permissions message."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    size, most = len(os.fsencode(p.name)), _name_max(folder if folder.is_dir() else Path("."))
    if size > most:
        raise OutputError(
            f"{option} {p.name[:40]}…: file name too long ({size} bytes; this file system "
            f"takes at most {most}); give a shorter name"
        )


def file_in_the_way(folder: str | Path) -> Path | None:
    """What keeps ``folder`` from being (or being made) a folder: itself or its nearest
    existing parent where that is a file; None when nothing is in the way."""
    p = Path(folder).expanduser().absolute()
    there = next(q for q in (p, *p.parents) if q.exists())  # "/" at least
    return None if there.is_dir() else there


def check_writable_folder(path: str | Path, option: str) -> None:
    """OutputError (naming ``option``) unless a file can be created in the folder ``path``:
    checked by creating and removing a probe, before any long work."""
    folder = Path(path)
    probe = _hidden(folder / "probe", "partial")
    try:
        probe.write_bytes(b"")
    except OSError as e:
        raise OutputError(
            f"{option}: cannot write in {folder} ({_reason(e)}); pick another folder"
        ) from None
    with contextlib.suppress(OSError):
        probe.unlink()


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same path once symlinks are resolved, or
    (both existing) the same inode (a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):  # a symlink loop, an unreadable folder
        return False


def _within(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def check_not_input(
    path: str | Path, option: str, inputs: Mapping[str, str | os.PathLike[str] | None]
) -> None:
    """OutputError when the output ``path`` of ``option`` is one of ``inputs`` (option ->
    path of the command's input files, or of its other outputs), through symlinks and hard
    links; for an input that is a folder (a checkpoint folder), when ``path`` is a file that
    already exists inside it; for an output that is a folder (a PNG sequence's), when an
    input lies inside it."""
    p = Path(path).expanduser()
    for other, value in inputs.items():
        if not value or is_stdout(value):
            continue
        q = Path(value).expanduser()
        try:
            folder = q.is_dir()
            inside = folder and p.exists() and p.resolve().is_relative_to(q.resolve())
        except (OSError, RuntimeError):  # a name too long, a loop: the input's own check says
            continue
        if folder:
            if inside:
                raise OutputError(
                    f"{option} {p}: is a file inside the {other} folder {q} and would be "
                    "overwritten; write it elsewhere"
                )
            continue
        if p.is_dir() and _within(q, p):  # an output that is a folder is replaced whole
            raise OutputError(
                f"{option} {p}: the folder holds the {other} file {q} and would replace it; "
                "write the output elsewhere"
            )
        if _same_file(p, q):
            raise OutputError(
                f"{option} {p}: is also the {other} file and would be overwritten; "
                "give the output a name of its own"
            )


def check_output_file(
    path: str | os.PathLike[str] | None,
    option: str,
    inputs: Mapping[str, str | os.PathLike[str] | None] | None = None,
    stdout: bool = True,
) -> Path | None:
    """The file target of ``option``, checked before any work; None when not given, or for
    ``-`` (stdout) where ``stdout`` allows it. OutputError when it is a folder, its folder
    is missing or takes no files, its name is too long, or it is one of ``inputs``."""
    if path is None:
        return None
    if is_stdout(path):
        if stdout:
            return None
        raise OutputError(f"{option} -: this output cannot go to stdout; give a file name")
    p = Path(path).expanduser()
    check_file_name(p, option)  # first: the system refuses even to look up a longer name
    if p.is_dir():
        raise OutputError(f"{option} {p}: is a directory; give a file name")
    folder = p.parent
    if not folder.exists() or not folder.is_dir():
        raise OutputError(f"{option} {p}: the folder {folder} does not exist; create it first")
    check_not_input(p, option, inputs or {})
    if not _special(p):  # a device or a FIFO is written as it is, not beside its folder
        check_writable_folder(folder, option)
    return p


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


def read_json(path: str | os.PathLike[str], what: str, max_bytes: int) -> Any:
    """The JSON in the file ``path``, a ``what`` (a preset, control tracks, a project);
    InputError naming the file for anything wrong: absent, not a regular file (a FIFO or a
    device would hang), over ``max_bytes``, unreadable, not JSON, nested too deeply."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: {what} file not found")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file, so not a {what}")
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise InputError(f"{p}: {size} bytes, too large for a {what} (at most {max_bytes})")
        return json.loads(p.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{p}: not a {what}: nested too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"{p}: cannot read the {what}: {e}") from None
