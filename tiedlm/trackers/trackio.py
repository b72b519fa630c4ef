"""Trackio (train.log_to: [trackio]; `pip install 'tiedlm[trackio]'`), Hugging Face's local-first
tracker: a run goes to the SQLite database of project `tiedlm` under $TRACKIO_DIR (default
~/.cache/huggingface/trackio), named as its folder and grouped by the config's name; `trackio show
--project tiedlm` opens the dashboard. The config, counts and ledger are its config; the scalars are
logged at the training step; the final evaluation at the run's last step (Trackio keeps no
summary). Resumed, the run of the same name goes on. Trackio's banners are not shown.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from .base import PROJECT, ComparisonSummary, RunInfo, Tracker, by_step


def _quiet():
    """Trackio's banners kept off tiedlm's output (tiedlm's docs say where the dashboard is)."""
    return contextlib.redirect_stdout(io.StringIO())


class TrackioTracker(Tracker):
    name, module, extra, label = "trackio", "trackio", "trackio", "Trackio"

    def __init__(self) -> None:
        self.run = None
        self.last = 0  # the last step logged: where the final evaluation goes

    def start(self, run_dir: Path, info: RunInfo, state: dict | None) -> dict:
        import trackio

        resumed = state is not None and state.get("id")
        config = {**info.config, "params": info.params, "ledger": info.ledger or {}, **info.texts, **info.tags}
        with _quiet():
            self.run = trackio.init(project=PROJECT, name=state["id"] if resumed else info.name, group=info.group,
                                    config=None if resumed else config, resume="allow" if resumed else "never",
                                    embed=False)
        self.last = (state or {}).get("step", 0) if resumed else 0
        return {"id": self.run.name, "project": PROJECT}

    def scalars(self, items: list[tuple[str, float, int]]) -> None:
        for step, values in by_step(items):
            self.run.log(values, step=step)
            self.last = max(self.last, step)

    def final(self, items: list[tuple[str, float, int]]) -> None:
        self.run.log({tag: value for tag, value, _ in items}, step=self.last)

    def close(self, finished: bool) -> None:
        import trackio

        run, self.run = self.run, None
        if run is not None:
            with _quiet():
                trackio.finish()  # the current run, ours (Run.finish would leave it current, finished again at exit)

    def comparison(self, summary: ComparisonSummary) -> None:
        import trackio

        with _quiet():
            run = trackio.init(project=PROJECT, name=summary.name, group=summary.group, embed=False,
                               config={"interval": summary.interval, "verdicts": "\n".join(summary.verdicts)})
        try:
            tables = {"verdict": _table(summary.table)}
            if summary.tuning:
                tables["tuning"] = _table(summary.tuning)
            run.log({**summary.scalars, **tables, **{f"figures/{p.stem}": trackio.Image(p) for p in summary.figures}},
                    step=0)
        finally:
            with _quiet():
                trackio.finish()


def _table(rows: list[dict]):
    import trackio

    columns = list(dict.fromkeys(k for r in rows for k in r))
    return trackio.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows], allow_mixed_types=True)
