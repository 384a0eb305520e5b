"""The fast LMDM path: static condition buffers, hoisted embeddings, one CUDA graph per window.

:class:`FastLMDM` runs the guided LMDM step under a precision policy (:class:`PathSpec`) on
static condition buffers, and :meth:`FastLMDM.sample` runs a whole DDIM loop with the
condition encoder and the time embeddings, which do not depend on the noisy motion, computed
once per window (``hoist``); ``window`` also hoists the FiLM, cross-attention keys and
values and the ``cond_frame`` projection (:mod:`studio.motion.lmdm_hoist`: 50 matmuls a step
instead of 98, and 3 stacked ones a window for all of those constants), which the product's
fp32 path uses. :class:`WindowGraph` captures that loop
once per step count and window shape into a CUDA graph and replays it per window;
:func:`graphed_lmdm` keeps those graphs for the loaded LMDM.
:func:`studio.motion.generator.generate_motion` uses them on CUDA, and the ``lmdm`` bench
suite measures every precision policy of :class:`FastLMDM`.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from studio.layout import GUIDANCE_WEIGHT, MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import (
    DDIMSchedule,
    DeviceDDIM,
    alphas_cumprod,
    noise_tables,
    predict_noise_from_start,
)
from studio.models.lmdm import LMDM
from studio.motion.lmdm_fold import FoldedConstants, fold_window, folded_weights, folded_x0_step
from studio.motion.lmdm_hoist import (
    WindowConstants,
    guided_x0_step,
    stacked_projections,
    window_constants,
)
from studio.runtime.base import capture_cuda_graph, math_mode, sdpa_backend
from studio.runtime.torch_backend import PrecisionAdapter

__all__ = [
    "COMPILE_MODE",
    "FastLMDM",
    "GraphedLMDM",
    "PathSpec",
    "WINDOW",
    "WindowGraph",
    "fp32_spec",
    "graphed_lmdm",
]

# "default" compiles the step in ~20-30 s on an H200 and cut its replay by ~1.6x there;
# "max-autotune-no-cudagraphs" was still autotuning GEMMs after 4 minutes. Graph capture
# stays ours either way.
COMPILE_MODE = "default"
GRAPH_WARMUP = 2  # eager loops before a capture (cuBLAS workspaces, SDPA kernel choice)
WINDOW = (1, SEQ_FRAMES, MOTION_DIM)  # batch 1, one 80-frame window


@dataclass(frozen=True)
class PathSpec:
    """One fast path: compute dtype, precision mode, hoisting, TF32, torch.compile."""

    name: str
    dtype: str  # "float32" | "bfloat16" | "float16"
    mode: str  # "fp32" (weights fp32) | "cast" (weights in dtype) | "autocast"
    hoist: bool = True
    tf32: bool = False
    compile: bool = False
    window: bool = False  # also the per-window constants (studio.motion.lmdm_hoist)
    fold: bool = False  # window constants with the attention projections folded in (lmdm_fold)
    # SDPA backend ("auto" | "flash" | "efficient" | "cudnn" | "math"), entered inside the
    # step functions; the bench sweeps it for uncompiled paths (a compile per candidate costs
    # 20-30 s), so compiled paths name it here
    sdpa: str = "auto"

    def __post_init__(self) -> None:
        if self.fold and self.sdpa == "flash":
            raise ValueError(f"{self.name}: the fold's unequal q/k and v widths rule out flash")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The compute dtype as a torch dtype."""
        return getattr(torch, self.dtype)


def fp32_spec(tf32: bool = False) -> PathSpec:
    """The product's LMDM policy: fp32 weights and math (the released set's), TF32 on request."""
    name = "fast_tf32_window" if tf32 else "fast_fp32_window"
    return PathSpec(name, "float32", "fp32", tf32=tf32, window=True)


class FastLMDM:
    """The guided LMDM step with static condition buffers and a precision policy.

    ``mode`` "cast" holds the weights in bf16/fp16 on a copy, with the runtime's LMDM cast
    (:meth:`PrecisionAdapter._cast`: the sinusoidal time MLP stays fp32, as timesteps up to
    999 lose all precision in half types); "autocast" keeps fp32 weights under
    ``torch.autocast(cache_enabled=False)``, as CUDA-graph capture requires. Guidance and
    the noise prediction are always combined in fp32, and the DDIM state stays fp32.

    With ``compile`` the window's constants (condition encoder, time embeddings, stacked
    projections, the fold) are one compiled function and a step another, traced once for
    every step of the window.

    Only the module's public pieces are used (``embed_motion``, ``time_embedding``,
    ``encode_condition``, ``null_condition``, ``decode``), in the order of
    :meth:`LMDM.guided_x0` with ``batch_guidance``. Batch 1.
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
        dtype = spec.torch_dtype
        if spec.mode == "cast":
            model = copy.deepcopy(base).requires_grad_(False)
            PrecisionAdapter._cast("lmdm", model, dtype)
            model.to(dev)
            self.input_dtype = dtype
        elif spec.mode in ("fp32", "autocast"):
            same = base.device.type == dev.type and base.device.index in (None, dev.index or 0)
            model = base if same else copy.deepcopy(base).to(dev)
            self.input_dtype = torch.float32
        else:
            raise ValueError(f"unknown precision mode {spec.mode!r}")
        self.model = model.eval().requires_grad_(False)
        self.cond_frame = torch.zeros(1, MOTION_DIM, dtype=self.input_dtype, device=dev)
        self.cond = torch.zeros(1, SEQ_FRAMES, base.cond_dim, dtype=self.input_dtype, device=dev)
        self.noise_tables = noise_tables(alphas_cumprod()).to(dev)
        self._core: Callable[..., Tensor] = self._x0
        self._step_x0: Callable[..., Tensor] = guided_x0_step
        self._folded_x0: Callable[..., Tensor] = folded_x0_step
        self.stacked = stacked_projections(self.model) if spec.window or spec.fold else None
        self.folded = None
        if spec.fold:
            self.folded = folded_weights(base, self.input_dtype, dev)
        self._window: Callable[[Tensor, str], WindowConstants | FoldedConstants]
        self._window = self._window_constants
        if spec.compile:
            self._window = torch.compile(self._window_constants, mode=compile_mode, dynamic=False)
            self._core = torch.compile(self._x0, mode=compile_mode, dynamic=False)
            self._step_x0 = torch.compile(guided_x0_step, mode=compile_mode, dynamic=False)
            self._folded_x0 = torch.compile(folded_x0_step, mode=compile_mode, dynamic=False)

    def load_condition(self, cond_frame: Tensor, cond: Tensor) -> None:
        """Copy a window's condition into the static buffers (cast to their dtype)."""
        self.cond_frame.copy_(cond_frame.reshape(self.cond_frame.shape))
        self.cond.copy_(cond.reshape(self.cond.shape))

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """no_grad + SDPA backend + TF32 flag (CUDA) + autocast, for a run or a capture."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(sdpa_backend(self.sdpa))
            stack.enter_context(math_mode("tf32" if self.spec.tf32 else "fp32", self.device))
            if self.spec.mode == "autocast":
                stack.enter_context(
                    torch.autocast(
                        self.device.type, dtype=self.spec.torch_dtype, cache_enabled=False
                    )
                )
            yield

    def _condition(self) -> tuple[Tensor, Tensor]:
        """(null ++ encoded) condition tokens [2, 80, d] and hidden [2, d]."""
        m = self.model
        cond_tokens, cond_hidden = m.encode_condition(self.cond)
        null_tokens, null_hidden = m.null_condition(1)
        return torch.cat((null_tokens, cond_tokens)), torch.cat((null_hidden, cond_hidden))

    def _x0(
        self,
        x: Tensor,
        t_vec: Tensor,
        time_tokens: Tensor,
        cond_tokens: Tensor,
        hidden: Tensor,
        sdpa: str,
    ) -> Tensor:
        """Guided x0 in fp32 for x [1, 80, 265]: unconditional and conditional as one batch.
        ``sdpa`` is entered here, where a compiled step traces it (:func:`sdpa_backend`)."""
        m = self.model
        with sdpa_backend(sdpa):
            tokens = m.embed_motion(x.to(self.input_dtype), self.cond_frame)
            both = m.decode(
                torch.cat((tokens, tokens)),
                t_vec.expand(2, -1),
                time_tokens.expand(2, -1, -1),
                cond_tokens,
                hidden,
            ).float()
        uncond, conditioned = both[:1], both[1:]
        return uncond + (conditioned - uncond) * GUIDANCE_WEIGHT

    def _window_constants(self, times: Tensor, sdpa: str) -> WindowConstants | FoldedConstants:
        """The condition encoder, the time embeddings of ``times`` [T] and the window's
        constants (folded on the fold path): everything a window computes once."""
        with sdpa_backend(sdpa):
            cond_tokens, hidden = self._condition()
        t_vecs, t_tokens = self.model.time_embedding(times)
        consts = window_constants(
            self.model, self.cond_frame, cond_tokens, hidden, t_vecs, t_tokens, self.stacked
        )
        return consts if self.folded is None else fold_window(self.model, consts)

    def step(self, x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
        """The exported step (everything recomputed): (pred_noise, x_start), fp32. No context."""
        cond_tokens, hidden = self._condition()
        t_vec, time_tokens = self.model.time_embedding(time_cond)
        x0 = self._core(x, t_vec, time_tokens, cond_tokens, hidden, self.sdpa)
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
            if not self.spec.hoist:
                return sampler.sample(self.step, x_t)
            order = iter(range(sampler.time_cond.shape[0]))
            if self.spec.window or self.spec.fold:
                consts = self._window(sampler.time_cond[:, 0], self.sdpa)
            # One step's constants per call, at index 0: a compiled step is traced once.
            if self.folded is not None:
                folded, weights = consts, self.folded
                per_fold = [folded.at(k) for k in range(folded.steps)]

                def x0_of(x: Tensor, k: int) -> Tensor:
                    return self._folded_x0(self.model, x, per_fold[k], weights, 0, self.sdpa)
            elif self.spec.window:
                per_step = [consts.at(k) for k in range(consts.steps)]

                def x0_of(x: Tensor, k: int) -> Tensor:
                    return self._step_x0(self.model, x, per_step[k], 0, self.sdpa)
            else:
                cond_tokens, hidden = self._condition()
                t_vecs, t_tokens = self.model.time_embedding(sampler.time_cond[:, 0])

                def x0_of(x: Tensor, k: int) -> Tensor:
                    return self._core(
                        x, t_vecs[k : k + 1], t_tokens[k : k + 1], cond_tokens, hidden, self.sdpa
                    )

            def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
                x0 = x0_of(x, next(order))
                return predict_noise_from_start(x, time_cond, x0, self.noise_tables), x0

            return sampler.sample(denoise, x_t)


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
                lambda: fast.sample(self.sampler, self.x_t), GRAPH_WARMUP
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
