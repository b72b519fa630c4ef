"""compare --config's request and plan: what a comparison was asked (`CompareRequest`, every
option of `tiedlm compare` and of compare_runs / compare_config, checked once by `check()`,
naming the CLI's options, before anything is read, trained or written), and the runs it takes.
The plan holds the variants of a config (tied or its tying mode, untied, and with --match params
or params:width the tied model grown, deeper or wider, to the untied one's parameters: a variant
like the others, tuned on its own grid), each at its tuning points and seeds; they
are trained a stage at a time through an executor (jobs.Executor): the tuning grid and its steps
past the edges (tuning.TuningSearch), then the seeds at each variant's point (sequential.SeedDesign:
a number, or one look at a time). `train_for_comparison` returns the run folders to compare and
what training found (`Found`); the caller compares them (compare.compare)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, RunError, TiedlmError
from ..plan import PlannedRun, RunSource, Stage
from .collect import COMPARE_DIR, SELECT, choose_weights, load_runs
from .comparison import build_comparison
from .matching import ParamMatch, match_by, match_params
from .outputs import check_outputs
from .sequential import SeedDesign, primary_variant

SEEDS_LIMIT = 1000  # compare_config seeds: a typo (1000000) would queue a million trainings per variant


@dataclass
class CompareRequest:
    """One comparison: of finished runs (`paths`, or every run under `runs_dir`), or, with
    `config`, of the tied and untied variants of a config trained first (`overrides`, `seeds` or
    the sequential design, `tune`, `match`). `select`, `primary` and `baseline` say what is
    judged; `out` (default runs_dir/compare) where the comparison goes. `train` trains one run
    (train.train_run, or a stand-in with its signature); `jobs` is --jobs."""

    config: str | Path | None = None
    overrides: list[str] = field(default_factory=list)
    paths: list[str | Path] | None = None
    seeds: int | str = 1
    max_seeds: int | None = None
    min_effect: float | None = None
    tune: list[str] = field(default_factory=list)
    match: str | None = None
    select: str | None = None
    primary: str | None = None
    baseline: str | None = None
    runs_dir: Path = Path("runs")
    out: Path | None = None
    overwrite: bool = False
    overwrite_output: bool = False
    analyze: bool = False
    progress: bool = True
    jobs: int | str | None = 1
    train: Callable[..., Any] | None = None
    design: tuple[int, float] = (10, 0.02)  # --max-seeds and --min-effect with their defaults (check)

    @property
    def folder(self) -> Path:
        """Where the comparison is written."""
        return Path(self.out) if self.out is not None else Path(self.runs_dir) / COMPARE_DIR

    def check(self) -> CompareRequest:
        """Refuse (ConfigError) what cannot be asked, before any file is read; returns self."""
        from ..checks import check_split

        self.runs_dir = Path(self.runs_dir)
        if self.config is not None:
            self._check_training()
        if self.primary is not None:
            check_split(self.primary, "--primary")
        if self.select is not None and self.select not in SELECT:
            raise ConfigError(f"--select {self.select!r} is not known — choose best (each run's kept best weights) "
                              "or final (the last weights)")
        if self.baseline is not None and (not str(self.baseline).strip() or "\n" in str(self.baseline)):
            raise ConfigError(f"--baseline {self.baseline!r} names no variant — give a variant's label or a run's name")
        if self.config is not None:
            from ..parallel import parse_jobs

            self.jobs = parse_jobs(self.jobs)
        return self

    def _check_training(self) -> None:
        """compare --config's own options, before its config is read."""
        from ..checks import check_at_most, check_positive
        from .sequential import check_auto

        match_by(self.match)  # refuses an unknown --match
        if self.seeds != "auto" and isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            check_positive(self.seeds, "--seeds")
            check_at_most(self.seeds, SEEDS_LIMIT, "--seeds", "each seed trains every variant once more")
        self.design = check_auto(self.seeds, self.max_seeds, self.min_effect)
        self.overrides = list(self.overrides or [])
        self.tune = list(self.tune or [])


@dataclass
class Found:
    """What training and tuning found, for the comparison of their runs: the parameter match
    (--match params), the runs that failed to train (name -> error), the tuning, the sequential
    design's record, a tuned sweep's record (tuning.json) and every run trained or found finished."""

    match: Any = None
    failed: dict[str, str] = field(default_factory=dict)
    tuning: Any = None
    sequential: Any = None
    record: Any = None
    record_note: str | None = None  # why a tuned compare --config left no tuning.json
    trained: list[str] | None = None  # every run it trained or found finished, compared or not (tuning's too)


@dataclass
class ComparisonPlan:
    """The variants to train, (tag, overrides) each, and how their runs are made (`source`)."""

    base: Any  # the config with the request's overrides
    variants: list[tuple[str, list[str]]]
    source: RunSource
    match: ParamMatch | None = None
    points: dict[str, tuple[dict, list[str]]] = field(default_factory=dict)  # tag -> (point, overrides) when tuned
    schedule: list[str] = field(default_factory=list)  # the tuning's schedule overrides (min_lr follows lr)

    def runs(self, first: int, stop: int, point: dict | None = None) -> list[PlannedRun]:
        """Seed indices first .. stop − 1 of every variant, at its own tuned point (`points`), or
        at `point` for all of them."""
        return [self.source.run(tag, extra, seed) for tag, extra, seed in self._each(first, stop, point)]

    def dirs(self, runs_dir: Path, first: int, stop: int, point: dict | None = None) -> list[Path]:
        """The folders of runs(first, stop, point), named without resolving a config."""
        from ..runs import run_dir_for

        return [run_dir_for(runs_dir, self.source.name(tag, seed)) for tag, _, seed in self._each(first, stop, point)]

    def _each(self, first: int, stop: int, point: dict | None) -> list[tuple[str, list[str], int]]:
        """(tag with its point's label, overrides, seed) of each run of runs()."""
        out = []
        for tag, extra in self.variants:
            at, more = (point, self._point_overrides(point)) if point is not None else self.points.get(tag, ({}, []))
            label = self._label(at)
            out += [(f"{tag}-{label}" if label else tag, extra + more, seed)
                    for seed in range(self.base.seed + first, self.base.seed + stop)]
        return out

    def _label(self, point: dict) -> str:
        from ..tuning import point_tag, short_keys

        return point_tag(point, short_keys(list(point)))

    def _point_overrides(self, point: dict) -> list[str]:
        from ..tuning import point_overrides

        return point_overrides(point, self.schedule)


def variants_of(req: CompareRequest, base: Any) -> tuple[list[tuple[str, list[str]]], ParamMatch | None]:
    """(tag, overrides) of each variant to train, and the parameter match with --match params (the
    tied model deeper) or params:width (wider). A config with a model.tie_mode (projection, lowrank,
    split, soft, pull) is its own variant, against untied: the mode with its rank or strength."""
    from ..config import load_config

    m, tie = base.model, base.model.tie
    untie = ["model.untie_at=null"] if m.untie_at is not None else []  # an untie_at is for tied models
    untie += ["model.untie_rank=0"] if tie.rank else []  # and a rank for the lowrank mode
    tied = ("tied", ["model.tie_embeddings=true"])
    if tie.stored_mode is not None:  # a named mode: it is the variant set against untied
        tied = (tie.tag, [f"model.tie_mode={tie.mode}"])
        if req.match is not None:
            raise ConfigError(f"--match {req.match} grows the plain tied model, and this config's model.tie_mode "
                              f"is {tie.mode} — drop --match, or compare with model.tie_mode tied")
    if req.match is not None and m.untie_at is not None:  # the matched model would end untied
        raise ConfigError(f"--match {req.match} grows a model that stays tied, and this config's model.untie_at "
                          f"is {m.untie_at:g}: its tied variants end untied, so no count matches — drop --match, "
                          "or set model.untie_at=null")
    variants = [tied, ("untied", ["model.tie_embeddings=false", *untie])]
    by = match_by(req.match)
    if by is None:
        return variants, None
    from ..data import prepare_data

    untied_cfg = load_config(req.config, req.overrides + variants[1][1])
    matched = match_params(untied_cfg.model, prepare_data(untied_cfg).model_vocab_size, by)
    if matched.adds_a_variant:
        variants.append((matched.tag, matched.overrides()))
    return variants, matched


def plan_comparison(req: CompareRequest) -> ComparisonPlan:
    from ..config import load_config
    from ..naming import override_tag

    base = load_config(req.config, req.overrides)
    from ..data import check_source

    check_source(base.data)  # a local-looking data.path that is not there: one line, before any run
    variants, matched = variants_of(req, base)
    source = RunSource(req.config, tuple(req.overrides), base.name + override_tag(req.overrides))
    return ComparisonPlan(base=base, variants=variants, source=source, match=matched)


def train_for_comparison(req: CompareRequest, spec: Any) -> tuple[list[Path], Found]:
    """Train what the request asks (tuned with `spec`, a tuning.TuneSpec, or not) and return the
    run folders to compare (the seeds at each variant's point) and what training found."""
    from ..jobs import Executor
    from ..runs import run_dir_for
    from ..train import train_run

    plan = plan_comparison(req)
    found = Found(match=plan.match)
    executor = Executor(req.runs_dir, req.progress, req.overwrite, req.train or train_run, req.jobs,
                        may_grow=spec is not None)
    with executor:  # the --jobs workers serve every stage, and end with the comparison
        found.failed = executor.failures
        primary = req.primary
        if spec is not None:
            found.tuning = _tune(req, plan, spec, executor)
            primary = primary or "test"
        seeds = SeedDesign(req.seeds, *req.design, progress=req.progress)
        executor.may_grow = seeds.auto  # the tuning is done: only the sequential design adds runs now
        shared = _shared_point(found.tuning, plan)
        span = seeds.first()
        while span is not None:
            runs = plan.runs(*span)
            if shared is not None and found.tuning.spec.shared_seeds:
                runs += plan.runs(*span, point=shared)
            new = [run_dir_for(req.runs_dir, r.name) for r in runs]
            check_outputs(req.folder, [d for d in new if d.is_dir()], req.analyze, req.overwrite_output)
            trained = executor.run(Stage(f"seeds {span[0] + 1} to {span[1]}", runs))
            contrast = (contrast_of(plan.dirs(req.runs_dir, 0, seeds.seeds), found.failed, req, primary, found.tuning,
                                    plan.match) if seeds.auto else None)
            span = seeds.after(trained, contrast)
        found.sequential = seeds.record
        extra: list[Path] = []
        if shared is not None:
            extra = dirs = plan.dirs(req.runs_dir, 0, seeds.seeds, point=shared)
            found.tuning.shared = shared_verdict(found.tuning, shared, dirs, found.failed, req, primary, plan.match)
        chosen = plan.dirs(req.runs_dir, 0, seeds.seeds)
        found.trained = sorted(n for n, r in executor.results.items() if r.status != "failed")
        if found.tuning is not None:
            found.record_note = _leave_record(req, found, chosen, extra, seeds.auto)
        return chosen, found


def _leave_record(req: CompareRequest, found: Found, chosen: list[Path], extra: list[Path], auto: bool) -> str | None:
    """tuning.json into the runs folder, so that `tiedlm compare FOLDER` compares these runs as this
    command does: only when the folder holds no run of another command (its record would not speak
    for them, and another's record there is left alone) and the seeds were fixed (the sequential
    design's levels are not in the record). Else the note that says why none was written."""
    from ..tuning_record import RECORD, record_runs, write_record
    from .collect import discover

    ours = set(record_runs(found.tuning, [d.name for d in chosen], [d.name for d in extra]))
    here, _ = discover(None, req.runs_dir, req.folder)
    others = sorted(d.name for d in here if d.name not in ours)
    if auto:
        why = "the seeds came from the sequential design (--seeds auto), whose levels a record does not carry"
    elif others:
        why = f"{req.runs_dir} also holds runs of other commands ({', '.join(others[:3])}{', …' * (len(others) > 3)})"
    else:
        write_record(req.runs_dir, found.tuning, sorted(d.name for d in chosen), sorted(d.name for d in extra))
        return None
    if (req.runs_dir / RECORD).exists():  # an earlier command's record, left alone: say it is not this one's
        return (f"this command's {RECORD} was not written: {why}; the {RECORD} in {req.runs_dir} is an earlier "
                f"command's and speaks for its runs, not these — give this command its own --out to have a record "
                "of its own")
    return (f"no {RECORD} was left in the runs folder: {why}; `tiedlm compare` of the folder would compare every "
            f"tuning run as a variant of its own — give this command its own --out to have one")


def _tune(req: CompareRequest, plan: ComparisonPlan, spec: Any, executor: Any) -> Any:
    """Each variant's tuning grid on the tuning seeds, stage by stage; the variants' points set."""
    from ..tuning import TuningSearch

    if plan.match is not None:
        _check_match_tuning(req, plan, spec)
    if req.primary == "validation":
        raise ConfigError("with tuning, validation chose each variant's value, so the verdict is on test — drop "
                          "--primary validation")
    check_outputs(req.folder, [], req.analyze, req.overwrite_output)  # refused: nothing trained
    from ..tuning_record import check_record_target

    check_record_target(req.runs_dir, remove=False)  # a record tiedlm did not write: refused
    selection = "kept best weights" if plan.base.train.keep_best else "final weights"
    search = TuningSearch(spec, plan.variants, plan.source, req.runs_dir, plan.base.seed, selection, plan.base)
    stage = search.next_stage()
    while stage is not None:
        executor.run(stage)
        stage = search.next_stage()
    tuning = search.tuning
    missing = [v.tag for v in tuning.variants if v.chosen is None]
    if missing:
        raise RunError(f"no point of {', '.join(missing)}'s tuning grid finished training — see the reasons above, "
                       "fix them and run the same command again")
    plan.schedule = tuning.schedule
    plan.points = {v.tag: (v.chosen.point, plan._point_overrides(v.chosen.point)) for v in tuning.variants}
    return tuning


def _check_match_tuning(req: CompareRequest, plan: ComparisonPlan, spec: Any) -> None:
    """Refuse a tuned key that changes a parameter count (model.n_layer, n_embd, ...): the match was
    made at the config's architecture, and a tuned one would leave the matched variant unmatched,
    or (a key the match sets) undo it."""
    from ..config import load_config
    from ..counting import count_params_config
    from ..tuning import point_overrides, points

    m = plan.match
    sets = ["model.n_layer"] if m.by == "depth" else ["model.n_embd", "model.n_head", "model.n_kv_head"]
    grown = [k for k in spec.keys if k in sets]
    if grown:
        raise ConfigError(f"--match {m.option} sets {', '.join(grown)} for the matched variant, so it cannot be tuned "
                          f"too — tune other keys, or drop --match")
    for point in points(spec):
        model = {k: v for k, v in point.items() if k.startswith("model.")}
        if not model:
            continue
        cfg = load_config(req.config, req.overrides + plan.variants[1][1] + point_overrides(model, []))
        if count_params_config(cfg.model, m.vocab_size)["total"] != m.untied_total:
            keys = ", ".join(model)
            raise ConfigError(f"--match {m.option} with {keys} tuned: the match grows the tied model to the untied "
                              f"one's parameter count at the config's own architecture, and tuning {keys} changes "
                              f"that count — tune other keys (train.lr, model.dropout), or vary {keys} with --set, "
                              "one comparison per value")


def _shared_point(tuning: Any, plan: ComparisonPlan) -> dict | None:
    from ..tuning import shared_point

    return shared_point(tuning, plan.base) if tuning is not None else None


def contrast_of(run_dirs: list[Path], failed: dict[str, str], req: CompareRequest, primary: str | None,
                tuning: Any = None, match: ParamMatch | None = None) -> Any:
    """The primary contrast of a comparison of run_dirs, built as the final one is but not written
    (None when there is nothing to contrast): what the sequential design looks at. With --match, the
    tied variant at equal architecture against untied (sequential.primary_variant)."""
    from ..tuning import tuned_keys

    runs, skipped = load_runs(list(run_dirs), [], failed)
    if not runs:
        return None
    try:
        runs, left, _, _, primary = choose_weights(runs, req.select, primary)
        c = build_comparison(runs, skipped + left, req.baseline, "", match, primary,
                             tuned=tuned_keys(tuning)) if runs else None
    except TiedlmError:
        return None  # the final comparison says why
    found = primary_variant(c) if c is not None else None
    return found[1] if found else None


def shared_verdict(tuning: Any, point: dict, run_dirs: list[Path], failures: dict[str, str], req: CompareRequest,
                   primary: str | None, match: ParamMatch | None = None) -> dict | None:
    """The verdict with every variant at the config's own point, on the seeds trained there (the
    tuning seeds, or every seed with tune.shared_seeds): what the untuned comparison says. With
    --match, of the primary contrast (tied vs untied at equal architecture)."""
    from ..tuning import point_label, short_keys, tuned_keys

    runs, _ = load_runs([d for d in run_dirs if d.is_dir()], [], failures)
    # the seeds every variant has there (a variant that chose this point has all of its seeds here,
    # the other only its tuning seeds): paired by seed, as the tuned verdict is
    by_variant: dict[Any, set[int]] = {}
    for r in runs:
        by_variant.setdefault(r.config_hash, set()).add(r.seed)
    shared = set.intersection(*by_variant.values()) if len(by_variant) > 1 else set()
    runs = [r for r in runs if r.seed in shared]
    if not runs:
        return None
    runs, _, _, _, primary = choose_weights(runs, req.select, primary)
    try:
        c = build_comparison(runs, [], None, str(req.folder), match, primary, tuned=tuned_keys(tuning))
    except TiedlmError:
        return None
    found = primary_variant(c)
    other, contrast = found if found is not None else (None, None)
    if contrast is None:
        return None
    return {"point": point, "label": point_label(point, short_keys(tuning.keys)), "variant": other.label,
            "baseline": c.baseline_label, "split": primary, "seeds": sorted({r.seed for r in runs}),
            "relative": contrast.relative, "ci_low": contrast.relative_ci_low, "ci_high": contrast.relative_ci_high,
            "p_value": contrast.p_value, "significant": contrast.significant}
