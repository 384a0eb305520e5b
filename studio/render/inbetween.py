"""Motion-compensated in-between frames: the neighbouring keyframes moved to where the
in-between's motion puts the face, then blended, instead of a cross-fade in place.

For each neighbour a dense backward flow (in-between pixel -> keyframe pixel) comes from a
thin-plate spline through the implicit keypoints' 2-D positions (in-between -> keyframe),
pinned by fixed anchors on the image border so the background stays. The spline is evaluated
on a coarse grid (``step`` pixels) and upsampled: it is smooth, and that keeps the cost to the
two bilinear ``grid_sample`` calls. Each warped neighbour is weighted by its distance in time
(``1 - w``, ``w``) times a confidence that falls where its warp stretches or compresses the
image strongly (the Jacobian's log-determinant: a mouth opening between the keyframes is
stretched from the shut one and squeezed from the open one) or lands outside it.

Pure torch on the images' device: the demo renderer runs it on the CPU, a device renderer on
its GPU (for a renderer that pastes a crop back, on the crop before paste-back).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

GRID_STEP = 8  # pixels between the coarse grid's nodes the spline is evaluated on
ANCHORS_PER_SIDE = 5  # fixed points along each border edge (corners included)
TPS_REG = 1e-4  # spline regularisation (unit-square coordinates): near-coincident keypoints
STRETCH_SHARPNESS = 4.0  # confidence exp(-k |log det J|) of a warped pixel
INTERPOLATION = "bicubic"  # bilinear blurs anti-aliased edges at half-pixel shifts (~42 dB)


def border_anchors(height: int, width: int, per_side: int = ANCHORS_PER_SIDE) -> np.ndarray:
    """[M, 2] fixed (x, y) pixel points along the image border, corners included."""
    xs = np.linspace(0.0, width, per_side)
    ys = np.linspace(0.0, height, per_side)[1:-1]
    top = np.stack([xs, np.zeros_like(xs)], 1)
    bottom = np.stack([xs, np.full_like(xs, height)], 1)
    left = np.stack([np.zeros_like(ys), ys], 1)
    right = np.stack([np.full_like(ys, width), ys], 1)
    return np.concatenate([top, bottom, left, right])


def _tps_kernel(r2: torch.Tensor) -> torch.Tensor:
    """U(r) = r^2 log r^2 (0 at r = 0)."""
    return r2 * torch.log(r2.clamp_min(1e-12))


def tps_fit(ctrl: torch.Tensor, target: torch.Tensor, reg: float = TPS_REG) -> torch.Tensor:
    """Thin-plate spline coefficients [M + 3, 2] mapping ``ctrl`` [M, 2] onto ``target``."""
    m = ctrl.shape[0]
    k = _tps_kernel(torch.cdist(ctrl, ctrl).square()) + reg * torch.eye(m, dtype=ctrl.dtype)
    p = torch.cat([torch.ones(m, 1, dtype=ctrl.dtype), ctrl], 1)
    a = torch.zeros(m + 3, m + 3, dtype=ctrl.dtype)
    a[:m, :m], a[:m, m:], a[m:, :m] = k, p, p.T
    rhs = torch.cat([target, torch.zeros(3, 2, dtype=ctrl.dtype)])
    return torch.linalg.solve(a, rhs)


def tps_apply(coef: torch.Tensor, ctrl: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
    """The spline of :func:`tps_fit` at ``pts`` [P, 2]."""
    u = _tps_kernel(torch.cdist(pts, ctrl).square())
    p = torch.cat([torch.ones(pts.shape[0], 1, dtype=pts.dtype), pts], 1)
    m = ctrl.shape[0]
    return u @ coef[:m] + p @ coef[m:]


def coarse_map(
    dst_kp: np.ndarray, src_kp: np.ndarray, height: int, width: int, step: int = GRID_STEP
) -> torch.Tensor:
    """The backward map on the coarse grid: [2, gh, gw] source (x, y) in pixels of the nodes
    (x = 0, step, …, width), pulling keypoints ``dst_kp`` [21, 2] from ``src_kp`` (float64,
    CPU: a few thousand points)."""
    scale = float(max(height, width))
    anchors = border_anchors(height, width)
    ctrl = torch.from_numpy(np.concatenate([dst_kp, anchors]) / scale)
    target = torch.from_numpy(np.concatenate([src_kp, anchors]) / scale)
    coef = tps_fit(ctrl, target)
    gx = np.linspace(0.0, width, -(-width // step) + 1)
    gy = np.linspace(0.0, height, -(-height // step) + 1)
    yy, xx = np.meshgrid(gy, gx, indexing="ij")
    nodes = torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], 1) / scale)
    out = tps_apply(coef, ctrl, nodes) * scale
    return out.T.reshape(2, gy.size, gx.size)


def _confidence(grid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[gh, gw] confidence of a coarse backward map: exp(-k |log det J|), 0 where it folds."""
    sx = grid.shape[2] - 1
    sy = grid.shape[1] - 1
    dx = torch.gradient(grid, dim=(1, 2), spacing=(height / sy, width / sx))
    jxx, jxy = dx[1][0], dx[0][0]  # d src_x / dx, d src_x / dy
    jyx, jyy = dx[1][1], dx[0][1]
    det = jxx * jyy - jxy * jyx
    conf = torch.exp(-STRETCH_SHARPNESS * det.clamp_min(1e-6).log().abs())
    return torch.where(det > 0, conf, torch.zeros_like(conf))


def _to_full(coarse: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Upsample [C, gh, gw] node values (nodes at 0..width) to pixel centres [C, H, W]."""
    gh, gw = coarse.shape[1:]
    # pixel centre x + 0.5 in node units, as grid_sample coordinates (align_corners=True)
    xs = (torch.arange(width, dtype=coarse.dtype) + 0.5) / width * 2.0 - 1.0
    ys = (torch.arange(height, dtype=coarse.dtype) + 0.5) / height * 2.0 - 1.0
    grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], -1)[None]
    return F.grid_sample(coarse[None], grid, mode="bilinear", align_corners=True)[0]


def motion_inbetween(
    prev_image: np.ndarray | torch.Tensor,
    next_image: np.ndarray | torch.Tensor,
    prev_kp: np.ndarray,
    next_kp: np.ndarray,
    kp: np.ndarray,
    w: float,
    step: int = GRID_STEP,
) -> np.ndarray | torch.Tensor:
    """The in-between at weight ``w`` (0: ``prev_image``, 1: ``next_image``).

    Images [H, W, 3] uint8 (numpy, or torch on any device: the result is of the same kind);
    keypoints [21, 2] (x, y) pixels of the previous keyframe, the next one and the
    in-between itself.
    """
    as_numpy = isinstance(prev_image, np.ndarray)
    a = torch.from_numpy(prev_image) if as_numpy else prev_image
    b = torch.from_numpy(next_image) if as_numpy else next_image
    height, width = a.shape[:2]
    kp = np.asarray(kp, np.float64)
    maps, confs = [], []
    for src in (prev_kp, next_kp):
        grid = coarse_map(kp, np.asarray(src, np.float64), height, width, step)
        maps.append(grid)
        confs.append(_confidence(grid, height, width))
    coarse = torch.cat([maps[0], maps[1], confs[0][None], confs[1][None]]).float()
    full = _to_full(coarse.to(a.device), height, width)  # [6, H, W]
    # backward maps -> grid_sample's normalised coordinates (pixel centres, align_corners=False)
    norm = torch.tensor([2.0 / width, 2.0 / height], device=a.device)[:, None, None]
    grids = torch.stack([full[0:2], full[2:4]]) * norm - 1.0  # [2, 2, H, W]
    images = torch.stack([a, b]).permute(0, 3, 1, 2).float()
    warped = F.grid_sample(
        images,
        grids.permute(0, 2, 3, 1),
        mode=INTERPOLATION,
        padding_mode="border",
        align_corners=False,
    )
    inside = (grids.abs() <= 1.0).all(dim=1).float()  # [2, H, W]
    weight = torch.stack([(1.0 - w) * full[4], w * full[5]]) * inside + 1e-6
    weight[0] += (1.0 - w) * 1e-4  # falls back to the distance blend where both are unsure
    weight[1] += w * 1e-4
    out = (warped * weight[:, None]).sum(0) / weight.sum(0)
    out = out.add_(0.5).clamp_(0.0, 255.0).to(torch.uint8).permute(1, 2, 0)
    return out.numpy() if as_numpy else out
