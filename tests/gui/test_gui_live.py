"""The window's Live mode under a real offscreen Qt (pytest-qt), on the demo engine."""

import math
import queue

import av
import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("PySide6")

from studio.gui import live as live_mod  # noqa: E402
from studio.layout import FPS, SAMPLE_RATE  # noqa: E402
from studio.live.sources import PcmConverter, PcmFormat, QueueSource  # noqa: E402

RENDER_TIMEOUT_MS = 120_000
SESSION_TIMEOUT_MS = 60_000
CLIP_S = 2.5


@pytest.fixture
def speech(tmp_path):
    """The demo speech cut to CLIP_S seconds (16 kHz mono WAV)."""
    from studio.engines.demo import demo_audio_path

    x, rate = sf.read(str(demo_audio_path()), dtype="float32")
    path = tmp_path / "speech.wav"
    sf.write(str(path), x[: int(CLIP_S * rate)], rate)
    return path


def _file_session(window, path, record=None):
    window.set_mode("live")
    panel = window.live
    panel.source_box.setCurrentIndex(panel.source_box.findData("file"))
    panel.file_edit.setText(str(path))
    if record is not None:
        panel.record_edit.setText(str(record))
        panel.record_box.setChecked(True)
    assert panel.start()
    return panel


def test_live_mode_shows_frames_while_the_file_plays_and_records_it(
    window, qtbot, speech, tmp_path
):
    assert window.mode == "clip"
    out = tmp_path / "live.mp4"
    panel = _file_session(window, speech, record=out)
    assert window.mode == "live" and window.modes.currentWidget() is panel
    assert not window.act_export.isEnabled() and not window.act_render.isEnabled()
    assert not panel.start_button.isEnabled() and panel.stop_button.isEnabled()
    # Frames reach the viewer and the figures fill in while the audio is still playing.
    qtbot.waitUntil(lambda: panel.shown >= 3, timeout=SESSION_TIMEOUT_MS)
    qtbot.waitUntil(lambda: panel.figure("first_frame") != "–", timeout=SESSION_TIMEOUT_MS)
    assert panel.running and panel.status["audio_s"] < CLIP_S
    side = window.controls.settings().size  # the size last used (the fixture: 256)
    assert panel.viewer.frame is not None and panel.viewer.frame.shape == (side, side, 3)
    assert panel.figure("first_frame").endswith(" ms")
    assert int(panel.figure("shown")) >= 1
    with qtbot.waitSignal(panel.sessionFinished, timeout=SESSION_TIMEOUT_MS) as done:
        panel.stop()
    report = done.args[0]
    assert report["stopped"] and report["output"] == str(out)
    assert report["frames"] >= panel.shown > 0
    assert not panel.running and panel.start_button.isEnabled()
    assert panel.figure("latency_p95").endswith(" ms")
    assert str(out) in panel.state_label.text()
    # The recording: H.264 + AAC, every frame the session made.
    with av.open(str(out)) as c:
        assert c.streams.audio[0].codec_context.name == "aac"
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == report["frames"] and frames[0].shape == (side, side, 3)
    # Back to Clip mode: as before.
    window.set_mode("clip")
    assert window.mode == "clip" and window.modes.currentWidget() is window.top_splitter
    assert window.act_export.isEnabled() and window.act_render.isEnabled()
    assert any(window.viewer.frame is f for f in window.frames)


def test_a_file_plays_to_its_end_on_the_windows_engine(window, qtbot, speech, monkeypatch):
    def no_open(*_a, **_k):
        raise AssertionError("the window's engine should be reused")

    monkeypatch.setattr(live_mod, "open_prepared", no_open)
    panel = _file_session(window, speech)
    with qtbot.waitSignal(panel.sessionFinished, timeout=SESSION_TIMEOUT_MS) as done:
        pass
    report = done.args[0]
    assert not report["stopped"] and report["output"] is None
    assert report["frames"] == math.ceil(CLIP_S * FPS)  # the clip's frame count
    # the last burst (the lookahead, made at the end) plays out after the session ended
    qtbot.waitUntil(lambda: not panel.presenting, timeout=5000)
    assert panel.shown + panel.dropped == report["frames"]
    assert panel.shown > report["frames"] // 2  # bursts are paced, not dropped
    assert panel.figure("dropped") == str(panel.dropped)
    assert panel.figure("audio") == f"{CLIP_S:.1f} s"
    assert "ended" in panel.state_label.text()


def test_a_live_source_runs_until_stopped(window, qtbot, monkeypatch):
    """The microphone's path (a QueueSource fed 20 ms chunks), with a synthetic input."""
    chunks: queue.Queue = queue.Queue()
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone = (0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.4 < 0.25)).astype(np.float32)
    for start in range(0, tone.size, 320):
        chunks.put(tone[start : start + 320])
    monkeypatch.setattr(
        live_mod.LivePanel, "_open_mic", lambda self: QueueSource(chunks, "test input")
    )
    window.set_mode("live")
    panel = window.live
    panel.source_box.setCurrentIndex(panel.source_box.findData("mic"))
    panel.latency_box.setCurrentIndex(panel.latency_box.findData("low"))
    assert not panel.file_edit.isEnabled()
    assert panel.start()
    qtbot.waitUntil(lambda: panel.shown >= 10, timeout=SESSION_TIMEOUT_MS)
    assert not panel.sound.playing  # a microphone is never played back
    with qtbot.waitSignal(panel.sessionFinished, timeout=SESSION_TIMEOUT_MS) as done:
        panel.stop()
    report = done.args[0]
    assert report["stopped"] and report["latency_setting"] == "low"
    assert report["frames"] >= 10
    qtbot.waitUntil(lambda: not panel.presenting, timeout=5000)
    assert panel.shown + panel.dropped == report["frames"]


def test_closing_the_window_ends_the_session_and_keeps_the_recording(
    window, qtbot, speech, tmp_path
):
    out = tmp_path / "closed.mp4"
    panel = _file_session(window, speech, record=out)
    runner = panel.runner
    qtbot.waitUntil(lambda: panel.shown >= 2, timeout=SESSION_TIMEOUT_MS)
    window.close()
    assert not runner.alive and not panel.running
    with av.open(str(out)) as c:
        assert c.streams.video and c.streams.audio


def test_a_failing_session_shows_one_line(window, qtbot, tmp_path):
    window.set_mode("live")
    panel = window.live
    panel.file_edit.setText(str(tmp_path / "missing.wav"))
    with qtbot.waitSignal(window.errorShown, timeout=SESSION_TIMEOUT_MS) as shown:
        assert panel.start()
    message = shown.args[0]
    assert "missing.wav" in message and "\n" not in message and "Traceback" not in message
    assert window.error_box.detailedText() == ""
    qtbot.waitUntil(lambda: not panel.running, timeout=5000)
    assert panel.start_button.isEnabled()
    window.error_box.close()
    # A bad recording path is refused before anything starts.
    panel.record_edit.setText(str(tmp_path / "no_folder" / "x.mp4"))
    panel.record_box.setChecked(True)
    with qtbot.waitSignal(window.errorShown, timeout=5000):
        assert not panel.start()
    assert not panel.running


def _frames(a, b):
    from types import SimpleNamespace

    return [SimpleNamespace(index=i, audio=np.full(640, i, np.float32)) for i in range(a, b)]


def test_mailbox_hands_over_frames_in_order_with_one_signal_per_batch():
    calls = []
    box = live_mod.FrameMailbox(lambda: calls.append(1), keep=4)
    box.put(_frames(0, 2))
    box.put(_frames(2, 3))  # the GUI has not taken the first batch: no second signal
    assert calls == [1]
    frames, lost, last = box.take()
    assert [f.index for f in frames] == [0, 1, 2] and lost == 0 and not last
    assert box.take() == ([], 0, False)
    box.put(_frames(3, 9), last=True)  # a stalled GUI: the oldest go
    assert calls == [1, 1]
    frames, lost, last = box.take()
    assert [f.index for f in frames] == [5, 6, 7, 8] and lost == 2 and last


def test_presenter_paces_bursts_and_skips_when_behind():
    now = [0.0]
    p = live_mod.Presenter(clock=lambda: now[0])
    p.add(_frames(0, 3))  # a burst of three
    shown = []
    for _ in range(20):  # 100 ms in 5 ms ticks
        frame, dropped = p.due()
        assert dropped == []
        if frame is not None:
            shown.append((frame.index, round(now[0] * 1000)))
        now[0] += 0.005
    assert shown == [(0, 0), (1, 40), (2, 80)]  # one frame every 40 ms
    p.add(_frames(3, 3 + live_mod.MAX_WAITING_FRAMES + 2))  # more than a burst: behind
    frame, dropped = p.due()
    assert frame.index == 3 + live_mod.MAX_WAITING_FRAMES + 1
    assert [f.index for f in dropped] == list(range(3, frame.index))
    p.draining = True  # a finished session's last burst: shown whole
    p.add(_frames(20, 30))
    now[0] += 1.0
    frame, dropped = p.due()
    assert frame.index == 20 and dropped == []


def test_figures_text():
    assert live_mod.figure_texts(None, 0, 0)["first_frame"] == "–"
    status = {
        "audio_s": 1.25,
        "frames": 30,
        "latency_ms": 81.4,
        "latency_p95_ms": 120.0,
        "late_frames": 2,
        "time_to_first_frame_ms": 95.6,
    }
    texts = live_mod.figure_texts(status, 28, 2)
    assert texts["first_frame"] == "96 ms" and texts["latency_p95"] == "120 ms"
    assert texts["late"] == "2" and texts["dropped"] == "2" and texts["shown"] == "28"


def test_microphone_bytes_become_20ms_chunks_at_16khz(qtbot):
    """A device that offers only 48 kHz stereo Int16: converted, then cut into 20 ms."""
    chunks: queue.Queue = queue.Queue()
    mic = live_mod.MicInput(chunks)
    mic._converter = PcmConverter(PcmFormat(48000, 2, "s16le"))
    pcm = (np.ones((48000, 2)) * 8000).astype("<i2").tobytes()
    for start in range(0, len(pcm), 3000):  # odd pieces, as a device delivers them
        mic.take(pcm[start : start + 3000])
    got = []
    while not chunks.empty():
        got.append(chunks.get())
    assert got and all(c.shape == (320,) and c.dtype == np.float32 for c in got)
    assert abs(len(got) * 320 - SAMPLE_RATE) <= 640
    assert abs(float(got[len(got) // 2][0]) - 8000 / 32768) < 1e-3


def test_sound_keeps_its_backlog_short(qtbot):
    """Frame audio the device has not taken beyond SOUND_BACKLOG_S is dropped."""

    class Device:
        written = b""

        def bytesFree(self):  # noqa: N802 - Qt API
            return 0

    sound = live_mod.FrameSound()
    sound.sink, sound._io = Device(), Device()
    sound.push([np.zeros(640, np.float32)] * 50)  # 2 s the device did not take
    assert len(sound._backlog) == 2 * int(SAMPLE_RATE * live_mod.SOUND_BACKLOG_S)
    assert sound.dropped_s == pytest.approx(2.0 - live_mod.SOUND_BACKLOG_S)
    sound._io = sound.sink = None
