"""Timing helpers shared by the bench suites.

Every measurement is: ``warmup`` untimed runs, then ``repeats`` timed runs, each preceded
by ``setup(i)`` (which loads input set ``i % n`` into the buffers, so successive runs do
not re-read the same inputs from cache). On a CUDA device each timed run is bracketed by
CUDA events and the host synchronizes only at that boundary (after ``setup`` and after the
end event), never inside the measured work; on the CPU ``time.perf_counter`` is used. The
reported figure is the median; min, max and the inter-quartile range come with it.

CUDA graphs and TF32 are the runtime's (:func:`studio.runtime.base.capture_cuda_graph`,
:func:`studio.runtime.base.math_mode`): the bench measures what the engines run, with no
capture of its own.
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

__all__ = [
    "Timing",
    "default_device",
    "device_facts",
    "git_commit",
    "measure",
    "synchronize",
    "utc_now",
]

T = TypeVar("T")


@dataclass
class Timing:
    """Samples of one measurement in milliseconds (``wall_ms``: host clock, synced)."""

    samples_ms: list[float]
    wall_ms: list[float] = field(default_factory=list)
    method: str = "perf_counter"

    @property
    def median_ms(self) -> float:
        """Median of the samples."""
        return float(statistics.median(self.samples_ms))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary with the raw samples."""
        s = sorted(self.samples_ms)
        q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
        out: dict[str, Any] = {
            "median_ms": self.median_ms,
            "min_ms": s[0],
            "max_ms": s[-1],
            "iqr_ms": float(q[2] - q[0]),
            "repeats": len(s),
            "method": self.method,
            "samples_ms": [round(v, 6) for v in self.samples_ms],
        }
        if self.wall_ms:
            out["wall_median_ms"] = float(statistics.median(self.wall_ms))
        return out


def default_device(device: str | None = None) -> str:
    """A suite's ``--device``: as given, else ``cuda`` when torch sees a GPU, else ``cpu``."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str,
    repeats: int,
    warmup: int = 1,
    setup: Callable[[int], None] | None = None,
) -> Timing:
    """Time ``fn`` ``repeats`` times after ``warmup`` runs; ``setup(i)`` runs untimed before each.

    CUDA: events around each run on the current stream, synchronized after the end event
    (the boundary), plus the host wall clock of the same run. CPU: ``perf_counter``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    dev = torch.device(device)
    for i in range(warmup):
        if setup is not None:
            setup(i)
        fn()
    synchronize(dev)
    samples: list[float] = []
    wall: list[float] = []
    if dev.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for i in range(repeats):
            if setup is not None:
                setup(i)
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            start.record()
            fn()
            end.record()
            end.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
            samples.append(float(start.elapsed_time(end)))
        return Timing(samples, wall, "cuda_events")
    for i in range(repeats):
        if setup is not None:
            setup(i)
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(samples, [], "perf_counter")


ARCHIVE_COMMIT = Path("studio/bench/archive_commit.txt")  # filled in by git archive


def git_commit(root: Path | None = None) -> str | None:
    """The checkout's HEAD commit (with ``-dirty`` when the tree has changes), or None.

    A tree made by ``git archive`` (how the GPU runs get their copy) names its own commit
    in :data:`ARCHIVE_COMMIT`, ahead of any repository around it."""
    cwd = root or Path(__file__).resolve().parents[2]
    try:
        stamped = (cwd / ARCHIVE_COMMIT).read_text().strip()
    except OSError:
        stamped = ""
    if stamped and not stamped.startswith("$Format"):
        return f"{stamped} (git archive)"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def utc_now() -> str:
    """Current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def device_facts(device: torch.device | str) -> dict[str, Any]:
    """What the numbers were measured on: device, capability, torch/CUDA/cuDNN versions."""
    dev = torch.device(device)
    facts: dict[str, Any] = {
        "device": str(dev),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        facts.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        facts.update(name=facts["cpu"], capability=None)
    return facts


def kernel_category(name: str, categories: Sequence[tuple[str, tuple[str, ...]]]) -> str:
    """The first category whose keys the kernel's lowercase name holds, else "elementwise /
    other"."""
    low = name.lower()
    return next((c for c, keys in categories if any(k in low for k in keys)), OTHER_KERNELS)


OTHER_KERNELS = "elementwise / other"


def kernel_profile(
    fn: Callable[[], object],
    device: torch.device,
    categories: Sequence[tuple[str, tuple[str, ...]]],
    top: int = 12,
) -> dict[str, Any]:
    """GPU kernels of one ``fn()`` call (``torch.profiler``, CUDA activity): count, summed
    time, time per :func:`kernel_category` and the ``top`` kernels by time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and getattr(ev, "name", ""):
            us = float(getattr(ev, "device_time", None) or getattr(ev, "cuda_time", 0.0) or 0.0)
            kernels.setdefault(ev.name, []).append(us)
    by_cat: dict[str, dict[str, float]] = {}
    for name, times in kernels.items():
        c = by_cat.setdefault(kernel_category(name, categories), {"kernels": 0, "us": 0.0})
        c["kernels"] += len(times)
        c["us"] += sum(times)
    ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": sum(len(v) for v in kernels.values()),
        "kernel_ms": sum(sum(v) for v in kernels.values()) / 1e3,
        "by_category": {
            k: {"kernels": int(v["kernels"]), "ms": v["us"] / 1e3}
            for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1]["us"])
        },
        "top_kernels": [
            {"name": name[:120], "count": len(t), "ms": sum(t) / 1e3} for name, t in ranked
        ],
    }
