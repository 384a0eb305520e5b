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


class OnlineWindows:
    """Streaming motion (reference §1.5): feed feature chunks, get emitted frames back.

    The feature buffer starts with ``priming`` ([O, C] features of silence), which
    are never emitted; their condition indices are negative. The first window
    only primes the state; later ones emit the crossfaded region.
    """

    def __init__(
        self,
        predict: Predictor,
        priming: torch.Tensor,
        kp_policy: KpCondPolicy,
        seq: int = SEQ_FRAMES,
        overlap: int | None = None,
        smooth_kernel: int = SMOOTH_KERNEL,
    ) -> None:
        overlap = priming.shape[0] if overlap is None else overlap
        self.predict = predict
        self.fuser = WindowFuser(kp_policy, seq, overlap, smooth_kernel, online=True)
        self.seq, self.valid = seq, seq - overlap
        self.feats = priming.clone()
        self.pending: list[torch.Tensor] = []
        self.pending_len = 0
        self.cond_idx_start = -priming.shape[0]
        self.valid_start: int | None = None
        self.local_idx = 0
        self.global_idx = 0
        self.d0: torch.Tensor | None = None  # frame 0 of the first window (the stitch reference)
        self.windows_run = 0
        self.ended = False

    def push(self, features: torch.Tensor) -> torch.Tensor:
        """Add [k, C] features; returns the motion frames emitted now ([m, 265], m may be 0)."""
        if self.ended:
            raise RuntimeError("stream already finished")
        self.pending.append(features)
        self.pending_len += features.shape[0]
        if self.pending_len < self.valid:
            return self._empty(features)
        return self._drain(is_end=False)

    def finish(self) -> torch.Tensor:
        """End of stream: run the padded final window(s); returns the last emitted frames."""
        self.ended = True
        return self._drain(is_end=True)

    def _empty(self, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros((0, self.fuser.kp_cond.shape[0]))

    def _drain(self, is_end: bool) -> torch.Tensor:
        if self.pending:
            self.feats = torch.cat([self.feats, *self.pending], dim=0)
            self.pending, self.pending_len = [], 0
        out: list[torch.Tensor] = []
        while True:
            win = self.feats[self.local_idx : self.local_idx + self.seq]
            real_valid = self.valid
            if win.shape[0] == 0:
                break
            if win.shape[0] < self.seq:
                if not is_end:
                    break
                real_valid = win.shape[0]
                win = pad_window(win, 0, self.seq)
            pred = self.predict(self.fuser.kp_cond, win, self.global_idx + self.cond_idx_start)
            res = self.fuser.add(pred)
            self.windows_run += 1
            if self.valid_start is None:
                self.valid_start = res.shape[0] - self.fuser.fuse_length
                self.d0 = res[0].clone()
            else:
                out.append(res[self.valid_start : self.valid_start + real_valid])
                self.valid_start += real_valid
            self.local_idx += real_valid
            self.global_idx += real_valid
            n = res.shape[0]
            if n > 2 * self.seq:
                cut = n - 2 * self.seq
                self.fuser.trim_front(cut)
                self.valid_start -= cut
            if self.local_idx >= self.feats.shape[0]:
                break
        if self.feats.shape[0] > 2 * self.seq:
            cut = self.feats.shape[0] - 2 * self.seq
            self.feats = self.feats[cut:]
            self.local_idx -= cut
        if not out:
            return self._empty(self.feats)
        return torch.cat(out, dim=0)
