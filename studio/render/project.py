"""A project file: the clip's audio and avatar, its settings and its control tracks, in one
JSON file that reopens exactly (``studio render --project FILE``).

Paths inside the project's folder are kept relative to it, so a project folder can be moved
or shared whole; others stay absolute. Anything wrong in the file is an
:class:`~studio.errors.InputError` naming it and the key.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.errors import InputError
from studio.files import read_json, write_atomic
from studio.motion.controls import ControlTracks
from studio.settings import RenderSettings

PROJECT_FORMAT = "studio-project/1"
KEYS = ("format", "audio", "avatar", "settings", "controls")
MAX_PROJECT_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Project:
    """What a clip is made from."""

    audio: str | None = None
    avatar: str | None = None
    settings: RenderSettings = field(default_factory=RenderSettings)
    controls: ControlTracks = field(default_factory=ControlTracks)

    def to_dict(self, folder: Path | None = None) -> dict[str, Any]:
        """The file's content; paths under ``folder`` relative to it."""
        return {
            "format": PROJECT_FORMAT,
            "audio": _portable(self.audio, folder),
            "avatar": _portable(self.avatar, folder),
            "settings": self.settings.to_dict(),
            "controls": self.controls.to_dict(),
        }

    def save(self, path: str | Path) -> None:
        """Write the project (atomically)."""
        p = Path(path)
        write_atomic(p, json.dumps(self.to_dict(p.absolute().parent), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Any, folder: Path, source: str) -> Project:
        if not isinstance(data, dict):
            raise InputError(f"{source}: a project is a JSON object")
        if data.get("format") != PROJECT_FORMAT:
            raise InputError(
                f"{source}: format {data.get('format')!r} is not a project format this studio "
                f"reads ({PROJECT_FORMAT})"
            )
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise InputError(f"{source}: unknown key {unknown[0]!r} ({', '.join(KEYS)})")
        paths = {}
        for key in ("audio", "avatar"):
            value = data.get(key)
            if value is not None and not isinstance(value, str):
                raise InputError(f"{source}: {key} must be a file path or null")
            paths[key] = None if not value else str(folder / value)
        settings = RenderSettings.from_dict(data.get("settings", {}), source=f"{source}: settings")
        controls = ControlTracks.from_dict(data.get("controls") or {}, source=f"{source}: controls")
        return cls(paths["audio"], paths["avatar"], settings, controls)

    @classmethod
    def load(cls, path: str | Path) -> Project:
        """Read a project file; InputError naming it for anything wrong."""
        p = Path(path)
        data = read_json(p, "project", MAX_PROJECT_BYTES)
        return cls.from_dict(data, p.absolute().parent, str(p))


def _portable(path: str | None, folder: Path | None) -> str | None:
    """``path`` relative to ``folder`` when it lies inside it, else absolute."""
    if path is None:
        return None
    p = Path(path).absolute()
    if folder is not None:
        try:
            return (
                Path(os.path.relpath(p, folder)).as_posix() if p.is_relative_to(folder) else str(p)
            )
        except ValueError:  # another drive
            return str(p)
    return str(p)
