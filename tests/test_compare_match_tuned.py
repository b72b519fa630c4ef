"""compare --config --match params / params:width: the matched variant tuned like the others, the
two contrasts (tied vs untied at equal architecture, matched vs untied at equal parameters) judged
by Holm over the two, --seeds auto deciding on the primary one, the width match against a brute
force count, and the refusals. A stand-in trainer (tests/test_compare_tuning.py's kind): no model
is trained, the losses are given per variant and seed."""

import csv
import dataclasses
import io
import json
import math
import re
import shutil
import types
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tests.test_compare import V, make_run
from tiedlm import runs as run_folder
from tiedlm.compare import sequential as S
from tiedlm.compare.matching import match_params, match_width
from tiedlm.compare.stats import holm
from tiedlm.config import load_config
from tiedlm.model.counting import count_params_config
from tiedlm.errors import ConfigError
from .conftest import comparison_dir

BEST_LR = 2e-3  # every variant's best lr: interior to the grid, so no extension
GRID = ["train.lr=1e-3,2e-3,4e-3"]
# test loss per variant (plain tied, matched, untied) and seed: the primary contrast has raw p < 0.05
# but p > 0.025 (so Holm doubles it past 0.05 only if the other is not smaller), the matched one a tiny p
TEST_LOSS = {"tied": [3.94, 3.88, 3.93], "matched": [3.80, 3.805, 3.81], "untied": [4.00, 4.00, 4.01]}


def variant_of(cfg) -> str:
    if not cfg.model.tie_embeddings:
        return "untied"
    return "tied" if (cfg.model.n_layer, cfg.model.n_embd) == (2, 64) else "matched"


@pytest.fixture
def stand_in(monkeypatch):
    """A train_run stand-in writing a finished run: validation perplexity a parabola in log lr
    (best at BEST_LR), test loss TEST_LOSS[variant][seed]. Records the runs it trained."""
    import tiedlm.data

    state = types.SimpleNamespace(calls=[], test=TEST_LOSS)

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        run_dir = Path(out) / name
        if run_folder.existing_state(run_dir, cfg) == "finished":
            return run_dir
        state.calls.append(name)
        shutil.rmtree(run_dir, ignore_errors=True)
        which = variant_of(cfg)
        shift = {"tied": 0, "matched": -1, "untied": 1}[which]
        val = 50.0 * (1.0 + 0.5 * math.log(cfg.train.lr / BEST_LR) ** 2) + shift
        test = math.exp(state.test[which][cfg.seed % len(state.test[which])])
        return make_run(Path(out), name, cfg.seed, val=val, test=test, cfg=cfg)

    monkeypatch.setattr(tiedlm.data, "prepare_data",
                        lambda cfg, progress=True: types.SimpleNamespace(model_vocab_size=V))
    state.train = train_run
    return state


def config(tmp_path: Path, model: str = "") -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n" + model
                    + "train:\n  max_steps: 20\n  warmup_steps: 2\n  lr: 2.0e-3\n  min_lr: 2.0e-4\n")
    return path


def compare(tmp_path, stand_in, match="params", tune=GRID, seeds=3, **kw):
    return E.compare_config(config(tmp_path), [], seeds=seeds, match=match, tune=tune, runs_dir=tmp_path / "runs",
                            progress=False, train=stand_in.train, **kw)


def test_match_params_with_tuning_tunes_the_matched_variant_and_judges_both_contrasts_by_holm(tmp_path, stand_in):
    c = compare(tmp_path, stand_in)
    m = c.match
    assert m.by == "depth" and m.matched_n_layer == 2 + round(V * 64 / m.layer_params)
    # three variants, each tuned on its own grid: 3 points on tuning seed 0, then seeds 1 and 2 at its choice
    assert [v.tag for v in c.tuning.variants] == ["tied", "untied", "tied-matched"]
    assert all(v.chosen.point["train.lr"] == BEST_LR and not v.extensions for v in c.tuning.variants)
    assert len(stand_in.calls) == 3 * 3 + 3 * 2 == len(set(stand_in.calls))
    tags = ("tied", "untied", "tied-matched")
    assert sorted(r.name for r in c.runs) == sorted(f"tiny-{t}-lr=0.002-s{s}" for t in tags for s in range(3))
    assert c.primary == "test"
    assert c.tuning.shared["variant"] == "tied, n_layer=2"  # the shared-value verdict is the primary contrast's

    # the two contrasts against untied, the primary one (equal architecture) first, Holm over the two
    fam = c.family
    tied, matched, untied = (c.variant("tied, n_layer=2"), c.variant(f"tied, n_layer={m.matched_n_layer}"),
                             c.variant("untied, n_layer=2"))
    assert fam.reference == untied.label and [x.label for x in fam.members] == [tied.label, matched.label]
    assert [x.role for x in fam.members] == ["primary", "matched"]
    p1, p2 = tied.contrast("test").p_value, matched.contrast("test").p_value
    assert p2 < p1 < 0.05 and 2 * p2 < 0.05 < 2 * p1  # raw p-values both below 0.05
    assert [x.p_holm for x in fam.members] == pytest.approx(holm([p1, p2]))
    assert fam.members[0].p_holm == pytest.approx(max(p1, 2 * p2))  # by hand: the larger kept, the smaller doubled
    assert fam.members[1].p_holm == pytest.approx(2 * p2)
    assert tied.contrast("test").significant is True  # p1 < 0.05 and the gate (2·p2 < 0.05) is passed
    assert matched.contrast("test").significant is True
    # the first verdict is the primary contrast's, and it names the adjustment
    first = c.verdicts[0]
    assert first.startswith("Tied vs untied at equal architecture (the primary contrast): **tied, n_layer=2**")
    assert "Holm-adjusted over the two contrasts p=" in first and "significant at 0.05 after Holm" in first
    assert any(line.startswith("Matched tied vs untied at equal parameters: **" + matched.label) for line in c.verdicts)
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "### The two contrasts (test)" in md and "| Holm p |" in md
    assert "## Parameter matching (--match params)" in md and "| tied-matched | " in md  # its tuning row
    data = json.loads((comparison_dir(tmp_path / "runs") / "comparison.json").read_text())
    got = {x["role"]: x for x in data["match_contrasts"]["contrasts"]}
    assert got["primary"]["p_holm"] == pytest.approx(max(p1, 2 * p2)) and got["matched"]["significant"] is True


@pytest.mark.parametrize("match", ["params", "params:width"])
def test_compare_folder_finds_the_match_and_judges_the_same_family(tmp_path, stand_in, match):
    """`tiedlm compare FOLDER` on a --match comparison's runs: the match recognised from the
    variants, the two contrasts Holm-adjusted as compare --config did, in .json and .csv."""
    c = compare(tmp_path, stand_in, match=match)
    again = C.compare_runs([tmp_path / "runs"], runs_dir=tmp_path / "runs", out=tmp_path / "again")
    assert again.match is not None and again.match.by == c.match.by
    assert (again.match.matched_n_layer, again.match.matched_n_embd) == (c.match.matched_n_layer,
                                                                          c.match.matched_n_embd)
    assert [(m.role, m.label) for m in again.family.members] == [(m.role, m.label) for m in c.family.members]
    assert [m.p_holm for m in again.family.members] == pytest.approx([m.p_holm for m in c.family.members])
    assert [m.significant for m in again.family.members] == [m.significant for m in c.family.members]
    assert any("--match " + match + " comparison's" in n for n in again.notes)
    data = json.loads((tmp_path / "again" / "comparison.json").read_text())
    assert [x["role"] for x in data["match_contrasts"]["contrasts"]] == ["primary", "matched"]
    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO((tmp_path / "again" / "comparison.csv").read_text()))
            if r["row_type"] == "variant"}
    for m in again.family.members:
        assert float(rows[m.label]["test_p_holm"]) == pytest.approx(m.p_holm)
        assert rows[m.label]["match_role"] == m.role and rows[m.label]["test_significant"] == str(m.significant)


def test_a_tuned_compare_refuses_a_tuning_record_it_did_not_write_before_training(tmp_path, stand_in):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tuning.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"tuning.json was not written by tiedlm, or was changed since — move it "
                                          r"away, or train into another folder \(out: in a grid file, --out"):
        compare(tmp_path, stand_in)
    assert stand_in.calls == [] and (tmp_path / "runs" / "tuning.json").read_text() == "{}"


def test_a_tuned_compare_leaves_no_record_beside_other_runs_or_after_seeds_auto(tmp_path, stand_in):
    """tuning.json speaks for every run of its folder: beside another command's runs, or with the
    sequential design's levels (which it does not carry), none is written, and a note says why."""
    runs = tmp_path / "runs"
    make_run(runs, "other-tied-s0", 0, ["model.tie_embeddings=true"], val=50.0)
    c = compare(tmp_path, stand_in, tune=["train.lr=2e-3"], seeds=2)
    assert not (runs / "tuning.json").exists()
    assert any("no tuning.json was left in the runs folder" in n and "other-tied-s0" in n and "--out" in n
               for n in c.notes)
    alone = tmp_path / "alone"
    alone.mkdir()
    c = E.compare_config(config(alone), [], seeds="auto", max_seeds=3, match="params", tune=["train.lr=2e-3"],
                         runs_dir=alone / "runs", progress=False, train=stand_in.train)
    assert not (alone / "runs" / "tuning.json").exists()
    assert any("sequential design (--seeds auto)" in n for n in c.notes)


def test_an_earlier_commands_record_is_not_called_absent(tmp_path, stand_in):
    """A second tuned command into a folder whose tuning.json an earlier one wrote: its own record
    is not written (the folder holds the other's runs), and its note says the record there is the
    earlier command's, never that no tuning.json was left."""
    runs = tmp_path / "runs"
    compare(tmp_path, stand_in, match=None, tune=["train.lr=2e-3"], seeds=2)
    before = (runs / "tuning.json").read_text()
    c = E.compare_config(config(tmp_path), ["train.warmup_steps=3"], seeds=2, match=None, tune=["train.lr=2e-3"],
                         runs_dir=runs, progress=False, train=stand_in.train)
    assert (runs / "tuning.json").read_text() == before
    notes = [n for n in c.notes if "tuning.json" in n]
    assert len(notes) == 1 and "no tuning.json was left" not in notes[0]
    assert notes[0].startswith("this command's tuning.json was not written: ")
    assert f"the tuning.json in {runs} is an earlier command's and speaks for its runs, not these" in notes[0]


def test_only_the_depth_or_width_a_match_would_choose_is_taken_for_one(tmp_path, stand_in):
    """found_match on a --match comparison's variants, then with the grown one a layer deeper, with
    another block size (a key that is neither grown nor tuned), and without the untied one."""
    from tiedlm.compare.matching import found_match

    c = compare(tmp_path, stand_in, match="params", tune=["train.lr=2e-3"], seeds=1)
    variants = c.variants
    assert found_match(variants, ["train.lr"]).matched_n_layer == c.match.matched_n_layer

    def changed(v, **model):
        cfg = dataclasses.replace(v.config, model=dataclasses.replace(v.config.model, **model))
        return dataclasses.replace(v, config=cfg)

    grown = c.variant(c.family.members[1].label)
    deeper = [changed(v, n_layer=v.config.model.n_layer + 1) if v is grown else v for v in variants]
    assert found_match(deeper, ["train.lr"]) is None
    other = [changed(v, block_size=32) if v is grown else v for v in variants]
    assert found_match(other, ["train.lr"]) is None
    assert found_match([v for v in variants if v.tied], ["train.lr"]) is None


def test_holm_can_take_back_a_raw_significance(tmp_path, stand_in):
    """Both raw p-values between 0.025 and 0.05: neither passes Holm's first step, so neither is significant."""
    stand_in.test = {"tied": [3.94, 3.88, 3.93], "matched": [3.94, 3.88, 3.925], "untied": [4.00, 4.00, 4.01]}
    c = compare(tmp_path, stand_in, tune=["train.lr=2e-3"], seeds=3)
    ps = [c.variant(x.label).contrast("test").p_value for x in c.family.members]
    assert all(0.025 < p < 0.05 for p in ps)
    assert all(x.significant is False for x in c.family.members)
    assert all(c.variant(x.label).contrast("test").significant is False for x in c.family.members)
    assert "not significant at 0.05 after Holm's adjustment over the two contrasts (its 95% interval, not adjusted, " \
           "excludes 0%)" in c.verdicts[0]


def test_match_params_width_grows_n_embd_by_the_head_size_and_is_tuned_too(tmp_path, stand_in):
    c = compare(tmp_path, stand_in, match="params:width", seeds=1)
    m = c.match
    assert m.by == "width" and m.matched_n_layer == 2 and m.matched_n_embd % 32 == 0
    assert m.matched_n_head == m.matched_n_embd // 32 and m.matched_n_embd > 64
    assert [v.tag for v in c.tuning.variants] == ["tied", "untied", "tied-matched-width"]
    assert len(stand_in.calls) == 3 * 3  # one seed: the tuning seed's runs are the compared ones
    wide = next(v for v in c.variants if v.config.model.n_embd == m.matched_n_embd)
    assert wide.tied and wide.config.model.n_head == m.matched_n_head and wide.params["total"] == m.matched_total
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "## Parameter matching (--match params:width)" in md
    assert f"n_embd={m.matched_n_embd} ({m.matched_n_head} heads of 32) instead of 64 (2 heads)" in md


def brute_force(model, vocab: int, step_heads: int = 1) -> int:
    """The n_embd, a multiple of the head size up to 8 times the config's, whose tied total is closest to untied."""
    head = model.n_embd // model.n_head
    untied = count_params_config(dataclasses.replace(model, tie_embeddings=False), vocab)["total"]
    tied = dataclasses.replace(model, tie_embeddings=True)
    best = None
    for k in range(model.n_head, 8 * model.n_head + 1, step_heads):
        extra = {"n_kv_head": k // (model.n_head // model.n_kv_head)} if model.n_kv_head else {}
        total = count_params_config(dataclasses.replace(tied, n_embd=k * head, n_head=k, **extra), vocab)["total"]
        if best is None or abs(total - untied) < abs(best[1] - untied):
            best = (k * head, total)
    return best[0]


@pytest.mark.parametrize("overrides, vocab, step", [
    (["model.n_layer=2", "model.n_head=2", "model.n_embd=64"], 2048, 1),
    (["model.n_layer=4", "model.n_head=4", "model.n_embd=128"], 8192, 1),
    (["model.n_layer=12", "model.n_head=12", "model.n_embd=768", "model.block_size=1024"], 50257, 1),
    (["model.arch=llama", "model.bias=false", "model.n_layer=2", "model.n_head=4", "model.n_embd=64"], 4096, 1),
    (["model.arch=llama", "model.bias=false", "model.n_layer=2", "model.n_head=4", "model.n_kv_head=2",
      "model.n_embd=64"], 4096, 2),
])
def test_the_width_match_is_the_n_embd_closest_to_the_untied_count(overrides, vocab, step):
    model = load_config(None, ["train.max_steps=10", *overrides]).model
    m = match_width(model, vocab)
    assert m.matched_n_embd == brute_force(model, vocab, step)
    wide = dataclasses.replace(model, tie_embeddings=True, n_embd=m.matched_n_embd, n_head=m.matched_n_head,
                               **({"n_kv_head": m.matched_n_kv_head} if m.matched_n_kv_head else {}))
    assert count_params_config(wide, vocab)["total"] == m.matched_total
    assert m.untied_total == count_params_config(dataclasses.replace(model, tie_embeddings=False), vocab)["total"]
    head = model.n_embd // model.n_head
    assert m.matched_n_embd == m.matched_n_head * head  # the head size kept
    if model.n_kv_head:
        assert m.matched_n_head // m.matched_n_kv_head == model.n_head // model.n_kv_head  # heads per kv head kept
    assert match_params(model, vocab, "width") == m


def test_seeds_auto_with_match_decides_on_the_primary_contrast(tmp_path, stand_in):
    stand_in.test = {"tied": [3.94, 3.88, 3.93, 3.93], "matched": [3.80, 3.805, 3.81, 3.80],
                     "untied": [4.00, 4.00, 4.01, 4.02]}
    c = compare(tmp_path, stand_in, tune=None, seeds="auto", max_seeds=4)
    seq, fam = c.sequential, c.family
    tied = c.variant("tied, n_layer=2")
    assert seq.contrast == "tied vs untied at equal architecture: tied, n_layer=2 vs untied, n_layer=2 on validation"
    assert fam.sequential and fam.primary.label == tied.label
    n = seq.seeds
    assert n == 3 and seq.stopped_because == "efficacy" and len(stand_in.calls) == 3 * 3  # no spread on validation
    assert fam.primary.level == S.threshold(n, 4) and fam.primary.half == S.threshold(n, 4, 0.025)
    assert fam.members[1].level == 0.05 and fam.members[1].half == 0.025
    assert all(x.p_holm is None for x in fam.members)
    md = (comparison_dir(tmp_path / "runs") / "comparison.md").read_text()
    assert "looking at the primary contrast (tied vs untied at equal architecture: tied, n_layer=2 vs untied" in md
    assert "decided on the primary contrast, tied vs untied at equal architecture" in md
    assert "sequential design's adjusted level" in c.verdicts[0] or "not significant" in c.verdicts[0]


@pytest.mark.parametrize("options, message", [
    ({"match": "params:height"}, "--match 'params:height' is not known — choose params (the tied model deeper"),
    ({"match": "width"}, "--match 'width' is not known"),
    ({"match": "params", "tune": ["model.n_layer=2,3"]}, "--match params sets model.n_layer for the matched variant"),
    ({"match": "params:width", "tune": ["model.n_head=2,4"]}, "--match params:width sets model.n_head"),
    ({"match": "params", "tune": ["model.n_embd=64,128"]}, "--match params with model.n_embd tuned"),
])
def test_a_bad_match_is_refused_in_one_line_before_training(tmp_path, stand_in, options, message):
    options = {"tune": None, **options}
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        compare(tmp_path, stand_in, seeds=1, **options)
    assert "\n" not in str(info.value) and stand_in.calls == []


def test_real_width_match_on_a_tiny_llama_with_grouped_query_attention(tmp_path):
    """train.py for real (CPU, 2 steps): the grown model builds, and its own count is the match's."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("""\
name: tiny
data:
  synthetic: {vocab_size: 120, n_classes: 6, successors: 2, train_tokens: 3000, validation_tokens: 600,
              test_tokens: 600}
model: {arch: llama, bias: false, n_layer: 1, n_head: 4, n_kv_head: 2, n_embd: 16, block_size: 16}
train: {device: cpu, dtype: fp32, batch_size: 2, max_steps: 2, warmup_steps: 1, eval_every: 2,
        eval_tokens: 64, checkpoint_every: 0, log_every: 2}
""")
    c = E.compare_config(cfg, [], seeds=1, match="params:width", runs_dir=tmp_path / "runs", progress=False)
    m = c.match
    assert (m.matched_n_embd, m.matched_n_head, m.matched_n_kv_head) == (24, 6, 3)  # 4 heads of 4, 2 per kv head
    assert sorted(r.name for r in c.runs) == ["tiny-tied-matched-width-s0", "tiny-tied-s0", "tiny-untied-s0"]
    wide = next(v for v in c.variants if v.config.model.n_embd == 24)
    assert wide.params["total"] == m.matched_total and not c.train_failures
    untied = next(v for v in c.variants if not v.tied)
    assert untied.params["total"] == m.untied_total
