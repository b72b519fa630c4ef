"""Weights & Biases (train.log_to: [wandb]; `pip install 'tiedlm[wandb]'`).

A run is a W&B run named as its folder, in project `tiedlm` (or $WANDB_PROJECT), grouped by the
config's name; its files go to `<run>/wandb/`. The config (by section), the parameter counts and
the ledger are its W&B config; the run and parameter texts go to its summary, the scalars to its
history at the training step (the names TensorBoard uses: train/loss, val/perplexity, ...), and
the final evaluation (which the kept best weights score at an earlier step) to its summary.
Resumed, it continues the W&B run of the same id (resume="allow"). W&B's own settings apply:
WANDB_MODE=offline writes locally only, and `wandb sync` uploads later. tiedlm's output stays
tiedlm's: the console is not captured.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .base import PROJECT, ComparisonSummary, RunInfo, Tracker, by_step


def _settings():
    import wandb

    return wandb.Settings(console="off", silent=True)


class WandbTracker(Tracker):
    name, module, extra, label = "wandb", "wandb", "wandb", "W&B"

    def __init__(self) -> None:
        self.run = None

    def start(self, run_dir: Path, info: RunInfo, state: dict | None) -> dict:
        import wandb

        run_id = (state or {}).get("id") or secrets.token_hex(4)  # W&B ids: [a-z0-9]
        config = {**info.config, "params": info.params, "ledger": info.ledger or {}, "tags": info.tags}
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or PROJECT, group=info.group, name=info.name,
                              id=run_id, resume="allow", job_type="train", dir=str(run_dir),
                              config=config if state is None else None, settings=_settings(),
                              reinit="create_new")
        if state is None:
            self.run.summary.update({f"text/{k}": v for k, v in info.texts.items()})
        return {"id": run_id, "project": self.run.project}

    def scalars(self, items: list[tuple[str, float, int]]) -> None:
        for step, values in by_step(items):
            self.run.log(values, step=step)

    def final(self, items: list[tuple[str, float, int]]) -> None:
        self.run.summary.update({tag: value for tag, value, _ in items})

    def close(self, finished: bool) -> None:
        run, self.run = self.run, None
        if run is not None:
            run.finish(exit_code=0 if finished else 1)

    def comparison(self, summary: ComparisonSummary) -> None:
        import wandb

        run = wandb.init(project=os.environ.get("WANDB_PROJECT") or PROJECT, group=summary.group,
                         name=summary.name, job_type="compare", config={"interval": summary.interval},
                         dir=str(summary.folder),
                         settings=_settings(), reinit="create_new")
        try:
            run.log({"verdict": _table(summary.table), **({"tuning": _table(summary.tuning)} if summary.tuning else {}),
                     **{f"figures/{p.stem}": wandb.Image(str(p)) for p in summary.figures}})
            run.summary.update({**summary.scalars, "verdicts": "\n".join(summary.verdicts),
                                "interval": summary.interval})
            if summary.markdown is not None:
                run.save(str(summary.markdown), base_path=str(summary.markdown.parent), policy="now")
        finally:
            run.finish()


def _table(rows: list[dict]):
    import wandb

    columns = list(dict.fromkeys(k for r in rows for k in r))
    return wandb.Table(columns=columns, data=[[_cell(r.get(c)) for c in columns] for r in rows])


def _cell(value):
    return value if value is None or isinstance(value, (int, float, str, bool)) else str(value)
