"""The in-betweens' warp, replayed from CUDA graphs.

A batched warp of a few in-betweens is some 150 small kernels: launched one by one it costs
~3 ms of host time whatever the batch, about half a keyframe render. It reads only its
inputs and never syncs with the host, so it is captured once per batch size (powers of two
up to :data:`~studio.engines.base.INBETWEEN_BATCH`, the padding rows keeping earlier valid
values) and replayed. On the CPU it runs as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from studio.engines.base import INBETWEEN_BATCH, InbetweenWarp
from studio.runtime.base import capture_cuda_graph


def _bucket(count: int) -> int:
    return 1 << max(0, int(count) - 1).bit_length()


class WarpGraphs:
    """``warp`` of crops on ``device``: captured per (warp, batch size) on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._graphs: dict[tuple[Any, int], tuple[Any, dict[str, Tensor], Tensor]] = {}

    def __call__(
        self,
        warp: InbetweenWarp,
        prev: Sequence[Tensor],
        nxt: Sequence[Tensor],
        kp: Tensor,
        w: np.ndarray,
    ) -> Tensor:
        """In-betweens [B, H, W, 3] uint8 of the crops ``prev``/``nxt`` (each [H, W, 3]),
        keypoints ``kp`` [B, 3, K, 2] (float64 pixels: previous, next, in-between) and
        weights ``w`` [B]; on a GPU the result is overwritten by the next call."""
        wt = torch.as_tensor(np.asarray(w, np.float32))
        if self.device.type != "cuda":
            return warp(torch.stack(list(prev)), torch.stack(list(nxt)), *kp.unbind(1), wt)
        out = []
        for s in range(0, len(prev), INBETWEEN_BATCH):
            part = slice(s, s + INBETWEEN_BATCH)
            out.append(self._replay(warp, prev[part], nxt[part], kp[part], wt[part]))
        return out[0] if len(out) == 1 else torch.cat(out)

    def _replay(
        self,
        warp: InbetweenWarp,
        prev: Sequence[Tensor],
        nxt: Sequence[Tensor],
        kp: Tensor,
        w: Tensor,
    ) -> Tensor:
        count = len(prev)
        graph, buf, out = self._graph(warp, _bucket(count), prev[0], kp)
        torch.stack(list(prev), out=buf["a"][:count])
        torch.stack(list(nxt), out=buf["b"][:count])
        buf["kp"][:count].copy_(kp)
        buf["w"][:count].copy_(w.pin_memory(), non_blocking=True)
        graph.replay()
        return out[:count]

    def _graph(
        self, warp: InbetweenWarp, size: int, crop: Tensor, kp: Tensor
    ) -> tuple[Any, dict[str, Tensor], Tensor]:
        """The graph of ``size``; the first call captures every size up to the batch, so a
        clip pays its captures once, before its first in-between."""
        if (warp, size) not in self._graphs:
            for s in (1 << i for i in range(INBETWEEN_BATCH.bit_length())):
                self._capture(warp, s, crop, kp)
        return self._graphs[(warp, size)]

    def _capture(self, warp: InbetweenWarp, size: int, crop: Tensor, kp: Tensor) -> None:
        key = (warp, size)
        if key not in self._graphs:
            dev = self.device
            buf = {
                "a": torch.zeros((size, *crop.shape), dtype=crop.dtype, device=dev),
                "b": torch.zeros((size, *crop.shape), dtype=crop.dtype, device=dev),
                # valid keypoints for the padding rows: the first call's, repeated
                "kp": kp[:1].expand(size, *kp.shape[1:]).to(dev, torch.float64).clone(),
                "w": torch.full((size,), 0.5, dtype=torch.float32, device=dev),
            }
            k = buf["kp"]
            graph, out = capture_cuda_graph(
                lambda: warp(buf["a"], buf["b"], k[:, 0], k[:, 1], k[:, 2], buf["w"]),
                context=torch.no_grad,
            )
            self._graphs[key] = (graph, buf, out)
