"""The Ditto engine's live motion (motion_stream): the clip's frames, chunking, lookahead, silence.

Runs the reduced random-weight tree (``ditto_assets``) on the CPU, HuBERT being the ONNX
stand-in, with 2 DDIM steps.
"""

import numpy as np
import pytest

from studio.audio.features import num_feature_frames
from studio.audio.io import audio_from_array
from studio.engines.base import LATENCIES
from studio.layout import MOTION_DIM, SAMPLES_PER_FRAME
from studio.motion.live_lmdm import LIVE_PLANS, live_plan
from studio.render.engines import open_engine
from studio.settings import RenderSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TARGETS = {"low": 3, "balanced": 4, "smooth": 10}


@pytest.fixture(scope="module")
def engine(ditto_assets):
    settings = RenderSettings(backend="ditto", steps=2)
    return open_engine(
        settings,
        str(ditto_assets["tree"]),
        str(ditto_assets["face"]),
        "cpu",
        avatar_cache=str(ditto_assets["cache"]),
    )


def _speech(seconds: float, seed: int = 0) -> np.ndarray:
    """Syllable-rate modulated voice plus a little noise, 16 kHz float32."""
    t = np.arange(int(seconds * 16000)) / 16000
    voice = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700), 1))
    syllables = np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None) ** 0.5
    noise = np.random.default_rng(seed).normal(0, 0.05, t.size)
    return (0.25 * voice * syllables + noise).astype(np.float32)


def _run(stream, x: np.ndarray, sizes) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Push ``x`` in chunks of the cycled ``sizes``; all rows and (samples pushed, rows so far)."""
    rows, log, i, k = [], [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        out = stream.push(x[i : i + n], None)
        assert out.dtype == np.float32 and out.shape[1:] == (MOTION_DIM,)
        rows.append(out)
        i, k = i + n, k + 1
        log.append((min(i, len(x)), sum(len(r) for r in rows)))
    rows.append(stream.finish())
    return np.concatenate(rows), log


def test_offline_windows_reproduce_the_clip(engine) -> None:
    """The smooth plan's HuBERT chunks (the clip's) with overlap 10: generate()'s frames."""
    x = _speech(3.6)
    clip = engine.generate(audio_from_array(x, 16000), None, seed=5)
    stream = engine.motion_stream(5, "smooth", overlap=10)
    got, _ = _run(stream, x, [320])
    assert got.shape == clip.shape == (num_feature_frames(len(x)), MOTION_DIM)
    err = np.linalg.norm(got - clip) / np.linalg.norm(clip)
    assert err <= 1e-4, err


def test_push_sizes_do_not_change_the_rows(engine) -> None:
    x = _speech(1.7, seed=1)
    a, _ = _run(engine.motion_stream(3, "balanced"), x, [320])
    b, _ = _run(engine.motion_stream(3, "balanced"), x, [4000, 77, 1280, 1])
    c, _ = _run(engine.motion_stream(3, "balanced"), x, [len(x)])
    assert len(a) == num_feature_frames(len(x))
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-6)
    other, _ = _run(engine.motion_stream(4, "balanced"), x, [320])
    assert not np.allclose(other, a)  # the seed matters


@pytest.mark.parametrize("latency", LATENCIES)
def test_frames_come_with_the_lookahead_and_all_after_finish(engine, latency) -> None:
    stream = engine.motion_stream(0, latency)
    ahead = stream.lookahead_frames
    assert ahead == LIVE_PLANS[latency].lookahead_frames <= TARGETS[latency]
    x = _speech(1.5, seed=2)[: 37 * SAMPLES_PER_FRAME + 123]  # ends inside a frame
    rows, log = _run(stream, x, [SAMPLES_PER_FRAME // 2])
    assert len(rows) == num_feature_frames(len(x)) == 38
    assert np.isfinite(rows).all()
    for pushed, emitted in log:
        audio_frames = pushed // SAMPLES_PER_FRAME  # whole frames of audio in
        # frame j is out once the audio to the end of frame j + lookahead is in ...
        assert emitted >= min(audio_frames - ahead, 38), (pushed, emitted)
        # ... and the lookahead is tight: no frame comes out earlier than the plan says
        plan = live_plan(latency)
        assert all(plan.audio_frames_for(j) <= audio_frames for j in range(emitted))


def test_silence_keeps_frames_coming(engine) -> None:
    stream = engine.motion_stream(1, "low")
    zeros = np.zeros(SAMPLES_PER_FRAME, np.float32)
    counts = [len(stream.push(zeros, None)) for _ in range(60)]  # 2.4 s of silence
    ahead = stream.lookahead_frames
    assert sum(counts) == 60 - ahead and all(c == 1 for c in counts[ahead:])
    rows = np.concatenate([stream.push(zeros, None) for _ in range(5)])
    assert np.isfinite(rows).all() and np.ptp(rows[:, :202], axis=0).max() > 0  # it moves
    tail = stream.finish()
    assert len(tail) == ahead


def test_bounded_state_over_a_long_stream(engine) -> None:
    stream = engine.motion_stream(2, "low")
    x = _speech(8.0, seed=3)
    _run(stream, x, [640 * 5])
    w = stream.windows
    assert w.feats.shape[0] <= 2 * 80 and w.fuser.res.shape[0] <= 2 * 80
    assert len(stream.features._buf) <= stream.features.geometry.split_len + 640 * 5


def test_latency_and_overlap_are_checked(engine) -> None:
    with pytest.raises(ValueError, match="latency"):
        engine.motion_stream(0, "fast")
    with pytest.raises(ValueError, match="valid frames"):
        engine.motion_stream(0, "smooth", overlap=80)


@pytest.mark.parametrize("valid", [5, 1, 2])
def test_hubert_stream_is_the_offline_features(engine, valid) -> None:
    """Chunks computed as their samples arrive, the end zero-filled: offline()'s features,
    feature j once geometry.audio_frames_for(j) frames are in, one chunk of samples kept."""
    from studio.audio.features import HubertFeatures

    hubert = HubertFeatures(engine.hubert.path, ("CPUExecutionProvider",), (3, valid, 2))
    for n in (0, 1, 640, 4480, 16000 + 17):
        x = _speech(n / 16000 + 1e-6, seed=n)[:n]
        stream = hubert.stream()
        parts, i = [], 0
        for k, size in enumerate([100, 2000, 640, 1] * (n // 2741 + 1)):
            if i >= n:
                break
            parts.append(stream.push(x[i : i + size]))
            i += size
            got = sum(len(p) for p in parts)
            in_frames = min(i, n) // SAMPLES_PER_FRAME
            ready = [j for j in range(200) if hubert.geometry.audio_frames_for(j) <= in_frames]
            assert got == len(ready), (n, k)
            assert len(stream._buf) <= hubert.geometry.split_len + size
        parts.append(stream.finish())
        np.testing.assert_array_equal(np.concatenate(parts), hubert.offline(x))


def test_fast_path_stream_is_the_fast_clip_with_a_clip_in_between() -> None:
    """The fast path (the window graph, run uncaptured on the CPU) gives the clip's frames,
    even when another sampler of the same LMDM (a clip render) runs between two pushes."""
    import torch

    from studio.fixtures.random_tree import random_network
    from studio.layout import COND_DIM
    from studio.motion.generator import generate_motion, stream_motion

    lmdm = random_network("lmdm", reduced=True, cond_dim=COND_DIM)
    n = 150
    cond = torch.randn(n, COND_DIM, generator=torch.Generator().manual_seed(1))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(2))
    clip = generate_motion(lmdm, cond, kp, steps=3, seed=9, fast=True)
    live = stream_motion(lmdm, cond[:0], kp, steps=3, seed=9, overlap=10, fast=True)
    rows = [live.push(cond[:100])]
    generate_motion(lmdm, cond, kp, steps=3, seed=1, fast=True)  # the shared graph's noises
    rows += [live.push(cond[100:]), live.finish()]
    torch.testing.assert_close(torch.cat(rows), clip, rtol=0, atol=0)


def test_the_engines_renderers_share_one_device_copy_of_the_avatar(engine) -> None:
    """The avatar's features and keypoints go to the device once per engine: the preview's
    renderer and an export's (another size, frame mode) read the same tensors."""
    crop = RenderSettings(backend="ditto", steps=2, frame="crop", size=256)
    a = engine.renderer()
    b = engine.with_settings(crop).renderer(crop)
    assert a.f_s.data_ptr() == b.f_s.data_ptr()
    assert all(a.source[k].data_ptr() == b.source[k].data_ptr() for k in a.source)


def test_a_live_session_warps_its_inbetweens_on_the_kept_crops(engine) -> None:
    """Live, the Ditto renderer keeps each keyframe's crop and warps the in-betweens on them
    (its "inbetween" stage), as a clip does, instead of cross-fading them."""
    from studio.motion.cadence import CadenceThresholds
    from studio.render.stream import LiveSession, ReplayClock

    # random weights move the face far: bounds wide open, so that some frames are warped
    loose = CadenceThresholds(max_pose_gap_deg=20.0, max_warp_px=64.0, max_lid_px=64.0)
    settings = RenderSettings(
        backend="ditto", steps=2, frame="crop", size=256, stride=2, cadence=loose
    )
    session = LiveSession(engine, settings, "balanced", ReplayClock())
    x = _speech(0.6)
    frames = []
    for start in range(0, len(x), 320):
        session.clock.arrive(320)
        frames += session.feed(x[start : start + 320])
    frames += session.finish()
    assert [f.index for f in frames] == list(range(15))
    timings = session.renderer.timings_ms
    assert timings.get("inbetween", 0.0) > 0.0
