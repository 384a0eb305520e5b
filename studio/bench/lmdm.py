"""The ``lmdm`` bench suite: one LMDM step and full DDIM per path, beside the published figures.

Measured on random weights of the released architecture (condition width 1103; ``reduced``
for CPU smoke runs), for one 80-frame window at batch 1:

- ``eager_fp32``: the reference loop (:func:`studio.models.diffusion.ddim_sample`) calling
  the module's ``forward`` in fp32 (TF32 off). Its final x0 is the accuracy reference.
- ``fast_*_window_graph`` (CUDA only): the product's fast path,
  :class:`~studio.motion.fast_lmdm.FastLMDM`, in a precision (fp32, TF32, or bf16/fp16
  weights cast by the runtime's policy), on static input buffers, with the *whole* DDIM
  loop (:class:`~studio.models.diffusion.DeviceDDIM`) captured once per T into a CUDA graph
  and replayed. What does not depend on the noisy motion (condition encoder, time
  embeddings, FiLM, cross-attention keys and values) is computed once per window inside
  the graph (:mod:`studio.motion.lmdm_hoist`). The single step recomputes all of it, as the
  exported step does. For each uncompiled path the SDPA backend is chosen by timing the
  captured single step under each candidate; compiled paths run the one their
  :class:`PathSpec` names.
- ``onnxruntime_cpu`` / ``onnxruntime_cuda``: the TorchScript-exported step in ONNX Runtime,
  host-side DDIM loop (no IOBinding), when onnxruntime and the provider are present.
- ``tensorrt``: reported, not measured (engines are built by ``studio compile``).
- ``fast_*_window_compiled_graph`` (``--compile``): the same with the window's constants
  and the step through ``torch.compile`` (Inductor kernels, captured by our graph; off by
  default); the ``flash`` ones name flash attention inside the compiled step.

Variants that lost on the H200 (per-step hoisting without window constants, autocast,
recomputing the condition every step, folded attention projections) were removed after
measurement; docs/benchmarks.md says what they measured.

On CUDA the fastest accurate path at T=4 is then profiled (``torch.profiler`` over one
graph replay): kernels per step and GPU time by kernel kind, against the replay time.

Accuracy: cosine similarity and relative L2 of each path's final x0 to ``eager_fp32`` with
the same x_T, per-step noises and condition, flattened, worst over the input sets.
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from studio.bench.report import compare as _compare
from studio.bench.report import fmt as _f
from studio.bench.report import fmt_cos as _cos
from studio.bench.report import (
    int_list,
    markdown_tail,
    measured_on,
    name_list,
    run_main,
    settings_markdown,
    suite_parser,
    write_plots,
)
from studio.bench.report import is_ok as _ok
from studio.bench.report import table as _table
from studio.bench.report import worst as _worst
from studio.bench.timing import (
    Timing,
    default_device,
    device_facts,
    git_commit,
    kernel_profile,
    measure,
    synchronize,
    utc_now,
)
from studio.layout import DIFFUSION_STEPS, MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import (
    DeviceDDIM,
    ddim_sample,
    draw_noises,
    make_schedule,
)
from studio.models.lmdm import INPUT_NAMES, LMDM, OUTPUT_NAMES, REDUCED_KWARGS
from studio.motion.fast_lmdm import COMPILE_MODE, WINDOW, FastLMDM, PathSpec
from studio.runtime.base import capture_cuda_graph, math_mode

__all__ = [
    "DEFAULT_STEPS",
    "FAST_PATHS",
    "PUBLISHED",
    "TARGETS",
    "FastLMDM",
    "PathSpec",
    "main",
    "run_lmdm_suite",
    "save_plots",
    "to_markdown",
]

DEFAULT_STEPS: tuple[int, ...] = (1, 2, 4, 10, 50)
STEP_TIME = DIFFUSION_STEPS - 1  # the first (noisiest) DDIM timestep

PUBLISHED: dict[str, Any] = {
    "source": "Ditto reference, RTX 5090 laptop GPU, TensorRT 10.15",
    "step_ms": 5.24,
    "tensorrt_ddim_ms": {"1": 5.05, "2": 9.80, "4": 19.65, "10": 49.12, "50": 249.04},
    "eager_ddim_ms": {"1": 24.34, "2": 51.89, "4": 90.50, "10": 274.06, "50": 1118.95},
    "cosine": {"4": 0.9928},
}
TARGETS: dict[str, Any] = {"steps": 4, "ddim_ms": 2.0, "motion_fps": 40_000.0, "cosine": 0.999}

FAST_PATHS: tuple[PathSpec, ...] = (
    PathSpec("fast_fp32_window_graph", "fp32"),
    PathSpec("fast_tf32_window_graph", "tf32"),
    PathSpec("fast_bf16_window_graph", "bf16"),
    PathSpec("fast_fp16_window_graph", "fp16"),
)
COMPILED_PATHS: tuple[PathSpec, ...] = (
    PathSpec("fast_bf16_window_compiled_graph", "bf16", compile=True),
    PathSpec("fast_fp16_window_compiled_graph", "fp16", compile=True),
    PathSpec("fast_bf16_window_flash_compiled_graph", "bf16", compile=True, sdpa="flash"),
    PathSpec("fast_fp16_window_flash_compiled_graph", "fp16", compile=True, sdpa="flash"),
)
ORT_PATHS = ("onnxruntime_cpu", "onnxruntime_cuda")
ALL_PATHS = ("eager_fp32", *(p.name for p in FAST_PATHS + COMPILED_PATHS), *ORT_PATHS, "tensorrt")
SDPA_CANDIDATES = {
    "fp32": ("auto", "efficient", "math"),
    "tf32": ("auto", "efficient", "math"),
    "bf16": ("auto", "flash", "efficient", "cudnn"),
    "fp16": ("auto", "flash", "efficient", "cudnn"),
}


# --- inputs and metrics ----------------------------------------------------------------


@dataclass
class _Inputs:
    """Rotating input sets on the device: condition, step input, x_T and noises per T."""

    cond_frame: list[Tensor]
    cond: list[Tensor]
    x_step: list[Tensor]
    x_t: dict[int, list[Tensor]]
    noises: dict[int, list[Tensor]]

    @property
    def count(self) -> int:
        return len(self.cond)


@dataclass(frozen=True)
class _Workload:
    """What every path is measured on: the input sets, the T values, the fp32 eager
    references (final x0 per T and input set, one step per set) and the repeat counts."""

    inputs: _Inputs
    steps: Sequence[int]
    refs: dict[int, list[Tensor]]
    step_refs: list[Tensor]
    repeats: int | None
    warmup: int | None

    def unpack(self) -> tuple:
        return (self.inputs, self.steps, self.refs, self.step_refs, self.repeats, self.warmup)


def _make_inputs(
    cond_dim: int, steps: Sequence[int], sets: int, seed: int, device: torch.device
) -> _Inputs:
    g = torch.Generator().manual_seed(seed + 1)
    cf = [torch.randn(1, MOTION_DIM, generator=g).to(device) for _ in range(sets)]
    cond = [torch.randn(1, SEQ_FRAMES, cond_dim, generator=g).to(device) for _ in range(sets)]
    xs = [torch.randn(WINDOW, generator=g).to(device) for _ in range(sets)]
    x_t: dict[int, list[Tensor]] = {}
    noises: dict[int, list[Tensor]] = {}
    for steps_t in steps:
        sched = make_schedule(steps_t)
        pairs = [draw_noises(sched, WINDOW, g, device) for _ in range(sets)]
        x_t[steps_t] = [p[0] for p in pairs]
        noises[steps_t] = [p[1] for p in pairs]
    return _Inputs(cf, cond, xs, x_t, noises)


def _fps(ms: float) -> float:
    return SEQ_FRAMES / (ms / 1e3) if ms > 0 else math.inf


def _repeats_for(steps: int | None, repeats: int | None) -> int:
    if repeats is not None:
        return repeats
    if steps is None or steps <= 4:
        return 20
    return 10 if steps <= 10 else 5


def _warmup_for(steps: int | None, warmup: int | None) -> int:
    if warmup is not None:
        return warmup
    return 1 if steps is not None and steps >= 50 else 2


# --- paths -------------------------------------------------------------------------------


def _run_eager(
    model: LMDM,
    inputs: _Inputs,
    steps: Sequence[int],
    device: torch.device,
    repeats: int | None,
    warmup: int | None,
) -> tuple[dict[str, Any], dict[int, list[Tensor]], list[Tensor]]:
    """eager_fp32: the record, reference x0 per (T, set), reference step x_start per set."""
    n = inputs.count
    holder = {"k": 0}

    def pick(i: int) -> None:
        holder["k"] = i % n

    ctx = math_mode("fp32", device)
    record: dict[str, Any] = {
        "status": "ok",
        "settings": {
            "dtype": "float32",
            "loop": "studio.models.diffusion.ddim_sample (reference, per-step host scalars)",
            "network": "LMDM.forward (exported step, batch_guidance)",
            "graph": False,
            "tf32": False,
            "sdpa": "auto",
        },
        "ddim": {},
    }
    refs: dict[int, list[Tensor]] = {}
    with ctx, torch.no_grad():
        t_step = torch.full((1,), STEP_TIME, dtype=torch.long, device=device)
        step_refs = [
            model(inputs.x_step[k], inputs.cond_frame[k], inputs.cond[k], t_step)[1].clone()
            for k in range(n)
        ]

        def one_step() -> object:
            k = holder["k"]
            return model(inputs.x_step[k], inputs.cond_frame[k], inputs.cond[k], t_step)

        timing = measure(
            one_step,
            device=device,
            repeats=_repeats_for(None, repeats),
            warmup=_warmup_for(None, warmup),
            setup=pick,
        )
        record["step"] = {**timing.to_dict(), "cosine": 1.0, "rel_l2": 0.0}
        for steps_t in steps:
            sched = make_schedule(steps_t)

            def run(k: int, sched: Any = sched, steps_t: int = steps_t) -> Tensor:
                def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
                    return model(x, inputs.cond_frame[k], inputs.cond[k], time_cond)

                return ddim_sample(
                    denoise, inputs.x_t[steps_t][k], inputs.noises[steps_t][k], sched
                )

            refs[steps_t] = [run(k).clone() for k in range(n)]
            timing = measure(
                lambda run=run: run(holder["k"]),
                device=device,
                repeats=_repeats_for(steps_t, repeats),
                warmup=_warmup_for(steps_t, warmup),
                setup=pick,
            )
            again = [run(k) for k in range(n)]
            acc = _worst([_compare(a, r) for a, r in zip(again, refs[steps_t], strict=True)])
            record["ddim"][str(steps_t)] = {
                **timing.to_dict(),
                "motion_fps": _fps(timing.median_ms),
                **acc,
            }
    return record, refs, step_refs


def _time_step_graph(
    fast: FastLMDM, inputs: _Inputs, device: torch.device, repeats: int, warmup: int
) -> tuple[Timing, list[Tensor]]:
    """Capture one guided step into a graph; time its replays; x_start per input set."""
    n = inputs.count
    x = torch.zeros(WINDOW, device=device)
    t = torch.full((1,), STEP_TIME, dtype=torch.long, device=device)

    def setup(i: int) -> None:
        k = i % n
        x.copy_(inputs.x_step[k])
        fast.load_condition(inputs.cond_frame[k], inputs.cond[k])

    setup(0)
    graph, (_, x_start) = capture_cuda_graph(lambda: fast.run_step(x, t), 2)
    timing = measure(graph.replay, device=device, repeats=repeats, warmup=warmup, setup=setup)
    outs = []
    for k in range(n):
        setup(k)
        graph.replay()
        outs.append(x_start.clone())
    del graph
    return timing, outs


def _run_fast(
    base: LMDM,
    spec: PathSpec,
    work: _Workload,
    device: torch.device,
    sweep_sdpa: bool,
    compile_mode: str = COMPILE_MODE,
) -> dict[str, Any]:
    """One fast path: SDPA choice, captured single step, one captured DDIM graph per T."""
    inputs, steps, refs, step_refs, repeats, warmup = work.unpack()
    n = inputs.count
    started = time.perf_counter()
    fast = FastLMDM(base, spec, device, compile_mode=compile_mode)
    dtype = str(fast.input_dtype).removeprefix("torch.")
    settings: dict[str, Any] = {
        **asdict(spec),
        "dtype": dtype,
        "mode": fast.mode,
        "window_constants": True,
        "tf32": spec.precision == "tf32",
        "weights": dtype,
        "time_mlp": "float32" if fast.mode == "cast" else None,
        "guidance_and_ddim_state": "float32",
        "graph": "one CUDA graph per T holding the whole DDIM loop (DeviceDDIM), replayed",
        "compile_mode": compile_mode if spec.compile else None,
    }
    settings = {k: v for k, v in settings.items() if v is not None}
    step_repeats = _repeats_for(None, repeats)
    step_warmup = _warmup_for(None, warmup)

    # SDPA backend: time the captured single step under each candidate, keep the fastest.
    sweep: dict[str, Any] = {}
    best: tuple[float, str, Timing, list[Tensor]] | None = None
    # compiled paths: one compile (20-30 s) per candidate would be too dear, so the spec names
    # the backend
    sweep_sdpa = sweep_sdpa and not spec.compile
    candidates = SDPA_CANDIDATES[spec.precision] if sweep_sdpa else (spec.sdpa,)
    for backend in candidates:
        fast.sdpa = backend
        try:
            timing, outs = _time_step_graph(fast, inputs, device, step_repeats, step_warmup)
        except Exception as e:  # an unsupported backend fails in the eager warm-up
            sweep[backend] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            synchronize(device)
            continue
        sweep[backend] = round(timing.median_ms, 4)
        if spec.compile and "first_capture_s" not in settings:  # compilation happens here
            settings["first_capture_s"] = round(time.perf_counter() - started, 1)
        if best is None or timing.median_ms < best[0]:
            best = (timing.median_ms, backend, timing, outs)
    if best is None:
        raise RuntimeError(f"no SDPA backend worked: {sweep}")
    _, fast.sdpa, step_timing, step_outs = best
    settings["sdpa"] = fast.sdpa
    settings["sdpa_sweep_step_ms"] = sweep
    record: dict[str, Any] = {"status": "ok", "settings": settings, "ddim": {}}
    record["step"] = {
        **step_timing.to_dict(),
        **_worst([_compare(a, r) for a, r in zip(step_outs, step_refs, strict=True)]),
    }

    for steps_t in steps:
        sched = make_schedule(steps_t)
        noises = torch.zeros((sched.num_noises, *WINDOW), device=device)
        sampler = DeviceDDIM(sched, WINDOW, noises, device)
        x_static = torch.zeros(WINDOW, device=device)

        def setup(
            i: int, sampler: DeviceDDIM = sampler, steps_t: int = steps_t, x: Tensor = x_static
        ) -> None:
            k = i % n
            x.copy_(inputs.x_t[steps_t][k])
            sampler.noises.copy_(inputs.noises[steps_t][k])
            fast.load_condition(inputs.cond_frame[k], inputs.cond[k])

        setup(0)
        graph, out = capture_cuda_graph(lambda s=sampler, x=x_static: fast.sample(s, x), 2)
        timing = measure(
            graph.replay,
            device=device,
            repeats=_repeats_for(steps_t, repeats),
            warmup=_warmup_for(steps_t, warmup),
            setup=setup,
        )
        pairs = []
        for k in range(n):
            setup(k)
            out.fill_(float("nan"))  # every element must be rewritten by the replay
            graph.replay()
            pairs.append(_compare(out, refs[steps_t][k]))
        record["ddim"][str(steps_t)] = {
            **timing.to_dict(),
            "motion_fps": _fps(timing.median_ms),
            **_worst(pairs),
        }
        del graph, out, sampler, noises
    settings["path_s"] = round(time.perf_counter() - started, 1)
    return record


_KERNEL_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "attn", "cudnn_sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "cublas", "nvjet", "sm90_", "sm80_", "ampere_")),
    ("layer_norm", ("layer_norm", "layernorm")),
    ("triton (fused)", ("triton",)),
    ("copy / cat", ("copy", "cat", "memcpy", "memset", "fill")),
    ("reduction", ("reduce",)),
)


def profile_fast_path(
    base: LMDM,
    spec: PathSpec,
    inputs: _Inputs,
    steps: int,
    device: torch.device,
    sdpa: str | None = None,
    compile_mode: str = COMPILE_MODE,
) -> dict[str, Any]:
    """Where a captured DDIM replay spends its time: kernels per step and GPU time by kind.
    ``sdpa`` overrides the path's backend (None: the spec's).

    Profiles one replay of the T-step graph with ``torch.profiler`` (CUDA activity) and
    compares the summed kernel time with the replay's event time (the rest is the gaps
    between graph nodes).
    """
    fast = FastLMDM(base, spec, device, sdpa=sdpa, compile_mode=compile_mode)
    fast.load_condition(inputs.cond_frame[0], inputs.cond[0])
    sched = make_schedule(steps)
    sampler = DeviceDDIM(sched, WINDOW, inputs.noises[steps][0], device)
    x = inputs.x_t[steps][0].clone()
    graph, _ = capture_cuda_graph(lambda: fast.sample(sampler, x), 2)
    replay = measure(graph.replay, device=device, repeats=5, warmup=2)
    prof = kernel_profile(graph.replay, device, _KERNEL_CATEGORIES)
    del graph
    kernel_ms = prof["kernel_ms"]
    return {
        "path": spec.name,
        "steps": steps,
        "sdpa": fast.sdpa,
        "replay_ms": replay.median_ms,
        "kernels": prof["kernels"],
        "kernels_per_step": prof["kernels"] / steps,
        "kernel_ms": kernel_ms,
        "busy_fraction": kernel_ms / replay.median_ms if replay.median_ms > 0 else None,
        "by_category": {
            k: {"kernels_per_step": v["kernels"] / steps, "ms_per_step": v["ms"] / steps}
            for k, v in prof["by_category"].items()
        },
        "top_kernels": prof["top_kernels"],
    }


def _export_onnx(model: LMDM, folder: Path) -> Path:
    """TorchScript-export the guided step (fp32, static batch 1) to ``folder/lmdm.onnx``."""
    path = folder / "lmdm.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            model.example_inputs(1),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=list(OUTPUT_NAMES),
            opset_version=17,
            dynamo=False,
        )
    return path


def _run_onnxruntime(
    base_cpu: LMDM, providers: Sequence[str], work: _Workload, onnx_dir: Path
) -> dict[str, dict[str, Any]]:
    """ONNX Runtime per provider: the exported step, DDIM loop on the host (numpy I/O)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return {p: {"status": "unavailable", "reason": f"onnxruntime: {e}"} for p in ORT_PATHS}
    available = ort.get_available_providers()
    wanted = {
        "onnxruntime_cpu": "CPUExecutionProvider",
        "onnxruntime_cuda": "CUDAExecutionProvider",
    }
    out: dict[str, dict[str, Any]] = {}
    todo = [p for p in providers if wanted[p] in available]
    for p in providers:
        if wanted[p] not in available:
            out[p] = {
                "status": "unavailable",
                "reason": f"onnxruntime {ort.__version__} lacks {wanted[p]} (has {available})",
            }
    if not todo:
        return out
    try:
        path = _export_onnx(base_cpu, onnx_dir)
    except Exception as e:
        for p in todo:
            out[p] = {"status": "error", "reason": f"ONNX export failed: {type(e).__name__}: {e}"}
        return out
    for p in todo:
        try:
            extra = [] if wanted[p] == "CPUExecutionProvider" else ["CPUExecutionProvider"]
            session = ort.InferenceSession(str(path), providers=[wanted[p], *extra])
            out[p] = _measure_ort(session, work)
            out[p]["settings"]["onnxruntime"] = ort.__version__
        except Exception as e:
            out[p] = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    return out


def _measure_ort(session: Any, work: _Workload) -> dict[str, Any]:
    """Time one ONNX Runtime session: the step and the host-side DDIM loop per T."""
    inputs, steps, refs, step_refs, repeats, warmup = work.unpack()
    n = inputs.count
    cpu = torch.device("cpu")
    cf = [t.cpu().numpy() for t in inputs.cond_frame]
    cond = [t.cpu().numpy() for t in inputs.cond]
    x_step = [t.cpu() for t in inputs.x_step]
    t_step = torch.full((1,), STEP_TIME, dtype=torch.long)
    current = {"k": 0}

    def pick(i: int) -> None:
        current["k"] = i % n

    def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
        k = current["k"]
        feeds = {
            "x": x.numpy(),
            "cond_frame": cf[k],
            "cond": cond[k],
            "time_cond": time_cond.numpy(),
        }
        noise, x0 = session.run(list(OUTPUT_NAMES), feeds)
        return torch.from_numpy(noise), torch.from_numpy(x0)

    def one_step() -> object:
        return denoise(x_step[current["k"]], t_step)

    timing = measure(
        one_step,
        device=cpu,
        repeats=min(_repeats_for(None, repeats), 10),
        warmup=_warmup_for(None, warmup),
        setup=pick,
    )
    pairs = []
    for k in range(n):
        pick(k)
        pairs.append(_compare(denoise(x_step[k], t_step)[1], step_refs[k]))
    rec: dict[str, Any] = {
        "status": "ok",
        "settings": {
            "providers": session.get_providers(),
            "export": "torch.onnx.export(dynamo=False), opset 17, fp32, static batch 1",
            "loop": "ddim_sample on the host; numpy feeds each step (no IOBinding)",
        },
        "step": {**timing.to_dict(), **_worst(pairs)},
        "ddim": {},
    }
    for steps_t in steps:
        sched = make_schedule(steps_t)
        x_t = [t.cpu() for t in inputs.x_t[steps_t]]
        noises = [t.cpu() for t in inputs.noises[steps_t]]

        def run(
            sched: Any = sched, x_t: list[Tensor] = x_t, noises: list[Tensor] = noises
        ) -> Tensor:
            k = current["k"]
            return ddim_sample(denoise, x_t[k], noises[k], sched)

        timing = measure(
            run, device=cpu, repeats=min(_repeats_for(steps_t, repeats), 5), warmup=1, setup=pick
        )
        pairs = []
        for k in range(n):
            pick(k)
            pairs.append(_compare(run(), refs[steps_t][k]))
        rec["ddim"][str(steps_t)] = {
            **timing.to_dict(),
            "motion_fps": _fps(timing.median_ms),
            **_worst(pairs),
        }
    return rec


def _tensorrt_status() -> dict[str, Any]:
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # ImportError, or a broken install (missing libnvinfer)
        return {"status": "unavailable", "reason": f"unavailable: {type(e).__name__}: {e}"}
    version = getattr(sys.modules.get("tensorrt"), "__version__", "?")
    return {
        "status": "skipped",
        "reason": f"tensorrt {version} imports, but this suite does not build engines "
        "(that is `studio compile`)",
    }


# --- the suite ---------------------------------------------------------------------------


def run_lmdm_suite(
    device: str = "cuda",
    steps: Sequence[int] = DEFAULT_STEPS,
    repeats: int | None = None,
    warmup: int | None = None,
    reduced: bool = False,
    seed: int = 0,
    input_sets: int = 3,
    compile: bool = False,
    compile_mode: str = COMPILE_MODE,
    profile: bool = True,
    onnx: bool = True,
    paths: Sequence[str] | None = None,
    sweep_sdpa: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every available LMDM path; returns a JSON-ready dict (see module docstring).

    ``repeats``/``warmup`` None: 20 repeats for the step and T <= 4, 10 for T <= 10, 5 above;
    2 warm-ups (1 for T >= 50). ``paths`` limits the paths run (names of :data:`ALL_PATHS`;
    ``eager_fp32`` always runs: it is the reference). Keys: suite, facts, config, published,
    targets, paths (name -> status, reason, settings, step, ddim[str(T)]), summary, notes.
    ``progress`` receives one line per finished path.
    """
    say = progress or (lambda _line: None)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device (use --device cpu)")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    steps = tuple(int(s) for s in steps)
    wanted = set(paths) if paths is not None else set(ALL_PATHS)
    unknown = wanted - set(ALL_PATHS)
    if unknown:
        raise ValueError(f"unknown paths {sorted(unknown)}; known: {', '.join(ALL_PATHS)}")
    kwargs: dict[str, int] = dict(REDUCED_KWARGS) if reduced else {}

    torch.manual_seed(seed)
    base_cpu = LMDM(**kwargs).eval().requires_grad_(False)
    eager = base_cpu if dev.type == "cpu" else copy.deepcopy(base_cpu).to(dev)
    inputs = _make_inputs(base_cpu.cond_dim, steps, input_sets, seed, dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    result: dict[str, Any] = {
        "suite": "lmdm",
        "facts": {**device_facts(dev), "date": utc_now(), "commit": git_commit()},
        "config": {
            "steps": list(steps),
            "repeats": repeats,
            "warmup": warmup,
            "repeats_by_T": {str(s): _repeats_for(s, repeats) for s in steps},
            "step_repeats": _repeats_for(None, repeats),
            "input_sets": input_sets,
            "reduced": reduced,
            "seed": seed,
            "compile": compile,
            "compile_mode": compile_mode if compile else None,
            "model": {
                "cond_dim": base_cpu.cond_dim,
                "kwargs": kwargs or "released",
                "parameters": sum(p.numel() for p in base_cpu.parameters()),
                "weights": "random (seeded)",
            },
            "window": {"batch": WINDOW[0], "frames": SEQ_FRAMES, "motion_dim": MOTION_DIM},
            "timing": "CUDA events per run, synced at the run boundary; median of repeats"
            if dev.type == "cuda"
            else "perf_counter per run; median of repeats",
        },
        "published": PUBLISHED,
        "targets": TARGETS,
        "paths": {},
        "notes": [],
    }
    rec, refs, step_refs = _run_eager(eager, inputs, steps, dev, repeats, warmup)
    work = _Workload(inputs, steps, refs, step_refs, repeats, warmup)
    result["paths"]["eager_fp32"] = rec
    say(_progress_line("eager_fp32", rec))

    specs = FAST_PATHS + (COMPILED_PATHS if compile else ())
    for spec in specs:
        if spec.name not in wanted:
            continue
        if dev.type != "cuda":
            result["paths"][spec.name] = {
                "status": "skipped",
                "reason": "needs --device cuda (CUDA graphs and half-precision fast paths)",
            }
            continue
        try:
            result["paths"][spec.name] = _run_fast(eager, spec, work, dev, sweep_sdpa, compile_mode)
            gc.collect()  # the path's weight copy and graph pools go before the next path
            torch.cuda.empty_cache()
            say(_progress_line(spec.name, result["paths"][spec.name]))
        except Exception as e:
            synchronize(dev)
            result["paths"][spec.name] = {
                "status": "error",
                "reason": f"{type(e).__name__}: {str(e)[:400]}",
                "settings": asdict(spec),
            }
            say(_progress_line(spec.name, result["paths"][spec.name]))
    if not compile:
        result["notes"].append(
            "torch.compile paths not run (--compile measures them; mode 'default' compiles "
            "in about 20-30 s per path on an H200)"
        )

    ort_wanted = [p for p in ORT_PATHS if p in wanted]
    if ort_wanted and onnx:
        with tempfile.TemporaryDirectory(prefix="studio-bench-") as tmp:
            result["paths"].update(_run_onnxruntime(base_cpu, ort_wanted, work, Path(tmp)))
        for p in ort_wanted:
            say(_progress_line(p, result["paths"][p]))
    elif ort_wanted:
        for p in ort_wanted:
            result["paths"][p] = {"status": "skipped", "reason": "ONNX Runtime paths disabled"}
    if "tensorrt" in wanted:
        result["paths"]["tensorrt"] = _tensorrt_status()

    if dev.type == "cuda":
        result["facts"]["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
    result["summary"] = _summary(result)
    key = str(TARGETS["steps"])
    best = result["summary"]["best"].get(key)
    if profile and dev.type == "cuda" and best and best["path"].startswith("fast_"):
        spec = next(p for p in specs if p.name == best["path"])
        sdpa = result["paths"][spec.name]["settings"].get("sdpa", "auto")
        try:
            result["profile"] = profile_fast_path(
                eager, spec, inputs, TARGETS["steps"], dev, sdpa, compile_mode
            )
        except Exception as e:
            result["profile"] = {"path": spec.name, "error": f"{type(e).__name__}: {e}"}
        gc.collect()
        torch.cuda.empty_cache()
    return result


def _progress_line(name: str, rec: dict[str, Any]) -> str:
    if not _ok(rec):
        return f"[lmdm] {name}: {rec['status']}: {rec.get('reason')}"
    cells = ", ".join(
        f"T={k} {r['median_ms']:.3f} ms cos {_cos(r.get('cosine'))}"
        for k, r in rec.get("ddim", {}).items()
    )
    return f"[lmdm] {name}: step {rec['step']['median_ms']:.3f} ms; {cells}"


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """Speed-ups over our eager, the best path per T, and the target checks."""
    paths = result["paths"]
    eager = paths["eager_fp32"]
    goal = TARGETS["cosine"]
    best: dict[str, Any] = {}
    for key, eager_rec in eager["ddim"].items():
        cands = [
            (rec["ddim"][key]["median_ms"], name, rec["ddim"][key])
            for name, rec in paths.items()
            if _ok(rec) and name != "eager_fp32" and key in rec.get("ddim", {})
        ]
        accurate = [c for c in cands if (c[2].get("cosine") or 0.0) >= goal]
        pool = accurate or cands
        if not pool:
            continue
        ms, name, rec = min(pool, key=lambda c: c[0])
        best[key] = {
            "path": name,
            "median_ms": ms,
            "motion_fps": rec["motion_fps"],
            "cosine": rec.get("cosine"),
            "speedup_vs_eager": eager_rec["median_ms"] / ms,
            "meets_cosine": bool(accurate),
        }
    speedups = {
        name: {
            key: eager["ddim"][key]["median_ms"] / r["median_ms"]
            for key, r in rec.get("ddim", {}).items()
            if key in eager["ddim"]
        }
        for name, rec in paths.items()
        if _ok(rec) and name != "eager_fp32"
    }
    summary: dict[str, Any] = {"best": best, "speedup_vs_eager": speedups}
    key = str(TARGETS["steps"])
    if key in best and key in eager["ddim"]:
        b = best[key]
        eager_ms = eager["ddim"][key]["median_ms"]
        summary["targets"] = [
            {
                "target": f"{key}-step DDIM <= {TARGETS['ddim_ms']} ms",
                "ours": b["median_ms"],
                "path": b["path"],
                "met": b["median_ms"] <= TARGETS["ddim_ms"],
                "needed_speedup_vs_eager": eager_ms / TARGETS["ddim_ms"],
                "achieved_speedup_vs_eager": eager_ms / b["median_ms"],
            },
            {
                "target": f">= {TARGETS['motion_fps']:,.0f} motion FPS",
                "ours": b["motion_fps"],
                "path": b["path"],
                "met": b["motion_fps"] >= TARGETS["motion_fps"],
                "needed_speedup_vs_eager": TARGETS["motion_fps"] / _fps(eager_ms),
                "achieved_speedup_vs_eager": b["motion_fps"] / _fps(eager_ms),
            },
            {
                "target": f"cosine >= {goal} to fp32 eager",
                "ours": b["cosine"],
                "path": b["path"],
                "met": b["cosine"] is not None and b["cosine"] >= goal,
            },
        ]
    else:
        summary["targets"] = "not evaluated: T=4 or a fast path was not measured"
    return summary


# --- reporting -----------------------------------------------------------------------------


def to_markdown(result: dict[str, Any]) -> str:
    """Markdown tables: our numbers per path beside the published ones, targets, settings."""
    facts, cfg, paths = result["facts"], result["config"], result["paths"]
    keys = [str(s) for s in cfg["steps"]]
    ok = {n: r for n, r in paths.items() if _ok(r)}
    eager = paths["eager_fp32"]
    pub = result["published"]
    out = [
        "## LMDM: one step and DDIM for an 80-frame window (batch 1)",
        "",
        measured_on(facts),
        f"Random weights, {'reduced' if cfg['reduced'] else 'released'} architecture "
        f"({cfg['model']['parameters']:,} parameters, cond width {cfg['model']['cond_dim']}); "
        f"{cfg['timing']}; {cfg['input_sets']} rotating input sets. "
        f"Published: {pub['source']}.",
        "",
        "Published reference figures: one LMDM step "
        f"{pub['step_ms']} ms; DDIM T = "
        + ", ".join(pub["tensorrt_ddim_ms"])
        + " -> TensorRT "
        + ", ".join(f"{v:.2f}" for v in pub["tensorrt_ddim_ms"].values())
        + " ms, PyTorch eager "
        + ", ".join(f"{v:.2f}" for v in pub["eager_ddim_ms"].values())
        + " ms; cosine "
        + ", ".join(f"{v} at T={k}" for k, v in pub["cosine"].items())
        + f". Targets: {TARGETS['steps']}-step DDIM <= {TARGETS['ddim_ms']} ms, "
        f">= {TARGETS['motion_fps']:,.0f} motion FPS, cosine >= {TARGETS['cosine']}.",
        "",
        "### Single network step (one guided forward)",
        "",
    ]
    rows = [["published TensorRT", _f(pub["step_ms"]), "–", "–", "–", "–"]]
    for name, rec in ok.items():
        s = rec.get("step")
        if not s:
            continue
        rows.append(
            [
                name,
                _f(s["median_ms"], 3),
                _f(s.get("wall_median_ms"), 3),
                _f(eager["step"]["median_ms"] / s["median_ms"]) + "×",
                _cos(s.get("cosine")),
                _f(s.get("rel_l2"), 6) if s.get("rel_l2") is not None else "–",
            ]
        )
    out += _table(["path", "median ms", "wall ms", "vs our eager", "cosine", "rel L2"], rows)

    header = ["path", *(f"T={k}" for k in keys)]
    published = (
        ("published TensorRT", pub["tensorrt_ddim_ms"]),
        ("published PyTorch eager", pub["eager_ddim_ms"]),
    )
    for title, field, digits, of_ms in (
        ("DDIM latency, ms (median)", "median_ms", 3, lambda ms: ms),
        ("Effective motion FPS (80 frames / DDIM time)", "motion_fps", 0, _fps),
    ):
        out += ["", f"### {title}", ""]
        pub_digits = 1 if digits == 0 else 2
        rows = [
            [label, *(_f(of_ms(by_t[k]), pub_digits) if k in by_t else "–" for k in keys)]
            for label, by_t in published
        ]
        for name, rec in ok.items():
            if rec.get("ddim"):
                rows.append([name, *(_f(rec["ddim"].get(k, {}).get(field), digits) for k in keys)])
        out += _table(header, rows)

    out += ["", "### Speed-up over our fp32 eager (same run)", ""]
    rows = [
        [
            "published TensorRT vs published eager",
            *(
                _f(pub["eager_ddim_ms"][k] / pub["tensorrt_ddim_ms"][k]) + "×"
                if k in pub["tensorrt_ddim_ms"]
                else "–"
                for k in keys
            ),
        ]
    ]
    for name, sp in result["summary"]["speedup_vs_eager"].items():
        rows.append([name, *(_f(sp.get(k)) + "×" if k in sp else "–" for k in keys)])
    out += _table(header, rows)

    out += ["", "### Final x0 vs fp32 eager: cosine / relative L2 (worst input set)", ""]
    rows = [["published TensorRT", *(_cos(pub["cosine"].get(k)) for k in keys)]]
    for name, rec in ok.items():
        if rec.get("ddim"):
            cells = []
            for k in keys:
                r = rec["ddim"].get(k, {})
                cells.append(f"{_cos(r.get('cosine'))} / {_f(r.get('rel_l2'), 6)}")
            rows.append([name, *cells])
    out += _table(header, rows)

    out += ["", "### Targets (H200 fast path)", ""]
    targets = result["summary"].get("targets")
    if isinstance(targets, list):
        rows = []
        for t in targets:
            ratio = (
                f"{_f(t['achieved_speedup_vs_eager'])}× achieved, "
                f"{_f(t['needed_speedup_vs_eager'])}× needed"
                if "needed_speedup_vs_eager" in t
                else "–"
            )
            ours = _cos(t["ours"]) if "cosine" in t["target"] else _f(t["ours"], 3)
            rows.append([t["target"], ours, t["path"], _f(bool(t["met"])), ratio])
        out += _table(["target", "ours", "path", "met", "vs our eager"], rows)
    else:
        out.append(str(targets))

    prof = result.get("profile")
    if prof:
        out += ["", f"### Where the time goes: {prof['path']}, T={prof.get('steps')}", ""]
        if prof.get("error"):
            out.append(f"Profile failed: {prof['error']}")
        else:
            out.append(
                f"One graph replay: {_f(prof['replay_ms'], 3)} ms; "
                f"{prof['kernels_per_step']:.0f} kernels per step, summed kernel time "
                f"{_f(prof['kernel_ms'], 3)} ms ({_f(100 * (prof['busy_fraction'] or 0), 0)}% "
                "of the replay; the rest is the gaps between graph nodes)."
            )
            out.append("")
            out += _table(
                ["kernel kind", "kernels / step", "ms / step"],
                [
                    [k, f"{v['kernels_per_step']:.0f}", _f(v["ms_per_step"], 4)]
                    for k, v in prof["by_category"].items()
                ],
            )
            out.append("")
            out += _table(
                ["top kernels", "count", "ms"],
                [
                    [f"`{t['name'][:80]}`".replace("|", "/"), str(t["count"]), _f(t["ms"], 4)]
                    for t in prof["top_kernels"]
                ],
            )

    others = {n: r for n, r in paths.items() if not _ok(r)}
    if others:
        out += ["", "### Paths not measured", ""]
        out += _table(
            ["path", "status", "reason"],
            [
                [n, r["status"], str(r.get("reason", "")).replace("|", "/")]
                for n, r in others.items()
            ],
        )

    out += settings_markdown(ok)
    out += markdown_tail(result)
    return "\n".join(out) + "\n"


def save_plots(result: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """PNG plots (latency vs T, motion FPS, cosine) through
    :func:`studio.bench.report.write_plots`; its ``{"files": [...]}`` (or why none)."""
    return write_plots(result, folder, lambda plots: _draw(result, plots))


def _draw(result: dict[str, Any], plots: Any) -> None:
    pub = result["published"]
    steps = result["config"]["steps"]
    keys = [str(s) for s in steps]
    ok = {n: r for n, r in result["paths"].items() if _ok(r) and r.get("ddim")}
    fig = plots.figure()
    ax = fig.add_subplot()
    for label, series, style in (
        ("published TensorRT", pub["tensorrt_ddim_ms"], "k--"),
        ("published eager", pub["eager_ddim_ms"], "k:"),
    ):
        pts = [(int(k), series[k]) for k in keys if k in series]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=label)
    for name, rec in ok.items():
        pts = [(int(k), rec["ddim"][k]["median_ms"]) for k in keys if k in rec["ddim"]]
        ax.plot(*zip(*pts, strict=True), "o-", label=name)
    ax.axhline(TARGETS["ddim_ms"], color="r", lw=0.8, label=f"target {TARGETS['ddim_ms']} ms")
    ax.set(xscale="log", yscale="log", xlabel="DDIM steps T", ylabel="ms (median)")
    ax.set_title(f"LMDM DDIM latency, 80-frame window — {result['facts'].get('name')}")
    ax.legend(fontsize=7)
    plots.save(fig, "lmdm_ddim_ms.png")

    key = str(TARGETS["steps"]) if str(TARGETS["steps"]) in keys else keys[-1]
    names = [n for n in ok if key in ok[n]["ddim"]]
    fps = [ok[n]["ddim"][key]["motion_fps"] for n in names]
    if key in pub["tensorrt_ddim_ms"]:
        names.append("published TensorRT")
        fps.append(_fps(pub["tensorrt_ddim_ms"][key]))
    fig = plots.figure()
    ax = fig.add_subplot()
    ax.barh(names, fps)
    ax.axvline(TARGETS["motion_fps"], color="r", lw=0.8, label="target")
    ax.set(xscale="log", xlabel=f"motion FPS at T={key}")
    ax.legend(fontsize=7)
    plots.save(fig, "lmdm_motion_fps.png")

    fig = plots.figure()
    ax = fig.add_subplot()
    for name, rec in ok.items():
        if name == "eager_fp32":
            continue
        pts = [
            (int(k), 1.0 - rec["ddim"][k]["cosine"])
            for k in keys
            if k in rec["ddim"] and rec["ddim"][k].get("cosine") is not None
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=name)
    if "4" in pub["cosine"]:
        ax.plot([4], [1.0 - pub["cosine"]["4"]], "k*", ms=10, label="published TensorRT")
    ax.axhline(1.0 - TARGETS["cosine"], color="r", lw=0.8, label="target")
    ax.set(xscale="log", yscale="log", xlabel="DDIM steps T", ylabel="1 - cosine to fp32 eager")
    ax.legend(fontsize=7)
    plots.save(fig, "lmdm_cosine.png")


def build_parser() -> argparse.ArgumentParser:
    """The suite's command-line options (``studio bench --suite lmdm`` maps onto these)."""
    p = suite_parser(
        "lmdm",
        "LMDM step and DDIM latency, motion FPS and accuracy per path.",
        {"repeats": "timed runs per point (default: by T)"},
    )
    p.add_argument(
        "--steps",
        type=lambda s: int_list(s, 1, DIFFUSION_STEPS, "steps"),
        default=DEFAULT_STEPS,
        metavar="1,2,4,10,50",
    )
    p.add_argument("--reduced", action="store_true", help="small LMDM (smoke runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-sets", type=int, default=3, help="rotating input sets")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile paths")
    p.add_argument("--compile-mode", default=COMPILE_MODE, help=f"default {COMPILE_MODE}")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel profile")
    p.add_argument("--no-onnx", action="store_true", help="skip the ONNX Runtime paths")
    p.add_argument("--paths", metavar="A,B", help=f"subset of: {', '.join(ALL_PATHS)}")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, write the outputs asked for, print the Markdown; 0, or 2 on errors."""
    errors = (RuntimeError, ValueError)
    return run_main("lmdm", build_parser(), argv, _run, to_markdown, save_plots, errors)


# options passed on to run_lmdm_suite as they are (the same names)
_AS_GIVEN = ("repeats", "warmup", "reduced", "seed", "compile", "compile_mode")


def _run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    return run_lmdm_suite(
        device=default_device(args.device),
        steps=args.steps,
        paths=name_list(args.paths),
        input_sets=max(1, args.input_sets),
        profile=not args.no_profile,
        onnx=not args.no_onnx,
        progress=progress,
        **{name: getattr(args, name) for name in _AS_GIVEN},
    )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
