"""The `studio` command: gui (default), render, live, analyze, doctor, export-onnx, compile,
bench.

User errors (bad files, bad options, unwritable outputs) print one line on
stderr and exit with status 2; nothing is left half-written. Inputs are checked before any
work, in the order a user fixes them: options, outputs, the checkpoint folder, the avatar,
the device, the audio. An output is never one of the inputs (symlinks followed), and every
JSON output option takes ``-`` for stdout (the human summary then goes to stderr). Long work
shows its stages on stderr (:mod:`studio.progress`: bars on a terminal, one line per stage
start and end otherwise), and notices such as a large file about to be written to a cache
appear there too (``-q`` hides both, ``-v`` adds debug lines); stdout carries the results only.

The last line of defence (:func:`main`): SIGINT, SIGTERM and SIGHUP are caught from the first
line of ``main`` on, before any heavy import (an inherited ignore, as under ``nohup``, is
kept), and end the command with one line and status 130; an unexpected exception ends it with
one line naming its type and a log file under the cache's ``logs/`` holding the traceback,
and status 1. No Python traceback reaches stderr.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, NoReturn

from studio import __version__
from studio.errors import Cancelled, InputError, OptionError, StudioError
from studio.files import (
    check_not_input,
    check_output_file,
    file_in_the_way,
    is_stdout,
    write_json,
)
from studio.signals import handled

EXIT_USAGE = 2
EXIT_INTERNAL = 1
EXIT_CANCELLED = 130
COMMANDS = (
    "gui",
    "render",
    "batch",
    "live",
    "analyze",
    "doctor",
    "export-onnx",
    "compile",
    "bench",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, naming the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _setting(
    g: argparse._ActionsContainer,
    key: str,
    metavar: str,
    note: str = "",
) -> None:
    """The option that sets the schema's ``key`` (:func:`studio.settings.spec`): its type or
    choices, and help with the range and default, come from the schema, which checks it. Its
    dest is argparse's own (``--x264-preset``: x264_preset, as ``--preset`` names a file)."""
    from studio.settings import spec

    s = spec(key)
    assert s.option is not None, key
    if s.kind is bool:  # a flag: given or not (None: the preset's or the default)
        text = f"{s.help}{note} (default {'on' if s.default else 'off'})".replace("%", "%%")
        g.add_argument(s.option, action="store_true", default=None, help=text)
        return
    kind = {"choices": s.choices} if s.choices else {"type": s.kind}
    text = f"{s.help}{note} ({s.allowed}; default {s.default})".replace("%", "%%")
    g.add_argument(s.option, metavar=metavar, help=text, **kind)


def _output_options(g: argparse._ActionsContainer) -> None:
    """What a written clip is made of: size, quality, speed, rate, codec, encoder, backdrop."""
    for key, metavar, note in (
        ("size", "PX", ""),
        ("crf", "N", ""),
        ("preset", "NAME", ""),
        ("fps", "FPS", ""),
        ("codec", "NAME", " (of .mp4 outputs)"),
        ("hw_encode", "", ""),
        ("background", "NAME", ""),
    ):
        _setting(g, key, metavar, note)


def _motion_options(p: argparse.ArgumentParser, audio: bool = True) -> None:
    g = p.add_argument_group("motion")
    if audio:
        g.add_argument(
            "--audio", metavar="FILE", help="speech to animate (WAV/FLAC/OGG/MP3, any rate)"
        )
    g.add_argument(
        "--demo",
        action="store_true",
        help="use the built-in demo engine (the default "
        "when no checkpoints are given)"
        + (" and, without --audio, the demo speech" if audio else ""),
    )
    g.add_argument("--preset", metavar="FILE", help="load settings from a JSON preset first")
    if audio:
        g.add_argument(
            "--project",
            metavar="FILE.json",
            help="a project file (audio, avatar, settings and control tracks, as the GUI saves "
            "it); options given as well override it",
        )
        g.add_argument(
            "--controls",
            metavar="TRACKS.json",
            help="keyed control tracks over the clip: head pose offsets and amplitude, mouth, "
            "eyes, blinks, fades (README: Directing the performance)",
        )
    _setting(g, "smooth_window", "N")
    _setting(g, "smooth_order", "K")
    _setting(g, "accel_limit", "A")
    g.add_argument("--no-smooth", action="store_true", help="turn pose smoothing off")
    _setting(g, "stride", "S")
    _setting(g, "seed", "N")
    _ditto_options(p)


def _ditto_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ditto engine (with --checkpoints)")
    g.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="Ditto's checkpoint folder (holding ditto_pytorch/): selects the Ditto engine",
    )
    g.add_argument(
        "--avatar",
        metavar="FILE",
        help="the face to animate: a photo (PNG/JPEG), or a short video of it (MP4/MOV/WebM)",
    )
    _setting(g, "emotion", "N")
    for axis in ("pitch", "yaw", "roll"):
        _setting(g, f"delta_{axis}", "DEG")
    _setting(g, "steps", "T")
    _setting(g, "crop_scale", "S")
    _setting(g, "crop_vx", "R")
    _setting(g, "crop_vy", "R")
    _setting(g, "memory", "MODE")
    _setting(g, "batch", "N")
    _setting(g, "precision", "P")
    _setting(g, "motion_precision", "P")
    _setting(g, "frame", "KIND")
    _setting(g, "video_loop", "ORDER")
    _setting(g, "runtime", "NAME", note="; `studio doctor` says which run here")
    g.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="run warp + decoder through torch.compile on a GPU: about 1.6x the frame rate, "
        "after a first render that compiles for a minute (cached on disk after that)",
    )
    g.add_argument("--device", metavar="DEV", help="cpu, cuda or cuda:N (default: a GPU if any)")
    g.add_argument(
        "--avatar-cache",
        metavar="DIR",
        help="where registered avatars are kept (default: avatars/ under the cache root, "
        "--cache-dir)",
    )


def build_parser() -> argparse.ArgumentParser:
    from studio.runtime.compile_cli import add_arguments as _compile_arguments
    from studio.runtime.compile_cli import add_folder_options

    parser = _Parser(prog="studio", description="Talking-head preview studio.")
    parser.add_argument("--version", action="version", version=f"studio {__version__}")
    _global_options(parser)
    _completion_option(parser)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    r = sub.add_parser(
        "render",
        help="render a video (MP4, WebM, QuickTime) or a PNG sequence",
        description="Render a talking head from speech: OUT.mp4 (H.264, HEVC or AV1 + AAC), "
        "OUT.webm (VP9 + Opus), OUT.mov (ProRes 4444 + PCM) or OUT.png (a folder OUT/ of PNG "
        "frames and OUT.wav); --background transparent gives .webm, .mov and .png an alpha "
        "channel.",
    )
    _motion_options(r)
    r.add_argument(
        "--out",
        required=True,
        metavar="OUT.mp4",
        help="output: .mp4, .webm, .mov, or .png for a PNG sequence in the folder OUT/",
    )
    _output_options(r)
    r.add_argument("--report", metavar="REPORT.json", help="write the JSON report here")

    b = sub.add_parser(
        "batch",
        help="render many clips with one warm engine (resumable)",
        description="Render every clip of JOBS into --out-dir: JOBS is a .jsonl or .csv file "
        "(one clip a line: audio, and optionally avatar, output, preset and settings by key) "
        "or a folder of audio files (each with --avatar). One engine serves every job of an "
        "avatar; a job that fails is recorded with its error and the others go on; a rerun "
        "skips finished jobs (--retry-failed retries failed ones). Writes batch_report.json "
        "in --out-dir. Exit status 1 when a job failed.",
    )
    b.add_argument(
        "jobs", metavar="JOBS", help="a .jsonl or .csv file of jobs, or a folder of audio"
    )
    b.add_argument(
        "--out-dir", required=True, metavar="DIR", help="where the MP4s go (made if needed)"
    )
    b.add_argument(
        "--retry-failed", action="store_true", help="run again the jobs that failed last time"
    )
    _motion_options(b, audio=False)
    _output_options(b)
    b.add_argument(
        "--report", metavar="REPORT.json", help="also write the batch report here (- for stdout)"
    )
    rg = b.add_argument_group("on a Ray cluster (pip install 'talkinghead-studio[ray]')")
    rg.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the jobs through Ray Data: on the cluster at ADDRESS (HOST:6379, "
        "ray://HOST:10001 or auto), or without one on a local Ray instance started for the batch",
    )
    rg.add_argument(
        "--actors", type=int, default=1, metavar="N", help="engines (actors) at once (default 1)"
    )
    rg.add_argument(
        "--gpus-per-actor",
        type=float,
        metavar="G",
        help="GPUs each actor holds: 1, or 0.5 / 0.25 to pack actors on one GPU (default: 1 "
        "where the cluster has GPUs, else 0)",
    )
    rg.add_argument(
        "--cpus-per-actor",
        type=float,
        default=1.0,
        metavar="C",
        help="CPUs each actor holds (default 1)",
    )

    lv = sub.add_parser(
        "live",
        help="animate live audio (a file played as live, a pipe, a socket, the microphone)",
        description="Turn audio into frames as it arrives: from a file played as live, raw "
        "PCM on stdin (-) or a socket, the microphone (--mic) or a browser's (--browser-mic); "
        "frames go to an MP4 recording (--out), a browser page over WebRTC (--serve) and a "
        "virtual camera. Ctrl-C ends the session and keeps what was recorded.",
    )
    _motion_options(lv)
    src = lv.add_argument_group("live input")
    src.add_argument("--mic", action="store_true", help="listen to the microphone (PortAudio)")
    src.add_argument(
        "--mic-device", metavar="NAME", help="the microphone to use (default: the system's)"
    )
    src.add_argument(
        "--browser-mic",
        action="store_true",
        help="listen to the microphone of the browser connected to --serve",
    )
    src.add_argument(
        "--realtime",
        action="store_true",
        help="play a file at its own pace (else as fast as possible)",
    )
    src.add_argument(
        "--loop",
        type=int,
        default=0,
        metavar="N",
        help="play a file N more times (-1: until Ctrl-C)",
    )
    src.add_argument("--duration", type=float, metavar="S", help="stop after S seconds of audio")
    src.add_argument(
        "--pcm-rate",
        type=int,
        default=16000,
        metavar="HZ",
        help="raw PCM: sample rate (default 16000)",
    )
    src.add_argument(
        "--pcm-channels", type=int, default=1, metavar="N", help="raw PCM: channels (default 1)"
    )
    src.add_argument(
        "--pcm-format",
        default="s16le",
        choices=("s16le", "f32le"),
        help="raw PCM: sample type (default s16le)",
    )
    src.add_argument(
        "--latency",
        default="balanced",
        choices=("low", "balanced", "smooth"),
        help="less lookahead (low), or smoother motion (smooth); default balanced",
    )
    out = lv.add_argument_group("live output")
    out.add_argument("--out", metavar="REC.mp4", help="record the session (H.264 + AAC)")
    out.add_argument(
        "--serve", metavar="[HOST:]PORT", help="serve a page that shows the head over WebRTC"
    )
    out.add_argument(
        "--virtual-camera",
        nargs="?",
        const="",
        metavar="DEVICE",
        help="send the frames to a virtual camera (v4l2loopback; see `studio doctor`)",
    )
    _setting(out, "size", "PX")
    _setting(out, "crf", "N")
    _setting(out, "preset", "NAME")
    out.add_argument(
        "--report", metavar="REPORT.json", help="write the session's measurements here"
    )

    a = sub.add_parser(
        "analyze",
        help="motion, cadence and kinematics without rendering",
        description="Analyse speech: motion, cadence plan and kinematics.",
    )
    _motion_options(a)
    a.add_argument("--json", metavar="OUT.json", help="write the analysis here")

    d = sub.add_parser(
        "doctor",
        help="what this machine offers the studio",
        description="Report Python, torch, ONNX Runtime, TensorRT, GPU, Qt, PyAV and, with "
        "--checkpoints, which of Ditto's checkpoint files are present or missing per stage.",
    )
    d.add_argument("--json", action="store_true", help="print JSON instead of text")
    d.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="also check Ditto's checkpoint folder (the one holding ditto_pytorch/, "
        "ditto_onnx/, ditto_trt_*/, ditto_cfg/)",
    )

    e = sub.add_parser(
        "export-onnx",
        help="export Ditto's PyTorch networks to ONNX, verified in ONNX Runtime",
        description="Export the networks found in DIR/ditto_pytorch/models/ to ONNX files "
        "with Ditto's names, I/O names and static shapes (one self-contained file each), "
        "and check each against the PyTorch module in ONNX Runtime.",
    )
    add_folder_options(e, "ditto_pytorch/", ".onnx files")
    e.add_argument(
        "--networks",
        metavar="A,B",
        help="comma-separated subset of appearance_extractor, motion_extractor, warp_network, "
        "decoder, stitch_network, lmdm (default: every one present)",
    )
    e.add_argument(
        "--opset", type=int, default=20, metavar="N", help="ONNX opset, >= 20 (default 20)"
    )
    e.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the ONNX Runtime comparison (structure is still checked)",
    )
    e.add_argument("--json", metavar="OUT.json", help="also write the summary here")

    c = sub.add_parser(
        "compile",
        help="build Ditto's engines ahead: TensorRT engines, or (--runtime torch) the "
        "compiled render engines --compile uses (cached, rebuilt when stale)",
        description="Build TensorRT engines from ditto_onnx/ or from ONNX exported from "
        "ditto_pytorch/, with per-network precision, a timing cache, and an engine cache that "
        "rebuilds stale engines (other GPU, TensorRT version, precision or ONNX) instead of "
        "failing; needs tensorrt (pip install 'talkinghead-studio[trt]'). With --runtime "
        "torch: the compiled warp + decoder engines that renders with --compile load instead "
        "of compiling (needs a CUDA GPU, no TensorRT), kept in the cache root's "
        "compiled/aot.",
    )
    _compile_arguments(c)

    g = sub.add_parser(
        "gui", help="open the studio window (the default)", description="Open the studio window."
    )
    g.add_argument("--audio", metavar="FILE", help="open on this speech")
    g.add_argument("--avatar", metavar="FILE", help="open on this avatar (photo, video or folder)")
    g.add_argument(
        "--screenshot",
        metavar="FILE.png",
        help="save a screenshot of the window after the first render, then exit",
    )
    g.add_argument("--window-size", metavar="WxH", help="initial window size, e.g. 1600x1000")

    for command in sub.choices.values():  # `studio render -v` as well as `studio -v render`
        _global_options(command, given_only=True)
    # the suites parse their own options: `studio bench` forwards the rest of the line
    sub.add_parser(
        "bench",
        help="measured suites (studio bench --suite NAME --help)",
        description="Measured suites with the published reference figures beside ours.",
        add_help=False,
    )
    return parser


def _global_options(p: argparse.ArgumentParser, given_only: bool = False) -> None:
    """``-v``, ``-q`` and ``--cache-dir``: on the top parser with their defaults, and on each
    command's with none (``given_only``), so that a value given before the command stands."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if given_only else value

    g = p.add_argument_group("global options")
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default(0),
        help="also show debug lines on stderr",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default(False),
        help="show no progress and no notices on stderr, only errors",
    )
    g.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=default(None),
        help="the root of every cache: avatars, engines, compiled kernels, logs (default "
        "$STUDIO_CACHE_DIR, else the user cache folder: ~/.cache/talkinghead-studio)",
    )


def _completion_option(p: argparse.ArgumentParser) -> None:
    """``--print-completion bash|zsh|tcsh``: the shell completion script (shtab)."""
    import shtab

    shtab.add_argument_to(
        p,
        ["--print-completion"],
        help="print the shell's completion script and exit",
    )


def _settings(args: argparse.Namespace, **extra):
    """The preset (if any), then every schema setting whose option was given, then ``extra``;
    checked by the schema (OptionError naming the option)."""
    from studio.settings import RenderSettings, keys, spec

    project = getattr(args, "project_", None)
    if args.preset and project is not None:
        raise OptionError("--preset", "cannot be combined with --project (it holds settings)")
    base = RenderSettings.load(args.preset) if args.preset else RenderSettings()
    if project is not None:
        base = project.settings
    options = {k: spec(k).option for k in keys()}
    given = {  # by argparse's dest of each option (absent: an option of another command)
        k: getattr(args, option.lstrip("-").replace("-", "_"), None)
        for k, option in options.items()
        if option
    }
    given.update(extra)
    if args.checkpoints:  # the engine that runs on a checkpoint folder
        from studio.render.engines import ENGINES, capabilities

        given["backend"] = next(n for n in ENGINES if capabilities(n).needs_checkpoints)
    values = {k: v for k, v in given.items() if v is not None}
    if args.no_smooth:
        values["smooth"] = False
    return base.replace(**values)


def _load_controls(args: argparse.Namespace):
    """The --controls tracks, else the project's, else the preset's (None without any);
    InputError naming the file."""
    if not getattr(args, "controls", None):
        project = getattr(args, "project_", None)
        if project is not None and project.controls:
            return project.controls
        if getattr(args, "preset", None):
            from studio.settings import load_preset_tracks

            return load_preset_tracks(args.preset)
        return None
    from studio.motion.controls import ControlTracks

    return ControlTracks.load(args.controls)


def _open_project(args: argparse.Namespace) -> None:
    """With --project: the project read (``args.project_``), its audio and avatar the
    defaults of --audio and --avatar."""
    args.project_ = None
    if not getattr(args, "project", None):
        return
    from studio.render.project import Project

    project = Project.load(args.project)
    args.project_ = project
    args.audio = args.audio or project.audio
    args.avatar = args.avatar or project.avatar


def _load_audio(args: argparse.Namespace):
    from studio.audio.io import load_audio
    from studio.engines.demo import demo_audio_path

    return load_audio(args.audio if args.audio else demo_audio_path())


def _check_json_target(
    path: str | None, option: str, others: dict[str, str | None] | None = None
) -> str | Path | None:
    """The JSON target of ``option``, checked before any work: ``-`` (stdout) as it is, else
    a file name the folder takes, in a folder that exists and takes files, and not one of
    the ``others`` (option -> path: the command's inputs and outputs, which the JSON would
    overwrite; through symlinks)."""
    if is_stdout(path):
        return path
    return check_output_file(path, option, others)


def _check_out_not_input(args: argparse.Namespace) -> None:
    """``--out`` is none of the command's inputs, and a PNG sequence's folder holds none."""
    from studio.export.video import written_path

    check_not_input(args.out, "--out", _inputs(args))
    if written_path(args.out) != Path(args.out):
        check_not_input(written_path(args.out), "--out", _inputs(args))


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The command's input files by option (an output must not overwrite them)."""
    names = {
        "--audio": "audio",
        "--avatar": "avatar",
        "--preset": "preset",
        "--controls": "controls",
    }
    given = {option: getattr(args, name, None) for option, name in names.items()}
    return {**given, "--checkpoints": getattr(args, "checkpoints", None)}


def _write_json(path: str | Path, data: dict) -> None:
    """``data`` as JSON to ``path`` (atomically, synced) or, for ``-``, to stdout."""
    write_json(path, data)


def _print_result(text: str, json_target: str | Path | None) -> None:
    """The human summary: on stdout, or on stderr when the JSON went to stdout."""
    print(text, file=sys.stderr if is_stdout(json_target) else sys.stdout)


def _progress():
    """The stage progress shown on stderr (bars on a terminal, plain lines otherwise)."""
    from studio.progress import StageProgress

    return StageProgress(sys.stderr, checkpoint=_raise_if_signalled)


def _raise_if_signalled() -> None:
    """KeyboardInterrupt again when a signal was caught: its first one can be swallowed
    where it landed (a finaliser, a library catching everything)."""
    if _SIGNALLED:
        raise KeyboardInterrupt(f"signal {_SIGNALLED[0]}")


def _inbetween_words(psnr: dict | None) -> str:
    """ ", in-betweens M dB mean (p5 P) against full renders" where they were measured."""
    if not psnr:
        return ""
    return f", in-betweens {psnr['mean']:.1f} dB mean (p5 {psnr['p5']:.1f}) against full renders"


def _summary(report: dict) -> str:
    k = report["kinematics"]
    t = report["timings_ms"]
    hist = report["stride_histogram"]
    change = 0.0
    if k["pose_jerk_mean_raw"] > 0:
        change = 100.0 * (k["pose_jerk_mean_smoothed"] / k["pose_jerk_mean_raw"] - 1)
    lines = [
        f"{report['frames']} frames ({report['duration_s']:.2f} s at {report['fps']} fps), "
        f"strides 1/2/3: {hist['1']}/{hist['2']}/{hist['3']}, "
        f"rendered {report['rendered_frames']} ({100 * report['rendered_fraction']:.0f}%)"
        + _inbetween_words(report.get("inbetween_psnr")),
        f"pose jerk {k['pose_jerk_mean_raw']:.2f} -> {k['pose_jerk_mean_smoothed']:.2f} rad/s³ "
        f"({change:+.1f}%), max accel {k['accel_max_smoothed']:.3f} <= "
        f"{k['accel_limit']:.3f} deg/frame², exp MAE {k['exp_mae']:.2g}",
        "timings: " + ", ".join(f"{name} {ms:.0f} ms" for name, ms in t.items()),
    ]
    if "render_fps" in report:
        w, h = report.get("frame_size", (report["size"], report["size"]))
        lines.append(f"wrote {report['output']} ({w}x{h}, {report['render_fps']:.1f} fps)")
    return "\n".join(lines)


def _prepare_engine(args: argparse.Namespace, settings):
    """The engine's checks before any work, in the order a user fixes things (the checkpoint
    folder, the avatar, the device and precision; :func:`studio.render.engines.prepare_engine`),
    after the command's own: --demo and --checkpoints pick one engine. Notes on stderr for
    options the engine will ignore (``--compile`` on a CPU)."""
    from studio.engines.base import EngineRequest
    from studio.render.engines import prepare_engine

    if args.checkpoints and args.demo:
        raise OptionError("--demo", "cannot be combined with --checkpoints; pick one engine")
    request = EngineRequest(settings, args.checkpoints, args.avatar, args.device, args.avatar_cache)
    prepared = prepare_engine(request)
    notes = prepared.notes
    if args.command == "analyze" and settings.compile:  # renders nothing: say that instead
        notes = (
            *(n for n in notes if not n.startswith("--compile")),
            "--compile is ignored by analyze, which renders no frames",
        )
    out = str(getattr(args, "out", "") or "")
    if settings.hw_encode and args.command == "render" and out.lower().endswith(".mp4"):
        from studio.export.video import hardware_note

        note = hardware_note(settings.codec)  # the writer's own note, said before the work
        notes = (*notes, note) if note else notes
    for note in notes:
        print(f"studio {args.command}: note: {note}", file=sys.stderr)
    return prepared


def _open_engine(prepared, progress):
    """Open the checked engine; its one-line summary (the avatar, for Ditto) above the bars."""
    from studio.render.engines import open_prepared

    engine = open_prepared(prepared, progress)
    summary = engine.describe().get("summary")
    if summary:
        progress.note(summary)
    return engine


def _engine_report(engine) -> dict:
    """What ran: the engine's own description, without the line meant for people."""
    info = engine.describe()
    info.pop("summary", None)
    return info


def cmd_render(args: argparse.Namespace) -> int:
    from studio.export.video import check_alpha_output, check_output_path
    from studio.progress import process_age_s

    started, before = time.perf_counter(), process_age_s()  # before: interpreter and imports
    _open_project(args)
    settings = _settings(args, size=args.size, crf=args.crf, preset=args.x264_preset)
    out = check_output_path(args.out)
    check_alpha_output(out, settings.background == "transparent")
    _check_out_not_input(args)
    report_path = _check_json_target(args.report, "--report", {"--out": args.out, **_inputs(args)})
    prepared = _prepare_engine(args, settings)
    audio = _load_audio(args)
    controls = _load_controls(args)
    # the pipeline (torch, scipy) after the inputs: a mistake in them is said a second sooner
    imports = time.perf_counter()
    from studio.render.pipeline import (
        analyze,
        find_silence_aside,
        quality_of,
        start_video,
        warmup_of,
    )

    find_silence_aside(audio)  # the quality report's VAD, beside everything until the report
    with _progress() as progress:
        t0 = time.perf_counter()
        engine = _open_engine(prepared, progress)
        opened = time.perf_counter()
        result = analyze(audio, settings, engine, controls)
        analysed = time.perf_counter()
        renderer = engine.renderer(settings)
        # export/compile/capture before the first frame, as a stage of its own
        t1 = time.perf_counter()
        renderer.build_engines(int(result.plan.keyframes.size), progress)
        built = time.perf_counter()
        report = start_video(
            result, renderer, str(out), settings, progress=progress, started=started
        ).finish()
    report["warmup_ms"] = {
        # the command's checks (the engine's: its device started), the inputs read
        "inputs": round((imports - started) * 1000.0, 2),
        "imports": round((t0 - imports) * 1000.0, 2),  # the pipeline's, after the inputs
        "open_engine": round((opened - t0) * 1000.0, 2),
        "renderer": round((t1 - analysed) * 1000.0, 2),  # the avatar to the device
        "build_engines": round((built - t1) * 1000.0, 2),
        **warmup_of(report),  # LMDM's graph capture, a GPU process's first clip
    }
    from studio.runtime.base import peak_memory_mb

    report["peak_memory_mb"] = peak_memory_mb()
    report["audio"] = audio.path
    report["settings"] = settings.to_dict()
    if controls:
        report["controls"] = controls.to_dict()
    report["engine"] = _engine_report(engine)
    report["quality"] = quality_of(result, engine)
    # the process around the command's own total: before it, and up to this report
    report["process_ms"] = {
        "before_command": None if before is None else round(before * 1000.0, 1),
        "to_report": round((time.perf_counter() - started) * 1000.0, 1),
    }
    if report_path is not None:
        _write_json(report_path, report)
    _print_result(_summary(report), report_path)
    return 0


def _failure_said(rec: dict) -> None:
    """Under -q (no progress lines) a job that failed now is still one line: it is an error."""
    if rec["status"] == "failed" and not rec.get("was"):
        print(f"studio batch: {rec['name']}: {rec.get('error', 'failed')}", file=sys.stderr)


def _after_ctrl_c() -> str:
    """A line break on a terminal (the ^C it echoed ends no line); nothing in a file or pipe."""
    return "\n" if sys.stderr.isatty() else ""


def cmd_batch(args: argparse.Namespace) -> int:
    from studio.batch.jobs import check_outputs, read_jobs
    from studio.batch.run import (
        REPORT_FILE,
        EngineOptions,
        check_engines,
        run_batch,
        summary_table,
    )

    if args.checkpoints and args.demo:
        raise OptionError("--demo", "cannot be combined with --checkpoints; pick one engine")
    settings = _settings(args, size=args.size, crf=args.crf, preset=args.x264_preset)
    if not args.out_dir.strip():  # "" would be the folder the command runs in, unsaid
        raise OptionError("--out-dir", "is empty; give the folder for the videos")
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise OptionError("--out-dir", f"{out_dir} is a file; give a folder for the MP4s")
    report_path = _check_json_target(args.report, "--report")
    runner = None
    if args.ray is not None:
        from studio.batch.ray_run import RaySetup, ray_runner

        runner = ray_runner(
            RaySetup(args.ray, args.actors, args.gpus_per_actor, args.cpus_per_actor)
        )
    elif (args.actors, args.gpus_per_actor, args.cpus_per_actor) != (1, None, 1.0):
        raise OptionError("--actors", "--actors and --*-per-actor need --ray")
    if args.checkpoints:  # the whole batch's engine: a wrong folder is the command's error
        from studio.models.checkpoints import discover

        discover(args.checkpoints)
    jobs = read_jobs(args.jobs, settings, args.avatar)
    check_outputs(jobs, out_dir, args.jobs, None if is_stdout(report_path) else report_path)
    options = EngineOptions(args.checkpoints, args.device, args.avatar_cache)
    for note in check_engines(jobs, options):  # as render checks its engine, once each
        print(f"studio batch: note: {note}", file=sys.stderr)
    with _progress() as progress:
        try:
            report = run_batch(
                jobs,
                out_dir,
                options,
                args.retry_failed,
                progress,
                progress.note,
                runner=runner,
                on_job=None if not progress.quiet else _failure_said,
            )
        except KeyboardInterrupt:
            progress.close(finished=False)
            print(
                f"{_after_ctrl_c()}studio batch: interrupted; the finished jobs are kept in "
                f"{out_dir} ({REPORT_FILE}): run the same command again to go on",
                file=sys.stderr,
            )
            return EXIT_CANCELLED
    if report_path is not None:
        _write_json(report_path, report)
    _print_result(summary_table(report), report_path)
    return 1 if report["summary"]["failed"] else 0


def _live_source(args: argparse.Namespace):
    """The one live input the options name (the demo speech when none is named)."""
    from studio.live import sources

    given = [
        o
        for o, on in (
            ("--audio", args.audio),
            ("--mic", args.mic),
            ("--browser-mic", args.browser_mic),
        )
        if on
    ]
    if len(given) > 1:
        raise OptionError(given[1], f"cannot be combined with {given[0]}; pick one live input")
    if args.browser_mic and not args.serve:
        raise OptionError("--browser-mic", "needs --serve (the page the browser opens)")
    fmt = sources.PcmFormat(args.pcm_rate, args.pcm_channels, args.pcm_format).check()
    if args.mic:
        return sources.MicSource(args.mic_device)
    if args.audio == "-":
        return sources.PcmSource(sys.stdin.buffer, fmt, "stdin")
    if args.audio and args.audio.startswith(("tcp:", "unix:")):
        print(f"studio live: waiting for raw PCM on {args.audio}", file=sys.stderr)
        return sources.open_socket_source(args.audio, fmt)
    if args.browser_mic:
        return None  # made with the WebRTC sink
    from studio.engines.demo import demo_audio_path

    return sources.FileSource(args.audio or str(demo_audio_path()), loop=args.loop)


def _serve_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise OptionError(
            "--serve", f"{value}: give [HOST:]PORT, e.g. 8080 or 0.0.0.0:8080"
        ) from None
    if not 0 <= number <= 65535:
        raise OptionError("--serve", f"{value}: the port must be from 0 to 65535")
    return host or "127.0.0.1", number


def _live_summary(report: dict) -> str:
    lat = report["latency_ms"]
    first = report["time_to_first_frame_ms"]
    lines = [
        f"{report['frames']} frames from {report['audio_s']:.2f} s of audio "
        f"(latency setting {report['latency_setting']}, lookahead {report['lookahead_frames']} "
        f"frames = {report['algorithmic_latency_ms']:.0f} ms)",
    ]
    if first is not None:
        lines.append(
            f"first frame after {first:.1f} ms; audio-to-frame latency p50 {lat['p50']:.0f} ms, "
            f"p95 {lat['p95']:.0f} ms, max {lat['max']:.0f} ms; late frames {report['late_frames']}"
        )
    if report.get("output"):
        lines.append(f"recorded {report['output']}")
    return "\n".join(lines)


@contextlib.contextmanager
def _stop_on_signal(stop) -> Iterator[None]:
    """The first Ctrl-C (or SIGTERM/SIGHUP) ends the live session cleanly (``stop`` set);
    a second one interrupts at once."""

    def ask_stop(signum: int, frame: object) -> None:
        if stop.is_set():
            _interrupt(signum, frame)
        stop.set()

    with handled(ask_stop):
        yield


def cmd_live(args: argparse.Namespace) -> int:
    for option in ("controls", "project"):
        if getattr(args, option, None):
            raise OptionError(f"--{option}", "is for a clip (render, analyze), not a live session")
    import threading

    from studio.live.run import run_live, session_clock, status_line
    from studio.render.stream import LiveSession, live_settings, warm_up

    settings = _settings(args, size=args.size, crf=args.crf, preset=args.x264_preset)
    settings = live_settings(settings, steps_chosen=args.steps is not None)
    outputs = {"--out": args.out} if args.out else {}
    if args.out:
        from studio.export.video import check_output_path

        check_output_path(args.out)
        _check_out_not_input(args)
    report_path = _check_json_target(args.report, "--report", {**outputs, **_inputs(args)})
    serve = _serve_address(args.serve) if args.serve else None
    sinks: list = []
    if args.virtual_camera is not None:
        from studio.live.sinks import VirtualCameraSink

        sinks.append(VirtualCameraSink(args.virtual_camera or None))
    prepared = _prepare_engine(args, settings)
    source = _live_source(args)
    try:
        with _progress() as progress:
            engine = _open_engine(prepared, progress)
        if args.out:
            from studio.live.sinks import RecordingSink

            sinks.append(RecordingSink(args.out, settings.crf, settings.preset))
        if serve is not None:
            from studio.live.webrtc import WebRTCSink

            web = WebRTCSink(*serve, browser_audio=args.browser_mic)
            sinks.append(web)
            if source is None:
                from studio.live.sources import QueueSource

                source = QueueSource(web.browser_audio())
        warm_up(engine, settings, args.latency)
        stop = threading.Event()
        session = LiveSession(engine, settings, args.latency, session_clock(source, args.realtime))

        def started() -> None:
            if serve is not None:
                print(f"studio live: open {web.url} in a browser", file=sys.stderr, flush=True)
            print(
                f"studio live: {source.name} -> frames (Ctrl-C stops)", file=sys.stderr, flush=True
            )

        def status(figures: dict) -> None:
            if not args.quiet:
                print(f"studio live: {status_line(figures)}", file=sys.stderr, flush=True)

        with _stop_on_signal(stop):
            report = run_live(
                session,
                source,
                sinks,
                realtime=args.realtime,
                stop=stop,
                duration_s=args.duration,
                on_status=status,
                on_start=started,
            )
    finally:
        if source is not None:
            source.close()
    report["output"] = args.out
    report["stopped"] = "signal" if stop.is_set() else "end of input"
    report["settings"] = settings.to_dict()
    report["engine"] = _engine_report(engine)
    if report_path is not None:
        _write_json(report_path, report)
    _print_result(_live_summary(report), report_path)
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    _open_project(args)
    settings = _settings(args)
    json_path = _check_json_target(args.json, "--json", _inputs(args))
    prepared = _prepare_engine(args, settings)
    audio = _load_audio(args)
    controls = _load_controls(args)
    from studio.render.pipeline import (  # after the inputs
        analyze,
        build_report,
        find_silence_aside,
        quality_of,
    )

    find_silence_aside(audio)  # the quality report's VAD, beside the engine and the analysis
    with _progress() as progress:
        engine = _open_engine(prepared, progress)
        result = analyze(audio, settings, engine, controls)
    timings = dict(result.timings_ms)
    timings["total"] = (time.perf_counter() - started) * 1000.0
    report = build_report(result, timings, rendered=False)
    report["rendered_frames"] = int(result.plan.keyframes.size)
    from studio.runtime.base import peak_memory_mb

    report["peak_memory_mb"] = peak_memory_mb()
    report["audio"] = audio.path
    report["settings"] = settings.to_dict()
    report["quality"] = quality_of(result, engine)
    if controls:
        report["controls"] = controls.to_dict()
    report["strides"] = result.plan.strides.tolist()
    report["keyframes"] = result.plan.keyframes.tolist()
    if json_path is not None:
        _write_json(json_path, report)
    _print_result(_summary(report), json_path)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from studio.doctor import collect, format_text

    found = None
    if args.checkpoints is not None:
        from studio.models.checkpoints import discover

        found = discover(args.checkpoints)  # InputError for a bad folder, before any probing
    info = collect()
    if found is not None:
        info["checkpoints"] = found.to_dict()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_text(info))
        if found is not None:
            print(found.report())
    return 0


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _export_table(summary: dict) -> str:
    """The verification table of `studio export-onnx`: one row per network output."""
    lines = [
        f"ONNX export of {summary['checkpoints']} -> {summary['out_dir']} "
        f"(opset {summary['opset']})",
        f"  {'network':<21} {'output':<11} {'shape':<17} {'rel L2':>9}  result",
    ]
    for name, r in summary["networks"].items():
        if r["status"] == "missing":
            lines.append(f"  {name:<21} not exported: {r['checkpoint']} is missing")
            continue
        for i, o in enumerate(r["outputs"]):
            err = r["parity"].get(o["name"])
            rel = f"{err:9.2e}" if err is not None else f"{'-':>9}"
            verdict = "not verified" if err is None else "ok" if err <= r["tolerance"] else "FAILED"
            shape = "x".join(map(str, o["shape"]))
            lines.append(
                f"  {name if i == 0 else '':<21} {o['name']:<11} {shape:<17} {rel}  {verdict}"
            )
        where = r["onnx_file"] if r["ok"] else "not written"
        lines.append(
            f"  {'':<21} -> {where} ({_size(r['bytes'])}, export {r['export_s']:.1f} s, "
            f"verify {r['verify_s']:.1f} s)"
        )
    bad = [n for n, r in summary["networks"].items() if not r["ok"]]
    lines.append(
        f"FAILED: {', '.join(bad)} (ONNX Runtime differs from torch beyond the tolerance)"
        if bad
        else "all exported networks match torch within the tolerance"
        if any(r["parity"] for r in summary["networks"].values() if r["status"] != "missing")
        else "exported (not verified)"
    )
    return "\n".join(lines)


def cmd_export_onnx(args: argparse.Namespace) -> int:
    from studio.models.onnx_export import check_opset, export_onnx

    check_opset(args.opset, "--opset")
    json_path = _check_json_target(args.json, "--json", {"--checkpoints": args.checkpoints})
    with _progress() as progress:
        summary = export_onnx(
            args.checkpoints,
            args.out,
            networks=args.networks,
            opset=args.opset,
            verify=not args.no_verify,
            progress=progress,
        )
    if json_path is not None:
        _write_json(json_path, summary)
    _print_result(_export_table(summary), json_path)
    return 0 if summary["ok"] else 1


def cmd_compile(args: argparse.Namespace) -> int:
    from studio.runtime.compile_cli import run

    if args.runtime == "torch":
        return _compile_torch(args)
    return run(args)


def _compile_torch(args: argparse.Namespace) -> int:
    """`studio compile --runtime torch`: the compiled render engines, built ahead."""
    from studio.engines.ditto.prebuild import prebuild
    from studio.settings import RenderSettings

    json_out = _check_json_target(args.json, "--json", {"--checkpoints": args.checkpoints})
    values = {"compile": True, "precision": args.precision or "auto"}
    if args.batch is not None:
        values["batch"] = args.batch
    settings = RenderSettings(**values)
    with _progress() as progress:
        summary = prebuild(args.checkpoints, settings, args.device, progress)
    if json_out is not None:
        _write_json(json_out, summary)
    _print_result(
        f"compiled render engines for batches {', '.join(map(str, summary['batches']))} on "
        f"{summary['device']} ({', '.join(summary['packages'])}) in {summary['folder']}",
        json_out,
    )
    return 0


def _qt_platform(env: MutableMapping[str, str], screenshot: bool, platform: str) -> None:
    """Without a display on Linux Qt aborts the process: a screenshot runs offscreen instead,
    and the window itself is a clear error."""
    if not platform.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return
    if screenshot:
        env["QT_QPA_PLATFORM"] = "offscreen"
        return
    raise StudioError(
        "no display found (DISPLAY and WAYLAND_DISPLAY are unset): run the studio in a desktop "
        "session, or use studio render / --screenshot without one"
    )


def cmd_gui(args: argparse.Namespace) -> int:
    from studio.gui.app import run

    size = None
    if args.window_size:
        try:
            w, h = (int(v) for v in args.window_size.lower().split("x"))
        except ValueError:
            raise OptionError(
                "--window-size", f"must look like 1600x1000, got {args.window_size}"
            ) from None
        size = (w, h)
    for option, path in (("--audio", args.audio), ("--avatar", args.avatar)):
        if path and not Path(path).exists():
            raise InputError(f"{option} {path}: no such file; check the path")
    _qt_platform(os.environ, bool(args.screenshot), sys.platform)
    return run(audio=args.audio, avatar=args.avatar, screenshot=args.screenshot, size=size)


def cmd_bench(argv: list[str]) -> int:
    """`studio bench --suite NAME [suite options]`: NAME from ``studio.bench.SUITES`` or all.

    The dispatch table (suite name -> module with ``main(argv)``) lives in ``studio.bench``;
    the suite parses the rest of the command line.
    """
    from studio.bench import main as bench_main

    return bench_main(argv)


_SIGNALLED: list[int] = []  # the signals caught during this run of main


IMPORT_WAIT_S = 3.0  # the longest a signal waits for an import to end before it acts anyway
_HELD: dict[str, Any] = {}  # a signal waiting for an import: since, token, resent (a flag)


def _interrupt(signum: int, frame: Any) -> None:
    again = _HELD.pop("resent", False)  # our own re-send, not another signal from outside
    waited = time.monotonic() - _HELD.get("since", time.monotonic())
    if _importing(frame) and ("since" not in _HELD or again) and waited < IMPORT_WAIT_S:
        # raised inside a module being imported, the interrupt can leave a library half set
        # up for good (an abort in a C extension's start, a wrong error later): it is sent
        # again in a moment, until the import is over; a second one from outside, or an
        # import that takes longer than IMPORT_WAIT_S, ends the command at once
        _HELD.setdefault("since", time.monotonic())
        _again_soon(signum)
        return
    _HELD.clear()
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _importing(frame: Any) -> bool:
    """Whether ``frame`` (the main thread's, where a signal landed) runs inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int, delay_s: float = 0.02) -> None:
    """``signum`` to this process in ``delay_s``, unless the wait was given up meanwhile."""
    import threading

    token = object()
    _HELD["token"] = token

    def resend() -> None:
        if _HELD.get("token") is token:
            _HELD["resent"] = True
            os.kill(os.getpid(), signum)

    timer = threading.Timer(delay_s, resend)
    timer.daemon = True
    timer.start()


# commands that end without the interpreter's teardown when run as the process (heavy
# imports, every output closed by then); the GUI (Qt's settings) and live sessions do not
QUICK_EXIT = frozenset({"render", "batch", "compile"})


def _end_now(status: int) -> NoReturn:
    """End the process at once with ``status``, the standard streams flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _exit_quietly(_signum: int, _frame: object) -> None:
    """After ``main`` returned, at the process's end: a signal ends it at once, quietly."""
    _end_now(EXIT_CANCELLED)


def _catch_signals() -> Callable[[bool], None]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt from now on, so that a kill or a
    closed terminal ends a command as Ctrl-C does (outputs cleaned up, one line, status 130).
    A signal ignored by the parent (``nohup``, a background job) stays ignored. Returns the
    undo: the previous handlers back, or (``owner``: the process's own entry point) handlers
    that end the exiting process quietly."""
    import signal

    stack = contextlib.ExitStack()
    caught = stack.enter_context(handled(_interrupt))  # an inherited ignore: respected

    def restore(owner: bool) -> None:
        _HELD.clear()  # a signal still waiting for an import is not sent into the caller
        stack.close()
        for sig in caught if owner else ():
            signal.signal(sig, _exit_quietly)

    return restore


_VALUE_OPTIONS = ("--cache-dir", "--print-completion")  # the top-level options taking a value


def _command_of(argv: list[str]) -> tuple[str, int | None]:
    """The command named on the line and its index, top-level options skipped (``gui`` and
    None when there is none)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            return arg, i
        if "=" not in arg and arg.startswith("--") and len(arg) > 2:
            if any(option.startswith(arg) for option in _VALUE_OPTIONS):
                i += 1  # its value
        i += 1
    return "gui", None


class _RecentRecords(logging.Handler):
    """The last log records of the run, every level, for the log file of an internal error."""

    def __init__(self, capacity: int = 500) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=capacity)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never break the work
            self.handleError(record)


def _label(command: str) -> str:
    return f"studio {command}" if command in COMMANDS else "studio"


def _type_name(e: BaseException) -> str:
    t = type(e)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _write_error_log(
    command: str, e: BaseException, argv: list[str], recent: _RecentRecords | None
) -> str:
    """The traceback of ``e`` in a new log file (:func:`studio.paths.write_log`), with the
    command line, versions and the run's last log records; its path, or why none was
    written."""
    import platform
    import traceback

    from studio.paths import write_log

    lines = [
        f"studio {__version__}: internal error in `{_label(command)}`",
        "command: " + " ".join(["studio", *argv]),
        f"python: {sys.version.split()[0]} on {platform.platform()}",
        f"time: {time.strftime('%Y-%m-%d %H:%M:%S %z')}",
        "",
    ]
    if recent is not None and recent.lines:
        lines += ["last log records:", *recent.lines, ""]
    text = "\n".join(lines) + "".join(traceback.format_exception(e)).rstrip("\n") + "\n"
    try:
        return f"details in {write_log('studio-error', text)}"
    except OSError as err:
        return f"no log file could be written ({err.strerror or err})"


def _internal_error(
    command: str, e: BaseException, argv: list[str], recent: _RecentRecords | None
) -> int:
    """One line for an unexpected exception, its traceback in a log file; status 1."""
    first = (str(e).strip().splitlines() or [""])[0]
    if len(first) > 200:
        first = first[:199] + "…"
    what = f"{_type_name(e)}: {first}" if first else _type_name(e)
    where = _write_error_log(command, e, argv, recent)
    print(f"{_label(command)}: internal error: {what} — {where}", file=sys.stderr)
    return EXIT_INTERNAL


def _failed(command: str, e: Exception, argv: list[str], recent: _RecentRecords | None) -> int:
    """The end of a command that raised ``e``: one line on stderr; the exit status."""
    if isinstance(e, StudioError):
        print(f"{_label(command)}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(e, Cancelled):
        print(f"{_label(command)}: cancelled; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
    return _internal_error(command, e, argv, recent)


@contextlib.contextmanager
def _console(
    args: argparse.Namespace, command: str, argv: list[str], recent: _RecentRecords
) -> Iterator[None]:
    """While a command runs: the cache root of ``--cache-dir`` (and torch.compile's caches
    under it), the ``studio`` log records kept for an error's log file, notices on stderr at
    the level ``-v``/``-q`` ask (the GUI shows its own), progress silenced by ``-q``, and
    worker threads' unexpected exceptions reported like the command's own. All put back
    after."""
    import threading

    from studio import paths
    from studio.progress import quiet, show_notices

    blocker = None if args.cache_dir is None else file_in_the_way(args.cache_dir)
    if blocker is not None:
        root = Path(args.cache_dir).expanduser().absolute()
        where = "is a file" if blocker == root else f"is under a file ({blocker})"
        raise OptionError("--cache-dir", f"{args.cache_dir} {where}; give a folder")
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    log = logging.getLogger("studio")
    before_level, before_hook = log.level, threading.excepthook
    kept = (paths.CACHE_ENV, *paths.COMPILED_ENVS)
    before_env = {k: os.environ.get(k) for k in kept}

    def thread_failed(info: threading.ExceptHookArgs) -> None:
        if info.exc_value is not None and not isinstance(info.exc_value, SystemExit):
            _internal_error(command, info.exc_value, argv, recent)

    log.setLevel(logging.DEBUG)
    log.addHandler(recent)
    threading.excepthook = thread_failed
    try:
        with (
            paths.use_cache_root(args.cache_dir),
            quiet(bool(args.quiet)),
            show_notices(sys.stderr, level=level) if command != "gui" else contextlib.nullcontext(),
        ):
            paths.place_compiled_caches()
            yield
    finally:
        threading.excepthook = before_hook
        log.removeHandler(recent)
        log.setLevel(before_level)
        for k, v in before_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The parsed line, and for ``bench`` the rest of it, which the suites parse."""
    parser = build_parser()
    command, at = _command_of(argv)
    head, rest = argv, []
    if command == "bench" and at is not None:
        head, rest = argv[: at + 1], argv[at + 1 :]
    args = parser.parse_args(head)
    if args.command is None:  # the window is the default command
        args = parser.parse_args([*head, "gui"])
    if args.verbose and args.quiet:
        parser.error("-v and -q cannot be combined")
    return args, rest


def _run(argv: list[str], command: str) -> int:
    """Parse, then run the command inside :func:`_console`; every exception becomes one line
    (:func:`_failed`). argparse's own exits (errors, --help) pass."""
    recent = _RecentRecords()
    try:
        args, rest = _parse(argv)
        with _console(args, command, argv, recent):
            try:
                if command == "bench":
                    return cmd_bench(rest)
                handler = {
                    "render": cmd_render,
                    "batch": cmd_batch,
                    "live": cmd_live,
                    "analyze": cmd_analyze,
                    "doctor": cmd_doctor,
                    "export-onnx": cmd_export_onnx,
                    "compile": cmd_compile,
                    "gui": cmd_gui,
                }[args.command]
                return handler(args)
            except Exception as e:  # inside: the log file follows --cache-dir
                return _failed(command, e, argv, recent)
    except Exception as e:  # noqa: BLE001 - parsing or setting up: the same last line
        return _failed(command, e, argv, recent)


def main(argv: list[str] | None = None) -> int:
    """The `studio` command; returns the exit status (0 done, 1 a failed check or an
    internal error, 2 a user error, 130 interrupted). Signal handlers come first, before any
    heavy import; called without ``argv`` (the process's entry point) they stay for the
    process's end, else the previous ones come back."""
    restore = _catch_signals()
    owner, command, status = argv is None, "studio", EXIT_CANCELLED
    _SIGNALLED.clear()
    try:
        try:
            argv = sys.argv[1:] if argv is None else list(argv)
            command = _command_of(argv)[0]
            status = _profiled(_run, argv, command)
        except KeyboardInterrupt:
            print(
                f"{_after_ctrl_c()}{_label(command)}: interrupted; nothing was written",
                file=sys.stderr,
            )
    except KeyboardInterrupt:  # a second signal while the first was being reported
        pass
    finally:
        restore(owner)
    if owner and _SIGNALLED:
        # A KeyboardInterrupt that passed through C code while a module was importing can
        # leave CPython set to kill itself with SIGINT at exit (status -2, not ours): the
        # outputs are cleaned up by now, so end here.
        _end_now(status)
    if owner and command in QUICK_EXIT and _only_daemon_threads():
        _end_without_teardown(status)
    return status


PROFILE_ENV = "STUDIO_PROFILE"  # a path: the command's main thread profiled into it (pstats)


def _profiled(run: Callable[[list[str], str], int], argv: list[str], command: str) -> int:
    """``run(argv, command)``, under cProfile when ``STUDIO_PROFILE`` names a file: the
    profile is written there at the command's end (also when it fails), since a render's
    process ends without the interpreter's teardown, where ``python -m cProfile`` writes."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        return run(argv, command)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(run, argv, command)
    finally:
        profiler.dump_stats(path)


def _only_daemon_threads() -> bool:
    """Whether every thread but this one is a daemon (nothing the exit would wait for)."""
    import threading

    main = threading.main_thread()
    return all(t.daemon or t is main for t in threading.enumerate())


def _end_without_teardown(status: int) -> NoReturn:
    """End a finished command's process without the interpreter's teardown: the exit
    handlers run (logging flushed, a local Ray instance stopped, compile workers ended), the
    streams are flushed, then the process ends. What is skipped is every module and object
    freed one by one, and torch's and CUDA's own teardown: about half a second on the CPU
    with torch loaded (``studio bench --suite warmstart``'s ``exit``), more on a GPU."""
    import atexit

    atexit._run_exitfuncs()
    _end_now(status)
