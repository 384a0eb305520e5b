"""The PyTorch engine: eager fp32/TF32, bf16/fp16 (cast weights or autocast), channels_last,
CUDA graphs with static buffers, and torch.compile on request.

Precision policy (:class:`PrecisionAdapter`, also what the half-precision ONNX export traces):

- ``mode="cast"``: floating parameters and buffers are cast to the compute dtype on a copy
  of the module, except what must stay fp32 (:data:`KEEP_FP32`): LMDM's noise schedule
  (``alphas_cumprod``, ``noise_tables``) and its sinusoidal time MLP (timesteps up to 999 lose
  all precision in half types; its output is cast to the compute dtype). Operations in
  :data:`FP32_OPS` (``grid_sample``; on the CPU also 3-D average pooling, which has no half
  kernels there) run in fp32 inside the half graph. Inputs in :data:`FP32_INPUTS` are passed
  in fp32 (LMDM's noisy motion: the network's own step casts it for its layers and reads it
  in fp32 for the noise prediction, with the guidance combined in fp32 as well).
- ``mode="autocast"``: fp32 weights under ``torch.autocast(cache_enabled=False)`` (the cache
  must be off for CUDA-graph capture); autocast keeps grid sampling in fp32 by itself.
- Default: ``cast``, except the warp network, whose keypoint grids are more accurate under
  autocast (they stay fp32 there, while ``cast`` would build them from half keypoints).

Inputs and outputs are fp32 (as in Ditto's engines) unless ``io_dtype`` says otherwise;
integer inputs (LMDM's ``time_cond``) keep their dtype.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from studio.runtime.base import HALF_DTYPES, EngineBase, TensorSpec, capture_cuda_graph, math_mode

_log = logging.getLogger(__name__)

__all__ = [
    "FP32_INPUTS",
    "FP32_OPS",
    "KEEP_FP32",
    "PrecisionAdapter",
    "TorchEngine",
    "default_mode",
]

MODES = ("fp32", "cast", "autocast")

# (submodule names kept fp32 with their outputs cast to the compute dtype, buffer names kept).
KEEP_FP32: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "lmdm": (("time_mlp",), ("alphas_cumprod", "noise_tables")),
}
# Inputs passed in fp32 in every mode: the network casts them for its layers itself.
FP32_INPUTS: dict[str, tuple[str, ...]] = {"lmdm": ("x",)}


def _fp32_ops(device: torch.device) -> tuple[Callable[..., Any], ...]:
    ops: tuple[Callable[..., Any], ...] = (F.grid_sample,)
    if device.type == "cpu":
        ops += (F.avg_pool3d,)
    return ops


FP32_OPS = ("grid_sample", "avg_pool3d (CPU only)")


class Fp32Islands(TorchFunctionMode):
    """Run the listed torch functions in fp32 on half inputs, casting the result back."""

    def __init__(self, ops: tuple[Callable[..., Any], ...]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in self.ops:
            low = [a.dtype for a in args if isinstance(a, Tensor) and a.dtype in _HALVES]
            if low:
                up = [
                    a.float() if isinstance(a, Tensor) and a.dtype in _HALVES else a for a in args
                ]
                return func(*up, **kwargs).to(low[0])
        return func(*args, **kwargs)


_HALVES = (torch.float16, torch.bfloat16)


class _CastOutput(nn.Module):
    """Run ``inner`` in fp32 and cast its output to ``dtype``."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x).to(self.dtype)


def default_mode(network: str, precision: str) -> str:
    """``fp32`` for fp32/tf32; for bf16/fp16 ``autocast`` for the warp network, else ``cast``."""
    if precision not in HALF_DTYPES:
        return "fp32"
    return "autocast" if network == "warp_network" else "cast"


def _io_names(module: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from studio.models.onnx_export import _io_names as names

    return names(module)


def _as_tuple(out: Any) -> tuple[Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _module_device(module: nn.Module) -> torch.device:
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.type != "cuda" or (a.index or 0) == (b.index or 0))


def _to_channels_last(module: nn.Module) -> None:
    """4-D parameters/buffers to channels_last, 5-D to channels_last_3d (in place)."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)
            elif t.dim() == 5:
                t.data = t.data.contiguous(memory_format=torch.channels_last_3d)


def _memory_format(rank: int) -> torch.memory_format | None:
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(rank)


class PrecisionAdapter(nn.Module):
    """A studio network under a precision policy, with fp32 (or ``io_dtype``) I/O.

    ``forward(*inputs)`` takes the inputs in ``INPUT_NAMES`` order and returns the outputs in
    ``OUTPUT_NAMES`` order as a tuple. ``example_inputs(batch)`` are the module's, so the
    adapter exports to ONNX like the module itself (:mod:`studio.runtime.onnx_cache`).
    The adapter owns a cast copy of the module in ``cast`` mode; otherwise it wraps
    ``module`` itself (moved to ``device`` on a copy when it lives elsewhere).
    """

    def __init__(
        self,
        network: str,
        module: nn.Module,
        precision: str = "fp32",
        device: torch.device | str = "cpu",
        mode: str | None = None,
        io_dtype: torch.dtype | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        dev = torch.device(device)
        mode = mode or default_mode(network, precision)
        if mode not in MODES:
            raise ValueError(f"unknown precision mode {mode!r}: one of {', '.join(MODES)}")
        if precision not in ("fp32", "tf32", *HALF_DTYPES):
            raise ValueError(f"the torch engine runs fp32, tf32, fp16 or bf16, not {precision}")
        if mode != "fp32" and precision not in HALF_DTYPES:
            raise ValueError(f"mode {mode} needs precision fp16 or bf16, got {precision}")
        if mode == "fp32" and precision in HALF_DTYPES:
            raise ValueError(f"precision {precision} needs mode cast or autocast")
        self.network = network
        self.precision = precision
        self.mode = mode
        self.device_ = dev
        self.compute_dtype = HALF_DTYPES.get(precision, torch.float32)
        self.io_dtype = io_dtype or torch.float32
        self.INPUT_NAMES, self.OUTPUT_NAMES = _io_names(module)
        module = module.eval()
        if mode == "cast" or channels_last or not _same_device(_module_device(module), dev):
            module = copy.deepcopy(module).requires_grad_(False)
        if mode == "cast":
            self._cast(network, module, self.compute_dtype)
        module.to(dev)
        if channels_last:
            _to_channels_last(module)
        self.inner = module
        kept = FP32_INPUTS.get(network, ())
        self._fp32_at = frozenset(i for i, n in enumerate(self.INPUT_NAMES) if n in kept)
        self.islands = _fp32_ops(dev)

    @staticmethod
    def _cast(network: str, module: nn.Module, dtype: torch.dtype) -> None:
        keep_modules, keep_buffers = KEEP_FP32.get(network, ((), ()))
        # Copies taken before the cast: casting back afterwards would keep the rounding.
        kept = {name: copy.deepcopy(getattr(module, name)).float() for name in keep_modules}
        saved = {name: getattr(module, name).detach().clone().float() for name in keep_buffers}
        module.to(dtype)  # floating parameters and buffers
        for name, sub in kept.items():
            setattr(module, name, _CastOutput(sub, dtype))
        for name, buf in saved.items():
            setattr(module, name, buf)

    def example_inputs(self, batch: int = 1) -> tuple[Tensor, ...]:
        ex = self.inner.example_inputs(batch)
        return tuple(
            t.to(self.device_, self.io_dtype) if t.is_floating_point() else t.to(self.device_)
            for t in ex
        )

    @contextlib.contextmanager
    def policy(self) -> Iterator[None]:
        """Autocast (mode autocast) and the fp32 islands (mode cast)."""
        with contextlib.ExitStack() as stack:
            if self.mode == "autocast":
                stack.enter_context(
                    torch.autocast(self.device_.type, dtype=self.compute_dtype, cache_enabled=False)
                )
            if self.mode == "cast":
                stack.enter_context(Fp32Islands(self.islands))
            yield

    def _compute(self, t: Tensor) -> Tensor:
        if not t.is_floating_point():
            return t
        return t.to(self.compute_dtype) if self.mode == "cast" else t.float()

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        args = [
            t.float() if i in self._fp32_at and t.is_floating_point() else self._compute(t)
            for i, t in enumerate(inputs)
        ]
        with self.policy():
            outs = _as_tuple(self.inner(*args))
        return tuple(o.to(self.io_dtype) if o.is_floating_point() else o for o in outs)


def _reusable(
    network: str,
    module: nn.Module,
    precision: str,
    device: torch.device,
    mode: str | None,
    io_dtype: torch.dtype | None,
    channels_last: bool,
) -> bool:
    """Whether ``module`` is already a :class:`PrecisionAdapter` of exactly this policy."""
    return (
        isinstance(module, PrecisionAdapter)
        and module.network == network
        and module.precision == precision
        and _same_device(module.device_, device)
        and mode in (None, module.mode)
        and (io_dtype or torch.float32) == module.io_dtype
        and not channels_last
    )


COMPILED_ENGINES = 64  # compiled torch engines a process may hold (networks x batch sizes)


def _room_for_compiled_engines() -> None:
    """Every compiled engine compiles the same code (the precision adapter's forward), and
    Dynamo keeps at most ``recompile_limit`` (8 by default) graphs per code object: past it a
    new engine would run eagerly inside its CUDA graph, with a log line only. Two networks
    on a ladder of batch sizes reach 8; make room for :data:`COMPILED_ENGINES`."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), COMPILED_ENGINES))
            return


def _aot_forward(
    name: str,
    adapter: PrecisionAdapter,
    precision: str,
    policy: str,
    batch: int,
    example: tuple[Tensor, ...],
    aot_dir: str | os.PathLike[str],
    build: bool,
) -> tuple[Callable[..., tuple[Tensor, ...]], str]:
    """The adapter's forward from its AOTInductor package (:mod:`studio.runtime.aot_cache`):
    (forward, "loaded" or "built"); where this torch cannot load packages, from Inductor's
    standalone artifact (:mod:`studio.runtime.aot_artifacts`): (forward, "artifact loaded"
    or "artifact built"); or (the adapter, why not) for torch.compile to take.

    A new file's outputs are checked against the adapter's on ``example`` when it is built
    (one that differs is never kept, and remembered as failed); a kept file, whose key and
    SHA-256 match, is loaded as it is, without running the network eagerly again."""
    from studio.runtime import aot_artifacts, aot_cache

    key = aot_cache.AotKey.of(name, adapter, precision, policy, batch, adapter.device_)

    def check(runner: Callable[..., Any]) -> str | None:
        return _differs(adapter, _tupled(runner), example, precision)

    args = (aot_dir, key, adapter, example, build, check)
    try:  # a kept artifact or package is loaded first: no lock, no probe
        artifact = aot_artifacts.artifact_file(aot_dir, key).is_file()
        runner, why = (None, "") if artifact else aot_cache.load_or_build(*args)
        if artifact or why.startswith(aot_cache.NO_PACKAGES):
            runner, made = aot_artifacts.load_or_build(*args)
            why = f"artifact {made}" if runner else "; ".join(w for w in (why, made) if w)
    except Exception as e:  # noqa: BLE001 - a network AOTInductor cannot take: torch.compile
        _log.warning(
            "%s: no compiled package (%s: %s); compiling in process", name, type(e).__name__, e
        )
        return adapter, f"failed: {type(e).__name__}"
    if runner is None:
        _log.debug("%s: %s", name, why)
        return adapter, why
    return _tupled(runner), why


def _tupled(runner: Callable[..., Any]) -> Callable[..., tuple[Tensor, ...]]:
    """``runner`` returning a tuple of outputs (packages and artifacts return lists)."""

    def forward(*args: Tensor) -> tuple[Tensor, ...]:
        out = runner(*args)
        return tuple(out) if isinstance(out, list | tuple) else (out,)

    return forward


PACKAGE_READY = ("loaded", "built")  # TorchEngine.aot: an AOTInductor package runs it
ARTIFACT_READY = ("artifact loaded", "artifact built")  # an Inductor artifact runs it
AOT_READY = (*PACKAGE_READY, *ARTIFACT_READY)  # compiled ahead of time
# an engine running an artifact at this batch or above is not captured: a call's GPU time
# (about 100 ms at 32 frames) hides its Python launches, while a graph's warm-up and
# instantiation cost a new process seconds (docs/benchmarks.md)
UNCAPTURED_BATCH = 16
# the largest relative L2 error a compiled engine may have against the adapter on its example
# inputs: what two correct kernels of a precision may differ by (fp16 eager and compiled are
# each about 1e-2 from fp32 on the full-size renderer, bf16 about 6e-2: docs/benchmarks.md);
# an engine computing something else (weights or inputs bound wrongly) is off by about 1
AOT_TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 3e-2, "bf16": 1e-1}


def _differs(
    adapter: PrecisionAdapter,
    forward: Callable[..., tuple[Tensor, ...]],
    example: tuple[Tensor, ...],
    precision: str,
) -> str | None:
    """Why ``forward`` does not compute ``adapter``'s outputs on ``example`` (None: it does).

    The measure is the relative L2 error, not the largest element's: half precisions round
    differently in each kernel, and through a deep random-weight network one pixel in a
    million can move by 3 % of the range between two correct engines."""
    tol = AOT_TOLERANCE[precision]
    with torch.no_grad():
        want, got = adapter(*example), forward(*example)
    want = want if isinstance(want, tuple) else (want,)
    if len(want) != len(got):
        return f"returns {len(got)} outputs, not {len(want)}"
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.shape != g.shape:
            return f"output {i} has shape {tuple(g.shape)}, not {tuple(w.shape)}"
        w, g = w.double(), g.double()
        err = float(torch.linalg.vector_norm(w - g)) / (float(torch.linalg.vector_norm(w)) or 1.0)
        if not err <= tol:
            return f"output {i} differs by {err:.3g} (relative L2; tolerance {tol:g})"
    return None


class TorchEngine(EngineBase):
    """One studio network as an :class:`~studio.runtime.base.Engine` on torch.

    ``module`` is the network module (``load_network``/``random_network``), or a
    :class:`PrecisionAdapter` of the same policy, which is then used as it is (engines of
    several batch sizes share one cast copy of the weights); ``precision`` is
    fp32, tf32 (CUDA), bf16 or fp16 (CUDA); ``mode`` cast/autocast for half precisions (see
    the module docstring); ``channels_last`` converts weights (and, in graph mode, the static
    input buffers) to channels-last layouts; ``compile`` runs the forward through
    ``torch.compile`` (``compile_mode``); ``batch`` is the static batch size. The output
    specs are found by one warm-up forward on example inputs at construction.

    :meth:`capture` records a CUDA graph: static input buffers (``static_inputs``; write into
    them to skip the copy), warm-up on a side stream, then ``run`` copies the feed into the
    buffers and replays; the returned outputs are the graph's static outputs.
    """

    backend = "torch"

    def __init__(
        self,
        name: str,
        module: nn.Module,
        precision: str = "fp32",
        device: torch.device | str = "cpu",
        batch: int = 1,
        mode: str | None = None,
        channels_last: bool = False,
        compile: bool = False,
        compile_mode: str = "default",
        io_dtype: torch.dtype | None = None,
        aot_dir: str | os.PathLike[str] | None = None,
        aot_build: bool = False,
    ) -> None:
        dev = torch.device(device)
        if _reusable(name, module, precision, dev, mode, io_dtype, channels_last):
            self.adapter = module  # shared (its weights too) with the engines of other batches
        elif isinstance(module, PrecisionAdapter):
            raise ValueError(
                f"{name}: a precision adapter ({module.network}, {module.precision}, "
                f"{module.mode}) cannot serve {precision} {mode or ''} here; pass the network"
            )
        else:
            self.adapter = PrecisionAdapter(
                name, module, precision, dev, mode, io_dtype, channels_last
            ).eval()
        self.mode = self.adapter.mode
        self.channels_last = channels_last
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static_out: tuple[Tensor, ...] | None = None
        self._fn: Callable[..., tuple[Tensor, ...]] = self.adapter
        self.aot = "off"  # compiled ahead of time: AOT_READY, or why not
        example = self.adapter.example_inputs(batch)  # made once: large for the render nets
        if compile and aot_dir is not None and not channels_last:  # (exported contiguous)
            self._fn, self.aot = _aot_forward(
                name,
                self.adapter,
                precision,
                f"{self.mode}|{channels_last}|{compile_mode}",
                batch,
                example,
                aot_dir,
                aot_build,
            )
        if compile and self.aot not in AOT_READY:
            _room_for_compiled_engines()
            self._fn = torch.compile(self.adapter, mode=compile_mode, dynamic=False)
        names = self.adapter.INPUT_NAMES
        inputs = tuple(
            TensorSpec(n, tuple(t.shape), t.dtype) for n, t in zip(names, example, strict=True)
        )
        with self.context():
            outs = self._call(example)
        outputs = tuple(
            TensorSpec(n, tuple(t.shape), t.dtype)
            for n, t in zip(self.adapter.OUTPUT_NAMES, outs, strict=True)
        )
        super().__init__(name, precision, dev, inputs, outputs)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """no_grad + the TF32 setting of the precision (CUDA)."""
        with torch.no_grad(), math_mode(self.adapter.precision, self.adapter.device_):
            yield

    def _call(self, args: tuple[Tensor, ...] | list[Tensor]) -> tuple[Tensor, ...]:
        if self.channels_last and self._graph is None:
            args = [
                t.contiguous(memory_format=fmt)
                if t.is_floating_point() and (fmt := _memory_format(t.dim())) is not None
                else t
                for t in args
            ]
        return self._fn(*args)

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.check_feed(feed)
        if self._graph is not None:
            self._fill_static(feed)
            self._graph.replay()
            assert self._static_out is not None
            return dict(zip(self.output_names, self._static_out, strict=True))
        with self.context():
            outs = self._call([feed[n] for n in self.input_names])
        return dict(zip(self.output_names, outs, strict=True))

    @property
    def runs_uncaptured(self) -> bool:
        """Whether :meth:`capture` leaves this engine as it is: an Inductor artifact at
        :data:`UNCAPTURED_BATCH` frames or more."""
        return self.aot in ARTIFACT_READY and self.batch >= UNCAPTURED_BATCH

    def capture(self, warmup: int = 3) -> bool:
        """Capture the forward into a CUDA graph (CUDA only; False on the CPU). An engine
        running an AOTInductor package is ready as it is (True, nothing captured): a
        package's runner cannot be captured, and it launches its kernels from C++. One
        running an Inductor artifact is captured, as torch.compile's code is, below
        :data:`UNCAPTURED_BATCH` frames; from there on it too runs as it is."""
        if self.device.type != "cuda":
            return False
        if self._graph is not None or self.aot in PACKAGE_READY or self.runs_uncaptured:
            return True
        static: dict[str, Tensor] = {}
        for s in self.inputs:  # zeros: what the warm-up and the capture read does not matter
            last = self.channels_last and s.dtype.is_floating_point
            fmt = _memory_format(len(s.shape)) if last else None
            buf = torch.zeros(s.shape, dtype=s.dtype, device=self.device)
            static[s.name] = buf.contiguous(memory_format=fmt or torch.contiguous_format)
        args = [static[n] for n in self.input_names]
        graph, out = capture_cuda_graph(lambda: self._fn(*args), warmup, self.context)
        self._graph, self._static_out = graph, out
        self.static_inputs = static
        return True
