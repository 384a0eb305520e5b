"""Seeded fuzz of audio input: truncated and bit-flipped WAV / RF64 / FLAC / OGG / MP3 files.

Every case is either read correctly (finite float32 samples of a sane length) or refused
with an InputError whose one-line message names the file; never another exception, never
MemoryError, nothing printed by the decoders, and a bounded allocation whatever the
header declares. A few refused cases also go through ``studio render`` (exit 2, one line).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from studio.audio.io import MIN_RATE, Audio, load_audio
from studio.errors import InputError
from studio.layout import SAMPLE_RATE

SEED = 17
CASES_PER_FORMAT = 160
CLIP_S, CLIP_RATE = 1.0, 22050
FORMATS = {
    "wav": {"format": "WAV", "subtype": "PCM_16"},
    "rf64": {"format": "RF64", "subtype": "PCM_16"},
    "flac": {"format": "FLAC"},
    "ogg": {"format": "OGG", "subtype": "VORBIS"},
    "mp3": {"format": "MP3"},
}
PEAK_BYTES = 32 << 20  # what any case may allocate: the clip's decode needs well under 1 MB


def clip() -> np.ndarray:
    """A one-second voiced tone with a syllable rhythm, float32 mono."""
    t = np.arange(round(CLIP_S * CLIP_RATE)) / CLIP_RATE
    voice = np.sin(2 * np.pi * 180 * t) + 0.4 * np.sin(2 * np.pi * 540 * t)
    return (0.4 * voice * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def mutate(blob: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One or two seeded damages of ``blob``: (what was done, the damaged bytes).

    Half of them hit the first 256 bytes, where the headers keep lengths, rates and sizes.
    """
    data, done = bytearray(blob), []
    for _ in range(int(rng.integers(1, 3))):
        kind, span = int(rng.integers(3)), len(data) if rng.integers(2) else min(len(data), 256)
        if kind == 0 and len(data) > 1:  # truncated
            cut = int(rng.integers(1, min(span, len(data) - 1) + 1))
            del data[cut:]
            done.append(f"cut{cut}")
        elif kind == 1:  # bit flips
            at = [int(i) for i in rng.integers(0, span, size=int(rng.integers(1, 9)))]
            for i in at:
                data[i] ^= 1 << int(rng.integers(8))
            done.append("flip" + "-".join(map(str, at[:3])))
        elif len(data) > 4:  # a 32-bit field stomped: all ones (a huge length) or random
            at = int(rng.integers(0, min(span, len(data)) - 4 + 1))
            data[at : at + 4] = b"\xff\xff\xff\xff" if rng.integers(2) else rng.bytes(4)
            done.append(f"stomp{at}")
    return "_".join(done), bytes(data)


def fuzz_files(folder: Path, fmt: str, seed: int = SEED, n: int = CASES_PER_FORMAT) -> list[Path]:
    """``n`` damaged copies of the clip in format ``fmt``, written to ``folder``."""
    good = folder / f"good.{fmt}"
    sf.write(str(good), clip(), CLIP_RATE, **FORMATS[fmt])
    blob = good.read_bytes()
    rng = np.random.default_rng([seed, sorted(FORMATS).index(fmt)])
    paths = []
    for i in range(n):
        what, damaged = mutate(blob, rng)
        path = folder / f"case{i:03d}_{what[:40]}.{fmt}"
        path.write_bytes(damaged)
        paths.append(path)
    return paths


def judge(path: Path, load: Callable[[Path], Audio] = load_audio) -> tuple[str, str | None]:
    """How ``load`` handled ``path``: ("read" | "refused" | "crashed", what is wrong or None)."""
    try:
        audio = load(path)
    except InputError as e:
        msg = str(e)
        if "\n" in msg or path.name not in msg:
            return "refused", f"{path.name}: message not one line naming the file: {msg!r}"
        return "refused", None
    except Exception as e:  # the point: nothing else may escape (MemoryError included)
        return "crashed", f"{path.name}: {type(e).__name__}: {e}"
    s = audio.samples
    longest = CLIP_S * CLIP_RATE / MIN_RATE  # a damaged rate field can stretch it this far
    if s.dtype != np.float32 or s.ndim != 1 or not np.isfinite(s).all():
        return "read", f"{path.name}: samples {s.dtype} {s.shape} or not finite"
    if not 0 < audio.duration_s <= longest or float(np.abs(s).max()) > 1.0:
        return "read", f"{path.name}: {audio.duration_s:.2f} s, peak {float(np.abs(s).max()):.2f}"
    return "read", None


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_damaged_files_are_read_or_refused_in_one_line(tmp_path, capfd, fmt):
    paths = fuzz_files(tmp_path, fmt)
    assert load_audio(tmp_path / f"good.{fmt}").samples.shape == (SAMPLE_RATE,)
    problems, refused = [], 0
    tracemalloc.start()
    try:
        for path in paths:
            tracemalloc.reset_peak()
            verdict, problem = judge(path)
            peak = tracemalloc.get_traced_memory()[1]
            if problem is None and peak > PEAK_BYTES:
                problem = f"{path.name}: allocated {peak >> 20} MB"
            problems += [problem] if problem else []
            refused += verdict == "refused"
    finally:
        tracemalloc.stop()
    assert problems == []
    assert refused > len(paths) // 4  # the damage is real: many cases are refused
    assert capfd.readouterr().err == ""  # no decoder printed past the one-line error


def refused_cases(folder: Path) -> list[Path]:
    """Three refused fuzz cases of different formats (the first of each that is refused)."""
    picked = []
    for fmt in ("wav", "flac", "mp3"):
        refused = (p for p in fuzz_files(folder, fmt, n=16) if judge(p)[0] == "refused")
        picked += [next(refused)]
    return picked


@pytest.mark.slow
def test_cli_refuses_damaged_audio_with_one_line_and_no_output(tmp_path):
    cases = refused_cases(tmp_path)
    assert len(cases) == 3
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    for bad in cases:
        out = out_dir / "x.mp4"
        run = subprocess.run(
            [sys.executable, "-m", "studio", "render", "--demo", "--audio", str(bad),
             "--out", str(out)],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        lines = run.stderr.splitlines()
        assert run.returncode == 2, run.stderr
        assert len(lines) == 1 and bad.name in lines[0], run.stderr
        assert list(out_dir.iterdir()) == []
