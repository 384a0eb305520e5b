"""Checkpoint discovery over dummy trees, and the restricted config unpickler."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import pickletools
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from conftest import PYTORCH_FILES, make_tree

from studio.errors import InputError
from studio.models import checkpoints as ck
from studio.models.checkpoints import NETWORKS, discover, load_cfg

ONNX_NAMES = (
    "appearance_extractor motion_extractor warp_network decoder stitch_network lmdm_v0.4_hubert "
    "hubert insightface_det landmark106 landmark203 blaze_face face_mesh"
).split()
ONNX_FILES = [f"ditto_onnx/{n}.onnx" for n in ONNX_NAMES] + [
    "ditto_onnx/libgrid_sample_3d_plugin.so"
]
FP32 = {"motion_extractor", "hubert", "lmdm_v0.4_hubert"}
TRT_FILES = [
    f"ditto_trt_Ampere_Plus/{n}_{'fp32' if n in FP32 else 'fp16'}.engine" for n in ONNX_NAMES
]
CFG_FILES = [
    "ditto_cfg/v0.4_hubert_cfg_trt.pkl",
    "ditto_cfg/v0.4_hubert_cfg_trt_online.pkl",
    "ditto_cfg/v0.4_hubert_cfg_pytorch.pkl",
]
ALL_FILES = PYTORCH_FILES + ONNX_FILES + TRT_FILES + CFG_FILES


# --- discovery -------------------------------------------------------------------------------


def test_full_release_is_complete(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ALL_FILES, b"abc")
    cs = discover(root)
    assert cs.root == root.resolve()
    assert cs.layouts() == ["pytorch", "onnx", "trt:ditto_trt_Ampere_Plus", "cfg"]
    for layout in cs.layouts():
        assert cs.complete(layout), layout
        assert cs.missing(layout) == []
    assert all(f.present and f.size == 3 for f in cs.files)
    assert cs.path("decoder") == root.resolve() / "ditto_pytorch/models/decoder.pth"
    for net in NETWORKS:
        assert cs.path(net, "onnx").suffix == ".onnx"
        assert cs.path(net, "trt").suffix == ".engine"
    assert cs.path("lmdm", "trt").name == "lmdm_v0.4_hubert_fp32.engine"
    assert cs.path("det_10g").name == "det_10g.onnx"  # alias of insightface_det
    assert cs.path("cfg_trt_online", "cfg").name == "v0.4_hubert_cfg_trt_online.pkl"
    assert "Complete layouts: pytorch, onnx, trt:ditto_trt_Ampere_Plus, cfg" in cs.report()
    assert "MISSING" not in cs.report() and "absent" not in cs.report()
    assert cs.complete_for_pytorch()
    assert cs.report().splitlines()[-1].startswith("Result: complete for PyTorch: `studio render")


def test_every_file_has_a_stage_and_every_stage_is_covered(tmp_path: Path) -> None:
    cs = discover(make_tree(tmp_path, ALL_FILES))
    assert {f.stage for f in cs.files} == set(ck.STAGES)
    expected = {(tmp_path.resolve() / rel) for rel in ALL_FILES}
    assert {f.path for f in cs.files} == expected
    assert len(cs.files) == len(ALL_FILES)


def test_missing_file_named_with_stage(tmp_path: Path) -> None:
    files = [f for f in PYTORCH_FILES if not f.endswith("decoder.pth")]
    cs = discover(make_tree(tmp_path, files))
    assert cs.layouts() == ["pytorch"]
    assert not cs.complete("pytorch")
    (miss,) = cs.missing("pytorch")
    assert (miss.stage, miss.role, miss.present, miss.size) == (
        "render / decoder",
        "decoder",
        False,
        None,
    )
    text = cs.report()
    assert "missing ditto_pytorch/models/decoder.pth (stage: render / decoder)" in text
    assert "MISSING  ditto_pytorch/models/decoder.pth" in text
    assert "onnx: not found" in text and "cfg: not found" in text
    assert "trt:ditto_trt_*: not found" in text
    assert "INCOMPLETE, 1 of 10 required missing" in text
    assert "Complete layouts: none" in text
    assert not cs.complete_for_pytorch()
    assert text.splitlines()[-1].startswith(
        "Result: NOT complete for PyTorch: `studio render` needs ditto_pytorch/models/decoder.pth;"
    )


def test_missing_aux_and_eye_models_per_layout(tmp_path: Path) -> None:
    drop = {"ditto_onnx/face_mesh.onnx", "ditto_onnx/hubert.onnx", "ditto_pytorch/aux_models/"}
    files = [f for f in PYTORCH_FILES + ONNX_FILES if not any(f.startswith(d) for d in drop)]
    cs = discover(make_tree(tmp_path, files))
    onnx = {(f.stage, f.role) for f in cs.missing("onnx")}
    assert onnx == {
        ("registration / eye landmarks (MediaPipe)", "face_mesh"),
        ("audio / HuBERT", "hubert"),
    }
    pt = {f.role for f in cs.missing("pytorch")}
    assert pt == {"insightface_det", "landmark106", "landmark203", "face_landmarker", "hubert"}
    assert {f.role for f in cs.missing_required("onnx")} == {"hubert"}  # face_mesh: optional
    text = cs.report()
    assert "missing ditto_onnx/hubert.onnx (stage: audio / HuBERT)" in text
    assert "absent   ditto_onnx/face_mesh.onnx  (optional: " in text
    assert "missing ditto_onnx/face_mesh.onnx" not in text  # not listed with required files
    assert "absent   ditto_pytorch/aux_models/face_landmarker.task  (optional: " in text
    assert "MISSING  ditto_pytorch/aux_models/det_10g.onnx" in text
    assert cs.complete("cfg") is True  # every config is optional; the layout is not here
    assert "cfg" not in cs.layouts()


def test_optional_files_leave_a_working_folder_complete_for_pytorch(tmp_path: Path) -> None:
    """What `studio render` reads is there; the MediaPipe task file and Ditto's TensorRT
    configs are not: complete for PyTorch, optional files named as such."""
    files = [f for f in PYTORCH_FILES if not f.endswith("face_landmarker.task")]
    cs = discover(make_tree(tmp_path, [*files, "ditto_cfg/v0.4_hubert_cfg_pytorch.pkl"]))
    assert cs.complete("pytorch") and cs.complete("cfg") and cs.complete_for_pytorch()
    assert [f.role for f in cs.missing("pytorch")] == ["face_landmarker"]
    assert cs.missing_required("pytorch") == []
    text = cs.report()
    assert "INCOMPLETE" not in text and "MISSING" not in text
    assert (
        "pytorch (ditto_pytorch/): complete (10 required files present); optional: 0 of 1" in text
    )
    assert "cfg (ditto_cfg/): 1 of 3 files present, all optional" in text
    assert "absent   ditto_cfg/v0.4_hubert_cfg_trt.pkl  (optional: used by Ditto's TensorRT" in text
    assert "eye features come from the 203 landmarks" in text
    assert "Complete layouts: pytorch, cfg" in text
    assert text.splitlines()[-1] == (
        f"Result: complete for PyTorch: `studio render --checkpoints {cs.root} "
        "--avatar FACE.png` can run from this folder"
    )
    d = json.loads(json.dumps(cs.to_dict()))
    assert d["complete_for_pytorch"] is True and d["missing_required"] == []
    assert d["complete"] == {"pytorch": True, "onnx": False, "cfg": True}
    assert set(d["missing_optional"]) == {
        "ditto_pytorch/aux_models/face_landmarker.task",
        "ditto_cfg/v0.4_hubert_cfg_trt.pkl",
        "ditto_cfg/v0.4_hubert_cfg_trt_online.pkl",
    }
    landmarker = next(f for f in d["files"] if f["role"] == "face_landmarker")
    assert landmarker["optional"] is True and "203 landmarks" in landmarker["note"]


def test_only_onnx_is_not_complete_for_pytorch(tmp_path: Path) -> None:
    cs = discover(make_tree(tmp_path, ONNX_FILES))
    assert cs.complete("onnx") and not cs.complete_for_pytorch()
    last = cs.report().splitlines()[-1]
    assert last.startswith("Result: NOT complete for PyTorch: `studio render` needs ditto_pytorch/")
    assert "which is not here" in last and "digital-avatar/ditto-talkinghead" in last


def test_the_required_pytorch_files_are_what_the_ditto_render_reads() -> None:
    """doctor's "complete for PyTorch" and the CLI's check before a render agree."""
    from studio.engines.ditto.engine import ALL_ROLES

    assert set(ck.PYTORCH_RENDER_ROLES) == set(ALL_ROLES)
    required = {r.role for r in ck.REQUIREMENTS if "pytorch" in r.files}
    required -= {role for role, kind in ck.OPTIONAL if kind == "pytorch"}
    assert required == set(ALL_ROLES)


def test_several_trt_folders_and_other_precision(tmp_path: Path) -> None:
    make_tree(tmp_path, TRT_FILES)
    custom = [f.replace("Ampere_Plus", "custom") for f in TRT_FILES]
    # A custom build may use the other precision; it is accepted in place of the released name.
    custom = [f.replace("decoder_fp16", "decoder_fp32") for f in custom]
    make_tree(tmp_path, [f for f in custom if not f.endswith("/hubert_fp32.engine")])
    cs = discover(tmp_path)
    assert cs.layouts() == ["trt:ditto_trt_Ampere_Plus", "trt:ditto_trt_custom"]
    assert cs.complete("trt:ditto_trt_Ampere_Plus")
    assert [f.role for f in cs.missing("trt:ditto_trt_custom")] == ["hubert"]
    assert cs.path("decoder", "trt:ditto_trt_custom").name == "decoder_fp32.engine"
    assert cs.trt_layouts()[0] == "trt:ditto_trt_Ampere_Plus"
    with pytest.raises(InputError, match=r"hubert_fp32\.engine is missing.*audio / HuBERT"):
        cs.path("hubert", "trt:ditto_trt_custom")
    assert "the warp engine may need ditto_onnx/libgrid_sample_3d_plugin.so" in cs.report()


@pytest.mark.parametrize(
    "pointed", ["", "checkpoints", "checkpoints/ditto_pytorch", "checkpoints/ditto_pytorch/models"]
)
def test_forgiving_root(tmp_path: Path, pointed: str) -> None:
    make_tree(tmp_path / "checkpoints", PYTORCH_FILES + CFG_FILES)
    (tmp_path / "core").mkdir()  # a Ditto checkout has other folders too
    cs = discover(tmp_path / pointed)
    assert cs.root == (tmp_path / "checkpoints").resolve()
    assert cs.complete("pytorch") and cs.complete("cfg")


def test_huggingface_cache_entry(tmp_path: Path) -> None:
    entry = tmp_path / "models--digital-avatar--ditto-talkinghead"
    make_tree(entry / "snapshots" / "0123abc", CFG_FILES)
    cs = discover(entry)
    assert cs.root == (entry / "snapshots" / "0123abc").resolve()
    assert cs.layouts() == ["cfg"]


def test_ambiguous_subfolders(tmp_path: Path) -> None:
    make_tree(tmp_path / "a", CFG_FILES)
    make_tree(tmp_path / "b", CFG_FILES)
    with pytest.raises(InputError, match="several folders"):
        discover(tmp_path)
    make_tree(tmp_path / "checkpoints", CFG_FILES)  # Ditto's own folder name wins
    assert discover(tmp_path).root.name == "checkpoints"


def test_bad_roots(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        discover(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InputError, match="is not a folder"):
        discover(tmp_path / "file.txt")
    (tmp_path / "unrelated").mkdir()
    with pytest.raises(InputError, match=r"no Ditto checkpoints in .*ditto_pytorch/, ditto_onnx/"):
        discover(tmp_path)
    (tmp_path / "ditto_onnx").mkdir()
    with pytest.raises(InputError, match="none of the expected files"):
        discover(tmp_path)


def test_path_errors(tmp_path: Path) -> None:
    cs = discover(make_tree(tmp_path, CFG_FILES))
    with pytest.raises(InputError) as err:
        cs.path("warp_network")
    msg = str(err.value)
    assert "ditto_pytorch/models/warp_network.pth is missing" in msg
    assert "stage: render / warp" in msg and "layout: pytorch" in msg
    assert "digital-avatar/ditto-talkinghead" in msg
    with pytest.raises(InputError, match="no TensorRT engine folder"):
        cs.path("decoder", "trt")
    with pytest.raises(ValueError, match="has no 'blaze_face'"):
        cs.path("blaze_face", "pytorch")
    with pytest.raises(ValueError, match="unknown checkpoint layout"):
        cs.complete("tensorflow")
    # a layout that was not found can still be asked what it needs
    assert len(cs.missing("trt:ditto_trt_Ampere_Plus")) == len(TRT_FILES)


def test_lfs_pointer_is_not_a_model(tmp_path: Path) -> None:
    make_tree(tmp_path, PYTORCH_FILES, b"weights")
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 123\n"
    (tmp_path / "ditto_pytorch/models/decoder.pth").write_bytes(pointer)
    cs = discover(tmp_path)
    (bad,) = cs.missing("pytorch")
    assert bad.present and bad.problem and "git lfs pull" in bad.problem
    with pytest.raises(InputError, match="Git LFS pointer"):
        cs.path("decoder")
    assert "BROKEN" in cs.report()


def test_to_dict_is_json(tmp_path: Path) -> None:
    cs = discover(make_tree(tmp_path, ONNX_FILES[:3]))
    d = json.loads(json.dumps(cs.to_dict()))
    assert d["layouts"] == ["onnx"]
    assert d["complete"]["onnx"] is False
    rel = {f["relpath"]: f["present"] for f in d["files"]}
    assert rel["ditto_onnx/appearance_extractor.onnx"] is True
    assert rel["ditto_onnx/decoder.onnx"] is False
    assert {"stage", "role", "layout", "path", "present", "size"} <= set(d["files"][0])


# --- config pickles --------------------------------------------------------------------------


def plausible_cfg() -> dict:
    return {
        "base_cfg": {
            "insightface_det_cfg": {
                "model_path": "./checkpoints/ditto_trt_Ampere_Plus/insightface_det_fp16.engine",
                "device": "cuda",
                "force_ori_type": False,
            },
            "landmark478_cfg": {
                "blaze_face_model_path": "blaze_face_fp16.engine",
                "face_mesh_model_path": "face_mesh_fp16.engine",
                "task_path": None,
                "device": "cuda",
                "force_ori_type": False,
            },
            "decoder_cfg": {"model_path": "decoder_fp16.engine", "device": "cuda"},
        },
        "audio2motion_cfg": {
            "model_path": "lmdm_v0.4_hubert_fp32.engine",
            "device": "cuda",
            "motion_feat_dim": 265,
            "audio_feat_dim": np.int64(1103),
            "seq_frames": 80,
            "use_emo": True,
            "use_sc": True,
            "use_eye_open": np.bool_(True),
            "use_eye_ball": True,
            "w2f_type": "hubert",
        },
        "default_kwargs": {
            "sampling_timesteps": 50,
            "overlap_v2": 10,
            "online_mode": False,
            "smo_k_d": np.int32(3),
            "crop_scale": np.float32(2.3),
            "v_min_max_for_clip": np.stack([np.full(265, -1.0), np.full(265, 1.0)]),
            "use_d_keys": ("exp", "pitch", "yaw", "roll", "t"),
            "fix_kp_cond_dim": [0, 202],
            "chunksize": (3, 5, 2),
            "misc": {"set": {1, 2}, "fs": frozenset({"a"}), "c": 1 + 2j, "raw": b"\x00\x01"},
            "fortran": np.asfortranarray(np.arange(6, dtype=np.float16).reshape(2, 3)),
            "objects": np.array([1, "a", None], dtype=object),
            "ordered": OrderedDict(a=1),
        },
    }


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_real_cfg_loads_under_every_protocol(tmp_path: Path, protocol: int) -> None:
    p = tmp_path / "cfg.pkl"
    p.write_bytes(pickle.dumps(plausible_cfg(), protocol=protocol))
    cfg = load_cfg(p)
    assert type(cfg) is dict
    assert set(cfg) == {"base_cfg", "audio2motion_cfg", "default_kwargs"}
    kw = cfg["default_kwargs"]
    np.testing.assert_array_equal(
        kw["v_min_max_for_clip"], plausible_cfg()["default_kwargs"]["v_min_max_for_clip"]
    )
    assert kw["fortran"].dtype == np.float16 and kw["fortran"][1, 2] == 5
    assert kw["objects"].tolist() == [1, "a", None]
    assert kw["crop_scale"] == np.float32(2.3) and isinstance(kw["crop_scale"], np.float32)
    assert kw["misc"] == {"set": {1, 2}, "fs": frozenset({"a"}), "c": 1 + 2j, "raw": b"\x00\x01"}
    assert ck.cfg_summary(cfg) == {
        "audio_feat_dim": 1103,
        "motion_feat_dim": 265,
        "seq_frames": 80,
        "w2f_type": "hubert",
        "use_emo": True,
        "use_eye_ball": True,
        "use_eye_open": True,
        "use_sc": True,
        "sampling_timesteps": 50,
        "overlap_v2": 10,
        "online_mode": False,
        "smo_k_d": 3,
    }
    json.dumps(ck.cfg_summary(cfg))


def test_numpy1_module_paths_are_accepted(tmp_path: Path) -> None:
    """A pickle written by numpy 1.x names numpy.core.*; rewrite one to check it loads."""
    data = pickle.dumps(plausible_cfg(), protocol=2)  # GLOBAL opcodes hold plain text names
    assert b"numpy._core.multiarray" in data
    old = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    p = tmp_path / "old.pkl"
    p.write_bytes(old)
    cfg = load_cfg(p)
    assert cfg["audio2motion_cfg"]["audio_feat_dim"] == 1103


def test_allowed_globals_are_what_numpy_emits() -> None:
    """The allow-list covers every global this numpy writes for arrays, dtypes and scalars."""
    seen = set()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for op, arg, _ in pickletools.genops(pickle.dumps(plausible_cfg(), protocol=protocol)):
            if op.name == "GLOBAL":
                seen.add(tuple(arg.split(" ")))
    seen = {("builtins" if m == "__builtin__" else m, n) for m, n in seen}
    assert seen <= set(ck._ALLOWED)


class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


class _Eval:
    def __reduce__(self):
        return (builtins.eval, ("__import__('os').getcwd()",))


class Custom:
    pass


def _cfg_with(payload: object) -> dict:
    cfg = plausible_cfg()
    cfg["default_kwargs"]["evil"] = payload
    return cfg


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_os_system_refused_without_running(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps(_cfg_with(_System(f"touch {marker}")), protocol=protocol))
    with pytest.raises(InputError) as err:
        load_cfg(p)
    assert not marker.exists()
    msg = str(err.value)
    assert msg.startswith(f"refusing to load {p}: it references os.system")
    assert "a config file never needs" in msg


@pytest.mark.parametrize(
    ("payload", "name"),
    [
        (_Eval(), "builtins.eval"),
        (Custom(), f"{__name__}.Custom"),
        (Path("x"), "pathlib"),
        (np.ma.masked_array([1, 2]), "numpy.ma"),
    ],
)
def test_other_globals_refused(tmp_path: Path, payload: object, name: str) -> None:
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps(_cfg_with(payload)))
    with pytest.raises(InputError, match=f"refusing to load .*evil.pkl: it references {name}"):
        load_cfg(p)


def test_subprocess_refused(tmp_path: Path) -> None:
    # Hand-written protocol-0 pickle: subprocess.Popen(("touch", marker)).
    marker = tmp_path / "pwned"
    data = f"csubprocess\nPopen\n((S'touch'\nS'{marker}'\nttR.".encode()
    p = tmp_path / "evil.pkl"
    p.write_bytes(data)
    with pytest.raises(InputError, match="it references subprocess.Popen"):
        load_cfg(p)
    assert not marker.exists()


def test_codecs_encode_only_latin1(tmp_path: Path) -> None:
    data = b"c_codecs\nencode\n(Vabc\nVrot13\ntR."
    p = tmp_path / "codec.pkl"
    p.write_bytes(data)
    with pytest.raises(InputError, match="not a valid config pickle"):
        load_cfg(p)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (pickle.dumps(plausible_cfg())[:-40], "not a valid config pickle"),
        (b"\x80\x04garbage", "not a valid config pickle"),
        (b"", "not a valid config pickle"),
        (pickle.dumps([1, 2, 3]), "holds a list, not the config dict"),
        (
            pickle.dumps({"base_cfg": {}, "default_kwargs": {}}),
            "lacks the config key.*audio2motion_cfg",
        ),
        (
            pickle.dumps({"base_cfg": {}, "audio2motion_cfg": [], "default_kwargs": {}}),
            "audio2motion_cfg should hold a dict",
        ),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\n", "Git LFS pointer"),
    ],
)
def test_bad_cfg_files(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "v0.4_hubert_cfg_trt.pkl"
    p.write_bytes(content)
    with pytest.raises(InputError, match=match) as err:
        load_cfg(p)
    assert str(p) in str(err.value)


def test_missing_cfg_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_cfg(tmp_path / "nope.pkl")


def test_cfg_summary_tolerates_sparse_cfg() -> None:
    assert ck.cfg_summary({"base_cfg": {}, "audio2motion_cfg": {}, "default_kwargs": {}}) == {}
