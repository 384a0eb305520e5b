"""Zero-padded convolution channels: the same outputs, tensor-core friendly shapes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from studio.models.channel_pad import PaddedConv, pad_conv_channels, padded
from studio.models.warp_network import REDUCED_KWARGS, WarpNetwork


def test_padded_rounds_up() -> None:
    assert [padded(c, 8) for c in (1, 8, 22, 142)] == [8, 8, 24, 144]


@pytest.mark.parametrize(
    "conv", [nn.Conv3d(142 // 4, 22, 3, padding=1), nn.Conv2d(13, 1, 7, padding=3)]
)
def test_padded_conv_equals_the_original(conv) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, conv.in_channels, *(6,) * (conv.weight.dim() - 2))
    wrapped = PaddedConv(conv, 8)
    assert wrapped.conv.in_channels % 8 == 0 and wrapped.conv.out_channels % 8 == 0
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), conv(x), rtol=1e-5, atol=1e-5)


def test_pad_conv_channels_keeps_the_warp_network_output(one_torch_thread) -> None:
    torch.manual_seed(0)
    warp = WarpNetwork(**REDUCED_KWARGS).eval()
    padded_warp = pad_conv_channels(warp, 8).eval()
    wrapped = [m for m in padded_warp.modules() if isinstance(m, PaddedConv)]
    assert wrapped, "the reduced warp network has misaligned convolutions to pad"
    assert not any(isinstance(m, PaddedConv) for m in warp.modules())  # the original is kept
    f_s, x_s, x_d = warp.example_inputs(2)
    with torch.no_grad():
        torch.testing.assert_close(
            padded_warp(f_s, x_s, x_d), warp(f_s, x_s, x_d), rtol=1e-4, atol=1e-5
        )
    mine = copy.deepcopy(warp)
    assert pad_conv_channels(mine, 8, inplace=True) is mine  # a private copy, rewritten
    assert sum(isinstance(m, PaddedConv) for m in mine.modules()) == len(wrapped)
    with pytest.raises(ValueError, match="multiple"):
        pad_conv_channels(warp, 0)
