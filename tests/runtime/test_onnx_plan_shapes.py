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
    wrong = {**good, "values": {n: [s, "not_a_dtype"] for n, (s, _) in good["values"].items()}}
    kept.write_text(json.dumps(wrong))
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
