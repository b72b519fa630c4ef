"""tiedlm.load_results (tiedlm/results.py): a comparison, a run and a folder of runs as one row per
run with the numbers their comparison.json and report.json hold; pandas missing and a path that is
no run are one-line errors."""

import json
import sys

import pytest

import tiedlm
from tiedlm import runs
from tiedlm.compare import compare_runs
from tiedlm.errors import ConfigError, NotARunError


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    from .conftest import train_tied_untied

    root = tmp_path_factory.mktemp("results")
    pair = train_tied_untied(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEDLM_CACHE", str(root / "cache"))
        compare_runs([pair / "ttrue", pair / "tfalse"], out=root / "cmp")
    return root


def test_a_comparison_is_a_row_per_run_with_its_numbers(compared):
    df = tiedlm.load_results(compared / "cmp")
    data = json.loads((compared / "cmp" / "comparison.json").read_text())
    assert sorted(df["run"]) == ["tfalse", "ttrue"] and len(df) == len(data["runs"])
    for r in data["runs"]:
        row = df[df["run"] == r["name"]].iloc[0]
        assert row["variant"] == r["variant"] and row["seed"] == r["seed"] and row["params_total"] == r["params_total"]
        for col in ("validation_loss", "validation_perplexity", "test_bits_per_byte"):
            assert row[col] == r[col]
    assert tiedlm.load_results(compared / "cmp" / "comparison.json").equals(df)


def test_runs_are_rows_with_the_keys_that_differ_between_them(compared):
    df = tiedlm.load_results(compared / "runs")
    assert sorted(df["run"]) == ["tfalse", "ttrue"]
    assert dict(zip(df["run"], df["model.tie_embeddings"])) == {"ttrue": True, "tfalse": False}
    assert "model.n_embd" not in df.columns  # the same in both: not a key that was varied
    report = runs.read_report(compared / "runs" / "ttrue")
    one = tiedlm.load_results(compared / "runs" / "ttrue").iloc[0]
    assert one["test_perplexity"] == report.final["test"]["perplexity"]
    assert one["params_total"] == report.params["total"] and one["params_lm_head"] == 0


def test_missing_pandas_and_a_path_that_is_no_run_are_one_line(compared, tmp_path, monkeypatch):
    with pytest.raises(NotARunError, match="is neither a comparison, a run nor a folder of runs"):
        tiedlm.load_results(tmp_path)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ConfigError, match=r"^tiedlm.load_results needs pandas — pip install 'tiedlm\[pandas\]'$"):
        tiedlm.load_results(compared / "cmp")


def test_every_name_tiedlm_exports_resolves():
    """`tiedlm.<name>` for each lazy export: load_results beside the others, each from the module
    that holds it now."""
    assert "load_results" in tiedlm.__all__
    for name in tiedlm.__all__:
        assert getattr(tiedlm, name) is not None, name
