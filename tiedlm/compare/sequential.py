"""`compare --config --seeds auto`: seeds only while they are needed, without inflating false positives.

A group-sequential design on the primary endpoint's one contrast (tied vs untied):

- looks: after 3 seeds per variant (FIRST_SEEDS), then after every further seed per variant, up to
  K = --max-seeds; the look with n seeds per variant has information fraction t = n / K;
- alpha spending: Lan–DeMets O'Brien–Fleming type, α(t) = 2 − 2Φ(z_{1−α/2} / √t), two-sided,
  α = 0.05: α(1) = α, and almost nothing is spent at the early looks. Only stopping for efficacy
  spends alpha;
- boundaries, for the paired t-test itself: a nominal two-sided p-value threshold p_k at each look
  such that under H0 (the per-seed differences independent N(0, σ²), any σ) the probability that
  the t-test's p falls below p_j at some look j ≤ k is α(t_k). The paired t-statistics' joint null
  distribution does not depend on σ, so it is simulated exactly: `paths` null comparisons (fixed
  seed, numpy's frozen legacy generator, so the thresholds are the same on every run; cached per
  (max_seeds, alpha)), seeds added one at a time, and at each look the threshold set between two
  order statistics of |t| of the comparisons not yet stopped, so that exactly ⌊α(t_k)·paths⌋ of them
  have stopped by then. The one approximation is Monte-Carlo error: with 1,000,000 paths (up to 40
  looks; fewer for more looks, at least 100,000) the design's overall false-positive rate is α
  within about ±0.0005 (two standard errors), and the early looks' tiny thresholds are each
  within about ±10% (they spend hundredths of α). Computing a design takes about 0.5 s for
  K = 10 and 5 s for K = 1000, once per process;
- why not the usual shortcut: z-boundaries for the Brownian-motion approximation (Armitage–McPherson–
  Rowe numerical integration) converted to the t-test's nominal levels ("significance level
  approach") were measured at 5.7% false positives for K = 10 (2 to 9 degrees of freedom) and 5.4%
  for K = 40: at few degrees of freedom the looks' t-statistics (heavier-tailed, each with its own
  variance estimate) are not jointly the Brownian motion, and matching each look's marginal level
  does not match the chance of crossing at some look.
  tests/test_compare_sequential.py integrates the Brownian design (checked against the published
  Lan–DeMets boundaries) and checks this module's calibration against it for a known variance;
- futility (non-binding, spends no alpha): stop when the effect detectable with 80% power at
  α = 0.05 (stats.power_analysis: mde_relative, the larger of the two directions) is below
  --min-effect; stopping there can only lower the false-positive rate;
- otherwise stop at K seeds per variant. A p of exactly 0 (no spread between seeds and a
  difference: stats' convention, as SciPy's) is significant at any level. When a failed run breaks
  the pairing the design stops there (the t-test is then Welch's, held to the same threshold).

Pure maths and the design's record: the boundaries, the decision at a look, `Sequential` (what
comparison.json holds). Which seeds to train next is the experiment's (experiment/seeds.py:
SeedDesign), told the primary contrast at each look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

from ..formatting import percent
from ..perplexity import relative
from .stats import ALPHA, AdjustedLevel, fmt_pvalue, fmt_threshold, norm_cdf, significant, t_sf
from .matching import MatchFamily, apply_family
from .stats import t_ppf
from .verdicts import verdicts_for

if TYPE_CHECKING:
    from .comparison import Comparison
    from .variants import SplitContrast

FIRST_SEEDS = 3  # seeds per variant at the first look
MAX_SEEDS = 10  # --max-seeds default
MIN_EFFECT = 0.02  # --min-effect default: 2%
MAX_SEEDS_RANGE = (3, 1000)
RULE = "O'Brien–Fleming-type alpha spending (Lan–DeMets), two-sided"
DECISIONS = ("continue", "efficacy", "futility", "max")

MC_SEED = 20_240_617  # the simulated null comparisons' seed: the thresholds are deterministic
MC_DRAWS = 40_000_000  # paths x looks: 1,000,000 paths up to 40 looks
MC_PATHS = (100_000, 1_000_000)  # the fewest and the most paths
SQRT2 = math.sqrt(2.0)


# ============================================================================ the boundaries


def norm_isf(p: float) -> float:
    """x with Φ(−x) = p, for 0 < p < 1 (bisection on erfc, to float precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"norm_isf needs 0 < p < 1, got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * math.erfc(mid / SQRT2) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def spent(t: float, alpha: float = ALPHA) -> float:
    """The alpha spent by information fraction t: α(t) = 2 − 2Φ(z_{1−α/2} / √t) (0 at t = 0)."""
    if t <= 0.0:
        return 0.0
    return min(alpha, math.erfc(norm_isf(alpha / 2.0) / math.sqrt(t) / SQRT2))


def mc_paths(max_seeds: int) -> int:
    """The simulated null comparisons behind a design with looks at FIRST_SEEDS .. max_seeds."""
    looks = max_seeds - FIRST_SEEDS + 1
    return max(MC_PATHS[0], min(MC_PATHS[1], MC_DRAWS // looks))


@dataclass(frozen=True)
class Boundary:
    """One look of the design: after `seeds` seeds per variant (information fraction `fraction`),
    the alpha it may have spent by then (α(t)), the share of simulated null comparisons stopped by
    then (`crossed`), the critical |t| (`critical`, inf: no stop possible) and the nominal two-sided
    p-value threshold the look's t-test is held to (`threshold`, 0: no stop possible)."""

    seeds: int
    fraction: float
    spent: float
    crossed: float
    critical: float
    threshold: float


@lru_cache(maxsize=32)
def calibrate(max_seeds: int, alpha: float = ALPHA, statistic: str = "t", paths: int | None = None,
              seed: int = MC_SEED) -> tuple[Boundary, ...]:
    """The design's looks at FIRST_SEEDS .. max_seeds seeds per variant, calibrated on simulated null
    comparisons (see the module's docstring). statistic "t": the paired t-test (the design used);
    "z": a z-test with the variance known, the Brownian-motion design, for checking."""
    import numpy as np

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    if statistic not in ("t", "z"):
        raise ValueError(f"statistic must be t or z, got {statistic!r}")
    if not MAX_SEEDS_RANGE[0] <= max_seeds <= MAX_SEEDS_RANGE[1]:
        raise ValueError(f"max_seeds must be in {MAX_SEEDS_RANGE[0]}..{MAX_SEEDS_RANGE[1]}, got {max_seeds}")
    n_paths = paths or mc_paths(max_seeds)
    rng = np.random.RandomState(seed)
    total, squares = np.zeros(n_paths), np.zeros(n_paths)  # of the comparisons not yet stopped
    stopped, out = 0, []
    for n in range(1, max_seeds + 1):
        x = rng.standard_normal(len(total))
        total += x
        squares += x * x
        if n < FIRST_SEEDS:
            continue
        fraction = n / max_seeds
        may = int(math.floor(spent(fraction, alpha) * n_paths + 1e-9)) - stopped  # the paths that may stop here
        critical = math.inf
        if may > 0:
            if statistic == "t":
                var = np.maximum(squares - total * total / n, 0.0) / (n - 1)
                stat = np.abs(total) / np.sqrt(var * n)
            else:
                stat = np.abs(total) / math.sqrt(n)
            may = min(may, len(stat) - 1)
            i = len(stat) - may  # stat sorted: [i − 1] is the largest that goes on, [i] the smallest that stops
            part = np.partition(stat, (i - 1, i))
            critical = 0.5 * (float(part[i - 1]) + float(part[i]))
            keep = stat <= critical
            stopped += len(stat) - int(keep.sum())
            total, squares = total[keep], squares[keep]
        if not math.isfinite(critical):
            p = 0.0
        elif statistic == "t":
            p = 2.0 * t_sf(critical, n - 1)
        else:
            p = 2.0 * norm_cdf(-critical)
        out.append(Boundary(n, fraction, spent(fraction, alpha), stopped / n_paths, critical, p))
    return tuple(out)


def design(max_seeds: int, alpha: float = ALPHA) -> tuple[Boundary, ...]:
    """The looks of the design used: the paired t-test, calibrated (deterministic, cached)."""
    return calibrate(max_seeds, alpha)


def threshold(seeds: int, max_seeds: int, alpha: float = ALPHA) -> float:
    """The nominal p-value threshold of the look with `seeds` seeds per variant."""
    for b in design(max_seeds, alpha):
        if b.seeds == seeds:
            return b.threshold
    raise ValueError(f"no look at {seeds} seeds per variant with max_seeds={max_seeds} (looks at "
                     f"{FIRST_SEEDS}..{max_seeds})")


# ============================================================================ the decision


@dataclass
class Look:
    """One look at the primary contrast, after `seeds` seeds per variant: the t-test's p-value, the
    design's nominal threshold there, the smallest effect detectable with 80% power at α = 0.05
    (mde_relative), what was decided, the observed effect (exp(Δloss) − 1) and its interval at the
    adjusted level 1 − threshold (None where it cannot be given)."""

    seeds: int
    p_value: float | None
    threshold: float = 0.0
    mde_relative: float | None = None
    decision: str = "continue"
    relative: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    test: str | None = None

    def to_json(self) -> dict:
        return {"seeds": self.seeds, "p_value": self.p_value, "threshold": self.threshold,
                "mde_relative": self.mde_relative, "decision": self.decision, "relative": self.relative,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "test": self.test}


def efficacy(p_value: float | None, threshold_: float) -> bool:
    """Significant at the look's adjusted level (stats.significant, at threshold_)."""
    return bool(significant(p_value, threshold_))


def next_decision(looks: Sequence[Look], max_seeds: int = MAX_SEEDS, alpha: float = ALPHA,
                  min_effect: float = MIN_EFFECT) -> str:
    """What to do after the last of `looks` (the looks so far, at FIRST_SEEDS, FIRST_SEEDS + 1, …
    seeds per variant, every earlier one decided "continue"): "efficacy" when its p-value is below
    the design's threshold there, else "futility" when the smallest detectable effect is below
    min_effect, else "max" at max_seeds, else "continue". The thresholds come from design(); the
    looks' own `threshold` fields are not read."""
    if not looks:
        raise ValueError("next_decision needs at least one look")
    for i, look in enumerate(looks):
        if look.seeds != FIRST_SEEDS + i:
            raise ValueError(f"look {i + 1} is at {look.seeds} seeds per variant; the design looks at "
                             f"{FIRST_SEEDS}, {FIRST_SEEDS + 1}, … seeds")
        if i < len(looks) - 1 and look.decision != "continue":
            raise ValueError(f"look {i + 1} already stopped the design ({look.decision})")
    last = looks[-1]
    if efficacy(last.p_value, threshold(last.seeds, max_seeds, alpha)):
        return "efficacy"
    if last.mde_relative is not None and last.mde_relative < min_effect:
        return "futility"
    return "max" if last.seeds >= max_seeds else "continue"


def look_at(contrast: SplitContrast | None, seeds: int, threshold_: float) -> Look:
    """A Look from the primary SplitContrast (None: no contrast could be made), with the interval at
    the adjusted level: Δloss ± t(1 − threshold/2, df)·se, as exp() − 1."""

    if contrast is None or contrast.difference is None:
        return Look(seeds, None, threshold_)
    power = contrast.power
    look = Look(seeds, contrast.p_value, threshold_, power.mde_relative if power else None,
                relative=contrast.relative, test=contrast.test)
    if contrast.se is not None and contrast.df is not None and threshold_ > 0:
        half = 0.0 if contrast.se == 0 else t_ppf(1.0 - threshold_ / 2.0, contrast.df) * contrast.se
        look.ci_low = relative(contrast.difference - half)
        look.ci_high = relative(contrast.difference + half)
    return look


# ============================================================================ the design's record


@dataclass
class Sequential:
    """The sequential design of `compare --config --seeds auto` and what happened at each look
    (comparison.json's `sequential`)."""

    max_seeds: int = MAX_SEEDS
    min_effect: float = MIN_EFFECT
    alpha: float = ALPHA
    looks: list[Look] = field(default_factory=list)
    stopped_because: str | None = None  # efficacy | futility | max | failed
    contrast: str | None = None  # "tied vs untied on validation": the contrast the design decided on

    @property
    def seeds(self) -> int:
        """Seeds per variant at the last look."""
        return self.looks[-1].seeds if self.looks else 0

    @property
    def threshold(self) -> float:
        """The nominal p threshold at the last look: what the verdict is judged against."""
        return self.looks[-1].threshold if self.looks else 0.0

    def summary(self) -> str:
        """One sentence: the rule, where it stopped and why, and the adjusted threshold there."""
        n, k = self.seeds, len(self.looks)
        head = ("Sequential design: O'Brien–Fleming-type alpha spending (Lan–DeMets, two-sided "
                f"α = {self.alpha:g}) over up to {self.max_seeds} seeds per variant")
        at = f"after {n} seeds ({k} look{'s' * (k != 1)})"
        level = f"the interval at the adjusted level (p < {fmt_threshold(self.threshold)})"
        last = self.looks[-1] if self.looks else None
        why = self.stopped_because
        if why == "efficacy":
            return f"{head}; stopped {at} because {level} excludes 0."
        includes = "excludes" if last and efficacy(last.p_value, last.threshold) else "includes"
        if why == "futility":
            return (f"{head}; stopped {at} for futility: the seeds already detect effects down to "
                    f"{percent(last.mde_relative)} (80% power, α = 0.05), below --min-effect "
                    f"{self.min_effect * 100:g}%, and {level} {includes} 0.")
        if why == "max":
            return f"{head}; stopped at the maximum, {at}: {level} {includes} 0."
        if why == "failed":
            return (f"{head}; stopped {at} because a run failed to train — fix it and run the same command again "
                    "(finished runs are reused).")
        return f"{head}; {at}."

    def to_json(self) -> dict:
        return {"rule": RULE, "alpha": self.alpha, "spending": "alpha(t) = 2 - 2*Phi(z_{1-alpha/2} / sqrt(t)), "
                "t = seeds / max_seeds", "first_seeds": FIRST_SEEDS, "max_seeds": self.max_seeds,
                "min_effect": self.min_effect,
                "calibration": {"statistic": "paired t", "paths": mc_paths(self.max_seeds), "seed": MC_SEED},
                "contrast": self.contrast, "looks": [x.to_json() for x in self.looks],
                "stopped_because": self.stopped_because, "seeds": self.seeds, "threshold": self.threshold,
                "summary": self.summary()}

    def apply(self, c: Comparison) -> None:
        """Record the design on the comparison and judge its primary contrast at the adjusted level:
        the contrast's `significant`, and its `adjusted` level (AdjustedLevel), from which the
        verdict says the threshold beside the p-value (the interval shown stays the 95% one; the
        adjusted one is named)."""

        c.sequential = self
        found = c.primary_contrast()
        if found is None:
            return
        v, d = found
        self.contrast = f"{v.label} vs {v.vs_baseline.baseline} on {c.primary}"
        family = c.family if getattr(c, "family", None) is not None and c.family.split == c.primary else None
        if family is not None and len(family.members) > 1:
            self.contrast = f"{family.primary.words}: {self.contrast}"
            self._judge_family(c, family)
            return
        if d.p_value is not None:
            d.significant = efficacy(d.p_value, self.threshold)
        last = self.looks[-1] if self.looks else None
        d.adjusted = AdjustedLevel(self.threshold, self.seeds, last.ci_low if last else None,
                                   last.ci_high if last else None)
        v.verdicts = verdicts_for(v, c)  # the verdict judges at d.adjusted's level and says so

    def _judge_family(self, c: Comparison, family: MatchFamily) -> None:
        """--match under the design: Holm over the two contrasts with the primary one's levels the
        design's thresholds at the last look, at α and at α/2 (the design calibrated at α/2: crossing
        its stricter boundaries at the look where this design stopped is an event of probability at
        most α/2 under no effect, as that design would have crossed there or earlier). The matched
        contrast keeps α and α/2. Holm's adjusted p-values are not given: the levels differ."""

        family.sequential = True
        for m in family.members:
            m.p_holm = None
            if m.role == "primary":
                m.level = self.threshold
                m.half = threshold(self.seeds, self.max_seeds, self.alpha / 2) if self.looks else 0.0
            else:
                m.level, m.half = self.alpha, self.alpha / 2
        family.judge()
        apply_family(family, c.variants)
        for v in c.variants:
            if family.member(v.label) is not None:
                v.verdicts = verdicts_for(v, c)



def look_words(look: Look) -> str:
    """'−3.20%, p=0.210 (threshold p < 0.00035), smallest detectable +8.10%: continue'."""
    p = fmt_pvalue(look.p_value) if look.p_value is not None else "no p-value"
    mde = percent(look.mde_relative)
    return (f"{percent(look.relative)}, {p} (threshold p < {fmt_threshold(look.threshold)}), "
            f"smallest detectable {mde}: {look.decision}")
