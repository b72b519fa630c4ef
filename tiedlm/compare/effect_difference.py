"""The difference between two comparisons' tying effects: does tying do the same on another block,
another corpus or another scale, beyond the noise between seeds?

Each comparison.json holds, for each seed, the loss of the variant and of its reference on a split;
a comparison's effect is the mean over seeds of their difference (nats per token, shown as a ratio
of perplexities, exp(Δ) − 1). Two comparisons trained apart are independent, so the difference of
their effects is tested with Welch's t-test on the two lists of per-seed differences (Welch–
Satterthwaite degrees of freedom), and shown as exp(Δ_a − Δ_b) − 1: how much larger comparison a's
perplexity ratio is than comparison b's. `scripts/effect_difference.py` prints it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formatting import fmt_p, percent
from ..perplexity import relative
from .stats import TestResult, paired_test, significant, welch_test


class NotComparable(ValueError):
    """A comparison without the variants, seeds or split asked for."""


def seed_differences(comparison: dict, variant: str, reference: str, split: str) -> dict[int, float]:
    """{seed: loss(variant) − loss(reference)} on `split`, over the seeds both variants have."""
    by_label = {v.get("label"): v for v in comparison.get("variants", [])}
    missing = [name for name in (variant, reference) if name not in by_label]
    if missing:
        raise NotComparable(f"no variant {missing[0]!r} in this comparison (it has "
                            f"{', '.join(sorted(map(str, by_label)))}) — name one with --variant / --reference")
    runs = {r.get("name"): r for r in comparison.get("runs", [])}

    def losses(label: str) -> dict[int, float]:
        out = {}
        for name in by_label[label].get("runs", []):
            run = runs.get(name, {})
            loss = run.get(f"{split}_loss")
            if isinstance(loss, (int, float)):
                out[int(run["seed"])] = float(loss)
        return out

    a, b = losses(variant), losses(reference)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise NotComparable(f"{variant} and {reference} share no seed with a {split} loss — compare runs scored "
                            f"on {split} (eval.splits)")
    return {s: a[s] - b[s] for s in seeds}


@dataclass
class EffectDifference:
    split: str
    variant: str
    reference: str
    effect_a: TestResult  # each comparison's own effect, paired over its seeds
    effect_b: TestResult
    difference: TestResult  # Welch: effect_a − effect_b

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "variant": self.variant, "reference": self.reference,
                "effect_a": self.effect_a.to_json(), "effect_b": self.effect_b.to_json(),
                "difference": self.difference.to_json()}


def effect_difference(a: dict, b: dict, variant: str = "tied", reference: str = "untied",
                      split: str = "test") -> EffectDifference:
    da, db = seed_differences(a, variant, reference, split), seed_differences(b, variant, reference, split)
    zeros = lambda d: [0.0] * len(d)  # noqa: E731  (paired against zero: the mean difference and its interval)
    return EffectDifference(split, variant, reference, paired_test(list(da.values()), zeros(da)),
                            paired_test(list(db.values()), zeros(db)), welch_test(list(da.values()), list(db.values())))


def _pct(x: float | None) -> str:
    """A loss difference as the ratio it makes, as every comparison shows one: +9.88%."""
    return percent(relative(x))


def describe(result: EffectDifference, name_a: str, name_b: str) -> str:
    """Three lines: each comparison's effect with its interval, then their difference."""
    def effect(name: str, t: TestResult) -> str:
        return (f"{name}: {result.variant} vs {result.reference} on {result.split} {_pct(t.difference)} "
                f"(95% CI {_pct(t.ci_low)} to {_pct(t.ci_high)}, {t.n} seeds)")

    d = result.difference
    p = fmt_p(d.p_value)
    verdict = "the effects differ beyond the noise between seeds" if significant(d.p_value) else \
        "the interval holds 0: no difference between the effects is shown"
    return "\n".join([effect(name_a, result.effect_a), effect(name_b, result.effect_b),
                      f"difference ({name_a} over {name_b}, as a ratio of the perplexity ratios): {_pct(d.difference)} "
                      f"(95% CI {_pct(d.ci_low)} to {_pct(d.ci_high)}, Welch df {d.df:.1f}, {p}): {verdict}"
                      if d.df is not None else f"difference: {_pct(d.difference)} ({d.note})"])
