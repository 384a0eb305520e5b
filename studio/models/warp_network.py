"""Warping network W: warps the source feature volume f_s from keypoints x_s to keypoints x_d.

Checkpoint-compatible with Ditto's ``warp_network.pth`` (LivePortrait's WarpingNetwork with its
DenseMotionNetwork): a flat state dict of 97 keys that loads with ``strict=True``. Ditto's
argument order is kept: ``forward(feature_3d, kp_source, kp_driving)`` (LivePortrait's is
driving first), and only the warped feature is returned.

Dense motion: 22 candidate sampling grids (the identity for the background, then one
translation per keypoint, ``grid - x_d,k + x_s,k``), each sampling a compressed copy of f_s; an
hourglass over those samples and the keypoint heatmaps predicts a softmax mask that blends the
grids into one deformation, and an occlusion map that gates the output.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from studio.layout import KP_DIMS, NUM_KP
from studio.models.blocks import (
    Hourglass,
    SameBlock2d,
    check_reshape,
    kp_to_gaussian,
    make_coordinate_grid,
)

FEATURE_SIZE = 64  # H and W of f_s for the pipeline's 256x256 crops
KP_VARIANCE = 0.01  # Gaussian heatmap variance, in normalised grid units

INPUT_NAMES = ("feature_3d", "kp_source", "kp_driving")
OUTPUT_NAMES = ("out",)

# A narrow variant with the same 97 keys, for tests and quick exports. Maps stay 64x64 (the
# 5-block hourglass needs H, W divisible by 32); feature_3d is [B, 8, 4, 64, 64] (what the
# reduced appearance extractor emits) and the output is [B, 32, 64, 64] instead of
# [B, 256, 64, 64]. dense_compress 1 makes the hourglass input 22 * 2 = 44 channels.
REDUCED_KWARGS: dict[str, int | bool] = {
    "num_kp": NUM_KP,
    "block_expansion": 8,
    "max_features": 32,
    "num_down_blocks": 2,
    "reshape_channel": 8,
    "reshape_depth": 4,
    "estimate_occlusion_map": True,
    "dense_block_expansion": 4,
    "dense_max_features": 16,
    "dense_num_blocks": 5,
    "dense_compress": 1,
}


class DenseMotion(NamedTuple):
    """Dense motion prediction for a batch."""

    deformation: torch.Tensor  # [B, d, h, w, 3] sampling grid, (x, y, z)
    occlusion_map: torch.Tensor | None  # [B, 1, h, w] in 0..1, None when not estimated
    mask: torch.Tensor  # [B, num_kp + 1, d, h, w] softmax weights (index 0: background)


class DenseMotionNetwork(nn.Module):
    """Predicts the deformation grid and occlusion map from f_s, x_s and x_d."""

    def __init__(
        self,
        num_kp: int = NUM_KP,
        feature_channel: int = 32,
        reshape_depth: int = 16,
        block_expansion: int = 32,
        max_features: int = 1024,
        num_blocks: int = 5,
        compress: int = 4,
        estimate_occlusion_map: bool = True,
    ) -> None:
        super().__init__()
        self.num_kp = num_kp
        # Registration order fixes the state-dict order: hourglass, mask, compress, norm, occlusion.
        self.hourglass = Hourglass(
            block_expansion=block_expansion,
            in_features=(num_kp + 1) * (compress + 1),
            num_blocks=num_blocks,
            max_features=max_features,
        )
        out_filters = self.hourglass.out_filters
        self.mask = nn.Conv3d(out_filters, num_kp + 1, kernel_size=7, padding=3)
        self.compress = nn.Conv3d(feature_channel, compress, kernel_size=1)
        self.norm = nn.BatchNorm3d(compress, affine=True)
        self.occlusion = (
            nn.Conv2d(out_filters * reshape_depth, 1, kernel_size=7, padding=3)
            if estimate_occlusion_map
            else None
        )

    def sparse_motions(
        self, shape: tuple[int, int, int], kp_source: torch.Tensor, kp_driving: torch.Tensor
    ) -> torch.Tensor:
        """The num_kp + 1 candidate grids [B, K+1, d, h, w, 3]: identity, then grid - x_d + x_s."""
        b, k = kp_source.shape[0], self.num_kp
        d, h, w = shape
        identity = make_coordinate_grid(shape, kp_source).view(1, 1, d, h, w, 3)
        per_kp = identity - kp_driving.view(b, k, 1, 1, 1, 3) + kp_source.view(b, k, 1, 1, 1, 3)
        return torch.cat([identity.expand(b, 1, d, h, w, 3), per_kp], dim=1)

    def forward(
        self, feature: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor
    ) -> DenseMotion:
        feature = F.relu(self.norm(self.compress(feature)))
        b, c, d, h, w = feature.shape
        k1 = self.num_kp + 1

        motions = self.sparse_motions((d, h, w), kp_source, kp_driving)
        # Sample the compressed volume once per candidate grid (batch and grid folded together).
        repeated = feature.unsqueeze(1).expand(b, k1, c, d, h, w).reshape(b * k1, c, d, h, w)
        deformed = F.grid_sample(
            repeated,
            motions.reshape(b * k1, d, h, w, 3),
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        ).reshape(b, k1, c, d, h, w)

        heat = kp_to_gaussian(kp_driving, (d, h, w), KP_VARIANCE) - kp_to_gaussian(
            kp_source, (d, h, w), KP_VARIANCE
        )
        heat = torch.cat([torch.zeros_like(heat[:, :1]), heat], dim=1)  # background channel

        # Keypoint-major channels: [heatmap_k, deformed_k (c channels)] for k = 0..num_kp.
        net_in = torch.cat([heat.unsqueeze(2), deformed], dim=2).reshape(b, k1 * (c + 1), d, h, w)
        prediction = self.hourglass(net_in)

        mask = F.softmax(self.mask(prediction), dim=1)
        deformation = (motions * mask.unsqueeze(-1)).sum(dim=1)

        occlusion_map = None
        if self.occlusion is not None:
            flat = prediction.reshape(b, -1, h, w)  # channel-major (channel, depth) reshape
            occlusion_map = torch.sigmoid(self.occlusion(flat))
        return DenseMotion(deformation, occlusion_map, mask)


class WarpNetwork(nn.Module):
    """(f_s [B, C, D, 64, 64], x_s [B, K, 3], x_d [B, K, 3]) -> warped feature [B, 256, 64, 64].

    ``reshape_depth`` (not a Ditto argument; Ditto fixes it at 16) is the depth D of f_s, so
    ``reshape_channel * reshape_depth`` must equal ``max_features``, the channel count after the
    warped volume is flattened to 2-D. The output has ``block_expansion * 2**num_down_blocks``
    channels.
    """

    def __init__(
        self,
        num_kp: int = NUM_KP,
        block_expansion: int = 64,
        max_features: int = 512,
        num_down_blocks: int = 2,
        reshape_channel: int = 32,
        estimate_occlusion_map: bool = True,
        dense_block_expansion: int = 32,
        dense_max_features: int = 1024,
        dense_num_blocks: int = 5,
        dense_compress: int = 4,
        reshape_depth: int = 16,
    ) -> None:
        super().__init__()
        check_reshape(reshape_channel, reshape_depth, max_features)
        self.num_kp = num_kp
        self.reshape_channel = reshape_channel
        self.reshape_depth = reshape_depth
        out_channels = block_expansion * (2**num_down_blocks)
        self.dense_motion_network = DenseMotionNetwork(
            num_kp=num_kp,
            feature_channel=reshape_channel,
            reshape_depth=reshape_depth,
            block_expansion=dense_block_expansion,
            max_features=dense_max_features,
            num_blocks=dense_num_blocks,
            compress=dense_compress,
            estimate_occlusion_map=estimate_occlusion_map,
        )
        self.third = SameBlock2d(max_features, out_channels, kernel_size=3, padding=1, lrelu=True)
        self.fourth = nn.Conv2d(out_channels, out_channels, kernel_size=1, stride=1)

    def forward(
        self, feature_3d: torch.Tensor, kp_source: torch.Tensor, kp_driving: torch.Tensor
    ) -> torch.Tensor:
        motion = self.dense_motion_network(feature_3d, kp_source, kp_driving)
        out = F.grid_sample(
            feature_3d,
            motion.deformation,
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        )
        b, c, d, h, w = out.shape
        out = self.fourth(self.third(out.reshape(b, c * d, h, w)))
        if motion.occlusion_map is not None:
            out = out * motion.occlusion_map
        return out

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The static-shape ONNX inputs (seeded random f_s and nearby keypoint pairs), drawn on
        the weights' device: a GPU engine's f_s (67 M values at batch 32) is not drawn on the
        CPU and copied up in every new process."""
        device = self.fourth.weight.device
        g = torch.Generator(device).manual_seed(0)
        shape = (batch, self.reshape_channel, self.reshape_depth, FEATURE_SIZE, FEATURE_SIZE)
        kp_shape = (batch, self.num_kp, KP_DIMS)
        feature_3d = torch.randn(*shape, generator=g, device=device)
        kp_source = (torch.rand(*kp_shape, generator=g, device=device) * 2 - 1) * 0.6
        kp_driving = kp_source + 0.05 * torch.randn(*kp_shape, generator=g, device=device)
        return feature_3d, kp_source, kp_driving
