"""Compare runs: tied against untied, across seeds, with intervals, on one primary endpoint.

What was asked, and the runs it takes
    plan          CompareRequest: every option, checked once; compare --config's variants × points ×
                  seeds, trained a stage at a time through jobs.Executor (tuning.TuningSearch, then
                  sequential.SeedDesign); Found: what training and tuning found
    matching      --match params / params:width: the tied model grown (deeper, or wider) to the untied
                  one's parameters, and the two contrasts against untied judged by Holm (MatchFamily)
Computing
    collect       find run folders and read finished runs (through runs.py); which weights are compared
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
    sequential    --seeds auto: the alpha-spending design, its looks (judged by stats.significant
                  at the adjusted level) and SeedDesign, which says which seeds to train next
Rendering
    verdicts      the sentences: verdict on the primary endpoint, confirmation, seeds needed, FLOPs
    report        comparison.md / .csv / .json and the terminal table (the sections in order)
    sections      the text of the effect over training, the sequential design and the tuning
    plots         every figure: the curves, the effect over training, the tying map, the tuning
    outputs       writing every file into the comparison folder, and the check before anything is

compare_runs compares runs that exist; compare_config trains the tied and untied variants of a
config first; both build a CompareRequest and call compare(). They write comparison.md,
comparison.csv, comparison.json and the plots (atomically) and return the Comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..tuning import tuned_keys
from .collect import COMPARE_DIR, LeftOut, LoadedRun, choose_weights, discover, load_runs, no_runs_error, overtrained_notes
from .comparison import Comparison, TrainFailure, build_comparison
from .grid import MatchedContrast
from .guards import guard_warnings, protocol_differences, protocol_line
from .outputs import OVERWRITE_OPTION, check_outputs, replaced_note, write_outputs
from .plan import CompareRequest, Found, train_for_comparison
from .plots import MATCHED_PLOT, PLOTS  # noqa: F401 (the file names, for users)
from .report import format_terminal_table
from .plots import TRAJECTORY_PLOT, TYING_MAP_PLOT
from .sections import tuning_note
from .tying_map import TyingMap
from .variants import Contrast, SplitContrast, Variant
from .verdicts import verdicts_for

# What a user of the library calls and reads: the two entry points, the outputs, the result's types
# and the names of the files written. Everything else is imported from its module (compare.stats, ...).
__all__ = [
    "compare_runs", "compare_config", "compare", "CompareRequest", "check_outputs", "write_outputs",
    "format_terminal_table",
    "Comparison", "Variant", "Contrast", "SplitContrast", "MatchedContrast", "TyingMap", "TrainFailure",
    "COMPARE_DIR", "PLOTS", "MATCHED_PLOT", "TRAJECTORY_PLOT", "TYING_MAP_PLOT",
]


def compare_runs(paths: list[str | Path] | None = None, runs_dir: Path = Path("runs"),
                 out: Path | None = None, baseline: str | None = None, primary: str | None = None,
                 select: str | None = None, analyze: bool = False, overwrite_output: bool = False) -> Comparison:
    """Compare finished runs (run folders, folders of runs, or globs; default: every run under
    runs_dir). Writes comparison.md/.csv/.json and plots to `out` (default runs_dir/compare) and
    returns the comparison. Unfinished or unreadable runs are listed in its `skipped`. `primary`
    is the split whose loss carries the verdict (train, validation or test; default validation, or
    test when the best weights are compared). `select` is "best" (the weights each run kept at its
    best validation evaluation), "final" (the last weights) or None: best when every run kept them.
    `analyze` first analyses each run's two matrices (tiedlm analyze) for the report's section on them.
    Files of the outputs' names that tiedlm did not write are refused (check_outputs) unless
    `overwrite_output`."""
    return compare(CompareRequest(paths=list(paths) if paths else None, runs_dir=runs_dir, out=out, baseline=baseline,
                                  primary=primary, select=select, analyze=analyze, overwrite_output=overwrite_output))


def compare_config(cfg_path: str | Path, overrides: list[str] | None = None, **options: Any) -> Comparison:
    """Train the tied and untied variants of a config (seeds cfg.seed .. cfg.seed+seeds-1; finished
    runs are reused) and compare exactly those runs; `options` are CompareRequest's fields. match=
    "params" adds a tied variant with extra layers whose total is as close as possible to the untied
    one's, "params:width" one with n_embd grown by the head size instead; the matched variant is
    tuned like the others, and the verdict has both contrasts against untied (tied at equal
    architecture, the primary one, and matched at equal parameters), Holm-adjusted over the two.
    Training failures do not stop the others; they are listed in the result's
    train_failures and among the runs left out. `train` trains one run (train.train_run, the
    default, or a stand-in with its signature). `overwrite` retrains runs whose folders hold another
    config; `overwrite_output` replaces files of the outputs' names that tiedlm did not write
    (check_outputs, before anything is trained). `tune` (`--tune KEY=V1,V2,...`, over the config's
    tune: block) tunes each variant on validation first and compares each at its own chosen value,
    on test (tuning.py). `seeds="auto"` adds seeds only while the verdict is undecided
    (sequential.py: from 3 per variant up to `max_seeds`, stopping for efficacy at the design's
    adjusted level, or for futility once the smallest detectable effect is below `min_effect`);
    with tuning, for the seeds at the chosen values. `jobs` (--jobs): train that many runs at once,
    each in its own process, or "auto" (parallel.py); 1 trains them one after another in this process."""
    return compare(CompareRequest(config=cfg_path, overrides=list(overrides or []), **options))


def compare(req: CompareRequest) -> Comparison:
    """The comparison a request asks for: of the runs it names, or of a config's variants, trained
    first (plan.train_for_comparison); the request is checked before anything is read."""
    import dataclasses

    from ..runs import FolderLock
    from ..tuning import read_tune_block, spec_from_options

    req.check()
    if req.config is None:
        return _compare_existing(req)
    spec = spec_from_options(req.tune, read_tune_block(req.config))
    # Held from before the first run is trained until the comparison is written: a second command
    # comparing into the same folder waits, then finds every run trained (skipped) and compares the
    # whole set, instead of failing on the runs this one is training and comparing the rest.
    with FolderLock(req.folder):
        dirs, found = train_for_comparison(req, spec)
        if spec is not None:
            req = dataclasses.replace(req, primary=req.primary or "test")
        c = _compare(dirs, [], req, found)
    c.train_failures = [TrainFailure(n, e) for n, e in found.failed.items()]
    return c


def _compare_existing(req: CompareRequest) -> Comparison:
    """compare_runs: the runs found, a tuned sweep's folder compared at each point's chosen values."""
    import dataclasses

    from ..tuning_record import read_record

    run_dirs, missing = discover(req.paths, req.runs_dir, req.folder)
    paths = req.paths
    # a tuned sweep's folder, compared whole: each grid point at its chosen values (tuning.json)
    folder = req.runs_dir if not paths else Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    record = read_record(folder, run_dirs) if folder is not None and run_dirs else None
    tuned = record is not None and record.usable
    if tuned:
        if req.primary == "validation":
            raise ConfigError(f"these runs were tuned on validation ({record.folder}/tuning.json), so the verdict is "
                              "on test — drop --primary validation")
        chosen = set(record.chosen)
        missing += [LeftOut(str(d), d.name, "a tuning run at a value its variant did not choose (tuning.json)")
                    for d in run_dirs if d.name not in chosen]
        found = {d.name for d in run_dirs}
        missing += [LeftOut(str(record.folder / n), n, "chosen by the tuning (tuning.json), but not there")
                    for n in record.chosen if n not in found]
        run_dirs = [d for d in run_dirs if d.name in chosen]
    req = dataclasses.replace(req, primary=req.primary or ("test" if tuned else None))
    return _compare(run_dirs, missing, req, Found(record=record))


def _compare(run_dirs: list[Path], left_out: list[LeftOut], req: CompareRequest, found: Found) -> Comparison:
    """Read, judge and write the comparison of run_dirs, its folder held throughout: never beside
    another writer's files."""
    from ..runs import FolderLock

    with FolderLock(req.folder):
        return _compare_held(run_dirs, left_out, req, found)


def _compare_held(run_dirs: list[Path], left_out: list[LeftOut], req: CompareRequest, found: Found) -> Comparison:
    out, tuning, record = req.folder, found.tuning, found.record
    runs, skipped = load_runs(run_dirs, left_out, found.failed)
    check_outputs(out, [Path(r.path) for r in runs], req.analyze, req.overwrite_output)  # before the first write
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
    c.protocol = protocol_line(protocol_differences(select, c.primary, tuning is not None or bool(tuned),
                                                    [v.n_seeds for v in c.variants]))
    if record is not None:
        c.notes += record.notes()
        c.warnings += record.warnings(primary)
    if tuning is not None:
        c.tuning = tuning
        c.notes.append(tuning_note(tuning, primary))
    if found.record_note:
        c.notes.append(found.record_note)
    c.notes += overtrained_notes(runs, select) + [r.analysis_note for r in runs if r.analysis_note]
    for v in c.variants:
        v.verdicts = verdicts_for(v, c)
    if found.sequential is not None:  # --seeds auto: the primary contrast judged at the design's adjusted level
        found.sequential.apply(c)
    c.replaced = replaced_note(c, out)
    write_outputs(c, out, req.overwrite_output)
    return c


def _analyzed(run: LoadedRun, overwrite_output: bool = False) -> LoadedRun:
    """The run with a fresh analysis of its final checkpoint (tiedlm analyze, into its folder)."""
    import dataclasses

    from ..analyze import analyze_run

    analysis = analyze_run(run.path, overwrite=overwrite_output, overwrite_option=OVERWRITE_OPTION)
    return dataclasses.replace(run, analysis=analysis, analysis_note=None)
