"""The hoisted LMDM step (per-window constants) against LMDM.guided_x0 at every step."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import random_biases

from studio.layout import MOTION_DIM, SEQ_FRAMES
from studio.models.lmdm import LMDM, REDUCED_KWARGS
from studio.motion.lmdm_hoist import (
    ALIGN,
    constants_of_condition,
    guided_x0_step,
    stacked_projections,
)


@pytest.mark.parametrize("kwargs", [REDUCED_KWARGS, {"num_layers": 2}], ids=["reduced", "wide"])
def test_hoisted_step_equals_guided_x0_at_every_step(kwargs, one_torch_thread) -> None:
    torch.manual_seed(0)
    model = random_biases(LMDM(**kwargs).eval())
    cond_frame = torch.randn(1, MOTION_DIM)
    cond = torch.randn(1, SEQ_FRAMES, model.cond_dim)
    times = torch.tensor([999, 749, 499, 249, 0])
    with torch.no_grad():
        consts = constants_of_condition(model, cond_frame, cond, times)
        assert consts.steps == times.numel()
        for k, t in enumerate(times.tolist()):
            x = torch.randn(1, SEQ_FRAMES, MOTION_DIM)
            want = model.guided_x0(x, cond_frame, cond, torch.tensor([t]))
            got = guided_x0_step(model, x, consts, k)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        # Another step's constants give another answer: the index really selects.
        other = guided_x0_step(model, x, consts, 0)
        assert not torch.allclose(other, want, atol=1e-3)


def test_motion_projection_is_aligned_and_step_names_its_attention_backend(one_torch_thread):
    """The step's input projection runs on an aligned (zero-padded) width; the SDPA backend
    is traced inside the step, so compiled code is not reused under another backend."""
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = random_biases(LMDM(**REDUCED_KWARGS).eval())
    cond_frame = torch.randn(1, MOTION_DIM)
    cond = torch.randn(1, SEQ_FRAMES, model.cond_dim)
    x = torch.randn(1, SEQ_FRAMES, MOTION_DIM)
    with torch.no_grad():
        consts = constants_of_condition(model, cond_frame, cond, torch.tensor([999, 0]))
        assert consts.projections.motion_weight.shape[1] == MOTION_DIM  # fp32: no padding
        half = stacked_projections(copy.deepcopy(model).to(torch.bfloat16))
        width = half.motion_weight.shape[1]
        assert width % ALIGN == 0 and MOTION_DIM < width < MOTION_DIM + ALIGN
        for w in (half.motion_weight, half.frame_weight, half.final_weight):
            assert w.is_contiguous()
        for w in (half.motion_weight, half.frame_weight, half.final_weight.T):
            assert w.shape[1] == width and torch.count_nonzero(w[:, MOTION_DIM:]) == 0
        assert half.final_bias.shape == (width,)
        assert torch.count_nonzero(half.final_bias[MOTION_DIM:]) == 0
        want = guided_x0_step(model, x, consts, 1)
        counter = CompileCounter()
        step = torch.compile(guided_x0_step, backend=counter, dynamic=False)
        torch._dynamo.reset()
        try:
            for backend in ("math", "flash", "math"):
                torch.testing.assert_close(
                    step(model, x, consts, 1, backend), want, rtol=1e-4, atol=1e-5
                )
            assert counter.frame_count == 2  # one trace per backend, the third call reused
            # and the backend really is restricted inside: the CPU has no efficient kernel
            for run in (guided_x0_step, step):
                with pytest.raises(RuntimeError):
                    run(model, x, consts, 1, "efficient")
        finally:
            torch._dynamo.reset()
        with pytest.raises(ValueError, match="unknown SDPA backend 'fast'"):
            guided_x0_step(model, x, consts, 1, "fast")
