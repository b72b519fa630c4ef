"""Judge finished runs: tied against untied, across seeds, with intervals, on one primary endpoint.
It takes run folders and returns a `Comparison`; it trains nothing and imports nothing from
experiment/, which runs what compare --config asks and hands the folders here (`judge`, with what
training `Found`). Mid-plan, the planner asks one thing through one call: `glance`, the primary
contrast of the runs so far (for the sequential design's looks and the verdict at the shared value).

What is judged
    matching      --match params / params:width: the tied model grown (deeper, or wider) to the untied
                  one's parameters, and the two contrasts against untied judged by Holm (MatchFamily)
    tuned         a tuning as the judge reads it (TuneSpec, Tuning, JointEffect) and a tuned sweep's
                  record beside its runs (tuning.json, read_record)
Computing
    collect       find run folders and read finished runs (through runs/); which weights are compared
    datasets      group runs by the tokens they were trained and evaluated on
    variants      variants, labels, the baseline, aggregates over seeds, contrasts on the loss
    grid          matched contrasts: each tied variant against its untied twin in a grid
    comparison    build_comparison and the Comparison it returns (what comparison.json holds)
    trajectory    each contrast's effect at every periodic evaluation: crossover, still moving
    tying_map     a two-key grid's map of the effect, its crossover and the map's own sentences
    map_measures  the untied pairs' matrix measures beside each cell of the map
    between       two comparisons' effects against each other (scripts/effect_difference.py)
Statistics
    stats         every test, interval and correction: t and noncentral t, paired and Welch tests,
                  Holm, Spearman, power; `significant`, the one place significance is decided
    sequential    --seeds auto: the alpha-spending design's boundaries (pure maths), its looks (judged
                  by stats.significant at the adjusted level) and its record, Sequential
Rendering
    verdicts      the sentences: verdict on the primary endpoint, confirmation, seeds needed, FLOPs
    report        comparison.md / .csv / .json and the terminal table (the sections in order)
    sections      the text of the effect over training, the sequential design and the tuning
    plots         every figure: the curves, the effect over training, the tying map, the tuning
    outputs       writing every file into the comparison folder, and the check before anything is

compare_runs compares runs that exist (experiment.compare_config trains a config's variants first,
then calls judge). Both write comparison.md, comparison.csv, comparison.json and the plots
(atomically) and return the Comparison.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..config.checks import check_log_to, check_split
from ..config.naming import comparison_folder, common_name
from ..errors import ConfigError, TiedlmError
from ..process import log
from ..runs import FolderLock
from .collect import (
    COMPARE_DIR,
    SELECT,
    LeftOut,
    LoadedRun,
    choose_weights,
    discover,
    load_runs,
    no_runs_error,
    overtrained_notes,
)
from .comparison import Comparison, TrainFailure, build_comparison
from .grid import MatchedContrast
from .guards import guard_warnings, ignored_record_warning, protocol_differences, protocol_line
from .matching import ParamMatch
from .outputs import OVERWRITE_OPTION, check_outputs, own_name, replaced_note, write_outputs
from .plots import MATCHED_PLOT, PLOTS, TRAJECTORY_PLOT, TYING_MAP_PLOT
from .report import format_terminal_table
from .sections import tuning_note
from .sequential import Sequential
from .tuned import Tuning, TuningRecord, read_record, tuned_keys
from .tying_map import TyingMap
from .variants import Contrast, SplitContrast, Variant
from .verdicts import adjust_grid, verdicts_for

# What a user of the library calls and reads: the entry points, the outputs, the result's types
# and the names of the files written. Everything else is imported from its module (compare.stats, ...).
__all__ = [
    "compare_runs", "judge", "judge_runs", "glance", "Judging", "Found", "Glance", "check_outputs", "write_outputs",
    "format_terminal_table",
    "Comparison", "Variant", "Contrast", "SplitContrast", "MatchedContrast", "TyingMap", "TrainFailure",
    "COMPARE_DIR", "PLOTS", "MATCHED_PLOT", "TRAJECTORY_PLOT", "TYING_MAP_PLOT",
]


DEFAULT_RUNS = Path("runs")  # the runs folder where none is given (--out)


@dataclass
class Judging:
    """How finished runs are judged: which weights (`select`), on which split (`primary`), against
    which variant (`baseline`), and where the comparison goes (`out`, default
    runs_dir/compare-EXPERIMENT, `experiment` the name its runs share);
    `paths` are the runs to compare (run folders, folders of runs, or globs; None: every run under
    `runs_dir`). `analyze` analyses each run's two matrices first; `overwrite_output` replaces
    files of the outputs' names that tiedlm did not write."""

    paths: list[str | Path] | None = None
    select: str | None = None
    primary: str | None = None
    baseline: str | None = None
    runs_dir: Path | None = None  # None: runs/, or with `paths`, the folder every run found lies in
    out: Path | None = None
    analyze: bool = False
    overwrite_output: bool = False
    log_to: list[str] | None = None  # trackers for the summary run; None: those the runs logged to
    experiment: str | None = None  # the name the runs share (naming.common_name), for the default folder

    @property
    def folder(self) -> Path:
        """Where the comparison is written: `out`, else runs_dir/compare-EXPERIMENT, a folder of
        each experiment's own, so that one comparison never replaces another's by default."""
        if self.out is not None:
            return Path(self.out)
        return Path(self.runs_dir or DEFAULT_RUNS) / comparison_folder(self.experiment or common_name([]))

    def of_runs(self, run_dirs: list) -> tuple[Judging, str | None]:
        """This judging with its experiment named after the runs found (unless it has a folder
        already: `out`, or a config's `experiment`), and the line saying where it went when the
        folder of that name holds another comparison (outputs.own_name)."""
        if self.experiment is not None or self.out is not None:
            return self, None
        name, note = own_name(self.runs_dir, [Path(d).name for d in run_dirs])
        return dataclasses.replace(self, experiment=name), note

    @property
    def option(self) -> str:
        """The command-line option that chose the folder: --into, else --out (the runs folder it is in)."""
        return "--into" if self.out is not None else "--out"

    def check(self) -> Judging:
        """Refuse (ConfigError) what cannot be judged, before any file is read; returns self."""
        self.runs_dir = Path(self.runs_dir) if self.runs_dir is not None else None
        if self.primary is not None:
            check_split(self.primary, "--primary")
        if self.log_to is not None:
            check_log_to(self.log_to, "--log-to")
        if self.select is not None and self.select not in SELECT:
            raise ConfigError(f"--select {self.select!r} is not known — choose best (each run's kept best weights) "
                              "or final (the last weights)")
        if self.baseline is not None and (not str(self.baseline).strip() or "\n" in str(self.baseline)):
            raise ConfigError(f"--baseline {self.baseline!r} names no variant — give a variant's label or a run's name")
        return self


@dataclass
class Found:
    """What training and tuning found, for the judging of their runs: the parameter match (--match
    params), the runs that failed to train (name -> error), the tuning, the sequential design's
    record, a tuned sweep's record (tuning.json), every run trained or found finished, and why the
    comparison's folder is not the one its runs' name gives."""

    match: ParamMatch | None = None
    failed: dict[str, str] = field(default_factory=dict)
    tuning: Tuning | None = None
    sequential: Sequential | None = None
    record: TuningRecord | None = None
    record_note: str | None = None  # why a tuned compare --config left no tuning.json
    trained: list[str] | None = None  # every run it trained or found finished, compared or not (tuning's too)
    folder_note: str | None = None  # why the comparison went to a folder of its own (outputs.own_name)


def compare_runs(paths: list[str | Path] | None = None, runs_dir: Path | None = None,
                 out: Path | None = None, baseline: str | None = None, primary: str | None = None,
                 select: str | None = None, analyze: bool = False, overwrite_output: bool = False) -> Comparison:
    """Compare finished runs (run folders, folders of runs, or globs; default: every run under
    runs_dir). Writes comparison.md/.csv/.json and plots to `out` (default runs_dir/compare-NAME, NAME
    the name the runs share) and
    returns the comparison. Unfinished or unreadable runs are listed in its `skipped`. `primary`
    is the split whose loss carries the verdict (train, validation or test; default validation, or
    test when the best weights are compared). `select` is "best" (the weights each run kept at its
    best validation evaluation), "final" (the last weights) or None: best when every run kept them.
    `analyze` first analyses each run's two matrices (tiedlm analyze) for the report's section on them.
    Files of the outputs' names that tiedlm did not write are refused (check_outputs) unless
    `overwrite_output`."""
    return judge_runs(Judging(paths=list(paths) if paths else None, runs_dir=runs_dir, out=out, baseline=baseline,
                              primary=primary, select=select, analyze=analyze, overwrite_output=overwrite_output))


def judge_runs(judging: Judging) -> Comparison:
    """compare_runs: the runs found, a tuned sweep's folder compared at each point's chosen values."""
    judging.check()
    run_dirs, missing = discover(judging.paths, judging.runs_dir or DEFAULT_RUNS, judging.out)
    if judging.runs_dir is None:  # beside the runs compared, where they share a folder; else runs/
        parents = {Path(d).parent for d in run_dirs} if judging.paths else set()
        judging = dataclasses.replace(judging, runs_dir=parents.pop() if len(parents) == 1 else DEFAULT_RUNS)
    named = [d.name for d in run_dirs]  # the runs that name the comparison's folder (Judging.of_runs)
    paths = judging.paths
    # a tuned sweep's folder, compared whole: each grid point at its chosen values (tuning.json)
    folder = judging.runs_dir if not paths else Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    record = read_record(folder, run_dirs) if folder is not None and run_dirs else None
    tuned = record is not None and record.usable
    if tuned:
        if judging.primary == "validation":
            raise ConfigError(f"these runs were tuned on validation ({record.folder}/tuning.json), so the verdict is "
                              "on test — drop --primary validation")
        chosen = set(record.chosen)
        missing += [LeftOut(str(d), d.name, "a tuning run at a value its variant did not choose (tuning.json)")
                    for d in run_dirs if d.name not in chosen]
        found = {d.name for d in run_dirs}
        missing += [LeftOut(str(record.folder / n), n, "chosen by the tuning (tuning.json), but not there")
                    for n in record.chosen if n not in found]
        run_dirs = [d for d in run_dirs if d.name in chosen]
    judging = dataclasses.replace(judging, primary=judging.primary or ("test" if tuned else None))
    while True:  # the folder is chosen again once held: another command may have written it meanwhile
        chosen, kept = judging.of_runs(named)
        with FolderLock(chosen.folder):
            if chosen.folder == judging.of_runs(named)[0].folder:
                return _judge_held(run_dirs, missing, chosen, Found(record=record, folder_note=kept))


def judge(run_dirs: list[Path], left_out: list[LeftOut], judging: Judging, found: Found) -> Comparison:
    """Read, judge and write the comparison of run_dirs (`left_out`: runs already set aside, and
    why), its folder held throughout: never beside another writer's files."""
    with FolderLock(judging.folder):
        return _judge_held(run_dirs, left_out, judging, found)


def _judge_held(run_dirs: list[Path], left_out: list[LeftOut], req: Judging, found: Found) -> Comparison:
    out, tuning, record = req.folder, found.tuning, found.record
    runs, skipped = load_runs(run_dirs, left_out, found.failed)
    check_outputs(out, [Path(r.path) for r in runs], req.analyze, req.overwrite_output, req.option)  # before any write
    if req.analyze:
        runs = [_analyzed(r, req.overwrite_output) for r in runs]
    runs, left, select, why, primary = choose_weights(runs, req.select, req.primary)
    skipped += left
    if not runs:
        raise no_runs_error(run_dirs, skipped, req.runs_dir)
    tuned = tuned_keys(tuning) or (record.keys if record is not None else [])
    c = build_comparison(runs, skipped, req.baseline, str(out), found.match, primary, tuned=tuned)
    c.select, c.select_reason = select, why
    c.trained = len(found.trained) if found.trained is not None else None
    c.warnings += guard_warnings(runs, c.primary)
    c.at_chance = {r.name for r in runs if r.at_unigram(c.primary)}  # a contrast of only these gets no verdict
    one_point = tuning is not None and tuning.only_point is not None
    chosen = [] if one_point else (tuning.keys if tuning is not None else record.keys if record is not None else [])
    c.protocol = protocol_line(protocol_differences(select, c.primary, list(chosen), [v.n_seeds for v in c.variants],
                                                    one_point))
    if record is not None:
        c.notes += record.notes()
        c.warnings += ignored_record_warning(record.ignored, primary)
    if tuning is not None:
        c.tuning = tuning
        c.notes.append(tuning_note(tuning, primary))
    if found.record_note:
        c.notes.append(found.record_note)
    c.notes += overtrained_notes(runs, select) + [r.analysis_note for r in runs if r.analysis_note]
    adjust_grid(c)  # a grid's settings judged as one family (Holm), as its tying line and map judge them
    for v in c.variants:
        v.verdicts = verdicts_for(v, c)
    if found.sequential is not None:  # --seeds auto: the primary contrast judged at the design's adjusted level
        found.sequential.apply(c)
    c.replaced = replaced_note(c, out) or found.folder_note
    write_outputs(c, out, req.overwrite_output)
    _log_summary(c, runs, req.log_to)
    return c


def _log_summary(c: Comparison, runs: list[LoadedRun], log_to: list[str] | None) -> None:
    """The comparison as a summary run in the trackers asked for (or that its runs logged to),
    grouped under the name its runs share (the folder's name where they differ)."""
    targets = log_to if log_to is not None else sorted({t for r in runs for t in r.config.train.log_to})
    if not any(t != "tensorboard" for t in targets):  # TensorBoard has no summary run (compare --tensorboard)
        return
    from ..trackers.live import log_comparison

    names = {r.config.name for r in runs}
    group = names.pop() if len(names) == 1 else Path(c.out).name
    for line in log_comparison(targets, c.to_json(), dict(c.files), group):
        log(line)


def _analyzed(run: LoadedRun, overwrite_output: bool = False) -> LoadedRun:
    """The run with a fresh analysis of its final checkpoint (tiedlm analyze, into its folder)."""
    from ..analyze import analyze_run

    analysis = analyze_run(run.path, overwrite=overwrite_output, overwrite_option=OVERWRITE_OPTION)
    return dataclasses.replace(run, analysis=analysis, analysis_note=None)


# ============================================================================ asked mid-plan


@dataclass
class Glance:
    """The primary contrast of the runs trained so far, judged as the final comparison judges it
    but not written: the variant set against the baseline (with --match, tied at equal
    architecture against untied), the baseline's label, the contrast on `split`, and the seeds
    the runs judged have."""

    variant: str
    baseline: str
    split: str
    contrast: SplitContrast
    seeds: list[int]


def glance(run_dirs: list[Path], judging: Judging, found: Found, primary: str | None,
           same_seeds: bool = False) -> Glance | None:
    """What the planner asks the judging side mid-plan, in one call: the primary contrast of
    run_dirs (those that exist), judged with `found`'s failures, match and tuning on `primary` (None:
    the default), or None when there is nothing to contrast. `same_seeds` keeps only the seeds every
    variant has (paired by seed, as the tuned verdict is): the verdict at the shared value."""
    runs, skipped = load_runs([d for d in run_dirs if d.is_dir()] if same_seeds else list(run_dirs), [],
                              found.failed)
    if same_seeds:
        by_variant: dict[str, set[int]] = {}
        for r in runs:
            by_variant.setdefault(r.config_hash, set()).add(r.seed)
        shared = set.intersection(*by_variant.values()) if len(by_variant) > 1 else set()
        runs, skipped = [r for r in runs if r.seed in shared], []
    if not runs:
        return None
    try:
        runs, left, _, _, primary = choose_weights(runs, judging.select, primary)
        c = build_comparison(runs, skipped + left, judging.baseline, str(judging.folder), found.match, primary,
                             tuned=tuned_keys(found.tuning)) if runs else None
    except TiedlmError:
        return None  # the final comparison says why
    picked = c.primary_contrast() if c is not None else None
    if picked is None:
        return None
    variant, contrast = picked
    return Glance(variant.label, c.baseline_label, primary, contrast, sorted({r.seed for r in runs}))
