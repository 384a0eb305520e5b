import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from studio import layout as L
from studio.audio.phonetics import analyze
from studio.motion.cadence import (
    CadencePlan,
    CadenceThresholds,
    blend_weights,
    keyframes_for,
    plan_cadence,
    sample_motion,
)

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo"


@pytest.fixture(scope="module")
def demo_speech():
    x, sr = sf.read(DEMO / "speech.wav", dtype="float32")
    truth = json.loads((DEMO / "speech_phonemes.json").read_text())
    return analyze(x), truth


def test_plosive_releases_get_stride_one_and_pauses_get_three(demo_speech):
    phon, truth = demo_speech
    plan = plan_cadence(phon)
    n = plan.num_frames
    releases = [int(t * L.FPS) for t in truth["plosive_releases_s"]]
    at_release = [plan.strides[min(r, n - 1)] == 1 for r in releases]
    assert np.mean(at_release) >= 0.9
    pause_frames = []
    for s, e in truth["silences"]:
        lo, hi = int(np.ceil(s * L.FPS)) + 2, int(e * L.FPS) - 2
        pause_frames.extend(range(lo, min(hi, n)))
    assert len(pause_frames) > 20
    assert np.mean(plan.strides[pause_frames] == 3) >= 0.95
    # It saves work: not every frame is a keyframe, and the histogram adds up.
    hist = plan.histogram()
    assert sum(hist.values()) == n and hist["3"] > 0 and hist["2"] > 0
    assert plan.rendered_fraction < 0.9


def test_keyframes_respect_every_frames_stride():
    rng = np.random.default_rng(0)
    for _ in range(50):
        strides = rng.integers(1, 4, int(rng.integers(1, 120)))
        keys = keyframes_for(strides)
        assert keys[0] == 0 and keys[-1] == strides.size - 1
        assert np.all(np.diff(keys) >= 1)
        for a, b in zip(keys[:-1], keys[1:], strict=True):
            assert b - a <= strides[a : b + 1].min()
    assert keyframes_for(np.ones(7, int)).tolist() == list(range(7))
    assert keyframes_for(np.full(10, 3)).tolist() == [0, 3, 6, 9]


def test_fixed_strides_and_errors(demo_speech):
    phon, _ = demo_speech
    for s in (1, 2, 3):
        plan = plan_cadence(phon, str(s))
        assert set(plan.strides.tolist()) == {s}
        assert plan.rendered_fraction == pytest.approx(1 / s, abs=0.02)
    with pytest.raises(ValueError, match="stride"):
        plan_cadence(phon, "4")


def test_thresholds_change_the_plan(demo_speech):
    phon, _ = demo_speech
    base = plan_cadence(phon).rendered_fraction
    wide = plan_cadence(phon, thresholds=CadenceThresholds(plosive_guard=3)).rendered_fraction
    assert wide > base


def test_sampling_keeps_keyframes_and_interpolates_angles_linearly():
    rng = np.random.default_rng(1)
    n = 10
    frames = L.MotionFrames(
        scale=np.ones(n, np.float32),
        pitch=rng.uniform(-20, 20, n).astype(np.float32),
        yaw=rng.uniform(-20, 20, n).astype(np.float32),
        roll=rng.uniform(-20, 20, n).astype(np.float32),
        t=rng.normal(size=(n, 3)).astype(np.float32),
        exp=rng.normal(size=(n, 21, 3)).astype(np.float32),
    )
    m = L.pack(frames)
    strides = np.array([3] * n)
    plan = CadencePlan(strides, keyframes_for(strides))
    out = sample_motion(m, plan)
    assert np.array_equal(out[plan.keyframes], m[plan.keyframes])
    prv, nxt, w = blend_weights(plan)
    assert w[1] == pytest.approx(1 / 3) and prv[1] == 0 and nxt[1] == 3
    deg, got = L.pose_degrees(m), L.pose_degrees(out)
    np.testing.assert_allclose(got[1], deg[0] * 2 / 3 + deg[3] / 3, atol=1e-3)
    np.testing.assert_allclose(out[2, L.EXP], m[0, L.EXP] / 3 + m[3, L.EXP] * 2 / 3, atol=1e-6)
