"""The ``pipeline`` bench suite: the waterfall of a 165-frame (6.6 s) clip, end to end.

Each timed pass is what ``studio render --checkpoints`` does, through the same functions:
:func:`studio.render.pipeline.analyze` (phonetics, HuBERT, LMDM, cadence, smoothing) on a
:class:`studio.engines.ditto.engine.DittoEngine`, then :func:`studio.render.pipeline.start_video`
with the engine's renderer (stitching, warp + decode, paste-back, encoding to a real MP4 in
a temporary folder). Settings: stride 1 (every frame rendered), ``--steps`` DDIM steps,
``--precision`` (auto). Two variants: ``crop`` (the 512² render itself) and ``full``
(pasted back into the ``--source`` image, 1280x720 by default).

Inputs: ``--checkpoints DIR``, or by default a temporary full-size random-weight tree written
by the project (:func:`studio.fixtures.random_tree.write_checkpoint_tree`, the face-model
stand-ins of :func:`studio.fixtures.face_standins.write_aux_standins`) with a HuBERT of the real
depth and widths (:func:`studio.fixtures.hubert_standin.build_hubert_costlike`), so that every
stage costs what the released network would; ``--hubert standin`` takes the tiny stand-in
instead and the report says its HuBERT row is not the real cost. The speech is synthesized
(numpy only) and the avatar is a drawn face registered with
:func:`studio.avatar.register.register_avatar` (timed apart: not part of the clip).

Timing: ``--warmup`` untimed passes per variant, then the median of ``--repeats`` passes, per
stage. hubert and lmdm are host wall times (the LMDM stage ends with its one read-back);
stitching, warp_decode and putback are CUDA-event (CPU: perf_counter) sums from the renderer;
encode is the encoder thread's busy time beside the render loop and encode_wait the part the
loop waited for; total is the pass's wall time. Overall FPS = frames / total; render-loop
FPS = frames / (stitching + warp_decode + putback).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from studio import layout
from studio.bench import report
from studio.bench.report import fmt, table
from studio.bench.timing import device_facts, git_commit, utc_now
from studio.errors import StudioError

__all__ = [
    "PUBLISHED",
    "STAGES",
    "TARGETS",
    "VARIANTS",
    "main",
    "run_pipeline_suite",
    "save_plots",
    "speech_clip",
    "to_markdown",
    "write_inputs",
]

HELP = {  # the common options, as this suite reads them
    "plots": "write the waterfall PNG (needs matplotlib)",
    "repeats": "timed passes (default 3 GPU, 1 CPU)",
    "warmup": "untimed passes per variant (default 1)",
}
CLIP_FRAMES = 165  # 6.6 s at 25 fps, the published clip
DEFAULT_STEPS = 4  # DDIM steps of the published figures
CROP_SIDE = 512
VARIANTS = ("crop", "full")
DEFAULT_SOURCE = (1280, 720)  # width, height of the drawn face image for --frame full
HUBERT_FILE = "ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx"
REAL_HUBERT_MB = 1200  # a HuBERT-large ONNX in fp32 is ~1.26 GB; far smaller is a stand-in

# Every stage start_video/analyze report, in pipeline order; "other" is the rest of the wall
# time (renderer set-up, opening and closing the MP4, host copies between stages).
STAGES = (
    "features",
    "hubert",
    "lmdm",
    "cadence",
    "smoothing",
    "stitching",
    "warp_decode",
    "putback",
    "blend",
    "encode",
    "encode_wait",
    "other",
    "total",
)
# The stages that follow one another on the wall clock (encode overlaps: encode_wait counts).
SERIAL = tuple(s for s in STAGES if s not in ("encode", "total"))
RENDER_LOOP = ("stitching", "warp_decode", "putback")

PUBLISHED: dict[str, Any] = {
    "source": "Ditto reference, RTX 5090 laptop GPU, TensorRT 10.15",
    "clip_frames": CLIP_FRAMES,
    "total_ms": 2410.0,
    "stages_ms": {
        "hubert": 9.8,
        "lmdm": 19.6,
        "smoothing": 5.3,
        "stitching": 58.0,
        "warp_decode": 2180.0,
        "encode": 140.0,
    },
    "render_loop_fps": 71.1,
    "overall_fps": CLIP_FRAMES / 2.41,
}
TARGETS: dict[str, Any] = {
    "total_ms_crop": 1000.0,  # end to end at 512² crop output, HuBERT included
    "render_loop_fps": 300.0,  # at 512²
    "side": CROP_SIDE,
}
STAGE_LABELS: dict[str, str] = {
    "features": "phonetics",
    "hubert": "HuBERT (+ condition)",
    "lmdm": "LMDM",
    "cadence": "cadence plan",
    "smoothing": "smoothing",
    "stitching": "stitching",
    "warp_decode": "warp + decode",
    "putback": "paste-back / crop out",
    "blend": "blending in-between frames (host)",
    "encode": "encode (busy, beside the loop)",
    "encode_wait": "encode wait (loop blocked)",
    "other": "other (set-up, MP4 open/close, copies)",
    "total": "**total**",
}


# --- inputs -----------------------------------------------------------------------------------


def speech_clip(seconds: float, seed: int = 0) -> Any:
    """A deterministic speech-like :class:`studio.audio.io.Audio`: a voiced tone with gliding
    pitch and harmonics, syllable-rate envelope, pauses and plosive bursts (numpy only)."""
    from studio.audio.io import audio_from_array

    sr = layout.SAMPLE_RATE
    t = np.arange(int(round(seconds * sr))) / sr
    rng = np.random.default_rng(seed)
    f0 = 120.0 + 25.0 * np.sin(2 * np.pi * 0.4 * t) + 10.0 * np.sin(2 * np.pi * 2.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 7))
    syllables = np.clip(np.sin(2 * np.pi * 3.7 * t + np.sin(2 * np.pi * 0.7 * t)), 0, None) ** 0.6
    phrases = (np.sin(2 * np.pi * 0.3 * t) > -0.8).astype(np.float64)  # short pauses
    bursts = np.zeros_like(t)
    for start in rng.uniform(0, max(seconds - 0.05, 0.0), size=int(seconds * 2)):
        i = int(start * sr)
        bursts[i : i + 400] = rng.normal(0.0, 0.3, bursts[i : i + 400].size)
    x = 0.25 * voice * syllables * phrases + bursts + rng.normal(0.0, 0.01, t.size)
    return audio_from_array(x.astype(np.float32), sr, path="<synthesized speech>")


def _hubert_record(path: Path, kind: str, detail: str = "") -> dict[str, Any]:
    """What the HuBERT file is, with a label saying whether its time is the real cost."""
    mb = path.stat().st_size / 1e6
    if kind == "given":
        real = mb >= REAL_HUBERT_MB * 0.5
        label = (
            f"given ({mb:,.0f} MB, assumed the released model)"
            if real
            else f"given, but {mb:,.1f} MB: likely a stand-in, not the real network's cost"
        )
    else:
        real = kind == "cost-equivalent"
        label = {
            "cost-equivalent": "cost-equivalent (random weights, HuBERT-large depth and widths)",
            "reduced": "reduced cost-like graph (smoke run): not the real network's cost",
            "standin": "stand-in (tiny pooling graph): not the real network's cost",
        }[kind]
    return {
        "kind": kind,
        "label": label,
        "cost_is_real": real,
        "path": str(path),
        "size_mb": round(mb, 1),
        **({"detail": detail} if detail else {}),
    }


def write_inputs(root: Path, reduced: bool, hubert: str) -> dict[str, Any]:
    """Write a random-weight checkpoint tree under ``root`` (module docstring); HuBERT record."""
    from studio.fixtures.face_standins import write_aux_standins
    from studio.fixtures.hubert_standin import (
        HUBERT_LARGE,
        HUBERT_SMOKE,
        build_hubert_costlike,
        build_hubert_standin,
    )
    from studio.fixtures.random_tree import write_checkpoint_tree

    write_checkpoint_tree(root, reduced=reduced, lmdm_cond_dim=layout.COND_DIM)
    write_aux_standins(root)
    target = root / HUBERT_FILE
    if hubert == "standin":
        return _hubert_record(build_hubert_standin(target), "standin")
    shape = HUBERT_SMOKE if reduced else HUBERT_LARGE
    path = build_hubert_costlike(target, shape)
    chunk = (sum(layout.HUBERT_CHUNK) * layout.SAMPLES_PER_FRAME) + layout.HUBERT_CHUNK_EXTRA
    detail = (
        f"{shape.layers} layers x {shape.width} wide, {shape.heads} heads, FFN {shape.ffn}, "
        f"conv front end {shape.conv_dim} ch; {shape.params() / 1e6:,.1f} M params; "
        f"{shape.gflop(chunk):.2f} GFLOP per {chunk}-sample chunk"
    )
    rec = _hubert_record(path, "reduced" if reduced else "cost-equivalent", detail)
    rec["gflop_per_chunk"] = shape.gflop(chunk)
    return rec


def _face_png(folder: Path, width: int, height: int) -> Path:
    """A drawn face (the registration stand-ins find it) as a PNG of width x height."""
    from studio.avatar.register import _png_bytes  # the avatar cache's own PNG writer
    from studio.fixtures.face_standins import face_image

    side = 0.55 * min(width, height)
    cx, cy = width / 2, height * 0.48
    box = (cx - 0.42 * side, cy - 0.5 * side, cx + 0.42 * side, cy + 0.5 * side)
    path = folder / f"face_{width}x{height}.png"
    path.write_bytes(_png_bytes(face_image((height, width), [box])))
    return path


# --- one pass -----------------------------------------------------------------------------------


def _pass(engine: Any, audio: Any, settings: Any, out_path: Path) -> dict[str, Any]:
    """One end-to-end pass (analyze + start_video to ``out_path``): its stage timings in ms."""
    from studio.render.pipeline import analyze, start_video

    started = time.perf_counter()
    result = analyze(audio, settings, engine)
    renderer = engine.renderer(settings)
    report = start_video(result, renderer, str(out_path), settings, started=started).finish()
    t = {k: float(v) for k, v in report["timings_ms"].items()}
    t["other"] = max(0.0, t["total"] - sum(t.get(s, 0.0) for s in SERIAL if s != "other"))
    return {
        "timings_ms": t,
        "frames": int(report["frames"]),
        "rendered_frames": int(report["rendered_frames"]),
        "frame_size": list(report["frame_size"]),
        "mp4_bytes": out_path.stat().st_size,
        "render_dtype": str(renderer.dtype).replace("torch.", ""),
        "memory": renderer.memory.to_dict(),
    }


def _summarize(passes: list[dict[str, Any]], frames: int) -> dict[str, Any]:
    """Per-stage medians (and samples) over the timed passes, with the two FPS figures."""
    stages: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    for s in STAGES:
        values = [p["timings_ms"].get(s, 0.0) for p in passes]
        samples[s] = [round(v, 3) for v in values]
        stages[s] = float(statistics.median(values))
    loop_ms = [sum(p["timings_ms"].get(s, 0.0) for s in RENDER_LOOP) for p in passes]
    loop = float(statistics.median(loop_ms))
    return {
        "stages_ms": stages,
        "samples_ms": samples,
        "render_loop_ms": loop,
        "overall_fps": frames / (stages["total"] / 1e3) if stages["total"] > 0 else None,
        "render_loop_fps": frames / (loop / 1e3) if loop > 0 else None,
    }


@contextlib.contextmanager
def _peak_memory(device: torch.device) -> Iterator[dict[str, Any]]:
    """Yields a dict that gets ``peak_gib`` (max CUDA memory allocated in the block)."""
    info: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    yield info
    if device.type == "cuda":
        info["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


# --- the suite ----------------------------------------------------------------------------------


def run_pipeline_suite(
    device: str | None = None,
    checkpoints: str | Path | None = None,
    variants: Sequence[str] = VARIANTS,
    frames: int = CLIP_FRAMES,
    steps: int = DEFAULT_STEPS,
    precision: str = "auto",
    memory: str = "auto",
    batch: int = 0,
    compile: bool = False,
    x264_preset: str = "medium",
    source: tuple[int, int] = DEFAULT_SOURCE,
    reduced: bool = False,
    hubert: str = "large",
    repeats: int | None = None,
    warmup: int = 1,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the clip's waterfall per variant; a JSON-ready dict (module docstring).

    Keys: suite, facts, config, inputs (HuBERT record, avatar registration and engine load
    times), published, targets, variants (name -> stages_ms medians, samples, FPS, memory
    plan, render dtype, peak memory, frame size), summary. ``repeats`` None: 3 on CUDA, 1 on
    the CPU. InputError (a StudioError) for a bad ``checkpoints`` folder or device.
    """
    from studio.avatar.register import register_avatar
    from studio.engines.base import EngineRequest
    from studio.engines.ditto.engine import ALL_ROLES, require
    from studio.models.checkpoints import discover
    from studio.render.engines import open_prepared, prepare_engine
    from studio.runtime.base import resolve_device
    from studio.settings import RenderSettings

    say = progress or (lambda _line: None)
    bad = [v for v in variants if v not in VARIANTS]
    if not variants or bad:
        raise ValueError(f"variants must be some of {', '.join(VARIANTS)}, got {list(variants)}")
    if frames < 1 or warmup < 0 or (repeats is not None and repeats < 1):
        raise ValueError("need --frames >= 1, --warmup >= 0 and --repeats >= 1")
    dev = resolve_device(device)
    repeats = repeats if repeats is not None else (3 if dev.type == "cuda" else 1)
    base = RenderSettings(backend="ditto", stride="1", size=CROP_SIDE, precision=precision)
    base = base.replace(memory=memory, batch=batch, seed=seed, steps=steps)
    base = base.replace(compile=compile, preset=x264_preset)
    base = base.validate()
    audio = speech_clip(frames / layout.FPS, seed)
    result: dict[str, Any] = {
        "suite": "pipeline",
        "facts": {**device_facts(dev), "date": utc_now(), "commit": git_commit()},
        "config": {
            "frames": audio.num_frames,
            "duration_s": round(audio.duration_s, 4),
            "variants": list(variants),
            "source": f"{source[0]}x{source[1]}",
            "steps": base.steps,
            "stride": base.stride,
            "precision": base.precision,
            "compile": base.compile,
            "x264_preset": base.preset,
            "memory": base.memory,
            "batch": base.batch,
            "repeats": repeats,
            "warmup": warmup,
            "reduced": reduced,
            "checkpoints": str(checkpoints) if checkpoints else None,
            "timing": "per stage: median over timed passes (module docstring for each clock)",
        },
        "published": PUBLISHED,
        "targets": TARGETS,
        "inputs": {},
        "variants": {},
        "notes": [],
    }
    with tempfile.TemporaryDirectory(prefix="studio-bench-pipeline-") as tmp:
        work = Path(tmp)
        if checkpoints:
            found = discover(checkpoints)
            require(found, ALL_ROLES)
            hub = _hubert_record(found.path("hubert"), "given")
        else:
            say(f"[pipeline] writing a {'reduced' if reduced else 'full-size'} random tree")
            t0 = time.perf_counter()
            hub = write_inputs(work / "ckpt", reduced, hubert)
            result["inputs"]["tree_write_s"] = round(time.perf_counter() - t0, 1)
            found = discover(work / "ckpt")
            require(found, ALL_ROLES)
        result["inputs"]["hubert"] = hub
        face = _face_png(work, *source)
        timings: dict[str, float] = {}
        for label, refresh in (("avatar_registration_ms", False), ("avatar_warm_ms", True)):
            t0 = time.perf_counter()
            avatar = register_avatar(face, found, work / "avatars", device=dev, refresh=refresh)
            timings[label] = (time.perf_counter() - t0) * 1e3
        # the product's one way in: checks, the (now cached) avatar, the networks
        request = EngineRequest(base, str(found.root), str(face), str(dev), str(work / "avatars"))
        t0 = time.perf_counter()
        engine = open_prepared(prepare_engine(request))
        timings["engine_load_ms"] = (time.perf_counter() - t0) * 1e3
        result["inputs"].update(
            {k: round(v, 1) for k, v in timings.items()},
            eye_method=getattr(avatar, "eye_method", None),
            hubert_providers=list(engine.hubert.providers),
            hubert_fallback=engine.hubert.fallback,
        )
        for variant in variants:
            settings = base.replace(frame=variant)
            passes: list[dict[str, Any]] = []
            with _peak_memory(dev) as mem:
                for i in range(warmup + repeats):
                    rec = _pass(engine, audio, settings, work / f"{variant}_{i}.mp4")
                    (work / f"{variant}_{i}.mp4").unlink()
                    if i >= warmup:
                        passes.append(rec)
            last = passes[-1]
            summary = _summarize(passes, last["frames"])
            result["variants"][variant] = {
                **summary,
                "frames": last["frames"],
                "rendered_frames": last["rendered_frames"],
                "frame_size": last["frame_size"],
                "mp4_bytes": last["mp4_bytes"],
                "render_dtype": last["render_dtype"],
                "memory": last["memory"],
                **mem,
            }
            say(
                f"[pipeline] {variant} {last['frame_size'][0]}x{last['frame_size'][1]}: total "
                f"{summary['stages_ms']['total']:,.0f} ms, {summary['overall_fps']:.1f} fps "
                f"overall, render loop {summary['render_loop_fps']:.1f} fps"
            )
    result["summary"] = _targets(result)
    if audio.num_frames != CLIP_FRAMES:
        result["notes"].append(
            f"{audio.num_frames} frames, not the published {CLIP_FRAMES}: compare the FPS rows, "
            "not the stage times, with the published column."
        )
    if not hub["cost_is_real"]:
        result["notes"].append(
            f"HuBERT is {hub['label']}: the hubert row and the totals that include it do not "
            "measure the real network."
        )
    on_gpu = any("cuda" in p.lower() for p in result["inputs"]["hubert_providers"])
    if not on_gpu and dev.type == "cuda":
        result["notes"].append(
            "HuBERT ran on ONNX Runtime's CPU provider: the torch path fell back "
            f"({result['inputs']['hubert_fallback'] or 'no GPU device given'})."
        )
    return result


def _targets(result: dict[str, Any]) -> dict[str, Any]:
    """The targets, met or not, on the crop variant (the targets are stated at 512²)."""
    crop = result["variants"].get("crop")
    out: dict[str, Any] = {"measured_on": "crop" if crop else None}
    if crop:
        total = crop["stages_ms"]["total"]
        out.update(
            total_ms=total,
            total_met=total <= TARGETS["total_ms_crop"],
            total_vs_published=PUBLISHED["total_ms"] / total if total > 0 else None,
            render_loop_fps=crop["render_loop_fps"],
            render_loop_met=(crop["render_loop_fps"] or 0) >= TARGETS["render_loop_fps"],
            render_loop_vs_published=(crop["render_loop_fps"] or 0) / PUBLISHED["render_loop_fps"],
        )
        out["hubert_cost_is_real"] = result["inputs"]["hubert"]["cost_is_real"]
    return out


# --- report ------------------------------------------------------------------------------------


def _variant_title(name: str, rec: dict[str, Any]) -> str:
    w, h = rec["frame_size"]
    return f"{name} {w}x{h}"


def to_markdown(result: dict[str, Any]) -> str:
    """The waterfall table (published column first), FPS, targets and the set-up facts."""
    facts, cfg, pub, inp = result["facts"], result["config"], result["published"], result["inputs"]
    hub = inp["hubert"]
    variants = result["variants"]
    out = [
        f"## Pipeline: a {cfg['frames']}-frame clip end to end",
        "",
        report.measured_on(facts)
        + f" {cfg['frames']} frames ({cfg['duration_s']} s of synthesized speech), stride "
        f"{cfg['stride']} (every frame rendered), {cfg['steps']} DDIM steps, precision "
        f"{cfg['precision']}{' with torch.compile' if cfg.get('compile') else ''}, x264 preset "
        f"{cfg.get('x264_preset', 'medium')}; median of {cfg['repeats']} passes after "
        f"{cfg['warmup']} warm-up; "
        + (
            f"checkpoints `{cfg['checkpoints']}`."
            if cfg["checkpoints"]
            else f"a {'reduced' if cfg['reduced'] else 'full-size'} random-weight tree."
        ),
        "",
        f"HuBERT: {hub['label']}"
        + (f" ({hub['detail']})" if hub.get("detail") else "")
        + f"; ran on {', '.join(inp['hubert_providers'])}.",
        "",
        "### Waterfall (ms, median per stage)",
        "",
    ]
    header = ["stage", f"published ({pub['clip_frames']} frames)"]
    header += [_variant_title(n, r) for n, r in variants.items()]
    rows = []
    for s in STAGES:
        label = STAGE_LABELS[s]
        if s == "hubert" and not hub["cost_is_real"]:
            label += " — stand-in, not the real cost"
        ref = pub["total_ms"] if s == "total" else pub["stages_ms"].get(s)
        rows.append([label, fmt(ref, 1), *(fmt(r["stages_ms"][s], 1) for r in variants.values())])
    rows.append(
        ["overall FPS (frames / total)", fmt(pub["overall_fps"], 1)]
        + [fmt(r["overall_fps"], 1) for r in variants.values()]
    )
    rows.append(
        ["render-loop FPS (frames / stitch + warp/decode + paste)", fmt(pub["render_loop_fps"], 1)]
        + [fmt(r["render_loop_fps"], 1) for r in variants.values()]
    )
    out += table(header, rows)
    summ = result.get("summary") or {}
    if summ.get("measured_on"):
        out += ["", f"### Targets (at {TARGETS['side']}², crop variant)", ""]
        total_note = "" if summ["hubert_cost_is_real"] else " (HuBERT: stand-in)"
        out += table(
            ["target", "goal", "ours", "met", "speed-up over published"],
            [
                [
                    "end to end, HuBERT included" + total_note,
                    f"≤ {TARGETS['total_ms_crop']:,.0f} ms",
                    f"{fmt(summ['total_ms'], 1)} ms",
                    fmt(summ["total_met"]),
                    f"{fmt(summ['total_vs_published'], 2)}×",
                ],
                [
                    "render loop",
                    f"≥ {TARGETS['render_loop_fps']:,.0f} FPS",
                    f"{fmt(summ['render_loop_fps'], 1)} FPS",
                    fmt(summ["render_loop_met"]),
                    f"{fmt(summ['render_loop_vs_published'], 2)}×",
                ],
            ],
        )
    out += ["", "### Set-up (not part of the clip's total)", ""]
    setup = [
        ["avatar registration (first)", f"{fmt(inp['avatar_registration_ms'], 1)} ms"],
        ["avatar registration (again, models warm)", f"{fmt(inp['avatar_warm_ms'], 1)} ms"],
        ["engine load (networks, HuBERT session)", f"{fmt(inp['engine_load_ms'], 1)} ms"],
        ["eye features", str(inp.get("eye_method"))],
    ]
    if "tree_write_s" in inp:
        setup.append(["random tree written in", f"{fmt(inp['tree_write_s'], 1)} s"])
    for name, r in variants.items():
        m = r["memory"]
        setup.append(
            [
                f"{name}: render dtype, memory, batch, peak",
                f"{r['render_dtype']}, {m['mode']} ({m['reason']}), batch {m['batch']}"
                + (f", {r['peak_gib']} GiB" if "peak_gib" in r else ""),
            ]
        )
    out += table(["what", "value"], setup)
    encode = (
        "encode runs on a thread beside the render loop; the waterfall's serial sum counts "
        "encode_wait (what it added to the wall time), the published row counts encode."
    )
    out += report.markdown_tail(result, notes=[encode, *result.get("notes", [])])
    return "\n".join(out) + "\n"


def save_plots(result: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """A waterfall bar chart (PNG): cumulative serial stages per variant, published beside,
    through :func:`studio.bench.report.write_plots`; its ``{"files": [...]}`` (or why none)."""
    return report.write_plots(result, folder, lambda plots: _draw(result, plots))


def _draw(result: dict[str, Any], plots: Any) -> None:
    pub = result["published"]
    plotted = (*SERIAL, "encode")  # ours: encode as encode_wait; published: encode was serial
    columns = [("published", {s: pub["stages_ms"].get(s, 0.0) for s in plotted})]
    columns += [
        (_variant_title(n, r), {**{s: r["stages_ms"][s] for s in SERIAL}, "encode": 0.0})
        for n, r in result["variants"].items()
    ]
    stages = [s for s in plotted if any(c[s] > 0 for _, c in columns)]
    fig = plots.figure((10, 1.5 + 0.6 * len(columns)))
    ax = fig.add_subplot()
    palette = [f"C{i}" for i in range(10)] + ["#444444", "#bbbb77", "#77bbbb"]
    colours = {s: palette[i % len(palette)] for i, s in enumerate(stages)}
    ticks: list[tuple[int, str]] = []
    for y, (title, ms) in enumerate(reversed(columns)):
        start = 0.0
        for s in stages:
            if ms[s] > 0:
                ax.barh(y, ms[s], left=start, height=0.6, color=colours[s], label=STAGE_LABELS[s])
                start += ms[s]
        ticks.append((y, title))
    ax.set_yticks([t for t, _ in ticks], [n for _, n in ticks])
    ax.axvline(TARGETS["total_ms_crop"], color="r", lw=0.8, ls="--", label="target (crop)")
    ax.set(xlabel="ms (stages one after another; encode as encode_wait)")
    ax.set_title(f"{result['config']['frames']}-frame clip — {result['facts'].get('name')}")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plots.save(fig, "pipeline_waterfall.png")


# --- command line --------------------------------------------------------------------------------


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got {text}") from None
    if not (128 <= w <= 4096 and 128 <= h <= 4096):
        raise argparse.ArgumentTypeError(f"sides must be 128..4096 pixels: {text}")
    return w, h


def build_parser() -> argparse.ArgumentParser:
    """The suite's command-line options (``studio bench --suite pipeline`` maps onto these)."""
    p = report.suite_parser(
        "pipeline",
        "The 165-frame clip end to end: per-stage waterfall, overall and render-loop FPS, "
        "beside the published figures.",
        HELP,
        warmup_default=1,
        allow_abbrev=False,
    )
    p.add_argument("--checkpoints", metavar="DIR", help="a real tree (default: a random one)")
    p.add_argument(
        "--frame",
        choices=(*VARIANTS, "both"),
        default="both",
        help="crop (512²), full (paste-back at --source) or both (default)",
    )
    p.add_argument("--source", type=_size, default=DEFAULT_SOURCE, metavar="WxH")
    p.add_argument("--frames", type=int, default=CLIP_FRAMES, help=f"default {CLIP_FRAMES}")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"default {DEFAULT_STEPS}")
    p.add_argument("--precision", choices=("auto", "fp32", "fp16", "bf16"), default="auto")
    p.add_argument("--memory", choices=("auto", "resident", "streamed"), default="auto")
    p.add_argument("--compile", action="store_true", help="warp + decoder through torch.compile")
    p.add_argument("--x264-preset", default="medium", help="x264 speed preset (default medium)")
    p.add_argument("--batch", type=int, default=0, help="frames per batch (0: automatic)")
    p.add_argument("--reduced", action="store_true", help="narrow networks (smoke runs)")
    p.add_argument(
        "--hubert",
        choices=("large", "standin"),
        default="large",
        help="random tree's HuBERT: HuBERT-large cost (default) or the tiny stand-in",
    )
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, write the outputs asked for, print the Markdown; 0, or 2 on errors."""
    errors = (StudioError, ValueError)
    return report.run_main("pipeline", build_parser(), argv, _run, to_markdown, save_plots, errors)


def _run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    variants = VARIANTS if args.frame == "both" else (args.frame,)
    return run_pipeline_suite(
        **report.args_for(run_pipeline_suite, args, variants=variants, progress=progress)
    )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
