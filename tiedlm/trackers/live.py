"""The trackers of train.log_to while a run trains (TrainingTrackers, TensorBoard's TrainingLog
among them), and a comparison's summary run (log_comparison).

A tracker is fed what metrics.jsonl is appended (at each checkpoint and at the end), so it
holds what the record holds. Each keeps in trackers.json its run id and the last step it holds:
a resumed run reopens that tracker run and sends only later steps, so no step is there twice
(where an attempt was killed between a write and its checkpoint, the tracker keeps the steps it
had, which an exact resume repeats). A tracker that fails (network, disk, its own error) is
reported once and stops; training goes on, and metrics.jsonl stays complete.
"""

from __future__ import annotations

from pathlib import Path

from .. import runs
from ..errors import ConfigError
from ..files import first_line
from ..process import log
from .tensorboard import TrainingLog, final_scalars, record_scalars
from .tensorboard import require as require_tensorboard
from .base import RunInfo, Tracker, read_state, run_info, write_state
from .mlflow import MlflowTracker
from .summary import comparison_summary
from .trackio import TrackioTracker
from .wandb import WandbTracker

TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (WandbTracker, MlflowTracker, TrackioTracker)}
TB = "tensorboard"


def require(targets: list[str]) -> None:
    """A ConfigError naming the extra to install for the first logger whose package is missing."""
    for name in targets:
        if name == TB:
            require_tensorboard()
        elif name in TRACKERS:
            TRACKERS[name].require()
        else:
            raise ConfigError(f"train.log_to: {name!r} is not a logger tiedlm writes to")


class _Live:
    """One tracker of a training run; `stopped` after its first failure, which is said once."""

    def __init__(self, tracker: Tracker, run_dir: Path):
        self.tracker, self.run_dir = tracker, run_dir
        self.step = 0  # the last step the tracker holds
        self.stopped = False
        self.started = False

    def fail(self, exc: Exception, what: str) -> None:
        if not self.stopped:
            self.stopped = True
            log(f"{self.run_dir.name}: {self.tracker.label} logging stopped while {what} "
                f"({type(exc).__name__}: {first_line(exc)}); training goes on and metrics.jsonl is complete")
        try:
            if self.started:
                self.tracker.close(False)
        except Exception:  # the tracker is off; a second failure says nothing new
            pass


class TrainingTrackers:
    """Every logger of train.log_to for one run, on the rank that writes the run folder."""

    def __init__(self, targets: list[str], run_dir: Path, report: runs.RunReport, resumed: bool):
        self.run_dir = Path(run_dir)
        self.tb = TrainingLog(run_dir, report) if TB in targets else None
        self.live = [_Live(TRACKERS[name](), self.run_dir) for name in targets if name in TRACKERS]
        self.finished = False
        if not self.live:
            return
        kept = read_state(run_dir) if resumed else {}
        info = run_info(run_dir, report)
        records = runs.read_metrics(run_dir)  # trimmed to the checkpoint this attempt resumes from
        for live in self.live:
            self._start(live, info, kept.get(live.tracker.name) if isinstance(kept.get(live.tracker.name), dict)
                        else None)
            self._send(live, records)

    def _start(self, live: _Live, info: RunInfo, kept: dict | None) -> None:
        try:
            entry = live.tracker.start(self.run_dir, info, kept)
            live.started = True
            live.step = int(kept.get("step", 0)) if kept else 0
            self._keep(live, entry)
        except Exception as exc:
            live.fail(exc, "starting")

    def _keep(self, live: _Live, entry: dict | None = None) -> None:
        state = read_state(self.run_dir)
        state[live.tracker.name] = {**(entry or state.get(live.tracker.name) or {}), "step": live.step}
        write_state(self.run_dir, state)

    def _send(self, live: _Live, records: list[dict]) -> None:
        steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
        new = [s for r in records for s in record_scalars(r) if s[2] > live.step]
        if live.stopped or not steps or max(steps) <= live.step:
            return
        try:
            if new:
                live.tracker.scalars(new)
            live.step = max(steps)
            self._keep(live)
        except Exception as exc:
            live.fail(exc, "logging")

    def append(self, records: list[dict]) -> None:
        """The records just appended to metrics.jsonl."""
        if self.tb is not None:
            self.tb.append(records)
        for live in self.live:
            self._send(live, records)

    def finish(self, report: runs.RunReport) -> None:
        """The final evaluation, from the finished report."""
        if self.tb is not None:
            self.tb.finish(report)
        self.finished = True
        items = final_scalars(report)
        for live in self.live:
            if not live.stopped:
                try:
                    live.tracker.final(items)
                except Exception as exc:
                    live.fail(exc, "logging the final evaluation")

    def close(self) -> None:
        """End every tracker run; never raises (called on every way out of training)."""
        if self.tb is not None:
            self.tb.close()
        for live in self.live:
            if not live.stopped and live.started:
                try:
                    live.tracker.close(self.finished)
                except Exception as exc:
                    live.fail(exc, "closing")
                live.started = False


def log_comparison(targets: list[str], data: dict, files: dict[str, str], group: str) -> list[str]:
    """The comparison (comparison.json's form, `data`, and its files) as a summary run in each
    tracker of `targets` (TensorBoard has none), under `group`; returns a line for each, saying
    where it went or why it did not. A failure never fails the comparison."""
    summary = comparison_summary(data, files, group)
    lines = []
    for name in targets:
        if name not in TRACKERS:
            continue
        tracker = TRACKERS[name]()
        try:
            tracker.require()
            tracker.comparison(summary)
            lines.append(f"logged the comparison to {tracker.label} as {summary.name!r} in group {group!r}")
        except Exception as exc:
            lines.append(f"the comparison was not logged to {tracker.label} ({type(exc).__name__}: "
                         f"{first_line(exc)})")
    return lines
