"""Appearance extractor F: source crop [B, 3, 256, 256] -> 3-D feature volume f_s.

Checkpoint-compatible with Ditto's ``appearance_extractor.pth`` (LivePortrait's
AppearanceFeatureExtractor): a flat state dict of 107 keys that loads with ``strict=True``.
The feature volume is computed once per avatar and fed to the warping network every frame.
"""

from __future__ import annotations

import torch
from torch import nn

from studio.models.blocks import DownBlock2d, ResBlock3d, SameBlock2d, check_reshape

IMAGE_SIZE = 256  # the crop side the pipeline feeds (Ditto's ONNX input is static)

INPUT_NAMES = ("image",)
OUTPUT_NAMES = ("pred",)

# A narrow variant with the same 107 keys, for tests and quick exports: 256 input and 64x64
# maps as in the full net; f_s is [B, 8, 4, 64, 64] instead of [B, 32, 16, 64, 64].
REDUCED_KWARGS: dict[str, int] = {
    "image_channel": 3,
    "block_expansion": 8,
    "num_down_blocks": 2,
    "max_features": 32,
    "reshape_channel": 8,
    "reshape_depth": 4,
    "num_resblocks": 6,
}


class AppearanceExtractor(nn.Module):
    """RGB image in 0..1 -> f_s [B, reshape_channel, reshape_depth, H/4, W/4].

    SameBlock2d, ``num_down_blocks`` DownBlock2d, a 1x1 conv to ``max_features`` channels, a view
    as a (channel, depth) volume, then ``num_resblocks`` pre-activation ResBlock3d.
    """

    def __init__(
        self,
        image_channel: int = 3,
        block_expansion: int = 64,
        num_down_blocks: int = 2,
        max_features: int = 512,
        reshape_channel: int = 32,
        reshape_depth: int = 16,
        num_resblocks: int = 6,
    ) -> None:
        super().__init__()
        check_reshape(reshape_channel, reshape_depth, max_features)
        self.image_channel = image_channel
        self.num_down_blocks = num_down_blocks
        self.reshape_channel = reshape_channel
        self.reshape_depth = reshape_depth

        self.first = SameBlock2d(image_channel, block_expansion, kernel_size=3, padding=1)
        blocks = []
        out_features = block_expansion
        for i in range(num_down_blocks):
            in_features = min(max_features, block_expansion * (2**i))
            out_features = min(max_features, block_expansion * (2 ** (i + 1)))
            blocks.append(DownBlock2d(in_features, out_features, kernel_size=3, padding=1))
        self.down_blocks = nn.ModuleList(blocks)
        self.second = nn.Conv2d(out_features, max_features, kernel_size=1, stride=1)
        self.resblocks_3d = nn.Sequential()
        for i in range(num_resblocks):
            self.resblocks_3d.add_module(f"3dr{i}", ResBlock3d(reshape_channel, 3, 1))

    @property
    def feature_size(self) -> int:
        """Side of the f_s maps for the pipeline's 256x256 input (64 for the released net)."""
        return IMAGE_SIZE // (2**self.num_down_blocks)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        out = self.first(image)
        for block in self.down_blocks:
            out = block(out)
        out = self.second(out)
        b, _, h, w = out.shape
        f_s = out.view(b, self.reshape_channel, self.reshape_depth, h, w)
        return self.resblocks_3d(f_s)

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor]:
        """The static-shape ONNX inputs (seeded random RGB crops) on the module's device."""
        g = torch.Generator().manual_seed(0)
        image = torch.rand(batch, self.image_channel, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        return (image.to(self.second.weight.device),)
