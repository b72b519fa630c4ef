"""compare.py: the t distribution and tests against scipy, grouping and labelling, left-out runs,
every output file, compare --config (train_run, count_params_config and prepare_data faked)."""

import csv
import importlib
import json
import math
import random
import re
import statistics
import sys
import types
from pathlib import Path

import pytest
import yaml

from tiedlm.config import config_hash, load_config, to_dict
from tiedlm.errors import ConfigError, DivergedError, RunError

# the module itself (tiedlm exports compare_runs; the module is reached by its full name)
C = importlib.import_module("tiedlm.compare")
scipy_stats = pytest.importorskip("scipy.stats")  # the cross-check only; tiedlm itself needs no scipy
scipy_special = pytest.importorskip("scipy.special")

BUDGET = ["train.max_steps=100"]
V = 2048  # the fabricated runs' model vocabulary
BUCKETS = ("top 10%", "next 40%", "rest", "unseen")
PNG = b"\x89PNG\r\n\x1a\n"


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


def split_metrics(ppl: float, shift: float = 0.0) -> dict:
    loss = math.log(ppl)
    return {"loss": loss, "perplexity": ppl, "bits_per_byte": loss / math.log(2) / 5.0,
            "word_perplexity": ppl, "tokens": 99_999,
            "buckets": [{"name": n, "loss": loss - 1.0 + i * 0.8 + shift * i, "perplexity": math.exp(loss - 1 + i * 0.8),
                         "tokens": 70_000 // (i + 1)} for i, n in enumerate(BUCKETS)]}


def make_run(runs_dir: Path, name: str, seed: int, overrides=(), val=60.0, test=None, status="finished",
             error=None, curve=True, extra_metrics_lines=(), cfg=None, identity=None) -> Path:
    cfg = cfg or load_config(None, BUDGET + list(overrides), seed=seed)
    run = runs_dir / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    report = {
        "format": 1, "tiedlm_version": "0.1.0", "name": name, "status": status, "error": error, "seed": seed,
        "config_hash": config_hash(cfg), "config": to_dict(cfg), "params": gpt2_params(cfg.model, V),
        "flops_per_token": {"forward": 1e7, "train": 3e7},
        "final": {"validation": split_metrics(val, 0.0 if cfg.model.tie_embeddings else 0.05),
                  "test": split_metrics(test if test is not None else val + 1.0)},
        "floor": {"nats_per_word": 3.9, "perplexity_per_word": 49.4,
                  "bits_per_byte": {"validation": 1.1, "test": 1.1}, "note": "exact entropy rate"},
        "tokens_seen": 409_600, "steps": 100, "wall_time_s": 12.5 + seed, "tokens_per_s": 32_768.0,
        "peak_memory_bytes": 123_456_789, "device": "cpu", "dtype": "fp32",
        "versions": {"tiedlm": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}, "git_commit": None,
    }
    if identity is not None:  # what train.py records: {"fingerprint": ..., "tokenizer": ...}
        report["data_identity"] = identity
    if status != "finished":
        report["final"] = None
    (run / "report.json").write_text(json.dumps(report))
    lines = []
    for step in (10, 20, 30):
        lines.append(json.dumps({"kind": "train", "step": step, "tokens": step * 4096, "loss": 5.0,
                                 "lr": 1e-3, "grad_norm": 0.8, "tokens_per_s": 8000.0, "time": step / 10}))
    if curve:
        for i, step in enumerate((25, 50, 75, 100)):
            ppl = val * (3.0 - 0.5 * i) + seed
            lines.append(json.dumps({"kind": "eval", "step": step, "tokens": step * 4096, "split": "validation",
                                     "loss": math.log(ppl), "perplexity": ppl}))
    lines.extend(extra_metrics_lines)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


TIED, UNTIED = ["model.tie_embeddings=true"], ["model.tie_embeddings=false"]


def make_pair(runs_dir: Path, tied_vals, untied_vals, seeds=None):
    seeds = seeds or list(range(len(tied_vals)))
    for s, v in zip(seeds, tied_vals):
        make_run(runs_dir, f"base-tied-s{s}", s, TIED, val=v)
    for s, v in zip(seeds, untied_vals):
        make_run(runs_dir, f"base-untied-s{s}", s, UNTIED, val=v)


def variant(result: dict, label: str) -> dict:
    return next(v for v in result["variants"] if v["label"] == label)


def no_nan(text: str) -> bool:
    return re.search(r"\bnan\b|\binf\b", text, re.IGNORECASE) is None


# ------------------------------------------------------------------ the t distribution


def test_betainc_matches_scipy():
    for a, b in [(0.5, 0.5), (1.0, 0.5), (2.5, 0.5), (15.0, 0.5), (500.0, 0.5), (3.0, 7.0), (0.7, 12.0)]:
        for x in [1e-9, 1e-4, 0.01, 0.2, 0.5, 0.77, 0.95, 0.999999]:
            assert C.betainc(a, b, x) == pytest.approx(scipy_special.betainc(a, b, x), rel=1e-10, abs=1e-14)
    assert C.betainc(2.0, 3.0, 0.0) == 0.0 and C.betainc(2.0, 3.0, 1.0) == 1.0


@pytest.mark.parametrize("df", [1, 2, 2.7, 4, 9.3, 30, 1000])
def test_t_cdf_sf_and_ppf_match_scipy(df):
    for t in [-80.0, -12.0, -4.0, -2.1, -0.3, 0.0, 0.7, 1.96, 4.0, 12.0, 80.0]:
        assert C.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-9, abs=1e-15)
        # the upper tail, where p-values live, to relative precision
        assert C.t_sf(t, df) == pytest.approx(scipy_stats.t.sf(t, df), rel=1e-9, abs=1e-300)
        assert C.t_two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-9, abs=1e-300)
    for p in [1e-6, 0.025, 0.1, 0.5, 0.6, 0.9, 0.975, 0.995, 0.9995]:
        assert C.t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError):
        C.t_ppf(1.0, df)


# ------------------------------------------------------------------ summaries and tests


def test_summarize_mean_sd_and_t_interval():
    xs = [61.3, 59.8, 60.4, 62.9]
    s = C.summarize(xs)
    n = len(xs)
    mean, sd = statistics.mean(xs), statistics.stdev(xs)  # stdev: the sample SD, n - 1
    lo, hi = scipy_stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n))
    assert s["n"] == n
    assert s["mean"] == pytest.approx(mean, rel=1e-12)
    assert s["sd"] == pytest.approx(sd, rel=1e-12)
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    # by hand: t(0.975, 3) = 3.182446305284263
    assert s["ci_high"] - mean == pytest.approx(3.182446305284263 * sd / 2.0, rel=1e-9)


def test_one_value_has_no_sd_or_interval():
    s = C.summarize([42.0])
    assert s["mean"] == 42.0 and s["sd"] is None and s["ci_low"] is None and "one seed" in s["note"]
    assert C.summarize([None, float("nan")])["n"] == 0
    d = C.paired_test([1.0], [2.0])
    assert d["difference"] == -1.0 and d["p_value"] is None and "one seed" in d["note"]
    w = C.welch_test([1.0], [2.0, 3.0])
    assert w["p_value"] is None and w["ci_low"] is None


def test_paired_and_welch_match_scipy():
    rng = random.Random(3)
    a = [60 + rng.gauss(0, 1) for _ in range(5)]
    b = [61.5 + x - 60 + rng.gauss(0, 0.3) for x in a]  # correlated with a, as seeds make runs
    ref = scipy_stats.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    got = C.paired_test(a, b)
    assert got["test"] == "paired" and got["df"] == 4
    assert got["difference"] == pytest.approx(statistics.mean(x - y for x, y in zip(a, b)), rel=1e-12)
    assert got["t"] == pytest.approx(ref.statistic, rel=1e-9)
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)
    assert (got["ci_low"], got["ci_high"]) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))

    c = [58 + rng.gauss(0, 2) for _ in range(3)]
    d = [60 + rng.gauss(0, 0.5) for _ in range(6)]
    ref = scipy_stats.ttest_ind(c, d, equal_var=False)
    ci = ref.confidence_interval(0.95)
    got = C.welch_test(c, d)
    assert got["df"] == pytest.approx(ref.df, rel=1e-10)  # Welch–Satterthwaite
    assert got["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)
    assert (got["ci_low"], got["ci_high"]) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))


def test_compare_by_seed_pairs_only_when_seeds_match():
    assert C.compare_by_seed({0: 1.0, 1: 2.0, 2: 2.5}, {0: 1.5, 1: 2.1, 2: 3.0})["test"] == "paired"
    assert C.compare_by_seed({0: 1.0, 1: 2.0, 2: 2.5}, {0: 1.5, 1: 2.1, 3: 3.0})["test"] == "welch"
    same = C.compare_by_seed({0: 1.0, 1: 2.0}, {0: 2.0, 1: 3.0})  # the same difference every seed
    assert same["difference"] == -1.0 and same["p_value"] is None and "no spread" in same["note"]


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
    result = C.compare_runs(runs_dir=runs)

    labels = sorted(v["label"] for v in result["variants"])
    assert labels == ["tied, n_embd=128", "tied, n_embd=64", "untied, n_embd=128"]
    assert result["differing_keys"] == ["model.tie_embeddings", "model.n_embd"]
    assert result["baseline"]["label"] == "untied, n_embd=128"
    assert result["variants"][0]["is_baseline"]  # the baseline comes first
    assert variant(result, "tied, n_embd=64")["seeds"] == [1, 2, 5]
    assert variant(result, "untied, n_embd=128")["n_seeds"] == 3

    paired = variant(result, "tied, n_embd=128")["vs_baseline"]["validation"]
    ref = scipy_stats.ttest_rel(list(tied128.values()), list(untied128.values()))
    assert paired["test"] == "paired" and paired["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)
    diffs = [tied128[s] - untied128[s] for s in (0, 1, 2)]
    assert paired["difference"] == pytest.approx(statistics.mean(diffs))
    assert paired["relative"] == pytest.approx(statistics.mean(diffs) / statistics.mean(untied128.values()))
    assert paired["significant"] is bool(ref.pvalue < 0.05)

    welch = variant(result, "tied, n_embd=64")["vs_baseline"]["validation"]
    ref = scipy_stats.ttest_ind(list(tied64.values()), list(untied128.values()), equal_var=False)
    assert welch["test"] == "welch" and welch["p_value"] == pytest.approx(ref.pvalue, rel=1e-8)

    # parameters against the baseline: tying saves V·d; n_embd=64 saves more
    t128 = variant(result, "tied, n_embd=128")
    u128 = variant(result, "untied, n_embd=128")
    assert t128["params"]["saved_by_tying"] == V * 128
    assert t128["vs_baseline"]["params_difference"] == -V * 128
    assert t128["vs_baseline"]["params_relative"] == pytest.approx(-V * 128 / u128["params"]["total"])

    # the validation statistics are those of the per-seed numbers
    m = t128["metrics"]["validation"]["perplexity"]
    assert m["mean"] == pytest.approx(statistics.mean(tied128.values()))
    assert m["sd"] == pytest.approx(statistics.stdev(tied128.values()))
    assert t128["metrics"]["validation"]["buckets"][0]["name"] == "top 10%"

    v = result["verdicts"][0]
    assert v.startswith("**tied, n_embd=128** is ") and "lower perplexity than **untied, n_embd=128** on validation" in v
    assert "paired over 3 seeds" in v and "fewer parameters" in v


def test_short_keys_and_labels():
    assert C.short_keys(["model.n_embd", "tokenizer.vocab_size", "data.synthetic.vocab_size"]) == {
        "model.n_embd": "n_embd", "tokenizer.vocab_size": "tokenizer.vocab_size",
        "data.synthetic.vocab_size": "synthetic.vocab_size"}
    a = to_dict(load_config(None, BUDGET + TIED))
    b = to_dict(load_config(None, BUDGET + UNTIED))
    assert C.label_variants([a, b]) == (["tied", "untied"], ["model.tie_embeddings"])
    assert C.label_variants([b])[0] == ["untied"]


def test_baseline_choice_explicit_and_deterministic(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        make_run(runs, f"u64-s{s}", s, UNTIED + ["model.n_embd=64"], val=70 + s)
        make_run(runs, f"u128-s{s}", s, UNTIED, val=60 + s)
        make_run(runs, f"t128-s{s}", s, TIED, val=58 + s)
    make_run(runs, "u128-s2", 2, UNTIED, val=61)
    auto = C.compare_runs(runs_dir=runs)
    # two untied variants: the one with more seeds, and the reason says it was picked automatically
    assert auto["baseline"]["label"] == "untied, n_embd=128"
    assert "chosen automatically" in auto["baseline"]["reason"] and "--baseline" in auto["baseline"]["reason"]
    assert C.compare_runs(runs_dir=runs)["baseline"]["label"] == "untied, n_embd=128"  # deterministic

    assert C.compare_runs(runs_dir=runs, baseline="untied, n_embd=64")["baseline"]["label"] == "untied, n_embd=64"
    assert C.compare_runs(runs_dir=runs, baseline="t128-s1")["baseline"]["label"] == "tied, n_embd=128"
    assert C.compare_runs(runs_dir=runs, baseline="n_embd=64")["baseline"]["label"] == "untied, n_embd=64"
    with pytest.raises(ConfigError, match="several variants"):
        C.compare_runs(runs_dir=runs, baseline="untied")
    with pytest.raises(ConfigError, match="matches no variant"):
        C.compare_runs(runs_dir=runs, baseline="nothing-like-this")


# ------------------------------------------------------------------ runs on different data


def ident(fingerprint: str, tokenizer: str = "tok") -> dict:
    return {"fingerprint": fingerprint, "tokenizer": tokenizer}


V1000 = ["data.synthetic.vocab_size=1000"]
V4096 = ["data.synthetic.vocab_size=4096", "tokenizer.vocab_size=4096"]


def make_two_vocab_sizes(runs: Path, seeds=(0, 1)) -> None:
    """tied/untied on the synthetic language with 1000 words, and again with 4096 words (and a
    4096-token vocabulary): the 4096 runs have far higher perplexity, by the data, not by tying."""
    for s in seeds:
        make_run(runs, f"v1000-tied-s{s}", s, TIED + V1000, val=40.0 + s, identity=ident("syn1000", "w8192"))
        make_run(runs, f"v1000-untied-s{s}", s, UNTIED + V1000, val=41.0 + s, identity=ident("syn1000", "w8192"))
        make_run(runs, f"v4096-tied-s{s}", s, TIED + V4096, val=120.0 + s, identity=ident("syn4096", "w4096"))
        make_run(runs, f"v4096-untied-s{s}", s, UNTIED + V4096, val=124.0 + s, identity=ident("syn4096", "w4096"))


def test_runs_on_different_data_are_refused_with_how_the_data_differ(tmp_path):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    runs = tmp_path / "runs"
    make_two_vocab_sizes(runs)
    with pytest.raises(RunError) as err:
        C.compare_runs(runs_dir=runs)
    msg = str(err.value)
    assert "\n" not in msg and "2 different data sets" in msg and "never compared" in msg
    assert "data.synthetic.vocab_size 1000 vs 4096" in msg and "tokenizer.vocab_size 8192 vs 4096" in msg
    assert f"tiedlm compare {runs / 'v1000-'}*" in msg and f"{runs / 'v4096-'}*: 4 runs" in msg
    assert "--baseline" in msg
    assert not (runs / "compare").exists()  # nothing written, no verdict drawn

    r = CliRunner().invoke(app, ["compare", "--out", str(runs)])
    assert r.exit_code == 1 and "data.synthetic.vocab_size 1000 vs 4096" in r.output
    assert "lower perplexity" not in r.output and "higher perplexity" not in r.output

    # the runs of one data set at a time compare as before, with short labels
    one = C.compare_runs([str(runs / "v4096-*")], runs_dir=runs)
    assert [v["label"] for v in one["variants"]] == ["untied", "tied"] and one["data_sets"] == 1


def test_baseline_compares_within_its_data_set_and_lists_the_others(tmp_path):
    runs = tmp_path / "runs"
    make_two_vocab_sizes(runs)
    # labels over all the runs name the data keys, so a label part picks the data set
    result = C.compare_runs(runs_dir=runs, baseline="untied, synthetic.vocab_size=1000")
    # labels are computed within the data set: the data keys do not differ there
    assert [v["label"] for v in result["variants"]] == ["untied", "tied"]
    assert result["differing_keys"] == ["model.tie_embeddings"]
    assert result["baseline"]["label"] == "untied" and "--baseline" in result["baseline"]["reason"]
    assert sorted(r["name"] for r in result["runs"]) == [
        "v1000-tied-s0", "v1000-tied-s1", "v1000-untied-s0", "v1000-untied-s1"]
    tied = variant(result, "tied")["vs_baseline"]
    assert tied["validation"]["difference"] == pytest.approx(-1.0)  # 40.5 vs 41.5, not vs 124.5
    assert tied["validation"]["test"] == "paired" and tied["params_difference"] == -V * 128
    assert result["data_sets"] == 2
    other = {n["variant"]: n for n in result["not_compared"]}
    assert set(other) == {"tied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096",
                          "untied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096"}
    for n in other.values():
        assert n["reason"] == ("trained on other data (data.synthetic.vocab_size 4096 instead of 1000, "
                               "tokenizer.vocab_size 4096 instead of 8192)")
    tied4096 = other["tied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096"]
    assert tied4096["runs"] == ["v4096-tied-s0", "v4096-tied-s1"] and tied4096["data_set"] == 2

    out = runs / "compare"
    md = (out / "comparison.md").read_text()
    text = C.format_terminal_table(result)
    for line in result["verdicts"] + md.splitlines() + text.splitlines():
        if "perplexity than" in line or line.startswith(("| tied", "| untied")):
            assert "4096" not in line and "v4096" not in line  # no contrast with the other data
    assert "## Not compared (trained on other data)" in md and "`v4096-untied-s1`" in md
    assert "came from 2 data sets" in md
    assert ("not compared: untied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096 (2 runs: v4096-untied-s0, "
            "v4096-untied-s1): trained on other data (data.synthetic.vocab_size 4096 instead of 1000") in text
    rows = list(csv.DictReader((out / "comparison.csv").read_text().splitlines()))
    assert sorted(r["run"] for r in rows if r["row_type"] == "not_compared") == [
        f"v4096-{t}-s{s}" for t in ("tied", "untied") for s in (0, 1)]
    assert all(r["validation_perplexity_diff"] == "" for r in rows if "4096" in r["variant"])
    assert _strict_json(out / "comparison.json")["not_compared"][0]["data_set"] == 2

    # a run name picks the data set too; "untied" alone is ambiguous across data sets
    by_run = C.compare_runs(runs_dir=runs, baseline="v4096-untied-s0")
    assert {r["name"][:5] for r in by_run["runs"]} == {"v4096"}
    assert variant(by_run, "tied")["vs_baseline"]["validation"]["difference"] == pytest.approx(-4.0)
    with pytest.raises(ConfigError, match="several variants"):
        C.compare_runs(runs_dir=runs, baseline="untied")


def test_same_config_other_fingerprint_is_not_contrasted(tmp_path):
    """The data files changed between runs of the same config: the configs are equal, the tokens not."""
    runs = tmp_path / "runs"
    for s in (0, 1):
        make_run(runs, f"old-tied-s{s}", s, TIED, val=57.0 + s, identity=ident("files-before"))
        make_run(runs, f"old-untied-s{s}", s, UNTIED, val=59.0 + s, identity=ident("files-before"))
    for s in (2, 3):
        make_run(runs, f"new-tied-s{s}", s, TIED, val=80.0 + s, identity=ident("files-after"))
        make_run(runs, f"new-untied-s{s}", s, UNTIED, val=82.0 + s, identity=ident("files-after"))
    with pytest.raises(RunError, match=r"the data files changed between runs \(source fingerprint differs\)"):
        C.compare_runs(runs_dir=runs)
    result = C.compare_runs(runs_dir=runs, baseline="old-untied-s0")
    assert sorted(r["name"] for r in result["runs"]) == [
        "old-tied-s0", "old-tied-s1", "old-untied-s0", "old-untied-s1"]
    assert [v["label"] for v in result["variants"]] == ["untied", "tied"]
    assert variant(result, "tied")["seeds"] == [0, 1]
    assert variant(result, "tied")["vs_baseline"]["validation"]["test"] == "paired"
    assert {n["variant"] for n in result["not_compared"]} == {"tied [data set 1]", "untied [data set 1]"}
    assert all("source fingerprint differs" in n["reason"] for n in result["not_compared"])
    # a tokenizer key that differs alone (same source, same config) separates runs too
    for name in ("new-tied-s2", "new-tied-s3", "new-untied-s2", "new-untied-s3"):
        p = runs / name / "report.json"
        rep = json.loads(p.read_text())
        rep["data_identity"] = ident("files-before", "another-tokenizer")
        p.write_text(json.dumps(rep))
    with pytest.raises(RunError, match="the tokenizer changed between runs"):
        C.compare_runs(runs_dir=runs)


def test_data_without_recorded_identity_falls_back_to_the_config(tmp_path):
    runs = tmp_path / "runs"
    # the same data: one report with data_identity, one without (hand-made); grouped together
    make_run(runs, "a-tied-s0", 0, TIED, val=57.0, identity=ident("fp"))
    make_run(runs, "a-untied-s0", 0, UNTIED, val=59.0)
    result = C.compare_runs(runs_dir=runs)
    assert result["data_sets"] == 1 and not result["not_compared"]
    assert variant(result, "tied")["vs_baseline"]["validation"]["difference"] == pytest.approx(-2.0)
    # without data_identity, a different data config is different data
    make_run(runs, "b-untied-s0", 0, UNTIED + ["data.synthetic.seed=7"], val=70.0)
    with pytest.raises(RunError, match="data.synthetic.seed 0 vs 7"):
        C.compare_runs(runs_dir=runs)
    # the same recorded identity but a different evaluation set: not the same perplexities either
    make_run(runs, "c-untied-s0", 0, UNTIED + ["data.max_eval_tokens=500"], val=61.0, identity=ident("fp"))
    with pytest.raises(RunError, match="3 different data sets.*data.max_eval_tokens null vs 500"):
        C.compare_runs(runs_dir=runs)


def test_same_data_everywhere_compares_as_before(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1, 2):
        make_run(runs, f"t-s{s}", s, TIED, val=57.0 + s, identity=ident("fp"))
        make_run(runs, f"u-s{s}", s, UNTIED, val=59.0 + s, identity=ident("fp"))
        # another model on the same data: one data set, three variants
        make_run(runs, f"u64-s{s}", s, UNTIED + ["model.n_embd=64"], val=62.0 + s, identity=ident("fp"))
    result = C.compare_runs(runs_dir=runs)
    assert result["data_sets"] == 1 and result["not_compared"] == []
    assert sorted(v["label"] for v in result["variants"]) == ["tied, n_embd=128", "untied, n_embd=128",
                                                             "untied, n_embd=64"]
    md = (runs / "compare" / "comparison.md").read_text()
    assert "Not compared" not in md and "not compared" not in C.format_terminal_table(result)


# ------------------------------------------------------------------ runs left out


def test_unfinished_failed_and_corrupt_runs_are_left_out_with_reasons(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0], [59.0, 60.5], seeds=[0, 1])
    make_run(runs, "running-s7", 7, TIED, status="running")
    make_run(runs, "failed-s8", 8, TIED, status="failed", error="DataError: split 'validation' is empty")
    make_run(runs, "diverged-s9", 9, UNTIED, status="diverged", error="loss is nan at step 40")
    bad = make_run(runs, "badjson-s3", 3, TIED)
    (bad / "report.json").write_text('{"status": "finished", "final": ')  # torn
    noreport = make_run(runs, "noreport-s4", 4, TIED)
    (noreport / "report.json").unlink()
    nofinal = make_run(runs, "nofinal-s5", 5, TIED)
    rep = json.loads((nofinal / "report.json").read_text())
    rep["final"] = {}
    (nofinal / "report.json").write_text(json.dumps(rep))
    odd = make_run(runs, "base-tied-s1", 1, TIED, val=58.5)  # hand-edited: odd types, still usable
    rep = json.loads((odd / "report.json").read_text())
    rep["final"]["test"] = "n/a"
    rep["final"]["validation"]["buckets"] = 3
    rep["params"] = []
    rep["name"] = "renamed-elsewhere"
    (odd / "report.json").write_text(json.dumps(rep))
    nomodel = make_run(runs, "nomodel-s6", 6, TIED)
    rep = json.loads((nomodel / "report.json").read_text())
    rep["config"]["model"] = "big"
    (nomodel / "report.json").write_text(json.dumps(rep))
    (runs / "notes").mkdir()  # not a run folder: ignored silently
    (runs / "notes" / "todo.txt").write_text("x")
    (runs / "compare").mkdir()  # earlier output: ignored
    (runs / "compare" / "report.json").write_text("{}")
    torn = runs / "base-tied-s0" / "metrics.jsonl"
    torn.write_text(torn.read_text() + "not json\n" + '{"kind": "eval", "step": 1')

    result = C.compare_runs(runs_dir=runs)
    reasons = {s["name"]: s["reason"] for s in result["skipped"]}
    assert set(reasons) == {"running-s7", "failed-s8", "diverged-s9", "badjson-s3", "noreport-s4", "nofinal-s5",
                            "nomodel-s6"}
    assert "no model section" in reasons["nomodel-s6"]
    assert "base-tied-s1" in [r["name"] for r in result["runs"]]  # the folder name, not the report's
    assert reasons["running-s7"].startswith("status running")
    assert "status failed: DataError: split 'validation' is empty" in reasons["failed-s8"]
    assert "status diverged" in reasons["diverged-s9"] and "lr" in reasons["diverged-s9"]
    assert "not valid JSON" in reasons["badjson-s3"]
    assert "no report.json" in reasons["noreport-s4"]
    assert "no final evaluation" in reasons["nofinal-s5"]
    assert sum(v["n_seeds"] for v in result["variants"]) == 4
    assert any("2 unreadable lines of metrics.jsonl" in n for n in result["notes"])
    assert len(variant(result, "tied")["curve"]) == 4  # the good lines still make the curve

    table = C.format_terminal_table(result)
    assert "left out" in table and "badjson-s3" in table and "status running" in table
    md = (runs / "compare" / "comparison.md").read_text()
    assert "## Left out" in md and "failed-s8" in md and "unreadable lines" in md
    rows = list(csv.DictReader((runs / "compare" / "comparison.csv").open()))
    assert {r["run"] for r in rows if r["row_type"] == "skipped"} == set(reasons)


def test_no_finished_runs_is_a_run_error_that_says_what_to_run(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(RunError, match="no runs folder"):
        C.compare_runs(runs_dir=runs)
    make_run(runs, "only-s0", 0, TIED, status="running")
    with pytest.raises(RunError, match=r"no finished runs.*status running.*tiedlm compare --config"):
        C.compare_runs(runs_dir=runs)
    assert not (runs / "compare").exists()


def test_paths_globs_and_parent_folders(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0, 57.5], [59.0, 60.5, 60.0])
    make_run(runs, "other-s0", 0, TIED + ["model.n_layer=2"], val=70)
    out = tmp_path / "cmp"
    result = C.compare_runs([str(runs / "base-*-s[01]"), runs / "base-untied-s2", str(tmp_path / "nope*"),
                             tmp_path / "missing"], runs_dir=runs, out=out)
    assert sorted(r["name"] for r in result["runs"]) == [
        "base-tied-s0", "base-tied-s1", "base-untied-s0", "base-untied-s1", "base-untied-s2"]
    reasons = {s["path"]: s["reason"] for s in result["skipped"]}
    assert reasons[str(tmp_path / "nope*")] == "no run folder matches"
    assert reasons[str(tmp_path / "missing")] == "does not exist"
    assert (out / "comparison.md").exists()
    # welch: tied has seeds 0, 1 and untied 0, 1, 2
    assert variant(result, "tied")["vs_baseline"]["validation"]["test"] == "welch"
    # a folder of runs stands for the runs in it
    assert len(C.compare_runs([runs], runs_dir=runs)["variants"]) == 3


# ------------------------------------------------------------------ outputs


def _strict_json(path: Path) -> dict:
    def bad(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=bad)


def test_end_to_end_writes_every_output_and_valid_pngs(tmp_path):
    import matplotlib.image

    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.1, 57.4], [59.2, 60.0, 60.1])
    make_run(runs, "stale-s5", 5, TIED, status="interrupted")
    result = C.compare_runs(runs_dir=runs)
    out = runs / "compare"
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
    assert "**tied** is " in md and "lower perplexity than **untied** on validation" in md
    assert "paired over 3 seeds" in md and "significant at 0.05" in md
    assert "confidence interval for the mean over seeds" in md
    assert "Loss by token frequency" in md and "top 10%" in md
    assert "saved by tying" in md and f"{V * 128:,}" in md
    assert "Floor of the synthetic language" in md
    assert "stale-s5" in md and "status interrupted" in md
    assert no_nan(md)

    data = _strict_json(out / "comparison.json")
    assert data["baseline"]["label"] == "untied"
    assert [v["label"] for v in data["variants"]] == ["untied", "tied"]
    assert data["files"]["markdown"].endswith("comparison.md")
    assert data == json.loads(json.dumps(result, default=str))  # the returned dict is what was written

    text = (out / "comparison.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    kinds = [r["row_type"] for r in rows]
    assert kinds.count("variant") == 2 and kinds.count("run") == 6 and kinds.count("skipped") == 1
    tied = next(r for r in rows if r["row_type"] == "variant" and r["variant"] == "tied")
    assert float(tied["validation_perplexity"]) == pytest.approx(statistics.mean([57.0, 58.1, 57.4]))
    assert float(tied["validation_p_value"]) < 0.05 and tied["validation_test"] == "paired"
    assert float(tied["validation_loss[top 10%]"]) > 0
    assert no_nan(text)

    table = C.format_terminal_table(result)
    assert table.splitlines()[0].split()[:3] == ["variant", "seeds", "val"]
    assert "tied" in table and "baseline" in table and "comparison.md" in table


def test_single_seed_says_plainly_that_no_interval_can_be_given(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0], [60.0])
    result = C.compare_runs(runs_dir=runs)
    d = variant(result, "tied")["vs_baseline"]["validation"]
    assert d["difference"] == pytest.approx(-3.0) and d["p_value"] is None and d["ci_low"] is None
    out = runs / "compare"
    md = (out / "comparison.md").read_text()
    assert "one seed: no interval" in md and "no confidence interval or p-value can be given" in md
    assert "5.0% lower perplexity than **untied**" in md
    for name in ("comparison.md", "comparison.csv", "comparison.json"):
        assert no_nan((out / name).read_text())
    _strict_json(out / "comparison.json")
    assert "no confidence interval" in C.format_terminal_table(result)


def test_without_learning_curves_or_buckets_plots_still_written(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        r = make_run(runs, f"a-s{s}", s, TIED, curve=False)
        rep = json.loads((r / "report.json").read_text())
        rep["final"]["validation"].pop("buckets")
        rep["floor"] = None
        (r / "report.json").write_text(json.dumps(rep))
        (r / "metrics.jsonl").unlink()
    result = C.compare_runs(runs_dir=runs)
    assert len(result["variants"]) == 1 and result["variants"][0]["label"] == "tied"
    for plot in C.PLOTS.values():
        assert (runs / "compare" / plot).read_bytes()[:8] == PNG
    assert "Only one variant" in (runs / "compare" / "comparison.md").read_text()


def test_duplicate_seed_of_a_variant_is_used_once(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    make_run(runs, "zcopy-tied-s0", 0, TIED, val=50.0)
    result = C.compare_runs(runs_dir=runs)
    assert variant(result, "tied")["n_seeds"] == 2
    assert any("same config and seed 0" in s["reason"] for s in result["skipped"])


# ------------------------------------------------------------------ compare --config


@pytest.fixture
def fake_training(monkeypatch):
    """Fake tiedlm.train, tiedlm.model (count) and tiedlm.data modules; records the runs trained."""
    calls: list[str] = []
    fail: set[str] = set()

    def train_run(cfg, out=Path("runs"), name=None, overwrite=False, progress=True, **_):
        name = name or f"{cfg.name}-s{cfg.seed}"
        calls.append(name)
        if name in fail:
            raise DivergedError(f"{name}: loss is nan at step 3")
        extra_layers = cfg.model.n_layer - 2
        val = 60.0 - (1.5 if cfg.model.tie_embeddings else 0.0) - 0.7 * extra_layers + 0.4 * cfg.seed
        make_run(Path(out), name, cfg.seed, val=val, cfg=cfg)
        return Path(out) / name

    train = types.ModuleType("tiedlm.train")
    train.train_run = train_run
    model = types.ModuleType("tiedlm.model")
    model.count_params_config = gpt2_params
    data = types.ModuleType("tiedlm.data")
    data.prepare_data = lambda cfg: types.SimpleNamespace(model_vocab_size=V)
    for mod in (train, model, data):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return types.SimpleNamespace(calls=calls, fail=fail)


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n"
                    "train:\n  max_steps: 20\n")
    return path


def test_compare_config_trains_both_variants_and_reuses_finished_runs(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    runs = tmp_path / "runs"
    result = C.compare_config(cfg_path, ["train.lr=2e-3"], seeds=2, match=None, runs_dir=runs, progress=False)
    # --set overrides name the runs, so they never clash with the plain config's runs
    assert fake_training.calls == ["tiny-lr=2e-3-tied-s0", "tiny-lr=2e-3-tied-s1",
                                   "tiny-lr=2e-3-untied-s0", "tiny-lr=2e-3-untied-s1"]
    assert [v["label"] for v in result["variants"]] == ["untied", "tied"]
    assert variant(result, "tied")["config"]["train"]["lr"] == 2e-3  # --set applies to every variant
    assert (runs / "compare" / "comparison.md").exists()
    d = variant(result, "tied")["vs_baseline"]["validation"]
    assert d["test"] == "paired" and d["difference"] == pytest.approx(-1.5)

    fake_training.calls.clear()
    make_run(runs, "unrelated-s0", 0, TIED + ["model.n_layer=3"])  # compares exactly its own runs
    again = C.compare_config(cfg_path, ["train.lr=2e-3"], seeds=3, match=None, runs_dir=runs, progress=False)
    assert fake_training.calls == ["tiny-lr=2e-3-tied-s2", "tiny-lr=2e-3-untied-s2"]  # seeds 0, 1 reused
    assert sorted(r["name"] for r in again["runs"]) == sorted(
        f"tiny-lr=2e-3-{t}-s{s}" for t in ("tied", "untied") for s in range(3))


def test_compare_config_seeds_offset_from_config_seed_and_failures_listed(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    fake_training.fail.add("tiny-untied-s5")
    result = C.compare_config(cfg_path, ["seed=4"], seeds=2, match=None, runs_dir=tmp_path / "r", progress=False)
    assert fake_training.calls == ["tiny-tied-s4", "tiny-tied-s5", "tiny-untied-s4", "tiny-untied-s5"]
    assert result["train_failures"] == [{"name": "tiny-untied-s5", "error": "tiny-untied-s5: loss is nan at step 3"}]
    skipped = {s["name"]: s["reason"] for s in result["skipped"]}
    assert "loss is nan" in skipped["tiny-untied-s5"]
    assert "training failed" in C.format_terminal_table(result)
    with pytest.raises(ConfigError):
        C.compare_config(cfg_path, [], seeds=0, match=None, runs_dir=tmp_path / "r", progress=False)
    with pytest.raises(ConfigError):
        C.compare_config(cfg_path, [], seeds=1, match="flops", runs_dir=tmp_path / "r", progress=False)


def test_match_layers_reproduces_gpt2_small_counts():
    cfg = load_config(None, BUDGET + ["model.n_layer=12", "model.n_head=12", "model.n_embd=768",
                                      "model.block_size=1024"]).model
    m = C.match_layers(cfg, 50257, count=gpt2_params)
    assert m["tied_total"] == 124_439_808 and m["untied_total"] == 163_037_184  # GPT-2 small
    assert m["matched_n_layer"] == 17  # 38.6M saved / 7.09M per layer = 5.4 more layers
    assert abs(m["matched_total"] - m["untied_total"]) <= m["layer_params"] / 2


def test_match_params_adds_a_tied_variant_within_one_layer_of_untied(tmp_path, fake_training):
    cfg_path = write_config(tmp_path)
    runs = tmp_path / "runs"
    result = C.compare_config(cfg_path, [], seeds=2, match="params", runs_dir=runs, progress=False)
    assert fake_training.calls[-2:] == ["tiny-tied-matched-s0", "tiny-tied-matched-s1"]
    m = result["match"]
    d = 64
    layer = 12 * d * d + 13 * d
    assert m["layer_params"] == layer and m["vocab_size"] == V
    assert m["untied_total"] - m["tied_total"] == V * d
    assert abs(m["matched_total"] - m["untied_total"]) <= layer
    assert m["matched_n_layer"] == 2 + round(V * d / layer)
    labels = sorted(v["label"] for v in result["variants"])
    assert labels == ["tied, n_layer=2", f"tied, n_layer={m['matched_n_layer']}", "untied, n_layer=2"]
    matched = variant(result, f"tied, n_layer={m['matched_n_layer']}")
    assert matched["params"]["total"] == m["matched_total"]
    md = (runs / "compare" / "comparison.md").read_text()
    assert "Parameter matching" in md
    assert f"{m['untied_total']:,}" in md and f"{m['matched_total']:,}" in md


# ------------------------------------------------------------------ the real thing, tiny


def test_real_compare_config_end_to_end_on_a_tiny_config(tmp_path):
    """train.py, data.py and evaluate.py for real, on the built-in synthetic language, CPU."""
    import matplotlib.image

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("""\
name: tiny
data:
  synthetic: {vocab_size: 120, n_classes: 6, successors: 2, train_tokens: 6000, validation_tokens: 1500,
              test_tokens: 1500}
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
train: {device: cpu, dtype: fp32, batch_size: 4, max_steps: 6, warmup_steps: 1, eval_every: 3,
        eval_tokens: 256, checkpoint_every: 0, log_every: 3}
""")
    runs = tmp_path / "runs"
    result = C.compare_config(cfg, [], seeds=2, match=None, runs_dir=runs, progress=False)
    assert not result["skipped"] and not result["train_failures"]
    assert sorted(r["name"] for r in result["runs"]) == ["tiny-tied-s0", "tiny-tied-s1",
                                                         "tiny-untied-s0", "tiny-untied-s1"]
    tied, untied = variant(result, "tied"), variant(result, "untied")
    assert untied["is_baseline"] and tied["vs_baseline"]["validation"]["test"] == "paired"
    assert tied["params"]["saved_by_tying"] == tied["params"]["wte"] > 0
    assert untied["params"]["total"] - tied["params"]["total"] == tied["params"]["wte"]
    assert len(tied["curve"]) == 2 and tied["metrics"]["validation"]["buckets"]
    out = runs / "compare"
    for name in ("comparison.md", "comparison.csv", "comparison.json"):
        assert no_nan((out / name).read_text())
    for plot in C.PLOTS.values():
        assert (out / plot).read_bytes()[:8] == PNG
        assert matplotlib.image.imread(out / plot).ndim == 3
    md = (out / "comparison.md").read_text()
    assert "paired over 2 seeds" in md and "## Loss by token frequency" in md

    # the config edited: the old finished runs are refused and left out, never compared as new
    cfg.write_text(cfg.read_text().replace("max_steps: 6", "max_steps: 5"))
    with pytest.raises(RunError, match="no finished runs"):
        C.compare_config(cfg, [], seeds=1, match=None, runs_dir=runs, progress=False)
    again = C.compare_config(cfg, [], seeds=1, match=None, runs_dir=runs, progress=False, overwrite=True)
    assert not again["train_failures"]
    assert sorted(r["name"] for r in again["runs"]) == ["tiny-tied-s0", "tiny-untied-s0"]
    assert {v["config"]["train"]["max_steps"] for v in again["variants"]} == {5}
    # --set overrides get folders of their own, next to the plain runs
    other = C.compare_config(cfg, ["train.lr=2e-3"], seeds=1, match=None, runs_dir=runs, progress=False)
    assert sorted(r["name"] for r in other["runs"]) == ["tiny-lr=2e-3-tied-s0", "tiny-lr=2e-3-untied-s0"]


def test_bucket_differences_are_tested_by_seed(tmp_path):
    """Each frequency bucket's loss difference gets the same paired test as perplexity."""
    runs = tmp_path / "runs"
    rare = {0: 7.30, 1: 7.36, 2: 7.41}
    base = {0: 7.10, 1: 7.22, 2: 7.19}
    for seed in range(3):
        for tied, table in ((True, rare), (False, base)):
            name = f"{'tied' if tied else 'untied'}-s{seed}"
            make_run(runs, name, seed, TIED if tied else UNTIED)
            report = json.loads((runs / name / "report.json").read_text())
            for split in report["final"].values():
                split["buckets"] = [{"name": "rest 50%", "loss": table[seed], "tokens": 100}]
            (runs / name / "report.json").write_text(json.dumps(report))
    result = C.compare_runs(None, runs_dir=runs)
    test = variant(result, "tied")["vs_baseline"]["validation"]["buckets"]["rest 50%"]
    expected = scipy_stats.ttest_rel([rare[s] for s in range(3)], [base[s] for s in range(3)])
    assert test["test"] == "paired"
    assert test["difference"] == pytest.approx(sum(rare.values()) / 3 - sum(base.values()) / 3)
    assert test["p_value"] == pytest.approx(expected.pvalue, rel=1e-6)
    md = (runs / "compare" / "comparison.md").read_text()
    assert f"p={expected.pvalue:.3f}" in md
