"""HuBERT audio features at the video rate, chunked exactly as Ditto does.

The released ``hubert_streaming_fix_kv.onnx`` maps ``input_values`` [1, N] float32 (16 kHz)
to ``encoding_out`` [T_h, 1024] (no batch axis) at 50 Hz. Audio goes through it in chunks
of ``split_len = (a + b + c) * 640 + 80`` samples (6480 for the default chunk (3, 5, 2) of
left-context, valid and right-context video frames). Of the 2 (a + b + c) = 20 HuBERT
frames of a chunk, frames ``[-(b + c) * 2 : -c * 2]`` are kept and averaged in pairs,
giving ``b`` features per chunk.

* Offline: left pad ``a * 640 + 80`` zeros, right pad ``split_len``; chunks start every
  ``b`` frames, at sample ``640 * i``. Feature j covers samples ~[640 j - 80, 640 j + 640).
  Ditto computes the start as ``int(i * 0.04 * 16000)``, which for some i >= 1615 (64.6 s)
  lands one sample early through float error; the integer start here fixes that on
  purpose. The frame count ``ceil(len * 25 / 16000)`` is also exact integer arithmetic
  (Ditto's float form gives one frame more for some lengths, e.g. 4480 samples).
* Online: left pad ``a * 640`` zeros, windows every ``b * 640`` samples, zero-filled at the
  end, so features are 80 samples later than offline and there are
  ``b * ceil((len + a * 640) / (b * 640))`` of them.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.audio.hubert_signature import (
    INPUT_NAME,
    OUTPUT_NAME,
    check_encoding,
    check_signature,
)
from studio.errors import InputError
from studio.layout import (
    FPS,
    HUBERT_CHUNK,
    HUBERT_CHUNK_EXTRA,
    HUBERT_DIM,
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
)
from studio.runtime.onnx_sessions import open_session, providers_for

_NO_ONNXRUNTIME = (
    "HuBERT features need onnxruntime; install it with pip install 'talkinghead-studio[onnx]'."
)
_UNREADABLE = (
    "HuBERT model '{path}' could not be loaded by ONNX Runtime ({reason}); "
    "it is not a readable ONNX file (re-download hubert_streaming_fix_kv.onnx)."
)


def num_feature_frames(num_samples: int) -> int:
    """Video frames covering ``num_samples`` 16 kHz samples: ceil(n * 25 / 16000), exactly."""
    return -(-int(num_samples) * FPS // SAMPLE_RATE)


@dataclass(frozen=True)
class ChunkGeometry:
    """HuBERT chunking for ``(left, valid, right)`` context in video frames."""

    left: int
    valid: int
    right: int

    @classmethod
    def of(cls, chunksize: Sequence[int] | ChunkGeometry) -> ChunkGeometry:
        """Validated geometry from a 3-sequence (a, b, c): a >= 0, b > 0, c > 0."""
        if isinstance(chunksize, ChunkGeometry):
            return chunksize
        try:
            a, b, c = (int(v) for v in chunksize)
            ok = all(int(v) == v and not isinstance(v, bool) for v in chunksize)
        except (TypeError, ValueError):
            ok = False
        if not ok or a < 0 or b <= 0 or c <= 0:
            raise ValueError(
                f"chunksize must be three integers (left >= 0, valid > 0, right > 0), got "
                f"{chunksize!r}; right must be > 0 or the kept HuBERT slice is empty"
            )
        return cls(a, b, c)

    @property
    def split_len(self) -> int:
        """Samples per HuBERT call: (a + b + c) * 640 + 80 (6480)."""
        return (self.left + self.valid + self.right) * SAMPLES_PER_FRAME + HUBERT_CHUNK_EXTRA

    @property
    def hop(self) -> int:
        """Samples between chunk starts: b * 640 (3200)."""
        return self.valid * SAMPLES_PER_FRAME

    @property
    def keep(self) -> slice:
        """HuBERT frames kept per chunk: [-(b + c) * 2 : -c * 2] (frames -14..-5)."""
        return slice(-(self.valid + self.right) * 2, -self.right * 2)

    @property
    def min_hubert_frames(self) -> int:
        """The fewest HuBERT frames a chunk must yield for ``keep`` to be whole."""
        return (self.valid + self.right) * 2

    def audio_frames_for(self, feature: int) -> int:
        """Video frames of audio a chunk needs before feature ``feature`` (offline alignment)
        exists: its chunk's valid frames and right context, (j // b) * b + b + c."""
        return (int(feature) // self.valid) * self.valid + self.valid + self.right

    @property
    def offline_left_pad(self) -> int:
        """split_len - (b + c) * 640 = a * 640 + 80 (2000)."""
        return self.split_len - (self.valid + self.right) * SAMPLES_PER_FRAME

    @property
    def online_left_pad(self) -> int:
        """a * 640 (1920)."""
        return self.left * SAMPLES_PER_FRAME


def offline_chunk_starts(num_frames: int, chunksize: Sequence[int] = HUBERT_CHUNK) -> range:
    """Start samples (in the padded signal) of the offline chunks: 640 i, i = 0, b, 2b, ..."""
    g = ChunkGeometry.of(chunksize)
    return range(0, SAMPLES_PER_FRAME * max(int(num_frames), 0), g.hop)


def online_feature_count(num_samples: int, chunksize: Sequence[int] = HUBERT_CHUNK) -> int:
    """Features the online path yields: b * ceil((len + a * 640) / (b * 640))."""
    g = ChunkGeometry.of(chunksize)
    return g.valid * -(-(int(num_samples) + g.online_left_pad) // g.hop)


def online_windows(
    samples16k: np.ndarray, chunksize: Sequence[int] = HUBERT_CHUNK
) -> Iterator[np.ndarray]:
    """The online path's ``split_len``-sample windows (read-only views of one padded buffer)."""
    x = _check_samples(samples16k)
    g = ChunkGeometry.of(chunksize)
    n = g.online_left_pad + len(x)
    padded = np.zeros(n + g.split_len, dtype=np.float32)
    padded[g.online_left_pad : n] = x
    padded.flags.writeable = False
    for start in range(0, n, g.hop):
        yield padded[start : start + g.split_len]


class HubertFeatures:
    """HuBERT features from ``hubert_streaming_fix_kv.onnx``.

    With ``device`` None the model runs in ONNX Runtime: ``providers=None`` picks CUDA when
    ONNX Runtime offers it, else CPU; one session per model file and provider list is
    shared by every instance. With a ``device`` (the Ditto engine passes its CUDA device)
    the same file runs in torch there (:mod:`studio.audio.hubert_torch`): the offline path
    as one batched call per clip, fp32 unless ``precision`` is ``tf32``. A graph the torch
    executor cannot run falls back to ONNX Runtime with a warning; ``fallback`` says why.
    """

    def __init__(
        self,
        onnx_path: str | os.PathLike,
        providers: Sequence[str] | None = None,
        chunksize: Sequence[int] = HUBERT_CHUNK,
        device: str | Any | None = None,
        precision: str | None = None,
    ) -> None:
        self.geometry = ChunkGeometry.of(chunksize)
        self.path = Path(onnx_path).expanduser()
        self.fallback: str | None = None
        self._torch = None if device is None else self._torch_runner(device, precision)
        if self._torch is None:
            self._session = _session_for(self.path, None if providers is None else tuple(providers))
            check_signature(
                self._session.get_inputs(),
                self._session.get_outputs(),
                self.path,
                self.geometry.split_len,
            )
        else:
            g = self.geometry
            check_encoding(self._torch.encoding_shape, self.path, g.split_len, g.min_hubert_frames)
        self._silence: dict[int, np.ndarray] = {}

    def _torch_runner(self, device: Any, precision: str | None) -> Any:
        """The torch runner, or None (``fallback`` set, a warning) when it cannot run."""
        _check_path(self.path)
        from studio.audio.hubert_torch import TorchHubert
        from studio.runtime.onnx_torch import UnsupportedOnnxOp

        g = self.geometry
        try:
            return TorchHubert(self.path, g.split_len, g.hop, g.keep, device, precision)
        except UnsupportedOnnxOp as e:
            reason = str(e)
        except ImportError as e:
            reason = f"the torch path needs the onnx package ({e})"
        self.fallback = reason
        warnings.warn(
            f"{reason}; HuBERT runs in ONNX Runtime instead", RuntimeWarning, stacklevel=3
        )
        return None

    @property
    def providers(self) -> list[str]:
        """What runs HuBERT: ONNX Runtime's providers in priority order, or ``torch <device>``."""
        if self._torch is not None:
            return self._torch.providers
        return list(self._session.get_providers())

    def chunk_features(self, chunk: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """One ``split_len``-sample chunk -> [b, 1024] features (written into ``out`` if given)."""
        g = self.geometry
        x = _check_samples(chunk)
        if len(x) != g.split_len:
            raise ValueError(f"a HuBERT chunk must have {g.split_len} samples, got {len(x)}")
        if out is None:
            out = np.empty((g.valid, HUBERT_DIM), dtype=np.float32)
        if self._torch is not None:
            out[...] = self._torch.features(x, 1)
            return out
        enc = self._session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(x)[None, :]})[0]
        check_encoding(enc.shape, self.path, g.split_len, g.min_hubert_frames)
        kept = enc[g.keep]
        np.add(kept[0::2], kept[1::2], out=out)
        out *= 0.5
        return out

    def offline(self, samples16k: np.ndarray) -> np.ndarray:
        """All features at once: [ceil(len * 25 / 16000), 1024] float32 (Ditto's offline path)."""
        x = _check_samples(samples16k)
        g = self.geometry
        num_f = num_feature_frames(len(x))
        starts = offline_chunk_starts(num_f, g)
        padded = np.zeros(g.offline_left_pad + len(x) + g.split_len, dtype=np.float32)
        padded[g.offline_left_pad : g.offline_left_pad + len(x)] = x
        return self.chunks(padded, len(starts))[:num_f]

    def chunks(self, signal: np.ndarray, count: int) -> np.ndarray:
        """[count * b, 1024] features of the first ``count`` chunks of ``signal`` (chunk k at
        sample k * hop): one batched call on a torch device, a call a chunk in ONNX Runtime."""
        g = self.geometry
        if count <= 0:
            return np.empty((0, HUBERT_DIM), dtype=np.float32)
        if self._torch is not None:
            return self._torch.features(signal, count)
        out = np.empty((count * g.valid, HUBERT_DIM), dtype=np.float32)
        for k in range(count):
            start = k * g.hop
            self.chunk_features(
                signal[start : start + g.split_len], out[k * g.valid : (k + 1) * g.valid]
            )
        return out

    def stream(self) -> HubertStream:
        """Features of live audio, chunk by chunk, equal to :meth:`offline`'s."""
        return HubertStream(self)

    def online_chunks(self, samples16k: np.ndarray) -> Iterator[np.ndarray]:
        """Yield [b, 1024] blocks as Ditto's online path would (``online_feature_count`` rows)."""
        for window in online_windows(samples16k, self.geometry):
            yield self.chunk_features(window)

    def silence(self, n_frames: int) -> np.ndarray:
        """[n, 1024] features of n * 640 zero samples (offline path): the online priming."""
        n = int(n_frames)
        if n < 0:
            raise ValueError(f"n_frames must be >= 0, got {n_frames}")
        if n not in self._silence:
            feats = self.offline(np.zeros(n * SAMPLES_PER_FRAME, dtype=np.float32))
            assert len(feats) == n
            self._silence[n] = feats
        return self._silence[n].copy()


class HubertStream:
    """:meth:`HubertFeatures.offline`, incrementally: :meth:`push` samples and get the features
    whose chunk (right context included) has fully arrived; :meth:`finish` zero-fills the end
    as the offline path pads it, so the concatenated features equal ``offline()``'s.

    Only the samples of chunks not yet computed are kept (at most ``split_len`` plus one
    push). Feature j exists once ``geometry.audio_frames_for(j)`` frames of audio have
    arrived: ``lookahead_frames`` = b - 1 + c frames after its own at worst.
    """

    def __init__(self, hubert: HubertFeatures) -> None:
        self.hubert = hubert
        self.geometry = g = hubert.geometry
        self._buf = np.zeros(g.offline_left_pad, dtype=np.float32)  # from the next chunk on
        self.received = 0  # samples pushed
        self.emitted = 0  # features returned
        self.ended = False

    @property
    def lookahead_frames(self) -> int:
        """Frames of audio after a feature's own that it waits for, at worst."""
        return self.geometry.valid - 1 + self.geometry.right

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Take the next 16 kHz samples; the [k, 1024] features that became available."""
        if self.ended:
            raise RuntimeError("push() after finish()")
        x = _check_samples(samples)
        self.received += len(x)
        self._buf = np.concatenate([self._buf, x])
        g = self.geometry
        return self._take(max(0, (len(self._buf) - g.split_len) // g.hop + 1))

    def finish(self) -> np.ndarray:
        """The remaining features up to ``num_feature_frames(received)``, zero-filled."""
        if self.ended:
            raise RuntimeError("finish() called twice")
        self.ended = True
        g = self.geometry
        left = num_feature_frames(self.received) - self.emitted
        count = -(-left // g.valid) if left > 0 else 0
        need = (count - 1) * g.hop + g.split_len
        if count and len(self._buf) < need:
            self._buf = np.concatenate([self._buf, np.zeros(need - len(self._buf), np.float32)])
        return self._take(count, max(left, 0))

    def _take(self, count: int, limit: int | None = None) -> np.ndarray:
        """Features of the next ``count`` chunks (the first ``limit``); their samples dropped."""
        feats = self.hubert.chunks(self._buf, count)[:limit]
        if count:
            self._buf = self._buf[count * self.geometry.hop :].copy()
        self.emitted += len(feats)
        return feats


# --- internals ---------------------------------------------------------------


def _check_samples(x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.ndim != 1 or x.dtype != np.float32:
        desc = (
            f"{x.dtype} array shaped {list(x.shape)}"
            if isinstance(x, np.ndarray)
            else type(x).__name__
        )
        raise ValueError(f"audio must be a 1-D float32 array of 16 kHz samples, got {desc}")
    return x


def default_providers() -> tuple[str, ...]:
    """CUDA then CPU when ONNX Runtime offers CUDA, else CPU only."""
    return providers_for("cuda", _NO_ONNXRUNTIME)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise InputError(f"HuBERT model '{path}' does not exist; check the checkpoint folder.")
    if path.is_dir():
        raise InputError(f"HuBERT model path '{path}' is a directory; point it at the .onnx file.")


def _session_for(path: Path, providers: tuple[str, ...] | None) -> Any:
    _check_path(path)
    chosen = providers if providers is not None else default_providers()
    return open_session(path, chosen, _NO_ONNXRUNTIME, _UNREADABLE)
