"""The demo engine's live motion: one streaming process behind both the clip and live audio."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from studio import layout
from studio.audio.io import load_audio
from studio.audio.phonetics import PhoneticFrames, analyze
from studio.engines.base import LATENCIES
from studio.engines.demo import demo_audio_path, rig
from studio.engines.demo.engine import DemoEngine
from studio.engines.demo.motion import BLINK_SHAPE, LOOKAHEAD, DemoMotion, generate_motion

FPS = layout.FPS


def _phon(n: int, speech: np.ndarray | None = None, seed: int = 0) -> PhoneticFrames:
    """Synthetic phonetics: silence (zeros) except where ``speech`` is set, there syllables
    (4 Hz loudness, dipping between them), voicing, a spectral shape and a plosive burst
    every 0.6 s."""
    rng = np.random.default_rng(seed)
    on = np.zeros(n, bool) if speech is None else np.asarray(speech, bool)
    j = np.arange(n)
    syllables = np.sqrt(np.clip(np.sin(2 * np.pi * j / 6.25), 0, 1))  # dips between syllables
    level = on * np.clip(0.15 + 0.7 * syllables + 0.1 * rng.random(n), 0, 1)
    voicing = on * np.clip(0.5 + 0.4 * rng.standard_normal(n), 0, 1)
    f = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return PhoneticFrames(
        rms_db=f(np.where(on, -20.0, -90.0)),
        level=f(level),
        flux=f(on * rng.random(n)),
        voicing=f(voicing),
        pitch_hz=f(on * 140.0),
        centroid_hz=f(on * rng.uniform(800, 3500, n)),
        low_ratio=f(on * rng.uniform(0.3, 0.95, n)),
        silence=~on,
        onset=np.zeros(n, bool),
        burst=on & (j % 15 == 7),
    )


def _piece(phon: PhoneticFrames, a: int, b: int) -> PhoneticFrames:
    return PhoneticFrames(**{f.name: getattr(phon, f.name)[a:b] for f in dataclasses.fields(phon)})


def _stream(phon: PhoneticFrames, seed: int, latency: str, rng: np.random.Generator):
    """Push ``phon`` in random pieces (empty ones too) through the engine's motion stream."""
    stream = DemoEngine().motion_stream(seed, latency)
    out, i = [], 0
    while i < phon.num_frames:
        k = int(rng.choice([0, 1, 1, 2, 3, 7, 25]))
        out.append(stream.push(np.zeros(640 * k, np.float32), _piece(phon, i, i + k)))
        i += k
    out.append(stream.finish())
    return np.concatenate(out)


@pytest.fixture(scope="module")
def clip_phon() -> PhoneticFrames:
    audio = load_audio(demo_audio_path())
    return analyze(audio.samples, audio.num_frames)


@pytest.fixture(scope="module")
def paused_phon() -> PhoneticFrames:
    n = 40 * FPS
    j = np.arange(n)
    speech = ((j > 3 * FPS) & (j < 14 * FPS)) | ((j > 20 * FPS) & (j < 33 * FPS))
    return _phon(n, speech, seed=1)


def _pose(m: np.ndarray) -> np.ndarray:
    return layout.pose_degrees(m)


def _exp(m: np.ndarray) -> np.ndarray:
    return m[:, layout.EXP]


@pytest.mark.parametrize("seed", [0, 11])
def test_balanced_stream_is_the_clip_motion_exactly(clip_phon, paused_phon, seed):
    rng = np.random.default_rng(seed)
    for phon in (clip_phon, paused_phon):
        clip = generate_motion(phon, seed)
        assert clip.shape == (phon.num_frames, layout.MOTION_DIM) and clip.dtype == np.float32
        live = _stream(phon, seed, "balanced", rng)
        assert live.dtype == np.float32
        np.testing.assert_array_equal(live, clip)
    assert not np.array_equal(generate_motion(clip_phon, 0), generate_motion(clip_phon, 1))


def test_engine_generate_uses_the_stream(clip_phon):
    audio = load_audio(demo_audio_path())
    np.testing.assert_array_equal(
        DemoEngine().generate(audio, clip_phon, 4), generate_motion(clip_phon, 4)
    )
    assert generate_motion(_phon(0), 0).shape == (0, layout.MOTION_DIM)


def test_low_and_smooth_differ_only_slightly(paused_phon):
    rng = np.random.default_rng(2)
    ref = generate_motion(paused_phon, 5)
    exp_range = np.ptp(_exp(ref), axis=0).max()
    for latency in ("low", "smooth"):
        other = _stream(paused_phon, 5, latency, rng)
        assert other.shape == ref.shape and not np.array_equal(other, ref)
        assert np.abs(_pose(other) - _pose(ref)).max() < 1.0  # degrees
        assert np.abs(_exp(other) - _exp(ref)).mean() < 0.02 * exp_range
        # the slow sway and the blinks are the same: noise and schedule are per frame
        np.testing.assert_allclose(_pose(other)[:, 1], _pose(ref)[:, 1], atol=0.02)


@pytest.mark.parametrize("latency", LATENCIES)
def test_a_row_is_emitted_once_its_lookahead_has_arrived(paused_phon, latency):
    stream = DemoEngine().motion_stream(3, latency)
    lookahead = stream.lookahead_frames
    assert lookahead == LOOKAHEAD[latency] == {"low": 1, "balanced": 2, "smooth": 4}[latency]
    n, total = 200, 0
    for i in range(n):
        total += len(stream.push(np.zeros(640, np.float32), _piece(paused_phon, i, i + 1)))
        assert total == max(0, i + 1 - lookahead)
    assert len(stream.finish()) == lookahead
    assert len(stream.finish()) == 0
    with pytest.raises(RuntimeError):
        stream.push(np.zeros(0, np.float32), _piece(paused_phon, 0, 1))


def test_latency_is_checked():
    with pytest.raises(ValueError, match="low, balanced, smooth"):
        DemoEngine().motion_stream(0, "fast")


def _blink_peaks(m: np.ndarray) -> np.ndarray:
    """Frames where the upper lid is fully closed (the peak of each blink)."""
    lid = _exp(m).reshape(-1, layout.NUM_KP, 3)[:, rig.LID_UPPER_L, 1]
    return np.nonzero(np.isclose(lid, BLINK_SHAPE.max() * rig.BLINK_UPPER_LID))[0]


def test_silence_keeps_the_head_alive():
    n = 60 * FPS
    stream = DemoMotion(seed=9)
    m = np.concatenate([stream.feed(_piece(_phon(n), a, a + 5)) for a in range(0, n, 5)])
    m = np.concatenate([m, stream.finish()])
    assert len(m) == n
    pose = _pose(m)
    assert (np.ptp(pose, axis=0) > 0.5).all()  # sway in every angle
    assert np.abs(np.diff(pose, axis=0)).max() < 0.5  # slowly
    scale = m[:, layout.SCALE.start]
    assert np.ptp(scale) > 0.006  # breathing (0.004 amplitude)
    peaks = _blink_peaks(m)
    assert peaks[0] < 2.4 * FPS + 2
    gaps = np.diff(peaks) / FPS
    assert len(gaps) >= 14 and gaps.min() >= 2.4 and gaps.max() <= 4.0
    assert len(set(np.diff(peaks).tolist())) > 3  # not a metronome
    # the mouth stays closed
    jaw = _exp(m).reshape(-1, layout.NUM_KP, 3)[:, rig.JAW, 1]
    assert np.abs(jaw).max() == 0


def test_a_pause_brings_a_blink(paused_phon):
    m = generate_motion(paused_phon, 0)
    peaks = _blink_peaks(m)
    silence = paused_phon.silence
    starts = np.nonzero(silence[1:] & ~silence[:-1])[0] + 1
    assert len(starts) == 2
    for p in starts:
        assert ((peaks >= p + 2) & (peaks <= p + 5 + 2)).any() or (
            (peaks >= p - 25) & (peaks < p + 2)
        ).any()  # soon after, unless the eyes just blinked


def test_speech_after_silence_takes_over_without_a_jump(paused_phon):
    m = generate_motion(paused_phon, 7)
    dpose = np.abs(np.diff(_pose(m), axis=0)).max(axis=1)
    dexp = np.abs(np.diff(_exp(m), axis=0)).max(axis=1)
    silence = paused_phon.silence
    onsets = np.nonzero(~silence[1:] & silence[:-1])[0] + 1
    inside = np.zeros(len(m) - 1, bool)
    inside[5 * FPS : 13 * FPS] = inside[22 * FPS : 32 * FPS] = True  # well within speech
    for o in onsets:
        near = slice(o - 3, o + 8)
        assert dpose[near].max() <= 1.25 * dpose[inside].max()
        assert dexp[near].max() <= 1.25 * dexp[inside].max()
        assert dpose[o - 10 : o - 2].max() < 0.5  # idle before: no pre-jump either


def test_mouth_follows_the_speech(paused_phon):
    m = generate_motion(paused_phon, 0)
    e = _exp(m).reshape(-1, layout.NUM_KP, 3)
    jaw, lip = e[:, rig.JAW, 1], e[:, rig.LIP_UPPER, 1]
    speech = ~paused_phon.silence
    assert np.abs(jaw[speech]).mean() > 5 * np.abs(jaw[~speech]).mean()
    for b in np.nonzero(paused_phon.burst)[0]:
        assert jaw[b - 2] == jaw[b - 1] == 0  # closed before the burst
        assert np.isclose(lip[b - 1], rig.LIP_PRESS, rtol=1e-5)  # lips pressed
        assert jaw[b] != 0  # popped open at it


def test_state_and_memory_stay_bounded():
    n = 30 * 60 * FPS  # 30 minutes
    j = np.arange(n)
    phon = _phon(n, (j // (7 * FPS)) % 3 != 0, seed=3)  # speech with pauses
    rng = np.random.default_rng(0)
    stream = DemoMotion(seed=1, lookahead=LOOKAHEAD["smooth"])
    total, i, held, pending = 0, 0, 0, 0
    while i < n:
        k = int(rng.integers(0, 60))
        total += len(stream.feed(_piece(phon, i, i + k)))
        i += k
        held = max(held, stream.held_frames)
        pending = max(pending, len(stream._blinks.pending))
    total += len(stream.finish())
    assert total == n
    assert held <= 32 + stream.lookahead_frames + 60
    assert pending <= 2
