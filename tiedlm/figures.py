"""Figures written as PNG files: one matplotlib Figure on an Agg canvas per plot.

matplotlib is imported inside the functions, so that `tiedlm --help` stays instant, and used
through its object interface, never pyplot: a library call must not switch the caller's backend
or leave figures in pyplot's registry. Each PNG is written atomically (a full disk is one line).
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from .formatting import fmt_count
from .files import atomic_write_bytes
from .runs import AGAIN_HINT, writing

if TYPE_CHECKING:
    from matplotlib.axes import Axes


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

    with writing(path, AGAIN_HINT):  # a full disk is then one line, as for every run file
        atomic_write_bytes(path, buf.getvalue())


def plain_ticks(ax: Axes, which: str, log: bool = False) -> None:
    """Tick labels as 60, 100, 200k, 1.2M instead of 6x10^1 or an offset 1e6. A log axis (`log`,
    called once everything is drawn) is labelled by its span (log_ticks) and ends at labelled
    ticks at or beyond its highest and lowest points, so that both can be read off the axis."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    fmt = FuncFormatter(lambda x, _: fmt_count(x) if abs(x) >= 1000 else f"{x:g}")
    axis.set_major_formatter(fmt)
    if log:
        axis.set_minor_formatter(NullFormatter())  # the labelled ticks are the major ones
        _log_axis(ax, which)


TOLERANCE = 1.02  # a labelled tick this close to the highest (lowest) point counts as at it: 200 for 201.6


def log_ticks(lo: float, hi: float) -> list[float]:
    """The labelled ticks of a log axis over the data lo..hi (both > 0), one step past each end:
    1-9 × 10^k when it spans less than 20×, 1-2-5 × 10^k up to 1000×, the decades beyond; evenly
    spaced round values where that leaves fewer than two ticks in lo..hi (a span of a few percent)."""
    span = hi / lo
    mults = (1, 2, 3, 4, 5, 6, 7, 8, 9) if span < 20 else (1, 2, 5) if span < 1000 else (1,)
    first, last = math.floor(math.log10(lo)), math.floor(math.log10(hi))
    ticks = sorted(float(f"{m}e{k}") for k in range(first, last + 2) for m in mults)
    if sum(1 for t in ticks if lo <= t <= hi) < 2:
        from matplotlib.ticker import MaxNLocator

        ticks = [float(t) for t in MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if t > 0]
    inside = [t for t in ticks if lo <= t <= hi]
    below = [t for t in ticks if t < lo][-1:]
    above = [t for t in ticks if t > hi][:1]
    return below + inside + above


def _log_axis(ax: Axes, which: str) -> None:
    """A log axis' labelled ticks (log_ticks of its data), its view widened to the first of them at
    or above the highest point and at or below the lowest one."""
    from matplotlib.ticker import FixedLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    box = ax.dataLim
    lo, hi = (box.x0, box.x1) if which == "x" else (box.y0, box.y1)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        return  # nothing positive drawn: matplotlib's own ticks
    view_lo, view_hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    if lo == hi and 0 < view_lo < view_hi:  # one value: the view matplotlib opened around it
        lo, hi = view_lo, view_hi
    ticks = log_ticks(lo, hi)
    axis.set_major_locator(FixedLocator(ticks))
    top = min((t for t in ticks if t * TOLERANCE >= hi), default=view_hi)
    bottom = max((t for t in ticks if t <= lo * TOLERANCE), default=view_lo)
    (ax.set_xlim if which == "x" else ax.set_ylim)(min(view_lo, bottom), max(view_hi, top))


def empty_panel(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
