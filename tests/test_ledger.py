"""The confound ledger (tiedlm/runs/ledger.py): what each variant's E and W_out received, checked
against built models and their optimizer, recorded by a training run, and rendered by compare
(with runs written before the ledger computed from their stored configs)."""

import json
import math

import pytest

import tiedlm.compare as C
from tests.test_compare import TIED, UNTIED, make_run
from tiedlm import runs as run_folder
from tiedlm.runs.ledger import FROM_CONFIG, INIT_STD, RECORDED, Ledger, differences, differs_sentence, ledger_of
from .conftest import comparison_dir

V = 64
MODES = {  # overrides -> (W_out is E, W_out's values equal E's at the start)
    "tied": ([], True, True),
    "untied": (["model.tie_embeddings=false"], False, False),
    "soft": (["model.tie_embeddings=false", "model.tie_mode=soft", "model.tie_strength=0.1"], False, True),
    "pull": (["model.tie_embeddings=false", "model.tie_mode=pull", "model.tie_strength=10"], False, True),
    "projection": (["model.tie_mode=projection"], True, True),
    "lowrank": (["model.tie_mode=lowrank", "model.untie_rank=4"], True, True),
    "split": (["model.tie_mode=split", "model.untie_rank=4"], True, True),
    "untie_at": (["model.untie_at=0.5"], True, True),
}


def _built(cfg):
    import torch

    from tiedlm.model.blocks import GPT, count_params
    from tiedlm.train.step import build_optimizer

    torch.manual_seed(0)
    model = GPT(cfg.model, V)
    return model, build_optimizer(model, cfg.train), count_params(model)


def _decay_of(optimizer, p) -> float:
    return next(g["weight_decay"] for g in optimizer.param_groups if any(q is p for q in g["params"]))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("decay_embeddings", [True, False])
def test_the_ledger_says_what_a_built_model_and_its_optimizer_give_the_matrices(tiny, mode, decay_embeddings):
    import torch

    overrides, shared, equal = MODES[mode]
    cfg = tiny(*overrides, "train.weight_decay=0.05", f"train.decay_embeddings={str(decay_embeddings).lower()}",
               "train.lr=0.003")
    model, optimizer, params = _built(cfg)
    g = ledger_of(cfg, params)
    e, w_out = model.transformer.wte.weight, model.lm_head.weight
    assert (w_out is e) == shared
    assert torch.equal(w_out, e) == equal and g.head_init.startswith("its own draw") == (not equal)
    assert e.std().item() == pytest.approx(INIT_STD, rel=0.1) and g.init_std_e == INIT_STD
    assert w_out.std().item() == pytest.approx(INIT_STD, rel=0.1) and g.init_std_w_out == INIT_STD
    assert g.weight_decay_e == _decay_of(optimizer, e) == (0.05 if decay_embeddings else 0.0)
    own = {"projection": [model.head_proj] if mode == "projection" else [],
           "lowrank": [model.head_a, model.head_b] if mode == "lowrank" else [],
           "split": [model.head_own] if mode == "split" else []}.get(mode, [w_out])
    own = [p.weight if hasattr(p, "weight") else p for p in own]
    assert {_decay_of(optimizer, p) for p in own} == {g.weight_decay_w_out}
    assert g.weight_decay_other == _decay_of(optimizer, model.transformer.h[0].attn.c_attn.weight) == 0.05
    assert (g.lr, g.min_lr, g.tie) == (0.003, cfg.train.min_lr, cfg.model.tie.label)
    assert g.vd == V * 16 and g.vd_share == pytest.approx(V * 16 / sum(p.numel() for p in model.parameters()))
    assert ("untie_at" in g.head_init) == (mode == "untie_at")


@pytest.mark.parametrize("overrides, trainable, frozen", [
    (["model.tie_embeddings=false"], "head", "E and the blocks"),
    ([], "head", "the blocks"),  # tied: E is W_out, and trains
    (["model.tie_embeddings=false"], "embeddings", "the blocks"),
    (["model.tie_embeddings=false"], "all", "nothing"),
])
def test_the_ledger_says_what_train_trainable_froze(tiny, overrides, trainable, frozen):
    from tiedlm.model.blocks import freeze_all_but

    cfg = tiny(*overrides, f"train.trainable={trainable}")
    model, _, params = _built(cfg)
    freeze_all_but(model, trainable)
    g = ledger_of(cfg, params)
    assert g.frozen == frozen
    assert model.transformer.wte.weight.requires_grad == ("E" not in frozen)
    assert model.lm_head.weight.requires_grad
    assert model.transformer.h[0].attn.c_attn.weight.requires_grad == (frozen == "nothing")


@pytest.mark.parametrize("overrides, trainable", [
    (["model.tie_embeddings=false"], "head"),  # E and the blocks frozen
    ([], "head"),  # tied: E is W_out and trains; the blocks frozen
    (["model.tie_embeddings=false"], "embeddings"),
    (["model.tie_mode=projection"], "embeddings"),  # P is not an embedding matrix: frozen
    (["model.tie_mode=projection"], "head"),
])
def test_the_ledger_gives_no_weight_decay_to_what_train_trainable_froze(tiny, overrides, trainable):
    """A frozen matrix is not in the optimizer, so the ledger gives it no decay (it listed
    train.weight_decay on a frozen E and frozen blocks)."""
    from tiedlm.model.blocks import freeze_all_but
    from tiedlm.runs.ledger import run_lines
    from tiedlm.train.step import build_optimizer

    cfg = tiny(*overrides, f"train.trainable={trainable}", "train.weight_decay=0.05")
    model, _, params = _built(cfg)
    freeze_all_but(model, trainable)
    optimizer = build_optimizer(model, cfg.train)
    g = ledger_of(cfg, params)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    w_out = model.head_proj.weight if cfg.model.tie.mode == "projection" else model.lm_head.weight
    for field, p in (("weight_decay_e", model.transformer.wte.weight), ("weight_decay_w_out", w_out),
                     ("weight_decay_other", model.transformer.h[0].attn.c_attn.weight)):
        decay = getattr(g, field)
        assert (decay is None) == (id(p) not in trained), field
        assert decay is None or decay == _decay_of(optimizer, p)
    assert "— (frozen)" in "\n".join(run_lines(g))


def _recorded(cfg):
    """The parameters a training run records of the model it built (train._params)."""
    import types

    from tiedlm.model.blocks import build_model
    from tiedlm.train import _params

    return _params(build_model(cfg.model, V), types.SimpleNamespace(model_vocab_size=V, vocab_size=V))


def test_the_ledger_reads_biases_from_the_built_model_not_model_bias(tiny):
    """model.bias is tiedlm's own blocks' key: a transformers GPT-2 has biases although its config
    leaves model.bias false, and the ledger said 'model.bias yes vs no' between the two GPT-2s."""
    pytest.importorskip("transformers")
    ours, theirs = tiny(), tiny("model.arch=hf", "model.hf_config=gpt2")
    a, b = ledger_of(ours, _recorded(ours)), ledger_of(theirs, _recorded(theirs))
    assert a.block_biases == b.block_biases == "yes" and a.lm_head_bias is b.lm_head_bias is False
    found = differences(a, b, ours, theirs)
    assert not any("bias" in f for f in found), found
    bare = tiny("model.bias=false")
    assert "biases of the blocks' matrices no vs yes" in differences(ledger_of(bare, _recorded(bare)), b, bare, theirs)
    phi = tiny("model.arch=hf", "model.hf_config=phi", "model.tie_embeddings=false")
    assert ledger_of(phi, _recorded(phi)).lm_head_bias is True  # Phi's head has a bias of its own
    qwen = tiny("model.arch=hf", "model.hf_config=qwen2")
    assert ledger_of(qwen, _recorded(qwen)).block_biases == "6 of 14 matrices"  # q, k and v of 2 blocks
    assert ledger_of(theirs, None).block_biases is None  # not recorded: not guessed from model.bias


def test_a_pretrained_start_is_the_checkpoint_s_initialisation(tiny):
    import dataclasses

    cfg = tiny("model.tie_embeddings=false")
    start = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from="exports/base-tied"))
    params = {"wte": 960, "total": 5960, "start": {"init_from": "exports/base-tied", "checkpoint_tied": True,
                                                   "start": "untied by copy: W_out starts as a copy of E"}}
    g = ledger_of(start, params)
    assert g.init == "the checkpoint exports/base-tied" and g.init_std_e is None and g.init_std_w_out is None
    assert g.head_init == "the checkpoint's (untied by copy: W_out starts as a copy of E)"
    fresh = ledger_of(cfg, params)
    assert differences(g, fresh, start, cfg) == [
        "initialisation the checkpoint exports/base-tied vs normal(0, 0.02), drawn at the run's seed",
        "block initialisation the checkpoint's vs normal(0, 0.02); residual projections 0.01 (0.02/√(2·2))",
        "init std of E — vs 0.02", "init std of W_out — vs 0.02"]  # model.init_from is said once, as init


def test_differences_name_what_is_not_the_tie(tiny):
    tied, untied = tiny(), tiny("model.tie_embeddings=false")
    a, b = ledger_of(tied, {"wte": 960, "total": 5000}), ledger_of(untied, {"wte": 960, "total": 5960})
    assert a.head_init != b.head_init and a.vd_share != b.vd_share  # the tie's own: not a confound
    assert differences(a, b, tied, untied) == []
    assert differs_sentence([]) == "the variants differ only in the tie."
    tuned = tiny("model.tie_embeddings=false", "train.lr=0.01", "train.decay_embeddings=false", "model.dropout=0.1")
    found = differences(a, ledger_of(tuned, None), tied, tuned)
    assert found == ["learning rate 0.001 vs 0.01", "weight decay on E 0.1 vs 0", "weight decay on W_out 0.1 vs 0",
                     "model.dropout 0 vs 0.1"]
    assert differs_sentence(found).startswith("they also differ in: learning rate 0.001 vs 0.01; weight decay on E")
    ratio = tiny("train.min_lr_ratio=0.5")  # the schedule's end, said once as the ledger's field
    assert differences(a, ledger_of(ratio, None), tied, ratio) == ["final learning rate 0.0001 vs 0.0005"]
    head = tiny("model.tie_embeddings=false", "train.trainable=head")
    assert differences(ledger_of(head, None), b, head, untied) == ["train.trainable head vs all"]


def test_a_mapping_value_is_said_as_yaml(tiny):
    """model.hf_overrides in a difference reads as a config writes it, not as a Python dict."""
    a, b = tiny("model.arch=hf", "model.hf_config=gpt2", "model.hf_overrides={layer_norm_epsilon: 1.0e-6}"), \
        tiny("model.arch=hf", "model.hf_config=gpt2")
    assert differences(ledger_of(a, None), ledger_of(b, None), a, b) == [
        "model.hf_overrides {layer_norm_epsilon: 1.0e-06} vs null"]


def test_a_ledger_survives_report_json_and_an_unreadable_one_is_recomputed(tiny):
    g = ledger_of(tiny(), {"wte": 960, "total": 5000})
    back = Ledger.from_json(json.loads(json.dumps(g.to_json())))
    assert back == g and back.source == RECORDED
    assert Ledger.from_json({"tie": "tied"}) is None and Ledger.from_json(None) is None
    assert ledger_of(tiny(), None).vd is None  # no parameter breakdown: V·d not recorded


def test_a_training_run_records_its_ledger(tiny, tmp_path):
    from tiedlm import train_run

    run = train_run(tiny("model.tie_embeddings=false", "train.decay_embeddings=false"), out=tmp_path, progress=False)
    report = run_folder.read_report(run)
    g = Ledger.from_json(report.ledger)
    assert g is not None and g.tie == "untied" and g.weight_decay_w_out == 0.0 and g.weight_decay_other == 0.1
    assert g.vd == report.params["wte"] and g.vd_share == pytest.approx(report.params["wte"] / report.params["total"])
    md = (run / "report.md").read_text()
    assert "## Confound ledger" in md and "- weight decay: E 0, W_out 0, other matrices 0.1" in md
    assert f"W_out at the start: its own draw, normal(0, {INIT_STD:g})" in md


def test_a_comparison_renders_the_ledger_and_says_what_else_differs(tmp_path):
    runs = tmp_path / "runs"
    for seed, (t, u) in enumerate(((57.0, 59.2), (58.1, 60.0), (57.4, 60.1))):
        make_run(runs, f"tied-s{seed}", seed, TIED + ["train.lr=0.003"], val=t)
        make_run(runs, f"untied-s{seed}", seed, UNTIED + ["train.lr=0.01"], val=u)
    # one run's report records its ledger; the others predate it and are computed from their configs
    record = run_folder.read_report(runs / "tied-s0")
    run_folder.RunRecord(runs / "tied-s0", record).write(ledger=ledger_of(record.config, record.params).to_json())
    c = C.compare_runs(runs_dir=runs)
    tied, untied = c.variant("tied, lr=0.003"), c.variant("untied, lr=0.01")
    assert tied.ledger.source == RECORDED and untied.ledger.source == FROM_CONFIG
    assert tied.vs_baseline.confounds == ["learning rate 0.003 vs 0.01"]
    assert "Besides the tie, it also differs from untied, lr=0.01 in: learning rate 0.003 vs 0.01" in tied.verdicts[0]
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "## Confound ledger" in md
    assert "- tied, lr=0.003 vs untied, lr=0.01: they also differ in: learning rate 0.003 vs 0.01." in md
    assert "| E itself (one matrix) | 0.003 → 0.0001 | 0.1 / 0.1 / 0.1 | 0.02 / 0.02 |" in md
    assert "Not recorded by the runs of untied, lr=0.01 (written before the ledger)" in md
    data = json.loads((comparison_dir(runs) / "comparison.json").read_text())
    assert data["variants"][1]["vs_baseline"]["confounds"] == ["learning rate 0.003 vs 0.01"]
    assert math.isclose(data["variants"][1]["ledger"]["vd_share"], tied.ledger.vd_share)


def test_a_tuned_key_s_difference_is_the_protocol_s_not_a_confound():
    """compare --tune: each variant at its own learning rate is what the protocol asks; the ledger
    names it as each variant's own choice, and only other differences as confounds."""
    import dataclasses

    from tiedlm.config import load_config
    from tiedlm.runs.ledger import differences, ledger_of

    a = load_config(None, ["train.max_steps=10", "train.warmup_steps=1", "train.lr=0.01"])
    b = load_config(None, ["train.max_steps=10", "train.warmup_steps=1", "train.lr=0.003",
                           "model.tie_embeddings=false", "model.dropout=0.1"])
    la, lb = ledger_of(a, None), ledger_of(b, None)
    assert any(x.startswith("learning rate") for x in differences(la, lb, a, b))  # untuned: a confound
    confounds = differences(la, lb, a, b, tuned=["train.lr"])
    chosen = differences(la, lb, a, b, tuned=["train.lr"], chosen=True)
    assert not any(x.startswith("learning rate") for x in confounds) and any("dropout" in x for x in confounds)
    assert any(x.startswith("learning rate 0.01 vs 0.003") for x in chosen) and not any("dropout" in x for x in chosen)
    assert dataclasses.is_dataclass(la)
