"""The tying line (compare/tying_line.py): a one-key grid's effects fitted in log2 of the key by
weighted least squares, and its zero crossing with Fieller's interval, against independent
arithmetic: numpy.polyfit's weighted fit and covariance, scipy's t quantile, and the defining
equation of Fieller's set at the interval's ends."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tiedlm.compare.tying_line import fit_line, tying_line

XS = [152509, 305018, 610036, 1220072, 2440144]


def test_the_fit_and_its_slope_s_standard_error_are_numpy_s_weighted_polyfit():
    ys = [0.080, 0.041, 0.012, -0.020, -0.055]
    ses = [0.010, 0.012, 0.009, 0.015, 0.011]
    line = fit_line("train.max_tokens", list(zip(XS, ys, ses)))
    u = np.log2(XS) - line.centre
    coef, cov = np.polyfit(u, ys, 1, w=1 / np.asarray(ses), cov=True)  # polyfit weights the residuals: 1/σ
    assert line.slope == pytest.approx(coef[0], rel=1e-9) and line.intercept == pytest.approx(coef[1], rel=1e-9)
    assert line.slope_se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-6)
    assert line.slope_p == pytest.approx(2 * stats.t.sf(abs(coef[0]) / math.sqrt(cov[0, 0]), 3), rel=1e-6)
    assert line.crossing == pytest.approx(2 ** (-coef[1] / coef[0] + line.centre), rel=1e-9)
    assert XS[1] < line.crossing < XS[3] and line.bounded
    # Fieller's ends: where the line's 95% interval just touches zero
    t = stats.t.ppf(0.975, 3)
    for end in (line.low, line.high):
        g = math.log2(end) - line.centre
        pred = coef[1] + coef[0] * g
        var = cov[1, 1] + 2 * g * cov[0, 1] + g * g * cov[0, 0]
        assert pred ** 2 == pytest.approx(t * t * var, rel=1e-6)
    assert line.low < line.crossing < line.high
    text = " ".join(line.lines())
    assert "Tying starts to help where the line crosses zero" in text and "Fieller" in text


def test_a_slope_that_is_not_significant_leaves_the_crossing_unplaced():
    ys = [0.02, -0.03, 0.025, -0.02, 0.01]
    line = fit_line("train.max_tokens", [(x, y, 0.02) for x, y in zip(XS, ys)])
    assert not line.bounded and line.low is None and line.high is None
    assert "unbounded: the slope is not significant" in " ".join(line.lines()) or line.crossing is None


def test_too_few_settings_with_a_standard_error_fit_no_line():
    line = fit_line("train.max_tokens", [(XS[0], 0.1, 0.01), (XS[1], 0.05, None), (XS[2], 0.0, 0.01)])
    assert line.slope is None and any("3 needed" in n for n in line.notes)
    assert any("1 setting(s) left out" in n for n in line.notes)


def test_a_setting_of_zero_is_left_out_for_its_log_axis_not_for_a_missing_standard_error():
    """dropout 0 with three seeds has a standard error: the note says log2(0), not 'no standard error'."""
    line = fit_line("model.dropout", [(0.0, 0.2, 0.01), (0.1, 0.1, 0.01), (0.2, 0.05, 0.01), (0.4, 0.0, 0.01)])
    assert any("dropout=0 has no place on its log2 axis" in n for n in line.notes)
    assert not any("standard error" in n for n in line.notes) and line.slope is not None
    line = fit_line("model.dropout", [(0.0, 0.2, 0.01), (0.1, 0.1, None), (0.2, 0.05, 0.01), (0.4, 0.0, 0.01)])
    assert any("1 setting(s) left out of the fit: no effect with a standard error" in n for n in line.notes)


def test_a_one_key_grid_gets_its_line_and_a_two_key_grid_does_not():
    from types import SimpleNamespace

    def matched(setting, y, se):
        d = SimpleNamespace(difference=y, se=se, ci_low=y - 2 * se, ci_high=y + 2 * se)
        return SimpleNamespace(setting=setting, split=lambda name, d=d: d)

    one = [matched({"train.max_tokens": x}, 0.05 - 0.02 * i, 0.01) for i, x in enumerate(XS)]
    line = tying_line(one, "test")
    assert line is not None and line.short == "max_tokens" and line.slope < 0
    two = [matched({"train.max_tokens": x, "model.n_embd": 64}, 0.05, 0.01) for x in XS]
    two += [matched({"train.max_tokens": x, "model.n_embd": 128}, 0.05, 0.01) for x in XS]
    assert tying_line(two, "test") is None


def test_the_mechanism_rows_give_the_bucket_effects_and_who_peaked_first():
    from types import SimpleNamespace

    from tiedlm.compare.tying_line import mechanism_markdown

    def variant(label, budget, best_tokens):
        cfg = SimpleNamespace(train=SimpleNamespace(max_tokens=budget))
        return SimpleNamespace(label=label, config=cfg, best_points=[(t, 50.0) for t in best_tokens], matrices={},
                               metrics={}, n_seeds=2)

    b = lambda diff: SimpleNamespace(difference=diff, ci_low=diff - 0.01, ci_high=diff + 0.01)  # noqa: E731
    matched, variants = [], []
    for i, x in enumerate(XS[:3]):
        d = SimpleNamespace(difference=0.04 - 0.03 * i, se=0.01, relative=math.expm1(0.04 - 0.03 * i), ci_low=None, ci_high=None,
                            buckets={"top 10%": b(0.01), "next 40%": b(0.0), "rest": b(0.05 - 0.06 * i)},
                            p_value=(0.01, 0.04, 0.03)[i])
        matched.append(SimpleNamespace(setting={"train.max_tokens": x}, tied=f"t{i}", untied=f"u{i}",
                                       split=lambda name, d=d: d))
        variants += [variant(f"t{i}", x, [x, x]), variant(f"u{i}", x, [x // 2, x // 4])]
    line = tying_line(matched, "test", variants)
    rows = line.mechanism
    assert [r["setting"] for r in rows] == XS[:3]
    assert rows[2]["rare"]["bucket"] == "rest" and rows[2]["rare"]["effect"] == pytest.approx(math.expm1(-0.07))
    assert rows[0]["frequent"]["effect"] == pytest.approx(math.expm1(0.01))
    assert rows[1]["tied_best_share"] == 1.0 and rows[1]["untied_best_share"] == pytest.approx(0.375, abs=1e-5)
    # Holm over the three settings, by hand: 0.01·3 = 0.03; 0.03·2 = 0.06; max(0.06, 0.04·1) = 0.06
    assert [r["p_holm"] for r in rows] == pytest.approx([0.03, 0.06, 0.06])
    assert "| Holm p |" in "\n".join(mechanism_markdown(line)) and "| 0.060 |" in "\n".join(mechanism_markdown(line))
    assert "untied best at" in "\n".join(mechanism_markdown(line)) and "38%" in "\n".join(mechanism_markdown(line))
    assert all(r["direct_path_cost_bpb"] is None for r in rows)  # no run analysed: no direct-path column
    assert "bits/byte" not in "\n".join(mechanism_markdown(line))


def test_the_mechanism_rows_give_the_direct_path_cost_per_byte_of_an_analysed_untied_pair():
    from types import SimpleNamespace

    from tiedlm.compare.tying_line import mechanism_markdown

    def summary(x):
        return SimpleNamespace(mean=x, n=2)

    def variant(label, budget, matrices):
        cfg = SimpleNamespace(train=SimpleNamespace(max_tokens=budget))
        return SimpleNamespace(label=label, config=cfg, best_points=[(budget, 5.0)], matrices=matrices, metrics={},
                               n_seeds=2)

    matched, variants = [], []
    for i, x in enumerate(XS[:3]):
        d = SimpleNamespace(difference=0.04 - 0.03 * i, se=0.01, relative=math.expm1(0.04 - 0.03 * i), buckets={},
                            ci_low=None, ci_high=None)
        matched.append(SimpleNamespace(setting={"train.max_tokens": x}, tied=f"t{i}", untied=f"u{i}",
                                       split=lambda name, d=d: d))
        own, forced = 1.5 - 0.1 * i, 1.9 - 0.3 * i  # bits per byte: the cost falls 0.4, 0.2, 0.0
        analysed = {"direct_path_bpb": summary(own), "direct_path_bpb_e_as_w_out": summary(forced)} if i < 2 else {}
        variants += [variant(f"t{i}", x, {}), variant(f"u{i}", x, analysed)]
    rows = tying_line(matched, "test", variants).mechanism
    assert rows[0]["direct_path_cost_bpb"] == pytest.approx(0.4)
    assert rows[1]["direct_path_cost_bpb"] == pytest.approx(0.2)
    assert rows[2]["direct_path_cost_bpb"] is None  # its untied runs were not analysed
    md = "\n".join(mechanism_markdown(tying_line(matched, "test", variants)))
    assert "W_out := E costs (bits/byte)" in md and "0.4000" in md and "0.2000" in md


def test_settings_whose_runs_do_not_beat_the_unigram_model_are_left_out_of_the_fit():
    """An effect between models that have not learned from context says nothing about tying: such a
    setting is named in the notes, drawn apart, and the line is fitted over the others."""
    from types import SimpleNamespace

    ys = [0.30, 0.12, 0.05, 0.03, 0.02]  # the first two, models at chance, would steepen the line
    xs = [2**k * 1000 for k in range(5)]
    matched, variants = [], []
    for i, (x, y) in enumerate(zip(xs, ys)):
        d = SimpleNamespace(difference=y, se=0.01, relative=math.expm1(y), ci_low=y - 0.03, ci_high=y + 0.03,
                            buckets={})
        matched.append(SimpleNamespace(setting={"train.max_tokens": x}, tied=f"t{i}", untied=f"u{i}",
                                       split=lambda name, d=d: d))
        at_unigram = {0: ([0, 1, 2], [0, 1]), 1: ([2], [])}.get(i, ([], []))
        for label, seeds in zip((f"t{i}", f"u{i}"), at_unigram):
            cfg = SimpleNamespace(train=SimpleNamespace(max_tokens=x))
            variants.append(SimpleNamespace(label=label, config=cfg, best_points=[], matrices={}, n_seeds=3,
                                            metrics={"test": SimpleNamespace(at_unigram=seeds)}))
    line = tying_line(matched, "test", variants)
    assert [p[0] for p in line.points] == xs[2:] and line.unlearned == [(xs[0], ys[0]), (xs[1], ys[1])]
    alone = fit_line("train.max_tokens", [(x, y, 0.01) for x, y in zip(xs[2:], ys[2:])])
    assert line.slope == pytest.approx(alone.slope) and line.slope_se == pytest.approx(alone.slope_se)
    assert line.lines()[-1] == ("max_tokens 1,000 and 2,000 left out of the fit: runs there do not beat the unigram "
                                "model of their training split on test (5 of 6 runs at 1,000, 1 of 6 runs at 2,000), "
                                "so their effect says nothing about tying")
    assert len(line.mechanism) == 5  # the mechanism table still shows every setting


@pytest.mark.figures
def test_the_line_png_draws_the_settings_the_fit_and_the_crossing(tmp_path):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from tests.test_tying_map import PNG, _colours
    from tiedlm.compare.plots import plot_tying_line

    def line_of(ys):
        matched = []
        for x, y in zip(XS, ys):
            d = SimpleNamespace(difference=y, se=0.01, ci_low=y - 0.03, ci_high=y + 0.03)
            matched.append(SimpleNamespace(setting={"train.max_tokens": x}, split=lambda name, d=d: d))
        return tying_line(matched, "test")

    def orange(path):  # tab:orange, the fit and its crossing
        px = _colours(path)
        return int(((px[..., 0] > 0.9) & (abs(px[..., 1] - 0.5) < 0.08) & (px[..., 2] < 0.2)).sum())

    crossing, unfitted = line_of([0.06, 0.03, 0.0, -0.03]), line_of([0.02, 0.02])
    assert crossing.crossing == pytest.approx(XS[2], rel=0.05) and unfitted.slope is None
    paths = tmp_path / "crossing.png", tmp_path / "unfitted.png"
    plot_tying_line(crossing, "test", paths[0])
    plot_tying_line(unfitted, "test", paths[1])
    assert all(p.read_bytes().startswith(PNG) for p in paths)
    assert orange(paths[0]) > 500 and orange(paths[1]) == 0
    crossing.unlearned = [(XS[0] / 2, 0.25)]  # a setting left out of the fit: drawn hollow, in grey, beside
    plot_tying_line(crossing, "test", tmp_path / "left_out.png")
    assert _colours(tmp_path / "left_out.png").shape == _colours(paths[0]).shape
    assert orange(tmp_path / "left_out.png") > 500
