"""compare/: run folders built through the report schema, grouping and labelling, the baseline,
left-out runs, every output file. Also: test_compare_stats.py (the statistics),
test_compare_datasets.py (runs on different data), test_compare_config.py (compare --config)."""

import contextlib
import csv
import json
import math
import random
import re
import statistics
import struct
from pathlib import Path

import pytest

import tiedlm.compare as C
import tiedlm.experiment as E
from tiedlm import runs as run_folder
from tiedlm.compare.variants import label_variants
from tiedlm.config import load_config, to_yaml
from tiedlm.config.identity import config_hash
from tiedlm.errors import ConfigError, NotARunError, RunError
from tiedlm.formatting import percent
from tiedlm.config.naming import short_keys
from .conftest import comparison_dir

scipy_stats = pytest.importorskip("scipy.stats")  # the cross-check only; tiedlm itself needs no scipy

BUDGET = ["train.max_steps=100", "train.warmup_steps=10"]


def test_the_package_exports_what_users_call():
    """tiedlm.compare exports the entry points, the result's types and the output names; the
    statistics and the other internals are imported from their modules (tiedlm.compare.stats, ...).
    compare_config, which trains first, is the experiment side's (tiedlm.experiment)."""
    import tiedlm

    assert all(hasattr(C, name) for name in C.__all__)
    assert {"compare_runs", "judge", "glance", "Comparison", "Variant", "COMPARE_DIR", "PLOTS"} <= set(C.__all__)
    assert all(hasattr(E, name) for name in E.__all__) and "compare_config" in E.__all__
    assert not {"betainc", "holm", "t_sf", "label_variants", "discover", "short_keys"} & set(C.__all__)
    assert tiedlm.compare_runs is C.compare_runs and tiedlm.compare_config is E.compare_config
V = 2048  # the fabricated runs' model vocabulary
BUCKETS = ("top 10%", "next 40%", "rest", "unseen")
PNG = b"\x89PNG\r\n\x1a\n"


@contextlib.contextmanager
def raises_exactly(kind: type, match: str | None = None):
    """pytest.raises, and the error is of exactly this type (not a subclass)."""
    with pytest.raises(kind, match=match) as info:
        yield info
    assert info.type is kind, f"{info.type.__name__} raised, {kind.__name__} expected"


# ------------------------------------------------------------------ fabricated run folders


def gpt2_params(model_cfg, vocab_size: int) -> dict:
    """The GPT-2 count (biases on): V·d·(1 if tied else 2) + T·d + L·(12d² + 13d) + 2d."""
    d, L, T = model_cfg.n_embd, model_cfg.n_layer, model_cfg.block_size
    tied = model_cfg.tie_embeddings
    wte, wpe = vocab_size * d, T * d
    lm_head = 0 if tied else vocab_size * d
    blocks = L * (12 * d * d + 13 * d) + 2 * d
    total = wte + lm_head + wpe + blocks
    return {"total": total, "wte": wte, "lm_head": lm_head, "lm_head_bias": 0, "wpe": wpe,
            "non_embedding": blocks, "saved_by_tying": wte if tied else 0, "tied": tied,
            "vocab_size": vocab_size, "model_vocab_size": vocab_size, "vocab_padding": 0}


def split_metrics(ppl: float, shift: float = 0.0, buckets: bool = True) -> dict:
    loss = math.log(ppl)
    out = {"loss": loss, "perplexity": ppl, "bits_per_byte": loss / math.log(2) / 5.0,
           "word_perplexity": ppl, "tokens": 99_999}
    if buckets:
        out["buckets"] = [{"name": n, "loss": loss - 1.0 + i * 0.8 + shift * i,
                           "perplexity": math.exp(loss - 1 + i * 0.8), "tokens": 70_000 // (i + 1)}
                          for i, n in enumerate(BUCKETS)]
    return out


FLOOR = {"nats_per_word": 3.9, "perplexity_per_word": 49.4, "bits_per_byte": {"validation": 1.1, "test": 1.1},
         "note": "expected entropy rate", "with_unk": False,
         "splits": {"validation": {"label": "split floor", "perplexity": 49.6}, "test": {"label": "split floor",
                                                                                         "perplexity": 49.5}}}


def make_run(runs_dir: Path, name: str, seed: int, overrides=(), val=60.0, test=None, status="finished",
             error=None, curve=True, extra_metrics_lines=(), cfg=None, identity=None, buckets=True,
             floor=FLOOR, final=None) -> Path:
    """A run folder as train.py writes it: config.yaml, report.json and report.md through the
    report schema (runs.RunReport / RunRecord), metrics.jsonl through runs.append_metrics."""
    cfg = cfg or load_config(None, BUDGET + list(overrides), seed=seed)
    run = runs_dir / name
    run.mkdir(parents=True)
    (run / run_folder.CONFIG).write_text(to_yaml(cfg))
    if final is None and status == "finished":
        final = {"validation": split_metrics(val, 0.0 if cfg.model.tie_embeddings else 0.05, buckets),
                 "test": split_metrics(test if test is not None else val + 1.0, buckets=buckets)}
    report = run_folder.RunReport(
        name=name, status=status, error=error, seed=seed, config_hash=config_hash(cfg), config=cfg,
        tiedlm_version="0.1.0", params=gpt2_params(cfg.model, V), flops_per_token={"forward": 1e7, "train": 3e7},
        final=final, floor=floor, tokens_seen=409_600, steps=100, wall_time_s=12.5 + seed, tokens_per_s=32_768.0,
        peak_memory_bytes=123_456_789, device="cpu", dtype="fp32",
        versions={"tiedlm": "0.1.0", "torch": "2.13.0", "python": "3.11.7"},
        data_identity=identity)  # what train.py records: {"fingerprint": ..., "tokenizer": ...}
    run_folder.RunRecord(run, report).write()
    records = [{"kind": "train", "step": step, "tokens": step * 4096, "loss": 5.0, "lr": 1e-3, "grad_norm": 0.8,
                "tokens_per_s": 8000.0, "time": step / 10} for step in (10, 20, 30)]
    if curve:
        for i, step in enumerate((25, 50, 75, 100)):
            ppl = val * (3.0 - 0.5 * i) + seed
            records.append({"kind": "eval", "step": step, "tokens": step * 4096, "split": "validation",
                            "loss": math.log(ppl), "perplexity": ppl})
    run_folder.append_metrics(run, records)
    if extra_metrics_lines:
        with open(run / run_folder.METRICS, "a", encoding="utf-8") as f:
            f.write("\n".join(extra_metrics_lines))
    return run


def edit_report(run_dir: Path, **changes) -> None:
    """Change fields of a run's report.json through the schema, as train.py would."""
    run_folder.RunRecord(run_dir, run_folder.read_report(run_dir)).write(**changes)


def hand_edit(run_dir: Path, edit) -> None:
    """Change report.json's raw JSON, as a person (or another program) might: edit(dict)."""
    path = run_dir / run_folder.REPORT
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


TIED, UNTIED = ["model.tie_embeddings=true"], ["model.tie_embeddings=false"]


def make_pair(runs_dir: Path, tied_vals, untied_vals, seeds=None):
    seeds = seeds or list(range(len(tied_vals)))
    for s, v in zip(seeds, tied_vals):
        make_run(runs_dir, f"base-tied-s{s}", s, TIED, val=v)
    for s, v in zip(seeds, untied_vals):
        make_run(runs_dir, f"base-untied-s{s}", s, UNTIED, val=v)


def dloss(a, b) -> float:
    """The mean per-seed loss difference of two lists of perplexities, paired in order."""
    return statistics.mean(math.log(x) - math.log(y) for x, y in zip(a, b))


def no_nan(text: str) -> bool:
    return re.search(r"\bnan\b|\binf\b", text, re.IGNORECASE) is None


def test_fixtures_are_what_training_writes(tmp_path):
    """make_run's report.json holds only keys of the schema train.py writes, in its order."""
    import dataclasses

    run = make_run(tmp_path, "t-s0", 0, TIED)
    data = json.loads((run / run_folder.REPORT).read_text())
    schema = [f.name for f in dataclasses.fields(run_folder.RunReport)]
    assert list(data) == [k for k in schema if k in data] and {"status", "final", "config", "seed"} <= set(data)
    assert run_folder.read_report(run).final["validation"]["perplexity"] == 60.0
    assert (run / run_folder.REPORT_MD).exists()


# ------------------------------------------------------------------ grouping and labelling


def test_three_variants_mixed_seeds_grouped_labelled_and_tested(tmp_path):
    runs = tmp_path / "runs"
    tied128 = {0: 57.0, 1: 58.1, 2: 57.4}
    untied128 = {0: 59.2, 1: 60.0, 2: 60.1}
    tied64 = {1: 66.0, 2: 64.9, 5: 65.7}
    for s, v in tied128.items():
        make_run(runs, f"t128-s{s}", s, TIED, val=v)
    for s, v in untied128.items():
        # a different config name does not make a different variant: name and seed are not the variant
        make_run(runs, f"u128-s{s}", s, UNTIED + (["name=other"] if s == 1 else []), val=v)
    for s, v in tied64.items():
        make_run(runs, f"t64-s{s}", s, TIED + ["model.n_embd=64"], val=v)
    result = C.compare_runs(runs_dir=runs, baseline="untied, n_embd=128")

    labels = sorted(v.label for v in result.variants)
    assert labels == ["tied, n_embd=128", "tied, n_embd=64", "untied, n_embd=128"]
    assert result.differing_keys == ["model.tie_embeddings", "model.n_embd"]
    assert result.mode == "baseline" and result.baseline_label == "untied, n_embd=128"
    assert result.variants[0].is_baseline  # the baseline comes first
    assert result.variant("tied, n_embd=64").seeds == [1, 2, 5]
    assert result.variant("untied, n_embd=128").n_seeds == 3

    # tested on the loss (log-perplexity), paired by seed
    log = {k: {s: math.log(v) for s, v in d.items()} for k, d in
           (("t128", tied128), ("u128", untied128), ("t64", tied64))}
    paired = result.variant("tied, n_embd=128").contrast("validation")
    ref = scipy_stats.ttest_rel(list(log["t128"].values()), list(log["u128"].values()))
    assert paired.test == "paired" and paired.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    ci = ref.confidence_interval(0.95)
    assert paired.difference == pytest.approx(dloss(tied128.values(), untied128.values()))
    assert paired.relative == pytest.approx(math.exp(paired.difference) - 1)
    assert paired.relative_ci_low == pytest.approx(math.exp(ci.low) - 1, rel=1e-9)
    assert paired.relative_ci_high == pytest.approx(math.exp(ci.high) - 1, rel=1e-9)
    assert paired.significant is bool(ref.pvalue < 0.05)
    gmean = scipy_stats.gmean
    assert paired.variant_mean == pytest.approx(gmean(list(tied128.values())))
    assert paired.perplexity_difference == pytest.approx(gmean(list(tied128.values())) - gmean(list(untied128.values())))

    welch = result.variant("tied, n_embd=64").contrast("validation")
    ref = scipy_stats.ttest_ind(list(log["t64"].values()), list(log["u128"].values()), equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert welch.test == "welch" and welch.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    assert (welch.ci_low, welch.ci_high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))

    # parameters against the baseline: tying saves V·d; n_embd=64 saves more
    t128 = result.variant("tied, n_embd=128")
    u128 = result.variant("untied, n_embd=128")
    assert t128.params["saved_by_tying"] == V * 128
    assert t128.vs_baseline.params_difference == -V * 128
    assert t128.vs_baseline.params_relative == pytest.approx(-V * 128 / u128.params["total"])

    # the perplexity of a variant: the geometric mean over seeds, with exp() of the loss interval
    m = t128.split("validation")
    lo, hi = scipy_stats.t.interval(0.95, 2, loc=statistics.mean(log["t128"].values()),
                                    scale=statistics.stdev(log["t128"].values()) / math.sqrt(3))
    assert m.perplexity.mean == pytest.approx(gmean(list(tied128.values())))
    assert (m.perplexity.ci_low, m.perplexity.ci_high) == (pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert m.loss.sd == pytest.approx(statistics.stdev(log["t128"].values()))
    assert t128.buckets("validation")[0].name == "top 10%"

    v = result.verdicts[0]
    assert v.startswith("**tied, n_embd=128** has ")
    assert "lower perplexity than **untied, n_embd=128** on validation, the primary endpoint" in v
    assert "paired over 3 seeds" in v and "fewer parameters" in v

    # without --baseline the grid's answer is the matched contrast: tied vs untied at n_embd=128
    grid = C.compare_runs(runs_dir=runs, out=tmp_path / "grid")
    assert grid.mode == "matched" and grid.baseline_label is None and grid.baseline is None
    assert [(m.label, m.tied, m.untied) for m in grid.matched] == [
        ("n_embd=128", "tied, n_embd=128", "untied, n_embd=128")]
    assert grid.variant("tied, n_embd=64").vs_baseline is None  # no untied twin at n_embd=64
    md = (tmp_path / "grid" / "comparison.md").read_text()
    assert "No untied variant with the same settings (not contrasted): tied, n_embd=64" in md


def test_short_keys_and_labels():
    assert short_keys(["model.n_embd", "tokenizer.vocab_size", "data.synthetic.vocab_size"]) == {
        "model.n_embd": "n_embd", "tokenizer.vocab_size": "tokenizer.vocab_size",
        "data.synthetic.vocab_size": "synthetic.vocab_size"}
    a = load_config(None, BUDGET + TIED)
    b = load_config(None, BUDGET + UNTIED)
    assert label_variants([a, b]) == (["tied", "untied"], ["model.tie_embeddings"])
    assert label_variants([b])[0] == ["untied"]


def test_baseline_choice_explicit_and_independent_of_order(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        # named to come first: the baseline must not depend on which variant is seen first
        make_run(runs, f"a64-s{s}", s, UNTIED + ["model.n_embd=64"], val=70 + s)
        make_run(runs, f"u128-s{s}", s, UNTIED, val=60 + s)
        # no untied twin at n_embd=96: no matched contrast, so one baseline is chosen automatically
        make_run(runs, f"t96-s{s}", s, TIED + ["model.n_embd=96"], val=58 + s)
    make_run(runs, "u128-s2", 2, UNTIED, val=61)
    auto = C.compare_runs(runs_dir=runs)
    # two untied variants: the one with more seeds, and the reason says it was picked automatically
    assert auto.baseline_label == "untied, n_embd=128"
    assert "chosen automatically" in auto.baseline_reason and "--baseline" in auto.baseline_reason
    # the automatic choice depends on the runs, not on the order the folders are given in
    folders = sorted(runs.glob("*-s*"))
    for order in (folders[::-1], random.Random(5).sample(folders, len(folders))):
        again = C.compare_runs(order, runs_dir=runs)
        assert again.baseline_label == "untied, n_embd=128"
        assert [v.label for v in again.variants] == [v.label for v in auto.variants]
    # equal seed counts: the label first in alphabetical order ("n_embd=128" < "n_embd=64"), although
    # the n_embd=64 runs come first by name and in the list
    tie = [p for p in folders if p.name != "u128-s2"]
    assert tie[0].name == "a64-s0"
    assert C.compare_runs(tie, runs_dir=runs).baseline_label == "untied, n_embd=128"
    assert C.compare_runs(tie[::-1], runs_dir=runs).baseline_label == "untied, n_embd=128"

    assert C.compare_runs(runs_dir=runs, baseline="untied, n_embd=64").baseline_label == "untied, n_embd=64"
    assert C.compare_runs(runs_dir=runs, baseline="t96-s1").baseline_label == "tied, n_embd=96"
    assert C.compare_runs(runs_dir=runs, baseline="n_embd=64").baseline_label == "untied, n_embd=64"
    with raises_exactly(ConfigError, match="several variants"):
        C.compare_runs(runs_dir=runs, baseline="untied")
    with raises_exactly(ConfigError, match="matches no variant"):
        C.compare_runs(runs_dir=runs, baseline="nothing-like-this")


# ------------------------------------------------------------------ runs left out


def test_unfinished_failed_and_corrupt_runs_are_left_out_with_reasons(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0], [59.0, 60.5], seeds=[0, 1])
    make_run(runs, "running-s7", 7, TIED, status="running")
    make_run(runs, "failed-s8", 8, TIED, status="failed", error="DataError: split 'validation' is empty")
    make_run(runs, "diverged-s9", 9, UNTIED, status="diverged", error="loss is nan at step 40")
    bad = make_run(runs, "badjson-s3", 3, TIED)
    (bad / run_folder.REPORT).write_text('{"status": "finished", "final": ')  # torn
    noreport = make_run(runs, "noreport-s4", 4, TIED)
    (noreport / run_folder.REPORT).unlink()
    nofinal = make_run(runs, "nofinal-s5", 5, TIED)
    edit_report(nofinal, final={})
    odd = make_run(runs, "base-tied-s1", 1, TIED, val=58.5)  # hand-edited: odd types, still usable

    def oddities(rep):
        rep["final"]["test"] = "n/a"
        rep["final"]["validation"]["buckets"] = 3
        rep["params"] = []
        rep["name"] = "renamed-elsewhere"

    hand_edit(odd, oddities)
    nomodel = make_run(runs, "nomodel-s6", 6, TIED)
    hand_edit(nomodel, lambda rep: rep["config"].update(model="big"))
    (runs / "notes").mkdir()  # not a run folder: ignored silently
    (runs / "notes" / "todo.txt").write_text("x")
    (runs / "compare").mkdir()  # the folder every comparison went to before compare-NAME/: ignored
    (runs / "compare" / run_folder.REPORT).write_text("{}")
    torn = runs / "base-tied-s0" / run_folder.METRICS
    torn.write_text(torn.read_text() + "not json\n" + '{"kind": "eval", "step": 1')

    result = C.compare_runs(runs_dir=runs)
    reasons = {s.name: s.reason for s in result.skipped}
    assert set(reasons) == {"running-s7", "failed-s8", "diverged-s9", "badjson-s3", "noreport-s4", "nofinal-s5",
                            "nomodel-s6"}
    assert "no model section" in reasons["nomodel-s6"]
    assert "base-tied-s1" in [r.name for r in result.runs]  # the folder name, not the report's
    assert reasons["running-s7"].startswith("status running")
    assert "status failed: DataError: split 'validation' is empty" in reasons["failed-s8"]
    assert "status diverged" in reasons["diverged-s9"] and "lr" in reasons["diverged-s9"]
    assert "not valid JSON" in reasons["badjson-s3"]
    assert "no report.json" in reasons["noreport-s4"]
    assert "no final evaluation" in reasons["nofinal-s5"]
    assert sum(v.n_seeds for v in result.variants) == 4
    assert any("2 unreadable lines of metrics.jsonl" in n for n in result.notes)
    assert len(result.variant("tied").curve) == 4  # the good lines still make the curve
    # the hand-edited run counts with what is usable: its validation perplexity, not its test or buckets
    assert result.variant("tied").split("validation").by_seed == {0: 57.0, 1: 58.5}
    assert result.variant("tied").split("test").by_seed == {0: 58.0, 1: None}

    table = C.format_terminal_table(result)
    assert "left out" in table and "badjson-s3" in table and "status running" in table
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "## Left out" in md and "failed-s8" in md and "unreadable lines" in md
    rows = list(csv.DictReader((comparison_dir(runs) / "comparison.csv").open()))
    assert {r["run"] for r in rows if r["row_type"] == "skipped"} == set(reasons)


def test_no_runs_is_a_usage_error_and_no_finished_run_a_runtime_one(tmp_path):
    # exit 2 for what the user typed (no run there at all), 1 for what happened to the runs found
    runs = tmp_path / "runs"
    with raises_exactly(NotARunError, match="no runs folder"):
        C.compare_runs(runs_dir=runs)
    with raises_exactly(NotARunError, match=r"no finished runs.*does not exist.*tiedlm compare --config"):
        C.compare_runs([runs / "nothing-s0"], runs_dir=runs)
    for status in ("running", "failed", "diverged", "interrupted"):
        make_run(runs, f"{status}-s0", 0, TIED, status=status)
        with raises_exactly(RunError, match=rf"no finished runs.*status {status}.*none of the runs found finished"):
            C.compare_runs([runs / f"{status}-s0"], runs_dir=runs)
    assert not [p for p in runs.iterdir() if p.name.startswith("compare")]


def test_paths_globs_and_parent_folders(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0, 57.5], [59.0, 60.5, 60.0])
    make_run(runs, "other-s0", 0, TIED + ["model.n_layer=2"], val=70)
    out = tmp_path / "cmp"
    result = C.compare_runs([str(runs / "base-*-s[01]"), runs / "base-untied-s2", str(tmp_path / "nope*"),
                             tmp_path / "missing"], runs_dir=runs, out=out)
    assert sorted(r.name for r in result.runs) == [
        "base-tied-s0", "base-tied-s1", "base-untied-s0", "base-untied-s1", "base-untied-s2"]
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons[str(tmp_path / "nope*")] == "no run folder matches"
    assert reasons[str(tmp_path / "missing")] == "does not exist"
    assert (out / "comparison.md").exists()
    # welch: tied has seeds 0, 1 and untied 0, 1, 2
    assert result.variant("tied").contrast("validation").test == "welch"
    # a folder of runs stands for the runs in it
    assert len(C.compare_runs([runs], runs_dir=runs).variants) == 3


# ------------------------------------------------------------------ outputs


def _strict_json(path: Path) -> dict:
    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=bad)


@pytest.mark.figures
def test_end_to_end_writes_every_output_and_valid_pngs(tmp_path):
    import matplotlib.image

    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.1, 57.4], [59.2, 60.0, 60.1])
    make_run(runs, "stale-s5", 5, TIED, status="interrupted")
    result = C.compare_runs(runs_dir=runs)
    out = comparison_dir(runs)
    names = {"comparison.md", "comparison.csv", "comparison.json", *C.PLOTS.values()}
    assert names <= {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave nothing behind
    for plot in C.PLOTS.values():
        data = (out / plot).read_bytes()
        assert data[:8] == PNG
        img = matplotlib.image.imread(out / plot)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100

    md = (out / "comparison.md").read_text()
    for plot in C.PLOTS.values():
        assert f"]({plot})" in md  # relative links, so the folder can be moved or pasted
    assert "**tied** has " in md and "lower perplexity than **untied** on validation, the primary endpoint" in md
    assert "paired over 3 seeds" in md and "significant at 0.05" in md
    assert "The primary endpoint is the validation loss: it alone carries the verdict. Test is reported as " \
           "confirmation, and the per-bucket differences are secondary" in md
    assert "  - test confirms: " in md and ("may not be detectable with 3 seeds (80% power, α = 0.05), taking the "
                                           "seed-to-seed spread at its one-sided 80% upper confidence bound (2.12× "
                                           "the observed spread, which has 2 degrees of freedom)") in md
    pw = result.variant("tied").contrast("validation").power
    assert pw.mde_upper == pytest.approx(pw.mde * math.sqrt(2 / scipy_stats.chi2.ppf(0.2, 2)))
    assert pw.seeds_needed_upper >= pw.seeds_needed
    assert (f"between {percent(-pw.mde_relative_down_upper)} and {percent(pw.mde_relative_upper)} may not be "
            f"detectable") in md and (f"at the observed spread itself, between {percent(-pw.mde_relative_down)} "
                                      f"and {percent(pw.mde_relative)}") in md
    assert (f"{percent(-pw.mde_relative_down_upper)} / {percent(pw.mde_relative_upper)} / "
            f"{pw.seeds_needed_upper} |") in md  # the contrasts table leads with the bound
    assert "Student-t interval of the mean loss" in md and "geometric mean over seeds" in md
    assert "Embeddings are weight-decayed" in md  # base config: train.decay_embeddings true
    assert "Loss by token frequency" in md and "top 10%" in md
    assert "saved by tying" in md and f"{V * 128:,}" in md
    assert "validation 49.60 (split floor), test 49.50 (split floor). The language's expected entropy rate is 49.40" in md
    assert "stale-s5" in md and "status interrupted" in md
    assert "| 117.7 MiB |" in md  # peak memory, 123,456,789 bytes
    assert no_nan(md)

    data = _strict_json(out / "comparison.json")
    assert data["baseline"]["label"] == "untied"
    assert [v["label"] for v in data["variants"]] == ["untied", "tied"]
    assert data["files"]["markdown"].endswith("comparison.md")
    assert data == result.to_json()  # the returned comparison is what was written

    text = (out / "comparison.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    kinds = [r["row_type"] for r in rows]
    assert kinds.count("variant") == 2 and kinds.count("run") == 6 and kinds.count("skipped") == 1
    tied = next(r for r in rows if r["row_type"] == "variant" and r["variant"] == "tied")
    assert float(tied["validation_perplexity"]) == pytest.approx(scipy_stats.gmean([57.0, 58.1, 57.4]))
    assert float(tied["validation_p_value"]) < 0.05 and tied["validation_test"] == "paired"
    assert float(tied["validation_effect"]) == pytest.approx(math.exp(dloss([57.0, 58.1, 57.4], [59.2, 60.0, 60.1])) - 1)
    assert int(tied["validation_seeds_needed"]) >= 2 and tied["reference"] == "untied"
    assert int(tied["validation_seeds_needed_upper"]) >= int(tied["validation_seeds_needed"])
    assert float(tied["validation_detectable_effect_upper"]) > float(tied["validation_detectable_effect"])
    assert float(tied["validation_detectable_decrease_upper"]) > float(tied["validation_detectable_decrease"])
    assert float(tied["validation_loss[top 10%]"]) > 0
    assert no_nan(text)

    table = C.format_terminal_table(result)
    protocol, *lines = table.splitlines()  # untuned, final weights, on validation: said first
    assert protocol == ("protocol: untuned (every variant at the config's own settings); final weights (not each "
                        "run's best kept on validation); the verdict on validation (not test). The main job tunes each "
                        "variant's learning rate on validation and compares their best kept weights on test, over 3 "
                        "seeds (docs/comparing.md).")
    assert lines[0].split()[:5] == ["variant", "seeds", "val", "ppl", "95%"] and "vs untied" in lines[0]
    assert lines[2].startswith("untied ") and "baseline" in lines[2] and lines[3].startswith("tied ")
    assert "comparison.md" in table


def test_comparison_json_keys(tmp_path):
    """comparison.json's keys at every level (format 2: statistics on the loss, primary endpoint,
    power, matched contrasts, FLOPs and the resolved device)."""
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.1], [59.2, 60.0])
    C.compare_runs(runs_dir=runs)
    data = _strict_json(comparison_dir(runs) / "comparison.json")
    assert list(data) == ["format", "tiedlm_version", "created", "out", "level", "alpha", "power", "interval",
                          "difference", "primary", "confirmation", "secondary", "select", "mode", "baseline", "differing_keys",
                          "adaptation", "variants", "runs", "skipped", "notes", "match", "match_contrasts", "verdicts", "data_sets", "not_compared",
                          "matched", "files", "tuning", "tying_map", "tying_line", "sequential", "warnings", "protocol"]
    assert (data["format"], data["primary"], data["confirmation"], data["mode"]) == (2, "validation", ["test"],
                                                                                     "baseline")
    tied = data["variants"][1]
    assert list(tied) == ["label", "config_hash", "config", "tied", "seeds", "runs", "n_seeds", "metrics", "params",
                          "flops_per_token", "train_flops", "cost", "device", "dtype", "resolution", "floor",
                          "tokenizer_kind", "curve", "best_points", "matrices", "is_baseline", "vs_baseline", "verdicts",
                          "ledger"]
    assert list(tied["ledger"]) == ["tie", "init", "head_init", "frozen", "lr", "min_lr", "weight_decay_e",
                                    "weight_decay_w_out",
                                    "weight_decay_other", "init_std_e", "init_std_w_out", "embed_scale", "lm_head_bias",
                                    "vd", "vd_share", "block_init", "block_biases", "source"]
    assert tied["vs_baseline"]["confounds"] == []  # the pair differs only in the tie
    assert tied["resolution"] == "cpu, fp32" and tied["train_flops"] == pytest.approx(3e7 * 409_600)
    assert list(tied["metrics"]["validation"]) == ["perplexity", "bits_per_byte", "loss", "word_perplexity",
                                                   "by_seed", "loss_by_seed", "buckets", "at_unigram"]
    assert list(tied["metrics"]["validation"]["perplexity"]) == ["n", "mean", "ci_low", "ci_high", "level",
                                                                 "sd_factor", "min", "max", "values", "note"]
    assert list(tied["metrics"]["validation"]["by_seed"]) == ["0", "1"]
    assert list(tied["metrics"]["validation"]["buckets"][0]) == ["name", "loss", "by_seed", "perplexity", "tokens"]
    assert list(tied["cost"]) == ["tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps"]
    assert list(tied["curve"][0]) == ["tokens", "mean", "min", "max", "n"]
    vs = tied["vs_baseline"]
    assert list(vs) == ["baseline", "kind", "validation", "test", "params_difference", "params_relative",
                        "parameter_matched", "train_flops_per_token", "baseline_train_flops_per_token",
                        "train_flops_relative", "compute_matched", "confounds", "tuned_differences", "trajectory"]
    assert vs["kind"] == "baseline" and vs["parameter_matched"] is False and vs["compute_matched"] is True
    tested = ["test", "difference", "se", "df", "t", "p_value", "ci_low", "ci_high", "level", "note", "n", "seeds_a",
              "seeds_b"]
    assert list(vs["validation"]) == tested + ["relative", "relative_ci_low", "relative_ci_high", "significant",
                                               "variant_mean", "baseline_mean", "perplexity_difference", "p_holm", "power",
                                               "buckets"]
    assert list(vs["validation"]["power"]) == ["test", "seeds", "power", "alpha", "mde", "mde_relative",
                                               "mde_relative_down", "observed",
                                               "observed_relative", "seeds_needed", "note", "spread_confidence",
                                               "spread_factor", "mde_upper", "mde_relative_upper",
                                               "mde_relative_down_upper", "seeds_needed_upper"]
    assert list(vs["validation"]["buckets"]["rest"]) == tested + ["p_holm"]
    assert data["variants"][0]["vs_baseline"] is None
    assert list(data["runs"][0]) == ["name", "path", "variant", "seed", "config_hash", "validation_perplexity",
                                     "validation_bits_per_byte", "validation_loss", "test_perplexity",
                                     "test_bits_per_byte", "test_loss", "buckets", "train_perplexity",
                                     "train_bits_per_byte", "train_loss", "params_total", "tokens_per_s",
                                     "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps", "device", "dtype",
                                     "weights", "best_step", "last_above_best", "overtrained"]


@pytest.mark.figures
def test_plots_leave_the_matplotlib_backend_and_pyplot_alone(tmp_path):
    """A library call must not switch the caller's backend (0.1 set Agg) or leave figures open."""
    import matplotlib
    import matplotlib.pyplot as plt

    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.1], [59.2, 60.0])
    before = matplotlib.get_backend()
    try:
        matplotlib.use("svg")  # not the Agg that the plots draw with
        C.compare_runs(runs_dir=runs)
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == []
    finally:
        matplotlib.use(before)
    assert (comparison_dir(runs) / C.PLOTS["curve"]).read_bytes()[:8] == PNG


@pytest.mark.figures  # drawn for real: one seed, so no interval to draw
def test_single_seed_says_plainly_that_no_interval_can_be_given(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0], [60.0])
    result = C.compare_runs(runs_dir=runs)
    d = result.variant("tied").contrast("validation")
    assert d.difference == pytest.approx(math.log(57 / 60)) and d.p_value is None and d.ci_low is None
    assert d.power.mde is None and d.power.seeds_needed is None
    out = comparison_dir(runs)
    md = (out / "comparison.md").read_text()
    assert "one seed: no interval" in md and "no confidence interval or p-value can be given" in md
    assert "5.00% lower perplexity than **untied**" in md
    assert ("With 1 seed no interval can be given: at least 2 seeds per variant are needed for one, 3 or more for "
            "a useful one.") in md
    for name in ("comparison.md", "comparison.csv", "comparison.json"):
        assert no_nan((out / name).read_text())
    _strict_json(out / "comparison.json")
    for plot in C.PLOTS.values():
        assert min(struct.unpack(">II", (out / plot).read_bytes()[16:24])) > 100  # width, height: drawn
    assert "no confidence interval" in C.format_terminal_table(result)


@pytest.mark.figures  # drawn for real: empty panels and a single variant
def test_without_learning_curves_or_buckets_plots_still_written(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        r = make_run(runs, f"a-s{s}", s, TIED, curve=False, buckets=False, floor=None)
        (r / run_folder.METRICS).unlink()
    result = C.compare_runs(runs_dir=runs)
    assert len(result.variants) == 1 and result.variants[0].label == "tied"
    assert result.variants[0].curve == [] and result.bucket_names("validation") == []
    for plot in C.PLOTS.values():
        png = (comparison_dir(runs) / plot).read_bytes()
        assert png[:8] == PNG and min(struct.unpack(">II", png[16:24])) > 100  # width, height: drawn
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "Only one variant" in md and "Loss by token frequency" not in md
    assert "a-s0: no metrics.jsonl, so no learning curve" in result.notes


def test_duplicate_seed_of_a_variant_is_used_once(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    make_run(runs, "zcopy-tied-s0", 0, TIED, val=50.0)
    result = C.compare_runs(runs_dir=runs)
    tied = result.variant("tied")
    assert tied.n_seeds == 2 and tied.runs == ["base-tied-s0", "base-tied-s1"]  # the first by name is used
    assert tied.split("validation").by_seed == {0: 57.0, 1: 58.0}
    assert any(s.name == "zcopy-tied-s0" and "same config and seed 0" in s.reason for s in result.skipped)




def test_bucket_differences_are_tested_by_seed(tmp_path):
    """Each frequency bucket's loss difference gets the same paired test as perplexity."""
    runs = tmp_path / "runs"
    rare = {0: 7.30, 1: 7.36, 2: 7.41}
    base = {0: 7.10, 1: 7.22, 2: 7.19}
    for seed in range(3):
        for tied, table in ((True, rare), (False, base)):
            final = {split: {**split_metrics(60.0, buckets=False),
                             "buckets": [{"name": "rest 50%", "loss": table[seed], "tokens": 100}]}
                     for split in ("validation", "test")}
            make_run(runs, f"{'tied' if tied else 'untied'}-s{seed}", seed, TIED if tied else UNTIED, final=final)
    result = C.compare_runs(None, runs_dir=runs)
    test = result.variant("tied").vs_baseline.bucket("validation", "rest 50%")
    expected = scipy_stats.ttest_rel([rare[s] for s in range(3)], [base[s] for s in range(3)])
    assert test.test == "paired"
    assert test.difference == pytest.approx(sum(rare.values()) / 3 - sum(base.values()) / 3)
    assert test.p_value == pytest.approx(expected.pvalue, rel=1e-6)
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert f"p={expected.pvalue:.3f}" in md
