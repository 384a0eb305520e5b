"""The batch's jobs on a Ray cluster, through Ray Data (the optional ``ray`` extra).

The jobs become a dataset of one row each; :class:`JobActor`, a callable class run by
``map_batches`` on a pool of actors (``ActorPoolStrategy``), opens engines once per actor
(:class:`~studio.batch.run.EngineCache`) and renders each job it is given with
:func:`~studio.batch.run.run_in_turn` into the output folder, which every actor must reach (a
shared folder on a multi-node cluster). Ray's driver is a child process of the batch
(:class:`Driver`, :mod:`studio.batch.ray_driver`); records stream back to the batch as jobs
finish, so the state file, the progress lines and the report are the local path's. Without
an address the driver starts a local Ray instance for the batch and stops it after it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.batch.jobs import Job
from studio.batch.ray_driver import BATCH_PID_ENV
from studio.batch.run import EngineCache, EngineOptions, run_in_turn
from studio.engines.base import Progress
from studio.errors import OptionError, StudioError
from studio.signals import handled

LOCAL = "local"  # --ray without an address: a Ray instance of this machine, for this batch
AUTO = "auto"  # Ray's own: the cluster started on this machine (`ray start`) or RAY_ADDRESS
CONNECT_TIMEOUT_S = 30.0  # a cluster's address that does not connect by then is not one


@dataclass(frozen=True)
class RaySetup:
    """Where and how wide: the cluster (``local`` or an address such as ``ray://head:10001``
    or ``auto``), the actors, and what each one holds (a fraction of a GPU packs several on
    one)."""

    address: str = LOCAL
    actors: int = 1
    gpus_per_actor: float | None = None  # None: 1 where the cluster has GPUs, else 0
    cpus_per_actor: float = 1.0

    def check(self) -> RaySetup:
        if self.actors < 1:
            raise OptionError("--actors", f"{self.actors}: give at least 1")
        if self.gpus_per_actor is not None and not 0 <= self.gpus_per_actor <= 8:
            raise OptionError("--gpus-per-actor", f"{self.gpus_per_actor}: give 0 to 8")
        if not 0 < self.cpus_per_actor <= 256:
            raise OptionError("--cpus-per-actor", f"{self.cpus_per_actor}: give more than 0")
        if self.address not in (LOCAL, AUTO) and _host_port(self.address) is None:
            raise OptionError(
                "--ray",
                f"{self.address!r} is not a cluster's address: give HOST:PORT (the head's "
                "GCS port, 6379 unless it was started with another), ray://HOST:PORT (Ray "
                "Client, 10001), auto (the cluster `ray start` made here), or no address for "
                "a local instance",
            )
        return self


class JobActor:
    """One Ray actor: engines opened once, then every job it is handed. The batch's output
    folder and engine options are class attributes (:func:`actor_class`), so that the actor
    takes no constructor arguments through the object store."""

    out_dir = ""
    options: dict[str, Any] = {}

    def __init__(self) -> None:
        self.out = Path(self.out_dir)
        self.cache = EngineCache(EngineOptions(**self.options))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        jobs = [Job.from_dict(json.loads(str(blob))) for blob in batch["job"]]
        records = []
        for rec in run_in_turn(jobs, self.out, self.cache):
            rec["actor"] = f"{os.uname().nodename}:{os.getpid()}"
            records.append(json.dumps(rec))
        return {"record": np.array(records, dtype=object)}


def actor_class(out_dir: Path, options: EngineOptions) -> type[JobActor]:
    """:class:`JobActor` for this batch (sent to the workers by value)."""
    attrs = {"out_dir": str(out_dir.resolve()), "options": asdict(options)}
    return type("StudioJobActor", (JobActor,), attrs)


def _quiet() -> None:
    """Ray Data's progress logs and bars off: the batch prints its own lines."""
    import ray.data

    logging.getLogger("ray").setLevel(logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def _host_port(address: str) -> tuple[str, str] | None:
    """(host, port) of a HOST:PORT or ray://HOST:PORT address; None for anything else."""
    scheme, _, where = address.rpartition("://")
    host, _, port = where.rpartition(":")
    if scheme not in ("", "ray") or not host or not port.isdigit():
        return None
    return host, port


def _reachable(address: str, timeout: float = 5.0) -> None:
    """StudioError unless something answers at ``address``'s host:port (``auto`` is left to
    Ray): Ray itself would retry for minutes."""
    found = _host_port(address)
    if found is None:
        return
    host, port = found
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()  # [v6]
    except OSError as e:
        raise StudioError(
            f"--ray {address}: nothing answers at {host}:{port} ({e.strerror or e}); start "
            "the cluster's head there (`ray start --head`), or leave the address out for a "
            "local instance"
        ) from None


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C (and SIGTERM, SIGHUP) held while a local Ray instance starts: a start stopped
    half-way leaves the agents its daemons were spawning orphaned, outliving the batch. The
    first signal is acted on once the start is over (by the handler it was meant for), so the
    instance is then shut down whole; a second one acts at once. (Ray sets its own SIGTERM
    handler inside ``ray.init``, so a SIGTERM there is Ray's to handle.)"""
    came: list[int] = []

    def hold(signum: int, _frame: Any) -> None:
        if came:  # the user insists
            raise KeyboardInterrupt(f"signal {signum}")
        came.append(signum)

    with handled(hold) as held:
        yield
    if came:
        handler = held[came[0]]
        if not callable(handler):  # SIG_DFL: what it would have done, as an interrupt
            raise KeyboardInterrupt
        handler(came[0], None)  # (the frame it came in is gone)


def _init(setup: RaySetup) -> bool:
    """Connect to the cluster (or start a local one); whether this call started it."""
    import ray

    if ray.is_initialized():
        return False
    try:
        if setup.address == LOCAL:
            # its own instance, on this machine: the token note is not the user's concern
            logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
            with _signals_held():  # it starts daemons here: none is left half-started
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=setup.address, log_to_driver=False, configure_logging=False)
    except BaseException as e:  # Ctrl-C too: what a start began goes with it (no orphans)
        ray.shutdown()
        if isinstance(e, ConnectionError) and setup.address == AUTO:
            raise StudioError(
                "--ray auto: no Ray cluster runs on this machine (none was started with `ray "
                "start --head`, and RAY_ADDRESS is not set): start one, give a cluster's "
                "address, or give --ray alone for a local instance"
            ) from None
        if isinstance(e, ConnectionError):
            raise StudioError(
                f"--ray {setup.address}: cannot reach the Ray cluster ({e})"
            ) from None
        raise
    return True


def _fit(setup: RaySetup) -> tuple[float, float]:
    """(GPUs, CPUs) per actor, checked against what the cluster has: a request it can never
    grant would wait for ever."""
    import ray

    have = ray.cluster_resources()
    gpus_total, cpus_total = float(have.get("GPU", 0.0)), float(have.get("CPU", 0.0))
    gpus = setup.gpus_per_actor
    if gpus is None:
        gpus = 1.0 if gpus_total >= 1 else 0.0
    if gpus > 0 and gpus * setup.actors > gpus_total + 1e-9:
        fix = (
            "give --gpus-per-actor 0 to run on CPUs"
            if gpus_total == 0
            else f"give --gpus-per-actor {gpus_total / setup.actors:g} to share its GPUs"
        )
        raise OptionError(
            "--actors",
            f"{setup.actors} actors of {gpus:g} GPU need {gpus * setup.actors:g} GPUs; the "
            f"cluster has {gpus_total:g} ({fix})",
        )
    if setup.cpus_per_actor * setup.actors > cpus_total + 1e-9:
        raise OptionError(
            "--actors",
            f"{setup.actors} actors of {setup.cpus_per_actor:g} CPU need "
            f"{setup.cpus_per_actor * setup.actors:g} CPUs; the cluster has {cpus_total:g}",
        )
    return gpus, setup.cpus_per_actor


@contextlib.contextmanager
def connected(setup: RaySetup) -> Iterator[None]:
    """Connected to the cluster (a local instance started for the batch) while inside; a
    local instance stopped on leaving. The Ray driver's process
    (:mod:`studio.batch.ray_driver`) says everything to the batch before it leaves: Ray's
    teardown can crash."""
    import ray

    started = _init(setup)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def drive(
    setup: RaySetup, todo: Sequence[Job], out: Path, options: EngineOptions
) -> Iterator[dict[str, Any]]:
    """The records of ``todo`` rendered by a pool of actors, as their jobs end (inside
    :func:`connected`)."""
    import ray
    from ray.data import ActorPoolStrategy

    gpus, cpus = _fit(setup)
    rows = [{"job": json.dumps(job.to_dict())} for job in todo]
    _quiet()
    with warnings.catch_warnings():
        # max_restarts has no named parameter in the Ray this extra pins (< 2.64), and Ray's
        # default restarts an actor for ever: one that dies opening its engine (out of GPU
        # memory) would never end the batch
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            actor_class(out, options),
            batch_size=1,
            compute=ActorPoolStrategy(size=min(setup.actors, len(rows))),
            num_gpus=gpus,
            num_cpus=cpus,
            max_restarts=0,  # a job's failure is its record; a lost actor ends it all
        )
    # no prefetch: each record is kept (and the state saved) as soon as its job ends
    for batch in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=0):
        for blob in batch["record"]:
            yield json.loads(str(blob))


STOP_WAIT_S = 60.0  # how long the driver gets to stop its actors and local instance


def ray_runner(setup: RaySetup) -> Callable[..., Iterator[dict[str, Any]]]:
    """A runner for :func:`~studio.batch.run.run_batch` that sends the jobs to Ray (the
    options checked and a HOST:PORT address tried first: nothing is written before; with
    ``auto``, Ray's answer comes once it is asked, after the batch's state is opened).

    Ray's driver runs in a child process (:class:`Driver`) that streams the records back:
    the batch's state, report and exit status stay with this process whatever Ray's teardown
    does (its core worker can crash as it shuts down, which took the summary and the report
    with it), and Ray's threads never live beside the caller's."""
    setup.check()
    if setup.address != LOCAL:
        _reachable(setup.address)

    def run(
        todo: Sequence[Job],
        out: Path,
        options: EngineOptions,
        progress: Progress | None,
        cancel: Callable[[], bool] | None,
        on_start: Callable[[Job], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        if not todo:
            return
        if importlib.util.find_spec("ray") is None:
            raise StudioError("--ray needs Ray: pip install 'talkinghead-studio[ray]'")
        driver = Driver(
            {
                "setup": asdict(setup),
                "jobs": [job.to_dict() for job in todo],
                "out": str(out),
                "options": asdict(options),
            }
        )
        try:
            yield from driver.records()
        except RuntimeError as e:
            raise RuntimeError(
                f"{e}; the finished jobs are kept: run the same command again to go on"
            ) from None
        finally:
            driver.stop()

    return run


class Driver:
    """The Ray driver's process of one batch (``python -m studio.batch.ray_driver``, in a
    process group of its own): the request on its stdin, the records from its stdout, what it
    says on stderr (Ray's own) kept aside and logged (debug: an error's log file) after a bad
    end.
    A terminal's Ctrl-C reaches this process alone, which passes it on once (:meth:`stop`)."""

    def __init__(self, request: dict[str, Any]) -> None:
        import studio

        env = dict(os.environ)
        root = str(Path(studio.__file__).resolve().parent.parent)  # where this studio is
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env[BATCH_PID_ENV] = str(os.getpid())
        self.request = request
        self.said = tempfile.TemporaryFile()
        self.over = False  # done or failed, as it said: the rest is Ray's teardown
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "studio.batch.ray_driver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.said,
            text=True,
            env=env,
            process_group=0,
        )
        assert self.proc.stdin is not None
        try:
            with self.proc.stdin:
                self.proc.stdin.write(json.dumps(request))
        except BrokenPipeError:  # it ended at once: :meth:`records` says how
            pass
        except BaseException:  # Ctrl-C: no driver is left running the batch
            self.stop()
            raise

    def records(self) -> Iterator[dict[str, Any]]:
        """The jobs' records as they finish; the driver's error raised as this process's
        (RuntimeError when it ends without a word). StudioError where a cluster's address
        has not connected within :data:`CONNECT_TIMEOUT_S` (Ray's connect retries for ever
        where something else listens there)."""
        assert self.proc.stdout is not None
        address = self.request["setup"]["address"]
        if address != LOCAL and not self._says_within(CONNECT_TIMEOUT_S):
            self._kill_group()
            self.proc.wait()
            self.over = True
            there = ", though something listens there" if _host_port(address) else ""
            raise StudioError(
                f"--ray {address}: no Ray cluster answered within {CONNECT_TIMEOUT_S:g} s"
                f"{there}: give the address of the cluster's head (`ray start --head` prints it)"
            )
        for line in self.proc.stdout:
            event = json.loads(line)
            if event.get("connected"):
                continue
            if "record" in event:
                yield event["record"]
            elif "error" in event:
                self.over = True
                raise _error_of(event["error"])
            elif event.get("done"):
                self.over = True
                return
        code = self.proc.wait()
        self.log()
        raise RuntimeError(f"Ray's driver process {_ended(code)} mid-batch")

    def stop(self) -> None:
        """The driver's end: waited for when it is over (its local instance stopping), else
        interrupted first; killed with what is left of its process group (its instance's
        agents) if it does not end in :data:`STOP_WAIT_S` or a second Ctrl-C comes, or
        after any bad end."""
        proc = self.proc
        if not self.over and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
            self._kill_group()
            proc.wait()
            if isinstance(e, KeyboardInterrupt):
                raise
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.returncode != 0:
            self._kill_group()
            if self.over:  # after the last record: Ray's own, not the batch's
                self.log()
        self.said.close()

    def _says_within(self, seconds: float) -> bool:
        """Whether the driver says something (or ends) within ``seconds``."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], seconds)
        return bool(ready)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def log(self) -> None:
        """How the driver ended and what it said on stderr, as a debug record (an internal
        error's log file holds it)."""
        said = b""
        with contextlib.suppress(OSError, ValueError):
            self.said.seek(0)
            said = self.said.read()
        logging.getLogger(__name__).debug(
            "Ray's driver process %s; on stderr it said:\n%s",
            _ended(self.proc.returncode),
            said.decode(errors="replace"),
        )


def _ended(code: int | None) -> str:
    if code is None:
        return "is still running"
    return f"died of signal {-code}" if code < 0 else f"ended with status {code}"


def _error_of(said: dict[str, str]) -> Exception:
    """The exception the driver reported, as this process raises it."""
    if said.get("option"):
        return OptionError(said["option"], said["message"])
    if said["kind"] == "studio":
        return StudioError(said["message"])
    return RuntimeError(f"Ray: {said['message']}")


def error_said(e: BaseException) -> dict[str, str]:
    """What :func:`_error_of` rebuilds ``e`` from (the driver's side)."""
    if isinstance(e, OptionError):
        return {"kind": "studio", "option": e.option, "message": e.message}
    if isinstance(e, StudioError):
        return {"kind": "studio", "message": str(e)}
    return {"kind": "other", "message": f"{type(e).__name__}: {e}"}
