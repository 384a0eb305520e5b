"""TensorRT: cache keys and staleness (no tensorrt needed), graph rewrites, `studio compile`
without tensorrt, the builder's call sequence against a stand-in module, and real
builder/runner tests that skip without tensorrt and a GPU."""

from __future__ import annotations

import contextlib
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from studio.cli import main
from studio.errors import InputError, OptionError
from studio.runtime import engine_cache as ec
from studio.runtime.base import BackendUnavailable, EngineBase
from studio.runtime.tensorrt import build as trt_build
from studio.runtime.tensorrt import cache as trt_cache
from studio.runtime.tensorrt import plugins as trt_plugins
from studio.runtime.tensorrt import run as trt_run
from studio.runtime.tensorrt.build import build_engine, engine_key
from studio.runtime.tensorrt.cache import cached_engine, engine_stem, ensure_engine
from studio.runtime.tensorrt.plugins import (
    has_op,
    load_plugin,
    plugin_entry_points,
    plugin_needed,
    rewrite_grid_sample_for_plugin,
)
from studio.runtime.tensorrt.run import TensorRTEngine, uses_side_stream
from studio.runtime.tensorrt.support import (
    BuildSettings,
    graph_precision,
    import_tensorrt,
    native_grid_sample_3d,
    network_flags,
    parse_version,
    precision_flags,
    resolve_typing,
    tensorrt_version,
    weak_typing_available,
)

HAVE_TRT = tensorrt_version() is not None
# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def key(**changes) -> ec.EngineKey:
    base = ec.EngineKey(
        network="decoder",
        precision="fp16",
        onnx_sha256="a" * 64,
        gpu_name="NVIDIA H200",
        compute_capability="9.0",
        tensorrt_version="10.8.0.43",
        builder={"opt_level": 5, "workspace_bytes": 8 << 30, "typing": "strong"},
    )
    return replace(base, **changes)


def fake_engine(tmp_path: Path, recorded: ec.EngineKey, payload: bytes = b"plan" * 64) -> Path:
    path = ec.engine_file(tmp_path, "decoder", recorded.precision)
    path.write_bytes(payload)
    ec.write_metadata(path, recorded, {"note": "test"})
    return path


# --- keys and staleness ----------------------------------------------------------------------


def test_same_inputs_give_the_same_key_and_every_field_changes_it():
    assert key() == key() and key().digest() == key().digest()
    assert (
        key(builder={"typing": "strong", "opt_level": 5, "workspace_bytes": 8 << 30}).digest()
        == key().digest()
    )  # builder settings are canonicalised (order does not matter)
    changed = [
        key(gpu_name="NVIDIA A100-SXM4-80GB"),
        key(compute_capability="8.0"),
        key(tensorrt_version="10.9.0.34"),
        key(precision="fp32"),
        key(onnx_sha256="b" * 64),
        key(builder={"opt_level": 3, "workspace_bytes": 8 << 30, "typing": "strong"}),
        key(network="warp_network"),
    ]
    digests = {k.digest() for k in changed}
    assert len(digests) == len(changed) and key().digest() not in digests
    assert ec.EngineKey.from_dict(key().to_dict()) == key()


def test_a_current_engine_is_reused(tmp_path):
    path = fake_engine(tmp_path, key())
    d = ec.decide(path, key(), verify_bytes=True)
    assert d.action == "reuse" and d.reasons == () and "using the cached engine" in d.message
    meta = json.loads(ec.metadata_file(path).read_text())
    assert meta["key_sha256"] == key().digest() and meta["engine_bytes"] == path.stat().st_size
    assert meta["note"] == "test"


def test_a_missing_engine_is_built(tmp_path):
    d = ec.decide(tmp_path / "decoder_fp16.engine", key())
    assert d.action == "build" and "no cached engine" in d.message


@pytest.mark.parametrize(
    ("wanted", "needle"),
    [
        (
            key(gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9"),
            "built on NVIDIA H200 (sm 9.0), this GPU is NVIDIA GeForce RTX 4090 (sm 8.9)",
        ),
        (key(tensorrt_version="11.2.1"), "built with TensorRT 10.8.0.43, this is TensorRT 11.2.1"),
        (key(precision="fp32"), "it is fp16, fp32 was asked for"),
        (
            key(onnx_sha256="c" * 64),
            "its ONNX file changed (sha256 aaaaaaaaaaaa… -> cccccccccccc…)",
        ),
        (
            key(builder={"opt_level": 3, "workspace_bytes": 8 << 30, "typing": "strong"}),
            "the builder settings changed (opt_level 5 -> 3)",
        ),
        (replace(key(), format=ec.ENGINE_FORMAT + 1), "build recipe changed"),
    ],
)
def test_a_stale_engine_is_rebuilt_with_a_message(tmp_path, wanted, needle):
    path = fake_engine(tmp_path, key())
    d = ec.decide(path, wanted)
    assert d.action == "rebuild"
    assert needle in d.message and d.message.startswith(f"rebuilding {path.name}: ")


def test_engines_without_usable_metadata_or_with_damaged_files_are_rebuilt(tmp_path):
    path = fake_engine(tmp_path, key())
    meta = ec.metadata_file(path)
    good = meta.read_text()
    meta.write_text("{not json")
    d = ec.decide(path, key())
    assert d.action == "rebuild" and "unreadable" in d.message
    meta.unlink()
    d = ec.decide(path, key())
    assert d.action == "rebuild" and "decoder_fp16.engine.json" in d.message
    meta.write_text(good)
    path.write_bytes(b"plan")  # truncated
    d = ec.decide(path, key())
    assert d.action == "rebuild" and "truncated" in d.message
    fake_engine(tmp_path, key())
    path.write_bytes(b"PLAN" * 64)  # same size, other bytes
    assert ec.decide(path, key()).action == "reuse"  # size is checked by default (cheap)
    assert "SHA-256 differs" in ec.decide(path, key(), verify_bytes=True).message


def test_versions_typing_and_grid_sample_support():
    assert parse_version("10.8.0.43") == (10, 8, 0, 43)
    assert parse_version("11.2.1.post1") == (11, 2, 1)
    assert not native_grid_sample_3d("10.13.3") and not native_grid_sample_3d("11.1.0")
    assert native_grid_sample_3d("11.2.1") and native_grid_sample_3d("12.0")
    assert weak_typing_available("10.13.0") and not weak_typing_available("11.0.0")
    assert resolve_typing("auto", "10.8") == "strong" == resolve_typing("auto", "11.2")
    assert resolve_typing("weak", "10.8") == "weak"
    with pytest.raises(OptionError, match="--typing: weak typing .* removed in TensorRT 11"):
        resolve_typing("weak", "11.2.1")
    assert graph_precision("fp16", "strong") == "fp16"
    assert graph_precision("fp16", "weak") == "fp32"
    assert graph_precision("int8", "strong") == "fp32"  # ModelOpt quantizes the fp32 graph
    assert engine_stem("lmdm") == "lmdm_v0.4_hubert" and engine_stem("decoder", 8) == "decoder_b8"


@pytest.mark.parametrize(
    ("version", "typing", "bit", "flags"),
    [
        ("10.8.0.43", "strong", 1, 1 << 1),  # 10.x: strong typing is opt-in
        ("10.16.1", "strong", 1, 1 << 1),
        ("10.13.0", "weak", 1, 0),
        ("11.0.0", "strong", 1, 0),  # 11.x: always strong, STRONGLY_TYPED deprecated + ignored
        ("11.2.1", "strong", 1, 0),
        ("10.8.0.43", "strong", None, 0),  # a build without the flag
    ],
)
def test_network_flags_per_version_and_typing(version, typing, bit, flags):
    assert network_flags(typing, version, bit) == flags


@pytest.mark.parametrize(
    ("precision", "typing", "flags"),
    [
        ("fp32", "weak", ()),
        ("tf32", "weak", ()),
        ("fp16", "weak", ("FP16", "OBEY_PRECISION_CONSTRAINTS")),
        ("bf16", "weak", ("BF16", "OBEY_PRECISION_CONSTRAINTS")),
        ("int8", "weak", ("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS")),
        ("fp8", "weak", ("FP16", "OBEY_PRECISION_CONSTRAINTS")),  # never BuilderFlag.FP8
        ("fp16", "strong", ()),  # types come from the graph; flags must not be set
        ("bf16", "strong", ()),
        ("int8", "strong", ()),
        ("fp8", "strong", ()),
    ],
)
def test_precision_flags_per_precision_and_typing(precision, typing, flags):
    assert precision_flags(precision, typing) == flags


def test_precision_flags_refuse_an_unknown_precision():
    with pytest.raises(OptionError, match="--precision: TensorRT cannot build 'fp4'"):
        precision_flags("fp4", "weak")


def test_only_default_streams_get_a_side_stream():
    assert uses_side_stream(0)  # torch's default (legacy) stream
    assert uses_side_stream(1) and uses_side_stream(2)  # cudaStreamLegacy, PerThread
    assert not uses_side_stream(0x7F3A_2C00_1230)


def test_plugin_entry_points_tell_dynamic_from_static_libraries():
    assert plugin_entry_points(types.SimpleNamespace()) == []
    assert plugin_entry_points(types.SimpleNamespace(getCreators=1)) == ["getCreators"]
    old_style = types.SimpleNamespace(getPluginCreators=1, setLoggerFinder=1)
    assert plugin_entry_points(old_style) == ["getPluginCreators"]


def test_plugin_native_or_library_choice(tmp_path):
    """The warp network needs the plugin below 11.2, or whenever its graph has plugin ops."""
    src = grid_model(tmp_path / "g.onnx")
    plugged = tmp_path / "g.plugin.onnx"
    rewrite_grid_sample_for_plugin(src, plugged)
    assert plugin_needed("warp_network", src, "10.16.1")
    assert plugin_needed("warp_network", src, "11.1.0")
    assert not plugin_needed("warp_network", src, "11.2.1")
    assert plugin_needed("warp_network", plugged, "11.2.1")  # Ditto's released graph
    assert not plugin_needed("decoder", src, "10.8.0.43")  # no 3-D sampling elsewhere


def test_cache_key_fields_follow_the_build_that_would_run(tmp_path, monkeypatch):
    monkeypatch.setattr(trt_build, "_device_facts", lambda device: ("NVIDIA H200", "9.0"))
    onnx = grid_model(tmp_path / "g.onnx")
    plugin = tmp_path / "libgrid_sample_3d_plugin.so"
    plugin.write_bytes(b"\x7fELF v1")
    settings = BuildSettings(plugin=str(plugin))
    dev = torch.device("cuda", 0)
    old = engine_key("warp_network", onnx, "fp16", dev, settings, "10.16.1")
    new = engine_key("warp_network", onnx, "fp16", dev, settings, "11.2.1")
    assert old.builder["plugin_sha256"] == ec.file_sha256(plugin)
    assert new.builder["plugin_sha256"] is None  # native 3-D GridSample: the .so is unused
    assert old.builder["typing"] == new.builder["typing"] == "strong"
    assert (old.gpu_name, old.compute_capability) == ("NVIDIA H200", "9.0")
    assert old.tensorrt_version == "10.16.1" and old.digest() != new.digest()
    plugin.write_bytes(b"\x7fELF v2")  # another plugin build: another engine
    again = engine_key("warp_network", onnx, "fp16", dev, settings, "10.16.1")
    assert again.digest() != old.digest()
    weak = engine_key(
        "warp_network", onnx, "fp16", dev, replace(settings, typing="weak"), "10.16.1"
    )
    assert weak.builder["typing"] == "weak" and weak.digest() != old.digest()
    assert engine_key("warp_network", onnx, "bf16", dev, settings, "10.16.1") != old


def test_build_settings_are_validated_by_option(tmp_path):
    assert BuildSettings().validate().opt_level == 5
    for bad, needle in (
        (BuildSettings(opt_level=7), "--opt-level"),
        (BuildSettings(workspace_gb=0), "--workspace-gb"),
        (BuildSettings(typing="loose"), "--typing"),
        (BuildSettings(plugin=str(tmp_path / "missing.so")), "--plugin"),
        (BuildSettings(calibration=str(tmp_path / "missing.npz")), "--calibration"),
    ):
        with pytest.raises(OptionError, match=needle):
            bad.validate()
    fields = BuildSettings().key_fields("hubert", "strong", False)
    assert fields["profiles"] == {"input_values": [[1, 3240], [1, 6480], [1, 12960]]}


# --- the plugin rewrite -------------------------------------------------------------------------


def grid_model(path: Path) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    nodes = [
        helper.make_node(
            "GridSample",
            ["vol", "grid3"],
            ["out3"],
            name="/warp/GridSample",
            mode="linear",
            padding_mode="zeros",
            align_corners=0,
        ),
        helper.make_node("GridSample", ["img", "grid2"], ["out2"], name="/image/sampler"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            vi("vol", [1, 2, 4, 4, 4]),
            vi("grid3", [1, 3, 3, 3, 3]),
            vi("img", [1, 2, 4, 4]),
            vi("grid2", [1, 3, 3, 2]),
        ],
        [vi("out3", [1, 2, 3, 3, 3]), vi("out2", [1, 2, 3, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.save(model, str(path))
    return path


def test_five_d_grid_samples_become_plugin_nodes(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    src = grid_model(tmp_path / "g.onnx")
    dst = tmp_path / "g.plugin.onnx"
    assert rewrite_grid_sample_for_plugin(src, dst) == 1
    nodes = {n.name: n for n in onnx.load(str(dst)).graph.node}
    plugin = nodes["/warp/GridSample"]
    assert plugin.op_type == "GridSample3D"
    attrs = {a.name: helper.get_attribute_value(a) for a in plugin.attribute}
    assert attrs == {"interpolation_mode": 0, "padding_mode": 0, "align_corners": 0}
    assert nodes["/image/sampler"].op_type == "GridSample"  # 4-D stays native
    assert has_op(dst, "GridSample3D") and not has_op(src, "GridSample3D")
    assert rewrite_grid_sample_for_plugin(dst, tmp_path / "again.onnx") == 0
    assert not (tmp_path / "again.onnx").exists()


# --- without tensorrt --------------------------------------------------------------------------


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is installed here: its absence cannot be tested")
def test_without_tensorrt_the_module_imports_and_says_how_to_install():
    assert "tensorrt" not in sys.modules
    with pytest.raises(BackendUnavailable, match=r"pip install 'talkinghead-studio\[trt\]'"):
        import_tensorrt()
    assert tensorrt_version() is None


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    from studio.fixtures.random_tree import write_checkpoint_tree

    root = tmp_path_factory.mktemp("ck")
    return write_checkpoint_tree(root, reduced=True, networks=["stitch_network"], cfg=False)


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is installed here: its absence cannot be tested")
def test_compile_without_tensorrt_exits_2_with_the_install_hint(tree, tmp_path, capsys):
    out = tmp_path / "engines"
    code = main(
        [
            "compile",
            "--checkpoints",
            str(tree),
            "--out",
            str(out),
            "--precision",
            "stitch_network=fp16",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "tensorrt is not importable" in err
    assert "pip install 'talkinghead-studio[trt]'" in err
    assert not out.exists()  # nothing written


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--opt-level", "9"], "--opt-level: must be 0..5"),
        (["--workspace-gb", "-1"], "--workspace-gb"),
        (["--precision", "vocoder=fp16"], "--precision: vocoder=fp16: unknown network"),
        (["--precision", "decoder=fp7"], "--precision: decoder=fp7: unknown precision"),
        (["--networks", "decoder,vocoder"], "--networks: unknown network 'vocoder'"),
        (["--plugin", "/nonexistent/libgrid_sample_3d_plugin.so"], "--plugin"),
        (["--networks", "decoder"], "holds no .pth or ONNX file for decoder"),
        (["--batch", "0"], "--batch"),
    ],
)
def test_compile_checks_its_arguments_before_tensorrt(tree, tmp_path, capsys, extra, needle):
    code = main(["compile", "--checkpoints", str(tree), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "tensorrt is not importable" not in err


def test_compile_names_a_missing_checkpoint_folder(tmp_path, capsys):
    code = main(["compile", "--checkpoints", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert code == 2 and str(tmp_path / "none") in capsys.readouterr().err


def test_tensorrt_precisions_need_a_gpu_and_modelopt_for_quantization():
    from studio.runtime.precision import parse_precision, precision_support

    support = precision_support("tensorrt", "cpu")
    assert all("TensorRT" in why or "tensorrt" in why for why in support.values())
    with pytest.raises(OptionError, match="--precision: decoder=fp16: tensorrt on cpu"):
        parse_precision("decoder=fp16", "tensorrt", "cpu")


# --- the builder against a stand-in tensorrt ----------------------------------------------------


class _Enum:
    def __init__(self, **values):
        self.__dict__.update(values)


def fake_tensorrt(version: str, parse_ok: bool = True) -> types.ModuleType:
    """Just enough of the tensorrt module for build_engine, recording what it is asked."""
    onnx = pytest.importorskip("onnx")
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = []
    trt.float32 = "float32"
    trt.MemoryPoolType = _Enum(WORKSPACE="workspace")
    trt.NetworkDefinitionCreationFlag = _Enum(STRONGLY_TYPED=5)
    flags = {"TF32": "tf32"}
    if weak_typing_available(version):
        flags.update(FP16="fp16", BF16="bf16", INT8="int8", OBEY_PRECISION_CONSTRAINTS="obey")
    trt.BuilderFlag = _Enum(**flags)
    trt.LayerType = _Enum(GRID_SAMPLE="grid_sample", CONV="conv", PLUGIN_V2="plugin")
    trt.HardwareCompatibilityLevel = _Enum(AMPERE_PLUS="ampere_plus")

    class Logger:
        WARNING, ERROR = 2, 1

        def __init__(self, level):
            self.level = level

    class Layer:
        def __init__(self, name, kind):
            self.name, self.type, self.precision, self.num_outputs = name, kind, None, 1
            self.output_types = {}

        def set_output_type(self, i, dtype):
            self.output_types[i] = dtype

    class Tensor:
        def __init__(self, name, shape):
            self.name, self.shape = name, shape

    class Network:
        def __init__(self, flags):
            self.flags, self.layers, self.inputs = flags, [], []

        num_layers = property(lambda self: len(self.layers))
        num_inputs = property(lambda self: len(self.inputs))

        def get_layer(self, i):
            return self.layers[i]

        def get_input(self, i):
            return self.inputs[i]

    class Parser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        def parse_from_file(self, path):
            trt.calls.append(("parse", Path(path).name))
            if not parse_ok:
                self.errors = ["In node 3 (importGridSample): UNSUPPORTED_NODE"]
                return False
            model = onnx.load(path)
            for n in model.graph.node:
                kind = {"GridSample": "grid_sample", "GridSample3D": "plugin"}.get(
                    n.op_type, "conv"
                )
                self.network.layers.append(Layer(n.name, kind))
            for v in model.graph.input:
                dims = tuple(d.dim_value or -1 for d in v.type.tensor_type.shape.dim)
                self.network.inputs.append(Tensor(v.name, dims))
            return True

        num_errors = property(lambda self: len(self.errors))

        def get_error(self, i):
            return self.errors[i]

    class TimingCache:
        def __init__(self, blob):
            self.blob = bytes(blob)

        def serialize(self):
            return self.blob + b"+timed"

    class Config:
        def __init__(self):
            self.flags, self.limits, self.plugins_to_serialize = set(), {}, []
            self.builder_optimization_level = 3
            self.hardware_compatibility_level = None
            self.profiles = []

        def set_memory_pool_limit(self, pool, size):
            self.limits[pool] = size

        def set_flag(self, flag):
            self.flags.add(flag)

        def clear_flag(self, flag):
            self.flags.discard(flag)

        def create_timing_cache(self, blob):
            trt.calls.append(("timing_cache_loaded", bytes(blob)))
            return TimingCache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            self.timing = cache

        def get_timing_cache(self):
            return self.timing

        def add_optimization_profile(self, profile):
            self.profiles.append(profile)

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = (lo, opt, hi)

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            self.network = Network(flags)
            return self.network

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            trt.calls.append(("build", network, config))
            return b"serialized-engine"

    class Registry:
        def load_library(self, path):
            trt.calls.append(("load_library", Path(path).name))
            return object()

    trt.Logger, trt.Builder, trt.OnnxParser = Logger, Builder, Parser
    trt.init_libnvinfer_plugins = lambda logger, ns: trt.calls.append(("init_plugins", ns))
    registry = Registry()
    trt.get_plugin_registry = lambda: registry
    return trt


@pytest.fixture
def stand_in(monkeypatch):
    """Install a stand-in tensorrt and a pretend GPU; returns a function making the module."""

    def install(version: str = "10.8.0.43", library: object | None = None, **kw):
        trt = fake_tensorrt(version, **kw)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)

        def dlopen(path):  # a statically registered plugin library unless told otherwise
            trt.calls.append(("dlopen", Path(path).name))
            return library if library is not None else types.SimpleNamespace()

        monkeypatch.setattr(trt_plugins, "_dlopen", dlopen)
        for module in (trt_build, trt_run, trt_cache):  # each looks cuda_device up itself
            monkeypatch.setattr(module, "cuda_device", lambda device=None: torch.device("cuda", 0))
        monkeypatch.setattr(trt_build, "_device_facts", lambda device: ("NVIDIA H200", "9.0"))
        monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
        trt_plugins._LOADED_PLUGINS.clear()
        return trt

    return install


# warp_onnx (conftest): fp32 and fp16 exports of a small warp network, shared with other files


def test_strongly_typed_build_with_timing_cache_and_cache_reuse(stand_in, warp_onnx, tmp_path):
    trt = stand_in("11.2.1")
    settings = BuildSettings(opt_level=4, workspace_gb=2)
    messages = []
    path, decision, used = ensure_engine(
        "warp_network", warp_onnx["fp16"], "fp16", "cuda", tmp_path, settings, log=messages.append
    )
    assert decision.action == "build" and path == tmp_path / "warp_network_fp16.engine"
    assert path.read_bytes() == b"serialized-engine"
    ((_, network, config),) = [c for c in trt.calls if c[0] == "build"]
    assert network.flags == 0  # TensorRT 11: always strongly typed, the flag is ignored
    assert config.limits == {"workspace": 2 << 30} and config.builder_optimization_level == 4
    assert "tf32" not in config.flags and config.plugins_to_serialize == []
    assert (tmp_path / "timing.cache").read_bytes() == b"+timed"
    assert ("load_library", "libgrid_sample_3d_plugin.so") not in trt.calls  # native 3-D
    meta = json.loads(ec.metadata_file(path).read_text())
    assert meta["key"]["tensorrt_version"] == "11.2.1" and meta["key"]["gpu_name"] == "NVIDIA H200"
    assert meta["key"]["onnx_sha256"] == ec.file_sha256(warp_onnx["fp16"])
    # Same request: reused, nothing built.
    trt.calls.clear()
    _, again, _ = ensure_engine(
        "warp_network", warp_onnx["fp16"], "fp16", "cuda", tmp_path, settings, log=messages.append
    )
    assert again.action == "reuse" and not [c for c in trt.calls if c[0] == "build"]
    # Another TensorRT: rebuilt with a message, the saved timing cache loaded.
    trt = stand_in("11.3.0")
    _, third, _ = ensure_engine(
        "warp_network", warp_onnx["fp16"], "fp16", "cuda", tmp_path, settings, log=messages.append
    )
    assert third.action == "rebuild"
    assert "built with TensorRT 11.2.1, this is TensorRT 11.3.0" in messages[-2]
    assert ("timing_cache_loaded", b"+timed") in trt.calls


def test_weak_typing_pins_grid_sample_layers_to_fp32(stand_in, warp_onnx, tmp_path):
    trt = stand_in("10.13.0")
    build_engine(
        "decoder_like",
        warp_onnx["fp32"],
        tmp_path / "w.engine",
        "fp16",
        "cuda",
        BuildSettings(typing="weak"),
    )
    ((_, network, config),) = [c for c in trt.calls if c[0] == "build"]
    assert network.flags == 0 and {"fp16", "obey"} <= config.flags
    grids = [layer for layer in network.layers if layer.type == "grid_sample"]
    assert len(grids) == 2
    assert all(
        layer.precision == "float32" and layer.output_types == {0: "float32"} for layer in grids
    )
    meta = json.loads(ec.metadata_file(tmp_path / "w.engine").read_text())
    assert len(meta["grid_sample_fp32_layers"]) == 2


def _build_warp_with_plugin(tmp_path, onnx_path, precision: str, **settings):
    """Build the warp network's engine with a stand-in GridSample3D plugin library."""
    plugin = tmp_path / "libgrid_sample_3d_plugin.so"
    plugin.write_bytes(b"\x7fELF stand-in")
    build_engine(
        "warp_network",
        onnx_path,
        tmp_path / "w.engine",
        precision,
        settings=BuildSettings(plugin=str(plugin), **settings),
    )
    return plugin


def test_old_tensorrt_needs_the_plugin_for_the_warp_network(stand_in, warp_onnx, tmp_path):
    trt = stand_in("10.8.0.43")
    with pytest.raises(BackendUnavailable, match="no 3-D GridSample .* --plugin PATH"):
        build_engine("warp_network", warp_onnx["fp32"], tmp_path / "w.engine", "fp32")
    plugin = _build_warp_with_plugin(tmp_path, warp_onnx["fp32"], "fp32")
    # A statically registered library: opened globally, not handed to load_library.
    assert ("dlopen", plugin.name) in trt.calls
    assert not [c for c in trt.calls if c[0] == "load_library"]
    parsed = [c[1] for c in trt.calls if c[0] == "parse"]
    assert parsed == [f"{warp_onnx['fp32'].stem}.plugin.onnx"]
    ((_, network, config),) = [c for c in trt.calls if c[0] == "build"]
    assert [layer.type for layer in network.layers].count("plugin") == 2
    assert config.plugins_to_serialize == []  # only for version-compatible engines
    meta = json.loads(ec.metadata_file(tmp_path / "w.engine").read_text())
    assert meta["key"]["builder"]["plugin_sha256"] == ec.file_sha256(plugin)
    assert not (tmp_path / ".w.engine.work").exists()


def test_parser_errors_are_raised_not_printed(stand_in, warp_onnx, tmp_path):
    stand_in("11.2.1", parse_ok=False)
    with pytest.raises(RuntimeError, match="cannot parse .* UNSUPPORTED_NODE"):
        build_engine("warp_network", warp_onnx["fp16"], tmp_path / "w.engine", "fp16")
    assert not (tmp_path / "w.engine").exists()


def test_quantized_precisions_need_modelopt(stand_in, warp_onnx, tmp_path, monkeypatch):
    stand_in("11.2.1")
    monkeypatch.setitem(sys.modules, "modelopt", None)  # make the import fail
    monkeypatch.setitem(sys.modules, "modelopt.onnx.quantization", None)
    with pytest.raises(BackendUnavailable, match="nvidia-modelopt"):
        build_engine("warp_network", warp_onnx["fp32"], tmp_path / "w.engine", "int8")


def test_tensorrt_10_strong_build_sets_the_flag_and_no_precision_flags(
    stand_in, warp_onnx, tmp_path
):
    trt = stand_in("10.16.1")
    plugin = tmp_path / "libgrid_sample_3d_plugin.so"
    plugin.write_bytes(b"\x7fELF stand-in")
    build_engine(
        "decoder",
        warp_onnx["fp16"],
        tmp_path / "d.engine",
        "fp16",
        settings=BuildSettings(plugin=str(plugin)),
    )
    ((_, network, config),) = [c for c in trt.calls if c[0] == "build"]
    assert network.flags == 1 << 5  # the stand-in's STRONGLY_TYPED bit
    assert config.flags == set()  # no FP16/OBEY on a strongly typed network, TF32 cleared
    assert all(layer.precision is None for layer in network.layers)  # nothing pinned


def test_weak_int8_quantizes_before_the_plugin_rewrite(stand_in, warp_onnx, tmp_path, monkeypatch):
    """ModelOpt must see standard GridSample nodes; TensorRT then parses the plugin graph."""
    import shutil

    onnx = pytest.importorskip("onnx")
    trt = stand_in("10.8.0.43")
    seen = {}

    def quantize(
        onnx_path, quantize_mode, calibration_data, op_types_to_exclude, output_path, **kw
    ):
        ops = {n.op_type for n in onnx.load(onnx_path).graph.node}
        seen.update(mode=quantize_mode, ops=ops, exclude=op_types_to_exclude, **kw)
        seen["inputs"] = sorted(calibration_data)
        shutil.copyfile(onnx_path, output_path)

    for name in ("modelopt", "modelopt.onnx"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    quant = types.ModuleType("modelopt.onnx.quantization")
    quant.quantize = quantize
    monkeypatch.setitem(sys.modules, "modelopt.onnx.quantization", quant)
    _build_warp_with_plugin(tmp_path, warp_onnx["fp32"], "int8", typing="weak")
    assert seen["mode"] == "int8" and "GridSample" in seen["ops"]
    assert "GridSample3D" not in seen["ops"]
    assert "GridSample" in seen["exclude"] and seen["op_types_to_exclude_fp16"] == ["GridSample"]
    assert seen["inputs"] == sorted(i.name for i in onnx.load(warp_onnx["fp32"]).graph.input)
    parsed = [c[1] for c in trt.calls if c[0] == "parse"]
    assert parsed == [f"{warp_onnx['fp32'].stem}.int8.plugin.onnx"]
    ((_, network, config),) = [c for c in trt.calls if c[0] == "build"]
    assert network.flags == 0 and config.flags == {"int8", "fp16", "obey"}
    plugged = [layer for layer in network.layers if layer.type == "plugin"]
    assert plugged and all(layer.precision == "float32" for layer in plugged)


def test_a_dynamically_registered_plugin_goes_through_load_library_once(stand_in, tmp_path):
    trt = stand_in("10.8.0.43", library=types.SimpleNamespace(getCreators=object()))
    plugin = tmp_path / "libdynamic_plugin.so"
    plugin.write_bytes(b"\x7fELF stand-in")
    first = load_plugin(trt, plugin)
    assert load_plugin(trt, plugin) is first  # once per process
    assert [c for c in trt.calls if c[0] in ("dlopen", "load_library")] == [
        ("dlopen", plugin.name),
        ("load_library", plugin.name),
    ]


def test_a_plugin_library_that_does_not_load_is_an_input_error(stand_in, tmp_path, monkeypatch):
    trt = stand_in("10.8.0.43")

    def broken(path):
        raise OSError("undefined symbol: getPluginRegistry")

    monkeypatch.setattr(trt_plugins, "_dlopen", broken)
    plugin = tmp_path / "libgrid_sample_3d_plugin.so"
    plugin.write_bytes(b"not a library")
    with pytest.raises(InputError, match="cannot load the plugin library .*undefined symbol"):
        load_plugin(trt, plugin)
    with pytest.raises(InputError, match="does not exist"):
        load_plugin(trt, tmp_path / "missing.so")


# --- the runner's stream and graph logic, on stand-ins ---------------------------------------


class _Stream:
    def __init__(self, handle, log):
        self.cuda_stream, self.log = handle, log

    def wait_stream(self, other):
        self.log.append(("wait", self.cuda_stream, other.cuda_stream))

    def synchronize(self):
        self.log.append(("sync", self.cuda_stream))


class _Context:
    def __init__(self, log, ok=True):
        self.log, self.ok = log, ok

    def execute_async_v3(self, stream):
        self.log.append(("execute", stream))
        return self.ok

    def set_tensor_address(self, name, ptr):
        return True

    def set_input_shape(self, name, shape):
        return tuple(shape) == (1, 3)


def bare_runner(monkeypatch, current: int, ok: bool = True):
    """A TensorRTEngine without TensorRT or a GPU: stand-in context and streams."""
    from studio.runtime.base import TensorSpec

    log: list = []
    eng = object.__new__(TensorRTEngine)
    spec = TensorSpec("x", (1, 3), torch.float32)
    EngineBase.__init__(eng, "stitch_network", "fp32", torch.device("cuda", 0), (spec,), ())
    eng._context = _Context(log, ok)
    eng._buffers = {"x": torch.zeros(1, 3)}
    eng._bound, eng._dynamic, eng._graph, eng._side = {}, set(), None, None
    streams = {"current": _Stream(current, log), "side": _Stream(0xBEEF, log)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams["current"])
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: streams["side"])
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync", "all")))
    return eng, log


def test_the_runner_enqueues_on_the_callers_stream_when_it_is_not_a_default_one(monkeypatch):
    eng, log = bare_runner(monkeypatch, current=0x1234)
    eng._enqueue()
    assert log == [("execute", 0x1234)]


def test_the_runner_avoids_the_default_stream_with_device_side_waits(monkeypatch):
    eng, log = bare_runner(monkeypatch, current=0)
    eng._enqueue()
    eng._enqueue()
    # Side stream after the caller's work, execute there, the caller's stream after it; the
    # side stream is made once.
    assert log == [("wait", 0xBEEF, 0), ("execute", 0xBEEF), ("wait", 0, 0xBEEF)] * 2


def test_a_failed_enqueue_is_an_error_and_a_shape_outside_the_profile_too(monkeypatch):
    eng, _ = bare_runner(monkeypatch, current=0x1234, ok=False)
    with pytest.raises(RuntimeError, match="stitch_network: TensorRT execute_async_v3 failed"):
        eng._enqueue()
    eng._set_input_shape("x", (1, 3))
    with pytest.raises(ValueError, match=r"refused shape \(9, 3\) for x .*optimization profile"):
        eng._set_input_shape("x", (9, 3))


def test_capture_warms_up_once_and_stays_eager_when_capture_fails(monkeypatch):
    eng, log = bare_runner(monkeypatch, current=0x1234)

    def not_capturable(fn, warmup):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(trt_run, "capture_cuda_graph", not_capturable)
    assert eng.capture() is False
    assert eng._graph is None and not eng.captured
    assert log[:2] == [("execute", 0x1234), ("sync", 0x1234)]  # eager enqueue, then a sync
    assert log[-1] == ("sync", "all")
    captured = []

    def capture_ok(fn, warmup):
        captured.append(warmup)
        return "graph", None

    monkeypatch.setattr(trt_run, "capture_cuda_graph", capture_ok)
    assert eng.capture() is True and eng.captured and eng._graph == "graph"
    assert eng.static_inputs == {"x": eng._buffers["x"]} and captured == [1]
    assert eng.capture() is True and captured == [1]  # captured once


def test_dynamic_engines_are_not_captured(monkeypatch):
    eng, log = bare_runner(monkeypatch, current=0x1234)
    eng._dynamic = {"x"}
    assert eng.capture() is False and log == []


# --- real TensorRT ----------------------------------------------------------------------------


@pytest.fixture
def real_trt():
    pytest.importorskip("tensorrt", reason="tensorrt is not installed (pip install '.[trt]')")
    if not torch.cuda.is_available():
        pytest.skip("TensorRT needs a CUDA GPU (torch sees none here)")


def test_tensorrt_engine_builds_runs_and_matches_torch(real_trt, tmp_path):
    from studio.fixtures.random_tree import random_network
    from studio.runtime.onnx_cache import export_for_engine
    from studio.runtime.torch_backend import TorchEngine

    for network, precision in (("stitch_network", "fp32"), ("decoder", "fp16"), ("lmdm", "fp32")):
        m = random_network(network, reduced=True)
        ref = TorchEngine(network, m, "fp32", "cuda", batch=2)
        graph = graph_precision(precision, "strong")
        onnx = export_for_engine(network, m, tmp_path / "onnx", batch=2, precision=graph)
        eng = cached_engine(network, onnx, precision, "cuda", tmp_path, stem=f"{network}_b2")
        assert [(s.name, s.shape) for s in eng.inputs] == [(s.name, s.shape) for s in ref.inputs]
        assert [(s.name, s.shape) for s in eng.outputs] == [(s.name, s.shape) for s in ref.outputs]
        feed = ref.example_feed(3)
        want = ref.run(feed)
        got = {k: v.clone() for k, v in eng.run(feed).items()}
        for name in want:
            cos = torch.nn.functional.cosine_similarity(
                got[name].double().flatten(), want[name].double().flatten(), dim=0
            )
            assert float(cos) >= 0.999, (network, name)
        assert eng.capture()
        again = eng.run(feed)
        for name in want:
            assert torch.allclose(again[name], got[name], rtol=1e-3, atol=1e-4)


def test_tensorrt_rebuilds_an_engine_it_cannot_deserialize(real_trt, tmp_path):
    from studio.fixtures.random_tree import random_network
    from studio.runtime.onnx_cache import export_for_engine

    m = random_network("stitch_network", reduced=True)
    onnx = export_for_engine("stitch_network", m, tmp_path / "onnx")
    eng = cached_engine("stitch_network", onnx, "fp32", "cuda", tmp_path)
    path = eng.path
    del eng
    data = bytearray(path.read_bytes())
    data[:64] = b"\0" * 64  # a damaged header, same size: only deserialization notices
    path.write_bytes(bytes(data))
    messages = []
    eng = cached_engine("stitch_network", onnx, "fp32", "cuda", tmp_path, log=messages.append)
    assert eng.run(eng.example_feed())["out"].shape == (1, 21, 3)
    assert any("cannot deserialize" in m for m in messages), messages


def test_compile_builds_then_keeps_current_engines(stand_in, tree, tmp_path, monkeypatch, capsys):
    """`studio compile` end to end on the stand-in: export, build, reuse, --force."""
    import studio.runtime.base as base
    import studio.runtime.onnx_cache as onnx_cache
    import studio.runtime.precision as precision

    stand_in("11.2.1")
    monkeypatch.setattr(base, "resolve_device", lambda d=None: torch.device("cuda", 0))
    monkeypatch.setattr(
        precision, "precision_support", lambda b, d: dict.fromkeys(precision.PRECISIONS)
    )
    export = onnx_cache.export_for_engine
    monkeypatch.setattr(  # trace on the CPU here (a GPU machine traces on its GPU)
        onnx_cache, "export_for_engine", lambda *a, **k: export(*a, **{**k, "device": "cpu"})
    )
    out = tmp_path / "engines"
    args = [
        "compile",
        "--checkpoints",
        str(tree),
        "--out",
        str(out),
        "--batch",
        "4",
        "--precision",
        "stitch_network=fp16",
        "--json",
        str(tmp_path / "s.json"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "stitch_network" in text and "stitch_network_b4_fp16.engine: built" in text
    summary = json.loads((tmp_path / "s.json").read_text())
    record = summary["networks"]["stitch_network"]
    assert record["onnx_source"] == "exported" and ".b4.fp16." in record["onnx"]
    assert (out / "stitch_network_b4_fp16.engine").is_file() and (out / "timing.cache").is_file()
    assert main(args) == 0
    assert "current, kept" in capsys.readouterr().out
    assert main([*args, "--force"]) == 0
    captured = capsys.readouterr()
    assert "rebuilt" in captured.out and "asked to (--force)" in captured.err
