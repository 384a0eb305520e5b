"""studio.audio.phonetics against the espeak-ng demo clip's ground truth and synthetic signals."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from studio.audio import phonetics
from studio.audio.phonetics import PhoneticFrames, analyze
from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "resources" / "demo"
FIXTURE_NAME = "ditto_example_speech_24k.wav"
FIXTURE_DIRS = (
    Path(__file__).resolve().parents[3] / "shared" / "fixtures",
    Path("/work/shared/fixtures"),
)


@lru_cache(maxsize=1)
def _demo() -> tuple[np.ndarray, dict, PhoneticFrames]:
    samples, sr = sf.read(DEMO / "speech.wav", dtype="float32")
    assert sr == SAMPLE_RATE and samples.ndim == 1
    truth = json.loads((DEMO / "speech_phonemes.json").read_text())
    return samples, truth, analyze(samples)


def _frame(t: float) -> int:
    return int(np.floor(t * FPS))


def _releases(truth: dict, affricates: bool = False) -> np.ndarray:
    times = list(truth["plosive_releases_s"])
    if affricates:
        times += truth["affricate_releases_s"]
    return np.array([_frame(t) for t in times])


def _frames_inside(start_s: float, end_s: float, margin: int = 0) -> np.ndarray:
    """Frames lying entirely inside [start_s, end_s), minus margin frames at each edge."""
    first = int(np.ceil(start_s * FPS)) + margin
    stop = int(np.floor(end_s * FPS)) - margin
    return np.arange(first, max(first, stop))


# --- the demo clip and its ground truth ------------------------------------------------------


def test_demo_assets_match_their_ground_truth() -> None:
    samples, truth, _ = _demo()
    assert truth["sample_rate"] == SAMPLE_RATE
    assert len(samples) / SAMPLE_RATE == pytest.approx(truth["duration_s"], abs=1e-3)
    assert 8.0 <= truth["duration_s"] <= 12.0
    assert (DEMO / "speech.wav").stat().st_size < 400_000
    assert 0.8 < np.max(np.abs(samples)) <= 1.0  # peak-normalised to about -1 dBFS
    kinds = [p["kind"] for p in truth["phonemes"]]
    assert kinds.count("plosive") >= 20 and len(truth["plosive_releases_s"]) >= 20
    assert len(truth["silences"]) >= 3
    for start, end in truth["silences"]:  # the inserted pauses are digital silence
        inner = samples[int(start * SAMPLE_RATE) + 10 : int(end * SAMPLE_RATE) - 10]
        assert np.max(np.abs(inner)) < 1e-3


def test_burst_recall_on_plosive_releases() -> None:
    _, truth, frames = _demo()
    bursts = np.flatnonzero(frames.burst)
    releases = _releases(truth)
    hit = [np.any(np.abs(bursts - r) <= 1) for r in releases]
    assert np.mean(hit) >= 0.8, f"recall {np.mean(hit):.2f}, missed {releases[~np.array(hit)]}"


def test_burst_precision() -> None:
    # +-1 frame: a random choice of speech frames scores ~0.6 here, so 0.85 means something
    _, truth, frames = _demo()
    bursts = np.flatnonzero(frames.burst)
    releases = _releases(truth, affricates=True)
    assert len(bursts) <= 1.3 * len(releases)
    near = [np.any(np.abs(releases - b) <= 1) for b in bursts]
    assert np.mean(near) >= 0.85, f"precision {np.mean(near):.2f}, stray {bursts[~np.array(near)]}"


def test_inserted_pauses_are_silent_without_bursts() -> None:
    _, truth, frames = _demo()
    for start, end in truth["silences"]:
        idx = _frames_inside(start, end, margin=2)
        assert len(idx) >= 4
        assert frames.silence[idx].all(), (start, end)
        assert not frames.burst[idx].any(), (start, end)
        assert np.all(frames.voicing[idx] < 0.1) and np.all(frames.pitch_hz[idx] == 0)


def test_speech_frames_are_not_silent() -> None:
    _, truth, frames = _demo()
    speech = np.zeros(frames.num_frames, bool)
    for p in truth["phonemes"]:
        if p["kind"] != "pause":
            speech[_frames_inside(p["start_s"], p["end_s"])] = True
    assert speech.sum() > 80
    assert frames.silence[speech].mean() <= 0.05
    assert np.median(frames.level[speech]) > 0.6


def test_voicing_high_on_vowels() -> None:
    _, truth, frames = _demo()
    vowel = np.zeros(frames.num_frames, bool)
    for p in truth["phonemes"]:
        if p["kind"] == "vowel":
            vowel[_frames_inside(p["start_s"], p["end_s"])] = True
    assert vowel.sum() > 40
    assert np.median(frames.voicing[vowel]) >= 0.75
    assert np.mean(frames.voicing[vowel] > 0.5) >= 0.75
    pitch = frames.pitch_hz[vowel & (frames.pitch_hz > 0)]
    assert 80 <= np.median(pitch) <= 130  # espeak-ng's en-us male voice


def test_measurements_do_not_depend_on_gain() -> None:
    samples, _, frames = _demo()
    quiet = analyze(samples * 10 ** (-30 / 20))
    np.testing.assert_array_equal(quiet.silence, frames.silence)
    assert np.mean(quiet.burst == frames.burst) >= 0.98
    np.testing.assert_allclose(quiet.level, frames.level, atol=0.05)
    np.testing.assert_allclose(quiet.voicing, frames.voicing, atol=0.05)


# --- synthetic signals -----------------------------------------------------------------------


def test_white_noise_after_silence_is_a_burst_and_an_onset() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros(SAMPLE_RATE, np.float32)
    start = 8 * SAMPLES_PER_FRAME + 300  # inside frame 8
    x[start : start + 3200] = 0.2 * rng.standard_normal(3200)
    frames = analyze(x)
    assert np.flatnonzero(frames.burst).tolist() == [8]
    assert frames.onset[8] and not frames.onset[:8].any()
    assert frames.silence[:7].all() and not frames.silence[9:13].any()
    assert frames.centroid_hz[10] > 3000 and frames.voicing[10] < 0.3
    assert frames.flux[8] > 0.5 and frames.flux[10] < 0.3


def test_steady_harmonic_tone_is_voiced_at_its_pitch() -> None:
    f0 = 150.0
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    x = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 12)).astype(np.float32) * 0.1
    frames = analyze(x)
    interior = slice(3, frames.num_frames - 3)
    assert np.all(frames.voicing[interior] > 0.9)
    np.testing.assert_allclose(frames.pitch_hz[interior], f0, rtol=0.02)
    assert not frames.burst[interior].any()
    assert not frames.silence.any()
    assert np.all(frames.low_ratio[interior] > 0.8)  # nearly all of 1/k harmonics lie below 1 kHz


def test_frame_bookkeeping() -> None:
    one_second = analyze(np.zeros(SAMPLE_RATE, np.float32))
    assert one_second.num_frames == 25
    assert analyze(np.zeros(SAMPLE_RATE + 1, np.float32)).num_frames == 26
    assert analyze(np.zeros(100, np.float32)).num_frames == 1
    assert analyze(np.zeros(0, np.float32)).num_frames == 0
    assert one_second.silence.all() and not one_second.burst.any()

    rng = np.random.default_rng(1)
    x = (0.1 * rng.standard_normal(SAMPLE_RATE // 2)).astype(np.float32)
    padded = analyze(x, num_frames=20)  # 12.5 frames of audio, zero-padded to 20
    assert padded.num_frames == 20
    for name in PhoneticFrames.__dataclass_fields__:
        arr = getattr(padded, name)
        assert arr.shape == (20,), name
        assert arr.dtype == (bool if name in ("silence", "onset", "burst") else np.float32), name
    assert not padded.silence[:12].any() and padded.silence[13:].all()
    assert analyze(x, num_frames=5).num_frames == 5  # longer audio is cut


# --- real speech (shared fixture, optional) ----------------------------------------------------


def _fixture() -> Path | None:
    for folder in FIXTURE_DIRS:
        if (folder / FIXTURE_NAME).is_file():
            return folder / FIXTURE_NAME
    return None


def test_real_speech_fixture() -> None:
    path = _fixture()
    if path is None:
        pytest.skip(f"{FIXTURE_NAME} not found in {', '.join(map(str, FIXTURE_DIRS))}")
    from scipy.signal import resample_poly

    y, sr = sf.read(path, dtype="float32", always_2d=True)
    x = resample_poly(y.mean(axis=1), SAMPLE_RATE, sr).astype(np.float32)
    frames = analyze(x)
    duration = len(x) / SAMPLE_RATE
    assert frames.silence[: int(0.3 * FPS)].all()  # the clip starts with a pause
    assert 0.05 <= frames.silence.mean() <= 0.35
    speech = ~frames.silence
    assert np.median(frames.voicing[speech]) > 0.7
    assert 150 <= np.median(frames.pitch_hz[frames.pitch_hz > 0]) <= 260  # a female voice
    rate = frames.burst.sum() / duration
    assert 1.0 <= rate <= 4.0, f"{rate:.2f} bursts/s"
    assert not (frames.burst & frames.silence).any()
    assert frames.onset.sum() >= 10


def test_burst_times_are_sub_frame_accurate() -> None:
    samples, truth, frames = _demo()
    times = phonetics.burst_times(samples)
    np.testing.assert_array_equal(
        np.unique((times * FPS).astype(int)), np.flatnonzero(frames.burst)
    )
    releases = np.array(truth["plosive_releases_s"])
    err = np.array([np.min(np.abs(releases - t)) for t in times])
    assert np.median(err) < 0.005


def test_nanmedian_rows_is_numpys() -> None:
    """The pitch median (a row's voiced sub-frames) is np.nanmedian's, value for value."""
    rng = np.random.default_rng(2)
    for rows in (1, 3, 700):
        f0 = 70.0 + 330.0 * rng.random((rows, phonetics.SUBFRAMES))
        f0[rng.random(f0.shape) < 0.5] = np.nan
        f0[:, 0] = np.where(np.isfinite(f0).any(axis=1), f0[:, 0], 100.0)  # one voiced at least
        np.testing.assert_array_equal(phonetics._nanmedian_rows(f0), np.nanmedian(f0, axis=1))
