"""ONNX stand-ins for ``hubert_streaming_fix_kv.onnx`` (tests and benchmarks).

Same interface as the released model: input ``input_values`` [1, N] float32 (N dynamic),
output ``encoding_out`` [T_h, 1024] with no batch axis, T_h = floor((N - 400) / 320) + 1
(the standard HuBERT conv front end: 400-sample receptive field, 320-sample hop).

The values encode where each frame looked: ``encoding_out[t, d]`` is the mean of
``input_values[0, 320 t : 320 t + 400]`` times ``1 - d / 1024``. Dim 0 carries the mean
exactly, so feeding the sample index as audio tells which samples a feature came from,
and an impulse shows up in exactly the frames whose window holds it.

:func:`build_hubert_costlike` writes the other kind: the same interface with HuBERT-large's
depth and widths and random weights, for benchmarks whose HuBERT time must be the real cost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studio.motion.layout import HUBERT_DIM, HUBERT_HOP, HUBERT_RECEPTIVE_FIELD

STANDIN_OPSET = 17
STANDIN_IR_VERSION = 8  # old enough for every onnxruntime this project supports
# HuBERT's conv front end, (kernel, stride) per layer: 400-sample receptive field, 320 hop.
CONV_LAYERS: tuple[tuple[int, int], ...] = ((10, 5), *((3, 2),) * 4, (2, 2), (2, 2))


def standin_weights(dim: int = HUBERT_DIM) -> np.ndarray:
    """The per-dim ramp ``1 - d / dim`` the stand-in multiplies each frame's mean by."""
    return (1.0 - np.arange(dim, dtype=np.float64) / dim).astype(np.float32)


def build_hubert_standin(
    path: str | os.PathLike,
    *,
    input_name: str = "input_values",
    output_name: str = "encoding_out",
    num_samples: int | None = None,
    dim: int = HUBERT_DIM,
) -> Path:
    """Write the stand-in model to ``path`` and return the path.

    ``num_samples`` fixes N (static input); the names and ``dim`` can be changed to build
    models with a wrong signature for error tests. Needs the ``onnx`` package.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n_dim: int | str = "N" if num_samples is None else int(num_samples)
    t_dim: int | str = "T_h"
    if num_samples is not None:
        t_dim = (int(num_samples) - HUBERT_RECEPTIVE_FIELD) // HUBERT_HOP + 1
    inp = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [1, n_dim])
    out = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [t_dim, dim])
    inits = [
        numpy_helper.from_array(np.array([1, 1, -1], dtype=np.int64), "shape_ncl"),
        numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "shape_t1"),
        numpy_helper.from_array(standin_weights(dim)[None, :], "ramp"),
    ]
    nodes = [
        helper.make_node("Reshape", [input_name, "shape_ncl"], ["x_ncl"]),
        helper.make_node(
            "AveragePool",
            ["x_ncl"],
            ["pooled"],
            kernel_shape=[HUBERT_RECEPTIVE_FIELD],
            strides=[HUBERT_HOP],
        ),
        helper.make_node("Reshape", ["pooled", "shape_t1"], ["mean_t1"]),
        helper.make_node("Mul", ["mean_t1", "ramp"], [output_name]),
    ]
    graph = helper.make_graph(nodes, "hubert_standin", [inp], [out], initializer=inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", STANDIN_OPSET)],
        producer_name="talkinghead-studio",
    )
    model.ir_version = STANDIN_IR_VERSION
    onnx.checker.check_model(model)
    p = Path(path)
    onnx.save(model, str(p))
    return p


# --- a cost-equivalent stand-in: HuBERT-large's shape with random weights ---------------------


@dataclass(frozen=True)
class HubertShape:
    """Depth and widths of a HuBERT encoder (defaults: HuBERT-large, whose 1024-wide output
    ``encoding_out`` matches; which layer the released export reads is not known, so every
    layer runs: an upper bound of its cost)."""

    conv_dim: int = 512
    conv_layers: tuple[tuple[int, int], ...] = CONV_LAYERS  # (kernel, stride) of the front end
    width: int = HUBERT_DIM
    layers: int = 24
    heads: int = 16
    ffn: int = 4096
    pos_kernel: int = 128
    pos_groups: int = 16

    def params(self) -> int:
        """Weights in the graph (the released HuBERT-large has about 316 M)."""
        c, d = self.conv_dim, self.width
        conv = sum(
            k * (1 if i == 0 else c) * c + 2 * c for i, (k, _) in enumerate(self.conv_layers)
        )
        proj = 2 * c + c * d + d
        pos = d * (d // self.pos_groups) * self.pos_kernel + d
        layer = 4 * (d * d + d) + 2 * d * self.ffn + self.ffn + d + 4 * d
        return conv + proj + pos + self.layers * layer + 2 * d

    def gflop(self, num_samples: int) -> float:
        """Multiply-add FLOPs (x2) of one call on ``num_samples`` samples, in GFLOP."""
        c, d, n = self.conv_dim, self.width, int(num_samples)
        flops = 0
        for i, (k, s) in enumerate(self.conv_layers):
            n = (n - k) // s + 1
            flops += 2 * n * k * (1 if i == 0 else c) * c
        t = n
        flops += 2 * t * c * d + 2 * t * d * (d // self.pos_groups) * self.pos_kernel
        flops += self.layers * (2 * t * (4 * d * d + 2 * d * self.ffn) + 4 * t * t * d)
        return flops / 1e9


HUBERT_LARGE = HubertShape()
# For smoke runs: the same graph, narrow and shallow (output width stays HUBERT_DIM).
HUBERT_SMOKE = HubertShape(conv_dim=32, layers=1, heads=4, ffn=256, pos_kernel=16, pos_groups=16)


class _Onnx:
    """A graph under construction: nodes and random initializers with unique names."""

    def __init__(self, rng: np.random.Generator) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.rng = rng
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, value: np.ndarray, base: str = "c") -> str:
        n = self.name(base)
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), n))
        return n

    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(fan_in))
        return self.const(w, "w")

    def norm_params(self, dim: int) -> tuple[str, str]:
        scale = 1.0 + 0.1 * self.rng.standard_normal(dim, dtype=np.float32)
        return self.const(scale, "ln_g"), self.const(
            0.1 * self.rng.standard_normal(dim, dtype=np.float32), "ln_b"
        )

    def op(self, kind: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or self.name(kind.lower())
        self.nodes.append(self.helper.make_node(kind, inputs, [out], **attrs))
        return out

    def layer_norm(self, x: str, dim: int) -> str:
        return self.op("LayerNormalization", [x, *self.norm_params(dim)], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        """0.5 x (1 + erf(x / sqrt 2)): the pattern ONNX Runtime fuses into one Gelu kernel."""
        e = self.op("Erf", [self.op("Mul", [x, self.const(np.float32(1 / np.sqrt(2)))])])
        one = self.op("Add", [e, self.const(np.float32(1.0))])
        return self.op("Mul", [self.op("Mul", [x, one]), self.const(np.float32(0.5))])

    def linear(self, x: str, d_in: int, d_out: int) -> str:
        y = self.op("MatMul", [x, self.weight((d_in, d_out), d_in)])
        return self.op("Add", [y, self.const(np.zeros(d_out, dtype=np.float32), "bias")])


def _attention(g: _Onnx, x: str, s: HubertShape) -> str:
    """Multi-head self-attention on [T, D] (batch 1, no mask)."""
    d, h = s.width, s.heads
    qkv = g.linear(x, d, 3 * d)
    q, k, v = (g.name(n) for n in ("q", "k", "v"))
    g.nodes.append(
        g.helper.make_node("Split", [qkv, g.const(np.array([d] * 3))], [q, k, v], axis=1)
    )
    heads = g.const(np.array([-1, h, d // h], dtype=np.int64), "shape")
    qh, kh, vh = (
        g.op("Transpose", [g.op("Reshape", [t, heads])], perm=[1, 0, 2]) for t in (q, k, v)
    )
    kt = g.op("Transpose", [kh], perm=[0, 2, 1])
    scores = g.op("Mul", [g.op("MatMul", [qh, kt]), g.const(np.float32((d // h) ** -0.5))])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), vh])
    flat = g.op("Reshape", [g.op("Transpose", [ctx], perm=[1, 0, 2]), g.const(np.array([-1, d]))])
    return g.linear(flat, d, d)


def build_hubert_costlike(
    path: str | os.PathLike, shape: HubertShape = HUBERT_LARGE, seed: int = 0
) -> Path:
    """Write a random-weight HuBERT encoder with the released interface (module docstring) and
    ``shape``'s depth and widths, so that its run time is the real network's, not a toy's.

    The graph: the 7-layer conv front end (each conv, LayerNorm, GELU; 400-sample receptive
    field, 320 hop), LayerNorm + projection to the model width, the grouped positional conv,
    then ``layers`` pre-LN transformer layers and a final LayerNorm, on [T_h, width]. The
    values mean nothing. HuBERT-large is ~1.26 GB of fp32 weights; needs ``onnx``.
    """
    import onnx
    from onnx import TensorProto, helper

    g = _Onnx(np.random.default_rng(seed))
    inp = helper.make_tensor_value_info("input_values", TensorProto.FLOAT, [1, "N"])
    out = helper.make_tensor_value_info("encoding_out", TensorProto.FLOAT, ["T_h", HUBERT_DIM])
    c, d = shape.conv_dim, shape.width
    x = g.op("Unsqueeze", ["input_values", g.const(np.array([1], dtype=np.int64))])  # [1, 1, N]
    for i, (k, stride) in enumerate(shape.conv_layers):
        c_in = 1 if i == 0 else c
        y = g.op("Conv", [x, g.weight((c, c_in, k), c_in * k)], strides=[stride])
        y = g.gelu(g.layer_norm(g.op("Transpose", [y], perm=[0, 2, 1]), c))  # [1, T, C]
        x = y if i == len(shape.conv_layers) - 1 else g.op("Transpose", [y], perm=[0, 2, 1])
    x = g.op("Squeeze", [x, g.const(np.array([0], dtype=np.int64))])  # [T, C]
    x = g.linear(g.layer_norm(x, c), c, d)  # [T, D]
    pk = shape.pos_kernel
    pos_in = g.op("Unsqueeze", [g.op("Transpose", [x], perm=[1, 0]), g.const(np.array([0]))])
    pos = g.op(
        "Conv",
        [
            pos_in,
            g.weight((d, d // shape.pos_groups, pk), d // shape.pos_groups * pk),
            g.const(np.zeros(d, dtype=np.float32), "bias"),
        ],
        group=shape.pos_groups,
        pads=[pk // 2, pk // 2],
    )  # [1, D, T + 1] for an even kernel: drop the last frame, as HuBERT does
    t_len = g.op("Shape", [x], start=0, end=1)
    pos = g.op("Slice", [pos, g.const(np.array([0])), t_len, g.const(np.array([2]))])
    pos = g.op("Transpose", [g.op("Squeeze", [pos, g.const(np.array([0]))])], perm=[1, 0])
    x = g.op("Add", [x, g.gelu(pos)])
    for _ in range(shape.layers):
        x = g.op("Add", [x, _attention(g, g.layer_norm(x, d), shape)])
        hidden = g.gelu(g.linear(g.layer_norm(x, d), d, shape.ffn))
        x = g.op("Add", [x, g.linear(hidden, shape.ffn, d)])
    x = g.layer_norm(x, d)
    if d != HUBERT_DIM:
        x = g.linear(x, d, HUBERT_DIM)
    g.op("Identity", [x], "encoding_out")
    graph = helper.make_graph(g.nodes, "hubert_costlike", [inp], [out], initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", STANDIN_OPSET)],
        producer_name="talkinghead-studio",
    )
    model.ir_version = STANDIN_IR_VERSION
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(p))
    onnx.checker.check_model(str(p))  # by path: the model may be over the in-memory limit
    return p
