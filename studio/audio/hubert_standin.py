"""A tiny ONNX stand-in for ``hubert_streaming_fix_kv.onnx`` (tests and benchmarks).

Same interface as the released model: input ``input_values`` [1, N] float32 (N dynamic),
output ``encoding_out`` [T_h, 1024] with no batch axis, T_h = floor((N - 400) / 320) + 1
(the standard HuBERT conv front end: 400-sample receptive field, 320-sample hop).

The values encode where each frame looked: ``encoding_out[t, d]`` is the mean of
``input_values[0, 320 t : 320 t + 400]`` times ``1 - d / 1024``. Dim 0 carries the mean
exactly, so feeding the sample index as audio tells which samples a feature came from,
and an impulse shows up in exactly the frames whose window holds it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from studio.motion.layout import HUBERT_DIM, HUBERT_HOP, HUBERT_RECEPTIVE_FIELD

STANDIN_OPSET = 17
STANDIN_IR_VERSION = 8  # old enough for every onnxruntime this project supports


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
