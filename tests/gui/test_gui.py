"""The studio window under a real offscreen Qt (pytest-qt)."""

import av
import numpy as np
import pytest

pytest.importorskip("PySide6")

from studio.gui.window import MainWindow  # noqa: E402

RENDER_TIMEOUT_MS = 120_000


def test_opens_on_the_demo_and_frames_reach_the_viewer(window):
    assert window.result is not None and window.result.num_frames == len(window.frames)
    assert all(f is not None for f in window.frames)
    shown = window.viewer.frame
    side = window.controls.settings().size  # the size last used (the fixture: 256)
    assert shown is not None and shown.shape == (side, side, 3)
    assert any(shown is f for f in window.frames)
    assert "fps" in window.metrics.text("fps") and window.last_fps > 0
    assert "backend demo" in window.status_engine.text()
    # The timeline and plots got the clip.
    assert window.timeline.bands.opts["x"].size == window.result.num_frames
    assert window.plots.smoothed_data.shape == (window.result.num_frames, 6)


def test_smoothing_window_updates_curve_and_jerk_without_regenerating_motion(window, qtbot):
    calls = window.motion_worker.generate_calls
    before_curve = window.plots.smoothed_data.copy()
    before_jerk = window.metrics.text("jerk_smoothed")
    with qtbot.waitSignal(window.renderFinished, timeout=RENDER_TIMEOUT_MS):
        window.controls.window.setValue(15)
    assert window.motion_worker.generate_calls == calls
    assert not np.allclose(window.plots.smoothed_data, before_curve)
    assert window.metrics.text("jerk_smoothed") != before_jerk
    assert window.result.kinematics["pose_jerk_mean_smoothed"] < float(before_jerk.split()[0])


def test_cancel_stops_the_render(window, qtbot):
    gen = window.generation + 1
    with qtbot.waitSignal(window.render_worker.cancelled, timeout=5000) as blocker:
        window.controls.accel.setValue(0.3)
        qtbot.waitUntil(lambda: window.generation == gen and window.rendering, timeout=5000)
        window.cancel_render()
    assert blocker.args[0] == gen
    qtbot.waitUntil(lambda: not window.rendering, timeout=10_000)


def test_export_writes_the_same_video_as_the_cli(window, qtbot, tmp_path):
    from studio.cli import main

    out = tmp_path / "gui.mp4"
    dlg = window.open_export_dialog()
    dlg.path.setText(str(out))
    dlg.size.setCurrentIndex(dlg.size.findData(256))
    assert dlg.preset.currentData() == "medium"  # the settings' default
    dlg.preset.setCurrentIndex(dlg.preset.findData("veryfast"))
    with qtbot.waitSignal(window.render_worker.exportDone, timeout=RENDER_TIMEOUT_MS):
        dlg.export_button.click()
    qtbot.waitUntil(lambda: not dlg.running, timeout=5000)
    assert "Wrote" in dlg.status.text() and dlg.progress.value() == 100
    cli = tmp_path / "cli.mp4"
    argv = ["render", "--demo", "--out", str(cli), "--size", "256", "--x264-preset", "veryfast"]
    assert main(argv) == 0

    def frames(path):
        with av.open(str(path)) as c:
            assert c.streams.audio[0].codec_context.name == "aac"
            return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]

    a, b = frames(out), frames(cli)
    assert len(a) == len(b) == window.result.num_frames
    # the same encoder settings (veryfast, not the default medium) give the same frames
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_corrupt_audio_shows_an_error_and_the_app_stays_usable(window, qtbot, tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 10)
    with qtbot.waitSignal(window.errorShown, timeout=10_000) as blocker:
        window.open_audio(str(bad))
    assert "broken.wav" in blocker.args[0]
    assert window.error_box is not None and window.error_box.isVisible()
    # a one-line error has no details: "Show Details…" would only repeat it
    assert window.error_box.text() == blocker.args[0] and window.error_box.detailedText() == ""
    window.error_box.close()
    window.show_error("first line\nsecond line")
    assert window.error_box.text() == "first line"
    assert "second line" in window.error_box.detailedText()
    window.error_box.close()
    # Still usable: the demo speech renders again.
    window.audio_path = None
    with qtbot.waitSignal(window.renderFinished, timeout=RENDER_TIMEOUT_MS):
        window.request_motion()
    assert all(f is not None for f in window.frames)


def test_settings_and_recent_files_persist(window, qtbot, tmp_path):
    window.controls.window.setValue(9)
    preset = tmp_path / "p.json"
    window.save_preset(str(preset))
    window._add_recent(str(preset))
    window.close()
    again = MainWindow()
    qtbot.addWidget(again)
    assert again.controls.settings().smooth_window == 9
    assert str(preset) in again._recent()
    from studio.settings import RenderSettings

    assert RenderSettings.load(preset).smooth_window == 9
    again.close()


def test_keyboard_transport_steps_and_scrubs(window, qtbot):
    from PySide6.QtCore import Qt

    qtbot.keyClick(window, Qt.Key.Key_Right)
    qtbot.keyClick(window, Qt.Key.Key_Right)
    assert window.playback.frame == 2
    assert window.viewer.frame is window.frames[2]
    qtbot.keyClick(window, Qt.Key.Key_Left)
    assert window.playback.frame == 1
    window.timeline.playhead.setValue(100.5 / 25)
    window.timeline.scrubbed.emit(100)
    assert window.playback.frame == 100 and window.viewer.frame is window.frames[100]
    qtbot.keyClick(window, Qt.Key.Key_Home)
    assert window.playback.frame == 0
    qtbot.keyClick(window, Qt.Key.Key_Space)
    assert window.playback.playing
    qtbot.waitUntil(lambda: window.playback.frame > 3, timeout=5000)
    qtbot.keyClick(window, Qt.Key.Key_Space)
    assert not window.playback.playing


def test_open_path_routes_files_and_rejects_bad_avatars(window, qtbot, tmp_path):
    not_image = tmp_path / "face.png"
    not_image.write_bytes(b"not really a png")
    with qtbot.waitSignal(window.errorShown, timeout=10_000) as blocker:
        window.open_path(str(not_image))
    assert "face.png" in blocker.args[0]
    window.error_box.close()
    with qtbot.waitSignal(window.errorShown, timeout=10_000):
        window.open_path(str(tmp_path / "notes.docx"))
    window.error_box.close()
    from PySide6.QtGui import QImage

    good = tmp_path / "avatar.png"
    img = QImage(64, 64, QImage.Format.Format_RGB32)
    img.fill(0x336699)
    assert img.save(str(good))
    window.open_path(str(good))
    assert window.avatar_path == str(good)
    # on the demo engine the photo is not animated: the window says so, not only the status bar
    assert "demo engine draws its own character" in window.notice.text()
    assert "avatar.png" in window.notice.text() and "Checkpoints" in window.notice.text()
    assert window.notice.action.isVisibleTo(window)


def test_closing_mid_render_stops_the_workers(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(
        lambda: w.rendering and any(f is not None for f in w.frames), timeout=RENDER_TIMEOUT_MS
    )
    w.close()
    assert w.render_thread.isFinished() and w.motion_thread.isFinished()


def _click_at_time(qtbot, widget, plot_item, seconds: float, y_frac: float = 0.5) -> None:
    """A left click on ``widget`` where ``plot_item`` shows ``seconds`` (at a height inside it,
    a fraction ``y_frac`` down the item: 0.98 lands on its time axis)."""
    from PySide6.QtCore import QPointF, Qt

    rect = plot_item.sceneBoundingRect()
    x = plot_item.vb.mapViewToScene(QPointF(seconds, 0.0)).x()
    scene_point = QPointF(x, rect.top() + y_frac * rect.height())
    pos = widget.mapFromScene(scene_point)
    qtbot.mouseClick(widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def test_a_click_on_the_timeline_or_a_plot_seeks_there(window, qtbot):
    _click_at_time(qtbot, window.timeline, window.timeline.getPlotItem(), 4.02)
    assert window.playback.frame == 100
    assert window.viewer.frame is window.frames[100] and "frame 101 /" in window.frame_label.text()
    _click_at_time(qtbot, window.plots, window.plots.angles, 2.02)
    assert window.playback.frame == 50
    _click_at_time(qtbot, window.plots, window.plots.jerk, 6.02, y_frac=0.97)  # its time axis
    assert window.playback.frame == 150 and window.viewer.frame is window.frames[150]


def test_after_a_cancel_missing_frames_are_shown_as_such_and_ctrl_r_renders_them(window, qtbot):
    from PySide6.QtCore import Qt

    n = window.result.num_frames
    with qtbot.waitSignal(window.render_worker.cancelled, timeout=RENDER_TIMEOUT_MS):
        window.controls.accel.setValue(0.3)  # a new motion and a new preview render
        qtbot.waitUntil(lambda: window.rendering and window.frames[30] is not None, timeout=20_000)
        window.cancel_render()
    qtbot.waitUntil(lambda: not window.rendering, timeout=10_000)
    done = sum(f is not None for f in window.frames)
    assert 30 < done < n
    assert "cancelled" in window.metrics.text("preview") and window.metrics.is_stale("preview")
    assert window.metrics.is_stale("fps") and "earlier render" in window.metrics.text("fps")
    window.playback.seek(n - 1)  # never rendered: a dimmed stand-in that says so
    assert window.viewer.standin and "not rendered" in window.viewer.caption.toPlainText()
    assert f"frame {n} / {n}" in window.frame_label.text()
    window.playback.seek(3)  # rendered: the real frame, no caption
    assert not window.viewer.standin and window.viewer.frame is window.frames[3]
    window.playback.seek(n - 1)
    with qtbot.waitSignal(window.renderFinished, timeout=RENDER_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert all(f is not None for f in window.frames)
    assert not window.viewer.standin and window.viewer.frame is window.frames[n - 1]
    assert window.metrics.text("preview").startswith("complete")
    assert not window.metrics.is_stale("fps")


def test_the_frame_counter_follows_the_playhead_not_the_render(window, qtbot):
    from PySide6.QtCore import Qt

    window.playback.seek(12)
    with qtbot.waitSignal(window.renderFinished, timeout=RENDER_TIMEOUT_MS):
        window.controls.accel.setValue(0.35)
        qtbot.waitUntil(lambda: window.rendering and window.frames[40] is not None, timeout=20_000)
        assert "frame 13 /" in window.frame_label.text()  # not the render's progress
        qtbot.keyClick(window, Qt.Key.Key_Left)
        assert window.playback.frame == 11 and "frame 12 /" in window.frame_label.text()
        assert window.viewer.frame is window.frames[11]
    assert "frame 12 /" in window.frame_label.text()


def test_progress_bar_is_busy_rather_than_full_while_work_goes_on(window):
    window._show_progress(3, 10)
    assert (window.progress_bar.minimum(), window.progress_bar.maximum()) == (0, 10)
    window._show_progress(10, 10)  # a stage done, the next one not counted yet
    assert window.progress_bar.maximum() == 0  # busy, not a full bar


def test_export_asks_before_overwriting_and_reuses_the_preview(window, qtbot, tmp_path):
    from PySide6.QtWidgets import QMessageBox

    from studio.cli import main

    existing = tmp_path / "talk.mp4"
    existing.write_bytes(b"an earlier export")
    dlg = window.open_export_dialog()
    dlg.path.setText(str(existing))
    dlg.preset.setCurrentIndex(dlg.preset.findData("veryfast"))
    assert dlg.size.currentData() == window.preview_settings.size  # the preview's frames fit
    dlg.export_button.click()
    box = dlg.overwrite_box
    assert box is not None and box.isVisible() and "talk.mp4 already exists" in box.text()
    cancel = box.button(QMessageBox.StandardButton.Cancel)
    cancel.click()
    assert not dlg.running and existing.read_bytes() == b"an earlier export"
    dlg.export_button.click()
    keep = next(b for b in dlg.overwrite_box.buttons() if "talk_2.mp4" in b.text())
    with qtbot.waitSignal(window.render_worker.exportDone, timeout=RENDER_TIMEOUT_MS) as done:
        keep.click()
    fresh = tmp_path / "talk_2.mp4"
    assert done.args[0] == str(fresh) and existing.read_bytes() == b"an earlier export"
    n = window.result.num_frames
    assert done.args[1]["reused_frames"] == n  # nothing rendered again
    qtbot.waitUntil(lambda: not dlg.running, timeout=5000)
    assert f"{n} preview frames reused" in dlg.status.text()
    dlg.reject()
    # the next export suggests a fresh name instead of the file just written
    assert window.open_export_dialog().path.text() == str(tmp_path / "talk_3.mp4")
    window.export_dialog.reject()
    cli = tmp_path / "cli.mp4"
    size = str(window.controls.settings().size)
    argv = ["render", "--demo", "--out", str(cli), "--x264-preset", "veryfast", "--size", size]
    assert main(argv) == 0

    def frames(path):
        with av.open(str(path)) as c:
            return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]

    a, b = frames(fresh), frames(cli)
    assert len(a) == len(b) == n and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_engine_notices_reach_the_status_bar_from_any_thread(window, qtbot):
    import logging
    import threading

    note = "exporting warp_network to ONNX for ONNX Runtime (≈ 182 MB, once)"
    worker = threading.Thread(target=lambda: logging.getLogger("studio.runtime.x").info(note))
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: window.statusBar().currentMessage() == note, timeout=10_000)


@pytest.mark.parametrize("size", [(1066, 666), (1280, 720), (1600, 1000)])
def test_settings_panel_fits_its_dock_without_a_horizontal_scrollbar(window, qtbot, size):
    window.resize(*size)
    scroll = window.dock.widget()
    panel = scroll.widget()
    qtbot.waitUntil(lambda: window.width() == size[0], timeout=10_000)
    qtbot.wait(100)  # let the dock's layout settle
    assert panel.minimumSizeHint().width() <= scroll.viewport().width()
    assert panel.width() <= scroll.viewport().width()


def test_a_preset_loads_as_it_is_or_is_an_error_naming_the_key(window, qtbot, tmp_path):
    preset = tmp_path / "wide.json"
    preset.write_text('{"smooth_window": 51, "accel_limit": 20, "cadence": {"fast_flux": 0.625}}')
    window.load_preset(str(preset))  # the clamps: 51 -> 31, 20 -> 10
    s = window.controls.settings()
    assert (s.smooth_window, s.accel_limit, s.cadence.fast_flux) == (51, 20.0, 0.625)
    before = window.controls.settings()
    preset.write_text('{"smooth_window": 151}')
    with qtbot.waitSignal(window.errorShown, timeout=10_000) as blocker:
        window.load_preset(str(preset))
    assert blocker.args[0] == f"{preset}: smooth_window: 151 is above the maximum, 101"
    assert window.controls.settings() == before
    window.error_box.close()
