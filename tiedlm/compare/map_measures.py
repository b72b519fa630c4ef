"""Why, from the matrices: beside each cell of the tying map, what `tiedlm analyze` measured in
the cell's untied pair (compare --analyze), and whether those measures predict the effect.

The seed's symmetry argument: tying forces W_out = E, which costs least where the untied model
learns an W_out close to E anyway. So where tying helps (a negative effect) the untied pair
should be similar (a high CKA and rotated cosine), and forcing E into W_out's place on the direct
path (the bigram path softmax(W_out · LN_f(E[t])) (LN_f the final norm: LayerNorm, or RMSNorm for llama)) should cost little. Over the map's cells the
predicted signs of Spearman's ρ with the effect are: CKA −, rotated cosine −, the direct path's
cost of W_out := E (the loss with E minus the loss with W_out) +. Each ρ is tested with the
t approximation scipy.stats.spearmanr uses (t = ρ·√((n − 2)/(1 − ρ²)), n − 2 degrees of freedom), or
exactly over every ordering up to stats.EXACT_CELLS cells; with a dozen cells it is a weak test, and the
lines say how many cells it rests on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..formatting import fmt_signed, percent
from .stats import number, spearman_test

# (key in the variant's matrices or computed here, label, the sign of ρ the symmetry argument predicts)
MEASURES = (("cka", "untied CKA", -1), ("aligned_cosine", "untied rotated cosine", -1),
            ("direct_path_nll", "untied direct path loss", None),
            ("direct_path_nll_e_as_w_out", "untied direct path loss with W_out := E", None),
            ("direct_path_cost", "cost of W_out := E on the direct path", +1))
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


def cell_measures(tmap: Any, variants: Sequence[Any]) -> dict:
    """(row, col) -> {measure: the untied variant's mean over its analysed seeds}; a cell whose
    untied runs were not analysed gets {}."""
    by_label = {v.label: v for v in variants}
    out = {}
    for at, cell in tmap.cells.items():
        v = by_label.get(cell.untied)
        m = {k: number(s.mean) for k, s in (v.matrices if v is not None else {}).items() if s.n}
        if m:
            own, forced = m.get("direct_path_nll"), m.get("direct_path_nll_e_as_w_out")
            m["direct_path_cost"] = forced - own if own is not None and forced is not None else None
        out[at] = m
    return out


def correlations(tmap: Any, measures: dict) -> list[MeasureCorrelation]:
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

    tmap: Any  # tying_map.TyingMap
    measures: dict  # cell -> the untied pair's measures (cell_measures)
    correlations: list[MeasureCorrelation]

    def to_json(self) -> dict:
        return {**self.tmap.to_json(), "matrices": to_json(self.measures, self.correlations),
                "matrices_summary": measure_lines(self.correlations)}

    def lines(self) -> list[str]:
        """What the terminal prints: the map's sentences, then the measures'."""
        return self.tmap.summary_lines() + measure_lines(self.correlations)

    def markdown(self, plot: str) -> list[str]:
        """comparison.md's section: the heatmap, its sentences, each cell with its untied pair's measures."""
        t = self.tmap
        rows = []
        for r in t.rows:
            for col in t.cols:
                cell = t.known(r, col)
                if cell is None:
                    continue
                m = self.measures.get((r, col), {})
                rows.append([t.name((r, col)), percent(cell.effect), f"{percent(cell.ci_low)} to {percent(cell.ci_high)}",
                             "yes" if cell.significant else "no", *(_num(m.get(k)) for k, _, _ in MEASURES)])
        from ..formatting import markdown_table

        bullets = [f"  {line}" if line.startswith("- ") else f"- {line}" for line in self.lines()]  # sub-points nest
        return ["", "### The tying map", "", f"![tying map]({plot})", "", *bullets, "",
                "Beside each cell, what `tiedlm analyze` measured in the untied pair of its twin (mean over the "
                "analysed seeds; blank without `--analyze`). The direct path is softmax(W_out · LN_f(E[t])) (LN_f the final norm: LayerNorm, or RMSNorm for llama), scored "
                "on validation; its cost of W_out := E is the loss with E in W_out's place minus its own.", "",
                markdown_table(["cell", "effect", "95% CI", "CI excludes 0", *(label for _, label, _ in MEASURES)],
                               rows, "lrrl" + "r" * len(MEASURES))]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def map_section(matched: list, primary: str, variants: Sequence[Any]) -> MapSection | None:
    """The comparison's tying map (tying_map.tying_map) with its cells' measures, or None."""
    from .tying_map import tying_map

    tmap = tying_map(matched, primary)
    if tmap is None:
        return None
    measures = cell_measures(tmap, variants)
    return MapSection(tmap, measures, correlations(tmap, measures))


def missing_map_note(matched: list) -> list[str]:
    """Why a grid of two numeric keys has no tying map when several tied variants (tied and a
    mode, say) share a setting: the map holds one effect per cell. [] otherwise."""
    from collections import Counter

    if not matched or any(len(m.setting) != 2 for m in matched):
        return []
    per_setting = Counter(tuple(sorted(map(str, m.setting.items()))) for m in matched)
    crowded = sum(1 for n in per_setting.values() if n > 1)
    if not crowded:
        return []
    return [f"No tying map: {crowded} setting{'s have' if crowded > 1 else ' has'} more than one tied variant against "
            "its untied twin, and a map holds one effect per cell — compare one tied variant (one tying mode) at a "
            "time with the untied runs for its map"]

