"""The window's Live mode: a talking head driven by audio as it arrives (issue 18).

:class:`LivePanel` holds the live viewer, the input (the microphone, or a speech file played
as live at real time), the latency setting, an optional MP4 recording and the live figures.
A session runs :func:`studio.live.run.run_live` on a Python thread of its own
(:class:`LiveRunner`), never on the GUI thread. Frames reach the GUI thread through a
mailbox and one queued signal (:class:`FrameMailbox`). The session makes frames in small
bursts (a keyframe and its in-betweens), so the GUI shows them one every 40 ms
(:class:`Presenter`); when more are waiting than a burst holds, the GUI has fallen behind:
the newest frame is shown and the older ones count as dropped. For a file the frames' own
audio (``LiveFrame.audio``) is played through a push-mode ``QAudioSink`` as each frame is
shown (:class:`FrameSound`), so sound and picture stay together; the microphone is never
played back (feedback).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QLoggingCategory, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.engines.base import LATENCIES, EngineRequest
from studio.errors import StudioError
from studio.export.video import check_output_path
from studio.files import unused_name
from studio.gui.probe import QUIET_MULTIMEDIA
from studio.gui.widgets.viewer import FrameView
from studio.layout import FPS, SAMPLE_RATE
from studio.live.sources import FileSource, PcmConverter, PcmFormat, QueueSource, chunk_samples
from studio.render.engines import capabilities, open_prepared, prepare_engine
from studio.render.stream import live_settings, warm_up
from studio.settings import RenderSettings

SOURCES = (("file", "File as live"), ("mic", "Microphone"))
FIGURES = (
    ("first_frame", "Time to first frame"),
    ("latency", "Audio-to-frame latency"),
    ("latency_p95", "Latency p95"),
    ("late", "Late frames"),
    ("dropped", "Dropped frames"),
    ("shown", "Frames shown"),
    ("audio", "Audio in"),
)
STATUS_EVERY_S = 0.25  # run_live's figures, and the panel's refresh: ~4 times a second
FIGURES_MS = 250
SOUND_BUFFER_S = 0.1  # the output device's buffer: small, so sound stays with the picture
SOUND_BACKLOG_S = 0.5  # frame audio the device has not taken beyond this is dropped
SOUND_PUMP_MS = 10
MAILBOX_FRAMES = 250  # frames kept for a GUI thread that stalls (10 s); older ones dropped
MAX_WAITING_FRAMES = 5  # more waiting than a burst holds: the GUI is behind, skip to the newest
PRESENT_TICK_MS = 5
JOIN_S = 15.0  # closing the window waits this long for a session to end (recording finalised)
IDLE_NOTE = "Live: choose the input and press Start"


@dataclass(frozen=True)
class LiveContext:
    """What the window gives a session: its settings and the engine it has open for them
    (None: the session opens one), and what opening one takes."""

    settings: RenderSettings
    engine: Any | None = None
    checkpoints: str | None = None
    avatar: str | None = None
    audio_path: str | None = None  # the window's clip: the default file to play as live


@dataclass(frozen=True)
class LiveJob:
    """One session: the context, the latency setting, the input and where to record."""

    context: LiveContext
    latency: str
    source: str  # "file" or "mic"
    path: str | None = None  # the file of a "file" source
    record: str | None = None  # an MP4 path, or None


def open_live_engine(context: LiveContext) -> Any:
    """The engine a session runs: the window's for the current settings, else one opened
    now (on the session's thread: opening Ditto takes seconds)."""
    s = live_settings(context.settings)
    engine = context.engine
    if engine is None or engine.name != s.backend:
        caps = capabilities(s.backend)
        request = EngineRequest(
            s,
            context.checkpoints if caps.needs_checkpoints else None,
            context.avatar if caps.takes_avatar else None,
        )
        engine = open_prepared(prepare_engine(request))
    live = engine.with_settings(s)  # a new object: the window's engine is left as it is
    live.progress = None
    return live


def figure_texts(status: dict[str, Any] | None, shown: int, dropped: int) -> dict[str, str]:
    """The panel's figures as text (``status``: :func:`studio.live.run.status_of`'s dict)."""
    s = status or {}

    def ms(key: str) -> str:
        v = s.get(key)
        return "–" if v is None else f"{v:.0f} ms"

    return {
        "first_frame": ms("time_to_first_frame_ms"),
        "latency": ms("latency_ms"),
        "latency_p95": ms("latency_p95_ms"),
        "late": str(s.get("late_frames", 0)) if s else "–",
        "dropped": str(dropped),
        "shown": str(shown),
        "audio": f"{s['audio_s']:.1f} s" if "audio_s" in s else "–",
    }


class FrameMailbox:
    """Frames from the session's thread to the GUI's, in order. ``notify`` is called once
    per batch the GUI has not taken yet, so the GUI's event queue never fills with frames;
    a GUI thread stalled for longer than ``MAILBOX_FRAMES`` loses the oldest (counted)."""

    def __init__(self, notify: Callable[[], None], keep: int = MAILBOX_FRAMES) -> None:
        self._notify = notify
        self._lock = threading.Lock()
        self._frames: deque[Any] = deque(maxlen=keep)
        self._lost = 0
        self._last = False
        self._signalled = False

    def put(self, frames: Sequence[Any], last: bool = False) -> None:
        """Called on the session's thread with the frames that became ready; ``last``: the
        input has ended, these are the session's last frames (its lookahead, all at once)."""
        if not frames:
            return
        with self._lock:
            self._lost += max(0, len(self._frames) + len(frames) - self._frames.maxlen)
            self._frames.extend(frames)
            self._last = self._last or last
            signal, self._signalled = not self._signalled, True
        if signal:
            self._notify()

    def take(self) -> tuple[list[Any], int, bool]:
        """The frames since the last take, in order, how many were lost before them, and
        whether the session's last frames are among them."""
        with self._lock:
            frames, lost, last = list(self._frames), self._lost, self._last
            self._frames.clear()
            self._lost, self._last, self._signalled = 0, False, False
        return frames, lost, last


class WatchedSource:
    """A source that says when its input has ended (``ended``): the frames made after that
    are the session's last, its lookahead made all at once."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.ended = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)

    def chunks(self) -> Any:
        yield from self.source.chunks()
        self.ended = True

    def close(self) -> None:
        self.source.close()


class Presenter:
    """Which frame to show when: frames in order, one every 1/FPS s (the session makes them
    in bursts); more than ``MAX_WAITING_FRAMES`` waiting means the GUI fell behind, and all
    but the newest are dropped (not in ``draining``: a finished session's last burst plays
    out whole). ``clock``: seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.waiting: deque[Any] = deque()
        self.draining = False  # the session ended: its last burst plays out, none dropped
        self._next = -math.inf  # when the next frame may be shown

    def add(self, frames: Sequence[Any]) -> None:
        self.waiting.extend(frames)

    def due(self) -> tuple[Any | None, list[Any]]:
        """The frame to show now (None: none yet) and the frames dropped to reach it."""
        if not self.waiting:
            return None, []
        dropped = []
        if len(self.waiting) > MAX_WAITING_FRAMES and not self.draining:
            while len(self.waiting) > 1:
                dropped.append(self.waiting.popleft())
            self._next = -math.inf
        now = self.clock()
        if now < self._next:
            return None, dropped
        # keep the 25 fps schedule while on it; after a pause, restart it from now
        base = self._next if now - self._next < 1.0 / FPS else now
        self._next = base + 1.0 / FPS
        return self.waiting.popleft(), dropped

    def clear(self) -> None:
        self.waiting.clear()
        self._next = -math.inf
        self.draining = False


class LiveRunner(QObject):
    """One live session on a Python thread: the engine opened (or the window's reused),
    warmed up, then :func:`~studio.live.run.run_live` until the input ends or :meth:`stop`.

    Every signal is emitted from the session's thread: connect them queued.
    """

    # Each carries the runner first: a late signal of an ended session is told apart.
    framesWaiting = Signal(object)  # the mailbox holds frames the GUI has not taken
    statusChanged = Signal(object, object)  # status_of's dict, ~4 times a second
    stageChanged = Signal(object, str)  # what it is doing ("opening the engine…", "live")
    finished = Signal(object, object)  # the session's report (None: stopped before it started)
    failed = Signal(object, str)  # one line

    def __init__(self, job: LiveJob, source: Any | None = None) -> None:
        super().__init__()
        self.job = job
        self.source = source  # a ready source (the microphone's queue); else the job's file
        self.mailbox = FrameMailbox(lambda: self.framesWaiting.emit(self))
        self._input: WatchedSource | None = None
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="studio-live", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the session to end: the frames still in the lookahead are made and the
        recording is finalised; ``finished`` follows."""
        self.stop_event.set()
        if self.source is not None:
            self.source.close()  # a live source waiting for audio wakes up

    def wait(self, timeout_s: float) -> bool:
        """Wait for the thread to end; whether it did."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _deliver(self, frames: list[Any]) -> None:
        """run_live's frames to the mailbox, the last ones (after the input) marked."""
        ended = self.stop_event.is_set() or (self._input is not None and self._input.ended)
        self.mailbox.put(frames, last=ended)

    def _run(self) -> None:
        try:
            report = self._session()
        except StudioError as e:
            self.failed.emit(self, _one_line(str(e)))
        except Exception as e:  # noqa: BLE001 - one line in the window, the app stays usable
            self.failed.emit(
                self, _one_line(f"The live session failed: {e.__class__.__name__}: {e}")
            )
        else:
            self.finished.emit(self, report)

    def _session(self) -> dict[str, Any] | None:
        from studio.live.run import run_live, session_clock, status_of
        from studio.live.sinks import RecordingSink
        from studio.render.stream import LiveSession

        job = self.job
        s = live_settings(job.context.settings)
        self.stageChanged.emit(self, f"opening the {capabilities(s.backend).label} engine…")
        engine = open_live_engine(job.context)
        warm_up(engine, s, job.latency)
        source = WatchedSource(self.source if self.source is not None else FileSource(job.path))
        self._input = source
        if self.stop_event.is_set():
            source.close()
            return None
        sinks = [RecordingSink(job.record, s.crf, s.preset)] if job.record else []
        session = LiveSession(engine, s, job.latency, session_clock(source, True))
        report = run_live(
            session,
            source,
            sinks,
            realtime=True,
            stop=self.stop_event,
            on_frames=self._deliver,
            on_status=lambda status: self.statusChanged.emit(self, status),
            status_every_s=STATUS_EVERY_S,
            on_start=lambda: self.stageChanged.emit(self, "live"),
        )
        self.statusChanged.emit(self, status_of(session))
        recorded = sinks and sinks[0].frames > 0
        report["output"] = str(sinks[0].path) if recorded else None
        report["stopped"] = self.stop_event.is_set()
        return report


def _one_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line if len(line) <= 400 else line[:397] + "…"


def _multimedia() -> Any:
    """PySide6.QtMultimedia with its start-up chatter quietened."""
    QLoggingCategory.setFilterRules(QUIET_MULTIMEDIA)
    from PySide6 import QtMultimedia

    return QtMultimedia


class FrameSound(QObject):
    """The frames' own audio through the default output device, pushed as frames are shown.

    The device's buffer is kept small and audio it has not taken beyond
    ``SOUND_BACKLOG_S`` is dropped, so the sound never drifts behind the picture. Without an
    output device it stays silent and says why (``reason``)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.sink = None
        self._io = None
        self.reason = ""
        self.dropped_s = 0.0
        self._backlog = bytearray()
        self._timer = QTimer(self)
        self._timer.setInterval(SOUND_PUMP_MS)
        self._timer.timeout.connect(self._pump)

    @property
    def playing(self) -> bool:
        return self._io is not None

    def start(self) -> bool:
        """Open the output device at 16 kHz mono; False (and ``reason``) when there is none."""
        self.stop()
        try:
            mm = _multimedia()
        except Exception as e:  # noqa: BLE001 - no QtMultimedia: silent
            self.reason = f"audio playback unavailable ({e.__class__.__name__})"
            return False
        device = mm.QMediaDevices.defaultAudioOutput()
        if device.isNull():
            self.reason = "no audio output device: the live picture plays silently"
            return False
        fmt = mm.QAudioFormat()
        fmt.setSampleRate(SAMPLE_RATE)
        fmt.setChannelCount(1)
        fmt.setSampleFormat(mm.QAudioFormat.SampleFormat.Int16)
        if not device.isFormatSupported(fmt):
            self.reason = f"{device.description()} cannot play 16 kHz mono: playing silently"
            return False
        self.sink = mm.QAudioSink(device, fmt, self)
        self.sink.setBufferSize(2 * int(SAMPLE_RATE * SOUND_BUFFER_S))
        self._io = self.sink.start()
        if self._io is None:
            self.reason = "the audio output could not start: playing silently"
            self.sink = None
            return False
        self.reason = ""
        self._timer.start()
        return True

    def push(self, chunks: Sequence[np.ndarray]) -> None:
        """Queue these samples (16 kHz mono float32) for the device, in order."""
        if self._io is None or not chunks:
            return
        x = np.clip(np.concatenate(chunks), -1.0, 1.0)
        self._backlog += (x * 32767.0).astype("<i2").tobytes()
        excess = len(self._backlog) - 2 * int(SAMPLE_RATE * SOUND_BACKLOG_S)
        if excess > 0:
            excess += excess % 2
            del self._backlog[:excess]
            self.dropped_s += excess / 2 / SAMPLE_RATE
        self._pump()

    def _pump(self) -> None:
        if self._io is None or not self._backlog:
            return
        n = min(self.sink.bytesFree(), len(self._backlog))
        n -= n % 2
        if n > 0:
            written = self._io.write(bytes(self._backlog[:n]))
            if written > 0:
                del self._backlog[:written]

    def stop(self) -> None:
        self._timer.stop()
        sink, self.sink, self._io = self.sink, None, None
        self._backlog.clear()
        if sink is not None:
            sink.stop()
            sink.deleteLater()


class MicInput(QObject):
    """The default microphone (QtMultimedia ``QAudioSource``) as 20 ms chunks of 16 kHz mono
    float32 in a queue, for a :class:`~studio.live.sources.QueueSource`. 16 kHz mono is asked
    for; a device that offers only its own format is converted (downmixed, resampled)."""

    def __init__(self, chunks: queue.Queue, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.chunks = chunks
        self.name = "microphone"
        self.source = None
        self._io = None
        self._converter: PcmConverter | None = None
        self._rest = np.zeros(0, np.float32)
        self._step = chunk_samples()

    def start(self) -> None:
        """Open the default input; a StudioError says why it cannot be."""
        try:
            mm = _multimedia()
        except Exception as e:  # noqa: BLE001
            raise StudioError(
                f"No microphone access here: QtMultimedia is unavailable ({e})"
            ) from None
        device = mm.QMediaDevices.defaultAudioInput()
        if device.isNull():
            raise StudioError("No microphone found: connect one, or play a file as live.")
        sample = mm.QAudioFormat.SampleFormat
        fmt = mm.QAudioFormat()
        fmt.setSampleRate(SAMPLE_RATE)
        fmt.setChannelCount(1)
        fmt.setSampleFormat(sample.Int16)
        if not device.isFormatSupported(fmt):
            fmt = device.preferredFormat()
            if fmt.sampleFormat() not in (sample.Int16, sample.Float):
                fmt.setSampleFormat(sample.Int16)
        kind = "f32le" if fmt.sampleFormat() == sample.Float else "s16le"
        self._converter = PcmConverter(PcmFormat(fmt.sampleRate(), fmt.channelCount(), kind))
        self.source = mm.QAudioSource(device, fmt, self)
        self._io = self.source.start()
        if self._io is None:
            self.source = None
            raise StudioError(f"The microphone ({device.description()}) could not be opened.")
        self._io.readyRead.connect(self._read)
        self.name = f"microphone {device.description()}"

    def _read(self) -> None:
        if self._io is not None:
            self.take(bytes(self._io.readAll().data()))

    def take(self, data: bytes) -> None:
        """Raw bytes from the device -> 20 ms chunks in the queue."""
        x = np.concatenate([self._rest, self._converter.convert(data)])
        whole = len(x) - len(x) % self._step
        for start in range(0, whole, self._step):
            self.chunks.put(x[start : start + self._step])
        self._rest = x[whole:]

    def stop(self) -> None:
        source, self.source, self._io = self.source, None, None
        if source is not None:
            source.stop()
            source.deleteLater()


class LivePanel(QWidget):
    """Live mode: the live viewer, the input, Start/Stop, recording and the live figures.

    ``context`` gives the window's settings and engine at Start (settings changed during a
    session apply to the next one). ``failed`` carries one line for the window's error
    dialog; ``message`` a status-bar line and how long to show it (ms).
    """

    sessionStarted = Signal()
    sessionFinished = Signal(object)  # the report, or None
    failed = Signal(str)
    message = Signal(str, int)

    def __init__(self, context: Callable[[], LiveContext], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.context = context
        self.runner: LiveRunner | None = None
        self.mic: MicInput | None = None
        self.sound = FrameSound(self)
        self.status: dict[str, Any] | None = None
        self.shown = 0
        self.dropped = 0
        self.last_report: dict[str, Any] | None = None
        self._figures_timer = QTimer(self)
        self._figures_timer.setInterval(FIGURES_MS)
        self._figures_timer.timeout.connect(self._show_figures)
        self.presenter = Presenter()
        self._present_timer = QTimer(self)
        self._present_timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._present_timer.setInterval(PRESENT_TICK_MS)
        self._present_timer.timeout.connect(self._present)
        self._build()
        self._source_changed()
        self._set_running(False)

    # --- layout ----------------------------------------------------------------------

    def _build(self) -> None:
        self.viewer = FrameView()
        self.viewer.show_message(IDLE_NOTE)

        self.source_box = QComboBox()
        for key, label in SOURCES:
            self.source_box.addItem(label, key)
        self.source_box.setToolTip(
            "File as live: a speech file fed at real time, its sound played with the picture. "
            "Microphone: the default input (not played back)."
        )
        self.source_box.currentIndexChanged.connect(self._source_changed)
        self.file_edit = QLineEdit()
        self.file_edit.setPlaceholderText("the clip open in Clip mode (or the demo speech)")
        self.file_button = QToolButton()
        self.file_button.setText("…")
        self.file_button.setToolTip("Choose the speech file to play as live")
        self.file_button.clicked.connect(self._choose_file)
        file_row = QHBoxLayout()
        file_row.addWidget(self.file_edit, 1)
        file_row.addWidget(self.file_button)

        self.latency_box = QComboBox()
        for name in LATENCIES:
            self.latency_box.addItem(name, name)
        self.latency_box.setCurrentIndex(LATENCIES.index("balanced"))
        self.latency_box.setToolTip(
            "low: the least delay; balanced: the default; smooth: more lookahead, calmer motion"
        )

        self.record_box = QCheckBox("Record")
        self.record_edit = QLineEdit()
        self.record_edit.setPlaceholderText("live.mp4")
        self.record_button = QToolButton()
        self.record_button.setText("Record to MP4…")
        self.record_button.clicked.connect(self._choose_record)
        record_row = QHBoxLayout()
        record_row.addWidget(self.record_box)
        record_row.addWidget(self.record_edit, 1)
        record_row.addWidget(self.record_button)

        inputs = QGroupBox("Live input")
        form = QFormLayout(inputs)
        form.addRow("Source", self.source_box)
        form.addRow("File", file_row)
        form.addRow("Latency", self.latency_box)
        form.addRow("Recording", record_row)

        self.start_button = QPushButton("▶  Start")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.clicked.connect(self.stop)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        self.state_label = QLabel("idle")
        self.state_label.setWordWrap(True)

        figures = QGroupBox("Live figures")
        fform = QFormLayout(figures)
        self.figures: dict[str, QLabel] = {}
        for key, label in FIGURES:
            value = QLabel("–")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            fform.addRow(label, value)
            self.figures[key] = value

        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(inputs)
        sl.addLayout(buttons)
        sl.addWidget(self.state_label)
        sl.addWidget(figures)
        sl.addStretch(1)
        side.setMinimumWidth(360)
        side.setMaximumWidth(480)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.viewer, 1)
        layout.addWidget(side)

    def figure(self, key: str) -> str:
        """A figure's text (for tests and the status bar)."""
        return self.figures[key].text()

    @property
    def running(self) -> bool:
        """Whether a session is open (starting, live or stopping)."""
        return self.runner is not None

    @property
    def presenting(self) -> bool:
        """Whether frames are still waiting to be shown (a session's last burst plays out
        after it ended)."""
        return bool(self.presenter.waiting)

    def source_kind(self) -> str:
        return str(self.source_box.currentData())

    def _source_changed(self) -> None:
        is_file = self.source_kind() == "file"
        self.file_edit.setEnabled(is_file and not self.running)
        self.file_button.setEnabled(is_file and not self.running)

    def _set_running(self, on: bool) -> None:
        self.start_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        for w in (self.source_box, self.latency_box, self.record_box, self.record_edit):
            w.setEnabled(not on)
        self.record_button.setEnabled(not on)
        self._source_changed()

    def _choose_file(self) -> None:
        start = self.file_edit.text() or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Speech to play as live", start, "Audio (*.wav *.flac *.ogg *.mp3);;All (*)"
        )
        if path:
            self.file_edit.setText(path)

    def _choose_record(self) -> None:
        start = self.record_edit.text() or str(unused_name(Path.home() / "live.mp4"))
        path, _ = QFileDialog.getSaveFileName(self, "Record the live session", start, "MP4 (*.mp4)")
        if path:
            self.record_edit.setText(path if path.lower().endswith(".mp4") else path + ".mp4")
            self.record_box.setChecked(True)

    # --- sessions ----------------------------------------------------------------------

    def job(self) -> LiveJob:
        """The session the panel's choices describe (a StudioError says what is wrong)."""
        context = self.context()
        record = None
        if self.record_box.isChecked():
            text = self.record_edit.text().strip()
            record = str(check_output_path(text or unused_name(Path.home() / "live.mp4")))
        path = None
        if self.source_kind() == "file":
            from studio.engines.demo import demo_audio_path

            path = self.file_edit.text().strip() or context.audio_path or str(demo_audio_path())
        latency = str(self.latency_box.currentData())
        return LiveJob(context, latency, self.source_kind(), path, record)

    def start(self) -> bool:
        """Start a session with the panel's choices; False (and ``failed``) when it cannot."""
        if self.running:
            return False
        try:
            job = self.job()
            source = self._open_mic() if job.source == "mic" else None
        except StudioError as e:
            self.failed.emit(_one_line(str(e)))
            return False
        self.status, self.shown, self.dropped, self.last_report = None, 0, 0, None
        runner = LiveRunner(job, source)
        queued = Qt.ConnectionType.QueuedConnection
        runner.framesWaiting.connect(self._take_frames, queued)
        runner.statusChanged.connect(self._status, queued)
        runner.stageChanged.connect(self._stage, queued)
        runner.finished.connect(self._finished, queued)
        runner.failed.connect(self._failed, queued)
        self.runner = runner
        self.presenter.clear()
        self.sound.stop()
        if job.source == "file" and not self.sound.start():
            self.message.emit(self.sound.reason, 8000)
        self._present_timer.start()
        self._set_running(True)
        self.viewer.show_message("starting…")
        self.state_label.setText("starting…")
        self._show_figures()
        self._figures_timer.start()
        runner.start()
        self.sessionStarted.emit()
        return True

    def _open_mic(self) -> QueueSource:
        chunks: queue.Queue = queue.Queue()
        self.mic = MicInput(chunks, self)
        try:
            self.mic.start()
        except StudioError:
            self.mic = None
            raise
        return QueueSource(chunks, self.mic.name)

    def stop(self) -> None:
        """End the session: the last frames are made, a recording is finalised."""
        if self.runner is None:
            return
        self._stop_inputs()
        self.runner.stop()
        self.stop_button.setEnabled(False)
        self.state_label.setText("stopping…")

    def _stop_inputs(self) -> None:
        if self.mic is not None:
            self.mic.stop()
            self.mic = None

    def shutdown(self, timeout_s: float = JOIN_S) -> None:
        """Stop a session and wait for it (the window closes)."""
        runner = self.runner
        if runner is None:
            return
        self.stop()
        runner.wait(timeout_s)
        self._done()
        self.presenter.clear()
        self._present_timer.stop()
        self.sound.stop()

    def _take_frames(self, runner: LiveRunner) -> None:
        if runner is not self.runner:
            return
        frames, lost, last = runner.mailbox.take()
        self.dropped += lost
        self.presenter.draining = self.presenter.draining or last
        self.presenter.add(frames)
        self._present()

    def _present(self) -> None:
        """Show the frame that is due (every PRESENT_TICK_MS while frames wait); its audio,
        and that of the frames dropped to reach it, to the output device."""
        frame, dropped = self.presenter.due()
        played = [*dropped, frame] if frame is not None else dropped
        if played:
            self.sound.push([f.audio for f in played])
        self.dropped += len(dropped)
        if frame is not None:
            self.viewer.show_frame(frame.image)
            self.shown += 1
        if self.runner is None and not self.presenter.waiting:  # the last burst is shown
            self._present_timer.stop()
            self._show_figures()
            QTimer.singleShot(int(SOUND_BACKLOG_S * 1000), self._quiet)

    def _quiet(self) -> None:
        """Close the output device once a finished session's sound has played."""
        if self.runner is None and not self.presenter.waiting:
            self.sound.stop()

    def _status(self, runner: LiveRunner, status: dict[str, Any]) -> None:
        if runner is self.runner:
            self.status = status

    def _stage(self, runner: LiveRunner, text: str) -> None:
        if runner is not self.runner:
            return
        if text == "live":
            job = runner.job
            what = Path(job.path).name if job.source == "file" else "microphone"
            text = f"live: {what}, latency {job.latency}"
            if job.record:
                text += f", recording to {Path(job.record).name}"
        self.state_label.setText(text)

    def _show_figures(self) -> None:
        for key, text in figure_texts(self.status, self.shown, self.dropped).items():
            self.figures[key].setText(text)

    def _finished(self, runner: LiveRunner, report: dict[str, Any] | None) -> None:
        if runner is not self.runner:
            return
        self._take_frames(runner)
        self.presenter.draining = True  # what is still waiting plays out
        self.last_report = report
        self._done()
        if report is None:
            self.state_label.setText("stopped")
            self.message.emit("live session stopped", 5000)
        else:
            how = "stopped" if report.get("stopped") else "ended"
            text = f"live session {how}: {report['frames']} frames from {report['audio_s']:.1f} s"
            if report.get("output"):
                text += f"; recorded {report['output']}"
            self.state_label.setText(text)
            self.message.emit(text, 15000)
        self.sessionFinished.emit(report)

    def _failed(self, runner: LiveRunner, message: str) -> None:
        if runner is not self.runner:
            return
        self._done()
        self.state_label.setText("failed")
        self.failed.emit(message)
        self.sessionFinished.emit(None)

    def _done(self) -> None:
        """Back to idle (the session's thread has ended or is ending); frames still waiting
        play out."""
        self._stop_inputs()
        self._figures_timer.stop()
        self._show_figures()
        self.runner = None
        self._set_running(False)
        if self.viewer.frame is None:
            self.viewer.show_message(IDLE_NOTE)
