"""RenderSettings: every user-facing knob of a render, validated, and JSON presets.

The CLI and the GUI build the same object, so a preset saved in one works in the
other. Validation errors name the CLI option and what is allowed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from studio.errors import InputError, OptionError
from studio.layout import DEFAULT_EMOTION, DEFAULT_SAMPLING_STEPS, EMOTIONS
from studio.motion.cadence import CadenceThresholds
from studio.motion.kinematics import (
    DEFAULT_ACCEL_LIMIT,
    DEFAULT_ORDER,
    DEFAULT_WINDOW,
    SmoothingSettings,
)
from studio.runtime.names import RUNTIMES

PRESET_FORMAT = "talkinghead-studio/preset-1"
MIN_SIZE, MAX_SIZE = 64, 2048
MAX_WINDOW = 101
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow")
MEMORY_MODES = ("auto", "resident", "streamed")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
FRAMES = ("full", "crop")
MAX_STEPS = 1000
MAX_BATCH = 256
MAX_DELTA_DEG = 45.0


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class RenderSettings:
    """One render's settings; ``validate()`` returns it or raises OptionError."""

    smooth: bool = True
    smooth_window: int = DEFAULT_WINDOW
    smooth_order: int = DEFAULT_ORDER
    accel_limit: float = DEFAULT_ACCEL_LIMIT
    stride: str = "auto"
    cadence: CadenceThresholds = field(default_factory=CadenceThresholds)
    seed: int = 0
    size: int = 512
    crf: int = 18
    preset: str = "medium"
    backend: str = "demo"
    # Ditto engine (ignored by the demo engine)
    emotion: int = DEFAULT_EMOTION
    delta_pitch: float = 0.0
    delta_yaw: float = 0.0
    delta_roll: float = 0.0
    steps: int = DEFAULT_SAMPLING_STEPS
    memory: str = "auto"
    batch: int = 0  # 0 = chosen from the device
    precision: str = "auto"
    frame: str = "full"
    compile: bool = False  # warp + decoder through torch.compile (CUDA; first render slower)
    runtime: str = "torch"  # the engine backend of warp + decoder

    @property
    def smoothing(self) -> SmoothingSettings:
        return SmoothingSettings(
            self.smooth, self.smooth_window, self.smooth_order, self.accel_limit
        )

    def validate(self) -> RenderSettings:
        """Check every value; the error names the CLI option."""
        w, k = self.smooth_window, self.smooth_order
        if not isinstance(w, int) or w < 3 or w % 2 == 0 or w > MAX_WINDOW:
            raise OptionError("--smooth-window", f"must be an odd integer 3..{MAX_WINDOW}, got {w}")
        if not isinstance(k, int) or k < 0 or k >= w:
            raise OptionError(
                "--smooth-order", f"must be an integer 0..{w - 1} (below the window), got {k}"
            )
        if not (isinstance(self.accel_limit, (int, float)) and 0 < self.accel_limit <= 90):
            raise OptionError(
                "--accel-limit",
                f"must be a number of degrees/frame² in (0, 90], got {self.accel_limit}",
            )
        if str(self.stride) not in ("auto", "1", "2", "3"):
            raise OptionError("--stride", f"must be auto, 1, 2 or 3, got {self.stride}")
        if not isinstance(self.size, int) or not MIN_SIZE <= self.size <= MAX_SIZE or self.size % 2:
            raise OptionError(
                "--size",
                f"must be an even number of pixels {MIN_SIZE}..{MAX_SIZE}, got {self.size}",
            )
        if not isinstance(self.crf, int) or not 0 <= self.crf <= 51:
            raise OptionError(
                "--crf", f"must be an integer 0..51 (lower is better quality), got {self.crf}"
            )
        if self.preset not in PRESETS:
            raise OptionError(
                "--x264-preset", f"must be one of {', '.join(PRESETS)}, got {self.preset}"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise OptionError("--seed", f"must be a non-negative integer, got {self.seed}")
        c = self.cadence
        if c.plosive_guard < 0 or not 0 <= c.calm_flux < c.fast_flux:
            raise OptionError(
                "cadence", "thresholds need plosive_guard >= 0 and 0 <= calm_flux < fast_flux"
            )
        if not (isinstance(self.backend, str) and self.backend.isidentifier()):
            # which engines exist is the registry's (studio.render.engines): it refuses others
            raise OptionError("--backend", f"not an engine name: {self.backend!r}")
        self._validate_ditto()
        return self

    def _validate_ditto(self) -> None:
        names = ", ".join(f"{i} {n}" for i, n in enumerate(EMOTIONS))
        if not _is_int(self.emotion) or not 0 <= self.emotion < len(EMOTIONS):
            raise OptionError("--emotion", f"must be a label 0..{len(EMOTIONS) - 1} ({names})")
        for axis in ("pitch", "yaw", "roll"):
            v = getattr(self, f"delta_{axis}")
            if not isinstance(v, (int, float)) or not -MAX_DELTA_DEG <= v <= MAX_DELTA_DEG:
                raise OptionError(
                    f"--delta-{axis}",
                    f"must be degrees in [-{MAX_DELTA_DEG:g}, {MAX_DELTA_DEG:g}], got {v}",
                )
        if not _is_int(self.steps) or not 1 <= self.steps <= MAX_STEPS:
            raise OptionError(
                "--steps", f"must be an integer 1..{MAX_STEPS} (DDIM steps), got {self.steps}"
            )
        for option, value, allowed in (
            ("--memory", self.memory, MEMORY_MODES),
            ("--precision", self.precision, PRECISIONS),
            ("--frame", self.frame, FRAMES),
            ("--runtime", self.runtime, RUNTIMES),
        ):
            if value not in allowed:
                raise OptionError(option, f"must be one of {', '.join(allowed)}, got {value!r}")
        if not isinstance(self.compile, bool):
            raise OptionError("--compile", f"must be true or false, got {self.compile!r}")
        if not _is_int(self.batch) or not 0 <= self.batch <= MAX_BATCH:
            raise OptionError(
                "--batch",
                f"must be 0 (automatic) or a frame count 1..{MAX_BATCH}, got {self.batch}",
            )

    def to_dict(self) -> dict[str, Any]:
        return {"format": PRESET_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "preset") -> RenderSettings:
        """Build from a preset dict; unknown keys and wrong types are errors naming the key."""
        if not isinstance(data, dict):
            raise InputError(f"{source}: a preset must be a JSON object")
        data = dict(data)
        fmt = data.pop("format", PRESET_FORMAT)
        if fmt != PRESET_FORMAT:
            raise InputError(
                f"{source}: unsupported preset format {fmt!r} (expected {PRESET_FORMAT})"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"{source}: unknown preset keys {', '.join(unknown)}")
        if "cadence" in data:
            cad = data["cadence"]
            ck = {f.name for f in fields(CadenceThresholds)}
            if not isinstance(cad, dict) or set(cad) - ck:
                raise InputError(
                    f"{source}: 'cadence' must be an object with keys {', '.join(sorted(ck))}"
                )
            data["cadence"] = CadenceThresholds(**cad)
        if "stride" in data:
            data["stride"] = str(data["stride"])
        try:
            settings = replace(cls(), **data)
            return settings.validate()
        except OptionError as e:
            raise InputError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> RenderSettings:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(f"preset file not found: {p}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"cannot read preset {p}: {e}") from None
        return cls.from_dict(data, source=str(p))
