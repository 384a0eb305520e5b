"""The ``render`` bench suite: warp network + decoder throughput per batch, precision and path.

Every path times the renderer's own engines, :class:`studio.engines.ditto.warp_decode.
WarpDecodeEngines`: the runtime's :class:`~studio.runtime.torch_backend.TorchEngine` per
network at a static batch, over one :class:`~studio.runtime.torch_backend.PrecisionAdapter`
(the precision policy), with the decoder's spectral norm folded, the renderer's channel
padding and depth-split rewrites, CUDA graphs captured by the runtime's
:func:`~studio.runtime.base.capture_cuda_graph` and optional ``torch.compile``: the code
``studio render`` runs, with the knobs it has for what the product does not default to. The
networks are the real modules of :mod:`studio.models` with random weights
(:func:`studio.fixtures.random_tree.random_network`; the released sizes, or ``reduced`` for
smoke runs); a batch is one avatar's f_s and per-frame source and driving keypoints, warp then
decode, as the Ditto renderer calls the engines.

Paths (``<kind>_<precision>``; a precision is the runtime's with the torch engines' policy
for half types: ``fp16``/``bf16`` cast the weights once, ``fp16-autocast``/``bf16-autocast``
keep fp32 weights under ``torch.autocast``; ``tf32`` is fp32 with TF32 math):

- ``eager_fp32``: the engines at fp32 (TF32 off for matmuls and cuDNN convolutions), no CUDA
  graph, no rewrites: the accuracy reference and the speed-up baseline (what the renderer runs
  on the CPU).
- ``eager_*``: the engines at that precision, run eagerly, no rewrites.
- ``channels_last_*``: the same with the torch engines' channels-last layout (4-D weights
  channels-last, 5-D channels-last-3d, the inputs too).
- ``graph_*`` (CUDA): each engine captured as a CUDA graph, in whichever layout was faster
  eager at the largest batch; ``graph_split_padded_*``: with the renderer's rewrites, i.e. the
  renderer's default without ``--compile``.
- ``compiled_graph_*`` (CUDA, ``compile=True``): the graphs over ``torch.compile``;
  ``compiled_graph_channels_last_*`` in channels-last; ``compiled_graph_split_*``,
  ``compiled_graph_padded_*`` and ``compiled_graph_split_padded_*`` (the renderer's default
  with ``--compile``) with the depth split of the 7x7x7 mask convolution
  (:func:`studio.models.depth_split.split_deep_conv3d`) and / or every convolution's channels
  zero-padded to :data:`PAD_MULTIPLE` (:func:`studio.models.channel_pad.pad_conv_channels`).
- ``padded_*``: eager with padded channels.

Each point: the engines built (and captured, compiled) first, then warm-up, then the median
of repeats (CUDA events at the run boundaries; by default enough repeats for about
``target_ms`` of timed work, 3..20), rotating over ``input_sets`` distinct (f_s, x_s, x_d)
sets; before each run, untimed, the set's f_s is loaded into the engines
(:meth:`~studio.engines.ditto.warp_decode.WarpDecodeEngines.load_avatar`: once per avatar in a
clip) and the GPU's L2 cache is flushed. A timed run is one call of the engines, as the
renderer makes it per batch. Throughput is frames/s and ms/frame; the FLOP floor is FLOPs per
frame (counted at the run's shapes with ``FlopCounterMode``; for the released sizes the
manifest's ``networks.warp_network.flops.forward_total +
networks.decoder.flops.forward_total`` = 1.234 TFLOP) over the rate of a large matmul of the
same precision measured in the same run. Accuracy: cosine similarity and relative L2 of each
path's images to ``eager_fp32`` on the same inputs and batch, worst over the input sets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from studio.bench.report import (
    compare,
    fmt,
    fmt_cos,
    int_list,
    is_ok,
    markdown_tail,
    measured_on,
    name_list,
    run_main,
    settings_markdown,
    suite_parser,
    table,
    worst,
    write_plots,
)
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
from studio.engines.ditto.warp_decode import RENDER_NETWORKS, WarpDecodeEngines
from studio.fixtures.random_tree import random_network
from studio.models import network_spec
from studio.models.channel_pad import TENSOR_CORE_MULTIPLE
from studio.models.decoder import fold_spectral_norm
from studio.models.warp_network import FEATURE_SIZE
from studio.runtime.base import HALF_DTYPES, math_mode
from studio.runtime.precision import precision_support

__all__ = [
    "DEFAULT_BATCHES",
    "ENGINE",
    "MANIFEST_KEYS",
    "PRECISIONS",
    "PUBLISHED",
    "TARGETS",
    "RenderPath",
    "build_engines",
    "count_flops",
    "main",
    "manifest_flops",
    "plan_paths",
    "run_render_suite",
    "save_plots",
    "sized_warp",
    "to_markdown",
]

DEFAULT_BATCHES: tuple[int, ...] = (1, 4, 8, 16, 32)
MAX_BATCH = 256
ACCURATE_COSINE = 0.999  # a fast path counts as accurate at or above this cosine to fp32 eager
MIN_REPEATS, MAX_REPEATS = 3, 20
PAD_MULTIPLE = TENSOR_CORE_MULTIPLE  # channel multiple of the padded paths
TARGET_MS = 1000.0  # timed work per point when repeats are chosen automatically
COMPILE_MODE = "default"

PUBLISHED: dict[str, Any] = {
    "source": "Ditto reference, RTX 5090 laptop GPU, TensorRT 10.15",
    "clip_frames": 165,
    "warp_decode_ms": 2180.0,  # the whole 165-frame clip
    "warp_decode_fps": 165 / 2.180,
    "render_loop_fps": 71.1,
    "flops_per_frame_tflop": 1.234,
}
TARGETS: dict[str, Any] = {"render_loop_fps": 300.0, "side": 512}

MANIFEST_NAME = "ditto_state_dicts.json"
MANIFEST_KEYS: dict[str, str] = {
    "warp_network": "networks.warp_network.flops.forward_total",
    "decoder": "networks.decoder.flops.forward_total",
}
# The manifest's values at those keys, for machines that have no ../shared checkout (the
# device machine): used only when the file is not found, and then said so in the result.
_MANIFEST_COPY: dict[str, int] = {"warp_network": 342_071_443_456, "decoder": 891_574_812_672}


# --- precisions and paths ------------------------------------------------------------------

ENGINE = "studio.engines.ditto.warp_decode.WarpDecodeEngines"
# --precisions name -> (the runtime's precision, the torch engines' half_mode; None: not half)
PRECISIONS: dict[str, tuple[str, str | None]] = {
    "fp32": ("fp32", None),
    "tf32": ("tf32", None),
    "fp16": ("fp16", "cast"),
    "bf16": ("bf16", "cast"),
    "fp16-autocast": ("fp16", "autocast"),
    "bf16-autocast": ("bf16", "autocast"),
}
CUDA_PRECISIONS = tuple(PRECISIONS)
CPU_PRECISIONS = ("fp32",)  # add bf16-autocast by hand; torch on the CPU has no fp16 kernels


@dataclass(frozen=True)
class RenderPath:
    """One measured path: the engines' knobs (precision, layout, rewrites, graph, compile)."""

    name: str
    precision: str  # a name of PRECISIONS
    layout: str = "contiguous"  # | "channels_last" | "auto" (the faster eager layout)
    pad: int = 0  # conv channels padded to this multiple (studio.models.channel_pad), 0: as is
    split: bool = False  # deep 3-D convolutions over depth slices (studio.models.depth_split)
    graph: bool = False
    compile: bool = False
    reference: bool = False


def _tag(precision: str) -> str:
    return precision.replace("-", "_")


def plan_paths(precisions: Sequence[str], device: str, compile: bool = False) -> list[RenderPath]:
    """The paths for these precisions on this device, ``eager_fp32`` (the reference) first.

    On CUDA, fp32 runs only as the reference (``tf32`` is the fast fp32 path); every other
    precision gets eager, channels-last, padded and graph paths (and compiled graphs with
    ``compile``). On the CPU: eager, channels-last and padded paths per precision.
    """
    cuda = torch.device(device).type == "cuda"
    paths = [RenderPath("eager_fp32", "fp32", reference=True)]
    for name in precisions:
        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
        t, fast = _tag(name), name != "fp32"
        if fast:
            paths.append(RenderPath(f"eager_{t}", name))
        if fast or not cuda:
            paths.append(RenderPath(f"channels_last_{t}", name, layout="channels_last"))
        if cuda and fast:
            rewrites = {"pad": PAD_MULTIPLE, "split": True}  # the renderer's defaults on graphs
            paths.append(RenderPath(f"graph_{t}", name, layout="auto", graph=True))
            paths.append(RenderPath(f"graph_split_padded_{t}", name, graph=True, **rewrites))
            if compile:
                for kind, knobs in (
                    ("", {"layout": "auto"}),
                    ("_channels_last", {"layout": "channels_last"}),
                    ("_split", {"split": True}),
                    ("_padded", {"pad": PAD_MULTIPLE}),
                    ("_split_padded", rewrites),
                ):
                    paths.append(
                        RenderPath(
                            f"compiled_graph{kind}_{t}", name, graph=True, compile=True, **knobs
                        )
                    )
        if fast:
            paths.append(RenderPath(f"padded_{t}", name, pad=PAD_MULTIPLE))
    return paths


def build_engines(
    spec: RenderPath,
    warp: nn.Module,
    decoder: nn.Module,
    device: torch.device,
    channels_last: bool = False,
    compile_mode: str = COMPILE_MODE,
    feature_size: int = FEATURE_SIZE,
) -> WarpDecodeEngines:
    """The renderer's engines for one path: its precision and half policy, rewrites, CUDA
    graphs and compile; ``channels_last`` is the path's layout once ``auto`` is resolved."""
    precision, half_mode = PRECISIONS[spec.precision]
    knobs = {  # keyword-only, the product's defaults unless the path turns them
        "cuda_graphs": spec.graph,
        "half_mode": half_mode or "cast",
        "channels_last": channels_last,
        "compile_mode": compile_mode,
        "feature_size": feature_size,
    }
    return WarpDecodeEngines(
        warp, decoder, precision, device, spec.compile, "torch", spec.pad, spec.split, **knobs
    )


@contextlib.contextmanager
def _compile_room(entries: int) -> Iterator[None]:
    """Room in Dynamo's caches for ``entries`` compiled engines, restored after. Every torch
    engine compiles the same code (the precision adapter's forward), once per network, batch
    size and path, and Dynamo keeps at most ``recompile_limit`` (8) graphs per code object:
    past it the rest would run eagerly inside their CUDA graphs, with a log line only."""
    if entries <= 0:
        yield
        return
    entries += 8  # Dynamo's default: room for whatever else the process compiles
    import torch._dynamo

    cfg = torch._dynamo.config
    names = [
        next((n for n in pair if hasattr(cfg, n)), None)
        for pair in (
            ("recompile_limit", "cache_size_limit"),
            ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
        )
    ]
    before = {n: getattr(cfg, n) for n in names if n is not None}
    for name, value in before.items():
        setattr(cfg, name, max(value, entries))
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(cfg, name, value)


def _dtype(precision: str) -> torch.dtype:
    """The compute dtype of a --precisions name."""
    return HALF_DTYPES.get(PRECISIONS[precision][0], torch.float32)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --- FLOPs, matmul rate, inputs -----------------------------------------------------------------


def count_flops(warp: nn.Module, decoder: nn.Module, size: int = FEATURE_SIZE) -> dict[str, Any]:
    """FLOPs of one frame (batch 1, f_s maps ``size``²) per network, counted on meta copies.

    FlopCounterMode, the manifest's convention: 2 FLOPs per multiply-add; convolutions and
    matmuls counted, grid sampling, norms and elementwise work not.
    """
    w = copy.deepcopy(warp).to("meta")
    d = fold_spectral_norm(decoder).to("meta")
    f_s, x_s, x_d = (t.to("meta") for t in _example(w, 1, size))
    with torch.no_grad():
        with FlopCounterMode(display=False) as fw:
            feature = w(f_s, x_s, x_d)
        with FlopCounterMode(display=False) as fd:
            image = d(feature)
    return {
        "warp_network": int(fw.get_total_flops()),
        "decoder": int(fd.get_total_flops()),
        "per_frame": int(fw.get_total_flops() + fd.get_total_flops()),
        "feature": list(feature.shape[1:]),
        "output": list(image.shape[1:]),
    }


def _manifest_candidates() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    return [
        root / "shared" / "reference" / MANIFEST_NAME,
        root.parent / "shared" / "reference" / MANIFEST_NAME,
        Path("/work/shared/reference") / MANIFEST_NAME,
    ]


def manifest_flops(path: str | Path | None = None) -> dict[str, Any]:
    """Warp and decoder FLOPs per frame at :data:`MANIFEST_KEYS` of the reference manifest.

    Looks in ``shared/reference`` beside or above the checkout unless ``path`` is given; when
    no file is found, the values copied from it into this module are returned (``read_from``
    says which).
    """
    candidates = [Path(path)] if path else _manifest_candidates()
    out: dict[str, Any] = {"keys": dict(MANIFEST_KEYS)}
    for cand in candidates:
        if cand.is_file():
            data = json.loads(cand.read_text())
            for name, key in MANIFEST_KEYS.items():
                node: Any = data
                for part in key.split("."):
                    node = node[part]
                out[name] = int(node)
            out["read_from"] = str(cand)
            break
    else:
        out.update(_MANIFEST_COPY)
        out["read_from"] = "copy in studio.bench.render (manifest file not found here)"
    out["per_frame"] = out["warp_network"] + out["decoder"]
    return out


def matmul_rate(
    precision: str, device: torch.device, n: int, repeats: int, warmup: int = 2
) -> dict[str, Any]:
    """TFLOP/s of an n x n x n matmul in the precision's dtype, under the runtime's math mode
    for it (TF32 on for ``tf32`` only)."""
    runtime_precision = PRECISIONS[precision][0]
    dtype = _dtype(precision)
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    c = torch.empty_like(a)
    with math_mode(runtime_precision, device), torch.no_grad():
        t = measure(lambda: torch.mm(a, b, out=c), device=device, repeats=repeats, warmup=warmup)
    return {
        "dtype": _dtype_name(dtype),
        "tf32": runtime_precision == "tf32",
        "n": n,
        "median_ms": t.median_ms,
        "tflops": 2.0 * n**3 / (t.median_ms / 1e3) / 1e12,
    }


def _example(
    warp: nn.Module, batch: int, size: int = FEATURE_SIZE
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded f_s [1, C, D, size, size] and keypoint pairs [batch, K, 3] (on the CPU)."""
    g = torch.Generator().manual_seed(batch)
    f_s = torch.randn(1, warp.reshape_channel, warp.reshape_depth, size, size, generator=g)
    x_s = (torch.rand(batch, warp.num_kp, 3, generator=g) * 2 - 1) * 0.6
    x_d = x_s + 0.05 * torch.randn(batch, warp.num_kp, 3, generator=g)
    return f_s, x_s, x_d


@dataclass
class _Inputs:
    """Rotating input sets on the device: one f_s per set, keypoint pairs per batch and set."""

    f_s: list[Tensor]
    x_s: dict[int, list[Tensor]]
    x_d: dict[int, list[Tensor]]

    @property
    def count(self) -> int:
        return len(self.f_s)

    def batch(self, b: int) -> list[tuple[Tensor, Tensor, Tensor]]:
        return [(self.f_s[k], self.x_s[b][k], self.x_d[b][k]) for k in range(self.count)]


def _make_inputs(
    warp: nn.Module, batches: Sequence[int], sets: int, size: int, seed: int, device: torch.device
) -> _Inputs:
    g = torch.Generator().manual_seed(seed + 17)
    c, d, k = warp.reshape_channel, warp.reshape_depth, warp.num_kp
    f_s = [torch.randn(1, c, d, size, size, generator=g).to(device) for _ in range(sets)]
    x_s: dict[int, list[Tensor]] = {}
    x_d: dict[int, list[Tensor]] = {}
    for b in batches:
        src = [(torch.rand(b, k, 3, generator=g) * 2 - 1) * 0.6 for _ in range(sets)]
        x_s[b] = [s.to(device) for s in src]
        x_d[b] = [(s + 0.05 * torch.randn(b, k, 3, generator=g)).to(device) for s in src]
    return _Inputs(f_s, x_s, x_d)


class _CacheFlush:
    """Overwrites a buffer twice the GPU's L2 size (untimed, before each run); no-op on CPU."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.buf: Tensor | None = None
        if enabled and device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
            self.buf = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)

    @property
    def bytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * 4

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


def sized_warp(warp: nn.Module, size: int) -> nn.Module:
    """``warp`` whose ``example_inputs`` (the engines' static input shapes) give f_s maps of
    ``size``² instead of the product's :data:`FEATURE_SIZE`² (bound to this instance, so the
    engines' copies keep it); the network itself when ``size`` is the product's."""
    if size == FEATURE_SIZE:
        return warp

    def example_inputs(self: nn.Module, batch: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        _, x_s, x_d = type(self).example_inputs(self, batch)
        g = torch.Generator(x_s.device).manual_seed(0)
        shape = (batch, self.reshape_channel, self.reshape_depth, size, size)
        return torch.randn(*shape, generator=g, device=x_s.device), x_s, x_d

    warp.example_inputs = types.MethodType(example_inputs, warp)
    return warp


# --- measuring -------------------------------------------------------------------------------


def _timed(
    fn: Callable[[], object],
    setup: Callable[[int], None],
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
) -> Timing:
    """``measure`` with the given repeats, or enough for about ``target_ms`` (3..20)."""
    if repeats is not None:
        return measure(fn, device=device, repeats=repeats, warmup=warmup, setup=setup)
    probe = measure(fn, device=device, repeats=1, warmup=warmup, setup=setup)
    reps = math.ceil(target_ms / max(probe.median_ms, 1e-3))
    reps = max(MIN_REPEATS, min(MAX_REPEATS, reps))
    return measure(fn, device=device, repeats=reps, warmup=0, setup=setup)


def _point(timing: Timing, batch: int, flops: int, rate_tflops: float | None) -> dict[str, Any]:
    ms = timing.median_ms
    fps = batch / (ms / 1e3) if ms > 0 else math.inf
    tflops = flops * fps / 1e12
    rec = {
        **timing.to_dict(),
        "fps": fps,
        "ms_per_frame": ms / batch,
        "tflops": tflops,
        "matmul_tflops": rate_tflops,
        "floor_ms_per_frame": flops / (rate_tflops * 1e12) * 1e3 if rate_tflops else None,
        "floor_fraction": tflops / rate_tflops if rate_tflops else None,
    }
    return rec


class _Runner:
    """How one batch of a path is run: ``setup(i)`` (untimed: input set ``i``'s avatar loaded
    into the engines, L2 flushed) then ``fn()`` (one call of the engines, as the renderer makes
    it per batch); ``render(k)`` returns a copy of the images of input set ``k``."""

    def __init__(
        self,
        wd: WarpDecodeEngines,
        sets: list[tuple[Tensor, Tensor, Tensor]],
        batch: int,
        flush: _CacheFlush,
    ) -> None:
        self.wd, self.sets, self.batch, self.flush = wd, sets, batch, flush
        self.k = 0
        self.out: Tensor | None = None
        self.setup(0)  # builds (captures, compiles) the engines of this batch, untimed

    def setup(self, i: int) -> None:
        self.k = i % len(self.sets)
        self.wd.load_avatar(self.sets[self.k][0], self.batch)
        self.flush()

    def fn(self) -> object:
        self.out = self.wd(*self.sets[self.k], self.batch)
        return self.out

    def render(self, k: int) -> Tensor:
        self.setup(k)
        if self.out is not None and self.wd.graphs:
            self.out.fill_(float("nan"))  # the graphs' output: every element must be rewritten
        out = self.fn()
        assert isinstance(out, Tensor)
        return out.clone()


def _run_batch(
    runner: _Runner,
    batch: int,
    ref: list[Tensor] | None,
    flops: int,
    rate: float | None,
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
    reference: bool = False,
) -> tuple[dict[str, Any], list[Tensor]]:
    """One (path, batch) point: timing, throughput, FLOP floor, accuracy against ``ref``
    (``reference``: against a second run of itself); (point, the reference images)."""
    n = len(runner.sets)
    timing = _timed(runner.fn, runner.setup, device, repeats, warmup, target_ms)
    images = [runner.render(k) for k in range(n)]
    point = _point(timing, batch, flops, rate)
    if reference:  # the reference, against a second run of itself
        ref, images = images, [runner.render(k) for k in range(n)]
    if ref is not None:
        point.update(worst([compare(a, r) for a, r in zip(images, ref, strict=True)]))
    else:
        point.update(cosine=None, rel_l2=None, finite=None, accuracy="no reference at this batch")
    point["status"] = "ok"
    return point, images if ref is None else ref


def _run_path(
    wd: WarpDecodeEngines,
    inputs: _Inputs,
    batches: Sequence[int],
    refs: dict[int, list[Tensor]] | None,
    flops: int,
    rate: float | None,
    flush: _CacheFlush,
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
) -> tuple[dict[str, Any], dict[int, list[Tensor]]]:
    """Time one path's engines at every batch; (record, the images per batch and set when
    ``refs`` is None: the reference path)."""
    out_images: dict[int, list[Tensor]] = {}
    per_batch: dict[str, Any] = {}
    for b in batches:
        try:
            runner = _Runner(wd, inputs.batch(b), b, flush)
            point, images = _run_batch(
                runner,
                b,
                None if refs is None else refs.get(b),
                flops,
                rate,
                device,
                repeats,
                warmup,
                target_ms,
                reference=refs is None,
            )
            per_batch[str(b)] = point
            if refs is None:
                out_images[b] = images
            del runner, images
        except Exception as e:  # out of memory at a large batch, a missing kernel, ...
            synchronize(device)
            per_batch[str(b)] = {"status": "error", "reason": _reason(e)}
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
    ok = [r for r in per_batch.values() if is_ok(r)]
    rec: dict[str, Any] = {"status": "ok" if ok else "error", "batches": per_batch}
    if not ok:
        rec["reason"] = next(iter(per_batch.values()))["reason"] if per_batch else "no batches"
    return rec, out_images


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _path_settings(spec: RenderPath, wd: WarpDecodeEngines, compile_mode: str) -> dict[str, Any]:
    """What ran for a path: its knobs and what the engines say of themselves."""
    precision, half_mode = PRECISIONS[spec.precision]
    dtype = _dtype_name(_dtype(spec.precision))
    return {
        **asdict(spec),
        "engine": ENGINE,
        "runtime": wd.runtime,
        "runtime_precision": precision,
        "dtype": dtype,
        "mode": half_mode or "fp32",
        "tf32": precision == "tf32",
        "weights": dtype if half_mode == "cast" else "float32",
        "layout": "channels_last" if wd.channels_last else "contiguous",
        "decoder": "spectral norm folded (the engines')",
        "cuda_graphs": "one per engine and batch size (runtime capture)" if wd.graphs else False,
        "compiled": wd.compiled,
        "compile_mode": compile_mode if wd.compiled else None,
        "channel_pad": wd.channel_pad,
        "depth_split": wd.depth_split,
    }


# --- the suite -----------------------------------------------------------------------------


def run_render_suite(
    device: str = "cuda",
    batches: Sequence[int] = DEFAULT_BATCHES,
    precisions: Sequence[str] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    reduced: bool = False,
    feature_size: int = FEATURE_SIZE,
    seed: int = 0,
    input_sets: int = 3,
    compile: bool = False,
    compile_mode: str = COMPILE_MODE,
    paths: Sequence[str] | None = None,
    matmul_size: int | None = None,
    target_ms: float = TARGET_MS,
    cudnn_benchmark: bool = True,
    flush_cache: bool = True,
    manifest: str | Path | None = None,
    profile: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the renderer's warp + decode engines per path and batch; a JSON-ready dict (see
    the module docstring).

    ``precisions`` None: all of :data:`PRECISIONS` on CUDA, fp32 on the CPU. ``paths`` limits
    the paths run (``eager_fp32`` always runs). ``repeats`` None: automatic (``target_ms``);
    ``warmup`` None: 2 on CUDA, 1 on the CPU. ``cudnn_benchmark`` is cuDNN's autotuner for the
    eager paths (the engines tune at capture whatever it says). Keys: suite, facts, config,
    flops, matmul, published, targets, paths (name -> status, settings, batches[str(B)]),
    summary, notes; on CUDA with ``profile``, also profile and profile_rewritten
    (:func:`profile_networks` at fp16, largest batch, without and with the rewrites).
    """
    say = progress or (lambda _line: None)
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device (use --device cpu)")
    if feature_size < 32 or feature_size % 32:
        raise ValueError(
            f"feature size must be a multiple of 32 (the hourglass), got {feature_size}"
        )
    batches = tuple(int(b) for b in batches)
    precisions = tuple(precisions or (CUDA_PRECISIONS if dev.type == "cuda" else CPU_PRECISIONS))
    plan = plan_paths(precisions, device, compile)
    known = [p.name for p in plan_paths(tuple(PRECISIONS), device, True)]
    if paths is not None:
        unknown = set(paths) - set(known)
        if unknown:
            raise ValueError(f"unknown paths {sorted(unknown)}; known here: {', '.join(known)}")
        plan = [p for p in plan if p.reference or p.name in set(paths)]
    warmup = (2 if dev.type == "cuda" else 1) if warmup is None else warmup
    matmul_n = matmul_size or (8192 if dev.type == "cuda" else 1024)

    warp_cpu = random_network("warp_network", reduced=reduced, seed=seed)
    decoder_cpu = random_network("decoder", reduced=reduced, seed=seed)
    counted = count_flops(warp_cpu, decoder_cpu, feature_size)
    released = not reduced and feature_size == FEATURE_SIZE
    man = manifest_flops(manifest)
    flops = counted["per_frame"]
    warp = sized_warp(warp_cpu.to(dev), feature_size)
    decoder = decoder_cpu.to(dev)
    inputs = _make_inputs(warp, batches, input_sets, feature_size, seed, dev)
    flush = _CacheFlush(dev, flush_cache)
    support = precision_support("torch", dev)
    bench_before = torch.backends.cudnn.benchmark
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark
        torch.cuda.reset_peak_memory_stats(dev)

    result: dict[str, Any] = {
        "suite": "render",
        "facts": {**device_facts(dev), "date": utc_now(), "commit": git_commit()},
        "config": {
            "batches": list(batches),
            "precisions": list(precisions),
            "repeats": repeats,
            "repeats_rule": f"automatic: about {target_ms:.0f} ms of timed runs, "
            f"{MIN_REPEATS}..{MAX_REPEATS}"
            if repeats is None
            else "fixed",
            "warmup": warmup,
            "input_sets": input_sets,
            "reduced": reduced,
            "feature_size": feature_size,
            "output": counted["output"],
            "seed": seed,
            "compile": compile,
            "compile_mode": compile_mode if compile else None,
            "cudnn_benchmark": cudnn_benchmark if dev.type == "cuda" else None,
            "l2_flush_bytes": flush.bytes,
            "engine": ENGINE,
            "inputs": "per set: one f_s [1, C, D, H, W] loaded into the engines (once per "
            "avatar, untimed), x_s and x_d [B, 21, 3] per frame",
            "models": {
                name: {
                    "parameters": sum(p.numel() for p in m.parameters()),
                    "kwargs": network_spec(name).reduced_kwargs if reduced else "released",
                    "weights": "random (seeded), studio.fixtures.random_tree.random_network",
                }
                for name, m in (("warp_network", warp), ("decoder", decoder))
            },
            "timing": "CUDA events per run, synced at the run boundary; median of repeats"
            if dev.type == "cuda"
            else "perf_counter per run; median of repeats",
        },
        "flops": {
            "per_frame": flops,
            "counted": counted,
            "counted_with": "torch.utils.flop_counter.FlopCounterMode on meta copies at batch 1 "
            "(2 FLOPs per multiply-add; convolutions; grid sampling and norms not counted)",
            "manifest": man,
            "released_sizes": released,
            "matches_manifest": counted["per_frame"] == man["per_frame"] if released else None,
        },
        "matmul": {},
        "published": PUBLISHED,
        "targets": TARGETS,
        "paths": {},
        "notes": [],
    }

    rates: dict[tuple[str, bool], dict[str, Any]] = {}
    for name in (*precisions, *(() if "fp32" in precisions else ("fp32",))):
        key = (_dtype_name(_dtype(name)), PRECISIONS[name][0] == "tf32")
        if key not in rates:
            try:
                rates[key] = matmul_rate(
                    name, dev, matmul_n, repeats or (10 if dev.type == "cuda" else 3)
                )
            except Exception as e:
                rates[key] = {"dtype": key[0], "tf32": key[1], "n": matmul_n, "error": _reason(e)}
        result["matmul"][name] = rates[key]
    say(
        "[render] matmul TFLOP/s: "
        + ", ".join(f"{k} {v.get('tflops', float('nan')):.2f}" for k, v in result["matmul"].items())
    )

    refs: dict[int, list[Tensor]] = {}
    eager_layout: dict[str, dict[str, float]] = {}  # precision -> layout -> fps at largest batch
    compiled = sum(spec.compile for spec in plan) if dev.type == "cuda" else 0
    restore = contextlib.ExitStack()
    try:
        restore.enter_context(_compile_room(len(RENDER_NETWORKS) * len(batches) * compiled))
        for spec in plan:
            rate = result["matmul"][spec.precision].get("tflops")
            layout = spec.layout
            if layout == "auto":
                seen = eager_layout.get(spec.precision, {})
                layout = max(seen, key=seen.get) if seen else "contiguous"
            why = support.get(PRECISIONS[spec.precision][0])
            if spec.graph and dev.type != "cuda":
                why = "needs --device cuda"
            if why is not None:
                result["paths"][spec.name] = {"status": "skipped", "reason": why}
                if spec.reference:
                    raise RuntimeError(f"the fp32 eager reference cannot run: {why}")
                continue
            started = time.perf_counter()
            wd: WarpDecodeEngines | None = None
            settings: dict[str, Any] = {**asdict(spec), "layout": layout}
            try:
                wd = build_engines(
                    spec, warp, decoder, dev, layout == "channels_last", compile_mode, feature_size
                )
                settings = _path_settings(spec, wd, compile_mode)
                rec, images = _run_path(
                    wd,
                    inputs,
                    batches,
                    None if spec.reference else refs,
                    flops,
                    rate,
                    flush,
                    dev,
                    repeats,
                    warmup,
                    target_ms,
                )
            except Exception as e:
                synchronize(dev)
                rec, images = {"status": "error", "reason": _reason(e)}, {}
            if spec.reference:
                refs = images
                if not is_ok(rec):
                    raise RuntimeError(f"the fp32 eager reference failed: {rec.get('reason')}")
            if spec.layout == "auto":
                settings["layout_rule"] = "the faster eager layout at the largest batch"
            settings["path_s"] = round(time.perf_counter() - started, 1)
            rec["settings"] = settings
            result["paths"][spec.name] = rec
            if not spec.graph and not spec.pad and not spec.split and is_ok(rec):
                ok_b = [int(b) for b, r in rec["batches"].items() if is_ok(r)]
                largest = str(max(ok_b))
                eager_layout.setdefault(spec.precision, {})[layout] = rec["batches"][largest]["fps"]
            say(_progress_line(spec.name, rec))
            del wd  # the path's weight copies and graph pools go before the next path
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if profile and dev.type == "cuda":
            # as loaded, then with the render engines' rewrites (depth split, padded channels)
            for key, rewrite in (("profile", False), ("profile_rewritten", True)):
                try:
                    result[key] = profile_networks(
                        warp,
                        decoder,
                        "fp16",
                        dev,
                        inputs,
                        max(batches),
                        PAD_MULTIPLE if rewrite else 0,
                        rewrite,
                        feature_size,
                    )
                except Exception as e:  # out of memory, a profiler without CUDA activity, ...
                    result[key] = {"error": _reason(e)}
    finally:
        restore.close()
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = bench_before
    if dev.type == "cuda":
        result["facts"]["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
    else:
        result["notes"].append(
            "CUDA graph and torch.compile paths need --device cuda; on the CPU only eager, "
            "channels-last and padded paths run"
        )
    if not compile and dev.type == "cuda":
        result["notes"].append("torch.compile paths not run (--compile measures them)")
    result["summary"] = _summary(result)
    return result


RENDER_KERNELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("grid sampling", ("grid_sampler",)),
    ("convolution / GEMM", ("conv", "implicit", "xmma", "cutlass", "gemm", "nvjet", "sm90_")),
    ("normalisation", ("norm", "welford")),
    ("triton (fused)", ("triton",)),
    ("upsample / pixel shuffle", ("upsample", "pixel_shuffle", "interpolate")),
    ("copy / layout", ("copy", "nchw", "nhwc", "cat", "memcpy", "memset", "fill")),
    ("reduction", ("reduce", "softmax")),
)


def profile_networks(
    warp: nn.Module,
    decoder: nn.Module,
    precision: str,
    device: torch.device,
    inputs: _Inputs,
    batch: int,
    pad: int = 0,
    split: bool = False,
    feature_size: int = FEATURE_SIZE,
) -> dict[str, Any]:
    """Where a batch's time goes: the kernels of the warp engine and of the decoder engine
    (the renderer's, run eagerly at ``precision``, conv channels padded to ``pad``, the deep
    3-D convolution depth-split with ``split``), each run once after a warm-up, by kind."""
    spec = RenderPath("profile", precision, pad=pad, split=split)
    wd = build_engines(spec, warp, decoder, device, feature_size=feature_size)
    engines = wd.engines(batch)
    f_s, x_s, x_d = inputs.batch(batch)[0]
    feed = {
        "feature_3d": f_s.expand(batch, *f_s.shape[1:]).contiguous(),
        "kp_source": x_s,
        "kp_driving": x_d,
    }
    warp_engine, decoder_engine = engines["warp_network"], engines["decoder"]
    feature = warp_engine.run(feed)["out"]
    for _ in range(2):
        decoder_engine.run({"feature": warp_engine.run(feed)["out"]})
    nets = {
        "warp_network": kernel_profile(lambda: warp_engine.run(feed), device, RENDER_KERNELS),
        "decoder": kernel_profile(
            lambda: decoder_engine.run({"feature": feature}), device, RENDER_KERNELS
        ),
    }
    return {
        "precision": precision,
        "batch": batch,
        "pad": pad,
        "split": split,
        "engine": ENGINE,
        "networks": nets,
        "ms_per_frame": {n: p["kernel_ms"] / batch for n, p in nets.items()},
    }


def _profile_markdown(prof: dict[str, Any]) -> list[str]:
    padded = f", channels padded to {prof['pad']}" if prof.get("pad") else ""
    padded = (", mask depth-split" if prof.get("split") else "") + padded
    title = f"### Where the time goes: eager {prof.get('precision')}, B={prof.get('batch')}{padded}"
    out = ["", title, ""]
    if prof.get("error"):
        return [*out, f"Profile failed: {prof['error']}"]
    per = prof["ms_per_frame"]
    out.append(
        "Summed kernel time per frame: "
        + ", ".join(f"{n} {fmt(v, 3)} ms" for n, v in per.items())
        + f" (total {fmt(sum(per.values()), 3)} ms)."
    )
    for name, p in prof["networks"].items():
        out += ["", f"**{name}** ({p['kernels']} kernels, {fmt(p['kernel_ms'], 2)} ms)", ""]
        out += table(
            ["kernel kind", "kernels", "ms", "share"],
            [
                [k, str(v["kernels"]), fmt(v["ms"], 3), f"{100 * v['ms'] / p['kernel_ms']:.0f}%"]
                for k, v in p["by_category"].items()
            ]
            if p["kernel_ms"] > 0
            else [],
        )
        out += [
            "",
            *table(
                ["top kernels", "count", "ms"],
                [
                    [f"`{t['name'][:80]}`".replace("|", "/"), str(t["count"]), fmt(t["ms"], 3)]
                    for t in p["top_kernels"][:6]
                ],
            ),
        ]
    return out


def _progress_line(name: str, rec: dict[str, Any]) -> str:
    if not is_ok(rec):
        return f"[render] {name}: {rec['status']}: {rec.get('reason')}"
    cells = ", ".join(
        f"B={b} {r['fps']:.1f} fps cos {fmt_cos(r.get('cosine'))}"
        if is_ok(r)
        else f"B={b} {r['status']}"
        for b, r in rec["batches"].items()
    )
    return f"[render] {name}: {cells}"


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """Best path per batch, speed-ups over our fp32 eager, the best overall and the target."""
    paths = result["paths"]
    eager = paths["eager_fp32"]["batches"]
    best: dict[str, Any] = {}
    speedups: dict[str, dict[str, float]] = {}
    for name, rec in paths.items():
        if not is_ok(rec) or name == "eager_fp32":
            continue
        speedups[name] = {
            b: r["fps"] / eager[b]["fps"]
            for b, r in rec["batches"].items()
            if is_ok(r) and is_ok(eager.get(b, {}))
        }
    overall: dict[str, Any] | None = None
    for b in (str(x) for x in result["config"]["batches"]):
        cands = [
            (rec["batches"][b]["fps"], name, rec["batches"][b])
            for name, rec in paths.items()
            if is_ok(rec) and is_ok(rec["batches"].get(b, {}))
        ]
        accurate = [c for c in cands if (c[2].get("cosine") or 0.0) >= ACCURATE_COSINE]
        pool = accurate or cands
        if not pool:
            continue
        fps, name, r = max(pool, key=lambda c: c[0])
        best[b] = {
            "path": name,
            "fps": fps,
            "ms_per_frame": r["ms_per_frame"],
            "floor_fraction": r.get("floor_fraction"),
            "cosine": r.get("cosine"),
            "speedup_vs_eager": fps / eager[b]["fps"] if is_ok(eager.get(b, {})) else None,
            "meets_cosine": bool(accurate),
        }
        if overall is None or fps > overall["fps"]:
            overall = {"batch": int(b), **best[b]}
    summary: dict[str, Any] = {"best": best, "speedup_vs_eager": speedups, "best_overall": overall}
    out = result["config"]["output"]
    side_ok = out[-1] == TARGETS["side"] and out[-2] == TARGETS["side"]
    if overall is not None:
        base = eager.get(str(overall["batch"]), {})
        eager_fps = base["fps"] if is_ok(base) else None
        goal = TARGETS["render_loop_fps"]
        summary["vs_published_warp_decode"] = overall["fps"] / PUBLISHED["warp_decode_fps"]
        summary["targets"] = [
            {
                "target": f">= {goal:.0f} FPS at {TARGETS['side']}² (warp+decode alone; the "
                "render loop adds stitching and paste-back: pipeline suite)",
                "ours": overall["fps"],
                "path": overall["path"],
                "batch": overall["batch"],
                "met": bool(side_ok and overall["fps"] >= goal),
                "evaluated": side_ok,
                "needed_speedup_vs_eager": goal / eager_fps if eager_fps else None,
                "achieved_speedup_vs_eager": overall["fps"] / eager_fps if eager_fps else None,
            }
        ]
    else:
        summary["targets"] = "not evaluated: no path was measured"
    return summary


# --- reporting -----------------------------------------------------------------------------


def to_markdown(result: dict[str, Any]) -> str:
    """Markdown tables: frames/s, ms/frame, FLOP-floor fraction, accuracy, beside the published."""
    facts, cfg, paths = result["facts"], result["config"], result["paths"]
    keys = [str(b) for b in cfg["batches"]]
    ok = {n: r for n, r in paths.items() if is_ok(r)}
    pub, fl = result["published"], result["flops"]
    man = fl["manifest"]
    out_side = "x".join(str(v) for v in cfg["output"][1:])
    size = "released" if not cfg["reduced"] else "reduced"
    out = [
        "## Render: warp network + decoder, batched",
        "",
        measured_on(facts),
        f"Every path is the renderer's own engines (`{cfg['engine']}`) with the knobs its "
        "settings row names.",
        f"Random weights, {size} architecture (warp network "
        f"{cfg['models']['warp_network']['parameters']:,} and decoder "
        f"{cfg['models']['decoder']['parameters']:,} parameters), feature maps "
        f"{cfg['feature_size']}², output {out_side}; {cfg['timing']}; repeats "
        f"{cfg['repeats_rule'] if cfg['repeats'] is None else cfg['repeats']}; "
        f"{cfg['input_sets']} rotating input sets"
        + (
            f", L2 flushed before each run ({cfg['l2_flush_bytes'] // 2**20} MiB)"
            if cfg["l2_flush_bytes"]
            else ""
        )
        + ".",
        "",
        f"FLOPs per frame: **{fl['per_frame'] / 1e12:.4f} TFLOP** counted at these shapes "
        f"(warp {fl['counted']['warp_network'] / 1e9:,.1f} + decoder "
        f"{fl['counted']['decoder'] / 1e9:,.1f} GFLOP); the manifest "
        f"(`{man['keys']['warp_network']}` + `{man['keys']['decoder']}`, {man['read_from']}) "
        f"gives {man['per_frame'] / 1e12:.4f} TFLOP for the released sizes"
        + (
            f" ({'matches' if fl['matches_manifest'] else '**differs from**'} the count)."
            if fl["released_sizes"]
            else " (not these sizes)."
        ),
        f"Published ({pub['source']}): warp+decode {pub['warp_decode_ms']:,.0f} ms for the "
        f"{pub['clip_frames']}-frame clip = {pub['warp_decode_fps']:.1f} frames/s; render loop "
        f"{pub['render_loop_fps']} FPS. Target: >= {TARGETS['render_loop_fps']:.0f} FPS render "
        f"loop at {TARGETS['side']}².",
        "",
        "### Matrix rate of the same run (the FLOP floor's denominator)",
        "",
    ]
    rows = []
    for name, m in result["matmul"].items():
        rows.append(
            [
                name,
                m["dtype"] + (" (TF32)" if m.get("tf32") else ""),
                str(m["n"]),
                fmt(m.get("median_ms"), 3),
                fmt(m.get("tflops"), 2) if "tflops" in m else f"error: {m.get('error')}",
            ]
        )
    out += table(["precision", "matmul dtype", "n", "ms", "TFLOP/s"], rows)

    header = ["path", *(f"B={k}" for k in keys)]

    def cells(rec: dict[str, Any], field: str, digits: int) -> list[str]:
        row = []
        for k in keys:
            r = rec["batches"].get(k, {})
            row.append(fmt(r.get(field), digits) if is_ok(r) else ("error" if r else "–"))
        return row

    out += ["", "### Frames per second (median)", ""]
    out += table(header, [[n, *cells(r, "fps", 1)] for n, r in ok.items()])
    out += ["", "### ms per frame (median batch time / batch)", ""]
    out += table(header, [[n, *cells(r, "ms_per_frame", 3)] for n, r in ok.items()])
    out += [
        "",
        "### Fraction of the FLOP floor (conv TFLOP/s achieved / matmul TFLOP/s, same precision)",
        "",
    ]
    out += table(header, [[n, *cells(r, "floor_fraction", 3)] for n, r in ok.items()])
    out += ["", "### Speed-up over our fp32 eager (same batch, same run)", ""]
    rows = []
    for name, sp in result["summary"]["speedup_vs_eager"].items():
        rows.append([name, *(fmt(sp[k]) + "×" if k in sp else "–" for k in keys)])
    out += table(header, rows)
    out += ["", "### Images vs fp32 eager: cosine / relative L2 (worst input set)", ""]
    rows = []
    for name, rec in ok.items():
        row = []
        for k in keys:
            r = rec["batches"].get(k, {})
            row.append(
                f"{fmt_cos(r.get('cosine'))} / {fmt(r.get('rel_l2'), 6)}" if is_ok(r) else "–"
            )
        rows.append([name, *row])
    out += table(header, rows)

    out += ["", "### Beside the published figures", ""]
    summ = result["summary"]
    best = summ.get("best_overall")
    rows = [
        [
            "warp+decode frames/s",
            f"{pub['warp_decode_fps']:.1f}",
            f"{fmt(best['fps'], 1)} ({best['path']}, B={best['batch']})" if best else "–",
            fmt(summ.get("vs_published_warp_decode")) + "×" if best else "–",
        ],
        ["render loop FPS", f"{pub['render_loop_fps']}", "pipeline suite", "–"],
    ]
    out += table(["figure", "published", "ours (best accurate path)", "ours / published"], rows)
    targets = summ.get("targets")
    if isinstance(targets, list):
        out += [""]
        rows = []
        for t in targets:
            met = fmt(bool(t["met"])) if t.get("evaluated") else "not evaluated (not 512²)"
            ratio = (
                f"{fmt(t['achieved_speedup_vs_eager'])}× achieved, "
                f"{fmt(t['needed_speedup_vs_eager'])}× needed"
            )
            rows.append(
                [t["target"], fmt(t["ours"], 1), f"{t['path']}, B={t['batch']}", met, ratio]
            )
        out += table(["target", "ours", "path", "met", "vs our eager"], rows)

    others = {n: r for n, r in paths.items() if not is_ok(r)}
    errors = [
        (n, b, r.get("reason", ""))
        for n, rec in ok.items()
        for b, r in rec["batches"].items()
        if not is_ok(r)
    ]
    if others or errors:
        out += ["", "### Not measured", ""]
        rows = [
            [n, "all", r["status"], str(r.get("reason", "")).replace("|", "/")]
            for n, r in others.items()
        ]
        rows += [[n, f"B={b}", "error", str(why).replace("|", "/")] for n, b, why in errors]
        out += table(["path", "batch", "status", "reason"], rows)

    for key in ("profile", "profile_rewritten"):
        if result.get(key):
            out += _profile_markdown(result[key])

    out += settings_markdown(ok, skip=("name", "reference"))
    out += markdown_tail(result)
    return "\n".join(out) + "\n"


def save_plots(result: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """PNG plots (frames/s and FLOP-floor fraction vs batch, per path) through
    :func:`studio.bench.report.write_plots`; its ``{"files": [...]}`` (or why none)."""
    return write_plots(result, folder, lambda plots: _draw(result, plots))


def _draw(result: dict[str, Any], plots: Any) -> None:
    pub = result["published"]
    ok = {n: r for n, r in result["paths"].items() if is_ok(r)}
    batches = result["config"]["batches"]

    def series(rec: dict[str, Any], field: str) -> list[tuple[int, float]]:
        return [
            (int(b), r[field])
            for b, r in rec["batches"].items()
            if is_ok(r) and r.get(field) is not None
        ]

    def per_path(field: str) -> Any:
        fig = plots.figure()
        ax = fig.add_subplot()
        for name, rec in ok.items():
            pts = series(rec, field)
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", label=name)
        ax.set_xscale("log")
        ax.set_xticks(batches, [str(b) for b in batches])
        return fig, ax

    fig, ax = per_path("fps")
    ax.axhline(pub["warp_decode_fps"], color="k", ls="--", lw=0.8, label="published warp+decode")
    ax.axhline(pub["render_loop_fps"], color="k", ls=":", lw=0.8, label="published render loop")
    ax.axhline(TARGETS["render_loop_fps"], color="r", lw=0.8, label="target render loop")
    ax.set(yscale="log", xlabel="batch", ylabel="frames/s (median)")
    ax.set_title(f"Warp + decode throughput — {result['facts'].get('name')}")
    ax.legend(fontsize=7)
    plots.save(fig, "render_fps.png")

    fig, ax = per_path("floor_fraction")
    ax.set(xlabel="batch", ylabel="fraction of the FLOP floor")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    plots.save(fig, "render_floor_fraction.png")


# --- command line ------------------------------------------------------------------------


def _precision_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in PRECISIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"precisions must be some of {', '.join(PRECISIONS)}: {text}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The suite's command-line options (``studio bench --suite render`` maps onto these)."""
    p = suite_parser(
        "render", "Throughput of the renderer's warp + decode engines per batch, precision, path."
    )
    p.add_argument(
        "--batches",
        type=lambda s: int_list(s, 1, MAX_BATCH, "batches"),
        default=DEFAULT_BATCHES,
        metavar="1,4,8,16,32",
    )
    p.add_argument(
        "--precisions",
        type=_precision_list,
        default=None,
        metavar="A,B",
        help=f"some of {', '.join(PRECISIONS)} (default: all on CUDA, fp32 on the CPU)",
    )
    p.add_argument("--paths", metavar="A,B", help="subset of the paths (eager_fp32 always runs)")
    p.add_argument("--reduced", action="store_true", help="narrow networks (smoke runs)")
    p.add_argument(
        "--feature-size",
        type=int,
        default=FEATURE_SIZE,
        help=f"f_s side, a multiple of 32 (default {FEATURE_SIZE}: 512² output)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-sets", type=int, default=3, help="rotating input sets")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile paths")
    p.add_argument("--compile-mode", default=COMPILE_MODE, help=f"default {COMPILE_MODE}")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the rate matmul")
    p.add_argument("--target-ms", type=float, default=TARGET_MS, help="timed ms per point (auto)")
    p.add_argument(
        "--no-cudnn-benchmark",
        action="store_true",
        help="keep cuDNN heuristics on the eager paths (the engines autotune at capture)",
    )
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between runs")
    p.add_argument("--manifest", metavar="FILE", help=f"path of {MANIFEST_NAME}")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel profile (CUDA)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, write the outputs asked for, print the Markdown; 0, or 2 on errors."""
    errors = (RuntimeError, ValueError, OSError)
    return run_main("render", build_parser(), argv, _run, to_markdown, save_plots, errors)


# options passed on to run_render_suite as they are (the same names)
_AS_GIVEN = ("batches", "precisions", "repeats", "warmup", "reduced", "feature_size", "seed")
_AS_GIVEN += ("compile", "compile_mode", "matmul_size", "target_ms", "manifest")


def _run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    return run_render_suite(
        device=default_device(args.device),
        paths=name_list(args.paths),
        input_sets=max(1, args.input_sets),
        cudnn_benchmark=not args.no_cudnn_benchmark,
        flush_cache=not args.no_flush,
        profile=not args.no_profile,
        progress=progress,
        **{name: getattr(args, name) for name in _AS_GIVEN},
    )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
