"""Control tracks: sampling keys, directing the motion, the file, and `studio render
--controls` (demo engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from studio import layout
from studio.audio.io import load_audio
from studio.engines.demo import demo_audio_path, rig
from studio.engines.demo.engine import DemoEngine
from studio.errors import InputError
from studio.motion.controls import ControlTracks, Key, apply_controls
from studio.render.pipeline import generate

NOD = {"pitch": [{"t": 5.0, "value": 0}, {"t": 5.3, "value": 8}, {"t": 5.6, "value": 0}]}


@pytest.fixture(scope="module")
def raw() -> np.ndarray:
    _, motion, _ = generate(DemoEngine(), load_audio(demo_audio_path()), 0)
    return motion


def test_keys_hold_ramp_and_ease() -> None:
    tracks = ControlTracks(
        {
            "yaw": (
                Key(1.0, 0.0, "hold"),
                Key(2.0, 10.0, "linear"),
                Key(3.0, 20.0, "smooth"),
                Key(4.0, 0.0),
            ),
        }
    )
    v = tracks.sample("yaw", 125)  # 25 fps: frame 25 is 1 s
    assert v[0] == 0.0 and v[24] == 0.0  # before the first key: its value
    assert v[49] == 0.0 and v[50] == 10.0  # hold until the next key, then its value
    assert v[62] == pytest.approx(15.0, abs=0.5)  # linear: half way
    assert 9.0 < v[87] < 12.0 and v[80] > 15.0  # smooth: eased, on the way down
    assert v[100:].tolist() == [0.0] * 25  # after the last key: its value
    assert tracks.sample("mouth", 5).tolist() == [1.0] * 5  # no keys: neutral


def test_a_nod_changes_the_pose_at_its_keys_and_nowhere_before(raw: np.ndarray) -> None:
    out = apply_controls(raw, ControlTracks.from_dict({"tracks": NOD}))
    d = layout.pose_degrees(out) - layout.pose_degrees(raw)
    assert np.abs(d[:125]).max() < 1e-3  # nothing before the first key (5 s)
    assert d[int(5.3 * 25), 0] == pytest.approx(8.0, abs=0.2)  # the nod's peak, on pitch
    assert np.abs(d[:, 1:]).max() < 1e-3 and np.abs(d[141:]).max() < 1e-3
    assert np.array_equal(out[:, layout.EXP], raw[:, layout.EXP])  # the face untouched
    assert np.array_equal(out[:125], raw[:125]) and np.array_equal(out[141:], raw[141:])  # bits


def test_mouth_blink_eyes_and_fade(raw: np.ndarray) -> None:
    def run(tracks: dict) -> np.ndarray:
        return apply_controls(raw, ControlTracks.from_dict({"tracks": tracks}))

    exp = raw[:, layout.EXP].reshape(-1, 21, 3)
    lips, lids = list(layout.LIP_KP), list(layout.EYE_KP)
    still = run({"mouth": [{"t": 0, "value": 0}]})[:, layout.EXP].reshape(-1, 21, 3)
    assert np.allclose(still[:, lips], exp[:1, lips]) and np.allclose(still[:, lids], exp[:, lids])
    half = run({"mouth": [{"t": 0, "value": 0.5}]})[:, layout.EXP].reshape(-1, 21, 3)
    assert np.allclose(
        half[:, lips] - exp[:1, lips], 0.5 * (exp[:, lips] - exp[:1, lips]), atol=1e-6
    )
    no_blink = run({"blink": [{"t": 0, "value": 0}]})[:, layout.EXP].reshape(-1, 21, 3)
    assert np.allclose(no_blink[:, lids], exp[:1, lids]) and np.allclose(
        no_blink[:, lips], exp[:, lips]
    )
    wide = run({"eyes": [{"t": 0, "value": 4}]})[:, layout.EXP].reshape(-1, 21, 3)
    scale = raw[:, 0] + 1.0
    (up, low), _ = layout.EYE_LIDS_KP
    gap = (wide[:, low, 1] - wide[:, up, 1]) - (exp[:, low, 1] - exp[:, up, 1])
    assert np.allclose(gap * 256.0 * scale, 4.0, atol=1e-3)  # 4 px of a 512 frame wider
    faded = run(
        {
            "fade": [
                {"t": 0, "value": 0, "interp": "hold"},
                {"t": 1, "value": 0, "interp": "linear"},
                {"t": 2, "value": 1},
            ]
        }
    )
    pose = layout.pose_degrees
    assert np.allclose(pose(faded[:1]), pose(raw[:1]), atol=1e-3)
    assert np.allclose(faded[10, layout.EXP], raw[0, layout.EXP])  # at rest while faded out
    assert np.allclose(pose(faded[10:11]), pose(raw[:1]), atol=1e-3)
    assert np.allclose(faded[60:, layout.EXP], raw[60:, layout.EXP], atol=1e-6)  # in by 2 s
    assert np.allclose(pose(faded[60:]), pose(raw[60:]), atol=1e-3)


def test_the_file_round_trips_and_bad_ones_name_the_place(tmp_path: Path) -> None:
    tracks = ControlTracks.from_dict(
        {"tracks": {**NOD, "mouth": [{"t": 1, "value": 0.6, "interp": "hold"}]}}
    )
    path = tmp_path / "c.json"
    tracks.save(path)
    assert ControlTracks.load(path) == tracks
    bad = [
        ({"tracks": {"nod": []}}, "unknown track 'nod'"),
        ({"tracks": {"yaw": [{"t": 1, "value": 90}]}}, "yaw[0]: value 90 is outside -60..60"),
        ({"tracks": {"yaw": [{"t": 1, "value": 5, "interp": "cubic"}]}}, "interp 'cubic'"),
        ({"tracks": {"yaw": [{"value": 5}]}}, "yaw[0]: a key is"),
        ({"tracks": {"fade": [{"t": -1, "value": 1}]}}, "t must be 0 or more"),
        ({"format": "x/9"}, "format 'x/9'"),
    ]
    for data, words in bad:
        path.write_text(json.dumps(data))
        with pytest.raises(InputError, match=words.replace("[", r"\[").replace("]", r"\]")):
            ControlTracks.load(path)


def test_render_with_controls(tmp_path: Path, capsys) -> None:
    path = tmp_path / "nod.json"
    path.write_text(json.dumps({"tracks": NOD}))
    argv = ["render", "--demo", "--size", "96", "--stride", "1", "--report"]
    code, _, err = run_cli(
        [*argv, str(tmp_path / "a.json"), "--out", str(tmp_path / "a.mp4")], capsys
    )
    assert code == 0, err
    code, _, err = run_cli(
        [
            *argv,
            str(tmp_path / "b.json"),
            "--out",
            str(tmp_path / "b.mp4"),
            "--controls",
            str(path),
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["controls"]["tracks"]["pitch"][1]["value"] == 8
    path.write_text('{"tracks": {"pitch": [{"t": 1, "value": 99}]}}')
    code, _, err = run_cli(
        [
            *argv,
            str(tmp_path / "c.json"),
            "--out",
            str(tmp_path / "c.mp4"),
            "--controls",
            str(path),
        ],
        capsys,
    )
    assert code == 2 and "nod.json: pitch[0]: value 99" in err and not (tmp_path / "c.mp4").exists()
    code, _, err = run_cli(["live", "--demo", "--controls", str(path)], capsys)
    assert code == 2 and "--controls" in err


SMILE = {
    "tracks": {
        "emotion": [
            {"t": 0.0, "value": "Neutral", "interp": "hold"},
            {"t": 2.0, "value": "happy", "interp": "hold"},
            {"t": 4.0, "value": 4},
        ]
    }
}


def test_emotion_keys_make_segments_and_blends() -> None:
    tracks = ControlTracks.from_dict(SMILE)
    rows = tracks.emotion_rows(150)
    happy, neutral = layout.EMOTIONS.index("Happy"), layout.DEFAULT_EMOTION
    assert rows.shape == (150, layout.NUM_EMOTIONS) and np.allclose(rows.sum(1), 1.0)
    assert (rows[:50].argmax(1) == neutral).all() and (rows[50:100].argmax(1) == happy).all()
    assert (rows[100:].argmax(1) == neutral).all() and rows[50:100, happy].min() == 1.0
    assert tracks.to_dict()["tracks"]["emotion"][1]["value"] == "Happy"  # saved by name
    assert ControlTracks.from_dict(tracks.to_dict()) == tracks
    blend = ControlTracks({"emotion": (Key(0.0, 4.0, "linear"), Key(1.0, 3.0))}).emotion_rows(26)
    assert np.allclose(blend[12, [happy, neutral]], [0.48, 0.52])  # halfway, by weight
    assert ControlTracks({"pitch": (Key(0.0, 5.0),)}).emotion_rows(10) is None
    assert tracks.motion_key() != ControlTracks().motion_key()
    with pytest.raises(InputError, match=r"emotion\[0\]: emotion 'Glee' is not one of Angry"):
        ControlTracks.from_dict({"tracks": {"emotion": [{"t": 0, "value": "Glee"}]}})
    with pytest.raises(InputError, match="a label name or number, not 2.5"):
        ControlTracks.from_dict({"tracks": {"emotion": [{"t": 0, "value": 2.5}]}})


def test_a_keyed_smile_changes_the_demo_motion_inside_its_segment_only() -> None:
    audio = load_audio(demo_audio_path())
    tracks = ControlTracks.from_dict(SMILE)
    _, plain, _ = generate(DemoEngine(), audio, 0)
    _, smiling, _ = generate(DemoEngine(), audio, 0, tracks)
    assert np.array_equal(smiling[:50], plain[:50]) and np.array_equal(smiling[100:], plain[100:])
    exp = (smiling - plain)[:, layout.EXP].reshape(-1, layout.NUM_KP, 3)
    corners = [rig.MOUTH_CORNER_L, rig.MOUTH_CORNER_R]
    assert (exp[50:100, corners, 1] < -0.02).all()  # the mouth corners go up: a smile
    assert apply_controls(plain, tracks) is plain  # emotion is not a post-motion control


def test_keys_are_added_moved_and_deleted_as_new_tracks() -> None:
    tracks = ControlTracks.from_dict({"tracks": NOD})
    assert tracks.value_at("pitch", 5.3) == 8.0 and tracks.value_at("yaw", 1.0) == 0.0
    assert abs(tracks.value_at("pitch", 5.15) - 4.0) < 0.01  # halfway up the smooth ramp
    added = tracks.with_key("pitch", Key(6.0, -5.0, "linear"))
    assert [k.t for k in added.keys("pitch")] == [5.0, 5.3, 5.6, 6.0]
    assert tracks.keys("pitch")[-1].t == 5.6  # the original is unchanged
    moved = added.with_key("pitch", Key(5.2, 8.0), replace=1)
    assert [k.t for k in moved.keys("pitch")] == [5.0, 5.2, 5.6, 6.0]
    same_time = moved.with_key("pitch", Key(5.2, 3.0))  # a key at the same time is replaced
    assert [k.value for k in same_time.keys("pitch")] == [0.0, 3.0, 0.0, -5.0]
    gone = ControlTracks({"yaw": (Key(1.0, 2.0),)}).without_key("yaw", 0)
    assert not gone and gone.to_dict()["tracks"] == {}
    with pytest.raises(InputError, match="outside -45..45"):
        tracks.with_key("pitch", Key(1.0, 90.0))
    smile = ControlTracks.from_dict(SMILE)
    assert smile.value_at("emotion", 3.0) == layout.EMOTIONS.index("Happy")
