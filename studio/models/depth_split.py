"""A deep 3-D convolution as one 2-D convolution over depth slices: the same arithmetic.

The warp network's dense-motion mask is a 7x7x7 Conv3d (142 -> 22 channels, 11% of a frame's
FLOPs). cuDNN runs it with a generic indexed implicit-GEMM kernel: on the H200 that one kernel
took 35 ms of a 32-frame batch, 48% of the warp network, at 17% of the fp16 matrix rate
(docs/benchmarks.md, render suite profile). :class:`DepthSplitConv3d` computes the same
convolution as a 2-D one: every depth slice of the input goes through a Conv2d whose output
channels are the kernel's depth taps times the output channels (``kd * Cout``), and the taps
are summed along depth (in fp32) with the convolution's zero padding. FLOPs are the same;
the matrix shape (N = 7 x 22) suits tensor cores instead of starving them (N = 22). The
result equals the 3-D convolution's up to rounding (each tap's 2-D result is rounded to the
compute dtype before the depth sum).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

__all__ = ["MIN_DEPTH", "DepthSplitConv3d", "split_deep_conv3d"]

MIN_DEPTH = 5  # kernels at least this deep are split (the 7x7x7 mask; 3x3x3 ones run well)


class DepthSplitConv3d(nn.Module):
    """A stride-1, undilated, ungrouped Conv3d computed as Conv2d over depth slices."""

    def __init__(self, conv: nn.Conv3d) -> None:
        super().__init__()
        if conv.groups != 1 or conv.stride[0] != 1 or conv.dilation[0] != 1:
            raise ValueError("only ungrouped convolutions of depth stride and dilation 1 split")
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("only explicit zero padding splits")
        kd, kh, kw = conv.kernel_size
        self.taps, self.out_channels, self.depth_pad = kd, conv.out_channels, conv.padding[0]
        w = conv.weight
        self.conv = nn.Conv2d(
            conv.in_channels,
            kd * conv.out_channels,
            (kh, kw),
            stride=conv.stride[1:],
            padding=conv.padding[1:],
            dilation=conv.dilation[1:],
            bias=False,
        ).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():  # [Cout, Cin, kd, kh, kw] -> [kd * Cout, Cin, kh, kw], tap-major
            self.conv.weight.copy_(w.permute(2, 0, 1, 3, 4).reshape(self.conv.weight.shape))
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        b, c, d, h, w = x.shape
        pad, taps = self.depth_pad, self.taps
        depth = d + 2 * pad - taps + 1
        if depth < 1:
            raise ValueError(f"input depth {d} is shallower than the kernel ({taps}, pad {pad})")
        y = self.conv(x.transpose(1, 2).reshape(b * d, c, h, w))
        y = y.reshape(b, d, taps, self.out_channels, *y.shape[-2:])
        # out[o] = sum_k y[o + k - pad, k] over the slices that exist (the zero padding),
        # accumulated in fp32 like the 3-D convolution's own sums
        out = y.new_zeros((b, depth, self.out_channels, *y.shape[-2:]), dtype=torch.float32)
        if self.bias is not None:
            out += self.bias.float().view(1, 1, -1, 1, 1)
        for k in range(taps):
            lo, hi = max(0, pad - k), min(depth, d + pad - k)
            if lo < hi:
                out[:, lo:hi] += y[:, lo + k - pad : hi + k - pad, k]
        return out.to(y.dtype).transpose(1, 2)


def split_deep_conv3d(
    module: nn.Module, min_depth: int = MIN_DEPTH, inplace: bool = False
) -> nn.Module:
    """A deep copy of ``module`` (``inplace``: the module itself, for one that is already a
    private copy) with every splittable Conv3d at least ``min_depth`` deep replaced by a
    :class:`DepthSplitConv3d`."""
    out = module if inplace else copy.deepcopy(module)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if (
                isinstance(child, nn.Conv3d)
                and child.kernel_size[0] >= min_depth
                and child.groups == 1
                and child.stride[0] == 1
                and child.dilation[0] == 1
                and child.padding_mode == "zeros"
                and not isinstance(child.padding, str)
            ):
                setattr(parent, name, DepthSplitConv3d(child))
    return out
