"""``studio bench --suite streaming``: the live engine's latency, beside the clip path.

Per engine (the demo engine; Ditto on a random-weight tree of the released layout, or on
``--checkpoints``), with warm engines:

- **time to the first frame** of a file source (wall time from the session's start to frame
  0, the file fed as fast as the session takes it) for clips of ``--ttff-seconds`` (10 s and
  10 min by default), against the clip path's (analysis of the whole clip, then the first
  keyframe batch rendered);
- **audio-to-frame latency** per latency setting over ``--latency-seconds`` of speech fed on a
  :class:`~studio.render.stream.ReplayClock` (each chunk arrives when its audio ends, work
  takes its real time): p50/p95/max, split into the wait for the lookahead and compute, the
  compute per 20 ms chunk, late frames; and the motion against the clip path's on the same
  audio (relative L2 and cosines before smoothing, jerk after, the jerk peak at chunk
  boundaries against the mean);
- **concurrency**: N sessions, each with its own avatar, fed in real time (wall clock) for
  ``--stream-seconds``; N holds when every session's p95 latency is within the budget and no
  frame is late; the largest N that holds;
- **memory over a long session** (``--long-minutes``): a looped file fed unpaced, host RSS and
  GPU memory each minute; flat when the end is within 100 MB of the peak after minute one.

Synthetic speech (:func:`studio.bench.pipeline.speech_clip`) drives every measurement.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio import layout
from studio.bench import report
from studio.bench.timing import device_facts, git_commit, utc_now
from studio.errors import StudioError

ENGINES = ("demo", "ditto")
LATENCY_BUDGET_MS = {"low": 200.0, "balanced": 300.0, "smooth": 600.0}
TARGETS = {
    "time_to_first_frame_ms": 50.0,
    "latency_p95_ms_balanced": 300.0,
    "latency_p95_ms_low": 200.0,
    "compute_per_chunk_p95_ms": 20.0,
    "concurrent_streams": 8,
    "demo_latency_p95_ms_cpu": 250.0,
    "long_session_growth_mb": 100.0,
}
CHUNK = 320  # 20 ms at 16 kHz
HELP = {"repeats": "unused (each figure is a distribution of its own)"}


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    import resource

    return pages * resource.getpagesize() / 2**20


def _gpu_mb(dev: Any) -> float | None:
    if dev.type != "cuda":
        return None
    import torch

    return torch.cuda.memory_allocated(dev) / 2**20


def _chunks(samples: np.ndarray) -> Iterator[np.ndarray]:
    """20 ms chunks as a live source hands them over (made as they are fed: a clip's whole
    list would be counted in the time to its first frame)."""
    return (samples[i : i + CHUNK] for i in range(0, len(samples), CHUNK))


def _replay(
    engine: Any,
    settings: Any,
    samples: np.ndarray,
    latency: str,
    keep: bool = False,
    until_first: bool = False,
) -> Any:
    """A session fed ``samples`` on a replay clock (as fast as it takes them)."""
    from studio.render.stream import LiveSession, ReplayClock

    clock = ReplayClock()
    session = LiveSession(engine, settings, latency, clock, keep_motion=keep)
    after = None
    for chunk in _chunks(samples):
        clock.arrive(len(chunk))
        session.feed(chunk)
        if until_first and session.stats.first_frame_s is not None:
            after = session.received_samples if after is None else after
            if session.received_samples - after >= layout.SAMPLE_RATE:
                return session
    session.finish()
    return session


def _ttff(engine: Any, settings: Any, seconds: Sequence[float], seed: int) -> list[dict]:
    from studio.bench.pipeline import speech_clip
    from studio.render.pipeline import analyze

    rows = []
    for s in seconds:
        audio = speech_clip(s, seed)
        session = _replay(engine, settings, audio.samples, "balanced", until_first=True)
        t0 = time.perf_counter()
        result = analyze(audio, settings, engine)
        renderer = engine.renderer(settings)
        renderer.prepare(result.smoothed)
        renderer.render_frames(result.plan.keyframes[: renderer.batch])
        offline = (time.perf_counter() - t0) * 1000.0
        rows.append(
            {
                "audio_s": s,
                "live_ms": round(session.stats.first_frame_s * 1000.0, 2),
                "clip_path_ms": round(offline, 1),
            }
        )
    return rows


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def motion_difference(
    live_raw: np.ndarray, clip_raw: np.ndarray, live: np.ndarray, clip: np.ndarray
) -> dict[str, float]:
    """The live motion against the clip path's on the same audio: before smoothing (relative
    L2, exp cosine per frame, pose cosine of the centred angle tracks) and after (jerk)."""
    from studio.motion.kinematics import pose_jerk

    n = min(len(live_raw), len(clip_raw))
    a, b = live_raw[:n].astype(np.float64), clip_raw[:n].astype(np.float64)
    exp_a, exp_b = a[:, layout.EXP], b[:, layout.EXP]
    pose_a = layout.pose_degrees(live_raw[:n]).astype(np.float64)
    pose_b = layout.pose_degrees(clip_raw[:n]).astype(np.float64)
    pa, pb = (pose_a - pose_a.mean(0)).ravel(), (pose_b - pose_b.mean(0)).ravel()
    return {
        "frames": n,
        "raw_rel_l2": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)),
        "exp_cos_mean": float(np.mean(np.sum(_unit(exp_a) * _unit(exp_b), axis=1))),
        "pose_cos": float(pa @ pb / max(np.linalg.norm(pa) * np.linalg.norm(pb), 1e-12)),
        "pose_rms_deg": float(np.sqrt(np.mean((pose_a - pose_b) ** 2))),
        "jerk_mean_live": float(np.mean(pose_jerk(live[:n]))),
        "jerk_mean_clip": float(np.mean(pose_jerk(clip[:n]))),
    }


def _latency(
    engine: Any,
    settings: Any,
    latencies: Sequence[str],
    seconds: float,
    seed: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    from studio.bench.pipeline import speech_clip
    from studio.render.pipeline import analyze

    audio = speech_clip(seconds, seed)
    clip = analyze(audio, settings, engine)
    out = {}
    for latency in latencies:
        _replay(engine, settings, np.zeros(8000, np.float32), latency)  # its plan's first use
        session = _replay(engine, settings, audio.samples, latency, keep=True)
        rec = session.report()
        raw = np.concatenate(session.raw_rows)
        post = np.concatenate(session.post_rows)
        rec["motion_vs_clip"] = motion_difference(raw, clip.raw, post, clip.smoothed)
        rec["budget_ms"] = LATENCY_BUDGET_MS[latency]
        out[latency] = rec
        brief = {
            k: rec[k]
            for k in (
                "lookahead_frames",
                "latency_ms",
                "compute_per_chunk_ms",
                "late_frames",
                "stage_ms",
                "time_to_first_frame_ms",
            )
        }
        say(f"[streaming] {latency}: {json.dumps(brief)}")
    return out


def _concurrency(
    open_one: Callable[[int], Any],
    settings: Any,
    counts: Sequence[int],
    seconds: float,
    seed: int,
    say: Callable[[str], None],
) -> list[dict]:
    """N sessions (each its own engine/avatar) fed in real time from one thread."""
    from studio.bench.pipeline import speech_clip
    from studio.render.stream import LiveSession

    rows = []
    samples = speech_clip(seconds, seed).samples
    chunks = list(_chunks(samples))
    engines: list[Any] = []
    for n in counts:
        while len(engines) < n:
            engines.append(open_one(len(engines)))
        sessions = [LiveSession(e, settings, "balanced") for e in engines[:n]]
        for s in sessions:  # warm: the first session per avatar prepares its renderer
            s.feed(np.zeros(CHUNK, np.float32))
        sessions = [LiveSession(e, settings, "balanced") for e in engines[:n]]
        start = time.perf_counter()
        lag_ms = 0.0
        for i, chunk in enumerate(chunks):
            due = start + i * CHUNK / layout.SAMPLE_RATE
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            lag_ms = max(lag_ms, -wait * 1000.0)
            for s in sessions:
                s.feed(chunk)
        reports = [s.report() for s in sessions]
        p95 = max(r["latency_ms"]["p95"] or 0.0 for r in reports)
        late = sum(r["late_frames"] for r in reports)
        # frames over the audio they could cover yet (the last lookahead is still to come)
        ahead_s = sessions[0].lookahead_frames / layout.FPS
        fps = min(r["frames"] for r in reports) / max(seconds - ahead_s, 1e-9)
        holds = p95 <= LATENCY_BUDGET_MS["balanced"] and late == 0
        rows.append(
            {
                "streams": n,
                "p95_latency_ms_worst": p95,
                "late_frames": late,
                "fps_each": round(fps, 2),
                "max_lag_ms": round(lag_ms, 1),
                "holds": holds,
            }
        )
        say(
            f"[streaming] {n} streams: p95 {p95:.0f} ms, late {late}, "
            f"{'holds' if holds else 'does not hold'}"
        )
        if not holds:
            break
    return rows


def _long_session(
    engine: Any, settings: Any, minutes: float, dev: Any, seed: int, say: Callable[[str], None]
) -> dict[str, Any]:
    from studio.bench.pipeline import speech_clip
    from studio.render.stream import LiveSession, ReplayClock

    loop = speech_clip(60.0, seed).samples
    clock = ReplayClock()
    session = LiveSession(engine, settings, "balanced", clock)
    marks = []
    t0 = time.perf_counter()
    for minute in range(int(np.ceil(minutes))):
        for chunk in _chunks(loop):
            clock.arrive(len(chunk))
            session.feed(chunk)
        marks.append(
            {
                "minute": minute + 1,
                "rss_mb": round(_rss_mb(), 1),
                "gpu_mb": None if _gpu_mb(dev) is None else round(_gpu_mb(dev), 1),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        say(f"[streaming] long session: minute {minute + 1}, RSS {marks[-1]['rss_mb']} MB")
    after_first = marks[1:] or marks
    peak = max(m["rss_mb"] for m in after_first)
    growth = {
        "rss_end_minus_peak_mb": round(marks[-1]["rss_mb"] - peak, 1),
        "rss_growth_after_minute_1_mb": round(marks[-1]["rss_mb"] - marks[0]["rss_mb"], 1),
    }
    if marks[0]["gpu_mb"] is not None:
        growth["gpu_growth_after_minute_1_mb"] = round(marks[-1]["gpu_mb"] - marks[0]["gpu_mb"], 1)
    return {
        "minutes": minutes,
        "marks": marks,
        **growth,
        "frames": session.stats.frames,
        "latency_ms": session.report()["latency_ms"],
    }


def _open_engines(
    name: str,
    dev: Any,
    work: Path,
    checkpoints: str | None,
    reduced: bool,
    hubert: str,
    size: int,
    say: Callable[[str], None],
) -> tuple[Any, Callable, Any]:
    """(settings, open_one(i) -> an engine with avatar i, HuBERT record or None)."""
    from studio.render.engines import open_engine
    from studio.render.stream import live_settings
    from studio.settings import RenderSettings

    if name == "demo":
        settings = RenderSettings(backend="demo", size=size).validate()
        return settings, lambda i: open_engine(settings), None
    from studio.bench.pipeline import _face_png, _hubert_record, write_inputs

    if checkpoints:
        root, hub = str(checkpoints), None
    else:
        say(f"[streaming] writing a {'reduced' if reduced else 'full-size'} random tree")
        hub = write_inputs(work / "ckpt", reduced, hubert)
        root = str(work / "ckpt")
    if checkpoints and hub is None:
        from studio.models.checkpoints import discover

        hub = _hubert_record(discover(checkpoints).path("hubert"), "given")
    settings = live_settings(RenderSettings(backend="ditto", size=512).validate())

    def open_one(i: int) -> Any:
        face = _face_png(work, 512 + 2 * i, 512)  # each stream its own avatar (photo)
        return open_engine(settings, root, str(face), str(dev), avatar_cache=str(work / "av"))

    return settings, open_one, hub


def run_streaming_suite(
    device: str | None = None,
    engines: Sequence[str] = ENGINES,
    checkpoints: str | None = None,
    reduced: bool = False,
    hubert: str = "large",
    latencies: Sequence[str] = ("low", "balanced", "smooth"),
    ttff_seconds: Sequence[float] = (10.0, 600.0),
    latency_seconds: float = 30.0,
    streams: Sequence[int] = (1, 2, 4, 8, 12, 16),
    stream_seconds: float = 10.0,
    long_minutes: float = 0.0,
    size: int = 256,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every measurement of the module docstring, per engine; a JSON-ready dict."""
    from studio.runtime.base import resolve_device

    say = progress or (lambda _line: None)
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise ValueError(f"engines must be some of {', '.join(ENGINES)}, got {list(engines)}")
    dev = resolve_device(device)
    result: dict[str, Any] = {
        "suite": "streaming",
        "facts": {**device_facts(dev), "date": utc_now(), "commit": git_commit()},
        "config": {
            "engines": list(engines),
            "latencies": list(latencies),
            "ttff_seconds": list(ttff_seconds),
            "latency_seconds": latency_seconds,
            "streams": list(streams),
            "stream_seconds": stream_seconds,
            "long_minutes": long_minutes,
            "demo_size": size,
            "chunk_ms": 20,
            "reduced": reduced,
            "checkpoints": checkpoints,
        },
        "targets": TARGETS,
        "engines": {},
        "notes": [],
    }
    with tempfile.TemporaryDirectory(prefix="studio-bench-streaming-") as tmp:
        work = Path(tmp)
        for name in engines:
            settings, open_one, hub = _open_engines(
                name, dev, work, checkpoints, reduced, hubert, size, say
            )
            engine = open_one(0)
            _replay(engine, settings, np.zeros(8000, np.float32), "balanced")  # warm
            rec: dict[str, Any] = {"hubert": hub}
            say(f"[streaming] {name}: time to first frame")
            rec["time_to_first_frame"] = _ttff(engine, settings, ttff_seconds, seed)
            say(f"[streaming] {name}: first frame {json.dumps(rec['time_to_first_frame'])}")
            say(f"[streaming] {name}: latency per setting")
            rec["latency"] = _latency(engine, settings, latencies, latency_seconds, seed, say)
            say(f"[streaming] {name}: concurrent streams")
            rec["concurrency"] = _concurrency(
                open_one, settings, streams, stream_seconds, seed, say
            )
            held = [r["streams"] for r in rec["concurrency"] if r["holds"]]
            rec["max_streams"] = max(held) if held else 0
            if long_minutes > 0:
                rec["long_session"] = _long_session(engine, settings, long_minutes, dev, seed, say)
            result["engines"][name] = rec
    return result


def to_markdown(result: dict[str, Any]) -> str:
    f = result["facts"]
    lines = ["## Streaming (live) engine", "", report.measured_on(f), ""]
    for name, rec in result["engines"].items():
        lines += [f"### {name}", ""]
        lines += report.table(
            ["audio", "live: first frame (ms)", "clip path: first frame (ms)"],
            [
                [f"{r['audio_s']:g} s", report.fmt(r["live_ms"]), report.fmt(r["clip_path_ms"], 0)]
                for r in rec["time_to_first_frame"]
            ],
        )
        rows = []
        for lat, r in rec["latency"].items():
            m = r["motion_vs_clip"]
            rows.append(
                [
                    lat,
                    str(r["lookahead_frames"]),
                    " / ".join(report.fmt(r["latency_ms"][q], 0) for q in ("p50", "p95", "max")),
                    f"{report.fmt(r['wait_ms']['p95'], 0)} + "
                    f"{report.fmt(r['compute_ms']['p95'], 1)}",
                    report.fmt(r["compute_per_chunk_ms"]["p95"], 1),
                    str(r["late_frames"]),
                    f"{m['raw_rel_l2']:.2e}",
                    f"{m['pose_cos']:.4f}",
                    f"{m['exp_cos_mean']:.4f}",
                    report.fmt(r["kinematics"].get("boundary_jerk_ratio"), 2),
                ]
            )
        lines += [
            "",
            *report.table(
                [
                    "latency",
                    "lookahead (frames)",
                    "latency p50/p95/max (ms)",
                    "p95 wait + compute (ms)",
                    "compute per chunk p95 (ms)",
                    "late",
                    "motion rel L2 vs clip",
                    "pose cos",
                    "exp cos",
                    "boundary jerk / mean",
                ],
                rows,
            ),
        ]
        lines += [
            "",
            *report.table(
                ["streams", "worst p95 latency (ms)", "late frames", "fps each", "holds"],
                [
                    [
                        str(r["streams"]),
                        report.fmt(r["p95_latency_ms_worst"], 0),
                        str(r["late_frames"]),
                        report.fmt(r["fps_each"]),
                        "yes" if r["holds"] else "no",
                    ]
                    for r in rec["concurrency"]
                ],
            ),
            "",
            f"Largest number of live streams that holds: **{rec['max_streams']}**.",
        ]
        if "long_session" in rec:
            ls = rec["long_session"]
            lines += [
                "",
                f"Long session: {ls['minutes']:g} min, RSS growth after minute 1: "
                f"{ls['rss_growth_after_minute_1_mb']} MB"
                + (
                    f", GPU {ls['gpu_growth_after_minute_1_mb']} MB"
                    if "gpu_growth_after_minute_1_mb" in ls
                    else ""
                ),
            ]
        lines.append("")
    lines += report.markdown_tail(result)
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = report.suite_parser(
        "streaming",
        "The live engine: time to the first frame, audio-to-frame latency per setting, the "
        "motion against the clip path, concurrent streams, memory over a long session.",
        HELP,
        warmup_default=1,
        allow_abbrev=False,
    )
    p.add_argument("--engines", default="demo,ditto", help="demo, ditto or both (default)")
    p.add_argument("--checkpoints", metavar="DIR", help="a real Ditto tree (default: random)")
    p.add_argument("--reduced", action="store_true", help="narrow networks (smoke runs)")
    p.add_argument("--hubert", choices=("large", "standin"), default="large")
    p.add_argument("--latencies", default="low,balanced,smooth")
    p.add_argument("--ttff-seconds", default="10,600", help="clip lengths for the first frame")
    p.add_argument("--latency-seconds", type=float, default=30.0)
    p.add_argument("--streams", default="1,2,4,8,12,16", help="concurrent stream counts")
    p.add_argument("--stream-seconds", type=float, default=10.0)
    p.add_argument("--long-minutes", type=float, default=0.0)
    p.add_argument("--size", type=int, default=256, help="demo frame size (default 256)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return report.run_main(
        "streaming", build_parser(), argv, _run, to_markdown, None, (StudioError, ValueError)
    )


def _run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    return run_streaming_suite(
        **report.args_for(
            run_streaming_suite,
            args,
            engines=report.name_list(args.engines),
            latencies=report.name_list(args.latencies),
            ttff_seconds=report.float_list(args.ttff_seconds, "--ttff-seconds", "10,600"),
            streams=tuple(int(v) for v in report.float_list(args.streams, "--streams", "1,2,4")),
            progress=progress,
        )
    )
