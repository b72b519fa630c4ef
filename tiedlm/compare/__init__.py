"""Compare finished runs: group them into variants, aggregate seeds, test the differences.

    collect     find run folders and read finished runs (through runs.py)
    datasets    group runs by the tokens they were trained and evaluated on
    variants    variants, labels, the baseline, aggregates over seeds, contrasts on the loss
    grid        matched contrasts: each tied variant against its untied twin in a grid
    comparison  build_comparison and the Comparison it returns (what comparison.json holds)
    trajectory  each contrast's effect at every periodic evaluation: crossover, still moving, its plot
    stats       t and noncentral t distributions, summaries, paired and Welch tests, Holm, power (pure)
    matching    --match params: the tied model with as many parameters as the untied one
    verdicts    the sentences: verdict on the primary endpoint, confirmation, seeds needed, FLOPs
    report      comparison.md / .csv / .json and the terminal table
    plots       the PNG plots

compare_runs compares runs that exist; compare_config trains the tied and untied variants of a
config first. Both write comparison.md, comparison.csv, comparison.json and four PNG plots
(atomically; a fifth, tying_effect.png, in a grid) and return the Comparison.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import ConfigError, TiedlmError
from ..naming import override_tag
from ..tuning import tuned_keys
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
from .matching import ParamMatch, match_layers
from .plots import MATCHED_PLOT, PLOTS, write_plots
from .report import FILES, LEGACY, format_terminal_table, to_csv, to_json_text, to_markdown
from .trajectory import TRAJECTORY_PLOT
from .tuning_report import tuning_note
from .tying_map import TYING_MAP_PLOT, TyingMap, plot_tying_map
from .variants import Contrast, SplitContrast, Variant
from .verdicts import verdicts_for

# What a user of the library calls and reads: the two entry points, the outputs, the result's types
# and the names of the files written. Everything else is imported from its module (compare.stats, ...).
__all__ = [
    "compare_runs", "compare_config", "check_outputs", "write_outputs", "format_terminal_table",
    "Comparison", "Variant", "Contrast", "SplitContrast", "MatchedContrast", "TyingMap", "TrainFailure",
    "COMPARE_DIR", "PLOTS", "MATCHED_PLOT", "TRAJECTORY_PLOT", "TYING_MAP_PLOT",
]


OVERWRITE_OPTION = "--overwrite-output"  # the CLI option that replaces files tiedlm did not write
SEEDS_LIMIT = 1000  # compare_config seeds: a typo (1000000) would queue a million trainings per variant


def write_outputs(c: Comparison, out: Path, overwrite: bool = False) -> None:
    """comparison.md, .csv, .json and the plots into out (each written atomically); c.files says where.
    They are recorded there as tiedlm's (files.recording): a file of one of their names that tiedlm
    did not write is refused unless `overwrite`, before anything is written."""
    from ..files import atomic_write_text, recording
    from ..runs import AGAIN_HINT, writing

    from .tuning_report import TUNE_PLOT, plot_tuning

    out = Path(out)
    c.files = {k: str(out / v) for k, v in FILES.items()}
    if c.matched:
        c.files["plot_tying_effect"] = str(out / MATCHED_PLOT)
    if c.tying_map is not None:
        c.files["plot_tying_map"] = str(out / TYING_MAP_PLOT)
    if c.tuning is not None:
        c.files["plot_tuning"] = str(out / TUNE_PLOT)
    names = [Path(f).name for f in c.files.values()]
    with recording(out, names, OVERWRITE_OPTION, overwrite, LEGACY,
                   known=[*FILES.values(), MATCHED_PLOT, TUNE_PLOT, TYING_MAP_PLOT]):
        write_plots(c, out)
        if c.tying_map is not None:
            plot_tying_map(c.tying_map.tmap, out / TYING_MAP_PLOT)
        if c.tuning is not None:
            plot_tuning(c.tuning, out / TUNE_PLOT)
        for kind, render in (("csv", to_csv), ("markdown", to_markdown), ("json", to_json_text)):
            text = render(c)
            with writing(out / FILES[kind], AGAIN_HINT):  # its runs are finished: nothing to resume
                atomic_write_text(out / FILES[kind], text)


def check_outputs(out: Path, run_dirs: Iterable[Path] = (), analyze: bool = False, overwrite: bool = False) -> None:
    """Refuse, before anything is trained or written, a comparison folder inside a run's managed
    parts, files there of the comparison's names that tiedlm did not write, and with `analyze` such
    files of the analysis' names in the run folders (a grid's tying-effect plot, and an untied
    run's pair-cosine plot, are checked again when they are written)."""
    from ..analyze import check_target
    from ..checkpoints import check_outside_runs
    from ..files import check_foreign

    check_outside_runs(out, "--out")
    check_foreign(out, FILES.values(), OVERWRITE_OPTION, overwrite, LEGACY)
    for d in run_dirs if analyze else ():
        check_target(Path(d), overwrite, OVERWRITE_OPTION, is_out=False)


def _compare(run_dirs: list[Path], left_out: list[LeftOut], out: Path, baseline: str | None, runs_dir: Path,
             match: ParamMatch | None = None, failed: dict[str, str] | None = None,
             primary: str | None = None, select: str | None = None, analyze: bool = False,
             overwrite_output: bool = False, tuning: Any = None, sequential: Any = None,
             record: Any = None) -> Comparison:
    with _holding(Path(out)):  # read, judged and written whole, never beside another writer's files
        return _compare_held(run_dirs, left_out, out, baseline, runs_dir, match, failed, primary, select, analyze,
                             overwrite_output, tuning, sequential, record)


def _holding(out: Path) -> Any:
    """The comparison folder's lock (runs.FolderLock): a second compare or analyze writing there
    waits for this one to finish, saying so."""
    from ..runs import FolderLock

    return FolderLock(out)


def _compare_held(run_dirs: list[Path], left_out: list[LeftOut], out: Path, baseline: str | None, runs_dir: Path,
                  match: ParamMatch | None, failed: dict[str, str] | None, primary: str | None, select: str | None,
                  analyze: bool, overwrite_output: bool, tuning: Any, sequential: Any, record: Any) -> Comparison:
    runs, skipped = load_runs(run_dirs, left_out, failed)
    check_outputs(Path(out), [Path(r.path) for r in runs], analyze, overwrite_output)  # before the first write
    if analyze:
        runs = [_analyzed(r, overwrite_output) for r in runs]
    runs, left, select, why, primary = choose_weights(runs, select, primary)
    skipped += left
    if not runs:
        raise no_runs_error(run_dirs, skipped, runs_dir)
    tuned = tuned_keys(tuning) or (record.keys if record is not None else [])
    c = build_comparison(runs, skipped, baseline, str(out), match, primary, tuned=tuned)
    c.select, c.select_reason = select, why
    if record is not None:
        c.notes += record.notes()
        c.warnings += record.warnings(primary)
    if tuning is not None:
        c.tuning = tuning
        c.notes.append(tuning_note(tuning, primary))
    c.notes += overtrained_notes(runs, select) + [r.analysis_note for r in runs if r.analysis_note]
    for v in c.variants:
        v.verdicts = verdicts_for(v, c)
    if sequential is not None:  # --seeds auto: the primary contrast judged at the design's adjusted level
        sequential.apply(c)
    write_outputs(c, Path(out), overwrite_output)
    return c


def _analyzed(run: LoadedRun, overwrite_output: bool = False) -> LoadedRun:
    """The run with a fresh analysis of its final checkpoint (tiedlm analyze, into its folder)."""
    import dataclasses

    from ..analyze import analyze_run

    analysis = analyze_run(run.path, overwrite=overwrite_output, overwrite_option=OVERWRITE_OPTION)
    return dataclasses.replace(run, analysis=analysis, analysis_note=None)


def _check_options(primary: str | None, select: str | None, baseline: str | None = None) -> None:
    """The options compare_runs and compare_config share (ConfigError, named as the CLI's options),
    refused before anything is read, trained or written: the CLI only parses and passes them on."""
    from ..checks import check_split

    if primary is not None:
        check_split(primary, "--primary")
    if select is not None and select not in SELECT:
        raise ConfigError(f"--select {select!r} is not known — choose best (each run's kept best weights) or "
                          "final (the last weights)")
    if baseline is not None and (not str(baseline).strip() or "\n" in str(baseline)):
        raise ConfigError(f"--baseline {baseline!r} names no variant — give a variant's label or a run's name")


def _check_config_options(seeds: int | str, max_seeds: int | None, min_effect: float | None, match: str | None,
                          primary: str | None, select: str | None, baseline: str | None) -> tuple[int, float]:
    """compare_config's options, all of them before its config is read; returns (max_seeds,
    min_effect) with their defaults (sequential.check_auto)."""
    from ..checks import check_at_most, check_positive
    from .sequential import check_auto

    if match not in (None, "params"):
        raise ConfigError(f"--match {match!r} is not known — the one choice is --match params")
    if seeds != "auto" and isinstance(seeds, int) and not isinstance(seeds, bool):
        check_positive(seeds, "--seeds")
        check_at_most(seeds, SEEDS_LIMIT, "--seeds", "each seed trains every variant once more")
    auto = check_auto(seeds, max_seeds, min_effect, match)  # a whole number or auto; --max-seeds, --min-effect
    _check_options(primary, select, baseline)
    return auto


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
    _check_options(primary, select, baseline)
    runs_dir = Path(runs_dir)
    out = Path(out) if out is not None else runs_dir / COMPARE_DIR
    run_dirs, missing = discover(list(paths) if paths else None, runs_dir, out)
    from ..tuning import read_record

    # a tuned sweep's folder, compared whole: each grid point at its chosen values (tuning.json)
    folder = runs_dir if not paths else Path(paths[0]) if len(paths) == 1 and Path(paths[0]).is_dir() else None
    record = read_record(folder, run_dirs) if folder is not None and run_dirs else None
    if record is not None and record.usable:
        if primary == "validation":
            raise ConfigError(f"these runs were tuned on validation ({record.folder}/tuning.json), so the verdict is "
                              "on test — drop --primary validation")
        chosen = set(record.chosen)
        missing += [LeftOut(str(d), d.name, "a tuning run at a value its variant did not choose (tuning.json)")
                    for d in run_dirs if d.name not in chosen]
        found = {d.name for d in run_dirs}
        missing += [LeftOut(str(record.folder / n), n, "chosen by the tuning (tuning.json), but not there")
                    for n in record.chosen if n not in found]
        run_dirs = [d for d in run_dirs if d.name in chosen]
    tuned = record is not None and record.usable
    return _compare(run_dirs, missing, out, baseline, runs_dir, primary=primary or ("test" if tuned else None),
                    select=select, analyze=analyze, overwrite_output=overwrite_output, record=record)


def _variants(cfg_path: str | Path, overrides: list[str], match: str | None,
              base: Any) -> tuple[list[tuple[str, list[str]]], ParamMatch | None]:
    """(tag, overrides) of each variant to train, and the parameter match with match="params". A
    config with a model.tie_mode (projection, lowrank) is its own tied variant, against untied."""
    from ..config import load_config

    m = base.model
    untie = ["model.untie_at=null"] if m.untie_at is not None else []  # an untie_at is for tied models
    untie += ["model.untie_rank=0"] if m.untie_rank else []  # and a rank for the lowrank mode
    tied = ("tied", ["model.tie_embeddings=true"])
    if m.tie_mode is not None:
        tied = (m.tie_mode + (f"-r{m.untie_rank}" if m.tie_mode == "lowrank" else ""), [f"model.tie_mode={m.tie_mode}"])
        if match == "params":
            raise ConfigError(f"--match params adds layers to the plain tied model, and this config's model.tie_mode "
                              f"is {m.tie_mode} — drop --match, or compare with model.tie_mode tied")
    variants = [tied, ("untied", ["model.tie_embeddings=false", *untie])]
    if match != "params":
        return variants, None
    from ..data import prepare_data

    untied_cfg = load_config(cfg_path, overrides + variants[1][1])
    matched = match_layers(untied_cfg.model, prepare_data(untied_cfg).model_vocab_size)
    if matched.adds_a_variant:
        variants.append(("tied-matched", ["model.tie_embeddings=true", f"model.n_layer={matched.matched_n_layer}"]))
    return variants, matched


def compare_config(cfg_path: str | Path, overrides: list[str] | None = None, seeds: int | str = 1,
                   match: str | None = None, runs_dir: Path = Path("runs"), baseline: str | None = None,
                   progress: bool = True, out: Path | None = None, overwrite: bool = False,
                   train: Callable[..., Any] | None = None, primary: str | None = None,
                   select: str | None = None, analyze: bool = False, overwrite_output: bool = False,
                   tune: list[str] | None = None, max_seeds: int | None = None,
                   min_effect: float | None = None, jobs: int | str | None = 1) -> Comparison:
    """Train the tied and untied variants of a config (seeds cfg.seed .. cfg.seed+seeds-1; finished
    runs are reused) and compare exactly those runs. match="params" adds a tied variant with extra
    layers whose total is as close as possible to the untied one's. Training failures do not stop
    the others; they are listed in the result's train_failures and among the runs left out.
    `train` trains one run (train.train_run, the default, or a stand-in with its signature).
    `overwrite` retrains runs whose folders hold another config; `overwrite_output` replaces files
    of the outputs' names that tiedlm did not write (check_outputs, before anything is trained).
    `tune` (`--tune KEY=V1,V2,...`, over the config's tune: block) tunes each variant on validation
    first and compares each at its own chosen value, on test (tuning.py). `seeds="auto"` adds seeds
    only while the verdict is undecided (sequential.py: from 3 per variant up to `max_seeds`,
    stopping for efficacy at the design's adjusted level, or for futility once the smallest
    detectable effect is below `min_effect`); with tuning, for the seeds at the chosen values.
    `jobs` (--jobs): train that many runs at once, each in its own process, or "auto" (parallel.py);
    1 trains them one after another in this process."""
    from ..tuning import read_tune_block, spec_from_options

    auto = _check_config_options(seeds, max_seeds, min_effect, match, primary, select, baseline)
    from ..parallel import parse_jobs

    jobs = parse_jobs(jobs)
    spec = spec_from_options(list(tune or []), read_tune_block(cfg_path))
    out = Path(out) if out is not None else Path(runs_dir) / COMPARE_DIR
    # Held from before the first run is trained until the comparison is written: a second command
    # comparing into the same folder waits, then finds every run trained (skipped) and compares the
    # whole set, instead of failing on the runs this one is training and comparing the rest.
    with _holding(out):
        if spec is not None:
            return _compare_tuned(spec, cfg_path, list(overrides or []), seeds, match, Path(runs_dir), baseline,
                                  progress, out, overwrite, train, primary, select, analyze, overwrite_output, auto,
                                  jobs)
        return _compare_untuned(cfg_path, list(overrides or []), seeds, match, Path(runs_dir), baseline, progress,
                                out, overwrite, train, primary, select, analyze, overwrite_output, auto, jobs)


def _compare_untuned(cfg_path: str | Path, overrides: list[str], seeds: int | str, match: str | None,
                     runs_dir: Path, baseline: str | None, progress: bool, out: Path, overwrite: bool,
                     train: Callable[..., Any] | None, primary: str | None, select: str | None, analyze: bool,
                     overwrite_output: bool, auto: tuple[int, float], jobs: int | str) -> Comparison:
    """compare_config without tuning, with its comparison folder held."""
    from ..config import load_config
    from ..runs import run_dir_for

    base, variants, matched, prefix, out = _setup(cfg_path, overrides, match, runs_dir, out)
    from ..jobs import train_jobs
    from ..process import log
    from ..train import train_run
    from .sequential import contrast_of, settle_seeds

    failures: dict[str, str] = {}

    def run_dirs(stop: int, first: int = 0) -> list[Path]:  # seed indices first .. stop - 1 of every variant
        return [run_dir_for(runs_dir, f"{prefix}-{tag}-s{seed}") for tag, _ in variants
                for seed in range(base.seed + first, base.seed + stop)]

    def train_seeds(first: int, stop: int) -> bool:
        todo = [(f"{prefix}-{tag}-s{seed}", load_config(cfg_path, overrides + extra, seed=seed))
                for tag, extra in variants for seed in range(base.seed + first, base.seed + stop)]
        new = run_dirs(stop, first)
        check_outputs(out, [d for d in new if d.is_dir()], analyze, overwrite_output)  # refused: nothing trained
        results = train_jobs(todo, runs_dir, progress, overwrite_other_config=overwrite, train=train or train_run,
                             parallel=jobs)
        failures.update({r.name: r.error for r in results if r.status == "failed"})
        return all(r.status != "failed" for r in results)

    seeds, sequential = settle_seeds(seeds, *auto, train_seeds, lambda n: contrast_of(
        run_dirs(n), failures, baseline, primary, select), log if progress else None)
    c = _compare(run_dirs(seeds), [], out, baseline, runs_dir, match=matched, failed=failures, primary=primary,
                 select=select, analyze=analyze, overwrite_output=overwrite_output, sequential=sequential)
    c.train_failures = [TrainFailure(n, e) for n, e in failures.items()]
    return c


def _setup(cfg_path: str | Path, overrides: list[str], match: str | None, runs_dir: Path,
           out: Path | None) -> tuple[Any, list, Any, str, Path]:
    """What compare_config trains, tuned or not: (the base config, the variants' tags and overrides,
    the parameter match, the run-name prefix, the comparison folder); compare_config checked the options."""
    from ..config import load_config

    base = load_config(cfg_path, overrides)
    variants, matched = _variants(cfg_path, overrides, match, base)
    out = Path(out) if out is not None else runs_dir / COMPARE_DIR
    return base, variants, matched, base.name + override_tag(overrides), out


def _compare_tuned(spec: Any, cfg_path: str | Path, overrides: list[str], seeds: int, match: str | None,
                   runs_dir: Path, baseline: str | None, progress: bool, out: Path | None, overwrite: bool,
                   train: Callable[..., Any] | None, primary: str | None, select: str | None, analyze: bool,
                   overwrite_output: bool, auto: tuple[int, float] = (10, 0.02), jobs: int | str = 1) -> Comparison:
    """compare_config with tuning: every variant's grid on the tuning seeds, each variant's point
    chosen on validation, every seed at the chosen points, the verdict on test. With seeds="auto"
    the seeds at the chosen points are added by the sequential design (`auto`: max_seeds, min_effect)."""
    from ..config import load_config
    from ..errors import RunError
    from ..jobs import train_jobs
    from ..naming import sanitize
    from ..runs import run_dir_for
    from ..train import train_run
    from ..tuning import point_label, point_overrides, run_tuning, shared_point, short_keys

    if match is not None:
        raise ConfigError("--match params with tuning is not supported — tune without --match, or match without "
                          "--tune")
    if primary == "validation":
        raise ConfigError("with tuning, validation chose each variant's value, so the verdict is on test — drop "
                          "--primary validation")
    base, variants, _, prefix, out = _setup(cfg_path, overrides, None, runs_dir, out)
    failures: dict[str, str] = {}

    def make_job(suffix: str, extra: list[str], seed: int):
        return sanitize(f"{prefix}-{suffix}-s{seed}"), load_config(cfg_path, overrides + extra, seed=seed)

    def train_all(todo: list) -> None:
        unique = list({name: (name, cfg) for name, cfg in todo}.values())
        results = train_jobs(unique, runs_dir, progress, overwrite_other_config=overwrite, train=train or train_run,
                             parallel=jobs)
        failures.update({r.name: r.error for r in results if r.status == "failed"})

    check_outputs(out, [], analyze, overwrite_output)  # refused: nothing trained
    selection = "kept best weights" if base.train.keep_best else "final weights"
    tuning = run_tuning(spec, variants, make_job, train_all, runs_dir, base.seed, selection, base)
    missing = [v.tag for v in tuning.variants if v.chosen is None]
    if missing:
        raise RunError(f"no point of {', '.join(missing)}'s tuning grid finished training — see the reasons above, "
                       "fix them and run the same command again")
    short = short_keys(tuning.keys)

    def at(v: Any, point: dict, stop: int, first: int = 0) -> list:  # seed indices first .. stop - 1
        label = sanitize(point_label(point, short))
        return [make_job(f"{v.tag}-{label}", v.overrides + point_overrides(point, tuning.schedule), s)
                for s in range(base.seed + first, base.seed + stop)]

    shared = shared_point(tuning, base)

    def train_seeds(first: int, stop: int) -> bool:
        before = len(failures)
        todo = [job for v in tuning.variants for job in at(v, v.chosen.point, stop, first)]
        if shared is not None and tuning.spec.shared_seeds:
            todo += [job for v in tuning.variants for job in at(v, shared, stop, first)]
        train_all(todo)
        return len(failures) == before

    def chosen_dirs(n: int) -> list[Path]:
        return [run_dir_for(runs_dir, name) for v in tuning.variants for name, _ in at(v, v.chosen.point, n)]

    from ..process import log
    from .sequential import contrast_of, settle_seeds

    seeds, sequential = settle_seeds(seeds, *auto, train_seeds, lambda n: contrast_of(
        chosen_dirs(n), failures, baseline, primary or "test", select, tuned_keys(tuning)), log if progress else None)
    chosen = [job for v in tuning.variants for job in at(v, v.chosen.point, seeds)]
    shared_jobs = [job for v in tuning.variants for job in at(v, shared, seeds)] if shared is not None else []
    if shared is not None:
        tuning.shared = _shared_verdict(tuning, shared, [run_dir_for(runs_dir, n) for n, _ in shared_jobs],
                                        failures, select, primary or "test", out)
    c = _compare([run_dir_for(runs_dir, n) for n, _ in chosen], [], out, baseline, runs_dir, failed=failures,
                 primary=primary or "test", select=select, analyze=analyze, overwrite_output=overwrite_output,
                 tuning=tuning, sequential=sequential)
    c.train_failures = [TrainFailure(n, e) for n, e in failures.items()]
    return c


def _shared_verdict(tuning: Any, point: dict, run_dirs: list[Path], failures: dict[str, str], select: str | None,
                    primary: str, out: Path) -> dict | None:
    """The verdict with every variant at the config's own point, on the seeds trained there (the
    tuning seeds, or every seed with tune.shared_seeds): what the untuned comparison says."""
    from ..tuning import point_label, short_keys

    runs, _ = load_runs([d for d in run_dirs if d.is_dir()], [], failures)
    # the seeds every variant has there (a variant that chose this point has all of its seeds here,
    # the other only its tuning seeds): paired by seed, as the tuned verdict is
    by_variant: dict[Any, set[int]] = {}
    for r in runs:
        by_variant.setdefault(r.config.model.tie_embeddings, set()).add(r.seed)
    shared = set.intersection(*by_variant.values()) if len(by_variant) > 1 else set()
    runs = [r for r in runs if r.seed in shared]
    if not runs:
        return None
    runs, _, _, _, primary = choose_weights(runs, select, primary)
    try:
        c = build_comparison(runs, [], None, str(out), None, primary, tuned=tuned_keys(tuning))
    except TiedlmError:
        return None
    other = next((v for v in c.variants if v.vs_baseline is not None), None)
    contrast = other.contrast(primary) if other is not None else None
    if contrast is None:
        return None
    return {"point": point, "label": point_label(point, short_keys(tuning.keys)), "variant": other.label,
            "baseline": c.baseline_label, "split": primary, "seeds": sorted({r.seed for r in runs}),
            "relative": contrast.relative, "ci_low": contrast.relative_ci_low, "ci_high": contrast.relative_ci_high,
            "p_value": contrast.p_value, "significant": contrast.significant}
