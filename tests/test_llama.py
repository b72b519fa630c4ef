"""The Llama-style block (model.arch: llama): its pieces against arithmetic written out here,
grouped-query attention against multi-head attention with repeated keys and values, every tie
mode, the config's rules, and training with a bit-identical resume."""

import itertools
import json
import math

import pytest
import torch
from torch.nn import functional as F

from tiedlm.config import ModelConfig
from tiedlm.config.identity import config_hash
from tiedlm.config import load_config as _load
from tiedlm.errors import ConfigError, Interrupted
from tiedlm.model.blocks import GPT, count_params, rotary_tables, rotate
from tiedlm.model.counting import count_params_config
from tiedlm.train import train_run

from .test_train import metric_rows, weights

LLAMA = dict(arch="llama", n_layer=2, n_head=4, n_embd=32, block_size=16, bias=False)


def build(seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig(**{**LLAMA, **kw}), 61)


def ids(seed=1, T=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 61, (3, T), generator=g)


def test_a_llama_model_has_no_position_matrix_biases_or_layernorm():
    m = build()
    names = dict(m.named_parameters())
    assert "transformer.wpe.weight" not in names
    assert not any(n.endswith(".bias") for n in names)
    assert all(not isinstance(x, torch.nn.LayerNorm) for x in m.modules())
    assert sum(isinstance(x, torch.nn.RMSNorm) for x in m.modules()) == 2 * 2 + 1  # two a block and the final one
    assert m.is_tied and not any("rope" in k for k in m.state_dict())  # the rotary tables are not weights


def test_the_final_norm_is_rmsnorm_by_hand():
    m = build()
    with torch.no_grad():
        m.transformer.ln_f.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    w = m.transformer.ln_f.weight.double()
    by_hand = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * w
    assert torch.allclose(m.transformer.ln_f(x.float()).double(), by_hand, atol=1e-6)


def test_rotary_tables_are_position_times_inverse_frequency():
    cos, sin = rotary_tables(8, 5, 10000.0)
    for pos, i in itertools.product(range(5), range(4)):
        angle = pos * 10000.0 ** (-2 * i / 8)
        assert cos[pos, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
        assert sin[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)


def test_rotation_keeps_norms_and_makes_scores_depend_on_the_offset_only():
    cos, sin = rotary_tables(16, 12, 10000.0)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    at = lambda x, p: rotate(x.view(1, 1, 1, 16), cos[p].double(), sin[p].double()).view(16)  # noqa: E731
    assert torch.allclose(at(q, 7).norm(), q.norm())
    score = lambda m, n: float(at(q, m) @ at(k, n))  # noqa: E731
    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5) == pytest.approx(score(3, 0), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    # dimension i turns with dimension i + hs/2 (transformers' layout), by angle pos·θ^(-2i/hs)
    e0 = torch.zeros(16, dtype=torch.float64)
    e0[0] = 1.0
    turned = at(e0, 3)
    assert turned[0].item() == pytest.approx(math.cos(3.0)) and turned[8].item() == pytest.approx(math.sin(3.0))


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_attention_is_multi_head_attention_with_shared_keys_and_values(n_kv_head):
    """A GQA model equals the multi-head model whose k and v heads are copies: query head j reads
    key/value head j // (n_head / n_kv_head)."""
    gqa = build(n_kv_head=n_kv_head)
    mha = build(seed=5)
    hs, rep = 8, 4 // n_kv_head
    sd = gqa.state_dict()
    for i in range(2):
        w = sd[f"transformer.h.{i}.attn.c_attn.weight"]
        q, k, v = w.split([32, n_kv_head * hs, n_kv_head * hs])
        spread = lambda t: t.view(n_kv_head, hs, 32).repeat_interleave(rep, 0).reshape(32, 32)  # noqa: E731
        sd[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([q, spread(k), spread(v)])
    mha.load_state_dict(sd)
    x = ids()
    with torch.no_grad():
        assert torch.allclose(gqa(x), mha(x), atol=1e-6)
    assert count_params(gqa)["total"] == count_params(mha)["total"] - 2 * 2 * (32 - n_kv_head * hs) * 32


def test_swiglu_is_down_of_silu_gate_times_up():
    m = build(intermediate_size=24)
    mlp = m.transformer.h[0].mlp
    x = torch.randn(2, 3, 32)
    gate, up = mlp.c_fc.weight[:24], mlp.c_fc.weight[24:]
    by_hand = (F.silu(x @ gate.T) * (x @ up.T)) @ mlp.c_proj.weight.T
    assert torch.allclose(mlp(x), by_hand, atol=1e-6)


def test_the_intermediate_size_rule():
    """8/3·d, truncated as Llama truncates it, rounded up to a multiple of model.multiple_of."""
    at = lambda d, m=64, **kw: ModelConfig(**{**LLAMA, "n_embd": d, "multiple_of": m, **kw}).mlp_size  # noqa: E731
    assert at(32) == 128  # int(85.3) = 85 -> 128
    assert at(128) == 384  # int(341.3) = 341 -> 384
    assert at(4096, 256) == 11008  # Llama 1 and 2 7B
    assert at(576, 256) == 1536  # SmolLM2-135M: 8/3·576 is a multiple already
    assert at(128, intermediate_size=100) == 100
    assert ModelConfig(n_embd=128).mlp_size == 512  # gpt2: 4d


MODES = [dict(tie_embeddings=True), dict(tie_embeddings=False), dict(tie_mode="projection"),
         dict(tie_mode="lowrank", untie_rank=3), dict(tie_embeddings=True, untie_at=0.5),
         dict(tie_mode="split", untie_rank=8), dict(tie_mode="soft", tie_embeddings=False, tie_strength=0.1),
         dict(tie_mode="pull", tie_embeddings=False, tie_strength=1.0)]
SHAPES = [dict(), dict(n_kv_head=2), dict(n_kv_head=1, bias=True), dict(intermediate_size=40, embed_scale="sqrt_d"),
          dict(lm_head_bias=True, norm_eps=1e-6, rope_theta=500.0)]


@pytest.mark.parametrize("mode,shape", list(itertools.product(MODES, SHAPES)),
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_counts_match_the_arithmetic_and_every_mode_trains_a_step(mode, shape):
    cfg = ModelConfig(**{**LLAMA, **mode, **shape})
    m = GPT(cfg, 61)
    assert count_params(m) == count_params_config(cfg, 61)
    x = ids()
    loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(math.log(61), rel=0.1)
    grads = {n: p.grad for n, p in m.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    logits = m(x)
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, 61), x[:, 1:].reshape(-1))
    assert loss.item() == pytest.approx(ref.item(), abs=1e-5)  # the fused loss is the plain one


def test_embed_scale_multiplies_the_input_only():
    """Gemma's √d: the blocks read √d·E[x], the tied head reads E itself."""
    b = build(embed_scale="sqrt_d")
    x = ids()
    with torch.no_grad():
        t = b.transformer
        h = t.drop(t.wte(x) * math.sqrt(32))
        for block in t.h:
            h = block(h, b.rope_cos[:12], b.rope_sin[:12])
        hidden = t.ln_f(h)
        assert torch.allclose(b.hidden(x), hidden, atol=1e-6)
        assert torch.allclose(b(x), hidden @ t.wte.weight.T, atol=1e-5)  # unscaled E on the output side
        plain = build()  # the same weights (seed 0) without the scale compute something else
        assert torch.equal(plain.transformer.wte.weight, t.wte.weight) and not torch.allclose(plain(x), b(x))


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_bf16_autocast_trains_and_stays_near_float32(n_kv_head):
    """Under CPU autocast q, k and v are bf16 and the rotary tables float32: the block runs, and its
    loss and gradients stay within bf16's rounding of the float32 ones."""
    m = build(n_kv_head=n_kv_head, dropout=0.0)
    x = ids()
    ref = m(x[:, :-1], x[:, 1:])
    ref.backward()
    ref_grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=2e-2)
    for p, g in zip(m.parameters(), ref_grads):
        assert torch.allclose(p.grad, g, rtol=0.1, atol=0.05 * g.abs().max().item() + 1e-6)


# ------------------------------------------------------------------ the config


def load(*sets):
    return _load(None, ["train.max_steps=1", *sets])


def test_biases_follow_the_block_unless_asked(tmp_path):
    assert load().model.bias is True and load("model.arch=llama").model.bias is False
    assert load("model.arch=llama", "model.bias=true").model.bias is True
    base = tmp_path / "base.yaml"
    base.write_text("model: {bias: true, n_embd: 32, n_head: 4}\ntrain: {max_steps: 1}\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nmodel: {arch: llama}\n")
    assert _load(child).model.bias is False  # a layer that picks the block picks its biases
    child.write_text("base: base.yaml\nmodel: {arch: llama, bias: true}\n")
    assert _load(child).model.bias is True
    # the --set options are one layer: their order does not matter
    assert load("model.bias=true", "model.arch=llama").model.bias is True
    # naming the block a lower layer has already changes nothing
    assert load("model.bias=false", "model.arch=gpt2").model.bias is False
    base.write_text("model: {bias: false, n_embd: 32, n_head: 4}\ntrain: {max_steps: 1}\n")
    child.write_text("base: base.yaml\nmodel: {arch: gpt2}\n")
    assert _load(child).model.bias is False
    assert config_hash(_load(child)) == config_hash(_load(base))


def test_one_llama_model_has_one_hash():
    """n_kv_head equal to n_head, and an intermediate_size or multiple_of that the rule at its
    default gives, are the default model, written one way."""
    base = ["model.arch=llama", "model.n_embd=128", "model.n_head=4"]
    plain = load(*base)
    for extra in (["model.n_kv_head=4"], ["model.intermediate_size=384"], ["model.multiple_of=128"],
                  ["model.intermediate_size=384", "model.multiple_of=32"]):
        same = load(*base, *extra)
        assert config_hash(same) == config_hash(plain) and same.model == plain.model, extra
    wide = load(*base, "model.multiple_of=256")
    assert (wide.model.intermediate_size, wide.model.multiple_of, wide.model.mlp_size) == (512, 64, 512)
    assert config_hash(wide) == config_hash(load(*base, "model.intermediate_size=512")) != config_hash(plain)
    assert load(*base, "model.n_kv_head=2").model.n_kv_head == 2


def test_gpt2_configs_hash_as_before_when_the_new_keys_are_written_at_their_defaults():
    plain = config_hash(load())
    assert config_hash(load("model.arch=gpt2", "model.norm_eps=1e-5")) == plain
    assert config_hash(load("model.norm_eps=1e-6")) != plain
    assert config_hash(load("model.arch=llama")) != plain


@pytest.mark.parametrize("sets,message", [
    (["model.arch=mamba"], "model.arch must be gpt2 or llama"),
    (["model.rope_theta=500000"], "model.rope_theta applies to Llama-style blocks only"),
    (["model.n_kv_head=2"], "model.n_kv_head applies to Llama-style blocks only"),
    (["model.intermediate_size=100"], "model.intermediate_size applies to Llama-style blocks only"),
    (["model.arch=llama", "model.n_kv_head=3"], "model.n_kv_head (3) must divide model.n_head (4)"),
    (["model.arch=llama", "model.n_kv_head=0"], "model.n_kv_head must be positive"),
    (["model.arch=llama", "model.n_embd=20", "model.n_head=4"], "head size n_embd / n_head (5) must be even"),
    (["model.arch=llama", "model.intermediate_size=-1"], "model.intermediate_size must be positive"),
    (["model.norm_eps=0"], "model.norm_eps must be positive"),
])
def test_what_the_block_refuses(sets, message):
    with pytest.raises(ConfigError) as info:
        load(*sets)
    assert message in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------ training


@pytest.mark.parametrize("stop", [3, 6], ids=lambda s: f"stop{s}")
def test_a_llama_run_resumes_bit_for_bit(tiny, tmp_path, stop):
    """With dropout (the RNG state matters), GQA and an untie half-way (step 6)."""
    cfg = tiny("model.arch=llama", "model.n_kv_head=1", "model.untie_at=0.5", "model.dropout=0.1")
    ref = train_run(cfg, out=tmp_path / "a", progress=False)
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path / "b", progress=False, stop_after_step=stop)
    run = train_run(cfg, out=tmp_path / "b", progress=False)
    wa, wb = weights(ref), weights(run)
    assert wa.keys() == wb.keys() and "lm_head.weight" in wb and not any("wpe" in k for k in wb)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert metric_rows(ref) == metric_rows(run)
    report = json.loads((run / "report.json").read_text())
    assert report["params"]["wpe"] == 0 and report["config"]["model"]["arch"] == "llama"
    md = (run / "report.md").read_text()
    assert "Block: **Llama-style** (RMSNorm, SwiGLU of 64, rotary θ 10000, 1 key/value heads for 2 query heads" in md
