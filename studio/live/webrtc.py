"""WebRTC sink: a page on localhost that shows the live talking head with the audio it
animates, and optionally sends the browser's microphone back as a live audio source.

One asyncio thread runs an aiohttp server (``GET /`` the page, ``POST /offer`` the SDP
exchange, ``GET /stats``) and the aiortc peer connections. :meth:`WebRTCSink.write` puts
frames in a short ring (thread-safe, never blocks). Every viewer has a :class:`_Playout`
that maps its media clock (25 fps ticks from its first packet) to frame indices; its video
track and its audio track both ask it, so a tick's picture and its 40 ms of sound come from
the same frame: aligned by construction. A frame that is not there at its tick is waited
for by both (the picture repeats, the sound is silent, the timeline slips one frame); a
viewer that falls too far behind the newest frame skips ahead (frames dropped).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from fractions import Fraction
from importlib import resources
from typing import Any, Protocol

import numpy as np

from studio.errors import OptionError
from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

log = logging.getLogger(__name__)

VIDEO_CLOCK = 90000  # RTP video clock (Hz)
AUDIO_TICKS_PER_FRAME = 2  # aiortc audio frames are 20 ms: two per 40 ms video frame
AUDIO_TICK = SAMPLES_PER_FRAME // AUDIO_TICKS_PER_FRAME  # 320 samples
RING_FRAMES = 2 * FPS  # frames kept for viewers (2 s)
MAX_LAG_FRAMES = 8  # a viewer further behind the newest frame than this skips ahead ...
CATCH_UP_LAG_FRAMES = 3  # ... to this far behind
MIC_QUEUE_CHUNKS = 500  # browser microphone chunks kept unread (10 s of 20 ms), oldest dropped
_MEMO_TICKS = 16  # resolved ticks remembered per viewer (the two tracks ask within a frame)


class FrameLike(Protocol):
    """What the sink reads from a frame (:class:`studio.render.stream.LiveFrame`)."""

    index: int
    image: np.ndarray  # [H, W, 3] uint8 RGB
    # audio: np.ndarray [640] float32, the frame's samples (silence when absent)


def page_html(browser_audio: bool) -> str:
    """The viewer page, told whether to send the microphone."""
    text = resources.files("studio.live").joinpath("page.html").read_text(encoding="utf-8")
    return text.replace("/*CONFIG*/null", json.dumps({"browserAudio": browser_audio}))


class _Ring:
    """The newest frames by index, shared by the writer thread and the server's loop."""

    def __init__(self, capacity: int = RING_FRAMES) -> None:
        self.lock = threading.Lock()
        self._frames: dict[int, Any] = {}
        self._order: deque[int] = deque()
        self.capacity = capacity
        self.newest: int | None = None

    def put(self, frames: Sequence[FrameLike]) -> None:
        with self.lock:
            for f in frames:
                i = int(f.index)
                if i in self._frames:
                    continue
                self._frames[i] = f
                self._order.append(i)
                self.newest = i if self.newest is None else max(self.newest, i)
            while len(self._order) > self.capacity:
                del self._frames[self._order.popleft()]

    def first_at_or_after(self, index: int) -> tuple[int, Any] | None:
        """The frame ``index``, or the next one that exists (a gap or an evicted frame)."""
        with self.lock:
            if self.newest is None or index > self.newest:
                return None
            for i in range(index, self.newest + 1):
                f = self._frames.get(i)
                if f is not None:
                    return i, f
            return None


class _Playout:
    """One viewer's timeline: media tick ``k`` (40 ms) shows frame ``k + offset``.

    Anchored at the newest frame on its first tick; the first caller of a tick decides it
    and the other track gets the same answer (memo), so sound and picture never diverge.
    """

    def __init__(self, ring: _Ring, counters: _Counters) -> None:
        self.ring = ring
        self.counters = counters
        self.offset: int | None = None
        self.t0: float | None = None
        self._memo: dict[int, Any] = {}
        self.last_image: np.ndarray | None = None
        self.send_lag = {"video": 0.0, "audio": 0.0}  # EMA of (sent - due) per track, s

    async def wait_tick(self, seconds: float) -> float:
        """Sleep until ``seconds`` on this viewer's media clock (started by the first call)."""
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        due = self.t0 + seconds
        if due > now:
            await asyncio.sleep(due - now)
        return due

    def note_sent(self, kind: str, due: float) -> None:
        lag = time.monotonic() - due
        self.send_lag[kind] += 0.05 * (lag - self.send_lag[kind])

    def frame(self, k: int) -> Any | None:
        """The frame of tick ``k``, or None (not there yet: repeat / silence)."""
        if k not in self._memo:
            self._memo[k] = self._resolve(k)
            for old in [j for j in self._memo if j < k - _MEMO_TICKS]:
                del self._memo[old]
        return self._memo[k]

    def _resolve(self, k: int) -> Any | None:
        newest = self.ring.newest
        if newest is None:
            return None  # nothing written yet: black and silence, not anchored
        if self.offset is None:
            self.offset = newest - k  # a viewer starts from the newest frame
        idx = k + self.offset
        if idx > newest:  # late: wait for it, one tick later
            self.offset -= 1
            self.counters.add("frames_repeated")
            return None
        if newest - idx > MAX_LAG_FRAMES:  # too far behind: skip ahead
            skip = newest - CATCH_UP_LAG_FRAMES - idx
            self.offset += skip
            idx += skip
            self.counters.add("frames_dropped_slow_viewer", skip)
        found = self.ring.first_at_or_after(idx)
        if found is None:
            self.offset -= 1
            self.counters.add("frames_repeated")
            return None
        i, f = found
        if i > idx:
            self.offset += i - idx
            self.counters.add("frames_dropped_slow_viewer", i - idx)
        return f


class _Counters:
    """Thread-safe counters for :attr:`WebRTCSink.stats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.values[key] = self.values.get(key, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.values)


def _tracks(playout: _Playout, width: int, height: int):
    """A viewer's video and audio tracks (aiortc imported here: only live mode needs it)."""
    from aiortc import MediaStreamTrack
    from av import AudioFrame, VideoFrame

    class VideoTrack(MediaStreamTrack):
        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self.k = 0
            playout.last_image = np.zeros((height, width, 3), np.uint8)

        async def recv(self) -> VideoFrame:
            k, self.k = self.k, self.k + 1
            due = await playout.wait_tick(k / FPS)
            f = playout.frame(k)
            if f is not None:
                playout.last_image = np.ascontiguousarray(f.image, dtype=np.uint8)
                playout.counters.add("frames_sent")
            frame = VideoFrame.from_ndarray(playout.last_image, format="rgb24")
            frame.pts = k * (VIDEO_CLOCK // FPS)
            frame.time_base = Fraction(1, VIDEO_CLOCK)
            playout.note_sent("video", due)
            return frame

    class AudioTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.m = 0

        async def recv(self) -> AudioFrame:
            m, self.m = self.m, self.m + 1
            due = await playout.wait_tick(m * AUDIO_TICK / SAMPLE_RATE)
            f = playout.frame(m // AUDIO_TICKS_PER_FRAME)
            pcm = np.zeros(AUDIO_TICK, np.int16)
            audio = None if f is None else getattr(f, "audio", None)
            if audio is not None:
                part = np.asarray(audio, np.float32).reshape(-1)
                part = part[(m % AUDIO_TICKS_PER_FRAME) * AUDIO_TICK :][:AUDIO_TICK]
                pcm[: part.size] = np.clip(np.round(part * 32767.0), -32768, 32767)
            else:
                playout.counters.add("audio_silent_ticks")
            frame = AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = m * AUDIO_TICK
            frame.time_base = Fraction(1, SAMPLE_RATE)
            playout.note_sent("audio", due)
            return frame

    return VideoTrack(), AudioTrack()


class WebRTCSink:
    """Live frames to browsers over WebRTC, from a page served on ``url``.

    ``browser_audio``: the page also sends the browser's microphone; read it, 16 kHz mono
    float32 chunks, from :meth:`browser_audio`. ``port`` 0 picks a free port.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8080, browser_audio: bool = False):
        self.host, self.port = host, int(port)
        self.mic_enabled = bool(browser_audio)
        self.url = f"http://{host}:{self.port}/"
        self._ring = _Ring()
        self._counters = _Counters()
        self._peers: dict[Any, _Playout] = {}  # RTCPeerConnection -> its playout
        self._reports: dict[int, dict] = {}  # what each page measured (getStats)
        self._mic: queue.Queue[np.ndarray | None] = queue.Queue(MIC_QUEUE_CHUNKS)
        self._mic_owner: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._size = (0, 0)
        self._closed = False

    # --- the writer's side ------------------------------------------------------------

    def start(self, width: int, height: int) -> None:
        """Serve the page and the offers on a thread of its own; return once listening."""
        self._size = (int(width), int(height))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webrtc", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        except OSError as exc:
            self.close()
            raise OptionError(
                "--port", f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc})"
            ) from None

    def write(self, frames: Sequence[FrameLike]) -> None:
        """Hand over frames (in index order); never blocks on the viewers."""
        if not frames:
            return
        self._ring.put(frames)
        self._counters.add("frames_written", len(frames))
        if not self._peers:
            self._counters.add("frames_dropped_no_viewer", len(frames))

    def close(self) -> None:
        """End every peer connection and the server (idempotent)."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            except Exception:  # noqa: BLE001 - closing: the server goes either way
                log.debug("webrtc shutdown", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        if loop is not None and not loop.is_running():
            loop.close()
        self._mic_put(None)

    def __enter__(self) -> WebRTCSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def browser_audio(self) -> Iterator[np.ndarray]:
        """The browser microphone's audio, 16 kHz mono float32 chunks, until :meth:`close`."""
        if not self.mic_enabled:
            raise RuntimeError("this sink was made without browser_audio=True")
        while True:
            try:
                chunk = self._mic.get(timeout=0.2)
            except queue.Empty:
                if self._closed:
                    return
                continue
            if chunk is None:
                return
            yield chunk

    @property
    def stats(self) -> dict[str, Any]:
        """Viewers, frames sent / repeated / dropped, and the A/V offset estimates (ms)."""
        c = self._counters.snapshot()
        playouts = list(self._peers.values())
        send = [1000.0 * (p.send_lag["audio"] - p.send_lag["video"]) for p in playouts]
        pages = [r for r in self._reports.values() if r.get("av_offset_ms") is not None]
        return {
            "peers": len(playouts),
            "frames_written": c.get("frames_written", 0),
            "frames_sent": c.get("frames_sent", 0),
            "frames_repeated": c.get("frames_repeated", 0),
            "frames_dropped_no_viewer": c.get("frames_dropped_no_viewer", 0),
            "frames_dropped_slow_viewer": c.get("frames_dropped_slow_viewer", 0),
            "audio_silent_ticks": c.get("audio_silent_ticks", 0),
            "mic_chunks": c.get("mic_chunks", 0),
            "mic_chunks_dropped": c.get("mic_chunks_dropped", 0),
            # audio minus video, from when each track handed its tick to the encoder
            "av_send_offset_ms": round(float(np.mean(send)), 1) if send else None,
            # audio minus video playout, as the pages measured it (getStats)
            "av_offset_ms": round(float(np.mean([r["av_offset_ms"] for r in pages])), 1)
            if pages
            else None,
            "viewer_fps": [r.get("fps") for r in self._reports.values()],
        }

    # --- the server (on the loop's thread) ----------------------------------------------

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/", self._on_page)
        app.router.add_post("/offer", self._on_offer)
        app.router.add_post("/report", self._on_report)
        app.router.add_get("/stats", self._on_stats)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{self.port}/"

    async def _shutdown(self) -> None:
        await asyncio.gather(*(pc.close() for pc in list(self._peers)), return_exceptions=True)
        self._peers.clear()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _on_page(self, request):
        from aiohttp import web

        return web.Response(text=page_html(self.mic_enabled), content_type="text/html")

    async def _on_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats)

    async def _on_report(self, request):
        from aiohttp import web

        body = await request.json()
        self._reports[int(body.get("peer", 0))] = {
            "fps": body.get("fps"),
            "av_offset_ms": body.get("av_offset_ms"),
        }
        return web.Response(status=204)

    async def _on_offer(self, request):
        from aiohttp import web
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        params = await request.json()
        # No STUN server: the page is on this machine (and there may be no network at all).
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        playout = _Playout(self._ring, self._counters)
        self._peers[pc] = playout
        peer_id = id(pc)

        @pc.on("connectionstatechange")
        async def _state() -> None:
            if pc.connectionState in ("failed", "closed"):
                self._peers.pop(pc, None)
                self._reports.pop(peer_id, None)
                await pc.close()

        @pc.on("track")
        def _track(track) -> None:
            if track.kind == "audio":
                asyncio.ensure_future(self._consume_mic(track))

        await pc.setRemoteDescription(RTCSessionDescription(params["sdp"], params["type"]))
        for track in _tracks(playout, *self._size):
            pc.addTrack(track)
        await pc.setLocalDescription(await pc.createAnswer())
        desc = pc.localDescription
        return web.json_response({"sdp": desc.sdp, "type": desc.type, "peer": peer_id})

    async def _consume_mic(self, track) -> None:
        """Read a browser's microphone; the first one sending is the source, others drained."""
        from aiortc.mediastreams import MediaStreamError
        from av import AudioResampler

        resampler = AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        try:
            while True:
                frame = await track.recv()
                if not self.mic_enabled:
                    continue
                if self._mic_owner is None:
                    self._mic_owner = track
                if self._mic_owner is not track:
                    continue
                for out in resampler.resample(frame):
                    self._mic_put(out.to_ndarray().reshape(-1).astype(np.float32, copy=True))
                    self._counters.add("mic_chunks")
        except MediaStreamError:
            pass
        finally:
            if self._mic_owner is track:
                self._mic_owner = None

    def _mic_put(self, chunk: np.ndarray | None) -> None:
        """Queue a chunk; when nobody reads, the oldest goes (bounded memory)."""
        while True:
            try:
                self._mic.put_nowait(chunk)
                return
            except queue.Full:
                try:
                    self._mic.get_nowait()
                    self._counters.add("mic_chunks_dropped")
                except queue.Empty:
                    pass
