"""Shared test setup: Qt runs offscreen (without a display Qt aborts), and tensor helpers."""

import contextlib
import gc
import json
import os
import time

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

HEAP_FILL = 165  # the byte fresh heap memory holds in the tests (glibc's M_PERTURB)
M_PERTURB = -6  # mallopt's parameter number (malloc.h)


def _repeatable_heap() -> None:
    """Fresh heap memory holds one byte, in this process (``mallopt``) and its children
    (``MALLOC_PERTURB_``: CLI subprocesses, Ray workers). The H.264 encode (FFmpeg with
    libx264) reads some heap memory it never set: the same frames encoded again come out
    different about once in a hundred encodes where other threads are busy and audio is
    muxed (the planes handed to it identical, its packets not; up to ~15 levels in some
    pixels). Tests compare the frames of separate encodes, so that memory must not vary."""
    fill = int(os.environ.setdefault("MALLOC_PERTURB_", str(HEAP_FILL)))  # one byte for all
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(M_PERTURB, fill)
    except (OSError, AttributeError):  # not glibc: its malloc has no such switch
        pass


_repeatable_heap()

HOST_READS = ("item", "tolist", "cpu", "numpy")


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a child a test interrupts with SIGINT: SIGINT back to its default,
    since a runner started in the background (``cmd &`` without job control) passes it on
    ignored, and the studio rightly keeps an inherited ignore (nohup)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True, scope="session")
def _studio_cache(tmp_path_factory):
    """Every cache, lock and error log of the test session in a folder of its own, never in
    the user's cache (a test that wants another sets STUDIO_CACHE_DIR itself)."""
    root = tmp_path_factory.mktemp("studio-cache")
    before = os.environ.get("STUDIO_CACHE_DIR")
    os.environ["STUDIO_CACHE_DIR"] = str(root)
    yield root
    if before is None:
        os.environ.pop("STUDIO_CACHE_DIR", None)
    else:
        os.environ["STUDIO_CACHE_DIR"] = before


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


SMALL_WARP_MAPS = 16  # H and W of small_warp_network's example feature maps (64 in the product)


def _small_example_inputs(self, batch=1):
    f_s, x_s, x_d = type(self).example_inputs(self, batch)
    return f_s[..., :SMALL_WARP_MAPS, :SMALL_WARP_MAPS].contiguous(), x_s, x_d


def small_warp_network(seed=0):
    """The reduced random warp network made cheaper still, for engine and export tests whose
    assertions do not depend on its size: a 4-block dense-motion hourglass (5 when reduced) and
    16x16 feature maps in its ``example_inputs`` (64x64; the hourglass needs H and W divisible
    by 2**blocks). Same layers, ops and precision policy. PyTorch's fp16 Conv3d on the CPU is a
    slow reference kernel: the half export traces in about 2 s instead of 40."""
    import types

    from studio.fixtures.random_tree import random_network

    warp = random_network("warp_network", reduced=True, seed=seed, dense_num_blocks=4)
    # bound to the instance: copies (precision adapters deep-copy the module) keep it
    warp.example_inputs = types.MethodType(_small_example_inputs, warp)
    return warp


@pytest.fixture(scope="session")
def warp_onnx(tmp_path_factory):
    """fp32 and fp16 ONNX exports of one small_warp_network, shared by the export, engine and
    TensorRT tests (exporting is the expensive part)."""
    pytest.importorskip("onnx")
    import torch

    from studio.runtime.onnx_cache import export_for_engine

    d = tmp_path_factory.mktemp("warp_onnx")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread, for whichever test asks first
    try:
        m = small_warp_network()
        return {
            "fp32": export_for_engine("warp_network", m, d, verify=False),
            "fp16": export_for_engine("warp_network", m, d, precision="fp16"),
        }
    finally:
        torch.set_num_threads(before)


DITTO_FACE_HW = (300, 360)  # not square: full frames must keep it
DITTO_CLIP_S = 0.8  # 20 frames at 25 fps


def stitch_net():
    """A reduced stitch network of fixed weights: what the compiled-engine tests compile."""
    import torch

    from studio.fixtures.random_tree import random_network

    torch.manual_seed(0)
    return random_network("stitch_network", reduced=True).eval()


def compiled_stitch(net, folder):
    """``net``'s compiled engine (batch 2, fp32, CPU), its compiled file built or loaded in
    ``folder``."""
    from studio.runtime.torch_backend import TorchEngine

    return TorchEngine(
        "stitch_network", net, "fp32", "cpu", batch=2, compile=True, aot_dir=folder, aot_build=True
    )


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


def write_video(path, frames, fps=25):
    """An H.264 MP4 of ``frames`` (HxWx3 uint8 each), near-lossless so drawn faces stay
    drawn (the face stand-ins threshold colours)."""
    import av

    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps, options={"crf": "4", "preset": "ultrafast"})
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv444p"
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def drifting_face(n, box, hw, step=1.0):
    """``n`` frames of a drawn face in ``box`` moving right ``step`` px a frame."""
    from studio.fixtures.face_standins import face_image

    x1, y1, x2, y2 = box
    return [face_image(hw, [(x1 + step * i, y1, x2 + step * i, y2)]) for i in range(n)]


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
def registration_tree(tmp_path_factory):
    """A checkpoint tree with what registration reads: the two reduced extractors (no cfg)
    and the ONNX face stand-ins."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from studio.fixtures.face_standins import write_aux_standins
    from studio.fixtures.random_tree import write_checkpoint_tree

    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint_tree(
        root, reduced=True, networks=("appearance_extractor", "motion_extractor"), cfg=False
    )
    write_aux_standins(root)
    return root


@pytest.fixture(scope="session")
def ditto_assets(tmp_path_factory):
    """A reduced random-weight Ditto tree (1103-wide LMDM condition) with ONNX stand-ins for
    HuBERT and the face models, a drawn face the stand-ins find, and a short speech-like clip."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from studio.fixtures.face_standins import face_image, write_aux_standins
    from studio.fixtures.hubert_standin import build_hubert_standin
    from studio.fixtures.random_tree import write_checkpoint_tree

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


# The released ditto_pytorch/ layout, file by file: tests build folders of it.
PYTORCH_FILES = [
    "ditto_pytorch/models/appearance_extractor.pth",
    "ditto_pytorch/models/motion_extractor.pth",
    "ditto_pytorch/models/warp_network.pth",
    "ditto_pytorch/models/decoder.pth",
    "ditto_pytorch/models/stitch_network.pth",
    "ditto_pytorch/models/lmdm_v0.4_hubert.pth",
    "ditto_pytorch/aux_models/det_10g.onnx",
    "ditto_pytorch/aux_models/2d106det.onnx",
    "ditto_pytorch/aux_models/landmark203.onnx",
    "ditto_pytorch/aux_models/face_landmarker.task",
    "ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx",
]


def make_tree(base, files, content: bytes = b""):
    """Empty (or ``content``) files at ``files`` under ``base``: a checkpoint folder's shape."""
    for rel in files:
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    return base


def slow_down(module: object, name: str, seconds: float = 1.0) -> None:
    """Make ``module.name`` (a build step) wait ``seconds`` before it runs: in a process of a
    cold-cache race, so that the other process arrives while the build is under way."""
    step = getattr(module, name)

    def slowed(*args: object, **kwargs: object) -> object:
        time.sleep(seconds)
        return step(*args, **kwargs)

    setattr(module, name, slowed)


def demo_speech_piece(folder, name, start_s, seconds):
    """A piece of the demo speech (``seconds`` from ``start_s``) written to ``folder/name``."""
    import soundfile as sf

    from studio.engines.demo import demo_audio_path

    data, rate = sf.read(demo_audio_path(), dtype="float32")
    a = int(start_s * rate)
    path = folder / name
    sf.write(path, data[a : a + int(seconds * rate)], rate)
    return path


def run_cli(argv, capsys):
    """`studio ARGV` in this process: (exit status, stdout, stderr); argparse's own exits
    count as the status they carry."""
    from studio.cli import main

    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


GUI_RENDER_TIMEOUT_MS = 120_000


@pytest.fixture(autouse=True)
def _collect_windows_on_the_gui_thread(request):
    """A Qt test's windows deleted and their Python wrappers collected at its end, here on the
    GUI thread: left to the cyclic collector, a closed window's Qt objects would be destroyed
    in whichever thread next allocates, such as a worker thread of the next test's window."""
    yield
    if "qtbot" not in request.fixturenames:
        return
    from PySide6.QtCore import QCoreApplication, QEvent

    for _ in range(2):
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        gc.collect()


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """The studio window on the demo engine, shown offscreen, after its first render (its
    settings kept in a folder of the test's own, where it finds a size of 256 last used:
    a quarter of the default's pixels to render, what every preview of the tests costs)."""
    monkeypatch.setenv("STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    from PySide6.QtWidgets import QApplication

    from studio.gui import theme
    from studio.gui.window import MainWindow, app_settings
    from studio.settings import RenderSettings

    app_settings().setValue("settings/last", json.dumps(RenderSettings(size=256).to_dict()))
    theme.apply(QApplication.instance())
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.renderFinished, timeout=GUI_RENDER_TIMEOUT_MS):
        pass
    yield w
    w.close()
