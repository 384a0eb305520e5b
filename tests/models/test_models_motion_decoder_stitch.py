"""Motion extractor, SPADE decoder and stitching network: checkpoint layout, maths and export.

Full-size modules are built only for the layout checks (manifest, strict load); forward, parity
and export tests use the narrow ``REDUCED_KWARGS`` variants so the file stays fast on a CPU.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from studio.layout import NUM_BINS, NUM_KP
from studio.models import decoder as dec_mod
from studio.models import motion_extractor as me_mod
from studio.models import stitch_network as st_mod
from studio.models.decoder import Decoder, SpectralNormConv2d
from studio.models.motion_extractor import MotionExtractor
from studio.models.stitch_network import (
    StitchNetwork,
    unwrap_stitch_container,
    wrap_stitch_container,
)

# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODULES = {
    "motion_extractor": (me_mod, MotionExtractor),
    "decoder": (dec_mod, Decoder),
    "stitch_network": (st_mod, StitchNetwork),
}


def _manifest_path() -> Path | None:
    name = Path("shared") / "reference" / "ditto_state_dicts.json"
    for root in (Path(__file__).resolve().parents[3], Path("/work")):
        if (root / name).is_file():
            return root / name
    return None


@pytest.fixture(scope="module")
def manifest() -> dict:
    path = _manifest_path()
    if path is None:
        pytest.skip("shared/reference/ditto_state_dicts.json is not available")
    return json.loads(path.read_text())["networks"]


@pytest.fixture(scope="module")
def full_size() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {name: cls().eval() for name, (_, cls) in MODULES.items()}


def _reduced(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    mod, cls = MODULES[name]
    return cls(**mod.REDUCED_KWARGS).eval()


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _as_tuple(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


# --- checkpoint layout --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODULES))
def test_state_dict_matches_manifest_in_order(name, manifest, full_size):
    module = full_size[name]
    buffers = {k for k, _ in module.named_buffers()}
    ours = [
        (k, list(v.shape), str(v.dtype).removeprefix("torch."), k in buffers and "buffer")
        for k, v in module.state_dict().items()
    ]
    ref = [
        (e["key"], e["shape"], e["dtype"], e["kind"] == "buffer" and "buffer")
        for e in manifest[name]["state_dict"]
    ]
    assert ours == ref
    assert len(ours) == manifest[name]["state_dict_num_keys"]
    assert sum(p.numel() for p in module.parameters()) == manifest[name]["param_count"]


@pytest.mark.parametrize("name", list(MODULES))
def test_io_names_match_manifest(name, manifest, full_size):
    mod, cls = MODULES[name]
    onnx_io = manifest[name]["onnx"]
    assert mod.INPUT_NAMES == cls.INPUT_NAMES == tuple(i["name"] for i in onnx_io["inputs"])
    assert mod.OUTPUT_NAMES == cls.OUTPUT_NAMES == tuple(o["name"] for o in onnx_io["outputs"])
    shapes = [list(x.shape) for x in full_size[name].example_inputs()]
    assert shapes == [i["shape"] for i in onnx_io["inputs"]]


def _file_from_manifest(entries: list[dict]) -> dict[str, torch.Tensor]:
    # Stride-0 tensors keep the saved files tiny while the loader still sees the real shapes;
    # entry i is filled with the value i so that a misrouted key would be noticed.
    return {
        e["key"]: torch.tensor(float(i), dtype=getattr(torch, e["dtype"])).expand(e["shape"])
        for i, e in enumerate(entries)
    }


@pytest.mark.parametrize("name", list(MODULES))
def test_strict_load_from_released_container(name, manifest, full_size, tmp_path):
    entries = manifest[name]["state_dict"]
    flat = _file_from_manifest(entries)
    if name == "stitch_network":
        # LivePortrait's layout; the mouth/eye entries are placeholders that must be ignored.
        other = {"mlp.0.weight": torch.zeros(2, 3)}
        obj = wrap_stitch_container(flat, retarget_mouth=other, retarget_eye=other)
        assert all(k.startswith("module.") for k in obj["retarget_shoulder"])
    else:
        obj = flat
    path = tmp_path / manifest[name]["checkpoint_file"]
    torch.save(obj, path)
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    state = unwrap_stitch_container(loaded) if name == "stitch_network" else loaded

    module = copy.deepcopy(full_size[name])
    module.load_state_dict(state, strict=True)
    for i, (key, value) in enumerate(module.state_dict().items()):
        assert key == entries[i]["key"]
        assert float(value.reshape(-1)[0]) == float(value.reshape(-1)[-1]) == float(i)


def test_unwrap_stitch_container_strips_every_module_substring_and_rejects_others():
    sd = {"module.mlp.0.weight": torch.ones(1), "mlp.module.2.bias": torch.ones(1)}
    got = unwrap_stitch_container({"retarget_shoulder": sd, "retarget_eye": {}})
    assert list(got) == ["mlp.0.weight", "mlp.2.bias"]
    with pytest.raises(ValueError, match="retarget_shoulder"):
        unwrap_stitch_container({"mlp.0.weight": torch.ones(1)})
    state = StitchNetwork().state_dict()
    assert unwrap_stitch_container(wrap_stitch_container(state)).keys() == state.keys()


# --- spectral norm ------------------------------------------------------------------------------


def _torch_spectral_norm_twin(module: nn.Module) -> nn.Module:
    """A copy whose SpectralNormConv2d layers are torch.nn.utils.spectral_norm(nn.Conv2d)."""
    twin = copy.deepcopy(module)
    for parent in list(twin.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, SpectralNormConv2d):
                out_c, in_c, k, _ = child.weight_orig.shape
                conv = nn.Conv2d(in_c, out_c, k, padding=child.padding, bias=child.bias is not None)
                setattr(parent, child_name, torch.nn.utils.spectral_norm(conv))
    return twin


def test_spectral_norm_conv_equals_torch_spectral_norm_in_eval():
    torch.manual_seed(1)
    ref = torch.nn.utils.spectral_norm(nn.Conv2d(6, 5, 3, padding=1))
    ref.train()
    with torch.no_grad():
        for _ in range(3):  # power iterations give u, v a trained-like state
            ref(torch.randn(1, 6, 8, 8))
    ref.eval()
    ours = SpectralNormConv2d(6, 5, 3, padding=1)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 6, 8, 8)
    with torch.no_grad():
        expected = ref(x)
        u, v = ref.weight_u.clone(), ref.weight_v.clone()
        for _ in range(2):  # cached and uncached paths
            torch.testing.assert_close(ours(x), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours(x), expected, rtol=1e-6, atol=1e-6)  # grad-enabled path
    assert torch.equal(ref.weight_u, u) and torch.equal(ref.weight_v, v)  # eval: no iteration
    w = ours.weight_orig.detach()
    sigma = ours.weight_u @ (w.reshape(5, -1) @ ours.weight_v)
    torch.testing.assert_close(ours.compute_weight(), w / sigma)


def test_spectral_norm_cache_follows_in_place_edits_and_reloads():
    torch.manual_seed(2)
    conv = SpectralNormConv2d(4, 3, 3, padding=1, bias=False).eval()
    x = torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        first = conv(x)
        conv.weight_orig.mul_(-1.0)  # sigma flips sign too: the effective weight is unchanged
        torch.testing.assert_close(conv(x), first)
        conv.weight_u.mul_(2.0)  # sigma doubles, output halves
        torch.testing.assert_close(conv(x), first / 2)
        other = SpectralNormConv2d(4, 3, 3, padding=1, bias=False)
        conv.load_state_dict(other.state_dict())
        torch.testing.assert_close(conv(x), other(x))
        conv.double()
        assert conv(x.double()).dtype == torch.float64


def test_random_init_gives_positive_sigma_near_top_singular_value():
    conv = SpectralNormConv2d(16, 8, 3)
    w = conv.weight_orig.detach().reshape(8, -1)
    sigma = float(conv.weight_u @ (w @ conv.weight_v))
    top = float(torch.linalg.matrix_norm(w, ord=2))
    assert 0.8 * top < sigma <= top * (1 + 1e-5)


def test_decoder_equals_torch_spectral_norm_decoder_in_eval():
    ours = _reduced("decoder")
    twin = _torch_spectral_norm_twin(ours).eval()
    assert list(twin.state_dict()) == list(ours.state_dict())
    twin.load_state_dict(ours.state_dict(), strict=True)
    (x,) = ours.example_inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), twin(x), rtol=1e-5, atol=1e-6)


# --- forward behaviour ---------------------------------------------------------------------------


def test_motion_extractor_full_size_shapes(full_size):
    with torch.no_grad():
        out = full_size["motion_extractor"](*full_size["motion_extractor"].example_inputs())
    shapes = [tuple(o.shape) for o in out]
    n = NUM_KP * 3
    assert shapes == [(1, NUM_BINS)] * 3 + [(1, 3), (1, n), (1, 1), (1, n)]


def test_motion_extractor_output_order_follows_heads():
    m = _reduced("motion_extractor")
    heads = ["fc_pitch", "fc_yaw", "fc_roll", "fc_t", "fc_exp", "fc_scale", "fc_kp"]
    with torch.no_grad():
        for value, head in enumerate(heads, start=1):
            layer = getattr(m.detector, head)
            layer.weight.zero_()
            layer.bias.fill_(float(value))
        out = m(*m.example_inputs(batch=2))
    assert len(out) == len(me_mod.OUTPUT_NAMES) == 7
    sizes = {"pitch": NUM_BINS, "yaw": NUM_BINS, "roll": NUM_BINS, "t": 3, "exp": 63, "scale": 1}
    for value, (name, tensor) in enumerate(zip(me_mod.OUTPUT_NAMES, out, strict=True), start=1):
        assert tuple(tensor.shape) == (2, sizes.get(name, NUM_KP * 3)), name
        assert torch.all(tensor == value), name


def test_decoder_reduced_shape_and_range():
    d = _reduced("decoder")
    (x,) = d.example_inputs(batch=1)
    with torch.no_grad():
        y = d(x)
    s = dec_mod.REDUCED_KWARGS["feature_size"]
    assert tuple(y.shape) == (1, 3, 8 * s, 8 * s)  # 64 -> 512 at full size
    assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0


def test_stitch_applies_delta_like_the_reference():
    net = StitchNetwork().eval()
    delta = torch.arange(65, dtype=torch.float32) / 100.0
    with torch.no_grad():
        net.mlp[-1].weight.zero_()
        net.mlp[-1].bias.copy_(delta)
    kp_s, kp_d = net.example_inputs(batch=2)
    with torch.no_grad():
        out = net(kp_s, kp_d)
    expected = kp_d + delta[:63].reshape(1, NUM_KP, 3)
    expected[..., 0] += delta[63]
    expected[..., 1] += delta[64]
    assert out.shape == (2, NUM_KP, 3)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(net.delta(kp_s, kp_d), delta.expand(2, 65))


@pytest.mark.parametrize("name", list(MODULES))
def test_batch_of_two_equals_two_single_runs(name):
    m = _reduced(name)
    inputs = m.example_inputs(batch=2)
    with torch.no_grad():
        both = _as_tuple(m(*inputs))
        singles = [_as_tuple(m(*(x[i : i + 1] for x in inputs))) for i in range(2)]
    for k, out in enumerate(both):
        torch.testing.assert_close(out, torch.cat([s[k] for s in singles]), rtol=1e-5, atol=1e-6)


# --- ONNX ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODULES))
def test_onnx_export_runs_in_onnxruntime_like_torch(name, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    mod, _ = MODULES[name]
    m = _reduced(name)
    inputs = m.example_inputs()
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter announces its deprecation
        torch.onnx.export(
            m,
            inputs,
            str(path),
            input_names=list(mod.INPUT_NAMES),
            output_names=list(mod.OUTPUT_NAMES),
            opset_version=20,
            dynamo=False,
        )
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # one self-contained file
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == list(mod.INPUT_NAMES)
    assert [o.name for o in model.graph.output] == list(mod.OUTPUT_NAMES)

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: x.numpy() for n, x in zip(mod.INPUT_NAMES, inputs, strict=True)})
    with torch.no_grad():
        ref = _as_tuple(m(*inputs))
    assert len(got) == len(ref)
    for out_name, a, b in zip(mod.OUTPUT_NAMES, got, ref, strict=True):
        assert a.shape == tuple(b.shape), out_name
        assert _rel_l2(a, b.numpy()) <= 1e-4, out_name


def test_folded_decoder_matches_and_exports_without_sigma_ops(tmp_path):
    onnx = pytest.importorskip("onnx")
    d = _reduced("decoder")
    folded = dec_mod.fold_spectral_norm(d)
    assert not any(isinstance(m, SpectralNormConv2d) for m in folded.modules())
    assert any(isinstance(m, SpectralNormConv2d) for m in d.modules())  # original untouched
    kept = {p.data_ptr() for p in d.parameters()} | {b.data_ptr() for b in d.buffers()}
    assert not any(p.data_ptr() in kept for p in folded.parameters())  # a copy, not a view
    (x,) = d.example_inputs()
    with torch.no_grad():
        torch.testing.assert_close(folded(x), d(x), rtol=1e-5, atol=1e-6)
    path = tmp_path / "decoder_folded.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(folded, (x,), str(path), opset_version=20, dynamo=False)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "MatMul" not in ops and "Div" not in ops
