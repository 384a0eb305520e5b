"""Crop geometry of avatar registration (ditto-reference.md §5.3) and image warps in torch.

Both crops of registration, the 224 px crop the 203-point landmark model sees and the final 512 px
crop the networks see, come from one rule (LivePortrait's ``crop_image``, which Ditto uses):

1. Two anchor points: the eye centre (midpoint of both eye centres) and the mouth centre, from
   the 203-point layout (eyes = means of 0, 6, 12, 18 and 24, 30, 36, 42; mouth = mean of 48
   and 66) or the 106-point layout (33, 35, 40, 39 / 87, 89, 94, 93; mouth 52 and 61).
2. ``u_y`` = unit vector eye centre -> mouth centre, ``u_x = (u_y.y, -u_y.x)``; the roll angle is
   ``arccos(u_x.x)``, negated when ``u_x.y < 0``.
3. The landmarks, rotated about their mean into the (u_x, u_y) frame, give a box; its longer
   side times ``scale`` is the crop size and its centre, mapped back, the crop centre.
4. The centre moves by ``vy_ratio * size`` along ``u_y`` (negative: towards the forehead).
   LivePortrait also has ``vx_ratio``, but its crop helper never forwards it, so Ditto always
   crops with 0; there is no such parameter here.
5. Original -> crop: ``[[s cos, s sin, tx], [-s sin, s cos, ty]]`` with ``s = dsize / size`` and
   (tx, ty) taking the centre to (dsize / 2, dsize / 2); ``M_c2o`` is its inverse (3x3).

Warps follow OpenCV's conventions (``warpAffine`` with ``INTER_LINEAR`` and a black constant
border; ``resize`` with ``INTER_LINEAR`` and ``INTER_AREA``) so that crops agree with the
reference to within interpolation rounding, but run in torch on any device and in batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "CropGeometry",
    "anchor_points",
    "area_downsample",
    "crop_geometry",
    "crop_image",
    "crop_rect",
    "invert_affine",
    "resize_bilinear",
    "scale_center_matrix",
    "to_3x3",
    "transform_points",
    "warp_affine",
]

# Anchor indices per layout: (left eye points, right eye points, mouth points).
ANCHORS = {
    203: ((0, 6, 12, 18), (24, 30, 36, 42), (48, 66)),
    106: ((33, 35, 40, 39), (87, 89, 94, 93), (52, 61)),
}


def anchor_points(pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eye centre, mouth centre) of 203- or 106-point landmarks [N, 2] (step 1)."""
    p = np.asarray(pts, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 2 or p.shape[0] not in ANCHORS:
        raise ValueError(f"landmarks must be [203, 2] or [106, 2], got {list(p.shape)}")
    left, right, mouth = ANCHORS[p.shape[0]]
    eye = (p[list(left)].mean(axis=0) + p[list(right)].mean(axis=0)) / 2
    return eye, p[list(mouth)].mean(axis=0)


def crop_rect(
    pts: np.ndarray, scale: float, vy_ratio: float, vx_ratio: float = 0.0
) -> tuple[np.ndarray, float, float]:
    """(centre [2], size, roll angle in radians) of the square crop around ``pts`` (steps 2-4);
    ``vx_ratio`` shifts it sideways by that fraction of its side (Ditto takes the ratio but
    never applies it: 0 is Ditto's crop exactly)."""
    p = np.asarray(pts, dtype=np.float64)
    eye, mouth = anchor_points(p)
    uy = mouth - eye
    length = float(np.linalg.norm(uy))
    uy = np.array([0.0, 1.0]) if length <= 1e-3 else uy / length
    ux = np.array([uy[1], -uy[0]])
    angle = math.acos(float(np.clip(ux[0], -1.0, 1.0)))
    if ux[1] < 0:
        angle = -angle
    rot = np.stack([ux, uy])  # rows: the crop's x and y axes in image coordinates
    mean = p.mean(axis=0)
    rpts = (p - mean) @ rot.T
    lo, hi = rpts.min(axis=0), rpts.max(axis=0)
    mid = (lo + hi) / 2
    size = float(max(hi - lo)) * scale
    center = mean + ux * (mid[0] + vx_ratio * size) + uy * mid[1] + uy * (vy_ratio * size)
    return center, size, angle


@dataclass(frozen=True)
class CropGeometry:
    """One crop: centre, side and roll in the original image, and both 3x3 matrices (f32)."""

    center: np.ndarray  # [2] (x, y) in original pixels
    size: float  # side of the square in original pixels
    angle: float  # roll in radians (0 without rotation)
    dsize: int  # side of the crop in pixels
    m_o2c: np.ndarray  # [3, 3] original -> crop
    m_c2o: np.ndarray  # [3, 3] crop -> original


def crop_geometry(
    pts: np.ndarray,
    dsize: int,
    scale: float,
    vy_ratio: float,
    rotate: bool = True,
    vx_ratio: float = 0.0,
) -> CropGeometry:
    """The crop of ``dsize`` px around landmarks ``pts`` (§5.3, all five steps)."""
    center, size, angle = crop_rect(pts, scale, vy_ratio, vx_ratio)
    if size <= 0:
        raise ValueError("landmarks span no area: cannot place a crop")
    s = dsize / size
    theta = angle if rotate else 0.0
    c, n = math.cos(theta), math.sin(theta)
    half = dsize / 2
    cx, cy = center
    m = np.array(
        [
            [s * c, s * n, half - s * (c * cx + n * cy)],
            [-s * n, s * c, half - s * (-n * cx + c * cy)],
            [0.0, 0.0, 1.0],
        ]
    )
    return CropGeometry(
        center=center.astype(np.float32),
        size=size,
        angle=theta,
        dsize=int(dsize),
        m_o2c=m.astype(np.float32),
        m_c2o=np.linalg.inv(m).astype(np.float32),
    )


def crop_corners(geo: CropGeometry) -> np.ndarray:
    """[4, 2] the crop square's corners in the original image (clockwise from top left)."""
    d = float(geo.dsize)
    return transform_points(np.array([[0, 0], [d, 0], [d, d], [0, d]], np.float64), geo.m_c2o)


def scale_center_matrix(center: np.ndarray, scale: float, dsize: int) -> np.ndarray:
    """Original -> crop [3, 3] f32 that scales by ``scale`` and puts ``center`` mid-crop.

    InsightFace's landmark crop (no rotation): ``[[s, 0, d/2 - s cx], [0, s, d/2 - s cy]]``.
    """
    cx, cy = (float(v) for v in center)
    half = dsize / 2
    return np.array(
        [[scale, 0.0, half - scale * cx], [0.0, scale, half - scale * cy], [0.0, 0.0, 1.0]],
        dtype=np.float32,
    )


def to_3x3(m: np.ndarray) -> np.ndarray:
    """A [2, 3] or [3, 3] affine matrix as [3, 3] float64."""
    a = np.asarray(m, dtype=np.float64)
    if a.shape == (3, 3):
        return a
    if a.shape == (2, 3):
        return np.vstack([a, [0.0, 0.0, 1.0]])
    raise ValueError(f"an affine matrix is [2, 3] or [3, 3], got {list(a.shape)}")


def invert_affine(m: np.ndarray) -> np.ndarray:
    """Inverse of an affine matrix, as [3, 3] float32."""
    return np.linalg.inv(to_3x3(m)).astype(np.float32)


def transform_points(pts: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``pts @ M[:2, :2].T + M[:2, 2]`` for points [N, 2] (float32 out)."""
    a = to_3x3(m)
    p = np.asarray(pts, dtype=np.float64)
    return (p @ a[:2, :2].T + a[:2, 2]).astype(np.float32)


# --- warps --------------------------------------------------------------------------------------


def _as_batch(images: np.ndarray | torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """[H, W, C] or [B, H, W, C] uint8/float -> float32 [B, C, H, W] on ``device``."""
    t = (
        images
        if isinstance(images, torch.Tensor)
        else torch.from_numpy(np.ascontiguousarray(images))
    )
    if device is not None:
        t = t.to(device)
    if t.ndim == 3:
        t = t[None]
    if t.ndim != 4:
        raise ValueError(f"images must be [H, W, C] or [B, H, W, C], got {list(t.shape)}")
    return t.permute(0, 3, 1, 2).to(torch.float32)


def _back(t: torch.Tensor, like: np.ndarray | torch.Tensor, batched: bool) -> np.ndarray:
    """float [B, C, H, W] -> numpy [B, H, W, C] (or [H, W, C]) in the dtype of ``like``."""
    out = t.permute(0, 2, 3, 1)
    dtype = like.dtype if isinstance(like, np.ndarray) else None
    if dtype == np.uint8 or (isinstance(like, torch.Tensor) and like.dtype == torch.uint8):
        # Half up, as OpenCV's integer paths do (e.g. INTER_AREA's (sum + 2) >> 2).
        out = torch.floor(out + 0.5).clamp(0, 255).to(torch.uint8)
    arr = out.cpu().numpy()
    return arr if batched else arr[0]


def warp_affine(
    images: np.ndarray | torch.Tensor,
    m_o2c: np.ndarray,
    dsize: int | tuple[int, int],
    device: torch.device | str | None = None,
) -> np.ndarray:
    """OpenCV-style ``warpAffine``: bilinear, black constant border, one matrix per image.

    ``images`` [H, W, C] or [B, H, W, C] (uint8 or float); ``m_o2c`` [2|3, 3] or [B, 2|3, 3]
    maps source pixel coordinates to destination ones (pixel centres at integers, as in
    OpenCV); ``dsize`` is the side or (width, height). Returns numpy in the input dtype
    (uint8 rounded), batched like the input. Reads the result back to the host.
    """
    batched = (images.ndim if hasattr(images, "ndim") else np.ndim(images)) == 4
    b = images.shape[0] if batched else 1
    h, w = images.shape[-3], images.shape[-2]
    out_w, out_h = (dsize, dsize) if isinstance(dsize, int) else (int(dsize[0]), int(dsize[1]))
    mats = np.asarray(m_o2c, dtype=np.float64)
    mats = mats[None] if mats.ndim == 2 else mats
    if mats.shape[0] == 1 and b > 1:
        mats = np.repeat(mats, b, axis=0)
    if mats.shape[0] != b:
        raise ValueError(f"{mats.shape[0]} matrices for {b} images")
    inv = np.stack([np.linalg.inv(to_3x3(m)) for m in mats])  # destination -> source
    # Only the source pixels the destination can reach are converted and sent to the device
    # (a 192 px landmark crop of a 1920 px frame reads a few percent of it).
    corners = np.array([[0, 0, 1], [out_w - 1, 0, 1], [0, out_h - 1, 1], [out_w - 1, out_h - 1, 1]])
    reach = np.einsum("bij,kj->bki", inv, corners)[..., :2].reshape(-1, 2)
    x0, y0 = (max(0, int(np.floor(v)) - 2) for v in reach.min(axis=0))
    x1, y1 = (min(n, int(np.ceil(v)) + 3) for v, n in zip(reach.max(axis=0), (w, h), strict=True))
    if x1 - x0 < 1 or y1 - y0 < 1:  # the destination sees nothing of the source
        x0, y0, x1, y1 = 0, 0, 1, 1
        images = images[..., :1, :1, :] * 0
    else:
        images = images[..., y0:y1, x0:x1, :]
    inv = np.array([[1.0, 0.0, -x0], [0.0, 1.0, -y0], [0.0, 0.0, 1.0]]) @ inv
    src = _as_batch(images, device)
    h, w = y1 - y0, x1 - x0
    # Normalised source coordinates for align_corners=False: (2 x + 1) / W - 1.
    norm = np.array([[2.0 / w, 0.0, 1.0 / w - 1.0], [0.0, 2.0 / h, 1.0 / h - 1.0], [0, 0, 1]])
    theta = (norm @ inv)[:, :2]
    theta_t = torch.from_numpy(theta).to(device=src.device, dtype=torch.float32)
    ys = torch.arange(out_h, device=src.device, dtype=torch.float32)
    xs = torch.arange(out_w, device=src.device, dtype=torch.float32)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    base = torch.stack([gx, gy, torch.ones_like(gx)], dim=-1)  # [H', W', 3] destination pixels
    grid = torch.einsum("hwk,bik->bhwi", base, theta_t)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return _back(out, images, batched)


def crop_image(
    image: np.ndarray | torch.Tensor,
    geometry: CropGeometry,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """The ``geometry.dsize`` square crop of one image (``warp_affine`` with ``m_o2c``)."""
    return warp_affine(image, geometry.m_o2c, geometry.dsize, device)


def resize_bilinear(
    image: np.ndarray | torch.Tensor,
    size_hw: tuple[int, int],
    device: torch.device | str | None = None,
) -> np.ndarray:
    """OpenCV ``resize`` with ``INTER_LINEAR`` (half-pixel centres, edge clamp, no antialias)."""
    batched = np.ndim(image) == 4 if isinstance(image, np.ndarray) else image.ndim == 4
    src = _as_batch(image, device)
    if tuple(src.shape[-2:]) == tuple(size_hw):
        out = src
    else:
        out = F.interpolate(src, size=tuple(size_hw), mode="bilinear", align_corners=False)
    return _back(out, image, batched)


def area_downsample(
    image: np.ndarray | torch.Tensor, factor: int = 2, device: torch.device | str | None = None
) -> np.ndarray:
    """OpenCV ``INTER_AREA`` for an integer factor: the mean of each factor x factor block."""
    batched = np.ndim(image) == 4 if isinstance(image, np.ndarray) else image.ndim == 4
    src = _as_batch(image, device)
    if src.shape[-1] % factor or src.shape[-2] % factor:
        raise ValueError(f"image sides {list(src.shape[-2:])} are not multiples of {factor}")
    return _back(F.avg_pool2d(src, factor), image, batched)
