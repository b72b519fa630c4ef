"""MLflow (train.log_to: [mlflow]; `pip install 'tiedlm[mlflow]'`: mlflow-skinny, and SQLAlchemy
for MLflow's default store).

MLflow's own settings choose the store: $MLFLOW_TRACKING_URI (a server, `sqlite:///mlflow.db`, or
a local folder `file:./mlruns` with MLFLOW_ALLOW_FILE_STORE=true), else MLflow's default,
`sqlite:///mlflow.db` in the working directory. A run is an MLflow run named as its folder, in the
experiment named by the config's name (or $MLFLOW_EXPERIMENT_NAME), so the runs of one comparison
share it. The config is its params (dotted keys, `params.<name>` for the counts), the ledger and
the texts are artifacts, the scalars are metrics at the training step, and the final evaluation
metrics at its own step. Resumed, the same MLflow run goes on (its id is in trackers.json).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .base import ComparisonSummary, RunInfo, Tracker

BATCH = 100  # params per log_batch call (MLflow's limit); metrics go 1000 a call
VALUE_LIMIT = 500  # characters of a param's value that every MLflow store keeps


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _experiment(client, name: str) -> str:
    """The experiment's id, made if there is none (another process may make it first: --jobs)."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or name
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _now() -> int:
    return int(time.time() * 1000)


class MlflowTracker(Tracker):
    name, module, extra, label = "mlflow", "mlflow", "mlflow", "MLflow"

    def __init__(self) -> None:
        self.client = None
        self.run_id: str | None = None

    def start(self, run_dir: Path, info: RunInfo, state: dict | None) -> dict:
        from mlflow.entities import Param

        self.client = client = _client()
        if state is not None and state.get("id"):
            self.run_id = state["id"]
            client.update_run(self.run_id, status="RUNNING")
        else:
            run = client.create_run(_experiment(client, info.group), run_name=info.name,
                                    tags={"tiedlm.group": info.group, **{f"tiedlm.{k}": v for k, v in info.tags.items()}})
            self.run_id = run.info.run_id
            params = [Param(k, str(v)[:VALUE_LIMIT]) for k, v in info.flat_config().items()]
            for i in range(0, len(params), BATCH):
                client.log_batch(self.run_id, params=params[i:i + BATCH])
            if info.ledger:
                client.log_dict(self.run_id, info.ledger, "ledger.json")
            client.log_dict(self.run_id, info.config, "config.json")
            for tag, text in info.texts.items():
                client.log_text(self.run_id, text, f"{tag}.md")
        return {"id": self.run_id, "tracking_uri": client.tracking_uri}

    def scalars(self, items: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = _now()
        metrics = [Metric(tag, value, now, step) for tag, value, step in items]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def final(self, items: list[tuple[str, float, int]]) -> None:
        self.scalars(items)

    def close(self, finished: bool) -> None:
        client, self.client = self.client, None
        if client is not None and self.run_id is not None:
            client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")

    def comparison(self, summary: ComparisonSummary) -> None:
        from mlflow.entities import Metric

        client = _client()
        run = client.create_run(_experiment(client, summary.group), run_name=summary.name,
                                tags={"tiedlm.group": summary.group, "tiedlm.kind": "comparison"})
        run_id, status = run.info.run_id, "FAILED"
        try:
            now = _now()
            client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in summary.scalars.items()])
            client.log_table(run_id, _columns(summary.table), "verdict.json")
            if summary.tuning:
                client.log_table(run_id, _columns(summary.tuning), "tuning.json")
            client.log_text(run_id, "\n\n".join(summary.verdicts), "verdict.md")
            client.log_text(run_id, summary.interval, "interval.md")
            for path in summary.figures + ([summary.markdown] if summary.markdown is not None else []):
                client.log_artifact(run_id, str(path))
            status = "FINISHED"
        finally:
            client.set_terminated(run_id, status)


def _columns(rows: list[dict]) -> dict[str, list]:
    """Rows as MLflow's table form (a column of values per key)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}
