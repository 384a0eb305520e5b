"""The WebRTC sink in a real headless Chromium: the demo head's frames of real speech,
paced at 25 fps, reach the page's <video> with their sound; the browser's fake microphone
comes back as 16 kHz chunks."""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import sigint_as_from_a_terminal

from studio.audio.io import audio_from_array, load_audio
from studio.engines.demo import demo_audio_path
from studio.engines.demo.engine import DemoEngine
from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.live.webrtc import WebRTCSink
from studio.render.pipeline import analyze, iter_frames
from studio.settings import RenderSettings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,  # real-time A/V timing in a browser: measured on an otherwise idle CPU
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt install chromium)"),
]

SIZE = 192
CHROME_ARGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]
STATS_JS = """async () => {
  const out = {};
  const r = await window.studioLive.pc.getStats();
  r.forEach((s) => { if (s.type === 'inbound-rtp') out[s.kind] = JSON.parse(JSON.stringify(s)); });
  return out;
}"""


@dataclass(frozen=True)
class _Frame:
    """A LiveFrame as the sink reads it."""

    index: int
    image: np.ndarray
    audio: np.ndarray
    arrival_s: float = 0.0
    ready_s: float = 0.0


@pytest.fixture(scope="module")
def speech_frames() -> list[tuple[np.ndarray, np.ndarray]]:
    """3 s of the demo speech rendered by the demo engine: (image, its 640 samples)."""
    samples = load_audio(demo_audio_path()).samples[: 3 * SAMPLE_RATE]
    audio = audio_from_array(samples, SAMPLE_RATE)
    settings = RenderSettings(size=SIZE)
    engine = DemoEngine(settings)
    images = list(iter_frames(analyze(audio, settings, engine), engine.renderer(settings)))
    padded = np.zeros(len(images) * SAMPLES_PER_FRAME, np.float32)
    padded[: samples.size] = samples
    return [
        (img, padded[j * SAMPLES_PER_FRAME :][:SAMPLES_PER_FRAME]) for j, img in enumerate(images)
    ]


class _Feeder(threading.Thread):
    """Writes the clip (looped, indices ever increasing) to the sink at 25 fps."""

    def __init__(self, sink: WebRTCSink, clip: list) -> None:
        super().__init__(daemon=True)
        self.sink, self.clip, self.stop = sink, clip, threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        j = 0
        while not self.stop.is_set():
            delay = t0 + j / FPS - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            img, pcm = self.clip[j % len(self.clip)]
            self.sink.write([_Frame(j, img, pcm)])
            j += 1


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROME_ARGS)
        try:
            yield b
        finally:
            b.close()


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 480, "height": 480})
    page.goto(url)
    page.wait_for_function(
        "window.studioLive && window.studioLive.state === 'connected'", timeout=15000
    )
    return page


def _wait_stats(page, ok, timeout_s: float = 10.0) -> dict:
    end = time.monotonic() + timeout_s
    stats = page.evaluate(STATS_JS)
    while not ok(stats) and time.monotonic() < end:
        time.sleep(0.25)
        stats = page.evaluate(STATS_JS)
    return stats


def _av_offsets(page, within_ms: float = 45.0, settle_s: float = 45.0) -> list[float]:
    """Audio minus video playout position (ms, on the sender's clock) from getStats'
    estimatedPlayoutTimestamp, read every 0.5 s until the median of the last four readings is
    within ``within_ms`` (the page's lip sync settles in a few seconds; longer on a loaded
    machine: Chrome shrinks a jitter buffer a starved start grew only slowly) or ``settle_s``
    passed; the last four readings."""

    def offset() -> float | None:
        s = page.evaluate(STATS_JS)
        a = s["audio"].get("estimatedPlayoutTimestamp")
        v = s["video"].get("estimatedPlayoutTimestamp")
        return round(a - v, 1) if a and v else None

    end = time.monotonic() + 8.0
    while offset() is None and time.monotonic() < end:
        time.sleep(0.25)
    out: list[float] = []
    end = time.monotonic() + settle_s
    while time.monotonic() < end:
        if (x := offset()) is not None:
            out = [*out[-3:], x]
            if len(out) == 4 and abs(float(np.median(out))) <= within_ms:
                break
        time.sleep(0.5)
    return out


def test_the_page_shows_the_head_with_its_sound(browser, speech_frames, tmp_path: Path) -> None:
    sink = WebRTCSink(port=0)
    sink.start(SIZE, SIZE)
    feeder = _Feeder(sink, speech_frames)
    feeder.start()
    try:
        page = _open(browser, sink.url)
        stats = _wait_stats(
            page,
            lambda s: (
                s.get("video", {}).get("framesDecoded", 0) > 50
                and s.get("audio", {}).get("totalSamplesReceived", 0) > 48000
            ),
        )
        video, audio = stats["video"], stats["audio"]
        assert video["framesDecoded"] > 50, video
        assert video["frameWidth"] == SIZE and video["frameHeight"] == SIZE
        received = audio["totalSamplesReceived"]
        assert received > 48000 and audio.get("concealedSamples", 0) < 0.5 * received, audio
        shot = tmp_path / "live.png"
        page.locator("video").screenshot(path=str(shot))
        from PIL import Image

        pixels = np.asarray(Image.open(shot).convert("RGB"), np.float32)
        assert pixels.std() > 10.0, f"the video area looks blank (std {pixels.std():.1f})"

        page.click("#unmute")  # muted autoplay; the sound is measured once it plays
        offsets = _av_offsets(page)
        stats = page.evaluate(STATS_JS)
        assert stats["audio"]["totalAudioEnergy"] > 0, "the speech is silent in the browser"
        fps = stats["video"].get("framesPerSecond")
        print(f"\nbrowser: {fps} fps, A/V offsets (audio - video) {offsets} ms")
        print(f"sink: {sink.stats}")
        assert offsets, "no A/V playout estimate from the browser's getStats"
        assert abs(sink.stats["av_send_offset_ms"]) <= 45.0, sink.stats  # one timeline
        assert abs(float(np.median(offsets))) <= 45.0, offsets
        assert sink.stats["peers"] == 1 and sink.stats["frames_sent"] > 50

        second = _open(browser, sink.url)  # a second viewer, mid-session
        later = _wait_stats(second, lambda s: s.get("video", {}).get("framesDecoded", 0) > 10)
        assert later["video"]["framesDecoded"] > 10 and sink.stats["peers"] == 2
    finally:
        feeder.stop.set()
        sink.close()
        feeder.join()
    sink.close()  # idempotent


def test_the_browser_microphone_arrives_as_16k_chunks(browser, speech_frames) -> None:
    sink = WebRTCSink(port=0, browser_audio=True)
    sink.start(SIZE, SIZE)
    feeder = _Feeder(sink, speech_frames)
    feeder.start()
    try:
        _open(browser, sink.url)
        chunks, total, end = [], 0, time.monotonic() + 10.0
        for chunk in sink.browser_audio():
            chunks.append(chunk)
            total += chunk.size
            if total >= 2 * SAMPLE_RATE or time.monotonic() > end:
                break
        mic = np.concatenate(chunks)
        assert mic.dtype == np.float32 and mic.ndim == 1
        assert mic.size >= 2 * SAMPLE_RATE, f"only {mic.size} samples from the microphone"
        assert np.abs(mic).max() > 0.01, "the fake microphone's beeps did not arrive"
    finally:
        feeder.stop.set()
        sink.close()
        feeder.join()


def test_studio_live_serve_reaches_a_browser(browser, tmp_path: Path) -> None:
    """`studio live --serve` end to end: the CLI prints the page's address, the browser's own
    stats count decoded frames and received audio, its screenshot shows the head, and Ctrl-C
    ends the session with a report."""
    import os
    import re
    import signal
    import subprocess
    import sys

    report = tmp_path / "live.json"
    cmd = [
        sys.executable,
        "-m",
        "studio",
        "live",
        "--demo",
        "--realtime",
        "--loop",
        "-1",
        "--size",
        "192",
        "--serve",
        "127.0.0.1:0",
        "--report",
        str(report),
    ]
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"open (http://\S+) in a browser", line)
            if found:
                url = found.group(1)
                break
        assert url, "studio live did not print the page's address"
        page = _open(browser, url)
        stats = _wait_stats(
            page,
            lambda s: (
                s.get("video", {}).get("framesDecoded", 0) > 25
                and s.get("audio", {}).get("totalSamplesReceived", 0) > 16000
            ),
            timeout_s=20.0,
        )
        assert stats["video"]["framesDecoded"] > 25, stats
        assert stats["audio"]["totalSamplesReceived"] > 16000, stats
        shot = tmp_path / "studio_live.png"
        page.locator("video").screenshot(path=str(shot))
        from PIL import Image

        pixels = np.asarray(Image.open(shot).convert("RGB"), np.float32)
        assert pixels.std() > 10.0, f"the video area looks blank (std {pixels.std():.1f})"
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, rest
    data = __import__("json").loads(report.read_text())
    assert data["frames"] > 25 and data["stopped"] == "signal"
