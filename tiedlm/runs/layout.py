"""The run folder's layout: the names of its files, where a run's folder is, what the command
line's run folders are, and clearing a folder for --overwrite.

The layout:

    runs/<name>/
      config.yaml          the resolved config
      metrics.jsonl        one JSON object per log / evaluation step
      report.json          status, parameters, final metrics, versions, config hash
      report.md            the same for people
      tokenizer/           the tokenizer the run used
      start/               a copy of what the run was built from (a pretrained start's config.json and
                           tokenizer.json, or model.hf_config's file as config.json), so that it is
                           rebuilt after its start is moved, replaced or deleted (kept_start)
      checkpoints/LATEST   the name of the newest complete checkpoint
      checkpoints/step-000500/{model.safetensors, state.pt, manifest.json}
      tb/                  TensorBoard's event files, when they are written (trackers/tensorboard.py)
      .lock                pid and host of the process that owns the run
"""

from __future__ import annotations

import contextlib
import glob
import shutil
from pathlib import Path

from ..config.checks import check_run_name
from ..errors import NotARunError
from ..files import replace_atomically

FORMAT = 1  # bumped when the run folder changes incompatibly
STATUSES = ("running", "finished", "interrupted", "diverged", "failed")

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
REPORT = "report.json"
REPORT_MD = "report.md"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
LOCK = ".lock"
TB = "tb"  # TensorBoard's event files (trackers/tensorboard.py)
START = "start"  # the copy of the run's start (model/hf_config.py start_files)
# the parts training writes: checkpoints.check_outside_runs refuses an --out inside them
MANAGED = (CONFIG, METRICS, REPORT, REPORT_MD, TOKENIZER, CHECKPOINTS, LOCK, TB, START)



def run_dir_for(out: Path, name: str) -> Path:
    """The folder of run `name` under `out`; a name that is not a plain folder name (one that
    would escape `out`, hide itself or read as an option) is a ConfigError (checks.check_run_name)."""
    check_run_name(name)
    return Path(out) / name


def keep_start(run_dir: Path, files: dict[str, Path]) -> None:
    """Copy into START what the run keeps of its start (model/hf_config.py start_files: the copy's
    name -> the file), each file written whole or not at all."""
    if not files:
        return
    folder = Path(run_dir) / START
    if folder.is_symlink():  # the run's own copy, never written through a link into another folder
        folder.unlink()
    folder.mkdir(exist_ok=True)
    for name, source in files.items():
        replace_atomically(folder / name, lambda tmp, source=source: shutil.copyfile(source, tmp))


def kept_start(run_dir: Path) -> Path | None:
    """The copy a run keeps of its start (START), None for a run without one (its model is built by
    tiedlm or from a transformers model_type, or it was trained before runs kept one)."""
    folder = Path(run_dir) / START
    return folder if (folder / "config.json").is_file() else None


def expand_runs(items: list[str]) -> list[Path]:
    """Run folders from the command line: folders, or globs (a glob matching nothing is an error)."""
    found: list[Path] = []
    for item in items:
        matches = sorted(glob.glob(item)) if any(ch in item for ch in "*?[") else [item]
        if not matches:
            raise NotARunError(f"no run folder matches {item!r} — give run folders such as runs/base-tied-s0")
        found += [Path(m) for m in matches if Path(m).name != "compare"]
    return list(dict.fromkeys(found))


def clear_run_dir(run_dir: Path) -> None:
    """Remove a run's files for --overwrite, keeping the lock this process holds."""
    for child in Path(run_dir).iterdir():
        if child.name != LOCK:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()




def clean_temporary_files(run_dir: Path) -> list[str]:
    """Remove what a killed writer left: `.NAME.*.tmp` files (files.replace_atomically) in the run folder,
    its checkpoints folder and its start folder, and `.tmp-step-*` / `.tmp-best-step-*` folders
    (runs/checkpoints.py). Only called by the process holding the run's lock, so no other writer can
    own them. Returns what was removed."""
    removed = []
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINTS, Path(run_dir) / START):
        for child in folder.iterdir() if folder.is_dir() else []:
            stray_file = child.name.startswith(".") and child.name.endswith(".tmp") and child.is_file()
            stray_dir = child.name.startswith((".tmp-step-", ".tmp-best-step-")) and child.is_dir()
            if stray_file or stray_dir:
                with contextlib.suppress(OSError):
                    shutil.rmtree(child) if stray_dir else child.unlink()
                    removed.append(child.name)
    return removed
