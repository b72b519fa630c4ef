"""compare on the loss, end to end: the issue's exactly-5% example, the primary endpoint and its
confirmation, Holm-adjusted buckets, matched contrasts in a tying × n_embd grid, runs separated by
the device and dtype they resolved to, and the weight-decay line. Run folders are written through
the report schema (make_run)."""

import json
import math

import pytest

import tiedlm.compare as C
from tests.test_compare import (
    PNG,
    TIED,
    UNTIED,
    V,
    _strict_json,
    edit_report,
    make_run,
    no_nan,
    raises_exactly,
    split_metrics,
)
from tiedlm.errors import ConfigError
from .conftest import comparison_dir

scipy_stats = pytest.importorskip("scipy.stats")


def test_exactly_five_percent_better_on_every_seed_is_minus_five_with_a_point_interval(tmp_path):
    """The issue's example: baseline seeds at 100/140/60, the variant 5% lower on each. On raw
    perplexity this gave p = 0.049 and −9.97% to −0.03%; on the loss it is exactly −5%."""
    runs = tmp_path / "runs"
    for seed, base in enumerate((100.0, 140.0, 60.0)):
        make_run(runs, f"u-s{seed}", seed, UNTIED, val=base, test=base)
        make_run(runs, f"t-s{seed}", seed, TIED, val=0.95 * base, test=0.95 * base)
    result = C.compare_runs(runs_dir=runs)
    d = result.variant("tied").contrast("validation")
    assert d.test == "paired" and d.relative == pytest.approx(-0.05, abs=1e-12)
    assert d.relative_ci_low == d.relative_ci_high == d.relative  # a zero-width interval
    assert d.p_value == 0.0 and d.significant is True and "no spread" in d.note
    assert d.variant_mean == pytest.approx(0.95 * scipy_stats.gmean([100, 140, 60]))
    assert d.power.mde == 0.0
    verdict = result.verdicts[0]
    assert "has 5.00% lower perplexity than **untied**" in verdict
    assert "95% CI −5.00% to −5.00%, p<0.001, paired over 3 seeds" in verdict
    assert "any difference is detectable with 3 seeds" in " ".join(result.verdicts)
    table = C.format_terminal_table(result)
    assert "−5.00%" in table and "−5.00% to −5.00%" in table
    for name in ("comparison.md", "comparison.csv", "comparison.json"):
        assert no_nan((comparison_dir(runs) / name).read_text())
    data = _strict_json(comparison_dir(runs) / "comparison.json")
    assert data["variants"][1]["vs_baseline"]["validation"]["t"] is None  # infinite: null in strict JSON


def test_no_perplexity_interval_is_ever_negative(tmp_path):
    """Two seeds far apart: the old raw-perplexity interval went below zero (−165.87 – 2443.02)."""
    runs = tmp_path / "runs"
    for seed, (t, u) in enumerate(((210.0, 220.0), (2100.0, 2000.0))):
        make_run(runs, f"t-s{seed}", seed, TIED, val=t)
        make_run(runs, f"u-s{seed}", seed, UNTIED, val=u)
    result = C.compare_runs(runs_dir=runs)
    for v in result.variants:
        for m in v.metrics.values():
            assert m.perplexity.ci_low > 0 and m.perplexity.ci_low < m.perplexity.mean < m.perplexity.ci_high
    d = result.variant("tied").contrast("validation")
    assert d.relative_ci_low > -1.0  # a ratio: never below −100%
    assert "−" not in table_lines(result)[2].split("baseline")[0]


def table_lines(result) -> list[str]:
    """The terminal table's lines after the protocol line (these fabricated runs are untuned)."""
    return [line for line in C.format_terminal_table(result).splitlines() if not line.startswith("protocol: ")]


def test_primary_endpoint_carries_the_verdict_and_the_other_split_confirms(tmp_path):
    runs = tmp_path / "runs"
    # validation: tied clearly better; test: no clear difference
    for seed, (tv, uv, tt, ut) in enumerate(((57.0, 59.2, 60.0, 60.1), (58.1, 60.0, 60.9, 60.2),
                                             (57.4, 60.1, 60.3, 60.9))):
        make_run(runs, f"t-s{seed}", seed, TIED, val=tv, test=tt)
        make_run(runs, f"u-s{seed}", seed, UNTIED, val=uv, test=ut)
    result = C.compare_runs(runs_dir=runs)
    assert result.primary == "validation" and result.confirmations == ["test"]
    lines = result.variant("tied").verdicts
    assert "on validation, the primary endpoint" in lines[0] and ": significant at 0.05" in lines[0]
    assert lines[1].startswith("test does not confirm: ")
    assert lines[2].startswith("Effects between −") and " may not be detectable with " in lines[2]
    assert "at the observed spread itself, between −" in lines[2]
    assert len([line for line in result.verdicts if "primary endpoint" in line]) == 1  # one verdict, not two

    on_test = C.compare_runs(runs_dir=runs, primary="test", out=tmp_path / "t")
    lines = on_test.variant("tied").verdicts
    assert "on test, the primary endpoint" in lines[0] and "not significant at 0.05" in lines[0]
    assert lines[1].startswith("validation does not confirm: it alone finds a significant difference")
    md = (tmp_path / "t" / "comparison.md").read_text()
    assert ("The primary endpoint is the test loss: it alone carries the verdict. Validation is reported as "
            "confirmation, and the per-bucket differences are secondary") in md
    assert "test ppl" in table_lines(on_test)[0]

    with raises_exactly(ConfigError, match="--primary: 'dev' must be train, validation or test"):
        C.compare_runs(runs_dir=runs, primary="dev")
    with raises_exactly(ConfigError, match="--primary train: no compared run has a final train evaluation"):
        C.compare_runs(runs_dir=runs, primary="train")


def test_primary_through_the_cli(tmp_path):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    runs = tmp_path / "runs"
    for seed in range(2):
        make_run(runs, f"t-s{seed}", seed, TIED, val=57.0 + seed)
        make_run(runs, f"u-s{seed}", seed, UNTIED, val=59.5 + seed * 0.8)
    r = CliRunner().invoke(app, ["compare", "--out", str(runs), "--primary", "test"])
    assert r.exit_code == 0 and "on test, the primary endpoint" in r.output
    r = CliRunner().invoke(app, ["compare", "--out", str(runs), "--primary", "dev"])
    assert r.exit_code == 2 and "--primary: 'dev' must be train, validation or test" in r.output


def test_bucket_contrasts_are_secondary_with_holm_adjusted_p_values(tmp_path):
    runs = tmp_path / "runs"
    shifts = {"top": [0.01, 0.03, 0.02], "mid": [-0.05, -0.03, -0.06], "rare": [-0.20, -0.12, -0.25]}
    for seed in range(3):
        for tied in (True, False):
            buckets = [{"name": n, "loss": 5.0 + i + (shifts[n][seed] if tied else 0.0) + 0.01 * seed, "tokens": 10}
                       for i, n in enumerate(shifts)]
            final = {s: {**split_metrics(60.0 - (1.0 if tied else 0.0) + seed, buckets=False), "buckets": buckets}
                     for s in ("validation", "test")}
            make_run(runs, f"{'t' if tied else 'u'}-s{seed}", seed, TIED if tied else UNTIED, final=final)
    result = C.compare_runs(runs_dir=runs)
    tests = result.variant("tied").vs_baseline.splits["validation"].buckets
    p = {n: scipy_stats.ttest_rel([5.0 + i + shifts[n][s] for s in range(3)], [5.0 + i for s in range(3)]).pvalue
         for i, n in enumerate(shifts)}
    for n in shifts:  # each bucket's own paired test on its loss, with its own interval
        assert tests[n].p_value == pytest.approx(p[n], rel=1e-8)
        ci = scipy_stats.ttest_rel([5.0 + shifts[n][s] for s in range(3)], [5.0] * 3).confidence_interval(0.95)
        assert (tests[n].ci_low, tests[n].ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    # Holm over the three buckets of this contrast, by hand
    order = sorted(shifts, key=p.get)
    running = 0.0
    for k, n in enumerate(order):
        running = max(running, min(1.0, (3 - k) * p[n]))
        assert tests[n].p_holm == pytest.approx(running, rel=1e-8)
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "## Loss by token frequency (validation, secondary)" in md and "| Holm p |" in md
    assert f"Holm p={tests['rare'].p_holm:.3f}" in md


def make_grid(runs, widths=(64, 128), seeds=(0, 1), effect=None) -> None:
    """A sweep over tying × n_embd × seeds, as tiedlm sweep names its runs."""
    effect = effect or {64: -0.04, 128: -0.01}
    for d in widths:
        for seed in seeds:
            base = 40.0 + 8000.0 / d + 0.7 * seed
            make_run(runs, f"g-tie_embeddings=false-n_embd={d}-s{seed}", seed, UNTIED + [f"model.n_embd={d}"],
                     val=base * (1 + 0.002 * seed))
            make_run(runs, f"g-tie_embeddings=true-n_embd={d}-s{seed}", seed, TIED + [f"model.n_embd={d}"],
                     val=base * (1 + effect[d]))


def test_grid_gives_one_matched_contrast_per_setting(tmp_path):
    runs = tmp_path / "runs"
    make_grid(runs)
    result = C.compare_runs(runs_dir=runs)
    assert result.mode == "matched" and result.baseline is None and result.baseline_label is None
    assert [(m.label, m.tied, m.untied) for m in result.matched] == [
        ("n_embd=64", "tied, n_embd=64", "untied, n_embd=64"), ("n_embd=128", "tied, n_embd=128", "untied, n_embd=128")]
    for m, d in zip(result.matched, (64, 128)):
        c = m.split("validation")
        assert m.setting == {"model.n_embd": d} and m.contrast.kind == "matched" and c.test == "paired"
        untied = result.variant(f"untied, n_embd={d}")
        assert m.embedding_share == pytest.approx(V * d / untied.params["total"])
        assert m.tied_params == untied.params["total"] - V * d
        # the effect is the ratio of the per-seed perplexities, paired by seed
        seeds_t = result.variant(f"tied, n_embd={d}").split("validation").loss_by_seed
        seeds_u = untied.split("validation").loss_by_seed
        ref = scipy_stats.ttest_rel([seeds_t[s] for s in (0, 1)], [seeds_u[s] for s in (0, 1)])
        assert c.p_value == pytest.approx(ref.pvalue, rel=1e-8)
        assert c.relative == pytest.approx(math.exp(sum(seeds_t[s] - seeds_u[s] for s in (0, 1)) / 2) - 1)
    assert result.matched[0].split("validation").relative < result.matched[1].split("validation").relative
    # untied variants are references, not contrasted; every tied one is against its own twin
    assert result.variant("untied, n_embd=64").vs_baseline is None
    assert result.variant("tied, n_embd=128").vs_baseline.baseline == "untied, n_embd=128"

    out = comparison_dir(runs)
    assert (out / C.MATCHED_PLOT).read_bytes()[:8] == PNG
    assert result.files["plot_tying_effect"].endswith(C.MATCHED_PLOT)
    md = (out / "comparison.md").read_text()
    assert "## Tying effect per setting (validation)" in md and f"]({C.MATCHED_PLOT})" in md
    assert "| n_embd=64 |" in md and "no single baseline" in md
    table = C.format_terminal_table(result)
    lines = table_lines(result)
    assert lines[0].split()[:2] == ["setting", "tied"] and "V·d share" in lines[0]
    assert lines[2].startswith("n_embd=64 ")
    data = _strict_json(out / "comparison.json")
    assert data["mode"] == "matched" and data["baseline"]["label"] is None
    assert [m["label"] for m in data["matched"]] == ["n_embd=64", "n_embd=128"]
    assert list(data["matched"][0]) == ["setting", "label", "tied", "untied", "split", "tied_perplexity",
                                        "untied_perplexity", "effect", "ci_low", "ci_high", "p_value", "test", "seeds",
                                        "embedding_share", "tied_params", "untied_params", "power"]

    # the settings are one family: each is significant only after Holm's adjustment over them
    from tiedlm.compare.stats import holm

    tested = [m.split(result.primary) for m in result.matched]
    for d, p in zip(tested, holm([d.p_value for d in tested])):
        assert d.p_holm == pytest.approx(p) and d.holm_family == 2 and d.significant == (p < 0.05)
    assert all("after Holm's adjustment over the settings" in line and "Holm-adjusted over the grid's 2 settings" in line
               for line in result.verdicts if "primary endpoint" in line)

    # --baseline keeps the one-baseline layout
    one = C.compare_runs(runs_dir=runs, baseline="untied, n_embd=128", out=tmp_path / "one")
    assert one.mode == "baseline" and one.matched == [] and one.baseline_label == "untied, n_embd=128"
    assert all(v.vs_baseline.baseline == "untied, n_embd=128" for v in one.variants if not v.is_baseline)
    assert not (tmp_path / "one" / C.MATCHED_PLOT).exists()


def test_plain_tied_vs_untied_keeps_one_baseline(tmp_path):
    runs = tmp_path / "runs"
    make_grid(runs, widths=(64,))
    result = C.compare_runs(runs_dir=runs)
    assert result.mode == "baseline" and result.baseline_label == "untied" and result.matched == []


def test_runs_that_resolved_to_another_device_or_dtype_are_another_variant(tmp_path):
    runs = tmp_path / "runs"
    for seed in range(2):
        make_run(runs, f"t-s{seed}", seed, TIED, val=57.0 + seed)
        make_run(runs, f"u-s{seed}", seed, UNTIED, val=59.0 + seed)
        # the same tied config, train.device auto: resolved to a GPU in bf16 this time
        gpu = make_run(runs, f"t-gpu-s{seed}", seed, TIED, val=56.0 + seed)
        edit_report(gpu, device="cuda:0", dtype="bf16")
    result = C.compare_runs(runs_dir=runs, baseline="untied (cpu, fp32)")
    labels = sorted(v.label for v in result.variants)
    assert labels == ["tied (cpu, fp32)", "tied (cuda, bf16)", "untied (cpu, fp32)"]
    assert len({v.config_hash for v in result.variants if v.tied}) == 1  # one config hash, two variants
    stored = json.loads((runs / "t-gpu-s0" / "report.json").read_text())["config_hash"]
    assert stored == result.variant("tied (cuda, bf16)").config_hash  # the stored hashes stay valid
    assert result.variant("tied (cuda, bf16)").resolution == "cuda, bf16"
    assert any("resolved to different devices or dtypes" in n for n in result.notes)
    assert "| cuda, bf16 |" in (comparison_dir(runs) / "comparison.md").read_text()


def test_the_decay_line_appears_only_when_embeddings_are_decayed(tmp_path):
    for decay, expected in (("true", True), ("false", False)):
        runs = tmp_path / decay
        for seed in range(2):
            make_run(runs, f"t-s{seed}", seed, TIED + [f"train.decay_embeddings={decay}"], val=57.0 + seed)
            make_run(runs, f"u-s{seed}", seed, UNTIED + [f"train.decay_embeddings={decay}"], val=59.0 + seed)
        C.compare_runs(runs_dir=runs)
        md = (comparison_dir(runs) / "comparison.md").read_text()
        assert ("decay shrinks the rows of an untied E that get no gradient" in md) is expected


def test_decay_ablation_grid_loads_and_crosses_tying_with_decay():
    from pathlib import Path

    from tiedlm.experiment.sweep import expand, load_grid

    runs = expand(load_grid(Path(__file__).resolve().parents[1] / "configs" / "decay-ablation.yaml"))
    combos = {(r.cfg.model.tie_embeddings, r.cfg.train.decay_embeddings) for r in runs}
    assert combos == {(True, True), (True, False), (False, True), (False, False)}
    assert len(runs) == 12 and {r.cfg.seed for r in runs} == {0, 1, 2}


def test_a_tiny_but_consistent_difference_is_never_called_the_same():
    import types

    from tiedlm.compare.verdicts import verdict

    d = types.SimpleNamespace(difference=1e-7, relative=1e-7, variant_mean=60.000006, baseline_mean=60.0,
                              ci_low=None, note="no spread between seeds", significant=True)
    text = verdict("tied", "untied", d, "validation")
    assert "1e-05% higher perplexity" in text and "same perplexity" not in text and text.endswith("significant at 0.05.")
    d.relative = d.difference = 0.0
    assert "has the same perplexity as **untied**" in verdict("tied", "untied", d, "validation")


def test_grid_rows_of_two_tie_modes_at_one_setting_name_their_tie(tmp_path):
    """A grid over tie modes: lowrank and projection at n_embd 64 each against the one untied twin
    must read as two rows, not two rows both called n_embd=64."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        for d in (64, 128):
            make_run(runs, f"g-untied-{d}-s{seed}", seed, UNTIED + [f"model.n_embd={d}"], val=60 + seed)
        make_run(runs, f"g-lowrank-s{seed}", seed, ["model.tie_mode=lowrank", "model.untie_rank=4", "model.n_embd=64"],
                 val=58 + seed)
        make_run(runs, f"g-projection-s{seed}", seed, ["model.tie_mode=projection", "model.n_embd=64"], val=57 + seed)
        make_run(runs, f"g-tied-128-s{seed}", seed, TIED + ["model.n_embd=128"], val=59 + seed)
    result = C.compare_runs(runs_dir=runs)
    labels = [m.label for m in result.matched]
    assert labels == ["lowrank r=4, n_embd=64", "projection, n_embd=64", "tied, n_embd=128"]
    assert len(set(labels)) == len(labels)
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "| lowrank r=4, n_embd=64 |" in md and "| projection, n_embd=64 |" in md


def test_a_one_key_grid_gets_the_tying_line_from_its_settings(tmp_path):
    """Four widths, tying helping more as the model grows, with seed noise: compare fits the line
    over log2 n_embd from the matched contrasts and says where it crosses zero, in the terminal,
    comparison.md and comparison.json."""
    runs = tmp_path / "runs"
    effect = {32: 0.04, 64: 0.015, 128: -0.01, 256: -0.035}
    for d, e in effect.items():
        for seed in (0, 1, 2):
            base = 40.0 + 8000.0 / d + 0.7 * seed
            make_run(runs, f"g-tie_embeddings=false-n_embd={d}-s{seed}", seed, UNTIED + [f"model.n_embd={d}"],
                     val=base * (1 + 0.002 * seed))
            make_run(runs, f"g-tie_embeddings=true-n_embd={d}-s{seed}", seed, TIED + [f"model.n_embd={d}"],
                     val=base * (1 + e) * (1 + 0.003 * (seed - 1)))
    result = C.compare_runs(runs_dir=runs)
    line = result.tying_line
    assert result.tying_map is None and line is not None and line.key == "model.n_embd"
    d = {m.setting["model.n_embd"]: m.split("validation").difference for m in result.matched}
    assert [p[1] for p in line.points] == pytest.approx([d[w] for w in (32, 64, 128, 256)])
    assert line.slope < 0 and 64 < line.crossing < 128
    md = (comparison_dir(runs) / "comparison.md").read_text()
    assert "### The tying line over n_embd" in md and "Tying starts to help where the line crosses zero" in md
    data = json.loads((comparison_dir(runs) / "comparison.json").read_text())
    assert data["tying_line"]["crossing"] == pytest.approx(line.crossing)
    from tiedlm.compare.report import format_terminal_table

    assert "Tying starts to help where the line crosses zero" in format_terminal_table(result)
