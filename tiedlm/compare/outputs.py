"""Where a comparison goes: comparison.md, .csv, .json and the plots written into its folder
(atomically, recorded as tiedlm's), and the check, before anything is trained or written, that
the folder may take them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from .comparison import Comparison
from .plots import (
    MATCHED_PLOT,
    TUNE_PLOT,
    TYING_LINE_PLOT,
    TYING_MAP_BUCKETS_PLOT,
    TYING_MAP_PLOT,
    plot_tuning,
    plot_tying_line,
    plot_tying_map,
    plot_tying_map_buckets,
    write_plots,
)
from .report import FILES, to_csv, to_json_text, to_markdown
from ..files import atomic_write_text, check_foreign, recording
from ..runs import AGAIN_HINT, writing

OVERWRITE_OPTION = "--overwrite-output"  # the CLI option that replaces files tiedlm did not write


def write_outputs(c: Comparison, out: Path, overwrite: bool = False) -> None:
    """comparison.md, .csv, .json and the plots into out (each written atomically); c.files says where.
    They are recorded there as tiedlm's (files.recording): a file of one of their names that tiedlm
    did not write is refused unless `overwrite`, before anything is written."""

    out = Path(out)
    c.files = {k: str(out / v) for k, v in FILES.items()}
    if c.matched:
        c.files["plot_tying_effect"] = str(out / MATCHED_PLOT)
    if c.tying_map is not None:
        c.files["plot_tying_map"] = str(out / TYING_MAP_PLOT)
        c.files["plot_tying_map_buckets"] = str(out / TYING_MAP_BUCKETS_PLOT)
    if c.tying_line is not None:
        c.files["plot_tying_line"] = str(out / TYING_LINE_PLOT)
    if c.tuning is not None:
        c.files["plot_tuning"] = str(out / TUNE_PLOT)
    names = [Path(f).name for f in c.files.values()]
    with recording(out, names, OVERWRITE_OPTION, overwrite):
        write_plots(c, out)
        if c.tying_map is not None:
            plot_tying_map(c.tying_map.tmap, out / TYING_MAP_PLOT)
            plot_tying_map_buckets(c.tying_map.tmap, out / TYING_MAP_BUCKETS_PLOT)
        if c.tying_line is not None:
            plot_tying_line(c.tying_line, c.primary, out / TYING_LINE_PLOT)
        if c.tuning is not None:
            plot_tuning(c, out / TUNE_PLOT)
        for kind, render in (("csv", to_csv), ("markdown", to_markdown), ("json", to_json_text)):
            text = render(c)
            with writing(out / FILES[kind], AGAIN_HINT):  # its runs are finished: nothing to resume
                atomic_write_text(out / FILES[kind], text)


def replaced_note(c: Comparison, out: Path) -> str | None:
    """What an earlier comparison in `out` compared, when it was of other runs: the line that says
    it is replaced (never silently), naming a few of them and how to keep comparisons apart."""
    path = Path(out) / FILES["json"]
    try:
        before = {r.get("name") for r in json.loads(path.read_text(encoding="utf-8")).get("runs", [])
                  if isinstance(r, dict)}
    except (OSError, ValueError, AttributeError):
        return None  # none there, or not one tiedlm can read: check_outputs has refused what is not tiedlm's
    now = {r.name for r in c.runs}
    gone = sorted(n for n in before - now if isinstance(n, str))
    if not gone:
        return None
    shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    return (f"replaced the comparison in {out}, which compared other runs ({shown}) — give --out DIR to keep "
            "each comparison in a folder of its own")


def check_outputs(out: Path, run_dirs: Iterable[Path] = (), analyze: bool = False, overwrite: bool = False) -> None:
    """Refuse, before anything is trained or written, a comparison folder inside a run's managed
    parts, files there of the comparison's names that tiedlm did not write, and with `analyze` such
    files of the analysis' names in the run folders (a grid's tying-effect plot, and an untied
    run's pair-cosine plot, are checked again when they are written)."""
    from ..analyze import check_target
    from ..runs.checkpoints import check_outside_runs

    check_outside_runs(out, "--out")
    check_foreign(out, FILES.values(), OVERWRITE_OPTION, overwrite)
    for d in run_dirs if analyze else ():
        check_target(Path(d), overwrite, OVERWRITE_OPTION, is_out=False)
