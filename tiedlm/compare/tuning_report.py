"""How a tuned comparison is shown: the tuning table (variant x point: validation perplexity and
best step, the chosen points marked), the chosen values and their edges, the tuning cost, the
verdict at the config's own (shared) point beside the tuned one, and tune_curves.png."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formatting import fmt_count, markdown_table, percent

if TYPE_CHECKING:
    from .comparison import Comparison
    from ..tuning import Tuning

TUNE_PLOT = "tune_curves.png"


def _ppl(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _seeds(tuning: Tuning) -> str:
    return f"tuning seed{'s' * (len(tuning.seeds) != 1)} {', '.join(str(s) for s in tuning.seeds)}"


def tuning_note(tuning: Tuning, primary: str) -> str:
    from ..tuning import not_compared

    if tuning.only_point is not None:
        return f"{not_compared(tuning.keys, tuning.only_point)}; the verdict is on {primary}"
    return (f"each variant at its own {', '.join(tuning.keys)}, chosen on validation ({tuning.selection}, "
            f"{_seeds(tuning)}); the verdict is on {primary}, which chose nothing")


def _not_compared(tuning: Tuning) -> str:
    from ..tuning import not_compared

    return not_compared(tuning.keys, tuning.only_point)


def _labels(tuning: Tuning) -> list[str]:
    """Every point any variant tried, in grid order (the first axis' values ascending)."""
    seen: dict[str, dict] = {}
    for v in tuning.variants:
        for p in v.points:
            seen.setdefault(p.label, p.point)
    return sorted(seen, key=lambda lab: tuple(_sort_key(x) for x in seen[lab].values()))


def _sort_key(x: Any) -> Any:
    return (0, x) if isinstance(x, (int, float)) else (1, str(x))


def table_rows(tuning: Tuning) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per variant, one column per point (validation perplexity, the
    chosen one starred), then the chosen point."""
    labels = _labels(tuning)
    chose = tuning.only_point is None  # one point: no star and no chosen column, as nothing was compared
    head = ["variant", *labels, *(["chosen"] if chose else [])]
    rows = []
    for v in tuning.variants:
        cells = []
        for lab in labels:
            p = v.point(lab)
            if p is None:
                cells.append("")
            elif p.perplexity is None:
                cells.append("failed")
            else:
                cells.append(_ppl(p.perplexity) + ("*" if chose and v.chosen is p else ""))
        rows.append([v.tag, *cells, *([v.chosen.label if v.chosen else "–"] if chose else [])])
    return head, rows


def _cost(tuning: Tuning) -> str:
    return f"{tuning.runs} tuning runs, {fmt_count(tuning.tokens)} tokens"


def _shared_sentence(c: Comparison, tuning: Tuning) -> str | None:
    s = tuning.shared
    if not s:
        return None
    if all(v.chosen is not None and v.chosen.label == s["label"] for v in tuning.variants):
        return (f"Every variant chose the config's own {s['label']}: the verdict at that shared value is the tuned "
                "verdict above.")
    tuned = next((v for v in c.variants if v.vs_baseline is not None), None)
    tuned_contrast = tuned.contrast(c.primary) if tuned is not None else None
    seeds = s.get("seeds") or []
    interval = (f" (95% CI {percent(s.get('ci_low'))} to {percent(s.get('ci_high'))}, over {len(seeds)} seeds)"
                if len(seeds) > 1 and s.get("ci_low") is not None else
                f" (seed {', '.join(str(x) for x in seeds)} only: no interval)")
    where = f"At {s['label']} for both variants: {s['variant']} {percent(s.get('relative'))} on {s['split']}{interval}"
    if tuned_contrast is None:
        return where + "."
    n = tuned_contrast.n or 0
    ci = (f"95% CI {percent(tuned_contrast.relative_ci_low)} to {percent(tuned_contrast.relative_ci_high)}"
          if tuned_contrast.relative_ci_low is not None else
          "no interval (one seed)" if n <= 1 else "no interval")
    best = f"; each at its own best: {tuned.label} {percent(tuned_contrast.relative)} ({ci})"
    return where + best + "."


def chosen_lines(tuning: Tuning) -> list[str]:
    out = []
    for v in tuning.variants:
        if v.chosen is None:
            continue
        steps = sum(v.extensions.values())
        grown = f", the grid extended {steps} step{'s' * (steps != 1)}" if steps else ""
        line = f"{v.tag}: {v.chosen.label} (validation perplexity {_ppl(v.chosen.perplexity)}{grown})"
        out.append(line + (f". Edge: {v.edge}" if v.edge else ""))
    return out


def terminal_lines(c: Comparison) -> list[str]:
    tuning = c.tuning
    if tuning is None:
        return []
    head, rows = table_rows(tuning)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths)))  # noqa: E731
    if tuning.only_point is not None:
        lines = [f"Not tuned: {_not_compared(tuning)} ({tuning.selection}; {_cost(tuning)}):"]
        return lines + ["  " + fmt(head)] + ["  " + fmt(r) for r in rows]
    lines = [f"Tuned on validation ({tuning.selection}; {', '.join(tuning.keys)}; {_cost(tuning)}):"]
    lines += ["  " + fmt(head)] + ["  " + fmt(r) for r in rows]
    lines += ["  chosen " + line for line in chosen_lines(tuning)]
    shared = _shared_sentence(c, tuning)
    if shared:
        lines.append(shared)
    return lines


def markdown(c: Comparison) -> list[str]:
    tuning = c.tuning
    if tuning is None:
        return []
    head, rows = table_rows(tuning)
    if tuning.only_point is not None:
        return ["## Tuning: one point, nothing compared", "",
                f"Not tuned: {_not_compared(tuning)}. Validation perplexity there "
                f"({tuning.selection}, {_seeds(tuning)}); the verdict above is on {c.primary}. Tuning cost: "
                f"{_cost(tuning)}.", "", markdown_table(head, rows), ""]
    out = ["## Each variant at its own setting", "",
           f"Validation perplexity of each point ({tuning.selection}, {_seeds(tuning)}); * marks each variant's "
           f"choice. The verdict above is on {c.primary}, which chose nothing. Tuning cost: {_cost(tuning)}.", ""]
    out += [markdown_table(head, rows), ""]
    out += [f"- {line}" for line in chosen_lines(tuning)]
    shared = _shared_sentence(c, tuning)
    if shared:
        out.append(f"- {shared}")
    if tuning.schedule:
        out.append(f"- The schedule keeps its shape: {', '.join(tuning.schedule)} (the config's min_lr / lr).")
    return out + ["", f"![tuning curves]({TUNE_PLOT})", ""]


def plot_tuning(tuning: Tuning, path: Path) -> None:
    """Validation perplexity against the tuned value, a line per variant, each choice ringed. One
    numeric axis: against its value (log scale when all are positive); otherwise against the points."""
    from ..figures import figure, plain_ticks

    labels = _labels(tuning)
    axes = tuning.spec.axes
    numeric = len(axes) == 1 and not any(isinstance(x, dict) for x in next(iter(axes.values())))
    key = next(iter(axes)) if numeric else None
    title = f"Tuning on validation ({tuning.selection}); ringed: each variant's choice"
    with figure(path, title) as ax:
        for v in tuning.variants:
            pts = sorted(((p, labels.index(p.label)) for p in v.points if p.perplexity is not None), key=lambda t: t[1])
            xs = [p.point[key] if numeric else i for p, i in pts]
            ax.plot(xs, [p.perplexity for p, _ in pts], marker="o", label=v.tag)
            if v.chosen is not None and v.chosen.perplexity is not None:
                x = v.chosen.point[key] if numeric else labels.index(v.chosen.label)
                ax.scatter([x], [v.chosen.perplexity], s=160, facecolors="none", edgecolors="black", zorder=3)
        if numeric:
            values = [p.point[key] for v in tuning.variants for p in v.points]
            if values and all(x > 0 for x in values):
                ax.set_xscale("log")
            ax.set_xlabel(key)
        else:
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
            ax.set_xlabel("point of the tuning grid")
        ax.set_ylabel("validation perplexity")
        ax.set_yscale("log")
        plain_ticks(ax, "y", log=True)
        ax.legend()


