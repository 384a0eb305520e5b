"""`studio doctor`: what this machine offers the studio, and what is missing.

The ``backends`` section says, per engine backend (torch, onnxruntime, tensorrt) and device
kind, whether it can run here and which precisions, with the reason for each one it cannot.

Encoders are listed as built into PyAV's FFmpeg or not, and for hardware encoders
(``h264_nvenc``) whether the hardware is here too: an encoder can be built in while the GPU
and driver it drives are absent.

Everything is probed without side effects: no QApplication is created, no GPU
memory is allocated beyond what querying free memory needs.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import importlib
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio import __version__

ENCODERS = (
    "libx264",
    "h264_nvenc",
    "libx265",
    "hevc_nvenc",
    "libsvtav1",
    "av1_nvenc",
    "libvpx-vp9",
    "prores_ks",
    "png",
    "aac",
    "libopus",
    "pcm_s16le",
)
# Encoders that drive hardware -> the hardware's name (probed by _nvidia_encoder).
HARDWARE_ENCODERS = dict.fromkeys(("h264_nvenc", "hevc_nvenc", "av1_nvenc"), "NVIDIA GPU")


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return None
    return str(getattr(mod, "__version__", "unknown"))


def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return {"available": False, "error": str(e)}
    info: dict[str, Any] = {
        "available": True,
        "version": torch.__version__,
        "cuda_build": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "devices": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            info["devices"].append(
                {
                    "index": i,
                    "name": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "free_vram_gb": round(free / 2**30, 2),
                    "total_vram_gb": round(total / 2**30, 2),
                    "bf16": bool(torch.cuda.is_bf16_supported()),
                }
            )
    return info


def _backend(module: str, hint: str, report: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``report(module)`` of an installed backend, or why it is not usable and how to install it."""
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        return {"available": False, "reason": f"not installed ({e.__class__.__name__}); {hint}"}
    return {"available": True, **report(mod)}


def _onnxruntime() -> dict[str, Any]:
    return _backend(
        "onnxruntime",
        "pip install 'talkinghead-studio[onnx]'",
        lambda ort: {"version": ort.__version__, "providers": list(ort.get_available_providers())},
    )


def _tensorrt() -> dict[str, Any]:
    return _backend(
        "tensorrt",
        "pip install 'talkinghead-studio[trt]' on a machine with an NVIDIA GPU",
        lambda trt: {"version": trt.__version__},
    )


def _nvidia_encoder() -> dict[str, Any]:
    """Whether NVENC hardware is here: an NVIDIA GPU (torch sees CUDA, or /dev/nvidia*) and
    the driver's encoder library (libnvidia-encode); ``reason`` says what is absent."""
    gpu = bool(glob.glob("/dev/nvidia[0-9]*"))
    try:
        import torch

        gpu = gpu or (torch.cuda.is_available() and torch.version.hip is None)
    except Exception:  # noqa: BLE001 - torch is reported on its own
        pass
    lib = ctypes.util.find_library("nvidia-encode") is not None
    if gpu and lib:
        return {"present": True, "reason": None}
    if not gpu:
        why = "no NVIDIA GPU here (torch sees no CUDA device, no /dev/nvidia*)"
    else:
        why = "an NVIDIA GPU but not the driver's libnvidia-encode"
    return {"present": False, "reason": why}


def _pyav() -> dict[str, Any]:
    try:
        import av
    except Exception as e:  # noqa: BLE001
        return {"available": False, "reason": str(e)}
    built_in = {name: name in av.codecs_available for name in ENCODERS}
    return {
        "available": True,
        "version": av.__version__,
        "encoders": built_in,  # built into PyAV's FFmpeg (not: usable on this machine)
        "hardware": {name: _nvidia_encoder() for name in HARDWARE_ENCODERS if built_in.get(name)},
    }


def _encoder_lines(a: dict[str, Any]) -> list[str]:
    """The encoders built into PyAV's FFmpeg, then per hardware encoder whether its hardware
    is here (built in is not the same as usable: h264_nvenc needs an NVIDIA GPU)."""
    built = [n for n, ok in a["encoders"].items() if ok]
    absent = [n for n, ok in a["encoders"].items() if not ok]
    line = f"PyAV {a['version']} encoders built in: {', '.join(built) or 'none of ours'}"
    if absent:
        line += f" (not built in: {', '.join(absent)})"
    lines = [line]
    for name, hw in a.get("hardware", {}).items():
        what = HARDWARE_ENCODERS[name]
        state = f"{what} present" if hw["present"] else hw["reason"] or f"no {what} here"
        lines.append(f"  hardware encoder {name}: built in, {state}")
    return lines


def _backends() -> dict[str, Any]:
    """Which engine backends and precisions are usable here, and why not (never raises)."""
    try:
        from studio.runtime.precision import backends_report

        return backends_report()
    except Exception as e:  # noqa: BLE001 - the report must not fail the doctor
        return {"error": f"{type(e).__name__}: {e}"}


def _backend_lines(b: dict[str, Any]) -> list[str]:
    if "error" in b:
        return [f"backends: not probed ({b['error']})"]
    lines = [
        "backends (precisions usable here; defaults: "
        + ", ".join(f"{k} {v}" for k, v in b.get("defaults", {}).items())
        + "):"
    ]
    for backend, kinds in b.items():
        if backend == "defaults":
            continue
        for kind, e in kinds.items():
            label = f"  {backend} {kind}:"
            if not e["usable"]:
                lines.append(f"{label} no ({e['reason']})")
                continue
            by_reason: dict[str, list[str]] = {}
            for p, why in e["unsupported"].items():
                if p not in ("fp8", "int8") or backend == "tensorrt":
                    by_reason.setdefault(why, []).append(p)
            off = "; ".join(f"{'/'.join(ps)}: {why}" for why, ps in by_reason.items())
            lines.append(f"{label} {', '.join(e['precisions'])}" + (f" (not {off})" if off else ""))
    return lines


def _live() -> dict[str, Any]:
    """Live mode's inputs and outputs here: microphone, WebRTC, virtual camera."""
    from studio.live.sinks import virtual_camera_status
    from studio.live.sources import microphone_status

    mic, mic_why = microphone_status()
    cam, cam_why = virtual_camera_status()
    return {
        "microphone": {"available": mic, "detail": mic_why},
        "webrtc": {"available": _version("aiortc") is not None, "aiortc": _version("aiortc")},
        "virtual_camera": {"available": cam, "detail": cam_why},
    }


def _live_lines(v: dict[str, Any]) -> list[str]:
    mic, web, cam = v["microphone"], v["webrtc"], v["virtual_camera"]
    return [
        "live: microphone (CLI) "
        + (f"yes: {mic['detail']}" if mic["available"] else f"no: {mic['detail']}"),
        "live: WebRTC (--serve) "
        + (f"yes: aiortc {web['aiortc']}" if web["available"] else "no: aiortc is not installed"),
        "live: virtual camera "
        + (f"yes: {cam['detail']}" if cam["available"] else f"no: {cam['detail']}"),
    ]


def _folder(path: Path) -> dict[str, Any]:
    """A cache folder: where, whether it is there, its files and bytes (a file another
    process removes meanwhile, a partial one renamed, is not counted)."""
    sizes = []
    for p in path.rglob("*") if path.is_dir() else ():
        with contextlib.suppress(OSError):
            if p.is_file():
                sizes.append(p.stat().st_size)
    return {"path": str(path), "exists": path.is_dir(), "files": len(sizes), "bytes": sum(sizes)}


def _caches() -> dict[str, Any]:
    """The studio's caches (:mod:`studio.paths`): each folder's size; of the compiled render
    engines, how many are kept, which failed to build (never tried again until removed) and
    whether this torch loads AOTInductor packages (its probe's answer, once asked)."""
    from studio import paths

    aot = paths.compiled_cache_dir() / "aot"
    packages_load = None  # this torch on this machine's first GPU: asked once, by a build
    try:
        import torch

        from studio.runtime.aot_cache import probe_file

        if torch.cuda.is_available():
            answer = json.loads(probe_file(aot, "cuda").read_text())["ok"]
            packages_load = bool(answer)
    except (ImportError, OSError, ValueError, KeyError, TypeError):
        pass
    return {
        "root": str(paths.cache_root()),
        "folders": {
            "avatars": _folder(paths.avatar_cache_dir()),
            "engines": _folder(paths.engine_cache_dir()),
            "compiled": _folder(paths.compiled_cache_dir()),
            "logs": _folder(paths.log_dir()),
        },
        "compiled_engines": sorted(
            p.name
            for p in aot.glob("*")
            if p.suffix in (".art", ".pt2") and not p.name.startswith(".")  # not a partial
        ),
        "failed_builds": sorted(
            p.name.removesuffix(".failed.json") for p in aot.glob("*.failed.json")
        ),
        "packages_load": packages_load,
    }


def _cache_lines(c: dict[str, Any]) -> list[str]:
    lines = [f"caches under {c['root']}:"]
    for name, f in c["folders"].items():
        size = f"{f['files']} files, {f['bytes'] / 1e6:,.1f} MB" if f["exists"] else "empty"
        lines.append(f"  {name}: {size} ({f['path']})")
    kept = c["compiled_engines"]
    packages = {True: "packages load here", False: "packages do not load here: artifacts"}
    how = packages.get(c["packages_load"], "not probed yet")
    lines.append(f"  compiled render engines: {len(kept)} kept ({how})")
    for name in c["failed_builds"]:
        lines.append(f"  compiled {name}: failed to build; remove its .failed.json to try again")
    return lines


def collect() -> dict[str, Any]:
    """Every probe, as a JSON-ready dict."""
    from studio.gui.probe import qt_report  # Qt lives under gui/; the probe works without it

    return {
        "studio": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": _torch(),
        "onnxruntime": _onnxruntime(),
        "tensorrt": _tensorrt(),
        "qt": qt_report(),
        "pyav": _pyav(),
        "backends": _backends(),
        "live": _live(),
        "caches": _caches(),
        "numpy": _version("numpy"),
        "scipy": _version("scipy"),
        "soundfile": _version("soundfile"),
        "pyqtgraph": _version("pyqtgraph"),
    }


def format_text(info: dict[str, Any]) -> str:
    """A readable summary of :func:`collect`."""
    t, o, r, q, a = info["torch"], info["onnxruntime"], info["tensorrt"], info["qt"], info["pyav"]
    lines = [f"studio {info['studio']} on Python {info['python']} ({info['platform']})"]
    if t["available"]:
        lines.append(
            f"torch {t['version']} (CUDA build: {t['cuda_build'] or 'none'}, "
            f"{t['threads']} CPU threads)"
        )
        if not t["devices"]:
            lines.append("  GPU: none visible (CPU only)")
        for d in t["devices"]:
            lines.append(
                f"  GPU {d['index']}: {d['name']} (sm {d['compute_capability']}), "
                f"{d['free_vram_gb']} of {d['total_vram_gb']} GB free"
            )
    else:
        lines.append(f"torch: not usable ({t.get('error')})")
    lines.append(
        f"ONNX Runtime {o['version']}: {', '.join(o['providers'])}"
        if o["available"]
        else f"ONNX Runtime: {o['reason']}"
    )
    lines.append(f"TensorRT {r['version']}" if r["available"] else f"TensorRT: {r['reason']}")
    if q["available"]:
        lines.append(
            f"Qt {q['qt']} (PySide6 {q['pyside6']}), platform plugins: "
            f"{', '.join(q['platform_plugins']) or 'none found'}; "
            f"QtMultimedia {'yes' if q['multimedia'] else 'no'}"
        )
    else:
        lines.append(f"Qt: not usable ({q['reason']})")
    if a["available"]:
        lines.extend(_encoder_lines(a))
    else:
        lines.append(f"PyAV: not usable ({a['reason']})")
    if "backends" in info:
        lines.extend(_backend_lines(info["backends"]))
    if "live" in info:
        lines.extend(_live_lines(info["live"]))
    if "caches" in info:
        lines.extend(_cache_lines(info["caches"]))
    return "\n".join(lines)
