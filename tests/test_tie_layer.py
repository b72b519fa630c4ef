"""The one tie layer (tie_layer.TiedLM) over every family: each tying mode on tiedlm's own blocks
and on transformers' Llama, Qwen2, OLMo 2 and Gemma 2 — built, counted (the built model's unique
parameters against the count from the config, and against arithmetic), started as the mode says,
trained a few optimizer steps with its W_out as the mode defines it — and through tiedlm's loop on
a transformers family: a mode's run resumed bit for bit, analysed and exported with its logits
checked. Also each native family's own initialisation against its transformers twin."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from tests.conftest import ROOT
from tiedlm.config import load_config
from tiedlm.model.counting import count_params_config
from tiedlm.errors import ConfigError
from tiedlm.model.blocks import build_model
from tiedlm.model.tie_layer import TiedLM, count_params
from tiedlm.train.step import build_optimizer

transformers = pytest.importorskip("transformers")

V, D = 96, 32
MODES = {  # the overrides of each mode
    "tied": ["model.tie_embeddings=true"],
    "untied": ["model.tie_embeddings=false"],
    "untie_at": ["model.tie_embeddings=true", "model.untie_at=0.5"],
    "projection": ["model.tie_mode=projection"],
    "lowrank": ["model.tie_mode=lowrank", "model.untie_rank=4"],
    "split": ["model.tie_mode=split", "model.untie_rank=4"],
    "soft": ["model.tie_mode=soft", "model.tie_strength=0.5"],
    "pull": ["model.tie_mode=pull", "model.tie_strength=2"],
    "sqrt_d": ["model.tie_embeddings=true", "model.embed_scale=sqrt_d"],
    "head_bias": ["model.tie_embeddings=true", "model.lm_head_bias=true"],
}
FAMILIES = {  # tiedlm's own blocks, and transformers' families through arch: hf
    "gpt2": ["model.arch=gpt2"],
    "llama (tiedlm)": ["model.arch=llama", "model.n_kv_head=2"],
    "llama": ["model.arch=hf", "model.hf_config=llama", "model.n_kv_head=2"],
    "qwen2": ["model.arch=hf", "model.hf_config=qwen2", "model.n_kv_head=2"],
    "olmo2": ["model.arch=hf", "model.hf_config=olmo2"],
    "gemma2": ["model.arch=hf", "model.hf_config=gemma2", "model.n_kv_head=2"],
}
NEEDS_LINEAR_HEAD = ("projection", "lowrank", "split")


def cfg_of(family: str, mode: str, *extra: str):
    return load_config(None, ["model.n_layer=2", f"model.n_embd={D}", "model.n_head=4", "model.block_size=16",
                              "train.max_steps=4", "train.warmup_steps=1", "train.lr=0.01",
                              *FAMILIES[family], *MODES[mode], *extra])


def unique_numel(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def by_arithmetic(mode: str) -> int:
    """What W_out adds beside E (its bias aside), from the mode's definition (model/tie.py's docstring)."""
    r = 4
    return {"untied": V * D, "soft": V * D, "pull": V * D, "projection": D * D, "lowrank": r * (V + D),
            "split": V * r}.get(mode, 0)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_on_every_family_counts_starts_and_trains(family, mode):
    cfg = cfg_of(family, mode)
    if family == "gemma2" and mode in NEEDS_LINEAR_HEAD:  # soft-capped logits: refused in one line
        with pytest.raises(ConfigError, match=f"model.tie_mode {mode} builds W_out from E for a plain linear head"):
            build_model(cfg.model, V)
        return
    if family == "gemma2" and mode == "sqrt_d":  # Gemma scales its embedding itself: not twice
        with pytest.raises(ConfigError, match=r"gemma2 scales its input embedding itself \(by 5.657 at this width\)"):
            build_model(cfg.model, V)
        return
    torch.manual_seed(0)
    model = build_model(cfg.model, V)
    assert isinstance(model, TiedLM)
    tie = cfg.model.tie
    model.check_tie(not tie.two_matrices)  # by storage, and by tie_word_embeddings on a transformers model
    built = count_params(model)
    assert built["total"] == unique_numel(model)
    assert built == {k: v for k, v in count_params_config(cfg.model, V).items() if k in built}
    assert built["lm_head"] == by_arithmetic(tie.mode)
    assert built["lm_head_bias"] == (V if mode == "head_bias" else 0)
    assert built["saved_by_tying"] == (0 if tie.two_matrices else V * D - by_arithmetic(tie.mode))

    E = model.get_input_embeddings().weight
    W = model.output_weight()
    assert torch.equal(W, E.detach()) or tie.mode == "untied"  # every mode but untied starts with W_out = E
    x, y = torch.randint(0, V, (2, 8)), torch.randint(0, V, (2, 8))
    if model.head_kind == "linear":  # the fused loss is the cross-entropy of h @ W_outᵀ + b
        with torch.no_grad():
            h, bias = model.hidden(x), model.get_output_embeddings().bias
            ref = F.cross_entropy(F.linear(h, model.output_weight(), bias).reshape(-1, V), y.reshape(-1))
            assert model(x, y).item() == pytest.approx(ref.item(), rel=1e-5)
    if mode == "sqrt_d":  # the input side reads √d·E, the output side E
        assert torch.allclose(model.embed(x), E[x] * math.sqrt(D))

    optimizer = build_optimizer(model, cfg.train)
    first = None
    for step in range(4):
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y) + (model.tie_penalty() if model.tie_penalty() is not None else 0)
        loss.backward()
        optimizer.step()
        model.pull_tie(cfg.train.lr)
        first = loss.item() if first is None else first
    assert math.isfinite(loss.item()) and loss.item() < first  # the mode trains on one batch
    assert model.is_tied is not tie.two_matrices  # the tie held through the steps
    moved = (model.output_weight() - model.get_input_embeddings().weight.detach()).abs().max().item()
    assert (moved == 0) is tie.w_out_is_e  # W_out is E exactly where the mode says so, and moved apart elsewhere


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_untie_at_splits_a_transformers_model_by_storage_and_flags(family):
    model = build_model(cfg_of(family, "untie_at").model, V)
    model.check_tie(True)
    new = model.untie()
    model.check_tie(False)
    assert new is model.get_output_embeddings().weight and torch.equal(new, model.get_input_embeddings().weight)
    assert model.current_tie.mode == "untied"


def test_sqrt_d_reads_sqrt_d_e_on_a_transformers_family():
    """tiedlm's √d on a family that scales nothing itself: the decoder reads √d·E[x]."""
    torch.manual_seed(0)
    plain = build_model(cfg_of("llama", "tied").model, V)
    torch.manual_seed(0)
    scaled = build_model(cfg_of("llama", "sqrt_d").model, V)
    x = torch.randint(0, V, (2, 8))
    embeds = plain.get_input_embeddings()(x) * math.sqrt(D)
    ref = plain.hf.get_decoder()(inputs_embeds=embeds).last_hidden_state
    assert torch.allclose(scaled.hidden(x), ref, atol=1e-6)


# ------------------------------------------------------------------ through tiedlm's loop


def run_cfg(family: str, mode: str, *extra: str):
    return load_config(ROOT / "configs" / "base.yaml",
                       ["model.n_layer=1", f"model.n_embd={D}", "model.n_head=2", "model.block_size=16",
                        "tokenizer.vocab_size=128", "train.max_steps=6", "train.warmup_steps=1", "train.batch_size=4",
                        "train.eval_every=3", "train.checkpoint_every=3", "data.synthetic.train_tokens=4000",
                        "data.synthetic.validation_tokens=600", "data.synthetic.test_tokens=600", "train.device=cpu",
                        "train.threads=1", *FAMILIES[family][:2], *MODES[mode], *extra])


@pytest.mark.parametrize("mode", ["lowrank", "soft"])
def test_a_mode_on_qwen2_resumes_bit_for_bit_analyses_and_exports(tmp_path, monkeypatch, mode):
    from safetensors.torch import load_file

    from tiedlm.runs import checkpoints
    from tiedlm.analyze import analyze_run
    from tiedlm.errors import Interrupted
    from tiedlm.export import export_run
    from tiedlm.train import train_run

    monkeypatch.setenv("TIEDLM_CACHE", str(tmp_path / "cache"))
    cfg = run_cfg("qwen2", mode)
    whole = train_run(cfg, out=tmp_path / "a", progress=False)

    calls = {"n": 0}
    real = checkpoints.save_checkpoint

    def stop_after_first(*args, **kwargs):  # interrupted right after the step-3 checkpoint
        out = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 1:
            raise Interrupted("stopped for the test")
        return out

    monkeypatch.setattr(checkpoints, "save_checkpoint", stop_after_first)
    with pytest.raises(Interrupted):
        train_run(cfg, out=tmp_path / "b", progress=False)
    monkeypatch.setattr(checkpoints, "save_checkpoint", real)
    resumed = train_run(cfg, out=tmp_path / "b", progress=False)
    a, b = (load_file(str(checkpoints.latest_checkpoint(r) / "model.safetensors")) for r in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("head_") for k in a) is (mode == "lowrank")  # A and B beside the family's weights

    report = __import__("json").loads((whole / "report.json").read_text())
    assert report["params"]["tie_mode"] == mode and report["params"]["total"] == count_params_config(
        cfg.model, report["params"]["model_vocab_size"])["total"]
    analysis = analyze_run(whole)
    assert analysis is not None
    result = export_run(whole, tmp_path / "export")
    assert result.verified and result.max_abs_diff is not None and result.max_abs_diff < 1e-4
    assert result.tied is False and result.hf_class == "Qwen2ForCausalLM"  # W_out materialised as its own matrix
    assert result.mode == mode


# ------------------------------------------------------------------ each family's own initialisation


def _std_by_kind(model, names: dict[str, str]) -> dict[str, float]:
    """The std of each kind of matrix over the model's layers, by the family's own names."""
    params = dict(model.named_parameters())
    out = {}
    for kind, suffix in names.items():
        values = torch.cat([p.detach().flatten() for n, p in params.items() if n.endswith(suffix)])
        out[kind] = values.std().item()
    return out


def test_llama_style_block_draws_llama_s_initialisation():
    """Every matrix of tiedlm's Llama-style block, the residual projections included, has the std
    transformers' LlamaForCausalLM draws it with (initializer_range 0.02), within sampling error;
    GPT-2's keeps its scaled residual projections, as GPT2LMHeadModel does."""
    L, d = 8, 256
    torch.manual_seed(0)
    ours = build_model(load_config(None, ["model.arch=llama", f"model.n_layer={L}", f"model.n_embd={d}",
                                          "model.n_head=4", "model.block_size=16", "train.max_steps=1"]).model, 512)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=d, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=ours.cfg.mlp_size, tie_word_embeddings=True))
    a = _std_by_kind(ours, {"E": "wte.weight", "qkv": "attn.c_attn.weight", "o": "attn.c_proj.weight",
                            "gate_up": "mlp.c_fc.weight", "down": "mlp.c_proj.weight"})
    b = _std_by_kind(theirs, {"E": "embed_tokens.weight", "qkv": "self_attn.q_proj.weight",
                              "o": "self_attn.o_proj.weight", "gate_up": "mlp.gate_proj.weight",
                              "down": "mlp.down_proj.weight"})
    for kind in a:  # tens of thousands of draws each: the std within 2% of the other's
        assert a[kind] == pytest.approx(b[kind], rel=0.02), kind
        assert a[kind] == pytest.approx(0.02, rel=0.02), kind


def test_gpt2_block_keeps_gpt2_s_scaled_residual_projections():
    L, d = 8, 256
    torch.manual_seed(0)
    ours = build_model(load_config(None, [f"model.n_layer={L}", f"model.n_embd={d}", "model.n_head=4",
                                          "model.block_size=16", "train.max_steps=1"]).model, 512)
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_embd=d, n_layer=L, n_head=4, n_positions=16))
    names = {"E": "wte.weight", "wpe": "wpe.weight", "qkv": "attn.c_attn.weight", "o": "attn.c_proj.weight",
             "up": "mlp.c_fc.weight", "down": "mlp.c_proj.weight"}
    a, b = _std_by_kind(ours, names), _std_by_kind(theirs, names)
    for kind in a:
        assert a[kind] == pytest.approx(b[kind], rel=0.03), kind
    assert a["o"] == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.03)


def test_the_ledger_records_each_family_s_block_initialisation():
    from tiedlm.runs.ledger import differences, ledger_of

    gpt2 = ledger_of(load_config(None, ["model.n_layer=8", "train.max_steps=1"]), None)
    llama = ledger_of(load_config(None, ["model.n_layer=8", "model.arch=llama", "train.max_steps=1"]), None)
    hf = ledger_of(load_config(None, ["model.n_layer=8", "model.arch=hf", "model.hf_config=llama",
                                      "train.max_steps=1"]), None)
    assert gpt2.block_init == "normal(0, 0.02); residual projections 0.005 (0.02/√(2·8))"
    assert llama.block_init == "normal(0, 0.02), the residual projections too"
    assert hf.block_init.startswith("the family's own")
    said = differences(gpt2, llama)
    assert any(s.startswith("block initialisation normal(0, 0.02); residual projections 0.005") for s in said)


@pytest.mark.parametrize("extra, message", [
    (["model.hf_config=gpt_neox", "model.n_kv_head=2"], "model.n_kv_head does not apply to gpt_neox"),
    (["model.hf_config=gemma2", "model.tie_mode=lowrank", "model.untie_rank=4"],
     "model.tie_mode lowrank builds W_out from E for a plain linear head"),
])
def test_compare_refuses_a_family_it_cannot_build_once_before_any_run(tiny_yaml, tmp_path, extra, message):
    """Said once, before a run is planned: not once per run of the tuning grid, each then failing."""
    from typer.testing import CliRunner

    from tiedlm.cli import app

    sets = [a for e in ["model.arch=hf", "model.n_head=4", *extra] for a in ("--set", e)]
    r = CliRunner().invoke(app, ["compare", "--config", str(tiny_yaml), "--seeds", "2", "--tune", "train.lr=0.001,0.01",
                                 "--out", str(tmp_path / "runs"), *sets])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_transformers_position_table_is_counted_and_grouped_as_tiedlm_s():
    """GPT-2 built by transformers counts and groups its wpe as tiedlm's own GPT-2 does."""
    ours = build_model(cfg_of("gpt2", "tied").model, V)
    theirs = build_model(load_config(None, ["model.n_layer=2", f"model.n_embd={D}", "model.n_head=4",
                                            "model.block_size=16", "train.max_steps=1", "model.arch=hf",
                                            "model.hf_config=gpt2"]).model, V)
    a, b = count_params(ours), count_params(theirs)
    assert a["wpe"] == b["wpe"] == 16 * D and a["total"] == b["total"] and a["non_embedding"] == b["non_embedding"]
    assert theirs.position_parameters()[0] is theirs.hf.transformer.wpe.weight
    assert any(p is theirs.hf.transformer.wpe.weight for p in theirs.embedding_parameters())


@pytest.mark.parametrize("extra", [
    ["model.tie_embeddings=false", "model.lm_head_bias=true"],  # tiedlm's head bias
    ["model.arch=hf", "model.hf_config=phi", "model.tie_embeddings=false"],  # Phi's own head bias
    ["model.arch=hf", "model.hf_config=phi"],  # tied: E is W_out, and the bias is the head's still
])
def test_train_trainable_head_trains_the_head_s_bias(extra):
    """train.trainable: head is the output projection and its bias, for every family (Phi's bias,
    and tiedlm's model.lm_head_bias, were frozen)."""
    from tiedlm.model.blocks import freeze_all_but

    cfg = load_config(None, ["model.n_layer=1", f"model.n_embd={D}", "model.n_head=2", "model.block_size=16",
                             "train.max_steps=1", "train.trainable=head", *extra])
    model = build_model(cfg.model, V)
    freeze_all_but(model, "head")
    head = model.get_output_embeddings()
    assert head.bias is not None and head.weight.requires_grad and head.bias.requires_grad
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    assert trained == {id(head.weight), id(head.bias)}  # E among them only as W_out, when tied


def test_train_trainable_embeddings_is_one_set_on_tiedlm_s_gpt2_and_transformers_gpt2():
    """embeddings: E, W_out (untied) and the learned position table, on either GPT-2 alike."""
    from tiedlm.model.blocks import freeze_all_but

    sizes = ["model.n_layer=1", f"model.n_embd={D}", "model.n_head=2", "model.block_size=16", "train.max_steps=1",
             "model.tie_embeddings=false", "train.trainable=embeddings"]
    ours, theirs = (build_model(load_config(None, sizes + extra).model, V)
                    for extra in ([], ["model.arch=hf", "model.hf_config=gpt2"]))
    for model in (ours, theirs):
        freeze_all_but(model, "embeddings")
    ours_names = sorted(n.split(".")[-2] for n, p in ours.named_parameters() if p.requires_grad)
    theirs_names = sorted(n.split(".")[-2] for n, p in theirs.named_parameters() if p.requires_grad)
    assert ours_names == theirs_names == ["lm_head", "wpe", "wte"]
