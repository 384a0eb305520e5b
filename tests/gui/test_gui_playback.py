"""Playback follows one clock: a fake audio clock that starts late and stops short of the end."""

import pytest

pytest.importorskip("PySide6")

from studio.gui.playback import ElapsedClock, Playback  # noqa: E402
from studio.layout import FPS  # noqa: E402

FRAME_MS = 1000.0 / FPS


class FakeAudioClock:
    """An audio device as QtMultimedia reports it: silent for a while after a start, then a
    position that advances with ``advance``, and an end that comes short of the last frame."""

    silent = False
    reason = ""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.pos: float | None = None
        self.done = False
        self.running = False

    def set_source(self, path):
        self.source = path

    def start(self, ms):
        self.starts.append(ms)
        self.pos, self.done, self.running = None, False, True  # no report yet

    def stop(self):
        self.running = False

    def report(self, ms):
        self.pos = ms

    def position_ms(self):
        return self.pos if self.running else None

    def ended(self):
        return self.done


@pytest.fixture
def play(qtbot):
    clock = FakeAudioClock()
    p = Playback(clock=clock)
    p.set_source("speech.wav", 394)
    shown: list[int] = []
    p.frameChanged.connect(shown.append)
    return p, clock, shown


def test_picture_waits_for_the_audio_and_never_runs_ahead(play):
    p, clock, shown = play
    p.play()
    for _ in range(20):  # the device is slow to start: no position yet
        p.poll()
    assert p.frame == 0 and shown == []
    for ms in (64.0, 128.0, 192.0, 1000.0, 2048.0):
        clock.report(ms)
        p.poll()
        assert p.frame == int(ms / FRAME_MS)  # the audio's frame, never one ahead
    assert shown == [1, 3, 4, 25, 51]


def test_loop_fires_when_audio_ends_short_of_the_last_frame(play):
    p, clock, shown = play
    assert p.loop
    p.play()
    end_ms = 393 * FRAME_MS - 5.0  # the player's last report: just short of frame 393
    clock.report(end_ms)
    p.poll()
    assert p.frame == 392
    clock.done = True  # EndOfMedia
    looped = []
    p.looped.connect(lambda: looped.append(True))
    p.poll()
    assert looped and p.frame == 0 and shown[-1] == 0
    assert p.playing and clock.starts == [0.0, 0.0]  # audio restarted with the picture
    p.poll()
    assert p.frame == 0  # and the picture waits for the restarted audio
    clock.report(80.0)
    p.poll()
    assert p.frame == 2


def test_without_loop_playback_stops_on_the_last_frame_and_play_restarts(play):
    p, clock, shown = play
    p.loop = False
    p.play()
    clock.report(300 * FRAME_MS)
    clock.done = True
    p.poll()
    assert not p.playing and p.frame == 393 and shown[-1] == 393
    p.play()  # one press plays again, from the start
    assert p.playing and p.frame == 0 and clock.starts[-1] == 0.0


def test_position_past_the_clip_ends_it_even_without_an_end_report(play):
    p, clock, _ = play
    p.play()
    clock.report(394 * FRAME_MS + 1)
    p.poll()
    assert p.frame == 0 and p.playing and len(clock.starts) == 2


def test_seek_while_playing_restarts_the_audio_there(play):
    p, clock, shown = play
    p.play()
    clock.report(400.0)
    p.poll()
    p.seek(200)
    assert p.frame == 200 and shown[-1] == 200 and clock.starts[-1] == 200 * FRAME_MS
    p.poll()  # no report since the seek: the picture holds the seek target
    assert p.frame == 200
    p.pause()
    p.step(-1)
    assert p.frame == 199 and not clock.running


def test_silent_clock_runs_on_elapsed_time(qtbot):
    p = Playback(clock=ElapsedClock("no audio output device"))
    p.set_source(None, 50)
    assert p.silent and "no audio" in p.silent_reason
    p.play()
    qtbot.waitUntil(lambda: p.frame >= 2, timeout=10_000)
    p.pause()
    assert not p.playing
