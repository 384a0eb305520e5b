"""Where live audio comes from, as 16 kHz mono float32 chunks.

- :class:`FileSource`: a file played as live (decoded by :func:`studio.audio.io.load_audio`),
  optionally looped; the pump paces it at real time or feeds it as fast as possible.
- :class:`PcmSource`: raw PCM from a byte stream (stdin, a socket) in a format given by the
  user, as a text-to-speech program writes it; resampled by soxr as it arrives.
- :class:`MicSource`: the microphone through sounddevice (PortAudio), where PortAudio exists.
- :class:`QueueSource`: chunks put by another part of the studio (a browser's microphone).

A source is ``live`` when its audio comes at its own pace (microphone, pipe, socket): the
pump then fills gaps with silence so the head keeps moving.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import soxr

from studio.errors import InputError, OptionError
from studio.layout import SAMPLE_RATE

CHUNK_MS = 20  # what a live source delivers at a time (Ditto and WebRTC use 20 ms too)
PCM_SAMPLES = {"s16le": ("<i2", 32768.0), "f32le": ("<f4", 1.0)}
_READ_BYTES = 4096


def chunk_samples(chunk_ms: float = CHUNK_MS) -> int:
    """Samples at 16 kHz in ``chunk_ms``."""
    return max(1, int(round(SAMPLE_RATE * chunk_ms / 1000.0)))


class FileSource:
    """A file played as live: ``chunk_ms`` at a time, looped ``loop`` times more (-1: for ever)."""

    live = False

    def __init__(self, path: str, chunk_ms: float = CHUNK_MS, loop: int = 0) -> None:
        from studio.audio.io import load_audio

        self.audio = load_audio(path)
        self.name = str(path)
        self.step = chunk_samples(chunk_ms)
        self.loop = int(loop)

    def chunks(self) -> Iterator[np.ndarray]:
        x = self.audio.samples
        played = 0
        while True:
            for start in range(0, len(x), self.step):
                yield x[start : start + self.step]
            played += 1
            if 0 <= self.loop < played:
                return

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class PcmFormat:
    """Raw PCM as a producer writes it: rate (Hz), channels, sample type (s16le or f32le)."""

    rate: int = SAMPLE_RATE
    channels: int = 1
    sample: str = "s16le"

    def check(self) -> PcmFormat:
        if self.sample not in PCM_SAMPLES:
            raise OptionError("--pcm-format", f"must be one of {', '.join(PCM_SAMPLES)}")
        if not 8000 <= self.rate <= 192000:
            raise OptionError("--pcm-rate", f"must be from 8000 to 192000 Hz, got {self.rate}")
        if not 1 <= self.channels <= 8:
            raise OptionError("--pcm-channels", f"must be from 1 to 8, got {self.channels}")
        return self


class PcmConverter:
    """Raw PCM bytes in any chunking -> 16 kHz mono float32 (downmixed, resampled by soxr's
    stream resampler, so chunk edges leave no clicks)."""

    def __init__(self, fmt: PcmFormat) -> None:
        self.fmt = fmt.check()
        self.dtype, self.scale = PCM_SAMPLES[fmt.sample]
        self.frame_bytes = np.dtype(self.dtype).itemsize * fmt.channels
        self._rest = b""
        self._resampler = (
            None
            if fmt.rate == SAMPLE_RATE
            else soxr.ResampleStream(fmt.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        )

    def convert(self, data: bytes, last: bool = False) -> np.ndarray:
        data = self._rest + data
        whole = len(data) - len(data) % self.frame_bytes
        self._rest = data[whole:]
        x = np.frombuffer(data[:whole], dtype=self.dtype).astype(np.float32) / self.scale
        x = x.reshape(-1, self.fmt.channels).mean(axis=1, dtype=np.float32)
        if not np.isfinite(x).all():
            raise InputError("live audio: the PCM stream holds non-finite samples (NaN or inf)")
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x, last=last)
        return np.clip(x, -1.0, 1.0).astype(np.float32, copy=False)


class PcmSource:
    """Raw PCM from a byte stream (stdin, a socket), converted as it arrives."""

    live = True

    def __init__(self, stream: BinaryIO, fmt: PcmFormat, name: str = "stdin") -> None:
        self.stream, self.name = stream, name
        self.converter = PcmConverter(fmt)
        self._closers: list = []

    def chunks(self) -> Iterator[np.ndarray]:
        read = getattr(self.stream, "read1", self.stream.read)
        while True:
            data = read(_READ_BYTES)
            if not data:
                tail = self.converter.convert(b"", last=True)
                if tail.size:
                    yield tail
                return
            x = self.converter.convert(data)
            if x.size:
                yield x

    def close(self) -> None:
        for close in self._closers:
            with contextlib.suppress(OSError):
                close()


def open_socket_source(address: str, fmt: PcmFormat, timeout_s: float = 60.0) -> PcmSource:
    """Listen on ``tcp:HOST:PORT`` or ``unix:PATH`` and take the first client's PCM."""
    kind, _, where = address.partition(":")
    try:
        if kind == "tcp":
            host, _, port = where.rpartition(":")
            server = socket.create_server((host or "127.0.0.1", int(port)))
        elif kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(where)
            server.listen(1)
        else:
            raise OptionError("--audio", f"{address}: use tcp:HOST:PORT or unix:PATH")
    except (OSError, ValueError) as e:
        raise OptionError("--audio", f"{address}: cannot listen ({e})") from None
    server.settimeout(timeout_s)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        server.close()
        raise InputError(
            f"live audio: nobody connected to {address} in {timeout_s:.0f} s"
        ) from None
    server.close()
    conn.settimeout(None)
    source = PcmSource(conn.makefile("rb"), fmt, name=address)
    source._closers += [conn.close]
    return source


def microphone_status() -> tuple[bool, str]:
    """Whether the CLI can listen to a microphone here (PortAudio and an input device)."""
    try:
        import sounddevice as sd
    except (ImportError, OSError) as e:
        why = " ".join(str(e).split())
        return False, f"PortAudio is missing ({why}; apt install libportaudio2)"
    try:
        device = sd.query_devices(kind="input")
    except Exception as e:  # noqa: BLE001 - PortAudio's errors name no common type
        return False, f"no input device ({' '.join(str(e).split())})"
    return True, str(device["name"])


class MicSource:
    """The default (or a named) microphone through sounddevice, 16 kHz mono."""

    live = True

    def __init__(self, device: str | None = None, chunk_ms: float = CHUNK_MS) -> None:
        try:
            import sounddevice as sd
        except (ImportError, OSError) as e:
            raise InputError(
                "--mic: no microphone access here: PortAudio is missing "
                f"({' '.join(str(e).split())}); install it (Debian: apt install libportaudio2) "
                "or use --audio FILE|- instead"
            ) from None
        self.name = f"microphone {device or '(default)'}"
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue()
        try:
            self._stream = sd.InputStream(
                samplerate=SAMPLE_RATE,
                channels=1,
                dtype="float32",
                blocksize=chunk_samples(chunk_ms),
                device=device,
                callback=lambda data, *_: self._queue.put(data[:, 0].copy()),
            )
            self._stream.start()
        except Exception as e:  # noqa: BLE001 - PortAudio's errors name no common type
            raise InputError(
                f"--mic: the microphone could not be opened ({' '.join(str(e).split())}); "
                "check `studio doctor` and the system's audio settings"
            ) from None

    def chunks(self) -> Iterator[np.ndarray]:
        while (x := self._queue.get()) is not None:
            yield x

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.stop()
            self._stream.close()
        self._queue.put(None)


class QueueSource:
    """Chunks put into a queue by someone else (a browser's microphone); None ends it."""

    live = True

    def __init__(self, chunks: queue.Queue, name: str = "browser microphone") -> None:
        self._queue, self.name = chunks, name

    def chunks(self) -> Iterator[np.ndarray]:
        while (x := self._queue.get()) is not None:
            yield np.asarray(x, np.float32)

    def close(self) -> None:
        self._queue.put(None)
