"""RenderSettings: the one schema of every user-facing setting of a render, and JSON presets.

Each field carries its one range (``ge``/``le``), its choices (a ``Literal``), its default and
its help (pydantic v2, strict types: no ``"no"`` for a bool, no string or bool for a number,
no NaN or infinity, no unknown key). The CLI's options, the GUI's widgets and the preset files
read them through :func:`spec`; reports store :meth:`RenderSettings.to_dict`. The cadence
thresholds are the schema's nested part: :class:`studio.motion.cadence.CadenceThresholds`
holds their ranges. A value outside the schema is an error naming the key (or the CLI option)
and what is allowed, never a clamp: ``OptionError`` when settings are built, ``InputError``
naming the file for a preset.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from studio.errors import InputError, OptionError
from studio.export.video import X264_PRESETS
from studio.files import read_json, write_atomic
from studio.layout import (
    CROP_SCALE,
    CROP_VX,
    CROP_VY,
    DEFAULT_EMOTION,
    DEFAULT_SAMPLING_STEPS,
    EMOTIONS,
    LMDM_PRECISIONS,
)
from studio.motion.cadence import STRIDES, CadenceThresholds
from studio.motion.condition import SOURCE_ORDERS
from studio.motion.controls import ControlTracks
from studio.motion.kinematics import (
    DEFAULT_ACCEL_LIMIT,
    DEFAULT_ORDER,
    DEFAULT_WINDOW,
    MIN_ACCEL_LIMIT,
    SmoothingSettings,
)
from studio.runtime.names import RUNTIMES

PRESET_FORMAT = "talkinghead-studio/preset-1"
PRESET_CONTROLS = "controls"  # a preset's optional control tracks (studio.motion.controls)
MAX_PRESET_BYTES = 1 << 20  # a preset is a few hundred bytes: a larger file is not one
MIN_SIZE, MAX_SIZE = 64, 2048
MIN_WINDOW, MAX_WINDOW = 3, 101
MAX_ACCEL_LIMIT = 90.0
STRIDE_CHOICES = ("auto", *(str(s) for s in STRIDES))
PRESETS = X264_PRESETS  # every x264 speed preset: the encoder, the CLI and the GUI share it
MEMORY_MODES = ("auto", "resident", "streamed")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
MOTION_PRECISIONS = LMDM_PRECISIONS
FRAMES = ("full", "crop")
FPS_CHOICES = ("25", "24", "30", "50", "60")  # 25: the motion's own; others resampled
CODECS = ("h264", "hevc", "av1")
# what the head is drawn over: the avatar's own picture, nothing (alpha), or a keying colour
BACKGROUND_COLOURS: dict[str, tuple[int, int, int]] = {
    "green": (0, 177, 64),  # chroma-key green
    "blue": (0, 71, 187),  # chroma-key blue
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}
BACKGROUNDS = ("avatar", "transparent", *BACKGROUND_COLOURS)
MAX_SEED = 2**31 - 1  # the GUI's spin box holds a 32-bit int
MAX_STEPS = 1000
MAX_BATCH = 256
MAX_DELTA_DEG = 45.0
MAX_ORDER = MAX_WINDOW - 1
EMOTION_HELP = "emotion label: " + ", ".join(f"{i} {name}" for i, name in enumerate(EMOTIONS))


def _ui(
    option: str | None = None,
    *,
    step: float = 1,
    decimals: int = 0,
    unit: str = "",
    parity: str | None = None,
) -> dict[str, Any]:
    """How a field meets users: the CLI option that sets it, the GUI's step, decimals and
    unit, and whether it must be odd or even (checked by the schema)."""
    extra: dict[str, Any] = {"step": step, "decimals": decimals, "unit": unit}
    if option:
        extra["option"] = option
    if parity:
        extra["parity"] = parity
    return extra


def _field(
    default: Any,
    option: str | None,
    help: str,
    low: float | None = None,
    high: float | None = None,
    *,
    strict: bool | None = True,
    **ui: Any,
) -> Any:
    """A setting's schema: its default, CLI option, help and inclusive range; strict types (a
    Literal's choices take ``strict=None``: they are exact already); the GUI's hints (_ui)."""
    extra = _ui(option, **ui)
    return Field(default, ge=low, le=high, strict=strict, description=help, json_schema_extra=extra)


def _choice(default: str, option: str, help: str) -> Any:
    """A setting with choices (its Literal type): default, CLI option and help."""
    return _field(default, option, help, strict=None)


def _delta(axis: str) -> Any:
    text = f"degrees of {axis} added to the head at stitching"
    bound = MAX_DELTA_DEG
    return _field(0.0, f"--delta-{axis}", text, -bound, bound, step=1.0, decimals=2, unit="°")


class SettingError(OptionError):
    """A value the schema refuses: the message names the CLI option (or the key where no
    option sets it); ``key`` and ``problem`` serve messages that name a preset file."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(_option(key), problem)
        self.key, self.problem = key, problem


class RenderSettings(BaseModel):
    """One render's settings, checked when built: OptionError naming the option (or key)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    smooth: bool = _field(True, None, "smooth the head pose (Savitzky-Golay, then the limit)")
    smooth_window: int = _field(
        DEFAULT_WINDOW,
        "--smooth-window",
        "Savitzky-Golay window in frames",
        MIN_WINDOW,
        MAX_WINDOW,
        step=2,
        parity="odd",
    )
    smooth_order: int = _field(
        DEFAULT_ORDER, "--smooth-order", "Savitzky-Golay order, below the window", 0, MAX_ORDER
    )
    accel_limit: float = _field(
        DEFAULT_ACCEL_LIMIT,
        "--accel-limit",
        "largest head-angle acceleration after smoothing, degrees/frame²",
        MIN_ACCEL_LIMIT,
        MAX_ACCEL_LIMIT,
        step=0.05,
        decimals=3,
        unit="°/frame²",
    )
    stride: Literal[STRIDE_CHOICES] = _choice(  # type: ignore[valid-type]
        "auto", "--stride", "render cadence: auto (from the speech) or a fixed stride"
    )
    cadence: CadenceThresholds = Field(
        default_factory=CadenceThresholds,
        description="when a frame counts as fast or calm (the adaptive cadence)",
    )
    seed: int = _field(0, "--seed", "random seed of the motion generator", 0, MAX_SEED)
    size: int = _field(
        512,
        "--size",
        "square output side in pixels (with Ditto: of crop frames)",
        MIN_SIZE,
        MAX_SIZE,
        step=2,
        parity="even",
    )
    crf: int = _field(18, "--crf", "H.264 quality (constant rate factor), lower is better", 0, 51)
    preset: Literal[PRESETS] = _choice(  # type: ignore[valid-type]
        "medium", "--x264-preset", "x264 speed preset: faster ones encode sooner, larger files"
    )
    fps: Literal[FPS_CHOICES] = _choice(  # type: ignore[valid-type]
        "25",
        "--fps",
        "output frame rate: 25 is the motion's own, 24/30/50/60 are resampled from the motion "
        "(every frame rendered)",
    )
    codec: Literal[CODECS] = _choice(  # type: ignore[valid-type]
        "h264",
        "--codec",
        "video codec: h264 (x264), hevc (x265) or av1 (SVT-AV1) where PyAV has the encoder",
    )
    hw_encode: bool = _field(
        False,
        "--hw-encode",
        "encode the MP4 on the GPU's video encoder (NVENC) where the machine has one; "
        "otherwise the software encoder, with a note",
    )
    background: Literal[BACKGROUNDS] = _choice(  # type: ignore[valid-type]
        "avatar",
        "--background",
        "what the head is drawn over: the avatar's own picture; transparent (alpha, for "
        ".webm, .mov or .png); or a green, blue, black or white screen",
    )
    backend: str = Field(
        "demo",
        strict=True,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=64,
        description="the talking-head engine; the engine registry says which exist",
    )
    # Ditto engine (ignored by the demo engine)
    emotion: int = _field(DEFAULT_EMOTION, "--emotion", EMOTION_HELP, 0, len(EMOTIONS) - 1)
    delta_pitch: float = _delta("pitch")
    delta_yaw: float = _delta("yaw")
    delta_roll: float = _delta("roll")
    steps: int = _field(DEFAULT_SAMPLING_STEPS, "--steps", "DDIM sampling steps", 1, MAX_STEPS)
    crop_scale: float = _field(
        CROP_SCALE,
        "--crop-scale",
        "the face crop's side as a multiple of the face (smaller: closer; 1.8-2.0 helps a "
        "mouth that will not open); the avatar is registered again",
        1.2,
        4.0,
        step=0.05,
        decimals=2,
    )
    crop_vx: float = _field(
        CROP_VX,
        "--crop-vx",
        "the face crop moved sideways, a fraction of its side (+: right)",
        -0.5,
        0.5,
        step=0.01,
        decimals=3,
    )
    crop_vy: float = _field(
        CROP_VY,
        "--crop-vy",
        "the face crop moved up or down, a fraction of its side (-: up, Ditto's -0.125)",
        -0.5,
        0.5,
        step=0.01,
        decimals=3,
    )
    memory: Literal[MEMORY_MODES] = _choice(  # type: ignore[valid-type]
        "auto",
        "--memory",
        "resident: a batch's tensors stay on the GPU; streamed: through "
        "pinned host buffers; auto picks from free VRAM",
    )
    batch: int = _field(0, "--batch", "frames per render batch, 0: from the device", 0, MAX_BATCH)
    precision: Literal[PRECISIONS] = _choice(  # type: ignore[valid-type]
        "auto", "--precision", "warp/decoder precision; auto is fp16 on a GPU, fp32 on the CPU"
    )
    motion_precision: Literal[MOTION_PRECISIONS] = _choice(  # type: ignore[valid-type]
        "fp32",
        "--motion-precision",
        "LMDM's precision on a GPU: fp32 is the released weights' own (the reference's "
        "motion); tf32, fp16 and bf16 sample faster, with motion a little different; the CPU "
        "runs fp32",
    )
    video_loop: Literal[SOURCE_ORDERS] = _choice(  # type: ignore[valid-type]
        "pingpong",
        "--video-loop",
        "a video avatar past its end: pingpong (back and forth, Ditto's) or loop (from the "
        "start again: for a video made to loop)",
    )
    frame: Literal[FRAMES] = _choice(  # type: ignore[valid-type]
        "full",
        "--frame",
        "full: the avatar image with the face pasted back; crop: the 512² "
        "face crop resized to the size",
    )
    compile: bool = _field(
        False, "--compile", "warp + decoder through torch.compile on a CUDA GPU (compiles once)"
    )
    runtime: Literal[RUNTIMES] = _choice(  # type: ignore[valid-type]
        "torch", "--runtime", "engine backend of warp + decoder"
    )

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise SettingError(*_problem(e)) from None

    @field_validator("stride", mode="before")
    @classmethod
    def _stride_number(cls, value: Any) -> Any:
        """A fixed stride may be written as a number (1, 2, 3), as older presets do."""
        return str(value) if type(value) is int and str(value) in STRIDE_CHOICES else value

    @model_validator(mode="after")
    def _rules(self) -> RenderSettings:
        """Odd window, even size, order below the window: SettingError naming the key."""
        for key in ("smooth_window", "size"):
            value, s = getattr(self, key), spec(key)
            if (value % 2 == 1) != (s.parity == "odd"):
                parity = "odd" if value % 2 else "even"
                raise SettingError(key, f"{value} is {parity}; must be {s.allowed}")
        if self.smooth_order >= self.smooth_window:
            raise SettingError(
                "smooth_order",
                f"{self.smooth_order} must be below the window, {self.smooth_window}",
            )
        return self

    @property
    def backdrop(self) -> tuple[int, int, int] | None:
        """The solid colour the frames are drawn over (None: the avatar's own backdrop;
        a transparent export draws over black and white to find its alpha)."""
        return BACKGROUND_COLOURS.get(self.background)

    @property
    def smoothing(self) -> SmoothingSettings:
        return SmoothingSettings(
            self.smooth, self.smooth_window, self.smooth_order, self.accel_limit
        )

    def validate(self) -> RenderSettings:  # type: ignore[override]
        """These settings (checked when they were built; kept so that callers may chain it)."""
        return self

    def replace(self, **changes: Any) -> RenderSettings:
        """A copy with ``changes``, checked like new settings (OptionError naming the option)."""
        return type(self)(**{**dict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The preset file's content, also the report's settings block."""
        return {"format": PRESET_FORMAT, **self.model_dump()}

    @classmethod
    def from_dict(cls, data: Any, source: str = "preset") -> RenderSettings:
        """Settings from a preset's dict; InputError naming ``source``, the key and what is
        allowed for an unknown key, a wrong type or a value out of range."""
        if not isinstance(data, dict):
            raise InputError(f"{source}: a preset must be a JSON object, not {_what(data)}")
        data = dict(data)
        data.pop(PRESET_CONTROLS, None)  # a preset's tracks: read by load_preset_tracks
        fmt = data.pop("format", PRESET_FORMAT)
        if fmt != PRESET_FORMAT:
            raise InputError(
                f"{source}: format: {_what(fmt)} is not a preset format this studio reads "
                f"({PRESET_FORMAT})"
            )
        try:
            return cls.model_validate(data)  # through __init__: SettingError
        except SettingError as e:
            raise InputError(f"{source}: {e.key}: {e.problem}") from None

    def save(self, path: str | os.PathLike, controls: ControlTracks | None = None) -> None:
        """Write the preset, with ``controls`` (control tracks) when given (atomically: the
        old file or the new one, never half of one)."""
        data = self.to_dict()
        if controls:
            data[PRESET_CONTROLS] = controls.to_dict()
        write_atomic(path, json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> RenderSettings:
        """Read a JSON preset; InputError naming the file for anything wrong with it."""
        p = Path(path)
        data = read_json(p, "preset", MAX_PRESET_BYTES)
        return cls.from_dict(data, source=str(p))


def load_preset_tracks(path: str | os.PathLike) -> ControlTracks | None:
    """The control tracks a preset file carries (its ``controls``), or None; InputError
    naming the file for anything wrong with them."""
    p = Path(path)
    data = read_json(p, "preset", MAX_PRESET_BYTES)
    if not isinstance(data, dict) or not data.get(PRESET_CONTROLS):
        return None
    return ControlTracks.from_dict(data[PRESET_CONTROLS], source=f"{p}: {PRESET_CONTROLS}")


# --- the schema as the CLI and the GUI read it ------------------------------------------------


@dataclass(frozen=True)
class FieldSpec:
    """One setting as the schema states it: type, default, range or choices, help, and how
    the CLI (its option) and the GUI (step, decimals, unit) show it."""

    key: str  # "smooth_window", "cadence.fast_flux"
    kind: type  # bool, int, float or str
    default: Any
    help: str
    low: float | None = None  # inclusive bounds of a number
    high: float | None = None
    choices: tuple[str, ...] = ()
    option: str | None = None  # the CLI option that sets it
    step: float = 1
    decimals: int = 0
    unit: str = ""
    parity: str | None = None  # "odd" or "even"

    @property
    def allowed(self) -> str:
        """What the schema allows, in words: "an odd integer 3..101", "one of a, b"."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is int:
            return f"an {self.parity + ' ' if self.parity else ''}integer {self.range}"
        if self.kind is float:
            return f"a number {self.range}"
        return "an engine name (letters, digits and _)"

    @property
    def range(self) -> str:
        """The bounds as ``low..high``."""
        return f"{_num(self.low)}..{_num(self.high)}"


def keys() -> tuple[str, ...]:
    """Every setting's key, the cadence thresholds as ``cadence.NAME``."""
    top = [k for k in RenderSettings.model_fields if k != "cadence"]
    return (*top, *(f"cadence.{k}" for k in CadenceThresholds.__pydantic_fields__))


@cache
def spec(key: str) -> FieldSpec:
    """The schema of one setting (``smooth_window``, ``cadence.fast_flux``); KeyError if none."""
    owner, _, name = key.rpartition(".")
    fields = CadenceThresholds.__pydantic_fields__ if owner else RenderSettings.model_fields
    if owner not in ("", "cadence") or name not in fields or key == "cadence":
        raise KeyError(key)
    info = fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    bounds = {b: getattr(m, b) for m in info.metadata for b in ("ge", "le") if hasattr(m, b)}
    ann = info.annotation
    choices = tuple(typing.get_args(ann)) if typing.get_origin(ann) is Literal else ()
    return FieldSpec(
        key=key,
        kind=str if choices else typing.cast(type, ann),
        default=info.get_default(call_default_factory=True),
        help=info.description or "",
        low=bounds.get("ge"),
        high=bounds.get("le"),
        choices=choices,
        option=typing.cast(str | None, extra.get("option")),
        step=typing.cast(float, extra.get("step", 1)),
        decimals=typing.cast(int, extra.get("decimals", 0)),
        unit=typing.cast(str, extra.get("unit", "")),
        parity=typing.cast(str | None, extra.get("parity")),
    )


# --- errors in one line -------------------------------------------------------------------------


def _num(x: float | None) -> str:
    return "" if x is None else str(x) if isinstance(x, int) else f"{x:g}"


def _what(value: Any) -> str:
    """A value as an error shows it: short, by kind for containers (never a huge repr)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _option(key: str) -> str:
    """The CLI option that sets ``key`` (the key itself where none does)."""
    try:
        return spec(key).option or key
    except KeyError:
        return key


def _problem(error: ValidationError) -> tuple[str, str]:
    """(key, what is wrong and what is allowed) of the first error; any others are counted."""
    errors = error.errors(include_url=False)
    first = errors[0]
    key = ".".join(str(p) for p in first["loc"]) or "settings"
    text = _explain(first, key)
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return key, text


def _explain(err: ErrorDetails, key: str) -> str:
    kind, value = err["type"], err.get("input")
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        owner = key.rpartition(".")[0]
        known = [k.rpartition(".")[2] for k in keys() if k.rpartition(".")[0] == owner]
        if not owner:
            known.append("cadence")
        return f"unknown key; the known {owner + ' ' if owner else ''}keys are {', '.join(known)}"
    if kind.startswith("dataclass"):
        names = ", ".join(CadenceThresholds.__pydantic_fields__)
        return f"got {_what(value)}; must be an object with the keys {names}"
    if kind == "value_error":
        return str(err.get("ctx", {}).get("error", err["msg"]))
    try:
        s = spec(key)
    except KeyError:
        return err["msg"]
    if kind == "greater_than_equal":
        return f"{_what(value)} is below the minimum, {_num(s.low)}"
    if kind == "less_than_equal":
        return f"{_what(value)} is above the maximum, {_num(s.high)}"
    if kind == "finite_number":
        return f"{_what(value)} is not a finite number; must be {s.allowed}"
    if kind == "literal_error":
        return f"{_what(value)} is not {s.allowed}"
    return f"got {_what(value)}; must be {s.allowed}"
