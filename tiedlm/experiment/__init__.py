"""Run an experiment: what `compare --config` and `sweep` train, a stage at a time, before the
judging side (compare/) is handed the finished run folders. Nothing here judges; where the plan
needs a verdict mid-way it asks compare.glance.

    request       CompareRequest: every option of compare --config, checked once
    plan          the plan of runs: PlannedRun, Stage, RunSource; a tuning's points; compare
                  --config's variants (tied or its mode, untied, --match's grown model) × points × seeds
    tuning        TuningSearch: each variant's grid, its steps past an edge, the choice on validation;
                  tuning.json written beside a tuned run's folder (compare/tuned.py reads it)
    tuning_spec   a tuning spec from --tune and a tune: block, each key and value checked
    seeds         SeedDesign: --seeds N, or --seeds auto's next seeds from the primary contrast so far
    jobs          the executor (Executor, train_jobs): one run after another, or --jobs workers
    parallel      the --jobs backend: worker processes, cores and GPUs divided among them
    driver        the one driver: `run(request)` (compare --config) and `tune` (shared with sweep)
    sweep, slurm  grid files: their runs, the commands, a tuned sweep, Slurm scripts

`compare(request)` composes the two sides: run (with compare --config) and judge.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..compare import Comparison, TrainFailure, judge, judge_runs
from ..compare.outputs import config_folder_name
from ..config.naming import sanitize
from ..runs import FolderLock
from .driver import run
from .plan import plan_comparison
from .request import CompareRequest
from .tuning_spec import read_tune_block, spec_from_options

__all__ = ["CompareRequest", "compare", "compare_config", "run"]


def compare_config(cfg_path: str | Path, overrides: list[str] | None = None, **options: Any) -> Comparison:
    """Train the tied and untied variants of a config (seeds cfg.seed .. cfg.seed+seeds-1; finished
    runs are reused) and compare exactly those runs; `options` are CompareRequest.of's keywords. match=
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
    (seeds.py: from 3 per variant up to `max_seeds`, stopping for efficacy at the design's
    adjusted level, or for futility once the smallest detectable effect is below `min_effect`);
    with tuning, for the seeds at the chosen values. `jobs` (--jobs): train that many runs at once,
    each in its own process, or "auto" (parallel.py); 1 trains them one after another in this process."""
    return compare(CompareRequest.of(config=cfg_path, overrides=list(overrides or []), **options))


def compare(req: CompareRequest) -> Comparison:
    """The comparison a request asks for: of the runs it names (compare.judge_runs), or of a
    config's variants, trained first (run) and then judged; the request is checked before anything
    is read."""
    req.check()
    if req.config is None:
        return judge_runs(req.judging)
    spec = spec_from_options(req.tune, read_tune_block(req.config))
    plan = plan_comparison(req)  # a config that cannot be run is refused before the folder's lock is waited on
    note = None
    if req.judging.experiment is None and req.judging.out is None:  # its own folder: compare-PREFIX, as its runs
        name, note = config_folder_name(req.runs_dir, sanitize(plan.source.prefix), [t for t, _ in plan.variants])
        req.judging = dataclasses.replace(req.judging, experiment=name)
    # Held from before the first run is trained until the comparison is written: a second command
    # comparing into the same folder waits, then finds every run trained (skipped) and compares the
    # whole set, instead of failing on the runs this one is training and comparing the rest.
    with FolderLock(req.folder):
        dirs, found = run(req, spec, plan)
        found.folder_note = note
        judging = req.judging
        if spec is not None:
            judging = dataclasses.replace(judging, primary=judging.primary or "test")
        c = judge(dirs, [], judging, found)
    c.train_failures = [TrainFailure(n, e) for n, e in found.failed.items()]
    return c
