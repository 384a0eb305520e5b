"""GPU putback: warp the rendered 512 crop into the source frame and feather-blend it.

Mirrors Ditto's ``PutBack`` (design doc §6): the ``get_mask(512, 512, 0.9, 0.9)`` feather mask
and the render are warped with ``M_c2o`` (bilinear, constant-0 border, as OpenCV ``warpAffine``
with ``INTER_LINEAR``), then ``out = m * render + (1 - m) * frame`` is clamped to [0, 255] and
truncated to uint8.  Unlike the reference (§9 item 5) the warped mask, the sampling grid and the
background are computed once per source image, only the crop's bounding box is blended, and the
output buffer is reused while the batch size stays the same.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["PasteBack", "paste_mask"]


def _linspace(start: float, stop: float, num: int) -> torch.Tensor:
    """float64 linspace with numpy's arithmetic (``i * step + start``, last = stop)."""
    if num <= 0:
        return torch.zeros(0, dtype=torch.float64)
    if num == 1:
        return torch.full((1,), float(start), dtype=torch.float64)
    step = (stop - start) / (num - 1)
    y = torch.arange(num, dtype=torch.float64) * step + start
    y[-1] = stop
    return y


def _radial(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``sqrt(row**2 + col**2)`` in float64, cast to float32 (as the reference does)."""
    return torch.sqrt(row[None, :] ** 2 + col[:, None] ** 2).to(torch.float32)


def paste_mask(size: int = 512, ratio: float = 0.9) -> torch.Tensor:
    """Ditto's feather mask ``get_mask(size, size, ratio, ratio)`` as float32 [size, size] (CPU).

    Interior is 1; each border band ramps linearly 0 -> 1 towards the interior; corners fall off
    radially as ``1 - min(1, dist)`` from the inner corner.  Bit-exact with the numpy original.
    """
    inner = int(size * ratio)
    a = (size - inner) // 2  # first interior index
    b = a + inner  # one past the last interior index
    n_lo, n_hi = a, size - b
    zeros = _linspace(0, 0, inner)
    m = torch.ones(size, size, dtype=torch.float32)
    m[:a, a:b] = _radial(zeros, _linspace(0, 1, n_lo))  # top
    m[b:, a:b] = _radial(zeros, _linspace(1, 0, n_hi))  # bottom
    m[a:b, :a] = _radial(_linspace(0, 1, n_lo), zeros)  # left
    m[a:b, b:] = _radial(_linspace(1, 0, n_hi), zeros)  # right
    lo, hi = slice(0, a), slice(b, size)
    corners = [  # (rows, cols, row ramp along x, col ramp along y)
        (lo, lo, _linspace(1, 0, n_lo), _linspace(1, 0, n_lo)),
        (lo, hi, _linspace(0, 1, n_hi), _linspace(1, 0, n_lo)),
        (hi, lo, _linspace(1, 0, n_lo), _linspace(0, 1, n_hi)),
        (hi, hi, _linspace(0, 1, n_hi), _linspace(0, 1, n_hi)),
    ]
    for ys, xs, row, col in corners:
        m[ys, xs] = 1 - _radial(row, col).clamp(0, 1)
    return m


def _as_numpy_f64(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


class PasteBack:
    """Paste batches of rendered crops back into one fixed source frame.

    Args:
        frame_rgb: source frame, uint8 [H, W, 3] RGB (numpy array or tensor).
        m_c2o: [3, 3] (or [2, 3]) affine matrix mapping crop pixels to frame pixels.
        crop_size: side of the square render.
        device: device for all work; defaults to the frame's device (CPU for numpy).

    Call with ``renders`` float [B, 3, crop_size, crop_size] in 0..1 (the decoder's NCHW output;
    values are clipped to [0, 1] and scaled by 255 like the reference).  Returns uint8
    [B, H, W, 3] on ``device``.  The returned tensor is an internal buffer reused by the next call
    with the same batch size: consume or clone it before calling again.
    """

    def __init__(
        self,
        frame_rgb: np.ndarray | torch.Tensor,
        m_c2o: np.ndarray | torch.Tensor,
        crop_size: int = 512,
        device: torch.device | str | None = None,
    ) -> None:
        if device is None:
            device = frame_rgb.device if isinstance(frame_rgb, torch.Tensor) else "cpu"
        self.device = torch.device(device)
        frame = torch.as_tensor(frame_rgb).to(self.device, torch.uint8)
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"frame_rgb must be [H, W, 3], got {tuple(frame.shape)}")
        self.background = frame.contiguous()
        self.crop_size = int(crop_size)
        h, w = frame.shape[:2]

        m = _as_numpy_f64(m_c2o)
        if m.shape == (2, 3):
            m = np.vstack([m, [0.0, 0.0, 1.0]])
        if m.shape != (3, 3):
            raise ValueError(f"m_c2o must be [3, 3] or [2, 3], got {m.shape}")
        inv = np.linalg.inv(m)

        # Frame pixels whose source lies in the open square (-1, S) can get non-zero weight;
        # everything outside the bounding box of that square's image is the background.
        s = self.crop_size
        corners = np.array([[-1, -1, 1], [s, -1, 1], [-1, s, 1], [s, s, 1]], dtype=np.float64)
        xy = corners @ m[:2].T
        x0 = max(0, math.floor(xy[:, 0].min()))
        y0 = max(0, math.floor(xy[:, 1].min()))
        x1 = min(w, math.ceil(xy[:, 0].max()) + 1)
        y1 = min(h, math.ceil(xy[:, 1].max()) + 1)
        if x1 <= x0 or y1 <= y0:
            x0 = y0 = x1 = y1 = 0
        self.box = (y0, y1, x0, x1)

        # Inverse map frame pixel centres (integer coords) -> crop pixel coords, normalised for
        # grid_sample(align_corners=True): -1 / +1 are the centres of pixels 0 / S-1.
        ys, xs = np.meshgrid(np.arange(y0, y1), np.arange(x0, x1), indexing="ij")
        u = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
        v = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
        grid = np.stack([u, v], axis=-1) * (2.0 / (s - 1)) - 1.0
        self.grid = torch.from_numpy(grid.astype(np.float32))[None].to(self.device)

        self.mask = torch.zeros(y1 - y0, x1 - x0, 1, device=self.device)
        self.bg_term = torch.zeros(y1 - y0, x1 - x0, 3, device=self.device)
        if self.grid.numel():
            mask = paste_mask(s).to(self.device)[None, None]
            warped = F.grid_sample(
                mask, self.grid, mode="bilinear", padding_mode="zeros", align_corners=True
            )
            self.mask = warped[0, 0, :, :, None].clamp(0, 1).contiguous()  # [h, w, 1]
            bg = self.background[y0:y1, x0:x1].float()
            self.bg_term = ((1 - self.mask) * bg).contiguous()
        self._mask255 = self.mask * 255.0
        self._out: torch.Tensor | None = None
        self._grid_b: torch.Tensor | None = None

    def __call__(self, renders: torch.Tensor) -> torch.Tensor:
        """Blend ``renders`` float [B, 3, S, S] in 0..1 -> uint8 [B, H, W, 3] (reused buffer)."""
        s = self.crop_size
        if renders.ndim != 4 or tuple(renders.shape[1:]) != (3, s, s):
            raise ValueError(f"renders must be [B, 3, {s}, {s}], got {tuple(renders.shape)}")
        b = renders.shape[0]
        if self._out is None or self._out.shape[0] != b:
            self._out = self.background.expand(b, -1, -1, -1).clone()
            self._grid_b = self.grid.expand(b, -1, -1, -1).contiguous()
        y0, y1, x0, x1 = self.box
        if y1 > y0 and x1 > x0:
            src = renders.to(self.device, torch.float32).clamp(0, 1)
            warped = F.grid_sample(
                src, self._grid_b, mode="bilinear", padding_mode="zeros", align_corners=True
            )  # [B, 3, h, w]
            blended = warped.permute(0, 2, 3, 1).mul_(self._mask255).add_(self.bg_term)
            # copy_ to uint8 truncates toward zero, like numpy's astype after the clip.
            self._out[:, y0:y1, x0:x1].copy_(blended.clamp_(0, 255))
        return self._out
