"""The batch's jobs on a Ray cluster, through Ray Data (the optional ``ray`` extra).

The jobs become a dataset of one row each; :class:`JobActor`, a callable class run by
``map_batches`` on a pool of actors (``ActorPoolStrategy``), opens engines once per actor
(:class:`~studio.batch.run.EngineCache`) and renders each job it is given with
:func:`~studio.batch.run.run_in_turn` into the output folder, which every actor must reach (a
shared folder on a multi-node cluster). Records stream back to the driver as jobs finish, so
the state file, the progress lines and the report are the local path's. Without an address
a local Ray instance is started for the batch and stopped after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.batch.jobs import Job
from studio.batch.run import EngineCache, EngineOptions, run_in_turn
from studio.engines.base import Progress
from studio.errors import OptionError, StudioError
from studio.signals import handled

LOCAL = "local"  # --ray without an address: a Ray instance of this machine, for this batch


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


def _reachable(address: str, timeout: float = 5.0) -> None:
    """StudioError unless something answers at ``address``'s host:port (``auto``, and
    addresses without a port, are left to Ray): Ray itself would retry for minutes."""
    where = address.split("://", 1)[-1]
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
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


def ray_runner(setup: RaySetup) -> Callable[..., Iterator[dict[str, Any]]]:
    """A runner for :func:`~studio.batch.run.run_batch` that sends the jobs to Ray (the
    options checked and a HOST:PORT address tried first: nothing is written before; with
    ``auto``, Ray's answer comes once it is asked, after the batch's state is opened)."""
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
        try:
            import ray
            from ray.data import ActorPoolStrategy
        except ImportError:
            raise StudioError("--ray needs Ray: pip install 'talkinghead-studio[ray]'") from None
        started = _init(setup)
        try:
            gpus, cpus = _fit(setup)
            rows = [{"job": json.dumps(job.to_dict())} for job in todo]
            _quiet()
            with warnings.catch_warnings():
                # max_restarts has no named parameter in the Ray this extra pins (< 2.64), and
                # Ray's default restarts an actor for ever: one that dies opening its engine
                # (out of GPU memory) would never end the batch
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
        finally:
            if started:
                ray.shutdown()

    return run
