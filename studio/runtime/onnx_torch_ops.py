"""ONNX ops as torch functions, for the static-shape executor :mod:`studio.runtime.onnx_torch`.

A converter reads one node (its attributes, the static shapes of its inputs and the host
values of the inputs that must be known before running: shapes, axes, starts, pads) and
returns a torch function of the remaining tensor inputs with every static parameter baked
in, plus the indices of those inputs. The functions work on logical shapes only, so they run
unchanged under ``torch.func.vmap`` (the executor's batched call). The table covers what the
project's HuBERT stand-ins and a torch-exported HuBERT use; anything else raises
:class:`Unsupported` with the reason.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["CONVERTERS", "Node", "Unsupported", "onnx_dtype"]

Fn = Callable[..., Any]
Converter = Callable[["Node"], tuple[Fn, tuple[int, ...]]]

_DTYPES = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
    16: torch.bfloat16,
}


class Unsupported(Exception):
    """This node's op, or this use of it, has no torch mapping here (the message says why)."""


def onnx_dtype(code: int) -> torch.dtype:
    """The torch dtype of an ONNX ``TensorProto`` element type."""
    if code not in _DTYPES:
        raise Unsupported(f"element type {code} has no torch dtype here")
    return _DTYPES[code]


@dataclass(frozen=True)
class Node:
    """What a converter sees of one node: attributes, static input shapes, host values."""

    op: str
    attrs: Mapping[str, Any]
    opset: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    values: tuple[Tensor | None, ...]  # the host value of each input known before running

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] != ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def shape(self, i: int = 0) -> tuple[int, ...]:
        s = self.shapes[i]
        assert s is not None
        return s

    def host(self, i: int) -> Any:
        """Input ``i`` as Python numbers (a list, or a scalar for a 0-d tensor)."""
        v = self.values[i] if self.has(i) else None
        if v is None:
            raise Unsupported(
                f"input {i} ('{self.inputs[i] if i < len(self.inputs) else ''}') must be known "
                "before running (a constant or computed from static shapes)"
            )
        return v.tolist()

    def present(self, *indices: int) -> tuple[int, ...]:
        return tuple(i for i in indices if self.has(i))

    def wants(self, i: int) -> bool:
        return i < len(self.outputs) and self.outputs[i] != ""


CONVERTERS: dict[str, Converter] = {}


def _op(*names: str) -> Callable[[Converter], Converter]:
    def register(conv: Converter) -> Converter:
        for name in names:
            CONVERTERS[name] = conv
        return conv

    return register


def _axis(a: int, rank: int) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise Unsupported(f"axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _axes(n: Node, i: int, since: int) -> list[int] | None:
    """Axes from input ``i`` (opset >= ``since``) or the ``axes`` attribute; None if absent."""
    if n.opset >= since:
        return [int(a) for a in n.host(i)] if n.has(i) else None
    a = n.attr("axes")
    return None if a is None else [int(v) for v in a]


def _identity(x: Tensor) -> Tensor:
    return x


# --- elementwise ------------------------------------------------------------------------------


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer Div truncates


def _pow(a: Tensor, b: Tensor) -> Tensor:
    return torch.pow(a, b).to(a.dtype)  # ONNX Pow keeps the base's type


_UNARY: dict[str, Fn] = {
    "Abs": torch.abs,
    "Ceil": torch.ceil,
    "Erf": torch.erf,
    "Exp": torch.exp,
    "Floor": torch.floor,
    "Log": torch.log,
    "Neg": torch.neg,
    "Not": torch.logical_not,
    "Reciprocal": torch.reciprocal,
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "Sqrt": torch.sqrt,
    "Tanh": torch.tanh,
}
_BINARY: dict[str, Fn] = {
    "Add": torch.add,
    "And": torch.logical_and,
    "Div": _div,
    "Equal": torch.eq,
    "Greater": torch.gt,
    "GreaterOrEqual": torch.ge,
    "Less": torch.lt,
    "LessOrEqual": torch.le,
    "MatMul": torch.matmul,
    "Mul": torch.mul,
    "Or": torch.logical_or,
    "Pow": _pow,
    "Sub": torch.sub,
}
_VARIADIC: dict[str, Fn] = {"Sum": torch.add, "Max": torch.maximum, "Min": torch.minimum}


@_op(*_UNARY)
def _unary(n: Node) -> tuple[Fn, tuple[int, ...]]:
    return _UNARY[n.op], (0,)


@_op("Mod")
def _mod(n: Node) -> tuple[Fn, tuple[int, ...]]:
    return (torch.fmod if n.attr("fmod", 0) else torch.remainder), (0, 1)


@_op(*_BINARY)
def _binary(n: Node) -> tuple[Fn, tuple[int, ...]]:
    return _BINARY[n.op], (0, 1)


@_op(*_VARIADIC)
def _variadic(n: Node) -> tuple[Fn, tuple[int, ...]]:
    f = _VARIADIC[n.op]
    return (lambda *xs: functools.reduce(f, xs)), n.present(*range(len(n.inputs)))


@_op("Identity", "Dropout")
def _identity_op(n: Node) -> tuple[Fn, tuple[int, ...]]:
    if n.wants(1):
        raise Unsupported("the mask output")
    return _identity, (0,)


@_op("Gelu")
def _gelu(n: Node) -> tuple[Fn, tuple[int, ...]]:
    approximate = n.attr("approximate", "none")
    return (lambda x: F.gelu(x, approximate=approximate)), (0,)


@_op("Where")
def _where(n: Node) -> tuple[Fn, tuple[int, ...]]:
    return torch.where, (0, 1, 2)


@_op("Clip")
def _clip(n: Node) -> tuple[Fn, tuple[int, ...]]:
    if n.opset >= 11:
        lo = n.host(1) if n.has(1) else None
        hi = n.host(2) if n.has(2) else None
    else:
        lo, hi = n.attr("min"), n.attr("max")
    return (lambda x: torch.clamp(x, lo, hi)), (0,)


@_op("Cast")
def _cast(n: Node) -> tuple[Fn, tuple[int, ...]]:
    dtype = onnx_dtype(int(n.attr("to")))
    return (lambda x: x.to(dtype)), (0,)


@_op("CastLike")
def _cast_like(n: Node) -> tuple[Fn, tuple[int, ...]]:
    return (lambda x, like: x.to(like.dtype)), (0, 1)


# --- linear algebra and normalization ---------------------------------------------------------


@_op("Gemm")
def _gemm(n: Node) -> tuple[Fn, tuple[int, ...]]:
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    ta, tb = bool(n.attr("transA", 0)), bool(n.attr("transB", 0))

    def gemm(a: Tensor, b: Tensor, c: Tensor | None = None) -> Tensor:
        y = (a.t() if ta else a) @ (b.t() if tb else b)
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (c if beta == 1.0 else c * beta)
        return y

    return gemm, n.present(0, 1, 2)


@_op("Softmax", "LogSoftmax")
def _softmax(n: Node) -> tuple[Fn, tuple[int, ...]]:
    f = torch.softmax if n.op == "Softmax" else torch.log_softmax
    shape = n.shape(0)
    axis = _axis(n.attr("axis", -1 if n.opset >= 13 else 1), len(shape))
    if n.opset >= 13 or axis == len(shape) - 1:
        return (lambda x: f(x, axis)), (0,)
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))  # opset < 13: a 2-D softmax
    return (lambda x: f(x.reshape(flat), -1).reshape(shape)), (0,)


@_op("LayerNormalization")
def _layer_norm(n: Node) -> tuple[Fn, tuple[int, ...]]:
    if n.wants(1) or n.wants(2):
        raise Unsupported("the Mean and InvStdDev outputs")
    shape = n.shape(0)
    norm = tuple(shape[_axis(n.attr("axis", -1), len(shape)) :])
    eps = float(n.attr("epsilon", 1e-5))
    if n.shapes[1] == norm and (not n.has(2) or n.shapes[2] == norm):
        return (lambda x, w, b=None: F.layer_norm(x, norm, w, b, eps)), n.present(0, 1, 2)

    def layer_norm(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        y = F.layer_norm(x, norm, None, None, eps) * w
        return y if b is None else y + b

    return layer_norm, n.present(0, 1, 2)


@_op("InstanceNormalization")
def _instance_norm(n: Node) -> tuple[Fn, tuple[int, ...]]:
    channels, eps = n.shape(0)[1], float(n.attr("epsilon", 1e-5))
    return (lambda x, w, b: F.group_norm(x, channels, w, b, eps)), (0, 1, 2)


@_op("GroupNormalization")
def _group_norm(n: Node) -> tuple[Fn, tuple[int, ...]]:
    groups, eps = int(n.attr("num_groups")), float(n.attr("epsilon", 1e-5))
    if n.opset >= 21:  # scale and bias per channel
        return (lambda x, w, b: F.group_norm(x, groups, w, b, eps)), (0, 1, 2)
    rep = n.shape(0)[1] // groups  # opset 18: per group

    def group_norm(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        return F.group_norm(x, groups, w.repeat_interleave(rep), b.repeat_interleave(rep), eps)

    return group_norm, (0, 1, 2)


def _l2(x: Tensor, dim: tuple[int, ...], keepdim: bool) -> Tensor:
    return torch.linalg.vector_norm(x, 2, dim, keepdim)


def _sum_square(x: Tensor, dim: tuple[int, ...], keepdim: bool) -> Tensor:
    return torch.sum(x * x, dim, keepdim)


# op -> (torch reduction, opset from which the axes are an input)
_REDUCE: dict[str, tuple[Fn, int]] = {
    "ReduceMean": (torch.mean, 18),
    "ReduceSum": (torch.sum, 13),
    "ReduceMax": (torch.amax, 18),
    "ReduceMin": (torch.amin, 18),
    "ReduceL2": (_l2, 18),
    "ReduceSumSquare": (_sum_square, 18),
}


@_op(*_REDUCE)
def _reduce(n: Node) -> tuple[Fn, tuple[int, ...]]:
    f, since = _REDUCE[n.op]
    rank = len(n.shape(0))
    axes = _axes(n, 1, since)
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return _identity, (0,)
        axes = list(range(rank))
    dims = tuple(sorted(_axis(a, rank) for a in axes))
    keep = bool(n.attr("keepdims", 1))
    return (lambda x: f(x, dim=dims, keepdim=keep)), (0,)


# --- convolution and pooling ------------------------------------------------------------------


def _spatial_pads(
    n: Node, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(begin, end) pads per spatial dim, with ``auto_pad`` resolved on the static shape."""
    k = len(kernel)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = [int(p) for p in n.attr("pads", [0] * 2 * k)]
        return pads[:k], pads[k:]
    if auto == "VALID":
        return [0] * k, [0] * k
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto}")
    begin, end = [], []
    for size, kk, s, d in zip(n.shape(0)[2:], kernel, strides, dilations, strict=True):
        total = max((-(-size // s) - 1) * s + (kk - 1) * d + 1 - size, 0)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin, end


def _torch_pad(begin: Sequence[int], end: Sequence[int]) -> list[int]:
    """ONNX (begin, end) of the trailing dims -> F.pad's list, last dim first."""
    out: list[int] = []
    for b, e in zip(reversed(begin), reversed(end), strict=True):
        out += [b, e]
    return out


@_op("Conv")
def _conv(n: Node) -> tuple[Fn, tuple[int, ...]]:
    kernel = n.shape(1)[2:]
    k = len(kernel)
    if k not in (1, 2, 3):
        raise Unsupported(f"a {k}-D convolution")
    conv = (F.conv1d, F.conv2d, F.conv3d)[k - 1]
    strides = [int(s) for s in n.attr("strides", [1] * k)]
    dilations = [int(d) for d in n.attr("dilations", [1] * k)]
    group = int(n.attr("group", 1))
    begin, end = _spatial_pads(n, kernel, strides, dilations)
    pre = None if begin == end else _torch_pad(begin, end)
    padding = begin if pre is None else [0] * k

    def convolve(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        if pre is not None:
            x = F.pad(x, pre)
        return conv(x, w, b, strides, padding, dilations, group)

    return convolve, n.present(0, 1, 2)


@_op("AveragePool")
def _average_pool(n: Node) -> tuple[Fn, tuple[int, ...]]:
    kernel = [int(v) for v in n.attr("kernel_shape")]
    k = len(kernel)
    if k not in (1, 2, 3):
        raise Unsupported(f"a {k}-D pool")
    if any(int(d) != 1 for d in n.attr("dilations", [1] * k)):
        raise Unsupported("dilated pooling")
    strides = [int(s) for s in n.attr("strides", [1] * k)]
    begin, end = _spatial_pads(n, kernel, strides, [1] * k)
    if begin != end:
        raise Unsupported("asymmetric pads")
    pool = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[k - 1]
    ceil, include = bool(n.attr("ceil_mode", 0)), bool(n.attr("count_include_pad", 0))
    return (lambda x: pool(x, kernel, strides, begin, ceil, include)), (0,)


# --- shapes and indexing ----------------------------------------------------------------------


@_op("Constant")
def _constant(n: Node) -> tuple[Fn, tuple[int, ...]]:
    a = n.attrs
    if "value" in a:
        value = torch.from_numpy(np.array(a["value"]))
    elif "value_float" in a or "value_floats" in a:
        value = torch.tensor(a.get("value_float", a.get("value_floats")), dtype=torch.float32)
    elif "value_int" in a or "value_ints" in a:
        value = torch.tensor(a.get("value_int", a.get("value_ints")), dtype=torch.int64)
    else:
        raise Unsupported(f"a Constant given as {', '.join(a)}")
    return (lambda: value), ()


@_op("ConstantOfShape")
def _constant_of_shape(n: Node) -> tuple[Fn, tuple[int, ...]]:
    shape = [int(d) for d in n.host(0)]
    fill = n.attr("value")
    value = torch.zeros(1) if fill is None else torch.from_numpy(np.array(fill)).reshape(1)
    return (lambda: value.expand(shape).clone()), ()


@_op("Shape")
def _shape(n: Node) -> tuple[Fn, tuple[int, ...]]:
    dims = list(n.shape(0))
    start, end = n.attr("start", 0), n.attr("end", len(dims))
    value = torch.tensor(dims[slice(start, end)], dtype=torch.int64)
    return (lambda: value), ()


@_op("Size")
def _size(n: Node) -> tuple[Fn, tuple[int, ...]]:
    value = torch.tensor(math.prod(n.shape(0)), dtype=torch.int64)
    return (lambda: value), ()


@_op("Range")
def _range(n: Node) -> tuple[Fn, tuple[int, ...]]:
    start, limit, delta = n.host(0), n.host(1), n.host(2)
    dtype = n.values[0].dtype  # type: ignore[union-attr]  # host() checked it is known
    return (lambda: torch.arange(start, limit, delta, dtype=dtype)), ()


def _reshaped(shape: Sequence[int]) -> Fn:
    target = tuple(int(d) for d in shape)
    return lambda x: x.reshape(target)


@_op("Reshape")
def _reshape(n: Node) -> tuple[Fn, tuple[int, ...]]:
    target = [int(d) for d in n.host(1)]
    src = n.shape(0)
    if not n.attr("allowzero", 0):
        target = [src[i] if d == 0 else d for i, d in enumerate(target)]
    return _reshaped(target), (0,)


@_op("Flatten")
def _flatten(n: Node) -> tuple[Fn, tuple[int, ...]]:
    s = n.shape(0)
    a = _axis(n.attr("axis", 1), len(s) + 1)
    return _reshaped((math.prod(s[:a]), math.prod(s[a:]))), (0,)


@_op("Squeeze")
def _squeeze(n: Node) -> tuple[Fn, tuple[int, ...]]:
    s = n.shape(0)
    axes = _axes(n, 1, 13)
    drop = {i for i, d in enumerate(s) if d == 1} if axes is None else set()
    for a in axes or ():
        i = _axis(a, len(s))
        if s[i] != 1:
            raise Unsupported(f"squeezing axis {a} of size {s[i]}")
        drop.add(i)
    return _reshaped([d for i, d in enumerate(s) if i not in drop]), (0,)


@_op("Unsqueeze")
def _unsqueeze(n: Node) -> tuple[Fn, tuple[int, ...]]:
    out = list(n.shape(0))
    axes = _axes(n, 1, 13) or []
    for a in sorted(_axis(a, len(out) + len(axes)) for a in axes):
        out.insert(a, 1)
    return _reshaped(out), (0,)


@_op("Transpose")
def _transpose(n: Node) -> tuple[Fn, tuple[int, ...]]:
    rank = len(n.shape(0))
    perm = [int(p) for p in n.attr("perm", range(rank - 1, -1, -1))]
    return (lambda x: x.permute(perm)), (0,)


@_op("Expand")
def _expand(n: Node) -> tuple[Fn, tuple[int, ...]]:
    out = tuple(np.broadcast_shapes(n.shape(0), tuple(int(d) for d in n.host(1))))
    return (lambda x: x.expand(out)), (0,)


@_op("Tile")
def _tile(n: Node) -> tuple[Fn, tuple[int, ...]]:
    reps = [int(r) for r in n.host(1)]
    return (lambda x: x.repeat(reps)), (0,)


@_op("Concat")
def _concat(n: Node) -> tuple[Fn, tuple[int, ...]]:
    present = n.present(*range(len(n.inputs)))
    axis = _axis(n.attr("axis"), len(n.shape(present[0])))
    return (lambda *xs: torch.cat(xs, axis)), present


@_op("Split")
def _split(n: Node) -> tuple[Fn, tuple[int, ...]]:
    s = n.shape(0)
    axis = _axis(n.attr("axis", 0), len(s))
    if n.opset >= 13 and n.has(1):
        sizes = [int(v) for v in n.host(1)]
    elif n.opset < 13 and n.attr("split"):
        sizes = [int(v) for v in n.attr("split")]
    else:  # equal parts (the last one smaller for opset 18's num_outputs)
        parts = int(n.attr("num_outputs", len(n.outputs)))
        each = -(-s[axis] // parts)
        sizes = [each] * (parts - 1) + [s[axis] - each * (parts - 1)]
    return (lambda x: torch.split(x, sizes, axis)), (0,)


@_op("Slice")
def _slice(n: Node) -> tuple[Fn, tuple[int, ...]]:
    s = n.shape(0)
    if n.opset >= 10:
        starts, ends = n.host(1), n.host(2)
        axes = n.host(3) if n.has(3) else list(range(len(starts)))
        steps = n.host(4) if n.has(4) else [1] * len(starts)
    else:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes, steps = n.attr("axes", list(range(len(starts)))), [1] * len(starts)
    index: list[slice] = [slice(None)] * len(s)
    flips: list[int] = []
    for start, end, a, step in zip(starts, ends, axes, steps, strict=True):
        ax = _axis(a, len(s))
        if step == 0:
            raise Unsupported("a zero step")
        picked = range(*slice(int(start), int(end), int(step)).indices(s[ax]))
        if step > 0 or not picked:
            index[ax] = slice(picked.start, picked.stop, picked.step) if picked else slice(0, 0)
        else:  # negative step: slice the flipped axis forwards
            flips.append(ax)
            index[ax] = slice(s[ax] - 1 - picked[0], s[ax] - picked[-1], -step)
    idx = tuple(index)
    if flips:
        return (lambda x: x.flip(flips)[idx]), (0,)
    return (lambda x: x[idx]), (0,)


@_op("Gather")
def _gather(n: Node) -> tuple[Fn, tuple[int, ...]]:
    s = n.shape(0)
    axis = _axis(n.attr("axis", 0), len(s))
    size = s[axis]
    if n.values[1] is not None and n.shape(1) == ():
        i = int(n.values[1])
        i = i + size if i < 0 else i
        return (lambda x: x.select(axis, i)), (0,)
    out = (*s[:axis], *n.shape(1), *s[axis + 1 :])

    def gather(x: Tensor, idx: Tensor) -> Tensor:
        flat = torch.remainder(idx.reshape(-1), size)  # negative indices count from the end
        return x.index_select(axis, flat).reshape(out)

    return gather, (0, 1)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


@_op("Pad")
def _pad(n: Node) -> tuple[Fn, tuple[int, ...]]:
    rank = len(n.shape(0))
    mode = n.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise Unsupported(f"mode {mode}")
    if n.opset >= 11:
        pads = [int(p) for p in n.host(1)]
        value = n.host(2) if n.has(2) else 0
        axes = [int(a) for a in n.host(3)] if n.has(3) else list(range(rank))
    else:
        pads, value, axes = [int(p) for p in n.attr("pads")], n.attr("value", 0.0), range(rank)
    value = value[0] if isinstance(value, list) else value
    axes = [_axis(a, rank) for a in axes]
    begin = dict.fromkeys(range(rank), 0)
    end = dict.fromkeys(range(rank), 0)
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    padded = [a for a in range(rank) if begin[a] or end[a]]
    if not padded:
        return _identity, (0,)
    first = padded[0]
    tpad = _torch_pad([begin[a] for a in range(first, rank)], [end[a] for a in range(first, rank)])
    tmode = _PAD_MODES[mode]
    if tmode == "constant":
        return (lambda x: F.pad(x, tpad, "constant", value)), (0,)
    if rank - first > 3 or first < 1:
        raise Unsupported(f"{mode} padding of axes {padded} of a rank-{rank} tensor")
    return (lambda x: F.pad(x, tpad, tmode)), (0,)
