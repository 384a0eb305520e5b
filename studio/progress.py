"""Progress for long command-line work: one tqdm bar per stage on a terminal, plain lines elsewhere.

:class:`StageProgress` is the ``progress(stage, done, total)`` callable that every long step of
the studio accepts (avatar registration, loading networks, HuBERT, LMDM windows, engine builds,
frames). Each stage gets a bar with its name, count, rate and ETA; on a stderr that is not a
terminal (a log file, CI) it prints one line when a stage starts and one when it ends, with the
count and the time taken, and no carriage returns. A stage name may carry a detail after ": "
("registering avatar: face detection"): the part before it names the bar, the detail is shown
beside the count.

Notices (a large file about to be written to a cache, an engine rebuilt) travel through the
``logging`` module: compute code logs them at INFO under ``studio.*`` and never prints;
:func:`show_notices` shows them on stderr above any bar (DEBUG too for ``studio -v``).
``studio -q`` hides both: :func:`quiet` silences every :class:`StageProgress` made inside it.
Nothing here imports Qt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

__all__ = [
    "LABELS",
    "Progress",
    "StageProgress",
    "format_seconds",
    "process_age_s",
    "quiet",
    "show_notices",
]

Progress = Callable[[str, int, int], None]

# Stage names the pipeline and engines report -> what the user reads (unknown names pass).
LABELS: dict[str, str] = {"render": "rendering frames", "motion": "LMDM windows"}
# The unit counted by each stage (the bar's rate and the end line).
UNITS: dict[str, str] = {
    "registering avatar": "steps",
    "loading networks": "networks",
    "LMDM windows": "windows",
    "rendering frames": "frames",
    "exporting networks": "networks",
    "building TensorRT engines": "engines",
    "measuring": "results",
}
RATE_UNITS = frozenset({"frames", "windows"})  # end lines give a rate for these
_QUIET = [False]  # inside quiet(): no bars, no stage lines, no notes


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """Inside (with ``on``): every :class:`StageProgress` made without an explicit ``quiet``
    shows nothing (``studio -q``); the previous state comes back after."""
    before = _QUIET[0]
    _QUIET[0] = bool(on) or before
    try:
        yield
    finally:
        _QUIET[0] = before


def process_age_s() -> float | None:
    """Seconds since this process began (interpreter start and imports included), from the
    kernel's record of it (Linux ``/proc``, 10 ms steps); None where there is none."""
    try:
        with open("/proc/self/stat") as f:  # the start time, in ticks after boot: field 22
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def format_seconds(s: float) -> str:
    """``3.2 s``, ``4 min 05 s`` or ``1 h 02 min``: short and unambiguous."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


class _Stage:
    """The stage being shown: its label, unit, count and when it started."""

    def __init__(self, label: str, total: int, done: int) -> None:
        self.label = label
        self.unit = UNITS.get(label, "")
        self.total = total
        self.done = done
        self.started = time.monotonic()
        self.bar: Any = None  # a tqdm bar on a terminal

    def count(self) -> str:
        """``3/10 frames`` (or ``3 frames`` when nothing says how many)."""
        n = f"{self.done}/{self.total}" if self.total > 0 else str(self.done)
        return f"{n} {self.unit}" if self.unit else n


class StageProgress:
    """``progress(stage, done, total)`` shown on ``stream`` (stderr by default).

    ``live`` (default: whether ``stream`` is a terminal) picks tqdm bars over plain lines;
    ``quiet`` (default: inside :func:`quiet`) shows nothing at all.
    ``labels`` renames stages (default :data:`LABELS`); ``checkpoint`` (if given) is called
    first on every report, so that a caller can stop long work there (the CLI: a signal whose
    KeyboardInterrupt was swallowed where it landed). A stage ends when its count reaches
    its total or another stage begins; :meth:`close` (or leaving the ``with`` block) ends the
    last one. When the block ends with an exception an unfinished stage is dropped silently,
    so the error line stands alone.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        live: bool | None = None,
        labels: Mapping[str, str] | None = None,
        quiet: bool | None = None,
        checkpoint: Callable[[], None] | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.checkpoint = checkpoint
        self.quiet = _QUIET[0] if quiet is None else bool(quiet)
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty())
        self.live = live
        self.labels = dict(LABELS if labels is None else labels)
        self._stage: _Stage | None = None

    # - the callable -
    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.checkpoint is not None:
            self.checkpoint()
        if self.quiet:
            return
        name, _, detail = stage.partition(": ")
        label = self.labels.get(name, name)
        done, total = int(done), int(total)
        cur = self._stage
        if cur is None or cur.label != label:  # a new stage: the previous one has ended
            self._end(finished=True)
            cur = self._stage = _Stage(label, total, done)
            self._open(cur, detail)
            if self._complete(cur):  # reported only once it was done (e.g. a cache hit)
                self._end(finished=True)
            return
        if total != cur.total:
            cur.total = total
            if cur.bar is not None:
                cur.bar.total = total if total > 0 else None
        cur.done = done
        if cur.bar is not None:
            if detail:
                cur.bar.set_postfix_str(detail, refresh=False)
            cur.bar.update(done - cur.bar.n)  # tqdm's own rate and ETA (smoothed)
        if self._complete(cur):
            self._end(finished=True)

    def note(self, message: str) -> None:
        """One line of text on the stream, above any bar (the bar is redrawn after it)."""
        if not self.quiet:
            _write_line(message, self.stream)

    def close(self, finished: bool = True) -> None:
        """End the current stage; ``finished=False`` drops it without an end line."""
        self._end(finished)

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(finished=exc_type is None)

    # - internals -
    @staticmethod
    def _complete(stage: _Stage) -> bool:
        return stage.total > 0 and stage.done >= stage.total

    def _open(self, stage: _Stage, detail: str) -> None:
        if self.live:
            from tqdm import tqdm

            # the terminal's size when the stage starts; 80x24 where it reads as 0x0 (a pty
            # nobody sized), where tqdm would draw nothing at all
            cols, rows = shutil.get_terminal_size((80, 24))
            stage.bar = tqdm(
                ncols=cols or 80,
                nrows=rows or 24,
                total=stage.total if stage.total > 0 else None,
                initial=stage.done,
                desc=stage.label,
                unit=f" {stage.unit or 'steps'}",
                file=self.stream,
                leave=True,
                mininterval=0.2,
                smoothing=0.1,
                postfix=detail or None,
            )
        elif not self._complete(stage):
            self._line(f"{stage.label}: {stage.count()} …")

    def _end(self, finished: bool) -> None:
        stage, self._stage = self._stage, None
        if stage is None:
            return
        if stage.bar is not None:
            if not finished:
                stage.bar.leave = False  # clear the unfinished bar: the error line follows
            stage.bar.close()
            return
        if not finished:
            return
        took = time.monotonic() - stage.started
        rate = ""
        if stage.unit in RATE_UNITS and stage.done > 0 and took >= 0.05:
            rate = f", {stage.done / took:.3g} {stage.unit}/s"
        self._line(f"{stage.label}: {stage.count()} in {format_seconds(took)}{rate}")

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _write_line(message: str, stream: IO[str]) -> None:
    """``message`` on its own line; tqdm clears and redraws any bar around it."""
    from tqdm import tqdm

    tqdm.write(message, file=stream)


class _NoticeHandler(logging.Handler):
    """Writes each record's message as one line, above any tqdm bar."""

    def __init__(self, stream: IO[str], level: int = logging.INFO) -> None:
        super().__init__(level)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write_line(self.format(record), self.stream)
        except Exception:  # noqa: BLE001 - logging must never break the work
            self.handleError(record)


class _NoticeFormatter(logging.Formatter):
    """A notice (INFO) as its message; a debug line or a warning says which it is."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno < logging.INFO:
            return f"debug: {record.name}: {text}"
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {text}"
        return text


@contextlib.contextmanager
def show_notices(
    stream: IO[str] | None = None, logger: str = "studio", level: int = logging.INFO
) -> Iterator[None]:
    """While inside: ``level`` (INFO: the notices) and above from the ``studio`` loggers
    appear on ``stream`` (stderr), as plain lines that do not tear a progress bar. The
    logger's level and handlers are put back afterwards."""
    log = logging.getLogger(logger)
    handler = _NoticeHandler(stream if stream is not None else sys.stderr, level)
    handler.setFormatter(_NoticeFormatter())
    before = log.level
    log.addHandler(handler)
    if log.level == logging.NOTSET or log.level > level:
        log.setLevel(level)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(before)
