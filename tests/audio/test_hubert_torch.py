"""HuBERT's torch path: the static-shape ONNX executor against ONNX Runtime."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

from studio.audio.features import (  # noqa: E402
    HubertFeatures,
    num_feature_frames,
    online_feature_count,
)
from studio.errors import OptionError  # noqa: E402
from studio.fixtures.hubert_standin import (  # noqa: E402
    HubertShape,
    build_hubert_costlike,
    build_hubert_standin,
)
from studio.runtime.onnx_torch import OnnxTorchGraph, UnsupportedOnnxOp, read_onnx  # noqa: E402

CPU = ["CPUExecutionProvider"]
# The cost-like graph (every op of the benchmark's HuBERT-large), two narrow layers.
REDUCED = HubertShape(
    conv_dim=32, width=128, layers=2, heads=4, ffn=256, pos_kernel=16, pos_groups=16
)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def speech(seconds: float, seed: int = 0) -> np.ndarray:
    n = int(seconds * 16000)
    t = np.arange(n) / 16000
    voice = np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t))
    noise = np.random.default_rng(seed).normal(0, 0.05, n)
    return (0.2 * voice + noise).astype(np.float32)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hubert_standin(tmp_path_factory.mktemp("hubert") / "standin.onnx")


@pytest.fixture(scope="module")
def costlike(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hubert_costlike(tmp_path_factory.mktemp("hubert") / "reduced.onnx", REDUCED)


@pytest.mark.parametrize("model", ["standin", "costlike"])
def test_torch_cpu_equals_onnxruntime(model: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(model)
    ref, got = HubertFeatures(path, providers=CPU), HubertFeatures(path, device="cpu")
    assert got.providers == ["torch cpu"] and got.fallback is None
    audio = speech(1.3)
    a, b = ref.offline(audio), got.offline(audio)
    assert a.shape == b.shape == (num_feature_frames(len(audio)), 1024)
    assert rel_l2(b, a) <= 1e-4
    online_ref = np.concatenate(list(ref.online_chunks(audio)))
    online = np.concatenate(list(got.online_chunks(audio)))
    assert online.shape == online_ref.shape
    assert rel_l2(online, online_ref) <= 1e-4


@pytest.mark.parametrize("n", [0, 1, 639, 640, 6480, 16000, 23456])
def test_offline_and_online_frame_counts(standin: Path, n: int) -> None:
    ref, got = HubertFeatures(standin, providers=CPU), HubertFeatures(standin, device="cpu")
    x = np.linspace(-1, 1, n, dtype=np.float32)
    assert len(got.offline(x)) == len(ref.offline(x)) == num_feature_frames(n)
    blocks = list(got.online_chunks(x))
    assert all(b.shape == (5, 1024) for b in blocks)
    assert sum(map(len, blocks)) == online_feature_count(n)
    assert len(got.silence(3)) == 3 and not got.silence(3).any()


def test_batched_call_equals_one_chunk_at_a_time(costlike: Path) -> None:
    g = OnnxTorchGraph(read_onnx(costlike), {"input_values": (1, 6480)}, "cpu", str(costlike))
    assert g.batchable, g.batch_note
    x = torch.from_numpy(np.stack([speech(0.405, seed=s)[None] for s in range(3)]))
    with torch.no_grad():
        batched = g.batched(x)[0]
        single = torch.stack([g(x[i])[0] for i in range(3)])
        g.batchable = False  # the path for graphs vmap cannot run: item by item, stacked
        looped = g.batched(x)[0]
    assert batched.shape == looped.shape == (3, 20, 1024)
    assert rel_l2(batched.numpy(), single.numpy()) <= 1e-5
    assert torch.equal(looped, single)


class _MiniHubert(nn.Module):
    """HuBERT's building blocks in miniature, as torch.onnx.export writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0 = nn.Conv1d(1, 8, 10, 5, bias=False)
        self.norm0 = nn.GroupNorm(8, 8)
        self.conv1 = nn.Conv1d(8, 8, 3, 2, bias=False)
        self.proj = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16))
        pos = nn.Conv1d(16, 16, 8, padding=4, groups=4)
        self.pos = nn.utils.parametrizations.weight_norm(pos, dim=2)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.ffn = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm0(self.conv0(x[:, None])))
        h = self.proj(nn.functional.gelu(self.conv1(h)).transpose(1, 2))
        h = h + nn.functional.gelu(self.pos(h.transpose(1, 2))[:, :, :-1].transpose(1, 2))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return (h + self.ffn(h))[0]


def test_a_torch_exported_graph_runs_with_its_shape_subgraphs_folded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path, x = tmp_path / "mini.onnx", speech(0.2)[None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _MiniHubert().eval(),
            (torch.from_numpy(x),),
            str(path),
            input_names=["input_values"],
            output_names=["encoding_out"],
            opset_version=17,
            dynamo=False,
        )
    model = read_onnx(path)
    assert {"Shape", "Gather", "Concat"} <= {n.op_type for n in model.graph.node}
    (ref,) = ort.InferenceSession(str(path), providers=CPU).run(None, {"input_values": x})
    g = OnnxTorchGraph(model, {"input_values": x.shape}, "cpu", str(path))
    assert g.num_steps < len(model.graph.node)  # the shape arithmetic ran once, on the host
    with torch.no_grad():
        (got,) = g(torch.from_numpy(x))
    assert got.shape == ref.shape
    assert rel_l2(got.numpy(), ref) <= 1e-5


def _with_unsupported_op(standin: Path, target: Path) -> Path:
    """The stand-in with a Softsign (which ONNX Runtime runs and the executor does not) last."""
    model = onnx.load(str(standin))
    model.graph.node[-1].output[0] = "pre_softsign"
    model.graph.node.append(helper.make_node("Softsign", ["pre_softsign"], ["encoding_out"]))
    onnx.save(model, str(target))
    return target


def test_unsupported_op_names_op_and_file(standin: Path, tmp_path: Path) -> None:
    path = _with_unsupported_op(standin, tmp_path / "odd_hubert.onnx")
    with pytest.raises(UnsupportedOnnxOp, match=r"Softsign.*odd_hubert\.onnx"):
        OnnxTorchGraph(read_onnx(path), {"input_values": (1, 6480)}, "cpu", str(path))


def test_unsupported_op_falls_back_to_onnxruntime(standin: Path, tmp_path: Path) -> None:
    path = _with_unsupported_op(standin, tmp_path / "odd_hubert.onnx")
    with pytest.warns(RuntimeWarning, match="Softsign.*ONNX Runtime instead"):
        h = HubertFeatures(path, providers=CPU, device="cpu")
    assert h.providers == CPU and "Softsign" in (h.fallback or "")
    x = speech(0.5)
    np.testing.assert_array_equal(h.offline(x), HubertFeatures(path, providers=CPU).offline(x))


def test_shape_errors_and_precision_option(tmp_path: Path, standin: Path) -> None:
    with pytest.raises(OptionError, match="hubert precision.*fp16"):
        HubertFeatures(standin, device="cpu", precision="fp16")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    perm = numpy_helper.from_array(np.array([3, 2], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "g", [inp], [out], [perm]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"input 'x' is \[2, 3\], not \[4, 3\]"):
        OnnxTorchGraph(model, {"x": (4, 3)})
    g = OnnxTorchGraph(model, {"x": (2, 3)})
    assert g.output_shapes == ((3, 2),)
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(g(x)[0], x.reshape(3, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for torch")
def test_gpu_torch_equals_onnxruntime_cpu(costlike: Path) -> None:
    ref = HubertFeatures(costlike, providers=CPU)
    got = HubertFeatures(costlike, device="cuda")
    assert got.providers == [f"torch cuda:{torch.cuda.current_device()}"]
    clips = {s: speech(s, seed=int(10 * s)) for s in (2.1, 1.0)}
    want = {s: ref.offline(a) for s, a in clips.items()}
    # Eager first; a length seen again is captured, then replayed (interleaved lengths too).
    for s in (2.1, 1.0, 2.1, 2.1, 1.0, 1.0, 2.1):
        b = got.offline(clips[s])
        assert b.shape == want[s].shape
        assert rel_l2(b, want[s]) <= 1e-4  # strict fp32: hubert's precision; TF32 stays off
    assert got._torch.capture_error is None and len(got._torch._graphs) == 2
    chunk = next(iter(ref.online_chunks(clips[1.0])))
    assert rel_l2(next(iter(got.online_chunks(clips[1.0]))), chunk) <= 1e-4


def test_an_unreadable_file_on_the_torch_path_is_named(tmp_path) -> None:
    from studio.errors import InputError

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an onnx model")
    with pytest.raises(InputError, match="junk.onnx.*could not be read.*re-download"):
        HubertFeatures(junk, device="cpu")
