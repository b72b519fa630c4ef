"""Where a comparison goes: comparison.md, .csv, .json and the plots written into its folder
(atomically, recorded as tiedlm's), and the check, before anything is trained or written, that
the folder may take them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable

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
from ..config.naming import common_name, comparison_folder, is_run_of
from ..errors import ConfigError
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


def compared_names(out: Path, skipped: bool = False) -> set | None:
    """The names of the runs the comparison in `out` compared (with `skipped`, and those it left
    out), None when it holds none tiedlm can read."""
    try:
        data = json.loads((Path(out) / FILES["json"]).read_text(encoding="utf-8"))
        entries = data.get("runs", []) + (data.get("skipped", []) if skipped else [])
        return {r.get("name") for r in entries if isinstance(r, dict)}
    except (OSError, ValueError, AttributeError, TypeError):
        return None  # none there, or not one tiedlm can read: check_outputs has refused what is not tiedlm's


def _kept_apart(runs_dir: Path, name: str, ours: Callable[[set], bool], key: list[str]) -> tuple[str, str | None]:
    """(the name of a comparison's folder, the line saying why it is not the one asked for):
    `name`, so that it goes to runs_dir/compare-NAME, where that folder holds no comparison or one
    that `ours` claims (its run names); else compare-NAME-HASH, HASH of `key`, so that the other
    comparison is kept, said once (not again once the folder of its own holds this one)."""
    folder = Path(runs_dir) / comparison_folder(name)
    before = compared_names(folder, skipped=True)
    if before is None or ours(before):
        return name, None
    own = f"{name}-{hashlib.sha256(' '.join(key).encode()).hexdigest()[:8]}"
    there = compared_names(Path(runs_dir) / comparison_folder(own), skipped=True)
    if there is not None and ours(there):
        return own, None
    return own, (f"{folder} holds a comparison of other runs, left as it is: this one is in "
                 f"{Path(runs_dir) / comparison_folder(own)} — give --into DIR to name its folder")


def own_name(runs_dir: Path, names: list[str]) -> tuple[str, str | None]:
    """The folder name of a comparison of the runs `names` that was not given a folder: the name
    they share (naming.common_name), unless its folder holds a comparison of another set of runs
    (another experiment's, or more or fewer of these): then that name and a hash of these names."""
    return _kept_apart(runs_dir, common_name(names), lambda before: before == set(names), sorted(names))


def config_folder_name(runs_dir: Path, prefix: str, tags: list[str]) -> tuple[str, str | None]:
    """compare --config's folder name: its runs' prefix, where it replaces an earlier comparison of
    its own runs (fewer seeds, say), unless that folder holds a comparison of runs not all of this
    experiment (naming.is_run_of: a sweep's, runs compared by name): then the prefix and a hash."""
    return _kept_apart(runs_dir, prefix, lambda before: all(isinstance(n, str) and is_run_of(n, prefix, tags)
                                                            for n in before), [prefix, *tags])


def replaced_note(c: Comparison, out: Path) -> str | None:
    """What an earlier comparison in `out` compared, when it was of other runs: the line that says
    it is replaced (never silently), naming a few of them and how to keep comparisons apart."""
    before = compared_names(out)
    if before is None:
        return None
    now = {r.name for r in c.runs}
    gone = sorted(n for n in before - now if isinstance(n, str))
    if not gone:
        return None
    shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    return (f"replaced the comparison in {out}, which compared other runs ({shown}) — give --into DIR to keep "
            "each comparison in a folder of its own")


def check_outputs(out: Path, run_dirs: Iterable[Path] = (), analyze: bool = False, overwrite: bool = False,
                  option: str = "--out") -> None:
    """Refuse, before anything is trained or written, a comparison folder inside a run's managed
    parts, files there of the comparison's names that tiedlm did not write, and with `analyze` such
    files of the analysis' names in the run folders (a grid's tying-effect plot, and an untied
    run's pair-cosine plot, are checked again when they are written). `option`: the one that chose
    the folder, named in the refusal."""
    from ..analyze import check_target
    from ..runs.checkpoints import check_outside_runs, is_run_folder

    check_outside_runs(out, option)  # --into where the folder was given, else --out, which it lies in
    if is_run_folder(Path(out)):
        raise ConfigError(f"{out} is the folder of the run {Path(out).name}, and a comparison goes into a folder of "
                          f"its own — give --into another folder (--into {Path(out).parent / 'compare-mine'})")
    check_foreign(out, FILES.values(), OVERWRITE_OPTION, overwrite)
    for d in run_dirs if analyze else ():
        check_target(Path(d), overwrite, OVERWRITE_OPTION, is_out=False)
