"""The GPT and its tying options, parameter counts and FLOPs, checked against independent arithmetic."""

import dataclasses
import math

import pytest
import torch
from torch.nn import functional as F

from tiedlm.config import ModelConfig
from tiedlm.model.blocks import GPT, count_params, load_model_tensors, model_tensors
from tiedlm.model.counting import count_params_config, flops_per_token

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, dropout=0.0)
V = 37


def gpt2_formula(V, d, L, T, tied, bias=True):
    """Independent GPT-2 count: embeddings + L blocks (qkv, proj, fc, proj, two LayerNorms) + ln_f."""
    b = 1 if bias else 0
    block = (3 * d * d + 3 * d * b) + (d * d + d * b) + (4 * d * d + 4 * d * b) + (4 * d * d + d * b) + 2 * (d + d * b)
    return V * d * (1 if tied else 2) + T * d + L * block + (d + d * b)


def test_tied_is_one_parameter_used_twice():
    m = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.is_tied
    u = GPT(dataclasses.replace(TINY, tie_embeddings=False), V)
    assert u.lm_head.weight is not u.transformer.wte.weight


def test_untied_minus_tied_is_V_times_d():
    t = count_params(GPT(dataclasses.replace(TINY, tie_embeddings=True), V))
    u = count_params(GPT(dataclasses.replace(TINY, tie_embeddings=False), V))
    assert u["total"] - t["total"] == V * TINY.n_embd
    assert t["saved_by_tying"] == V * TINY.n_embd and u["saved_by_tying"] == 0
    assert t["lm_head"] == 0 and u["lm_head"] == V * TINY.n_embd
    assert t["total"] == gpt2_formula(V, 16, 2, 8, tied=True)
    assert u["total"] == gpt2_formula(V, 16, 2, 8, tied=False)
    # the pieces add up
    for c in (t, u):
        assert c["total"] == c["wte"] + c["lm_head"] + c["wpe"] + c["non_embedding"]


@pytest.mark.parametrize("bias", [True, False])
def test_counts_match_formula_without_bias_and_with_head_bias(bias):
    cfg = dataclasses.replace(TINY, bias=bias, tie_embeddings=False, lm_head_bias=True)
    c = count_params(GPT(cfg, V))
    assert c["total"] == gpt2_formula(V, 16, 2, 8, tied=False, bias=bias) + V
    assert c["lm_head_bias"] == V


def test_gpt2_small_counts_match_design_figures():
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=True)
    tied = count_params_config(dataclasses.replace(cfg, tie_embeddings=True), 50257)
    untied = count_params_config(dataclasses.replace(cfg, tie_embeddings=False), 50257)
    assert tied["total"] == 124_439_808
    assert untied["total"] == 163_037_184
    assert round(100 * (untied["total"] - tied["total"]) / untied["total"], 1) == 23.7
    # nanoGPT's get_num_params(non_embedding=True) subtracts only wpe from the tied count
    assert tied["total"] - tied["wpe"] == 123_653_376


def test_tied_gradient_is_sum_of_both_uses():
    torch.manual_seed(0)
    tied = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    untied = GPT(dataclasses.replace(TINY, tie_embeddings=False), V)
    state = {k: v for k, v in tied.state_dict().items()}
    untied.load_state_dict(state)  # lm_head.weight = wte.weight, as separate copies
    assert torch.equal(untied.lm_head.weight, untied.transformer.wte.weight)
    x = torch.randint(0, V, (3, 8))
    y = torch.randint(0, V, (3, 8))
    for m in (tied, untied):
        F.cross_entropy(m(x).view(-1, V), y.view(-1)).backward()
    g_sum = untied.transformer.wte.weight.grad + untied.lm_head.weight.grad
    torch.testing.assert_close(tied.transformer.wte.weight.grad, g_sum, rtol=1e-5, atol=1e-7)
    # and the two uses really both contribute
    assert untied.transformer.wte.weight.grad.abs().sum() > 0 and untied.lm_head.weight.grad.abs().sum() > 0


def test_untie_gives_equal_independent_matrices():
    m = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    new = m.untie()
    assert not m.is_tied and m.lm_head.weight is new
    assert torch.equal(m.lm_head.weight, m.transformer.wte.weight)
    with torch.no_grad():
        m.lm_head.weight.add_(1.0)
    assert not torch.equal(m.lm_head.weight, m.transformer.wte.weight)


def test_tied_checkpoint_stores_one_matrix_and_reloads_tied(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(1)
    m = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    tensors, meta = model_tensors(m)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    stored = load_file(str(tmp_path / "m.safetensors"))
    vd = [k for k, v in stored.items() if tuple(v.shape) == (V, 16)]
    assert vd == ["transformer.wte.weight"]
    m2 = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    load_model_tensors(m2, stored, tied=True)
    assert m2.lm_head.weight is m2.transformer.wte.weight
    x = torch.randint(0, V, (2, 8))
    m.eval(), m2.eval()
    assert torch.equal(m(x), m2(x))


def test_load_refuses_mismatched_checkpoint():
    from tiedlm.errors import RunError

    m = GPT(dataclasses.replace(TINY, tie_embeddings=True), V)
    tensors, _ = model_tensors(m)
    other = GPT(dataclasses.replace(TINY, tie_embeddings=True), V + 1)
    with pytest.raises(RunError, match="does not fit"):
        load_model_tensors(other, tensors, tied=True)


def test_embed_scale_and_head_bias():
    torch.manual_seed(0)
    a = GPT(dataclasses.replace(TINY, embed_scale="1"), V)
    torch.manual_seed(0)
    b = GPT(dataclasses.replace(TINY, embed_scale="sqrt_d"), V)
    assert b.embed_scale == pytest.approx(4.0)
    x = torch.randint(0, V, (1, 8))
    assert not torch.allclose(a(x), b(x))
    c = GPT(dataclasses.replace(TINY, lm_head_bias=True, tie_embeddings=True), V)
    assert c.is_tied and c.lm_head.bias is not None and c.lm_head.bias.shape == (V,)


def test_init_std_follows_gpt2():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=64, tie_embeddings=False)
    m = GPT(cfg, 1000)
    assert m.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert m.transformer.h[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.05)
    assert m.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_flops_per_token_matches_torch_flop_counter():
    """Our matmul count against torch's own FLOP counter on a real forward pass."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, bias=False)
    for tied in (True, False):
        m = GPT(dataclasses.replace(cfg, tie_embeddings=tied), 50)
        x = torch.randint(0, 50, (2, 16))
        # the math backend runs attention as two batched matmuls the counter sees
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
            m(x)
        expected = flops_per_token(cfg, 50)["forward"]
        assert fc.get_total_flops() / (2 * 16) == pytest.approx(expected, rel=1e-9)


def test_flops_independent_arithmetic_gpt2_small():
    cfg = ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024)
    f = flops_per_token(cfg, 50257)
    # 2 FLOPs per weight of every matmul (85M non-embedding matmul weights + head) + attention
    matmul_weights = 12 * 12 * 768**2 + 50257 * 768
    assert f["forward"] == 2 * matmul_weights + 12 * 4 * 1024 * 768
    assert f["train"] == 3 * f["forward"]


def test_meta_device_counts_are_instant_for_large_models():
    cfg = ModelConfig(n_layer=48, n_head=25, n_embd=1600, block_size=1024)  # GPT-2 XL
    c = count_params_config(cfg, 50257)
    assert c["total"] == gpt2_formula(50257, 1600, 48, 1024, tied=True)
    assert c["total"] == 1_557_611_200


def test_tiedlm_s_layernorm_is_nn_layernorm_with_gradients_summed_by_column():
    """norms.LayerNorm (whose weight and bias gradients do not depend on the thread count) computes
    what nn.LayerNorm does: the same output, and the same gradients to float64 rounding."""
    import torch

    from tiedlm.model.norms import LayerNorm, _LayerNorm

    torch.manual_seed(0)
    for bias in (True, False):
        ours, ref = LayerNorm(8, bias=bias).double(), torch.nn.LayerNorm(8, bias=bias).double()
        with torch.no_grad():
            ours.weight.uniform_(0.5, 1.5)
            ref.weight.copy_(ours.weight)
            if bias:
                ours.bias.uniform_(-1, 1)
                ref.bias.copy_(ours.bias)
        x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
        g = torch.randn(3, 5, 8, dtype=torch.float64)
        got = torch.autograd.grad((ours(x) * g).sum(), [x, *ours.parameters()])
        want = torch.autograd.grad((ref(x) * g).sum(), [x, *ref.parameters()])
        assert torch.equal(ours(x), ref(x))
        for a, b in zip(got, want):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    w, b = (torch.randn(8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: _LayerNorm.apply(x, w, b, 1e-5), (x, w, b))
