"""What every experiment tracker of train.log_to shares: the check that its package is there
(a missing one is a ConfigError that names the extra to install), what a run logs about itself
(its config, ledger and parameter counts: RunInfo), what a comparison's summary run holds
(ComparisonSummary), and the run folder's trackers.json, which keeps each tracker's run id and the
last step it holds, so that a resumed run continues the same tracker run with no step twice.

Each tracker (wandb.py, mlflow.py, trackio.py) is a class with the methods of `Tracker`; none
of them imports its package at module level (`tiedlm --help` imports none of them).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import to_dict
from ..config.checks import flatten
from ..errors import ConfigError
from ..files import atomic_write_text, json_text
from ..runs import RunReport
from .tensorboard import run_texts

STATE = "trackers.json"  # in a run folder: {tracker: {"id": ..., "step": last step it holds, ...}}
PROJECT = "tiedlm"  # the W&B and Trackio project a run goes to (WANDB_PROJECT overrides W&B's)


def install_hint(extra: str) -> str:
    return f"pip install 'tiedlm[{extra}]'"


def require(name: str, module: str, extra: str) -> None:
    """A ConfigError, naming the extra, when the tracker's package cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"train.log_to: {name} needs the {module} package — {install_hint(extra)}") from None


@dataclass
class RunInfo:
    """What a run logs about itself once, when its tracker run starts."""

    name: str  # the run folder's name: the tracker run's name
    group: str  # the config's name: the runs of one comparison share it (W&B group, MLflow experiment)
    config: dict  # the resolved config, by section
    params: dict  # the parameter breakdown (report.json's params)
    ledger: dict | None  # what E and W_out received (ledger.Ledger)
    texts: dict[str, str]  # Markdown: the run, and its parameter table (as TensorBoard shows them)
    tags: dict[str, str] = field(default_factory=dict)  # tie, seed, variant

    def flat_config(self) -> dict[str, Any]:
        """The config as dotted keys (model.n_embd), with the counts as params.<name>."""
        out = flatten(self.config, leaves=())  # every value a scalar: model.hf_overrides.rms_norm_eps
        out.update({f"params.{k}": v for k, v in self.params.items() if not isinstance(v, dict)})
        return out


def run_info(run_dir: Path, report: RunReport) -> RunInfo:
    """What a tracker's run starts with. The ledger is the report's, or, for a run that has not
    finished yet (training records it at the end), made here from its config and counts."""
    from ..runs.ledger import ledger_of

    cfg = report.config
    tags = {"seed": str(report.seed), "variant": str(report.config_hash)}
    if cfg is not None:
        tags["tie"] = cfg.model.tie.label
    return RunInfo(name=Path(run_dir).name, group=cfg.name if cfg is not None else Path(run_dir).name,
                   config=to_dict(cfg) if cfg is not None else {}, params=dict(report.params or {}),
                   ledger=report.ledger or (ledger_of(cfg, report.params).to_json() if cfg and report.params else None),
                   texts=run_texts(run_dir, report), tags=tags)


@dataclass
class ComparisonSummary:
    """What a comparison's summary run holds: the verdict table (one row per variant), the
    sentences of the verdict, the interval's definition, the tuning table (one row per point
    tried), the figures and comparison.md, under the group its runs share."""

    name: str
    group: str
    folder: Path  # the comparison's folder (W&B's local files go there)
    table: list[dict]
    verdicts: list[str]
    interval: str
    tuning: list[dict]
    figures: list[Path]
    markdown: Path | None
    scalars: dict[str, float]  # the primary contrast's numbers, as metrics


class Tracker:
    """One tracker's client calls. `start` opens (or, given the state kept by an earlier attempt,
    resumes) the tracker run and returns the state to keep; `scalars` logs (tag, value, step)
    triples in step order; `final` the final evaluation's; `close` ends the run (`finished`: it
    did finish). `comparison` logs a comparison's summary run, start to end."""

    name = ""  # as train.log_to names it
    module = ""  # the package imported
    extra = ""  # pyproject's extra that installs it
    label = ""  # as messages name it

    @classmethod
    def require(cls) -> None:
        require(cls.name, cls.module, cls.extra)

    def start(self, run_dir: Path, info: RunInfo, state: dict | None) -> dict:
        raise NotImplementedError

    def scalars(self, items: list[tuple[str, float, int]]) -> None:
        raise NotImplementedError

    def final(self, items: list[tuple[str, float, int]]) -> None:
        raise NotImplementedError

    def close(self, finished: bool) -> None:
        raise NotImplementedError

    def comparison(self, summary: ComparisonSummary) -> None:
        raise NotImplementedError


def by_step(items: list[tuple[str, float, int]]) -> list[tuple[int, dict[str, float]]]:
    """(step, {tag: value}) in the order the steps first come."""
    out: dict[int, dict[str, float]] = {}
    for tag, value, step in items:
        out.setdefault(step, {})[tag] = value
    return list(out.items())


def read_state(run_dir: Path) -> dict:
    """trackers.json, or {} where there is none or it does not parse (its trackers start new runs)."""
    try:
        data = json.loads((Path(run_dir) / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(run_dir: Path, state: dict) -> None:
    atomic_write_text(Path(run_dir) / STATE, json_text(state, indent=2) + "\n")
