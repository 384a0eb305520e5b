"""Deep 3-D convolutions split into a 2-D convolution over depth slices: the same outputs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from studio.models.depth_split import DepthSplitConv3d, split_deep_conv3d
from studio.models.warp_network import REDUCED_KWARGS, WarpNetwork


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv3d(6, 5, 7, padding=3),
        nn.Conv3d(4, 3, (5, 3, 3), padding=(1, 1, 1), bias=False),  # shrinks the depth
        nn.Conv3d(3, 2, (3, 5, 5), padding=(0, 2, 2), stride=(1, 2, 2)),
        nn.Conv3d(2, 3, 3, padding=(2, 1, 1), dilation=(1, 2, 2)),  # depth grows
    ],
)
def test_split_conv_equals_the_3d_convolution(conv) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, conv.in_channels, 9, 10, 11)
    split = DepthSplitConv3d(conv)
    with torch.no_grad():
        want = conv(x)
        got = split(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_input_shallower_than_the_kernel_is_refused() -> None:
    split = DepthSplitConv3d(nn.Conv3d(2, 2, 7))
    with pytest.raises(ValueError, match="shallower"):
        split(torch.randn(1, 2, 4, 8, 8))


def test_unsplittable_convolutions_are_refused() -> None:
    with pytest.raises(ValueError, match="stride"):
        DepthSplitConv3d(nn.Conv3d(2, 2, 3, stride=2))
    with pytest.raises(ValueError, match="padding"):
        DepthSplitConv3d(nn.Conv3d(2, 2, 3, padding=1, padding_mode="replicate"))


def test_warp_network_mask_is_split_and_output_kept(one_torch_thread) -> None:
    torch.manual_seed(0)
    warp = WarpNetwork(**REDUCED_KWARGS).eval()
    split = split_deep_conv3d(warp).eval()
    assert isinstance(split.dense_motion_network.mask, DepthSplitConv3d)  # the 7x7x7 one
    assert sum(isinstance(m, DepthSplitConv3d) for m in split.modules()) == 1  # 3x3x3 kept
    assert isinstance(warp.dense_motion_network.mask, nn.Conv3d)  # the original untouched
    mine = copy.deepcopy(warp)
    assert split_deep_conv3d(mine, inplace=True) is mine  # a private copy, rewritten
    assert isinstance(mine.dense_motion_network.mask, DepthSplitConv3d)
    f_s, x_s, x_d = warp.example_inputs(2)
    with torch.no_grad():
        torch.testing.assert_close(split(f_s, x_s, x_d), warp(f_s, x_s, x_d), rtol=1e-4, atol=1e-5)


def test_half_precision_split_is_as_close_as_the_3d_convolution(one_torch_thread) -> None:
    """The taps are summed in fp32: in bf16 the split stays as close to fp64 as Conv3d."""
    torch.manual_seed(0)
    conv = nn.Conv3d(24, 6, 7, padding=3)
    x = torch.randn(1, 24, 8, 12, 12)
    with torch.no_grad():
        want = conv.double()(x.double())
        half = conv.to(torch.bfloat16)
        split = DepthSplitConv3d(half)
        got, native = split(x.bfloat16()), half(x.bfloat16())
    assert got.dtype == torch.bfloat16

    def err(t):
        return float((t.double() - want).norm() / want.norm())

    assert err(got) <= 1.5 * err(native)
