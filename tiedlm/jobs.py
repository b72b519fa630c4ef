"""Many runs, one after another or several at once (parallel.py): what `tiedlm compare --config`
and `tiedlm sweep` train. `Executor` is the seam a plan's stages go through (plan.py): its one
method trains a stage and says what became of each run; how (in this process, in --jobs
processes) is its own business, and a run's numbers never depend on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import runs
from .config import Config, config_hash
from .errors import ConfigMismatchError, Interrupted, TiedlmError
from .files import check_writable, os_error_line
from .process import log
from .train import train_run

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
    trains one run (train_run, or a stand-in with its signature)."""

    out: Path
    progress: bool = True
    overwrite_other_config: bool = False
    train: Callable[..., Path] = train_run
    parallel: int | str = 1
    failures: dict[str, str] = field(default_factory=dict)
    results: dict[str, JobResult] = field(default_factory=dict)

    def run(self, stage: Stage) -> bool:
        """Train the stage's runs (each name once); True when none of them failed."""
        done = train_jobs([(r.name, r.cfg) for r in stage.unique()], self.out, self.progress,
                          self.overwrite_other_config, self.train or train_run, self.parallel)
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
               parallel: int | str = 1) -> list[JobResult]:
    """Train (name, config) jobs one after another into `out`, as `tiedlm compare --config` and
    `tiedlm sweep` do: finished runs are skipped, a failure is noted and passed over (always shown,
    --quiet or not), an interrupt stops everything (the run resumes when the command is re-run).
    With overwrite_other_config, a folder holding another config is retrained instead of refused;
    an unfinished run of the same config is still resumed, never thrown away. `train` trains one
    job (train_run's signature); tests pass a fake. `parallel` (--jobs: a number or "auto"): with
    more than one process for the runs to train, each trains in a process of its own (parallel.py;
    with train_run only, a fake trains in turn)."""
    if any(not run_is_finished(Path(out) / name, cfg) for name, cfg in jobs):
        check_writable(Path(out))  # a read-only or full --out: said once, before any run is trained
    if parallel != 1 and train is train_run:
        from .parallel import resolve_workers

        finished = {name for name, cfg in jobs if run_is_finished(Path(out) / name, cfg)}
        workers = resolve_workers(parallel, [cfg for name, cfg in jobs if name not in finished])
        if workers > 1:
            return _train_parallel(jobs, out, progress, overwrite_other_config, workers, finished)
    results = []
    for i, (name, cfg) in enumerate(jobs, 1):
        tag = f"[{i}/{len(jobs)}] {name}"
        if run_is_finished(Path(out) / name, cfg):
            results.append(JobResult(name, "skipped"))
            if progress:
                log(f"{tag}: finished already, skipped")
            continue
        if progress:
            log(f"[{i}/{len(jobs)}] training {name}")
        try:
            try:
                train(cfg, out=out, name=name, progress=progress)
            except ConfigMismatchError:
                if not overwrite_other_config:
                    raise
                if progress:
                    log(f"{tag}: holds another config, retraining (--overwrite)")
                train(cfg, out=out, name=name, progress=progress, overwrite=True)
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
        if results[-1].status == "failed":
            log(f"{tag} failed: {results[-1].error}")
    return results


def _train_parallel(jobs: list[tuple[str, Config]], out: Path, progress: bool, overwrite_other_config: bool,
                    workers: int, finished: set[str]) -> list[JobResult]:
    """train_jobs with `workers` processes: the same skips, refusals and results, in the same order.
    `finished`: the jobs whose runs are finished already (train_jobs read their reports)."""
    from .parallel import train_parallel

    results: dict[str, JobResult] = {}
    todo = []
    for i, (name, cfg) in enumerate(jobs, 1):
        run_dir = runs.run_dir_for(Path(out), name)
        if name in finished:
            results[name] = JobResult(name, "skipped")
            if progress:
                log(f"[{i}/{len(jobs)}] {name}: finished already, skipped")
            continue
        overwrite = False
        try:
            runs.existing_state(run_dir, cfg)
        except ConfigMismatchError as exc:
            if not overwrite_other_config:
                results[name] = JobResult(name, "failed", str(exc))
                log(f"[{i}/{len(jobs)}] {name} failed: {exc}")
                continue
            overwrite = True
            if progress:
                log(f"[{i}/{len(jobs)}] {name}: holds another config, retraining (--overwrite)")
        except TiedlmError:
            pass  # the child meets it again and says it
        todo.append((name, cfg, overwrite))
    outcome = train_parallel(todo, Path(out), workers, progress, total=len(jobs), done_before=len(results))
    for name, error in outcome.items():
        results[name] = JobResult(name, "finished") if error is None else JobResult(name, "failed", error)
    return [results[name] for name, _ in jobs if name in results]
