"""The tying map: in a two-key grid (model width × training data, say), the tying effect of each
cell on one plane, and where its sign changes.

Each cell is one matched contrast (grid.py): the tied variant against its untied twin at that
setting, on the primary split. The effect is tied / untied perplexity − 1, exp(Δloss) − 1 with
exp(CI) − 1 bounds: positive where tying hurts, negative where it helps. A cell is significant when
its 95% interval excludes zero. The crossover is the set of edges between neighbouring cells (in the
same row or column, adjacent in the sorted values) whose point estimates have opposite signs: it
follows the point estimates, so a sign change is established only where the cells on both sides
are significant, and the sentences say so. When along one key the sign changes at most once per
line of the grid, always the same way (a staircase boundary), the sentences say where tying starts
to help on each line; otherwise they list the edges.

matplotlib is imported inside plot_tying_map (through figures.figure), never at import time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from ..formatting import percent
from ..perplexity import relative
from ..config.naming import scalar, short_keys
from .grid import MatchedContrast
from .stats import ALPHA, holm, number, significant
from .surface import Surface, fit_surface

if TYPE_CHECKING:
    from .variants import SplitContrast

Cell = tuple[Any, Any]  # (row value, column value)
Edge = tuple[Cell, Cell]


@dataclass
class BucketEffect:
    """One frequency bucket's tying effect at a cell, as the cell's contrast carries it: the loss
    difference in that bucket as exp(Δ) − 1 with exp(CI) − 1 bounds, and its p-value Holm-adjusted
    over the contrast's buckets."""

    name: str  # the bucket's name in the reports: "top 10%", "rest 50%" ("... of tokens" by mass)
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_holm: float | None
    difference: float | None  # Δloss in the bucket (nats)

    @property
    def significant(self) -> bool | None:
        return significant(self.p_holm)


@dataclass
class MapCell:
    """One setting's tying effect on the map's split. `significant`: the 95% interval excludes zero
    (None when there is no interval, e.g. a single seed); effect None when the contrast has no
    value on the split."""

    effect: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    significant: bool | None
    seeds: int | None
    tied: str  # the tied variant's label
    untied: str  # the untied variant's label
    p_holm: float | None = None  # p_value adjusted by Holm over the map's cells (a family of tests)
    difference: float | None = None  # the effect on the loss scale: mean Δloss (nats), what the surface fits
    se: float | None = None  # its standard error (None with one seed)
    frequent: BucketEffect | None = None  # the most frequent bucket's effect ("top 10%"), on bucket_split
    rare: BucketEffect | None = None  # the rarest ranked bucket's effect ("rest 50%")
    at_unigram: str = ""  # "3 of 6": its runs that do not beat the unigram model (left out of surface and crossover)

    @property
    def judged(self) -> bool:
        """It has an effect from runs that beat the unigram model: it counts for the surface and the crossover."""
        return self.effect is not None and not self.at_unigram

    @property
    def sign(self) -> int:
        """+1 where tying hurts, −1 where it helps, 0 for an effect of exactly 0 or none."""
        e = self.effect
        return 0 if e is None or e == 0 else (1 if e > 0 else -1)


@dataclass
class TyingMap:
    """The tying effect over a two-key numeric grid: rows are the first key of the settings,
    columns the second, both in numeric order. `cells` lacks settings with no matched contrast;
    `crossover` lists the edges between neighbouring cells whose effects differ in sign."""

    split: str
    row_key: str
    col_key: str
    row_short: str
    col_short: str
    rows: list[Any]
    cols: list[Any]
    cells: dict[Cell, MapCell]
    crossover: list[Edge] = field(default_factory=list)
    bucket_split: str | None = None  # the split the cells' bucket effects are on (None: no buckets)
    surface: Surface | None = None  # the fitted surface over the cells
    follows: dict[str, dict] = field(default_factory=dict)  # a key an axis determines -> {"by", "values"}

    def cell(self, row: Any, col: Any) -> MapCell | None:
        return self.cells.get((row, col))

    def known(self, row: Any, col: Any) -> MapCell | None:
        """The cell when it has an effect on the split, else None (a missing cell)."""
        c = self.cells.get((row, col))
        return c if c is not None and c.effect is not None else None

    def judged(self, row: Any, col: Any) -> MapCell | None:
        """The cell when it has an effect from runs that beat the unigram model (MapCell.judged), else None."""
        c = self.cells.get((row, col))
        return c if c is not None and c.judged else None

    def name(self, cell: Cell) -> str:
        """'n_embd=128, train_fraction=0.5'."""
        return f"{self.row_short}={scalar(cell[0])}, {self.col_short}={scalar(cell[1])}"

    def significant_sides(self, edge: Edge) -> int:
        """How many of the edge's two cells are significant (0, 1 or 2)."""
        return sum(bool(self.cells[c].significant) for c in edge)

    def to_json(self) -> dict:
        """comparison.json's `tying_map`: cells as a list (JSON has no tuple keys), each edge of the
        crossover with the key it runs along and how many of its sides are significant."""
        cells = [{"row": r, "col": c, **asdict(self.cells[(r, c)])}
                 for r in self.rows for c in self.cols if (r, c) in self.cells]
        edges = [{"cells": [list(a), list(b)], "along": self.row_key if a[0] != b[0] else self.col_key,
                  "significant_sides": self.significant_sides((a, b))} for a, b in self.crossover]
        return {"split": self.split, "row_key": self.row_key, "col_key": self.col_key, "row_short": self.row_short,
                "col_short": self.col_short, "rows": list(self.rows), "cols": list(self.cols), "cells": cells,
                "crossover": edges, "bucket_split": self.bucket_split, "buckets_summary": bucket_lines(self),
                "surface": self.surface.to_json() if self.surface is not None else None, "follows": self.follows,
                "summary": self.summary_lines()}

    def summary_lines(self) -> list[str]:
        """Plain sentences: where tying helps and hurts significantly, the cells without a result,
        and where the sign changes (with whether that change is significant)."""
        return _summary(self)


# ============================================================================ building the map


def is_numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and number(v) is not None


def _bucket_effect(d: SplitContrast | None, name: str | None) -> BucketEffect | None:
    b = d.buckets.get(name) if d is not None and name else None
    if b is None:
        return None
    return BucketEffect(name=name, effect=relative(b.difference), ci_low=relative(b.ci_low), ci_high=relative(b.ci_high),
                        p_value=number(b.p_value), p_holm=number(b.p_holm), difference=number(b.difference))


def frequency_ends(names: list[str]) -> tuple[str | None, str | None]:
    """The most frequent and the rarest ranked bucket among a contrast's bucket names: the first
    named "top …" and the last named "rest …" (evaluate's names; "unseen" and "<unk>" are not ranked)."""
    top = next((n for n in names if n.startswith("top ")), None)
    rest = next((n for n in reversed(names) if n == "rest" or n.startswith("rest ")), None)
    return top, rest


def _map_cell(m: MatchedContrast, split: str, bucket_split: str | None) -> MapCell:
    d = m.split(split)
    effect = number(d.relative) if d else None
    lo, hi = (number(d.relative_ci_low), number(d.relative_ci_high)) if d and effect is not None else (None, None)
    significant = None if lo is None or hi is None else (lo > 0 or hi < 0)
    b = m.split(bucket_split) if bucket_split else None
    top, rest = frequency_ends(list(b.buckets) if b is not None else [])
    return MapCell(effect=effect, ci_low=lo, ci_high=hi, p_value=number(d.p_value) if d else None,
                   significant=significant, seeds=d.seeds if d and d.test else None, tied=m.tied, untied=m.untied,
                   difference=number(d.difference) if d and effect is not None else None,
                   se=number(d.se) if d and effect is not None else None,
                   frequent=_bucket_effect(b, top), rare=_bucket_effect(b, rest))


def _bucket_split(matched: list[MatchedContrast], split: str) -> str | None:
    """The map's split when its contrasts carry bucket differences there, else validation (as the
    report's bucket table falls back), else None."""
    for name in (split, "validation"):
        if any((d := m.split(name)) is not None and d.buckets for m in matched):
            return name
    return None


def grid_axes(matched: list[MatchedContrast], keys: list[str]) -> tuple[list[str], dict[str, dict]]:
    """The map's keys, with each non-numeric key that another key's values determine set aside (a
    paired grid axis: tokenizer.kind beside tokenizer.vocab_size): (the keys left, {key set aside:
    {"by": the key that determines it, "values": {its value: that key's values}}}). Keys are kept as they are when none is set aside."""
    follows: dict[str, dict] = {}
    left = list(keys)
    for k in keys:
        if all(is_numeric(m.setting[k]) for m in matched):
            continue
        for by in (x for x in left if x != k and all(is_numeric(m.setting[x]) for m in matched)):
            seen: dict[Any, Any] = {}
            if all(seen.setdefault(m.setting[by], m.setting[k]) == m.setting[k] for m in matched):
                values: dict[str, list] = {}
                for m in matched:
                    values.setdefault(str(m.setting[k]), []).append(m.setting[by])
                follows[k] = {"by": by, "values": {v: sorted(set(xs)) for v, xs in values.items()}}
                left.remove(k)
                break
    return left, follows


def numeric_axes(matched: list[MatchedContrast], n: int) -> tuple[list[str], dict[str, dict]] | None:
    """The grid's `n` numeric axes and the keys set aside as following them (grid_axes), where every
    setting has the same keys; None otherwise (no settings, settings with other keys, another
    number of axes, or an axis with a value that is not a number)."""
    if not matched:
        return None
    keys = list(matched[0].setting)
    if any(set(m.setting) != set(keys) for m in matched):
        return None
    keys, follows = grid_axes(matched, keys)
    if len(keys) != n or not all(is_numeric(m.setting[k]) for m in matched for k in keys):
        return None
    return keys, follows


def runs_at_unigram(m: MatchedContrast, by_label: dict[str, Any], primary: str) -> str:
    """Of a setting's two variants' runs, how many do not beat their training split's unigram model
    on primary ("3 of 6"), or "" where all do (or no variants are known): an effect between models
    that have not learned from context says nothing about tying."""
    if not by_label:
        return ""
    failing = total = 0
    for label in (m.tied, m.untied):
        v = by_label.get(label)
        metrics = v.metrics.get(primary) if v is not None else None
        failing += len(metrics.at_unigram) if metrics is not None else 0
        total += v.n_seeds if v is not None else 0
    return f"{failing} of {total}" if failing else ""


def tying_map(matched: list[MatchedContrast], primary: str, variants: Sequence[Any] = ()) -> TyingMap | None:
    """The map of the matched contrasts on the split `primary`; None unless every setting has the
    same two keys, both with numeric values, each setting has one contrast (not several tied
    variants against one untied), and at least 2 rows and 2 columns have an effect. A cell whose
    runs do not all beat the unigram model (of the `variants`) is shown but left out of the surface
    and the crossover."""
    axes = numeric_axes(matched, 2)
    if axes is None:
        return None
    (row_key, col_key), follows = axes
    keys = [row_key, col_key]
    cells: dict[Cell, MapCell] = {}
    bucket_split = _bucket_split(matched, primary)
    by_label = {v.label: v for v in variants}
    for m in matched:
        at = (m.setting[row_key], m.setting[col_key])
        if at in cells:  # two tied variants at one setting (model.untie_at): no single effect per cell
            return None
        cells[at] = _map_cell(m, primary, bucket_split)
        cells[at].at_unigram = runs_at_unigram(m, by_label, primary)
    with_effect = [at for at, c in cells.items() if c.effect is not None]
    if len({r for r, _ in with_effect}) < 2 or len({c for _, c in with_effect}) < 2:
        return None
    short = short_keys(keys)
    tmap = TyingMap(split=primary, row_key=row_key, col_key=col_key, row_short=short[row_key],
                    col_short=short[col_key], rows=sorted({r for r, _ in cells}), cols=sorted({c for _, c in cells}),
                    cells=cells, bucket_split=bucket_split, follows=follows)
    tmap.crossover = _crossover(tmap)
    order = list(cells)  # Holm over the cells: the map is one family of tests, read together
    for at, p in zip(order, holm([cells[at].p_value if cells[at].effect is not None else None for at in order])):
        cells[at].p_holm = p

    tmap.surface = fit_surface([(r, c, cell.difference, cell.se) for (r, c), cell in cells.items()
                                if cell.judged], tmap.row_short, tmap.col_short)
    return tmap


def _crossover(t: TyingMap) -> list[Edge]:
    """Edges between neighbouring cells with effects of opposite sign: along each row (to the next
    column), then up each column (to the next row), in the order of the cells."""
    edges = []
    for i, r in enumerate(t.rows):
        for j, c in enumerate(t.cols):
            here = t.judged(r, c)
            if here is None:
                continue
            for at in ((r, t.cols[j + 1]) if j + 1 < len(t.cols) else None,
                       (t.rows[i + 1], c) if i + 1 < len(t.rows) else None):
                there = t.judged(*at) if at else None
                if there is not None and here.sign * there.sign < 0:
                    edges.append(((r, c), at))
    return edges


# ============================================================================ sentences


def _effect_words(c: MapCell) -> str:
    ci = "no interval" if c.ci_low is None else f"95% CI {percent(c.ci_low)} to {percent(c.ci_high)}"
    return f"{percent(c.effect)}, {ci}"


def _significance(t: TyingMap, edge: Edge) -> str:
    n = t.significant_sides(edge)
    if n == 2:
        return "significant: both cells' intervals exclude zero"
    if n == 1:
        sig = next(c for c in edge if t.cells[c].significant)
        return (f"not established: only {t.name(sig)} is significant, the other cell's interval includes "
                "zero (or there is none)")
    return "not significant: neither cell's interval excludes zero"


def _lines_along(t: TyingMap, along_rows: bool) -> list[tuple[Any, list[Cell]]]:
    """The lines of the grid along one key: (the other key's value, its cells with a nonzero effect
    whose runs beat the unigram model, in order). along_rows: the row value changes along each line (one line per column)."""
    def signed(r: Any, c: Any) -> bool:
        return bool(t.judged(r, c) and t.cells[(r, c)].sign)

    if along_rows:
        return [(c, [(r, c) for r in t.rows if signed(r, c)]) for c in t.cols]
    return [(r, [(r, c) for c in t.cols if signed(r, c)]) for r in t.rows]


def _monotone(t: TyingMap) -> tuple[bool, int, list[tuple[Any, Edge | None, int]]] | None:
    """When, along one key (the row key first), the sign changes at most once on each line of the
    grid, always the same way, and each change is a crossover edge (no missing cell between): the
    boundary is a staircase that one sentence per line describes. Returns (along_rows, the sign on
    the low side, [(the line's value, its edge or None, its sign where it has no edge)]); None when
    neither key gives such a description."""
    edges = set(t.crossover)
    for along_rows in (True, False):
        low_sides, lines, ok = set(), [], True
        for value, cells in _lines_along(t, along_rows):
            changes = [(a, b) for a, b in zip(cells, cells[1:]) if t.cells[a].sign != t.cells[b].sign]
            if len(changes) > 1 or any(e not in edges for e in changes):
                ok = False
                break
            if changes:
                low_sides.add(t.cells[changes[0][0]].sign)
            lines.append((value, changes[0] if changes else None, t.cells[cells[0]].sign if cells else 0))
        if ok and len(low_sides) == 1:
            return along_rows, low_sides.pop(), lines
    return None


def _crossover_lines(t: TyingMap) -> list[str]:
    """Where the sign changes: per line of the grid along one key when the boundary is a staircase
    (_monotone), else edge by edge; each change with whether it is significant."""
    if not t.crossover:
        judged = [c for c in t.cells.values() if c.judged]
        left_out = any(c.effect is not None and not c.judged for c in t.cells.values())
        signs = {c.sign for c in judged} - {0}
        if len(signs) == 2:
            between = "missing cells, or cells left out for their runs at chance, lie between them" if left_out \
                else "missing cells lie between them"
            return ["The point estimates have both signs, but no two neighbouring cells with a result differ in "
                    f"sign ({between}): no crossover edge can be placed."]
        if not judged:
            return ["No crossover: no cell has a result from runs that beat the unigram model."]
        zero = any(c.effect == 0 for c in judged)
        what = "hurts" if signs == {1} else "helps" if signs == {-1} else "has no effect"
        where = "with a nonzero effect" if zero and signs else "with a result"
        where += " whose runs beat the unigram model" if left_out else ""
        return [f"No crossover: tying {what} at every cell {where} (by the point estimates)."]
    mono = _monotone(t)
    out = []
    if mono is not None:
        along_rows, low_sign, lines = mono
        key, other = (t.row_short, t.col_short) if along_rows else (t.col_short, t.row_short)
        axis = 0 if along_rows else 1
        for value, edge, sign in lines:
            where = f"- at {other}={scalar(value)}"
            if edge is None:
                state = {1: "hurts", -1: "helps"}.get(sign)
                out.append(f"{where}: no sign change (tying {state} at every {key} with a result)." if state
                           else f"{where}: no result with a sign.")
                continue
            lo, hi = edge[0][axis], edge[1][axis]
            turn = (f"tying starts to help above {key}={scalar(lo)} (hurts at {scalar(lo)}, helps at {scalar(hi)})"
                    if low_sign > 0 else
                    f"tying starts to help below {key}={scalar(hi)} (helps at {scalar(lo)}, hurts at {scalar(hi)})")
            out.append(f"{where}: {turn}; {_significance(t, edge)}.")
        out.insert(0, f"Crossover along {key} (by the point estimates, at each {other}):")
    else:
        out.append("The sign of the effect changes between these neighbouring cells (no single boundary along "
                   "either key):")
        for a, b in t.crossover:
            ea, eb = percent(t.cells[a].effect), percent(t.cells[b].effect)
            out.append(f"- {t.name(a)} ({ea}) | {t.name(b)} ({eb}): {_significance(t, (a, b))}.")
    out.append("The crossover follows the point estimates: a sign change is established only where both "
               "neighbouring cells are significant.")
    return out


def _summary(t: TyingMap) -> list[str]:
    """The lines of TyingMap.summary_lines, cells in the order of the rows, then the columns."""
    known = [((r, c), t.cells[(r, c)]) for r in t.rows for c in t.cols if t.known(r, c)]
    total = len(t.rows) * len(t.cols)
    lines = [f"Tying map on {t.split} perplexity, {t.row_short} (rows) × {t.col_short} (columns): "
             f"{len(known)} of {total} cells have a result; effect = tied / untied perplexity − 1 "
             "(negative: tying helps)."]
    for key, f in t.follows.items():
        which = "; ".join(f"{v} at {', '.join(scalar(x) for x in xs)}" for v, xs in f["values"].items())
        lines.append(f"{key} follows {f['by']} ({which}), so it is not an axis of its own.")
    for sign, verb, side in ((-1, "helps", "below"), (1, "hurts", "above")):
        hit = [f"{t.name(at)} ({_effect_words(c)})" for at, c in known if c.significant and c.sign == sign]
        lines.append(f"Tying {verb} significantly (95% CI {side} zero) at {len(hit)} of {len(known)} cells"
                     + (": " + "; ".join(hit) + "." if hit else "."))
    tested = [(at, c) for at, c in known if c.p_holm is not None]
    if tested:
        kept = [f"{t.name(at)} ({percent(c.effect)}, p_Holm={c.p_holm:.3f})" for at, c in tested if significant(c.p_holm)]
        lines.append(f"After Holm's correction over the {len(tested)} cells, {len(kept)} remain significant at "
                     f"{ALPHA:g}" + (": " + "; ".join(kept) + "." if kept else "."))
    unsure = [t.name(at) for at, c in known if not c.significant]
    if unsure:
        cells = f"{len(unsure)} cell{'s' if len(unsure) != 1 else ''}"
        lines.append(f"No significant effect at {cells}: " + "; ".join(unsure) + ".")
    missing = [t.name((r, c)) for r in t.rows for c in t.cols if t.known(r, c) is None]
    if missing:
        lines.append(f"No result on {t.split} at: " + "; ".join(missing) + ".")
    chance = [f"{t.name(at)} ({c.at_unigram} runs)" for at, c in known if c.at_unigram]
    if chance:
        lines.append(f"Left out of the surface and the crossover, their runs not beating the unigram model of their "
                     f"training split on {t.split} (an effect between models that have not learned from context "
                     "says nothing about tying): " + "; ".join(chance) + ".")
    return lines + _crossover_lines(t)


def bucket_lines(t: TyingMap) -> list[str]:
    """Where the effect sits over the cells: how often the rare bucket's effect is the larger in
    magnitude (on the loss scale), how often it is the more favourable to tying, and how many cells
    each bucket's effect is significant at (Holm over the contrast's buckets)."""
    known = [t.known(r, col) for r in t.rows for col in t.cols]
    both = [(None, c) for c in known if c is not None and c.rare is not None and c.frequent is not None
            and c.rare.difference is not None and c.frequent.difference is not None]
    if not both:
        return []
    n = len(both)
    rare, top = both[0][1].rare.name, both[0][1].frequent.name
    tie = [abs(c.rare.difference - c.frequent.difference) <= 1e-12 * max(abs(c.rare.difference), 1e-300)
           for _, c in both]  # the same effect in both buckets (to float rounding): neither is larger
    larger = sum(abs(c.rare.difference) > abs(c.frequent.difference) and not same for (_, c), same in zip(both, tie))
    lower = sum(c.rare.difference < c.frequent.difference and not same for (_, c), same in zip(both, tie))
    ties = f" ({sum(tie)} with the same effect in both)" if any(tie) else ""

    def count(b: str, sign: int) -> int:
        return sum(bool(getattr(c, b).significant) and (getattr(c, b).difference > 0) == (sign > 0) for _, c in both)

    return [f"By token frequency (on {t.bucket_split}, each bucket's effect with its own interval, p Holm-adjusted "
            f"over the buckets of its contrast): the rare bucket's ({rare}) effect is the larger in magnitude at "
            f"{larger} of {n} cells, and the lower (the more in tying's favour) at {lower} of {n}{ties}; the update-rule "
            "argument predicts the gain on rare tokens.",
            f"Tying helps the rare bucket significantly at {count('rare', -1)} of {n} cells and hurts it at "
            f"{count('rare', 1)}; the frequent bucket ({top}): helps at {count('frequent', -1)}, hurts at "
            f"{count('frequent', 1)}."]
