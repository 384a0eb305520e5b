"""The Ditto engine's parts: LMDM clip motion, memory plan, precision, missing files."""

import numpy as np
import pytest
import torch

from studio.errors import InputError
from studio.models.random_tree import random_network, write_checkpoint_tree
from studio.motion.generator import generate_motion
from studio.motion.layout import COND_DIM, MOTION_DIM, OVERLAP_OFFLINE, SEQ_FRAMES
from studio.motion.windows import offline_starts
from studio.render.ditto import ENGINE_ROLES, plan_memory, render_dtype, require
from studio.runtime.checkpoints import discover

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lmdm():
    return random_network("lmdm", reduced=True, cond_dim=COND_DIM)


def test_clip_motion_shape_windows_and_seed(lmdm) -> None:
    n = 2 * (SEQ_FRAMES - OVERLAP_OFFLINE) + 17  # three windows, the last one padded
    cond = torch.randn(n, COND_DIM, generator=torch.Generator().manual_seed(1))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(2))
    seen = []
    a = generate_motion(lmdm, cond, kp, steps=3, seed=7, on_window=lambda d, t: seen.append((d, t)))
    assert a.shape == (n, MOTION_DIM) and torch.isfinite(a).all()
    windows = len(offline_starts(n))
    assert windows == 3 and seen == [(k + 1, windows) for k in range(windows)]
    b = generate_motion(lmdm, cond, kp, steps=3, seed=7)
    c = generate_motion(lmdm, cond, kp, steps=3, seed=8)
    assert torch.equal(a, b)  # reproducible from the seed
    assert not torch.allclose(a, c)  # and the seed matters
    d = generate_motion(lmdm, cond, kp, steps=1, seed=7)
    assert not torch.allclose(a, d)  # so do the steps


def test_clip_motion_reads_nothing_back(lmdm, host_reads) -> None:
    cond = torch.randn(SEQ_FRAMES + 5, COND_DIM)
    kp = torch.zeros(MOTION_DIM)
    lmdm.schedule(2)  # host-side constants, built once per step count
    with host_reads() as calls:
        generate_motion(lmdm, cond, kp, steps=2, seed=0)
    assert calls == []


def test_clip_motion_rejects_a_condition_of_the_wrong_width(lmdm) -> None:
    with pytest.raises(ValueError, match=f"\\[N, {COND_DIM}\\]"):
        generate_motion(lmdm, torch.zeros(10, 37), torch.zeros(MOTION_DIM), steps=2)


def test_memory_plan() -> None:
    cpu = plan_memory("auto", 0, torch.device("cpu"), torch.float32)
    assert (cpu.mode, cpu.batch) == ("resident", 4)
    assert plan_memory("streamed", 3, torch.device("cpu"), torch.float32).batch == 3
    gpu = torch.device("cuda")
    big = plan_memory("auto", 0, gpu, torch.float16, free_bytes=120 * 2**30)
    assert big.mode == "resident" and big.batch == 32 and "120.0 GiB" in big.reason
    small = plan_memory("auto", 0, gpu, torch.float16, free_bytes=3 * 2**30)
    assert small.mode == "streamed" and 1 <= small.batch <= 4
    fp32 = plan_memory("resident", 0, gpu, torch.float32, free_bytes=12 * 2**30)
    half = plan_memory("resident", 0, gpu, torch.float16, free_bytes=12 * 2**30)
    assert fp32.batch < half.batch  # half precision fits twice the frames
    assert plan_memory("resident", 5, gpu, torch.float16, free_bytes=2**30).batch == 5


def test_precision_choice() -> None:
    assert render_dtype("auto", torch.device("cpu")) == torch.float32
    assert render_dtype("auto", torch.device("cuda")) == torch.float16
    assert render_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(InputError, match="fp16 needs a GPU"):
        render_dtype("fp16", torch.device("cpu"))


def test_every_missing_file_is_named_with_its_stage(tmp_path) -> None:
    write_checkpoint_tree(tmp_path, reduced=True, networks=["lmdm", "decoder"], cfg=False)
    with pytest.raises(InputError) as err:
        require(discover(tmp_path), ENGINE_ROLES)
    msg = str(err.value)
    for name, stage in (
        ("aux_models/hubert_streaming_fix_kv.onnx", "audio / HuBERT"),
        ("models/stitch_network.pth", "render / stitching"),
        ("models/warp_network.pth", "render / warp"),
    ):
        assert f"missing ditto_pytorch/{name} (stage: {stage})" in msg
    assert "lmdm_v0.4_hubert.pth" not in msg and "decoder.pth" not in msg
    assert np.char.count(msg, "missing ") == 3
