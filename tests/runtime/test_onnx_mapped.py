"""Reading an ONNX file's graph with its weights left in the file (studio.runtime.onnx_mapped)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from studio.errors import InputError
from studio.runtime.onnx_mapped import Initializers, read_mapped
from studio.runtime.onnx_torch import OnnxTorchGraph, read_onnx


def _model(path: Path, bf16: bool = True) -> dict[str, np.ndarray]:
    """A small Add/MatMul graph whose initializers cover the kinds of storage; their values.
    (The torch planner takes no bfloat16 initializer: ``bf16`` False leaves it out.)"""
    rng = np.random.default_rng(0)
    values = {
        "w": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float16),
        "idx": np.array([2, 0, 1], np.int64),
        "flag": np.array([True, False]),
        "empty": np.zeros((0, 4), np.float32),
    }
    inits = [numpy_helper.from_array(v, k) for k, v in values.items()]
    # one stored in float_data (not raw_data), one bfloat16
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [2], [1.5, -2.0]))
    values["typed"] = np.array([1.5, -2.0], np.float32)
    if bf16:
        bits = np.array([0x3F80, 0x4040], np.uint16).tobytes()  # 1.0 and 3.0
        tensor = helper.make_tensor("bf", TensorProto.BFLOAT16, [2], bits, raw=True)
        inits.append(tensor)
        values["bf"] = numpy_helper.to_array(tensor)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Cast", ["b"], ["b32"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["xw", "b32"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string = "made for a test"
    onnx.save(model, str(path))
    return values


def test_the_weights_stay_in_the_file_and_read_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    values = _model(path)
    mapped = read_mapped(path)
    loaded = onnx.load(str(path))
    assert mapped.doc_string == loaded.doc_string
    assert mapped.graph.node == loaded.graph.node
    assert mapped.graph.input == loaded.graph.input
    by_name = {t.name: t for t in mapped.graph.initializer}
    reader = Initializers(tmp_path)
    assert [t.name for t in mapped.graph.initializer] == [t.name for t in loaded.graph.initializer]
    for name, want in values.items():
        got = reader.array(by_name[name])
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got, want), name
        got[...] = 0  # writable, and copy-on-write: the file keeps its bytes
    external = [t.name for t in mapped.graph.initializer if t.data_location == t.EXTERNAL]
    assert set(external) == {"w", "b", "idx", "flag", "empty", "bf"}
    # ONNX's own external-data loader finds the same bytes: the file is its own data file
    onnx.external_data_helper.load_external_data_for_model(mapped, str(tmp_path))
    assert [numpy_helper.to_array(t).tolist() for t in mapped.graph.initializer] == [
        numpy_helper.to_array(t).tolist() for t in loaded.graph.initializer
    ]


def test_a_graph_planned_from_the_mapped_file_computes_what_the_parsed_one_does(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.onnx"
    _model(path, bf16=False)
    x = torch.randn(2, 3)
    mapped = OnnxTorchGraph(read_onnx(path), {"x": (2, 3)}, "cpu", str(path))
    parsed = OnnxTorchGraph(onnx.load(str(path)), {"x": (2, 3)}, "cpu", str(path))
    assert torch.equal(mapped(x)[0], parsed(x)[0])


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_truncated_or_foreign_file_is_still_one_clear_error(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "m.onnx"
    _model(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(InputError, match="could not be read as an ONNX model"):
        read_onnx(path)
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="could not be read as an ONNX model"):
        read_onnx(path)
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_mapped(path)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_file_is_mapped_once_for_all_its_weights_and_copies_leave_it_alone(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal(7 + i).astype(np.float32), f"w{i}")
        for i in range(40)
    ]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=inits,
    )
    path = tmp_path / "many.onnx"
    onnx.save(helper.make_model(graph), str(path))
    model = read_mapped(path)
    before = _fds()
    mapped = Initializers(tmp_path)
    views = [mapped.array(t) for t in model.graph.initializer]
    assert _fds() - before <= 1  # one mapping of the file, not one per weight
    copies = [Initializers(tmp_path, mapped=False).array(t) for t in model.graph.initializer]
    for got, want in zip(copies, inits, strict=True):
        assert np.array_equal(got, numpy_helper.to_array(want))
    with open(path, "r+b") as f:  # the file rewritten in place under its readers
        f.write(b"\0" * path.stat().st_size)
    for got, want in zip(copies, inits, strict=True):
        assert np.array_equal(got, numpy_helper.to_array(want))  # copies keep their values
    del views


def test_weights_outside_a_model_without_its_file_are_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    _model(path, bf16=False)
    with pytest.raises(InputError, match="outside the model: give the model's file"):
        OnnxTorchGraph(read_onnx(path), {"x": (2, 3)}, "cpu")  # no source: no folder


def test_weights_at_offsets_their_dtype_does_not_divide_stay_mapped_and_compute(
    tmp_path: Path,
) -> None:
    """A GPU-bound weight is moved once, from the file: one at an odd offset is not copied on
    the host first (torch takes an unaligned view), and torch computes the same with it."""
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal(3 + i).astype(np.float32) for i in range(12)]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph), str(path))
    model = read_mapped(path)
    values = Initializers(tmp_path)
    views = [values.array(t) for t in model.graph.initializer]
    assert not all(v.flags.aligned for v in views)  # the case this test is about
    whole = values._file(path.name)
    for view, want in zip(views, weights, strict=True):
        assert np.shares_memory(view, whole)  # a view of the mapped file, aligned or not
        got = torch.from_numpy(view)
        assert torch.equal(got * 2 + 1, torch.from_numpy(want) * 2 + 1)
