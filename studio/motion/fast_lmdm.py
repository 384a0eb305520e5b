"""The fast LMDM path: the window step under a precision, compiled, captured in CUDA graphs.

:class:`FastLMDM` runs :mod:`studio.motion.lmdm_hoist`'s window step (the condition encoder,
time embeddings, FiLM, cross-attention keys and values and the ``cond_frame`` projection
computed once per window, in 3 stacked matmuls; 50 matmuls a step instead of 98) on static
condition buffers, in the precision a :class:`PathSpec` names: the weights are the runtime's
(:class:`~studio.runtime.torch_backend.PrecisionAdapter`: fp32, or a cast copy in bf16/fp16),
optionally through ``torch.compile``. :class:`WindowGraph` runs a window's DDIM loop as two
CUDA graphs captured once per step count and window shape (the window's constants, then a few
steps replayed until the loop is done);
:func:`graphed_lmdm` keeps those graphs for the loaded LMDM in fp32 (the released set's
precision). :func:`studio.motion.generator.generate_motion` uses them on CUDA, and the
``lmdm`` bench suite measures the precisions and compiled paths of :class:`FastLMDM`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from studio.layout import LMDM_PRECISIONS, MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import (
    DDIMSchedule,
    DeviceDDIM,
    alphas_cumprod,
    ddim_next,
    noise_tables,
    predict_noise_from_start,
)
from studio.models.lmdm import LMDM
from studio.motion.lmdm_hoist import (
    WindowConstants,
    constants_of_condition,
    guided_x0_step,
    stacked_projections,
)
from studio.runtime.base import capture_cuda_graph, math_mode, sdpa_backend
from studio.runtime.torch_backend import PrecisionAdapter

__all__ = [
    "COMPILE_MODE",
    "FastLMDM",
    "GraphedLMDM",
    "PathSpec",
    "PRECISIONS",
    "STEPS_PER_GRAPH",
    "WINDOW",
    "WindowGraph",
    "graphed_lmdm",
    "graphs_made_ms",
    "steps_per_graph",
    "window_spec",
]

# "default" compiles the step in ~20-30 s on an H200 and cut its replay by ~1.6x there;
# "max-autotune-no-cudagraphs" was still autotuning GEMMs after 4 minutes. Graph capture
# stays ours either way.
COMPILE_MODE = "default"
GRAPH_WARMUP = 1  # eager runs before a capture: one runs every op once (lazy inits)
# DDIM steps a window's steps graph holds at most (a divisor of the step count): its capture
# costs the ops of that many steps, and a window takes steps / that many replays
STEPS_PER_GRAPH = 10
WINDOW = (1, SEQ_FRAMES, MOTION_DIM)  # batch 1, one 80-frame window
PRECISIONS = LMDM_PRECISIONS  # the runtime's names; half types cast weights


@dataclass(frozen=True)
class PathSpec:
    """One fast path: precision (the runtime's policy for LMDM), torch.compile, SDPA backend."""

    name: str
    precision: str  # "fp32" | "tf32" | "bf16" | "fp16"
    compile: bool = False
    # SDPA backend ("auto" | "flash" | "efficient" | "cudnn" | "math"), entered inside the
    # step functions; the bench sweeps it for uncompiled paths (a compile per candidate costs
    # 20-30 s), so compiled paths name it here
    sdpa: str = "auto"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"{self.name}: precision {self.precision!r}, not one of {PRECISIONS}")


def window_spec(precision: str = "fp32") -> PathSpec:
    """The product's LMDM path at ``precision``: fp32 (the released set's weights and math),
    TF32 matmuls, or a bf16/fp16 cast copy of the weights (the render setting
    ``motion_precision``)."""
    return PathSpec(f"fast_{precision}_window", precision)


class FastLMDM:
    """The guided window step with static condition buffers, under a precision policy.

    The weights come from the runtime's precision policy for LMDM
    (:class:`~studio.runtime.torch_backend.PrecisionAdapter`): fp32 (the module itself when
    it already lives on ``device``), or a bf16/fp16 copy whose sinusoidal time MLP and noise
    schedule stay fp32. Guidance and the noise prediction are always combined in fp32, and
    the DDIM state stays fp32.

    With ``compile`` the window's constants are one compiled function and a step another,
    traced once for every step of the window. Batch 1.
    """

    def __init__(
        self,
        base: LMDM,
        spec: PathSpec,
        device: torch.device | str,
        sdpa: str | None = None,
        compile_mode: str = COMPILE_MODE,
    ) -> None:
        dev = torch.device(device)
        self.device = dev
        self.spec = spec
        self.sdpa = spec.sdpa if sdpa is None else sdpa
        policy = PrecisionAdapter("lmdm", base, spec.precision, dev)
        self.mode = policy.mode  # "fp32" or "cast"
        self.input_dtype = policy.compute_dtype
        self.model = policy.inner.eval().requires_grad_(False)
        self.cond_frame = torch.zeros(1, MOTION_DIM, dtype=self.input_dtype, device=dev)
        self.cond = torch.zeros(1, SEQ_FRAMES, base.cond_dim, dtype=self.input_dtype, device=dev)
        self.noise_tables = noise_tables(alphas_cumprod()).to(dev)
        self.stacked = stacked_projections(self.model)
        self._window: Callable[[Tensor, str], WindowConstants] = self._window_constants
        self._step_x0: Callable[..., Tensor] = guided_x0_step
        if spec.compile:
            self._window = torch.compile(self._window_constants, mode=compile_mode, dynamic=False)
            self._step_x0 = torch.compile(guided_x0_step, mode=compile_mode, dynamic=False)

    def load_condition(self, cond_frame: Tensor, cond: Tensor) -> None:
        """Copy a window's condition into the static buffers (cast to their dtype)."""
        self.cond_frame.copy_(cond_frame.reshape(self.cond_frame.shape))
        self.cond.copy_(cond.reshape(self.cond.shape))

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """no_grad + SDPA backend + the precision's TF32 setting (CUDA), for a run or a capture."""
        with torch.no_grad(), sdpa_backend(self.sdpa), math_mode(self.spec.precision, self.device):
            yield

    def _window_constants(self, times: Tensor, sdpa: str) -> WindowConstants:
        """Everything a window computes once, for the timesteps ``times`` [T]."""
        return constants_of_condition(
            self.model, self.cond_frame, self.cond, times, self.stacked, sdpa
        )

    def step(self, x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
        """One guided step with everything recomputed (the exported step's work: the window's
        constants of this one timestep, then the step): (pred_noise, x_start), fp32. No
        context."""
        consts = self._window(time_cond, self.sdpa)
        x0 = self._step_x0(self.model, x, consts, 0, self.sdpa)
        return predict_noise_from_start(x, time_cond, x0, self.noise_tables), x0

    def run_step(self, x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`step` inside :meth:`context`."""
        with self.context():
            return self.step(x, time_cond)

    def sample(self, sampler: DeviceDDIM, x_t: Tensor) -> Tensor:
        """The whole DDIM loop into ``sampler.out`` (capturable: no host reads, static shapes)."""
        if sampler.shape[0] != 1:
            raise ValueError(f"FastLMDM runs batch 1, got {sampler.shape[0]}")
        with self.context():
            consts = self._window(sampler.time_cond[:, 0], self.sdpa)
            # One step's constants per call, at index 0: a compiled step is traced once.
            per_step = iter([consts.at(k) for k in range(consts.steps)])

            def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
                x0 = self._step_x0(self.model, x, next(per_step), 0, self.sdpa)
                return predict_noise_from_start(x, time_cond, x0, self.noise_tables), x0

            return sampler.sample(denoise, x_t)


class WindowGraph:
    """One window's DDIM loop for one step count, on static buffers, as two graphs.

    The window's graph computes the constants of every step
    (:meth:`FastLMDM._window_constants`) into one packed buffer, a row per step, and sets a
    step index held on the device to 0. Each step then gathers its row and its schedule
    scalars by that index, runs the guided step and the DDIM update, and advances the index;
    the steps' graph holds :func:`steps_per_graph` of them and replays until the window's
    steps are done (5 replays of 10 steps for 50). On CUDA both are captured once: a capture
    of a tenth of the loop's ops, for one more gather a step and a few replays a window (few:
    each replay gives up the interpreter to any thread beside it). A 60 s clip's windows and
    capture took 2.47 s on an H200, against 3.44 s with the whole 50-step loop captured
    (docs/benchmarks.md). On the CPU the same functions run eagerly. Set the clip's per-step
    noises with :meth:`set_noises`; each :meth:`run` copies a window's condition and x_T in.
    The results are :meth:`FastLMDM.sample`'s.
    """

    def __init__(
        self, fast: FastLMDM, schedule: DDIMSchedule, shape: tuple[int, ...] = WINDOW
    ) -> None:
        dev = fast.device
        shape = tuple(shape)
        if shape[0] != 1:
            raise ValueError(f"FastLMDM runs batch 1, got {shape[0]}")
        self.fast = fast
        self.shape = shape
        self.steps = schedule.steps
        self.chunk = steps_per_graph(self.steps)
        self.times = torch.tensor([t for t, _ in schedule.time_pairs], device=dev)  # [T] long
        # [T]: the final step's row is never used (its x0 is the window's output)
        scalars = (schedule.alpha_next_sqrt, schedule.c, schedule.sigma)
        self.alpha_next_sqrt, self.c, self.sigma = (
            F.pad(v.to(dev, torch.float32), (0, 1)) for v in scalars
        )
        self.noises = torch.zeros((self.steps, *shape), device=dev)
        self.x = torch.zeros(shape, device=dev)  # x_T, then each step's x
        self.index = torch.zeros(1, dtype=torch.long, device=dev)
        with fast.context():
            consts = fast._window(self.times, fast.sdpa)  # its layout (and a warm-up)
        per_step = _per_step(consts)
        dtypes = {t.dtype for t in per_step}
        if len(dtypes) != 1:
            raise ValueError(f"a window's constants must share one dtype, got {dtypes}")
        width = sum(t[0].numel() for t in per_step)
        self.packed = torch.zeros((self.steps, width), dtype=per_step[0].dtype, device=dev)
        self.staged = torch.zeros((1, width), dtype=self.packed.dtype, device=dev)
        self._packed_views = _row_views(self.packed, per_step)
        self.input_bias = torch.zeros_like(consts.input_bias)
        staged = _with_per_step(consts, _row_views(self.staged, per_step))
        self.consts = replace(staged, input_bias=self.input_bias)
        self.out = torch.zeros(shape, device=dev)  # the last step's x0: the window's motion
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        if dev.type == "cuda":
            window, _ = capture_cuda_graph(self._load_window, GRAPH_WARMUP, fast.context)
            steps, _ = capture_cuda_graph(self._run_chunk, GRAPH_WARMUP, fast.context)
            self.graphs = (window, steps)

    def set_noises(self, noises: Tensor) -> None:
        """The clip's per-step noises [T-1, *shape] (shared by every window)."""
        self.noises[: self.steps - 1].copy_(noises)

    def _load_window(self) -> None:
        """Every step's constants of the loaded condition into the packed rows; index 0."""
        consts = self.fast._window(self.times, self.fast.sdpa)
        for view, value in zip(self._packed_views, _per_step(consts), strict=True):
            view.copy_(value)
        self.input_bias.copy_(consts.input_bias)
        self.index.zero_()

    def _step(self) -> None:
        """The step at the device's index (capturable: no host reads, static buffers): its
        constants' row staged, the guided x0 into :attr:`out`, the DDIM update into ``x``."""
        fast, k = self.fast, self.index
        torch.index_select(self.packed, 0, k, out=self.staged)
        x0 = fast._step_x0(fast.model, self.x, self.consts, 0, fast.sdpa)
        pred_noise = predict_noise_from_start(
            self.x, self.times.index_select(0, k), x0, fast.noise_tables
        )
        self.out.copy_(x0)
        scalars = (v.index_select(0, k) for v in (self.alpha_next_sqrt, self.c, self.sigma))
        noise = self.noises.index_select(0, k)[0]
        self.x.copy_(ddim_next(x0, pred_noise, *scalars, noise))
        self.index.add_(1)

    def _run_chunk(self) -> None:
        for _ in range(self.chunk):
            self._step()

    def run(self, cond_frame: Tensor, cond: Tensor, x_t: Tensor) -> Tensor:
        """x0 [*shape] of one window; a static buffer the next run overwrites (clone to keep)."""
        self.fast.load_condition(cond_frame, cond)
        self.x.copy_(x_t)
        chunks = self.steps // self.chunk
        if self.graphs is not None:
            window, steps = self.graphs
            window.replay()
            for _ in range(chunks):
                steps.replay()
            return self.out
        with self.fast.context():
            self._load_window()
            for _ in range(chunks):
                self._run_chunk()
        return self.out


def steps_per_graph(steps: int, most: int = STEPS_PER_GRAPH) -> int:
    """DDIM steps in one replay of a window's steps graph: the largest divisor of ``steps``
    up to ``most``, so that whole replays make the window (50 -> 10, 4 -> 4, 13 -> 1)."""
    return max(c for c in range(1, min(steps, most) + 1) if steps % c == 0)


def _per_step(consts: WindowConstants) -> list[Tensor]:
    """The constants with a leading step axis, in one order: every layer's FiLMs, keys, values."""
    return [*(f for films in consts.films for f in films), *consts.keys, *consts.values]


def _row_views(buffer: Tensor, like: list[Tensor]) -> list[Tensor]:
    """Views of ``buffer`` [R, width] shaped [R, *t.shape[1:]] for each of ``like``, side by
    side along a row (each row holds one step's constants, contiguous)."""
    views, start = [], 0
    for t in like:
        size = t[0].numel()
        views.append(buffer[:, start : start + size].unflatten(1, t.shape[1:]))
        start += size
    return views


def _with_per_step(consts: WindowConstants, flat: list[Tensor]) -> WindowConstants:
    """``consts`` with its per-step tensors replaced by ``flat`` (in :func:`_per_step`'s order)."""
    given = iter(flat)
    films = [tuple(next(given) for _ in layer) for layer in consts.films]
    keys = [next(given) for _ in consts.keys]
    values = [next(given) for _ in consts.values]
    return replace(consts, films=films, keys=keys, values=values)


class GraphedLMDM:
    """A loaded LMDM's fast path at one precision, with one :class:`WindowGraph` per step
    count and shape."""

    def __init__(self, base: LMDM, precision: str = "fp32") -> None:
        self.base = base
        self.fast = FastLMDM(base, window_spec(precision), base.device)
        self._graphs: dict[tuple[int, tuple[int, ...]], WindowGraph] = {}

    def window_graph(self, schedule: DDIMSchedule, shape: tuple[int, ...]) -> WindowGraph:
        """The (cached) graph for ``schedule.steps`` and ``shape``; captured on first use."""
        key = (schedule.steps, tuple(shape))
        if key not in self._graphs:
            t0 = time.perf_counter()
            self._graphs[key] = WindowGraph(self.fast, schedule, shape)
            with _GRAPHED_LOCK:
                _MADE_MS[0] += (time.perf_counter() - t0) * 1000.0
        return self._graphs[key]


_GRAPHED: dict[str, GraphedLMDM] = {}  # by precision
_GRAPHED_LOCK = threading.Lock()
_MADE_MS = [0.0]  # spent making window graphs in this process


def graphs_made_ms() -> float:
    """Milliseconds this process has spent making (on CUDA: capturing) LMDM's window graphs,
    of every LMDM and precision: a warm-up, which a caller reads before and after a clip."""
    return _MADE_MS[0]


def graphed_lmdm(base: LMDM, precision: str = "fp32") -> GraphedLMDM:
    """The :class:`GraphedLMDM` of ``base`` at ``precision``; graphs of one LMDM are kept at
    a time."""
    with _GRAPHED_LOCK:
        if any(g.base is not base for g in _GRAPHED.values()):
            _GRAPHED.clear()  # another LMDM was loaded: free the old one's graphs
        if precision not in _GRAPHED:
            _GRAPHED[precision] = GraphedLMDM(base, precision)
        return _GRAPHED[precision]
