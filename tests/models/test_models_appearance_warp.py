"""Appearance extractor and warping network: checkpoint layout, shapes, batching, ONNX parity."""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from studio.layout import NUM_KP
from studio.models import appearance_extractor as A
from studio.models import warp_network as W
from studio.models.blocks import kp_to_gaussian, make_coordinate_grid

# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

MANIFEST_CANDIDATES = (
    Path(__file__).resolve().parents[3] / "shared" / "reference" / "ditto_state_dicts.json",
    Path("/work/shared/reference/ditto_state_dicts.json"),
)

NETS = {
    "appearance_extractor": (A, A.AppearanceExtractor),
    "warp_network": (W, W.WarpNetwork),
}


def _find_manifest() -> dict | None:
    for path in MANIFEST_CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text())["networks"]
    return None


def _manifest() -> dict:
    manifest = _find_manifest()
    if manifest is None:
        pytest.skip("reference manifest ditto_state_dicts.json not found")
    return manifest


def _init_defaults(cls: type) -> dict:
    return {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _randomise_bn(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial running stats, so eval-mode BatchNorm is really exercised."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def _reduced(name: str, seed: int = 0) -> torch.nn.Module:
    mod, cls = NETS[name]
    torch.manual_seed(seed)
    net = cls(**mod.REDUCED_KWARGS)
    _randomise_bn(net, seed)
    return net.eval()


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def reduced_nets() -> dict[str, torch.nn.Module]:
    return {name: _reduced(name) for name in NETS}


# --- checkpoint layout ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NETS))
def test_state_dict_matches_manifest(name: str) -> None:
    entry = _manifest()[name]
    _, cls = NETS[name]
    net = cls()
    assert entry["construction_kwargs"].items() <= _init_defaults(cls).items()
    got = [
        (k, list(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in net.state_dict().items()
    ]
    want = [(e["key"], e["shape"], e["dtype"]) for e in entry["state_dict"]]
    assert got == want
    assert sum(p.numel() for p in net.parameters()) == entry["param_count"]
    # The reduced variant keeps the key structure (names and order).
    assert list(_reduced(name).state_dict()) == [e["key"] for e in entry["state_dict"]]


@pytest.mark.parametrize("name", list(NETS))
def test_strict_load_of_manifest_shaped_flat_pth(name: str, tmp_path: Path) -> None:
    """A flat file with exactly the released keys/shapes/dtypes loads strictly."""
    entry = _manifest()[name]
    g = torch.Generator().manual_seed(1)
    flat = {}
    for e in entry["state_dict"]:
        if e["dtype"] == "int64":
            flat[e["key"]] = torch.tensor(7, dtype=torch.int64).reshape(e["shape"])
        else:
            flat[e["key"]] = torch.randn(e["shape"], generator=g)
    path = tmp_path / entry["checkpoint_file"]
    torch.save(flat, path)
    _, cls = NETS[name]
    net = cls()
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
    for key, value in net.state_dict().items():
        assert torch.equal(value, flat[key]), key


@pytest.mark.parametrize("name", list(NETS))
def test_reduced_round_trip_through_pth(name: str, tmp_path: Path, reduced_nets) -> None:
    src = reduced_nets[name]
    torch.save(src.state_dict(), tmp_path / "net.pth")
    dst = _reduced(name, seed=5)
    dst.load_state_dict(torch.load(tmp_path / "net.pth", weights_only=True), strict=True)
    want = src.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in dst.state_dict().items())


def test_inconsistent_reshape_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_features"):
        A.AppearanceExtractor(max_features=256)
    with pytest.raises(ValueError, match="max_features"):
        W.WarpNetwork(reshape_channel=16)


# --- shapes and batching ----------------------------------------------------------------------


def test_reduced_forward_shapes(reduced_nets) -> None:
    app, warp = reduced_nets["appearance_extractor"], reduced_nets["warp_network"]
    (image,) = app.example_inputs(1)
    assert image.shape == (1, 3, 256, 256)
    with torch.no_grad():
        f_s = app(image)
        assert f_s.shape == (1, 8, 4, 64, 64)
        kp_s, kp_d = warp.example_inputs(1)[1:]
        assert kp_s.shape == kp_d.shape == (1, NUM_KP, 3)
        out = warp(f_s, kp_s, kp_d)  # the reduced nets chain
    assert out.shape == (1, 32, 64, 64)
    assert torch.isfinite(out).all()


def test_full_size_forward_shapes_and_flops() -> None:
    """One full-size forward each at batch 1; conv FLOPs equal the manifest's count."""
    from torch.utils.flop_counter import FlopCounterMode

    manifest = _find_manifest()
    torch.manual_seed(0)
    for name, shape in (
        ("appearance_extractor", (1, 32, 16, 64, 64)),
        ("warp_network", (1, 256, 64, 64)),
    ):
        _, cls = NETS[name]
        net = cls().eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = net(*net.example_inputs(1))
        assert out.shape == shape and torch.isfinite(out).all()
        if manifest is not None:
            assert counter.get_total_flops() == manifest[name]["flops"]["forward_total"]


@pytest.mark.parametrize("name", list(NETS))
def test_batch_two_equals_two_batch_one_calls(name: str, reduced_nets) -> None:
    net = reduced_nets[name]
    x = net.example_inputs(2)
    with torch.no_grad():
        both = net(*x)
        single = torch.cat([net(*(a[i : i + 1] for a in x)) for i in range(2)])
    # Equal to fp32 rounding; not bitwise, since oneDNN picks batch-dependent conv kernels.
    torch.testing.assert_close(both, single, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(both[0], both[1])  # the two items really differ


# --- dense motion geometry ------------------------------------------------------------------


def test_coordinate_grid_and_gaussian() -> None:
    ref = torch.zeros(1)
    grid = make_coordinate_grid((3, 4, 5), ref)
    assert grid.shape == (3, 4, 5, 3)
    assert grid[0, 0, 0].tolist() == [-1.0, -1.0, -1.0]
    assert grid[2, 3, 4].tolist() == [1.0, 1.0, 1.0]
    assert grid[1, 2, 3].tolist() == pytest.approx([0.5, 1 / 3, 0.0])  # x=w, y=h, z=d
    kp = grid[1, 2, 3].view(1, 1, 3)
    heat = kp_to_gaussian(kp, (3, 4, 5), 0.01)
    assert heat.shape == (1, 1, 3, 4, 5)
    assert heat[0, 0, 1, 2, 3].item() == pytest.approx(1.0)
    assert heat.flatten().argmax().item() == (1 * 4 + 2) * 5 + 3


def test_sparse_motions_layout(reduced_nets) -> None:
    dense = reduced_nets["warp_network"].dense_motion_network
    kp_s = torch.rand(2, NUM_KP, 3) - 0.5
    kp_d = torch.rand(2, NUM_KP, 3) - 0.5
    motions = dense.sparse_motions((4, 8, 8), kp_s, kp_d)
    identity = make_coordinate_grid((4, 8, 8), kp_s)
    assert motions.shape == (2, NUM_KP + 1, 4, 8, 8, 3)
    torch.testing.assert_close(motions[:, 0], identity.expand(2, 4, 8, 8, 3))
    shift = (kp_s - kp_d)[:, :, None, None, None, :]
    torch.testing.assert_close(motions[:, 1:], identity + shift)


def test_identity_motion_gives_identity_deformation(reduced_nets) -> None:
    warp = reduced_nets["warp_network"]
    f_s, kp_s, _ = warp.example_inputs(2)
    with torch.no_grad():
        motion = warp.dense_motion_network(f_s, kp_s, kp_s.clone())
    identity = make_coordinate_grid(f_s.shape[2:], f_s)
    assert motion.deformation.shape == (2, 4, 64, 64, 3)
    torch.testing.assert_close(motion.deformation, identity.expand_as(motion.deformation))
    torch.testing.assert_close(motion.mask.sum(1), torch.ones(2, 4, 64, 64))
    assert motion.occlusion_map.shape == (2, 1, 64, 64)
    assert 0 < motion.occlusion_map.min() and motion.occlusion_map.max() < 1


# --- ONNX -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NETS))
def test_onnx_export_and_runtime_parity(name: str, tmp_path: Path, reduced_nets) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    mod, _ = NETS[name]
    net = reduced_nets[name]
    inputs = net.example_inputs(1)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
        torch.onnx.export(
            net,
            inputs,
            str(path),
            input_names=list(mod.INPUT_NAMES),
            output_names=list(mod.OUTPUT_NAMES),
            opset_version=20,
            dynamo=False,
        )
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert tuple(i.name for i in model.graph.input) == mod.INPUT_NAMES
    assert tuple(o.name for o in model.graph.output) == mod.OUTPUT_NAMES
    assert not list(tmp_path.glob("*.data"))  # one self-contained file
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {n: t.numpy() for n, t in zip(mod.INPUT_NAMES, inputs, strict=True)}
    (got,) = session.run(list(mod.OUTPUT_NAMES), feeds)
    with torch.no_grad():
        want = net(*inputs).numpy()
    assert got.shape == want.shape
    assert _rel_l2(got, want) <= 1e-4
