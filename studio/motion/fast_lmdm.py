"""The fast LMDM path: the window step under a precision, compiled, one CUDA graph per window.

:class:`FastLMDM` runs :mod:`studio.motion.lmdm_hoist`'s window step (the condition encoder,
time embeddings, FiLM, cross-attention keys and values and the ``cond_frame`` projection
computed once per window, in 3 stacked matmuls; 50 matmuls a step instead of 98) on static
condition buffers, in the precision a :class:`PathSpec` names: the weights are the runtime's
(:class:`~studio.runtime.torch_backend.PrecisionAdapter`: fp32, or a cast copy in bf16/fp16),
optionally through ``torch.compile``. :class:`WindowGraph` captures a window's whole DDIM loop
once per step count and window shape into a CUDA graph and replays it per window;
:func:`graphed_lmdm` keeps those graphs for the loaded LMDM in fp32 (the released set's
precision). :func:`studio.motion.generator.generate_motion` uses them on CUDA, and the
``lmdm`` bench suite measures the precisions and compiled paths of :class:`FastLMDM`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from studio.layout import MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import (
    DDIMSchedule,
    DeviceDDIM,
    alphas_cumprod,
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
    "WINDOW",
    "WindowGraph",
    "fp32_spec",
    "graphed_lmdm",
]

# "default" compiles the step in ~20-30 s on an H200 and cut its replay by ~1.6x there;
# "max-autotune-no-cudagraphs" was still autotuning GEMMs after 4 minutes. Graph capture
# stays ours either way.
COMPILE_MODE = "default"
GRAPH_WARMUP = 1  # eager warm-ups before a capture: one runs every op once (lazy inits)
# DDIM steps of that warm-up: every step runs the same ops on the same shapes, so one step
# (the window's constants, a guided step, the update) does what the 50-step loop did in 0.47 s
WARMUP_STEPS = 1
WINDOW = (1, SEQ_FRAMES, MOTION_DIM)  # batch 1, one 80-frame window
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # the runtime's names; half types cast weights


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


def fp32_spec(tf32: bool = False) -> PathSpec:
    """The product's LMDM policy: fp32 weights and math (the released set's), TF32 on request."""
    name = "fast_tf32_window" if tf32 else "fast_fp32_window"
    return PathSpec(name, "tf32" if tf32 else "fp32")


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

    def sample(self, sampler: DeviceDDIM, x_t: Tensor, steps: int | None = None) -> Tensor:
        """The whole DDIM loop into ``sampler.out`` (capturable: no host reads, static shapes);
        its first ``steps`` only, to warm up before a capture."""
        if sampler.shape[0] != 1:
            raise ValueError(f"FastLMDM runs batch 1, got {sampler.shape[0]}")
        with self.context():
            consts = self._window(sampler.time_cond[:, 0], self.sdpa)
            # One step's constants per call, at index 0: a compiled step is traced once.
            per_step = iter([consts.at(k) for k in range(consts.steps)])

            def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
                x0 = self._step_x0(self.model, x, next(per_step), 0, self.sdpa)
                return predict_noise_from_start(x, time_cond, x0, self.noise_tables), x0

            return sampler.sample(denoise, x_t, steps)


class WindowGraph:
    """One window's whole DDIM loop for one step count, on static buffers.

    On CUDA the loop is captured once into a CUDA graph and :meth:`run` replays it; on the
    CPU :meth:`run` runs the same loop eagerly on the same buffers. Set the clip's per-step
    noises with :meth:`set_noises`; each :meth:`run` copies a window's condition and x_T in.
    """

    def __init__(
        self, fast: FastLMDM, schedule: DDIMSchedule, shape: tuple[int, ...] = WINDOW
    ) -> None:
        dev = fast.device
        shape = tuple(shape)
        self.fast = fast
        self.shape = shape
        self.x_t = torch.zeros(shape, device=dev)
        noises = torch.zeros((schedule.num_noises, *shape), device=dev)
        self.sampler = DeviceDDIM(schedule, shape, noises, dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out = self.sampler.out
        if dev.type == "cuda":
            self.graph, self.out = capture_cuda_graph(
                lambda: fast.sample(self.sampler, self.x_t),
                GRAPH_WARMUP,
                warm=lambda: fast.sample(self.sampler, self.x_t, WARMUP_STEPS),
            )

    def set_noises(self, noises: Tensor) -> None:
        """The clip's per-step noises [T-1, *shape] (shared by every window)."""
        self.sampler.noises.copy_(noises)

    def run(self, cond_frame: Tensor, cond: Tensor, x_t: Tensor) -> Tensor:
        """x0 [*shape] of one window; a static buffer the next run overwrites (clone to keep)."""
        self.fast.load_condition(cond_frame, cond)
        self.x_t.copy_(x_t)
        if self.graph is None:
            return self.fast.sample(self.sampler, self.x_t)
        self.graph.replay()
        return self.out


class GraphedLMDM:
    """A loaded LMDM's fast fp32 path with one :class:`WindowGraph` per step count and shape."""

    def __init__(self, base: LMDM, tf32: bool = False) -> None:
        self.base = base
        self.fast = FastLMDM(base, fp32_spec(tf32), base.device)
        self._graphs: dict[tuple[int, tuple[int, ...]], WindowGraph] = {}

    def window_graph(self, schedule: DDIMSchedule, shape: tuple[int, ...]) -> WindowGraph:
        """The (cached) graph for ``schedule.steps`` and ``shape``; captured on first use."""
        key = (schedule.steps, tuple(shape))
        if key not in self._graphs:
            self._graphs[key] = WindowGraph(self.fast, schedule, shape)
        return self._graphs[key]


_GRAPHED: dict[bool, GraphedLMDM] = {}
_GRAPHED_LOCK = threading.Lock()


def graphed_lmdm(base: LMDM, tf32: bool = False) -> GraphedLMDM:
    """The :class:`GraphedLMDM` of ``base``; graphs of one LMDM are kept at a time."""
    with _GRAPHED_LOCK:
        if any(g.base is not base for g in _GRAPHED.values()):
            _GRAPHED.clear()  # another LMDM was loaded: free the old one's graphs
        if tf32 not in _GRAPHED:
            _GRAPHED[tf32] = GraphedLMDM(base, tf32)
        return _GRAPHED[tf32]
