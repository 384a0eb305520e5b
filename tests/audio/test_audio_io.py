"""Audio loading: formats, resampling, frame counts and every rejected input (real libsndfile)."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import soundfile as sf

from studio.audio.io import MIN_DURATION_S, Audio, audio_from_array, load_audio
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


def test_wav_truncated_in_data_chunk(tmp_path):
    path = write(tmp_path / "cut.wav", tone(2.0, SAMPLE_RATE), SAMPLE_RATE, subtype="PCM_16")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 3])
    assert_rejected(path, "truncated", "2.000 s")


def test_wav_truncated_after_header(tmp_path):
    path = write(tmp_path / "hdr.wav", tone(1.0, SAMPLE_RATE), SAMPLE_RATE)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[:44])
    assert_rejected(path, "truncated")


def test_header_only_wav_has_no_audio(tmp_path):
    path = write(tmp_path / "zero.wav", np.zeros(0, np.float32), SAMPLE_RATE, subtype="PCM_16")
    assert os.path.getsize(path) == 44
    assert_rejected(path, "contains no audio")


def test_flac_truncated_mid_stream(tmp_path):
    path = write(tmp_path / "cut.flac", tone(2.0, 48000), 48000)
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 2])
    assert_rejected(path, "truncated", "2.000 s")  # libsndfile loses sync; we count frames


def test_flac_declaring_more_samples_than_present(tmp_path):
    path = write(tmp_path / "short.flac", tone(1.0, 48000), 48000)
    blob = bytearray(open(path, "rb").read())
    assert blob[:4] == b"fLaC"
    info = 8  # 4-byte magic + 4-byte metadata block header
    bits = int.from_bytes(blob[info + 10 : info + 18], "big")
    bits = (bits & ~((1 << 36) - 1)) | (48000 * 3)  # claim 3 s
    blob[info + 10 : info + 18] = bits.to_bytes(8, "big")
    open(path, "wb").write(bytes(blob))
    assert_rejected(path, "truncated", "3.000 s")


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
