"""LivePortrait building blocks shared by the appearance extractor and the warping network.

Attribute names (``conv``, ``norm``, ``conv1``, ``norm1``, ``down_blocks``, ``up_blocks`` ...) and
the order in which submodules are registered are part of the checkpoint format: they fix the
``state_dict()`` keys and their order, so the released ``.pth`` files load strictly. Pooling and
activations are functional because they carry no state.

All BatchNorms are affine with PyTorch's defaults (eps 1e-5); the loader puts the modules in
eval mode, so the running statistics are used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LEAKY_SLOPE = 0.01  # nn.LeakyReLU's default, used by the warping network's ``third`` block


def make_coordinate_grid(spatial_size: tuple[int, int, int], ref: torch.Tensor) -> torch.Tensor:
    """Identity sampling grid [d, h, w, 3] with channels (x, y, z), each ``2 * i / (n - 1) - 1``.

    x runs along the width, y along the height, z along the depth, matching
    ``F.grid_sample``'s 5-D convention. Built on ``ref``'s dtype and device.
    """
    d, h, w = spatial_size

    def axis(n: int) -> torch.Tensor:
        i = torch.arange(n, dtype=ref.dtype, device=ref.device)
        return 2 * (i / (n - 1)) - 1

    x = axis(w).view(1, 1, w, 1).expand(d, h, w, 1)
    y = axis(h).view(1, h, 1, 1).expand(d, h, w, 1)
    z = axis(d).view(d, 1, 1, 1).expand(d, h, w, 1)
    return torch.cat([x, y, z], dim=3)


def kp_to_gaussian(
    kp: torch.Tensor, spatial_size: tuple[int, int, int], variance: float
) -> torch.Tensor:
    """Unnormalised Gaussian blobs [B, K, d, h, w] centred on keypoints ``kp`` [B, K, 3].

    ``exp(-0.5 * |grid - kp|^2 / variance)`` on the identity grid of ``spatial_size``.
    """
    grid = make_coordinate_grid(spatial_size, kp)  # [d, h, w, 3]
    diff = grid[None, None] - kp[:, :, None, None, None, :]
    return torch.exp(-0.5 * (diff**2).sum(-1) / variance)


class _ConvNorm(nn.Module):
    """A conv (``conv``) and the affine BatchNorm after it (``norm``): the checkpoint's names.

    Subclasses pick the dimension through ``conv_type``/``norm_type`` and add the activation
    and resampling in ``forward``.
    """

    conv_type: type[nn.Module] = nn.Conv2d
    norm_type: type[nn.Module] = nn.BatchNorm2d

    def __init__(
        self, in_features: int, out_features: int, kernel_size: int = 3, padding: int = 1
    ) -> None:
        super().__init__()
        self.conv = self.conv_type(
            in_features, out_features, kernel_size=kernel_size, padding=padding
        )
        self.norm = self.norm_type(out_features, affine=True)


class SameBlock2d(_ConvNorm):
    """Conv2d + BatchNorm2d + ReLU (or LeakyReLU 0.01), resolution preserved."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        kernel_size: int = 3,
        padding: int = 1,
        lrelu: bool = False,
    ) -> None:
        super().__init__(in_features, out_features, kernel_size, padding)
        self.lrelu = lrelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.norm(self.conv(x))
        return F.leaky_relu(out, LEAKY_SLOPE) if self.lrelu else F.relu(out)


class DownBlock2d(_ConvNorm):
    """Conv2d + BatchNorm2d + ReLU, then 2x2 average pooling (halves H and W)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(F.relu(self.norm(self.conv(x))), kernel_size=2)


class ResBlock3d(nn.Module):
    """Pre-activation 3-D residual block: x + conv2(relu(bn2(conv1(relu(bn1(x)))))).

    Registration order conv1, conv2, norm1, norm2 matches the checkpoint's key order.
    """

    def __init__(self, features: int, kernel_size: int = 3, padding: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(features, features, kernel_size=kernel_size, padding=padding)
        self.conv2 = nn.Conv3d(features, features, kernel_size=kernel_size, padding=padding)
        self.norm1 = nn.BatchNorm3d(features, affine=True)
        self.norm2 = nn.BatchNorm3d(features, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.norm1(x)))
        out = self.conv2(F.relu(self.norm2(out)))
        return out + x


class DownBlock3d(_ConvNorm):
    """Conv3d + BatchNorm3d + ReLU, then (1, 2, 2) average pooling (depth kept)."""

    conv_type = nn.Conv3d
    norm_type = nn.BatchNorm3d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool3d(F.relu(self.norm(self.conv(x))), kernel_size=(1, 2, 2))


class UpBlock3d(_ConvNorm):
    """Nearest (1, 2, 2) upsampling, then Conv3d + BatchNorm3d + ReLU."""

    conv_type = nn.Conv3d
    norm_type = nn.BatchNorm3d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        return F.relu(self.norm(self.conv(out)))


def _hourglass_width(block_expansion: int, max_features: int, level: int) -> int:
    return min(max_features, block_expansion * (2**level))


class HourglassEncoder(nn.Module):
    """``num_blocks`` DownBlock3d; returns the input and every block's output (for the skips)."""

    def __init__(
        self, block_expansion: int, in_features: int, num_blocks: int, max_features: int
    ) -> None:
        super().__init__()
        blocks = []
        for i in range(num_blocks):
            cin = in_features if i == 0 else _hourglass_width(block_expansion, max_features, i)
            cout = _hourglass_width(block_expansion, max_features, i + 1)
            blocks.append(DownBlock3d(cin, cout))
        self.down_blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = [x]
        for block in self.down_blocks:
            outs.append(block(outs[-1]))
        return outs


class HourglassDecoder(nn.Module):
    """``num_blocks`` UpBlock3d with skip concatenation, then Conv3d + BatchNorm3d + ReLU.

    The output has ``block_expansion + in_features`` channels (the last skip is the input).
    """

    def __init__(
        self, block_expansion: int, in_features: int, num_blocks: int, max_features: int
    ) -> None:
        super().__init__()
        blocks = []
        for i in reversed(range(num_blocks)):
            mult = 1 if i == num_blocks - 1 else 2
            cin = mult * _hourglass_width(block_expansion, max_features, i + 1)
            cout = _hourglass_width(block_expansion, max_features, i)
            blocks.append(UpBlock3d(cin, cout))
        self.up_blocks = nn.ModuleList(blocks)
        self.out_filters = block_expansion + in_features
        self.conv = nn.Conv3d(self.out_filters, self.out_filters, kernel_size=3, padding=1)
        self.norm = nn.BatchNorm3d(self.out_filters, affine=True)

    def forward(self, skips: list[torch.Tensor]) -> torch.Tensor:
        out = skips[-1]
        for block, skip in zip(self.up_blocks, reversed(skips[:-1]), strict=True):
            out = torch.cat([block(out), skip], dim=1)
        return F.relu(self.norm(self.conv(out)))


class Hourglass(nn.Module):
    """3-D U-Net: H and W shrink by 2**num_blocks at the bottleneck (so must divide by it)."""

    def __init__(
        self, block_expansion: int, in_features: int, num_blocks: int = 3, max_features: int = 256
    ) -> None:
        super().__init__()
        self.encoder = HourglassEncoder(block_expansion, in_features, num_blocks, max_features)
        self.decoder = HourglassDecoder(block_expansion, in_features, num_blocks, max_features)
        self.out_filters = self.decoder.out_filters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def check_reshape(reshape_channel: int, reshape_depth: int, max_features: int) -> None:
    """The 2-D features are viewed as a [channel, depth] volume: their counts must agree."""
    if reshape_channel * reshape_depth != max_features:
        raise ValueError(
            f"reshape_channel * reshape_depth ({reshape_channel} * {reshape_depth}) "
            f"must equal max_features ({max_features})"
        )
