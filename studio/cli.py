"""The `studio` command: gui (default), render, analyze, doctor, export-onnx.

User errors (bad files, bad options, unwritable outputs) print one line on
stderr and exit with status 2; nothing is left half-written. Inputs are checked before any
work, in the order a user fixes them: options, outputs, the checkpoint folder, the avatar,
the device, the audio. Long work shows its stages on stderr (:mod:`studio.progress`: bars
on a terminal, one line per stage start and end otherwise), and notices such as a large
file about to be written to a cache appear there too; stdout carries the results only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import NoReturn

from studio import __version__
from studio.errors import Cancelled, InputError, OptionError, OutputError, StudioError
from studio.files import check_writable_folder, write_atomic

EXIT_USAGE = 2
EXIT_CANCELLED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line, naming the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _motion_options(p: argparse.ArgumentParser) -> None:
    from studio.motion.kinematics import DEFAULT_ACCEL_LIMIT, DEFAULT_ORDER, DEFAULT_WINDOW

    g = p.add_argument_group("motion")
    g.add_argument("--audio", metavar="FILE", help="speech to animate (WAV/FLAC/OGG/MP3, any rate)")
    g.add_argument(
        "--demo",
        action="store_true",
        help="use the built-in demo engine (the default "
        "when no checkpoints are given) and, without --audio, the demo speech",
    )
    g.add_argument("--preset", metavar="FILE", help="load settings from a JSON preset first")
    g.add_argument(
        "--smooth-window",
        type=int,
        metavar="N",
        help=f"Savitzky-Golay window, odd >= 3 (default {DEFAULT_WINDOW})",
    )
    g.add_argument(
        "--smooth-order",
        type=int,
        metavar="K",
        help=f"Savitzky-Golay polynomial order (default {DEFAULT_ORDER})",
    )
    g.add_argument(
        "--accel-limit",
        type=float,
        metavar="A",
        help=f"pose acceleration bound, degrees/frame² (default {DEFAULT_ACCEL_LIMIT})",
    )
    g.add_argument("--no-smooth", action="store_true", help="turn pose smoothing off")
    g.add_argument(
        "--stride",
        choices=("auto", "1", "2", "3"),
        help="render cadence: auto (from the speech) or a fixed stride (default auto)",
    )
    g.add_argument("--seed", type=int, help="random seed of the motion generator (default 0)")
    _ditto_options(p)


def _ditto_options(p: argparse.ArgumentParser) -> None:
    from studio.layout import DEFAULT_SAMPLING_STEPS, EMOTIONS
    from studio.settings import FRAMES, MEMORY_MODES, PRECISIONS

    g = p.add_argument_group("Ditto engine (with --checkpoints)")
    g.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="Ditto's checkpoint folder (holding ditto_pytorch/): selects the Ditto engine",
    )
    g.add_argument("--avatar", metavar="IMAGE", help="the face to animate (PNG/JPEG)")
    g.add_argument(
        "--emotion",
        type=int,
        metavar="N",
        help="emotion label: "
        + ", ".join(f"{i} {n}" for i, n in enumerate(EMOTIONS))
        + " (default 4)",
    )
    for axis in ("pitch", "yaw", "roll"):
        g.add_argument(
            f"--delta-{axis}", type=float, metavar="DEG", help=f"add DEG degrees of {axis}"
        )
    g.add_argument(
        "--steps",
        type=int,
        metavar="T",
        help=f"DDIM sampling steps of the motion model (default {DEFAULT_SAMPLING_STEPS})",
    )
    g.add_argument(
        "--memory",
        metavar="MODE",
        help=f"{'|'.join(MEMORY_MODES)}: keep a batch's tensors on the GPU, or stream them "
        "through pinned host buffers; auto picks from free VRAM (default auto)",
    )
    g.add_argument("--batch", type=int, metavar="N", help="frames per batch (default: automatic)")
    g.add_argument(
        "--precision",
        metavar="P",
        help=f"warp/decoder precision: {'|'.join(PRECISIONS)} (default auto: fp16 on a GPU)",
    )
    g.add_argument(
        "--frame",
        metavar="KIND",
        help=f"{'|'.join(FRAMES)}: the avatar image with the face pasted back (default), "
        "or the 512² face crop resized to --size",
    )
    g.add_argument(
        "--runtime",
        metavar="NAME",
        help="engine backend of warp + decoder: torch (default), onnxruntime or tensorrt "
        "(`studio doctor` says which run here)",
    )
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
        help="where registered avatars are kept (default ~/.cache/talkinghead-studio/avatars)",
    )


def build_parser() -> argparse.ArgumentParser:
    from studio.runtime.compile_cli import add_arguments as _compile_arguments
    from studio.runtime.compile_cli import add_folder_options

    parser = _Parser(prog="studio", description="Talking-head preview studio.")
    parser.add_argument("--version", action="version", version=f"studio {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    r = sub.add_parser(
        "render",
        help="render an MP4 (H.264 + AAC)",
        description="Render a talking-head MP4 from speech.",
    )
    _motion_options(r)
    r.add_argument("--out", required=True, metavar="OUT.mp4", help="output video")
    r.add_argument("--size", type=int, metavar="PX", help="output square side (default 512)")
    r.add_argument("--crf", type=int, help="H.264 quality, 0..51, lower is better (default 18)")
    r.add_argument(
        "--x264-preset",
        dest="x264_preset",
        metavar="NAME",
        help="x264 speed preset (default medium)",
    )
    r.add_argument("--report", metavar="REPORT.json", help="write the JSON report here")

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
        help="build TensorRT engines for Ditto's networks (cached, rebuilt when stale)",
        description="Build TensorRT engines from ditto_onnx/ or from ONNX exported from "
        "ditto_pytorch/, with per-network precision, a timing cache, and an engine cache that "
        "rebuilds stale engines (other GPU, TensorRT version, precision or ONNX) instead of "
        "failing. Needs tensorrt (pip install 'talkinghead-studio[trt]').",
    )
    _compile_arguments(c)

    g = sub.add_parser(
        "gui", help="open the studio window (the default)", description="Open the studio window."
    )
    g.add_argument("--audio", metavar="FILE", help="open on this speech")
    g.add_argument("--avatar", metavar="FILE", help="open on this avatar image or folder")
    g.add_argument(
        "--screenshot",
        metavar="FILE.png",
        help="save a screenshot of the window after the first render, then exit",
    )
    g.add_argument("--window-size", metavar="WxH", help="initial window size, e.g. 1600x1000")
    return parser


def _settings(args: argparse.Namespace, **extra):
    from dataclasses import replace

    from studio.settings import RenderSettings

    base = RenderSettings.load(args.preset) if args.preset else RenderSettings()
    given = {
        "smooth_window": args.smooth_window,
        "smooth_order": args.smooth_order,
        "accel_limit": args.accel_limit,
        "stride": args.stride,
        "seed": args.seed,
        "emotion": args.emotion,
        "delta_pitch": args.delta_pitch,
        "delta_yaw": args.delta_yaw,
        "delta_roll": args.delta_roll,
        "steps": args.steps,
        "memory": args.memory,
        "batch": args.batch,
        "precision": args.precision,
        "frame": args.frame,
        "compile": args.compile,
        "runtime": args.runtime,
        **extra,
    }
    if args.checkpoints:  # the engine that runs on a checkpoint folder
        from studio.render.engines import ENGINES, capabilities

        given["backend"] = next(n for n in ENGINES if capabilities(n).needs_checkpoints)
    values = {k: v for k, v in given.items() if v is not None}
    if args.no_smooth:
        values["smooth"] = False
    return replace(base, **values).validate()


def _load_audio(args: argparse.Namespace):
    from studio.audio.io import load_audio
    from studio.engines.demo.engine import demo_audio_path

    return load_audio(args.audio if args.audio else demo_audio_path())


def _check_json_target(
    path: str | None, option: str, others: dict[str, str | None] | None = None
) -> Path | None:
    """The JSON target of ``option``, checked before any work: not a folder, in a folder that
    exists and takes files, and not one of the ``others`` (option -> path: the command's
    inputs and outputs, which the report would overwrite)."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{option} {p}: is a directory; give a file name ending in .json")
    if not p.parent.exists() or not p.parent.is_dir():
        raise OutputError(f"{option} {p}: the folder {p.parent} does not exist; create it first")
    for other, value in (others or {}).items():
        if value and Path(value).resolve() == p.resolve():
            raise OutputError(
                f"{option} {p}: is also the {other} file and would be overwritten; "
                "give the report a name of its own"
            )
    check_writable_folder(p.parent, option)
    return p


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The command's input files by option (a report must not overwrite them)."""
    return {"--audio": args.audio, "--avatar": getattr(args, "avatar", None)}


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def _progress():
    """The stage progress shown on stderr (bars on a terminal, plain lines otherwise)."""
    from studio.progress import StageProgress

    return StageProgress(sys.stderr)


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
        f"rendered {report['rendered_frames']} ({100 * report['rendered_fraction']:.0f}%)",
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
    request = EngineRequest(
        settings, args.checkpoints, args.avatar, args.device, args.avatar_cache
    )
    prepared = prepare_engine(request)
    notes = prepared.notes
    if args.command == "analyze" and settings.compile:  # renders nothing: say that instead
        notes = (
            *(n for n in notes if not n.startswith("--compile")),
            "--compile is ignored by analyze, which renders no frames",
        )
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
    from studio.export.video import check_output_path
    from studio.render.pipeline import analyze, render_video

    started = time.perf_counter()
    settings = _settings(args, size=args.size, crf=args.crf, preset=args.x264_preset)
    out = check_output_path(args.out)
    report_path = _check_json_target(args.report, "--report", {"--out": args.out, **_inputs(args)})
    prepared = _prepare_engine(args, settings)
    audio = _load_audio(args)
    with _progress() as progress:
        engine = _open_engine(prepared, progress)
        result = analyze(audio, settings, engine)
        renderer = engine.renderer(settings)
        # export/compile/capture before the first frame, as a stage of its own
        renderer.build_engines(int(result.plan.keyframes.size), progress)
        report = render_video(
            result, renderer, str(out), settings, progress=progress, started=started
        )
    report["audio"] = audio.path
    report["settings"] = settings.to_dict()
    report["engine"] = _engine_report(engine)
    if report_path is not None:
        _write_json(report_path, report)
    print(_summary(report))
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from studio.render.pipeline import analyze, build_report

    started = time.perf_counter()
    settings = _settings(args)
    json_path = _check_json_target(args.json, "--json", _inputs(args))
    prepared = _prepare_engine(args, settings)
    audio = _load_audio(args)
    with _progress() as progress:
        result = analyze(audio, settings, _open_engine(prepared, progress))
    timings = dict(result.timings_ms)
    timings["total"] = (time.perf_counter() - started) * 1000.0
    report = build_report(result, timings, rendered=False)
    report["rendered_frames"] = int(result.plan.keyframes.size)
    report["audio"] = audio.path
    report["settings"] = settings.to_dict()
    report["strides"] = result.plan.strides.tolist()
    report["keyframes"] = result.plan.keyframes.tolist()
    if json_path is not None:
        _write_json(json_path, report)
    print(_summary(report))
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
    json_path = _check_json_target(args.json, "--json")
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
    print(_export_table(summary))
    return 0 if summary["ok"] else 1


def cmd_compile(args: argparse.Namespace) -> int:
    from studio.runtime.compile_cli import run

    return run(args)


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


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _stop_on_signals(active: bool) -> Iterator[None]:
    """While ``active``: SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT does, so that
    the writers' clean-up (partial MP4, JSON) runs for a kill or a closed terminal too. The
    previous handlers come back after."""
    import signal
    import threading

    names = [n for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {n: signal.signal(getattr(signal, n), _interrupt) for n in names}
    try:
        yield
    finally:
        for n, handler in before.items():
            signal.signal(getattr(signal, n), handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the suites parse their own options
        command, args = "bench", argv[1:]
    else:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = args.command or "gui"
        if args.command is None:
            args = parser.parse_args(["gui"])
    handler = {
        "bench": cmd_bench,
        "render": cmd_render,
        "analyze": cmd_analyze,
        "doctor": cmd_doctor,
        "export-onnx": cmd_export_onnx,
        "compile": cmd_compile,
        "gui": cmd_gui,
    }[command]
    from studio.progress import show_notices

    try:
        # a kill ends like Ctrl-C (partial outputs removed); the GUI has Qt's own handling;
        # notices logged by the work (large cache writes) appear on stderr
        with (
            _stop_on_signals(command != "gui"),
            show_notices(sys.stderr) if command != "gui" else contextlib.nullcontext(),
        ):
            return handler(args)
    except (InputError, OutputError, StudioError) as e:
        print(f"studio {command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Cancelled:
        print(f"studio {command}: cancelled; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
    except KeyboardInterrupt:
        print(f"\nstudio {command}: interrupted; nothing was written", file=sys.stderr)
        return EXIT_CANCELLED
