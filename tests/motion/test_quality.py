"""The weight-free quality metrics against hand-made motions, and on the demo engine's."""

import json
import sys

import numpy as np
import pytest

from studio import layout
from studio.audio.io import load_audio
from studio.audio.phonetics import PhoneticFrames, analyze
from studio.engines.demo import demo_audio_path, rig
from studio.engines.demo.motion import generate_motion
from studio.motion import quality as q

FPS = layout.FPS
KP = rig.CANONICAL_KP


def _motion(n, pitch=0.0, yaw=0.0, roll=0.0, t=(0.0, 0.0, 0.0), mouth=0.0, blink=0.0):
    """[n, 265] motion of the demo rig: pose in degrees, mouth opening and blink closure in
    the rig's control units (scalars or [n] arrays)."""
    exp = np.zeros((n, layout.NUM_KP, 3))
    mouth = np.broadcast_to(np.asarray(mouth, float), (n,))
    blink = np.broadcast_to(np.asarray(blink, float), (n,))
    exp[:, rig.LIP_LOWER, 1] = mouth * rig.MOUTH_OPEN_LOWER_LIP
    exp[:, rig.JAW, 1] = mouth * rig.MOUTH_OPEN_JAW
    exp[:, rig.LIP_UPPER, 1] = mouth * rig.MOUTH_OPEN_UPPER_LIP
    for lid in (rig.LID_UPPER_L, rig.LID_UPPER_R):
        exp[:, lid, 1] = blink * rig.BLINK_UPPER_LID
    for lid in (rig.LID_LOWER_L, rig.LID_LOWER_R):
        exp[:, lid, 1] = blink * rig.BLINK_LOWER_LID
    full = [np.broadcast_to(np.asarray(a, np.float32), (n,)) for a in (pitch, yaw, roll)]
    frames = layout.MotionFrames(
        scale=np.ones(n, np.float32),
        pitch=full[0],
        yaw=full[1],
        roll=full[2],
        t=np.broadcast_to(np.asarray(t, np.float32), (n, 3)),
        exp=exp.astype(np.float32),
    )
    return layout.pack(frames)


def _silence(n, stretches):
    mask = np.zeros(n, bool)
    for a, b in stretches:
        mask[a:b] = True
    return mask


def _phon(level, silence):
    """Phonetic frames with the given envelope and silence (the other cues neutral)."""
    n = len(level)
    z = np.zeros(n, np.float32)
    return PhoneticFrames(
        rms_db=z - 30,
        level=np.asarray(level, np.float32),
        flux=z,
        voicing=np.where(silence, 0.0, 0.8).astype(np.float32),
        pitch_hz=z + 120,
        centroid_hz=z + 1500,
        low_ratio=z + 0.6,
        silence=np.asarray(silence, bool),
        onset=np.zeros(n, bool),
        burst=np.zeros(n, bool),
    )


# --- head dynamics -----------------------------------------------------------------------------


def test_still_head_scores_zero_dynamics():
    d = q.head_dynamics(_motion(200, pitch=5.0, yaw=-12.0, roll=2.0, t=(0.01, -0.02, 0.3)))
    assert max(d["diff_var"].values()) < 1e-9
    assert max(d["angle_std"].values()) < 1e-4
    assert d["translation_var"] < 1e-12
    assert d["smoothness"] < 1e-5


def test_head_dynamics_match_the_theval_formula():
    n = 500
    i = np.arange(n)
    yaw = 10.0 * np.sin(2 * np.pi * i / 100)  # 4 s period
    pitch = 0.02 * i  # a slow drift: constant difference
    tx = 0.01 * np.cos(2 * np.pi * i / 50)
    d = q.head_dynamics(_motion(n, pitch=pitch, yaw=yaw, t=np.stack([tx, 0 * tx, 0 * tx], 1)))
    w = 2 * np.pi / 100
    assert d["diff_var"]["yaw"] == pytest.approx((10 * 2 * np.sin(w / 2)) ** 2 / 2, rel=0.02)
    assert d["diff_var"]["pitch"] < 1e-9 and d["diff_var"]["roll"] < 1e-9
    std = np.mean([np.std(pitch), np.std(yaw), 0.0])
    dvar = np.mean([0.0, np.var(np.diff(yaw)), 0.0])
    tvar = np.mean([np.var(tx), 0.0])
    assert d["smoothness"] == pytest.approx(np.sqrt(std * dvar + tvar), rel=1e-3)


# --- mouth -------------------------------------------------------------------------------------


def test_mouth_opening_follows_the_lips_not_the_pose():
    n = 100
    mouth = np.linspace(0, 1, n)
    nod = _motion(n, pitch=15 * np.sin(np.arange(n) / 5), yaw=20.0, mouth=mouth)
    for method in q.MOUTH_METHODS:
        still = q.mouth_opening(_motion(n, mouth=mouth), KP, method)
        moving = q.mouth_opening(nod, KP, method)
        np.testing.assert_allclose(moving, still, atol=1e-6)
        assert np.all(np.diff(still) > 0)
    eye_distance = 2 * abs(KP[rig.LID_UPPER_L, 0])
    extent = q.mouth_opening(_motion(n, mouth=mouth), KP, "extent")
    grows = rig.MOUTH_OPEN_JAW - rig.MOUTH_OPEN_UPPER_LIP
    assert extent[-1] - extent[0] == pytest.approx(grows / eye_distance, rel=1e-4)
    with pytest.raises(ValueError):
        q.mouth_opening(nod, KP, "area")


def test_silent_lip_deviation_high_when_mumbling_zero_when_closed():
    n = 500
    silence = _silence(n, [(100, 200), (300, 400)])
    i = np.arange(n)
    talk = 0.5 + 0.5 * np.sin(2 * np.pi * i / 8)
    closed_in_silence = np.where(silence, 0.0, talk)
    pose = {"pitch": 8 * np.sin(i / 9), "yaw": 15 * np.sin(i / 23)}
    mumble = q.mouth_opening(_motion(n, mouth=talk, **pose), KP)
    closed = q.mouth_opening(_motion(n, mouth=closed_in_silence, **pose), KP)
    high = q.silent_lip_deviation(mumble, silence)
    assert high > 0.05  # about the speech's own deviation
    assert high == pytest.approx(q._mad(mumble[~silence]), rel=0.1)
    assert q.silent_lip_deviation(closed, silence) < 1e-5
    # a mouth left a little open in one pause and closed in another is not mumbling
    ajar = np.where(i < 250, 0.2, 0.0) * silence + talk * ~silence
    assert q.silent_lip_deviation(q.mouth_opening(_motion(n, mouth=ajar), KP), silence) < 1e-5


def test_short_silences_are_ignored():
    silence = _silence(300, [(50, 55), (100, 104), (200, 220)])  # 0.2 s, 0.16 s, 0.8 s
    assert q.silent_stretches(silence) == [(202, 218)]
    assert np.isnan(q.silent_lip_deviation(np.random.rand(300), silence[:150]))


def test_mouth_envelope_correlation():
    rng = np.random.default_rng(0)
    n = 1000
    level = np.clip(np.convolve(rng.random(n), np.ones(5) / 5, "same"), 0, 1)
    speech = np.ones(n, bool)
    speech[::7] = False
    follows = q.mouth_opening(_motion(n, mouth=np.sqrt(level)), KP)
    random = q.mouth_opening(_motion(n, mouth=rng.random(n)), KP)
    assert q.mouth_envelope_correlation(follows, level, speech) > 0.9
    assert abs(q.mouth_envelope_correlation(random, level, speech)) < 0.1
    assert np.isnan(q.mouth_envelope_correlation(np.ones(n), level))


# --- blinks ------------------------------------------------------------------------------------


def _blinking(n, period, first=20):
    closure = np.zeros(n)
    for s in range(first, n - 5, period):
        closure[s : s + 5] = (0.35, 0.85, 1.0, 0.7, 0.3)
    return closure


def test_blinks_every_three_seconds():
    n = 60 * FPS
    i = np.arange(n)
    m = _motion(n, yaw=10 * np.sin(i / 30), blink=_blinking(n, 3 * FPS), mouth=np.sin(i) ** 2)
    b = q.blinks(m, KP)
    assert b.rate_per_min == pytest.approx(20, abs=1)
    np.testing.assert_allclose(b.intervals_s, 3.0)
    s = b.summary()
    assert s["count"] == 20 and s["in_schedule"] == 1.0 and s["interval_median_s"] == 3.0
    fast = q.blinks(_motion(n, blink=_blinking(n, FPS)), KP)
    assert fast.rate_per_min == pytest.approx(60, abs=1) and fast.in_schedule == 0.0
    none = q.blinks(_motion(n), KP)
    assert none.onsets.size == 0 and np.isnan(none.in_schedule)


# --- the report and the demo engine ------------------------------------------------------------


def test_quality_report_is_json_ready():
    n = 30 * FPS
    i = np.arange(n)
    silence = _silence(n, [(0, 20), (300, 360)])
    level = np.where(silence, 0.0, 0.5 + 0.5 * np.sin(i / 3) ** 2)
    m = _motion(n, mouth=np.sqrt(level), blink=_blinking(n, 3 * FPS), yaw=5 * np.sin(i / 40))
    r = q.quality_report(m, KP, _phon(level, silence))
    json.dumps(r, allow_nan=False)
    assert r["frames"] == n and r["seconds"] == 30.0
    assert r["silent_lips"]["deviation"] < 1e-4 and r["silent_lips"]["stretches"] == 2
    assert r["blinks"]["count"] == 10 and r["lip_sync"]["envelope_correlation"] > 0.9
    assert set(r["head"]["diff_var"]) == {"pitch", "yaw", "roll"}
    still = q.quality_report(m[:10], KP, _phon(level, np.ones(n, bool)))  # no speech, no pause
    assert still["lip_sync"]["envelope_correlation"] is None
    json.dumps(still, allow_nan=False)


@pytest.fixture(scope="module")
def demo_clip():
    phon = analyze(load_audio(demo_audio_path()).samples)
    return phon, generate_motion(phon)


def _pause_blink(onset, silence):
    """The demo's extra blink a few frames after a pause starts (not the 2.4-4 s schedule)."""
    pause_starts = np.flatnonzero(np.diff(silence.astype(int)) == 1) + 1
    return np.any((onset - pause_starts >= 0) & (onset - pause_starts <= 8))


def test_demo_motion_on_demo_speech(demo_clip):
    phon, motion = demo_clip
    r = q.quality_report(motion, KP, phon)
    assert r["lip_sync"]["envelope_correlation"] > 0.3
    assert r["silent_lips"]["deviation"] < 0.2 * r["silent_lips"]["speech_deviation"]
    assert r["head"]["smoothness"] > 0
    b = q.blinks(motion, KP)
    scheduled = [
        iv
        for onset, iv in zip(b.onsets[1:], b.intervals_s, strict=True)
        if not _pause_blink(onset, phon.silence)
    ]
    assert scheduled and all(2.4 <= iv <= 4.0 for iv in scheduled)


def test_demo_motion_blinks_on_schedule_in_continuous_speech():
    n = 90 * FPS
    level = 0.5 + 0.4 * np.sin(np.arange(n) / 4)
    motion = generate_motion(_phon(level, np.zeros(n, bool)), seed=3)
    b = q.blinks(motion, KP)
    assert b.in_schedule == 1.0 and 15 <= b.rate_per_min <= 25


# --- optional VAD ------------------------------------------------------------------------------


def test_vad_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "silero_vad", None)
    with pytest.raises(RuntimeError, match="silero-vad"):
        q.vad_silence(np.zeros(16000, np.float32))


def test_vad_silence_agrees_with_the_phonetics_on_the_demo_speech(demo_clip):
    phon, _ = demo_clip
    mask = q.vad_silence(load_audio(demo_audio_path()).samples)
    assert mask.shape == phon.silence.shape
    assert np.mean(mask == phon.silence) > 0.9


def test_vad_probabilities_are_the_models_own_window_by_window():
    """One ``audio_forward`` call gives exactly what the model gives called per 512-sample
    window from reset states, the last window zero-padded (get_speech_timestamps' loop)."""
    import torch

    get_speech_timestamps, load = q._silero()
    audio = torch.from_numpy(load_audio(demo_audio_path()).samples[: 16000 * 3 + 100])
    model = load()
    model.reset_states()
    windows = [audio[i : i + 512] for i in range(0, len(audio), 512)]
    want = [model(torch.nn.functional.pad(w, (0, 512 - len(w))), 16000).item() for w in windows]
    probs = q.WindowProbabilities(load(), audio)
    probs.reset_states()
    assert [probs(w, 16000).item() for w in windows] == want
    with pytest.raises(StopIteration):
        probs(windows[-1], 16000)
    spans = get_speech_timestamps(audio, load(), sampling_rate=16000)
    assert spans and get_speech_timestamps(audio, q.WindowProbabilities(load(), audio)) == spans


def test_vad_calls_its_model_once_for_the_whole_speech(monkeypatch):
    """Called per window from Python, the model gave up the interpreter on every window: beside
    a render thread running Python each call then waited for its switch interval (0.35 s of
    VAD became 13 s here). The mask comes from one audio_forward call."""
    get_speech_timestamps, load = q._silero()
    calls = {"forward": 0, "audio_forward": 0}

    class Counted:
        def __init__(self):
            self.model = load()

        def __call__(self, *args):
            calls["forward"] += 1
            return self.model(*args)

        def reset_states(self):
            self.model.reset_states()

        def audio_forward(self, *args):
            calls["audio_forward"] += 1
            return self.model.audio_forward(*args)

    monkeypatch.setattr(q, "_silero", lambda: (get_speech_timestamps, Counted))
    mask = q.vad_silence(load_audio(demo_audio_path()).samples)
    assert calls == {"forward": 0, "audio_forward": 1}
    assert mask.any() and not mask.all()


def test_envelope_lag_finds_the_offset():
    rng = np.random.default_rng(1)
    level = np.convolve(rng.random(400), np.ones(3) / 3, "same")
    late = np.concatenate([np.zeros(2), level[:-2]])  # the mouth two frames after the sound
    lag, r = q.envelope_lag(late, level)
    assert lag == 2 and r > 0.99
    assert q.envelope_lag(level[3:], level[:-3])[0] == -3


def test_the_vad_leaves_every_threads_torch_thread_count_alone():
    """silero_vad sets torch to one thread process-wide when first imported; a render on
    another thread would change its float sums under it. A new process checks it: no call
    to torch.set_num_threads reaches torch while the VAD is imported and run."""
    import subprocess

    code = (
        "import numpy as np, torch\n"
        "torch.set_num_threads(2)\n"
        "calls = []\n"
        "real = torch.set_num_threads\n"
        "torch.set_num_threads = lambda n: (calls.append(n), real(n))\n"
        "from studio.motion.quality import vad_silence\n"
        "vad_silence(np.zeros(16000, np.float32))\n"
        "print(calls, torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "2"]
