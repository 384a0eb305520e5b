"""The fast LMDM path (studio.motion.fast_lmdm): the window step under a precision, its DDIM
loop on static buffers, and the compiled step, against the module's own forward."""

from __future__ import annotations

import pytest
import torch
from conftest import random_biases

from studio.layout import MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import DeviceDDIM, ddim_sample, draw_noises, make_schedule
from studio.models.lmdm import LMDM, REDUCED_KWARGS
from studio.motion.fast_lmdm import (
    COMPILE_MODE,
    STEPS_PER_GRAPH,
    WINDOW,
    FastLMDM,
    PathSpec,
    WindowGraph,
    graphed_lmdm,
    steps_per_graph,
    window_spec,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _window(model: LMDM, steps: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    cf = torch.randn(1, MOTION_DIM, generator=g)
    cond = torch.randn(1, SEQ_FRAMES, model.cond_dim, generator=g)
    sched = make_schedule(steps)
    x_t, noises = draw_noises(sched, WINDOW, g)
    with torch.no_grad():
        ref = ddim_sample(lambda x, t: model(x, cf, cond, t), x_t, noises, sched)
    return cf, cond, sched, x_t, noises, ref


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fast_path_fp32_equals_module_forward(precision):
    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    cf, cond, sched, x_t, noises, ref = _window(model, 4)
    fast = FastLMDM(model, PathSpec("t", precision), "cpu")
    assert fast.model is model and fast.mode == "fp32"  # fp32 on its device: no copy
    fast.load_condition(cf, cond)
    sampler = DeviceDDIM(sched, WINDOW, noises, "cpu")
    out = fast.sample(sampler, x_t)
    assert out.data_ptr() == sampler.out.data_ptr()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    pred_noise, x0 = fast.run_step(x_t, torch.full((1,), 999))
    ref_noise, ref_x0 = model(x_t, cf, cond, torch.full((1,), 999))
    torch.testing.assert_close(x0, ref_x0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred_noise, ref_noise, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fast_path_half_types_use_the_runtime_policy_and_stay_close(precision):
    """Half types: the runtime's cast copy (time MLP and schedule fp32, the base untouched),
    the motion GEMMs zero-padded to an aligned width, guidance and DDIM state in fp32."""
    torch.manual_seed(0)
    model = LMDM(**REDUCED_KWARGS).eval()
    cf, cond, sched, x_t, noises, ref = _window(model, 2)
    fast = FastLMDM(model, PathSpec("t", precision), "cpu")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert fast.mode == "cast" and fast.input_dtype == half
    assert fast.stacked.motion_weight.shape[1] > MOTION_DIM  # padded to an aligned width
    assert fast.model.final_layer.weight.dtype == half
    assert all(p.dtype == torch.float32 for p in fast.model.time_mlp.parameters())
    assert fast.model.noise_tables.dtype == torch.float32
    assert model.final_layer.weight.dtype == torch.float32  # the base is untouched
    fast.load_condition(cf, cond)
    out = fast.sample(DeviceDDIM(sched, WINDOW, noises, "cpu"), x_t)
    assert out.dtype == torch.float32
    assert _cosine(out, ref) > 0.999
    assert ((out - ref).norm() / ref.norm()).item() < 0.05


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fast_sample_reads_nothing_back_to_host(host_reads, precision):
    """What is captured into a CUDA graph must not sync: no item/tolist/cpu/numpy/bool."""
    torch.manual_seed(0)
    model = LMDM(**REDUCED_KWARGS).eval()
    cf, cond, sched, x_t, noises, _ = _window(model, 4)
    fast = FastLMDM(model, PathSpec("t", precision), "cpu")
    fast.load_condition(cf, cond)
    sampler = DeviceDDIM(sched, WINDOW, noises, "cpu")
    with host_reads(
        ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
    ) as calls:
        fast.sample(sampler, x_t)
        fast.run_step(x_t, torch.full((1,), 999))
    assert calls == []


def test_compiled_step_is_traced_once_for_all_steps(monkeypatch):
    """Every step of a window shares one compiled graph (the step's constants are inputs);
    the window's constants are the other one.

    Dynamo's tracing and graph breaks are what is counted; they do not depend on the backend.
    The graphs go through AOTAutograd ("aot_eager") instead of Inductor, whose C++ code
    generation on the CPU took 4-27 s here (and torch.compile is a CUDA path in the studio)."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    modes = []

    def aot_eager(fn, *, mode=None, dynamic=None):
        modes.append(mode)
        return real_compile(fn, backend="aot_eager", dynamic=dynamic)

    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    counters.clear()
    try:
        torch.manual_seed(0)
        model = LMDM(**REDUCED_KWARGS).eval()
        cf, cond, sched, x_t, noises, ref = _window(model, 4)
        fast = FastLMDM(model, PathSpec("t", "fp32", compile=True), "cpu")
        fast.load_condition(cf, cond)
        out = fast.sample(DeviceDDIM(sched, WINDOW, noises, "cpu"), x_t)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        assert modes and set(modes) == {COMPILE_MODE}  # the path asked for torch.compile
        assert counters["stats"]["unique_graphs"] == 2
    finally:
        torch._dynamo.reset()


def test_window_graph_uncaptured_on_the_cpu_equals_the_module_loop():
    """The product's entry (graphed_lmdm: fp32, one WindowGraph per step count and shape)
    run on the CPU, where it is not captured: the module's own DDIM loop, window by window."""
    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    graphed = graphed_lmdm(model)
    assert graphed is graphed_lmdm(model) and graphed.fast.spec == window_spec()
    for seed in (3, 4):  # two windows through one kept graph
        cf, cond, sched, x_t, noises, ref = _window(model, 3, seed)
        graph = graphed.window_graph(sched, WINDOW)
        assert graph is graphed.window_graph(sched, WINDOW) and graph.graphs is None
        graph.set_noises(noises)
        torch.testing.assert_close(graph.run(cf, cond, x_t), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(("steps", "chunk"), [(1, 1), (4, 4), (12, 6)])
def test_window_graph_steps_equal_the_fast_loop_exactly(steps, chunk, precision):
    """The window graph's packed constants, step by step (each gathered by the device's step
    index, with its schedule scalars) in chunks of steps, compute exactly what the fast path's
    whole loop does; a second window overwrites the first's output buffer."""
    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    fast = FastLMDM(model, window_spec(precision), "cpu")
    graph = WindowGraph(fast, make_schedule(steps), WINDOW)
    assert graph.chunk == chunk and graph.graphs is None
    assert graph.packed.shape[0] == steps and graph.staged.shape[0] == 1
    outs = []
    for seed in (3, 4):
        cf, cond, sched, x_t, noises, _ = _window(model, steps, seed)
        graph.set_noises(noises)
        out = graph.run(cf, cond, x_t)
        assert out.data_ptr() == graph.out.data_ptr()
        outs.append(out.clone())
        fast.load_condition(cf, cond)
        want = fast.sample(DeviceDDIM(sched, WINDOW, noises, "cpu"), x_t)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert int(graph.index) == steps  # every step ran once
    assert not torch.equal(outs[0], outs[1])


def test_the_product_path_runs_at_each_precision_and_half_types_stay_close():
    """``motion_precision``: one kept GraphedLMDM per precision of one LMDM; the half types'
    windows (a cast copy of the weights) stay close to the module's fp32 loop."""
    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    cf, cond, sched, x_t, noises, ref = _window(model, 4)
    for precision in ("fp16", "bf16"):
        graphed = graphed_lmdm(model, precision)
        assert graphed is graphed_lmdm(model, precision) is not graphed_lmdm(model)
        assert graphed.fast.spec == window_spec(precision) and graphed.fast.mode == "cast"
        graph = graphed.window_graph(sched, WINDOW)
        graph.set_noises(noises)
        out = graph.run(cf, cond, x_t)
        assert out.dtype == torch.float32 and _cosine(out, ref) > 0.999
        assert not torch.equal(out, ref)


def test_steps_per_graph_divides_the_loop():
    assert STEPS_PER_GRAPH == 10
    assert [steps_per_graph(t) for t in (1, 4, 10, 12, 13, 25, 50)] == [1, 4, 10, 6, 1, 5, 10]
    assert steps_per_graph(50, most=50) == 50


def test_window_graph_runs_batch_one_only():
    model = LMDM(**REDUCED_KWARGS).eval()
    fast = FastLMDM(model, window_spec(), "cpu")
    with pytest.raises(ValueError, match="batch 1"):
        WindowGraph(fast, make_schedule(2), (2, SEQ_FRAMES, MOTION_DIM))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
@pytest.mark.parametrize("precision", ["tf32", "fp16", "bf16"])
def test_window_graph_captured_on_a_gpu_at_a_faster_precision_stays_close(precision):
    """``motion_precision`` on a GPU: the captured windows at TF32 or a half type stay close
    to the module's fp32 loop, window after window."""
    import copy

    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    graphed = graphed_lmdm(copy.deepcopy(model).to("cuda"), precision)
    for seed in (3, 4):
        cf, cond, sched, x_t, noises, ref = _window(model, 12, seed)
        graph = graphed.window_graph(sched, WINDOW)
        assert graph.graphs is not None
        graph.set_noises(noises.cuda())
        out = graph.run(cf.cuda(), cond.cuda(), x_t.cuda()).cpu()
        assert _cosine(out, ref) > 0.999, precision


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
@pytest.mark.parametrize("steps", [1, 3, 12])
def test_window_graph_captured_on_a_gpu_equals_the_module_loop(steps):
    """On a GPU the window's constants and a chunk of its steps are captured and replayed:
    every window, window after window, is the module's DDIM loop."""
    import copy

    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    on_gpu = copy.deepcopy(model).to("cuda")
    graphed = graphed_lmdm(on_gpu)
    for seed in (3, 4):
        cf, cond, sched, x_t, noises, ref = _window(model, steps, seed)
        graph = graphed.window_graph(sched, WINDOW)
        assert graph.graphs is not None
        graph.set_noises(noises.cuda())
        out = graph.run(cf.cuda(), cond.cuda(), x_t.cuda()).cpu()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_path_spec_names_a_runtime_precision():
    assert window_spec("tf32") == PathSpec("fast_tf32_window", "tf32")
    with pytest.raises(ValueError, match="precision 'float16'"):
        PathSpec("x", "float16")
    with pytest.raises(ValueError, match="batch 1"):
        model = LMDM(**REDUCED_KWARGS).eval()
        sched = make_schedule(2)
        shape = (2, SEQ_FRAMES, MOTION_DIM)
        sampler = DeviceDDIM(sched, shape, torch.zeros(1, *shape), "cpu")
        FastLMDM(model, window_spec(), "cpu").sample(sampler, torch.zeros(shape))
