"""The base of the runtime, which knows no backend: the Engine protocol, tensor specs, graph
capture, device choice and the math modes an engine runs under.

An :class:`Engine` runs one network with static, named inputs and outputs
(:class:`TensorSpec`: name, shape, dtype), on tensors that already live on its device:
``engine.run({"feature": f})`` returns ``{"output": img}`` without host copies or host
syncs. Batch size is part of the static shapes; an engine built for batch 8 takes exactly
[8, ...] inputs, so a last, partial batch is padded (and the padding dropped after).

Output tensors may be engine-owned, persistent buffers (CUDA-graph replays, TensorRT, ONNX
Runtime on CUDA): they are overwritten by the next ``run``. Clone what you keep across runs.

The backends (:mod:`studio.runtime.torch_backend`, :mod:`studio.runtime.onnxruntime_backend`,
:mod:`studio.runtime.tensorrt`) build on :class:`EngineBase`; the precision policy and what
each backend can run here is :mod:`studio.runtime.precision`;
:func:`studio.runtime.factory.make_engine` builds an engine.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from studio.errors import InputError, StudioError
from studio.models import NamedIO
from studio.paths import engine_cache_dir

HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class BackendUnavailable(StudioError):
    """A backend (or one of its features) cannot run here; the message says why and what to do."""


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``torch.float32``/``"tensor(float)"``-style names -> torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    text = str(name).removeprefix("torch.").removeprefix("tensor(").removesuffix(")")
    table = {
        "float": torch.float32,
        "float32": torch.float32,
        "float16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "double": torch.float64,
        "float64": torch.float64,
        "int64": torch.int64,
        "int32": torch.int32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
    }
    try:
        return table[text]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


@dataclass(frozen=True)
class TensorSpec:
    """One engine input or output; a dimension of -1 is dynamic (HuBERT's sample count)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def problem(self, t: Any, device: torch.device) -> str | None:
        """Why ``t`` cannot be fed as this input (None when it fits). Host metadata only."""
        if not isinstance(t, Tensor):
            return f"{self.name} must be a torch.Tensor, got {type(t).__name__}"
        shape = tuple(t.shape)
        if len(shape) != len(self.shape) or any(
            want >= 0 and got != want for got, want in zip(shape, self.shape, strict=True)
        ):
            want = "x".join("N" if d < 0 else str(d) for d in self.shape)
            return f"{self.name} must be [{want}], got {list(shape)}"
        if t.dtype != self.dtype:
            both_int = not t.dtype.is_floating_point and not self.dtype.is_floating_point
            if not both_int:
                return f"{self.name} must be {_dtype_name(self.dtype)}, got {_dtype_name(t.dtype)}"
        if t.device.type != device.type or (
            device.type == "cuda" and (t.device.index or 0) != (device.index or 0)
        ):
            return f"{self.name} is on {t.device}, the engine runs on {device}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": _dtype_name(self.dtype)}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@runtime_checkable
class Engine(Protocol):
    """What compute code calls: static named I/O, run on device tensors, optional capture."""

    name: str
    backend: str
    precision: str
    device: torch.device
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Outputs by name for inputs by name (device tensors; no host copies or syncs)."""
        ...

    def capture(self) -> bool:
        """Capture a CUDA graph with static buffers; False when the engine cannot."""
        ...


class EngineBase(NamedIO):
    """Shared plumbing: I/O specs, feed validation, static input buffers, description."""

    backend = "base"

    def __init__(
        self,
        name: str,
        precision: str,
        device: torch.device,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
    ) -> None:
        self.name = name
        self.precision = precision
        self.device = device
        self.inputs = inputs
        self.outputs = outputs
        self.static_inputs: dict[str, Tensor] | None = None  # set once captured

    @property
    def batch(self) -> int:
        """The static batch size (leading dimension of the first input)."""
        return self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1

    @property
    def captured(self) -> bool:
        return self.static_inputs is not None

    def check_feed(self, feed: Mapping[str, Tensor]) -> None:
        """ValueError naming the first missing, unexpected or mismatched input."""
        missing = [s.name for s in self.inputs if s.name not in feed]
        extra = [k for k in feed if k not in self.input_names]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unexpected {', '.join(extra)}")
            raise ValueError(
                f"{self.name} ({self.backend}): {'; '.join(parts)} "
                f"(inputs are {', '.join(self.input_names)})"
            )
        for s in self.inputs:
            why = s.problem(feed[s.name], self.device)
            if why is not None:
                raise ValueError(f"{self.name} ({self.backend}): {why}")

    def _fill_static(self, feed: Mapping[str, Tensor]) -> None:
        """Copy the feed into the static input buffers (skipped for the buffers themselves)."""
        assert self.static_inputs is not None
        for name, buf in self.static_inputs.items():
            t = feed[name]
            if t.data_ptr() != buf.data_ptr():
                buf.copy_(t)

    def __call__(self, **feed: Tensor) -> dict[str, Tensor]:
        return self.run(feed)

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:  # pragma: no cover
        raise NotImplementedError

    def capture(self) -> bool:
        return False

    def example_feed(self, seed: int = 0) -> dict[str, Tensor]:
        """Random inputs of the static shapes on the engine's device, drawn like real ones."""
        from studio.models.onnx_export import random_inputs

        example = [torch.zeros(s.shape, dtype=s.dtype) for s in self.inputs]
        drawn = random_inputs(self.input_names, example, seed)
        return {n: t.to(self.device) for n, t in zip(self.input_names, drawn, strict=True)}

    def describe(self) -> dict[str, Any]:
        return {
            "network": self.name,
            "backend": self.backend,
            "precision": self.precision,
            "device": str(self.device),
            "captured": self.captured,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} {self.precision} on {self.device}"
            f"{' (graph)' if self.captured else ''}>"
        )


GPU_LOCK = threading.RLock()
"""Held while a CUDA graph is captured and while the allocator's cache is released: both are
process-wide (a capture empties the cache and records into one private pool), so two threads
(a batch analysing the next clip beside a render) must not do them at once."""


def release_cached_memory() -> None:
    """``torch.cuda.empty_cache()``, never in the middle of another thread's capture."""
    with GPU_LOCK:
        torch.cuda.empty_cache()


def maxrss_mb(usage: Any) -> float:
    """A ``resource.struct_rusage``'s peak resident memory in MB (KiB on Linux, bytes on
    macOS)."""
    return usage.ru_maxrss / 2**20 if sys.platform == "darwin" else usage.ru_maxrss / 1024


def peak_memory_mb() -> dict[str, float | None]:
    """This process's peak resident host memory and peak GPU memory allocated by torch so far,
    MB (``gpu`` None where CUDA was never started)."""
    import resource  # POSIX only: imported where it is used

    host = maxrss_mb(resource.getrusage(resource.RUSAGE_SELF))
    gpu = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gpu = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return {"host": round(host, 1), "gpu": gpu}


def capture_cuda_graph(
    fn: Callable[[], Any], warmup: int = 3, context: Callable[[], Any] | None = None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``fn`` into a CUDA graph: warm-up on a side stream, then one capture.

    ``fn`` must read only static buffers (filled with ``copy_`` before each replay) and must
    not synchronize with the host. ``context()`` (e.g. no_grad + autocast) wraps both the
    warm-up and the capture; it is entered before :data:`GPU_LOCK` is taken, so a thread
    waiting for a math mode (:func:`math_mode`) never holds the lock. Returns (graph, fn's
    output, which replays overwrite).
    """
    ctx = context or contextlib.nullcontext
    with ctx(), GPU_LOCK:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, warmup)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (a batch analyses the next clip beside the
        # render, on its own stream) does not invalidate this capture
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = fn()
        torch.cuda.synchronize()
    return graph, out


_STREAMS = threading.local()


@contextlib.contextmanager
def own_stream() -> Iterator[None]:
    """This thread's CUDA work on a stream of its own (one per thread, made on first use),
    finished at exit (nothing where CUDA is not in use): work beside another thread's
    overlaps with it on the GPU instead of queueing behind it on the default stream. It
    starts without waiting for other streams: what it reads must be ready already (weights
    loaded before, host inputs)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        yield
        return
    stream = getattr(_STREAMS, "stream", None)
    if stream is None:
        stream = _STREAMS.stream = torch.cuda.Stream()
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()


class SharedFlags:
    """Process-wide torch flags (TF32, cuDNN's autotuner) that threads hold for a while.

    The flags are global, so two threads cannot run under different values at once: a thread
    asking for a value other threads hold a different one of waits until they let go. Threads
    asking for the same value hold it together. The value in force before the first hold is
    restored after the last one. Never wait for another thread while holding a value that
    thread may ask to change (the batch's threads don't: the render thread waits for the
    analysis only outside every hold)."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None]) -> None:
        self._read, self._write = read, write
        self._cond = threading.Condition()
        self._holds: dict[int, list[Any]] = {}  # thread -> its held values, innermost last
        self._before: Any = None

    def _free_for(self, value: Any, me: int) -> bool:
        return all(held[-1] == value for t, held in self._holds.items() if t != me)

    @contextlib.contextmanager
    def hold(self, value: Any) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            self._cond.wait_for(lambda: self._free_for(value, me))
            if not self._holds:
                self._before = self._read()
            self._holds.setdefault(me, []).append(value)
            self._write(value)
        try:
            yield
        finally:
            with self._cond:
                mine = self._holds[me]
                mine.pop()
                if not mine:
                    del self._holds[me]
                    if not self._holds:
                        self._write(self._before)
                else:  # back to this thread's outer value, once no other thread holds another
                    self._cond.wait_for(lambda: self._free_for(mine[-1], me))
                    self._write(mine[-1])
                self._cond.notify_all()


# --- devices, caches, math modes ------------------------------------------------------------------


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None/"auto": the first CUDA GPU when torch sees one, else the CPU; InputError (naming
    ``--device``, the option every command takes it from) for a device that is not there."""
    if device is None or device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"--device {device}: not a device; use auto, cpu or cuda[:N]") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device} was asked for, but torch sees no CUDA GPU here")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise InputError(
                f"device {device}: torch sees {torch.cuda.device_count()} GPU(s) (cuda:0..)"
            )
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise InputError(f"--device {device}: the studio runs on cpu or cuda[:N], not {dev.type}")
    return dev


def default_cache_dir() -> Path:
    """Where exported ONNX files and engines are cached: :func:`studio.paths.engine_cache_dir`
    (``$STUDIO_ENGINE_CACHE``, else ``engines/`` under the studio's cache root)."""
    return engine_cache_dir()


def sdpa_backend(name: str) -> contextlib.AbstractContextManager[None]:
    """Scaled-dot-product attention restricted to one backend ("flash", "efficient", "cudnn",
    "math"), or PyTorch's own choice ("auto", no restriction: whatever is in force around the
    call). Entered inside a compiled function, a named choice is part of its trace: compiled
    code made under one backend is not reused under another (a context around the call would
    be, silently)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    if name not in names:
        raise ValueError(f"unknown SDPA backend {name!r}; expected auto or one of {sorted(names)}")
    return sdpa_kernel([names[name]])


def _read_tf32() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def _write_tf32(value: tuple[bool, bool]) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = value


TF32 = SharedFlags(_read_tf32, _write_tf32)


@contextlib.contextmanager
def math_mode(precision: str, device: torch.device) -> Iterator[None]:
    """TF32 on for ``tf32``, off for everything else (strict fp32), on CUDA; restored after
    (held through :data:`TF32`: a thread asking for the other setting waits)."""
    if device.type != "cuda":
        yield
        return
    on = precision == "tf32"
    with TF32.hold((on, on)):
        yield
