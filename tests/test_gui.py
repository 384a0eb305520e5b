"""The studio window under a real offscreen Qt (pytest-qt)."""

import av
import numpy as np
import pytest

pytest.importorskip("PySide6")

from studio.gui import theme  # noqa: E402
from studio.gui.window import MainWindow  # noqa: E402

RENDER_TIMEOUT_MS = 120_000


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    from PySide6.QtWidgets import QApplication

    theme.apply(QApplication.instance())
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.renderFinished, timeout=RENDER_TIMEOUT_MS):
        pass
    yield w
    w.close()


def test_opens_on_the_demo_and_frames_reach_the_viewer(window):
    assert window.result is not None and window.result.num_frames == len(window.frames)
    assert all(f is not None for f in window.frames)
    shown = window.viewer.frame
    assert shown is not None and shown.shape == (512, 512, 3)
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
    qtbot.waitUntil(lambda: not window.rendering, timeout=1000)


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
    assert window.error_box.detailedText()
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
    with qtbot.waitSignal(window.errorShown, timeout=2000) as blocker:
        window.open_path(str(not_image))
    assert "face.png" in blocker.args[0]
    window.error_box.close()
    with qtbot.waitSignal(window.errorShown, timeout=2000):
        window.open_path(str(tmp_path / "notes.docx"))
    window.error_box.close()
    from PySide6.QtGui import QImage

    good = tmp_path / "avatar.png"
    img = QImage(64, 64, QImage.Format.Format_RGB32)
    img.fill(0x336699)
    assert img.save(str(good))
    window.open_path(str(good))
    assert window.avatar_path == str(good)


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
