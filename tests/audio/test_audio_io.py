"""Audio loading: formats, resampling, frame counts and every rejected input (real libsndfile,
FFmpeg and soxr)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import threading
import tracemalloc

import av
import numpy as np
import pytest
import soundfile as sf
import soxr

from studio.audio.io import (
    MIN_DURATION_S,
    Audio,
    OriginalFile,
    _Mono,
    audio_from_array,
    declared_seconds,
    load_audio,
)
from studio.errors import InputError
from studio.layout import FPS, SAMPLE_RATE


def tone(seconds: float, rate: int, channels: int = 1, freq: float = 440.0) -> np.ndarray:
    """A sine burst [n, channels]; channel k has amplitude 0.5 / (k + 1)."""
    t = np.arange(round(seconds * rate)) / rate
    sig = np.sin(2 * np.pi * freq * t)
    return np.stack([sig * 0.5 / (k + 1) for k in range(channels)], axis=1).astype(np.float32)


def write(path, data: np.ndarray, rate: int, **kw) -> str:
    sf.write(str(path), data, rate, **kw)
    return str(path)


def assert_rejected(path, *fragments: str) -> str:
    """load_audio(path) raises InputError naming the file in one line; return the message."""
    with pytest.raises(InputError) as info:
        load_audio(path)
    msg = str(info.value)
    assert os.path.basename(str(path)) in msg
    assert "\n" not in msg and "Traceback" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


# --- good inputs ----------------------------------------------------------------


def test_wav_16k_mono_is_taken_as_is(tmp_path):
    data = tone(1.0, SAMPLE_RATE)
    path = write(tmp_path / "a.wav", data, SAMPLE_RATE)
    audio = load_audio(path)
    assert audio.original_rate == SAMPLE_RATE
    assert audio.samples.dtype == np.float32 and audio.samples.shape == (SAMPLE_RATE,)
    assert audio.original.shape == (SAMPLE_RATE, 1)
    np.testing.assert_allclose(audio.samples, data[:, 0], atol=1.0 / 32768)
    assert audio.duration_s == 1.0 and audio.num_frames == FPS
    assert audio.path == str(tmp_path / "a.wav")


def test_wav_44k_stereo_is_downmixed_and_resampled(tmp_path):
    data = tone(1.3, 44100, channels=2)  # left 0.5, right 0.25 amplitude -> mean 0.375
    audio = load_audio(write(tmp_path / "s.wav", data, 44100))
    assert audio.original.shape == (len(data), 2) and audio.original_rate == 44100
    assert abs(audio.duration_s - len(data) / 44100) < 1e-3
    t = np.arange(len(audio.samples)) / SAMPLE_RATE
    expected = 0.375 * np.sin(2 * np.pi * 440 * t)
    mid = slice(800, -800)  # away from the filter's edge transients
    np.testing.assert_allclose(audio.samples[mid], expected[mid], atol=2e-3)


@pytest.mark.parametrize(
    ("name", "rate", "kw", "tol"),
    [
        ("a.flac", 48000, {}, 2e-3),
        ("a.ogg", 48000, {"format": "OGG", "subtype": "VORBIS"}, 2e-3),
        ("a.mp3", 44100, {"format": "MP3"}, 0.06),
    ],
)
def test_compressed_formats(tmp_path, name, rate, kw, tol):
    data = tone(1.2, rate, channels=2)
    audio = load_audio(write(tmp_path / name, data, rate, **kw))
    assert audio.original_rate == rate and audio.original.shape[1] == 2
    assert abs(audio.duration_s - 1.2) <= tol
    assert 0.3 < float(np.max(np.abs(audio.samples))) <= 1.0


def test_a_tag_that_is_not_utf8_does_not_refuse_the_file(tmp_path):
    """An MP3 whose ID3 title says UTF-8 but holds Latin-1 bytes (old taggers): the sound
    is what counts, the tag is not read strictly."""
    import io

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as f:
        stream = f.add_stream("libmp3lame", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(tone(1.0, 16000).T, format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            f.mux(packet)
    body = b"\x03Caf\xe9 \xff\xfe"  # text encoding 3 (UTF-8), then bytes that are not
    tit2 = b"TIT2" + struct.pack(">I", len(body)) + b"\x00\x00" + body
    size = bytes((len(tit2) >> shift) & 127 for shift in (21, 14, 7, 0))  # syncsafe
    path = tmp_path / "tagged.mp3"
    path.write_bytes(b"ID3\x03\x00\x00" + size + tit2 + buf.getvalue())
    audio = load_audio(path)
    assert abs(audio.duration_s - 1.0) < 0.1 and np.abs(audio.samples).max() > 0.1


def test_content_not_extension_decides(tmp_path):
    path = write(tmp_path / "speech.data", tone(1.0, 22050), 22050, format="WAV")
    assert load_audio(path).num_frames == FPS


@pytest.mark.parametrize(("n", "frames"), [(16000, 25), (16001, 26), (640 * 7, 7), (1, 1)])
def test_num_frames_is_exact_ceiling(n, frames):
    audio = Audio(None, np.zeros(n, np.float32), np.zeros((n, 1), np.float32), SAMPLE_RATE)
    assert audio.num_frames == frames


@pytest.mark.parametrize(("n", "frames"), [(16000, 25), (16001, 26), (640 * 13, 13)])
def test_num_frames_of_loaded_files(tmp_path, n, frames):
    data = tone(n / SAMPLE_RATE, SAMPLE_RATE)
    assert len(data) == n
    assert load_audio(write(tmp_path / "n.wav", data, SAMPLE_RATE)).num_frames == frames


def test_audio_from_array_scales_int16_and_resamples():
    pcm = (tone(1.0, 8000)[:, 0] * 32767).astype(np.int16)
    audio = audio_from_array(pcm, 8000)
    assert audio.path is None and audio.original.shape == (8000, 1)
    assert audio.samples.shape == (SAMPLE_RATE,)
    assert 0.45 < float(np.max(np.abs(audio.samples))) < 0.55


def test_audio_from_array_validates():
    with pytest.raises(InputError, match="silent"):
        audio_from_array(np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE, path="gen.wav")
    with pytest.raises(InputError, match="sample rate"):
        audio_from_array(tone(1.0, SAMPLE_RATE), 0)
    with pytest.raises(InputError, match="too short"):
        audio_from_array(tone(0.2, SAMPLE_RATE), SAMPLE_RATE)


# --- rejected inputs ----------------------------------------------------------------


def test_missing_file(tmp_path):
    assert_rejected(tmp_path / "nope.wav", "does not exist")


def test_directory(tmp_path):
    folder = tmp_path / "clips.wav"
    folder.mkdir()
    assert_rejected(folder, "is a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file(tmp_path):
    path = write(tmp_path / "locked.wav", tone(1.0, SAMPLE_RATE), SAMPLE_RATE)
    os.chmod(path, 0)
    try:
        assert_rejected(path, "permission denied")
    finally:
        os.chmod(path, 0o644)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    assert_rejected(path, "empty (0 bytes)")


def test_garbage_is_not_recognised(tmp_path):
    path = tmp_path / "noise.wav"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    assert_rejected(path, "could not be decoded", "Format not recognised")


def test_riff_header_with_garbage_is_corrupt(tmp_path):
    path = tmp_path / "corrupt.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", 1000) + b"WAVE" + b"\x07" * 200)
    msg = assert_rejected(path, "could not be decoded")
    assert "Error opening" not in msg


@pytest.mark.parametrize(
    "blob",
    [
        b"RIFF\x24\x00\x00\x00WAVEfmt junk",  # the header that crashed the RIFF walker
        b"RIFF\xff\xff\xff\xffWAVEfmt \x10\x00\x00\x00\x01\x00",  # 'fmt ' cut short
        b"RF64\xff\xff\xff\xffWAVEds64\x1c\x00\x00\x00\x00",  # 'ds64' cut short
    ],
)
def test_broken_headers_are_refused_in_one_line(tmp_path, blob):
    path = tmp_path / "bad.wav"
    path.write_bytes(blob)
    assert_rejected(path, "could not be decoded", "corrupt")


def test_wav_truncated_in_data_chunk(tmp_path):
    path = write(tmp_path / "cut.wav", tone(2.0, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 3])
    assert_rejected(path, "is damaged at 0.7 s of 2.0 s", "truncated", "re-export")


def test_wav_truncated_after_header(tmp_path):
    path = write(tmp_path / "hdr.wav", tone(1.0, SAMPLE_RATE), SAMPLE_RATE)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:44])
    assert_rejected(path, "damaged at 0.0 s of 1.0 s", "truncated")


def test_header_only_wav_has_no_audio(tmp_path):
    path = write(tmp_path / "zero.wav", np.zeros(0, np.float32), SAMPLE_RATE, subtype="PCM_16")
    assert os.path.getsize(path) == 44
    assert_rejected(path, "contains no audio")


def test_flac_truncated_mid_stream(tmp_path):
    path = write(tmp_path / "cut.flac", tone(2.0, 48000), 48000)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 2])
    assert_rejected(path, "damaged at", "of 2.0 s", "flac decoder lost sync")


def test_flac_declaring_more_samples_than_present(tmp_path):
    path = write(tmp_path / "short.flac", tone(1.0, 48000), 48000)
    blob = bytearray(open(path, "rb").read())
    assert blob[:4] == b"fLaC"
    info = 8  # 4-byte magic + 4-byte metadata block header
    bits = int.from_bytes(blob[info + 10 : info + 18], "big")
    bits = (bits & ~((1 << 36) - 1)) | (48000 * 3)  # claim 3 s
    blob[info + 10 : info + 18] = bits.to_bytes(8, "big")
    open(path, "wb").write(bytes(blob))
    assert_rejected(path, "damaged at", "of 3.0 s")


def test_too_short(tmp_path):
    path = write(tmp_path / "blip.wav", tone(0.3, SAMPLE_RATE), SAMPLE_RATE)
    assert_rejected(path, "too short", "0.300 s", f"{MIN_DURATION_S} s")


@pytest.mark.parametrize("level", [0.0, 5e-5])
def test_silent(tmp_path, level):
    data = np.full((SAMPLE_RATE, 1), level, np.float32)
    path = write(tmp_path / "quiet.wav", data, SAMPLE_RATE, subtype="FLOAT")
    assert_rejected(path, "is silent")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_samples(tmp_path, bad):
    data = tone(1.0, SAMPLE_RATE)
    data[100] = bad
    path = write(tmp_path / "nan.wav", data, SAMPLE_RATE, subtype="FLOAT")
    assert_rejected(path, "NaN or infinite")


# --- resampling (soxr HQ) -------------------------------------------------------------


def level_db(rate: int, freq: float) -> float:
    """Level of a 0.5-amplitude ``freq`` tone at ``rate`` after loading, in dB of its input."""
    audio = audio_from_array(tone(2.0, rate, freq=freq)[:, 0], rate)
    mid = audio.samples[SAMPLE_RATE // 4 : -SAMPLE_RATE // 4].astype(np.float64)
    return 20 * np.log10(np.sqrt(np.mean(mid**2)) / (0.5 / np.sqrt(2)))


def test_tone_above_the_new_nyquist_does_not_alias():
    assert level_db(44100, 9000.0) < -60.0  # resample_poly let it through at -22 dB


def test_tone_in_the_passband_keeps_its_level():
    assert abs(level_db(44100, 7200.0)) < 0.1  # resample_poly lost 1.2 dB


def test_16k_mono_array_shares_memory_and_clipping_spares_the_original(tmp_path):
    audio = audio_from_array(tone(1.0, SAMPLE_RATE), SAMPLE_RATE)
    assert np.shares_memory(audio.samples, audio.original)  # one copy of the clip
    loud = tone(1.0, SAMPLE_RATE) * 3.0  # float WAV above full scale
    audio = load_audio(write(tmp_path / "loud.wav", loud, SAMPLE_RATE, subtype="FLOAT"))
    assert float(audio.samples.max()) == 1.0 and float(audio.original.max()) > 1.4


@pytest.mark.parametrize(("rate", "channels"), [(44100, 2), (8000, 1), (48000, 3)])
def test_streamed_resampling_equals_resampling_the_whole_clip(tmp_path, rate, channels):
    data = tone(3.0, rate, channels, freq=330.0)
    audio = load_audio(write(tmp_path / "r.wav", data, rate, subtype="FLOAT"))
    mono = data.mean(axis=1, dtype=np.float32) if channels > 1 else data[:, 0]
    whole = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ")
    np.testing.assert_array_equal(audio.samples, np.clip(whole, -1.0, 1.0))


def test_model_input_grows_past_a_short_guess():
    # a file that declares no length is sized from a guess; more audio grows the buffer
    data = tone(3.0, 44100, channels=2)
    mono = _Mono(44100, 2, expected=100)
    for start in range(0, len(data), 5000):
        mono.add(data[start : start + 5000])
    whole = soxr.resample(data.mean(axis=1, dtype=np.float32), 44100, SAMPLE_RATE, quality="HQ")
    np.testing.assert_array_equal(mono.result(), np.clip(whole, -1.0, 1.0))


# --- the original, read again -------------------------------------------------------------


def test_loaded_file_keeps_no_original_and_reads_it_again_in_blocks(tmp_path):
    data = tone(2.0, 44100, channels=2)
    path = write(tmp_path / "s.wav", data, 44100, subtype="FLOAT")
    audio = load_audio(path)
    assert isinstance(audio.source, OriginalFile) and audio.source.frames == len(data)
    assert audio.channels == 2 and audio.original_rate == 44100
    blocks = list(audio.original_blocks())
    assert all(b.dtype == np.float32 and b.shape[1] == 2 for b in blocks)
    assert len(blocks) > 1 and max(len(b) for b in blocks) < len(data) // 4
    np.testing.assert_array_equal(np.concatenate(blocks), data)
    np.testing.assert_array_equal(audio.original, data)  # made on demand, a new array
    assert audio.original is not audio.original


@pytest.mark.parametrize(
    ("name", "fmt", "codec"), [("a.m4a", "mp4", "aac"), ("a.mp3", "mp3", None)]
)
def test_original_of_ffmpeg_formats_is_what_was_loaded(tmp_path, name, fmt, codec):
    if codec is None:  # MP3: FFmpeg's decoder, the file written by libsndfile
        path = write(tmp_path / name, tone(2.0, 44100, 2), 44100, format="MP3")
    else:
        path = encode(tmp_path / name, fmt, codec, seconds=2.0)
    audio = load_audio(path)
    original = audio.original
    assert len(original) == audio.source.frames and original.shape[1] == audio.channels
    whole = soxr.resample(original.mean(axis=1), audio.original_rate, SAMPLE_RATE, quality="HQ")
    np.testing.assert_array_equal(audio.samples, np.clip(whole, -1.0, 1.0))


def test_array_original_blocks_are_views():
    data = tone(1.0, 22050, channels=2)
    audio = audio_from_array(data, 22050)
    assert audio.channels == 2 and audio.original_rate == 22050
    blocks = list(audio.original_blocks())
    assert all(np.shares_memory(b, audio.original) for b in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), data)


@pytest.mark.parametrize("change", ["touched", "rewritten"])
def test_file_changed_since_loading_is_refused(tmp_path, change):
    path = write(tmp_path / "take.wav", tone(1.0, 22050), 22050)
    audio = load_audio(path)
    if change == "touched":
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    else:
        write(path, tone(1.5, 22050), 22050)
    for read in (audio.original_blocks, lambda: audio.original):
        with pytest.raises(InputError) as info:
            read()
        msg = str(info.value)
        assert "take.wav' changed since it was loaded; open it again" in msg and "\n" not in msg


# --- formats FFmpeg decodes -------------------------------------------------------------


def encode(
    path, fmt: str, codec: str | None, rate: int = 48000, seconds: float = 1.5,
    video: bool = False, **options: str,
) -> str:  # fmt: skip
    """Write a tone with PyAV (``codec`` None: no audio), with a video track if asked."""
    out = av.open(str(path), "w", format=fmt, options=options)
    vs = out.add_stream("libx264", rate=25) if video else None
    st = None if codec is None else out.add_stream(codec, rate=rate)
    if vs is not None:
        vs.width, vs.height, vs.pix_fmt = 64, 64, "yuv420p"
        for i in range(int(seconds * 25)):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), i, np.uint8), format="rgb24")
            frame.pts = i
            out.mux(vs.encode(frame))
        out.mux(vs.encode(None))
    if st is not None:
        layout = st.codec_context.layout.name
        pcm = np.ascontiguousarray(tone(seconds, rate, len(st.codec_context.layout.channels)).T)
        frame = av.AudioFrame.from_ndarray(pcm, format="fltp", layout=layout)
        frame.sample_rate, frame.pts = rate, 0
        cc = st.codec_context
        convert = av.AudioResampler(cc.format.name, layout, rate, cc.frame_size or 1152)
        for chunk in [*convert.resample(frame), *convert.resample(None), None]:
            out.mux(st.encode(chunk))
    out.close()
    return str(path)


@pytest.mark.parametrize(
    ("name", "fmt", "codec", "video"),
    [
        ("a.m4a", "mp4", "aac", False),
        ("a.aac", "adts", "aac", False),
        ("a.webm", "webm", "libopus", False),
        ("opus.mp4", "mp4", "libopus", False),
        ("clip.mp4", "mp4", "aac", True),
        ("clip.mkv", "matroska", "aac", True),
    ],
)
def test_ffmpeg_formats_and_video_audio_tracks(tmp_path, name, fmt, codec, video):
    audio = load_audio(encode(tmp_path / name, fmt, codec, video=video))
    assert audio.original_rate == 48000 and audio.original.shape[1] == 2
    assert abs(audio.duration_s - 1.5) < 0.05
    assert 0.3 < float(np.max(np.abs(audio.samples))) <= 1.0


def test_video_without_audio_track(tmp_path):
    path = encode(tmp_path / "silent-film.mp4", "mp4", None, video=True)
    assert_rejected(path, "has no audio track", "choose a file")


def test_mp3_without_xing_header_is_read_whole(tmp_path):
    # libsndfile reads such a VBR file only as far as its first frame's bitrate suggests
    path = encode(tmp_path / "vbr.mp3", "mp3", "libmp3lame", 44100, 6.0, write_xing="0")
    assert abs(load_audio(path).duration_s - 6.0) < 0.1


def test_flac_without_declared_length_is_read_whole(tmp_path):
    path = write(tmp_path / "live.flac", tone(2.0, 48000), 48000)
    blob = bytearray(open(path, "rb").read())
    blob[21] &= 0xF0  # STREAMINFO's 36-bit total, as a live encoder leaves it: 0
    blob[22:26] = bytes(4)
    open(path, "wb").write(bytes(blob))
    assert abs(load_audio(path).duration_s - 2.0) < 1e-3


def test_content_not_raw_extension_decides(tmp_path):
    path = write(tmp_path / "take.raw", tone(1.0, 22050), 22050, format="WAV")
    assert load_audio(path).num_frames == FPS


def test_gsm_wav(tmp_path):
    sox = shutil.which("sox")
    if sox is None:
        pytest.skip("sox is not installed")
    src = write(tmp_path / "in.wav", tone(2.0, 8000), 8000, subtype="PCM_16")
    gsm = tmp_path / "gsm.wav"
    subprocess.run([sox, src, "-e", "gsm-full-rate", str(gsm)], check=True)
    assert sf.info(str(gsm)).subtype == "GSM610"
    audio = load_audio(gsm)
    assert abs(audio.duration_s - 2.0) < 0.05 and float(np.max(np.abs(audio.samples))) > 0.3


# --- damage, bounds and files that are not audio ----------------------------------------


def damage_at(path: str, fraction: float, count: int = 300) -> None:
    """Overwrite ``count`` bytes at ``fraction`` of the file with seeded noise."""
    blob = bytearray(open(path, "rb").read())
    at = int(len(blob) * fraction)
    blob[at : at + count] = np.random.default_rng(3).integers(0, 256, count, np.uint8).tobytes()
    open(path, "wb").write(bytes(blob))


@pytest.mark.parametrize(("name", "kw"), [("mid.flac", {}), ("mid.mp3", {"format": "MP3"})])
def test_damage_in_the_middle_is_reported_where_it_is(tmp_path, name, kw):
    path = write(tmp_path / name, tone(4.0, 44100), 44100, **kw)
    damage_at(path, 0.4)
    msg = assert_rejected(path, "is damaged at", "of 4.0 s", "decoding stopped", "re-export")
    at = float(re.search(r"damaged at ([\d.]+) s", msg)[1])
    assert 1.2 <= at <= 1.8  # where the bytes were hit, not where the file ends


def test_ogg_cut_short_is_damaged(tmp_path):
    path = write(tmp_path / "cut.ogg", tone(3.0, 44100), 44100, format="OGG", subtype="VORBIS")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) * 2 // 3])
    assert_rejected(path, "is damaged at", "truncated")


def test_flac_declaring_billions_of_frames_in_4kb_is_refused_before_allocating(tmp_path):
    path = write(tmp_path / "huge.flac", tone(1.0, 48000), 48000)
    blob = bytearray(open(path, "rb").read()[:4096])
    blob[21] |= 0x0F  # STREAMINFO's 36-bit total: 2**36 - 1 frames (about 16.6 days)
    blob[22:26] = b"\xff\xff\xff\xff"
    open(path, "wb").write(bytes(blob))
    tracemalloc.start()
    try:
        msg = assert_rejected(path, "more than its 4096 bytes can hold", "header is corrupt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "MemoryError" not in msg and peak < 8 << 20


def test_zero_rate_header_is_refused(tmp_path):
    path = write(tmp_path / "rate.wav", tone(1.0, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
    blob = bytearray(open(path, "rb").read())
    blob[24:28] = struct.pack("<I", 3)  # 3 Hz: 16000 s of audio to upsample
    blob[28:32] = struct.pack("<I", 6)
    open(path, "wb").write(bytes(blob))
    assert_rejected(path, "sample rate of 3 Hz", "header is corrupt")


def test_text_renamed_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("Remember to record the intro again.\nTake 2 was better.\n")
    assert_rejected(path, "is a text file, not audio", "choose a recording")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_character_device_is_refused_up_front(device):
    if not os.path.exists(device):
        pytest.skip(f"{device} does not exist here")
    msg = str(refused_without_hanging(device))
    assert "is a character device, not an audio file" in msg and "empty" not in msg


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_fifo_is_refused_up_front(tmp_path):
    fifo = tmp_path / "speech.wav"
    os.mkfifo(fifo)
    msg = str(refused_without_hanging(str(fifo)))
    assert "speech.wav' is a named pipe (FIFO)" in msg and "save the audio to a file" in msg


def refused_without_hanging(path: str) -> InputError:
    """load_audio(path)'s InputError, from a thread that must not block (a writer unblocks it)."""
    result: list[BaseException | None] = [None]

    def attempt() -> None:
        try:
            load_audio(path)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            result[0] = e

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(60)
    hung = worker.is_alive()
    if hung and stat.S_ISFIFO(os.stat(path).st_mode):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # let the stuck reader go
    assert not hung, f"load_audio({path!r}) blocked"
    assert isinstance(result[0], InputError), result[0]
    assert "\n" not in str(result[0]) and path in str(result[0])
    return result[0]


@pytest.mark.slow
def test_cli_refuses_a_fifo_with_one_line(tmp_path):
    fifo = tmp_path / "live.wav"
    os.mkfifo(fifo)
    out = tmp_path / "x.mp4"
    run = subprocess.run(
        [sys.executable, "-m", "studio", "render", "--demo", "--audio", str(fifo), "--out",
         str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )  # fmt: skip
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr
    assert "named pipe" in run.stderr and not out.exists()


def test_declared_seconds_reads_headers_and_containers_without_decoding(tmp_path):
    """A batch's estimates: the length a WAV's or MP3's header (libsndfile) or an M4A's
    container (FFmpeg) declares; None for what is not audio or not there."""
    wav = write(tmp_path / "a.wav", tone(2.5, 22050), 22050)
    mp3 = write(tmp_path / "a.mp3", tone(3.0, 44100), 44100, format="MP3")
    m4a = encode(tmp_path / "a.m4a", "mp4", "aac", seconds=2.0)
    assert declared_seconds(wav) == pytest.approx(2.5)
    assert declared_seconds(mp3) == pytest.approx(3.0, abs=0.06)
    assert declared_seconds(m4a) == pytest.approx(2.0, abs=0.05)
    text = tmp_path / "notes.wav"
    text.write_text("not audio\n")
    assert declared_seconds(text) is None
    assert declared_seconds(tmp_path / "missing.wav") is None
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)  # no writer: opening it to read would block
    got: list[float | None] = []
    reader = threading.Thread(target=lambda: got.append(declared_seconds(fifo)), daemon=True)
    reader.start()
    reader.join(10.0)
    assert got == [None]
