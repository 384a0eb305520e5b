"""The folded LMDM step (projections inside the attentions) against the hoisted window step."""

from __future__ import annotations

import pytest
import torch
from conftest import random_biases

from studio.layout import MOTION_DIM, SEQ_FRAMES
from studio.models.lmdm import LMDM, REDUCED_KWARGS
from studio.motion.lmdm_fold import fold_window, folded_weights, folded_x0_step
from studio.motion.lmdm_hoist import ALIGN, constants_of_condition, guided_x0_step


def _constants(model: LMDM, times: torch.Tensor):
    cond_frame = torch.randn(1, MOTION_DIM)
    cond = torch.randn(1, SEQ_FRAMES, model.cond_dim)
    return constants_of_condition(model, cond_frame, cond, times)


@pytest.mark.parametrize("kwargs", [REDUCED_KWARGS, {"num_layers": 2}], ids=["reduced", "wide"])
def test_folded_step_equals_window_step(kwargs, one_torch_thread) -> None:
    torch.manual_seed(0)
    model = random_biases(LMDM(**kwargs).eval())
    times = torch.tensor([999, 499, 0])
    with torch.no_grad():
        consts = _constants(model, times)
        folded = fold_window(model, consts)
        weights = folded_weights(model)
        d = model.latent_dim
        assert folded.keys[0].shape[-1] % ALIGN == 0 and folded.keys[0].shape[-1] > d
        assert folded.values[0].shape[-1] == d
        assert folded.steps == 3
        for k in range(3):
            x = torch.randn(1, SEQ_FRAMES, MOTION_DIM)
            want = guided_x0_step(model, x, consts, k)
            got = folded_x0_step(model, x, folded, weights, k)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5)
        # The biases matter: dropping the key-bias channel changes the answer.
        folded.query_tail.zero_()
        assert not torch.allclose(folded_x0_step(model, x, folded, weights, 2), want, atol=1e-3)


def test_folded_weights_cast_from_fp32() -> None:
    torch.manual_seed(0)
    model = LMDM(**REDUCED_KWARGS).eval()
    exact = folded_weights(model)
    half = folded_weights(model, torch.bfloat16)
    assert half.value_out[0].dtype == torch.bfloat16
    d, heads = model.latent_dim, REDUCED_KWARGS["num_heads"]
    assert exact.value_out[0].shape == (heads * d, d)
    torch.testing.assert_close(half.value_out[0].float(), exact.value_out[0], rtol=2e-2, atol=2e-3)
