"""Many runs, one after another or several at once (parallel.py): what `tiedlm compare --config`
and `tiedlm sweep` train. `Executor` is the seam a plan's stages go through (plan.py): its one
method trains a stage and says what became of each run; how (in this process, in --jobs
processes, kept from stage to stage while it is open as a context manager) is its own business,
and a run's numbers never depend on it. `Tally` (parallel.py) counts the comparison's runs for the line printed
as each one ends: "run 3 of 10, about 4 min left"."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import runs
from ..config import Config
from ..errors import ConfigMismatchError, Interrupted, TiedlmError
from ..files import check_writable, os_error_line
from ..process import log
from ..train import train_run
from ..config.identity import config_hash
from .parallel import Tally, WorkerPool, resolve_workers, train_parallel, train_sharded

if TYPE_CHECKING:
    from .plan import Stage


@dataclass
class JobResult:
    """What became of one job of train_jobs."""

    name: str
    status: str  # skipped (finished already) | finished | failed
    error: str | None = None


@dataclass
class Executor:
    """Trains a plan's stages into `out`: finished runs are skipped, a failure is kept (in
    `failures`, by run name) and passed over. `parallel` is --jobs (a number or "auto"); `train`
    trains one run (train_run, or a stand-in with its signature); `may_grow`: later stages may add
    runs (for the count of `tally`). Used as a context manager, its --jobs workers are started at
    the first stage that needs them and kept until the end of the `with`; otherwise each stage
    starts and ends its own."""

    out: Path
    progress: bool = True
    overwrite_other_config: bool = False
    train: Callable[..., Path] = train_run
    parallel: int | str = 1
    may_grow: bool = False
    failures: dict[str, str] = field(default_factory=dict)
    results: dict[str, JobResult] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)
    pool: WorkerPool | None = field(default=None, repr=False)  # a parallel.WorkerPool while open

    def __enter__(self) -> "Executor":
        if self.parallel != 1 and self.pool is None:
            self.pool = WorkerPool()  # no process yet: the first stage with more than one run starts them
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run(self, stage: Stage) -> bool:
        """Train the stage's runs (each name once); True when none of them failed."""
        self.tally.may_grow = self.may_grow
        done = train_jobs([(r.name, r.cfg) for r in stage.unique()], self.out, self.progress,
                          self.overwrite_other_config, self.train or train_run, self.parallel,
                          tally=self.tally, pool=self.pool)
        self.results.update({r.name: r for r in done})
        self.failures.update({r.name: r.error for r in done if r.status == "failed"})
        return all(r.status != "failed" for r in done)


def run_is_finished(run_dir: Path, cfg: Config) -> bool:
    """True when run_dir holds a finished run of exactly this variant and seed."""
    try:
        report = runs.read_report(Path(run_dir))
    except (TiedlmError, OSError):
        return False
    return (report is not None and report.status == "finished"
            and report.config_hash == config_hash(cfg) and report.seed == cfg.seed)


def train_jobs(jobs: list[tuple[str, Config]], out: Path, progress: bool = True,
               overwrite_other_config: bool = False, train: Callable[..., Path] = train_run,
               parallel: int | str = 1, tally: Tally | None = None, pool: WorkerPool | None = None) -> list[JobResult]:
    """Train (name, config) jobs one after another into `out`, as `tiedlm compare --config` and
    `tiedlm sweep` do: finished runs are skipped, a failure is noted and passed over (always shown,
    --quiet or not), an interrupt stops everything (the run resumes when the command is re-run).
    With overwrite_other_config, a folder holding another config is retrained instead of refused;
    an unfinished run of the same config is still resumed, never thrown away. `train` trains one
    job (train_run's signature); tests pass a fake. `parallel` (--jobs: a number or "auto"): with
    more than one process for the runs to train, each trains in a process of its own (parallel.py;
    with train_run only, a fake trains in turn), on `pool`'s workers (a parallel.WorkerPool, kept by
    the caller across calls) or on workers started for this call. `tally`: the runs of the whole
    comparison, for the "run 3 of 10, about 4 min left" line after each run (these jobs alone when
    None)."""
    tally = tally if tally is not None else Tally()
    finished = {name for name, cfg in jobs if run_is_finished(Path(out) / name, cfg)}
    tally.expect([name for name, _ in jobs], finished)
    if len(finished) < len({name for name, _ in jobs}):
        check_writable(Path(out))  # a read-only or full --out: said once, before any run is trained
    sharded = train is train_run and any(cfg.train.parallel == "fsdp" for _, cfg in jobs)
    if sharded and parallel != 1 and progress:
        log("train.parallel fsdp: the runs are trained one after another, each a torchrun job of its own processes")
    if parallel != 1 and train is train_run and not sharded:
        workers = resolve_workers(parallel, [cfg for name, cfg in jobs if name not in finished])
        if workers > 1:
            return _train_parallel(jobs, out, progress, overwrite_other_config, workers, finished, tally, pool)
    results = []
    for name, cfg in jobs:
        tag = tally.tag(name)
        if run_is_finished(Path(out) / name, cfg):
            results.append(JobResult(name, "skipped"))
            tally.end(name)
            if progress:
                log(f"{tag}: finished already, skipped")
            continue
        if progress:
            log(f"{tag}: training")
        started = time.monotonic()
        trains = train_sharded if train is train_run and cfg.train.parallel == "fsdp" else train
        try:
            try:
                trains(cfg, out=out, name=name, progress=progress)
            except ConfigMismatchError:
                if not overwrite_other_config:
                    raise
                if progress:
                    log(f"{tag}: holds another config, retraining (--overwrite)")
                trains(cfg, out=out, name=name, progress=progress, overwrite=True)
        except (Interrupted, KeyboardInterrupt):
            raise
        except TiedlmError as exc:
            results.append(JobResult(name, "failed", str(exc)))
        except OSError as exc:  # a path that cannot be written: the line `tiedlm train` would print
            results.append(JobResult(name, "failed", os_error_line(exc)))
        except Exception as exc:  # a bug or out-of-memory in one run must not cost the others
            results.append(JobResult(name, "failed", f"{type(exc).__name__}: {exc}"))
        else:
            results.append(JobResult(name, "finished"))
        tally.end(name, time.monotonic() - started if results[-1].status == "finished" else None)
        if results[-1].status == "failed":
            log(f"{tag} failed: {results[-1].error}")
        if progress:
            log(f"{tag}: {tally.line()}")
    return results


def _train_parallel(jobs: list[tuple[str, Config]], out: Path, progress: bool, overwrite_other_config: bool,
                    workers: int, finished: set[str], tally: Tally, pool: WorkerPool | None) -> list[JobResult]:
    """train_jobs with `workers` processes: the same skips, refusals and results, in the same order.
    `finished`: the jobs whose runs are finished already (train_jobs read their reports)."""
    results: dict[str, JobResult] = {}
    todo = []
    for name, cfg in jobs:
        run_dir = runs.run_dir_for(Path(out), name)
        if name in finished:
            results[name] = JobResult(name, "skipped")
            tally.end(name)
            if progress:
                log(f"{tally.tag(name)}: finished already, skipped")
            continue
        overwrite = False
        try:
            runs.existing_state(run_dir, cfg)
        except ConfigMismatchError as exc:
            if not overwrite_other_config:
                results[name] = JobResult(name, "failed", str(exc))
                tally.end(name)
                log(f"{tally.tag(name)} failed: {exc}")
                continue
            overwrite = True
            if progress:
                log(f"{tally.tag(name)}: holds another config, retraining (--overwrite)")
        except TiedlmError:
            pass  # the child meets it again and says it
        todo.append((name, cfg, overwrite))
    outcome = train_parallel(todo, Path(out), workers, progress, pool=pool, tally=tally)
    for name, error in outcome.items():
        results[name] = JobResult(name, "finished") if error is None else JobResult(name, "failed", error)
    return [results[name] for name, _ in jobs if name in results]
