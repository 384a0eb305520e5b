"""Convolutions with channel counts padded to a multiple: an exact rewrite for tensor cores.

Several of the warp network's 3-D convolutions have channel counts that tensor-core kernels
handle badly: the dense-motion mask (142 -> 22 channels, 7x7x7: 11% of a frame's FLOPs), the
hourglass's last convolution (142 -> 142), its first (110 ->), and the occlusion head's 2-D
convolution (2272 -> 1). :func:`pad_conv_channels` replaces each such convolution by one whose
input and output channels are padded with zeros to a multiple of ``multiple``: the input gets
zero channels, the extra weights and biases are zero, and the extra outputs are cut off again,
so the result is the same up to the summation order. The rewritten module has other state-dict
keys: build it from a loaded network, for inference only.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TENSOR_CORE_MULTIPLE", "PaddedConv", "pad_conv_channels", "padded"]

TENSOR_CORE_MULTIPLE = 8  # channels per 16-byte load of fp16/bf16: what cuDNN's kernels want


def padded(channels: int, multiple: int) -> int:
    """``channels`` rounded up to a multiple of ``multiple``."""
    return -(-channels // multiple) * multiple


class PaddedConv(nn.Module):
    """A Conv2d/Conv3d (groups 1) run with zero-padded input and output channels."""

    def __init__(self, conv: nn.Conv2d | nn.Conv3d, multiple: int) -> None:
        super().__init__()
        if conv.groups != 1:
            raise ValueError("grouped convolutions are not padded")
        cin, cout = conv.in_channels, conv.out_channels
        pin, pout = padded(cin, multiple), padded(cout, multiple)
        self.extra_in = pin - cin
        self.out_channels = cout
        self.conv = type(conv)(
            pin,
            pout,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
        ).to(device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[:cout, :cin].copy_(conv.weight)
            if conv.bias is not None:
                self.conv.bias.zero_()
                self.conv.bias[:cout].copy_(conv.bias)
        self.conv.weight.data = self.conv.weight.data.contiguous(memory_format=_layout(conv.weight))

    def forward(self, x: Tensor) -> Tensor:
        if self.extra_in:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, self.extra_in))
        y = self.conv(x)
        return y[:, : self.out_channels] if y.shape[1] != self.out_channels else y


def _layout(weight: Tensor) -> torch.memory_format:
    """The weight's memory format (channels-last layouts are kept through the rewrite)."""
    if weight.dim() == 4 and weight.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last if not weight.is_contiguous() else torch.contiguous_format
    if weight.dim() == 5 and weight.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d if not weight.is_contiguous() else torch.contiguous_format
    return torch.contiguous_format


def pad_conv_channels(
    module: nn.Module, multiple: int = TENSOR_CORE_MULTIPLE, inplace: bool = False
) -> nn.Module:
    """A deep copy of ``module`` (``inplace``: the module itself, for one that is already a
    private copy) with every ungrouped Conv2d/Conv3d whose input or output channels are not
    a multiple of ``multiple`` replaced by a :class:`PaddedConv`."""
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    out = module if inplace else copy.deepcopy(module)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if (
                isinstance(child, (nn.Conv2d, nn.Conv3d))
                and child.groups == 1
                and (child.in_channels % multiple or child.out_channels % multiple)
            ):
                setattr(parent, name, PaddedConv(child, multiple))
    return out
