"""The live composition on the demo engine: frames leave while the audio is still arriving,
the first frame does not wait for the clip, the acceleration bound holds across chunks, and
silence keeps the head alive."""

from __future__ import annotations

import numpy as np
import pytest

from studio import layout
from studio.audio.io import load_audio
from studio.engines.base import LATENCIES
from studio.engines.demo import demo_audio_path
from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.render.engines import open_engine
from studio.render.stream import LiveSession, ReplayClock
from studio.settings import RenderSettings

CHUNK = 320


@pytest.fixture(scope="module")
def engine():
    return open_engine(RenderSettings(backend="demo", size=128))


@pytest.fixture(scope="module")
def speech():
    return load_audio(demo_audio_path()).samples


def settings(**kw):
    return RenderSettings(backend="demo", size=128, **kw)


def feed_all(session, samples, until=None):
    """Feed in 20 ms chunks on the session's replay clock; (frames, samples fed when each
    frame came out)."""
    frames, fed_at = [], []
    for start in range(0, len(samples), CHUNK):
        chunk = samples[start : start + CHUNK]
        if isinstance(session.clock, ReplayClock):
            session.clock.arrive(len(chunk))
        got = session.feed(chunk)
        frames += got
        fed_at += [session.received_samples] * len(got)
        if until is not None and len(frames) >= until:
            return frames, fed_at
    frames += session.finish()
    return frames, fed_at


@pytest.mark.parametrize("latency", LATENCIES)
def test_frames_leave_while_the_audio_arrives_each_after_its_lookahead(engine, speech, latency):
    s = settings()
    session = LiveSession(engine, s, latency, ReplayClock())
    frames, fed_at = feed_all(session, speech)
    n = -(-len(speech) * FPS // SAMPLE_RATE)
    assert [f.index for f in frames] == list(range(n))  # every frame once, in order
    ahead = session.lookahead_frames
    for f, fed in zip(frames, fed_at, strict=False):
        # a frame needs at most its lookahead of audio (plus the chunk it arrived in)
        assert fed <= (f.index + 1 + ahead) * SAMPLES_PER_FRAME + CHUNK, (f.index, fed)
    assert fed_at[0] < len(speech) // 4  # long before the audio ended
    for f in frames[:: max(1, n // 7)]:
        start = f.index * SAMPLES_PER_FRAME
        want = np.zeros(SAMPLES_PER_FRAME, np.float32)
        part = speech[start : start + SAMPLES_PER_FRAME]
        want[: part.size] = part
        np.testing.assert_array_equal(f.audio, np.clip(want, -1, 1))
        assert f.image.shape == (128, 128, 3) and f.image.dtype == np.uint8
    rep = session.report()
    assert rep["frames"] == n and rep["lookahead_frames"] == ahead
    assert rep["latency_ms"]["p95"] >= rep["wait_ms"]["p50"] >= 0


def test_the_first_frame_does_not_wait_for_the_clip(engine, speech):
    fed = []
    for seconds in (1, 60):
        clip = np.resize(speech, seconds * SAMPLE_RATE).astype(np.float32)
        session = LiveSession(engine, settings(), "balanced", ReplayClock())
        _, fed_at = feed_all(session, clip, until=1)
        fed.append(fed_at[0])
        assert session.stats.first_frame_s is not None
    assert fed[0] == fed[1] < SAMPLE_RATE // 2  # the same audio, not the clip, came first


@pytest.mark.parametrize("latency", LATENCIES)
def test_the_acceleration_bound_holds_across_chunk_boundaries(engine, speech, latency):
    limit = 0.05  # well below what the motion does, so the limiter is busy
    s = settings(accel_limit=limit, stride="auto")
    session = LiveSession(engine, s, latency, ReplayClock(), keep_motion=True)
    feed_all(session, speech)
    motion = np.concatenate(session.post_rows)
    deg = layout.pose_degrees(motion).astype(np.float64)
    accel = np.abs(np.diff(deg, n=2, axis=0)).max()
    assert accel <= limit * (1 + 1e-3) + 1e-6, accel
    assert session.report()["kinematics"]["accel_max"] <= limit * (1 + 1e-3) + 1e-6


def test_silence_keeps_the_head_alive(engine):
    session = LiveSession(engine, settings(), "balanced", ReplayClock())
    silence = np.zeros(12 * SAMPLE_RATE, np.float32)
    frames, fed_at = feed_all(session, silence)
    assert len(frames) == 12 * FPS
    # frames kept coming while silence arrived, not only at the end
    assert sum(fed <= 6 * SAMPLE_RATE for fed in fed_at) >= 6 * FPS - session.lookahead_frames
    images = np.stack([f.image for f in frames]).astype(np.int16)
    change = np.abs(np.diff(images, axis=0)).mean(axis=(1, 2, 3))
    assert (change > 0).mean() > 0.5  # breathing and swaying: the picture moves
    assert change.max() > 5 * np.median(change[change > 0])  # blinks stand out


def test_a_second_feed_after_finish_is_refused(engine):
    session = LiveSession(engine, settings(), "balanced")
    session.feed(np.zeros(CHUNK, np.float32))
    session.finish()
    assert session.finish() == []
    with pytest.raises(RuntimeError):
        session.feed(np.zeros(CHUNK, np.float32))


def test_an_unknown_latency_is_named():
    from studio.errors import OptionError

    with pytest.raises(OptionError, match="--latency"):
        LiveSession(open_engine(RenderSettings(backend="demo", size=64)), settings(), "fast")


def test_the_figures_keep_the_last_values_in_fixed_memory():
    from studio.render.stream import Ring, percentiles_ms

    ring = Ring(4)
    assert percentiles_ms(ring) == {"p50": None, "p95": None, "max": None}
    before = ring._data.nbytes
    for v in range(10):
        ring.append(v / 1000.0)
    assert ring.values().tolist() == pytest.approx([0.006, 0.007, 0.008, 0.009])
    assert len(ring) == 4 and ring._data.nbytes == before
    assert percentiles_ms(ring)["max"] == pytest.approx(9.0)
