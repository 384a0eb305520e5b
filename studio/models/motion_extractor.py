"""Motion extractor M: a ConvNeXt-V2 that reads pose, expression and keypoints off a face crop.

The module reproduces the released ``motion_extractor.pth`` layout exactly (212 keys, all under
``detector.``), so the file loads with ``load_state_dict(strict=True)``. The forward returns the
seven heads as a plain tuple in the order the released ONNX/TensorRT graph uses::

    pitch [B,66], yaw [B,66], roll [B,66], t [B,3], exp [B,63], scale [B,1], kp [B,63]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from studio.layout import KP_DIMS, NUM_BINS, NUM_KP

INPUT_NAMES = ("image",)
OUTPUT_NAMES = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")

# (pitch, yaw, roll, t, exp, scale, kp), in OUTPUT_NAMES order.
MotionOutputs = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]

# A narrow variant with the same key pattern (one block per stage), for fast tests and exports.
REDUCED_KWARGS: dict = {"depths": (1, 1, 1, 1), "dims": (8, 16, 32, 64), "image_size": 64}

_LN_EPS = 1e-6
_GRN_EPS = 1e-6


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over dim 1 of an NCHW tensor (biased variance), as in the ConvNeXt stem."""

    def __init__(self, channels: int, eps: float = _LN_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class GlobalResponseNorm(nn.Module):
    """ConvNeXt-V2 GRN on NHWC: scale each channel by its spatial L2 norm over the channel mean."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, channels))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, channels))

    def forward(self, x: Tensor) -> Tensor:
        g = torch.linalg.vector_norm(x, ord=2, dim=(1, 2), keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + _GRN_EPS)
        return self.gamma * (x * n) + self.beta + x


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, LayerNorm, 4x MLP with GELU and GRN, residual (no drop path)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=_LN_EPS)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.grn = GlobalResponseNorm(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(self.grn(self.act(self.pwconv1(self.norm(y)))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtV2Detector(nn.Module):
    """The backbone plus the seven linear heads (the module under the ``detector.`` prefix)."""

    def __init__(
        self,
        num_kp: int,
        num_bins: int,
        depths: Sequence[int],
        dims: Sequence[int],
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        if len(depths) != 4 or len(dims) != 4:
            raise ValueError("ConvNeXt-V2 needs four stages: depths and dims of length 4")
        self.downsample_layers = nn.ModuleList(
            [
                nn.Sequential(
                    nn.Conv2d(in_channels, dims[0], kernel_size=4, stride=4),
                    ChannelsFirstLayerNorm(dims[0]),
                )
            ]
        )
        for i in range(3):
            self.downsample_layers.append(
                nn.Sequential(
                    ChannelsFirstLayerNorm(dims[i]),
                    nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2),
                )
            )
        self.stages = nn.ModuleList(
            [nn.Sequential(*[ConvNeXtBlock(dims[i]) for _ in range(depths[i])]) for i in range(4)]
        )
        width = dims[-1]
        self.norm = nn.LayerNorm(width, eps=_LN_EPS)
        # Registration order is the checkpoint's key order.
        self.fc_kp = nn.Linear(width, KP_DIMS * num_kp)
        self.fc_scale = nn.Linear(width, 1)
        self.fc_pitch = nn.Linear(width, num_bins)
        self.fc_yaw = nn.Linear(width, num_bins)
        self.fc_roll = nn.Linear(width, num_bins)
        self.fc_t = nn.Linear(width, 3)
        self.fc_exp = nn.Linear(width, KP_DIMS * num_kp)

    def forward(self, x: Tensor) -> MotionOutputs:
        for down, stage in zip(self.downsample_layers, self.stages, strict=True):
            x = stage(down(x))
        f = self.norm(x.mean(dim=(-2, -1)))
        return (
            self.fc_pitch(f),
            self.fc_yaw(f),
            self.fc_roll(f),
            self.fc_t(f),
            self.fc_exp(f),
            self.fc_scale(f),
            self.fc_kp(f),
        )


class MotionExtractor(nn.Module):
    """Ditto/LivePortrait motion extractor: image [B,3,H,W] in 0..1 -> 7 head outputs.

    ``image_size`` only sets the static shape of :meth:`example_inputs` (256 for the release).
    """

    INPUT_NAMES = INPUT_NAMES
    OUTPUT_NAMES = OUTPUT_NAMES

    def __init__(
        self,
        num_kp: int = NUM_KP,
        num_bins: int = NUM_BINS,
        depths: Sequence[int] = (3, 3, 9, 3),
        dims: Sequence[int] = (96, 192, 384, 768),
        image_size: int = 256,
    ) -> None:
        super().__init__()
        self.num_kp = num_kp
        self.num_bins = num_bins
        self.image_size = image_size
        self.detector = ConvNeXtV2Detector(num_kp, num_bins, tuple(depths), tuple(dims))

    def forward(self, image: Tensor) -> MotionOutputs:
        """Return (pitch, yaw, roll, t, exp, scale, kp); exp and kp are flat [B, 3*num_kp]."""
        return self.detector(image)

    def example_inputs(self, batch: int = 1) -> tuple[Tensor]:
        """Deterministic inputs with the static ONNX shapes (``image`` [batch,3,256,256])."""
        g = torch.Generator().manual_seed(0)
        return (torch.rand(batch, 3, self.image_size, self.image_size, generator=g),)
