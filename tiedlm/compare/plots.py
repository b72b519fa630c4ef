"""The comparison's three PNG plots: validation perplexity during training, final perplexity
against parameters, loss by frequency bucket.

matplotlib is imported inside the functions, so that `tiedlm --help` stays instant, and used
through its object interface (a Figure on an Agg canvas), never pyplot: a library call must not
switch the caller's backend or leave figures in pyplot's registry.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Iterator

from ..formatting import fmt_count
from .comparison import Comparison
from .stats import number
from .variants import Variant

PLOTS = {
    "curve": "perplexity_vs_tokens.png",
    "params": "perplexity_vs_params.png",
    "buckets": "bucket_loss.png",
}


@contextlib.contextmanager
def _figure(path: Path, title: str) -> Iterator[Any]:
    """One plot: yields its axes, then titles it and writes the PNG atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    yield ax
    ax.set_title(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    from ..runs import atomic_write_bytes  # a full disk is then one line, as for every run file

    atomic_write_bytes(path, buf.getvalue())


def _plain_ticks(ax: Any, which: str, log: bool = False) -> None:
    """Tick labels as 60, 100, 200k, 1.2M instead of 6x10^1 or an offset 1e6."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    fmt = FuncFormatter(lambda x, _: fmt_count(x) if abs(x) >= 1000 else f"{x:g}")
    axis.set_major_formatter(fmt)
    if log:
        lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
        # minor ticks (20, 30, ..., 90) are labelled only when the axis spans little more than a decade
        axis.set_minor_formatter(fmt if lo > 0 and hi / lo < 20 else NullFormatter())


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _floor_ppl(variants: list[Variant]) -> float | None:
    for v in variants:
        if v.floor and v.tokenizer_kind == "word":  # a word-level floor is per token there
            return number(v.floor.get("perplexity_per_word"))
    return None


def plot_curve(c: Comparison, path: Path) -> None:
    with _figure(path, "Validation perplexity during training (mean, min–max band over seeds)") as ax:
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
            drawn = True
        if not drawn:
            _empty(ax, "no validation evaluations in metrics.jsonl (train.eval_every = 0?)")
            return
        floor = _floor_ppl(c.variants)
        if floor:
            ax.axhline(floor, color="0.3", linestyle="--", linewidth=1, label="floor (true entropy rate)")
        ax.set_yscale("log")
        _plain_ticks(ax, "x")
        _plain_ticks(ax, "y", log=True)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("validation perplexity (log scale)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)


def plot_params(c: Comparison, path: Path) -> None:
    with _figure(path, "Final validation perplexity against parameters (seeds, mean and 95% CI)") as ax:
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
            _empty(ax, "no final validation perplexity or parameter counts")
            return
        ax.set_xlabel("total parameters (unique)")
        ax.set_ylabel("final validation perplexity")
        _plain_ticks(ax, "x")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)


def plot_buckets(c: Comparison, path: Path) -> None:
    with _figure(path, "Validation loss by token frequency (mean ± SD over seeds)") as ax:
        names = c.bucket_names("validation")
        if not names:
            _empty(ax, "no per-bucket losses in the reports")
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


def write_plots(c: Comparison, out: Path) -> None:
    """The three plots, into the folder out."""
    plot_curve(c, out / PLOTS["curve"])
    plot_params(c, out / PLOTS["params"])
    plot_buckets(c, out / PLOTS["buckets"])
