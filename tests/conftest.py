"""Shared test setup: Qt runs offscreen (without a display Qt aborts), and tensor helpers."""

import contextlib
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

HOST_READS = ("item", "tolist", "cpu", "numpy")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Reduced networks are tiny: extra threads only add overhead (and stall on busy CI)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def host_reads():
    """``with host_reads(names) as calls:`` records every Tensor method in ``names`` called
    inside the block (reads that would sync a GPU with the host); they still work."""
    import torch

    @contextlib.contextmanager
    def guard(names=HOST_READS):
        calls: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            for name in names:
                orig = getattr(torch.Tensor, name)

                def spy(self, *a, _orig=orig, _name=name, **k):
                    calls.append(_name)
                    return _orig(self, *a, **k)

                mp.setattr(torch.Tensor, name, spy)
            yield calls

    return guard


DITTO_FACE_HW = (300, 360)  # not square: full frames must keep it
DITTO_CLIP_S = 0.8  # 20 frames at 25 fps


def random_biases(model, std=0.2):
    """``model`` with every bias drawn at random (in place): LMDM initialises its attention
    biases to zero, and a test of the projections' regrouping must see them."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, std)
    return model


def write_png(path, rgb):
    """``rgb`` (HxWx3 uint8) as a PNG through PyAV's encoder."""
    import av
    import numpy as np

    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = rgb.shape[1], rgb.shape[0], "rgb24"
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
    path.write_bytes(b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)]))
    return path


def write_speechlike(path, seconds, sr=16000):
    """A voiced, syllable-rate modulated tone with a little noise, as a WAV."""
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    voice = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((140, 280, 420, 700), 1))
    syllables = np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None) ** 0.5
    noise = np.random.default_rng(0).normal(0, 0.05, t.size)
    sf.write(path, (0.25 * voice * syllables + noise).astype(np.float32), sr)
    return path


@pytest.fixture(scope="session")
def ditto_assets(tmp_path_factory):
    """A reduced random-weight Ditto tree (1103-wide LMDM condition) with ONNX stand-ins for
    HuBERT and the face models, a drawn face the stand-ins find, and a short speech-like clip."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from studio.audio.hubert_standin import build_hubert_standin
    from studio.avatar.standins import face_image, write_aux_standins
    from studio.models.random_tree import write_checkpoint_tree

    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint_tree(root, reduced=True, lmdm_cond_dim=1103)
    write_aux_standins(root)
    build_hubert_standin(root / "ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx")
    d = tmp_path_factory.mktemp("inputs")
    face = write_png(d / "face.png", face_image(DITTO_FACE_HW, [(90, 40, 270, 260)]))
    return {
        "tree": root,
        "face": face,
        "audio": write_speechlike(d / "clip.wav", DITTO_CLIP_S),
        "cache": d / "avatars",
    }
