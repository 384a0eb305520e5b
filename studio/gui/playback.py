"""Playback: one clock drives the frame on screen, the audio device's when there is one.

:class:`Playback` asks a clock where playback is and shows that frame. The clock is the
audio player's position (:class:`MediaClock`) when an audio device exists, or elapsed time
(:class:`ElapsedClock`) when it does not (``silent``). A media clock knows no position until
the device first reports one after a start, and until then the picture waits on the start
frame: audio and picture start together. At the end (the player says so, or the last frame
is reached) a loop restarts both from frame 0.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QElapsedTimer, QLoggingCategory, QObject, QTimer, QUrl, Signal

from studio.gui.probe import QUIET_MULTIMEDIA
from studio.layout import FPS

TICK_MS = 10
# How far a media clock extrapolates past the player's last report: the FFmpeg backend reports
# every audio chunk (64 ms), so a frame (40 ms) would otherwise show late or in pairs. Never
# more than one report interval ahead of what the device last said it played.
EXTRAPOLATE_MS = 64.0
# A report further ahead of the start than the time since the start (plus this) is stale:
# it belongs to the playback before a seek.
STALE_SLACK_MS = 250.0


class Clock(Protocol):
    """Where playback is, in milliseconds of the clip."""

    silent: bool
    reason: str  # why the clock is silent ("" when it plays audio)

    def set_source(self, path: str | None) -> None: ...

    def start(self, ms: float) -> None:
        """Start (or restart) playing from ``ms``."""

    def stop(self) -> None: ...

    def position_ms(self) -> float | None:
        """The position now, or None while the clock has not started moving since start()."""

    def ended(self) -> bool:
        """Whether the source played to its end since start()."""


class ElapsedClock:
    """Elapsed time from the start position: the clock of silent playback."""

    silent = True

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        self._timer = QElapsedTimer()
        self._start = 0.0
        self._running = False

    def set_source(self, path: str | None) -> None:
        pass

    def start(self, ms: float) -> None:
        self._start = float(ms)
        self._timer.start()
        self._running = True

    def stop(self) -> None:
        self._running = False

    def position_ms(self) -> float | None:
        return self._start + self._timer.elapsed() if self._running else None

    def ended(self) -> bool:
        return False  # silence has no end of its own: Playback stops at the last frame


class MediaClock(QObject):
    """The audio player's position (QtMultimedia), as the device reports it."""

    silent = False
    reason = ""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        from PySide6.QtMultimedia import QAudioOutput, QMediaPlayer

        self._states = QMediaPlayer
        self.audio_out = QAudioOutput(self)
        self.player = QMediaPlayer(self)
        self.player.setAudioOutput(self.audio_out)
        self.player.positionChanged.connect(self._reported)
        self.player.mediaStatusChanged.connect(self._status)
        self.player.playbackStateChanged.connect(self._state)
        self._since_start = QElapsedTimer()
        self._since_report = QElapsedTimer()
        self._start = 0.0
        self._anchor: float | None = None
        self._running = False
        self._ended = False

    def set_source(self, path: str | None) -> None:
        self.stop()
        self.player.setSource(QUrl.fromLocalFile(path) if path else QUrl())

    def start(self, ms: float) -> None:
        self._start, self._anchor, self._ended = float(ms), None, False
        self._running = True
        self._since_start.start()
        self.player.setPosition(int(ms))
        self.player.play()

    def stop(self) -> None:
        self._running = False
        self._anchor = None
        self.player.pause()

    def _reported(self, pos: int) -> None:
        if not self._running:
            return
        fresh = self._start < pos <= self._start + self._since_start.elapsed() + STALE_SLACK_MS
        if fresh:  # the device played past the start: from now on its position is the clock
            self._anchor = float(pos)
            self._since_report.start()

    def _status(self, status) -> None:
        if self._running and status == self._states.MediaStatus.EndOfMedia:
            self._ended = True

    def _state(self, state) -> None:
        if self._running and state == self._states.PlaybackState.StoppedState:
            self._ended = True

    def position_ms(self) -> float | None:
        if not self._running or self._anchor is None:
            return None
        return self._anchor + min(float(self._since_report.elapsed()), EXTRAPOLATE_MS)

    def ended(self) -> bool:
        return self._ended


def default_clock(parent: QObject | None = None) -> Clock:
    """A media clock where QtMultimedia has an audio output, else a silent elapsed clock."""
    QLoggingCategory.setFilterRules(QUIET_MULTIMEDIA)
    try:
        from PySide6.QtMultimedia import QMediaDevices
    except Exception as e:  # noqa: BLE001 - no QtMultimedia: play silently
        return ElapsedClock(f"audio playback unavailable ({e.__class__.__name__})")
    if not QMediaDevices.audioOutputs():
        return ElapsedClock("no audio output device: playing silently")
    return MediaClock(parent)


class Playback(QObject):
    """Play/pause/seek/step/loop over ``num_frames`` frames; emits ``frameChanged``.

    ``frame`` is always the frame that belongs on screen: the start frame until the clock
    moves, then the clock's position, never ahead of it.
    """

    frameChanged = Signal(int)
    playingChanged = Signal(bool)
    looped = Signal()

    def __init__(self, parent: QObject | None = None, clock: Clock | None = None) -> None:
        super().__init__(parent)
        self.num_frames = 0
        self.frame = 0
        self.loop = True
        self.playing = False
        self.clock: Clock = clock if clock is not None else default_clock(self)
        self._timer = QTimer(self)
        self._timer.setInterval(TICK_MS)
        self._timer.timeout.connect(self.poll)

    @property
    def silent(self) -> bool:
        return self.clock.silent

    @property
    def silent_reason(self) -> str:
        return self.clock.reason

    def set_source(self, path: str | None, num_frames: int) -> None:
        """The audio file to play and the clip length in frames."""
        self.pause()
        self.num_frames = num_frames
        self.frame = min(self.frame, max(0, num_frames - 1))
        self.clock.set_source(path)

    def toggle(self) -> None:
        self.pause() if self.playing else self.play()

    def play(self) -> None:
        if self.num_frames == 0 or self.playing:
            return
        if self.frame >= self.num_frames - 1:
            self.frame = 0
            self.frameChanged.emit(0)
        self.playing = True
        self.clock.start(self.frame * 1000.0 / FPS)
        self._timer.start()
        self.playingChanged.emit(True)

    def pause(self) -> None:
        if not self.playing:
            return
        self.playing = False
        self._timer.stop()
        self.clock.stop()
        self.playingChanged.emit(False)

    def seek(self, frame: int) -> None:
        """Jump to ``frame``; while playing, audio restarts there and the picture waits for it."""
        frame = max(0, min(int(frame), max(0, self.num_frames - 1)))
        self.frame = frame
        self.frameChanged.emit(frame)
        if self.playing:
            self.clock.start(frame * 1000.0 / FPS)

    def step(self, delta: int) -> None:
        self.seek(self.frame + delta)

    def poll(self) -> None:
        """Follow the clock (every TICK_MS while playing): show its frame, loop or stop at the
        end."""
        if not self.playing:
            return
        pos = self.clock.position_ms()
        at = self.frame if pos is None else int(pos * FPS / 1000.0)
        if self.clock.ended() or at >= self.num_frames:
            self._end()
            return
        if at != self.frame:
            self.frame = at
            self.frameChanged.emit(at)

    def _end(self) -> None:
        last = self.num_frames - 1
        if self.loop:
            self.frame = 0
            self.frameChanged.emit(0)
            self.clock.start(0.0)  # audio and picture restart together
            self.looped.emit()
            return
        self.pause()
        self.frame = last
        self.frameChanged.emit(last)
