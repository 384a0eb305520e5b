"""The ONNX Runtime engine: CPU with zero-copy numpy views, CUDA through IOBinding.

- CPU: inputs are handed to ``InferenceSession.run`` as numpy views of the torch tensors
  (no copy for contiguous tensors) and the outputs come back as torch views of ORT's arrays.
- CUDA: the session runs on a stream of its own (a non-default torch stream: ORT treats the
  handle 0 as "no stream"), given to the CUDA provider as its ``user_compute_stream``, which
  also sets ``has_user_compute_stream`` (the provider's option parser; Python support since
  onnxruntime-gpu 1.17, microsoft/onnxruntime#19229). ``do_copy_in_default_stream`` keeps its
  default (1, the documented safe setting; nothing is copied with device-bound I/O anyway).
  Inputs are bound by device pointer (``IOBinding.bind_input(name, "cuda", id, element type,
  shape, data_ptr())``, re-bound only when a pointer or shape changes), outputs are
  preallocated torch tensors bound once (``bind_output`` with a buffer pointer), and the run
  option ``disable_synchronize_execution_providers=1`` keeps ``run_with_iobinding`` from
  waiting on the GPU. ORT's own ``synchronize_inputs``/``synchronize_outputs`` are host syncs;
  instead the caller's current stream and the session's stream are ordered with device-side
  waits both ways, so no host sync happens. Outputs are the engine's persistent buffers: the
  next ``run`` overwrites them.

Graphs with dynamic dimensions (HuBERT's ``input_values`` [1, N]) accept any size there; on
CUDA their outputs cannot be preallocated, so ORT allocates them and they come back through
the host with ``copy_outputs_to_cpu``. That copy is a plain ``cudaMemcpy`` on the legacy
default stream, which does not wait for a non-blocking stream such as the session's, so the
session stream is synchronized first (a host round trip, said here because of it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from studio.errors import InputError
from studio.runtime.base import BackendUnavailable, EngineBase, TensorSpec, torch_dtype
from studio.runtime.precision import import_backend

__all__ = ["OrtEngine", "cuda_provider_options", "element_type", "import_onnxruntime"]

_NUMPY = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}
# IOBinding also takes an ONNX TensorProto type number where numpy has no dtype.
_ONNX_BFLOAT16 = 16
RUN_NO_SYNC = "disable_synchronize_execution_providers"


def element_type(dtype: torch.dtype) -> Any:
    """The ``element_type`` IOBinding wants for ``dtype``: a numpy type, or for bf16 the ONNX
    type number (``bind_input``'s docstring allows either)."""
    if dtype == torch.bfloat16:
        return _ONNX_BFLOAT16
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise BackendUnavailable(f"ONNX Runtime I/O binding has no {dtype} here") from None


def cuda_provider_options(device_index: int, stream_handle: int, tf32: bool) -> dict[str, str]:
    """The CUDA provider's options: device, the session's own stream, and the TF32 switch."""
    if stream_handle == 0:
        raise ValueError("the CUDA provider ignores stream 0; give it a stream of its own")
    return {
        "device_id": str(device_index),
        "user_compute_stream": str(stream_handle),
        "use_tf32": "1" if tf32 else "0",
    }


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module; BackendUnavailable with the install hint when it is missing."""
    return import_backend("onnxruntime")


def _dims(shape: Any) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else -1 for d in shape)


def _static(shape: tuple[int, ...]) -> bool:
    return all(d > 0 for d in shape)


class OrtEngine(EngineBase):
    """One ONNX file in ONNX Runtime as an :class:`~studio.runtime.base.Engine`.

    ``precision`` describes the graph (fp32 files run fp32; a half file made by
    :func:`~studio.runtime.onnx_cache.export_for_engine` runs fp16 with fp32 I/O) and, on
    CUDA, sets the provider's TF32 switch (on only for ``tf32``). ``threads`` sets ORT's
    intra-op threads on the CPU.
    """

    backend = "onnxruntime"

    def __init__(
        self,
        name: str,
        path: str | os.PathLike[str],
        precision: str = "fp32",
        device: torch.device | str = "cpu",
        threads: int | None = None,
    ) -> None:
        ort = import_onnxruntime()
        dev = torch.device(device)
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise InputError(f"ONNX file {self.path} does not exist")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads is not None:
            opts.intra_op_num_threads = int(threads)
        self._stream: torch.cuda.Stream | None = None
        if dev.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable(
                    "ONNX Runtime has no CUDAExecutionProvider here: pip install onnxruntime-gpu"
                )
            self._stream = torch.cuda.Stream(dev)
            cuda_opts = cuda_provider_options(
                dev.index or 0, self._stream.cuda_stream, precision == "tf32"
            )
            try:
                session = self._session(ort, opts, cuda_opts)
            except Exception:  # noqa: BLE001 - an older ORT without use_tf32
                cuda_opts.pop("use_tf32")
                try:
                    session = self._session(ort, opts, cuda_opts)
                except Exception as e:  # noqa: BLE001 - e.g. no user_compute_stream before 1.17
                    raise BackendUnavailable(
                        f"ONNX Runtime {ort.__version__} cannot open {self.path.name} on CUDA "
                        f"with a user compute stream (needs onnxruntime-gpu >= 1.17): {e}"
                    ) from None
            if "CUDAExecutionProvider" not in session.get_providers():
                raise BackendUnavailable(f"ONNX Runtime could not put {self.path.name} on CUDA")
        else:
            try:
                session = ort.InferenceSession(
                    str(self.path), opts, providers=["CPUExecutionProvider"]
                )
            except Exception as e:  # noqa: BLE001 - ORT raises several pybind types for bad files
                reason = " ".join(str(e).split())[:160] or type(e).__name__
                damaged = any(w in str(e) for w in ("INVALID_PROTOBUF", "Protobuf parsing"))
                fix = (
                    "replace the file (one in the studio's cache is made again once removed)"
                    if damaged
                    else f"`studio doctor` names this ONNX Runtime ({ort.__version__})"
                )
                raise InputError(
                    f"ONNX file {self.path}: ONNX Runtime cannot open it ({reason}); {fix}"
                ) from None
        self.session = session
        inputs = tuple(
            TensorSpec(i.name, _dims(i.shape), torch_dtype(i.type)) for i in session.get_inputs()
        )
        outputs = tuple(
            TensorSpec(o.name, _dims(o.shape), torch_dtype(o.type)) for o in session.get_outputs()
        )
        super().__init__(name, precision, dev, inputs, outputs)
        self.run_options = ort.RunOptions()
        self._io: Any = None
        self._bound: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._out: dict[str, Tensor] = {}
        if dev.type == "cuda":
            self.run_options.add_run_config_entry(RUN_NO_SYNC, "1")
            self._io = session.io_binding()
            for s in outputs:
                if _static(s.shape):
                    buf = torch.empty(s.shape, dtype=s.dtype, device=dev)
                    self._io.bind_output(
                        s.name,
                        "cuda",
                        dev.index or 0,
                        element_type(s.dtype),
                        s.shape,
                        buf.data_ptr(),
                    )
                    self._out[s.name] = buf
                else:
                    self._io.bind_output(s.name, "cuda", dev.index or 0)

    def _session(self, ort: Any, opts: Any, cuda_opts: dict[str, Any]) -> Any:
        return ort.InferenceSession(
            str(self.path),
            opts,
            providers=[("CUDAExecutionProvider", cuda_opts), "CPUExecutionProvider"],
        )

    def _input(self, spec: TensorSpec, t: Tensor) -> Tensor:
        """The tensor as the graph's dtype, contiguous (a copy only when it is not already)."""
        if t.dtype != spec.dtype:
            t = t.to(spec.dtype)
        return t if t.is_contiguous() else t.contiguous()

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.check_feed(feed)
        if self._io is None:
            arrays = {s.name: self._input(s, feed[s.name]).numpy() for s in self.inputs}
            got = self.session.run(list(self.output_names), arrays, self.run_options)
            return {n: torch.from_numpy(a) for n, a in zip(self.output_names, got, strict=True)}
        index = self.device.index or 0
        keep = []
        for s in self.inputs:
            t = self._input(s, feed[s.name])
            keep.append(t)  # alive until the session has read it (ordered below)
            key = (t.data_ptr(), tuple(t.shape))
            if self._bound.get(s.name) != key:
                self._io.bind_input(
                    s.name, "cuda", index, element_type(s.dtype), tuple(t.shape), t.data_ptr()
                )
                self._bound[s.name] = key
        assert self._stream is not None
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        self.session.run_with_iobinding(self._io, self.run_options)
        current.wait_stream(self._stream)
        for t in keep:
            t.record_stream(self._stream)
        out = dict(self._out)
        if len(out) < len(self.outputs):  # dynamic outputs: through the host
            # copy_outputs_to_cpu is a cudaMemcpy on the legacy default stream, which does
            # not wait for the (non-blocking) session stream: wait for it here.
            self._stream.synchronize()
            values = self._io.copy_outputs_to_cpu()
            for s, v in zip(self.outputs, values, strict=True):
                if s.name not in out:
                    out[s.name] = torch.from_numpy(v).to(self.device)
        return {n: out[n] for n in self.output_names}
