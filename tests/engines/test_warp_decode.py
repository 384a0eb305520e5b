"""The renderer's warp + decode engines: equal to the modules run eagerly, short batches padded,
the ladder of batch sizes and its eviction; ONNX Runtime; on a GPU the captured fp16 path."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import SMALL_WARP_MAPS, small_warp_network

from studio.engines.ditto import warp_decode
from studio.engines.ditto.warp_decode import (
    MAX_BATCH_SIZES,
    WarpDecodeEngines,
    prebuild_rungs,
    static_batch,
)
from studio.fixtures.random_tree import random_network

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)"
)


@pytest.fixture(scope="module")
def modules():
    """A small warp network and the reduced decoder on 16x16 maps instead of the product's
    64x64 (the decoder would paint 512x512 images): engines of up to 16 frames build in a
    fraction of a second. While the fixture lives, engines take the decoder's static input
    size from the small maps too (WarpDecodeEngines reads FEATURE_SIZE when built)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warp_decode, "FEATURE_SIZE", SMALL_WARP_MAPS)
        yield small_warp_network(), random_network("decoder", reduced=True)


def _inputs(warp, frames: int, device: str = "cpu"):
    f_s, x_s, x_d = warp.example_inputs(frames)
    return f_s[:1].to(device), x_s.to(device), x_d.to(device)


def _eager(modules, f_s, x_s, x_d):
    warp, decoder = modules
    with torch.no_grad():
        return decoder(warp(f_s.expand(x_d.shape[0], *f_s.shape[1:]), x_s, x_d))


def test_static_batches_climb_a_short_ladder() -> None:
    # 165 frames at cap 32: five full batches and a tail of 5 on the 8-frame engines
    assert [static_batch(n, 32) for n in (32, 5, 1, 17, 25, 40)] == [32, 8, 1, 24, 32, 32]
    assert static_batch(3, 20) == 4 and static_batch(17, 20) == 20  # a cap off the ladder
    assert static_batch(0, 8) == 1


def test_engines_of_the_least_recently_used_batch_sizes_are_freed(modules, one_torch_thread):
    wd = WarpDecodeEngines(*modules, "auto", torch.device("cpu"))
    sizes = [1, 2, 4, 8, 1, 16]  # 1 is used again before 16 arrives: 2 goes
    first = wd.engines(1)
    for b in sizes[1:]:
        wd.engines(b)
    assert len(wd._engines) == MAX_BATCH_SIZES and set(wd._engines) == {4, 8, 1, 16}
    assert wd.engines(1) is first  # kept, not rebuilt
    for name in ("warp_network", "decoder"):  # one copy of the weights for every batch size
        assert wd.engines(16)[name].adapter is first[name].adapter
    assert wd.batch_for(3, 32) == 4 and wd.batch_for(5, 32) == 8  # built rungs up to 2x reused
    assert wd.batch_for(17, 32) == 24  # no built rung near: the ladder's
    for b in (4, 8):
        del wd._engines[b]
    assert wd.batch_for(3, 16) == 4  # 16 is more than twice 4: a rung of its own
    wd.compiled = True  # (on a GPU) another compiled rung costs seconds: pad to a built one
    assert wd.batch_for(3, 16) == 16 and wd.batch_for(1, 16) == 1
    assert wd.batch_for(3, 32) == 4  # under a quarter of the cap (a live call): its own rung
    assert wd.batch_for(17, 32) == 24  # none built holds them: the ladder's


@pytest.mark.parametrize("cap", [32, 20, 48, 128, 4, 1])
def test_the_prebuild_builds_the_render_batch_first_and_only_rungs_a_render_picks(
    modules, cap
) -> None:
    """`studio compile --runtime torch` builds what renders then pick, the clip's batch first
    (a prebuild stopped early has built that one): no render of 1..cap frames compiles
    another rung, and no prebuilt rung goes unused."""
    rungs = prebuild_rungs(cap)
    assert rungs[0] == cap and len(set(rungs)) == len(rungs)
    wd = WarpDecodeEngines(*modules, "auto", torch.device("cpu"))
    wd.compiled = True  # (as on a GPU with --compile)
    wd._engines = {r: {} for r in rungs}  # as if built: batch_for only looks them up
    picked = {wd.batch_for(n, cap) for n in range(1, cap + 1)}
    assert picked == set(rungs)
    assert prebuild_rungs(32) == [32, 1, 2, 4]  # not 8, 16 and 24: tails of 8+ pad to 32


@pytest.mark.parametrize("rewrite", [None, 8], ids=["as-is", "padded-split"])
def test_engines_match_the_modules_and_pad_short_batches(
    modules, rewrite, one_torch_thread
) -> None:
    cpu = torch.device("cpu")
    wd = WarpDecodeEngines(*modules, "auto", cpu, channel_pad=rewrite, depth_split=bool(rewrite))
    assert wd.precisions == {"warp_network": "fp32", "decoder": "fp32"}  # fp16 needs a GPU
    assert wd.describe()["channel_pad"] == (rewrite or 0)  # no rewrites by default on a CPU
    assert wd.describe()["depth_split"] is bool(rewrite)
    f_s, x_s, x_d = _inputs(modules[0], 3)
    want = _eager(modules, f_s, x_s, x_d)
    torch.testing.assert_close(wd(f_s, x_s, x_d, 3), want, rtol=1e-4, atol=1e-5)
    short = wd(f_s, x_s[:2], x_d[:2], 3)  # padded to the engine's static batch of 3
    assert short.shape[0] == 2
    torch.testing.assert_close(short, want[:2], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="do not fit a batch of 3"):
        wd(f_s, torch.cat((x_s, x_s)), torch.cat((x_d, x_d)), 3)


def test_one_feature_volume_per_frame_renders_each_frame_from_its_own(
    modules, one_torch_thread
) -> None:
    """A video avatar hands a feature volume per frame: frame i is rendered from f_s[i],
    short batches padded, and an image's f_s after it is written into the engine again."""
    wd = WarpDecodeEngines(*modules, "auto", torch.device("cpu"))
    f_s, x_s, x_d = _inputs(modules[0], 3)
    per_frame = torch.cat([f_s, f_s.flip(-1), f_s * 0.5])
    got = wd(per_frame, x_s, x_d, 4)  # 3 frames on the engines of 4
    for i in range(3):
        want = _eager(modules, per_frame[i : i + 1], x_s[i : i + 1], x_d[i : i + 1])
        torch.testing.assert_close(got[i : i + 1], want, rtol=1e-4, atol=1e-5)
    image = wd(f_s, x_s, x_d, 4)
    torch.testing.assert_close(image, _eager(modules, f_s, x_s, x_d), rtol=1e-4, atol=1e-5)
    assert (got[1] - image[1]).abs().max() > 1e-3


@needs_cuda
def test_cuda_graphed_fp16_engines_track_fp32_and_a_new_avatar(modules) -> None:
    dev = torch.device("cuda")
    warp, decoder = (copy.deepcopy(m).to(dev) for m in modules)  # the fixture's stay on the CPU
    wd = WarpDecodeEngines(warp, decoder, "auto", dev)
    assert wd.precisions == {"warp_network": "fp16", "decoder": "fp16"}
    assert wd.channel_pad == 8 and wd.depth_split  # the rewrites run on CUDA graphs
    f_s, x_s, x_d = _inputs(warp, 4, "cuda")
    got = wd(f_s, x_s, x_d, 4).clone()
    assert wd.engines(4)["decoder"].static_inputs is not None  # captured
    assert wd.describe()["cuda_graphs"] == [4]
    want = _eager((warp, decoder), f_s, x_s, x_d)
    cos = F.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0)
    assert float(cos) >= 0.999
    other = f_s.flip(-1).contiguous()  # another avatar: its f_s must reach the graph
    got2 = wd(other, x_s, x_d, 4)
    want2 = _eager((warp, decoder), other, x_s, x_d)
    cos2 = F.cosine_similarity(got2.double().flatten(), want2.double().flatten(), dim=0)
    assert float(cos2) >= 0.999


@needs_cuda
def test_compiled_artifacts_of_a_large_batch_run_without_a_graph(
    modules, tmp_path, monkeypatch
) -> None:
    """A compiled artifact's engines at UNCAPTURED_BATCH frames or more are not captured (a
    new process skips the graphs' warm-up and instantiation), and compute what the
    network does; the report says which batches replay graphs."""
    from studio.runtime import aot_cache
    from studio.runtime.torch_backend import UNCAPTURED_BATCH

    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")
    dev = torch.device("cuda")
    warp, decoder = (copy.deepcopy(m).to(dev) for m in modules)
    wd = WarpDecodeEngines(warp, decoder, "auto", dev, compile=True, aot_dir=tmp_path)
    f_s, x_s, x_d = _inputs(warp, UNCAPTURED_BATCH, "cuda")
    got = wd(f_s, x_s, x_d, UNCAPTURED_BATCH)
    eng = wd.engines(UNCAPTURED_BATCH)
    assert {e.aot for e in eng.values()} == {"artifact built"}
    assert all(e.static_inputs is None for e in eng.values())  # not captured
    assert wd.describe()["cuda_graphs"] == []
    want = _eager((warp, decoder), f_s, x_s, x_d)
    cos = F.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0)
    assert float(cos) >= 0.999


def test_onnxruntime_engines_match_torch(modules, tmp_path, monkeypatch, one_torch_thread) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("STUDIO_ENGINE_CACHE", str(tmp_path))  # the exported graphs go here
    cpu = torch.device("cpu")
    ort = WarpDecodeEngines(*modules, "auto", cpu, runtime="onnxruntime")
    assert ort.describe()["runtime"] == "onnxruntime"
    f_s, x_s, x_d = _inputs(modules[0], 2)
    want = WarpDecodeEngines(*modules, "auto", cpu)(f_s, x_s, x_d, 2)
    got = ort(f_s, x_s, x_d, 2)
    assert float((got - want).norm() / want.norm()) <= 1e-4
    # the batch's features are made once per avatar (not expanded and copied every call)
    features = ort._features(ort.engines(2)["warp_network"], f_s, 2)
    assert features.is_contiguous() and features.shape[0] == 2
    assert ort._features(ort.engines(2)["warp_network"], f_s, 2) is features
    other = f_s + 1  # a new avatar: new features, and a new render
    assert ort._features(ort.engines(2)["warp_network"], other, 2) is not features
    moved = ort(other, x_s, x_d, 2)
    assert float((moved - got).norm() / got.norm()) > 1e-3


def test_a_runtime_that_cannot_run_here_is_an_option_error(modules) -> None:
    from studio.errors import OptionError

    with pytest.raises(OptionError, match="--precision"):  # ORT runs fp32 on the CPU
        WarpDecodeEngines(*modules, "bf16", torch.device("cpu"), runtime="onnxruntime")


def test_knobs_default_to_what_the_renderer_runs(modules, one_torch_thread) -> None:
    """The bench's knobs: their defaults are the renderer's; turned, the same images (eager
    engines, autocast policy, channels-last layout on copies of the weights)."""
    cpu = torch.device("cpu")
    wd = WarpDecodeEngines(*modules, "auto", cpu)
    assert (wd.half_mode, wd.channels_last, wd.compile_mode) == ("cast", False, "default")
    assert wd._options("decoder") == {"compile": False, "mode": None}  # fp32 on the CPU
    f_s, x_s, x_d = _inputs(modules[0], 2)
    want = _eager(modules, f_s, x_s, x_d)
    before = {k: v.clone() for k, v in modules[0].state_dict().items()}
    laid_out = WarpDecodeEngines(*modules, "fp32", cpu, channels_last=True, cuda_graphs=False)
    engine = laid_out.engines(2)["warp_network"]
    assert engine.channels_last and engine.adapter.inner is not modules[0]  # its own copy
    torch.testing.assert_close(laid_out(f_s, x_s, x_d, 2), want, rtol=1e-4, atol=1e-5)
    for k, v in modules[0].state_dict().items():  # the caller's network untouched
        assert v.is_contiguous() and torch.equal(v, before[k]), k
    autocast = WarpDecodeEngines(*modules, "bf16", cpu, half_mode="autocast")
    assert autocast.engines(2)["decoder"].mode == "autocast"
    got = autocast(f_s, x_s, x_d, 2)
    cos = F.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0)
    assert float(cos) >= 0.999
    with pytest.raises(ValueError, match="half_mode"):
        WarpDecodeEngines(*modules, "auto", cpu, half_mode="fp8")


def test_load_avatar_writes_the_features_ahead_of_the_call(modules, one_torch_thread) -> None:
    wd = WarpDecodeEngines(*modules, "auto", torch.device("cpu"))
    f_s, x_s, x_d = _inputs(modules[0], 2)
    wd.load_avatar(f_s, 2)
    held = wd._f_s[2]
    assert held[0] is f_s and held[1].shape[0] == 2  # built and written, before any call
    wd(f_s, x_s, x_d, 2)
    assert wd._f_s[2] is held  # the call found the avatar loaded


def test_feature_size_sets_the_decoders_static_input(one_torch_thread) -> None:
    """The engines' static shapes follow the warp network's example maps and ``feature_size``
    (what the bench's --feature-size turns); the product's by default."""
    warp, decoder = small_warp_network(), random_network("decoder", reduced=True)
    wd = WarpDecodeEngines(warp, decoder, "auto", torch.device("cpu"), feature_size=SMALL_WARP_MAPS)
    spec = wd.engines(1)["decoder"].inputs[0]
    assert spec.shape[-2:] == (SMALL_WARP_MAPS, SMALL_WARP_MAPS)
    f_s, x_s, x_d = _inputs(warp, 1)
    torch.testing.assert_close(
        wd(f_s, x_s, x_d, 1), _eager((warp, decoder), f_s, x_s, x_d), rtol=1e-4, atol=1e-5
    )
