"""Statistics over seeds, the unit of replication. Pure functions of numbers: no I/O, no torch.

- summarize: mean ± sample standard deviation (n − 1 in the denominator) and a 95% Student-t
  confidence interval for the *mean* over seeds: mean ± t(0.975, n−1)·sd/√n;
- paired_test / welch_test / compare_by_seed: the difference of two means with a confidence
  interval and a two-sided p-value, paired by seed when both sides have the same seeds (same seed
  = same data order, so pairing removes that noise), Welch's t-test with Welch–Satterthwaite
  degrees of freedom otherwise.

The t distribution is implemented here (regularised incomplete beta by continued fraction) so
that tiedlm needs no scipy; tests/test_compare_stats.py checks it against scipy.stats.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

LEVEL = 0.95  # confidence level of every interval
ALPHA = 0.05  # significance level of the verdicts


# ============================================================================ the t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))  # even step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))  # odd step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # the continued fraction converges fast for x < (a+1)/(a+b+2); use the symmetry otherwise
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom (df may be fractional, as Welch's is)."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    # P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2): precise in the tails, where p-values live
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    return t_sf(-t, df)


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on t_sf, to float precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf needs 0 < p < 1, got {p}")
    if p == 0.5:
        return 0.0
    q = 1.0 - p if p > 0.5 else p  # the upper-tail probability of |quantile|
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > q:  # bracket the root
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            break
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_sf(mid, df) > q:
            lo = mid
        else:
            hi = mid
    x = 0.5 * (lo + hi)
    return x if p > 0.5 else -x


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


# ============================================================================ tests of a difference


@dataclass
class TestResult:
    """A difference of means with its interval and two-sided p-value. `test` is "paired",
    "welch", or None when one side has no values; se, df, t, p_value and the interval are None
    when they cannot be computed (one seed, no spread), and `note` says why."""

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

    def to_json(self) -> dict:
        """The keys comparison.json has always had for this kind of test, in the same order (the
        seed counts come straight after the difference when there were too few seeds to test)."""
        counts = {"n": self.n} if self.test == "paired" else {"n_a": self.n_a, "n_b": self.n_b} if self.test else {}
        too_few = bool(counts) and min(counts.values()) < 2
        out: dict[str, Any] = {"test": self.test, "difference": self.difference, **(counts if too_few else {})}
        if self.test is not None:
            out.update(se=self.se, df=self.df, t=self.t)
        out.update(p_value=self.p_value, ci_low=self.ci_low, ci_high=self.ci_high, level=self.level,
                   note=self.note, **({} if too_few else counts))
        if self.seeds_a is not None:
            out.update(seeds_a=self.seeds_a, seeds_b=self.seeds_b)
        return out


def _with_interval(result: TestResult, se: float, df: float) -> TestResult:
    """result with t, p-value and interval filled in from its difference and standard error."""
    if se == 0.0 or not math.isfinite(se):
        result.note = ("no spread between seeds: the difference is the same for every seed, so no "
                       "interval or p-value can be computed")
        return result
    diff = result.difference
    half = t_ppf(0.5 + result.level / 2.0, df) * se
    result.se, result.df, result.t = se, df, diff / se
    result.p_value = t_two_sided_p(diff / se, df)
    result.ci_low, result.ci_high = diff - half, diff + half
    return result


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
    return _with_interval(result, sd / math.sqrt(n), n - 1)


def welch_test(a: list[float], b: list[float], level: float = LEVEL) -> TestResult:
    """Welch's t-test of mean(a) = mean(b), Welch–Satterthwaite degrees of freedom."""
    na, nb = len(a), len(b)
    ma = sum(a) / na if na else float("nan")
    mb = sum(b) / nb if nb else float("nan")
    result = TestResult("welch", ma - mb if na and nb else None, level=level, n_a=na, n_b=nb)
    if na < 2 or nb < 2:
        result.note = "one seed on at least one side: no interval or p-value can be given; run more seeds"
        return result
    va = sum((x - ma) ** 2 for x in a) / (na - 1) / na  # squared standard errors
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if se > 0 else float("nan")
    return _with_interval(result, se, df)


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
