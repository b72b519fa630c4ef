"""Figures written as PNG files: one matplotlib Figure on an Agg canvas per plot.

matplotlib is imported inside the functions, so that `tiedlm --help` stays instant, and used
through its object interface, never pyplot: a library call must not switch the caller's backend
or leave figures in pyplot's registry. Each PNG is written atomically (a full disk is one line).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Iterator

from .formatting import fmt_count


@contextlib.contextmanager
def figure(path: Path, title: str, panels: int = 1) -> Iterator[Any]:
    """One plot: yields its axes (a list of them with panels > 1), then titles it and writes the
    PNG atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7 if panels == 1 else 11, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots(1, panels)
    yield ax if panels == 1 else list(ax)
    if panels == 1:
        ax.set_title(title, fontsize=10)
    else:
        fig.suptitle(title, fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    from .files import atomic_write_bytes
    from .runs import AGAIN_HINT, writing

    with writing(path, AGAIN_HINT):  # a full disk is then one line, as for every run file
        atomic_write_bytes(path, buf.getvalue())


def plain_ticks(ax: Any, which: str, log: bool = False) -> None:
    """Tick labels as 60, 100, 200k, 1.2M instead of 6x10^1 or an offset 1e6."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    fmt = FuncFormatter(lambda x, _: fmt_count(x) if abs(x) >= 1000 else f"{x:g}")
    axis.set_major_formatter(fmt)
    if log:
        lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
        # minor ticks (20, 30, ..., 90) are labelled only when the axis spans little more than a decade
        axis.set_minor_formatter(fmt if lo > 0 and hi / lo < 20 else NullFormatter())


def empty_panel(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
