"""The comparison's PNG plots: validation perplexity during training, final perplexity against
parameters, loss by frequency bucket, each contrast's effect over training (drawn by
trajectory.py); and in a grid, the tying effect per setting (against the
swept key when it is a number, and against the embedding share of parameters).

matplotlib is imported inside the functions, so that `tiedlm --help` stays instant, and used
through its object interface (a Figure on an Agg canvas), never pyplot: a library call must not
switch the caller's backend or leave figures in pyplot's registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..figures import empty_panel, figure, plain_ticks
from .comparison import Comparison
from .stats import number
from .trajectory import TRAJECTORY_PLOT, plot_trajectory
from .variants import Variant

PLOTS = {
    "curve": "perplexity_vs_tokens.png",
    "params": "perplexity_vs_params.png",
    "buckets": "bucket_loss.png",
    "trajectory": TRAJECTORY_PLOT,  # the effect of each contrast over training (trajectory.py)
}
MATCHED_PLOT = "tying_effect.png"  # written only when the comparison has matched contrasts


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
        for i, v in enumerate(c.variants):
            if not v.curve:
                continue
            color = f"C{i % 10}"
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
    with figure(path, "Final validation perplexity against parameters (seeds, geometric mean and 95% CI)") as ax:
        drawn = False
        for i, v in enumerate(c.variants):
            total = v.params.get("total")
            m = v.split("validation").perplexity if v.split("validation") else None
            if not isinstance(total, (int, float)) or not m or m.mean is None:
                continue
            color = f"C{i % 10}"
            ax.scatter([total] * len(m.values), m.values, color=color, alpha=0.35, s=18)
            yerr = None if m.ci_low is None else [[m.mean - m.ci_low], [m.ci_high - m.mean]]
            ax.errorbar([total], [m.mean], yerr=yerr, fmt="o", color=color, capsize=4, markersize=7, label=v.label)
            drawn = True
        if not drawn:
            empty_panel(ax, "no final validation perplexity or parameter counts")
            return
        ax.set_xlabel("total parameters (unique)")
        ax.set_ylabel("final validation perplexity")
        plain_ticks(ax, "x")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


def plot_buckets(c: Comparison, path: Path) -> None:
    with figure(path, "Validation loss by token frequency (mean ± SD over seeds)") as ax:
        names = c.bucket_names("validation")
        if not names:
            empty_panel(ax, "no per-bucket losses in the reports")
            return
        width = 0.8 / max(1, len(c.variants))
        for i, v in enumerate(c.variants):
            mine = {b.name: b for b in v.buckets("validation")}
            xs, ys, errs = [], [], []
            for j, n in enumerate(names):
                b = mine.get(n)
                if b and b.loss.mean is not None:
                    xs.append(j - 0.4 + width * (i + 0.5))
                    ys.append(b.loss.mean)
                    errs.append(b.loss.sd or 0.0)
            ax.bar(xs, ys, width=width, yerr=errs if any(errs) else None, capsize=3,
                   color=f"C{i % 10}", label=v.label)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_xlabel("token frequency bucket (training-set counts)")
        ax.set_ylabel("validation loss (nats per token)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)


def _effect_panel(ax: Any, xs: list[float], c: Comparison, xlabel: str, labels: list[str] | None = None,
                  annotate: bool = False) -> None:
    """The tying effect (%) with its 95% interval against xs, one point per matched contrast
    (named by its setting when annotate)."""
    for x, m in zip(xs, c.matched):
        d = m.split(c.primary)
        if d is None or d.relative is None:
            continue
        y = d.relative * 100
        yerr = None if d.relative_ci_low is None else [[y - d.relative_ci_low * 100], [d.relative_ci_high * 100 - y]]
        ax.errorbar([x], [y], yerr=yerr, fmt="o", color="C0", capsize=4, markersize=6)
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
    from .grid import numeric_key

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
