"""The effect over training: each contrast's effect at every periodic validation evaluation, so a
verdict can be read against how it got there (at small budgets the tying effect mostly
measures how fast each variant starts).

At each number of tokens seen that every run of both variants evaluated, the validation losses
are compared by seed exactly as the verdict compares the final ones (stats.compare_by_seed:
paired by seed when both variants ran the same seeds, Welch otherwise), and the effect is shown
as the verdict shows it: exp(mean Δloss) − 1 with exp(CI) − 1 bounds. From those points:

- crossover: the last change of sign of the point estimate, interpolated linearly in tokens
  between the two evaluations around it (so the sign after it holds to the end); None if the
  sign never changes. Negative is the variant better (lower perplexity).
- still_moving: the change of the effect over the last quarter of training (from the evaluation
  nearest to 75% of the last one's tokens, to the last one) against the half-width of the last
  interval; True when the change is larger. None without an interval (one seed) or with fewer
  than two evaluations.

The periodic evaluations score the first train.eval_tokens of validation (the same slice every
time), so the trajectory is on validation even when the verdict is on test (--select best).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..formatting import fmt_count
from ..perplexity import relative
from .collect import LoadedRun
from .stats import compare_by_seed, number
from .variants import Variant
from .. import runs as run_folder

SPLIT = "validation"  # the only split evaluated during training
LAST_QUARTER = 0.75  # still_moving: from the evaluation nearest to this fraction of the last one's tokens
ZERO_CHANGE = 1e-12  # a change below this is float rounding, never "still moving" (with no spread: no interval)
ONE_SEED = "one seed per variant: point estimates only, no interval"


@dataclass
class TrajectoryPoint:
    """The effect at one evaluation: exp(mean Δloss) − 1 with exp(CI) − 1 bounds (None: one seed)."""

    tokens: float
    step: int | None
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    n_seeds: int  # the pairs (paired), or the smaller side (Welch)
    test: str | None  # "paired" or "welch", as stats.compare_by_seed chose
    p_value: float | None


@dataclass
class Crossover:
    """The last change of sign of the effect, interpolated linearly in tokens."""

    tokens: float  # where the interpolated effect crosses zero
    between: tuple[float, float]  # the tokens of the evaluations on either side
    direction: str  # "variant_ahead" (the effect turns negative) or "reference_ahead"
    leader: str  # the label of the variant that is ahead after it
    text: str  # "tied pulls ahead of untied after 1.1M tokens"

    def to_json(self) -> dict:
        return {**asdict(self), "between": list(self.between)}


@dataclass
class Trajectory:
    """One contrast (variant against reference) over training, on the periodic validation evaluations."""

    variant: str
    reference: str
    points: list[TrajectoryPoint] = field(default_factory=list)
    crossover: Crossover | None = None
    still_moving: bool | None = None
    last_quarter_change: float | None = None  # effect at the last point − effect at the one nearest 75%
    last_quarter_from_tokens: float | None = None
    final_half_width: float | None = None  # (ci_high − ci_low) / 2 of the last point's effect
    note: str | None = None

    def to_json(self) -> dict:
        return {"split": SPLIT, "variant": self.variant, "reference": self.reference,
                "points": [asdict(p) for p in self.points],
                "crossover": self.crossover.to_json() if self.crossover else None,
                "still_moving": self.still_moving, "last_quarter_change": self.last_quarter_change,
                "last_quarter_from_tokens": self.last_quarter_from_tokens,
                "final_half_width": self.final_half_width, "note": self.note}


# ============================================================================ the points


def evaluations(run: LoadedRun) -> dict[float, tuple[int | None, float]]:
    """tokens -> (step, loss) of the run's periodic validation evaluations (metrics.jsonl, through
    runs/; LoadedRun.curve keeps only tokens and perplexity). The loss is log(perplexity) where a
    record lacks it; a later record at the same tokens (a resumed run) replaces an earlier one."""

    out: dict[float, tuple[int | None, float]] = {}
    try:
        records = run_folder.read_metrics(Path(run.path))
    except OSError:  # collect's notes already say so
        return out
    for rec in records:
        if rec.get("kind") != "eval" or rec.get("split", SPLIT) != SPLIT:
            continue
        tokens, loss, ppl = number(rec.get("tokens")), number(rec.get("loss")), number(rec.get("perplexity"))
        if loss is None and ppl is not None and ppl > 0:
            loss = math.log(ppl)
        step = rec.get("step")
        if tokens is not None and loss is not None:
            out[tokens] = (step if isinstance(step, int) and not isinstance(step, bool) else None, loss)
    return out


def effect_points(variant_runs: list[LoadedRun], reference_runs: list[LoadedRun]) -> tuple[list[TrajectoryPoint], bool]:
    """The effect at each evaluation every run of both variants reached, and whether some run
    evaluated beyond the last of them (it trained longer, or the others stopped early)."""
    ev_v = {r.seed: evaluations(r) for r in variant_runs}
    ev_r = {r.seed: evaluations(r) for r in reference_runs}
    every = list(ev_v.values()) + list(ev_r.values())
    if not every or not all(every):
        return [], False
    shared = sorted(set.intersection(*(set(e) for e in every)))
    points = []
    for t in shared:
        test = compare_by_seed({s: e[t][1] for s, e in ev_v.items()}, {s: e[t][1] for s, e in ev_r.items()})
        step = next((e[t][0] for e in every if e[t][0] is not None), None)
        points.append(TrajectoryPoint(tokens=t, step=step, effect=relative(test.difference),
                                      ci_low=relative(test.ci_low), ci_high=relative(test.ci_high),
                                      n_seeds=test.seeds, test=test.test, p_value=test.p_value))
    beyond = bool(shared) and any(max(e) > shared[-1] for e in every)
    return points, beyond


# ============================================================================ crossover and still moving


def crossover(points: list[TrajectoryPoint], variant: str, reference: str) -> Crossover | None:
    """The last change of sign of the point estimate (exact zeros have no sign and are passed over),
    at the tokens where the line between the two evaluations around it crosses zero."""
    signed = [p for p in points if p.effect is not None and p.effect != 0]
    for a, b in reversed(list(zip(signed, signed[1:]))):
        if (a.effect < 0) != (b.effect < 0):
            tokens = a.tokens + (b.tokens - a.tokens) * a.effect / (a.effect - b.effect)
            ahead = b.effect < 0
            leader, other = (variant, reference) if ahead else (reference, variant)
            return Crossover(tokens=tokens, between=(a.tokens, b.tokens),
                             direction="variant_ahead" if ahead else "reference_ahead", leader=leader,
                             text=f"{leader} pulls ahead of {other} after {fmt_count(tokens)} tokens")
    return None


def still_moving(points: list[TrajectoryPoint]) -> tuple[bool | None, float | None, float | None, float | None]:
    """(still moving?, the effect's change over the last quarter, the tokens it is measured from, the
    last interval's half-width). Still moving: the change is larger than the half-width."""
    pts = [p for p in points if p.effect is not None]
    if len(pts) < 2:
        return None, None, None, None
    last = pts[-1]
    start = min(pts, key=lambda p: abs(p.tokens - LAST_QUARTER * last.tokens))  # ties: the earlier one
    if start is last:
        return None, None, None, None
    change = last.effect - start.effect
    if last.ci_low is None or last.ci_high is None:
        return None, change, start.tokens, None
    half = (last.ci_high - last.ci_low) / 2.0
    return abs(change) > max(half, ZERO_CHANGE), change, start.tokens, half


def trajectory(variant: Variant, reference: Variant, variant_runs: list[LoadedRun],
               reference_runs: list[LoadedRun]) -> Trajectory:
    out = Trajectory(variant=variant.label, reference=reference.label)
    out.points, beyond = effect_points(variant_runs, reference_runs)
    if not out.points:
        out.note = ("no periodic validation evaluation that every run of both variants reached "
                    "(train.eval_every = 0, or no metrics.jsonl)")
        return out
    out.crossover = crossover(out.points, variant.label, reference.label)
    (out.still_moving, out.last_quarter_change, out.last_quarter_from_tokens,
     out.final_half_width) = still_moving(out.points)
    notes = []
    if out.points[-1].ci_low is None:
        notes.append(ONE_SEED if all(p.n_seeds <= 1 for p in out.points) else "no interval at the last evaluation")
    if beyond:
        notes.append(f"ends at {fmt_count(out.points[-1].tokens)} tokens, the last evaluation every run of both "
                     "variants reached (some trained longer, or others stopped early)")
    out.note = "; ".join(notes) or None
    return out


def contrast_trajectories(variants: list[Variant], runs_by_key: dict[str, list[LoadedRun]]) -> dict[str, Trajectory]:
    """variant label -> its contrast's trajectory, for every variant with a contrast."""
    by_label = {v.label: v for v in variants}
    out = {}
    for v in variants:
        ref = by_label.get(v.vs_baseline.baseline) if v.vs_baseline else None
        if ref is not None and v.key in runs_by_key and ref.key in runs_by_key:
            out[v.label] = trajectory(v, ref, runs_by_key[v.key], runs_by_key[ref.key])
    return out


def variant_json(v: Variant, trajectories: dict[str, Trajectory]) -> dict:
    """The variant's comparison.json entry, its contrast with the `trajectory` object."""
    data = v.to_json()
    t = trajectories.get(v.label)
    if data.get("vs_baseline") is not None:
        data["vs_baseline"]["trajectory"] = t.to_json() if t else None
    return data
