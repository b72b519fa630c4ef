"""compare --select best|final: which weights' scores are compared, the default, the verdict on
test when validation chose the weights, the over-training notes, and the best step on the plot."""

import csv
import io
import json
import math

import pytest
from typer.testing import CliRunner

import tiedlm.compare as C
from tiedlm.compare.report import to_markdown
from tests.test_compare import TIED, UNTIED, edit_report, make_run, split_metrics
from tiedlm.cli import app
from tiedlm.errors import ConfigError, RunError
from tiedlm.train.selection import OVERTRAINED_MARGIN
from .conftest import comparison_dir

SEEDS = (0, 1, 2)
# Final (last weights) test perplexities: untied over-trained, tied not. Best weights: untied ahead.
TIED_LAST, TIED_BEST = (100.0, 101.0, 99.5), (99.0, 100.2, 98.9)
UNTIED_LAST, UNTIED_BEST = (130.0, 128.0, 133.0), (92.0, 93.5, 91.0)


def best_record(step: int, best_ppl: float, last_ppl: float) -> dict:
    above = last_ppl / best_ppl - 1
    return {"split": "validation", "eval_tokens": 65536, "evaluations": 20, "step": step, "tokens": step * 2048,
            "loss": math.log(best_ppl), "perplexity": best_ppl, "last_step": 1000, "last_tokens": 2_048_000,
            "last_loss": math.log(last_ppl), "last_perplexity": last_ppl, "last_above_best": above,
            "margin": OVERTRAINED_MARGIN, "overtrained": above > OVERTRAINED_MARGIN}


def make_runs(runs_dir, keep_best=(True,) * 6):
    """Tied and untied, three seeds each; runs with keep_best have final_best too."""
    flags = iter(keep_best)
    for tag, ov, last, best, step in (("tied", TIED, TIED_LAST, TIED_BEST, 950),
                                      ("untied", UNTIED, UNTIED_LAST, UNTIED_BEST, 300)):
        for seed, lp, bp in zip(SEEDS, last, best):
            run = make_run(runs_dir, f"w-{tag}-s{seed}", seed, ov, val=lp * 0.9, test=lp)
            kept = next(flags)
            edit_report(run, best=best_record(step + seed, bp * 0.9, lp * 0.9),
                        final_best={"validation": split_metrics(bp * 0.85), "test": split_metrics(bp)} if kept else None)


def test_default_is_best_when_every_run_kept_it_and_the_verdict_moves_to_test(tmp_path):
    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path)
    assert c.select == "best" and c.primary == "test" and "every run kept its best weights" in c.select_reason
    untied = next(v for v in c.variants if v.tied is False)
    mean_loss = sum(math.log(p) for p in UNTIED_BEST) / 3
    assert untied.metrics["test"].loss.mean == pytest.approx(mean_loss)  # the best weights' scores
    assert untied.metrics["validation"].loss.mean == pytest.approx(mean_loss + math.log(0.85))
    assert all(r.weights == "best" for r in c.runs)
    md = (comparison_dir(tmp_path) / "comparison.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("Weights compared"))
    assert "best validation evaluation" in line and "biased low" in line and "**test**" in line
    data = json.loads((comparison_dir(tmp_path) / "comparison.json").read_text())
    assert data["select"]["weights"] == "best" and data["primary"] == "test"
    assert data["confirmation"] == [] and not any("validation confirms" in v for v in c.verdicts)
    assert "Validation chose the compared weights" in md  # shown, biased, confirming nothing


def test_the_verdict_changes_between_final_and_best(tmp_path):
    make_runs(tmp_path)
    final = C.compare_runs(runs_dir=tmp_path, select="final", primary="test", out=tmp_path / "f")
    best = C.compare_runs(runs_dir=tmp_path, select="best", out=tmp_path / "b")

    def effect(c):  # the tied variant against the untied one on test, as a ratio of perplexities
        tied = next(v for v in c.variants if v.tied)
        untied = next(v for v in c.variants if v.tied is False)
        contrast = tied.contrast("test") or untied.contrast("test")
        sign = 1 if tied.contrast("test") else -1
        return sign * contrast.difference

    expected_final = sum(math.log(t / u) for t, u in zip(TIED_LAST, UNTIED_LAST)) / 3
    expected_best = sum(math.log(t / u) for t, u in zip(TIED_BEST, UNTIED_BEST)) / 3
    assert effect(final) == pytest.approx(expected_final) and expected_final < 0  # tied wins on the last weights
    assert effect(best) == pytest.approx(expected_best) and expected_best > 0  # untied wins on the best ones
    # the last-weights comparison says which runs ended over-trained, with how much and where the best was
    notes = [n for n in final.notes if "over-trained" in n]
    assert len(notes) == 6 - sum(1 for t, b in zip(TIED_LAST, TIED_BEST) if t / b - 1 <= OVERTRAINED_MARGIN)
    assert any(n.startswith("`w-untied-s0` is over-trained: final 41.3% above best at step 300") for n in notes)
    assert "compare --select best" in notes[0] and not [n for n in best.notes if "over-trained" in n]
    assert "ended over-trained: see the notes" in to_markdown(final)


def test_default_is_final_when_a_run_kept_no_best_weights(tmp_path):
    make_runs(tmp_path, keep_best=(True, True, True, True, True, False))
    c = C.compare_runs(runs_dir=tmp_path)
    assert c.select == "final" and c.primary == "validation" and c.select_reason.startswith("1 of 6 runs kept no")
    assert all(r.weights == "last" for r in c.runs)
    notes = [n for n in c.notes if "w-untied-s2" in n and "over-trained" in n]
    assert notes and "train.keep_best: true" in notes[0]  # that run can only be fixed by training again
    # --select best compares the runs that kept them, and says why the other is left out
    b = C.compare_runs(runs_dir=tmp_path, select="best", out=tmp_path / "b")
    assert sorted(r.name for r in b.runs) == sorted(f"w-{t}-s{s}" for t in ("tied", "untied") for s in SEEDS)[:5]
    assert [s.name for s in b.skipped] == ["w-untied-s2"] and "kept no best weights" in b.skipped[0].reason


def test_primary_validation_means_the_last_weights(tmp_path):
    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path, primary="validation")
    assert c.select == "final" and c.primary == "validation" and "--primary validation" in c.select_reason
    with pytest.raises(ConfigError, match="biased low"):
        C.compare_runs(runs_dir=tmp_path, primary="validation", select="best")


def test_select_best_with_no_kept_weights_is_an_error_naming_why(tmp_path):
    make_runs(tmp_path, keep_best=(False,) * 6)
    with pytest.raises(RunError, match="kept no best weights"):
        C.compare_runs(runs_dir=tmp_path, select="best")


def test_the_plot_data_and_csv_carry_each_runs_best_step(tmp_path):
    make_runs(tmp_path)
    c = C.compare_runs(runs_dir=tmp_path)
    untied = next(v for v in c.variants if v.tied is False)
    assert untied.best_points == [((300 + s) * 2048, p * 0.9) for s, p in zip(SEEDS, UNTIED_BEST)]
    assert (comparison_dir(tmp_path) / C.PLOTS["curve"]).read_bytes().startswith(b"\x89PNG")
    rows = list(csv.DictReader(io.StringIO((comparison_dir(tmp_path) / "comparison.csv").read_text())))
    run = next(r for r in rows if r["run"] == "w-untied-s0")
    assert (run["weights"], run["best_step"]) == ("best", "300")
    assert float(run["last_above_best"]) == pytest.approx(UNTIED_LAST[0] / UNTIED_BEST[0] - 1)
    md = (comparison_dir(tmp_path) / "comparison.md").read_text()
    assert "| best (300; +41.3%) |" in md


@pytest.mark.parametrize("args,message", [
    (["--select", "worst"], "--select 'worst' is not known"),
    (["--select", "best", "--primary", "validation"], "biased low"),
])
def test_cli_select_errors_are_one_line_exit_2(tmp_path, args, message):
    make_runs(tmp_path)
    r = CliRunner().invoke(app, ["compare", "--out", str(tmp_path), *args])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_prints_which_weights_it_compared(tmp_path):
    make_runs(tmp_path)
    r = CliRunner().invoke(app, ["compare", "--out", str(tmp_path), "--select", "final"])
    assert r.exit_code == 0, r.output
    assert "Weights compared: each run's last weights (--select final: chosen on the command line)" in r.stdout
    assert "  w-untied-s0: last evaluation +41.3% above its best (step 300)" in r.stdout.splitlines()
