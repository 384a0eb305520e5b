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

import functools

import numpy as np
import torch
import torch.nn.functional as F

GRID_STEP = 4  # pixels between the coarse grid's nodes the spline is evaluated on (8 blurs lips)
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
    """U(r) = r^2 log r^2 (0 at r = 0), in one fused operation."""
    return torch.xlogy(r2, r2)


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a_i - b_j|^2 [..., P, M] of points a [..., P, 2] and b [..., M, 2]: one matrix product
    and two norms (no square root taken and squared again); rounding below zero clamped."""
    cross = a @ b.transpose(-1, -2)
    near = a.square().sum(-1, keepdim=True) + b.square().sum(-1)[..., None, :]
    return (near - 2.0 * cross).clamp_min_(0.0)


def tps_fit(ctrl: torch.Tensor, target: torch.Tensor, reg: float = TPS_REG) -> torch.Tensor:
    """Thin-plate spline coefficients [..., M + 3, D] mapping ``ctrl`` [..., M, 2] onto
    ``target`` [..., M, D] (several 2-D targets side by side share one solve; batched over the
    leading dimensions, on their device, without a host sync)."""
    m = ctrl.shape[-2]
    opts = {"dtype": ctrl.dtype, "device": ctrl.device}
    k = _tps_kernel(_squared_distances(ctrl, ctrl)) + reg * torch.eye(m, **opts)
    p = torch.cat([torch.ones(*ctrl.shape[:-1], 1, **opts), ctrl], -1)
    a = torch.zeros(*ctrl.shape[:-2], m + 3, m + 3, **opts)
    a[..., :m, :m], a[..., :m, m:], a[..., m:, :m] = k, p, p.transpose(-1, -2)
    rhs = torch.cat([target, torch.zeros(*target.shape[:-2], 3, target.shape[-1], **opts)], -2)
    return torch.linalg.solve_ex(a, rhs, check_errors=False)[0]  # regularised: never singular


def tps_apply(coef: torch.Tensor, ctrl: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
    """The spline of :func:`tps_fit` at ``pts`` [..., P, 2]."""
    u = _tps_kernel(_squared_distances(pts, ctrl))
    p = torch.cat([torch.ones(*pts.shape[:-1], 1, dtype=pts.dtype, device=pts.device), pts], -1)
    m = ctrl.shape[-2]
    return u @ coef[..., :m, :] + p @ coef[..., m:, :]


def coarse_map(
    dst_kp: torch.Tensor, src_kp: torch.Tensor, height: int, width: int, step: int = GRID_STEP
) -> torch.Tensor:
    """The backward maps on the coarse grid: [..., S, 2, gh, gw] source (x, y) in pixels of
    the nodes (x = 0, step, …, width), pulling keypoints ``dst_kp`` [..., K, 2] from each of
    the S sources ``src_kp`` [..., S, K, 2] (float64 tensors, on the device the maps are
    wanted on). The splines share their control points, the keypoints pulled, so one kernel
    and one solve serve every source."""
    scale = float(max(height, width))
    border, nodes, shape, _ = _grid(height, width, step, dst_kp.device)
    sources = src_kp.shape[-3]
    anchors = border.expand(*dst_kp.shape[:-2], *border.shape)
    ctrl = torch.cat([dst_kp, anchors], -2) / scale
    pulled = torch.cat([src_kp, border.expand(*src_kp.shape[:-2], *border.shape)], -2)
    target = pulled.transpose(-3, -2).flatten(-2) / scale  # [..., M, S * 2]
    coef = tps_fit(ctrl, target)
    out = tps_apply(coef, ctrl, nodes.expand(*ctrl.shape[:-2], -1, 2)) * scale  # [.., P, S*2]
    return out.transpose(-1, -2).reshape(*ctrl.shape[:-2], sources, 2, *shape)


@functools.lru_cache(maxsize=8)
def _grid(
    height: int, width: int, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int], torch.Tensor]:
    """The border anchors [M, 2] (pixels) and the coarse grid's nodes [P, 2] (unit-square
    coordinates), float64, (gh, gw), and the scale [2, 1, 1] from pixels to grid_sample's
    coordinates, all on ``device``: made once, no upload per call (nor in a graph capture)."""
    scale = float(max(height, width))
    gx = np.linspace(0.0, width, -(-width // step) + 1)
    gy = np.linspace(0.0, height, -(-height // step) + 1)
    yy, xx = np.meshgrid(gy, gx, indexing="ij")
    nodes = torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], 1) / scale).to(device)
    border = torch.from_numpy(border_anchors(height, width)).to(device)
    norm = torch.tensor([2.0 / width, 2.0 / height], device=device)[:, None, None]
    return border, nodes, (gy.size, gx.size), norm


def _confidence(grid: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[..., gh, gw] confidence of coarse backward maps [..., 2, gh, gw]:
    exp(-k |log det J|), 0 where the map folds."""
    sx = grid.shape[-1] - 1
    sy = grid.shape[-2] - 1
    gx, gy = grid[..., 0, :, :], grid[..., 1, :, :]
    jxy, jxx = torch.gradient(gx, dim=(-2, -1), spacing=(height / sy, width / sx))
    jyy, jyx = torch.gradient(gy, dim=(-2, -1), spacing=(height / sy, width / sx))
    det = jxx * jyy - jxy * jyx
    conf = torch.exp(-STRETCH_SHARPNESS * det.clamp_min(1e-6).log().abs())
    return torch.where(det > 0, conf, torch.zeros_like(conf))


def _to_full(coarse: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Upsample [B, C, gh, gw] node values (nodes at 0..width) to pixel centres [B, C, H, W]."""
    dev, dt = coarse.device, coarse.dtype
    # pixel centre x + 0.5 in node units, as grid_sample coordinates (align_corners=True)
    xs = (torch.arange(width, dtype=dt, device=dev) + 0.5) / width * 2.0 - 1.0
    ys = (torch.arange(height, dtype=dt, device=dev) + 0.5) / height * 2.0 - 1.0
    grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], -1)[None]
    grid = grid.expand(coarse.shape[0], -1, -1, -1)
    return F.grid_sample(coarse, grid, mode="bilinear", align_corners=True)


Points = np.ndarray | torch.Tensor


def motion_inbetweens(
    prev_images: np.ndarray | torch.Tensor,
    next_images: np.ndarray | torch.Tensor,
    prev_kp: Points,
    next_kp: Points,
    kp: Points,
    w: np.ndarray | torch.Tensor,
    step: int = GRID_STEP,
) -> np.ndarray | torch.Tensor:
    """A batch of in-betweens at weights ``w`` [B] (0: the previous keyframe, 1: the next).

    Images [B, H, W, 3] uint8 (numpy, or torch on any device: the result is of the same
    kind); keypoints [B, K, 2] (x, y) pixels (numpy, or torch anywhere) of the previous
    keyframes, the next ones and the in-betweens themselves. Everything runs where the
    images are, one call for the whole batch, without a host sync on a device (the splines
    in float64).
    """
    as_numpy = isinstance(prev_images, np.ndarray)
    a = torch.from_numpy(prev_images) if as_numpy else prev_images
    b = torch.from_numpy(next_images) if as_numpy else next_images
    count, height, width = a.shape[:3]
    dev = a.device

    def points(x: Points) -> torch.Tensor:
        t = torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray | list) else x
        return t.to(dev, torch.float64, non_blocking=True)

    dst = points(kp)
    src = torch.stack([points(prev_kp), points(next_kp)], 1)
    maps = coarse_map(dst, src, height, width, step)  # [B, 2, 2, gh, gw]
    confs = _confidence(maps, height, width)  # [B, 2, gh, gw]
    coarse = torch.cat([maps.flatten(1, 2), confs], 1).float()  # [B, 6, gh, gw]
    full = _to_full(coarse, height, width)  # [B, 6, H, W]
    # backward maps -> grid_sample's normalised coordinates (pixel centres, align_corners=False)
    norm = _grid(height, width, step, dev)[3]
    grids = full[:, :4].unflatten(1, (2, 2)) * norm - 1.0  # [B, 2 (prev, next), 2, H, W]
    images = torch.stack([a, b], 1).flatten(0, 1).permute(0, 3, 1, 2).float()  # [2B, 3, H, W]
    warped = F.grid_sample(
        images,
        grids.flatten(0, 1).permute(0, 2, 3, 1),
        mode=INTERPOLATION,
        padding_mode="border",
        align_corners=False,
    ).unflatten(0, (count, 2))  # [B, 2, 3, H, W]
    inside = (grids.abs() <= 1.0).all(dim=2).float()  # [B, 2, H, W]
    wt = torch.as_tensor(w).to(dev, torch.float32, non_blocking=True).reshape(count)
    dist = torch.stack([1.0 - wt, wt], 1)[:, :, None, None]  # [B, 2, 1, 1]
    # distance times confidence; falls back to the distance blend where both are unsure
    weight = dist * full[:, 4:] * inside + 1e-6 + dist * 1e-4
    out = (warped * weight[:, :, None]).sum(1) / weight.sum(1)[:, None]
    out = out.add_(0.5).clamp_(0.0, 255.0).to(torch.uint8).permute(0, 2, 3, 1)
    return out.numpy() if as_numpy else out


def motion_inbetween(
    prev_image: np.ndarray | torch.Tensor,
    next_image: np.ndarray | torch.Tensor,
    prev_kp: np.ndarray,
    next_kp: np.ndarray,
    kp: np.ndarray,
    w: float,
    step: int = GRID_STEP,
) -> np.ndarray | torch.Tensor:
    """One in-between at weight ``w``: :func:`motion_inbetweens` of a batch of one (images
    [H, W, 3], keypoints [K, 2])."""
    return motion_inbetweens(
        prev_image[None], next_image[None], prev_kp[None], next_kp[None], kp[None], [w], step
    )[0]
