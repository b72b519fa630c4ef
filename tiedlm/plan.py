"""A plan of runs: what `compare --config` and `sweep` train, one stage at a time.

A run of a plan is a name and a resolved Config (PlannedRun); a stage is the runs trained before
anything looks at them (Stage): a tuning grid, the steps past its edges, the seeds at the chosen
points, each look of the sequential design. Whoever plans (compare, sweep, tuning.TuningSearch,
compare.sequential.SeedDesign) builds stages as data and hands them to an executor
(jobs.Executor); looking at the finished runs decides the next stage. Nothing here trains,
reads or writes a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .naming import sanitize


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run folder's name under the runs folder
    cfg: Any  # the resolved Config


@dataclass
class Stage:
    """Runs trained together: every one is finished (or failed) before the next stage is planned."""

    what: str  # for people: "tuning grid", "seeds 1 to 3", ...
    runs: list[PlannedRun] = field(default_factory=list)

    def unique(self) -> list[PlannedRun]:
        """The runs, each name once (the first kept): two variants may plan the same run."""
        return list({r.name: r for r in self.runs}.values())


@dataclass(frozen=True)
class RunSource:
    """How a plan makes its runs: the config file, the overrides every run has, the run names'
    prefix, and `where` (a grid file) to name in the error of an override the config refuses."""

    config: str | Path
    overrides: tuple[str, ...] = ()
    prefix: str = ""
    where: str | None = None

    def name(self, tag: str, seed: int) -> str:
        """The run's folder name, `<prefix>-<tag>-s<seed>`: known without resolving its config."""
        return sanitize(f"{self.prefix}-{tag}-s{seed}")

    def run(self, tag: str, extra: list[str], seed: int) -> PlannedRun:
        """The run named `name(tag, seed)`, with the overrides and `extra`; a ConfigError when the
        config refuses them."""
        from .config import load_config

        try:
            cfg = load_config(self.config, [*self.overrides, *extra], seed=seed)
        except ConfigError as exc:
            if self.where is None:
                raise
            raise ConfigError(f"{self.where}: {tag}: {exc}") from None
        return PlannedRun(self.name(tag, seed), cfg)
