"""compare/datasets.py: runs are contrasted only with runs trained and evaluated on the same tokens;
runs on several data sets are refused, or --baseline picks one and the others are listed."""

import csv
import math
from pathlib import Path

import pytest

import tiedlm.compare as C
from tests.test_compare import (
    TIED,
    UNTIED,
    V,
    _strict_json,
    dloss,
    edit_report,
    make_run,
    raises_exactly,
)
from tiedlm.errors import ConfigError, RunError
from .conftest import comparison_dir


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


def test_runs_on_different_data_without_twins_are_refused_with_how_the_data_differ(tmp_path):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    runs = tmp_path / "runs"
    make_two_vocab_sizes(runs)
    for s in (0, 1):  # the 4096 data set keeps its tied runs only: no contrast of them stays on their data
        for f in (runs / f"v4096-untied-s{s}").iterdir():
            f.unlink()
        (runs / f"v4096-untied-s{s}").rmdir()
    with raises_exactly(RunError) as err:
        C.compare_runs(runs_dir=runs)
    msg = str(err.value)
    assert "\n" not in msg and "2 different data sets" in msg and "never compared" in msg
    assert "data.synthetic.vocab_size 1000 vs 4096" in msg and "tokenizer.vocab_size 8192 vs 4096" in msg
    assert f"tiedlm compare '{runs / 'v1000-'}*'" in msg and f"{runs / 'v4096-tied-s'}*: 2 runs" in msg  # quoted: typed as is
    assert "--baseline" in msg
    assert not [p for p in runs.iterdir() if p.name.startswith("compare")]  # nothing written, no verdict drawn

    r = CliRunner().invoke(app, ["compare", "--out", str(runs)])
    assert r.exit_code == 1 and "data.synthetic.vocab_size 1000 vs 4096" in r.output
    assert "lower perplexity" not in r.output and "higher perplexity" not in r.output

    # the runs of one data set at a time compare as before, with short labels
    one = C.compare_runs([str(runs / "v1000-*")], runs_dir=runs)
    assert [v.label for v in one.variants] == ["untied", "tied"] and one.data_sets == 1


def test_a_grid_across_data_sets_contrasts_each_tied_variant_with_its_twin_on_its_own_data(tmp_path):
    """A tokenizer (or corpus) axis: every tied variant has its untied twin on the same data, so each
    contrast is a ratio within one data set, and the comparison says the perplexities are not comparable."""
    runs = tmp_path / "runs"
    make_two_vocab_sizes(runs)
    c = C.compare_runs(runs_dir=runs)
    assert c.data_sets == 2 and c.mode == "matched" and c.baseline_label is None
    got = {m.tied: m.untied for m in c.matched}
    assert len(got) == 2 and all(("1000" in t) == ("1000" in u) for t, u in got.items())  # twins on their own data
    for m in c.matched:  # each effect is its own data set's: by hand from the two seeds' perplexities
        small = "1000" in m.tied
        tied_ppl, untied_ppl = ((40.0, 41.0), (41.0, 42.0)) if small else ((120.0, 121.0), (124.0, 125.0))
        want = math.exp(sum(math.log(t / u) for t, u in zip(tied_ppl, untied_ppl)) / 2) - 1
        assert m.split("validation").relative == pytest.approx(want)
    assert any("the runs are on 2 data sets" in n and "not comparable" in n for n in c.notes)
    assert any("data.synthetic.vocab_size" in n and "tokenizer.vocab_size" in n for n in c.notes)


def test_baseline_compares_within_its_data_set_and_lists_the_others(tmp_path):
    runs = tmp_path / "runs"
    make_two_vocab_sizes(runs)
    # labels over all the runs name the data keys, so a label part picks the data set
    result = C.compare_runs(runs_dir=runs, baseline="untied, synthetic.vocab_size=1000")
    # labels are computed within the data set: the data keys do not differ there
    assert [v.label for v in result.variants] == ["untied", "tied"]
    assert result.differing_keys == ["model.tie_embeddings"]
    assert result.baseline_label == "untied" and "--baseline" in result.baseline_reason
    assert sorted(r.name for r in result.runs) == [
        "v1000-tied-s0", "v1000-tied-s1", "v1000-untied-s0", "v1000-untied-s1"]
    tied = result.variant("tied").vs_baseline
    # 40, 41 vs 41, 42, not vs 124, 125: tested on the loss
    assert tied.split("validation").difference == pytest.approx(dloss([40.0, 41.0], [41.0, 42.0]))
    assert tied.split("validation").test == "paired" and tied.params_difference == -V * 128
    assert result.data_sets == 2
    other = {n.variant: n for n in result.not_compared}
    assert set(other) == {"tied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096",
                          "untied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096"}
    for n in other.values():
        assert n.reason == ("trained on other data (data.synthetic.vocab_size 4096 instead of 1000, "
                            "tokenizer.vocab_size 4096 instead of 8192)")
    tied4096 = other["tied, synthetic.vocab_size=4096, tokenizer.vocab_size=4096"]
    assert tied4096.runs == ["v4096-tied-s0", "v4096-tied-s1"] and tied4096.data_set == 2

    out = comparison_dir(runs)
    md = (out / "comparison.md").read_text()
    text = C.format_terminal_table(result)
    for line in result.verdicts + md.splitlines() + text.splitlines():
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
    assert {r.name[:5] for r in by_run.runs} == {"v4096"}
    assert by_run.variant("tied").contrast("validation").difference == pytest.approx(dloss([120, 121], [124, 125]))
    with raises_exactly(ConfigError, match="several variants"):
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
    with raises_exactly(RunError, match=r"the data files changed between runs \(source fingerprint differs\)"):
        C.compare_runs(runs_dir=runs)
    result = C.compare_runs(runs_dir=runs, baseline="old-untied-s0")
    assert sorted(r.name for r in result.runs) == ["old-tied-s0", "old-tied-s1", "old-untied-s0", "old-untied-s1"]
    assert [v.label for v in result.variants] == ["untied", "tied"]
    assert result.variant("tied").seeds == [0, 1]
    assert result.variant("tied").contrast("validation").test == "paired"
    assert {n.variant for n in result.not_compared} == {"tied [data set 1]", "untied [data set 1]"}
    assert all("source fingerprint differs" in n.reason for n in result.not_compared)
    # a tokenizer key that differs alone (same source, same config) separates runs too
    for name in ("new-tied-s2", "new-tied-s3", "new-untied-s2", "new-untied-s3"):
        edit_report(runs / name, data_identity=ident("files-before", "another-tokenizer"))
    with raises_exactly(RunError, match="the tokenizer changed between runs"):
        C.compare_runs(runs_dir=runs)


def test_data_without_recorded_identity_falls_back_to_the_config(tmp_path):
    runs = tmp_path / "runs"
    # the same data: one report with data_identity, one without (hand-made); grouped together
    make_run(runs, "a-tied-s0", 0, TIED, val=57.0, identity=ident("fp"))
    make_run(runs, "a-untied-s0", 0, UNTIED, val=59.0)
    result = C.compare_runs(runs_dir=runs)
    assert result.data_sets == 1 and not result.not_compared
    assert result.variant("tied").contrast("validation").difference == pytest.approx(math.log(57 / 59))
    # without data_identity, a different data config is different data
    make_run(runs, "b-untied-s0", 0, UNTIED + ["data.synthetic.seed=7"], val=70.0)
    with raises_exactly(RunError, match="data.synthetic.seed 0 vs 7"):
        C.compare_runs(runs_dir=runs)
    # the same recorded identity but a different evaluation set: not the same perplexities either
    make_run(runs, "c-untied-s0", 0, UNTIED + ["data.max_eval_tokens=500"], val=61.0, identity=ident("fp"))
    with raises_exactly(RunError, match="3 different data sets.*data.max_eval_tokens null vs 500"):
        C.compare_runs(runs_dir=runs)


def test_same_data_everywhere_compares_as_before(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1, 2):
        make_run(runs, f"t-s{s}", s, TIED, val=57.0 + s, identity=ident("fp"))
        make_run(runs, f"u-s{s}", s, UNTIED, val=59.0 + s, identity=ident("fp"))
        # another model on the same data: one data set, three variants
        make_run(runs, f"u64-s{s}", s, UNTIED + ["model.n_embd=64"], val=62.0 + s, identity=ident("fp"))
    result = C.compare_runs(runs_dir=runs)
    assert result.data_sets == 1 and result.not_compared == []
    assert sorted(v.label for v in result.variants) == ["tied, n_embd=128", "untied, n_embd=128", "untied, n_embd=64"]
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "Not compared" not in md and "not compared" not in C.format_terminal_table(result)


def test_runs_recorded_before_content_digests_join_the_runs_that_name_them_by_mtime(tmp_path):
    """A run recorded since local files are hashed carries its identity by modification time too:
    runs recorded before, under that identity, are on the same tokens and compare with it; runs
    under another old identity (the files touched in between) stay apart."""
    runs = tmp_path / "runs"
    now = {**ident("by-content"), "by_mtime": ident("by-mtime")}
    make_run(runs, "a-tied-s0", 0, TIED, val=57.0, identity=ident("by-mtime"))  # recorded before
    make_run(runs, "a-untied-s0", 0, UNTIED, val=59.0, identity=ident("by-mtime"))
    make_run(runs, "b-tied-s1", 1, TIED, val=58.0, identity=now)  # recorded since
    make_run(runs, "b-untied-s1", 1, UNTIED, val=60.5, identity=now)
    result = C.compare_runs(runs_dir=runs)
    assert sorted(r.name for r in result.runs) == ["a-tied-s0", "a-untied-s0", "b-tied-s1", "b-untied-s1"]
    assert result.variant("tied").seeds == [0, 1] and result.not_compared == []
    make_run(runs, "c-tied-s2", 2, TIED, val=50.0, identity=ident("touched-since"))
    with raises_exactly(RunError, match=r"the data files changed between runs \(source fingerprint differs\)"):
        C.compare_runs(runs_dir=runs)
