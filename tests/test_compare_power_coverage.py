"""The power lines' coverage, by simulation (stats.power_analysis; the distributions against scipy).

"Effects between … may not be detectable" and "about N seeds would resolve the observed …" are
claims about the true seed-to-seed spread σ, made from a sample of a few seeds. A claim over-claims
when the smallest detectable effect it states is below the true one (the seeds are said to see
effects they do not), or when the seeds it says would resolve the observed effect are fewer than
those the true σ needs. Planned from the sample SD itself, with 3 seeds (2 degrees of freedom),
both happen in about two draws of three; planned from the SD's one-sided 80% upper confidence bound,
in one draw of five, as stated.
"""

import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats")
scipy_special = pytest.importorskip("scipy.special")

from tiedlm.compare.stats import (  # noqa: E402
    SPREAD_CONFIDENCE,
    chi2_ppf,
    paired_test,
    power_analysis,
    spread_factor,
    welch_test,
)

SIGMA, DELTA = 0.02, 0.02  # the true seed-to-seed SD of Δloss and the true effect, in nats


def _power(nc: float, df: float, alpha: float = 0.05) -> float:
    """scipy's power of a two-sided t-test at noncentrality nc (scipy gives nan far in the tail
    against the effect, where the probability is below Φ(−nc): 0 at the noncentralities used here)."""
    c = scipy_stats.t.ppf(1 - alpha / 2, df)
    far = scipy_stats.nct.cdf(-c, df, abs(nc))
    return scipy_stats.nct.sf(c, df, abs(nc)) + (0.0 if math.isnan(far) else far)


def _true_mde(se: float, df: float) -> float:
    """The |Δloss| a t-test with this true standard error detects with 80% power (scipy)."""
    lo, hi = 0.0, 15.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _power(mid, df) < 0.8 else (lo, mid)
    return hi * se


def _true_seeds(effect: float, sd: float, cap: int = 100_000) -> float:
    """The seeds per variant a paired test at the true SD needs to detect `effect` with 80% power."""
    hits = lambda n: _power(effect / (sd / math.sqrt(n)), n - 1) >= 0.8  # noqa: E731
    lo, hi = 1, 2
    while not hits(hi):
        lo, hi = hi, hi * 2
        if lo > cap:
            return math.inf
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hits(mid) else (mid, hi)
    return hi


def _claimed(n: int | None) -> float:
    return math.inf if n is None else n  # None: "more than 100,000 seeds"


def test_the_chi_square_and_the_spread_bound_match_scipy():
    for df in (1, 2, 3.7, 7, 30, 250):
        for p in (0.01, 0.1, 0.2, 0.5, 0.9):
            assert chi2_ppf(p, df) == pytest.approx(scipy_stats.chi2.ppf(p, df), rel=1e-10)
        # σ <= s·f exactly when df·s²/σ² >= df/f², which χ²_df does with the stated probability
        f = spread_factor(df)
        assert scipy_stats.chi2.sf(df / f ** 2, df) == pytest.approx(SPREAD_CONFIDENCE, abs=1e-10)
        assert f > 1
    assert spread_factor(2) == pytest.approx(math.sqrt(2 / scipy_stats.chi2.ppf(0.2, 2)))
    assert spread_factor(2, 0.9) > spread_factor(2) > spread_factor(7) > spread_factor(30) > 1
    with pytest.raises(ValueError):
        chi2_ppf(1.0, 2)


@pytest.mark.parametrize("n, draws", [(3, 300), (8, 200)])
def test_the_paired_power_lines_over_claim_at_most_at_their_stated_rate(n, draws):
    rng = np.random.default_rng(47 + n)
    true_mde = _true_mde(SIGMA / math.sqrt(n), n - 1)
    mde = {"point": 0, "upper": 0}
    seeds = {"point": 0, "upper": 0}
    for _ in range(draws):
        d = rng.normal(DELTA, SIGMA, n)  # the per-seed differences of one comparison
        pw = power_analysis(paired_test(list(d + 4.0), [4.0] * n))
        mde["point"] += pw.mde >= true_mde
        mde["upper"] += pw.mde_upper >= true_mde
        needed = _true_seeds(pw.observed, SIGMA)
        seeds["point"] += _claimed(pw.seeds_needed) >= needed
        seeds["upper"] += _claimed(pw.seeds_needed_upper) >= needed
    se = math.sqrt(0.8 * 0.2 / draws)  # Monte Carlo error of a rate near 0.8
    # the bound covers σ with probability 0.8 exactly, and the smallest detectable effect with it
    assert mde["upper"] / draws == pytest.approx(SPREAD_CONFIDENCE, abs=4 * se)
    # the sample SD alone covers σ with P(χ²_{n−1} >= n − 1): 0.37 at n = 3, 0.43 at n = 8
    assert mde["point"] / draws == pytest.approx(scipy_stats.chi2.sf(n - 1, n - 1), abs=4 * se)
    # seeds needed: whole numbers round up, so at least the bound's rate
    assert seeds["upper"] / draws >= SPREAD_CONFIDENCE - 3 * se
    assert seeds["point"] / draws < 0.6


def test_the_welch_power_line_covers_about_its_stated_rate():
    """Welch's standard error with Welch–Satterthwaite degrees of freedom: the bound is an
    approximation there, and holds about its rate (3 seeds against 4, equal true spreads)."""
    rng = np.random.default_rng(4747)
    na, nb, draws = 3, 4, 150
    va, vb = SIGMA ** 2 / na, SIGMA ** 2 / nb
    true_mde = _true_mde(math.sqrt(va + vb), (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)))
    upper = point = 0
    for _ in range(draws):
        test = welch_test(list(rng.normal(DELTA, SIGMA, na) + 4.0), list(rng.normal(0.0, SIGMA, nb) + 4.0))
        pw = power_analysis(test)
        assert test.test == "welch" and pw.spread_factor > 1
        upper += pw.mde_upper >= true_mde
        point += pw.mde >= true_mde
    se = math.sqrt(0.8 * 0.2 / draws)
    assert upper / draws >= SPREAD_CONFIDENCE - 3 * se
    assert point / draws < 0.65


def test_two_seeds_say_they_cannot_bound_an_effect_and_how_many_would():
    """With 2 seeds the spread has 1 degree of freedom: no 'effects between −96% and +2334%' range,
    but that 2 seeds cannot bound what they miss, and the seeds the observed effect needs."""
    import dataclasses

    from tiedlm.compare.variants import SplitContrast
    from tiedlm.compare.verdicts import seeds_sentence

    test = paired_test([4.10, 4.13], [4.00, 4.05])
    d = SplitContrast(**dataclasses.asdict(test))
    d.power = power_analysis(test)
    said = seeds_sentence(d)
    assert said.startswith("2 seeds cannot bound the effects they might miss: the seed-to-seed spread has 1 degree "
                           "of freedom"), said
    assert "Effects between" not in said and "degrees of freedom" not in said
    assert f"About {d.power.seeds_needed_upper} seeds per variant would resolve the observed" in said
