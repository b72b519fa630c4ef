"""model.tie_mode soft: W_out a matrix of its own, copied from E at the start, and the training loss
adding λ/2·‖W_out − E‖² (model.tie_strength λ). The counts against built models, the penalty's
gradient against the hand-written one, λ = 0 against an untied model started from E (bit-identical),
the order of ‖W_out − E‖ across λ on a run, the penalty kept out of every evaluation and out of the
logged loss, the export (untied, within 1e-5 of transformers), the config's refusals, analyze, and
resume bit-identical."""

import dataclasses
import json

import pytest
import torch

from tiedlm import runs
from tiedlm.config import ModelConfig, TrainConfig
from tiedlm.config import load_config as _load
from tiedlm.model.counting import flops_per_token
from tiedlm.errors import ConfigError, Interrupted
from tiedlm.model.blocks import GPT, count_params
from tiedlm.model.counting import count_params_config
from tiedlm.model.tie import Tie
from tiedlm.train.step import build_optimizer
from tiedlm.train.step import train_step

V = 61
BASE = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8)
ARCHS = ["gpt2", "llama"]
SOFT = ["model.tie_mode=soft"]


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: one thread is faster than many on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def load_config(path, overrides=()):
    return _load(path, ["train.max_steps=10", *overrides])


def model_cfg(arch="gpt2", strength=1.0, mode="soft"):
    m = dataclasses.replace(BASE, arch=arch, bias=arch == "gpt2")
    return m.with_tie(Tie(mode, strength=strength if mode == "soft" else 0.0))


def build(arch="gpt2", strength=1.0, mode="soft", seed=0):
    torch.manual_seed(seed)
    return GPT(model_cfg(arch, strength, mode), V)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, V, (3, 8), generator=g), torch.randint(0, V, (3, 8), generator=g)) for _ in range(n)]


def apart(model, scale=0.05):
    """Move W_out away from E (a soft model starts with W_out = E, where the penalty is 0)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=g) * scale)
    return model


# ------------------------------------------------------------------------------ the model and its counts


@pytest.mark.parametrize("arch", ARCHS)
def test_counts_match_the_built_model_and_untied(arch):
    model = build(arch)
    built, arith = count_params(model), count_params_config(model.cfg, V)
    assert built == arith
    assert built["tie_mode"] == "soft" and built["tied"] is False and built["lm_head"] == V * 16
    untied = count_params_config(model_cfg(arch, mode="untied"), V)
    assert {k: v for k, v in built.items() if k != "tie_mode"} == {k: v for k, v in untied.items() if k != "tie_mode"}


@pytest.mark.parametrize("arch", ARCHS)
def test_soft_starts_as_e_copied_with_untieds_e_and_blocks(arch):
    soft, untied = build(arch), build(arch, mode="untied")
    assert not soft.is_tied and soft.current_tie == Tie("soft", strength=1.0) and not soft.w_out_is_e
    assert torch.equal(soft.lm_head.weight, soft.transformer.wte.weight)  # a copy: equal, two Parameters
    assert soft.lm_head.weight is not soft.transformer.wte.weight
    for (name, a), (_, b) in zip(soft.named_parameters(), untied.named_parameters()):
        if name != "lm_head.weight":
            assert torch.equal(a, b), name  # the same random stream as untied at a seed
    assert soft.tie_distance().item() == 0.0 and soft.tie_penalty().item() == 0.0


def test_flops_add_the_penalty_once_per_step():
    soft, plain = model_cfg(strength=0.5), model_cfg(mode="untied")
    assert flops_per_token(soft, V) == flops_per_token(plain, V)  # without a step, no per-token cost
    f = flops_per_token(soft, V, tokens_per_forward=24, tokens_per_step=48)
    assert f["tie_penalty"] == 6 * V * 16 / 48  # 6·V·d once per optimizer step, over its tokens
    assert f["train"] == pytest.approx(flops_per_token(plain, V)["train"] + 6 * V * 16 / 48)
    assert f["forward"] == flops_per_token(plain, V)["forward"]  # evaluation has no penalty
    assert "tie_penalty" not in flops_per_token(model_cfg(strength=0.0), V, 24, 48)  # λ = 0 computes nothing


@pytest.mark.parametrize("arch", ARCHS)
def test_the_penalty_and_its_gradient_are_the_hand_written_ones(arch):
    lam = 3.0
    model = apart(build(arch, lam))
    W, E = model.lm_head.weight, model.transformer.wte.weight
    diff = (W - E).detach()
    penalty = model.tie_penalty()
    assert penalty.item() == pytest.approx(lam / 2 * diff.square().sum().item(), rel=1e-6)
    assert float(model.tie_distance()) == pytest.approx(diff.norm().item(), rel=1e-6)
    penalty.backward()
    assert torch.allclose(W.grad, lam * diff, atol=1e-7, rtol=1e-6)
    assert torch.allclose(E.grad, -lam * diff, atol=1e-7, rtol=1e-6)
    others = [p.grad for n, p in model.named_parameters() if n not in ("lm_head.weight", "transformer.wte.weight")]
    assert all(g is None for g in others)  # the penalty touches E and W_out only


def steps(model, data, tcfg=TrainConfig(lr=1e-2, weight_decay=0.1, grad_clip=1.0)):
    optimizer = build_optimizer(model, tcfg)
    params = list(model.parameters())
    it = iter(data)
    return [train_step(model, optimizer, params, lambda: next(it), None, tcfg, tcfg.lr) for _ in data]


@pytest.mark.parametrize("arch", ARCHS)
def test_strength_zero_trains_as_untied_started_from_e_to_the_bit(arch):
    soft = build(arch, 0.0)
    assert soft.tie_penalty() is None  # λ = 0: nothing computed
    untied = build(arch, mode="untied")
    with torch.no_grad():  # untie_at at step 0, had it been allowed: W_out a copy of E, fresh AdamW state
        untied.lm_head.weight.copy_(untied.transformer.wte.weight)
    data = batches(5)
    assert steps(soft, data) == steps(untied, data)
    for (name, a), (_, b) in zip(soft.named_parameters(), untied.named_parameters()):
        assert torch.equal(a, b), name


def test_the_step_logs_the_cross_entropy_and_adds_the_penalty_to_the_gradient():
    model = apart(build(strength=100.0))
    (x, y), = batches(1)
    with torch.no_grad():
        ce = model(x, y).item()
    twin = build(mode="untied")  # the same weights, no penalty
    twin.load_state_dict(model.state_dict())
    (loss, _), = steps(model, [(x, y)])
    (twin_loss, _), = steps(twin, [(x, y)])
    assert loss == pytest.approx(ce, rel=1e-6) and loss == twin_loss  # the loss is the cross-entropy alone
    assert not torch.equal(model.lm_head.weight, twin.lm_head.weight)  # but the penalty moved the weights


def test_evaluation_excludes_the_penalty():
    from tiedlm.evaluate import score_tokens

    model = apart(build(strength=1000.0), scale=0.5)
    twin = build(mode="untied")
    twin.load_state_dict(model.state_dict())
    tokens = torch.randint(0, V, (200,), generator=torch.Generator().manual_seed(3)).numpy()
    a = score_tokens(model.eval(), tokens, 8, 8, 4, torch.device("cpu"))
    b = score_tokens(twin.eval(), tokens, 8, 8, 4, torch.device("cpu"))
    assert model.tie_penalty().item() > 1.0  # a penalty that would show
    assert all(torch.equal(torch.as_tensor(u), torch.as_tensor(v)) for u, v in zip(a, b))


# ------------------------------------------------------------------------------ the config


def test_a_config_stores_soft_and_names_it():
    cfg = load_config(None, [*SOFT, "model.tie_strength=1e-2"])
    m = cfg.model
    assert (m.tie_embeddings, m.tie_mode, m.tie_strength) == (False, "soft", 0.01)
    assert m.tie == Tie("soft", strength=0.01) and (m.tie.label, m.tie.tag) == ("soft λ=0.01", "soft-l0.01")
    assert m.tie.two_matrices and not m.tie.built_from_e and m.tie.stored_mode == "soft"
    # another mode drops the strength (it belongs to soft), as another mode drops lowrank's rank
    for override, mode in (("model.tie_mode=tied", None), ("model.tie_embeddings=false", None),
                           ("model.tie_mode=untied", None)):
        other = load_config(None, [*SOFT, "model.tie_strength=1", override]).model
        assert (other.tie_mode, other.tie_strength) == (mode, 0.0), override


@pytest.mark.parametrize("overrides,message", [
    (SOFT, "model.tie_mode soft needs its strength — set model.tie_strength"),
    (["model.tie_strength=1"], "model.tie_strength 1 applies to model.tie_mode: soft or pull only"),
    (["model.tie_mode=lowrank", "model.untie_rank=2", "model.tie_strength=0.5"],
     "applies to model.tie_mode: soft or pull only"),
    ([*SOFT, "model.tie_strength=-1"], "model.tie_strength must be a finite number, 0 or more"),
    ([*SOFT, "model.tie_strength=.inf"], "model.tie_strength must be a finite number"),
    ([*SOFT, "model.tie_strength=1", "model.untie_at=0.5"], "model.tie_mode soft starts as two matrices already"),
    ([*SOFT, "model.tie_strength=1", "model.untie_rank=4"], "applies to model.tie_mode: lowrank or split only"),
])
def test_what_soft_refuses(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_a_file_that_says_soft_and_tied_is_refused(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  tie_mode: soft\n  tie_strength: 1\n")
    assert load_config(f).model.tie == Tie("soft", strength=1.0)  # soft alone is two matrices
    f.write_text("model:\n  tie_mode: soft\n  tie_strength: 1\n  tie_embeddings: true\n")
    with pytest.raises(ConfigError, match="model.tie_mode soft and model.tie_embeddings true disagree"):
        load_config(f)


def test_labels_name_the_strength_and_it_tunes_like_any_key():
    from tiedlm.compare.variants import label_variants
    from tiedlm.experiment.tuning_spec import spec_from_block

    configs = [load_config(None, [*SOFT, f"model.tie_strength={s}"]) for s in (0, 1, 100)]
    configs.append(load_config(None, ["model.tie_embeddings=false"]))
    labels, _ = label_variants(configs)
    assert labels == ["soft λ=0", "soft λ=1", "soft λ=100", "untied"]
    spec = spec_from_block({"model.tie_strength": [1e-3, 1e-2, 1e-1]}, "tune:")
    assert spec.keys == ["model.tie_strength"]


# ------------------------------------------------------------------------------ runs


def trajectory(run):
    return [r["w_out_minus_e"] for r in runs.read_metrics(run) if r["kind"] == "train"]


def test_strength_orders_the_distance_on_a_run(tiny, tmp_path):
    """‖W_out − E‖ logged at every log step: λ = 0 lets it grow, λ = 1 holds it, λ = 100 and 1000
    pull it back towards 0 (measured trajectories: docs/tie-modes.md, soft)."""
    common = ["train.max_steps=20", "train.lr=1e-2", "train.eval_every=0", "train.checkpoint_every=0", *SOFT]
    paths = {lam: train_run_quiet(tiny(*common, f"model.tie_strength={lam}"), tmp_path, f"l{lam}")
             for lam in (0, 1, 100, 1000)}
    final = {lam: trajectory(p)[-1] for lam, p in paths.items()}
    assert final[0] > final[1] > final[100] > 0
    big = trajectory(paths[1000])
    assert len(big) == 20 and max(big) < 0.25 * final[0] and big[-1] < 0.05 * final[0]
    rows = [r for r in runs.read_metrics(paths[100]) if r["kind"] == "train"]
    assert all(r["tie_penalty"] == pytest.approx(50 * r["w_out_minus_e"] ** 2) for r in rows)
    report = runs.read_report(paths[100])
    assert report.params["tie_mode"] == "soft" and report.params["lm_head"] == report.params["wte"]
    assert report.flops_per_token["tie_penalty"] > 0
    assert "Tying: **soft λ=100**" in (paths[100] / runs.REPORT_MD).read_text()


def train_run_quiet(cfg, out, name, **kw):
    from tiedlm.train import train_run

    return train_run(cfg, out=out, name=name, progress=False, **kw)


@pytest.mark.parametrize("arch", ARCHS)
def test_interrupt_and_resume_is_bit_identical(tiny, tmp_path, arch):
    from safetensors.torch import load_file

    from tiedlm.runs import checkpoints

    cfg = tiny(*SOFT, "model.tie_strength=10", "model.dropout=0.1", f"model.arch={arch}")
    ref = train_run_quiet(cfg, tmp_path / "a", "r")
    with pytest.raises(Interrupted):
        train_run_quiet(cfg, tmp_path / "b", "r", stop_after_step=6)
    run = train_run_quiet(cfg, tmp_path / "b", "r")
    wa, wb = (load_file(str(checkpoints.latest_checkpoint(r) / checkpoints.MODEL_FILE)) for r in (ref, run))
    assert wa.keys() == wb.keys() and "lm_head.weight" in wb
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    def rows(r):
        return [(x["kind"], x["step"], x.get("loss"), x.get("w_out_minus_e")) for x in runs.read_metrics(r)]

    assert rows(ref) == rows(run) and len(trajectory(run)) == 12
    final = [json.loads((r / "report.json").read_text())["final"] for r in (ref, run)]
    assert final[0] == final[1]


def test_analyze_reads_soft_as_two_matrices(tiny, tmp_path):
    from tiedlm.analyze import analyze_run

    run = train_run_quiet(tiny(*SOFT, "model.tie_strength=1"), tmp_path, "soft")
    result = analyze_run(run)
    assert result["tied"] is False and result["tie_mode"] == "soft" and result["tie_label"] == "soft λ=1"
    assert "W_out" in result["matrices"] and 0.0 < result["pair"]["cka"] < 1.0


@pytest.mark.parametrize("arch,mode", [("gpt2", "soft"), ("llama", "soft"), ("gpt2", "pull")])
def test_a_soft_run_exports_untied_and_transformers_agrees(tmp_path, arch, mode):
    pytest.importorskip("transformers")
    from tests.test_export import BASE as EXPORT, hf_load
    from tiedlm.evaluate import load_run_model
    from tiedlm.export import export_run, summary

    run = train_run_quiet(load_config(None, EXPORT + [f"model.tie_mode={mode}", "model.tie_strength=1",
                                                      f"model.arch={arch}"]), tmp_path, "soft")
    result = export_run(run, tmp_path / "hf")
    assert result.verified and not result.tied and result.mode == mode and result.max_abs_diff <= 1e-5
    assert f"{mode}, written untied: lm_head is its own W_out" in summary(result)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is False
    hf, _ = hf_load(tmp_path / "hf")
    rm = load_run_model(run)
    assert hf.lm_head.weight.data_ptr() != hf.get_input_embeddings().weight.data_ptr()
    x = torch.randint(0, rm.data.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert (hf(input_ids=x).logits - rm.model.eval()(x)).abs().max().item() <= 1e-5


# ------------------------------------------------------------------------------ split: the rank dial's ends


def split_cfg(rank, arch="gpt2"):
    m = dataclasses.replace(BASE, arch=arch, bias=arch == "gpt2")
    return m.with_tie(Tie("split", rank))


@pytest.mark.parametrize("rank", [0, 5, 16])
def test_split_counts_and_forward(rank):
    torch.manual_seed(0)
    model = GPT(split_cfg(rank), V)
    assert count_params(model) == count_params_config(model.cfg, V)
    assert count_params(model)["lm_head"] == V * rank and model.is_tied  # lm_head.weight is E
    E = model.transformer.wte.weight
    with torch.no_grad():
        if rank:
            model.head_own.add_(1.0)
    W = model.output_weight()
    assert torch.equal(W[:, rank:], E[:, rank:]) and (rank == 0 or torch.equal(W[:, :rank], model.head_own))
    (x, _), = batches(1)
    h = model.hidden(x)
    assert torch.allclose(model(x), h @ W.T, atol=1e-6)
    assert model.w_out_is_e is (rank == 0) and Tie("split", rank).label == f"split r={rank}"


def test_split_at_rank_zero_is_tied_to_the_bit():
    torch.manual_seed(0)
    tied = GPT(dataclasses.replace(BASE), V)
    torch.manual_seed(0)
    zero = GPT(split_cfg(0), V)
    data = batches(3)
    assert steps(tied, data) == steps(zero, data)
    theirs = dict(zero.named_parameters())
    assert [n for n in theirs if n not in dict(tied.named_parameters())] == ["head_own"]  # (V, 0)
    for name, a in tied.named_parameters():
        assert torch.equal(a, theirs[name]), name


@pytest.mark.parametrize("arch", ARCHS)
def test_split_at_full_rank_trains_as_untied_from_e(arch):
    """At r = d W_out's columns are all its own: the run is soft at λ = 0, untied from a tied start,
    the same weights after steps (to rounding: the optimizer sees the parameters in another order)."""
    torch.manual_seed(0)
    full = GPT(split_cfg(16, arch), V)
    soft = build(arch, 0.0)
    data = batches(5)
    assert [round(loss, 5) for loss, _ in steps(full, data)] == [round(loss, 5) for loss, _ in steps(soft, data)]
    assert torch.allclose(full.output_weight(), soft.lm_head.weight, atol=1e-6)
    assert torch.allclose(full.transformer.wte.weight, soft.transformer.wte.weight, atol=1e-6)


def test_split_runs_exports_and_refuses(tmp_path):
    pytest.importorskip("transformers")
    from tests.test_export import BASE as EXPORT
    from tiedlm.export import export_run

    run = train_run_quiet(load_config(None, EXPORT + ["model.tie_mode=split", "model.untie_rank=8"]), tmp_path, "s")
    assert runs.read_report(run).params["lm_head"] == 8 * runs.read_report(run).params["vocab_size"]
    result = export_run(run, tmp_path / "hf")
    assert result.verified and not result.tied and result.mode == "split" and result.max_abs_diff <= 1e-5
    with pytest.raises(ConfigError, match="model.tie_mode split needs its rank"):
        load_config(None, ["model.tie_mode=split"])
    with pytest.raises(ConfigError, match="W_out has 128 columns"):
        load_config(None, ["model.tie_mode=split", "model.untie_rank=129"])


# ------------------------------------------------------------------------------ pull: soft, decoupled


def pull_cfg(strength, arch="gpt2"):
    m = dataclasses.replace(BASE, arch=arch, bias=arch == "gpt2")
    return m.with_tie(Tie("pull", strength=strength))


def test_pull_moves_both_towards_their_mean_after_the_step():
    torch.manual_seed(0)
    model = apart(GPT(pull_cfg(10.0), V))
    assert count_params(model) == count_params_config(model.cfg, V) and count_params(model)["lm_head"] == V * 16
    assert model.tie_penalty() is None  # no term in the loss
    W, E = model.lm_head.weight, model.transformer.wte.weight
    diff, mean = (W - E).detach().clone(), ((W + E) / 2).detach().clone()
    model.pull_tie(0.01)  # c = lr·λ = 0.1 of D to each side
    assert torch.allclose(W - E, 0.8 * diff, atol=1e-7) and torch.allclose((W + E) / 2, mean, atol=1e-7)
    model.pull_tie(1.0)  # c capped at 1/2: the two meet at their mean
    assert torch.allclose(W, E, atol=1e-7) and torch.allclose(W, mean, atol=1e-7)
    f = flops_per_token(model.cfg, V, 24, 48)
    assert f["tie_penalty"] == 5 * V * 16 / 48
    assert Tie("pull", strength=100.0).label == "pull λ=100" and Tie("pull", strength=100.0).tag == "pull-l100"


@pytest.mark.parametrize("arch", ARCHS)
def test_pull_at_zero_is_untied_from_e_and_a_strong_pull_keeps_one_matrix(arch):
    """λ = 0 is soft at λ = 0 to the bit; lr·λ ≥ 1/2 averages W_out and E after every step, so
    they stay one matrix (to rounding), moved by the mean of their two Adam steps. How close that is
    to tied's loss is measured on the main job (docs/tie-modes.md), not asserted here."""
    torch.manual_seed(0)
    zero = GPT(pull_cfg(0.0, arch), V)
    soft = build(arch, 0.0)
    data = batches(4)
    assert steps(zero, data) == steps(soft, data)
    assert all(torch.equal(a, b) for a, b in zip(zero.parameters(), soft.parameters()))
    torch.manual_seed(0)
    strong = GPT(pull_cfg(1e4, arch), V)
    for batch in data:
        steps(strong, [batch])
        assert strong.tie_distance().item() < 1e-6
    assert not torch.equal(strong.transformer.wte.weight, zero.transformer.wte.weight)  # and it trained


def test_pull_runs_logs_its_distance_and_resumes(tiny, tmp_path):
    cfg = tiny("model.tie_mode=pull", "model.tie_strength=50", "model.dropout=0.1")
    ref = train_run_quiet(cfg, tmp_path / "a", "p")
    with pytest.raises(Interrupted):
        train_run_quiet(cfg, tmp_path / "b", "p", stop_after_step=5)
    run = train_run_quiet(cfg, tmp_path / "b", "p")
    rows = [r for r in runs.read_metrics(run) if r["kind"] == "train"]
    assert len(rows) == 12 and all("w_out_minus_e" in r and "tie_penalty" not in r for r in rows)
    assert rows == [{**r, "time": rows[i]["time"], "tokens_per_s": rows[i]["tokens_per_s"]}
                    for i, r in enumerate(x for x in runs.read_metrics(ref) if x["kind"] == "train")]
    assert runs.read_report(run).params["tie_mode"] == "pull"
    with pytest.raises(ConfigError, match="model.tie_mode pull needs its strength"):
        load_config(None, ["model.tie_mode=pull"])


@pytest.mark.parametrize("mode", ["soft", "pull"])
def test_compare_config_sets_the_mode_against_untied(mode):
    """compare --config on a soft or pull config compares that mode, at its strength, with untied
    (the untied variant has no strength), as it does the modes built from E."""
    from tiedlm.experiment.plan import variants_of
    from tiedlm.experiment.request import CompareRequest

    sets = [f"model.tie_mode={mode}", "model.tie_strength=0.5"]
    variants, _ = variants_of(CompareRequest(overrides=sets), load_config(None, sets))
    assert [tag for tag, _ in variants] == [f"{mode}-l0.5", "untied"]
    own = load_config(None, [*sets, *variants[0][1]]).model
    untied = load_config(None, [*sets, *variants[1][1]]).model
    assert (own.tie_mode, own.tie_strength, own.tie_embeddings) == (mode, 0.5, False)
    assert (untied.tie_mode, untied.tie_strength, untied.tie_embeddings) == (None, 0.0, False)


def test_untied_is_the_baseline_of_a_dial_not_the_dial_itself(tiny, tmp_path):
    """soft and pull have two matrices, as untied has; the comparison still sets them against the
    plain untied model (it was the first of the two-matrix variants, alphabetically, before)."""
    from tiedlm.compare import compare_runs

    for name, sets in (("pull", ["model.tie_mode=pull", "model.tie_strength=1"]),
                       ("soft", [*SOFT, "model.tie_strength=1"]), ("untied", ["model.tie_embeddings=false"])):
        train_run_quiet(tiny(*sets, "train.max_steps=4"), tmp_path, name)
    c = compare_runs(runs_dir=tmp_path, out=tmp_path / "cmp")
    assert c.baseline_label == "untied" and c.baseline_reason == "the untied variant"
    assert {v.label: v.tied for v in c.variants} == {"untied": False, "pull λ=1": True, "soft λ=1": True}
