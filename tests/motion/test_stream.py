"""The streaming post-processing (cadence + pose smoothing) against its rules and the clip."""

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy.ndimage import gaussian_filter1d

from studio import layout
from studio.audio.phonetics import PhoneticFrames, analyze
from studio.motion.cadence import (
    CadencePlan,
    CadenceThresholds,
    frame_strides,
    plan_cadence,
    pose_stride_cap,
    sample_motion,
)
from studio.motion.kinematics import (
    SmoothingSettings,
    accel_max,
    channel_limits,
    pose_channels,
    second_difference,
    smooth_motion,
)
from studio.motion.stream import LATENCY, PostChunk, PostPreset, PostStream, limit_step

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo"
LATENCIES = tuple(LATENCY)
TH = CadenceThresholds()
SMOOTH = SmoothingSettings()
LONG = PostPreset(budget=40, max_stride=3, cue_ahead=7)  # enough lookahead to match the clip


def _phon(n: int, rng: np.random.Generator) -> PhoneticFrames:
    """Phonetic frames with speech-like variety: pauses, bursts, onsets, fast and calm runs."""
    u = lambda: rng.uniform(0, 1, n).astype(np.float32)  # noqa: E731
    silence = np.repeat(rng.uniform(0, 1, n // 10 + 1) < 0.3, 10)[:n]
    return PhoneticFrames(
        rms_db=(u() * 60 - 70),
        level=u(),
        flux=u() ** 2,
        voicing=u(),
        pitch_hz=u() * 200,
        centroid_hz=u() * 3000,
        low_ratio=u(),
        silence=silence,
        onset=rng.uniform(0, 1, n) < 0.04,
        burst=rng.uniform(0, 1, n) < 0.04,
    )


def _motion(n: int, rng: np.random.Generator, jumpy: bool) -> np.ndarray:
    """[n, 265] rows: a wandering head, with jumps of several degrees when ``jumpy``."""
    steps = rng.normal(0, 0.3, (n, 3))
    if jumpy:
        steps += (rng.uniform(0, 1, (n, 3)) < 0.08) * rng.normal(0, 6, (n, 3))
    ang = np.clip(np.cumsum(steps, axis=0), -50, 50)
    frames = layout.MotionFrames(
        scale=np.ones(n, np.float32),
        pitch=ang[:, 0],
        yaw=ang[:, 1],
        roll=ang[:, 2],
        t=np.cumsum(rng.normal(0, 0.01 if jumpy else 0.001, (n, 3)), axis=0).astype(np.float32),
        exp=rng.normal(0, 0.02, (n, layout.NUM_KP, layout.KP_DIMS)).astype(np.float32),
    )
    return layout.pack(frames)


def _slice(phon: PhoneticFrames, lo: int, hi: int) -> PhoneticFrames:
    return PhoneticFrames(**{f.name: getattr(phon, f.name)[lo:hi] for f in fields(phon)})


def _run(stream, motion, phon, sizes, chunks=None):
    """Push in pieces of the given sizes (cycled), then finish; the whole output."""
    out, i, k = PostChunk.empty(), 0, 0
    while i < len(motion):
        n = int(sizes[k % len(sizes)])
        piece = stream.push(motion[i : i + n], _slice(phon, i, i + n))
        if chunks is not None:
            chunks.append(piece)
        out, i, k = out.concat(piece), i + n, k + 1
    tail = stream.finish()
    if chunks is not None:
        chunks.append(tail)
    return out.concat(tail)


@pytest.fixture(scope="module")
def demo():
    x, _ = sf.read(DEMO / "speech.wav", dtype="float32")
    from studio.engines.demo.motion import generate_motion  # reading it in tests only

    phon = analyze(x)
    return phon, generate_motion(phon)


@pytest.mark.parametrize("latency", LATENCIES)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_accel_bound_holds_on_everything_emitted_across_chunk_boundaries(latency, seed):
    rng = np.random.default_rng(seed)
    n = 260
    motion, phon = _motion(n, rng, jumpy=True), _phon(n, rng)
    for limit in (0.5, 0.05):
        smoothing = SmoothingSettings(accel_limit=limit)
        stream = PostStream("auto", TH, smoothing, latency)
        out = _run(stream, motion, phon, rng.integers(0, 13, 64))
        assert len(out) == n
        assert accel_max(out.motion) <= limit  # angles as decoded from the emitted rows
        d2_t = np.abs(second_difference(out.motion[:, layout.T].astype(np.float64)))
        assert d2_t.max() <= limit * layout.T_UNITS_PER_DEGREE * (1 + 1e-4)
        assert stream.kinematics()["accel_max"] <= limit
        # jumps this large are cut: the limiter really was at work
        assert (
            accel_max(sample_motion(motion, CadencePlan(out.strides, np.flatnonzero(out.keyframe))))
            > 10 * limit
        )


@pytest.mark.parametrize("latency", LATENCIES)
@pytest.mark.parametrize("stride", ["auto", 1, 2, 3])
def test_frames_leave_in_order_once_with_their_next_keyframe(latency, stride):
    rng = np.random.default_rng(3)
    n = 150
    motion, phon = _motion(n, rng, jumpy=False), _phon(n, rng)
    chunks: list[PostChunk] = []
    _run(PostStream(stride, TH, SMOOTH, latency), motion, phon, rng.integers(0, 9, 40), chunks)
    expect, keys = 0, set()
    for c in chunks:
        assert c.start == expect and c.indices.tolist() == list(range(expect, expect + len(c)))
        assert c.motion.shape == (len(c), layout.MOTION_DIM) and c.motion.dtype == np.float32
        keys |= set(c.indices[c.keyframe].tolist())
        last = expect + len(c) - 1
        assert np.all(c.next_key <= last)  # the renderer already has (or gets now) the key
        assert np.all((c.prev_key <= c.indices) & (c.indices <= c.next_key))
        assert np.array_equal(c.keyframe, c.next_key == c.indices)
        assert np.all(c.weight[c.keyframe] == 0) and np.all((c.weight >= 0) & (c.weight < 1))
        assert set(c.prev_key.tolist()) <= keys and set(c.next_key.tolist()) <= keys
        expect += len(c)
    assert expect == n and 0 in keys and n - 1 in keys
    assert len(PostChunk.empty(7)) == 0 and PostChunk.empty(7).indices.size == 0


@pytest.mark.parametrize("latency", [*LATENCIES, LONG])
@pytest.mark.parametrize("stride", ["auto", 2])
def test_a_frame_leaves_once_its_lookahead_has_arrived(latency, stride):
    rng = np.random.default_rng(4)
    n = 90
    motion, phon = _motion(n, rng, jumpy=True), _phon(n, rng)
    stream = PostStream(stride, TH, SMOOTH, latency)
    budget = latency.budget if isinstance(latency, PostPreset) else LATENCY[latency].budget
    assert stream.lookahead_frames <= budget
    emitted = 0
    for m in range(n):
        emitted += len(stream.push(motion[m : m + 1], _slice(phon, m, m + 1)))
        assert emitted >= m + 1 - stream.lookahead_frames
    assert emitted + len(stream.finish()) == n


@pytest.mark.parametrize("latency", LATENCIES)
def test_the_output_does_not_depend_on_the_chunking(latency):
    rng = np.random.default_rng(5)
    n = 200
    motion, phon = _motion(n, rng, jumpy=True), _phon(n, rng)
    runs = [
        _run(PostStream("auto", TH, SMOOTH, latency), motion, phon, sizes)
        for sizes in ([n], [1], [3, 0, 7, 1, 16], rng.integers(0, 25, 50))
    ]
    for other in runs[1:]:
        np.testing.assert_array_equal(other.keyframe, runs[0].keyframe)
        np.testing.assert_array_equal(other.strides, runs[0].strides)
        np.testing.assert_allclose(other.weight, runs[0].weight)
        np.testing.assert_allclose(
            pose_channels(other.motion), pose_channels(runs[0].motion), atol=1e-5
        )
        np.testing.assert_array_equal(other.motion[:, layout.EXP], runs[0].motion[:, layout.EXP])


def test_with_a_long_lookahead_the_stream_is_the_clip(demo):
    phon, raw = demo
    plan = plan_cadence(phon, "auto", TH, motion=raw)
    offline = smooth_motion(sample_motion(raw, plan), SMOOTH)
    stream = PostStream("auto", TH, SMOOTH, LONG)
    out = _run(stream, raw, phon, [1, 4, 2, 9])
    assert np.array_equal(np.flatnonzero(out.keyframe), plan.keyframes)
    assert np.array_equal(out.strides, plan.strides)
    np.testing.assert_array_equal(out.motion[:, layout.EXP], offline[:, layout.EXP])
    diff = np.abs(layout.pose_degrees(out.motion) - layout.pose_degrees(offline))
    print(f"long lookahead vs clip: max {diff.max():.2e} deg, mean {diff.mean():.2e} deg")
    assert diff.max() < 0.01 and diff.mean() < 1e-3


@pytest.mark.parametrize("latency", LATENCIES)
def test_presets_stay_near_the_clip_on_the_demo(demo, latency):
    phon, raw = demo
    plan = plan_cadence(phon, "auto", TH, motion=raw)
    offline = smooth_motion(sample_motion(raw, plan), SMOOTH)
    out = _run(PostStream("auto", TH, SMOOTH, latency), raw, phon, [2, 1, 3])
    diff = np.abs(layout.pose_degrees(out.motion) - layout.pose_degrees(offline))
    print(f"{latency} vs clip: max {diff.max():.3f} deg, mean {diff.mean():.4f} deg")
    assert diff.max() < 0.5 and diff.mean() < 0.05


@pytest.mark.parametrize("latency", [*LATENCIES, LONG])
@pytest.mark.parametrize("stride", ["auto", 1, 2, 3])
def test_keyframes_cover_every_frames_stride(latency, stride):
    rng = np.random.default_rng(6)
    n = 160
    motion, phon = _motion(n, rng, jumpy=False), _phon(n, rng)
    th = replace(TH, max_warp_px=64.0, max_lid_px=64.0)  # random motion: large moves, lids too
    stream = PostStream(stride, th, SMOOTH, latency)
    out = _run(stream, motion, phon, rng.integers(1, 11, 30))
    keys = np.flatnonzero(out.keyframe)
    assert keys[0] == 0 and keys[-1] == n - 1
    assert out.strides.max() <= stream.max_stride
    for a, b in zip(keys[:-1], keys[1:], strict=True):
        assert 1 <= b - a <= out.strides[a : b + 1].min()
    if stride != "auto":
        s = min(int(stride), stream.max_stride)
        assert np.all(out.strides == s) and np.all(np.diff(keys)[:-1] == s)
    else:
        assert out.strides.min() == 1
        assert stream.max_stride == 1 or (out.strides > 1).any()


def test_smoothing_disabled_passes_the_rows_through():
    rng = np.random.default_rng(7)
    n = 120
    motion, phon = _motion(n, rng, jumpy=True), _phon(n, rng)
    off = SmoothingSettings(enabled=False)
    out = _run(PostStream(1, TH, off, "balanced"), motion, phon, [5, 1, 8])
    assert np.array_equal(out.motion, motion)
    for latency in LATENCIES:
        out = _run(PostStream("auto", TH, off, latency), motion, phon, [4, 0, 3])
        plan = CadencePlan(out.strides, np.flatnonzero(out.keyframe))
        clip = sample_motion(motion, plan)  # angles re-encoded in other blocks: to rounding
        np.testing.assert_array_equal(out.motion[:, layout.T.start :], clip[:, layout.T.start :])
        np.testing.assert_allclose(pose_channels(out.motion), pose_channels(clip), atol=1e-6)


@pytest.mark.parametrize("latency", LATENCIES)
def test_jerk_at_emission_boundaries_is_that_of_any_frame_on_demo_motion(demo, latency):
    phon, raw = demo
    rng = np.random.default_rng(8)
    stream = PostStream("auto", TH, SMOOTH, latency)
    _run(stream, raw, phon, rng.integers(1, 9, 64))
    k = stream.kinematics()
    print(latency, {key: round(v, 3) for key, v in k.items()})
    assert k["frames"] == raw.shape[0] and k["boundaries"] >= 20
    assert k["accel_max"] <= SMOOTH.accel_limit
    assert k["boundary_jerk_ratio"] <= 1.5
    # the peak of the three straddling entries, against that of every frame alike
    jerk = np.asarray(_all_jerk(stream, raw, phon))
    every = np.mean([jerk[j : j + 3].max() for j in range(jerk.size - 2)])
    assert k["boundary_jerk_peak"] <= 1.5 * every


def _all_jerk(stream, raw, phon):
    from studio.motion.kinematics import pose_jerk

    again = PostStream("auto", TH, SMOOTH, stream.preset)
    return pose_jerk(_run(again, raw, phon, [raw.shape[0]]).motion)


def test_memory_stays_bounded_over_a_long_push():
    rng = np.random.default_rng(9)
    n = 1500  # a minute of frames
    motion, phon = _motion(n, rng, jumpy=True), _phon(n, rng)
    stream = PostStream("auto", TH, SMOOTH, "smooth")
    held, total, i = [], 0, 0
    for size in np.tile([1, 0, 2, 1, 3, 1], n):
        if i >= n:
            break
        total += len(stream.push(motion[i : i + size], _slice(phon, i, i + size)))
        held.append(stream.buffered_frames)
        i += size
    total += len(stream.finish())
    assert total == n
    assert max(held) <= 32  # a few lookaheads' worth, however long the session
    assert max(held[len(held) // 2 :]) <= max(held[: len(held) // 10]) + 4  # no growth


def test_motion_ahead_of_phonetics_waits_for_them_in_auto():
    rng = np.random.default_rng(10)
    motion, phon = _motion(40, rng, jumpy=False), _phon(40, rng)
    stream = PostStream("auto", TH, SMOOTH, "low")
    assert len(stream.push(motion, _slice(phon, 0, 5))) <= 5
    rest = stream.push(motion[:0], _slice(phon, 5, 40))
    assert len(rest) > 20 and len(stream.finish()) + len(rest) + 5 >= 40


def test_limit_step_keeps_feasible_targets_and_bounds_the_rest():
    lim = channel_limits(0.5)
    past = np.zeros((2, 6))
    calm = np.outer(np.arange(1, 9) ** 2 * 0.2, np.ones(6)) * [1, 1, 1, 0.01, 0.01, 0.01]
    np.testing.assert_array_equal(limit_step(past, calm, lim), calm[0])
    jump = np.full((8, 6), 30.0)
    x = limit_step(past, jump, lim)
    assert np.all(np.abs(x) <= lim + 1e-12) and np.all(x > 0)
    # no past: the first value is free (no constraint can involve it yet)
    np.testing.assert_allclose(limit_step(past[:0], jump, lim), jump[0], atol=1e-6)


def test_the_cadence_pieces_keep_the_clip_results():
    rng = np.random.default_rng(11)
    motion = _motion(80, rng, jumpy=True)
    deg = gaussian_filter1d(layout.pose_degrees(motion), 1.5, axis=0)  # the former smoothing
    speed = np.abs(np.diff(deg, axis=0, prepend=deg[:1])).max(axis=1)
    speed = np.maximum(speed, np.roll(speed, -1))
    cap = np.ones(speed.size, dtype=np.int64)
    for s in (2, 3):
        cap[speed * s <= 1.5] = s
    np.testing.assert_array_equal(pose_stride_cap(motion, 1.5), cap)
    phon = _phon(3, rng)  # shorter than the plosive guard's window: no longer an error
    assert frame_strides(phon, CadenceThresholds(plosive_guard=3)).shape == (3,)
