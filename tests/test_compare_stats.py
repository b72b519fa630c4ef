"""compare/stats.py: the t distribution, summaries and the paired and Welch tests, against scipy."""

import math
import random
import statistics

import pytest

from tiedlm.compare.stats import (
    Summary,
    TestResult,
    betainc,
    compare_by_seed,
    number,
    paired_test,
    summarize,
    t_cdf,
    t_ppf,
    t_sf,
    t_two_sided_p,
    welch_test,
)

scipy_stats = pytest.importorskip("scipy.stats")  # the cross-check only; tiedlm itself needs no scipy
scipy_special = pytest.importorskip("scipy.special")


# ------------------------------------------------------------------ the t distribution


def test_betainc_matches_scipy():
    for a, b in [(0.5, 0.5), (1.0, 0.5), (2.5, 0.5), (15.0, 0.5), (500.0, 0.5), (3.0, 7.0), (0.7, 12.0)]:
        for x in [1e-9, 1e-4, 0.01, 0.2, 0.5, 0.77, 0.95, 0.999999]:
            assert betainc(a, b, x) == pytest.approx(scipy_special.betainc(a, b, x), rel=1e-10, abs=1e-14)
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0


@pytest.mark.parametrize("df", [1, 2, 2.7, 4, 9.3, 30, 1000])
def test_t_cdf_sf_and_ppf_match_scipy(df):
    for t in [-80.0, -12.0, -4.0, -2.1, -0.3, 0.0, 0.7, 1.96, 4.0, 12.0, 80.0]:
        assert t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), rel=1e-9, abs=1e-15)
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
    assert same.difference == -1.0 and same.p_value is None and "no spread" in same.note
    missing = compare_by_seed({0: 1.0}, {0: None})
    assert missing.test is None and missing.difference is None and missing.note == "missing on one side"


def test_test_results_keep_the_json_keys_of_each_kind():
    """comparison.json's keys for each kind of test, as 0.1 wrote them."""
    common = ["test", "difference", "se", "df", "t", "p_value", "ci_low", "ci_high", "level", "note"]
    paired = compare_by_seed({0: 1.0, 1: 2.5}, {0: 1.5, 1: 2.1}).to_json()
    assert list(paired) == common + ["n", "seeds_a", "seeds_b"]
    welch = welch_test([1.0, 2.0], [2.0, 3.5, 1.0]).to_json()
    assert list(welch) == common + ["n_a", "n_b"]
    # too few seeds to test: the counts come straight after the difference
    assert list(paired_test([1.0], [2.0]).to_json()) == common[:2] + ["n"] + common[2:]
    assert list(welch_test([1.0], [2.0, 3.5]).to_json()) == common[:2] + ["n_a", "n_b"] + common[2:]
    assert set(TestResult(None, None).to_json()) == {"test", "difference", "p_value", "ci_low", "ci_high", "level",
                                                     "note"}
    assert list(summarize([1.0, 2.0]).to_json()) == ["n", "mean", "sd", "ci_low", "ci_high", "level", "min", "max",
                                                     "values", "note"]
