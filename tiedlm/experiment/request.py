"""What a comparison of a config was asked: `CompareRequest`, every option of `tiedlm compare
--config` and of compare_config, checked once by `check()` (naming the CLI's options) before
anything is read, trained or written. The judging side's own options (which weights, which split,
the baseline, where the comparison goes) are its `judging` (compare.Judging)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from ..config.checks import check_at_most, check_positive
from ..compare import Judging
from ..compare.matching import match_by
from .parallel import parse_jobs
from .seeds import check_auto

SEEDS_LIMIT = 1000  # compare_config seeds: a typo (1000000) would queue a million trainings per variant


@dataclass
class CompareRequest:
    """One comparison: of finished runs (its `judging`'s paths, or every run under its runs_dir),
    or, with `config`, of the tied and untied variants of a config trained first (`overrides`,
    `seeds` or the sequential design, `tune`, `match`). `judging` (compare.Judging) is what the
    judging side reads: which weights, which split, the baseline, where the runs are and where the
    comparison goes. `train` trains one run (train.train_run, or a stand-in with its signature);
    `jobs` is --jobs. `CompareRequest.of` takes both sides' options as one set of keywords."""

    config: str | Path | None = None
    overrides: list[str] = field(default_factory=list)
    judging: Judging = field(default_factory=Judging)
    seeds: int | str = 1
    max_seeds: int | None = None
    min_effect: float | None = None
    tune: list[str] = field(default_factory=list)
    match: str | None = None
    overwrite: bool = False
    progress: bool = True
    jobs: int | str | None = 1
    train: Callable[..., Any] | None = None
    design: tuple[int, float] = (10, 0.02)  # --max-seeds and --min-effect with their defaults (check)

    @classmethod
    def of(cls, **options: Any) -> CompareRequest:
        """A request from compare_config's keywords: Judging's (select, primary, baseline, runs_dir,
        out, analyze, overwrite_output, paths) go to its `judging`, the rest are the request's."""
        judged = {f.name for f in fields(Judging)}
        return cls(judging=Judging(**{k: v for k, v in options.items() if k in judged}),
                   **{k: v for k, v in options.items() if k not in judged})

    @property
    def runs_dir(self) -> Path:
        """Where the runs are trained (the judging side's runs_dir)."""
        return Path(self.judging.runs_dir or "runs")

    @property
    def folder(self) -> Path:
        """Where the comparison is written."""
        return self.judging.folder

    def check(self) -> CompareRequest:
        """Refuse (ConfigError) what cannot be asked, before any file is read; returns self."""
        if self.config is not None:
            self._check_training()
            self.judging.runs_dir = self.runs_dir  # trained into runs/ unless --out names another
        self.judging.check()
        if self.config is not None:
            self.jobs = parse_jobs(self.jobs)
        return self

    def _check_training(self) -> None:
        """compare --config's own options, before its config is read."""
        if self.match is not None:
            match_by(self.match)  # refuses an unknown --match
        if self.seeds != "auto" and isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            check_positive(self.seeds, "--seeds")
            check_at_most(self.seeds, SEEDS_LIMIT, "--seeds", "each seed trains every variant once more")
        self.design = check_auto(self.seeds, self.max_seeds, self.min_effect)
        self.overrides = list(self.overrides or [])
        self.tune = list(self.tune or [])
