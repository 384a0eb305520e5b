"""A batch's jobs: one clip each, read from a JSONL or CSV file or from a folder of audio.

A JOBS file names one clip per line (JSONL: an object; CSV: a header row, then a row each):

- ``audio`` (required): the speech, relative paths from the JOBS file's folder;
- ``avatar``: the photo or face video (an engine that takes one; default: ``--avatar``);
- ``output``: the output's name in the output folder, ``.mp4``, ``.webm``, ``.mov`` or
  ``.png`` (a PNG sequence) (default: the audio's name, ``.mp4``; ``.webm`` with
  ``"background": "transparent"``);
- ``preset``: a preset file whose settings the job starts from (default: the command's);
- ``controls``: a control tracks file directing the clip (:mod:`studio.motion.controls`);
- any setting by its key (``smooth_window``, ``cadence.max_warp_px``; in JSONL also a
  ``settings`` object in the preset's own layout), applied on top.

A folder instead is every audio file in it (sorted), each with ``--avatar``. Anything wrong
with the list itself (not JSON, no ``audio``, an unknown key, a bad value, two jobs writing one
output) is an :class:`~studio.errors.InputError` naming the file and line, before any work; a
missing or unreadable audio or avatar file is the job's own failure, found when it runs.
:func:`check_outputs` then refuses, also before any work, an output that would overwrite
what the batch reads or keeps (its inputs, the folder's state and report, a folder of other
files a PNG sequence would replace).
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.batch.state import REPORT_FILE, STATE_FILE
from studio.errors import InputError, OutputError, StudioError
from studio.export.video import (
    OUTPUT_SUFFIXES,
    PNG_SEQUENCE,
    check_alpha_output,
    check_sequence_folder,
    written_path,
)
from studio.settings import RenderSettings, keys

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".mp3", ".m4a", ".aac", ".aiff", ".aif", ".opus")
JOB_KEYS = ("audio", "avatar", "output", "preset", "controls", "settings")
MAX_JOBS_BYTES = 64 * 2**20  # a JOBS file larger than this is not a list of clips
# video and picture types the batch does not write: named as an output, an error, not a name
# with .mp4 added (a name with another dot in it, "take.2", gets the default type)
OTHER_MEDIA = (".avi", ".mkv", ".m4v", ".flv", ".wmv", ".mpg", ".mpeg", ".ts", ".gif", ".jpg")


def with_output_type(name: str, default: str = ".mp4") -> str:
    """``name`` as it is where its type is one the batch writes (:data:`OUTPUT_SUFFIXES`),
    else with ``default`` added ("take.2" -> "take.2.mp4")."""
    return name if Path(name).suffix.lower() in OUTPUT_SUFFIXES else name + default


@dataclass(frozen=True)
class Job:
    """One clip to render: where it comes from, where it goes, and its settings."""

    name: str  # the output file's name: unique in a batch, the job's identity
    audio: str
    avatar: str | None
    settings: RenderSettings
    source: str  # "jobs.jsonl:3": where the job was written, for messages
    extra: dict[str, Any] = field(default_factory=dict)  # the line as written (the report)
    controls: str | None = None  # a control tracks file
    preset: str | None = None  # the preset file its settings start from

    def to_dict(self) -> dict[str, Any]:
        """The job as plain JSON (what a Ray worker is sent)."""
        return {
            "name": self.name,
            "audio": self.audio,
            "avatar": self.avatar,
            "settings": self.settings.to_dict(),
            "source": self.source,
            "extra": self.extra,
            "controls": self.controls,
            "preset": self.preset,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        """The job of :meth:`to_dict`."""
        settings = RenderSettings.from_dict(data["settings"], source=data["source"])
        return cls(
            data["name"],
            data["audio"],
            data["avatar"],
            settings,
            data["source"],
            data["extra"],
            data.get("controls"),
            data.get("preset"),
        )

    def fingerprint(self, engine: Sequence[Any] = ()) -> str:
        """What the output depends on (inputs by path, size and mtime; the settings; what
        ``engine`` says of the weights): a rerun skips a finished job only while this is
        unchanged."""
        parts: list[Any] = [self.name, self.settings.to_dict(), list(engine)]
        for path in (self.audio, self.avatar, self.controls):
            if path is None:
                parts.append(None)
                continue
            try:
                st = Path(path).stat()
                parts.append([str(Path(path).resolve()), st.st_size, st.st_mtime_ns])
            except OSError:
                parts.append([path, None, None])
        blob = json.dumps(parts, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _value(text: str) -> Any:
    """A CSV cell as the setting's value: JSON where it parses (numbers, true/false), else
    the text itself; an empty cell is None (not given)."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _preset_file(row: dict[str, Any], folder: Path) -> Path | None:
    """The preset file a job names (``preset`` ending in ``.json``); None where its
    ``preset`` is the setting of that name (x264's speed preset) or absent."""
    preset = row.get("preset")
    if isinstance(preset, str) and preset.strip().lower().endswith(".json"):
        return folder / preset.strip()
    return None


def _settings_of(
    row: dict[str, Any], base: RenderSettings, folder: Path, where: str
) -> RenderSettings:
    """The job's settings: its preset file (or ``base``), then its ``settings`` object, then
    its setting columns. ``preset`` names a preset file where it ends in ``.json``; otherwise
    it is the setting of that name (x264's speed preset)."""
    start = base
    preset_file = _preset_file(row, folder)
    if preset_file is not None:
        start = RenderSettings.load(preset_file)
    data = start.model_dump()
    nested = row.get("settings") or {}
    if not isinstance(nested, dict):
        raise InputError(f"{where}: settings: must be an object of preset keys")
    data = _merge(data, nested)
    for key in keys():
        if row.get(key) is None or (key == "preset" and preset_file):
            continue
        owner, _, name = key.rpartition(".")
        if owner:
            data[owner] = {**data[owner], name: row[key]}
        else:
            data[key] = row[key]
    return RenderSettings.from_dict(data, source=where)


def _job(
    row: dict[str, Any],
    base: RenderSettings,
    folder: Path,
    avatar: str | None,
    where: str,
) -> Job:
    unknown = sorted(k for k in row if k not in JOB_KEYS and k not in keys())
    if unknown:
        near = difflib.get_close_matches(unknown[0], (*JOB_KEYS, *keys()), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputError(
            f"{where}: unknown key {unknown[0]!r}{hint}; a job has {', '.join(JOB_KEYS)} and "
            f"the settings' keys: {', '.join(keys())}"
        )
    audio = row.get("audio")
    if not isinstance(audio, str) or not audio.strip():
        raise InputError(f'{where}: no audio: every job names its speech file ("audio")')
    audio_path = folder / audio
    avatar_value = row.get("avatar") or avatar
    avatar_path = None if avatar_value is None else str(folder / str(avatar_value))
    settings = _settings_of(row, base, folder, where)
    alpha = settings.background == "transparent"
    default = ".webm" if alpha else ".mp4"  # a transparent head needs a file with alpha
    output = row.get("output")
    if output is not None and not isinstance(output, str):
        raise InputError(f'{where}: output: give a file name as a string, e.g. "take1.mp4"')
    name = (output or "").strip() or Path(audio.strip()).stem + default
    if Path(name).name != name or name in (".", ".."):
        raise InputError(f"{where}: output: {name!r} must be a file name, not a path")
    if name.startswith(".") or any(ord(c) < 32 for c in name):  # hidden: the batch's own
        raise InputError(
            f"{where}: output: {name!r}: give a file name that starts with a letter or digit "
            "and holds no control characters"
        )
    if Path(name).suffix.lower() in OTHER_MEDIA:
        raise InputError(
            f"{where}: output: {name!r}: the batch writes {', '.join(OUTPUT_SUFFIXES)} (a "
            f"folder of PNG frames); give one of those"
        )
    name = with_output_type(name, default)
    try:
        check_alpha_output(name, alpha)
    except OutputError as e:
        raise InputError(f"{where}: output: {e}") from None
    controls = None if not row.get("controls") else str(folder / str(row["controls"]))
    preset = _preset_file(row, folder)
    return Job(
        name,
        str(audio_path),
        avatar_path,
        settings,
        where,
        dict(row),
        controls,
        None if preset is None else str(preset),
    )


class _Twice(Exception):
    """A key given twice in one JSON object (JSON keeps the last without a word)."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise _Twice(k)
    return dict(pairs)


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for number, line in enumerate(_text(path).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line, object_pairs_hook=_once_each)
        except _Twice as e:
            raise InputError(f"{where}: {e.args[0]!r} is given twice; keep one") from None
        except ValueError as e:
            raise InputError(f"{where}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f'{where}: a job is a JSON object, e.g. {{"audio": "a.wav"}}')
        rows.append((where, row))
    return rows


def _read_csv(path: Path) -> list[tuple[str, dict[str, Any]]]:
    lines = _text(path).splitlines()
    reader = csv.DictReader(lines, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    if not reader.fieldnames or "audio" not in [f.strip() for f in reader.fieldnames]:
        raise InputError(f"{path}:1: a CSV of jobs starts with a header row naming audio")
    columns = [f.strip() for f in reader.fieldnames]
    twice = next((c for c in columns if c and columns.count(c) > 1), None)
    if twice is not None:
        raise InputError(f"{path}:1: the column {twice!r} is named twice; keep one")
    rows = []
    for number, raw in enumerate(reader, 2):
        if None in raw:
            raise InputError(f"{path}:{number}: more cells than the header has columns")
        row = {k.strip(): _value(v or "") for k, v in raw.items()}
        if all(v is None for v in row.values()):
            continue
        for k in ("audio", "avatar", "output", "preset", "controls"):
            if row.get(k) is not None:
                row[k] = str(row[k])
        rows.append((f"{path}:{number}", {k: v for k, v in row.items() if v is not None}))
    return rows


def _text(path: Path) -> str:
    try:
        if not path.is_file():  # a FIFO or a device would be read until it ends, if ever
            raise InputError(f"{path}: not a file; give a .jsonl or .csv file of jobs")
        if path.stat().st_size > MAX_JOBS_BYTES:
            raise InputError(f"{path}: too large for a list of jobs")
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(
            f"{path}: not UTF-8 text; save the list of jobs as UTF-8 (JSONL or CSV)"
        ) from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the jobs: {e.strerror or e}") from None


def audio_files(folder: str | Path) -> list[Path]:
    """Every audio file directly in ``folder``, sorted (the jobs of a folder); [] where the
    folder cannot be listed."""
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return []
    return [
        p
        for p in entries
        if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES and not p.name.startswith(".")
    ]


def read_jobs(
    source: str | Path, base: RenderSettings | None = None, avatar: str | None = None
) -> list[Job]:
    """The jobs of a JSONL or CSV file, or of a folder of audio files (module docstring);
    ``base``: the settings a job starts from; ``avatar``: the photo of jobs naming none."""
    base = base or RenderSettings()
    if avatar is not None:  # the command's: from where the command runs, not the jobs' folder
        avatar = str(Path(avatar).expanduser().absolute())
    path = Path(source)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder of jobs")
    if path.is_dir():
        files = audio_files(path)
        if not files:
            raise InputError(f"{path}: no audio files in the folder ({', '.join(AUDIO_SUFFIXES)})")
        rows = [(str(p), {"audio": p.name}) for p in files]
        folder = path.absolute()  # absolute: a Ray worker runs elsewhere
    else:
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".ndjson", ".json"):
            rows = _read_jsonl(path)
        elif suffix in (".csv", ".tsv"):
            rows = _read_csv(path)
        else:
            raise InputError(
                f"{path}: give a .jsonl or .csv file of jobs, or a folder of audio files"
            )
        folder = path.parent.absolute()
    if not rows:
        raise InputError(f"{path}: no jobs in it")
    jobs: list[Job] = []
    seen: dict[str, str] = {}
    for where, row in rows:
        try:
            job = _job(row, base, folder, avatar, where)
        except StudioError as e:
            text = str(e)
            raise InputError(text if text.startswith(where) else f"{where}: {text}") from None
        # x.png and x.PNG: one folder x/; a.mp4 and A.mp4: one file where names ignore case
        written = str(written_path(job.name)).casefold()
        if written in seen:
            fix = (
                "rename one of the two audio files (a folder's outputs are named after them)"
                if path.is_dir()
                else 'give each job its own "output"'
            )
            raise InputError(
                f"{where}: output {job.name!r} is also written by {seen[written]}; {fix}"
            )
        seen[written] = where
        jobs.append(job)
    return jobs


def _where(path: str | Path) -> tuple[Path, tuple[int, int] | None]:
    """A file's place: its resolved path (links followed, ``..`` gone), and its (device,
    inode) where it exists, which also finds a hard link."""
    p = Path(path).expanduser()
    try:
        resolved = p.resolve()  # not strict: a file not made yet has its place too
    except (OSError, RuntimeError, ValueError):
        resolved = p.absolute()
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        return resolved, None
    return resolved, (st.st_dev, st.st_ino)


class _Places:
    """Files by place, each with what it is to the batch."""

    def __init__(self) -> None:
        self.paths: dict[Path, str] = {}
        self.ids: dict[tuple[int, int], str] = {}

    def add(self, path: str | Path, what: str) -> None:
        resolved, identity = _where(path)
        self.paths.setdefault(resolved, what)
        if identity is not None:
            self.ids.setdefault(identity, what)

    def find(self, path: str | Path) -> str | None:
        resolved, identity = _where(path)
        return self.paths.get(resolved) or (self.ids.get(identity) if identity else None)

    def inside(self, folder: Path) -> str | None:
        """What lies in ``folder`` (a PNG sequence's, replaced whole)."""
        where = _where(folder)[0]
        return next((w for p, w in self.paths.items() if p.is_relative_to(where)), None)


def check_outputs(
    jobs: Sequence[Job],
    out_dir: str | Path,
    source: str | Path | None,
    report: str | Path | None = None,
) -> None:
    """Before any work, an :class:`~studio.errors.OutputError` where a job's output would
    overwrite a file the batch reads (a job's audio, avatar, controls or preset, the JOBS file
    ``source`` if any; a PNG sequence's folder holding one), or the folder's own files (state,
    report), or where a PNG sequence's folder holds anything but an earlier export of it; and
    where ``report`` (``--report``) is one of those inputs, outputs or files."""
    inputs = _Places()
    if source is not None and Path(source).is_file():
        inputs.add(source, f"the jobs file {source}")
    for job in jobs:
        named = {
            "audio": job.audio,
            "avatar": job.avatar,
            "controls": job.controls,
            "preset": job.preset,
        }
        for what, path in named.items():
            if path is not None:
                inputs.add(path, f"the {what} of {job.source} ({path})")
    out = Path(out_dir)
    own = _Places()
    for name in (STATE_FILE, f"{STATE_FILE}.lock", REPORT_FILE):
        own.add(out / name, f"the batch's own {name}")
    outputs = _Places()
    fix = "give the job another output name or another output folder"
    for job in jobs:
        target = out / written_path(job.name)
        clash = inputs.find(target) or own.find(target)
        if Path(job.name).suffix.lower() == PNG_SEQUENCE:
            clash = clash or inputs.inside(target)
            try:
                check_sequence_folder(out / job.name)
            except OutputError as e:
                raise OutputError(f"{job.source}: output: {e}") from None
        if clash:
            raise OutputError(f"{job.source}: output {target}: is also {clash}; {fix}")
        outputs.add(target, f"the output of {job.source}")
    if report is not None:
        clash = inputs.find(report) or own.find(report) or outputs.find(report)
        if clash and clash != f"the batch's own {REPORT_FILE}":  # the same report: fine
            raise OutputError(
                f"--report {report}: is also {clash} and would be overwritten; give the report "
                "a file of its own"
            )
