"""Counting for model.arch llama, tied and untied: tiedlm's arithmetic (model/counting.py, nothing built)
against transformers' LlamaForCausalLM built on the meta device from the same numbers (instant at
any size: no memory is allocated), against a built tiedlm model on small shapes, and FLOPs per
token against the matmuls written out here. The published shapes come from configs/."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiedlm.config import ModelConfig, load_config
from tiedlm.model.counting import count_params_config, flops_per_token

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Shape:
    """One Llama-style shape, in the numbers both libraries take. `intermediate` is what tiedlm's
    config gets (None: its default rule); `hf_intermediate` is the width written out by hand, which
    transformers gets: where the rule applies, the two agree only if tiedlm's rule is right."""

    name: str
    d: int
    L: int
    H: int
    KV: int | None  # None: one key/value head per query head
    V: int
    hf_intermediate: int
    intermediate: int | None = None
    multiple_of: int = 64
    bias: bool = False
    T: int = 64

    def model_cfg(self, tied: bool) -> ModelConfig:
        return ModelConfig(arch="llama", n_layer=self.L, n_head=self.H, n_embd=self.d, block_size=self.T,
                           bias=self.bias, n_kv_head=self.KV, intermediate_size=self.intermediate,
                           multiple_of=self.multiple_of, tie_embeddings=tied)

    @property
    def kv(self) -> int:
        return self.H if self.KV is None else self.KV


SMALL = [
    Shape("gqa-rule", d=64, L=2, H=4, KV=2, V=97, hf_intermediate=192),  # int(8·64/3) = 170 -> 192
    Shape("mqa-bias-set", d=48, L=3, H=6, KV=1, V=101, hf_intermediate=100, intermediate=100, bias=True),
    Shape("mha-rule-32", d=96, L=2, H=3, KV=None, V=50, hf_intermediate=256, multiple_of=32),  # 256 = 8·96/3
    Shape("d128-rule-bias", d=128, L=2, H=8, KV=4, V=257, hf_intermediate=384, bias=True),  # 341 -> 384
    Shape("odd-rule-1", d=40, L=1, H=5, KV=5, V=33, hf_intermediate=106, multiple_of=1),  # int(106.67)
]


def shape_from_config(path: Path) -> Shape:
    cfg = load_config(path)
    m = cfg.model
    assert m.arch == "llama" and cfg.tokenizer.pad_to_multiple == 1
    return Shape(cfg.name, d=m.n_embd, L=m.n_layer, H=m.n_head, KV=m.kv_heads, V=cfg.tokenizer.vocab_size,
                 hf_intermediate=m.mlp_size, intermediate=m.intermediate_size, multiple_of=m.multiple_of,
                 bias=m.bias, T=m.block_size)


SMOLLM2 = shape_from_config(ROOT / "configs" / "smollm2-135m.yaml")
LLAMA_32_1B = shape_from_config(ROOT / "configs" / "llama-3.2-1b.yaml")
SHAPES = [*SMALL, SMOLLM2, LLAMA_32_1B]
FORMS = [True, False]


def hf_llama(s: Shape, tied: bool, rope_theta: float = 10000.0):
    """transformers' Llama from the numbers, on the meta device (shapes only, no memory)."""
    cfg = transformers.LlamaConfig(
        vocab_size=s.V, hidden_size=s.d, intermediate_size=s.hf_intermediate, num_hidden_layers=s.L,
        num_attention_heads=s.H, num_key_value_heads=s.kv, max_position_embeddings=s.T, rms_norm_eps=1e-5,
        rope_theta=rope_theta, attention_bias=s.bias, mlp_bias=s.bias, tie_word_embeddings=tied)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    return model


def unique_numel(params) -> int:
    seen, total = set(), 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


@pytest.mark.parametrize("tied", FORMS, ids=["tied", "untied"])
@pytest.mark.parametrize("s", SHAPES, ids=lambda s: s.name)
def test_count_matches_transformers_llama(s, tied):
    hf = hf_llama(s, tied)
    c = count_params_config(s.model_cfg(tied), s.V)
    assert c["total"] == unique_numel(hf.parameters()) == hf.num_parameters()
    assert c["wte"] == hf.model.embed_tokens.weight.numel() == s.V * s.d
    assert c["lm_head"] == (0 if tied else hf.lm_head.weight.numel())
    assert c["wpe"] == 0 and c["lm_head_bias"] == 0  # rotary positions; HF's Llama head has no bias
    # blocks and the final norm: every parameter of HF's decoder but its embedding
    assert c["non_embedding"] == unique_numel(hf.model.layers.parameters()) + hf.model.norm.weight.numel()
    # HF's exclude_embeddings drops the nn.Embedding (E) only: an untied head is an nn.Linear and stays
    assert hf.num_parameters(exclude_embeddings=True) == c["total"] - c["wte"] - c["wpe"] == c["non_embedding"] + c["lm_head"]
    assert c["saved_by_tying"] == (s.V * s.d if tied else 0) and c["tied"] == tied
    assert c["total"] == c["wte"] + c["lm_head"] + c["wpe"] + c["non_embedding"]


def test_published_counts():
    """SmolLM2-135M and Llama-3.2-1B: the counts their model cards publish (both tied), from the
    configs in configs/ and from transformers' own model built with the published numbers."""
    for s, theta, published, untied in ((SMOLLM2, 100000.0, 134_515_008, 162_826_560),
                                        (LLAMA_32_1B, 500000.0, 1_235_814_400, 1_498_482_688)):
        cfg = load_config(ROOT / "configs" / f"{s.name}.yaml").model
        assert cfg.tie_embeddings and cfg.rope_theta == theta and cfg.norm_eps == 1e-5 and not cfg.bias
        assert count_params_config(cfg, s.V)["total"] == published
        assert hf_llama(s, True, theta).num_parameters() == published
        assert count_params_config(s.model_cfg(False), s.V)["total"] == untied == published + s.V * s.d
    assert (SMOLLM2.d, SMOLLM2.L, SMOLLM2.H, SMOLLM2.KV, SMOLLM2.hf_intermediate, SMOLLM2.V) == (
        576, 30, 9, 3, 1536, 49152)
    assert (LLAMA_32_1B.d, LLAMA_32_1B.L, LLAMA_32_1B.H, LLAMA_32_1B.KV, LLAMA_32_1B.hf_intermediate,
            LLAMA_32_1B.V) == (2048, 16, 32, 8, 8192, 128256)


def test_params_command_prints_the_exact_count_without_torch():
    """`tiedlm params` counts by arithmetic: the report of a 1.2B model imports no torch."""
    code = ("import sys; from tiedlm.config import load_config; from tiedlm.model.params_report import params_report\n"
            "for name in ('smollm2-135m', 'llama-3.2-1b'):\n"
            "    print(params_report(load_config(f'configs/{name}.yaml')).text)\n"
            "assert 'torch' not in sys.modules, 'params imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "134,515,008" in out.stdout and "162,826,560" in out.stdout
    assert "1,235,814,400" in out.stdout and "1,498,482,688" in out.stdout
    assert "arch=llama n_kv_head=3 intermediate_size=1536" in out.stdout


def test_params_cli_json():
    from typer.testing import CliRunner

    from tiedlm.cli import app

    r = CliRunner().invoke(app, ["params", "--config", str(ROOT / "configs" / "smollm2-135m.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.stdout)
    assert out["vocab_size"] == 49152
    assert out["tied"]["total"] == 134_515_008 and out["untied"]["total"] == 162_826_560
    assert out["tied"]["wpe"] == 0 and out["flops_per_token"]["train"] == 3 * out["flops_per_token"]["forward"]


def block_formula(s: Shape) -> int:
    """One Llama block written out: q, k, v (k and v at the key/value heads' width), o; gate, up,
    down; two RMSNorm gains; and a bias on each of the seven linears when bias is on."""
    hs = s.d // s.H
    q, kv, o = s.d * s.d, s.d * s.kv * hs, s.d * s.d
    mlp = 3 * s.d * s.hf_intermediate
    biases = (s.d + 2 * s.kv * hs + s.d + 2 * s.hf_intermediate + s.d) if s.bias else 0
    return q + 2 * kv + o + mlp + biases + 2 * s.d


@pytest.mark.parametrize("tied", FORMS, ids=["tied", "untied"])
@pytest.mark.parametrize("s", SHAPES, ids=lambda s: s.name)
def test_count_matches_the_formula(s, tied):
    expected = s.V * s.d * (1 if tied else 2) + s.L * block_formula(s) + s.d
    assert count_params_config(s.model_cfg(tied), s.V)["total"] == expected


@pytest.mark.parametrize("tied", FORMS, ids=["tied", "untied"])
@pytest.mark.parametrize("s", SMALL, ids=lambda s: s.name)
def test_built_tiedlm_model_counts_the_same(s, tied):
    from tiedlm.model.blocks import GPT, count_params

    for head_bias in (False, True):
        cfg = dataclasses.replace(s.model_cfg(tied), lm_head_bias=head_bias)
        built = count_params(GPT(cfg, s.V))
        arith = count_params_config(cfg, s.V)
        for key in ("total", "wte", "lm_head", "lm_head_bias", "wpe", "non_embedding", "saved_by_tying", "tied"):
            assert built[key] == arith[key], key
        hf_total = hf_llama(s, tied).num_parameters()
        assert arith["total"] == hf_total + (s.V if head_bias else 0)
        assert arith["lm_head_bias"] == (s.V if head_bias else 0)


def test_default_intermediate_size_is_llamas_rule():
    # Llama-1/2 7B: d = 4096, multiple_of = 256 -> 11008 (int(8·4096/3) = 10922, rounded up)
    assert ModelConfig(arch="llama", n_embd=4096, n_head=32, multiple_of=256).mlp_size == 11008
    # tiedlm's default multiple_of (64) at d = 128: int(341.33) = 341 -> 384
    assert ModelConfig(arch="llama", n_embd=128).mlp_size == 384
    assert ModelConfig(arch="llama", n_embd=128, intermediate_size=500).mlp_size == 500
    assert ModelConfig(arch="gpt2", n_embd=128).mlp_size == 512


def forward_flops_formula(s: Shape) -> int:
    """Matmul FLOPs per token of one forward pass, 2 per multiply-add: per layer the projections
    q (d×d), k and v (d × n_kv_head·head_size each), o (d×d), gate, up and down (d × intermediate
    each), plus attention at the full T × T: scores q·kᵀ and the weighted values, 2·T·d
    multiply-adds each; then the head, V×d, tied or not."""
    hs = s.d // s.H
    proj = s.d * s.d + 2 * s.d * s.kv * hs + s.d * s.d
    mlp = 3 * s.d * s.hf_intermediate
    attention = 2 * 2 * s.T * s.d
    return s.L * (2 * (proj + mlp) + attention) + 2 * s.V * s.d


@pytest.mark.parametrize("s", SHAPES, ids=lambda s: s.name)
def test_flops_per_token(s):
    expected = forward_flops_formula(s)
    for tied in FORMS:  # tying saves parameters, never compute
        f = flops_per_token(s.model_cfg(tied), s.V)
        assert f["forward"] == expected
        assert f["train"] == 3 * f["forward"]
        assert f["head"] == 2 * s.V * s.d
    # the same from transformers' model: 2 FLOPs per weight of every Linear (untied: the head is one)
    hf = hf_llama(s, tied=False)
    linear = sum(m.weight.numel() for m in hf.modules() if isinstance(m, torch.nn.Linear))
    assert expected == 2 * linear + s.L * 4 * s.T * s.d


def test_flops_per_token_smollm2_written_out():
    # d = 576, head_size 64, 3 kv heads (k, v: 576 x 192), intermediate 1536, T = 2048, V = 49152
    per_layer = 2 * (576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536) + 4 * 2048 * 576
    forward = 30 * per_layer + 2 * 49152 * 576
    assert forward == 410_517_504
    f = flops_per_token(load_config(ROOT / "configs" / "smollm2-135m.yaml").model, 49152)
    assert f["forward"] == forward and f["train"] == 1_231_552_512
