"""`studio render --checkpoints --avatar` end to end on a reduced random-weight Ditto tree with
ONNX stand-ins for HuBERT and the face models: real ONNX Runtime, real PyAV, real soundfile."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import av
import numpy as np
import pytest
from conftest import DITTO_CLIP_S, DITTO_FACE_HW
from conftest import run_cli as _run

from studio.cli import main

# Reduced networks: one torch thread is as fast idle and far steadier on a busy machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = round(DITTO_CLIP_S * 25)
DITTO_TIMINGS = {"hubert", "lmdm", "smoothing", "stitching", "warp_decode", "putback", "encode"}


def _ditto_args(assets, cache, *extra):
    return [
        "--checkpoints",
        str(assets["tree"]),
        "--avatar",
        str(assets["face"]),
        "--audio",
        str(assets["audio"]),
        "--avatar-cache",
        str(cache),
        "--steps",
        "2",
        "--device",
        "cpu",
        *extra,
    ]


@pytest.fixture(scope="module")
def rendered(ditto_assets, tmp_path_factory):
    """One render on the CPU, asked to --compile (ignored there, with a note); its stderr
    (not a terminal: one line per stage start and end) is kept as ``rendered_stderr``."""
    d = tmp_path_factory.mktemp("ditto_render")
    out, report, cache = d / "ditto.mp4", d / "report.json", d / "avatars"
    argv = ["render", *_ditto_args(ditto_assets, cache), "--out", str(out)]
    argv += ["--report", str(report), "--x264-preset", "veryfast", "--stride", "1", "--compile"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    (d / "stderr.txt").write_text(err.getvalue())
    return out, json.loads(report.read_text()), cache


@pytest.fixture(scope="module")
def rendered_stderr(rendered):
    return (rendered[0].parent / "stderr.txt").read_text()


def test_render_writes_an_mp4_of_every_frame_at_the_avatar_size(rendered):
    out, report, _ = rendered
    h, w = DITTO_FACE_HW
    with av.open(str(out)) as c:
        assert c.streams.video[0].codec_context.name == "h264"
        assert c.streams.audio[0].codec_context.name == "aac"
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == FRAMES == report["frames"]
    assert frames[0].shape == (h, w, 3)
    assert report["frame_size"] == [w, h]
    # The face region moves between frames (motion reached the renderer); corners are the
    # untouched avatar image (paste-back keeps the background).
    assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).max() > 0


def test_report_splits_ditto_timings_and_names_the_engine(rendered):
    _, report, cache = rendered
    assert DITTO_TIMINGS | {"total"} <= set(report["timings_ms"])
    assert all(v >= 0 for v in report["timings_ms"].values())
    eng = report["engine"]
    assert eng["name"] == "ditto" and eng["device"] == "cpu" and eng["steps"] == 2
    assert eng["memory"]["mode"] in {"resident", "streamed"} and eng["memory"]["batch"] >= 1
    precisions = {"warp_network": "fp32", "decoder": "fp32"}  # the CPU: no half kernels
    want = {"precision": precisions, "cuda_graphs": False, "compiled": False}
    want |= {"channel_pad": 0, "depth_split": False, "compiled_packages": ["off"]}
    want |= {"cudnn_autotune": False}  # a GPU's choice only
    assert eng["render"] == {"runtime": "torch", **want}
    assert report["settings"]["backend"] == "ditto"
    assert str(cache) in eng["avatar"]


def test_every_stage_of_a_ditto_render_shows_its_count_and_time(rendered, rendered_stderr):
    """Without a terminal: a line when each stage starts and one when it ends, in order."""
    _, report, _ = rendered
    text = rendered_stderr
    assert "\r" not in text and "\033" not in text
    n = report["frames"]
    ends = [
        r"registering avatar: 7/7 steps in \d",
        r"loading networks: 5/5 networks in \d",
        r"HuBERT features: 1/1 in \d",
        r"LMDM windows: (\d+)/\1 windows in \d",
        r"building engines: (\d+)/\1 in \d",
        rf"rendering frames: {n}/{n} frames in \d",
    ]
    found = [re.search(pattern, text, re.M) for pattern in ends]
    assert all(found), text
    assert [m.start() for m in found] == sorted(m.start() for m in found), text
    for start in ("registering avatar: 0/7 steps …", "loading networks: 0/5 networks …"):
        assert start in text
    assert f"rendering frames: 0/{n} frames …" in text
    assert re.search(r"^avatar \d+x\d+, eye features: .*registered", text, re.M)


def test_compile_on_the_cpu_is_ignored_with_a_note(rendered, rendered_stderr):
    _, report, _ = rendered
    (note,) = [line for line in rendered_stderr.splitlines() if "note:" in line]
    assert note.startswith("studio render: note: --compile is ignored on the CPU: ")
    assert "GPU" in note
    assert report["engine"]["render"]["compiled"] is False


def test_avatar_cache_is_reused_and_rebuilt_when_stale(ditto_assets, rendered, tmp_path, capsys):
    _, _, cache = rendered
    (folder,) = [p for p in cache.iterdir() if p.is_dir()]
    stamp = (folder / "meta.json").stat().st_mtime_ns
    code, _, err = _run(["analyze", *_ditto_args(ditto_assets, cache)], capsys)
    assert code == 0, err
    assert "reused from cache" in err and (folder / "meta.json").stat().st_mtime_ns == stamp

    # A changed checkpoint file makes the cached features stale: registered again.
    tree = shutil.copytree(ditto_assets["tree"], tmp_path / "tree")
    ext = tree / "ditto_pytorch/models/motion_extractor.pth"
    ext.write_bytes(ext.read_bytes() + b"\0")
    args = _ditto_args(ditto_assets, cache)
    args[1] = str(tree)
    code, _, err = _run(["analyze", *args], capsys)
    assert code == 0, err
    assert "registered" in err and "reused" not in err


@pytest.mark.parametrize(
    "remove, words",
    [
        ("ditto_pytorch/models/decoder.pth", ["decoder.pth", "decoder"]),
        ("ditto_pytorch/aux_models/det_10g.onnx", ["det_10g.onnx", "face detection"]),
        (
            "ditto_pytorch/aux_models/hubert_streaming_fix_kv.onnx",
            ["hubert_streaming_fix_kv.onnx", "audio"],
        ),
    ],
)
def test_missing_checkpoint_file_is_one_clear_line(ditto_assets, tmp_path, capsys, remove, words):
    tree = shutil.copytree(ditto_assets["tree"], tmp_path / "tree")
    (tree / remove).unlink()
    args = _ditto_args(ditto_assets, tmp_path / "avatars")
    args[1] = str(tree)
    out = tmp_path / "x.mp4"
    code, _, err = _run(["render", *args, "--out", str(out)], capsys)
    assert code != 0 and not out.exists()
    assert "Traceback" not in err
    for w in words:
        assert w in err, err


def test_ditto_options_need_checkpoints_and_an_avatar(ditto_assets, tmp_path, capsys):
    out = str(tmp_path / "x.mp4")
    code, _, err = _run(["render", "--avatar", str(ditto_assets["face"]), "--out", out], capsys)
    assert code != 0 and "--avatar" in err and "--checkpoints" in err
    code, _, err = _run(
        ["render", "--checkpoints", str(ditto_assets["tree"]), "--out", out], capsys
    )
    assert code != 0 and "--avatar" in err
    # A face too small to register is named with the file.
    from conftest import write_png

    from studio.fixtures.face_standins import face_image

    tiny = write_png(tmp_path / "tiny.png", face_image((300, 360), [(150, 150, 180, 180)]))
    args = _ditto_args(ditto_assets, tmp_path / "avatars")
    args[3] = str(tiny)
    code, _, err = _run(["render", *args, "--out", out], capsys)
    assert code != 0 and "tiny.png" in err and "Traceback" not in err


def test_render_on_the_onnxruntime_runtime_and_an_unavailable_one(
    ditto_assets, tmp_path, capsys, monkeypatch
):
    import importlib.util

    monkeypatch.setenv("STUDIO_ENGINE_CACHE", str(tmp_path / "engines"))  # exported afresh
    cache = tmp_path / "avatars"
    out, report = tmp_path / "ort.mp4", tmp_path / "ort.json"
    argv = ["render", *_ditto_args(ditto_assets, cache, "--runtime", "onnxruntime")]
    argv += ["--frame", "crop", "--size", "130", "--out", str(out), "--report", str(report)]
    code, _, err = _run([*argv, "--x264-preset", "ultrafast"], capsys)
    assert code == 0, err
    # Said before the cache is written: which network, for which runtime, about how big.
    for net in ("warp_network", "decoder"):
        assert re.search(
            rf"^exporting {net} to ONNX for ONNX Runtime \(≈ [\d.]+ [kMG]?B, once; batch \d+, "
            rf"fp32\) into {re.escape(str(tmp_path / 'engines' / 'onnx'))}$",
            err,
            re.M,
        ), err
    assert err.index("exporting warp_network") < err.index("rendering frames: 0/")
    assert err.index("building engines") < err.index("exporting warp_network")
    assert list((tmp_path / "engines" / "onnx").glob("warp_network.*.onnx"))
    render = json.loads(report.read_text())["engine"]["render"]
    assert render["runtime"] == "onnxruntime" and render["cuda_graphs"] is False
    with av.open(str(out)) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (130, 130)  # H % 4 == 2
    if importlib.util.find_spec("tensorrt") is None:
        bad = tmp_path / "trt.mp4"
        argv = ["render", *_ditto_args(ditto_assets, cache, "--runtime", "tensorrt")]
        code, _, err = _run([*argv, "--out", str(bad)], capsys)
        assert code == 2 and "--runtime" in err and "tensorrt is not importable" in err
        assert "Traceback" not in err and not bad.exists()
    fresh = tmp_path / "unused-cache"
    argv = ["render", *_ditto_args(ditto_assets, fresh, "--precision", "fp16")]
    code, _, err = _run([*argv, "--out", str(tmp_path / "fp16.mp4")], capsys)
    assert code == 2 and "--precision" in err and "fp16" in err
    assert not fresh.exists()  # refused before the avatar was registered


def test_export_onnx_shows_a_stage_with_counts(ditto_assets, tmp_path, capsys):
    out = tmp_path / "onnx"
    argv = ["export-onnx", "--checkpoints", str(ditto_assets["tree"]), "--out", str(out)]
    code, stdout, err = _run([*argv, "--networks", "stitch_network,decoder", "--no-verify"], capsys)
    assert code == 0, err
    assert "exporting networks: 0/2 networks …" in err
    assert re.search(r"^exporting networks: 2/2 networks in \d", err, re.M), err
    assert "stitch_network" in stdout and "\r" not in err


def test_compile_for_torch_needs_a_gpu_and_tensorrt_needs_out(ditto_assets, capsys):
    tree = str(ditto_assets["tree"])
    code, _, err = _run(["compile", "--runtime", "torch", "--checkpoints", tree], capsys)
    # what to do, not only that --device cuda (the default) is not here
    assert code == 2 and "compiled render engines run inside CUDA graphs" in err
    assert "built on a CUDA GPU; this machine has none" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(
        ["compile", "--runtime", "torch", "--checkpoints", tree, "--device", "cpu"], capsys
    )
    assert code == 2 and "compiled render engines run inside CUDA graphs" in err
    code, _, err = _run(["compile", "--runtime", "torch", "--checkpoints", "/nonexistent"], capsys)
    assert code == 2 and "/nonexistent" in err  # the folder before the device
    code, _, err = _run(["compile", "--checkpoints", tree], capsys)
    assert code == 2 and "--out" in err


def test_a_video_avatar_renders_onto_its_own_moving_frames(ditto_assets, tmp_path, capsys):
    """`--avatar talk.mp4`: every output frame is pasted onto the video's own frame (mirrored
    past its end), with cadence in-betweens; a video with a cut is one line, exit 2."""
    from conftest import drifting_face, write_video

    from studio.motion.condition import mirror_indices

    h, w = DITTO_FACE_HW
    shot = drifting_face(13, (140, 60, 220, 150), (h, w), step=2.0)  # its crop clears the foot
    shot = [f.copy() for f in shot + shot[::-1]]  # 26 frames: more than 1 s
    for i, f in enumerate(shot):  # a marker strip the face never covers: the frame's number
        f[-12:, :] = (i * 9, 255 - i * 9, 60)
    video = write_video(tmp_path / "talk.mp4", shot)
    args = _ditto_args(ditto_assets, tmp_path / "avatars")
    args[3] = str(video)
    out, report = tmp_path / "talk_out.mp4", tmp_path / "talk.json"
    argv = ["render", *args, "--out", str(out), "--report", str(report), "--stride", "2"]
    code, _, err = _run([*argv, "--x264-preset", "ultrafast"], capsys)
    assert code == 0, err
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == FRAMES and frames[0].shape == (h, w, 3)
    src = mirror_indices(np.arange(FRAMES), len(shot))
    for g, i in enumerate(src):  # each output frame shows its source frame's marker
        marker = frames[g][-8:, 40:-40].reshape(-1, 3).mean(axis=0)
        assert np.abs(marker - (i * 9, 255 - i * 9, 60)).max() < 6, (g, i, marker)
    assert re.search(rf"^avatar {w}x{h} video \(26 frames at 25 fps\)", err, re.M), err
    assert json.loads(report.read_text())["frames"] == FRAMES

    # transparent: the head over nothing, the video's frames gone (a PNG sequence's alpha)
    from PIL import Image

    seq = tmp_path / "talk_alpha.png"
    argv = ["render", *args, "--out", str(seq), "--background", "transparent", "--stride", "1"]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    pngs = sorted((tmp_path / "talk_alpha").glob("talk_alpha_*.png"))
    assert len(pngs) == FRAMES
    rgba = np.asarray(Image.open(pngs[7]))
    assert rgba.shape == (h, w, 4)
    assert rgba[-8:, :, 3].max() == 0  # the video's foot (its marker) is not drawn
    assert rgba[90:120, 150:210, 3].min() == 255  # the face, pasted at frame 7's crop

    cut = write_video(tmp_path / "cut.mp4", shot[:13] + [np.full((h, w, 3), 30, np.uint8)] * 13)
    args[3] = str(cut)
    bad = tmp_path / "cut_out.mp4"
    code, _, err = _run(["render", *args, "--out", str(bad)], capsys)
    assert code == 2 and "cut.mp4 has a cut at 0.52 s (frame 13)" in err
    assert "Traceback" not in err and not bad.exists()
