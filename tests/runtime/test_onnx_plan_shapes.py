"""The torch executor's plan shapes kept for later processes (PlanShapes): the same graph
planned from them, no meta kernels (and so no Dynamo import) in a new process, and files that
are damaged, foreign or cannot be written planned again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
import torch  # noqa: E402

from studio.fixtures.hubert_standin import HubertShape, build_hubert_costlike  # noqa: E402
from studio.runtime.onnx_torch import OnnxTorchGraph, read_onnx  # noqa: E402

# every op of the benchmark's HuBERT-large (LayerNormalization's meta kernel among them)
REDUCED = HubertShape(
    conv_dim=32, width=64, layers=1, heads=4, ffn=128, pos_kernel=16, pos_groups=16
)
SHAPES = {"input_values": (1, 6480)}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hubert_costlike(tmp_path_factory.mktemp("plan") / "hubert.onnx", REDUCED)


def _graph(model: Path, plans: Path | None) -> OnnxTorchGraph:
    return OnnxTorchGraph(read_onnx(model), SHAPES, "cpu", str(model), plan_cache=plans)


def test_a_graph_planned_from_kept_shapes_is_the_same_graph(model: Path, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    first = _graph(model, plans)
    assert first.planned_from == "meta tensors" and len(list(plans.glob("*.json"))) == 1
    kept = _graph(model, plans)
    assert kept.planned_from == "cache"
    assert (kept.num_steps, kept.output_shapes) == (first.num_steps, first.output_shapes)
    assert (
        (kept.batchable, kept.batch_note)
        == (first.batchable, first.batch_note)
        == (
            True,
            "one vmapped call",
        )
    )
    x = torch.randn(3, 1, 6480, generator=torch.Generator().manual_seed(0))
    assert torch.equal(kept(x[0])[0], first(x[0])[0])
    assert torch.equal(kept.batched(x)[0], first.batched(x)[0])
    assert _graph(model, None).planned_from == "meta tensors"  # no folder: nothing kept


_PLAN = """
import sys
from studio.runtime.onnx_torch import OnnxTorchGraph, read_onnx
g = OnnxTorchGraph(read_onnx(sys.argv[1]), {"input_values": (1, 6480)}, "cpu", sys.argv[1],
                   plan_cache=sys.argv[2])
print(g.planned_from, "torch._dynamo" in sys.modules, "sympy" in sys.modules)
"""


def test_a_new_process_with_kept_shapes_runs_no_meta_kernel(model: Path, tmp_path: Path) -> None:
    """LayerNorm's meta kernel is a decomposition whose first call imports Dynamo and SymPy
    (about 1 s): a process planning from kept shapes imports neither."""

    def plan() -> str:
        argv = [sys.executable, "-c", _PLAN, str(model), str(tmp_path / "plans")]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout

    assert plan().split() == ["meta", "tensors", "True", "True"]
    assert plan().split() == ["cache", "False", "False"]


def test_a_damaged_foreign_or_unwritable_plan_is_planned_again(model: Path, tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    _graph(model, plans)
    (kept,) = plans.glob("*.json")
    good = json.loads(kept.read_text())
    kept.write_text('{"key": ')  # damaged: planned again and rewritten
    assert _graph(model, plans).planned_from == "meta tensors"
    assert json.loads(kept.read_text()) == good
    foreign = {**good, "key": {**good["key"], "torch": "0.0"}}
    kept.write_text(json.dumps(foreign))  # another key under this name: not trusted
    assert _graph(model, plans).planned_from == "meta tensors"
    first = next(iter(good["values"]))
    for values in (
        {n: [s, "not_a_dtype"] for n, (s, _) in good["values"].items()},
        {**good["values"], first: [[-1, 3], "float32"]},  # parsed, but no shape
        {**good["values"], first: ["12", "float32"]},
        [],
    ):
        kept.write_text(json.dumps({**good, "values": values}))
        assert _graph(model, plans).planned_from == "meta tensors"
    kept.write_text(json.dumps({**good, "batching": "xy"}))
    assert _graph(model, plans).planned_from == "meta tensors"
    assert _graph(model, plans).planned_from == "cache"
    blocked = tmp_path / "file"
    blocked.write_text("x")  # a file where the folder would go: nothing kept, still planned
    assert _graph(model, blocked).planned_from == "meta tensors"
    assert blocked.read_text() == "x"


def test_a_changed_model_file_is_planned_again(model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "hubert.onnx"
    copy.write_bytes(model.read_bytes())
    plans = tmp_path / "plans"
    _graph(copy, plans)
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _graph(copy, plans).planned_from == "meta tensors"
    assert len(list(plans.glob("*.json"))) == 2


def test_other_planner_code_plans_again(model: Path, tmp_path: Path, monkeypatch) -> None:
    """The key holds the planner's and the converters' source: a plan kept by another version
    of them (an upgrade; a converter that now returns a tuple) is not trusted."""
    from studio.runtime import onnx_torch

    plans = tmp_path / "plans"
    _graph(model, plans)
    monkeypatch.setattr(onnx_torch, "_planner_code", lambda: "other code")
    assert _graph(model, plans).planned_from == "meta tensors"
    assert len(list(plans.glob("*.json"))) == 2


def test_a_step_whose_outputs_all_go_unused_is_planned(tmp_path: Path) -> None:
    """A Split whose outputs nothing reads is planned (and dropped) as before the kept
    shapes: it returns a tuple and names no output to record it by."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    split = numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "split")
    nodes = [
        helper.make_node("Split", ["x", "split"], ["", ""], axis=0),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [split],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    g = OnnxTorchGraph(model, {"x": (2, 3)}, "cpu")
    x = torch.randn(2, 3)
    assert g.num_steps == 1 and torch.equal(g(x)[0], torch.relu(x))
