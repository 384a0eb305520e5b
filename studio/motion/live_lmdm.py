"""Live LMDM motion: HuBERT features, the condition and LMDM windows, a chunk of audio at a time.

The second composition of the clip's stages (:meth:`HubertFeatures.offline`,
:func:`~studio.motion.condition.assemble`, :func:`~studio.motion.generator.generate_motion`):
:class:`~studio.audio.features.HubertStream` computes each HuBERT chunk as soon as its samples
(right context included) are in, the condition is assembled per new feature frame, and
:func:`~studio.motion.generator.stream_motion` runs LMDM in online windows that emit from the
first one (their priming rows are silence, their first kp_cond the avatar's source motion), with
the clip's noise draws, crossfade, kp_cond policy and box smoothing.

A :class:`LivePlan` trades lookahead for smoothness: V new frames per LMDM window (overlap
O = 80 - V, crossfade min(O, V)), the HuBERT chunk's valid frames b (context kept), and the
offline whole-clip smoothing pass (one frame more). Its lookahead, in frames of audio after a
frame's own, is computed from the same bookkeeping the streams run. With the offline chunk
geometry, overlap 10 and the final pass, the stream's frames are the clip's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from studio.audio.features import ChunkGeometry, HubertFeatures
from studio.layout import HUBERT_CHUNK, MOTION_DIM, SEQ_FRAMES, SMOOTH_KERNEL
from studio.models.lmdm import LMDM
from studio.motion.condition import ConditionConfig, ConditionSource, assemble
from studio.motion.generator import stream_motion
from studio.motion.windows import online_frames_needed, online_priming

__all__ = ["LIVE_PLANS", "LiveMotion", "LivePlan", "live_plan"]


@dataclass(frozen=True)
class LivePlan:
    """How live motion is cut: HuBERT chunks, LMDM window advance, the final smoothing pass."""

    hubert: ChunkGeometry  # (left, valid b, right) context of a HuBERT chunk, video frames
    valid: int  # V: new motion frames per LMDM window
    final_smooth: bool = True  # the offline whole-clip box pass (a frame waits for the next)
    smooth_kernel: int = SMOOTH_KERNEL

    def __post_init__(self) -> None:
        if not 0 < self.valid < SEQ_FRAMES:
            raise ValueError(f"valid frames per window must be 1..{SEQ_FRAMES - 1}")

    @property
    def overlap(self) -> int:
        """O = 80 - V."""
        return SEQ_FRAMES - self.valid

    @property
    def priming(self) -> int:
        """Silent rows before frame 0 that let the first window emit V frames."""
        return online_priming(SEQ_FRAMES, self.overlap, self.smooth_after)

    @property
    def smooth_after(self) -> int:
        """Frames the final pass reads after a frame (0 without it)."""
        return self.smooth_kernel // 2 if self.final_smooth and self.smooth_kernel > 1 else 0

    def with_overlap(self, overlap: int) -> LivePlan:
        """The same plan with windows of ``overlap`` (V = 80 - overlap)."""
        return replace(self, valid=SEQ_FRAMES - int(overlap))

    def audio_frames_for(self, frame: int) -> int:
        """Frames of audio that must have been pushed before motion frame ``frame`` comes out."""
        cond = online_frames_needed(
            frame, SEQ_FRAMES, self.overlap, self.priming, self.smooth_after
        )
        return self.hubert.audio_frames_for(cond - 1)

    @property
    def lookahead_frames(self) -> int:
        """Frames of audio after a frame's own that it waits for, at worst (streaming)."""
        span = 2 * SEQ_FRAMES + 2 * math.lcm(self.valid, self.hubert.valid)
        return max(self.audio_frames_for(j) - 1 - j for j in range(span))

    @property
    def windows_per_second(self) -> float:
        """LMDM windows per second of audio (25 / V)."""
        return 25.0 / self.valid

    @property
    def hubert_calls_per_second(self) -> float:
        """HuBERT chunks per second of audio (25 / b)."""
        return 25.0 / self.hubert.valid


_LEFT, _, _RIGHT = HUBERT_CHUNK
LIVE_PLANS: dict[str, LivePlan] = {
    # one frame per window, one feature per HuBERT chunk, no final pass: 3 frames
    "low": LivePlan(ChunkGeometry(_LEFT, 1, _RIGHT), valid=1, final_smooth=False),
    # the same windows: the pose smoothing after them (PostStream) spends the rest
    "balanced": LivePlan(ChunkGeometry(_LEFT, 1, _RIGHT), valid=1, final_smooth=False),
    # the clip's HuBERT chunks (features equal the render's), 2-frame crossfades: 10 frames
    "smooth": LivePlan(ChunkGeometry.of(HUBERT_CHUNK), valid=2),
}


def live_plan(latency: str, overlap: int | None = None) -> LivePlan:
    """The plan of a latency setting (:data:`LIVE_PLANS`), with windows of ``overlap`` if given."""
    if latency not in LIVE_PLANS:
        raise ValueError(f"latency must be one of {', '.join(LIVE_PLANS)}; got {latency!r}")
    plan = LIVE_PLANS[latency]
    return plan if overlap is None else plan.with_overlap(overlap)


class LiveMotion:
    """Motion rows for live audio: ``push(samples, phon)`` -> the [k, 265] float32 rows that
    became final (frames in order from 0, none twice), ``finish()`` -> the rest; exactly
    ``ceil(n * 25 / 16000)`` rows in all. ``phon`` is not read: the samples drive HuBERT.

    ``hubert`` must chunk as ``plan.hubert``; ``silence`` are ``plan.priming`` HuBERT
    features of silence (the priming rows). Silence keeps frames coming: the model animates
    it. Memory is bounded (HuBERT keeps one chunk of samples, the windows about 2 x 80 rows).
    """

    def __init__(
        self,
        hubert: HubertFeatures,
        silence: np.ndarray,
        lmdm: LMDM,
        kp_source: torch.Tensor,
        source: ConditionSource | None,
        config: ConditionConfig,
        steps: int,
        seed: int,
        plan: LivePlan,
        fast: bool | None = None,
        precision: str = "fp32",
    ) -> None:
        if hubert.geometry != plan.hubert:
            raise ValueError(f"HuBERT chunks {hubert.geometry}, the plan needs {plan.hubert}")
        self.plan = plan
        self.lookahead_frames = plan.lookahead_frames
        self.features = hubert.stream()
        self.source, self.config = source, config
        self.device = lmdm.device
        priming = assemble(silence[: plan.priming], -plan.priming, source, config)
        self.windows = stream_motion(
            lmdm,
            torch.from_numpy(priming),
            kp_source,
            steps,
            seed,
            overlap=plan.overlap,
            smooth_kernel=plan.smooth_kernel,
            final_smooth=plan.final_smooth,
            fast=fast,
            precision=precision,
        )
        self.frames_in = 0  # condition frames assembled so far
        self.timings_s = {"hubert": 0.0, "lmdm": 0.0}  # where the time went, summed

    def push(self, samples: np.ndarray, phon: object = None) -> np.ndarray:
        """The next 16 kHz mono float32 samples -> the motion rows that became final."""
        t0 = time.perf_counter()
        feats = self.features.push(samples)
        self.timings_s["hubert"] += time.perf_counter() - t0
        return self._motion(feats, end=False)

    def finish(self) -> np.ndarray:
        """The audio has ended: every remaining row (the last HuBERT chunk zero-filled)."""
        t0 = time.perf_counter()
        feats = self.features.finish()
        self.timings_s["hubert"] += time.perf_counter() - t0
        return self._motion(feats, end=True)

    def _motion(self, feats: np.ndarray, end: bool) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return self._windows(feats, end)
        finally:
            self.timings_s["lmdm"] += time.perf_counter() - t0

    def _windows(self, feats: np.ndarray, end: bool) -> np.ndarray:
        rows = []
        if len(feats):
            cond = assemble(feats, self.frames_in, self.source, self.config)
            self.frames_in += len(feats)
            rows.append(self.windows.push(torch.from_numpy(cond).to(self.device)))
        if end:
            rows.append(self.windows.finish())
        if not rows:
            return np.zeros((0, MOTION_DIM), np.float32)
        out = torch.cat(rows) if len(rows) > 1 else rows[0]
        return out.cpu().numpy().astype(np.float32, copy=False)
