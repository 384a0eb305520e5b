"""What a batch has done, kept beside its outputs so that a rerun picks up where it stopped.

``<out-dir>/.studio-batch.json`` maps each job (its output name) to its last outcome:
``done`` with the fingerprint of what it was made from, or ``failed`` with the one-line
error. It is rewritten atomically after every job, so a batch stopped at any moment (Ctrl-C,
a crash, a power cut) keeps every finished job. A rerun skips a job that is ``done`` with the
same fingerprint and whose output still exists, and retries a failed one only when asked.
One batch at a time may work in a folder: :meth:`BatchState.open` holds its file lock.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from studio.errors import InputError, OutputError
from studio.files import file_in_the_way, write_json

STATE_FILE = ".studio-batch.json"
REPORT_FILE = "batch_report.json"  # beside it: the last run's report
STATE_FORMAT = "studio-batch/1"


class BatchState:
    """The per-job outcomes of the batch writing into ``out_dir``."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / STATE_FILE
        self.jobs: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            self.jobs = self._read()

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(
                f"{self.path}: the batch's state cannot be read ({e}); delete it to start over"
            ) from None
        jobs = data.get("jobs", {}) if isinstance(data, dict) else None
        if (
            not isinstance(data, dict)
            or data.get("format") != STATE_FORMAT
            or not isinstance(jobs, dict)
            or not all(isinstance(r, dict) for r in jobs.values())  # each job's record
        ):
            raise InputError(f"{self.path}: not a studio batch state file; delete it to start over")
        return dict(jobs)

    @classmethod
    @contextlib.contextmanager
    def open(cls, out_dir: str | Path) -> Iterator[BatchState]:
        """The folder's state, its lock held inside (a second batch there fails at once)."""
        from filelock import FileLock, Timeout

        folder = Path(out_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            blocker = file_in_the_way(folder)
            why = f"{blocker} is a file" if blocker is not None else e.strerror
            raise OutputError(f"{folder}: cannot make the output folder: {why}") from None
        lock = FileLock(str(folder / f"{STATE_FILE}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise OutputError(
                f"{folder}: another batch is writing into this folder; wait for it or pick "
                f"another --out-dir"
            ) from None
        except OSError as e:  # read-only, no permission: the batch could write nothing there
            raise OutputError(
                f"{folder}: cannot write into the output folder ({e.strerror or e}); pick "
                f"another --out-dir"
            ) from None
        try:
            yield cls(folder)
        finally:
            lock.release()
            with contextlib.suppress(OSError):
                (folder / f"{STATE_FILE}.lock").unlink()

    def _was(self, name: str, fingerprint: str, status: str) -> bool:
        rec = self.jobs.get(name)
        return (
            rec is not None
            and rec.get("status") == status
            and rec.get("fingerprint") == fingerprint
        )

    def finished(self, name: str, fingerprint: str) -> bool:
        """Whether job ``name`` is done from the same inputs and its output is there."""
        from studio.export.video import written_path

        return self._was(name, fingerprint, "done") and written_path(self.out_dir / name).exists()

    def failed(self, name: str, fingerprint: str) -> bool:
        """Whether job ``name`` failed last time, from the same inputs."""
        return self._was(name, fingerprint, "failed")

    def record(self, name: str, outcome: dict[str, Any]) -> None:
        """Keep job ``name``'s outcome (status, fingerprint, error, …) and save the state."""
        self.jobs[name] = outcome
        self.save()

    def save(self) -> None:
        write_json(self.path, {"format": STATE_FORMAT, "jobs": self.jobs})
