"""LMDM condition assembly (studio.motion.condition)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from studio.errors import OptionError
from studio.layout import COND_DIM, HUBERT_DIM
from studio.motion.condition import (
    EMOTIONS,
    ConditionConfig,
    ConditionSource,
    assemble,
    condition_layout,
    condition_width,
    emotion_table,
    emotion_vector,
    mirror_indices,
    source_indices,
)

FLAGS = ("use_emo", "use_eye_open", "use_eye_ball", "use_sc")


def video_source(n: int = 3) -> ConditionSource:
    """Frame f has eye_open (f, f + 0.5) and eye_ball 10 f + (0..5); sc = 100 + (0..62)."""
    f = np.arange(n, dtype=np.float32)[:, None]
    return ConditionSource(
        eye_open=np.hstack([f, f + 0.5]),
        eye_ball=10 * f + np.arange(6, dtype=np.float32),
        sc=100 + np.arange(63, dtype=np.float32),
        is_image=False,
    )


def feats(n: int) -> np.ndarray:
    return np.arange(n * HUBERT_DIM, dtype=np.float32).reshape(n, HUBERT_DIM)


def test_labels() -> None:
    assert EMOTIONS[0] == "Angry" and EMOTIONS[4] == "Neutral" and EMOTIONS[7] == "Contempt"
    assert len(EMOTIONS) == 8


def test_width_for_every_flag_combination() -> None:
    widths = {"use_emo": 8, "use_eye_open": 2, "use_eye_ball": 6, "use_sc": 63}
    extras = set()
    for on in itertools.product((False, True), repeat=4):
        cfg = dict(zip(FLAGS, on, strict=True))
        expected = HUBERT_DIM + sum(w for k, w in widths.items() if cfg[k])
        assert condition_width(cfg) == condition_width(ConditionConfig(**cfg)) == expected
        out = assemble(feats(4), 0, video_source(), ConditionConfig(**cfg))
        assert out.shape == (4, expected) and out.dtype == np.float32
        extras.add(expected - HUBERT_DIM)
    assert extras == {0, 2, 6, 8, 10, 14, 16, 63, 65, 69, 71, 73, 77, 79}
    assert condition_width({}) == condition_width(ConditionConfig()) == COND_DIM == 1103
    assert 1024 + 35 not in {HUBERT_DIM + e for e in extras}  # Ditto's stale default


def test_order_of_parts() -> None:
    src = video_source(1)
    src = ConditionSource(src.eye_open, src.eye_ball, src.sc, is_image=True)
    out = assemble(feats(2), 0, src, ConditionConfig(emotion=3))
    np.testing.assert_array_equal(out[:, :1024], feats(2))
    np.testing.assert_array_equal(out[:, 1024:1032], np.tile(emotion_vector(3), (2, 1)))
    np.testing.assert_array_equal(out[:, 1032:1034], [[0, 0.5]] * 2)
    np.testing.assert_array_equal(out[:, 1034:1040], [np.arange(6)] * 2)
    np.testing.assert_array_equal(out[:, 1040:1103], [100 + np.arange(63)] * 2)
    assert condition_layout(ConditionConfig()) == {
        "hubert": slice(0, 1024),
        "emotion": slice(1024, 1032),
        "eye_open": slice(1032, 1034),
        "eye_ball": slice(1034, 1040),
        "sc": slice(1040, 1103),
    }
    # parts that are off close the gap
    cfg = ConditionConfig(use_emo=False, use_eye_ball=False)
    assert condition_layout(cfg) == {
        "hubert": slice(0, 1024),
        "eye_open": slice(1024, 1026),
        "sc": slice(1026, 1089),
    }
    out = assemble(feats(2), 0, src, cfg)
    np.testing.assert_array_equal(out[:, 1024:1026], [[0, 0.5]] * 2)
    np.testing.assert_array_equal(out[:, 1026:], [100 + np.arange(63)] * 2)


def test_emotion_softmax_values() -> None:
    one = emotion_vector(4)
    assert one.dtype == np.float32 and one.shape == (8,)
    assert one[4] == pytest.approx(0.99766, abs=5e-6)
    np.testing.assert_allclose(np.delete(one, 4), 0.000335, atol=5e-7)
    two = emotion_vector([3, 4])
    np.testing.assert_allclose(two[[3, 4]], 0.4995, atol=5e-5)
    assert two[3] == two[4]
    for v in (one, two, emotion_vector((0, 1, 2, 3, 4, 5, 6, 7))):
        assert v.sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(emotion_vector(list(range(8))), 1 / 8, rtol=1e-6)
    assert np.array_equal(emotion_vector([3, 3]), emotion_vector(3))
    # the default emotion is Neutral
    np.testing.assert_array_equal(ConditionConfig().table, one[None, :])


def test_emotion_forms() -> None:
    assert emotion_table(2).shape == (1, 8)
    np.testing.assert_array_equal(emotion_table([3, 4]), emotion_vector([3, 4])[None, :])
    np.testing.assert_array_equal(emotion_table((3, 4)), emotion_table([3, 4]))
    per_frame = emotion_table([[4], [3, 4], 3])
    np.testing.assert_array_equal(
        per_frame, np.stack([emotion_vector(4), emotion_vector([3, 4]), emotion_vector(3)])
    )
    raw = np.random.default_rng(0).random((5, 8))
    np.testing.assert_array_equal(emotion_table(raw), raw.astype(np.float32))
    assert emotion_table(raw[0]).shape == (1, 8)
    np.testing.assert_array_equal(emotion_table(np.array([3, 4])), emotion_table([3, 4]))
    for bad in (8, -1, True, "Happy", [], [[]], [3, 9], np.zeros((3, 7)), np.full((1, 8), np.nan)):
        with pytest.raises(OptionError, match="--emotion"):
            emotion_table(bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError):
        ConditionConfig(emotion=11)
    ConditionConfig(use_emo=False, emotion=11)  # not parsed when the part is off


def test_emotion_loops_modulo_with_negative_frames_clamped() -> None:
    table = emotion_table([[0], [1], [2]])
    cfg = ConditionConfig(emotion=[[0], [1], [2]], use_eye_open=False, use_eye_ball=False)
    out = assemble(feats(8), -3, video_source(), cfg)
    frames = [0, 0, 0, 0, 1, 2, 3, 4]  # global frames -3..4, clamped
    np.testing.assert_array_equal(out[:, 1024:1032], table[[f % 3 for f in frames]])
    out = assemble(feats(4), 10, video_source(), cfg)
    np.testing.assert_array_equal(out[:, 1024:1032], table[[1, 2, 0, 1]])


def test_mirror_index() -> None:
    np.testing.assert_array_equal(mirror_indices(np.arange(10), 3), [0, 1, 2, 2, 1, 0, 0, 1, 2, 2])
    np.testing.assert_array_equal(mirror_indices(np.arange(4), 1), [0, 0, 0, 0])
    assert int(mirror_indices(7, 4)) == 0


def test_eye_info_mirrors_over_video_frames() -> None:
    src = video_source(3)
    out = assemble(feats(9), -2, src, ConditionConfig())
    frames = mirror_indices(np.maximum(np.arange(-2, 7), 0), 3)  # 0 0 0 1 2 2 1 0 0
    np.testing.assert_array_equal(frames, [0, 0, 0, 1, 2, 2, 1, 0, 0])
    np.testing.assert_array_equal(out[:, 1032:1034], src.eye_open[frames])
    np.testing.assert_array_equal(out[:, 1034:1040], src.eye_ball[frames])
    np.testing.assert_array_equal(out[:, 1040:], np.tile(src.sc, (9, 1)))


def test_a_looped_video_restarts_its_eye_info_instead_of_turning_back() -> None:
    from dataclasses import replace

    assert source_indices(np.arange(7), 3, "loop").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert source_indices(np.arange(7), 3).tolist() == [0, 1, 2, 2, 1, 0, 0]  # ping-pong
    with pytest.raises(ValueError, match="order must be one of"):
        source_indices(1, 3, "bounce")
    src = replace(video_source(3), order="loop")
    out = assemble(feats(7), 0, src, ConditionConfig())
    np.testing.assert_array_equal(out[:, 1032:1034], src.eye_open[[0, 1, 2, 0, 1, 2, 0]])


def test_image_source_and_eye_f0_mode_use_frame_0() -> None:
    src = video_source(3)
    for source, cfg in (
        (ConditionSource(src.eye_open, src.eye_ball, src.sc, is_image=True), ConditionConfig()),
        (src, ConditionConfig(eye_f0_mode=True)),
    ):
        out = assemble(feats(5), 2, source, cfg)
        np.testing.assert_array_equal(out[:, 1032:1034], np.tile(src.eye_open[0], (5, 1)))
        np.testing.assert_array_equal(out[:, 1034:1040], np.tile(src.eye_ball[0], (5, 1)))


def test_source_info_and_mapping_adapters() -> None:
    info = {
        "eye_open_lst": [np.array([[0.3, 0.4]]), np.array([[0.5, 0.6]])],
        "eye_ball_lst": [np.zeros((1, 6)), np.ones((1, 6))],
        "sc": np.arange(63.0),
        "is_image_flag": False,
    }
    src = ConditionSource.from_source_info(info)
    assert src.eye_open.shape == (2, 2) and src.eye_ball.shape == (2, 6) and not src.is_image
    assert src.eye_open.dtype == src.sc.dtype == np.float32
    cfg = ConditionConfig.from_mapping({"use_sc": False, "emo": [3, 4], "model_path": "x"})
    assert cfg.width == 1024 + 16 and not cfg.use_sc
    np.testing.assert_array_equal(cfg.table[0], emotion_vector([3, 4]))
    out = assemble(feats(3), 1, src, {"use_emo": False, "use_sc": False})
    np.testing.assert_array_equal(out[:, 1024:1026], src.eye_open[[1, 1, 0]])


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="features"):
        assemble(np.zeros((4, 768), np.float32), 0, video_source(), ConditionConfig())
    with pytest.raises(ValueError, match="ConditionSource"):
        assemble(feats(2), 0, None, ConditionConfig())
    only_emo = ConditionConfig(use_eye_open=False, use_eye_ball=False, use_sc=False)
    assert assemble(feats(2), 0, None, only_emo).shape == (2, 1032)
    with pytest.raises(ValueError, match="eye_open"):
        ConditionSource(np.zeros((2, 3)), np.zeros((2, 6)), np.zeros(63))
    with pytest.raises(ValueError, match="sc"):
        ConditionSource(np.zeros((2, 2)), np.zeros((2, 6)), np.zeros(62))
    assert assemble(feats(0), -5, video_source(), ConditionConfig()).shape == (0, 1103)
