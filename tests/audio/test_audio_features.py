"""HuBERT chunking (studio.audio.features) against the position-encoding ONNX stand-in.

The stand-in's frame t is the mean of samples [320 t, 320 t + 400) of its input (dim 0
exact, dim d scaled by 1 - d/1024), so an impulse shows which features saw a sample and a
ramp signal shows where each feature's window sits. Real ONNX Runtime, no mocks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from studio.audio.features import (
    ChunkGeometry,
    HubertFeatures,
    num_feature_frames,
    offline_chunk_starts,
    online_feature_count,
    online_windows,
)
from studio.errors import InputError
from studio.fixtures.hubert_standin import build_hubert_standin, standin_weights
from studio.layout import HUBERT_DIM


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hubert_standin(tmp_path_factory.mktemp("hubert") / "hubert_standin.onnx")


@pytest.fixture(scope="module")
def hubert(standin: Path) -> HubertFeatures:
    return HubertFeatures(standin, providers=["CPUExecutionProvider"])


def impulse(n: int, k: int) -> np.ndarray:
    x = np.zeros(n, dtype=np.float32)
    x[k] = 1.0
    return x


def seen_by(feats: np.ndarray) -> set[int]:
    return {int(j) for j in np.flatnonzero(feats[:, 0] != 0.0)}


# --- the stand-in and the geometry ---------------------------------------------


def test_standin_follows_the_conv_front_end(standin: Path) -> None:
    sess = ort.InferenceSession(str(standin), providers=["CPUExecutionProvider"])
    for n in (400, 719, 720, 6480, 9999):
        out = sess.run(None, {"input_values": np.zeros((1, n), np.float32)})[0]
        assert out.shape == ((n - 400) // 320 + 1, HUBERT_DIM)
    x = np.arange(6480, dtype=np.float32)[None, :]
    out = sess.run(None, {"input_values": x})[0]
    assert out.shape == (20, HUBERT_DIM)
    np.testing.assert_allclose(out[:, 0], 320 * np.arange(20) + 199.5, rtol=1e-6)
    np.testing.assert_allclose(out[3], out[3, 0] * standin_weights(), rtol=1e-6)


def test_chunk_geometry_defaults_and_validation() -> None:
    g = ChunkGeometry.of((3, 5, 2))
    assert (g.split_len, g.hop, g.offline_left_pad, g.online_left_pad) == (6480, 3200, 2000, 1920)
    assert g.keep == slice(-14, -4)  # HuBERT frames -14..-5
    assert len(range(20)[g.keep]) == 10 and g.min_hubert_frames == 14
    for bad in ((3, 5, 0), (3, 0, 2), (-1, 5, 2), (3, 5), (3, 5, 2, 1), ("3", 5, 2), (3, 5, 1.5)):
        with pytest.raises(ValueError, match="chunksize"):
            ChunkGeometry.of(bad)


def test_five_features_per_chunk_from_hubert_frames_6_to_15(hubert: HubertFeatures) -> None:
    chunk = np.arange(6480, dtype=np.float32)
    feats = hubert.chunk_features(chunk)
    assert feats.shape == (5, HUBERT_DIM) and feats.dtype == np.float32
    frame_means = 320 * np.arange(20) + 199.5
    expected = 0.5 * (frame_means[6:16:2] + frame_means[7:16:2])
    np.testing.assert_allclose(feats[:, 0], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="6480"):
        hubert.chunk_features(chunk[:6400])


# --- offline -------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 100, 639, 640, 641, 4480, 6479, 6480, 6481, 16000, 33333])
def test_offline_count_is_num_f(hubert: HubertFeatures, n: int) -> None:
    feats = hubert.offline(np.ones(n, dtype=np.float32))
    assert feats.shape == (math.ceil(n * 25 / 16000), HUBERT_DIM) == (num_feature_frames(n), 1024)
    assert feats.dtype == np.float32 and feats.flags.c_contiguous


def test_num_f_is_exact_where_the_float_formula_is_not() -> None:
    # Ditto's ceil(len / 16000 * 25) gives 8 frames for 4480 samples (7.000000000000001).
    assert math.ceil(4480 / 16000 * 25) == 8
    assert num_feature_frames(4480) == 7 == 4480 // 640


@pytest.mark.parametrize("chunksize", [(3, 5, 2), (2, 4, 1), (0, 3, 3)])
def test_offline_feature_j_covers_640j_minus_80_to_640j_plus_640(
    standin: Path, chunksize: tuple[int, int, int]
) -> None:
    h = HubertFeatures(standin, providers=["CPUExecutionProvider"], chunksize=chunksize)
    n = 640 * 23 + 17
    for k in (0, 79, 80, 559, 560, 639, 640, 1839, 1840, 2479, 2480, 2559, 9000, n - 1):
        expected = {j for j in range(num_feature_frames(n)) if 640 * j - 80 <= k < 640 * j + 640}
        assert seen_by(h.offline(impulse(n, k))) == expected, k


def test_offline_positions_with_a_ramp(hubert: HubertFeatures) -> None:
    n = 20000
    feats = hubert.offline(np.arange(n, dtype=np.float32))
    j = np.arange(1, num_feature_frames(n) - 1)  # windows fully inside the audio
    np.testing.assert_allclose(feats[j, 0], 640 * j + 279.5, rtol=1e-6)  # centre of the span
    np.testing.assert_allclose(feats[5], feats[5, 0] * standin_weights(), rtol=1e-6)
    # frame 0: 80 zeros of left padding then samples 0..639
    np.testing.assert_allclose(feats[0, 0], 0.5 * (319 * 320 / 2 / 400 + 439.5), rtol=1e-6)


def test_long_audio_chunk_starts_are_exact_multiples_of_640(hubert: HubertFeatures) -> None:
    float_start = [int(i * 0.04 * 16000) for i in range(0, 4000, 5)]
    exact = list(offline_chunk_starts(4000))
    assert exact == [640 * i for i in range(0, 4000, 5)]
    differ = [i for i, a, b in zip(range(0, 4000, 5), float_start, exact, strict=True) if a != b]
    assert differ and differ[0] == 1615 and float_start[1615 // 5] == 640 * 1615 - 1

    # End to end: the last sample of feature 1615's span. The reference's chunk (one sample
    # early) misses it in that feature; ours sees it.
    i, n = 1615, 640 * 1625
    k = 640 * i + 639
    feats = hubert.offline(impulse(n, k))
    assert feats[i, 0] > 0 and seen_by(feats) == {i, i + 1}
    padded = np.zeros(2000 + n + 6480, dtype=np.float32)
    padded[2000 + k] = 1.0
    ref_start = int(i * 0.04 * 16000)
    assert hubert.chunk_features(padded[ref_start : ref_start + 6480])[0, 0] == 0.0
    assert hubert.chunk_features(padded[640 * i : 640 * i + 6480])[0, 0] > 0.0


# --- online and priming --------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 1280, 1281, 3200, 6480, 16000, 16001, 40000])
def test_online_total(hubert: HubertFeatures, n: int) -> None:
    x = np.ones(n, dtype=np.float32)
    windows = list(online_windows(x))
    assert all(w.shape == (6480,) for w in windows)
    blocks = list(hubert.online_chunks(x))
    assert all(b.shape == (5, HUBERT_DIM) for b in blocks)
    total = sum(len(b) for b in blocks)
    assert total == 5 * math.ceil((n + 1920) / 3200) == online_feature_count(n)
    assert total >= num_feature_frames(n)


def test_online_is_80_samples_later_than_offline(hubert: HubertFeatures) -> None:
    n = 20000
    x = np.arange(n, dtype=np.float32)
    online = np.concatenate(list(hubert.online_chunks(x)))
    offline = hubert.offline(x)
    j = np.arange(1, 25)  # spans fully inside the audio in both paths
    np.testing.assert_allclose(online[j, 0], offline[j, 0] + 80, rtol=1e-6)
    for k in (0, 639, 640, 719, 720, 5000):  # online feature j covers [640 j, 640 j + 720)
        got = seen_by(np.concatenate(list(hubert.online_chunks(impulse(n, k)))))
        assert got == {j for j in range(online_feature_count(n)) if 640 * j <= k < 640 * j + 720}


@pytest.mark.parametrize("o", [0, 1, 10, 70, 75])
def test_priming_gives_exactly_o_silent_frames(hubert: HubertFeatures, o: int) -> None:
    prime = hubert.silence(o)
    assert prime.shape == (o, HUBERT_DIM) and not prime.any()
    np.testing.assert_array_equal(prime, hubert.offline(np.zeros(o * 640, np.float32)))
    prime[:] = 1.0  # a copy: the cache is not touched
    assert not hubert.silence(o).any()


def test_input_must_be_1d_float32(hubert: HubertFeatures) -> None:
    for bad in (np.zeros(100), np.zeros((1, 100), np.float32), [0.0] * 100):
        with pytest.raises(ValueError, match="1-D float32"):
            hubert.offline(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="1-D float32"):
            list(hubert.online_chunks(bad))  # type: ignore[arg-type]


# --- sessions and errors -------------------------------------------------------


def test_one_session_per_file(standin: Path) -> None:
    a = HubertFeatures(standin, providers=["CPUExecutionProvider"])
    b = HubertFeatures(standin, providers=["CPUExecutionProvider"], chunksize=(2, 4, 1))
    assert a._session is b._session
    assert a.providers == ["CPUExecutionProvider"]
    assert "CPUExecutionProvider" in HubertFeatures(standin).providers


def test_missing_unreadable_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist") as e:
        HubertFeatures(tmp_path / "nope.onnx")
    assert "nope.onnx" in str(e.value)
    with pytest.raises(InputError, match="is a directory"):
        HubertFeatures(tmp_path)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an onnx model")
    with pytest.raises(InputError, match="junk.onnx.*could not be loaded"):
        HubertFeatures(junk)


@pytest.mark.parametrize(
    ("kwargs", "found"),
    [
        ({"input_name": "audio"}, "inputs 'audio'"),
        ({"output_name": "last_hidden_state"}, "outputs 'last_hidden_state'"),
        ({"dim": 768}, "width 768"),
        ({"num_samples": 3200}, "fixed input length of 3200"),
    ],
)
def test_wrong_signature_names_file_and_expectation(
    tmp_path: Path, kwargs: dict, found: str
) -> None:
    path = build_hubert_standin(tmp_path / "wrong.onnx", **kwargs)
    with pytest.raises(InputError) as e:
        HubertFeatures(path, providers=["CPUExecutionProvider"])
    msg = str(e.value)
    assert "wrong.onnx" in msg and found in msg
    assert "'input_values' float32 [1, N]" in msg and "'encoding_out'" in msg


def test_static_6480_model_is_accepted(tmp_path: Path) -> None:
    path = build_hubert_standin(tmp_path / "static.onnx", num_samples=6480)
    h = HubertFeatures(path, providers=["CPUExecutionProvider"])
    assert h.offline(np.ones(16000, np.float32)).shape == (25, HUBERT_DIM)
