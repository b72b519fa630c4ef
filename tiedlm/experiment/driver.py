"""The one driver: each stage of a plan handed to an executor, and what comes next decided by
looking at the finished runs. `run(request)` trains what compare --config asks — each variant's
tuning (`tune`, which a tuned sweep calls too), then the seeds at each variant's point, a number or
one look of the sequential design at a time (seeds.SeedDesign, told the primary contrast through
compare.glance) — and returns the run folders to judge and what training found (compare.Found)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..compare import Found, Judging, glance
from ..compare.collect import discover
from ..compare.outputs import check_outputs
from ..compare.tuned import Tuning, TuneSpec
from ..config import Config
from ..errors import ConfigError, RunError
from ..config.naming import short_keys
from ..runs import run_dir_for
from .jobs import Executor
from .plan import ComparisonPlan, RunSource, Stage, check_match_tuning, plan_comparison
from .request import CompareRequest
from .seeds import SeedDesign
from .tuning import RECORD, TuningSearch, check_record_target, point_label, record_runs, shared_point, write_record


def tune(executor: Executor, spec: TuneSpec, variants: list[tuple[str, list[str]]], source: RunSource,
         runs_dir: Path, first_seed: int, base: Config) -> Tuning:
    """Each variant's tuning grid on the tuning seeds, then its steps past the edges, a stage at a
    time (tuning.TuningSearch), each stage trained by `executor`: compare --config's tuning and a
    tuned sweep's. The choice is on the kept best weights' validation loss where the config keeps
    them (train.keep_best), else the final one."""
    selection = "kept best weights" if base.train.keep_best else "final weights"
    search = TuningSearch(spec, variants, source, runs_dir, first_seed, selection, base)
    stage = search.next_stage()
    while stage is not None:
        executor.run(stage)
        stage = search.next_stage()
    return search.tuning


def run(req: CompareRequest, spec: TuneSpec | None, plan: ComparisonPlan | None = None) -> tuple[list[Path], Found]:
    """Train what the request asks (tuned with `spec`, a tuning.TuneSpec, or not) and return the
    run folders to compare (the seeds at each variant's point) and what training found. `plan`:
    the request's plan_comparison when the caller made it already."""
    from ..train import train_run

    plan = plan if plan is not None else plan_comparison(req)
    found = Found(match=plan.match)
    executor = Executor(req.runs_dir, req.progress, req.overwrite, req.train or train_run, req.jobs,
                        may_grow=spec is not None)
    with executor:  # the --jobs workers serve every stage, and end with the comparison
        found.failed = executor.failures
        primary = req.judging.primary
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
            check_outputs(req.folder, [d for d in new if d.is_dir()], req.judging.analyze, req.judging.overwrite_output,
                          req.judging.option)
            trained = executor.run(Stage(f"seeds {span[0] + 1} to {span[1]}", runs))
            look = glance(plan.dirs(req.runs_dir, 0, seeds.seeds), req.judging, found, primary) if seeds.auto else None
            span = seeds.after(trained, look.contrast if look is not None else None)
        found.sequential = seeds.record
        extra: list[Path] = []
        if shared is not None:
            extra = dirs = plan.dirs(req.runs_dir, 0, seeds.seeds, point=shared)
            found.tuning.shared = _shared_verdict(found, shared, dirs, req.judging, primary)
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


def _tune(req: CompareRequest, plan: ComparisonPlan, spec: TuneSpec, executor: Executor) -> Tuning:
    """Each variant's tuning grid on the tuning seeds, stage by stage; the variants' points set."""
    if plan.match is not None:
        check_match_tuning(req, plan, spec)
    if req.judging.primary == "validation":
        raise ConfigError("with tuning, validation chose each variant's value, so the verdict is on test — drop "
                          "--primary validation")
    check_outputs(req.folder, [], req.judging.analyze, req.judging.overwrite_output,  # refused: nothing trained
                  req.judging.option)
    check_record_target(req.runs_dir, remove=False)  # a record tiedlm did not write: refused
    tuning = tune(executor, spec, plan.variants, plan.source, req.runs_dir, plan.base.seed, plan.base)
    missing = [v.tag for v in tuning.variants if v.chosen is None]
    if missing:
        raise RunError(f"no point of {', '.join(missing)}'s tuning grid finished training — see the reasons above, "
                       "fix them and run the same command again")
    plan.schedule = tuning.schedule
    plan.points = {v.tag: (v.chosen.point, plan._point_overrides(v.chosen.point)) for v in tuning.variants}
    return tuning


def _shared_point(tuning: Tuning | None, plan: ComparisonPlan) -> dict | None:
    return shared_point(tuning, plan.base) if tuning is not None else None


def _shared_verdict(found: Found, point: dict, run_dirs: list[Path], judging: Judging,
                    primary: str | None) -> dict | None:
    """The verdict with every variant at the config's own point, on the seeds trained there (the
    tuning seeds, or every seed with tune.shared_seeds), paired by seed: what the untuned comparison
    says. With --match, of the primary contrast (tied vs untied at equal architecture)."""
    look = glance(run_dirs, dataclasses.replace(judging, baseline=None), found, primary, same_seeds=True)
    if look is None:
        return None
    d = look.contrast
    return {"point": point, "label": point_label(point, short_keys(found.tuning.keys)), "variant": look.variant,
            "baseline": look.baseline, "split": look.split, "seeds": look.seeds, "relative": d.relative,
            "ci_low": d.relative_ci_low, "ci_high": d.relative_ci_high, "p_value": d.p_value,
            "significant": d.significant}


