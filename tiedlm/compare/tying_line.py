"""The tying line: in a grid of one numeric key (the training budget, say), the cells' tying
effects as a line in log2 of the key, and where that line crosses zero: where tying starts (or
stops) helping, with its 95% interval.

The model, by weighted least squares over the settings with an effect and a standard error
(surface.wls, as the map's surface):

    y = b0 + b1·u        weights w = 1 / se²

y is the setting's effect on the loss scale (Δloss in nats, tied minus untied), se its standard
error (the setting's paired or Welch test), u = log2 of the key's value centred at the middle of
the measured range: b0 is the predicted effect there, b1 nats per doubling. The coefficients'
covariance is s²·(XᵀWX)⁻¹ with s² = χ²/(n − 2) (the settings' scatter about the line sets the
scale), Student t on n − 2 degrees of freedom, so at least 3 settings are needed.

The crossing is u₀ = −b0/b1. Its 95% interval is Fieller's: the values of u where the line's own
95% interval contains 0, {u : ŷ(u)² ≤ t²·var ŷ(u)}. It is a bounded interval only where the slope
is significant (b1² > t²·var b1); otherwise the data do not place the crossing and it is said to
be unbounded. Pure numbers and numpy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..formatting import fmt, markdown_table, p_only, percent
from ..config.naming import scalar, short_keys
from ..perplexity import relative
from .stats import LEVEL, holm, number, t_ppf, t_two_sided_p
from .surface import FAR, wls
from .map_measures import direct_path_costs
from .tying_map import frequency_ends, numeric_axes, runs_at_unigram

if TYPE_CHECKING:
    import numpy as np

    from .variants import Variant

MIN_SETTINGS = 3  # two parameters and at least one residual degree of freedom


@dataclass
class TyingLine:
    key: str  # the grid's key, dotted (train.max_tokens)
    short: str  # its short name (max_tokens)
    points: list[tuple[float, float, float]]  # (value, Δloss, se) of each setting fitted
    intercept: float | None = None  # nats at the measured range's centre
    slope: float | None = None  # nats per doubling of the key
    slope_se: float | None = None
    slope_p: float | None = None
    dof: int = 0
    centre: float | None = None  # log2 of the key at the centre
    crossing: float | None = None  # the key's value where the line predicts no effect
    low: float | None = None  # Fieller's 95% interval of the crossing (None: unbounded that side)
    high: float | None = None
    bounded: bool = False  # the slope is significant: Fieller's set is an interval
    notes: list[str] = field(default_factory=list)
    mechanism: list[dict] = field(default_factory=list)  # per setting: the buckets' effects and each variant's best
    intervals: list[tuple[float, float | None, float | None]] = field(default_factory=list)  # (value, 95% CI of Δloss)
    # (value, Δloss) of each setting left out because runs there do not beat the unigram model
    unlearned: list[tuple[float, float | None]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.lines()}

    def lines(self) -> list[str]:
        return line_sentences(self)


def fit_line(key: str, points: list[tuple[float, float, float]]) -> TyingLine:
    """The line over the settings (value, Δloss, se); fitted where at least MIN_SETTINGS have a
    positive value, a finite effect and se > 0 (the others are named in its notes)."""
    import numpy as np

    line = TyingLine(key=key, short=short_keys([key])[key], points=[])
    off_axis = [x for x, _, _ in points if x is not None and x <= 0]
    usable = [(x, y, se) for x, y, se in points
              if x is not None and x > 0 and y is not None and math.isfinite(y) and se is not None and se > 0]
    if off_axis:
        line.notes.append(f"{len(off_axis)} setting(s) left out of the fit: {line.short}="
                          f"{', '.join(f'{x:g}' for x in off_axis)} has no place on its log2 axis (log2(0) is −∞)")
    if len(usable) < len(points) - len(off_axis):
        line.notes.append(f"{len(points) - len(off_axis) - len(usable)} setting(s) left out of the fit: no effect with "
                          "a standard error (one seed, or no spread between seeds)")
    line.points = sorted(usable)
    if len(usable) < MIN_SETTINGS:
        line.notes.append(f"no line fitted: {len(usable)} setting(s) with an effect and a standard error, "
                          f"{MIN_SETTINGS} needed")
        return line
    u = np.log2([x for x, _, _ in line.points])
    line.centre = float((u.min() + u.max()) / 2)
    X = np.column_stack([np.ones(len(u)), u - line.centre])
    y = np.array([p[1] for p in line.points])
    w = 1.0 / np.array([p[2] for p in line.points]) ** 2
    fit = wls(X, y, w)
    if fit is None:
        line.notes.append("no line fitted: the settings' values do not span a line")
        return line
    cov = fit.unscaled * (fit.chi2 / fit.dof)
    a, b = (float(v) for v in fit.beta)
    line.intercept, line.slope, line.dof = a, b, fit.dof
    line.slope_se = math.sqrt(float(cov[1, 1]))
    line.slope_p = t_two_sided_p(b / line.slope_se, fit.dof) if line.slope_se > 0 else None
    _crossing(line, a, b, cov, t_ppf(0.5 + LEVEL / 2, fit.dof))
    return line


def _crossing(line: TyingLine, a: float, b: float, cov: np.ndarray, t: float) -> None:
    """u₀ = −a/b, and Fieller's set {u : (a + b·u)² ≤ t²·(A + 2B·u + D·u²)} (u centred)."""
    if b != 0 and abs(-a / b) <= FAR:
        line.crossing = float(2 ** (-a / b + line.centre))
    A, B, D = float(cov[0, 0]), float(cov[0, 1]), float(cov[1, 1])
    alpha, beta2, gamma = b * b - t * t * D, a * b - t * t * B, a * a - t * t * A
    if alpha <= 0:  # the slope is not significant: the set is unbounded
        return
    disc = max(0.0, beta2 * beta2 - alpha * gamma)
    r1, r2 = (-beta2 - math.sqrt(disc)) / alpha, (-beta2 + math.sqrt(disc)) / alpha
    line.bounded = True
    line.low = float(2 ** (r1 + line.centre)) if abs(r1) <= FAR else None
    line.high = float(2 ** (r2 + line.centre)) if abs(r2) <= FAR else None


def _value(x: float, digits: int | None = None) -> str:
    """A key's value as a reader takes it: 152,509; 4,530,000 (3 significant digits); 0.003."""
    if digits is not None:
        x = float(f"{x:.{digits}g}")
    return f"{x:,.0f}" if abs(x) >= 1000 and float(x).is_integer() else scalar(x)


def line_sentences(line: TyingLine) -> list[str]:
    if line.slope is None:
        return list(line.notes)
    lo, hi = line.points[0][0], line.points[-1][0]
    p = "" if line.slope_p is None else f", p={line.slope_p:.3g}"
    direction = "falls" if line.slope < 0 else "rises"
    out = [f"Fitted over log2 {line.short} ({len(line.points)} settings, weighted by 1/se², {line.dof} residual "
           f"degree{'s' if line.dof != 1 else ''} of freedom): the tying effect {direction} by "
           f"{abs(line.slope):.4f} nats per doubling of {line.short} (se {line.slope_se:.4f}{p})."]
    helps = "starts to help" if line.slope < 0 else "stops helping"
    if line.crossing is None:
        out.append(f"The line does not cross zero within 2^{FAR:g} of the measured range: no crossover.")
    else:
        where = ("inside" if lo <= line.crossing <= hi else "outside") + f" the measured range ({_value(lo)} to {_value(hi)})"
        if not line.bounded:
            band = "its 95% interval is unbounded: the slope is not significant, so the data do not place it"
        else:
            band = (f"95% interval {'unbounded' if line.low is None else _value(line.low, 3)} to "
                    f"{'unbounded' if line.high is None else _value(line.high, 3)} (Fieller)")
        out.append(f"Tying {helps} where the line crosses zero: {line.short} ≈ {_value(line.crossing, 3)}, "
                   f"{where}; {band}.")
    return out + list(line.notes)


def _best_share(v: Variant) -> float | None:
    """Where a variant's runs had their best validation evaluation, as a share of their budget (the
    mean over seeds): 1 for a run still improving at its end, less for one that over-fitted."""
    budget = v.config.train.max_tokens
    if not v.best_points or not budget:
        return None
    # the last step may pass the budget by part of a batch: its best is then the whole budget
    return min(1.0, sum(t for t, _ in v.best_points) / len(v.best_points) / budget)


def mechanism_rows(matched: list, variants: list, primary: str, key: str) -> list[dict]:
    """Per setting: the effect on the most frequent and the rarest ranked bucket (the primary split's
    buckets, Δ loss as exp(Δ) − 1), and where each variant's best weights came in its budget (who
    over-fits first), and what W_out := E costs the untied direct path in bits per byte where its runs
    were analysed (compare --analyze)."""
    by_label = {v.label: v for v in variants}
    rows = []
    ordered = sorted(matched, key=lambda m: m.setting[key])
    # the settings' tests are one family, read together: Holm over them, as over a map's cells
    adjusted = holm([getattr(m.split(primary), "p_value", None) for m in ordered])
    for m, p_holm in zip(ordered, adjusted):
        d = m.split(primary)
        top, rest = frequency_ends(list(d.buckets)) if d else (None, None)
        row = {"setting": m.setting[key], "effect": number(d.relative) if d else None, "p_holm": p_holm}
        for name, end in (("frequent", top), ("rare", rest)):
            b = d.buckets.get(end) if d and end else None
            row[name] = {"bucket": end, "effect": relative(b.difference) if b else None,
                         "ci_low": relative(b.ci_low) if b else None, "ci_high": relative(b.ci_high) if b else None}
        row["tied_best_share"] = _best_share(by_label[m.tied]) if m.tied in by_label else None
        row["untied_best_share"] = _best_share(by_label[m.untied]) if m.untied in by_label else None
        untied = by_label.get(m.untied)
        measured = {k: number(x.mean) for k, x in (untied.matrices if untied is not None else {}).items() if x.n}
        row["direct_path_cost_bpb"] = direct_path_costs(measured)["direct_path_cost_bpb"]
        rows.append(row)
    return rows


def mechanism_markdown(line: TyingLine) -> list[str]:
    if not line.mechanism:
        return []

    def pct(x):
        return "—" if x is None else percent(x)

    def share(x):
        return "—" if x is None else f"{x:.0%}"

    analysed = any(r.get("direct_path_cost_bpb") is not None for r in line.mechanism)
    rows = [[_value(r["setting"]), pct(r["effect"]), p_only(r.get("p_holm")),
             f"{pct(r['frequent']['effect'])} ({r['frequent']['bucket'] or '—'})",
             f"{pct(r['rare']['effect'])} ({r['rare']['bucket'] or '—'})",
             share(r["tied_best_share"]), share(r["untied_best_share"]),
             *([fmt(r.get("direct_path_cost_bpb"), 4)] if analysed else [])] for r in line.mechanism]
    path = (", and what forcing E into W_out's place costs the untied model's direct path, in bits per byte (the mean "
            "over its analysed seeds)") if analysed else ""
    return ["", f"Per {line.short}: the tying effect with its p-value adjusted by Holm over the settings (one family of "
                f"tests), the effect on the most frequent and the rarest tokens, and where each variant's "
                f"best weights came in its budget (the mean over seeds; below 100%, it had begun to over-fit){path}:", "",
            markdown_table([line.short, "effect", "Holm p", "frequent tokens", "rare tokens", "tied best at",
                            "untied best at", *(["direct path: W_out := E costs (bits/byte)"] if analysed else [])],
                           rows, "rrrrrrr" + ("r" if analysed else ""))]


def tying_line(matched: list, primary: str, variants: list | None = None) -> TyingLine | None:
    """The line of a grid whose settings vary in one numeric key (the others following it, as a
    tuned key chosen per setting does); None otherwise."""
    axes = numeric_axes(matched, 1)
    if axes is None:
        return None
    key = axes[0][0]
    if len({m.setting[key] for m in matched}) != len(matched):  # several tied variants at one setting
        return None
    by_label = {v.label: v for v in variants or []}
    points, intervals, unlearned = [], [], []
    for m in matched:
        d = m.split(primary)
        x = float(m.setting[key])
        intervals.append((x, d.ci_low if d else None, d.ci_high if d else None))
        failing = runs_at_unigram(m, by_label, primary)
        if failing:  # an effect between models that have not learned from context says nothing about tying
            unlearned.append((x, d.difference if d else None, failing))
        else:
            points.append((x, d.difference if d else None, d.se if d else None))
    line = fit_line(key, points)
    unlearned.sort()
    if unlearned:
        line.notes.insert(0, _unlearned_note(line.short, unlearned, primary))
    line.unlearned = [(x, y) for x, y, _ in unlearned]
    line.mechanism = mechanism_rows(matched, variants, primary, key) if variants is not None else []
    line.intervals = sorted(intervals)
    return line


def _unlearned_note(short: str, unlearned: list, primary: str) -> str:
    """The line's note on the settings left out (value, Δloss, "k of n"), in the key's order."""
    values = [_value(x) for x, _, _ in unlearned]
    named = values[0] if len(values) == 1 else ", ".join(values[:-1]) + f" and {values[-1]}"
    counts = ", ".join(f"{n} runs at {v}" for v, (_, _, n) in zip(values, unlearned))
    return (f"{short} {named} left out of the fit: runs there do not beat the unigram model of their training split "
            f"on {primary} ({counts}), so their effect says nothing about tying")


def predicted(line: TyingLine, x: float) -> float | None:
    """The fitted Δloss at the key's value x (None without a fit)."""
    if line.slope is None or line.intercept is None or line.centre is None or x <= 0:
        return None
    return line.intercept + line.slope * (math.log2(x) - line.centre)
