"""load_network and the random checkpoint tree: released containers, strict loading, errors.

Reduced-width trees cover every network quickly. A full-size tree is written for the
networks whose files are quick to make (all but the warp network, whose BatchNorm calibration
forward takes ~6 s on two cores); the full-size warp network is checked from a file of a freshly
constructed module instead (same container and shapes, default BatchNorm statistics).
"""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from studio.errors import InputError
from studio.fixtures.random_tree import CFG_FILE, random_network, write_checkpoint_tree
from studio.models import (
    NETWORK_NAMES,
    REGISTRY,
    load_checkpoint,
    load_network,
    network_spec,
    state_dict_from_container,
    wrap_container,
)
from studio.models import checkpoints as ck

# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

MANIFEST_CANDIDATES = (
    Path(__file__).resolve().parents[3] / "shared" / "reference" / "ditto_state_dicts.json",
    Path("/work/shared/reference/ditto_state_dicts.json"),
)
FULL_FROM_TREE = ["appearance_extractor", "motion_extractor", "decoder", "stitch_network", "lmdm"]
REDUCED_OUTPUT_SHAPES = {
    "appearance_extractor": [(1, 8, 4, 64, 64)],
    "motion_extractor": [(1, 66), (1, 66), (1, 66), (1, 3), (1, 63), (1, 1), (1, 63)],
    "warp_network": [(1, 32, 64, 64)],
    "decoder": [(1, 3, 128, 128)],
    "stitch_network": [(1, 21, 3)],
    "lmdm": [(1, 80, 265), (1, 80, 265)],
}


def _manifest() -> dict:
    for path in MANIFEST_CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text())["networks"]
    pytest.skip("reference manifest ditto_state_dicts.json not found")


def _outputs(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def _pth(root: Path, name: str) -> Path:
    return root / "ditto_pytorch" / "models" / network_spec(name).checkpoint_file


def _entries(module: nn.Module) -> list[tuple[str, list[int], str]]:
    return [
        (k, list(v.shape), str(v.dtype).removeprefix("torch."))
        for k, v in module.state_dict().items()
    ]


@pytest.fixture(scope="module")
def reduced_tree(tmp_path_factory) -> Path:
    return write_checkpoint_tree(tmp_path_factory.mktemp("reduced"), reduced=True, seed=0)


@pytest.fixture(scope="module")
def full_tree(tmp_path_factory) -> Path:
    return write_checkpoint_tree(
        tmp_path_factory.mktemp("full"), reduced=False, networks=FULL_FROM_TREE, cfg=False
    )


# --- registry ---------------------------------------------------------------------------------


def test_registry_matches_discovery_and_manifest() -> None:
    assert NETWORK_NAMES == ck.NETWORKS
    manifest = _manifest()
    for name, spec in REGISTRY.items():
        ref = manifest[name]
        assert spec.checkpoint_file == ref["checkpoint_file"]
        assert spec.onnx_file == ref["onnx"]["onnx_file"]
        key = ref["container"]["top_level_key"]
        assert spec.container == (key or "flat")
        for mine, theirs in (
            (spec.inputs, ref["onnx"]["inputs"]),
            (spec.outputs, ref["onnx"]["outputs"]),
        ):
            assert [(s.name, list(s.shape), s.dtype) for s in mine] == [
                (t["name"], t["shape"], t["dtype"]) for t in theirs
            ]
        assert spec.input_names == spec.module.INPUT_NAMES
        assert spec.output_names == spec.module.OUTPUT_NAMES
        assert set(spec.presets()) == {"released", "reduced"}
    with pytest.raises(InputError, match="unknown network 'hubert'.*appearance_extractor"):
        network_spec("hubert")


# --- the random tree --------------------------------------------------------------------------


def test_tree_files_have_the_released_containers(reduced_tree: Path) -> None:
    cs = ck.discover(reduced_tree)
    for name in NETWORK_NAMES:
        assert cs.path(name) == _pth(reduced_tree, name).resolve()
        raw = torch.load(_pth(reduced_tree, name), map_location="cpu", weights_only=True)
        container = network_spec(name).container
        if container == "flat":
            assert all(isinstance(k, str) and torch.is_tensor(v) for k, v in raw.items())
        elif container == "model_state_dict":
            assert list(raw) == ["model_state_dict"]
        else:
            assert list(raw) == ["retarget_shoulder", "retarget_mouth", "retarget_eye"]
            for part in raw.values():
                assert part and all(k.startswith("module.mlp.") for k in part)
            assert raw["retarget_mouth"]["module.mlp.0.weight"].shape[1] == 65
            assert raw["retarget_eye"]["module.mlp.0.weight"].shape[1] == 66
    cfg = ck.load_cfg(reduced_tree / "ditto_cfg" / CFG_FILE)
    summary = ck.cfg_summary(cfg)
    assert summary["audio_feat_dim"] == network_spec("lmdm").reduced_kwargs["cond_dim"]
    assert summary["motion_feat_dim"] == 265 and summary["seq_frames"] == 80


def test_tree_is_deterministic_and_keeps_the_callers_rng(tmp_path: Path) -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = write_checkpoint_tree(tmp_path / "a", reduced=True, seed=5, networks=["stitch_network"])
    assert torch.equal(torch.get_rng_state(), state)
    b = write_checkpoint_tree(tmp_path / "b", reduced=True, seed=5, networks=["stitch_network"])
    c = write_checkpoint_tree(tmp_path / "c", reduced=True, seed=6, networks=["stitch_network"])
    load = lambda root: torch.load(_pth(root, "stitch_network"), weights_only=True)  # noqa: E731
    sa, sb, sc = load(a), load(b), load(c)
    for part in sa:
        for k in sa[part]:
            assert torch.equal(sa[part][k], sb[part][k])
    assert not torch.equal(
        sa["retarget_shoulder"]["module.mlp.0.weight"],
        sc["retarget_shoulder"]["module.mlp.0.weight"],
    )
    assert sorted(p.name for p in (a / "ditto_pytorch" / "models").iterdir()) == [
        "stitch_network.pth"
    ]
    with pytest.raises(InputError, match="unknown network"):
        write_checkpoint_tree(tmp_path / "d", networks=["stitch_network", "nope"])
    assert not (tmp_path / "d").exists()


def test_random_weights_exercise_norms_and_spectral_norm() -> None:
    for name in ("appearance_extractor", "warp_network"):
        net = random_network(name, reduced=True)
        norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        assert norms
        for m in norms:
            assert not torch.allclose(m.running_mean, torch.zeros_like(m.running_mean))
            assert not torch.allclose(m.running_var, torch.ones_like(m.running_var))
            assert (m.running_var > 0).all() and int(m.num_batches_tracked) >= 10_000
            assert not torch.allclose(m.weight, torch.ones_like(m.weight))
    grn = random_network("motion_extractor", reduced=True).detector.stages[0][0].grn
    assert grn.gamma.abs().min() > 0  # GRN is no longer the identity of its zero init
    dec = random_network("decoder", reduced=True)
    for m in dec.modules():
        if hasattr(m, "weight_u"):
            w = m.weight_orig.reshape(m.weight_orig.shape[0], -1)
            sigma = torch.dot(m.weight_u, w @ m.weight_v)
            assert torch.linalg.vector_norm(m.weight_u) == pytest.approx(1, abs=1e-5)
            assert torch.linalg.vector_norm(m.weight_v) == pytest.approx(1, abs=1e-5)
            assert (
                0.9 * torch.linalg.matrix_norm(w, ord=2)
                <= sigma
                <= torch.linalg.matrix_norm(w, ord=2) * 1.0001
            )


# --- strict loading ---------------------------------------------------------------------------


_DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not torch.cuda.is_available(),
            reason="needs a CUDA GPU (checked after the upload there)",
        ),
    ),
]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_weights_are_a_clear_error_naming_the_tensor(
    bad: float, device: str, reduced_tree: Path, tmp_path: Path
) -> None:
    path = _pth(reduced_tree, "stitch_network")
    raw = torch.load(path, map_location="cpu", weights_only=True)
    sd = state_dict_from_container("stitch_network", raw, path)
    key = [k for k, v in sd.items() if v.is_floating_point()][2]  # the first bad one is named
    sd[key].view(-1)[0] = bad  # the container holds the same tensors
    damaged = tmp_path / path.name
    torch.save(raw, damaged)
    with pytest.raises(InputError, match=rf"{damaged.name}.*{key}.*NaN or infinity.*download"):
        load_network("stitch_network", damaged, device)


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_reduced_file_loads_strictly_with_forward_shapes(name: str, reduced_tree: Path) -> None:
    path = _pth(reduced_tree, name)
    net = load_network(name, path)
    assert isinstance(net, network_spec(name).cls)
    assert not any(m.training for m in net.modules())
    raw = torch.load(path, map_location="cpu", weights_only=True)
    stored = state_dict_from_container(name, raw, path)
    loaded = net.state_dict()
    assert list(loaded) == list(stored)
    for k, v in stored.items():
        assert torch.equal(loaded[k], v), k
    with torch.no_grad():
        out = _outputs(net(*net.example_inputs(1)))
    assert [tuple(o.shape) for o in out] == REDUCED_OUTPUT_SHAPES[name]
    assert all(torch.isfinite(o).all() for o in out)
    # the same file through explicit constructor keywords
    explicit = load_network(name, path, **network_spec(name).reduced_kwargs)
    for k, v in explicit.state_dict().items():
        assert torch.equal(v, loaded[k])


@pytest.mark.parametrize("name", NETWORK_NAMES)
def test_a_loaded_network_is_the_one_built_for_real_and_draws_no_random_numbers(
    name: str, reduced_tree: Path
) -> None:
    """Loading builds a meta skeleton and takes the file's tensors: no random init to pay for,
    the caller's random stream untouched, and every buffer (the computed ones too) real."""
    path = _pth(reduced_tree, name)
    rng = torch.get_rng_state()
    net = load_network(name, path)
    assert torch.equal(torch.get_rng_state(), rng)
    spec = network_spec(name)
    stored = state_dict_from_container(name, torch.load(path, weights_only=True), path)
    kwargs = dict(spec.reduced_kwargs)
    if name == "lmdm":
        kwargs["cond_dim"] = net.cond_dim
    real = spec.cls(**kwargs)
    real.load_state_dict(stored, strict=True)
    real.eval()
    ours = dict(net.named_buffers())
    for key, value in real.named_buffers():  # non-persistent ones included
        assert not ours[key].is_meta, key
        assert torch.equal(ours[key], value), key
    for key, value in real.named_parameters():
        assert dict(net.named_parameters())[key].requires_grad == value.requires_grad
    with torch.no_grad():
        inputs = net.example_inputs(1)
        for a, b in zip(_outputs(net(*inputs)), _outputs(real(*inputs)), strict=True):
            assert torch.equal(a, b)


def test_a_file_in_half_precision_or_with_strided_tensors_loads_as_the_module_holds_them(
    tmp_path: Path,
) -> None:
    spec = network_spec("stitch_network")
    source = random_network("stitch_network", reduced=True)
    sd = source.state_dict()
    first = next(k for k, v in sd.items() if v.dim() == 2)
    sd = {k: v.half() for k, v in sd.items()}
    sd[first] = sd[first].t().contiguous().t()  # same values, transposed strides
    path = tmp_path / spec.checkpoint_file
    torch.save(wrap_container("stitch_network", sd), path)
    net = load_network("stitch_network", path)
    for key, value in net.state_dict().items():
        assert value.dtype == torch.float32 and value.is_contiguous(), key
        assert torch.equal(value, sd[key].float()), key


@pytest.mark.parametrize("form", ["zip", "legacy", "deflated zip"])
def test_a_mapped_checkpoint_holds_what_a_read_one_does(tmp_path: Path, form: str) -> None:
    """mmap (weights bound for a GPU) maps a zip-format file as torch.save writes it; an
    old-format one, or a zip compressed again (which would map to garbage), is read."""
    import zipfile

    sd = random_network("stitch_network", reduced=True).state_dict()
    path = tmp_path / "stitch.pth"
    torch.save(sd, path, _use_new_zipfile_serialization=form != "legacy")
    if form == "deflated zip":
        stored = tmp_path / "stored.pth"
        path.rename(stored)
        with zipfile.ZipFile(stored) as src, zipfile.ZipFile(path, "w") as dst:
            for item in src.infolist():
                dst.writestr(item.filename, src.read(item), zipfile.ZIP_DEFLATED)
    read, mapped = load_checkpoint(path), load_checkpoint(path, mmap=True)
    assert list(mapped) == list(read)
    assert all(torch.equal(mapped[k], read[k]) for k in read)


@pytest.mark.parametrize("name", FULL_FROM_TREE)
def test_full_size_tree_loads_and_matches_the_manifest(name: str, full_tree: Path) -> None:
    manifest = _manifest()[name]
    net = load_network(name, _pth(full_tree, name))
    assert _entries(net) == [(e["key"], e["shape"], e["dtype"]) for e in manifest["state_dict"]]
    if name in ("stitch_network", "appearance_extractor"):  # cheap enough to run at full size
        spec = network_spec(name)
        with torch.no_grad():
            out = _outputs(net(*net.example_inputs(1)))
        assert [list(o.shape) for o in out] == [list(s.shape) for s in spec.outputs]


def test_full_size_warp_network_loads_and_matches_the_manifest(tmp_path: Path) -> None:
    manifest = _manifest()["warp_network"]
    torch.manual_seed(0)
    source = network_spec("warp_network").cls()
    path = tmp_path / "warp_network.pth"
    torch.save(wrap_container("warp_network", source.state_dict()), path)
    net = load_network("warp_network", path)
    assert _entries(net) == [(e["key"], e["shape"], e["dtype"]) for e in manifest["state_dict"]]
    assert torch.equal(net.third.conv.weight, source.third.conv.weight)


def test_lmdm_cond_width_is_read_from_the_file(tmp_path: Path) -> None:
    spec = network_spec("lmdm")
    kwargs = {**spec.reduced_kwargs, "cond_dim": 51}
    torch.manual_seed(0)
    path = tmp_path / "lmdm.pth"
    torch.save(wrap_container("lmdm", spec.cls(**kwargs).state_dict()), path)
    net = load_network("lmdm", path)
    assert net.cond_dim == 51
    assert net.example_inputs(1)[2].shape == (1, 80, 51)
    no_cond = {k: v for k, v in kwargs.items() if k != "cond_dim"}
    assert load_network("lmdm", path, **no_cond).cond_dim == 51
    with pytest.raises(InputError, match="condition width 51.*cond_dim=37"):
        load_network("lmdm", path, **spec.reduced_kwargs)


def test_device_argument(reduced_tree: Path) -> None:
    net = load_network("stitch_network", _pth(reduced_tree, "stitch_network"), device="cpu")
    assert all(p.device.type == "cpu" for p in net.parameters())


# --- errors -----------------------------------------------------------------------------------


def _assert_names(err: pytest.ExceptionInfo, *parts: str) -> None:
    text = str(err.value)
    for part in parts:
        assert part in text, (part, text)
    assert "\n" not in text


def test_missing_and_non_files(tmp_path: Path) -> None:
    missing = tmp_path / "decoder.pth"
    with pytest.raises(InputError) as err:
        load_network("decoder", missing)
    _assert_names(err, str(missing), "does not exist")
    with pytest.raises(InputError) as err:
        load_network("decoder", tmp_path)
    _assert_names(err, str(tmp_path), "folder")
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    with pytest.raises(InputError) as err:
        load_network("decoder", empty)
    _assert_names(err, str(empty), "empty")
    lfs = tmp_path / "lfs.pth"
    lfs.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")
    with pytest.raises(InputError) as err:
        load_network("decoder", lfs)
    _assert_names(err, str(lfs), "Git LFS pointer")


@pytest.mark.parametrize(
    "content",
    [b"hello, this is text", random.Random(0).randbytes(4096), pickle.dumps({"a": 1}, protocol=2)],
    ids=["text", "random-bytes", "plain-pickle"],
)
def test_not_a_torch_checkpoint(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "stitch_network.pth"
    p.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_network("stitch_network", p)
    _assert_names(err, str(p), "not a PyTorch checkpoint")


def test_truncated_file(reduced_tree: Path, tmp_path: Path) -> None:
    data = _pth(reduced_tree, "decoder").read_bytes()
    p = tmp_path / "decoder.pth"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError) as err:
        load_network("decoder", p)
    _assert_names(err, str(p), "truncated or corrupt")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = tmp_path / "stitch_network.pth"
    sd = network_spec("stitch_network").cls().state_dict()
    torch.save({"retarget_shoulder": sd, "payload": _RunsCode(marker)}, p)
    with pytest.raises(InputError) as err:
        load_network("stitch_network", p)
    _assert_names(err, str(p), "refusing to load", "system")
    assert not marker.exists()
    arrays = tmp_path / "decoder.pth"
    torch.save({"w": np.zeros(3)}, arrays)  # numpy objects are not weights either
    with pytest.raises(InputError) as err:
        load_network("decoder", arrays)
    _assert_names(err, str(arrays), "refusing to load", "numpy")


def test_wrong_containers(reduced_tree: Path, tmp_path: Path) -> None:
    lmdm_sd = state_dict_from_container(
        "lmdm", torch.load(_pth(reduced_tree, "lmdm"), weights_only=True)
    )
    flat_lmdm = tmp_path / "lmdm_v0.4_hubert.pth"
    torch.save(lmdm_sd, flat_lmdm)
    with pytest.raises(InputError) as err:
        load_network("lmdm", flat_lmdm)
    _assert_names(err, str(flat_lmdm), "no 'model_state_dict' entry", "lmdm")

    stitch = tmp_path / "stitch_network.pth"
    torch.save({"retarget_mouth": {}}, stitch)
    with pytest.raises(InputError) as err:
        load_network("stitch_network", stitch)
    _assert_names(err, str(stitch), "no 'retarget_shoulder' entry", "'retarget_mouth'")

    with pytest.raises(InputError) as err:  # an LMDM container where a flat file belongs
        load_network("decoder", _pth(reduced_tree, "lmdm"))
    _assert_names(err, "decoder", "'model_state_dict'", "not tensors", "flat state dict")

    listed = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(InputError) as err:
        load_network("warp_network", listed)
    _assert_names(err, str(listed), "list", "warp_network")


def test_strict_mismatch_names_network_file_and_keys(reduced_tree: Path, tmp_path: Path) -> None:
    sd = torch.load(_pth(reduced_tree, "decoder"), weights_only=True)
    sd.pop("fc.bias")
    sd["extra.weight"] = torch.zeros(1)
    p = tmp_path / "decoder.pth"
    torch.save(sd, p)
    with pytest.raises(InputError) as err:
        load_network("decoder", p)
    _assert_names(err, "decoder", str(p), "missing (fc.bias)", "unexpected (extra.weight)")

    with pytest.raises(InputError) as err:  # released-shaped file, reduced keywords
        load_network(
            "stitch_network", _pth(reduced_tree, "stitch_network"), hidden_sizes=(32, 16, 8)
        )
    _assert_names(
        err, "stitch_network", "wrong shape", "mlp.0.weight: file [16, 126] vs module [32, 126]"
    )

    other = tmp_path / "appearance_extractor.pth"  # a width neither known configuration has
    torch.save(
        network_spec("appearance_extractor")
        .cls(block_expansion=16, max_features=64, reshape_channel=8, reshape_depth=8)
        .state_dict(),
        other,
    )
    with pytest.raises(InputError) as err:
        load_network("appearance_extractor", other)
    _assert_names(err, "appearance_extractor", str(other), "wrong shape", "constructor keywords")
    assert (
        load_network(
            "appearance_extractor",
            other,
            block_expansion=16,
            max_features=64,
            reshape_channel=8,
            reshape_depth=8,
        ).reshape_depth
        == 8
    )

    with pytest.raises(InputError, match="cannot build decoder"):
        load_network("decoder", _pth(reduced_tree, "decoder"), no_such_argument=1)


class _Tabled(torch.nn.Module):
    """A network whose constructor computes a table it does not save (as LMDM's once did)."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.register_buffer("table", torch.arange(width, dtype=torch.float32) * 2.0, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + self.table


def test_a_skeleton_left_with_meta_tensors_is_built_for_real() -> None:
    """The meta skeleton cannot compute the table: the loader builds such a module for real,
    so no tensor stays on the meta device and the file's weights are the ones loaded."""
    from types import SimpleNamespace

    from studio.models import _build, _load_into

    spec = SimpleNamespace(cls=_Tabled)
    sd = _Tabled().state_dict()
    sd = {k: torch.randn_like(v) for k, v in sd.items()}
    skeleton = _build(spec, {"width": 4})
    assert skeleton.table.is_meta  # what the fallback is for
    module = _load_into(spec, {"width": 4}, skeleton, sd)
    assert not any(t.is_meta for t in (*module.parameters(), *module.buffers()))
    assert torch.equal(module.table, torch.arange(4, dtype=torch.float32) * 2.0)
    for k, v in sd.items():
        assert torch.equal(module.state_dict()[k], v)
