"""RGB -> YUV 4:2:0 (BT.709, limited range) on the device that rendered the frames.

The MP4 writer's own conversion (swscale on the host, one frame at a time) becomes a few
tensor ops on the GPU, and the host copy shrinks from 3 to 1.5 bytes a pixel. The layout is
what ``av.VideoFrame.from_ndarray(..., format="yuv420p")`` takes: the Y plane, then the U and
V planes of half width stacked under it, [H * 3 / 2, W] per frame.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BT709_LIMITED", "rgb_to_yuv420p"]

# Rows Y, U, V of the BT.709 matrix scaled to limited range (Y 16..235, chroma 16..240).
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB
BT709_LIMITED = (
    (219 * _KR, 219 * _KG, 219 * _KB),
    (-112 * _KR / (1 - _KB), -112 * _KG / (1 - _KB), 112.0),
    (112.0, -112 * _KG / (1 - _KR), -112 * _KB / (1 - _KR)),
)


def rgb_to_yuv420p(frames: Tensor) -> Tensor:
    """[B, H, W, 3] uint8 RGB (full range) -> [B, H * 3 // 2, W] uint8 yuv420p planes.

    H and W must be even. Chroma is the mean of each 2x2 block (swscale's default filter
    for this conversion is close to it: a level of difference at most on smooth images).
    The matrix enters as Python scalars: no upload, so no host sync in a render loop.
    """
    b, h, w, c = frames.shape
    if c != 3 or h % 2 or w % 2:
        raise ValueError(f"frames must be [B, H, W, 3] with even H and W, got {list(frames.shape)}")
    r, g, bl = (frames[..., i].to(torch.float32) for i in range(3))
    planes = [(kr * r + kg * g + kb * bl) / 255.0 for kr, kg, kb in BT709_LIMITED]
    y = planes[0] + 16.0
    uv = torch.nn.functional.avg_pool2d(torch.stack(planes[1:], 1), 2) + 128.0  # [B,2,H/2,W/2]
    out = torch.empty((b, h * 3 // 2, w), dtype=torch.uint8, device=frames.device)
    flat = out.view(b, -1)  # Y (h*w), then U and V (h*w/4 each), as from_ndarray reads them
    n = h * w
    flat[:, :n] = y.round_().clamp_(0, 255).to(torch.uint8).reshape(b, n)
    chroma = uv.round_().clamp_(0, 255).to(torch.uint8).reshape(b, 2, n // 4)
    flat[:, n : n + n // 4] = chroma[:, 0]
    flat[:, n + n // 4 :] = chroma[:, 1]
    return out
