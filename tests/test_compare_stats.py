"""compare/stats.py against scipy: the t quantiles and tails it takes from scipy.special, in the
form it calls them, summaries on the loss and their geometric (perplexity) view, the paired and
Welch tests, the zero-spread case, Holm, and power against the noncentral t integrated from its
definition."""

import math
import random
import statistics

import pytest

from tiedlm.compare.stats import (
    Summary,
    TestResult,
    compare_by_seed,
    detectable_nc,
    geometric,
    holm,
    number,
    paired_test,
    power_analysis,
    summarize,
    t_power,
    t_ppf,
    t_sf,
    t_two_sided_p,
    welch_test,
)

import scipy.stats as scipy_stats


# ------------------------------------------------------------------ the t distribution


@pytest.mark.parametrize("df", [1, 2, 2.7, 4, 9.3, 30, 1000])
def test_t_sf_and_ppf_match_scipy_stats(df):
    for t in [-80.0, -12.0, -4.0, -2.1, -0.3, 0.0, 0.7, 1.96, 4.0, 12.0, 80.0]:
        # the upper tail, where p-values live, to relative precision
        assert t_sf(t, df) == pytest.approx(scipy_stats.t.sf(t, df), rel=1e-9, abs=1e-300)
        assert t_two_sided_p(t, df) == pytest.approx(2 * scipy_stats.t.sf(abs(t), df), rel=1e-9, abs=1e-300)
    for p in [1e-6, 0.025, 0.1, 0.5, 0.6, 0.9, 0.975, 0.995, 0.9995]:
        assert t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-12)
    with pytest.raises(ValueError):
        t_ppf(1.0, df)


# ------------------------------------------------------------------ summaries and tests


def test_summarize_mean_sd_and_t_interval():
    xs = [61.3, 59.8, 60.4, 62.9]
    s = summarize(xs)
    n = len(xs)
    mean, sd = statistics.mean(xs), statistics.stdev(xs)  # stdev: the sample SD, n - 1
    lo, hi = scipy_stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n))
    assert isinstance(s, Summary) and s.n == n
    assert s.mean == pytest.approx(mean, rel=1e-12)
    assert s.sd == pytest.approx(sd, rel=1e-12)
    assert (s.ci_low, s.ci_high) == (pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    # by hand: t(0.975, 3) = 3.182446305284263
    assert s.ci_high - mean == pytest.approx(3.182446305284263 * sd / 2.0, rel=1e-9)
    assert (s.min, s.max, s.values) == (59.8, 62.9, xs)


def test_one_value_has_no_sd_or_interval():
    s = summarize([42.0])
    assert s.mean == 42.0 and s.sd is None and s.ci_low is None and "one seed" in s.note
    assert summarize([None, float("nan"), True, "7"]).n == 0  # only finite numbers count
    assert summarize([]).note == "no values"
    d = paired_test([1.0], [2.0])
    assert d.difference == -1.0 and d.p_value is None and "one seed" in d.note
    w = welch_test([1.0], [2.0, 3.0])
    assert w.p_value is None and w.ci_low is None and (w.n_a, w.n_b) == (1, 2)
    assert number(3) == 3.0 and number(float("inf")) is None and number(False) is None


def test_paired_and_welch_match_scipy():
    rng = random.Random(3)
    a = [60 + rng.gauss(0, 1) for _ in range(5)]
    b = [61.5 + x - 60 + rng.gauss(0, 0.3) for x in a]  # correlated with a, as seeds make runs
    ref = scipy_stats.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    got = paired_test(a, b)
    assert got.test == "paired" and got.df == 4 and got.n == 5
    assert got.difference == pytest.approx(statistics.mean(x - y for x, y in zip(a, b)), rel=1e-12)
    assert got.t == pytest.approx(ref.statistic, rel=1e-9)
    assert got.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    assert (got.ci_low, got.ci_high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))

    c = [58 + rng.gauss(0, 2) for _ in range(3)]
    d = [60 + rng.gauss(0, 0.5) for _ in range(6)]
    ref = scipy_stats.ttest_ind(c, d, equal_var=False)
    ci = ref.confidence_interval(0.95)
    got = welch_test(c, d)
    assert got.df == pytest.approx(ref.df, rel=1e-10)  # Welch–Satterthwaite
    assert got.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    assert (got.ci_low, got.ci_high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))


def test_compare_by_seed_pairs_only_when_seeds_match():
    assert compare_by_seed({0: 1.0, 1: 2.0, 2: 2.5}, {0: 1.5, 1: 2.1, 2: 3.0}).test == "paired"
    welch = compare_by_seed({0: 1.0, 1: 2.0, 2: 2.5}, {0: 1.5, 1: 2.1, 3: 3.0})
    assert welch.test == "welch" and (welch.seeds_a, welch.seeds_b) == ([0, 1, 2], [0, 1, 3])
    same = compare_by_seed({0: 1.0, 1: 2.0}, {0: 2.0, 1: 3.0})  # the same difference every seed
    assert same.difference == -1.0 and same.p_value == 0.0 and "no spread" in same.note
    assert same.ci_low == same.ci_high == -1.0
    missing = compare_by_seed({0: 1.0}, {0: None})
    assert missing.test is None and missing.difference is None and missing.note == "missing on one side"


def test_test_results_keep_the_json_keys_of_each_kind():
    common = ["test", "difference", "se", "df", "t", "p_value", "ci_low", "ci_high", "level", "note"]
    paired = compare_by_seed({0: 1.0, 1: 2.5}, {0: 1.5, 1: 2.1}).to_json()
    assert list(paired) == common + ["n", "seeds_a", "seeds_b"]
    welch = welch_test([1.0, 2.0], [2.0, 3.5, 1.0]).to_json()
    assert list(welch) == common + ["n_a", "n_b"]
    assert list(paired_test([1.0], [2.0]).to_json()) == common + ["n"]
    assert set(TestResult(None, None).to_json()) == {"test", "difference", "p_value", "ci_low", "ci_high", "level",
                                                     "note"}
    assert list(summarize([1.0, 2.0]).to_json()) == ["n", "mean", "sd", "ci_low", "ci_high", "level", "min", "max",
                                                     "values", "note"]


# ------------------------------------------------------------------ on the loss, shown as perplexity


def test_geometric_summary_is_exp_of_the_loss_interval_and_never_negative():
    ppl = [210.0, 2100.0]  # two seeds far apart: a raw-perplexity interval would go negative
    s = geometric(summarize(math.log(p) for p in ppl))
    lo, hi = scipy_stats.t.interval(0.95, 1, loc=statistics.mean(map(math.log, ppl)),
                                    scale=statistics.stdev(map(math.log, ppl)) / math.sqrt(2))
    assert s.mean == pytest.approx(scipy_stats.gmean(ppl), rel=1e-12)
    assert (s.ci_low, s.ci_high) == (pytest.approx(math.exp(lo), rel=1e-9), pytest.approx(math.exp(hi), rel=1e-9))
    assert s.ci_low > 0 and s.sd_factor == pytest.approx(math.exp(statistics.stdev(map(math.log, ppl))))
    assert s.values == pytest.approx(ppl) and (s.min, s.max) == (pytest.approx(210.0), pytest.approx(2100.0))
    one = geometric(summarize([math.log(57.0)]))
    assert one.mean == pytest.approx(57.0) and one.ci_low is None and one.sd_factor is None


def test_zero_spread_gives_a_point_interval_and_p_zero_as_scipy_does():
    # paired: the same difference on every seed (up to float rounding of the logs)
    base = [100.0, 140.0, 60.0]
    loss_a = [math.log(0.95 * b) for b in base]
    loss_b = [math.log(b) for b in base]
    got = paired_test(loss_a, loss_b)
    assert got.difference == pytest.approx(math.log(0.95), abs=1e-15)
    assert got.ci_low == got.ci_high == got.difference and got.p_value == 0.0 and got.t is None
    assert got.se == 0.0 and got.df == 2 and "no spread" in got.note
    exact = paired_test([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    with pytest.warns(RuntimeWarning):  # scipy: t = inf, p = 0, a point interval
        ref = scipy_stats.ttest_rel([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert math.isinf(ref.statistic) and exact.p_value == ref.pvalue == 0.0
    ci = ref.confidence_interval(0.95)
    assert (exact.ci_low, exact.ci_high) == (ci.low, ci.high) == (1.0, 1.0)
    # no difference and no spread: p undefined (scipy: nan), interval the point 0
    none = paired_test([1.0, 2.0], [1.0, 2.0])
    assert none.p_value is None and none.ci_low == none.ci_high == 0.0 and "undefined" in none.note
    assert math.isnan(scipy_stats.ttest_rel([1.0, 2.0], [1.0, 2.0]).pvalue)
    # welch: both sides without spread
    w = welch_test([2.0, 2.0, 2.0], [1.0, 1.0])
    assert w.p_value == 0.0 and w.ci_low == w.ci_high == 1.0 and w.df is None
    # the power analysis of a contrast without spread: any difference is detectable
    pw = power_analysis(got)
    assert pw.mde == 0.0 and pw.seeds_needed == 2 and "no spread" in pw.note


# ------------------------------------------------------------------ Holm


def test_holm_matches_the_step_down_procedure():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, None, 0.01]) == [pytest.approx(0.5), None, pytest.approx(0.02)]
    assert holm([]) == [] and holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1


def test_holm_is_statsmodels_multipletests_on_random_families():
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)  # one family per size: each multipletests call is a full gc.collect()
    for m in (1, 2, 3, 5, 8, 13):
        p = rng.uniform(0, 0.2, m).tolist()
        assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-15)
    assert holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])  # and never below an earlier adjusted p
    rng = random.Random(7)
    for _ in range(200):
        ps = [rng.random() ** 3 for _ in range(rng.randint(1, 6))]
        adjusted = holm(ps)
        for alpha in (0.01, 0.05, 0.1, 0.3):
            # Holm's step-down: reject the k-th smallest while p_(k) <= alpha / (m − k + 1)
            order = sorted(range(len(ps)), key=ps.__getitem__)
            rejected = set()
            for k, i in enumerate(order):
                if ps[i] > alpha / (len(ps) - k):
                    break
                rejected.add(i)
            assert {i for i, p in enumerate(adjusted) if p <= alpha} == rejected


# ------------------------------------------------------------------ the noncentral t and power


@pytest.mark.parametrize("df", [1, 1.7, 2, 4, 9.3, 30, 200])
def test_power_is_the_noncentral_t_integrated_from_its_definition(df):
    """t_power against P(T' > c) + P(T' < −c) with T' = (Z + δ)/√(V/ν) integrated over V ~ χ²(ν):
    independent of the noncentral t's algorithm (and of the tail where scipy's gives nan)."""
    c = scipy_stats.t.ppf(0.975, df)
    for nc in [0.0, 0.3, 1.0, 2.8, 6.0, 15.0, -2.0]:
        ref = 1.0 - _nct_by_integration(c, df, abs(nc)) + _nct_by_integration(-c, df, abs(nc))
        assert t_power(nc, df) == pytest.approx(ref, abs=1e-8)


def _nct_by_integration(t: float, df: float, nc: float) -> float:
    """P(T <= t) = E[Φ(t·√(V/ν) − δ)] over V ~ χ²(ν), by scipy.integrate.quad over w = √V (whose
    density 2w·f(w²) has no pole at 0 where χ²(1)'s has)."""
    from scipy import integrate

    top = math.sqrt(df + 30 * math.sqrt(2 * df) + 50)  # χ²(ν) has mean ν and SD √(2ν): integrate where it lives
    value, _ = integrate.quad(lambda w: scipy_stats.norm.cdf(t * w / math.sqrt(df) - nc)
                              * scipy_stats.chi2.pdf(w * w, df) * 2 * w, 0.0, top, epsabs=1e-13, limit=400)
    return value


def _scipy_power(nc: float, df: float) -> float:
    c = scipy_stats.t.ppf(0.975, df)
    nc = abs(nc)
    far = scipy_stats.nct.cdf(-c, df, nc)  # the tail against the effect
    if math.isnan(far):  # scipy gives up there; it is below Φ(−nc)
        assert nc >= 6
        far = 0.0
    return scipy_stats.nct.sf(c, df, nc) + far


def test_power_and_detectable_effect_match_scipy():
    for df, nc in [(1, 10.0), (2, 3.0), (2, 6.0), (4.6, 2.2), (29, 2.8), (200, 0.5)]:
        assert t_power(nc, df) == pytest.approx(_scipy_power(nc, df), abs=1e-9)
        assert t_power(-nc, df) == pytest.approx(_scipy_power(nc, df), abs=1e-9)  # two-sided: symmetric
    for df in (1, 2, 5.5, 30):
        nc = detectable_nc(df)
        assert _scipy_power(nc, df) == pytest.approx(0.8, abs=1e-7)
    assert t_power(0.0, 5) == pytest.approx(0.05, abs=1e-12)  # no effect: power is alpha


def test_power_analysis_paired_matches_scipy():
    d = [-0.031, -0.044, -0.036]  # per-seed loss differences
    test = paired_test(d, [0.0, 0.0, 0.0])
    sd = statistics.stdev(d)
    pw = power_analysis(test)
    assert pw.seeds == 3 and pw.test == "paired"
    # at the smallest detectable effect the power is 80%, with the seeds run
    assert _scipy_power(pw.mde / (sd / math.sqrt(3)), 2) == pytest.approx(0.8, abs=1e-7)
    assert pw.mde_relative == pytest.approx(math.exp(pw.mde) - 1)
    assert pw.mde_relative_down == pytest.approx(1 - math.exp(-pw.mde)) and pw.mde_relative_down < pw.mde_relative
    # seeds needed: the first n whose power reaches 80% for the observed effect
    effect = abs(statistics.mean(d))
    n = pw.seeds_needed
    assert _scipy_power(effect / (sd / math.sqrt(n)), n - 1) >= 0.8
    assert n == 2 or _scipy_power(effect / (sd / math.sqrt(n - 1)), n - 2) < 0.8
    noisy = [0.006, -0.02, 0.015, 0.004]  # a small effect in much noise: many seeds needed
    small = power_analysis(paired_test(noisy, [0.0] * 4))
    m = small.seeds_needed
    sd4, eff4 = statistics.stdev(noisy), abs(statistics.mean(noisy))
    assert m > 4 and _scipy_power(eff4 / (sd4 / math.sqrt(m)), m - 1) >= 0.8 > _scipy_power(
        eff4 / (sd4 / math.sqrt(m - 1)), m - 2)


def test_power_analysis_welch_matches_scipy():
    a, b = [4.05, 4.07, 4.04, 4.06], [4.09, 4.10, 4.085]
    test = welch_test(a, b)
    pw = power_analysis(test)
    assert pw.test == "welch" and pw.seeds == 3
    assert _scipy_power(pw.mde / test.se, test.df) == pytest.approx(0.8, abs=1e-7)
    va, vb = statistics.variance(a), statistics.variance(b)
    effect = abs(statistics.mean(a) - statistics.mean(b))

    def power_at(n):  # n seeds per variant, Welch–Satterthwaite df
        se2 = (va + vb) / n
        df = se2 ** 2 / ((va / n) ** 2 / (n - 1) + (vb / n) ** 2 / (n - 1))
        return _scipy_power(effect / math.sqrt(se2), df)

    n = pw.seeds_needed
    assert power_at(n) >= 0.8 and (n == 2 or power_at(n - 1) < 0.8)


def test_power_analysis_with_one_seed_or_no_effect():
    one = power_analysis(paired_test([4.0], [4.1]))
    assert one.mde is None and one.seeds_needed is None and "at least 2 seeds" in one.note
    flat = power_analysis(paired_test([1.0, 2.0, 3.0], [1.1, 1.9, 3.0]))
    assert flat.observed == pytest.approx(0.0, abs=1e-15)
