"""Control tracks and projects in the window (pytest-qt, offscreen, demo engine)."""

import json

import numpy as np
import pytest

pytest.importorskip("PySide6")

from studio import layout  # noqa: E402
from studio.motion.controls import ControlTracks  # noqa: E402

TIMEOUT_MS = 120_000
NOD = {
    "tracks": {"pitch": [{"t": 2.0, "value": 0}, {"t": 2.3, "value": 9}, {"t": 2.6, "value": 0}]}
}


def test_tracks_direct_the_preview_and_a_project_reopens_it(window, qtbot, tmp_path):
    before = layout.pose_degrees(window.result.smoothed)
    path = tmp_path / "nod.json"
    path.write_text(json.dumps(NOD))
    calls = window.motion_worker.generate_calls
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.load_tracks(str(path))
    assert window.motion_worker.generate_calls == calls  # the motion model did not run again
    assert window.result.controls == ControlTracks.from_dict(NOD)
    after = layout.pose_degrees(window.result.smoothed)
    assert np.abs(after[:40] - before[:40]).max() < 0.05  # nothing before the first key
    assert after[57, 0] - before[57, 0] > 4.0  # the nod (smoothed, limited) at 2.3 s
    assert window.timeline.track_items and window.act_clear_tracks.isEnabled()

    project = tmp_path / "clip.json"
    window.controls.window.setValue(9)
    window.save_project(str(project))
    saved = json.loads(project.read_text())
    assert saved["controls"] == ControlTracks.from_dict(NOD).to_dict()
    assert saved["settings"]["smooth_window"] == 9

    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.clear_tracks()
    assert window.result.controls is None and not window.timeline.track_items
    window.controls.window.setValue(5)
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.open_project(str(project))
    assert window.tracks == ControlTracks.from_dict(NOD)
    assert window.controls.settings().smooth_window == 9 and window.result.controls is not None


def test_a_bad_tracks_file_is_one_message(window, qtbot, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"tracks": {"yaw": [{"t": 1, "value": 500}]}}')
    with qtbot.waitSignal(window.errorShown, timeout=5_000) as shown:
        window.load_tracks(str(path))
    assert "bad.json: yaw[0]: value 500" in shown.args[0] and window.tracks is None


def test_an_emotion_key_makes_the_motion_again_with_the_smile(window, qtbot, tmp_path):
    from studio.engines.demo import rig

    before = window.result.raw.copy()
    calls = window.motion_worker.generate_calls
    path = tmp_path / "smile.json"
    keys = [{"t": 0, "value": "Neutral", "interp": "hold"}, {"t": 2, "value": "Happy"}]
    path.write_text(json.dumps({"tracks": {"emotion": keys}}))
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.load_tracks(str(path))
    assert window.motion_worker.generate_calls == calls + 1  # emotion conditions the motion
    exp = (window.result.raw - before)[:, layout.EXP].reshape(len(before), layout.NUM_KP, 3)
    assert np.abs(exp[:50]).max() == 0 and (exp[60:, rig.MOUTH_CORNER_L, 1] < -0.02).all()


def test_keys_added_moved_edited_deleted_and_undone(window, qtbot):
    from studio.motion.controls import Key

    ed, tl = window.track_editor, window.timeline
    before = layout.pose_degrees(window.result.smoothed)
    calls = window.motion_worker.generate_calls
    ed.track.setCurrentIndex(ed.track.findData("pitch"))
    window.playback.seek(50)  # 2.0 s
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.act_add_key.trigger()  # K: a key at the playhead, on the curve (0 there)
    assert window.tracks.keys("pitch") == (Key(2.0, 0.0),) and tl.selected == ("pitch", 0)
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        tl.keyRequested.emit(2.6)  # what a double click on the timeline at 2.6 s sends
    second = window.tracks.keys("pitch")[1].t
    assert len(window.tracks.keys("pitch")) == 2 and second == 2.6
    tl.keySelected.emit("pitch", 0)  # what a click on the first key's diamond sends
    assert tl.selected == ("pitch", 0) and ed.value.isEnabled()
    ed.value.setValue(9.0)
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        ed.value.editingFinished.emit()
    after = layout.pose_degrees(window.result.smoothed)
    assert after[50, 0] - before[50, 0] > 4.0  # +9° at 2 s, down to the key of 0 at 2.6 s
    assert np.abs(after[80:] - before[80:]).max() < 0.05  # and nothing after it
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        tl.keyMoved.emit("pitch", 0, 1.6)  # what a drag of the diamond ends with
    assert [k.t for k in window.tracks.keys("pitch")] == [1.6, second]
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.act_delete_key.trigger()  # Delete: the selected key goes
    assert [k.t for k in window.tracks.keys("pitch")] == [second]
    assert window.motion_worker.generate_calls == calls  # pose keys never re-run the model
    stack = window.undo_stack
    assert stack.count() == 5 and stack.undoText() == "Delete pitch key at 1.60 s"
    for _ in range(5):
        with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
            window.act_undo.trigger()
    assert window.tracks is None and np.allclose(
        layout.pose_degrees(window.result.smoothed), before
    )
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.act_redo.trigger()
    assert window.tracks.keys("pitch") == (Key(2.0, 0.0),)


def test_settings_edits_are_undone_one_setting_at_a_time(window, qtbot):
    stack = window.undo_stack
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.controls.window.setValue(7)
        window.controls.window.setValue(9)  # the same setting again: one command
    assert stack.count() == 1 and "smooth window" in stack.undoText()
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.controls.smooth.setChecked(False)
    assert stack.count() == 2
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert window.controls.smooth.isChecked() and window.controls.window.value() == 9
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert window.controls.window.value() == 5 and window.current_settings().smooth_window == 5
    assert window.preview_settings.smooth_window == 5


def test_keyed_tracks_save_for_the_cli_and_ride_in_a_preset(window, qtbot, tmp_path, capsys):
    from conftest import run_cli

    assert not window.act_save_tracks.isEnabled()
    path = tmp_path / "nod.json"
    path.write_text(json.dumps(NOD))
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.load_tracks(str(path))
    saved = tmp_path / "saved.json"
    window.save_tracks(str(saved))
    assert ControlTracks.load(saved) == ControlTracks.from_dict(NOD)
    out, report = tmp_path / "o.mp4", tmp_path / "o.json"
    argv = ["render", "--demo", "--size", "64", "--controls", str(saved), "--out", str(out)]
    code, _, err = run_cli([*argv, "--x264-preset", "ultrafast", "--report", str(report)], capsys)
    assert code == 0, err
    assert json.loads(report.read_text())["controls"] == ControlTracks.from_dict(NOD).to_dict()
    preset = tmp_path / "preset.json"
    window.save_preset(str(preset))
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.clear_tracks()
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.load_preset(str(preset))
    assert window.tracks == ControlTracks.from_dict(NOD)


def test_every_cadence_bound_replans_the_motion(qtbot) -> None:
    from studio.gui.widgets.controls import ControlsPanel

    panel = ControlsPanel()
    qtbot.addWidget(panel)
    for box, value in ((panel.warp_px, 12.0), (panel.pose_gap, 3.0), (panel.lid_px, 4.0)):
        with qtbot.waitSignal(panel.changed, timeout=1000) as got:
            box.setValue(value)
        assert got.args == ["motion"]
    assert panel.settings().cadence.max_lid_px == 4.0
