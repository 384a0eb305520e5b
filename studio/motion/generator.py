"""LMDM motion for a whole clip: offline windows sampled by the device-resident DDIM loop.

The condition ``[N, C]`` goes to the device once; every window's DDIM steps, the crossfades
and the box smoothing run there, and the ``[N, 265]`` motion stays on the device until a
caller asks for it on the host. As in the reference (ditto-reference.md §9 pitfall 10) the
per-step noises are drawn once per clip and shared by every window, while x_T is drawn per
window; both come from one generator seeded by the render seed, so a render is reproducible.

On CUDA each window runs through :mod:`studio.motion.fast_lmdm`: the condition encoder and
time embeddings hoisted out of the steps, and a window's DDIM loop captured once per step
count as two CUDA graphs (its constants, then a few steps: a
:class:`~studio.motion.fast_lmdm.WindowGraph`, kept for the loaded LMDM) and replayed with the
window's condition and x_T copied into its static buffers. LMDM runs in ``precision`` there:
fp32 (the released set's choice, the default), TF32 matmuls, or a bf16/fp16 copy of its
weights (guidance and the DDIM state stay fp32). On the CPU the eager fp32 loop runs.

:func:`stream_motion` is the live composition of the same stages: one :class:`WindowSampler`
(the same draws in the same order) feeding :class:`~studio.motion.windows.OnlineWindows`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from studio.layout import MOTION_DIM, OVERLAP_OFFLINE, SEQ_FRAMES, SMOOTH_KERNEL
from studio.models.diffusion import DeviceDDIM, draw_noises
from studio.models.lmdm import LMDM
from studio.motion.fast_lmdm import WINDOW, graphed_lmdm
from studio.motion.windows import (
    KpCondPolicy,
    OnlineWindows,
    Predictor,
    offline_starts,
    pad_window,
    run_offline,
)


class WindowSampler:
    """LMDM windows sampled from one seed, the clip's way: the per-step noises are drawn once
    (shared by every window), then x_T per window, in window order, from one CPU generator
    (the same draws on every device). :meth:`sample` runs one window: the captured fast path
    on CUDA (``fast`` None), the eager DDIM loop on the CPU (``fast=True`` runs the fast path
    uncaptured there) at ``precision`` (fp32, tf32, bf16 or fp16; the eager loop is fp32)."""

    def __init__(
        self,
        lmdm: LMDM,
        steps: int,
        seed: int = 0,
        fast: bool | None = None,
        precision: str = "fp32",
    ) -> None:
        self.device = dev = lmdm.device
        sched = lmdm.schedule(int(steps))
        self.generator = torch.Generator().manual_seed(int(seed))
        _, self.noises = draw_noises(sched, WINDOW, self.generator, dev)
        use_fast = dev.type == "cuda" if fast is None else fast
        graphed = graphed_lmdm(lmdm, precision) if use_fast else None
        self._graph = None if graphed is None else graphed.window_graph(sched, WINDOW)
        self._lmdm = lmdm
        self._sampler = None if use_fast else DeviceDDIM(sched, WINDOW, self.noises, dev)

    def draw_x_t(self, count: int) -> Tensor:
        """The next ``count`` windows' x_T [count, 1, S, 265] on the device (one upload)."""
        return torch.randn((int(count), *WINDOW), generator=self.generator).to(self.device)

    @torch.no_grad()
    def sample(self, kp_cond: Tensor, window: Tensor, x_t: Tensor) -> Tensor:
        """One window's motion [S, 265] (a copy) from kp_cond [265], the condition [S, C]
        and its x_T."""
        if self._graph is not None:
            # the graph is shared by every sampler of this LMDM (clips, live streams): its
            # noise buffer gets this sampler's noises before each window (a small copy)
            self._graph.set_noises(self.noises)
            return self._graph.run(kp_cond, window, x_t)[0].clone()
        assert self._sampler is not None
        kp_b, win_b = kp_cond[None], window[None]

        def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
            return self._lmdm(x, kp_b, win_b, time_cond)

        return self._sampler.sample(denoise, x_t)[0].clone()

    def predictor(self) -> Predictor:
        """A window predictor that draws each window's x_T as it is called (in window order)."""

        def predict(kp_cond: Tensor, window: Tensor, start: int) -> Tensor:
            return self.sample(kp_cond, window, self.draw_x_t(1)[0])

        return predict


@dataclass
class WindowMemo:
    """The last clip's LMDM windows: a digest of what each was conditioned on and what it
    predicted. A clip whose condition changed only from some window on (an emotion key later
    in the clip) samples the windows from the first changed one; the windows before it, whose
    inputs (condition rows, kp_cond, noise) are the same, give the same prediction again.
    Kept by an engine between clips; ``reused`` says how many windows the last call took."""

    key: tuple = ()
    digests: list[bytes] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    reused: int = 0
    windows: int = 0


def _window_digests(cond: Tensor, starts: list[int], seq: int) -> list[bytes]:
    host = cond.detach().to("cpu", torch.float32).contiguous()
    return [
        hashlib.blake2b(pad_window(host, s, seq).numpy().tobytes(), digest_size=16).digest()
        for s in starts
    ]


@torch.no_grad()
def generate_motion(
    lmdm: LMDM,
    cond: Tensor,
    kp_source: Tensor,
    steps: int,
    seed: int = 0,
    overlap: int = OVERLAP_OFFLINE,
    smooth_kernel: int = SMOOTH_KERNEL,
    on_window: Callable[[int, int], None] | None = None,
    fast: bool | None = None,
    precision: str = "fp32",
    memo: WindowMemo | None = None,
) -> Tensor:
    """[N, C] condition -> [N, 265] motion on the LMDM's device (offline mode, §1.4).

    ``kp_source`` is the source frame's motion vector [265] (the first kp_cond).
    ``on_window(done, total)`` is called after each window; it must not read tensors back
    if the loop is to stay free of host syncs. ``fast`` picks the fast path (None: on CUDA;
    True on the CPU runs it uncaptured); ``precision`` is the fast path's (:class:`WindowSampler`).
    ``memo`` (:class:`WindowMemo`) reuses the leading windows of the clip before whose inputs
    are unchanged, and keeps this clip's (the condition is read on the host to compare it).
    """
    dev = lmdm.device
    if cond.ndim != 2 or cond.shape[1] != lmdm.cond_dim:
        raise ValueError(f"cond must be [N, {lmdm.cond_dim}], got {list(cond.shape)}")
    starts = offline_starts(cond.shape[0], SEQ_FRAMES, overlap)
    digests: list[bytes] = []
    same = 0  # leading windows the memo can give
    if memo is not None:
        digests = _window_digests(cond, starts, SEQ_FRAMES)
        key = (id(lmdm), steps, seed, overlap, smooth_kernel, precision, _digest(kp_source))
        if memo.key == key:
            while same < min(len(digests), len(memo.digests)):
                if digests[same] != memo.digests[same]:
                    break
                same += 1
        outputs: list[Tensor] = []
    cond = cond.to(dev, torch.float32)
    sampler = WindowSampler(lmdm, steps, seed, fast, precision)
    window_index = {start: k for k, start in enumerate(starts)}
    x_ts = sampler.draw_x_t(len(starts))  # one upload, all windows

    def predict(kp_cond: Tensor, window: Tensor, start: int) -> Tensor:
        k = window_index[start]
        if memo is None:
            return sampler.sample(kp_cond, window, x_ts[k])
        out = memo.outputs[k] if k < same else sampler.sample(kp_cond, window, x_ts[k]).clone()
        outputs.append(out)
        return out

    motion = run_offline(
        predict,
        cond,
        KpCondPolicy(_kp(kp_source, dev)),
        seq=SEQ_FRAMES,
        overlap=overlap,
        smooth_kernel=smooth_kernel,
        on_window=on_window,
    )
    if memo is not None:
        memo.key, memo.digests, memo.outputs = key, digests, outputs
        memo.reused, memo.windows = same, len(starts)
    return motion


def _digest(t: Tensor) -> bytes:
    host = t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.blake2b(host, digest_size=16).digest()


def stream_motion(
    lmdm: LMDM,
    priming: Tensor,
    kp_source: Tensor,
    steps: int,
    seed: int = 0,
    overlap: int = OVERLAP_OFFLINE,
    smooth_kernel: int = SMOOTH_KERNEL,
    final_smooth: bool = True,
    fast: bool | None = None,
    precision: str = "fp32",
) -> OnlineWindows:
    """:func:`generate_motion` for live condition rows: online windows of ``overlap`` after the
    ``priming`` rows [P, C] (see :class:`OnlineWindows`), sampled by the same
    :class:`WindowSampler`. With P = 0, ``overlap`` 10 and ``final_smooth`` its frames are
    the clip's."""
    dev = lmdm.device
    if priming.ndim != 2 or priming.shape[1] != lmdm.cond_dim:
        raise ValueError(f"priming must be [P, {lmdm.cond_dim}], got {list(priming.shape)}")
    sampler = WindowSampler(lmdm, steps, seed, fast, precision)
    return OnlineWindows(
        sampler.predictor(),
        priming.to(dev, torch.float32),
        KpCondPolicy(_kp(kp_source, dev)),
        seq=SEQ_FRAMES,
        overlap=overlap,
        smooth_kernel=smooth_kernel,
        final_smooth=final_smooth,
    )


def _kp(kp_source: Tensor, dev: torch.device) -> Tensor:
    """The source motion [265] on ``dev`` (the first kp_cond)."""
    return kp_source.to(dev, torch.float32).reshape(MOTION_DIM)
