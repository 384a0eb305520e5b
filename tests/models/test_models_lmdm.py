"""LMDM: checkpoint layout, op order against a hand-written reference, guidance, sampling, ONNX."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from studio.layout import GUIDANCE_WEIGHT, MOTION_DIM, SEQ_FRAMES
from studio.models import diffusion as D
from studio.models import lmdm as L


def _manifest_path() -> Path | None:
    name = "ditto_state_dicts.json"
    for root in (
        Path(__file__).resolve().parents[3] / "shared" / "reference",
        Path("/work/shared/reference"),
    ):
        if (root / name).is_file():
            return root / name
    return None


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def manifest() -> dict:
    path = _manifest_path()
    if path is None:
        pytest.skip("shared/reference/ditto_state_dicts.json is not available")
    return json.loads(path.read_text())["networks"]["lmdm"]


@pytest.fixture(scope="module")
def full_model() -> L.LMDM:
    return L.LMDM().eval()


def _reduced_kwargs_without_cond() -> dict[str, int]:
    return {k: v for k, v in L.REDUCED_KWARGS.items() if k != "cond_dim"}


def _randomized(seed: int = 0, **kwargs: int) -> L.LMDM:
    """A reduced model whose biases and norm parameters are non-trivial too."""
    torch.manual_seed(seed)
    model = L.LMDM(**{**L.REDUCED_KWARGS, **kwargs}).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def reduced() -> L.LMDM:
    return _randomized()


def _inputs(model: L.LMDM, batch: int = 1, seed: int = 1, t: int = 500):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, SEQ_FRAMES, MOTION_DIM, generator=g)
    cond_frame = torch.randn(batch, MOTION_DIM, generator=g)
    cond = torch.randn(batch, SEQ_FRAMES, model.cond_dim, generator=g)
    return x, cond_frame, cond, torch.full((batch,), t, dtype=torch.int64)


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# --- a hand-written reference of the op order (spec: ditto-reference §4.1-4.3) ----------


def _rotate_ref(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (2i, 2i+1) rotated by p * f_i, positions p = 0..L-1."""
    pos = torch.arange(x.shape[-2], dtype=torch.float32)
    ang = pos[:, None] * freqs[None, :]
    cos, sin = ang.cos(), ang.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def _mha_ref(attn: L.MultiheadAttention, q, k, v) -> torch.Tensor:
    """torch's own nn.MultiheadAttention math on the packed weights (batch first in/out)."""
    out, _ = F.multi_head_attention_forward(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn.dim,
        attn.num_heads,
        attn.in_proj_weight,
        attn.in_proj_bias,
        None,
        None,
        False,
        0.0,
        attn.out_proj.weight,
        attn.out_proj.bias,
        training=False,
        need_weights=False,
    )
    return out.transpose(0, 1)


def _reference_pass(m: L.LMDM, x, cond_frame, cond, time_cond, drop: bool) -> torch.Tensor:
    freqs = m.rotary.freqs
    d, b = m.latent_dim, x.shape[0]
    h = m.input_projection(torch.cat([x, cond_frame[:, None].repeat(1, x.shape[1], 1)], -1))
    if drop:
        tokens = m.null_cond_embed.expand(b, -1, -1)
        hidden = m.null_cond_hidden
    else:
        c = m.cond_projection(cond)
        for layer in m.cond_encoder:
            n = layer.norm1(c)
            r = _rotate_ref(n, freqs)
            c = c + _mha_ref(layer.self_attn, r, r, n)
            c = c + layer.linear2(F.gelu(layer.linear1(layer.norm2(c))))
        tokens, hidden = c, m.non_attn_cond_projection(c.mean(1))
    half = d // 2
    f = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / (half - 1))
    ang = time_cond.float()[:, None] * f[None]
    t_hidden = F.mish(m.time_mlp[1](torch.cat([ang.sin(), ang.cos()], -1)))
    t_vec = m.to_time_cond[0](t_hidden) + hidden
    time_tokens = m.to_time_tokens[0](t_hidden).reshape(b, 2, d)
    mem = m.norm_cond(torch.cat([tokens, time_tokens], 1))

    def film(module, y):
        ss = module.block[1](F.mish(t_vec))
        return (1 + ss[:, None, :d]) * y + ss[:, None, d:]

    for layer in m.seqTransDecoder.stack:
        n = layer.norm1(h)
        r = _rotate_ref(n, freqs)
        h = h + film(layer.film1, _mha_ref(layer.self_attn, r, r, n))
        n = layer.norm2(h)
        a = _mha_ref(layer.multihead_attn, _rotate_ref(n, freqs), _rotate_ref(mem, freqs), mem)
        h = h + film(layer.film2, a)
        h = h + film(layer.film3, layer.linear2(F.gelu(layer.linear1(layer.norm3(h)))))
    return m.final_layer(h)


# --- checkpoint layout ----------------------------------------------------------------


def test_state_dict_matches_manifest_exactly(full_model, manifest):
    sd = full_model.state_dict()
    want = [(e["key"], tuple(e["shape"]), e["dtype"]) for e in manifest["state_dict"]]
    got = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in sd.items()]
    assert got == want
    assert len(sd) == manifest["state_dict_num_keys"] == 249
    assert sum(p.numel() for p in full_model.parameters()) == manifest["param_count"]
    assert sum(v.numel() for v in sd.values()) == manifest["state_dict_numel"]
    buffers = {k for k, _ in full_model.named_buffers(remove_duplicate=False)}
    kinds = {e["key"]: e["kind"] for e in manifest["state_dict"]}
    assert {k for k, v in kinds.items() if v == "buffer"} == buffers & set(kinds)
    rotary = [v for k, v in sd.items() if k.endswith("rotary.freqs")]
    assert len(rotary) == 11 and len({v.data_ptr() for v in rotary}) == 1
    ref = 1.0 / 10000 ** (torch.arange(0, 512, 2).float() / 512)
    torch.testing.assert_close(rotary[0], ref, rtol=0, atol=0)


def test_released_shapes_load_strictly(full_model, manifest):
    g = torch.Generator().manual_seed(0)
    sd = {
        e["key"]: torch.randn(e["shape"], generator=g, dtype=getattr(torch, e["dtype"]))
        for e in manifest["state_dict"]
    }
    freqs = 1.0 / 10000 ** (torch.arange(0, 512, 2).float() / 512)
    for k in sd:
        if k.endswith("rotary.freqs"):
            sd[k] = freqs.clone()
    result = full_model.load_state_dict(sd, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(full_model.final_layer.bias, sd["final_layer.bias"])
    assert full_model.cond_dim == L.RELEASED_COND_DIM == L.cond_dim_from_state_dict(sd)


def test_container_round_trip_is_strict_and_exact(reduced, tmp_path):
    path = tmp_path / "lmdm.pth"
    torch.save({"model_state_dict": reduced.state_dict(), "optimizer": {"lr": 1e-4}}, path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    loaded = L.LMDM.from_state_dict(ckpt, **_reduced_kwargs_without_cond())
    inputs = _inputs(reduced)
    with torch.no_grad():
        for a, b in zip(loaded(*inputs), reduced(*inputs), strict=True):
            assert torch.equal(a, b)
    fresh = L.LMDM(**L.REDUCED_KWARGS)
    fresh.load_state_dict(ckpt["model_state_dict"], strict=True)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fresh.load_state_dict({**ckpt["model_state_dict"], "model.extra": torch.zeros(1)})


def test_cond_width_is_read_from_the_checkpoint(tmp_path):
    model = L.LMDM(**{**L.REDUCED_KWARGS, "cond_dim": 37})
    path = tmp_path / "c37.pth"
    torch.save({"model_state_dict": model.state_dict()}, path)
    ckpt = torch.load(path, weights_only=True)
    assert L.cond_dim_from_state_dict(ckpt) == 37
    assert L.cond_dim_from_state_dict(ckpt["model_state_dict"]) == 37
    assert L.LMDM.from_state_dict(ckpt, **_reduced_kwargs_without_cond()).cond_dim == 37
    with pytest.raises(KeyError, match="cond_projection.weight"):
        L.cond_dim_from_state_dict({"final_layer.weight": torch.zeros(265, 64)})


def test_rotary_tables_follow_loaded_freqs(reduced):
    model = L.LMDM(**L.REDUCED_KWARGS)
    sd = reduced.state_dict()
    sd = {k: (v * 0.5 if k.endswith("rotary.freqs") else v) for k, v in sd.items()}
    model.load_state_dict(sd)
    x = torch.randn(1, SEQ_FRAMES + 2, model.latent_dim)
    torch.testing.assert_close(model.rotary(x), _rotate_ref(x, model.rotary.freqs))


# --- op order ---------------------------------------------------------------------------


def test_rotary_is_interleaved_and_per_sequence(reduced):
    rot = reduced.rotary
    d = reduced.latent_dim
    x = torch.randn(2, SEQ_FRAMES + 2, d)
    torch.testing.assert_close(rot(x), _rotate_ref(x, rot.freqs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rot(x)[:, :SEQ_FRAMES], rot(x[:, :SEQ_FRAMES]), rtol=0, atol=0)
    e0 = torch.zeros(1, 2, d)
    e0[..., 0] = 1.0  # dim 0 at position 1 turns by f_0 = 1 rad into dim 1
    out = rot(e0)[0, 1]
    torch.testing.assert_close(out[:2], torch.tensor([math.cos(1.0), math.sin(1.0)]))
    assert out[2:].abs().max() == 0


def test_time_embedding_is_sin_half_then_cos_half(reduced):
    t = torch.tensor([0, 19, 999])
    emb = reduced.time_mlp[0](t)
    half = reduced.latent_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    ang = t[:, None].double() * torch.exp(-i * math.log(10000) / (half - 1))
    # float32 angles (as the reference computes them) are off by up to ~1e-4 rad at t = 999
    torch.testing.assert_close(
        emb, torch.cat([ang.sin(), ang.cos()], -1).float(), atol=2e-4, rtol=0
    )
    assert torch.equal(emb[0], torch.cat([torch.zeros(half), torch.ones(half)]))


def test_rotary_is_applied_before_the_in_projection(reduced):
    """Encoder layer against a hand-written block: rotate tokens, then project q/k/v."""
    layer = reduced.cond_encoder[0]
    attn = layer.self_attn
    d, heads = attn.dim, attn.num_heads
    x = torch.randn(2, SEQ_FRAMES, d, generator=torch.Generator().manual_seed(3))
    w, b = attn.in_proj_weight, attn.in_proj_bias

    def split(t):
        return t.reshape(2, SEQ_FRAMES, heads, d // heads).transpose(1, 2)

    def attend(q, k, v):
        o = F.scaled_dot_product_attention(split(q), split(k), split(v))
        return attn.out_proj(o.transpose(1, 2).reshape(2, SEQ_FRAMES, d))

    def ff(y):
        return y + layer.linear2(F.gelu(layer.linear1(layer.norm2(y))))

    with torch.no_grad():
        n = layer.norm1(x)
        r = _rotate_ref(n, reduced.rotary.freqs)
        q, k = F.linear(r, w[:d], b[:d]), F.linear(r, w[d : 2 * d], b[d : 2 * d])
        v = F.linear(n, w[2 * d :], b[2 * d :])
        expected = ff(x + attend(q, k, v))
        q_late = _rotate_ref(F.linear(n, w[:d], b[:d]), reduced.rotary.freqs)
        k_late = _rotate_ref(F.linear(n, w[d : 2 * d], b[d : 2 * d]), reduced.rotary.freqs)
        wrong = ff(x + attend(q_late, k_late, v))
        got = layer(x)
        torch_mha = _mha_ref(attn, r, r, n)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn(r, r, n), torch_mha, rtol=1e-5, atol=1e-5)
    assert _rel_l2(wrong, expected) > 1e-2


@pytest.mark.parametrize("drop", [False, True])
def test_single_pass_matches_hand_written_reference(reduced, drop):
    inputs = _inputs(reduced, batch=2)
    with torch.no_grad():
        got = reduced.single_pass(*inputs, drop_cond=drop)
        want = _reference_pass(reduced, *inputs, drop=drop)
    assert _rel_l2(got, want) < 1e-5


# --- guidance ------------------------------------------------------------------------------


def test_guidance_formula_from_the_two_passes(reduced):
    inputs = _inputs(reduced, batch=2, t=250)
    with torch.no_grad():
        uncond = reduced.single_pass(*inputs, drop_cond=True)
        cond = reduced.single_pass(*inputs, drop_cond=False)
        want = uncond + (cond - uncond) * GUIDANCE_WEIGHT
        reduced.batch_guidance = False
        try:
            sequential = reduced.guided_x0(*inputs)
        finally:
            reduced.batch_guidance = True
        batched = reduced.guided_x0(*inputs)
        pred_noise, x_start = reduced(*inputs)
    assert GUIDANCE_WEIGHT == 2
    assert torch.equal(sequential, want)
    torch.testing.assert_close(batched, sequential, rtol=1e-5, atol=1e-5)
    assert torch.equal(x_start, batched)
    ac = D.alphas_cumprod()
    assert torch.equal(
        pred_noise, D.predict_noise_from_start(inputs[0], inputs[3], x_start, D.noise_tables(ac))
    )
    a = ac[inputs[3]].reshape(-1, 1, 1)
    eps = (inputs[0] - a.sqrt() * x_start) / (1 - a).sqrt()
    torch.testing.assert_close(pred_noise, eps, rtol=1e-4, atol=1e-4)


def test_guide_combines_in_fp32_and_a_half_copy_runs_its_own_dtype(reduced):
    """:func:`guide` is the one guidance combination (in fp32, whatever the branches' dtype);
    a bf16 copy of the module casts its inputs itself, returns fp32, and predicts the noise
    from the fp32 ``x`` it was given."""
    import copy

    g = torch.Generator().manual_seed(0)
    uncond, cond = (torch.randn(2, 3, generator=g).bfloat16() for _ in range(2))
    got = L.guide(uncond, cond)
    assert got.dtype == torch.float32
    assert torch.equal(got, uncond.float() + (cond.float() - uncond.float()) * GUIDANCE_WEIGHT)
    same = torch.randn(2, 3, generator=g)
    assert L.cast_to(same, torch.float32) is same  # no cast (nothing traced) in fp32

    half = copy.deepcopy(reduced).to(torch.bfloat16)
    inputs = _inputs(reduced, batch=2, t=250)
    with torch.no_grad():
        pred_noise, x_start = half(*inputs)
        ref_noise, ref_x0 = reduced(*inputs)
    assert pred_noise.dtype == x_start.dtype == torch.float32
    tables = half.noise_tables.float()
    assert torch.equal(
        pred_noise, D.predict_noise_from_start(inputs[0], inputs[3], x_start, tables)
    )
    cos = F.cosine_similarity(x_start.flatten(), ref_x0.flatten(), dim=0)
    assert cos > 0.99


def test_skipping_the_encoder_in_the_uncond_pass_is_exact(reduced):
    x, cond_frame, cond, t = _inputs(reduced, batch=2)
    with torch.no_grad():
        # The reference: run the encoder, then overwrite its outputs with the null ones.
        tokens, hidden = reduced.encode_condition(cond)
        keep = torch.zeros(2, dtype=torch.bool)
        tokens = torch.where(keep[:, None, None], tokens, reduced.null_cond_embed)
        hidden = reduced.non_attn_cond_projection(tokens.mean(dim=-2))
        hidden = torch.where(keep[:, None], hidden, reduced.null_cond_hidden)
        t_vec, time_tokens = reduced.time_embedding(t)
        want = reduced.decode(
            reduced.embed_motion(x, cond_frame), t_vec, time_tokens, tokens, hidden
        )
        got = reduced.single_pass(x, cond_frame, cond, t, drop_cond=True)
        other_cond = reduced.single_pass(x, cond_frame, cond * 3.0, t, drop_cond=True)
    assert torch.equal(got, want)
    assert torch.equal(got, other_cond)


# --- interface --------------------------------------------------------------------------------


def test_forward_shapes_dtypes_and_time_cond(reduced):
    for batch in (1, 2):
        inputs = reduced.example_inputs(batch)
        assert [tuple(t.shape) for t in inputs] == [
            (batch, SEQ_FRAMES, MOTION_DIM),
            (batch, MOTION_DIM),
            (batch, SEQ_FRAMES, reduced.cond_dim),
            (batch,),
        ]
        assert [t.dtype for t in inputs] == [torch.float32] * 3 + [torch.int64]
        with torch.no_grad():
            outputs = reduced(*inputs)
        assert len(outputs) == len(L.OUTPUT_NAMES) == 2
        for out in outputs:
            assert out.shape == (batch, SEQ_FRAMES, MOTION_DIM) and out.dtype == torch.float32
            assert torch.isfinite(out).all()
    x, cf, c, t = reduced.example_inputs(1)
    with torch.no_grad():
        as_int32 = reduced(x, cf, c, t.to(torch.int32))
        as_int64 = reduced(x, cf, c, t)
    assert all(torch.equal(a, b) for a, b in zip(as_int32, as_int64, strict=True))
    assert L.INPUT_NAMES == ("x", "cond_frame", "cond", "time_cond")
    with pytest.raises(TypeError, match="integer"):
        reduced(x, cf, c, t.float())
    with pytest.raises(ValueError, match="cond must be"):
        reduced(x, cf, c[..., :-1], t)
    with pytest.raises(ValueError, match="x must be"):
        reduced(x[:, :-1], cf, c, t)


def test_guidance_is_independent_per_batch_item(reduced):
    x, cf, c, t = _inputs(reduced, batch=2)
    t = torch.tensor([999, 19])
    with torch.no_grad():
        both = reduced(x, cf, c, t)
        for i in range(2):
            one = reduced(x[i : i + 1], cf[i : i + 1], c[i : i + 1], t[i : i + 1])
            for a, b in zip(one, both, strict=True):
                assert _rel_l2(a[0], b[i]) < 1e-5


# --- sampling ----------------------------------------------------------------------------------


def test_ddim_sample_replays_and_matches_the_reference_loop(reduced):
    steps = 3
    sched = D.make_schedule(steps)
    g = torch.Generator().manual_seed(7)
    kp = torch.randn(MOTION_DIM, generator=g)
    aud = torch.randn(SEQ_FRAMES, reduced.cond_dim, generator=g)
    x_t, noises = D.draw_noises(sched, (1, SEQ_FRAMES, MOTION_DIM), g)

    first = reduced.ddim_sample(kp, aud, steps, x_T=x_t, noises=noises).clone()
    again = reduced.ddim_sample(kp[None], aud[None], steps, x_T=x_t, noises=noises)
    assert first.shape == (1, SEQ_FRAMES, MOTION_DIM)
    assert torch.equal(first, again)

    with torch.no_grad():
        ref = D.ddim_sample(lambda x, t: reduced(x, kp[None], aud[None], t), x_t, noises, sched)
    assert torch.equal(first, ref)

    other = reduced.ddim_sample(kp, aud, steps, x_T=x_t, noises=torch.randn_like(noises))
    assert _rel_l2(other, first) > 1e-3

    seeded = reduced.ddim_sample(kp, aud, steps, generator=torch.Generator().manual_seed(11))
    drawn = D.draw_noises(sched, (1, SEQ_FRAMES, MOTION_DIM), torch.Generator().manual_seed(11))
    assert torch.equal(seeded, reduced.ddim_sample(kp, aud, steps, *drawn))


def test_ddim_sample_reads_nothing_back_to_host(reduced, host_reads):
    """Given x_T and noises (and a cached schedule), the loop never syncs with the host."""
    steps = 3
    sched = reduced.schedule(steps)
    kp = torch.randn(1, MOTION_DIM)
    aud = torch.randn(1, SEQ_FRAMES, reduced.cond_dim)
    x_t, noises = D.draw_noises(sched, (1, SEQ_FRAMES, MOTION_DIM), torch.Generator())
    with host_reads() as calls:
        out = reduced.ddim_sample(kp, aud, steps, x_T=x_t, noises=noises)
    assert calls == [] and out.shape == (1, SEQ_FRAMES, MOTION_DIM)


# --- ONNX ------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the brief's exporter is dynamo=False
def test_onnx_export_matches_onnxruntime(reduced, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    path = tmp_path / "lmdm.onnx"
    with torch.no_grad():
        torch.onnx.export(
            reduced,
            reduced.example_inputs(),
            str(path),
            input_names=list(L.INPUT_NAMES),
            output_names=list(L.OUTPUT_NAMES),
            opset_version=20,
            dynamo=False,
        )
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == list(L.INPUT_NAMES)
    assert [o.name for o in graph.output] == list(L.OUTPUT_NAMES)
    assert graph.input[3].type.tensor_type.elem_type == onnx.TensorProto.INT64
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    # the traced example and fresh inputs at other timesteps: nothing input-dependent is baked in
    for inputs in (
        reduced.example_inputs(),
        _inputs(reduced, seed=5, t=979),
        _inputs(reduced, t=19),
    ):
        with torch.no_grad():
            want = reduced(*inputs)
        feed = {n: t.numpy() for n, t in zip(L.INPUT_NAMES, inputs, strict=True)}
        for got, ref in zip(sess.run(None, feed), want, strict=True):
            assert _rel_l2(torch.from_numpy(got), ref) <= 1e-4
