"""``studio bench --suite warmstart``: what a user's new process costs with the studio's
caches on disk, and a batch's rate (issue 20's targets).

Every row is a new ``python -m studio`` process, timed from its start to its exit, in the order
a user meets them, all against one cache root (``--cache``, default a fresh folder: the first
process finds nothing):

- ``prebuild`` (with ``--compile``; ``--no-prebuild`` leaves it out, for a cache already
  filled): ``studio compile --runtime torch`` on the empty cache, the cold first build,
  reported on its own;
- ``render N s``: ``studio render`` of each clip length (``--clips``, default 10 and 60 s),
  each a new process finding what the earlier ones left on disk;
- ``batch``: ``studio batch`` of ``--batch-jobs`` clips of ``--batch-seconds`` each, one
  process and one warm engine; its real-time factor, and every output checked (it decodes,
  with the frame count its record gives). ``--batch-runs`` names the ways to run it: ``local``
  (the default), ``ahead`` (local, the next job analysed beside each render:
  ``STUDIO_BATCH_AHEAD=1``), and ``ray:N`` for the same jobs through a local Ray instance with
  N actors (each holding 1/N of the GPU where there is one).

Per row: wall time; where it went (``startup``: the interpreter and the command line's
imports; the report's warm-up: the pipeline's imports, engine open and engine build; its stage
timings; ``report`` and ``exit``, after the frames); the process's peak host memory
(``wait4``) and, from a batch's report, its peak GPU memory. Inputs: the synthetic speech of
:func:`studio.bench.pipeline.speech_clip`, a drawn face, and Ditto on ``--checkpoints`` or on
a random-weight tree of the released layout (``--reduced``: narrow networks, for smoke
runs), or the demo engine (``--engine demo``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from studio import layout
from studio.bench import report
from studio.bench.timing import git_commit, utc_now
from studio.errors import StudioError
from studio.files import write_atomic
from studio.paths import code_digest
from studio.settings import MOTION_PRECISIONS

ENGINES = ("ditto", "demo")
TARGETS = {"render_60s_wall_s": 8.0, "render_10s_wall_s": 3.0, "batch_realtime": 15.0}
HELP = {
    "repeats": "unused (each row is one new process)",
    "warmup": "unused (the rows are the warm-up)",
}


def run_process(
    argv: Sequence[str],
    log: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    keep: Path | None = None,
    profile: bool = False,
    sample: bool = False,
) -> dict[str, Any]:
    """``python -m studio ARGV`` as a new process: exit status, wall seconds, peak host MB.

    Its output goes to ``log``; past ``timeout`` seconds it is killed (exit status None).
    ``env``: variables set for it on top of this process's. ``keep``: a folder the log is
    copied to when the process ends (a run cut off later keeps what ended before), and with
    ``profile`` its main thread's profile (``STUDIO_PROFILE``): ``LOGNAME.prof`` there,
    summed up in ``LOGNAME.txt``; with ``sample``, every thread sampled from outside by
    py-spy (``LOGNAME.speedscope.json``, summed up in ``LOGNAME.samples.txt``)."""
    cmd = [sys.executable, "-m", "studio", *argv]
    prof = keep / f"{log.stem}.prof" if keep is not None and profile else None
    samples = keep / f"{log.stem}.speedscope.json" if keep is not None and sample else None
    if samples is not None:
        cmd = [*sampler_command(samples), *cmd]
    if prof is not None:
        env = {**(env or {}), "STUDIO_PROFILE": str(prof)}  # studio.cli.PROFILE_ENV
    with open(log, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )
        while True:  # wait4, not wait: the peak memory is this child's own
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            wall = time.perf_counter() - start
            if pid:
                break
            if wall > timeout:
                proc.send_signal(signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                status = None
                break
            time.sleep(0.005)
    proc.returncode = 0  # reaped above: keep Popen from waiting again
    code = None if status is None else os.waitstatus_to_exitcode(status)
    from studio.runtime.base import maxrss_mb

    if keep is not None:
        shutil.copyfile(log, keep / log.name)
    if prof is not None and prof.is_file():
        write_profile_summary(prof, prof.with_suffix(".txt"))
    if samples is not None and samples.is_file():
        write_sample_summary(samples, keep / f"{log.stem}.samples.txt")

    return {"exit": code, "wall_s": round(wall, 3), "peak_host_mb": round(maxrss_mb(usage), 1)}


def write_profile_summary(prof: Path, out: Path, lines: int = 60) -> None:
    """The profile ``prof`` as text: the calls taking most time with their callees, then
    most time in themselves (``lines`` of each)."""
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text).strip_dirs()
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines)
    out.write_text(text.getvalue())


SAMPLE_RATE = 200  # py-spy samples a second: 5 ms steps, little cost to the sampled process


def py_spy() -> str:
    """py-spy's executable: the environment's own, else PATH's; ValueError without one."""
    beside = Path(sys.executable).with_name("py-spy")
    spy = str(beside) if beside.is_file() else shutil.which("py-spy")
    if spy is None:
        raise ValueError("--sample needs py-spy: pip install py-spy")
    return spy


def sampler_command(out: Path) -> list[str]:
    """py-spy's command line that runs a process and samples all its threads, waiting ones
    too, from outside (no tracing inside it: its timings stay those of an unprofiled run)."""
    rate = str(SAMPLE_RATE)
    opts = ["--format", "speedscope", "--rate", rate, "--idle", "--threads", "--nonblocking"]
    return [py_spy(), "record", *opts, "--output", str(out), "--"]


def write_sample_summary(samples: Path, out: Path, lines: int = 40) -> None:
    """py-spy's ``samples`` as text: per thread its sampled seconds; for the main thread its
    phases in order (the command's own steps: the frames under ``studio/cli.py``) and where
    each phase of 0.3 s or more went; then per thread where it was (the innermost studio
    frame and the frame it was in)."""
    from collections import Counter, defaultdict

    data = json.loads(samples.read_text())
    frames = data["shared"]["frames"]

    def studio(i: int) -> bool:
        return "/studio/" in str(frames[i].get("file", ""))

    def name(i: int) -> str:
        f = frames[i]
        return f"{f['name']} ({Path(str(f.get('file', ''))).name}:{f.get('line')})"

    def step_name(i: int) -> str:  # a module's import by its module's file
        f = frames[i]
        return f"import {Path(str(f['file'])).stem}" if f["name"] == "<module>" else f["name"]

    def where(stack: list[int]) -> tuple[str, str]:
        inner = [i for i in stack if studio(i)]
        return name(inner[-1]) if inner else "-", name(stack[-1])

    def is_main(prof: dict[str, Any]) -> bool:  # py-spy's root frame names the thread (not
        # in the samples taken before Python named it), and it runs the module as main
        return any(
            "MainThread" in frames[s[0]]["name"]
            or any(frames[i]["name"] == "_run_module_as_main" for i in s[:2])
            for s in prof["samples"]
            if s
        )

    text = []
    profiles = data["profiles"]
    main = next((n for n, prof in enumerate(profiles) if is_main(prof)), 0)
    for n, prof in sorted(enumerate(profiles), key=lambda p: p[0] != main):  # the main first
        step = prof["weights"][0] if prof["weights"] else 1.0 / SAMPLE_RATE
        text.append(f"== {prof['name']}: {len(prof['samples']) * step:.2f} s sampled")
        if n == main:  # its phases, in order: consecutive samples under one step of the command
            runs: list[list[Any]] = []
            inside: defaultdict[str, Counter] = defaultdict(Counter)
            for stack in prof["samples"]:
                cli = [i for i in stack if str(frames[i].get("file", "")).endswith("studio/cli.py")]
                below = stack[stack.index(cli[-1]) + 1 :] if cli else []
                below = [i for i in below if "<frozen" not in str(frames[i].get("file"))]
                phase = " > ".join(step_name(i) for i in [*cli[-1:], *below[:1]]) or "-"
                inside[phase][where(stack)] += step
                if runs and runs[-1][0] == phase:
                    runs[-1][1] += step
                else:
                    runs.append([phase, step])
            merged: list[list[Any]] = []  # steps under 50 ms left out, then neighbours joined
            for ph, t in (r for r in runs if r[1] >= 0.05):
                if merged and merged[-1][0] == ph:
                    merged[-1][1] += t
                else:
                    merged.append([ph, t])
            text += [f"  {t:7.3f} s  {ph}" for ph, t in merged]
            short = sum(t for _, t in runs) - sum(t for _, t in merged)
            text.append(f"  {short:7.3f} s  (steps under 50 ms)")
            for ph, seen in inside.items():
                if sum(seen.values()) >= 0.3:
                    text.append(f"  in {ph} ({sum(seen.values()):.2f} s):")
                    text += [f"  {t:7.3f} s  {a}  in  {b}" for (a, b), t in seen.most_common(8)]
        everywhere = Counter(where(stack) for stack in prof["samples"])
        text.append(f"  where ({lines} most):")
        top = everywhere.most_common(lines)
        text += [f"  {n * step:7.3f} s  {a}  in  {b}" for (a, b), n in top]
    out.write_text("\n".join(text) + "\n")


def kept_engines(root: Path) -> list[str]:
    """The compiled engines under the cache root ``root``, as "network-precision-bN
    (package|artifact)"."""
    kinds = {".pt2": "package", ".art": "artifact"}
    return [
        f"{p.stem.rsplit('-', 1)[0]} ({kinds[p.suffix]})"
        for p in sorted((root / "compiled" / "aot").glob("*-b*-*.*"))
        if p.suffix in kinds and not p.name.startswith(".")  # not a build under way
    ]


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _render_row(run: dict[str, Any], rep: dict[str, Any]) -> dict[str, Any]:
    """A render's row: the process's figures and where its wall time went: ``startup_ms``
    (interpreter and imports before the command), the command's warm-up and stages,
    ``report_ms`` (after the frames: quality measures and the report) and ``exit_ms`` (after
    the report: the interpreter's and CUDA's teardown). A report without the process's own
    clock (``process_ms``) leaves all but the stages in ``startup_ms``."""
    warm = rep.get("warmup_ms", {})
    stages = rep.get("timings_ms", {})
    accounted = stages.get("total", 0.0)  # the command's own clock: warm-up included
    wall = run["wall_s"] * 1000.0
    proc = rep.get("process_ms", {})
    before, to_report = proc.get("before_command"), proc.get("to_report")
    if before is None or to_report is None:
        parts = {"startup_ms": round(max(wall - accounted, 0.0), 1)}
    else:
        parts = {
            "startup_ms": before,
            "report_ms": round(max(to_report - accounted, 0.0), 1),
            "exit_ms": round(max(wall - before - to_report, 0.0), 1),
        }
    return {
        **run,
        "frames": rep.get("frames"),
        "audio_s": rep.get("duration_s"),
        "render_fps": rep.get("render_fps"),
        "warmup_ms": warm,
        "timings_ms": stages,
        "peak_gpu_mb": rep.get("peak_memory_mb", {}).get("gpu"),
        **parts,
        # how its compiled engines came: "loaded" / "built" packages, or why compiled in process
        "compiled": rep.get("engine", {}).get("render", {}).get("compiled_packages"),
    }


def check_outputs(batch: dict[str, Any]) -> list[str]:
    """What is wrong with a batch's outputs: each done job's file must decode, holding the
    frame count of its record. Empty when every output is valid."""
    import av

    problems = []
    for rec in batch["jobs"]:
        if rec["status"] not in ("done", "skipped"):
            problems.append(f"{rec['name']}: {rec['status']} ({rec.get('error', '')})")
            continue
        try:
            with av.open(rec["output"]) as c:
                frames = sum(1 for _ in c.decode(video=0))
        except (av.FFmpegError, OSError) as e:
            problems.append(f"{rec['name']}: {rec['output']} does not decode ({e})")
            continue
        if "frames" in rec and frames != rec["frames"]:
            problems.append(f"{rec['name']}: {frames} frames decoded, {rec['frames']} recorded")
    return problems


INPUTS_FOLDER = "bench-inputs"  # under a kept --cache: the random tree and face, written once
_INPUTS_DONE = "inputs.json"  # written last: the tree is whole


def _inputs_code() -> str:
    """The source of what writes the bench's inputs, digested: inputs kept by other fixtures
    are written again."""
    from studio.bench import pipeline
    from studio.fixtures import face_standins, hubert_standin, random_tree

    modules = (pipeline, face_standins, hubert_standin, random_tree)
    return code_digest(*(str(m.__file__) for m in modules))


def _kept_inputs(done: Path) -> dict[str, Any]:
    """The record of inputs written whole ({}: none, or one damaged: they are written again)."""
    try:
        record = json.loads(done.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and "hubert" in record else {}


def _inputs(
    work: Path,
    engine: str,
    checkpoints: str | None,
    reduced: bool,
    hubert: str,
    seconds: list,
    kept: Path | None = None,
) -> tuple[list[str], dict[str, Any] | None, dict[float, Path]]:
    """(the engine's options for the CLI, the HuBERT record, speech file per length). With
    ``kept`` (a cache kept between runs) the random tree and the face are written there once
    and reused, as a user's checkpoint folder is: what the studio keeps by a file's path and
    time (HuBERT's plan shapes) then serves a later run's first render too."""
    import soundfile as sf

    from studio.bench.pipeline import _face_png, speech_clip, write_inputs

    speech = {}
    for s in seconds:
        clip = speech_clip(s, seed=int(s * 10))
        speech[s] = work / f"speech_{s:g}s.wav"
        sf.write(speech[s], clip.samples, layout.SAMPLE_RATE)
    if engine == "demo":
        return ["--demo"], None, speech
    if checkpoints is not None:
        return (
            ["--checkpoints", checkpoints, "--avatar", str(_face_png(work, 512, 512))],
            None,
            speech,
        )
    place = work if kept is None else kept / f"{'reduced' if reduced else 'full'}-{hubert}"
    done = place / _INPUTS_DONE
    made_by = _inputs_code()
    kept_inputs = _kept_inputs(done)
    if kept_inputs.get("code") == made_by:
        hub = kept_inputs["hubert"]
        face = place / "face_512x512.png"
    else:
        if kept is not None:  # a run stopped while writing them, or other fixtures made them
            shutil.rmtree(place, ignore_errors=True)
        hub = write_inputs(place / "ckpt", reduced, hubert)
        face = _face_png(place, 512, 512)
        write_atomic(done, json.dumps({"code": made_by, "hubert": hub}))
    return ["--checkpoints", str(place / "ckpt"), "--avatar", str(face)], hub, speech


def run_warmstart_suite(
    device: str | None = None,
    engine: str = "ditto",
    checkpoints: str | None = None,
    reduced: bool = False,
    hubert: str = "costlike",
    clips: Sequence[float] = (10.0, 60.0),
    compile: bool = True,
    prebuild: bool = True,
    batch_jobs: int = 20,
    batch_seconds: float = 60.0,
    batch_runs: Sequence[str] = ("local",),
    size: int = 512,
    x264_preset: str = "veryfast",
    motion_precision: str = "fp32",
    cache: str | None = None,
    timeout: float = 900.0,
    keep: str | None = None,
    profile: bool = False,
    sample: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every row of the module docstring; a JSON-ready dict. ``keep``: a folder for each
    process's log, and with ``profile`` its profile, with ``sample`` py-spy's samples
    (:func:`run_process`)."""
    say = progress or (lambda _line: None)
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, not {engine}")
    if (profile or sample) and keep is None:
        raise ValueError("--profile and --sample write into the --keep folder: give --keep DIR")
    if sample:
        py_spy()  # missing: said before any work
    if (clips and min(clips) <= 0) or batch_jobs < 0 or batch_seconds <= 0:
        raise ValueError("need clip lengths > 0, --batch-jobs >= 0 and --batch-seconds > 0")
    cuda = _cuda_here(device)
    ways = {run: _batch_way(run, cuda) for run in batch_runs}
    compile = compile and engine == "ditto"
    if checkpoints is not None and not Path(checkpoints).is_dir():
        raise ValueError(f"--checkpoints {checkpoints} is not a folder: give Ditto's checkpoints")
    result: dict[str, Any] = {
        "suite": "warmstart",
        "facts": {**_facts(device), "date": utc_now(), "commit": git_commit()},
        "config": {
            "engine": engine,
            "checkpoints": checkpoints,
            "reduced": reduced,
            "clips_s": list(clips),
            "compile": compile,
            "prebuild": prebuild,
            "batch_jobs": batch_jobs,
            "batch_seconds": batch_seconds,
            "batch_runs": list(batch_runs),
            "size": size,
            "x264_preset": x264_preset,
            "motion_precision": motion_precision,
            "device": device,
        },
        "targets": TARGETS,
        "rows": [],
        "notes": [],
    }
    with tempfile.TemporaryDirectory(prefix="studio-bench-warmstart-") as tmp:
        work = Path(tmp)
        root = Path(cache) if cache else work / "cache"
        kept = None if keep is None else Path(keep)
        if kept is not None:
            kept.mkdir(parents=True, exist_ok=True)
        launch = functools.partial(
            run_process, timeout=timeout, keep=kept, profile=profile, sample=sample
        )
        cold = not root.is_dir() or not any(root.iterdir())
        result["config"]["cache_was_empty"] = cold
        say(f"[warmstart] writing the inputs ({engine})")
        lengths = sorted({*clips, batch_seconds} if batch_jobs else set(clips))
        engine_args, hub, speech = _inputs(
            work,
            engine,
            checkpoints,
            reduced,
            hubert,
            lengths,
            root / INPUTS_FOLDER if cache else None,
        )
        result["hubert"] = hub
        common = [*engine_args, "--cache-dir", str(root), "-q"]
        if device:
            common += ["--device", device]
        look = ["--size", str(size), "--x264-preset", x264_preset]
        if engine == "ditto":
            look += ["--frame", "crop"]
        if compile:
            look.append("--compile")
        if engine == "ditto" and motion_precision != "fp32":
            look += ["--motion-precision", motion_precision]
        if compile and prebuild and not cuda:
            result["notes"].append("no prebuild row: compiled engines are built on a CUDA GPU")
        elif compile and prebuild:
            say("[warmstart] prebuild: studio compile --runtime torch")
            argv = _without_avatar(["compile", "--runtime", "torch", *common])
            run = launch(argv, work / "prebuild.log")
            label = "prebuild (empty cache)" if cold else "prebuild (cache kept)"
            run.update(row=label, last_line=_last_line(work / "prebuild.log"))
            run["compiled"] = kept_engines(root)  # what it left, also when it was stopped
            result["rows"].append(run)
            say(f"[warmstart] {label}: {run['wall_s']} s wall, {_result(run)}")
        for s in clips:
            name = f"render {s:g} s"
            say(f"[warmstart] {name}: a new process")
            out, rep_path, log = work / f"r{s:g}.mp4", work / f"r{s:g}.json", work / f"r{s:g}.log"
            argv = ["render", "--audio", str(speech[s]), *common, *look, "--out", str(out)]
            run = launch([*argv, "--report", str(rep_path)], log)
            rep = json.loads(rep_path.read_text()) if rep_path.is_file() else {}
            row = {"row": name, **_render_row(run, rep)}
            if run["exit"] != 0:
                row["last_line"] = _last_line(log)
            target = TARGETS.get(f"render_{s:g}s_wall_s")
            if target is not None:
                row["target_s"], row["meets_target"] = target, run["wall_s"] <= target
            result["rows"].append(row)
            went = where_it_went(row)
            say(f"[warmstart] {name}: {run['wall_s']} s wall, exit {run['exit']} ({went})")
            if run["exit"] != 0:
                say(f"[warmstart] {name}: {_result(row)}")
        for run_name, way in ways.items() if batch_jobs else ():
            result["rows"].append(
                _batch_row(
                    work,
                    speech[batch_seconds],
                    batch_jobs,
                    common + look,
                    launch,
                    say,
                    run_name,
                    way,
                )
            )
    return result


def _batch_way(run: str, cuda: bool) -> tuple[list[str], dict[str, str] | None]:
    """A ``--batch-runs`` item as the batch command's extra options and environment:
    ``local`` none, ``ahead`` ``STUDIO_BATCH_AHEAD=1``, ``ray:N`` N actors (1/N GPU each on
    a GPU)."""
    if run in ("local", "ahead"):
        return [], {"STUDIO_BATCH_AHEAD": "1"} if run == "ahead" else None
    head, _, count = run.partition(":")
    if head == "ray" and count.isdigit() and int(count) >= 1:
        actors = int(count)
        gpus = ["--gpus-per-actor", f"{1.0 / actors:g}"] if cuda else []
        return ["--ray", "--actors", str(actors), *gpus], None
    raise ValueError(f"--batch-runs: {run!r} is not local, ahead or ray:N (N actors, e.g. ray:2)")


def _without_avatar(argv: list[str]) -> list[str]:
    """``studio compile`` takes no avatar: ``argv`` without ``--avatar FILE``."""
    if "--avatar" not in argv:
        return argv
    i = argv.index("--avatar")
    return argv[:i] + argv[i + 2 :]


def _batch_row(
    work: Path,
    speech: Path,
    jobs: int,
    options: list[str],
    launch: Callable[..., dict[str, Any]],
    say: Callable[[str], None],
    run_name: str = "local",
    way: tuple[list[str], dict[str, str] | None] = ([], None),
) -> dict[str, Any]:
    """The batch row; ``launch``: :func:`run_process` with the suite's limit and folders."""
    say(f"[warmstart] batch ({run_name}): {jobs} jobs in one new process")
    listing = work / "jobs.jsonl"
    listing.write_text(
        "".join(
            json.dumps({"audio": str(speech), "output": f"clip_{i:02d}.mp4"}) + "\n"
            for i in range(jobs)
        )
    )
    tag = run_name.replace(":", "")
    out_dir, log = work / f"batch_{tag}", work / f"batch_{tag}.log"
    extra, env = way
    argv = ["batch", str(listing), "--out-dir", str(out_dir), *options, *extra]
    run = launch(argv, log, env=env)
    row: dict[str, Any] = {"row": f"batch {jobs} x {speech.stem} ({run_name})", **run}
    rep_path = out_dir / "batch_report.json"
    if not rep_path.is_file():
        row["last_line"] = _last_line(log)
        say(f"[warmstart] batch ({run_name}): {_result(row)}")
        return row
    batch = json.loads(rep_path.read_text())
    s = batch["summary"]
    audio = s["audio_s"]
    made = [r for r in batch["jobs"] if r["status"] == "done"]
    row.update(
        warmup_ms=_summed(r.get("warmup_ms", {}) for r in made),
        timings_ms=_summed(r.get("timings_ms", {}) for r in made),
        done=s["done"],
        failed=s["failed"],
        audio_s=audio,
        frames=s["frames"],
        realtime=round(audio / run["wall_s"], 2) if audio else None,
        peak_gpu_mb=s.get("peak_gpu_mb"),
        problems=check_outputs(batch),
        analysed_ahead=sum(bool(r.get("analysed_ahead")) for r in batch["jobs"]),
        target_x=TARGETS["batch_realtime"],
    )
    row["meets_target"] = bool(row["realtime"] and row["realtime"] >= TARGETS["batch_realtime"])
    row["valid"] = not row["problems"] and s["done"] == jobs
    say(
        f"[warmstart] batch ({run_name}): {row['realtime']}x real time, {row['wall_s']} s wall, "
        f"{s['done']} done, {len(row['problems'])} problems, peak GPU {row['peak_gpu_mb']} MB "
        f"({where_it_went(row)})"
    )
    return row


def _cuda_here(device: str | None) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def _facts(device: str | None) -> dict[str, Any]:
    import torch  # its versions only: CUDA is left for the rows' processes to start

    return {
        "name": _device_name(device),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
    }


def _summed(parts: Any) -> dict[str, float]:
    """Per key, the sum over the jobs' timing dicts (ms)."""
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = round(total.get(key, 0.0) + value, 2)
    return total


def _device_name(device: str | None) -> str:
    """The GPU's name where one is used, else the CPU (without initialising CUDA here: the
    rows' processes must find the GPU as a user's would)."""
    if device != "cpu":
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            if out.stdout.strip():
                return out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    import platform

    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def where_it_went(row: dict[str, Any]) -> str:
    """A row's seconds by part: startup, warm-up, its stages, the report and the exit (those
    of 5 ms or more); then how its compiled engines came, where it had some."""
    parts = [
        ("startup", row.get("startup_ms", 0)),
        *row.get("warmup_ms", {}).items(),
        *row.get("timings_ms", {}).items(),
        ("report", row.get("report_ms", 0)),
        ("exit", row.get("exit_ms", 0)),
    ]
    text = ", ".join(f"{k} {v / 1000:.2f}" for k, v in parts if k != "total" and v >= 5.0)
    compiled = [c for c in row.get("compiled") or () if c != "off"]
    return text + (f"; compiled engines: {', '.join(compiled)}" if compiled else "")


def _result(row: dict[str, Any]) -> str:
    """A row's result: ok, killed at the time limit, or the exit status and last line."""
    if row["exit"] == 0:
        return "ok"
    if row["exit"] is None:
        return f"killed at the --timeout ({row['wall_s']:.0f} s)"
    return f"exit {row['exit']}: {row.get('last_line', '')}"


def to_markdown(result: dict[str, Any]) -> str:
    f, c = result["facts"], result["config"]
    lines = [
        "## New processes against the caches on disk (warm starts and a batch)",
        "",
        report.measured_on(f),
        "",
        f"Engine {c['engine']}"
        + (" (reduced tree)" if c["reduced"] else "")
        + f", --compile {'on' if c['compile'] else 'off'}, {c['size']}² , x264 {c['x264_preset']}"
        + f", LMDM {c.get('motion_precision', 'fp32')}.",
        "",
    ]
    rows = []
    for r in result["rows"]:
        split = where_it_went(r)
        goal = ""
        if "target_s" in r:
            goal = f"≤ {r['target_s']:g} s: {'met' if r['meets_target'] else 'not met'}"
        elif "target_x" in r:
            goal = f"≥ {r['target_x']:g}x: {'met' if r['meets_target'] else 'not met'}"
        rate = f"{r['realtime']}x real time" if r.get("realtime") else ""
        if r.get("render_fps"):
            rate = f"{r['render_fps']} fps"
        rows.append(
            [
                r["row"],
                _result(r),
                f"{r['wall_s']:.2f} s",
                rate,
                f"{r['peak_host_mb']:.0f}"
                + (f" / {r['peak_gpu_mb']:.0f}" if r.get("peak_gpu_mb") else ""),
                split.replace("|", "/"),
                goal,
            ]
        )
    lines += report.table(
        ["process", "result", "wall", "rate", "peak MB host / GPU", "where it went (s)", "target"],
        rows,
    )
    for r in result["rows"]:
        for p in r.get("problems", []):
            lines.append(f"- {r['row']}: {p}")
    return "\n".join(lines + report.markdown_tail(result))


def build_parser() -> argparse.ArgumentParser:
    p = report.suite_parser(
        "warmstart",
        "New processes against the caches on disk: the cold prebuild, renders of each clip "
        "length, and a batch in one process, each timed whole.",
        HELP,
        allow_abbrev=False,
    )
    p.add_argument("--engine", choices=ENGINES, default="ditto")
    p.add_argument("--checkpoints", metavar="DIR", help="a real Ditto tree (default: random)")
    p.add_argument("--reduced", action="store_true", help="narrow networks (smoke runs)")
    p.add_argument("--hubert", choices=("costlike", "large", "standin"), default="costlike")
    p.add_argument("--clips", default="10,60", help="clip lengths in seconds (default 10,60)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager engines")
    p.add_argument(
        "--no-prebuild",
        dest="prebuild",
        action="store_false",
        help="no `studio compile` row (a cache filled before)",
    )
    p.add_argument("--batch-jobs", type=int, default=20, help="jobs of the batch row (0: none)")
    p.add_argument("--batch-seconds", type=float, default=60.0)
    p.add_argument(
        "--batch-runs",
        default="local",
        help="ways to run the batch, comma-separated: local, ahead (the next job analysed "
        "beside each render), ray:N (N Ray actors); default local",
    )
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--x264-preset", default="veryfast")
    p.add_argument(
        "--motion-precision",
        choices=MOTION_PRECISIONS,
        default="fp32",
        help="the renders' LMDM precision (studio render --motion-precision; default fp32)",
    )
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="the cache root, kept between runs with the random tree it holds (default: a "
        "fresh one)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    p.add_argument("--keep", metavar="DIR", help="copy each process's log into DIR")
    p.add_argument(
        "--profile",
        action="store_true",
        help="with --keep: each process's main thread profiled there (NAME.prof, NAME.txt)",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="with --keep: each process sampled by py-spy, all threads, waits included "
        "(NAME.speedscope.json, NAME.samples.txt)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return report.run_main(
        "warmstart", build_parser(), argv, _run, to_markdown, None, (StudioError, ValueError)
    )


def _run(args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    return run_warmstart_suite(
        **report.args_for(
            run_warmstart_suite,
            args,
            clips=report.float_list(args.clips, "--clips"),
            batch_runs=report.name_list(args.batch_runs) or [],
            progress=progress,
        )
    )
