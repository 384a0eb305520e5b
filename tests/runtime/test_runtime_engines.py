"""Engines: torch vs ONNX Runtime parity on the CPU, precision policy and parsing, the factory,
and (on a GPU) fp16/bf16/CUDA-graph paths against fp32 eager."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from studio.errors import InputError, OptionError
from studio.fixtures.random_tree import random_network, write_checkpoint_tree
from studio.models import NETWORK_NAMES
from studio.runtime.base import Engine
from studio.runtime.factory import make_engine
from studio.runtime.network_digest import weights_sha256
from studio.runtime.onnx_cache import export_for_engine
from studio.runtime.onnxruntime_backend import OrtEngine
from studio.runtime.precision import (
    DEFAULT_PRECISION,
    ENGINE_NETWORKS,
    backends_report,
    parse_precision,
    precision_support,
)
from studio.runtime.torch_backend import TorchEngine

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch sees none here)")
# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")
# Batched where the renderer batches (warp and decoder run a batch of frames at once).
BATCH = {"warp_network": 2, "decoder": 2}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double().flatten().cpu(), b.double().flatten().cpu(), dim=0))


@pytest.fixture(scope="module")
def nets():
    return {n: random_network(n, reduced=True) for n in NETWORK_NAMES}


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.mark.parametrize("network", NETWORK_NAMES)
def test_torch_and_onnxruntime_agree_in_fp32_on_cpu(network, nets, onnx_dir, one_torch_thread):
    """Every network, reduced: same I/O specs, relative L2 <= 1e-4 per output."""
    batch = BATCH.get(network, 1)
    te = TorchEngine(network, nets[network], "fp32", "cpu", batch=batch)
    path = export_for_engine(network, nets[network], onnx_dir, batch=batch, verify=False)
    oe = OrtEngine(network, path, "fp32", "cpu", threads=1)
    assert isinstance(te, Engine) and isinstance(oe, Engine)
    assert te.inputs == oe.inputs and te.outputs == oe.outputs
    assert te.batch == oe.batch == batch
    for seed in (0, 1):
        feed = te.example_feed(seed)
        a, b = te.run(feed), oe.run(feed)
        assert list(a) == list(b) == list(te.output_names)
        for name in a:
            assert a[name].dtype == b[name].dtype == torch.float32
            assert rel_l2(b[name], a[name]) <= 1e-4, (network, name)


def test_export_cache_reuses_and_keys_on_weights(nets, onnx_dir, one_torch_thread):
    m = nets["stitch_network"]
    first = export_for_engine("stitch_network", m, onnx_dir, verify=False)
    mtime = first.stat().st_mtime_ns
    assert export_for_engine("stitch_network", m, onnx_dir, verify=False) == first
    assert first.stat().st_mtime_ns == mtime  # reused, not rewritten
    other = random_network("stitch_network", reduced=True, seed=1)
    assert weights_sha256(other) != weights_sha256(m)
    assert export_for_engine("stitch_network", other, onnx_dir, verify=False) != first
    assert export_for_engine("stitch_network", m, onnx_dir, batch=3, verify=False) != first


def test_a_damaged_export_is_said_and_exported_again(nets, tmp_path, caplog, one_torch_thread):
    m = nets["stitch_network"]
    path = export_for_engine("stitch_network", m, tmp_path, verify=False)
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0xFF  # still a file of the right size: only its sum tells
    for bad in (bytes(damaged), good[: len(good) // 3]):
        path.write_bytes(bad)
        caplog.clear()
        assert export_for_engine("stitch_network", m, tmp_path, verify=False) == path
        assert path.read_bytes() == good  # the export is deterministic: the same file again
        assert "is corrupt" in caplog.text and "exporting it again" in caplog.text
    path.with_name(path.name + ".sha256").unlink()  # no record of what was written
    caplog.clear()
    export_for_engine("stitch_network", m, tmp_path, verify=False)
    assert "recorded SHA-256 is missing" in caplog.text and path.read_bytes() == good
    cut = tmp_path / "given.onnx"  # a file given to the runtime (no cache record): one line
    cut.write_bytes(good[: len(good) // 3])
    with pytest.raises(InputError, match="ONNX Runtime cannot open it .*; replace the file"):
        OrtEngine("stitch_network", cut, "fp32", "cpu", threads=1)


def test_feed_is_validated_by_name_shape_and_dtype(nets):
    e = TorchEngine("stitch_network", nets["stitch_network"], "fp32", "cpu")
    feed = e.example_feed()
    with pytest.raises(ValueError, match="missing kp_driving"):
        e.run({"kp_source": feed["kp_source"]})
    with pytest.raises(ValueError, match="unexpected extra"):
        e.run({**feed, "extra": feed["kp_source"]})
    with pytest.raises(ValueError, match=r"kp_source must be \[1x21x3\]"):
        e.run({**feed, "kp_source": torch.zeros(2, 21, 3)})
    with pytest.raises(ValueError, match="kp_driving must be float32"):
        e.run({**feed, "kp_driving": feed["kp_driving"].double()})
    lm = TorchEngine("lmdm", nets["lmdm"], "fp32", "cpu")
    f = lm.example_feed()
    out = lm.run({**f, "time_cond": f["time_cond"].int()})  # int32 timesteps are accepted
    assert torch.equal(out["x_start"], lm.run(f)["x_start"])


def test_run_reads_nothing_back_to_the_host(nets, host_reads, one_torch_thread):
    e = TorchEngine("decoder", nets["decoder"], "fp32", "cpu", batch=2)
    feed = e.example_feed()
    with host_reads() as calls:
        e.run(feed)
    assert calls == []


@pytest.mark.parametrize(
    ("network", "mode"),
    [("lmdm", "cast"), ("decoder", "cast"), ("warp_network", "autocast"), ("lmdm", "autocast")],
)
def test_bf16_on_cpu_stays_close_to_fp32(network, mode, nets, one_torch_thread):
    ref = TorchEngine(network, nets[network], "fp32", "cpu", batch=2)
    low = TorchEngine(network, nets[network], "bf16", "cpu", batch=2, mode=mode)
    feed = ref.example_feed(2)
    a, b = ref.run(feed), low.run(feed)
    for name in a:
        assert b[name].dtype == torch.float32  # fp32 I/O like the released engines
        assert cosine(b[name], a[name]) >= 0.999, name


def test_cast_mode_keeps_the_lmdm_schedule_and_time_mlp_fp32(nets):
    e = TorchEngine("lmdm", nets["lmdm"], "bf16", "cpu", mode="cast")
    inner = e.adapter.inner
    assert inner.noise_tables.dtype == inner.alphas_cumprod.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in inner.time_mlp.parameters())
    assert inner.final_layer.weight.dtype == torch.bfloat16
    assert nets["lmdm"].final_layer.weight.dtype == torch.float32  # the caller's module untouched


@pytest.mark.parametrize("mode", ["cast", "autocast"])
def test_the_lmdm_engine_runs_the_networks_own_step(nets, mode, one_torch_thread):
    """The runtime knows no LMDM step: its half engine is the module's own forward on the
    runtime's weights, with ``x`` passed in fp32 (FP32_INPUTS) and the rest in the compute
    dtype (guidance and noise prediction are the module's, in fp32)."""
    e = TorchEngine("lmdm", nets["lmdm"], "bf16", "cpu", batch=2, mode=mode)
    feed = e.example_feed(2)
    out = e.run(feed)
    low = torch.bfloat16 if mode == "cast" else torch.float32
    x, cf, cond, t = (feed[n] for n in ("x", "cond_frame", "cond", "time_cond"))
    with torch.no_grad(), e.adapter.policy():
        want = e.adapter.inner(x, cf.to(low), cond.to(low), t)
    for name, w in zip(("pred_noise", "x_start"), want, strict=True):
        assert out[name].dtype == w.dtype == torch.float32
        assert torch.equal(out[name], w), name


def test_an_adapter_of_the_same_policy_is_shared_and_another_refused(nets):
    first = TorchEngine("decoder", nets["decoder"], "bf16", "cpu", mode="cast", batch=1)
    second = TorchEngine("decoder", first.adapter, "bf16", "cpu", mode="cast", batch=2)
    assert second.adapter is first.adapter  # one cast copy of the weights for both batches
    with pytest.raises(ValueError, match="cannot serve fp32"):
        TorchEngine("decoder", first.adapter, "fp32", "cpu")
    with pytest.raises(ValueError, match="cannot serve"):
        TorchEngine("warp_network", first.adapter, "bf16", "cpu", mode="cast")


def test_warp_defaults_to_autocast_and_cast_keeps_grid_sample_fp32(nets, monkeypatch):
    assert TorchEngine("warp_network", nets["warp_network"], "bf16", "cpu").mode == "autocast"
    e = TorchEngine("warp_network", nets["warp_network"], "bf16", "cpu", mode="cast")
    seen = []
    original = torch.grid_sampler  # what F.grid_sample calls last

    def spy(inp, grid, *args):
        seen.append((inp.dtype, grid.dtype))
        return original(inp, grid, *args)

    monkeypatch.setattr(torch, "grid_sampler", spy)
    out = e.run(e.example_feed())
    assert len(seen) == 2 and set(seen) == {(torch.float32, torch.float32)}
    assert out["out"].dtype == torch.float32


def test_half_export_is_typed_with_fp32_io_and_grid_sample(warp_onnx):
    """export_for_engine(..., precision="fp16") of the warp network (the conftest fixture)."""
    onnx = pytest.importorskip("onnx")
    model = onnx.shape_inference.infer_shapes(onnx.load(str(warp_onnx["fp16"])))
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    types.update({v.name: v.type.tensor_type.elem_type for v in model.graph.input})
    grids = [n for n in model.graph.node if n.op_type == "GridSample"]
    assert len(grids) == 2
    assert all(types[i] == onnx.TensorProto.FLOAT for n in grids for i in n.input)
    assert {v.type.tensor_type.elem_type for v in model.graph.output} == {onnx.TensorProto.FLOAT}
    halves = [t for t in types.values() if t == onnx.TensorProto.FLOAT16]
    assert halves  # the convolutions run in fp16


# --- precision parsing ---------------------------------------------------------------------


def test_precision_defaults_follow_the_released_set():
    plan = parse_precision(None)
    assert plan.by_network == DEFAULT_PRECISION
    assert {n for n, p in plan.by_network.items() if p == "fp32"} == {
        "hubert",
        "lmdm",
        "motion_extractor",
    }
    plan = parse_precision("lmdm=fp16, decoder=bf16")
    assert plan.of("lmdm") == "fp16" and plan.of("decoder") == "bf16"
    assert plan.of("warp_network") == "fp16" and plan.explicit == {"lmdm", "decoder"}
    assert set(parse_precision("fp32").by_network.values()) == {"fp32"}
    assert parse_precision({"lmdm_v0.4_hubert": "half"}).of("lmdm") == "fp16"
    assert set(parse_precision(None).by_network) == set(ENGINE_NETWORKS)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("vocoder=fp16", "unknown network 'vocoder'"),
        ("decoder=fp12", "unknown precision 'fp12'"),
        ("decoder=fp16,decoder=fp32", "decoder is given twice"),
        ("fp16,bf16", "two precisions"),
    ],
)
def test_precision_errors_name_the_option(spec, needle):
    with pytest.raises(OptionError, match=needle) as info:
        parse_precision(spec, option="--precision")
    assert str(info.value).startswith("--precision: ")


def test_unsupported_precision_is_an_error_only_when_asked_for():
    with pytest.raises(OptionError, match=r"--precision: decoder=fp16: torch on cpu cannot run"):
        parse_precision("decoder=fp16", "torch", "cpu")
    with pytest.raises(OptionError, match="fp8 and int8 run only in TensorRT"):
        parse_precision("lmdm=int8", "torch", "cpu")
    plan = parse_precision(None, "torch", "cpu")  # default fp16 falls back on the CPU
    assert plan.of("decoder") == "fp32" and any("decoder" in n for n in plan.notes)
    assert parse_precision("decoder=bf16", "torch", "cpu").of("decoder") == "bf16"
    with pytest.raises(OptionError, match="onnxruntime on cpu cannot run bf16"):
        parse_precision("decoder=bf16", "onnxruntime", "cpu")
    trt = precision_support("tensorrt", "cpu")
    assert all(why is not None for why in trt.values())


def test_backends_report_says_what_runs_here():
    report = backends_report()
    cpu = report["torch"]["cpu"]
    assert cpu["usable"] and {"fp32", "bf16"} <= set(cpu["precisions"])
    assert "fp16" in cpu["unsupported"]
    assert report["onnxruntime"]["cpu"]["precisions"] == ["fp32"]
    for kind in report["tensorrt"].values():
        assert kind["usable"] == (kind["reason"] is None)
    if not CUDA:
        assert "no CUDA GPU" in report["torch"]["cuda"]["reason"]


def test_doctor_has_a_backends_section_and_keeps_its_keys():
    from studio.doctor import collect, format_text

    info = collect()
    for key in ("torch", "onnxruntime", "tensorrt", "qt", "pyav", "backends"):
        assert key in info
    text = format_text(info)
    assert "backends" in text and "torch cpu:" in text and "tensorrt cuda:" in text


# --- the factory ------------------------------------------------------------------------------


def test_make_engine_from_a_checkpoint_tree(tmp_path, one_torch_thread):
    tree = write_checkpoint_tree(tmp_path / "ck", reduced=True, networks=["decoder"], cfg=False)
    cache = tmp_path / "cache"
    te = make_engine("decoder", "torch", "fp32", "cpu", checkpoints=tree, batch=2)
    oe = make_engine(
        "decoder", "onnxruntime", None, "cpu", checkpoints=tree, batch=2, cache_dir=cache, threads=1
    )
    assert oe.precision == "fp32"  # the fp16 default is not available in ORT on the CPU
    assert len(list((cache / "onnx").glob("decoder.b2.fp32.*.onnx"))) == 1
    feed = te.example_feed(4)
    assert rel_l2(oe.run(feed)["output"], te.run(feed)["output"]) <= 1e-4
    assert not te.capture()  # no CUDA graphs on the CPU
    with pytest.raises(InputError, match="hubert has no torch module"):
        make_engine("hubert", "torch", device="cpu", checkpoints=tree)
    with pytest.raises(InputError, match="unknown network"):
        make_engine("vocoder", "torch", device="cpu", checkpoints=tree)
    with pytest.raises(OptionError, match="--precision: decoder=fp16"):
        make_engine("decoder", "torch", "fp16", "cpu", checkpoints=tree)
    if not CUDA:
        with pytest.raises(InputError, match="no CUDA GPU"):
            make_engine("decoder", "torch", device="cuda", checkpoints=tree)


# --- on a GPU -----------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("network", NETWORK_NAMES)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_half_precision_matches_fp32(network, precision, nets):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    ref = TorchEngine(network, nets[network], "fp32", "cuda", batch=BATCH.get(network, 1))
    for mode in ("cast", "autocast"):
        if network == "warp_network" and precision == "bf16" and mode == "cast":
            continue  # bf16 keypoint grids are too coarse for cast mode: autocast is the default
        low = TorchEngine(network, nets[network], precision, "cuda", batch=ref.batch, mode=mode)
        feed = ref.example_feed(5)
        a, b = ref.run(feed), low.run(feed)
        for name in a:
            assert cosine(b[name], a[name]) >= 0.999, (mode, name)


@needs_cuda
@pytest.mark.parametrize("network", NETWORK_NAMES)
def test_cuda_graph_replays_match_eager(network, nets):
    batch = BATCH.get(network, 1)
    eager = TorchEngine(network, nets[network], "fp32", "cuda", batch=batch)
    for precision in ("fp32", "fp16"):
        g = TorchEngine(network, nets[network], precision, "cuda", batch=batch)
        assert g.capture() and g.captured
        for seed in (0, 1):  # fresh inputs copied into the static buffers on every replay
            feed = eager.example_feed(seed)
            want = eager.run(feed)
            got = {k: v.clone() for k, v in g.run(feed).items()}
            for name in want:
                assert cosine(got[name], want[name]) >= 0.999, (precision, name)
        # Writing straight into the static inputs skips the copy.
        feed = eager.example_feed(7)
        for name, buf in g.static_inputs.items():
            buf.copy_(feed[name])
        got = g.run(g.static_inputs)
        want = eager.run(feed)
        assert all(cosine(got[n], want[n]) >= 0.999 for n in want)


def test_channels_last_path_matches_on_the_cpu(nets):
    ref = TorchEngine("decoder", nets["decoder"], "fp32", "cpu", batch=2)
    cl = TorchEngine("decoder", nets["decoder"], "fp32", "cpu", batch=2, channels_last=True)
    feed = ref.example_feed(1)
    torch.testing.assert_close(cl.run(feed)["output"], ref.run(feed)["output"])


@needs_cuda
def test_cuda_channels_last_path(nets):
    ref = TorchEngine("decoder", nets["decoder"], "fp32", "cuda", batch=2)
    cl = TorchEngine("decoder", nets["decoder"], "fp16", "cuda", batch=2, channels_last=True)
    feed = ref.example_feed(1)
    assert cosine(cl.run(feed)["output"], ref.run(feed)["output"]) >= 0.999
    assert cl.capture()
    assert cosine(cl.run(feed)["output"], ref.run(feed)["output"]) >= 0.999


@needs_cuda
def test_cuda_run_does_not_sync_with_the_host(nets, host_reads):
    e = TorchEngine("warp_network", nets["warp_network"], "fp16", "cuda", batch=2)
    feed = e.example_feed()
    with host_reads() as calls:
        e.run(feed)
        e.capture()
        e.run(feed)
    assert calls == []


@needs_cuda
def test_onnxruntime_cuda_iobinding_matches_torch(nets, onnx_dir):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("ONNX Runtime has no CUDAExecutionProvider here (onnxruntime-gpu)")
    for network in ("decoder", "lmdm", "warp_network"):
        batch = BATCH.get(network, 1)
        te = TorchEngine(network, nets[network], "fp32", "cuda", batch=batch)
        path = export_for_engine(network, nets[network], onnx_dir, batch=batch, verify=False)
        oe = OrtEngine(network, path, "fp32", "cuda")
        for seed in (0, 1):
            feed = te.example_feed(seed)
            a, b = te.run(feed), oe.run(feed)
            for name in a:
                assert b[name].device.type == "cuda"
                assert rel_l2(b[name], a[name]) <= 1e-3, (network, name)


def test_hubert_runs_in_onnxruntime_with_its_dynamic_length(tmp_path):
    from studio.fixtures.hubert_standin import build_hubert_standin

    path = build_hubert_standin(tmp_path / "hubert.onnx")
    e = make_engine("hubert", "onnxruntime", device="cpu", onnx=path)
    assert e.precision == "fp32" and e.inputs[0].shape == (1, -1)
    for n, frames in ((6480, 20), (3240, 9)):  # (N - 400) // 320 + 1
        out = e.run({"input_values": torch.randn(1, n)})["encoding_out"]
        assert tuple(out.shape) == (frames, 1024)
    with pytest.raises(ValueError, match=r"input_values must be \[1xN\]"):
        e.run({"input_values": torch.randn(2, 6480)})


def test_cuda_provider_options_give_the_session_its_stream_and_tf32_switch():
    from studio.runtime.onnxruntime_backend import cuda_provider_options

    opts = cuda_provider_options(1, 0x7F00_1234, tf32=False)
    # Strings, as ORT's provider-option parser reads them; user_compute_stream alone also
    # sets has_user_compute_stream there.
    assert opts == {"device_id": "1", "user_compute_stream": str(0x7F00_1234), "use_tf32": "0"}
    assert cuda_provider_options(0, 5, tf32=True)["use_tf32"] == "1"
    with pytest.raises(ValueError, match="ignores stream 0"):
        cuda_provider_options(0, 0, tf32=False)  # torch's default stream: ORT would drop it


def test_iobinding_element_types():
    import numpy as np

    from studio.runtime.base import BackendUnavailable
    from studio.runtime.onnxruntime_backend import element_type

    assert element_type(torch.float32) is np.float32 and element_type(torch.int64) is np.int64
    assert element_type(torch.float16) is np.float16 and element_type(torch.bool) is np.bool_
    onnx = pytest.importorskip("onnx")
    assert element_type(torch.bfloat16) == onnx.TensorProto.BFLOAT16  # numpy has no bf16
    with pytest.raises(BackendUnavailable, match="no torch.complex64"):
        element_type(torch.complex64)


def test_the_iobinding_calls_of_the_cuda_path_run_on_this_onnxruntime(nets, onnx_dir):
    """The CUDA path's IOBinding calls, made with device "cpu" against the installed ORT:
    bind_input/bind_output by pointer with shape and element type, run_with_iobinding with the
    no-sync run option, and a device-allocated output read back with copy_outputs_to_cpu."""
    ort = pytest.importorskip("onnxruntime")
    from studio.runtime.onnxruntime_backend import RUN_NO_SYNC, element_type

    path = export_for_engine("stitch_network", nets["stitch_network"], onnx_dir, verify=False)
    ref = OrtEngine("stitch_network", path, "fp32", "cpu", threads=1)
    feed = {s.name: torch.randn(s.shape) for s in ref.inputs}
    want = ref.run(feed)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    options = ort.RunOptions()
    options.add_run_config_entry(RUN_NO_SYNC, "1")
    for preallocate in (True, False):
        io = session.io_binding()
        for s in ref.inputs:
            t = feed[s.name].contiguous()
            io.bind_input(s.name, "cpu", 0, element_type(s.dtype), tuple(t.shape), t.data_ptr())
        out = {s.name: torch.empty(s.shape, dtype=s.dtype) for s in ref.outputs}
        for s in ref.outputs:
            if preallocate:
                ptr = out[s.name].data_ptr()
                io.bind_output(s.name, "cpu", 0, element_type(s.dtype), s.shape, ptr)
            else:
                io.bind_output(s.name, "cpu", 0)
        session.run_with_iobinding(io, options)
        if not preallocate:
            got = io.copy_outputs_to_cpu()
            out = {s.name: torch.from_numpy(v) for s, v in zip(ref.outputs, got, strict=True)}
        for name, w in want.items():
            assert torch.allclose(out[name], w, atol=1e-6), (preallocate, name)


def test_compiled_engines_get_room_in_dynamos_cache(nets, monkeypatch):
    """Every compiled engine compiles the adapter's one forward: past Dynamo's default of 8
    graphs per code object the rest would silently run eagerly."""
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **k: compiled.append(k) or m)  # no codegen
    # the config's own patch: monkeypatch's undo deletes the option, hiding it from Dynamo
    with cfg.patch({name: 8}):
        TorchEngine("stitch_network", nets["stitch_network"], "fp32", torch.device("cpu"))
        assert getattr(cfg, name) == 8 and not compiled  # an eager engine changes nothing
        for batch in (1, 2, 3):
            TorchEngine(
                "stitch_network",
                nets["stitch_network"],
                "fp32",
                torch.device("cpu"),
                batch=batch,
                compile=True,
            )
        assert len(compiled) == 3 and getattr(cfg, name) >= 64


def _export_in_a_process(out_dir: str, barrier, results) -> None:
    """One process of the cold-cache race: the reduced stitch network exported for an engine,
    the export slowed down so that the other process arrives while it runs."""
    import logging

    from conftest import slow_down

    import studio.models.onnx_export as onnx_export

    torch.set_num_threads(1)
    slow_down(onnx_export, "export_module")
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    log = logging.getLogger("studio")
    log.addHandler(Keep())
    log.setLevel(logging.INFO)
    net = random_network("stitch_network", reduced=True)  # the same weights in both
    barrier.wait()
    path = export_for_engine("stitch_network", net, out_dir, verify=False)
    results.put((str(path), said))


def test_two_processes_on_a_cold_cache_export_once(tmp_path, monkeypatch):
    """Two real processes export the same network into an empty cache at the same time: one
    exports (one notice, one file), the other waits for it and reuses its file."""
    import multiprocessing

    monkeypatch.setenv("STUDIO_CACHE_DIR", str(tmp_path / "cache"))  # the locks go here
    out = tmp_path / "onnx"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_export_in_a_process, args=(str(out), barrier, results))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (path,) = {g[0] for g in got}  # both have the same file
    notices = [m for _, said in got for m in said if m.startswith("exporting")]
    assert len(notices) == 1, [said for _, said in got]
    name = Path(path).name  # one file and its recorded sum, no partial left
    assert sorted(p.name for p in out.iterdir()) == [name, f"{name}.sha256"]
