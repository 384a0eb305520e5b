"""studio.audio.phonetics.PhoneticStream: live phonetics, a chunk at a time, against analyze()."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from studio.audio.phonetics import PhoneticFrames, PhoneticStream, analyze, frame_count
from studio.layout import SAMPLE_RATE, SAMPLES_PER_FRAME

REPO = Path(__file__).resolve().parents[2]
FIXTURE = "ditto_example_speech_24k.wav"
FIXTURE_DIRS = (REPO.parent / "shared" / "fixtures", Path("/work/shared/fixtures"))
FIELDS = list(PhoneticFrames.__dataclass_fields__)
WARMUP_FRAMES = 50  # 2 s: streaming statistics compared with the clip's only after this


@lru_cache(maxsize=1)
def _demo() -> np.ndarray:
    samples, sr = sf.read(REPO / "resources" / "demo" / "speech.wav", dtype="float32")
    assert sr == SAMPLE_RATE
    return samples


@lru_cache(maxsize=1)
def _fixture() -> np.ndarray | None:
    """The real-speech fixture at 16 kHz (soxr), or None where it is absent."""
    soxr = pytest.importorskip("soxr")
    for folder in FIXTURE_DIRS:
        if (folder / FIXTURE).is_file():
            y, sr = sf.read(folder / FIXTURE, dtype="float32", always_2d=True)
            return soxr.resample(y.mean(axis=1), sr, SAMPLE_RATE).astype(np.float32)
    return None


def _concat(parts: list[PhoneticFrames]) -> PhoneticFrames:
    return PhoneticFrames(**{k: np.concatenate([getattr(p, k) for p in parts]) for k in FIELDS})


def _stream(x: np.ndarray, sizes: Iterable[int], **kwargs: float) -> PhoneticFrames:
    """Push x in chunks of the given sizes (cycled), then finish; all the frames emitted."""
    stream = PhoneticStream(**kwargs)
    parts, i = [], 0
    sizes = list(sizes)
    k = 0
    while i < len(x):
        size = int(sizes[k % len(sizes)])
        k += 1
        parts.append(stream.push(x[i : i + size]))
        i += size
    parts.append(stream.finish())
    assert stream.frames_emitted == frame_count(len(x))
    return _concat(parts)


def _assert_same(a: PhoneticFrames, b: PhoneticFrames) -> None:
    for name in FIELDS:
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_chunking_does_not_change_the_result() -> None:
    x = _demo()
    rng = np.random.default_rng(0)
    reference = _stream(x, [320])
    assert reference.num_frames == frame_count(len(x))
    chunkings = [
        [len(x)],  # all at once
        [0, 1, 1, 0, 2, 639, 641, 1, 0, 5000],
        rng.choice([0, 1, 2, 31, 160, 320, 333, 640, 1280, 4000, 17000], 400),
        rng.integers(0, 1500, 400),
    ]
    for sizes in chunkings:
        _assert_same(_stream(x, sizes), reference)


def test_frame_count_after_finish() -> None:
    rng = np.random.default_rng(1)
    for n in (0, 1, 639, 640, 641, 1919, SAMPLE_RATE, SAMPLE_RATE + 1, 3 * SAMPLE_RATE + 7):
        x = (0.1 * rng.standard_normal(n)).astype(np.float32)
        frames = _stream(x, [333])
        assert frames.num_frames == frame_count(n), n
        for name in FIELDS:  # every field: one entry per frame, as analyze() gives
            assert getattr(frames, name).shape == (frame_count(n),), name
            assert getattr(frames, name).dtype == getattr(analyze(x), name).dtype, name


def test_finish_ends_the_stream() -> None:
    stream = PhoneticStream()
    assert stream.push(np.zeros(0, np.float32)).num_frames == 0
    stream.push(np.zeros(1000, np.float32))
    assert stream.finish().num_frames == 2  # nothing final before: 1000 samples = 2 frames
    assert stream.frames_emitted == 2
    assert stream.finish().num_frames == 0
    with pytest.raises(RuntimeError):
        stream.push(np.zeros(10, np.float32))


def test_frame_is_emitted_once_its_lookahead_is_in() -> None:
    x = _demo()[: 3 * SAMPLE_RATE]
    stream = PhoneticStream()
    lookahead = stream.lookahead_frames
    assert 0 <= lookahead <= 2
    total = 0
    for size in np.random.default_rng(2).integers(0, 200, 400):
        out = stream.push(x[total : total + size])
        before = stream.frames_emitted - out.num_frames
        total += size
        # frame j is final exactly when the audio up to the end of frame j + lookahead is in
        assert stream.frames_emitted == max(0, total // SAMPLES_PER_FRAME - lookahead), total
        assert before >= 0


def test_streaming_matches_analyze_on_real_speech() -> None:
    x = _fixture()
    if x is None:
        pytest.skip(f"{FIXTURE} not found in {', '.join(map(str, FIXTURE_DIRS))}")
    live = _stream(x, [320])
    clip = analyze(x)
    assert live.num_frames == clip.num_frames
    after = slice(WARMUP_FRAMES, None)
    # clip-relative: the running statistics of the last 10 s against the whole clip's
    assert np.mean(live.silence[after] == clip.silence[after]) >= 0.95
    assert np.corrcoef(live.level[after], clip.level[after])[0, 1] >= 0.95
    # local measures: the same, up to float rounding (voicing and pitch are gated by silence)
    np.testing.assert_array_equal(live.rms_db, clip.rms_db)
    np.testing.assert_allclose(live.centroid_hz, clip.centroid_hz, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(live.low_ratio, clip.low_ratio, rtol=1e-5, atol=1e-6)
    same = live.silence == clip.silence
    np.testing.assert_allclose(live.voicing[same], clip.voicing[same], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(live.pitch_hz[same], clip.pitch_hz[same], rtol=1e-5, atol=1e-3)
    # the first frames are usable: the leading pause reads as silence from frame 0
    assert live.silence[:8].all()
    # bursts and onsets: from the same local measures, nearly the same frames
    assert np.mean(live.burst == clip.burst) >= 0.97
    assert np.mean(live.onset == clip.onset) >= 0.97


def test_burst_and_onset_once_whatever_the_push_boundary() -> None:
    rng = np.random.default_rng(0)
    x = np.zeros(SAMPLE_RATE, np.float32)
    start = 8 * SAMPLES_PER_FRAME + 300  # inside frame 8, as analyze()'s test
    x[start : start + 3200] = 0.2 * rng.standard_normal(3200)
    for offset in range(0, 640, 37):  # push boundaries all around the burst
        frames = _stream(x, [offset + 1, 320])
        assert np.flatnonzero(frames.burst).tolist() == [8], offset
        assert np.flatnonzero(frames.onset).tolist() == [8], offset
        assert frames.silence[:7].all() and not frames.silence[9:13].any()


def test_silence_only_is_silent() -> None:
    rng = np.random.default_rng(3)
    for x in (
        np.zeros(20 * SAMPLE_RATE, np.float32),
        (10 ** (-90 / 20) * rng.standard_normal(20 * SAMPLE_RATE)).astype(np.float32),
    ):
        frames = _stream(x, [320])
        assert frames.silence.all()
        assert not frames.burst.any() and not frames.onset.any()
        assert not frames.voicing.any() and not frames.pitch_hz.any()


def test_long_pause_after_speech_stays_silent() -> None:
    """Idle life: after the speech leaves the 10 s history, a pause is still a pause."""
    rng = np.random.default_rng(4)
    pause = (10 ** (-85 / 20) * rng.standard_normal(15 * SAMPLE_RATE)).astype(np.float32)
    frames = _stream(np.concatenate([_demo(), pause]), [320])
    tail = frames.silence[-frame_count(len(pause)) + 5 :]
    assert tail.all()


def test_memory_stays_bounded() -> None:
    """Ten minutes of speech-like audio in 0.5 s chunks: the state stops growing."""
    stream = PhoneticStream(history_s=10.0)
    rng = np.random.default_rng(5)
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    sizes, emitted = [], 0
    for i in range(2 * 60 * 10):
        x = 0.1 * np.sin(2 * np.pi * (100 + 60 * rng.random()) * t)
        x += 0.01 * rng.standard_normal(len(t))
        if i % 3 == 2:
            x *= 0.001  # a pause
        emitted += stream.push(x.astype(np.float32)).num_frames
        sizes.append(stream._state_size())
    emitted += stream.finish().num_frames
    assert emitted == frame_count(10 * 60 * SAMPLE_RATE)
    assert max(sizes) < 60_000  # values: histories of 10 s plus a few frames of context
    assert max(sizes[120:]) <= max(sizes[:120])  # nothing grows after the first minute
