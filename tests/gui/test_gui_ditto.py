"""The GUI's ditto backend under a real offscreen Qt, real worker threads and a reduced
random-weight checkpoint tree (with ONNX stand-ins for HuBERT and the face models) on a drawn
face; short clips and 2 DDIM steps keep it quick on a CPU."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from conftest import DITTO_CLIP_S, DITTO_FACE_HW  # noqa: E402

# Reduced networks: one torch thread is as fast idle and far steadier on a busy machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from studio.gui import theme  # noqa: E402
from studio.gui.widgets.controls import (  # noqa: E402
    FP16_NEEDS_CUDA,
    NEEDS_CHECKPOINTS,
    PRECISIONS,
)
from studio.gui.window import NEEDS_AVATAR, MainWindow  # noqa: E402

TIMEOUT_MS = 120_000
FACE_HW, CLIP_S = DITTO_FACE_HW, DITTO_CLIP_S  # stride 3 renders 8 of the 20 frames


@pytest.fixture(scope="module")
def assets(ditto_assets):
    return ditto_assets


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch, assets):
    monkeypatch.setenv("STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("STUDIO_CACHE_DIR", str(assets["cache"]))  # registered once per module
    from PySide6.QtWidgets import QApplication

    theme.apply(QApplication.instance())


def _open(qtbot, assets, avatar=None, wait=True) -> MainWindow:
    w = MainWindow(audio=str(assets["audio"]), avatar=avatar)
    qtbot.addWidget(w)
    w.show()
    if wait:
        with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS):
            pass
    return w


def _set_checkpoints(w: MainWindow, qtbot, path) -> bool:
    with qtbot.waitSignal(w.checkpointsChanged, timeout=30_000) as blocker:
        w.set_checkpoints(str(path))
    return blocker.args[0]


def _is_ditto(stats) -> bool:
    return stats["backend"] == "ditto"


def _to_ditto(w: MainWindow, qtbot, assets) -> dict:
    """Checkpoints, avatar, 2 steps and stride 3 (quietly), then the ditto backend."""
    assert _set_checkpoints(w, qtbot, assets["tree"])
    w.open_path(str(assets["face"]))
    w.controls.set_settings(w.current_settings().replace(steps=2, stride="3"))
    with qtbot.waitSignal(
        w.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto
    ) as blocker:
        w.controls.backend.setCurrentIndex(w.controls.backend.findData("ditto"))
    return blocker.args[0]


def _item(combo, data):
    return combo.model().item(combo.findData(data))


def test_ditto_appears_with_checkpoints_and_needs_an_avatar(qtbot, assets):
    w = _open(qtbot, assets)
    c = w.controls
    ditto = _item(c.backend, "ditto")
    assert not ditto.isEnabled() and ditto.toolTip() == NEEDS_CHECKPOINTS
    assert not c.engine_box.isEnabled()  # emotion, deltas, steps: ditto only
    assert [p for p in PRECISIONS if _item(c.precision, p).isEnabled()] == ["fp32"]
    assert "demo engine" in _item(c.precision, "bf16").toolTip()
    assert not w.act_clear_checkpoints.isEnabled()

    assert _set_checkpoints(w, qtbot, assets["tree"])  # what File → Checkpoints… calls
    assert ditto.isEnabled() and w.checkpoints == str(assets["tree"])
    assert w.act_clear_checkpoints.isEnabled()
    c.set_backend("ditto")  # quietly: only to look at the precision choices
    assert c.engine_box.isEnabled()
    enabled = {p for p in PRECISIONS if _item(c.precision, p).isEnabled()}
    import torch

    if torch.cuda.is_available():
        assert enabled == {"auto", "fp32", "bf16", "fp16"}
    else:
        assert enabled == {"auto", "fp32", "bf16"}
        assert _item(c.precision, "fp16").toolTip() == FP16_NEEDS_CUDA
    assert c.settings().precision == "auto"
    c.set_backend("demo")

    # Without an avatar image, choosing ditto says what to do and stays on demo.
    with qtbot.waitSignal(w.errorShown, timeout=5000) as blocker:
        c.backend.setCurrentIndex(c.backend.findData("ditto"))
    assert blocker.args[0] == NEEDS_AVATAR
    assert c.backend_name() == "demo" and w.motion_worker.engine_builds == 0
    w.error_box.close()
    w.close()


def test_ditto_renders_full_frames_emotion_reruns_motion_deltas_only_rerender(qtbot, assets):
    from PySide6.QtCore import QObject, Qt, Slot

    w = _open(qtbot, assets)
    seen: list[tuple[str, str, int, int]] = []  # what the window shows after each build step

    class Look(QObject):  # lives on the GUI thread: runs after the window's own queued slot
        @Slot(int, str, int, int)
        def look(self, _gen, stage, _done, _total) -> None:
            bar = w.progress_bar
            seen.append((stage, w.status_engine.text(), bar.maximum(), bar.value()))

    looker = Look()
    w.motion_worker.engineProgress.connect(looker.look, Qt.ConnectionType.QueuedConnection)
    motion_stages: list[str] = []
    w.motion_worker.motionProgress.connect(lambda _g, stage, *_: motion_stages.append(stage))
    stats = _to_ditto(w, qtbot, assets)
    building = [text for _, text, _, _ in seen]
    assert building and all("starting the ditto engine: " in t for t in building)
    assert not any("switching to" in t for t in building)
    assert {"registering avatar", "loading networks"} <= {stage for stage, *_ in seen}
    assert {"HuBERT features", "LMDM windows"} <= set(motion_stages)
    # never a full bar while the work goes on: a count below its total, or busy (maximum 0)
    assert all(top == 0 or value < top for _, _, top, value in seen)
    h, wd = FACE_HW
    assert stats["frame_hw"] == (h, wd) and stats["device"] == "cpu"
    assert stats["precision"] == "fp32"  # auto on the CPU
    text = w.status_engine.text()
    assert "backend ditto" in text and "device cpu" in text and "precision fp32" in text
    assert "runtime torch" in text and stats["runtime"] == "torch"
    # Every frame arrived, at the avatar image's size, and the viewer shows it unsquashed.
    assert len(w.frames) == w.result.num_frames == round(CLIP_S * 25)
    assert all(f is not None and f.shape == (h, wd, 3) for f in w.frames)
    assert w.viewer.frame.shape == (h, wd, 3)
    assert (w.viewer.image.width(), w.viewer.image.height()) == (wd, h)
    (x0, x1), (y0, y1) = w.viewer.view.viewRange()
    assert x0 <= 0 and x1 >= wd and y0 <= 0 and y1 >= h
    assert w.motion_worker.engine_builds == 1
    calls = w.motion_worker.generate_calls
    raw = w.result.raw.copy()
    frames = [f.copy() for f in w.frames]

    # Emotion is an input of LMDM: the motion is generated again.
    with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto):
        w.controls.emotion.setCurrentIndex(3)  # Happy
    assert w.motion_worker.generate_calls == calls + 1
    assert w.current_settings().emotion == 3
    assert not np.allclose(w.result.raw, raw)
    calls, result = w.motion_worker.generate_calls, w.result
    frames = [f.copy() for f in w.frames]

    # A pose delta is applied at stitching: same motion, new frames.
    with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto):
        w.controls.deltas["yaw"].setValue(20.0)
    assert w.motion_worker.generate_calls == calls and w.result is result
    assert all(f is not None for f in w.frames)
    assert any(not np.array_equal(a, b) for a, b in zip(frames, w.frames, strict=True))

    # Smoothing re-runs only the post-processing, not the generator.
    with qtbot.waitSignal(w.motion_worker.motionReady, timeout=TIMEOUT_MS):
        w.controls.window.setValue(9)
    assert w.motion_worker.generate_calls == calls
    assert w.motion_worker.engine_builds == 1  # nothing above rebuilt the engine
    w.close()


def test_ditto_export_uses_the_same_engine_at_the_avatar_size(qtbot, assets, tmp_path):
    import av

    w = _open(qtbot, assets)
    _to_ditto(w, qtbot, assets)
    dlg = w.open_export_dialog()
    h, wd = FACE_HW
    assert not dlg.size.isEnabled() and f"{wd} × {h}" in dlg.size_note.text()
    assert "crop" in dlg.size_note.text()
    out = tmp_path / "ditto.mp4"
    dlg.path.setText(str(out))
    with qtbot.waitSignal(w.render_worker.exportDone, timeout=TIMEOUT_MS) as blocker:
        dlg.export_button.click()
    report = blocker.args[1]
    assert report["frame_size"] == [wd, h] and report["frames"] == w.result.num_frames
    assert "warp_decode" in report["timings_ms"] and "lmdm" in report["timings_ms"]
    with av.open(str(out)) as container:
        video = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(video) == w.result.num_frames and video[0].shape == (h, wd, 3)
    # The same engine and settings as the preview (up to H.264 loss).
    diff = np.abs(video[5].astype(int) - w.frames[5].astype(int)).mean()
    assert diff < 6.0
    w.close()


def test_missing_files_are_named_with_their_stage_and_demo_keeps_working(qtbot, assets, tmp_path):
    w = _open(qtbot, assets)
    broken = shutil.copytree(assets["tree"], tmp_path / "broken")
    (broken / "ditto_pytorch/models/decoder.pth").unlink()
    with qtbot.waitSignal(w.errorShown, timeout=30_000) as blocker:
        w.set_checkpoints(str(broken))
    assert "decoder.pth" in blocker.args[0] and "render / decoder" in blocker.args[0]
    assert not w.controls.engine_available("ditto") and w.checkpoints is None
    w.error_box.close()

    # A folder that was complete when set and lost a file later: the engine build fails,
    # says which file, and the window goes back to demo.
    later = shutil.copytree(assets["tree"], tmp_path / "later")
    assert _set_checkpoints(w, qtbot, later)
    w.open_path(str(assets["face"]))
    (later / "ditto_pytorch/aux_models/det_10g.onnx").unlink()
    with qtbot.waitSignal(w.errorShown, timeout=TIMEOUT_MS) as blocker:
        w.controls.backend.setCurrentIndex(w.controls.backend.findData("ditto"))
    assert "det_10g.onnx" in blocker.args[0]
    assert "registration / face detection" in blocker.args[0]
    assert w.controls.backend_name() == "demo"
    w.error_box.close()
    with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS) as blocker:
        pass  # the fallback to demo renders again
    assert blocker.args[0]["backend"] == "demo"
    assert "backend demo" in w.status_engine.text()
    assert all(f is not None for f in w.frames)
    w.close()


def test_checkpoints_and_the_ditto_backend_survive_a_restart(qtbot, assets):
    w = _open(qtbot, assets)
    assert _set_checkpoints(w, qtbot, assets["tree"])
    w.open_path(str(assets["face"]))
    w.controls.set_settings(w.current_settings().replace(steps=2, stride="3", emotion=6))
    w.controls.set_backend("ditto")  # saved with the settings, without rendering here
    w.close()

    # Same config folder: the folder is checked again and, with an avatar, ditto resumes.
    again = MainWindow(audio=str(assets["audio"]), avatar=str(assets["face"]))
    qtbot.addWidget(again)
    again.show()
    with qtbot.waitSignal(again.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto):
        pass
    assert again.checkpoints == str(assets["tree"]) and again.controls.engine_available("ditto")
    assert again.current_settings().emotion == 6
    again.clear_checkpoints()
    assert not again.controls.engine_available("ditto") and again.controls.backend_name() == "demo"
    with qtbot.waitSignal(again.renderFinished, timeout=TIMEOUT_MS):
        pass  # back on demo
    again.close()

    third = _open(qtbot, assets)
    assert third.checkpoints is None and not third.controls.engine_available("ditto")
    assert third.controls.backend_name() == "demo"
    third.close()


def test_compile_box_needs_a_gpu_and_round_trips_the_setting(qtbot) -> None:
    from studio.gui.widgets.controls import COMPILE_NEEDS_CUDA, ControlsPanel
    from studio.settings import RenderSettings

    panel = ControlsPanel()
    qtbot.addWidget(panel)
    panel.set_cuda_available(False)
    panel.set_settings(RenderSettings(compile=True))  # e.g. a preset from a GPU machine
    box = panel.engine_box
    assert not box.isEnabled()  # the demo engine reads none of the engine options
    panel.set_engine_available("ditto", True)
    panel.set_backend("ditto")
    assert box.isEnabled() and panel.emotion.isEnabled()
    assert not panel.compile.isEnabled() and panel.compile.toolTip() == COMPILE_NEEDS_CUDA
    assert panel.settings().compile is False
    panel.set_cuda_available(True)
    assert panel.compile.isEnabled()
    with qtbot.waitSignal(panel.changed, timeout=10_000) as blocker:
        panel.compile.setChecked(True)
    assert blocker.args == ["output"]  # frames re-render; the motion is kept
    assert panel.settings().compile is True
    panel.set_settings(RenderSettings(compile=False))
    assert not panel.compile.isChecked()


def test_lmdm_precision_needs_a_gpu_and_round_trips_the_setting(qtbot) -> None:
    """The Motion menu (LMDM's precision): fp32 only without a CUDA GPU (the CPU runs it),
    every choice with one; a change re-runs the motion."""
    from studio.gui.widgets.controls import MOTION_NEEDS_CUDA, ControlsPanel
    from studio.settings import RenderSettings

    panel = ControlsPanel()
    qtbot.addWidget(panel)
    panel.set_engine_available("ditto", True)
    panel.set_backend("ditto")
    combo = panel.motion_precision
    assert combo.isEnabled() and combo.currentData() == "fp32"
    assert [combo.model().item(i).isEnabled() for i in range(combo.count())] == [
        True,
        False,
        False,
        False,
    ]
    assert combo.model().item(2).toolTip() == MOTION_NEEDS_CUDA
    panel.set_settings(RenderSettings(motion_precision="fp16"))  # a preset from a GPU machine
    assert panel.settings().motion_precision == "fp32"
    panel.set_cuda_available(True)
    assert all(combo.model().item(i).isEnabled() for i in range(combo.count()))
    with qtbot.waitSignal(panel.changed, timeout=10_000) as blocker:
        combo.setCurrentIndex(combo.findData("fp16"))
    assert blocker.args == ["motion"]  # LMDM samples the motion again
    assert panel.settings().motion_precision == "fp16"
    panel.set_settings(RenderSettings(motion_precision="bf16"))
    assert panel.settings().motion_precision == "bf16"
    panel.set_cuda_available(False)
    assert panel.settings().motion_precision == "fp32"


def test_runtime_choice_shows_what_runs_here(qtbot, assets) -> None:
    from studio.gui.widgets.controls import RUNTIME_UNCHECKED
    from studio.gui.worker import runtime_reasons

    w = _open(qtbot, assets)
    panel = w.controls
    assert not panel.runtime.model().item(1).isEnabled()  # before any checkpoint check
    assert panel.runtime.model().item(1).toolTip() == RUNTIME_UNCHECKED
    assert _set_checkpoints(w, qtbot, assets["tree"])
    reasons = runtime_reasons()
    assert reasons["torch"] is None and reasons["onnxruntime"] is None  # both installed here
    for i, name in enumerate(("torch", "onnxruntime", "tensorrt")):
        item = panel.runtime.model().item(i)
        assert item.isEnabled() == (reasons[name] is None)
        if reasons[name] is not None:
            assert item.toolTip() == reasons[name]
    panel.runtime.setCurrentIndex(1)
    assert panel.settings().runtime == "onnxruntime"


def test_a_new_crop_framing_is_drawn_then_registered(qtbot, assets):
    w = _open(qtbot, assets)
    _to_ditto(w, qtbot, assets)
    builds = w.motion_worker.engine_builds
    first = w.engine.avatar.m_c2o.copy()
    with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto):
        w.controls.crop["crop_scale"].setValue(2.0)  # closer
        # at once, before registering: the new crop's square on the avatar image
        assert w.viewer.framing.isVisible() and "scale 2" in w.viewer.caption.toPlainText()
        xs, _ = w.viewer.framing.getData()
        side = float(np.hypot(*(np.diff(w.viewer.framing.getData(), axis=1)[:, 0])))
        assert abs(side - 512 * first[0, 0] * 2.0 / 2.3) < 1.0 and len(xs) == 5
    assert w.motion_worker.engine_builds == builds + 1  # registered again with it
    assert w.engine.avatar.m_c2o[0, 0] == pytest.approx(first[0, 0] * 2.0 / 2.3, rel=1e-4)
    assert not w.viewer.framing.isVisible()  # the preview replaced it
    w.close()


def test_a_video_dropped_as_the_avatar_renders_on_its_moving_frames(qtbot, assets, tmp_path):
    """A video opened (or dropped) as the avatar: registered frame by frame, the preview's
    frames pasted onto the video's own frames, at its size."""
    from conftest import drifting_face, write_video

    h, wd = FACE_HW
    shot = drifting_face(26, (140, 60, 220, 150), (h, wd), step=1.0)
    for i, f in enumerate(shot):  # the frames differ below the face: a marker per frame
        f[-12:, :] = (i * 9, 255 - i * 9, 60)
    video = write_video(tmp_path / "talk.mp4", shot)
    w = _open(qtbot, assets)
    assert _set_checkpoints(w, qtbot, assets["tree"])
    w.open_path(str(video))
    assert w.avatar_path == str(video)
    w.controls.set_settings(w.current_settings().replace(steps=2, stride="1"))
    with qtbot.waitSignal(w.renderFinished, timeout=TIMEOUT_MS, check_params_cb=_is_ditto):
        w.controls.backend.setCurrentIndex(w.controls.backend.findData("ditto"))
    assert w.engine.avatar.is_video and w.engine.avatar.num_frames == 26
    assert all(f is not None and f.shape == (h, wd, 3) for f in w.frames)
    for g in (0, 5, 12):
        marker = w.frames[g][-8:, 40:-40].reshape(-1, 3).mean(axis=0)
        assert np.abs(marker - (g * 9, 255 - g * 9, 60)).max() < 6
    w.close()
