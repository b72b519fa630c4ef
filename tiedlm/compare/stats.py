"""Statistics over seeds, the unit of replication. Pure functions of numbers: no I/O, no torch.

A run's result is its mean NLL (the loss, log-perplexity): every mean, interval and test is
computed on the loss and only then shown as a perplexity.

- summarize: mean ± sample standard deviation (n − 1 in the denominator) and a 95% Student-t
  confidence interval for the *mean* over seeds: mean ± t(0.975, n−1)·sd/√n;
- geometric: a loss summary as a perplexity: exp(mean loss) (the geometric mean of the seeds'
  perplexities) with exp(CI) bounds, so never negative;
- paired_test / welch_test / compare_by_seed: the difference of two means with a confidence
  interval and a two-sided p-value, paired by seed when both sides have the same seeds (same seed
  = same data order, so pairing removes that noise), Welch's t-test with Welch–Satterthwaite
  degrees of freedom otherwise. No spread (every seed gives the same difference, up to float
  rounding: sd ≤ 1e-12 × the largest |value|): the interval is the point itself and p = 0 when
  the difference is not 0 (the limit scipy.stats also reports: t = inf, p = 0); p is undefined
  (None) when the difference is 0 as well (scipy: nan);
- holm: Holm's step-down adjustment of a family of p-values (absent ones left out of the family);
- t_power / power_analysis: the power of a two-sided t-test (the noncentral t), the smallest
  effect detectable with 80% power and the seeds that would detect the observed effect, both at
  the observed spread and at the spread's one-sided 80% upper confidence bound (chi2_ppf, spread_factor): with 3 seeds the spread has 2 degrees of
  freedom, and figures planned from it alone are too small more often than not.

The distributions are scipy's (scipy.special: Student's t, χ², the normal and the noncentral t,
the ufuncs scipy.stats is built on, a microsecond a call where the searches call them thousands of
times); Spearman's test is scipy.stats' (spearmanr, and permutation_test for the exact p of a few
cells), and the weighted least squares of the tying line and surface statsmodels' WLS
(compare/surface.py). Written here, because no library has them in this form: the paired and
Welch tests' handling of a spread of zero, the power search over fractional Welch degrees of
freedom (`_seeds_needed`) and the spread's upper bound (`spread_factor`); and Holm's adjustment,
which statsmodels has but at a garbage collection a call (see `holm`). The sequential design's Monte-Carlo-calibrated boundaries (compare/sequential.py)
and Fieller's interval for the tying line's zero crossing (compare/tying_line.py) are written
there, for the same reason.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from scipy import special

from ..analyze.geometry import spearman

from ..perplexity import perplexity, relative
from ..formatting import MISSING, fmt_p

LEVEL = 0.95  # confidence level of every interval
ALPHA = 0.05  # significance level of the verdicts
POWER = 0.80  # the power at which "detectable" is defined
SPREAD_CONFIDENCE = 0.80  # the one-sided confidence of the spread's upper bound that power plans from
SEEDS_CAP = 100_000  # seeds_needed beyond this is reported as None ("more than 100,000")
ZERO_SD = 1e-12  # a spread below ZERO_SD x the largest |value| is float rounding, not spread


# ============================================================================ the t distribution


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom (df may be fractional, as Welch's is)."""
    return float(special.stdtr(df, -t))


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf needs 0 < p < 1, got {p}")
    return float(special.stdtrit(df, p))


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of a t statistic."""
    return min(1.0, 2.0 * t_sf(abs(t), df))


# ============================================================================ summaries


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among values (bools, None, NaN and non-numbers dropped), as floats."""
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def number(value: Any) -> float | None:
    """value as a float when it is a finite number, else None."""
    return float(value) if finite([value]) else None


@dataclass
class Summary:
    """Mean, sample SD and a Student-t interval for the mean over seeds. Missing numbers are None
    (JSON-safe); the fields are in comparison.json's order."""

    n: int
    mean: float | None = None
    sd: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    level: float = LEVEL
    min: float | None = None
    max: float | None = None
    values: list[float] = field(default_factory=list)
    note: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def summarize(values: Iterable[Any], level: float = LEVEL) -> Summary:
    """Summary of the finite numbers among values."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return Summary(n=0, level=level, note="no values")
    mean = sum(xs) / n
    if n == 1:
        return Summary(n=1, mean=mean, level=level, min=xs[0], max=xs[0], values=xs,
                       note="one seed: no standard deviation or interval can be given")
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Summary(n=n, mean=mean, sd=sd, ci_low=mean - half, ci_high=mean + half, level=level,
                   min=min(xs), max=max(xs), values=xs)


@dataclass
class GeometricSummary:
    """A perplexity over seeds, computed on its logarithm (the loss): `mean` is exp(mean loss), the
    geometric mean of the seeds' perplexities; the interval is exp() of the loss's Student-t
    interval (so never negative); `sd_factor` is exp(sd of the loss), the geometric standard
    deviation (a seed is typically within ×/÷ sd_factor of the mean)."""

    n: int
    mean: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    level: float = LEVEL
    sd_factor: float | None = None
    min: float | None = None
    max: float | None = None
    values: list[float] = field(default_factory=list)  # the seeds' perplexities, exp(loss)
    note: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def geometric(loss: Summary) -> GeometricSummary:
    """The perplexity view of a summary of losses (nats per token)."""
    return GeometricSummary(n=loss.n, mean=perplexity(loss.mean), ci_low=perplexity(loss.ci_low),
                            ci_high=perplexity(loss.ci_high), level=loss.level, sd_factor=perplexity(loss.sd),
                            min=perplexity(loss.min), max=perplexity(loss.max),
                            values=[v for v in (perplexity(x) for x in loss.values) if v is not None], note=loss.note)


def log_of(value: Any) -> float | None:
    """log(value) for a finite positive number (a perplexity), else None."""
    x = number(value)
    return math.log(x) if x is not None and x > 0 else None


# ============================================================================ tests of a difference


@dataclass
class TestResult:
    """A difference of means with its interval and two-sided p-value. `test` is "paired",
    "welch", or None when one side has no values; se, df, t, p_value and the interval are None
    when they cannot be computed (one seed), and `note` says why. With no spread between seeds
    the interval is the difference itself, t is None (infinite) and p is 0 (None when the
    difference is 0 too)."""

    __test__ = False  # not a pytest test class

    test: str | None
    difference: float | None
    se: float | None = None
    df: float | None = None
    t: float | None = None
    p_value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    level: float = LEVEL
    note: str | None = None
    n: int | None = None  # paired: the number of seeds
    n_a: int | None = None  # welch: the seeds on each side
    n_b: int | None = None
    seeds_a: list[int] | None = None  # compare_by_seed: the seeds of each side
    seeds_b: list[int] | None = None
    sd_a: float | None = None  # welch: each side's sample SD (for the power analysis)
    sd_b: float | None = None

    @property
    def seeds(self) -> int:
        """The seeds behind the test: the pairs, or the smaller side."""
        if self.test == "paired":
            return self.n or 0
        return min(self.n_a or 0, self.n_b or 0)

    def to_json(self) -> dict:
        counts = {"n": self.n} if self.test == "paired" else {"n_a": self.n_a, "n_b": self.n_b} if self.test else {}
        out: dict[str, Any] = {"test": self.test, "difference": self.difference}
        if self.test is not None:
            out.update(se=self.se, df=self.df, t=self.t)
        out.update(p_value=self.p_value, ci_low=self.ci_low, ci_high=self.ci_high, level=self.level,
                   note=self.note, **counts)
        if self.seeds_a is not None:
            out.update(seeds_a=self.seeds_a, seeds_b=self.seeds_b)
        return out


NO_SPREAD = ("no spread between seeds: the difference is the same on every seed, so the interval is the "
             "difference itself and p = 0 (t is infinite)")
NO_DIFFERENCE = "identical on every seed: the difference is 0 with no spread, so p is undefined"


def _with_interval(result: TestResult, se: float, df: float | None, scale: float) -> TestResult:
    """result with t, p-value and interval filled in from its difference and standard error.
    `scale` is the largest |value| tested: a standard error below ZERO_SD·scale is no spread."""
    diff = result.difference
    if not math.isfinite(se):
        result.note = "the spread between seeds is not finite: no interval or p-value"
        return result
    if se <= ZERO_SD * max(scale, 1e-300):
        result.se, result.df = 0.0, df
        result.ci_low = result.ci_high = diff
        zero = abs(diff) <= ZERO_SD * max(scale, 1e-300)
        result.p_value = None if zero else 0.0
        result.note = NO_DIFFERENCE if zero else NO_SPREAD
        return result
    half = t_ppf(0.5 + result.level / 2.0, df) * se
    result.se, result.df, result.t = se, df, diff / se
    result.p_value = t_two_sided_p(diff / se, df)
    result.ci_low, result.ci_high = diff - half, diff + half
    return result


def _scale(*lists: list[float]) -> float:
    return max((abs(x) for xs in lists for x in xs), default=0.0)


def paired_test(a: list[float], b: list[float], level: float = LEVEL) -> TestResult:
    """Paired t-test of mean(a - b) = 0, with a Student-t interval for mean(a - b)."""
    if len(a) != len(b):
        raise ValueError("paired_test needs two lists of equal length")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n if n else None
    result = TestResult("paired", mean, level=level, n=n)
    if n < 2:
        result.note = "one seed: no interval or p-value can be given; run more seeds"
        return result
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return _with_interval(result, sd / math.sqrt(n), n - 1, _scale(a, b))


def welch_test(a: list[float], b: list[float], level: float = LEVEL) -> TestResult:
    """Welch's t-test of mean(a) = mean(b), Welch–Satterthwaite degrees of freedom."""
    na, nb = len(a), len(b)
    ma = sum(a) / na if na else float("nan")
    mb = sum(b) / nb if nb else float("nan")
    result = TestResult("welch", ma - mb if na and nb else None, level=level, n_a=na, n_b=nb)
    if na < 2 or nb < 2:
        result.note = "one seed on at least one side: no interval or p-value can be given; run more seeds"
        return result
    result.sd_a = math.sqrt(sum((x - ma) ** 2 for x in a) / (na - 1))
    result.sd_b = math.sqrt(sum((x - mb) ** 2 for x in b) / (nb - 1))
    va, vb = result.sd_a ** 2 / na, result.sd_b ** 2 / nb  # squared standard errors
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if se > 0 else None
    return _with_interval(result, se, df, _scale(a, b))


def compare_by_seed(a: dict[int, Any], b: dict[int, Any], level: float = LEVEL) -> TestResult:
    """Difference of means a − b: paired by seed when both have the same seeds, Welch otherwise."""
    a = {s: v for s, v in a.items() if finite([v])}
    b = {s: v for s, v in b.items() if finite([v])}
    if not a or not b:
        return TestResult(None, None, level=level, note="missing on one side")
    if set(a) == set(b):
        seeds = sorted(a)
        result = paired_test([a[s] for s in seeds], [b[s] for s in seeds], level)
    else:
        result = welch_test(list(a.values()), list(b.values()), level)
    result.seeds_a, result.seeds_b = sorted(a), sorted(b)
    return result


EXACT_CELLS = 8  # up to this many cells the p-value is exact (every ordering, 8! = 40,320); above, the t approximation


def spearman_test(x: Sequence[float], y: Sequence[float]) -> tuple[float | None, float | None]:
    """(ρ, two-sided p), scipy's: ρ from scipy.stats.spearmanr (ties at average ranks); p exact for
    n ≤ EXACT_CELLS (scipy.stats.permutation_test over every pairing: with few cells the t
    approximation is far off, e.g. 4 cells in perfect order have p = 2/24, not 0), else spearmanr's
    t approximation (t = ρ·√((n − 2)/(1 − ρ²)), n − 2 degrees of freedom). (None, None) when ρ is
    undefined (fewer than 2 cells, a constant side, a nan)."""
    import numpy as np
    from scipy import stats

    rho = spearman(x, y)  # nan where ρ is undefined, the one place that decides it
    if not math.isfinite(rho):
        return None, None
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) > EXACT_CELLS:
        return rho, float(stats.spearmanr(x, y).pvalue)
    # ρ over the pairings: y's centred ranks against each ordering of x's
    rx, ry = stats.rankdata(x), stats.rankdata(y) - (len(y) + 1) / 2
    scale = math.sqrt(float(((rx - rx.mean()) ** 2).sum() * (ry ** 2).sum()))
    p = stats.permutation_test((rx,), lambda a, axis: (a @ ry) / scale, vectorized=True,
                               permutation_type="pairings", n_resamples=math.inf).pvalue
    return float(rho), float(p)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count towards the family):
    sorted ascending, p_(i) becomes max over k <= i of min(1, (m − k + 1)·p_(k)). Written here
    rather than called from statsmodels, whose multipletests (0.15) runs a full garbage collection
    on every call: 44–57 ms each in a process that holds torch, and a comparison adjusts one family
    per contrast and split (tests/test_compare_stats.py checks it against multipletests)."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for k, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def significant(p_value: float | None, level: float = ALPHA) -> bool | None:
    """The one decision of significance: a two-sided p below `level` (ALPHA, or the sequential
    design's adjusted threshold at its last look), or a p of exactly 0 (no spread between seeds and a
    difference: significant at any level); None when there is no p-value."""
    if p_value is None:
        return None
    return p_value < level or p_value == 0.0


# ============================================================================ the chi-square and the spread's bound


def chi2_ppf(p: float, df: float) -> float:
    """The p-quantile of χ²_df, df > 0 and possibly fractional (Welch–Satterthwaite's)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"chi2_ppf needs 0 < p < 1, got {p}")
    if not df > 0:
        raise ValueError(f"chi2_ppf needs df > 0, got {df}")
    return float(special.chdtri(df, 1.0 - p))


def chi2_sf(x: float, k: float) -> float:
    """P(χ²_k > x)."""
    return float(special.chdtrc(k, x)) if x > 0 else 1.0


def spread_factor(df: float, confidence: float = SPREAD_CONFIDENCE) -> float:
    """σ_U / s: the one-sided upper confidence bound on a normal sample's SD σ, as a multiple of
    the sample SD s with df degrees of freedom. (df·s²/σ² is χ²_df, so σ <= s·√(df / χ²_{1−c, df})
    with probability c.) 2.12 at df = 2 and c = 0.8, 1.35 at df = 7; → 1 as df grows. For Welch's
    standard error, df is Welch–Satterthwaite's (an approximation, as Welch's test is)."""
    return math.sqrt(df / chi2_ppf(1.0 - confidence, df))


# ============================================================================ the noncentral t and power


def norm_cdf(z: float) -> float:
    return float(special.ndtr(z))


def t_power(nc: float, df: float, alpha: float = ALPHA) -> float:
    """The power of a two-sided t-test at level alpha when the true effect is nc standard errors:
    P(T' > c) + P(T' < −c) for the noncentral t T' (scipy's, Boost's algorithm underneath). Far in
    the tail against the effect scipy gives no value (nan); that tail is below Φ(−|nc|) there, under
    1e-9 wherever it happens, and counts as 0."""
    c, nc = t_ppf(1.0 - alpha / 2.0, df), abs(nc)
    near = 1.0 - float(special.nctdtr(df, nc, c))
    far = float(special.nctdtr(df, nc, -c))
    return near + (0.0 if math.isnan(far) else far)


@functools.lru_cache(maxsize=1024)  # the same few degrees of freedom in every contrast and simulation
def detectable_nc(df: float, power: float = POWER, alpha: float = ALPHA) -> float:
    """The noncentrality (effect in standard errors) a two-sided t-test detects with `power`."""
    lo, hi = 0.0, 4.0
    while t_power(hi, df, alpha) < power:
        lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if t_power(mid, df, alpha) < power:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9 * hi:
            break
    return 0.5 * (lo + hi)


@dataclass
class Power:
    """What a contrast's seeds can detect: a two-sided t-test on the loss at level alpha, with the
    seed-to-seed spread observed (the SD of the paired differences, or each side's SD for Welch).
    `mde` is the smallest |Δloss| detected with `power` at the seeds run: as ratios of perplexities,
    an increase of mde_relative = exp(mde) − 1 or a decrease of mde_relative_down = 1 − exp(−mde);
    `seeds_needed` the seeds per variant that would detect the observed Δloss with `power`
    (None: no spread to plan from, no effect observed, or more than SEEDS_CAP).

    Those figures take the observed spread for the true one, and with few seeds it is often too
    small (with 3 seeds, below the true SD 63% of the time), so they over-claim: the `_upper`
    figures plan from the spread's one-sided `spread_confidence` upper bound instead (the observed
    SD × `spread_factor`), and are too small only 1 − spread_confidence of the time. The reports
    lead with them."""

    test: str | None
    seeds: int
    power: float = POWER
    alpha: float = ALPHA
    mde: float | None = None
    mde_relative: float | None = None
    mde_relative_down: float | None = None
    observed: float | None = None
    observed_relative: float | None = None
    seeds_needed: int | None = None
    note: str | None = None
    spread_confidence: float = SPREAD_CONFIDENCE
    spread_factor: float | None = None  # the bound / the observed spread
    mde_upper: float | None = None
    mde_relative_upper: float | None = None
    mde_relative_down_upper: float | None = None
    seeds_needed_upper: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _smallest_n(power_at: Callable[[int], float], target: float, guess: int = 2) -> int | None:
    """The smallest n >= 2 with power_at(n) >= target (power_at increasing in n), or None past
    SEEDS_CAP: a gallop from `guess` (the normal approximation's n, which is near) and bisection."""
    n = min(max(2, guess), SEEDS_CAP)
    if power_at(n) >= target:  # the answer is n or below: gallop down to a miss (or to 1)
        hi, step = n, 1
        lo = hi - step
        while lo >= 2 and power_at(lo) >= target:
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, 1)
    else:  # the answer is above n: gallop up to a hit
        lo, step = n, 1
        hi = lo + step
        while power_at(hi) < target:
            lo, step = hi, step * 2
            hi = lo + step
            if lo >= SEEDS_CAP:
                return None
    while hi - lo > 1:  # power_at(lo) < target (or lo = 1) and power_at(hi) >= target
        mid = (lo + hi) // 2
        if power_at(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi if hi <= SEEDS_CAP else None


def _seeds_needed(test: TestResult, effect: float, power: float, alpha: float, factor: float = 1.0) -> int | None:
    """The seeds per variant that detect `effect` with `power`, at the observed spread × factor."""
    if test.test == "paired":
        sd = test.se * math.sqrt(test.n) * factor
        power_at = lambda n: t_power(effect / (sd / math.sqrt(n)), n - 1, alpha)  # noqa: E731
        var = sd ** 2
    else:
        va, vb = (test.sd_a * factor) ** 2, (test.sd_b * factor) ** 2
        df_per = (va + vb) ** 2 / (va ** 2 + vb ** 2)  # Welch–Satterthwaite df / (n − 1) with n a side
        power_at = lambda n: t_power(effect / math.sqrt((va + vb) / n), (n - 1) * df_per, alpha)  # noqa: E731
        var = va + vb
    z = float(special.ndtri(1.0 - alpha / 2.0) + special.ndtri(power))
    guess = z * z * var / (effect * effect)  # n by the normal approximation; the t test needs a little more
    return _smallest_n(power_at, power, int(min(guess, SEEDS_CAP)) + 1)


def power_analysis(test: TestResult, power: float = POWER, alpha: float = ALPHA,
                   spread_confidence: float = SPREAD_CONFIDENCE) -> Power:
    """The smallest effect the test's seeds detect with `power`, and the seeds the observed one
    needs: at the observed spread, and at its one-sided `spread_confidence` upper bound."""
    out = Power(test=test.test, seeds=test.seeds, power=power, alpha=alpha, spread_confidence=spread_confidence)
    if test.difference is None:
        out.note = "nothing to test"
        return out
    out.observed, out.observed_relative = abs(test.difference), relative(test.difference)
    if test.se is None:
        out.note = ("one seed: no interval can be given and there is no spread to plan from; at least 2 seeds "
                    "per variant are needed for an interval, 3 or more for a useful one")
        return out
    if test.se == 0.0:
        out.mde, out.mde_relative, out.mde_relative_down = 0.0, 0.0, 0.0
        out.seeds_needed = None if test.p_value is None else 2
        out.note = "no spread between seeds: any difference is detected with the seeds run"
        return out
    out.spread_factor = spread_factor(test.df, spread_confidence)
    nc = detectable_nc(test.df, power, alpha)
    out.mde, out.mde_upper = nc * test.se, nc * test.se * out.spread_factor
    out.mde_relative, out.mde_relative_down = relative(out.mde), -relative(-out.mde)
    out.mde_relative_upper, out.mde_relative_down_upper = relative(out.mde_upper), -relative(-out.mde_upper)
    if out.observed == 0.0:
        out.note = "no effect observed: no number of seeds resolves it"
        return out
    out.seeds_needed = _seeds_needed(test, out.observed, power, alpha)
    out.seeds_needed_upper = _seeds_needed(test, out.observed, power, alpha, out.spread_factor)
    if out.seeds_needed_upper is None:
        out.note = (f"the observed effect needs more than {SEEDS_CAP:,} seeds" if out.seeds_needed is None else
                    f"at the spread's upper bound, the observed effect needs more than {SEEDS_CAP:,} seeds")
    return out


def fmt_threshold(p: float) -> str:
    """A nominal threshold with 3 significant digits: 0.0122, 0.000346; 0 when no stop was possible."""
    return f"{p:.3g}" if p > 0 else "0"


def fmt_pvalue(p: float | None) -> str:
    """A p-value precise enough to hold against a small threshold: p=0.035, p=0.00021."""

    if p is None:
        return MISSING
    return f"p={p:.2g}" if p < 0.001 else fmt_p(p)


@dataclass(frozen=True)
class AdjustedLevel:
    """A level other than 0.05 that judges a contrast: the sequential design's threshold at its last
    look (--seeds auto), at that many seeds, with the interval at that level there. The verdict
    reads it (verdicts.verdict) and says the threshold beside the p-value."""

    threshold: float
    seeds: int
    ci_low: float | None = None  # the relative effect's (1 − threshold) interval at the last look
    ci_high: float | None = None
