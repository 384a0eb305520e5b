"""Playback: a frame clock that follows the audio (QtMultimedia) or plays silently.

With an audio device the media player's position is the master clock, so the
frame on screen matches what is heard; without one, an elapsed-time clock drives
the frames and ``silent`` is True.
"""

from __future__ import annotations

from PySide6.QtCore import QElapsedTimer, QObject, QTimer, QUrl, Signal

from studio.motion.layout import FPS


class Playback(QObject):
    """Play/pause/step/loop over ``num_frames`` frames; emits ``frameChanged``."""

    frameChanged = Signal(int)
    playingChanged = Signal(bool)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.num_frames = 0
        self.frame = 0
        self.loop = True
        self.playing = False
        self._timer = QTimer(self)
        self._timer.setInterval(10)
        self._timer.timeout.connect(self._tick)
        self._clock = QElapsedTimer()
        self._start_frame = 0
        self.player = None
        self.audio_out = None
        self.silent_reason = ""
        self._init_audio()

    def _init_audio(self) -> None:
        try:
            from PySide6.QtMultimedia import QAudioOutput, QMediaDevices, QMediaPlayer
        except Exception as e:  # noqa: BLE001 - no QtMultimedia: play silently
            self.silent_reason = f"audio playback unavailable ({e.__class__.__name__})"
            return
        if not QMediaDevices.audioOutputs():
            self.silent_reason = "no audio output device: playing silently"
            return
        self.audio_out = QAudioOutput(self)
        self.player = QMediaPlayer(self)
        self.player.setAudioOutput(self.audio_out)

    @property
    def silent(self) -> bool:
        return self.player is None

    def set_source(self, path: str | None, num_frames: int) -> None:
        """The audio file to play and the clip length in frames."""
        self.pause()
        self.num_frames = num_frames
        self.frame = min(self.frame, max(0, num_frames - 1))
        if self.player is not None and path:
            self.player.setSource(QUrl.fromLocalFile(path))

    def toggle(self) -> None:
        self.pause() if self.playing else self.play()

    def play(self) -> None:
        if self.num_frames == 0 or self.playing:
            return
        if self.frame >= self.num_frames - 1:
            self.frame = 0
        self.playing = True
        self._start_frame = self.frame
        self._clock.start()
        if self.player is not None:
            self.player.setPosition(int(self.frame * 1000 / FPS))
            self.player.play()
        self._timer.start()
        self.playingChanged.emit(True)

    def pause(self) -> None:
        if not self.playing:
            return
        self.playing = False
        self._timer.stop()
        if self.player is not None:
            self.player.pause()
        self.playingChanged.emit(False)

    def seek(self, frame: int) -> None:
        """Jump to ``frame`` (keeps playing if playing)."""
        frame = max(0, min(int(frame), max(0, self.num_frames - 1)))
        was = self.playing
        if was:
            self.pause()
        self.frame = frame
        self.frameChanged.emit(frame)
        if was:
            self.play()

    def step(self, delta: int) -> None:
        self.seek(self.frame + delta)

    def _position_frame(self) -> int:
        if self.player is not None and self.player.position() > 0:
            return int(self.player.position() * FPS / 1000)
        return self._start_frame + int(self._clock.elapsed() * FPS / 1000)

    def _tick(self) -> None:
        f = self._position_frame()
        if f >= self.num_frames:
            if self.loop:
                self.pause()
                self.frame = 0
                self.frameChanged.emit(0)
                self.play()
            else:
                self.pause()
                self.frame = self.num_frames - 1
                self.frameChanged.emit(self.frame)
            return
        if f != self.frame:
            self.frame = f
            self.frameChanged.emit(f)
