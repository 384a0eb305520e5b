"""Live sources: raw PCM in any chunking and format, a real socket, files played as live, a
microphone where PortAudio is missing."""

from __future__ import annotations

import io
import socket
import threading
import time

import numpy as np
import pytest
import soxr

from studio.errors import InputError, OptionError
from studio.layout import SAMPLE_RATE
from studio.live import sources
from studio.live.sources import FileSource, PcmConverter, PcmFormat, PcmSource


def tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * np.pi * 220 * t)
    return np.repeat(x[:, None], channels, axis=1).astype(np.float32)


def s16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.mark.parametrize("piece", [1, 3, 641, 4096])
def test_pcm_at_16k_in_any_chunking_is_the_samples(piece):
    x = tone(0.5, SAMPLE_RATE)
    data = s16(x)
    conv = PcmConverter(PcmFormat())
    got = np.concatenate(
        [conv.convert(data[i : i + piece]) for i in range(0, len(data), piece)]
        + [conv.convert(b"", last=True)]
    )
    assert got.shape == (len(x),)
    assert np.abs(got - x[:, 0]).max() < 1e-4


def test_stereo_48k_float_is_downmixed_and_resampled_without_clicks_at_chunk_edges():
    x = tone(1.0, 48000, channels=2)
    x[:, 1] *= 0.5
    fmt = PcmFormat(rate=48000, channels=2, sample="f32le")
    data = x.astype("<f4").tobytes()
    conv = PcmConverter(fmt)
    parts = [conv.convert(data[i : i + 1000]) for i in range(0, len(data), 1000)]
    got = np.concatenate([*parts, conv.convert(b"", last=True)])
    want = soxr.resample(x.mean(axis=1), 48000, SAMPLE_RATE, quality="HQ")
    assert abs(len(got) - len(want)) <= 2
    n = min(len(got), len(want))
    assert np.abs(got[:n] - want[:n])[200:-200].max() < 1e-3


def test_pcm_source_reads_a_pipe_to_its_end():
    x = tone(0.3, SAMPLE_RATE)
    chunks = list(PcmSource(io.BytesIO(s16(x)), PcmFormat()).chunks())
    assert sum(len(c) for c in chunks) == len(x)


def test_bad_pcm_formats_are_named():
    for fmt, option in [
        (PcmFormat(sample="s24le"), "--pcm-format"),
        (PcmFormat(rate=100), "--pcm-rate"),
        (PcmFormat(channels=0), "--pcm-channels"),
    ]:
        with pytest.raises(OptionError, match=option):
            fmt.check()
    conv = PcmConverter(PcmFormat(sample="f32le"))
    with pytest.raises(InputError, match="non-finite"):
        conv.convert(np.array([0.0, np.nan], "<f4").tobytes())


def test_a_tcp_client_feeds_the_socket_source():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    x = tone(0.4, SAMPLE_RATE)

    def client() -> None:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port)) as c:
                    c.sendall(s16(x))
                return
            except ConnectionRefusedError:
                time.sleep(0.05)

    t = threading.Thread(target=client)
    t.start()
    source = sources.open_socket_source(f"tcp:127.0.0.1:{port}", PcmFormat(), timeout_s=10)
    got = np.concatenate(list(source.chunks()))
    source.close()
    t.join()
    assert len(got) == len(x) and np.abs(got - x[:, 0]).max() < 1e-4


def test_socket_addresses_are_checked():
    with pytest.raises(OptionError, match="tcp:HOST:PORT or unix:PATH"):
        sources.open_socket_source("udp:1:2", PcmFormat())


def test_a_file_plays_in_chunks_and_loops(tmp_path):
    import soundfile as sf

    path = tmp_path / "a.wav"
    sf.write(path, tone(0.5, 24000)[:, 0], 24000)
    once = list(FileSource(str(path)).chunks())
    assert all(len(c) == 320 for c in once[:-1])
    total = sum(len(c) for c in once)
    assert total == SAMPLE_RATE // 2
    twice = list(FileSource(str(path), loop=1).chunks())
    assert sum(len(c) for c in twice) == 2 * total


def test_a_missing_portaudio_is_one_clear_error():
    ok, why = sources.microphone_status()
    if ok:
        pytest.skip(f"a microphone exists here: {why}")
    with pytest.raises(InputError, match="--mic"):
        sources.MicSource()
