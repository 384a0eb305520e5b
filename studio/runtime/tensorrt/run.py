"""The runner: :class:`TensorRTEngine`, a deserialized engine bound to persistent device
buffers and run as an :class:`~studio.runtime.base.Engine` (CUDA).

One execution context, persistent torch device buffers for every I/O tensor bound once with
``set_tensor_address`` (an input given as a contiguous tensor of the engine's dtype is bound
by pointer instead of copied), ``execute_async_v3`` on ``torch.cuda.current_stream()`` unless
that is a default stream: "using default stream may lead to performance issues due to
additional cudaDeviceSynchronize() calls" (``enqueueV3`` in NvInferRuntime.h), so the engine
then enqueues on a stream of its own, ordered with the caller's by device-side waits. A CUDA
graph of the context (:meth:`TensorRTEngine.capture`) follows trtexec's recipe: one eager
enqueue first (deferred initialisation must not be captured), capture on a non-default stream,
and eager execution kept when the enqueue fails under capture (an engine may hold operations
that capture does not permit).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from studio.runtime.base import EngineBase, TensorSpec, capture_cuda_graph
from studio.runtime.tensorrt.load import deserialize_engine
from studio.runtime.tensorrt.support import cuda_device, import_tensorrt

__all__ = ["TensorRTEngine", "uses_side_stream"]

# CUDA's default-stream handles: 0 (legacy, torch's default), cudaStreamLegacy, cudaStreamPerThread.
DEFAULT_STREAM_HANDLES = (0, 1, 2)


def uses_side_stream(stream_handle: int) -> bool:
    """True for a default-stream handle, on which enqueueV3 adds device syncs (TensorRT's
    warning), so the runner enqueues on a stream of its own instead."""
    return int(stream_handle) in DEFAULT_STREAM_HANDLES


def _torch_dtypes(trt: Any) -> dict[Any, torch.dtype]:
    table = {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int32": torch.int32,
        "int64": torch.int64,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
        "fp8": torch.float8_e4m3fn,
    }
    return {getattr(trt, k): v for k, v in table.items() if hasattr(trt, k)}


class TensorRTEngine(EngineBase):
    """A serialized TensorRT engine as an :class:`~studio.runtime.base.Engine` (CUDA)."""

    backend = "tensorrt"

    def __init__(
        self,
        name: str,
        engine_path: str | os.PathLike[str],
        device: str | torch.device | None = None,
        precision: str | None = None,
        plugin: str | os.PathLike[str] | None = None,
    ) -> None:
        trt = import_tensorrt()
        dev = cuda_device(device)
        self.name = name  # for messages before EngineBase.__init__ runs
        self.path = Path(engine_path).expanduser()
        self._logger, self._runtime, engine = deserialize_engine(trt, self.path, dev, plugin)
        self._engine = engine
        with torch.cuda.device(dev):
            self._context = engine.create_execution_context()
        dtypes = _torch_dtypes(trt)
        inputs, outputs = [], []
        self._dynamic: set[str] = set()
        for i in range(engine.num_io_tensors):
            n = engine.get_tensor_name(i)
            shape = tuple(int(d) for d in engine.get_tensor_shape(n))
            spec = TensorSpec(n, shape, dtypes[engine.get_tensor_dtype(n)])
            if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT:
                if any(d < 0 for d in shape):
                    self._dynamic.add(n)
                    opt = tuple(int(d) for d in engine.get_tensor_profile_shape(n, 0)[1])
                    self._set_input_shape(n, opt)
                inputs.append(spec)
            else:
                outputs.append(spec)
        super().__init__(name, precision or "?", dev, tuple(inputs), tuple(outputs))
        self._buffers: dict[str, Tensor] = {}
        self._bound: dict[str, int] = {}
        for s in self.inputs:
            shape = tuple(self._context.get_tensor_shape(s.name))
            self._buffers[s.name] = torch.empty(shape, dtype=s.dtype, device=dev)
            self._bind(s.name, self._buffers[s.name])
        self._allocate_outputs()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._side: torch.cuda.Stream | None = None

    def _set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """``set_input_shape``, whose False (a shape outside the profile) becomes an error."""
        if not self._context.set_input_shape(name, shape):
            raise ValueError(
                f"{self.name}: TensorRT refused shape {shape} for {name} "
                "(outside the engine's optimization profile)"
            )

    def _bind(self, name: str, t: Tensor) -> None:
        ptr = t.data_ptr()
        if self._bound.get(name) != ptr:
            if not self._context.set_tensor_address(name, ptr):
                raise RuntimeError(f"{self.name}: TensorRT refused the address of {name}")
            self._bound[name] = ptr

    def _allocate_outputs(self) -> None:
        for s in self.outputs:
            shape = tuple(int(d) for d in self._context.get_tensor_shape(s.name))
            buf = self._buffers.get(s.name)
            if buf is None or tuple(buf.shape) != shape:
                self._buffers[s.name] = torch.empty(shape, dtype=s.dtype, device=self.device)
                self._bind(s.name, self._buffers[s.name])

    @property
    def buffers(self) -> dict[str, Tensor]:
        """The persistent I/O buffers (write inputs into them to skip every copy)."""
        return dict(self._buffers)

    def _execute(self, stream: int) -> None:
        if not self._context.execute_async_v3(stream):
            raise RuntimeError(f"{self.name}: TensorRT execute_async_v3 failed")

    def _enqueue(self, borrowed: tuple[Tensor, ...] = ()) -> None:
        """``execute_async_v3`` on the caller's stream, or on the engine's own stream ordered
        both ways with it when the caller's is a default stream; ``borrowed`` (caller tensors
        bound by pointer) are then recorded on that stream so their memory outlives the read."""
        current = torch.cuda.current_stream(self.device)
        if not uses_side_stream(current.cuda_stream):
            self._execute(current.cuda_stream)
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(current)
        self._execute(self._side.cuda_stream)
        current.wait_stream(self._side)
        for t in borrowed:
            t.record_stream(self._side)

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.check_feed(feed)
        reshaped = False
        borrowed = []
        for s in self.inputs:
            t = feed[s.name]
            if s.name in self._dynamic and tuple(self._buffers[s.name].shape) != tuple(t.shape):
                if self._graph is not None:
                    raise ValueError(f"{self.name}: a captured engine has fixed input shapes")
                self._set_input_shape(s.name, tuple(t.shape))
                self._buffers[s.name] = torch.empty(t.shape, dtype=s.dtype, device=self.device)
                reshaped = True
            buf = self._buffers[s.name]
            if self._graph is None and t.dtype == s.dtype and t.is_contiguous():
                self._bind(s.name, t)  # by pointer: no copy
                borrowed.append(t)
            else:
                if t.data_ptr() != buf.data_ptr():
                    buf.copy_(t)
                self._bind(s.name, buf)
        if reshaped:
            self._allocate_outputs()
        if self._graph is not None:
            self._graph.replay()
        else:
            self._enqueue(tuple(borrowed))
        return {s.name: self._buffers[s.name] for s in self.outputs}

    def capture(self, warmup: int = 1) -> bool:
        """CUDA graph of the context over the persistent buffers (static shapes only).

        False, with eager execution kept, for dynamic shapes and for engines whose enqueue
        fails under stream capture (trtexec falls back the same way).
        """
        if self._graph is not None:
            return True
        if self._dynamic:
            return False
        for s in self.inputs:
            self._bind(s.name, self._buffers[s.name])
        with torch.cuda.device(self.device):
            self._enqueue()  # the first enqueue does deferred setup that must not be captured
            torch.cuda.current_stream(self.device).synchronize()
            try:
                self._graph, _ = capture_cuda_graph(self._enqueue, warmup)
            except Exception:  # noqa: BLE001 - not capturable: stay eager
                self._graph = None
                torch.cuda.synchronize(self.device)
                return False
        self.static_inputs = {s.name: self._buffers[s.name] for s in self.inputs}
        return True
