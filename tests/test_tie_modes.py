"""model.tie_mode projection and lowrank: each forward against a hand-written reference, the
parameter counts against built models and independent arithmetic, rank 0 exactly tied (the same
logits, the same loss after an optimizer step), the config's short and long forms, what is refused,
and what params, analyze and the comparison's labels make of the modes."""

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from tiedlm.config import ModelConfig, TrainConfig
from tiedlm.config.identity import config_hash
from tiedlm.config import load_config as _load
from tiedlm.errors import ConfigError
from tiedlm.model.blocks import GPT, count_params
from tiedlm.model.counting import count_params_config
from tiedlm.train.step import build_optimizer

BASE = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8)
V = 97


def load_config(path, overrides=()):
    """A config with a budget (the defaults have none)."""
    return _load(path, ["train.max_steps=10", *overrides])


def build(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(BASE, **kw), V)


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (3, 8), generator=g), torch.randint(0, V, (3, 8), generator=g)


def scramble(model):
    """Random values in the modes' own parameters (they start at the identity and at zero)."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in model.head_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        if model.lm_head.bias is not None:
            model.lm_head.bias.copy_(torch.randn(V, generator=g))
    return model


@pytest.mark.parametrize("bias", [False, True])
def test_projection_forward_is_p_h_times_e_transposed(bias):
    m = scramble(build(tie_mode="projection", lm_head_bias=bias)).eval()
    x, y = batch()
    h = m.hidden(x)
    E, P = m.transformer.wte.weight, m.head_proj.weight
    ref = torch.einsum("btj,ij,vi->btv", h, P, E)  # logits[v] = Σ_i (Σ_j P[i,j] h[j]) E[v,i]
    if bias:
        ref = ref + m.lm_head.bias
    assert torch.allclose(m(x), ref, atol=1e-5)
    assert torch.allclose(m.output_weight(), E @ P, atol=1e-6)  # W_out = E·P: logits = h (E P)ᵀ
    assert m(x, y).item() == pytest.approx(F.cross_entropy(ref.reshape(-1, V), y.reshape(-1)).item(), rel=1e-5)


@pytest.mark.parametrize("rank", [1, 5, 16])
def test_lowrank_forward_is_e_plus_a_b_transposed(rank):
    m = scramble(build(tie_mode="lowrank", untie_rank=rank, lm_head_bias=True)).eval()
    x, y = batch()
    h = m.hidden(x)
    E, A, B = m.transformer.wte.weight, m.head_a, m.head_b
    W = E + torch.stack([sum(A[v, k] * B[:, k] for k in range(rank)) for v in range(V)])  # by the definition
    ref = h @ W.T + m.lm_head.bias
    assert A.shape == (V, rank) and B.shape == (16, rank)
    assert torch.allclose(m(x), ref, atol=1e-5)
    assert torch.allclose(m.output_weight(), W, atol=1e-6)
    per_token = m(x, y, reduction="none")
    want = F.cross_entropy(ref.reshape(-1, V), y.reshape(-1), reduction="none").view(3, 8)
    assert torch.allclose(per_token, want, atol=1e-5)


def test_the_modes_start_as_the_tied_model_at_a_seed():
    x, _ = batch()
    tied = build()
    for kw in ({"tie_mode": "projection"}, {"tie_mode": "lowrank", "untie_rank": 8}):
        m = build(**kw)
        assert torch.equal(m(x), tied(x))  # P = I, A = 0: the same E and blocks, the same logits
        assert m.is_tied and not m.w_out_is_e
    b = build(tie_mode="lowrank", untie_rank=16).head_b.detach()
    assert torch.allclose(b.T @ b, torch.eye(16), atol=1e-5)  # orthonormal columns


def one_step(model, clip=True):
    x, y = batch()
    opt = build_optimizer(model, TrainConfig(lr=1e-2))
    model(x, y).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return model(x, y).item(), model(x)


def test_rank_zero_is_exactly_tied_logits_and_loss_after_a_step():
    x, _ = batch()
    tied, zero = build(), build(tie_mode="lowrank", untie_rank=0)
    assert torch.equal(tied(x), zero(x)) and zero.w_out_is_e
    # without clipping: the global norm runs over each model's parameter list, and lowrank's two
    # empty matrices lengthen it, which moves the norm's last bit on some CPUs (AVX-512 reductions)
    (loss_t, logits_t), (loss_z, logits_z) = one_step(tied, clip=False), one_step(zero, clip=False)
    assert loss_t == loss_z and torch.equal(logits_t, logits_z)
    (loss_t, logits_t), (loss_z, logits_z) = one_step(build()), one_step(build(tie_mode="lowrank", untie_rank=0))
    assert loss_z == pytest.approx(loss_t, rel=1e-6) and torch.allclose(logits_t, logits_z, rtol=1e-5, atol=1e-6)
    assert count_params(zero)["total"] == count_params(tied)["total"]


def test_the_modes_own_parameters_learn():
    for kw, names in (({"tie_mode": "projection"}, ["head_proj.weight"]),
                      ({"tie_mode": "lowrank", "untie_rank": 4}, ["head_a", "head_b"])):
        m = build(**kw)
        before = {n: p.detach().clone() for n, p in m.head_parameters()}
        one_step(m)
        assert [n for n, _ in m.head_parameters()] == names
        assert all(not torch.equal(before[n], p) for n, p in m.head_parameters()), kw


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": False}, {"tie_mode": "projection"},
                                {"tie_mode": "lowrank", "untie_rank": 0}, {"tie_mode": "lowrank", "untie_rank": 3},
                                {"tie_mode": "lowrank", "untie_rank": 16, "bias": False, "lm_head_bias": True},
                                {"tie_mode": "projection", "lm_head_bias": True, "n_embd": 24, "n_head": 3}])
def test_counts_match_built_models_and_arithmetic(kw):
    m = build(**kw)
    counted, arithmetic = count_params(m), count_params_config(m.cfg, V)
    assert counted == arithmetic
    assert counted["total"] == sum(p.numel() for p in m.parameters())
    d = m.cfg.n_embd
    tied = count_params_config(dataclasses.replace(m.cfg, tie_mode=None, untie_rank=0, tie_embeddings=True), V)
    extra = {"projection": d * d, "lowrank": m.cfg.untie_rank * (V + d)}.get(m.cfg.tie_mode, 0)
    if m.cfg.tie_embeddings:
        assert counted["total"] == tied["total"] + extra and counted["lm_head"] == extra
        assert counted["saved_by_tying"] == V * d - extra
    else:
        assert counted["total"] == tied["total"] + V * d


def test_projection_is_decayed_and_lowrank_follows_the_embeddings():
    def decayed(model, tcfg):
        opt = build_optimizer(model, tcfg)
        return {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}

    p = build(tie_mode="projection")
    assert id(p.head_proj.weight) in decayed(p, TrainConfig(decay_embeddings=False))
    lr = build(tie_mode="lowrank", untie_rank=4)
    assert {id(lr.head_a), id(lr.head_b)} <= decayed(lr, TrainConfig(decay_embeddings=True))
    assert not {id(lr.head_a), id(lr.head_b)} & decayed(lr, TrainConfig(decay_embeddings=False))


# ------------------------------------------------------------------------------- the config


def test_tie_mode_tied_and_untied_are_the_short_form_and_hash_alike():
    for mode, tie in (("tied", True), ("untied", False)):
        long, short = load_config(None, [f"model.tie_mode={mode}"]), load_config(None, [f"model.tie_embeddings={tie}"])
        assert long.model.tie_mode is None and long.model.tie_embeddings is tie
        assert config_hash(long) == config_hash(short)
    # a later layer's short form replaces an earlier mode, and the other way round
    cfg = load_config(None, ["model.tie_mode=lowrank", "model.tie_embeddings=false"])
    assert cfg.model.tie_mode is None and cfg.model.tie_embeddings is False
    cfg = load_config(None, ["model.tie_embeddings=false", "model.tie_mode=projection"])
    assert cfg.model.tie_mode == "projection" and cfg.model.tie_embeddings is True
    lowrank_zero = load_config(None, ["model.tie_mode=lowrank", "model.untie_rank=0"])
    assert config_hash(lowrank_zero) != config_hash(load_config(None, []))


def test_a_file_that_sets_both_forms_must_agree(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  tie_mode: untied\n  tie_embeddings: true\n")
    with pytest.raises(ConfigError, match="tie_mode untied and model.tie_embeddings true disagree"):
        load_config(f)
    f.write_text("model:\n  tie_mode: lowrank\n  untie_rank: 4\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: c.yaml\nmodel:\n  tie_embeddings: false\n  untie_rank: 0\n")
    assert load_config(child).model.tie_mode is None  # the child's short form replaces the base's mode
    # another mode drops the base's rank (it belongs to lowrank); lowrank keeps it
    for override, mode in (("model.tie_mode=tied", None), ("model.tie_embeddings=false", None),
                           ("model.tie_mode=projection", "projection")):
        cfg = load_config(f, [override])
        assert (cfg.model.tie_mode, cfg.model.untie_rank) == (mode, 0), override
    assert load_config(f, ["model.tie_mode=lowrank"]).model.untie_rank == 4
    assert load_config(f, ["model.untie_rank=0", "model.tie_mode=lowrank"]).model.untie_rank == 0


@pytest.mark.parametrize("overrides,message", [
    (["model.tie_mode=weird"], "model.tie_mode must be tied, untied, projection, lowrank, split, soft or pull"),
    (["model.tie_mode=lowrank", "model.untie_at=0.5"], "model.untie_at splits a tied model in two"),
    (["model.tie_mode=projection", "model.untie_at=0.5"], "cannot split — drop one of them"),
    (["model.untie_rank=4"], "applies to model.tie_mode: lowrank or split only"),
    (["model.tie_mode=projection", "model.untie_rank=4"], "applies to model.tie_mode: lowrank or split only"),
    (["model.tie_mode=lowrank", "model.untie_rank=-1"], "model.untie_rank must be 0 or more"),
    (["model.tie_mode=lowrank", "model.untie_rank=129"], "is above model.n_embd (128)"),
])
def test_what_the_modes_refuse(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_params_report_adds_the_modes_column():
    from tiedlm.model.params_report import params_report

    rep = params_report(load_config(None, ["model.tie_mode=lowrank", "model.untie_rank=8"]), vocab_size=1000)
    d = 128
    assert rep.mode["lm_head"] == 8 * (1000 + d) and rep.mode["total"] == rep.tied["total"] + 8 * (1000 + d)
    assert rep.untied["total"] - rep.tied["total"] == 1000 * d  # the plain forms are unchanged by the mode
    assert "lowrank r=8" in rep.text and f"{100 * 8 * 1128 / (1000 * d):.1f}% of what untying adds" in rep.text
    assert params_report(load_config(None, []), vocab_size=1000).mode is None


def test_labels_name_the_mode():
    from tiedlm.compare.variants import label_variants

    configs = [load_config(None, ["model.tie_mode=lowrank", f"model.untie_rank={r}"]) for r in (0, 8)]
    configs += [load_config(None, [f"model.{k}"]) for k in ("tie_embeddings=false", "tie_mode=projection",
                                                             "tie_embeddings=true")]
    labels, keys = label_variants(configs)
    assert labels == ["lowrank r=0", "lowrank r=8", "untied", "projection", "tied"]
    assert set(keys) == {"model.tie_embeddings", "model.tie_mode", "model.untie_rank"}


def test_compare_config_trains_a_modes_own_variant_against_untied():
    from tiedlm.experiment.plan import variants_of
    from tiedlm.experiment.request import CompareRequest

    base = load_config(None, ["model.tie_mode=lowrank", "model.untie_rank=8"])
    variants, _ = variants_of(CompareRequest(overrides=["model.tie_mode=lowrank", "model.untie_rank=8"]), base)
    assert variants == [("lowrank-r8", ["model.tie_mode=lowrank"]),
                        ("untied", ["model.tie_embeddings=false", "model.untie_rank=0"])]
    untied = load_config(None, ["model.tie_mode=lowrank", "model.untie_rank=8", *variants[1][1]])
    assert untied.model.tie_mode is None and not untied.model.tie_embeddings
    with pytest.raises(ConfigError, match="--match params grows the plain tied model"):
        variants_of(CompareRequest(match="params"), base)


# ------------------------------------------------------------------------------- trained runs


def test_train_resume_analyze_and_report_use_the_effective_w_out(tiny, tmp_path):
    """A lowrank run trains, its checkpoint reloads to the same logits, and analyze reads the
    effective W_out as a matrix of its own (pair measures, the direct path with E in its place);
    at rank 0 it is the tied matrix."""
    from tiedlm import runs
    from tiedlm.analyze import analyze_run
    from tiedlm.evaluate import load_run_model
    from tiedlm.train import train_run

    run = train_run(tiny("model.tie_mode=lowrank", "model.untie_rank=4"), out=tmp_path, name="lr", progress=False)
    rm = load_run_model(run)
    assert rm.model.built_tie.mode == "lowrank" and rm.model.head_a.abs().sum() > 0  # A moved from zero
    report = runs.read_report(run)
    assert report.params["lm_head"] == 4 * (rm.model.vocab_size + rm.cfg.model.n_embd)
    assert "Tying: **lowrank r=4**" in (run / runs.REPORT_MD).read_text()
    result = analyze_run(run)
    assert result["tied"] is False and result["tie_mode"] == "lowrank" and "W_out" in result["matrices"]
    assert 0.0 < result["pair"]["cka"] < 1.0 and "with_e_as_w_out" in result["direct_path"]
    zero = train_run(tiny("model.tie_mode=lowrank", "model.untie_rank=0"), out=tmp_path, name="zero", progress=False)
    result = analyze_run(zero)
    assert result["tied"] is True and result["pair"]["cka"] == 1.0 and "with_e_as_w_out" not in result["direct_path"]


@pytest.mark.parametrize("extra,message", [
    (["model.tie_mode=lowrank", "model.untie_rank=4", "model.untie_at=0.5"], "cannot split — drop one of them"),
    (["model.tie_mode=projection", "model.untie_rank=2"], "applies to model.tie_mode: lowrank or split only"),
])
def test_the_cli_refuses_a_mode_in_one_line_and_writes_nothing(tiny_yaml, tmp_path, extra, message):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    args = ["train", "--config", str(tiny_yaml), "--out", str(tmp_path / "runs")]
    r = CliRunner().invoke(app, [*args, *(a for e in extra for a in ("--set", e))])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_flops_count_the_modes_head():
    from tiedlm.model.counting import flops_per_token

    m = dataclasses.replace(BASE, tie_mode=None)
    plain = flops_per_token(m, V)
    proj = flops_per_token(dataclasses.replace(m, tie_mode="projection"), V)
    assert proj["forward"] - plain["forward"] == 2 * 16 * 16 and proj["train"] == 3 * proj["forward"]
    low = dataclasses.replace(m, tie_mode="lowrank", untie_rank=4)
    assert flops_per_token(low, V) == plain  # without a batch the formation is no per-token cost
    spread = flops_per_token(low, V, tokens_per_forward=64)
    assert spread["head_formation"] == 2 * V * 16 * 4 / 64  # E + A·Bᵀ, once per forward, over 64 tokens
    assert spread["train"] == pytest.approx(plain["train"] + 6 * V * 16 * 4 / 64)  # and A, B's gradients
