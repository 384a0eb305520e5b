"""Where the studio keeps its caches: one root, one folder per kind, all named here.

The root is ``$STUDIO_CACHE_DIR`` when set (the CLI's global ``--cache-dir DIR`` sets it for
the process), else the user cache folder of the platform (platformdirs: ``$XDG_CACHE_HOME`` or
``~/.cache`` on Linux, then ``talkinghead-studio``). Under it:

- ``avatars/``: registered avatars (``$STUDIO_AVATAR_CACHE`` or ``--avatar-cache`` win);
- ``engines/``: ONNX exports and TensorRT engines (``$STUDIO_ENGINE_CACHE`` wins);
- ``compiled/``: torch.compile's Inductor and Triton caches (``inductor/``, ``triton/``), placed
  through ``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR`` unless those are set already;
- ``logs/``: one file per internal error, with its traceback (:func:`write_log`);
- ``locks/``: the file locks of :func:`build_lock`, which make concurrent processes build a
  cached file (an ONNX export, a TensorRT engine, a registered avatar) once.

The narrower variables beat the root, so an engine cache shared between machines stays where
it was. Nothing here creates a folder but :func:`write_log` and :func:`build_lock`; the caches
make their own. Imports nothing of the studio.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import itertools
import logging
import os
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path

__all__ = [
    "APP_NAME",
    "AVATAR_ENV",
    "CACHE_ENV",
    "ENGINE_ENV",
    "avatar_cache_dir",
    "build_lock",
    "cache_root",
    "code_digest",
    "compiled_cache_dir",
    "engine_cache_dir",
    "lock_dir",
    "log_dir",
    "place_compiled_caches",
    "use_cache_root",
    "write_log",
]

APP_NAME = "talkinghead-studio"
CACHE_ENV = "STUDIO_CACHE_DIR"  # the root of every cache
ENGINE_ENV = "STUDIO_ENGINE_CACHE"  # ONNX exports and TensorRT engines only
AVATAR_ENV = "STUDIO_AVATAR_CACHE"  # registered avatars only
COMPILED_ENVS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
KEEP_LOGS = 20  # the newest log files kept; older ones are removed when one is written
_log = logging.getLogger(__name__)
_LOG_NUMBERS = itertools.count(1)  # log files of one process in the same second differ


def code_digest(*sources: str | os.PathLike[str]) -> str:
    """SHA-256 of source files (a module's ``__file__``): put in a cache entry's key, an entry
    made by other code (an upgrade) is made again."""
    h = hashlib.sha256()
    for source in sources:
        data = Path(source).read_bytes()
        h.update(len(data).to_bytes(8, "little"))  # where one file ends and the next begins
        h.update(data)
    return h.hexdigest()


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def cache_root() -> Path:
    """``$STUDIO_CACHE_DIR``, else the platform's user cache folder for the studio."""
    root = _env_path(CACHE_ENV)
    if root is not None:
        return root
    from platformdirs import user_cache_path

    return user_cache_path(APP_NAME, appauthor=False)


def avatar_cache_dir() -> Path:
    """Registered avatars: ``$STUDIO_AVATAR_CACHE`` or ``<root>/avatars``."""
    return _env_path(AVATAR_ENV) or cache_root() / "avatars"


def engine_cache_dir() -> Path:
    """ONNX exports and TensorRT engines: ``$STUDIO_ENGINE_CACHE`` or ``<root>/engines``."""
    return _env_path(ENGINE_ENV) or cache_root() / "engines"


def compiled_cache_dir() -> Path:
    """torch.compile's artifacts (Inductor, Triton): ``<root>/compiled``."""
    return cache_root() / "compiled"


def log_dir() -> Path:
    """Log files of internal errors: ``<root>/logs``."""
    return cache_root() / "logs"


def lock_dir() -> Path:
    """The file locks of :func:`build_lock`: ``<root>/locks``."""
    return cache_root() / "locks"


def place_compiled_caches(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Point Inductor and Triton at ``<root>/compiled/{inductor,triton}`` (both read their
    variable when they first compile), keeping a value the user set; the variables set."""
    env = os.environ if env is None else env
    folder = compiled_cache_dir()
    placed: dict[str, str] = {}
    for name, sub in COMPILED_ENVS.items():
        if not env.get(name):
            env[name] = placed[name] = str(folder / sub)
    return placed


@contextlib.contextmanager
def use_cache_root(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Inside: ``path`` is the cache root (``$STUDIO_CACHE_DIR``, so child processes follow);
    the variable is put back after. ``None`` changes nothing."""
    if path is None:
        yield
        return
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(Path(path).expanduser().absolute())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def write_log(name: str, text: str) -> Path:
    """Write ``text`` to a new log file ``<logs>/<name>-<UTC time>-<pid>-<n>.log`` and return
    its path; the temporary folder is used when the cache cannot take it. Only the newest
    :data:`KEEP_LOGS` of ``name``'s logs are kept. OSError when neither folder can be
    written."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    file_name = f"{name}-{stamp}-{os.getpid()}-{next(_LOG_NUMBERS)}.log"
    error: OSError | None = None
    for folder in (log_dir(), Path(tempfile.gettempdir()) / APP_NAME / "logs"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / file_name
            path.write_text(text, encoding="utf-8", errors="replace")
        except OSError as e:
            error = error or e
            continue
        _prune(folder, name, path)
        return path
    assert error is not None
    raise error


def _prune(folder: Path, name: str, newest: Path) -> None:
    """Remove all but the newest :data:`KEEP_LOGS` ``name-*.log`` files of ``folder``
    (``newest``, just written, always stays)."""
    with contextlib.suppress(OSError):
        others = [p for p in folder.glob(f"{name}-*.log") if p != newest]
        others.sort(key=lambda p: (p.stat().st_mtime_ns, p.name))
        for old in others[: max(0, len(others) - (KEEP_LOGS - 1))]:
            old.unlink(missing_ok=True)


def _lock_file(target: Path) -> Path:
    """The lock of ``target``: named after it and a hash of its absolute, resolved path (so
    every process that builds the same file takes the same lock), in :func:`lock_dir`, or in
    the temporary folder when the cache root takes no files."""
    where = os.fsencode(str(Path(target).expanduser().absolute().resolve()))
    name = f"{target.name[:60]}-{hashlib.sha256(where).hexdigest()[:16]}.lock"
    for folder in (lock_dir(), Path(tempfile.gettempdir()) / APP_NAME / "locks"):
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder / name
    raise OSError(f"no folder for the lock of {target}")


@contextlib.contextmanager
def build_lock(target: str | os.PathLike[str], what: str | None = None) -> Iterator[None]:
    """Hold the file lock of ``target`` while building it, so that two processes on a cold
    cache build it once: the second waits (saying so at INFO), then, checking for ``target``
    again inside, finds it made. The lock lives apart from ``target``'s folder (in
    ``<root>/locks``) and is held by the process, so a crash releases it. Where no lock file
    can be made at all the build runs unlocked (writes stay atomic; at worst it is done
    twice)."""
    from filelock import FileLock, Timeout

    p = Path(target)
    lock: FileLock | None = None
    try:
        lock = FileLock(_lock_file(p))
        lock.acquire(timeout=0)
    except Timeout:  # held: wait for it (a TimeoutError, so before OSError)
        _log.info("waiting for another studio process that is building %s", what or p.name)
        lock.acquire()
    except OSError as e:
        _log.debug("building %s without a lock: %s", p, e)
        lock = None
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
