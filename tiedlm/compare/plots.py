"""The comparison's PNG plots: validation perplexity during training, the compared weights'
perplexity against parameters and loss by frequency bucket (on the verdict's split), each
contrast's effect over training (drawn by trajectory.py); and in a grid, the tying effect per
setting (against the swept key when it is a number, and against the embedding share of
parameters). Each variant has one colour in every figure (variant_colors), and each figure one
caption in comparison.md (caption), which says what is drawn, on which split and which weights.

matplotlib is imported inside the functions, so that `tiedlm --help` stays instant, and used
through its object interface (a Figure on an Agg canvas), never pyplot: a library call must not
switch the caller's backend or leave figures in pyplot's registry.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..figures import empty_panel, figure, plain_ticks
from ..formatting import percent
from ..perplexity import relative
from ..config.naming import scalar
from .comparison import Comparison
from .grid import numeric_key
from .stats import ALPHA, number
from .surface import nearest
from .trajectory import ONE_SEED, SPLIT, Trajectory
from .tying_line import TyingLine, predicted
from .variants import Variant

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.image import AxesImage

    from .tying_map import TyingMap

TRAJECTORY_PLOT = "tying_effect_vs_tokens.png"  # each contrast's effect over training
PLOTS = {
    "curve": "perplexity_vs_tokens.png",
    "params": "perplexity_vs_params.png",
    "buckets": "bucket_loss.png",
    "trajectory": TRAJECTORY_PLOT,  # the effect of each contrast over training (trajectory.py computes it)
}
MATCHED_PLOT = "tying_effect.png"  # written only when the comparison has matched contrasts
TYING_MAP_PLOT = "tying_map.png"  # a two-key grid's map (tying_map.py), with its fitted zero contour (surface.py)
TYING_MAP_BUCKETS_PLOT = "tying_map_buckets.png"  # the map's frequent and rare buckets' effects, side by side
TYING_LINE_PLOT = "tying_line.png"  # a one-key numeric grid's line (tying_line.py) and its zero crossing
TUNE_PLOT = "tune_curves.png"  # a tuned comparison's validation perplexity against the tuned value


def variant_colors(c: Comparison) -> dict[str, str]:
    """The one colour of each variant, by label, in the order of the comparison's variants: every
    figure draws a variant (or its contrast with its reference) in its colour."""
    return {v.label: f"C{i % 10}" for i, v in enumerate(c.variants)}


def tuning_colors(c: Comparison) -> dict[str, str]:
    """Each tuned variant's tag (tied, untied, tied-matched, ...) -> the colour of the compared
    variant that holds the runs at its chosen point (the tuning seeds' runs are compared ones); a
    tag with no compared variant there gets the next colour no variant has."""
    colors = variant_colors(c)
    by_run = {run: colors[v.label] for v in c.variants for run in v.runs}
    out: dict[str, str] = {}
    spare = (f"C{i % 10}" for i in range(len(colors), len(colors) + 10))
    for v in c.tuning.variants if c.tuning is not None else []:
        runs = v.chosen.runs.values() if v.chosen is not None else []
        out[v.tag] = next((by_run[r] for r in runs if r in by_run), None) or colors.get(v.tag) or next(spare)
    return out


def weights_words(select: str) -> str:
    """The compared weights, as a caption or a title says them (--select best or final)."""
    return "each run's best weights (its best validation evaluation)" if select == "best" else "each run's last weights"


def bucket_split(c: Comparison) -> str:
    """The split of the loss by frequency bucket, figure and table: the verdict's (the primary
    split) where the runs scored buckets there, else validation."""
    return c.primary if c.bucket_names(c.primary) else "validation"


def captions(c: Comparison) -> dict[str, str]:
    """comparison.md's sentence under each figure, by file name: what is drawn, on which split, and
    which weights (the compared ones: --select best or final; or the weights as they trained)."""
    weights = weights_words(c.select)
    split = bucket_split(c)
    elsewhere = f" ({c.primary}, the verdict's split, has no per-bucket losses)" if split != c.primary else ""
    out = {
        PLOTS["curve"]: "Validation perplexity at every periodic evaluation during training (the weights as they "
                        "trained, on the evaluation slice `train.eval_tokens`): the geometric mean over each "
                        "variant's seeds with a band from the lowest to the highest seed, on a log scale, and a "
                        "triangle at each run's best evaluation.",
        PLOTS["params"]: f"{c.primary.capitalize()} perplexity of {weights} against the model's total parameters: "
                         "a faint dot per seed, and the geometric mean over the seeds with its 95% interval.",
        PLOTS["buckets"]: f"{split.capitalize()} loss (nats per token) of {weights} in each token-frequency bucket "
                          f"(the vocabulary ranked by training-set count){elsewhere}, mean ± SD over the seeds, a "
                          "bar per variant.",
        TRAJECTORY_PLOT: "Each contrast's effect, exp(Δloss) − 1, at every periodic evaluation during training, on "
                         "the validation slice scored then (the weights as they trained), with its 95% interval as "
                         f"a band; the verdict is on {c.primary}, with {weights}.",
    }
    if c.matched:
        key = numeric_key(c.matched) or "the setting"
        out[MATCHED_PLOT] = (f"The tying effect on {c.primary} perplexity of {weights}, exp(Δloss) − 1 with its 95% "
                             f"interval, a point per setting: against {key} (left) and the embedding share V·d of "
                             "the untied model's parameters (right).")
    if c.tying_map is not None:
        t = c.tying_map.tmap
        out[TYING_MAP_PLOT] = (f"The tying effect on {t.split} perplexity of {weights} in each cell of the "
                               f"{t.row_short} × {t.col_short} grid (blue: tying helps, red: tying hurts), with its "
                               "95% interval and the sign changes along the cell edges.")
        out[TYING_MAP_BUCKETS_PLOT] = (f"The tying effect on {t.bucket_split or t.split} loss of {weights} in the most "
                                       "frequent bucket (left) and the rare bucket (right) of each cell.")
    if c.tying_line is not None:
        out[TYING_LINE_PLOT] = (f"The tying effect on {c.primary} perplexity of {weights} at each {c.tying_line.short}, "
                                "with its 95% interval, the line fitted in log2 of the key (weighted by 1/se²), and "
                                "where it crosses zero with Fieller's 95% interval of the crossing.")
    if c.tuning is not None:
        tuning = c.tuning
        seeds = tuning.seeds
        over = (f"tuning seed {seeds[0]}" if len(seeds) == 1 else
                f"mean over tuning seeds {', '.join(map(str, seeds))}")
        keys = ", ".join(tuning.keys)
        out[TUNE_PLOT] = (f"Validation perplexity of every point of the tuning ({keys}; {tuning.selection}, {over}), "
                          "a line per variant, and a ring at each variant's choice.")
    return out


def _floor_ppl(variants: list[Variant]) -> tuple[float, str] | None:
    """The validation split's own floor (per token, whatever the tokenizer) and its label; None
    for runs that recorded none (the expected rate alone is no bound, so it is not drawn)."""
    for v in variants:
        split = ((v.floor or {}).get("splits") or {}).get("validation")
        if split and number(split.get("perplexity")) is not None:
            return split["perplexity"], split.get("label") or "split floor"
    return None


def plot_curve(c: Comparison, path: Path) -> None:
    with figure(path, "Validation perplexity during training (mean, min–max band over seeds)") as ax:
        drawn = False
        colors = variant_colors(c)
        for v in c.variants:
            if not v.curve:
                continue
            color = colors[v.label]
            x = [p.tokens for p in v.curve]
            ax.plot(x, [p.mean for p in v.curve], color=color, label=f"{v.label} (n={v.n_seeds})")
            if v.n_seeds > 1:
                ax.fill_between(x, [p.min for p in v.curve], [p.max for p in v.curve], color=color, alpha=0.2,
                                linewidth=0)
            if v.best_points:  # each run's best evaluation, on its own curve
                ax.scatter([t for t, _ in v.best_points], [p for _, p in v.best_points], color=color, marker="v",
                           s=30, zorder=3, edgecolors="black", linewidths=0.5)
            drawn = True
        if any(v.best_points for v in c.variants):
            ax.scatter([], [], color="0.6", marker="v", edgecolors="black", linewidths=0.5,
                       label="best evaluation of each run")
        if not drawn:
            empty_panel(ax, "no validation evaluations in metrics.jsonl (train.eval_every = 0?)")
            return
        floor = _floor_ppl(c.variants)
        if floor:
            ax.axhline(floor[0], color="0.3", linestyle="--", linewidth=1,
                       label=f"{floor[1]} (the true model on validation)")
        ax.set_yscale("log")
        plain_ticks(ax, "x")
        plain_ticks(ax, "y", log=True)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("validation perplexity (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)


def plot_params(c: Comparison, path: Path) -> None:
    """The compared weights' perplexity on the verdict's split against the total parameter count."""
    split = c.primary
    title = (f"{split.capitalize()} perplexity of {weights_words(c.select).split(' (')[0]} against parameters "
             "(seeds, geometric mean and 95% CI)")
    with figure(path, title) as ax:
        drawn = False
        colors = variant_colors(c)
        for v in c.variants:
            total = v.params.get("total")
            m = v.split(split).perplexity if v.split(split) else None
            if not isinstance(total, (int, float)) or not m or m.mean is None:
                continue
            color = colors[v.label]
            ax.scatter([total] * len(m.values), m.values, color=color, alpha=0.35, s=18)
            yerr = None if m.ci_low is None else [[m.mean - m.ci_low], [m.ci_high - m.mean]]
            ax.errorbar([total], [m.mean], yerr=yerr, fmt="o", color=color, capsize=4, markersize=7, label=v.label)
            drawn = True
        if not drawn:
            empty_panel(ax, f"no {split} perplexity or parameter counts")
            return
        ax.set_xlabel("total parameters (unique)")
        ax.set_ylabel(f"{split} perplexity")
        plain_ticks(ax, "x")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


def plot_buckets(c: Comparison, path: Path) -> None:
    """The loss of each frequency bucket on the verdict's split (bucket_split), a bar per variant."""
    split = bucket_split(c)
    title = (f"{split.capitalize()} loss by token frequency, {weights_words(c.select).split(' (')[0]} "
             "(mean ± SD over seeds)")
    with figure(path, title) as ax:
        names = c.bucket_names(split)
        if not names:
            empty_panel(ax, "no per-bucket losses in the reports")
            return
        width = 0.8 / max(1, len(c.variants))
        colors = variant_colors(c)
        for i, v in enumerate(c.variants):
            mine = {b.name: b for b in v.buckets(split)}
            xs, ys, errs = [], [], []
            for j, n in enumerate(names):
                b = mine.get(n)
                if b and b.loss.mean is not None:
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(b.loss.mean)
                    errs.append(b.loss.sd or 0.0)
            ax.bar(xs, ys, width=width, yerr=errs if any(errs) else None, capsize=3,
                   color=colors[v.label], label=v.label)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_xlabel("token frequency bucket (training-set counts)")
        ax.set_ylabel(f"{split} loss (nats per token)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)


def _effect_panel(ax: Axes, xs: list[float], c: Comparison, xlabel: str, labels: list[str] | None = None,
                  annotate: bool = False) -> None:
    """The tying effect (%) with its 95% interval against xs, one point per matched contrast in its
    tied variant's colour (named by its setting when annotate)."""
    colors = variant_colors(c)
    for x, m in zip(xs, c.matched):
        d = m.split(c.primary)
        if d is None or d.relative is None:
            continue
        y = d.relative * 100
        yerr = None if d.relative_ci_low is None else [[y - d.relative_ci_low * 100], [d.relative_ci_high * 100 - y]]
        ax.errorbar([x], [y], yerr=yerr, fmt="o", color=colors.get(m.tied, "C0"), capsize=4, markersize=6)
        if annotate:
            ax.annotate(m.label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7, color="0.3")
    ax.axhline(0.0, color="0.3", linewidth=1, linestyle="--")
    if labels is not None:
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"tying effect on {c.primary} perplexity (%)")
    ax.grid(True, alpha=0.3)


def plot_tying_effect(c: Comparison, path: Path) -> None:
    """Tied against untied per setting: against the swept key (numeric, else by setting) and the
    embedding share V·d / untied total. Negative: tying is better."""

    title = "Tying effect per setting: exp(Δloss) − 1 with 95% CI (negative: tying better)"
    with figure(path, title, panels=2) as (left, right):
        key = numeric_key(c.matched)
        if key is not None:
            xs = [float(m.setting[key]) for m in c.matched]
            _effect_panel(left, xs, c, key)
            if len(set(xs)) > 1 and min(xs) > 0 and max(xs) / min(xs) >= 8:
                left.set_xscale("log", base=2)
                plain_ticks(left, "x")
        else:
            _effect_panel(left, list(range(len(c.matched))), c, "setting", [m.label for m in c.matched])
        shares = [m.embedding_share for m in c.matched]
        if all(s is not None for s in shares):
            _effect_panel(right, [s * 100 for s in shares], c, "embedding share V·d / untied parameters (%)",
                          annotate=True)
        else:
            empty_panel(right, "no parameter counts in the reports")


def write_plots(c: Comparison, out: Path) -> None:
    """The plots, into the folder out (the tying-effect plot only with matched contrasts)."""
    plot_curve(c, out / PLOTS["curve"])
    plot_params(c, out / PLOTS["params"])
    plot_buckets(c, out / PLOTS["buckets"])
    plot_trajectory(c, out / PLOTS["trajectory"])
    if c.matched:
        plot_tying_effect(c, out / MATCHED_PLOT)


# ============================================================================ the effect over training


def _is_tying(c: Comparison) -> bool:
    """Every contrast is a tied variant against an untied one."""
    by_label = {v.label: v for v in c.variants}
    return bool(c.trajectories) and all(by_label[t.variant].tied and by_label[t.reference].tied is False
                                        for t in c.trajectories.values() if t.variant in by_label
                                        and t.reference in by_label)


def _draw(ax: Axes, t: Trajectory, color: str, label: str) -> None:
    pts = [p for p in t.points if p.effect is not None]
    xs = [p.tokens for p in pts]
    ax.plot(xs, [p.effect * 100 for p in pts], color=color, marker="o", markersize=3, label=label)
    band = [p for p in pts if p.ci_low is not None]
    if band:
        ax.fill_between([p.tokens for p in band], [p.ci_low * 100 for p in band], [p.ci_high * 100 for p in band],
                        color=color, alpha=0.2, linewidth=0)
    if t.crossover:
        ax.scatter([t.crossover.tokens], [0.0], color=color, marker="X", s=70, zorder=4, edgecolors="black",
                   linewidths=0.5)
        ax.annotate(t.crossover.text, (t.crossover.tokens, 0.0), textcoords="offset points", xytext=(6, 8),
                    fontsize=7, color="0.25")


def _draw_verdict(ax: Axes, d: Any, t: Trajectory, color: str) -> int:
    """The verdict's effect (its split, its weights) with its 95% interval as a diamond at the end
    of the contrast's validation line: 1 when drawn, 0 when the contrast has none."""
    if d is None or d.relative is None or not t.points:
        return 0
    x = t.points[-1].tokens
    low = None if d.relative_ci_low is None else (d.relative - d.relative_ci_low) * 100
    high = None if d.relative_ci_high is None else (d.relative_ci_high - d.relative) * 100
    ax.errorbar([x], [d.relative * 100], yerr=[[low], [high]] if low is not None and high is not None else None,
                color=color, marker="D", markersize=6, markeredgecolor="black", capsize=3, zorder=5)
    return 1


def plot_trajectory(c: Comparison, path: Path) -> None:
    """tying_effect_vs_tokens.png: the effect (%) against tokens seen, a line and a 95% band per
    contrast, the zero line, each crossover marked."""
    what = "Tying effect" if _is_tying(c) else "Effect"
    better = "tying" if what == "Tying effect" else "the variant"
    title = f"{what} over training on validation: exp(Δloss) − 1 with 95% CI (negative: {better} is better)"
    with figure(path, title) as ax:
        shown = [(v, c.trajectories[v.label]) for v in c.variants if v.label in c.trajectories
                 and c.trajectories[v.label].points]
        if not shown:
            empty_panel(ax, "no contrast with periodic validation evaluations shared by every run")
            return
        matched = {m.tied: m.label for m in c.matched}
        colors = variant_colors(c)
        for v, t in shown:  # each contrast in its variant's colour
            _draw(ax, t, colors[v.label], matched.get(v.label) or f"{t.variant} vs {t.reference}")
        verdicts = 0
        if c.primary != SPLIT or c.select == "best":  # the verdict's own point, on its split, where it stands apart
            for v, t in shown:
                verdicts += _draw_verdict(ax, v.contrast(c.primary), t, colors[v.label])

        if any(t.crossover for _, t in shown):
            ax.scatter([], [], color="0.6", marker="X", edgecolors="black", linewidths=0.5,
                       label="crossover (the last change of sign)")
        ax.axhline(0.0, color="0.3", linewidth=1, linestyle="--")
        plain_ticks(ax, "x")
        ax.set_xlabel("tokens seen")
        ax.set_ylabel(f"{what.lower()} on perplexity (%): lines validation" + (f", ◆ {c.primary}" if verdicts else ""))
        notes = [ONE_SEED] if all(p.ci_low is None for _, t in shown for p in t.points) else []
        if c.select == "best" or c.primary != SPLIT:
            notes.append(f"◆ the verdict on {c.primary}" + (" (kept best weights)" if c.select == "best" else "")
                         + " with its 95% CI, at the end of each line; only validation is evaluated during training")
        if notes:
            ax.text(0.01, 0.01, "; ".join(notes), transform=ax.transAxes, fontsize=7, color="0.35", va="bottom")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


# ============================================================================ the tying line


def plot_tying_line(line: TyingLine, primary: str, path: Path) -> None:
    """tying_line.png: the effect (%) at each setting of a one-key grid with its 95% interval, on a
    log2 axis of the key, the fitted line (dashed past the measured range, to the crossing), the
    zero line, and the crossing with Fieller's 95% interval as a bar along zero (an arrow where it
    is unbounded on a side). Written atomically."""

    title = f"Tying effect on {primary} perplexity against {line.short} (negative: tying helps)"
    with figure(path, title) as ax:
        shown = [(x, lo, hi) for x, lo, hi in line.intervals if lo is not None and hi is not None]
        if not line.points and not shown:
            empty_panel(ax, "no setting with an effect and an interval")
            return
        for x, d, _ in line.points:
            ax.scatter([x], [100 * relative(d)], color="tab:blue", s=30, zorder=3)
        left_out = {x for x, _ in line.unlearned}
        for x, lo, hi in shown:
            ax.plot([x, x], [100 * relative(lo), 100 * relative(hi)], color="0.6" if x in left_out else "tab:blue",
                    linewidth=1.5)
        for i, (x, d) in enumerate(p for p in line.unlearned if p[1] is not None):
            ax.scatter([x], [100 * relative(d)], facecolors="none", edgecolors="0.4", s=30, zorder=3,
                       label="not fitted: runs not beating the unigram model" if i == 0 else None)
        xs = [p[0] for p in line.points] or [x for x, _, _ in shown]
        lo_x, hi_x = min(xs), max(xs)
        if line.slope is not None:
            ends = [lo_x, hi_x]
            grid = [lo_x * (hi_x / lo_x) ** (i / 50) for i in range(51)] if hi_x > lo_x else ends
            ax.plot(grid, [100 * relative(predicted(line, x)) for x in grid], color="tab:orange", linewidth=1.5,
                    label=f"fit: {line.slope:+.4f} nats per doubling")
            if line.crossing is not None and not lo_x <= line.crossing <= hi_x and hi_x > lo_x:
                far = [hi_x, line.crossing] if line.crossing > hi_x else [line.crossing, lo_x]
                span = [far[0] * (far[1] / far[0]) ** (i / 30) for i in range(31)]
                ax.plot(span, [100 * relative(predicted(line, x)) for x in span], color="tab:orange",
                        linewidth=1, linestyle="--")
        if line.crossing is not None:
            ax.scatter([line.crossing], [0.0], color="tab:orange", marker="X", s=70, zorder=4, edgecolors="black",
                       linewidths=0.5, label=f"crossing ≈ {line.crossing:,.3g}")
            if line.bounded:
                left = line.low if line.low is not None else min(lo_x, line.crossing) / 4
                right = line.high if line.high is not None else max(hi_x, line.crossing) * 4
                ax.plot([left, right], [0.0, 0.0], color="tab:orange", linewidth=4, alpha=0.35,
                        label="its 95% interval (Fieller)" + ("; an arrow: unbounded" if None in (line.low, line.high)
                                                              else ""))
                for end, bounded, sign in ((left, line.low is not None, -1), (right, line.high is not None, 1)):
                    if not bounded:
                        ax.annotate("", xy=(end * (2.0 ** sign), 0.0), xytext=(end, 0.0),
                                    arrowprops={"arrowstyle": "->", "color": "tab:orange"})
        ax.axhline(0.0, color="0.3", linewidth=1, linestyle="--")
        ax.set_xscale("log", base=2)
        plain_ticks(ax, "x", log=True)
        ax.set_xlabel(line.short)
        ax.set_ylabel(f"tying effect on {primary} perplexity (%)")
        ax.grid(True, alpha=0.3)
        if line.slope is not None or line.unlearned:
            ax.legend(fontsize=8)


# ============================================================================ the tying map


def plot_tying_map(tmap: TyingMap, path: Path) -> None:
    """tying_map.png: the effect per cell on a diverging colormap centred at 0 (red: tying hurts,
    blue: tying helps), each cell annotated with its effect and 95% interval, significant cells
    framed and starred, missing cells hatched grey, the crossover drawn along the cell edges
    (solid where both sides are significant, dashed otherwise). Written atomically."""
    title = f"Tying effect on {tmap.split} perplexity: tied / untied − 1 (negative: tying helps)"
    with figure(path, title) as ax:
        draw_tying_map(ax, tmap)


def draw_tying_map(ax: Axes, t: TyingMap) -> None:
    """The map on the axes ax (cell (row i, column j) centred at x=j, y=i), with its colorbar and legend."""
    import numpy as np
    from matplotlib import patheffects
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter

    nr, nc = len(t.rows), len(t.cols)
    data = np.full((nr, nc), np.nan)
    for i, r in enumerate(t.rows):
        for j, c in enumerate(t.cols):
            cell = t.known(r, c)
            if cell is not None:
                data[i, j] = cell.effect
    vmax = float(np.nanmax(np.abs(data))) or 0.01
    im = ax.imshow(np.ma.masked_invalid(data), cmap="RdBu_r", vmin=-vmax, vmax=vmax, origin="lower", aspect="auto")
    size = 8 if max(nr, nc) <= 4 else 6 if max(nr, nc) <= 7 else 4
    for i, r in enumerate(t.rows):
        for j, c in enumerate(t.cols):
            cell = t.known(r, c)
            if cell is None:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.85", edgecolor="0.6", hatch="//",
                                       linewidth=0))
                ax.text(j, i, "no result", ha="center", va="center", fontsize=size, color="0.35")
                continue
            ci = "no CI" if cell.ci_low is None else f"{percent(cell.ci_low, 1)} to {percent(cell.ci_high, 1)}"
            star = "*" if cell.significant else ""
            dark = abs(cell.effect) > 0.6 * vmax
            ax.text(j, i, f"{percent(cell.effect, 1)}{star}\n{ci}", ha="center", va="center", fontsize=size,
                    color="white" if dark else "black", fontweight="bold" if cell.significant else "normal")
            if cell.significant:
                ax.add_patch(Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, edgecolor="black", linewidth=2.5))
            if cell.at_unigram:  # shown, but left out of the surface and the crossover
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="0.4", hatch="..",
                                       linewidth=0))
    stroke = [patheffects.withStroke(linewidth=6, foreground="black")]
    for a, b in t.crossover:
        (i1, j1), (i2, j2) = [(t.rows.index(r), t.cols.index(c)) for r, c in (a, b)]
        if i1 == i2:  # neighbours in a row: the vertical edge between them
            xs, ys = [max(j1, j2) - 0.5] * 2, [i1 - 0.5, i1 + 0.5]
        else:
            xs, ys = [j1 - 0.5, j1 + 0.5], [max(i1, i2) - 0.5] * 2
        ax.plot(xs, ys, color="gold", linewidth=4, solid_capstyle="butt", path_effects=stroke, zorder=5,
                linestyle="-" if t.significant_sides((a, b)) == 2 else (0, (2, 1.2)))
    ax.set_xlim(-0.5, nc - 0.5)
    ax.set_ylim(-0.5, nr - 0.5)
    _label_map_axes(ax, t)
    bar = ax.figure.colorbar(im, ax=ax)
    bar.set_label(f"tying effect on {t.split} perplexity")
    bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: percent(x, 1) if abs(x) > 1e-12 else "0%"))
    handles = [Patch(facecolor="white", edgecolor="black", linewidth=2.5, label="* 95% CI excludes 0"),
               Patch(facecolor="0.85", edgecolor="0.6", hatch="//", label="no result"),
               *([Patch(facecolor="white", edgecolor="0.4", hatch="..", linewidth=0,
                        label="runs not beating the unigram model: not fitted")]
                 if any(c.at_unigram for c in t.cells.values()) else []),
               Line2D([], [], color="gold", linewidth=4, path_effects=stroke,
                      label="sign change, both sides significant"),
               Line2D([], [], color="gold", linewidth=4, linestyle=(0, (2, 1.2)), path_effects=stroke,
                      label="sign change, not significant on both sides")]
    if t.surface is not None and t.surface.fitted:
        _draw_surface(ax, t, handles)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7,
              title="red: tying hurts, blue: tying helps; each cell: effect, then its 95% CI", title_fontsize=7)


def _to_index(values: list[Any], logs: np.ndarray | list[float]) -> np.ndarray:
    """log2 axis values -> the map's index coordinate (cell k at k): piecewise linear between the
    measured values, extended linearly past the ends."""
    import numpy as np

    m = np.log2(np.asarray(values, dtype=float))
    x = np.asarray(logs, dtype=float)
    k = np.arange(len(m), dtype=float)
    out = np.interp(x, m, k)
    out = np.where(x < m[0], (x - m[0]) / (m[1] - m[0]), out)
    return np.where(x > m[-1], len(m) - 1 + (x - m[-1]) / (m[-1] - m[-2]), out)


def _draw_surface(ax: Axes, t: TyingMap, handles: list) -> None:
    """The fitted zero contour (black, white-edged) and its 95% Fieller band (grey) on the map, in
    index coordinates; a note at the bottom when the line lies outside the drawn cells."""
    import numpy as np
    from matplotlib import patheffects
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    s = t.surface
    if not all(isinstance(v, (int, float)) and v > 0 for v in [*t.rows, *t.cols]) or min(len(t.rows), len(t.cols)) < 2:
        return
    solved_vals, free_vals = (t.cols, t.rows) if s.solved == "col" else (t.rows, t.cols)
    pts = [p for p in s.contour if p.log_value is not None]
    band = [p for p in s.contour if p.bounded]
    stroke = [patheffects.withStroke(linewidth=3.5, foreground="white")]
    n_solved = len(solved_vals)

    def place(free: list[float], solved: list[float]) -> tuple[Any, Any]:
        f, v = _to_index(free_vals, np.log2(free)), np.asarray(solved, dtype=float)
        return (v, f) if s.solved == "col" else (f, v)  # (x, y): columns run along x

    if band:
        edge_lo, edge_hi = -0.5 - 1e3, n_solved - 0.5 + 1e3  # an unbounded side runs off the axes
        lo = [edge_lo if p.low is None else float(_to_index(solved_vals, [math.log2(p.low)])[0]) for p in band]
        hi = [edge_hi if p.high is None else float(_to_index(solved_vals, [math.log2(p.high)])[0]) for p in band]
        f = _to_index(free_vals, np.log2([p.at for p in band]))
        if s.solved == "col":
            ax.fill_betweenx(f, lo, hi, color="0.2", alpha=0.18, linewidth=0, zorder=4)
        else:
            ax.fill_between(f, lo, hi, color="0.2", alpha=0.18, linewidth=0, zorder=4)
    visible = False
    if pts:
        x, y = place([p.at for p in pts], list(_to_index(solved_vals, [p.log_value for p in pts])))
        ax.plot(x, y, color="black", linewidth=2, linestyle=(0, (6, 2, 1, 2)), path_effects=stroke, zorder=6)
        nx, ny = len(t.cols), len(t.rows)
        visible = bool(np.any((x >= -0.5) & (x <= nx - 0.5) & (y >= -0.5) & (y <= ny - 0.5)))
    if not visible:
        near = nearest(s)
        solved, free = (t.col_short, t.row_short) if s.solved == "col" else (t.row_short, t.col_short)
        where = (f": nearest {solved} ≈ {near.value:.3g} at {free}={scalar(near.at)}" if near is not None
                 else ": no sign change near the map")
        ax.text(0.01, 0.01, f"fitted zero contour outside the drawn cells{where}",
                transform=ax.transAxes, fontsize=7, color="0.1", va="bottom",
                bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0})
    handles += [Line2D([], [], color="black", linewidth=2, linestyle=(0, (6, 2, 1, 2)), path_effects=stroke,
                       label="fitted zero contour (WLS on log2 axes)"),
                Patch(facecolor="0.2", alpha=0.18, label="its 95% band (Fieller; unshaded: unbounded)")]


def plot_tying_map_buckets(tmap: TyingMap, path: Path) -> None:
    """tying_map_buckets.png: the frequent and the rare bucket's effect per cell, side by side on one
    diverging scale (blue: tying helps), * where the bucket's Holm-adjusted p is below ALPHA. Written
    atomically; an empty panel says so when the cells carry no bucket effects."""
    split = tmap.bucket_split or tmap.split
    title = (f"Tying effect per frequency bucket on {split}: exp(Δloss) − 1 in the bucket "
             f"(* Holm-adjusted over the contrast's buckets, p < {ALPHA:g})")
    with figure(path, title, panels=2) as (left, right):
        values = [getattr(c, b).effect for c in tmap.cells.values() for b in ("frequent", "rare")
                  if getattr(c, b) is not None and getattr(c, b).effect is not None]
        if not values:
            empty_panel(left, "no per-bucket differences in the contrasts")
            empty_panel(right, "no per-bucket differences in the contrasts")
            return
        vmax = max(abs(v) for v in values) or 0.01
        for ax, which in ((left, "frequent"), (right, "rare")):
            im = _bucket_panel(ax, tmap, which, vmax)
        from matplotlib.ticker import FuncFormatter

        bar = left.figure.colorbar(im, ax=[left, right])
        bar.set_label("tying effect in the bucket")
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: percent(x, 1) if abs(x) > 1e-12 else "0%"))


def _bucket_panel(ax: Axes, t: TyingMap, which: str, vmax: float) -> AxesImage:
    """One bucket's effects as a heatmap (cell (row i, column j) at x=j, y=i); returns the image."""
    import numpy as np

    nr, nc = len(t.rows), len(t.cols)
    data = np.full((nr, nc), np.nan)
    name = None
    for i, r in enumerate(t.rows):
        for j, c in enumerate(t.cols):
            cell = t.known(r, c)
            b = getattr(cell, which) if cell is not None else None
            if b is None or b.effect is None:
                ax.text(j, i, "no result", ha="center", va="center", fontsize=7, color="0.35")
                continue
            name = b.name
            data[i, j] = b.effect
            star = "*" if b.significant else ""
            ax.text(j, i, f"{percent(b.effect, 1)}{star}", ha="center", va="center", fontsize=8,
                    color="white" if abs(b.effect) > 0.6 * vmax else "black",
                    fontweight="bold" if b.significant else "normal")
    im = ax.imshow(np.ma.masked_invalid(data), cmap="RdBu_r", vmin=-vmax, vmax=vmax, origin="lower", aspect="auto")
    ax.set_facecolor("0.85")
    _label_map_axes(ax, t)
    ax.set_title(f"{which}: {name}" if name else which, fontsize=9)
    return im


# ============================================================================ the tuning


def plot_tuning(c: Comparison, path: Path) -> None:
    """The comparison's tuning (c.tuning): validation perplexity against the tuned value, a line per
    variant in its colour (tuning_colors), each choice ringed. One numeric axis: against its value
    (log scale when all are positive), ticked at the values tried; train.lr and one other key:
    against lr, a line per variant and value of the other key (the chosen value's drawn solid);
    otherwise against the points. The perplexity axis ends at a labelled tick at or above the top
    point."""
    tuning = c.tuning
    colors = tuning_colors(c)
    labels = tuning.labels()
    axes = tuning.spec.axes
    plain = not any(isinstance(x, dict) for vals in axes.values() for x in vals)
    numeric = plain and (len(axes) == 1 or (len(axes) == 2 and "train.lr" in axes))
    key = (next(iter(axes)) if len(axes) == 1 else "train.lr") if numeric else None
    other = next((k for k in axes if k != key), None) if numeric else None  # two keys: a line per its value
    title = f"Tuning on validation ({tuning.selection}); ringed: each variant's choice"
    with figure(path, title) as ax:
        from matplotlib.ticker import NullLocator

        for v in tuning.variants:
            color = colors[v.tag]
            pts = sorted(((p, labels.index(p.label)) for p in v.points if p.perplexity is not None), key=lambda t: t[1])
            chose = v.chosen.point.get(other) if v.chosen is not None and other else None
            if numeric and pts and all(p.point[key] is None for p, _ in pts):  # a key its tie lacks (untied)
                ax.axhline(min(p.perplexity for p, _ in pts), color=color, linestyle="--",
                           label=f"{v.tag} (no {key.rsplit('.', 1)[-1]})")
                continue
            ats = {p.point[other] for p, _ in pts} if other else {None}
            for k, at in enumerate(sorted(ats - {None}) + ([None] if None in ats else [])):
                line = sorted(((p, j) for p, j in pts if other is None or p.point[other] == at),
                              key=lambda t: t[0].point[key] if numeric else t[1])
                xs = [p.point[key] if numeric else j for p, j in line]
                ax.plot(xs, [p.perplexity for p, _ in line], marker="osv^D<>"[k % 7], color=color,
                        alpha=1.0 if other is None or at == chose else 0.45,
                        label=v.tag if other is None or at is None else f"{v.tag}, {other.rsplit('.', 1)[-1]}={scalar(at)}")
            if v.chosen is not None and v.chosen.perplexity is not None:
                x = v.chosen.point[key] if numeric else labels.index(v.chosen.label)
                ax.scatter([x], [v.chosen.perplexity], s=160, facecolors="none", edgecolors="black", zorder=3)
        if numeric:
            values = sorted({p.point[key] for v in tuning.variants for p in v.points if p.point[key] is not None})
            if values and all(x > 0 for x in values):
                ax.set_xscale("log")
                ax.xaxis.set_minor_locator(NullLocator())
            if values:  # each value tried, by its own name (0.37, not a decade's 10^-1)
                ax.set_xticks(values)
                ax.set_xticklabels([scalar(x) for x in values], rotation=30 if len(values) > 6 else 0, fontsize=8)
            ax.set_xlabel(key)
        else:
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
            ax.set_xlabel("point of the tuning grid")
        ax.set_ylabel("validation perplexity (log scale)")
        ax.set_yscale("log")
        plain_ticks(ax, "y", log=True)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7 if other else None)


def _label_map_axes(ax: Axes, t: TyingMap) -> None:
    """A map's cells on integer positions, labelled by the two keys' values."""
    ax.set_xticks(range(len(t.cols)))
    ax.set_xticklabels([scalar(c) for c in t.cols])
    ax.set_yticks(range(len(t.rows)))
    ax.set_yticklabels([scalar(r) for r in t.rows])
    ax.set_xlabel(t.col_short)
    ax.set_ylabel(t.row_short)
