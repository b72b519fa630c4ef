"""Why, from the matrices: beside each cell of the tying map, what `tiedlm analyze` measured in
the cell's untied pair (compare --analyze), and whether those measures predict the effect.

The seed's symmetry argument: tying forces W_out = E, which costs least where the untied model
learns an W_out close to E anyway. So where tying helps (a negative effect) the untied pair
should be similar (a high CKA and rotated cosine), and forcing E into W_out's place on the direct
path (the bigram path softmax(W_out · LN_f(E[t])) (LN_f the final norm: LayerNorm, or RMSNorm for llama)) should cost little. Over the map's cells the
predicted signs of Spearman's ρ with the effect are: CKA −, rotated cosine −, the direct path's
cost of W_out := E (the loss with E minus the loss with W_out, in nats per token and in bits per byte) +. Each ρ is tested with the
t approximation scipy.stats.spearmanr uses (t = ρ·√((n − 2)/(1 − ρ²)), n − 2 degrees of freedom), or
exactly over every ordering up to stats.EXACT_CELLS cells; with a dozen cells it is a weak test, and the
lines say how many cells it rests on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..formatting import fmt_signed, percent
from ..config.naming import scalar
from .stats import ALPHA, number, spearman_test
from ..formatting import markdown_table
from .tying_map import BucketEffect, TyingMap, bucket_lines, tying_map

if TYPE_CHECKING:
    from .surface import Surface

# (key in the variant's matrices or computed here, label, the sign of ρ the symmetry argument predicts)
MEASURES = (("cka", "untied CKA", -1), ("aligned_cosine", "untied rotated cosine", -1),
            ("direct_path_nll", "untied direct path loss", None),
            ("direct_path_nll_e_as_w_out", "untied direct path loss with W_out := E", None),
            ("direct_path_cost", "cost of W_out := E on the direct path", +1),
            ("direct_path_cost_bpb", "cost of W_out := E on the direct path, bits/byte", +1))
MIN_CELLS = 4  # fewer cells with both numbers: no correlation is reported


@dataclass
class MeasureCorrelation:
    key: str
    label: str
    n: int  # cells with both the effect and the measure
    rho: float | None
    p_value: float | None
    predicted: int | None  # the sign the symmetry argument predicts; None: no prediction

    @property
    def agrees(self) -> bool | None:
        """Whether ρ has the predicted sign (None without a prediction or a ρ)."""
        if self.predicted is None or self.rho is None or self.rho == 0:
            return None
        return (self.rho > 0) == (self.predicted > 0)


def cell_measures(tmap: TyingMap, variants: Sequence[Any]) -> dict:
    """(row, col) -> {measure: the untied variant's mean over its analysed seeds}; a cell whose
    untied runs were not analysed gets {}."""
    by_label = {v.label: v for v in variants}
    out = {}
    for at, cell in tmap.cells.items():
        v = by_label.get(cell.untied)
        m = {k: number(s.mean) for k, s in (v.matrices if v is not None else {}).items() if s.n}
        if m:
            m.update(direct_path_costs(m))
        out[at] = m
    return out


def direct_path_costs(m: dict) -> dict:
    """What forcing E into W_out's place costs the untied direct path: in nats per token, and in bits
    per byte (which reads across tokenizers); None where a loss is missing."""
    def cost(own: float | None, forced: float | None) -> float | None:
        return forced - own if own is not None and forced is not None else None

    return {"direct_path_cost": cost(m.get("direct_path_nll"), m.get("direct_path_nll_e_as_w_out")),
            "direct_path_cost_bpb": cost(m.get("direct_path_bpb"), m.get("direct_path_bpb_e_as_w_out"))}


def correlations(tmap: TyingMap, measures: dict) -> list[MeasureCorrelation]:
    """Spearman's ρ between the cells' effects and each measure, over the cells that have both."""
    out = []
    for key, label, predicted in MEASURES:
        pairs = [(c.effect, measures.get(at, {}).get(key)) for at, c in tmap.cells.items()]
        pairs = [(e, m) for e, m in pairs if e is not None and m is not None]
        rho, p = spearman_test([e for e, _ in pairs], [m for _, m in pairs]) if len(pairs) >= MIN_CELLS else (None, None)
        out.append(MeasureCorrelation(key, label, len(pairs), rho, p, predicted))
    return out


def measure_lines(found: list[MeasureCorrelation]) -> list[str]:
    """One sentence per measure with a ρ, and whether it has the sign the symmetry argument predicts."""
    lines = []
    for c in found:
        if c.rho is None:
            continue
        said = "" if c.agrees is None else (" — the sign the symmetry argument predicts" if c.agrees
                                            else " — against the symmetry argument's prediction")
        rho = fmt_signed(c.rho)
        p = "p < 0.001" if c.p_value < 0.001 else f"p = {c.p_value:.3f}"
        lines.append(f"Effect vs {c.label}: Spearman ρ = {rho} ({p}, {c.n} cells){said}.")
    if not lines:
        lines.append(f"No correlation with the matrices: fewer than {MIN_CELLS} cells have an analysed untied pair "
                     "(compare --analyze analyses them).")
    return lines


def to_json(measures: dict, found: list[MeasureCorrelation]) -> dict:
    return {"cells": [{"row": r, "col": c, **m} for (r, c), m in measures.items()],
            "correlations": [{**asdict(c), "agrees": c.agrees} for c in found]}


@dataclass
class MapSection:
    """The tying map of a comparison with what the matrices say beside it (comparison.tying_map)."""

    tmap: TyingMap
    measures: dict  # cell -> the untied pair's measures (cell_measures)
    correlations: list[MeasureCorrelation]

    def to_json(self) -> dict:
        return {**self.tmap.to_json(), "matrices": to_json(self.measures, self.correlations),
                "matrices_summary": measure_lines(self.correlations)}

    def lines(self) -> list[str]:
        """What the terminal prints: the map's sentences, then the measures'."""

        surface = self.tmap.surface.lines() if self.tmap.surface is not None else []
        return self.tmap.summary_lines() + bucket_lines(self.tmap) + surface + measure_lines(self.correlations)

    def markdown(self, plot: str, buckets_plot: str | None = None) -> list[str]:
        """comparison.md's section: the heatmap, its sentences, each cell with its frequent and rare
        buckets' effects and its untied pair's measures, the bucket figure, the fitted surface."""

        t = self.tmap
        cells = [(r, col) for r in t.rows for col in t.cols if t.known(r, col) is not None]
        top, rare = _bucket_names(t)
        rows = []
        for at in cells:
            cell = t.cells[at]
            m = self.measures.get(at, {})
            ends = [_bucket_words(cell.frequent), _bucket_words(cell.rare)] if top else []
            rows.append([t.name(at), percent(cell.effect), f"{percent(cell.ci_low)} to {percent(cell.ci_high)}",
                         "yes" if cell.significant else "no", *ends, *(_num(m.get(k)) for k, _, _ in MEASURES)])
        heads = [f"{top} (frequent)", f"{rare} (rare)"] if top else []
        bullets = [f"  {line}" if line.startswith("- ") else f"- {line}" for line in self.lines()]  # sub-points nest
        text = ("Beside each cell, its most frequent and its rare bucket's tying effect on "
                f"{t.bucket_split} (exp(Δloss) − 1 in the bucket, its 95% CI, and p Holm-adjusted over the buckets "
                f"of the cell's contrast; * where that p is below {ALPHA:g}), then what `tiedlm analyze` measured in the "
                "untied pair of its twin (mean over the analysed seeds; blank without `--analyze`). " if top else
                "Beside each cell, what `tiedlm analyze` measured in the untied pair of its twin (mean over the "
                "analysed seeds; blank without `--analyze`). ")
        md = ["", "### The tying map", "", f"![tying map]({plot})", "", *bullets, "",
              text + "The direct path is softmax(W_out · LN_f(E[t])) (LN_f the final norm: LayerNorm, or RMSNorm "
              "for llama), scored on validation; its cost of W_out := E is the loss with E in W_out's place minus "
              "its own.", "",
              markdown_table(["cell", "effect", "95% CI", "CI excludes 0", *heads, *(label for _, label, _ in MEASURES)],
                             rows, "lrrl" + "r" * (len(heads) + len(MEASURES)))]
        if top and buckets_plot:
            md += ["", f"![tying effect per frequency bucket]({buckets_plot})"]
        return md + surface_markdown(t.surface)


def _bucket_names(t: TyingMap) -> tuple[str | None, str | None]:
    """The frequent and rare buckets' names in the map's cells (None, None without buckets)."""
    for c in t.cells.values():
        if c.frequent is not None and c.rare is not None:
            return c.frequent.name, c.rare.name
    return None, None


def _bucket_words(b: BucketEffect | None) -> str:
    """'−3.10% (−5.0% to −1.2%), p_Holm 0.012*'."""
    if b is None or b.effect is None:
        return ""
    ci = "" if b.ci_low is None else f" ({percent(b.ci_low, 1)} to {percent(b.ci_high, 1)})"
    p = "" if b.p_holm is None else f", p_Holm {b.p_holm:.3f}" + ("*" if b.significant else "")
    return f"{percent(b.effect)}{ci}{p}"


def surface_markdown(s: Surface | None) -> list[str]:
    """The fitted surface's subsection: its coefficients, its residuals (its sentences are among the map's)."""

    if s is None or not s.fitted:
        return []

    def val(x: float | None, f: str = "+.4f") -> str:
        return "" if x is None else format(x, f).replace("-", "−")

    coefs = [[c.term, val(c.estimate), val(c.se, ".4f"), f"{val(c.ci_low)} to {val(c.ci_high)}" if c.ci_low is not None
              else "", val(c.t, "+.2f"), "" if c.p_value is None else f"{c.p_value:.3g}"] for c in s.coefficients]
    res = [[f"{s.row_short}={scalar(r.row)}, {s.col_short}={scalar(r.col)}", val(r.effect), val(r.se, ".4f"), val(r.fitted),
            val(r.residual), val(r.standardized, "+.2f"), f"{r.weight_share:.1%}"] for r in s.residuals]
    centre = f"{s.row_short}={s.centre[0]:.3g}, {s.col_short}={s.centre[1]:.3g}"
    return ["", "#### The fitted surface", "",
            "The cells' effects on the loss scale (Δloss in nats, the log of tied / untied perplexity) fitted by "
            "weighted least squares on log2 of each key, weights 1/se²; log2 is centred at the middle of the measured "
            f"range ({centre}), so the intercept is the predicted effect there and a slope is nats per doubling. "
            "Intervals: Student t on the residual degrees of freedom, the covariance (XᵀWX)⁻¹ scaled by χ²/dof. "
            "The zero contour and its 95% band (Fieller's: where the prediction's interval contains 0) are drawn "
            "on the map.", "",
            markdown_table(["term", "estimate", "SE", "95% CI", "t", "p"], coefs, "lrrrrr"), "",
            "Residuals (standardized: residual / the cell's own se; weight: the cell's share of Σ 1/se²):", "",
            markdown_table(["cell", "Δloss", "se", "fitted", "residual", "standardized", "weight"], res, "lrrrrrr")]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def map_section(matched: list, primary: str, variants: Sequence[Any]) -> MapSection | None:
    """The comparison's tying map (tying_map.tying_map) with its cells' measures, or None."""

    tmap = tying_map(matched, primary, variants)
    if tmap is None:
        return None
    measures = cell_measures(tmap, variants)
    return MapSection(tmap, measures, correlations(tmap, measures))


def missing_map_note(matched: list) -> list[str]:
    """Why a grid of two numeric keys has no tying map when several tied variants (tied and a
    mode, say) share a setting: the map holds one effect per cell. [] otherwise."""
    if not matched or any(len(m.setting) != 2 for m in matched):
        return []
    per_setting = Counter(tuple(sorted(map(str, m.setting.items()))) for m in matched)
    crowded = sum(1 for n in per_setting.values() if n > 1)
    if not crowded:
        return []
    return [f"No tying map: {crowded} setting{'s have' if crowded > 1 else ' has'} more than one tied variant against "
            "its untied twin, and a map holds one effect per cell — compare one tied variant (one tying mode) at a "
            "time with the untied runs for its map"]

