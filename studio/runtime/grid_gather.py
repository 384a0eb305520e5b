"""3-D grid sampling written as gathers, so that AOTInductor can package the warp network.

AOTInductor has no C shim for ``grid_sampler_3d`` (the warp network samples its feature volume
with it): a package holding it runs the operator through its proxy executor, and such packages
crashed the process that loaded them (:mod:`studio.runtime.aot_cache`). Trilinear sampling is
index arithmetic and eight gathers, plain ATen that Inductor compiles into kernels of its own.
:class:`GatheredGridSample` puts :func:`grid_sample_3d` in place of ``F.grid_sample`` on 5-D
inputs while a network is exported; eager runs and ``torch.compile`` keep the native kernel.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["GatheredGridSample", "grid_sample_3d"]

def grid_sample_3d(volume: Tensor, grid: Tensor) -> Tensor:
    """``F.grid_sample(volume, grid, "bilinear", "zeros", align_corners=False)`` for a volume
    [N, C, D, H, W] and a grid [N, Do, Ho, Wo, 3] of (x, y, z) in [-1, 1], computed in the
    volume's and grid's promoted dtype: the eight corners' values gathered and weighted, a corner
    outside the volume counting zero."""
    n, c, d, h, w = volume.shape
    dtype = torch.promote_types(volume.dtype, grid.dtype)
    volume, grid = volume.to(dtype), grid.to(dtype)
    extent = torch.tensor([w, h, d], dtype=dtype, device=grid.device)
    pos = ((grid + 1) * extent - 1) / 2  # voxel coordinates (align_corners=False)
    base = pos.floor()
    frac = pos - base
    base = base.to(torch.int64)
    flat = volume.reshape(n, c, d * h * w)
    points = grid.shape[1] * grid.shape[2] * grid.shape[3]
    out = None
    for corner in itertools.product((0, 1), repeat=3):
        offset = torch.tensor(corner, dtype=torch.int64, device=grid.device)
        idx = base + offset
        x, y, z = idx.unbind(-1)
        inside = (x >= 0) & (x < w) & (y >= 0) & (y < h) & (z >= 0) & (z < d)
        share = torch.where(offset.bool(), frac, 1 - frac).prod(-1) * inside
        at = (z.clamp(0, d - 1) * h + y.clamp(0, h - 1)) * w + x.clamp(0, w - 1)
        taken = flat.gather(2, at.reshape(n, 1, points).expand(n, c, points))
        term = taken * share.reshape(n, 1, points)
        out = term if out is None else out + term
    return out.reshape(n, c, *grid.shape[1:4])


_PARAMETERS = ("input", "grid", "mode", "padding_mode", "align_corners")


def _sampled_here(given: dict[str, Any]) -> bool:
    """Whether a ``F.grid_sample`` call (its arguments by name) is one :func:`grid_sample_3d`
    computes."""
    volume = given.get("input")
    return (
        isinstance(volume, Tensor)
        and volume.dim() == 5
        and given.get("mode", "bilinear") == "bilinear"
        and given.get("padding_mode", "zeros") == "zeros"
        and given.get("align_corners") is False
    )


class GatheredGridSample(TorchFunctionMode):
    """While active, 5-D bilinear zero-padded ``F.grid_sample`` calls (align_corners False)
    run as :func:`grid_sample_3d`; under autocast in fp32, as autocast runs grid sampling."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        given = dict(zip(_PARAMETERS, args, strict=False)) | kwargs
        if func is F.grid_sample and _sampled_here(given):
            volume, grid = given["input"], given["grid"]
            if torch.is_autocast_enabled(volume.device.type):
                volume, grid = volume.float(), grid.float()
            with torch.autocast(volume.device.type, enabled=False):
                return grid_sample_3d(volume, grid)
        return func(*args, **kwargs)
