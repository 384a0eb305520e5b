"""export_onnx / export_module / `studio export-onnx` and `studio doctor --checkpoints`.

Everything runs a real export and real ONNX Runtime sessions on a reduced-width checkpoint tree
(plus a full-size stitch network, whose I/O shapes must be exactly the released ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from studio.cli import main  # noqa: E402
from studio.errors import InputError, OptionError  # noqa: E402
from studio.fixtures.random_tree import write_checkpoint_tree  # noqa: E402
from studio.models import NETWORK_NAMES, load_network, network_spec  # noqa: E402
from studio.models.onnx_export import (  # noqa: E402
    TOLERANCE,
    export_module,
    export_onnx,
    random_inputs,
)

# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _dims(v) -> list:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param
        for d in v.type.tensor_type.shape.dim
    ]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return write_checkpoint_tree(tmp_path_factory.mktemp("ckpt"), reduced=True, seed=3)


@pytest.fixture(scope="module")
def exported(tree: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("onnx")
    return out, export_onnx(tree, out)


def test_summary_covers_all_six_with_parity(exported) -> None:
    out, summary = exported
    assert summary["ok"] is True and summary["opset"] == 20
    assert list(summary["networks"]) == list(NETWORK_NAMES)
    for name, r in summary["networks"].items():
        spec = network_spec(name)
        assert r["status"] == "exported" and r["ok"], name
        assert Path(r["path"]) == out / spec.onnx_file
        assert r["bytes"] == (out / spec.onnx_file).stat().st_size
        assert [i["name"] for i in r["inputs"]] == list(spec.input_names)
        assert [o["name"] for o in r["outputs"]] == list(spec.output_names)
        assert set(r["parity"]) == set(spec.output_names)
        assert all(0 <= v <= TOLERANCE for v in r["parity"].values()), (name, r["parity"])
        assert r["max_rel_l2"] == max(r["parity"].values())
    json.dumps(summary)  # JSON-ready


def test_files_are_single_static_opset20_graphs(exported) -> None:
    out, summary = exported
    assert sorted(p.name for p in out.iterdir()) == sorted(
        network_spec(n).onnx_file for n in NETWORK_NAMES
    )  # one self-contained file each, no external data, no temporaries left
    for name in NETWORK_NAMES:
        spec = network_spec(name)
        model = onnx.load(str(out / spec.onnx_file))
        onnx.checker.check_model(model)
        opsets = {o.domain: o.version for o in model.opset_import}
        assert opsets.get("", opsets.get("ai.onnx")) >= 20
        assert set(opsets) <= {"", "ai.onnx"}  # no custom ops (no GridSample3D plugin)
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
        assert [i.name for i in model.graph.input] == list(spec.input_names)
        assert [o.name for o in model.graph.output] == list(spec.output_names)
        record = summary["networks"][name]
        for v, described in zip(
            list(model.graph.input) + list(model.graph.output),
            record["inputs"] + record["outputs"],
            strict=True,
        ):
            dims = _dims(v)
            assert all(isinstance(d, int) and d > 0 for d in dims), (name, v.name, dims)
            assert dims == described["shape"]
            ref = next(s for s in spec.inputs + spec.outputs if s.name == v.name)
            assert dims[0] == 1 and len(dims) == len(ref.shape)  # batch 1, released rank
        if name == "lmdm":
            assert model.graph.input[3].type.tensor_type.elem_type == onnx.TensorProto.INT64
        if name == "decoder":  # spectral norm folded into plain conv weights, stored once
            assert not {"MatMul", "Div"} & {n.op_type for n in model.graph.node}
            assert record["bytes"] < 1.1 * Path(record["checkpoint"]).stat().st_size
        if name == "warp_network":
            grid = [n for n in model.graph.node if n.op_type == "GridSample"]
            assert len(grid) == 2  # the dense-motion sampler and the final warp, both 5-D


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_onnxruntime_matches_the_loaded_module(name: str, tree: Path, exported) -> None:
    out, _ = exported
    spec = network_spec(name)
    net = load_network(name, tree / "ditto_pytorch" / "models" / spec.checkpoint_file)
    session = ort.InferenceSession(str(out / spec.onnx_file), providers=["CPUExecutionProvider"])
    inputs = random_inputs(spec.input_names, net.example_inputs(1), seed=77)
    with torch.no_grad():
        want = net(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got = session.run(None, {n: t.numpy() for n, t in zip(spec.input_names, inputs, strict=True)})
    for out_name, g, w in zip(spec.output_names, got, want, strict=True):
        assert g.shape == tuple(w.shape)
        assert _rel_l2(g, w.numpy()) <= TOLERANCE, out_name


def test_full_size_stitch_has_the_released_io(tmp_path: Path) -> None:
    root = write_checkpoint_tree(tmp_path / "ckpt", networks=["stitch_network"], cfg=False)
    summary = export_onnx(root, tmp_path / "out")
    r = summary["networks"]["stitch_network"]
    spec = network_spec("stitch_network")
    assert r["ok"] and r["max_rel_l2"] <= TOLERANCE
    assert [(i["name"], i["shape"], i["dtype"]) for i in r["inputs"] + r["outputs"]] == [
        (s.name, list(s.shape), s.dtype) for s in spec.inputs + spec.outputs
    ]
    # the other five are reported missing, not errors
    assert {n: v["status"] for n, v in summary["networks"].items() if n != "stitch_network"} == {
        n: "missing" for n in NETWORK_NAMES if n != "stitch_network"
    }
    assert summary["ok"]


def test_explicit_missing_network_and_bad_options(tmp_path: Path) -> None:
    root = write_checkpoint_tree(tmp_path / "ckpt", reduced=True, networks=["stitch_network"])
    with pytest.raises(InputError, match=r"decoder\.pth.*cannot export decoder"):
        export_onnx(root, tmp_path / "out", networks=["stitch_network", "decoder"])
    with pytest.raises(InputError, match="unknown network 'hubert'"):
        export_onnx(root, tmp_path / "out", networks="hubert")
    with pytest.raises(OptionError, match="opset: must be"):
        export_onnx(root, tmp_path / "out", opset=17)
    with pytest.raises(InputError, match="does not exist"):
        export_onnx(tmp_path / "nowhere", tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written for a refused request
    summary = export_onnx(root, tmp_path / "out", networks="stitch_network")  # a string
    assert list(summary["networks"]) == ["stitch_network"]


def test_failed_verification_installs_nothing(tmp_path: Path, tree: Path) -> None:
    net = load_network("stitch_network", tree / "ditto_pytorch/models/stitch_network.pth")
    target = tmp_path / "stitch_network.onnx"
    target.write_bytes(b"previous")
    record = export_module(net, target, tolerance=-1.0)  # nothing can pass
    assert record["ok"] is False and "differs from torch" in record["error"]
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # temporaries removed
    record = export_module(net, target, verify=False)
    assert record["ok"] and record["parity"] == {} and record["max_rel_l2"] is None
    assert onnx.load(str(target)).graph.output[0].name == "out"


def test_lmdm_export_restores_batch_guidance(tmp_path: Path, tree: Path) -> None:
    net = load_network("lmdm", tree / "ditto_pytorch/models/lmdm_v0.4_hubert.pth")
    assert net.batch_guidance is True
    record = export_module(net, tmp_path / "lmdm.onnx")
    assert record["ok"]
    assert net.batch_guidance is True and not net.training


# --- CLI --------------------------------------------------------------------------------------


def test_cli_export_onnx(tree: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "onnx"
    report = tmp_path / "summary.json"
    code = main(
        [
            "export-onnx",
            "--checkpoints",
            str(tree),
            "--out",
            str(out),
            "--networks",
            "stitch_network,lmdm_v0.4_hubert",
            "--json",
            str(report),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["lmdm_v0.4_hubert.onnx", "stitch_network.onnx"]
    for expected in ("stitch_network", "pred_noise", "x_start", "1x80x265", "ok"):
        assert expected in text
    assert "within the tolerance" in text
    assert json.loads(report.read_text())["networks"]["lmdm"]["ok"] is True


def test_cli_export_onnx_errors(tree: Path, tmp_path: Path, capsys) -> None:
    for argv in (
        ["--checkpoints", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
        ["--checkpoints", str(tree), "--out", str(tmp_path / "o"), "--networks", "nope"],
        ["--checkpoints", str(tree), "--out", str(tmp_path / "o"), "--opset", "18"],
    ):
        assert main(["export-onnx", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("studio export-onnx: error: ") and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as done:
        main(["export-onnx", "--help"])
    assert done.value.code == 0
    assert "--checkpoints DIR" in capsys.readouterr().out


def test_cli_doctor_with_checkpoints(tree: Path, tmp_path: Path, capsys) -> None:
    assert main(["doctor", "--checkpoints", str(tree)]) == 0
    text = capsys.readouterr().out
    assert f"Ditto checkpoints in {tree.resolve()}" in text
    assert "present  ditto_pytorch/models/decoder.pth" in text
    assert "MISSING  ditto_pytorch/aux_models/det_10g.onnx" in text
    assert main(["doctor", "--checkpoints", str(tree), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["checkpoints"]["layouts"] == ["pytorch", "cfg"]
    assert "torch" in info  # the machine report is still there
    assert main(["doctor", "--checkpoints", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("studio doctor: error: ") and err.count("\n") == 1
