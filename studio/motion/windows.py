"""LMDM windowing: 80-frame windows, the linear crossfade, kp_cond and box smoothing.

Follows the reference (ditto-reference.md §1.4-1.8) frame for frame. Sequences are
torch tensors [L, 265] on any device; all bookkeeping is on host integers, so no
value is read back from the device.

A *predictor* is ``predict(kp_cond [265], window [S, C], cond_start) -> [S, 265]``
where ``cond_start`` is the condition-frame index of the window's first row
(negative for the online mode's silent priming frames).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from studio.layout import OVERLAP_OFFLINE, SEQ_FRAMES, SMOOTH_KERNEL, SMOOTHED_DIMS

Predictor = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def box_smooth(
    seq: torch.Tensor, start: int, end: int, kernel: int = SMOOTH_KERNEL
) -> torch.Tensor:
    """Centred box filter over frames [start, end) of dims 0..201, in place.

    Reads from an unmodified copy; at the sequence ends the mean covers only the
    neighbours that exist. ``kernel <= 1`` disables it. Returns ``seq``.
    """
    n = seq.shape[0]
    start, end = max(0, start), min(n, end)
    if kernel <= 1 or start >= end:
        return seq
    half = kernel // 2
    src = seq[:, SMOOTHED_DIMS].clone()
    acc = torch.zeros_like(src[start:end])
    count = torch.zeros((end - start, 1), dtype=seq.dtype, device=seq.device)
    for off in range(-half, half + 1):
        lo, hi = max(start, -off), min(end, n - off)  # frames i with 0 <= i+off < n
        if lo >= hi:
            continue
        acc[lo - start : hi - start] += src[lo + off : hi + off]
        count[lo - start : hi - start] += 1
    seq[start:end, SMOOTHED_DIMS] = acc / count
    return seq


def crossfade(
    res: torch.Tensor, pred: torch.Tensor, overlap: int, fuse_length: int
) -> torch.Tensor:
    """Blend res[L-F:L] with pred[O-F:O] by alpha_k = k/F, then append pred[O:] (the "fuse")."""
    seq = pred.shape[0]
    valid = seq - overlap
    alpha = torch.arange(fuse_length, dtype=res.dtype, device=res.device)[:, None] / fuse_length
    old = res[res.shape[0] - fuse_length :]
    new = pred[seq - valid - fuse_length : seq - valid]
    blended = old * (1 - alpha) + new * alpha
    return torch.cat([res[: res.shape[0] - fuse_length], blended, pred[seq - valid :]], dim=0)


def pad_window(cond: torch.Tensor, start: int, seq: int = SEQ_FRAMES) -> torch.Tensor:
    """cond[start:start+seq], padded by repeating its last frame when short."""
    win = cond[start : start + seq]
    if win.shape[0] < seq:
        win = torch.cat([win, win[-1:].expand(seq - win.shape[0], -1)], dim=0)
    return win


def offline_starts(
    num_frames: int, seq: int = SEQ_FRAMES, overlap: int = OVERLAP_OFFLINE
) -> list[int]:
    """Window start frames 0, V, 2V, ... while < num_frames (V = seq - overlap)."""
    valid = seq - overlap
    if valid <= 0:
        raise ValueError(f"overlap {overlap} must be smaller than the window {seq}")
    return list(range(0, num_frames, valid))


@dataclass
class KpCondPolicy:
    """The reference's kp_cond update: the frame before the next window, optionally reset."""

    source: torch.Tensor  # [265] s_kp_cond
    fix_every: int = 0  # fix_kp_cond: reset period in windows (0 = never)
    keep_dims: tuple[int, int] | None = None  # fix_kp_cond_dim: dims kept from the prediction

    def next(self, res: torch.Tensor, idx: int, clip_idx: int) -> torch.Tensor:
        """kp_cond after window number ``clip_idx`` (counted after the increment)."""
        prev = res[idx - 1]
        if self.fix_every > 0 and clip_idx % self.fix_every == 0:
            cond = self.source.clone()
            if self.keep_dims is not None:
                ds, de = self.keep_dims
                cond[ds:de] = prev[ds:de]
            return cond
        return prev.clone()


class WindowFuser:
    """Accumulates window predictions into one sequence (the reference's Audio2Motion)."""

    def __init__(
        self,
        kp_policy: KpCondPolicy,
        seq: int = SEQ_FRAMES,
        overlap: int = OVERLAP_OFFLINE,
        smooth_kernel: int = SMOOTH_KERNEL,
        online: bool = False,
    ) -> None:
        self.seq, self.overlap = seq, overlap
        self.valid = seq - overlap
        if self.valid <= 0:
            raise ValueError(f"overlap {overlap} must be smaller than the window {seq}")
        self.fuse_length = min(overlap, self.valid) if online else overlap
        self.smooth_kernel = smooth_kernel
        self.kp_policy = kp_policy
        self.kp_cond = kp_policy.source.clone()
        self.res: torch.Tensor | None = None
        self.clip_idx = 0

    def add(self, pred: torch.Tensor) -> torch.Tensor:
        """Fuse one [S, 265] window prediction; returns the whole sequence so far."""
        if self.res is None:
            self.res = box_smooth(pred.clone(), 0, pred.shape[0], self.smooth_kernel)
        else:
            res = crossfade(self.res, pred, self.overlap, self.fuse_length)
            n = res.shape[0]
            s = n - self.valid - self.fuse_length
            self.res = box_smooth(res, s, n - self.valid + 1, self.smooth_kernel)
        self.clip_idx += 1
        idx = self.res.shape[0] - self.overlap
        self.kp_cond = self.kp_policy.next(self.res, idx, self.clip_idx)
        return self.res

    def trim_front(self, cut: int) -> None:
        """Drop the first ``cut`` frames (the online mode's memory bound)."""
        if self.res is not None and cut > 0:
            self.res = self.res[cut:]


def run_offline(
    predict: Predictor,
    cond: torch.Tensor,
    kp_policy: KpCondPolicy,
    seq: int = SEQ_FRAMES,
    overlap: int = OVERLAP_OFFLINE,
    smooth_kernel: int = SMOOTH_KERNEL,
    on_window: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Offline motion for all frames of ``cond`` [N, C] -> [N, 265] (reference §1.4).

    ``on_window(done, total)`` reports progress after each window.
    """
    num_frames = cond.shape[0]
    if num_frames == 0:
        raise ValueError("no condition frames")
    fuser = WindowFuser(kp_policy, seq, overlap, smooth_kernel, online=False)
    starts = offline_starts(num_frames, seq, overlap)
    for k, start in enumerate(starts):
        fuser.add(predict(fuser.kp_cond, pad_window(cond, start, seq), start))
        if on_window is not None:
            on_window(k + 1, len(starts))
    assert fuser.res is not None
    res = fuser.res[:num_frames].clone()
    return box_smooth(res, 0, num_frames, smooth_kernel)


def online_priming(
    seq: int = SEQ_FRAMES, overlap: int = OVERLAP_OFFLINE, smooth_after: int = 0
) -> int:
    """Priming rows before frame 0 that let the first online window emit V frames, the final
    pass's ``smooth_after`` included: O - V - smooth_after (0 once V >= O, where the windows
    are the offline ones)."""
    valid = seq - overlap
    return max(0, overlap - valid - smooth_after)


def online_frames_needed(
    frame: int,
    seq: int = SEQ_FRAMES,
    overlap: int = OVERLAP_OFFLINE,
    priming: int = 0,
    smooth_after: int = 0,
) -> int:
    """Condition frames :class:`OnlineWindows` must have been given before it emits ``frame``
    (streaming, before ``finish``); ``smooth_after`` is the final pass's half kernel (0 off).

    Window k covers priming-offset rows [kV, kV + S) and leaves the rows before
    S + kV - F final (the next window crossfades the F after them).
    """
    valid = seq - overlap
    fuse = min(overlap, valid)
    last = int(frame) + smooth_after + priming  # the newest row that must be final
    k = max(0, -(-(last + fuse + 1 - seq) // valid))
    return max(int(frame) + 1, k * valid + seq - priming)


class OnlineWindows:
    """Streaming motion (reference §1.5, the first window emitting): feed condition rows, get
    the frames that became final, each once, in order; :meth:`finish` flushes the rest.

    ``priming`` ([P, C], P <= O) are rows before frame 0 (negative condition indices, never
    emitted); window k covers rows [kV, kV + S) of priming + condition, so its condition
    starts at kV - P, and runs once those rows are in. It is fused as offline (crossfade
    F = min(O, V), seam smoothing, kp_cond policy) and makes the rows before S + kV - F
    final. P = O is the reference's online mode (the first window only primes);
    :func:`online_priming` (O - V, less the final pass's lookahead) makes the first window
    emit V frames; P = 0 with O = 10 are the offline windows. At the end, windows run while
    kV < N (as :func:`offline_starts`), the last ones padded with the last row; exactly N
    frames come out. ``final_smooth`` applies the offline whole-clip box pass to the emitted
    frames (a frame then waits for the next one to be final). Rows and results are trimmed
    to about 2 S, so memory stays bounded.
    """

    def __init__(
        self,
        predict: Predictor,
        priming: torch.Tensor,
        kp_policy: KpCondPolicy,
        seq: int = SEQ_FRAMES,
        overlap: int | None = None,
        smooth_kernel: int = SMOOTH_KERNEL,
        final_smooth: bool = False,
    ) -> None:
        overlap = priming.shape[0] if overlap is None else overlap
        if priming.shape[0] > overlap:
            raise ValueError(f"{priming.shape[0]} priming rows exceed the overlap {overlap}")
        self.predict = predict
        self.fuser = WindowFuser(kp_policy, seq, overlap, smooth_kernel, online=True)
        self.seq, self.overlap, self.valid = seq, overlap, seq - overlap
        self.priming = priming.shape[0]
        self.smooth_after = smooth_kernel // 2 if final_smooth and smooth_kernel > 1 else 0
        self.feats = priming.clone()  # rows from position feats_start on (priming included)
        self.feats_start = 0
        self.received = 0  # condition frames given
        self.res_start = 0  # position of fuser.res[0]
        self.final = 0  # positions before it are final
        self.emitted = 0  # frames emitted
        self.d0: torch.Tensor | None = None  # frame 0 of the first window (the stitch reference)
        self.windows_run = 0
        self.ended = False

    @property
    def lookahead_frames(self) -> int:
        """Condition frames after a frame's own that it waits for, at worst (streaming)."""
        span = 2 * self.seq + self.valid
        return max(self.frames_needed(j) - 1 - j for j in range(span))

    def frames_needed(self, frame: int) -> int:
        """Condition frames given before ``frame`` is emitted (:func:`online_frames_needed`)."""
        return online_frames_needed(frame, self.seq, self.overlap, self.priming, self.smooth_after)

    def push(self, features: torch.Tensor) -> torch.Tensor:
        """Add [k, C] condition rows; returns the motion frames emitted now ([m, 265])."""
        if self.ended:
            raise RuntimeError("stream already finished")
        if features.shape[0]:
            self.feats = torch.cat([self.feats, features.to(self.feats)], dim=0)
            self.received += features.shape[0]
        while self._next_start() + self.seq <= self.priming + self.received:
            self._run_window(last=False)
        return self._emit()

    def finish(self) -> torch.Tensor:
        """End of stream: the remaining windows (padded) and every frame not yet emitted."""
        if self.ended:
            raise RuntimeError("stream already finished")
        self.ended = True
        while self._next_start() < self.received:
            self._run_window(last=self._next_start() + self.valid >= self.received)
        return self._emit()

    def _next_start(self) -> int:
        return self.windows_run * self.valid

    def _run_window(self, last: bool) -> None:
        start = self._next_start()
        win = pad_window(self.feats, start - self.feats_start, self.seq)
        res = self.fuser.add(self.predict(self.fuser.kp_cond, win, start - self.priming))
        if self.d0 is None:
            self.d0 = res[0].clone()
        self.windows_run += 1
        end = self.res_start + res.shape[0]
        self.final = end if last else end - self.fuser.fuse_length
        cut = self._next_start() - self.feats_start  # rows no later window reads
        if cut > 0:
            self.feats, self.feats_start = self.feats[cut:], self.feats_start + cut

    def _emit(self) -> torch.Tensor:
        """The frames that became final (after the final pass, where it is on)."""
        total = self.received if self.ended else self.final - self.priming - self.smooth_after
        lo, hi = self.emitted, min(total, self.received)
        res = self.fuser.res
        if res is None or hi <= lo:
            return self.feats.new_zeros((0, self.fuser.kp_cond.shape[0]))
        h = self.smooth_after
        a, b = max(0, lo - h), min(hi + h, self.received)  # the pass's neighbours, in the clip
        off = self.priming - self.res_start
        kernel = self.fuser.smooth_kernel if h else 1
        seg = box_smooth(res[a + off : b + off].clone(), lo - a, hi - a, kernel)
        out = seg[lo - a : hi - a]
        self.emitted = hi
        keep = min(res.shape[0] - self.seq, hi - h + off)  # the fuser needs the last S rows
        if keep > 0:
            self.fuser.trim_front(keep)
            self.res_start += keep
        return out
