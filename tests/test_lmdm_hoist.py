"""The hoisted LMDM step (per-window constants) against LMDM.guided_x0 at every step."""

from __future__ import annotations

import pytest
import torch
from conftest import random_biases

from studio.models.lmdm import LMDM, REDUCED_KWARGS
from studio.motion.layout import MOTION_DIM, SEQ_FRAMES
from studio.motion.lmdm_hoist import constants_of_condition, guided_x0_step


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
