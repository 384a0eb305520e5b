"""HuBERT on a torch device: the released ONNX file run by the static-shape torch executor.

Why: ONNX Runtime may have only its CPU provider (no onnxruntime-gpu), where HuBERT-large
costs ~40 ms a chunk; on the GPU a whole clip takes milliseconds. The graph is planned once
for one chunk ([1, split_len]); a clip's chunks are independent, so they run as one vmapped
call (at most :data:`MAX_BATCH` at a time), the kept frames are averaged on the device and
the features are read back once. Math is fp32, with TF32 only when the hubert precision
(:data:`studio.runtime.base.DEFAULT_PRECISION` by default) is ``tf32``.

On CUDA a chunk count seen a second time is captured into a CUDA graph and replayed from
then on (the eager call costs ~20 µs of host time per op, about as long as the GPU work);
the first call of a count stays eager, so a clip analysed once pays no capture. At most
:data:`MAX_GRAPHS` graphs are kept.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from studio.audio.hubert_signature import INPUT_NAME, OUTPUT_NAME, check_signature
from studio.errors import InputError, OptionError
from studio.paths import compiled_cache_dir
from studio.runtime.base import capture_cuda_graph, math_mode
from studio.runtime.onnx_torch import OnnxTorchGraph, onnx_ports, read_onnx
from studio.runtime.precision import DEFAULT_PRECISION

MAX_BATCH = 64  # chunks per vmapped call: bounds activation memory (~15 MB a chunk)
MAX_GRAPHS = 2  # captured chunk counts kept (each holds its activation pool)
PRECISIONS = ("fp32", "tf32")
PLAN_FOLDER = "onnx_plans"  # under the compiled cache: the planned graph's shapes, per file


class TorchHubert:
    """Averaged kept HuBERT frames of ``split_len``-sample chunks (chunk k at ``k * hop``),
    computed with torch on ``device``."""

    def __init__(
        self,
        path: Path,
        split_len: int,
        hop: int,
        keep: slice,
        device: str | torch.device,
        precision: str | None = None,
    ) -> None:
        self.precision = DEFAULT_PRECISION["hubert"] if precision is None else precision
        if self.precision not in PRECISIONS:
            raise OptionError(
                "hubert precision", f"{self.precision!r}: the torch path runs fp32 or tf32"
            )
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.split_len, self.hop, self.keep = int(split_len), int(hop), keep
        st = path.stat()
        self.graph = _cached_graph(
            str(path.resolve()), st.st_mtime_ns, st.st_size, self.split_len, str(self.device)
        )
        self.encoding_shape: tuple[int, ...] = self.graph.output_shapes[0]
        self._graphs: OrderedDict[int, tuple[Tensor, torch.cuda.CUDAGraph, Tensor]] = OrderedDict()
        self._seen: set[int] = set()
        self.capture_error: str | None = None

    @property
    def providers(self) -> list[str]:
        """What runs HuBERT, in the form the reports print: ``torch cuda:0``, ``torch cpu``."""
        return [f"torch {self.device}"]

    def features(self, signal: np.ndarray, count: int) -> np.ndarray:
        """[count * kept / 2, 1024] features of the first ``count`` chunks of ``signal``, read
        back to the host once."""
        width = self.encoding_shape[1]
        if count == 0:
            return np.empty((0, width), dtype=np.float32)
        x = torch.from_numpy(np.require(signal, np.float32, ["C", "W"])).to(self.device)
        chunks = x.unfold(0, self.split_len, self.hop)[:count]
        return self._run(chunks).cpu().numpy()

    @contextlib.contextmanager
    def _mode(self) -> Iterator[None]:
        with torch.no_grad(), math_mode(self.precision, self.device):
            yield

    def _compute(self, chunks: Tensor) -> Tensor:
        """[K, split_len] -> [K * kept / 2, 1024]: encode, keep, average pairs."""
        enc = self.graph.batched(chunks[:, None, :], chunk_size=MAX_BATCH)[0][:, self.keep]
        return ((enc[:, 0::2] + enc[:, 1::2]) * 0.5).reshape(-1, enc.shape[-1])

    def _run(self, chunks: Tensor) -> Tensor:
        """Eager, or the CUDA graph of this chunk count (its output is overwritten by the next
        replay: the caller reads it back at once)."""
        count = chunks.shape[0]
        entry = self._graphs.get(count)
        if entry is None and self._wants_graph(count):
            entry = self._capture(count)
        if entry is None:
            with self._mode():
                return self._compute(chunks)
        self._graphs.move_to_end(count)
        static_in, graph, out = entry
        static_in.copy_(chunks)
        graph.replay()
        return out

    def _wants_graph(self, count: int) -> bool:
        if self.device.type != "cuda" or self.capture_error is not None:
            return False
        if count in self._seen:
            return True
        if len(self._seen) > 256:
            self._seen.clear()
        self._seen.add(count)
        return False

    def _capture(self, count: int) -> tuple[Tensor, torch.cuda.CUDAGraph, Tensor] | None:
        static_in = torch.zeros(count, self.split_len, device=self.device)
        try:
            graph, out = capture_cuda_graph(
                lambda: self._compute(static_in), warmup=1, context=self._mode
            )
        except RuntimeError as e:  # capture refused (e.g. an op that syncs): stay eager
            self.capture_error = " ".join(str(e).split())[:160]
            return None
        self._graphs[count] = (static_in, graph, out)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return self._graphs[count]


@functools.lru_cache(maxsize=2)
def _cached_graph(
    path: str, mtime_ns: int, size: int, split_len: int, device: str
) -> OnnxTorchGraph:
    """One planned graph per file, chunk length and device (the weights live on the device);
    its shapes kept for the next process (:class:`~studio.runtime.onnx_torch.PlanShapes`)."""
    p = Path(path)
    try:
        model = read_onnx(p)
    except InputError as e:
        raise InputError(f"HuBERT model {e}: re-download hubert_streaming_fix_kv.onnx.") from None
    check_signature(*onnx_ports(model), p, split_len)
    shapes = {INPUT_NAME: (1, split_len)}
    plans = compiled_cache_dir() / PLAN_FOLDER
    # the caller's stat, taken before the read: a file replaced meanwhile is planned again
    version = (size, mtime_ns)
    return OnnxTorchGraph(model, shapes, device, str(p), (OUTPUT_NAME,), plans, version)
