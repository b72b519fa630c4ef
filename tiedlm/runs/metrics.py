"""metrics.jsonl: one JSON object per logged or evaluated step, appended with an fsync, read back
skipping a torn last line, and trimmed to a checkpoint's step on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import files
from .failures import writing
from .layout import METRICS


def append_metrics(run_dir: Path, records: list[dict]) -> None:
    """Append records; a torn last line (a kill or a full disk mid-write) is skipped on reading and
    cut away by trim_metrics on resume."""
    if not records:
        return
    path = Path(run_dir) / METRICS
    with writing(path), open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(files.json_text(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(run_dir: Path) -> list[dict]:
    """Every complete record of metrics.jsonl; a torn last line (a kill mid-write) is skipped."""
    return read_metrics_counted(run_dir)[0]


def read_metrics_counted(run_dir: Path) -> tuple[list[dict], int]:
    """(read_metrics's records, how many non-blank lines were skipped as unreadable)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return [], 0
    out, skipped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            skipped += bool(line.strip())
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            skipped += 1
    return out, skipped


def trim_metrics(run_dir: Path, up_to_step: int) -> None:
    """Keep only the records of steps <= up_to_step (those the checkpoint covers), so that a
    resumed run's metrics.jsonl has no duplicated or missing steps."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return
    # final-evaluation records are written after the last checkpoint: a resume writes them again
    keep = [r for r in read_metrics(run_dir) if int(r.get("step", 0)) <= up_to_step and r.get("kind") != "final"]
    text = "".join(files.json_text(r) + "\n" for r in keep)
    with writing(path):
        files.atomic_write_text(path, text)
