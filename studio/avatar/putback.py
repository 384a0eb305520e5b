"""GPU putback: warp the rendered 512 crop into the source frame and feather-blend it.

Mirrors Ditto's ``PutBack`` (design doc §6): the ``get_mask(512, 512, 0.9, 0.9)`` feather mask
and the render are warped with ``M_c2o`` (bilinear, constant-0 border, as OpenCV ``warpAffine``
with ``INTER_LINEAR``), then ``out = m * render + (1 - m) * frame`` is clamped to [0, 255] and
truncated to uint8.  Unlike the reference (§9 item 5) the warped mask, the sampling grid and the
background are computed once per source image, only the crop's bounding box is blended, and the
output buffer is reused while the batch size stays the same.

``PasteBack`` serves an image avatar (one fixed source frame); ``FramePasteBack`` a video avatar,
where every render has its own source frame and crop matrix.  Both share the box rule, the
float64 sampling grid, the warp and the blend below, so they agree bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["FramePasteBack", "PasteBack", "paste_mask"]


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


def _affine(m_c2o: np.ndarray | torch.Tensor, batched: bool = False) -> np.ndarray:
    """float64 [..., 3, 3] crop -> frame matrices from [..., 3, 3] or [..., 2, 3]."""
    m = _as_numpy_f64(m_c2o)
    lead = m.shape[:-2]
    if m.shape[-2:] == (2, 3):
        row = np.broadcast_to(np.array([0.0, 0.0, 1.0]), (*lead, 1, 3))
        m = np.concatenate([m, row], axis=-2)
    if m.shape[-2:] != (3, 3) or len(lead) != int(batched):
        want = "[n, 3, 3] or [n, 2, 3]" if batched else "[3, 3] or [2, 3]"
        raise ValueError(f"m_c2o must be {want}, got {m.shape}")
    return m


def _crop_box(m: np.ndarray, s: int, h: int, w: int) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1): the frame pixels an [s, s] crop warped by ``m`` can touch.

    Frame pixels whose source lies in the open square (-1, s) can get non-zero weight;
    everything outside the bounding box of that square's image is the background.
    Empty boxes are (0, 0, 0, 0).
    """
    corners = np.array([[-1, -1, 1], [s, -1, 1], [-1, s, 1], [s, s, 1]], dtype=np.float64)
    xy = corners @ m[:2].T
    x0 = max(0, math.floor(xy[:, 0].min()))
    y0 = max(0, math.floor(xy[:, 1].min()))
    x1 = min(w, math.ceil(xy[:, 0].max()) + 1)
    y1 = min(h, math.ceil(xy[:, 1].max()) + 1)
    if x1 <= x0 or y1 <= y0:
        return 0, 0, 0, 0
    return y0, y1, x0, x1


def _grid_coefs(inv: np.ndarray) -> np.ndarray:
    """[..., 3, 2] float64 (d/dx, d/dy, offset) of the frame -> crop map (u, v)."""
    return np.ascontiguousarray(np.swapaxes(inv[..., :2, :], -1, -2))


def _sampling_grid(coefs: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, s: int) -> torch.Tensor:
    """float32 [B, h, w, 2] grid_sample grid (align_corners=True) of frame pixels (ys x xs).

    ``coefs`` float64 [B, 3, 2] from ``_grid_coefs``; ``xs`` [w] / ``ys`` [h] float64 integer
    pixel coordinates.  float64 math then a cast, in numpy's order
    ``(a * x + b * y + c) * 2 / (s - 1) - 1``, so host and device grids agree bit for bit:
    -1 / +1 are the centres of crop pixels 0 / s-1.
    """
    a, b, c = (coefs[:, k, None, None, :] for k in range(3))  # [B, 1, 1, 2]
    grid = a * xs[None, None, :, None] + b * ys[None, :, None, None]  # [B, h, w, 2]
    return grid.add_(c).mul_(2.0 / (s - 1)).sub_(1.0).to(torch.float32)


def _warp(src: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Bilinear warp with a zero border, as OpenCV warpAffine(INTER_LINEAR, BORDER_CONSTANT 0)."""
    return F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def _bg_term(mask: torch.Tensor, bg: torch.Tensor) -> torch.Tensor:
    """``(1 - m) * background`` in float32 (mask and uint8 background broadcast together)."""
    return (1 - mask) * bg.float()


def _blend_into(
    out: torch.Tensor, warped: torch.Tensor, mask255: torch.Tensor, bg_term: torch.Tensor
) -> None:
    """``out`` uint8 [B, h, w, 3] = clamp(render [B, 3, h, w] * 255 m + (1 - m) bg, 0, 255)."""
    blended = warped.permute(0, 2, 3, 1).mul_(mask255).add_(bg_term)
    # copy_ to uint8 truncates toward zero, like numpy's astype after the clip.
    out.copy_(blended.clamp_(0, 255))


def _renders(renders: torch.Tensor, s: int, device: torch.device) -> torch.Tensor:
    """Checked float32 [B, 3, s, s] renders on ``device``, clipped to [0, 1]."""
    if renders.ndim != 4 or tuple(renders.shape[1:]) != (3, s, s):
        raise ValueError(f"renders must be [B, 3, {s}, {s}], got {tuple(renders.shape)}")
    return renders.to(device, torch.float32).clamp(0, 1)


def _union_box(boxes: np.ndarray) -> tuple[int, int, int, int]:
    """(y0, y1, x0, x1) bounding all non-empty boxes [n, 4]; (0, 0, 0, 0) if none is."""
    full = boxes[(boxes[:, 1] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 2])]
    if not len(full):
        return 0, 0, 0, 0
    return (
        int(full[:, 0].min()),
        int(full[:, 1].max()),
        int(full[:, 2].min()),
        int(full[:, 3].max()),
    )


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
        self.crop_size = s = int(crop_size)
        h, w = frame.shape[:2]

        m = _affine(m_c2o)
        self.box = y0, y1, x0, x1 = _crop_box(m, s, h, w)
        # The grid on the host (float64 math), once: frame pixel -> normalised crop position.
        coefs = torch.from_numpy(_grid_coefs(np.linalg.inv(m))[None])
        xs = torch.arange(x0, x1, dtype=torch.float64)
        ys = torch.arange(y0, y1, dtype=torch.float64)
        self.grid = _sampling_grid(coefs, xs, ys, s).to(self.device)

        self.mask = torch.zeros(y1 - y0, x1 - x0, 1, device=self.device)
        self.bg_term = torch.zeros(y1 - y0, x1 - x0, 3, device=self.device)
        if self.grid.numel():
            warped = _warp(paste_mask(s).to(self.device)[None, None], self.grid)
            self.mask = warped[0, 0, :, :, None].clamp(0, 1).contiguous()  # [h, w, 1]
            self.bg_term = _bg_term(self.mask, self.background[y0:y1, x0:x1]).contiguous()
        self._mask255 = self.mask * 255.0
        self._out: torch.Tensor | None = None
        self._grid_b: torch.Tensor | None = None

    def __call__(self, renders: torch.Tensor) -> torch.Tensor:
        """Blend ``renders`` float [B, 3, S, S] in 0..1 -> uint8 [B, H, W, 3] (reused buffer)."""
        src = _renders(renders, self.crop_size, self.device)
        b = src.shape[0]
        if self._out is None or self._out.shape[0] != b:
            self._out = self.background.expand(b, -1, -1, -1).clone()
            self._grid_b = self.grid.expand(b, -1, -1, -1).contiguous()
        y0, y1, x0, x1 = self.box
        if y1 > y0 and x1 > x0:
            warped = _warp(src, self._grid_b)  # [B, 3, h, w]
            _blend_into(self._out[:, y0:y1, x0:x1], warped, self._mask255, self.bg_term)
        return self._out


class FramePasteBack:
    """Paste batches of rendered crops back into per-frame source frames (a video avatar).

    Args:
        frames: the video's source frames, uint8 [n, H, W, 3] RGB (uploaded once to ``device``),
            or None for a solid ``colour`` background of ``size_hw`` behind every frame (green
            screen; transparency mattes draw over black and over white).
        m_c2o: [n, 3, 3] (or [n, 2, 3]) crop -> frame pixel matrices, one per source frame.
        crop_size: side of the square render.
        device: device for all work; defaults to the frames' device (CPU for numpy / colour).
        colour: (r, g, b) 0..255 of the solid background (with ``frames=None``).
        size_hw: (H, W) of the solid background; with ``frames`` it must match them.

    Call with ``renders`` float [B, 3, S, S] in 0..1 and ``index`` [B] ints, the source frame
    of each render.  Returns uint8 [B, H, W, 3] on ``device``, equal to
    ``PasteBack(frames[i], m_c2o[i])(renders[b:b+1])`` for every b with i = index[b]: the same
    float64 grid, mask, warp and blend.  The result is a buffer reused by the next call with
    the same batch size: consume or clone it before calling again.

    Per call only the union of the n crops' bounding boxes (fixed at construction) is warped:
    one grid built on the device from the batch's inverse matrices, one ``grid_sample`` of the
    renders with the mask as a 4th channel.  Host indices (numpy, list, CPU tensor) are
    range-checked (ValueError); a device index tensor is never read back (no host sync), so an
    out-of-range entry there trips ``index_select``'s device-side assert instead.
    """

    def __init__(
        self,
        frames: np.ndarray | torch.Tensor | None,
        m_c2o: np.ndarray | torch.Tensor,
        crop_size: int = 512,
        device: torch.device | str | None = None,
        *,
        colour: tuple[int, int, int] | None = None,
        size_hw: tuple[int, int] | None = None,
    ) -> None:
        if device is None:
            device = frames.device if isinstance(frames, torch.Tensor) else "cpu"
        self.device = torch.device(device)
        self.crop_size = s = int(crop_size)
        m = _affine(m_c2o, batched=True)
        self.count = n = m.shape[0]
        self._frames, self._colour, self._hw = self._backgrounds(frames, n, colour, size_hw)
        h, w = self._hw

        self.boxes = np.array([_crop_box(mi, s, h, w) for mi in m], dtype=np.int64).reshape(n, 4)
        self.box = y0, y1, x0, x1 = _union_box(self.boxes)
        dev = self.device
        self._coefs = torch.from_numpy(_grid_coefs(np.linalg.inv(m))).to(dev)  # [n, 3, 2]
        self._xs = torch.arange(x0, x1, dtype=torch.float64, device=dev)
        self._ys = torch.arange(y0, y1, dtype=torch.float64, device=dev)
        self._boxes = torch.from_numpy(self.boxes).to(dev)
        self._mask = paste_mask(s).to(dev)[None, None]  # [1, 1, S, S]
        self._out: torch.Tensor | None = None

    def _backgrounds(
        self,
        frames: np.ndarray | torch.Tensor | None,
        n: int,
        colour: tuple[int, int, int] | None,
        size_hw: tuple[int, int] | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, tuple[int, int]]:
        """(frames [n, H, W, 3] | None, colour [1, H, W, 3] | None, (H, W)); uint8, on device."""
        if frames is None:
            if colour is None or size_hw is None:
                raise ValueError("without frames, give colour and size_hw")
            h, w = (int(v) for v in size_hw)
            rgb = torch.tensor([int(c) for c in colour], dtype=torch.uint8, device=self.device)
            return None, rgb.expand(1, h, w, 3), (h, w)
        if colour is not None:
            raise ValueError("give either frames or a colour, not both")
        t = torch.as_tensor(frames).to(self.device, torch.uint8).contiguous()
        if t.ndim != 4 or t.shape[3] != 3 or t.shape[0] != n:
            raise ValueError(f"frames must be [{n}, H, W, 3] (one per m_c2o), got {tuple(t.shape)}")
        hw = (int(t.shape[1]), int(t.shape[2]))
        if size_hw is not None and tuple(int(v) for v in size_hw) != hw:
            raise ValueError(f"size_hw {tuple(size_hw)} does not match frames {hw}")
        return t, None, hw

    @property
    def height(self) -> int:
        return self._hw[0]

    @property
    def width(self) -> int:
        return self._hw[1]

    def _index(self, index: torch.Tensor | np.ndarray, b: int) -> torch.Tensor:
        """Checked int64 [b] source indices on the device (host ones range-checked)."""
        if isinstance(index, torch.Tensor) and index.device.type != "cpu":
            if tuple(index.shape) != (b,) or index.is_floating_point() or index.is_complex():
                raise ValueError(f"index must be [{b}] integers, got {tuple(index.shape)}")
            return index.to(self.device, torch.int64)
        idx = np.asarray(index.numpy() if isinstance(index, torch.Tensor) else index)
        if idx.shape != (b,) or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
            raise ValueError(f"index must be [{b}] integers, got {idx.shape} {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.count):
            raise ValueError(f"index out of range [0, {self.count}): {idx.min()}..{idx.max()}")
        return torch.from_numpy(idx.astype(np.int64)).to(self.device)

    def _buffer(self, b: int, idx: torch.Tensor) -> torch.Tensor:
        """The output buffer holding each render's background (gathered, or the colour)."""
        if self._out is None or self._out.shape[0] != b:
            bg = self._colour if self._frames is None else self._frames[:1]
            self._out = bg.expand(b, -1, -1, -1).clone()
        if self._frames is not None:
            torch.index_select(self._frames, 0, idx, out=self._out)
        # a colour buffer keeps the colour outside the box; the box is rewritten every call
        return self._out

    def __call__(self, renders: torch.Tensor, index: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Blend ``renders`` [B, 3, S, S] over source frames ``index`` [B] -> uint8 [B, H, W, 3]."""
        src = _renders(renders, self.crop_size, self.device)
        b = src.shape[0]
        idx = self._index(index, b)
        out = self._buffer(b, idx)
        y0, y1, x0, x1 = self.box
        if b == 0 or y1 <= y0 or x1 <= x0:
            return out
        grid = _sampling_grid(self._coefs.index_select(0, idx), self._xs, self._ys, self.crop_size)
        src = torch.cat([src, self._mask.expand(b, -1, -1, -1)], dim=1)
        warped = _warp(src, grid)  # [B, 4, h, w]: render, then mask
        # channel-first [B, C, h, w] math: the same values as PasteBack's [h, w, C], with the
        # mask broadcast along rows of pixels rather than over 3 channels (vectorises better)
        mask = warped[:, 3:].clamp(0, 1).mul_(self._inside(idx)[:, None])
        region = out[:, y0:y1, x0:x1]
        bg = region if self._frames is not None else self._colour[:, :1, :1]
        bg_term = _bg_term(mask, bg.permute(0, 3, 1, 2))
        hwc = (0, 2, 3, 1)
        _blend_into(region, warped[:, :3], (mask * 255.0).permute(hwc), bg_term.permute(hwc))
        return out

    def _inside(self, idx: torch.Tensor) -> torch.Tensor:
        """[B, h, w] bool: the union-box pixels inside each render's own crop box.

        Outside it PasteBack keeps the background; zeroing the mask there keeps that exact.
        """
        by0, by1, bx0, bx1 = self._boxes.index_select(0, idx).unbind(1)
        ys, xs = self._ys[None], self._xs[None]
        rows = (ys >= by0[:, None]) & (ys < by1[:, None])
        cols = (xs >= bx0[:, None]) & (xs < bx1[:, None])
        return rows[:, :, None] & cols[:, None, :]
