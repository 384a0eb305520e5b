"""LMDM motion for a whole clip: offline windows sampled by the device-resident DDIM loop.

The condition ``[N, C]`` goes to the device once; every window's DDIM steps, the crossfades
and the box smoothing run there, and the ``[N, 265]`` motion stays on the device until a
caller asks for it on the host. As in the reference (ditto-reference.md §9 pitfall 10) the
per-step noises are drawn once per clip and shared by every window, while x_T is drawn per
window; both come from one generator seeded by the render seed, so a render is reproducible.

On CUDA each window runs through :mod:`studio.motion.fast_lmdm`: the condition encoder and
time embeddings hoisted out of the steps, and the whole DDIM loop of a window captured once
per step count as a CUDA graph (kept for the loaded LMDM) and replayed with the window's
condition and x_T copied into its static buffers. LMDM stays fp32 there (the released set's
choice); ``tf32=True`` allows TF32 matmuls. On the CPU the eager loop runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from studio.layout import MOTION_DIM, OVERLAP_OFFLINE, SEQ_FRAMES, SMOOTH_KERNEL
from studio.models.diffusion import DeviceDDIM, draw_noises
from studio.models.lmdm import LMDM
from studio.motion.fast_lmdm import WINDOW, graphed_lmdm
from studio.motion.windows import KpCondPolicy, offline_starts, run_offline


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
    tf32: bool = False,
) -> Tensor:
    """[N, C] condition -> [N, 265] motion on the LMDM's device (offline mode, §1.4).

    ``kp_source`` is the source frame's motion vector [265] (the first kp_cond).
    ``on_window(done, total)`` is called after each window; it must not read tensors back
    if the loop is to stay free of host syncs. ``fast`` picks the fast path (None: on CUDA;
    True on the CPU runs it uncaptured); ``tf32`` lets its matmuls use TF32 (CUDA, fast path).
    """
    dev = lmdm.device
    if cond.ndim != 2 or cond.shape[1] != lmdm.cond_dim:
        raise ValueError(f"cond must be [N, {lmdm.cond_dim}], got {list(cond.shape)}")
    cond = cond.to(dev, torch.float32)
    kp = kp_source.to(dev, torch.float32).reshape(MOTION_DIM)
    shape = WINDOW
    sched = lmdm.schedule(int(steps))
    gen = torch.Generator().manual_seed(int(seed))  # CPU: the same draws on every device
    _, noises = draw_noises(sched, shape, gen, dev)
    starts = offline_starts(cond.shape[0], SEQ_FRAMES, overlap)
    window_index = {start: k for k, start in enumerate(starts)}
    x_ts = torch.randn((len(starts), *shape), generator=gen).to(dev)  # one upload, all windows
    use_fast = dev.type == "cuda" if fast is None else fast
    if use_fast:
        graph = graphed_lmdm(lmdm, tf32).window_graph(sched, shape)
        graph.set_noises(noises)

        def predict(kp_cond: Tensor, window: Tensor, start: int) -> Tensor:
            return graph.run(kp_cond, window, x_ts[window_index[start]])[0].clone()

    else:
        sampler = DeviceDDIM(sched, shape, noises, dev)

        def predict(kp_cond: Tensor, window: Tensor, start: int) -> Tensor:
            kp_b, win_b = kp_cond[None], window[None]

            def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
                return lmdm(x, kp_b, win_b, time_cond)

            return sampler.sample(denoise, x_ts[window_index[start]])[0].clone()

    return run_offline(
        predict,
        cond,
        KpCondPolicy(kp),
        seq=SEQ_FRAMES,
        overlap=overlap,
        smooth_kernel=smooth_kernel,
        on_window=on_window,
    )
