"""Guards before a verdict: a run that does not beat its training split's unigram model, a budget
shorter than its warm-up (refused before training) or mostly warm-up (a warning), most runs still
improving at their last evaluation, evaluation lines found in train, and a protocol other than the
main job's said first. The unigram loss checked against independent arithmetic."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tiedlm.compare as C
from tests.test_compare import edit_report, make_run
from tiedlm import runs as run_folder
from tiedlm.compare.guards import OVERLAP_WARN
from tiedlm.config import load_config
from tiedlm.errors import ConfigError
from tiedlm.evaluate import summarize_nll, unigram_loss
from .conftest import comparison_dir

TIED, UNTIED = ["model.tie_embeddings=true", "train.warmup_steps=10"], ["model.tie_embeddings=false",
                                                                        "train.warmup_steps=10"]


def test_the_unigram_loss_is_add_one_smoothed_training_counts():
    counts = np.array([5, 0, 3, 2], dtype=np.int64)  # N = 10, V = 4
    targets = np.array([0, 1, 2, 0])
    by_hand = -(2 * math.log(6 / 14) + math.log(1 / 14) + math.log(4 / 14)) / 4
    assert unigram_loss(counts, targets) == pytest.approx(by_hand, rel=1e-12)
    out = summarize_nll(targets, np.ones(4), 5, train_counts=counts)
    assert out["unigram_loss"] == pytest.approx(by_hand, rel=1e-12)
    assert "unigram_loss" not in summarize_nll(targets, np.ones(4), 5)


def _with_unigram(run, loss: float) -> None:
    report = run_folder.read_report(run)
    final = {s: {**m, "unigram_loss": loss} for s, m in report.final.items()}
    edit_report(run, final=final)


def test_runs_that_do_not_beat_the_unigram_model_are_said_first(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _with_unigram(make_run(runs, f"t-s{seed}", seed, TIED, val=2000.0 + seed), math.log(400.0))
        _with_unigram(make_run(runs, f"u-s{seed}", seed, UNTIED, val=2050.0 + seed), math.log(400.0))
    c = C.compare_runs(runs_dir=runs)
    w = [x for x in c.warnings if "unigram" in x]
    assert len(w) == 1 and w[0].startswith("4 of 4 runs (")
    assert ("do not beat the unigram model of their training split on validation (perplexity 2,000.00–2,051.00 "
            "against the unigram model's 400.00)") in w[0]
    assert "nothing can be concluded about tying" in w[0]
    lines = C.format_terminal_table(c).splitlines()
    assert lines[1].startswith("warning: 4 of 4 runs")  # after the protocol line, before the table
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert md.index("**Warning:** 4 of 4 runs") < md.index("## Verdict")
    assert json.loads((comparison_dir(runs) / "comparison.json").read_text())["warnings"] == c.warnings
    said = "\n".join(c.verdicts)  # the guard says nothing can be concluded: no verdict is printed either
    assert "no verdict. None of their runs beats the unigram model" in said
    assert "significant" not in said and "confirms" not in said and "seeds per variant would" not in said


def test_runs_that_beat_it_get_no_such_warning(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _with_unigram(make_run(runs, f"t-s{seed}", seed, TIED, val=60.0 + seed), math.log(400.0))
        _with_unigram(make_run(runs, f"u-s{seed}", seed, UNTIED, val=62.0 + seed), math.log(400.0))
    assert not [x for x in C.compare_runs(runs_dir=runs).warnings if "unigram" in x]


def test_a_budget_shorter_than_its_warmup_is_refused_for_a_verdict_before_anything_is_written(tmp_path):
    from tiedlm.experiment import CompareRequest
    from tiedlm.experiment.plan import plan_comparison

    req = CompareRequest.of(config="configs/shakespeare.yaml", overrides=["train.max_tokens=100000"],
                            runs_dir=tmp_path / "runs")
    with pytest.raises(ConfigError, match=r"train\.warmup_steps 50 is more than the 49 optimizer steps the budget "
                                          r"gives \(train\.max_tokens 100,000 / \(32 batch x 64 tokens x 1 "
                                          r"grad_accum\)\).*lower train\.warmup_steps \(a tenth of the steps: 4\), set "
                                          r"train\.warmup=0\.1 \(a tenth of any budget\), or raise train\.max_tokens to "
                                          r"at least 102,400"):
        plan_comparison(req)
    assert not any(tmp_path.iterdir())


def test_one_run_shorter_than_its_warmup_warns_once_and_trains(tiny, tmp_path, capsys):
    """tiedlm train --set train.max_steps=10 is a smoke test: said once, and the run goes on."""
    from tiedlm.train import train_run

    run = train_run(tiny("train.max_steps=3", "train.warmup_steps=5", "train.eval_every=0"), out=tmp_path,
                    progress=False)
    err = capsys.readouterr().err
    assert err.count("warning: train.warmup_steps 5 is more than the 3 optimizer steps the budget gives "
                     "(train.max_steps 3)") == 1
    assert "so this run is a smoke test rather than a measurement (compare --config refuses it)" in err
    assert json.loads((run / "report.json").read_text())["status"] == "finished"


def test_runs_mostly_warming_up_are_said(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):  # the fabricated runs record 100 steps: a warm-up of 60 is most of them
        make_run(runs, f"t-s{seed}", seed, ["model.tie_embeddings=true", "train.warmup_steps=60"], val=60 + seed)
        make_run(runs, f"u-s{seed}", seed, ["model.tie_embeddings=false", "train.warmup_steps=60"], val=61 + seed)
    w = [x for x in C.compare_runs(runs_dir=runs).warnings if "warming up" in x]
    assert len(w) == 1 and w[0].startswith("4 of 4 runs") and "(t-s0: 60 warm-up steps of 100)" in w[0]


def test_most_runs_still_improving_is_a_verdict_about_the_budget(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        for name, tie, val in (("t", TIED, 60.0), ("u", UNTIED, 61.0)):
            run = make_run(runs, f"{name}-s{seed}", seed, tie, val=val + seed)
            last = seed == 0 or name == "t"  # 3 of 4 at their best at the last evaluation
            edit_report(run, best={"step": 100 if last else 75, "last_step": 100, "loss": 4.0, "last_loss": 4.0})
    w = [x for x in C.compare_runs(runs_dir=runs).warnings if "still improving" in x]
    assert len(w) == 1 and w[0].startswith("3 of 4 runs were still improving")
    for run in sorted(runs.glob("*-s1")):  # now 2 of 4: not most
        edit_report(run, best={"step": 75, "last_step": 100, "loss": 4.0, "last_loss": 4.1})
    assert not [x for x in C.compare_runs(runs_dir=runs).warnings if "still improving" in x]


@pytest.mark.parametrize("share, carve, warned", [(0.2, "random", True), (0.2, "contiguous", True),
                                                  (OVERLAP_WARN, "random", False), (0.004, "random", False)])
def test_evaluation_lines_found_in_train_are_said_with_the_fix(tmp_path, share, carve, warned):
    runs = tmp_path / "runs"
    row = {"unit": "lines", "min_chars": 30, "checked": 1000, "in_train": round(share * 1000), "share": share}
    for seed in (0, 1):
        for name, tie in (("t", TIED), ("u", UNTIED)):
            run = make_run(runs, f"{name}-s{seed}", seed, [*tie, f"data.carve={carve}"], val=60.0 + seed)
            edit_report(run, data={"overlap": {"validation": row, "test": row}})
    w = [x for x in C.compare_runs(runs_dir=runs).warnings if "also in the training split" in x]
    assert bool(w) == warned
    if warned:
        assert w[0].startswith("20% of the validation lines (200 of 1,000, of at least 30 characters) are also in")
        assert ("data.carve: contiguous" in w[0]) == (carve == "random")


def test_a_few_lines_in_a_small_split_are_not_a_leak(tmp_path):
    runs = tmp_path / "runs"
    row = {"unit": "lines", "min_chars": 32, "checked": 100, "in_train": 4, "share": 0.04}
    for seed in (0, 1):
        for name, tie in (("t", TIED), ("u", UNTIED)):
            edit_report(make_run(runs, f"{name}-s{seed}", seed, tie, val=60.0 + seed),
                        data={"overlap": {"validation": row}})
    assert not [x for x in C.compare_runs(runs_dir=runs).warnings if "also in the training split" in x]


def test_the_main_jobs_protocol_has_no_protocol_line(tmp_path):
    from tiedlm.compare.guards import protocol_differences, protocol_line

    assert protocol_line(protocol_differences("best", "test", ["train.lr"], [3, 3])) is None
    line = protocol_line(protocol_differences("final", "validation", [], [2, 3]))
    assert line.startswith("Protocol: untuned (") and "final weights" in line and "the verdict on validation" in line
    assert "2 seeds per variant (not 3)" in line
    # --tune train.lr=1e-2 (one point) and --tune model.dropout=0,0.1 (lr shared) are not the main job's
    one = protocol_line(protocol_differences("best", "test", [], [3, 3], one_point=True))
    assert one.startswith("Protocol: untuned (--tune gave one point")
    shared = protocol_line(protocol_differences("best", "test", ["model.dropout"], [3, 3]))
    assert shared.startswith("Protocol: the learning rate shared (tuned: model.dropout;")
