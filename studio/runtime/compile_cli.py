"""`studio compile`: TensorRT engines for Ditto's networks, cached and rebuilt when stale.

    studio compile --checkpoints DIR --out DIR [--precision lmdm=fp16,decoder=fp16,...]
                   [--networks a,b] [--batch N] [--opt-level N] [--workspace-gb G]
                   [--plugin PATH] [--typing auto|strong|weak] [--device cuda:N] [--force]

For each network the ONNX graph comes from ``ditto_onnx/`` when it fits (batch 1, an fp32
graph; the warp network's only with ``--plugin``, its graph using the GridSample3D op),
else it is exported from ``ditto_pytorch/`` into ``OUT/onnx/`` (static batch, and for
strongly typed fp16/bf16 engines a typed half graph). Engines are written as
``OUT/<stem>_<precision>.engine`` with ``<engine>.json`` beside them (the cache key); the
timing cache is ``OUT/timing.cache``. An engine that is current is kept; one that is stale
(another GPU, TensorRT version, precision, ONNX file or builder settings) is rebuilt with a
message. Every argument is checked before TensorRT is imported (``--json`` too: ``-`` is
stdout, and then the summary goes to stderr); without TensorRT the command exits with status 2
and says how to install it. The builds are one stage of :mod:`studio.progress` (a bar on a
terminal, a line per network otherwise); the builder's messages appear above it.

Importing this module is light (no torch, no tensorrt), so ``studio --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "add_folder_options", "run"]


def add_folder_options(
    p: argparse.ArgumentParser, holding: str, written: str, required_out: bool = True
) -> None:
    """The folders `studio compile` and `studio export-onnx` both require: the checkpoint
    folder (``holding`` these) and the output folder (for the ``written`` files)."""
    p.add_argument(
        "--checkpoints",
        required=True,
        metavar="DIR",
        help=f"Ditto's checkpoint folder (holding {holding})",
    )
    p.add_argument("--out", required=required_out, metavar="DIR", help=f"folder for the {written}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `studio compile`."""
    add_folder_options(
        p, "ditto_pytorch/ and/or ditto_onnx/", "engines (TensorRT)", required_out=False
    )
    p.add_argument(
        "--runtime",
        choices=("tensorrt", "torch"),
        default="tensorrt",
        help="tensorrt: TensorRT engines in --out (the default); torch: the compiled render "
        "engines `--compile` uses (AOTInductor packages, or Inductor's standalone artifacts "
        "where this torch cannot load packages, in the cache root's compiled/aot), "
        "for the render batch (--batch; default: the renderer's own), then the small batches "
        "of short calls (for batch 32: 1, 2, 4); --precision then takes auto, fp32, fp16 or "
        "bf16",
    )
    p.add_argument(
        "--precision",
        metavar="SPEC",
        help="per-network precision over the released defaults (hubert, lmdm, motion_extractor "
        "fp32; the rest fp16), e.g. lmdm=fp16,decoder=fp16, or one precision for all: "
        "fp32|tf32|fp16|bf16|fp8|int8 (fp8/int8 need nvidia-modelopt)",
    )
    p.add_argument(
        "--networks",
        metavar="A,B",
        help="subset of appearance_extractor, motion_extractor, warp_network, decoder, "
        "stitch_network, lmdm, hubert (default: every one present)",
    )
    p.add_argument(
        "--batch",
        type=int,
        metavar="N",
        help="static batch (TensorRT: default 1; torch: the render batch, default automatic)",
    )
    p.add_argument(
        "--opt-level",
        type=int,
        default=5,
        metavar="N",
        help="TensorRT builder optimization level 0..5 (default 5, as Ditto's build)",
    )
    p.add_argument(
        "--workspace-gb",
        type=float,
        default=8.0,
        metavar="G",
        help="builder workspace limit in GiB (default 8)",
    )
    p.add_argument(
        "--plugin",
        metavar="PATH",
        help="the GridSample3D plugin library (Ditto's libgrid_sample_3d_plugin.so), needed "
        "for the warp network on TensorRT < 11.2",
    )
    p.add_argument(
        "--typing",
        default="auto",
        metavar="MODE",
        help="auto|strong|weak: strongly typed networks from typed graphs (the default; the "
        "only mode of TensorRT 11), or fp16/bf16 builder flags (TensorRT 10 only, "
        "deprecated there since 10.12)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE.npz",
        help="fp8/int8 calibration inputs (arrays named like the network inputs)",
    )
    p.add_argument(
        "--hardware-compat",
        action="store_true",
        help="build Ampere-plus compatible engines (run on sm 8.0 and newer, somewhat slower)",
    )
    p.add_argument(
        "--device", default="cuda", metavar="DEV", help="cuda or cuda:N (both runtimes build on it)"
    )
    p.add_argument("--force", action="store_true", help="rebuild even current engines")
    p.add_argument("--json", metavar="OUT.json", help="also write the summary here (- for stdout)")


def _networks(text: str | None) -> list[str] | None:
    from studio.errors import OptionError
    from studio.runtime.precision import ENGINE_NETWORKS, NETWORK_ALIASES

    if text is None:
        return None
    names: list[str] = []
    for part in text.split(","):
        if not part.strip():
            continue
        name = NETWORK_ALIASES.get(part.strip(), part.strip())
        if name not in ENGINE_NETWORKS:
            raise OptionError(
                "--networks",
                f"unknown network {part.strip()!r} (one of {', '.join(ENGINE_NETWORKS)})",
            )
        if name not in names:
            names.append(name)
    if not names:
        raise OptionError("--networks", "names no network")
    return names


def _available(found: Any, name: str) -> dict[str, Path | None]:
    """The .pth and released ONNX of one network (None where absent)."""
    from studio.errors import InputError

    out: dict[str, Path | None] = {"pytorch": None, "onnx": None}
    for layout in ("pytorch", "onnx"):
        try:
            out[layout] = found.path(name, layout)
        except (InputError, ValueError):
            pass
    return out


def _source(
    name: str,
    files: dict[str, Path | None],
    graph: str,
    batch: int,
    plugin: bool,
    onnx_dir: Path,
    device: Any,
    log: Any,
) -> tuple[Path, str]:
    """(the ONNX file to build from, where it came from)."""
    from studio.errors import InputError

    released = files["onnx"]
    pth = files["pytorch"]
    if name == "hubert":  # ONNX only: ditto_onnx/hubert.onnx or the PyTorch release's aux model
        path = released or pth
        if path is None:
            raise InputError("hubert: no hubert.onnx / hubert_streaming_fix_kv.onnx found")
        return path, "released"
    fits = batch == 1 and graph == "fp32" and (name != "warp_network" or plugin)
    if released is not None and (fits or pth is None):
        if not fits:
            raise InputError(
                f"{name}: only {released.name} is present, and it cannot make this engine "
                f"(batch {batch}, {graph} graph): put ditto_pytorch/ beside it to export one"
            )
        return released, "released"
    if pth is None:
        raise InputError(f"{name}: neither its .pth nor its ditto_onnx file is present")
    from studio.models import load_network
    from studio.runtime.onnx_cache import export_for_engine, export_purpose

    module = load_network(name, pth)
    with export_purpose("TensorRT"):  # the notice says what the file is for
        path = export_for_engine(
            name, module, onnx_dir, batch=batch, precision=graph, device=device, log=log
        )
    return path, "exported"


def run(args: argparse.Namespace) -> int:
    """`studio compile`; returns the exit status (StudioErrors propagate to the CLI)."""
    from studio.errors import InputError, OptionError, OutputError
    from studio.files import check_output_file, is_stdout, write_json
    from studio.models.checkpoints import discover
    from studio.runtime.precision import ENGINE_NETWORKS, parse_precision
    from studio.runtime.tensorrt.support import BuildSettings

    # 1. Arguments, before anything heavy.
    found = discover(args.checkpoints)
    if args.out is None:
        raise OptionError("--out", "TensorRT engines need a folder: give --out DIR")
    args.batch = 1 if args.batch is None else args.batch
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a folder")
    inputs = {"--checkpoints": args.checkpoints, "--plugin": args.plugin}
    json_out = check_output_file(args.json, "--json", {**inputs, "--calibration": args.calibration})
    if not isinstance(args.batch, int) or args.batch < 1:
        raise OptionError("--batch", f"must be a positive integer, got {args.batch}")
    settings = BuildSettings(
        opt_level=args.opt_level,
        workspace_gb=args.workspace_gb,
        typing=args.typing,
        hardware_compat=bool(args.hardware_compat),
        plugin=str(Path(args.plugin).expanduser()) if args.plugin else None,
        timing_cache=str(out / "timing.cache"),
        calibration=args.calibration,
    ).validate()
    wanted = _networks(args.networks)
    plan = parse_precision(args.precision)
    files = {n: _available(found, n) for n in ENGINE_NETWORKS}
    present = [n for n in ENGINE_NETWORKS if any(files[n].values())]
    if wanted is not None:
        absent = [n for n in wanted if n not in present]
        if absent:
            raise InputError(
                f"{found.root} holds no .pth or ONNX file for {', '.join(absent)} "
                "(`studio doctor --checkpoints DIR` lists what is there)"
            )
    names = wanted or present
    if not names:
        raise InputError(
            f"{found.root} holds none of Ditto's networks (ditto_pytorch/, ditto_onnx/)"
        )

    # 2. TensorRT and the GPU.
    from studio.runtime.tensorrt.cache import engine_stem, ensure_engine
    from studio.runtime.tensorrt.support import graph_precision, import_tensorrt, resolve_typing

    trt = import_tensorrt()  # BackendUnavailable: exit 2 with the install hint
    from studio.runtime.base import resolve_device

    device = resolve_device(args.device)
    if device.type != "cuda":
        raise OptionError("--device", f"TensorRT builds on an NVIDIA GPU, not {device}")
    plan = parse_precision(args.precision, "tensorrt", device)
    typing = resolve_typing(settings.typing, str(trt.__version__))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create {out}: {e.strerror or e}") from None

    # 3. One engine per network: one progress stage, the builder's messages above it.
    from studio.progress import StageProgress

    summary: dict[str, Any] = {
        "checkpoints": str(found.root),
        "out_dir": str(out),
        "tensorrt": str(trt.__version__),
        "typing": typing,
        "settings": {
            "opt_level": settings.opt_level,
            "workspace_gb": settings.workspace_gb,
            "batch": args.batch,
            "hardware_compat": settings.hardware_compat,
            "plugin": settings.plugin,
        },
        "networks": {},
    }
    with StageProgress(sys.stderr) as progress:

        def log(message: str) -> None:
            progress.note(f"  {message}")

        for i, name in enumerate(names):
            precision = plan.of(name)
            graph = graph_precision(precision, typing)
            record: dict[str, Any] = {"precision": precision}
            started = time.perf_counter()
            progress(f"building TensorRT engines: {name} ({precision})", i, len(names))
            try:
                onnx, origin = _source(
                    name,
                    files[name],
                    graph,
                    args.batch,
                    settings.plugin is not None,
                    out / "onnx",
                    device,
                    log,
                )
                record.update({"onnx": str(onnx), "onnx_source": origin})
                path, decision, _ = ensure_engine(
                    name,
                    onnx,
                    precision,
                    device,
                    out,
                    settings,
                    engine_stem(name, args.batch),
                    args.force,
                    log,
                )
                record.update(
                    {
                        "engine": str(path),
                        "action": decision.action,
                        "reasons": list(decision.reasons),
                        "ok": True,
                    }
                )
            except Exception as e:  # noqa: BLE001 - one failed build does not stop the others
                record.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
                log(f"{name}: FAILED: {record['error']}")
            record["seconds"] = round(time.perf_counter() - started, 1)
            summary["networks"][name] = record
            progress(f"building TensorRT engines: {name} ({precision})", i + 1, len(names))
    summary["ok"] = all(r["ok"] for r in summary["networks"].values())
    if args.json:
        write_json(json_out or args.json, summary)  # a file, or - (stdout)
    print(format_summary(summary), file=sys.stderr if is_stdout(args.json) else sys.stdout)
    return 0 if summary["ok"] else 1


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"TensorRT {summary['tensorrt']} engines ({summary['typing']}ly typed) in "
        f"{summary['out_dir']}"
    ]
    for name, r in summary["networks"].items():
        if r["ok"]:
            what = {"reuse": "current, kept", "build": "built", "rebuild": "rebuilt"}[r["action"]]
            lines.append(
                f"  {name:<21} {r['precision']:<5} {Path(r['engine']).name}: {what} "
                f"({r['seconds']:.1f} s, from {r['onnx_source']} {Path(r['onnx']).name})"
            )
        else:
            lines.append(f"  {name:<21} {r['precision']:<5} FAILED: {r['error']}")
    return "\n".join(lines)
