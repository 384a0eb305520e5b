"""The Ray driver's process of a ``--ray`` batch (``python -m studio.batch.ray_driver``,
started by :func:`~studio.batch.ray_run.ray_runner`).

It reads one JSON request on stdin (setup, jobs, output folder, engine options), runs the
jobs through :func:`~studio.batch.ray_run.drive` and writes one JSON line per event on
stdout: ``{"connected": true}`` once it has its cluster, ``{"record": ...}`` per finished
job, then ``{"done": true}`` before Ray is stopped, or ``{"error": ...}``. Anything else
that writes to stdout (Ray's own notes) goes to stderr. Interrupted (SIGINT from the batch),
it stops its local instance and ends with status 130; the batch's process gone, it kills its
own process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

EXIT_INTERRUPTED = 130
WATCH_S = 0.2  # how often the driver looks whether its batch's process is still there
BATCH_PID_ENV = "STUDIO_RAY_BATCH_PID"  # the batch's process, set by ray_run.Driver


def _send(channel: TextIO, event: dict[str, Any]) -> None:
    channel.write(json.dumps(event) + "\n")
    channel.flush()


def _stopped_by_the_batch() -> None:
    """SIGINT, which only the batch sends (this process has a process group of its own),
    interrupts it, also where the batch's own was ignored (nohup). A batch killed outright
    (the OOM killer, SIGKILL) leaves nobody to report to: a watcher thread then kills this
    process group (the driver and its local instance's processes) at once, whatever the main
    thread is held up in (Ray's start, its C++ calls)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    batch = int(os.environ.get(BATCH_PID_ENV, os.getppid()))
    threading.Thread(target=_ends_with, args=(batch,), name="batch-watch", daemon=True).start()


def _ends_with(batch: int) -> None:
    """Kill this driver's process group (only itself, where it is not its group's leader)
    once ``batch`` is no longer its parent."""
    while os.getppid() == batch:
        time.sleep(WATCH_S)
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    channel = os.fdopen(os.dup(1), "w")  # the records' own pipe
    os.dup2(2, 1)  # stdout: anything else printed goes to stderr
    try:
        _stopped_by_the_batch()
        from studio.batch.jobs import Job
        from studio.batch.ray_run import RaySetup, connected, drive, error_said
        from studio.batch.run import EngineOptions

        request = json.load(sys.stdin)
        setup = RaySetup(**request["setup"])
        options = EngineOptions(**request["options"])
        jobs = [Job.from_dict(d) for d in request["jobs"]]
        with contextlib.ExitStack() as ray_session:  # left (Ray stopped) after the last word
            try:
                ray_session.enter_context(connected(setup))
                _send(channel, {"connected": True})
                for rec in drive(setup, jobs, Path(request["out"]), options):
                    _send(channel, {"record": rec})
                _send(channel, {"done": True})
            except Exception as e:  # noqa: BLE001 - the batch's process reports it
                _send(channel, {"error": error_said(e)})
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the batch's process is gone
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # Ray was stopped on leaving its session: its exit handlers are done
