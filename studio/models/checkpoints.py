"""Find Ditto's released checkpoint files and load its config pickles safely.

Ditto (HuggingFace ``digital-avatar/ditto-talkinghead``) ships four folders side by side:
``ditto_pytorch/`` (``.pth`` networks plus ONNX/MediaPipe aux models), ``ditto_onnx/``,
``ditto_trt_*/`` (TensorRT 8.6 engines, possibly several builds) and ``ditto_cfg/`` (pickled
configs). :func:`discover` checks every file each layout needs, stage by stage, so that
``studio doctor --checkpoints DIR`` can say exactly which file is missing and what it is for.
Files the studio can do without (:data:`OPTIONAL`: the MediaPipe task file, Ditto's TensorRT
configs, ...) are reported as optional: a layout is complete when its required files are
there, and :meth:`CheckpointSet.complete_for_pytorch` says whether ``studio render`` can run.

The config ``.pkl`` files are pickles, and a pickle can run code when loaded. :func:`load_cfg`
therefore uses an unpickler that admits only plain data: containers, numbers, strings, bytes and
numpy arrays/scalars. Everything else is refused before it is imported or called.
"""

from __future__ import annotations

import io
import os
import pickle
import shlex
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.errors import InputError

NETWORKS = (
    "appearance_extractor",
    "motion_extractor",
    "warp_network",
    "decoder",
    "stitch_network",
    "lmdm",
)

HF_REPO = "digital-avatar/ditto-talkinghead"

# Layout kind -> folder inside the checkpoint root ("trt" folders are ditto_trt_<anything>).
LAYOUT_DIRS = {"pytorch": "ditto_pytorch", "onnx": "ditto_onnx", "cfg": "ditto_cfg"}
TRT_PREFIX = "ditto_trt"
DEFAULT_TRT_DIR = "ditto_trt_Ampere_Plus"

# Stages, in pipeline order ("group / step").
S_DET = "registration / face detection"
S_LMK106 = "registration / 106 landmarks"
S_LMK203 = "registration / 203 landmarks"
S_EYES = "registration / eye landmarks (MediaPipe)"
S_APPEARANCE = "registration / appearance extractor"
S_MOTION = "registration / motion extractor"
S_HUBERT = "audio / HuBERT"
S_LMDM = "motion / LMDM"
S_STITCH = "render / stitching"
S_WARP = "render / warp"
S_DECODER = "render / decoder"
S_CONFIG = "config"
STAGES = (
    S_DET,
    S_LMK106,
    S_LMK203,
    S_EYES,
    S_APPEARANCE,
    S_MOTION,
    S_HUBERT,
    S_LMDM,
    S_STITCH,
    S_WARP,
    S_DECODER,
    S_CONFIG,
)


def _trt(name: str, precision: str) -> tuple[str, ...]:
    """Engine names: the released precision first, the other one accepted for custom builds."""
    other = "fp32" if precision == "fp16" else "fp16"
    return (f"{name}_{precision}.engine", f"{name}_{other}.engine")


@dataclass(frozen=True)
class Requirement:
    """One file a stage needs; ``files`` maps a layout kind to candidate names in its folder."""

    stage: str
    role: str
    files: dict[str, tuple[str, ...]]


# The released files (ditto-reference.md, "Released checkpoint files"). Precision of the TRT
# engines follows Ditto's build rule: fp32 for motion_extractor, hubert and lmdm*, else fp16.
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        S_DET,
        "insightface_det",
        {
            "pytorch": ("aux_models/det_10g.onnx",),
            "onnx": ("insightface_det.onnx",),
            "trt": _trt("insightface_det", "fp16"),
        },
    ),
    Requirement(
        S_LMK106,
        "landmark106",
        {
            "pytorch": ("aux_models/2d106det.onnx",),
            "onnx": ("landmark106.onnx",),
            "trt": _trt("landmark106", "fp16"),
        },
    ),
    Requirement(
        S_LMK203,
        "landmark203",
        {
            "pytorch": ("aux_models/landmark203.onnx",),
            "onnx": ("landmark203.onnx",),
            "trt": _trt("landmark203", "fp16"),
        },
    ),
    Requirement(S_EYES, "face_landmarker", {"pytorch": ("aux_models/face_landmarker.task",)}),
    Requirement(
        S_EYES,
        "blaze_face",
        {"onnx": ("blaze_face.onnx",), "trt": _trt("blaze_face", "fp16")},
    ),
    Requirement(
        S_EYES,
        "face_mesh",
        {"onnx": ("face_mesh.onnx",), "trt": _trt("face_mesh", "fp16")},
    ),
    Requirement(
        S_APPEARANCE,
        "appearance_extractor",
        {
            "pytorch": ("models/appearance_extractor.pth",),
            "onnx": ("appearance_extractor.onnx",),
            "trt": _trt("appearance_extractor", "fp16"),
        },
    ),
    Requirement(
        S_MOTION,
        "motion_extractor",
        {
            "pytorch": ("models/motion_extractor.pth",),
            "onnx": ("motion_extractor.onnx",),
            "trt": _trt("motion_extractor", "fp32"),
        },
    ),
    Requirement(
        S_HUBERT,
        "hubert",
        {
            "pytorch": ("aux_models/hubert_streaming_fix_kv.onnx",),
            "onnx": ("hubert.onnx",),
            "trt": _trt("hubert", "fp32"),
        },
    ),
    Requirement(
        S_LMDM,
        "lmdm",
        {
            "pytorch": ("models/lmdm_v0.4_hubert.pth",),
            "onnx": ("lmdm_v0.4_hubert.onnx",),
            "trt": _trt("lmdm_v0.4_hubert", "fp32"),
        },
    ),
    Requirement(
        S_STITCH,
        "stitch_network",
        {
            "pytorch": ("models/stitch_network.pth",),
            "onnx": ("stitch_network.onnx",),
            "trt": _trt("stitch_network", "fp16"),
        },
    ),
    Requirement(
        S_WARP,
        "warp_network",
        {
            "pytorch": ("models/warp_network.pth",),
            "onnx": ("warp_network.onnx",),
            "trt": _trt("warp_network", "fp16"),
        },
    ),
    Requirement(S_WARP, "grid_sample_plugin", {"onnx": ("libgrid_sample_3d_plugin.so",)}),
    Requirement(
        S_DECODER,
        "decoder",
        {
            "pytorch": ("models/decoder.pth",),
            "onnx": ("decoder.onnx",),
            "trt": _trt("decoder", "fp16"),
        },
    ),
    Requirement(S_CONFIG, "cfg_trt", {"cfg": ("v0.4_hubert_cfg_trt.pkl",)}),
    Requirement(S_CONFIG, "cfg_trt_online", {"cfg": ("v0.4_hubert_cfg_trt_online.pkl",)}),
    Requirement(S_CONFIG, "cfg_pytorch", {"cfg": ("v0.4_hubert_cfg_pytorch.pkl",)}),
)

# Files a layout can do without, (role, layout kind) -> what happens without them. Everything
# else a layout lists is required. The studio's eye features come from face_landmarker.task
# (MediaPipe) or, without it, the 203 landmarks; it never runs Ditto's blaze_face/face_mesh.
_NO_EYE_MODELS = "the studio's eye features use face_landmarker.task or the 203 landmarks"
OPTIONAL: dict[tuple[str, str], str] = {
    ("face_landmarker", "pytorch"): "without it the eye features come from the 203 landmarks",
    ("blaze_face", "onnx"): _NO_EYE_MODELS,
    ("face_mesh", "onnx"): _NO_EYE_MODELS,
    ("blaze_face", "trt"): _NO_EYE_MODELS,
    ("face_mesh", "trt"): _NO_EYE_MODELS,
    ("grid_sample_plugin", "onnx"): "only a TensorRT warp engine before TensorRT 11.2 loads it",
    ("cfg_trt", "cfg"): "used by Ditto's TensorRT pipeline only",
    ("cfg_trt_online", "cfg"): "used by Ditto's TensorRT pipeline only",
    ("cfg_pytorch", "cfg"): "the studio has the same defaults built in",
}
# What `studio render --checkpoints` reads from ditto_pytorch/
# (studio.engines.ditto.engine.ALL_ROLES: registration, HuBERT, LMDM, stitching, warp,
# decoder): the layout's required files.
PYTORCH_RENDER_ROLES = (
    "insightface_det",
    "landmark106",
    "landmark203",
    "appearance_extractor",
    "motion_extractor",
    "hubert",
    "lmdm",
    "stitch_network",
    "warp_network",
    "decoder",
)

# Other names accepted by CheckpointSet.path(): Ditto's file stems and plain-word synonyms.
ALIASES = {
    "det_10g": "insightface_det",
    "face_detector": "insightface_det",
    "2d106det": "landmark106",
    "lmdm_v0.4_hubert": "lmdm",
    "hubert_streaming_fix_kv": "hubert",
    "libgrid_sample_3d_plugin": "grid_sample_plugin",
    "stitching": "stitch_network",
    "warp": "warp_network",
}

_LFS_MAGIC = b"version https://git-lfs.github.com/spec/"
_HINTS = {
    "pytorch": f"download ditto_pytorch/ from the HuggingFace repo {HF_REPO}",
    "onnx": f"download ditto_onnx/ from the HuggingFace repo {HF_REPO}",
    "trt": f"download ditto_trt_Ampere_Plus/ from {HF_REPO} or rebuild the engines from "
    "ditto_onnx/ with Ditto's scripts/cvt_onnx_to_trt.py",
    "cfg": f"download ditto_cfg/ from the HuggingFace repo {HF_REPO}",
}


@dataclass(frozen=True)
class FileStatus:
    """One expected file of one layout: where it should be and whether it is there.

    ``problem`` is set for a file that exists but cannot be the model (a Git LFS pointer).
    ``optional`` files (:data:`OPTIONAL`) do not make a layout incomplete; ``note`` says what
    the studio does without one.
    """

    stage: str
    role: str
    layout: str
    path: Path
    present: bool
    size: int | None
    problem: str | None = None
    optional: bool = False
    note: str | None = None

    @property
    def ok(self) -> bool:
        """Present and not known to be broken."""
        return self.present and self.problem is None


def _kind(layout: str) -> str:
    """Layout name ("pytorch", "onnx", "cfg", "trt:<folder>") -> its key in Requirement.files."""
    if layout.startswith("trt:") and len(layout) > 4:
        return "trt"
    if layout in LAYOUT_DIRS:
        return layout
    raise ValueError(
        f"unknown checkpoint layout {layout!r}: expected pytorch, onnx, cfg, trt or trt:<folder>"
    )


def _layout_dir(base: Path, layout: str) -> Path:
    return base / (layout[4:] if _kind(layout) == "trt" else LAYOUT_DIRS[layout])


def _probe(path: Path) -> tuple[bool, int | None, str | None]:
    """(present, size, problem) for one file; symlinks (HuggingFace cache) are followed."""
    try:
        if not path.is_file():
            return False, None, None
        size = path.stat().st_size
    except OSError:
        return False, None, None
    problem = None
    if size < 1024:
        try:
            with open(path, "rb") as f:
                head = f.read(len(_LFS_MAGIC))
        except OSError:
            head = b""
        if head == _LFS_MAGIC:
            problem = "is a Git LFS pointer, not the model: run `git lfs pull` in the checkout"
    return True, size, problem


def _statuses(base: Path, layout: str) -> list[FileStatus]:
    """Every file ``layout`` needs, probed on disk, in stage order."""
    kind, folder = _kind(layout), _layout_dir(base, layout)
    out = []
    for req in REQUIREMENTS:
        names = req.files.get(kind)
        if not names:
            continue
        found = [(folder / n, *_probe(folder / n)) for n in names]
        path, present, size, problem = next((f for f in found if f[1]), found[0])
        note = OPTIONAL.get((req.role, kind))
        out.append(
            FileStatus(
                req.stage, req.role, layout, path, present, size, problem, note is not None, note
            )
        )
    return out


def _human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass
class CheckpointSet:
    """What :func:`discover` found under ``root`` (the folder holding the ``ditto_*`` folders)."""

    root: Path
    files: list[FileStatus]

    def _all_layouts(self) -> list[str]:
        return list(dict.fromkeys(f.layout for f in self.files))

    def _of(self, layout: str) -> list[FileStatus]:
        own = [f for f in self.files if f.layout == layout]
        return own if own else _statuses(self.root, layout)

    def rel(self, path: Path) -> str:
        """``path`` relative to the root, as shown in messages."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def layouts(self) -> list[str]:
        """Layouts with at least one file present: "pytorch", "onnx", "trt:<folder>", "cfg"."""
        return [lay for lay in self._all_layouts() if any(f.present for f in self._of(lay))]

    def trt_layouts(self) -> list[str]:
        """The ``trt:<folder>`` layouts found, complete ones first."""
        found = [lay for lay in self.layouts() if lay.startswith("trt:")]
        return sorted(found, key=lambda lay: not self.complete(lay))

    def complete(self, layout: str) -> bool:
        """True when every required file of ``layout`` is present and usable (optional files,
        :data:`OPTIONAL`, may be absent)."""
        return not self.missing_required(layout)

    def missing(self, layout: str) -> list[FileStatus]:
        """Files of ``layout`` that are absent or broken (e.g. Git LFS pointers), optional
        ones included."""
        return [f for f in self._of(self._resolve_layout(layout)) if not f.ok]

    def missing_required(self, layout: str) -> list[FileStatus]:
        """The required files of ``layout`` that are absent or broken."""
        return [f for f in self.missing(layout) if not f.optional]

    def complete_for_pytorch(self) -> bool:
        """True when ``studio render --checkpoints`` can run from this folder: every file of
        :data:`PYTORCH_RENDER_ROLES` is present and usable in ``ditto_pytorch/``."""
        files = {f.role: f for f in self._of("pytorch")}
        return all(files[r].ok for r in PYTORCH_RENDER_ROLES)

    def describe(self, f: FileStatus) -> str:
        """One line naming the file and its stage, e.g. for a missing-file list."""
        if not f.present:
            return f"missing {self.rel(f.path)} (stage: {f.stage})"
        if f.problem:
            return f"{self.rel(f.path)} {f.problem} (stage: {f.stage})"
        return f"{self.rel(f.path)} (stage: {f.stage})"

    def _resolve_layout(self, layout: str) -> str:
        if layout != "trt":
            _kind(layout)
            return layout
        found = self.trt_layouts()
        if not found:
            raise InputError(
                f"{self.root} holds no TensorRT engine folder ({TRT_PREFIX}_*/): " + _HINTS["trt"]
            )
        return found[0]

    def path(self, network_or_aux: str, layout: str = "pytorch") -> Path:
        """Path of one network/aux model/config in ``layout``; InputError when it is absent.

        ``network_or_aux`` is a role ("decoder", "lmdm", "hubert", "insightface_det",
        "blaze_face", "cfg_trt", ...) or an alias from ALIASES; ``layout`` may be "trt" for the
        best ``trt:<folder>`` found.
        """
        role = ALIASES.get(network_or_aux, network_or_aux)
        layout = self._resolve_layout(layout)
        entries = [f for f in self._of(layout) if f.role == role]
        if not entries:
            roles = ", ".join(f.role for f in self._of(layout))
            raise ValueError(f"layout {layout} has no {network_or_aux!r}; it has {roles}")
        f = entries[0]
        if f.ok:
            return f.path
        what = "is missing" if not f.present else f.problem
        raise InputError(
            f"{f.path} {what} (stage: {f.stage}, layout: {layout}): {_HINTS[_kind(layout)]} "
            f"into {self.root}"
        )

    def report(self) -> str:
        """Human-readable text: per layout, per stage, present, MISSING (required), BROKEN or
        absent (optional, with what the studio does without it); then what is missing, which
        layouts are complete, and whether ``studio render`` can run from the folder."""
        lines = [f"Ditto checkpoints in {self.root}"]
        present = set(self.layouts())
        layouts = self._all_layouts()
        if not any(lay.startswith("trt:") for lay in layouts):
            layouts.insert(2, f"trt:{TRT_PREFIX}_*")
        width = max(len(s) for s in STAGES)
        for lay in layouts:
            if lay not in present:
                folder = _layout_dir(self.root, lay).name
                lines.append(f"  {lay}: not found (no files in {folder}/)")
                continue
            files = self._of(lay)
            folder = _layout_dir(self.root, lay).name
            lines.append(f"  {lay} ({folder}/): {self._state(files)}")
            for f in files:
                rel = self.rel(f.path)
                if f.ok:
                    mark, extra = "present", f"  ({_human_size(f.size or 0)})"
                elif f.present:
                    mark, extra = "BROKEN ", f"  ({f.problem})"
                elif f.optional:
                    mark, extra = "absent ", f"  (optional: {f.note})"
                else:
                    mark, extra = "MISSING", ""
                lines.append(f"    {f.stage:<{width}}  {mark}  {rel}{extra}")
            if lay.startswith("trt:"):
                plugin = next(
                    f for f in _statuses(self.root, "onnx") if f.role == "grid_sample_plugin"
                )
                lines.append(
                    f"    note: the warp engine may need {self.rel(plugin.path)} loaded first "
                    f"({'present' if plugin.ok else 'not found'})"
                )
        found = [f for lay in layouts if lay in present for f in self._of(lay)]
        problems = [f for f in found if not f.ok and not f.optional]
        if problems:
            lines.append("Missing or broken (required):")
            lines += [f"  {self.describe(f)}" for f in problems]
        broken = [f for f in found if f.optional and f.present and f.problem]
        if broken:
            lines.append("Broken (optional):")
            lines += [f"  {self.describe(f)}" for f in broken]
        usable = [lay for lay in layouts if lay in present and self.complete(lay)]
        lines.append(f"Complete layouts: {', '.join(usable) if usable else 'none'}")
        lines.append(self.pytorch_verdict())
        return "\n".join(lines)

    @staticmethod
    def _state(files: list[FileStatus]) -> str:
        """The layout's state: complete or INCOMPLETE (required files), and the optional count."""
        required = [f for f in files if not f.optional]
        bad = [f for f in required if not f.ok]
        optional = [f for f in files if f.optional]
        absent = [f for f in optional if not f.ok]
        if not required:
            return f"{len(optional) - len(absent)} of {len(optional)} files present, all optional"
        if bad:
            state = f"INCOMPLETE, {len(bad)} of {len(required)} required missing"
        else:
            state = f"complete ({len(required)} required files present)"
        if optional:
            state += (
                f"; optional: {len(optional) - len(absent)} of {len(optional)} present"
                if absent
                else f"; optional: all {len(optional)} present"
            )
        return state

    def pytorch_verdict(self) -> str:
        """One line: can ``studio render`` run from this folder, and if not, what to do."""
        if self.complete_for_pytorch():
            return (
                "Result: complete for PyTorch: `studio render --checkpoints "
                f"{shlex.quote(str(self.root))} --avatar FACE.png` can run from this folder"
            )
        if "pytorch" not in self.layouts():
            return (
                f"Result: NOT complete for PyTorch: `studio render` needs "
                f"{LAYOUT_DIRS['pytorch']}/, which is not here; {_HINTS['pytorch']} into "
                f"{self.root}"
            )
        files = {f.role: f for f in self._of("pytorch")}
        bad = [files[r] for r in PYTORCH_RENDER_ROLES if not files[r].ok]
        names = ", ".join(self.rel(f.path) for f in bad)
        return (
            f"Result: NOT complete for PyTorch: `studio render` needs {names}; {_HINTS['pytorch']} "
            f"into {self.root}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: root, layouts found, completeness per layout (required files)
        and for ``studio render`` (``complete_for_pytorch``), the missing required and
        optional files of the layouts found, and every file's status (with ``optional`` and
        ``note``)."""
        found = [f for f in self.files if f.layout in self.layouts()]  # layouts present
        files = []
        for f in self.files:
            d = asdict(f)
            d["path"] = str(f.path)
            d["relpath"] = self.rel(f.path)
            files.append(d)
        return {
            "root": str(self.root),
            "layouts": self.layouts(),
            "complete": {lay: self.complete(lay) for lay in self._all_layouts()},
            "complete_for_pytorch": self.complete_for_pytorch(),
            "missing_required": [self.rel(f.path) for f in found if not f.ok and not f.optional],
            "missing_optional": [self.rel(f.path) for f in found if not f.ok and f.optional],
            "files": files,
        }


def _is_layout_name(name: str) -> bool:
    return name in LAYOUT_DIRS.values() or name.startswith(TRT_PREFIX)


def _layout_folders(d: Path) -> list[Path]:
    try:
        return sorted(c for c in d.iterdir() if _is_layout_name(c.name) and c.is_dir())
    except OSError:
        return []


def _find_base(root: Path) -> Path:
    """The folder that holds the ``ditto_*`` folders: ``root``, its parent or one level below."""
    if _is_layout_name(root.name):  # pointed at ditto_pytorch/ itself
        return root.parent
    if root.name in ("models", "aux_models") and root.parent.name == LAYOUT_DIRS["pytorch"]:
        return root.parent.parent
    if _layout_folders(root):
        return root
    try:
        children = sorted(c for c in root.iterdir() if c.is_dir())
    except OSError:
        children = []
    snapshots = root / "snapshots"  # a HuggingFace cache entry: snapshots/<revision>/ditto_*
    if snapshots.is_dir():
        children += sorted(c for c in snapshots.iterdir() if c.is_dir())
    holders = [c for c in children if _layout_folders(c)]
    if len(holders) > 1:
        named = [c for c in holders if c.name == "checkpoints"]
        if len(named) == 1:
            return named[0]
        names = ", ".join(str(c) for c in holders)
        raise InputError(
            f"{root} holds Ditto checkpoints in several folders ({names}): point at one of them"
        )
    if holders:
        return holders[0]
    raise InputError(
        f"no Ditto checkpoints in {root}: looked for ditto_pytorch/, ditto_onnx/, "
        f"{TRT_PREFIX}_*/ and ditto_cfg/ in it and its subfolders; download them from the "
        f"HuggingFace repo {HF_REPO} and point at the folder that holds them"
    )


def discover(root: str | os.PathLike[str]) -> CheckpointSet:
    """Check every file of every released layout under ``root``.

    ``root`` may be the folder holding ``ditto_pytorch/`` etc. (Ditto's ``checkpoints/``), one of
    those folders, or a folder one level above (e.g. a Ditto checkout or a HuggingFace cache
    entry). InputError when it is missing, not a folder, or holds none of the expected files.
    """
    given = Path(root).expanduser()
    if not given.exists():
        raise InputError(
            f"checkpoint folder {given} does not exist: point at the folder that holds "
            f"ditto_pytorch/, ditto_onnx/, {TRT_PREFIX}_*/ or ditto_cfg/"
        )
    if not given.is_dir():
        raise InputError(
            f"{given} is not a folder: point at the folder that holds ditto_pytorch/, "
            f"ditto_onnx/, {TRT_PREFIX}_*/ or ditto_cfg/"
        )
    base = _find_base(given.resolve())
    layouts = ["pytorch", "onnx"]
    layouts += [f"trt:{d.name}" for d in _layout_folders(base) if d.name.startswith(TRT_PREFIX)]
    layouts.append("cfg")
    files = [f for lay in layouts for f in _statuses(base, lay)]
    found = CheckpointSet(base, files)
    if not found.layouts():
        folders = ", ".join(f"{d.name}/" for d in _layout_folders(base))
        raise InputError(
            f"{base} has {folders} but none of the expected files in them (e.g. "
            f"ditto_pytorch/models/decoder.pth, ditto_onnx/decoder.onnx, "
            f"ditto_cfg/v0.4_hubert_cfg_trt.pkl): finish downloading {HF_REPO}"
        )
    return found


# ---------------------------------------------------------------------------------------------
# Restricted unpickling of ditto_cfg/*.pkl


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 0-2 pickles use it for bytes; only latin-1 is allowed."""
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591"):
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The numpy callables that array/scalar/dtype pickles name, under 1.x and 2.x paths.

    Objects are taken from whichever numpy is installed, so a numpy-1 pickle loads under numpy
    2 (and the reverse) without importing the deprecated ``numpy.core`` shim.
    """
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for pkg in ("numpy.core", "numpy._core"):
        table[(f"{pkg}.multiarray", "_reconstruct")] = multiarray._reconstruct
        table[(f"{pkg}.multiarray", "scalar")] = multiarray.scalar
        table[(f"{pkg}.numeric", "_frombuffer")] = numeric._frombuffer  # protocol 5 arrays
    return table


# Everything a config pickle may name. Plain containers, numbers, strings and bytes have opcodes
# of their own; protocols 0-3 spell set/frozenset/complex/bytearray and bytes via these globals.
# collections.OrderedDict is admitted: it is a dict whose items are unpickled (and restricted)
# like any other, and config dicts written by older code are often ordered dicts.
_BUILTINS: dict[tuple[str, str], Callable[..., Any] | type] = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "bytearray"): bytearray,
    ("_codecs", "encode"): _latin1_encode,
    ("collections", "OrderedDict"): OrderedDict,
}
_ALLOWED = {**_BUILTINS, **_numpy_globals()}
_DISPLAY_MODULES = {"__builtin__": "builtins", "posix": "os", "nt": "os"}  # for messages
CFG_KEYS = ("base_cfg", "audio2motion_cfg", "default_kwargs")


class _Refused(Exception):
    """A global outside the allow-list; carries its dotted name."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _ConfigUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allow-listed globals and never imports anything."""

    def find_class(self, module: str, name: str) -> Any:
        # Protocols 0-2 name Python 3 builtins by their Python 2 module.
        obj = _ALLOWED.get(("builtins" if module == "__builtin__" else module, name))
        if obj is None:
            raise _Refused(f"{_DISPLAY_MODULES.get(module, module)}.{name}")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def load_cfg(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a Ditto config ``.pkl`` without running code, and check its top-level structure.

    Returns the unpickled dict unchanged (keys ``base_cfg``, ``audio2motion_cfg``,
    ``default_kwargs``; ditto-reference.md §4.6). InputError when the file is missing, corrupt,
    references anything but plain data and numpy arrays/scalars, or lacks those keys.
    """
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"config file {p} does not exist: {_HINTS['cfg']}") from None
    except OSError as e:
        raise InputError(f"cannot read config file {p} ({e.strerror or e}): check it") from None
    if data.startswith(_LFS_MAGIC):
        raise InputError(
            f"{p} is a Git LFS pointer, not the config: run `git lfs pull` in the checkout"
        )
    try:
        cfg = _ConfigUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise InputError(
            f"refusing to load {p}: it references {e.name}, which a config file never needs"
        ) from None
    except Exception as e:  # noqa: BLE001 - any failure inside pickle means a corrupt file
        raise InputError(
            f"{p} is not a valid config pickle ({e.__class__.__name__}: {e}): "
            f"re-download it ({_HINTS['cfg']})"
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(
            f"{p} holds a {type(cfg).__name__}, not the config dict Ditto writes: "
            f"use one of the ditto_cfg/*.pkl files"
        )
    absent = [k for k in CFG_KEYS if k not in cfg]
    if absent:
        raise InputError(
            f"{p} lacks the config key(s) {', '.join(absent)}: use one of the ditto_cfg/*.pkl "
            f"files, which hold {', '.join(CFG_KEYS)}"
        )
    not_dicts = [k for k in CFG_KEYS if not isinstance(cfg[k], dict)]
    if not_dicts:
        raise InputError(
            f"{p}: config key(s) {', '.join(not_dicts)} should hold a dict: use one of the "
            f"ditto_cfg/*.pkl files"
        )
    return cfg


def _plain(v: Any) -> Any:
    """numpy scalars/arrays -> Python values, so the summary is JSON-ready."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def cfg_summary(cfg: dict[str, Any]) -> dict[str, Any]:
    """The settings that matter for the studio, from a :func:`load_cfg` dict, where present.

    From ``audio2motion_cfg``: audio_feat_dim, motion_feat_dim, seq_frames, w2f_type and every
    ``use_*`` flag; from ``default_kwargs``: sampling_timesteps, overlap_v2, online_mode, smo_k_d.
    """
    a2m = cfg.get("audio2motion_cfg") or {}
    kw = cfg.get("default_kwargs") or {}
    out: dict[str, Any] = {}
    for key in ("audio_feat_dim", "motion_feat_dim", "seq_frames", "w2f_type"):
        if key in a2m:
            out[key] = _plain(a2m[key])
    for key in sorted(k for k in a2m if isinstance(k, str) and k.startswith("use_")):
        out[key] = _plain(a2m[key])
    for key in ("sampling_timesteps", "overlap_v2", "online_mode", "smo_k_d"):
        if key in kw:
            out[key] = _plain(kw[key])
    return out
