"""Many runs, one after another: what `tiedlm compare --config` and `tiedlm sweep` train."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import runs
from .config import Config, config_hash
from .errors import ConfigMismatchError, Interrupted, TiedlmError
from .process import log
from .train import train_run



@dataclass
class JobResult:
    """What became of one job of train_jobs."""

    name: str
    status: str  # skipped (finished already) | finished | failed
    error: str | None = None


def run_is_finished(run_dir: Path, cfg: Config) -> bool:
    """True when run_dir holds a finished run of exactly this variant and seed."""
    try:
        report = runs.read_report(Path(run_dir))
    except (TiedlmError, OSError):
        return False
    return (report is not None and report.status == "finished"
            and report.config_hash == config_hash(cfg) and report.seed == cfg.seed)


def train_jobs(jobs: list[tuple[str, Config]], out: Path, progress: bool = True,
               overwrite_other_config: bool = False, train: Callable[..., Path] = train_run) -> list[JobResult]:
    """Train (name, config) jobs one after another into `out`, as `tiedlm compare --config` and
    `tiedlm sweep` do: finished runs are skipped, a failure is noted and passed over (always shown,
    --quiet or not), an interrupt stops everything (the run resumes when the command is re-run).
    With overwrite_other_config, a folder holding another config is retrained instead of refused;
    an unfinished run of the same config is still resumed, never thrown away. `train` trains one
    job (train_run's signature); tests pass a fake."""
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
        except Exception as exc:  # a bug or out-of-memory in one run must not cost the others
            results.append(JobResult(name, "failed", f"{type(exc).__name__}: {exc}"))
        else:
            results.append(JobResult(name, "finished"))
        if results[-1].status == "failed":
            log(f"{tag} failed: {results[-1].error}")
    return results
