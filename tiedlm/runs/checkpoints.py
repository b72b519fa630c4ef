"""Checkpoints of a run: `checkpoints/step-N/` folders and the `checkpoints/LATEST` pointer.

    checkpoints/LATEST                 the name of the newest complete checkpoint
    checkpoints/step-0000500/          model.safetensors (a tied matrix once), state.pt (optimizer,
                                       counters, RNG states), manifest.json (each file's SHA-256)
    checkpoints/best-step-0000300/     train.keep_best: the weights of the best validation evaluation
                                       (model.safetensors and manifest.json), named by the state
    checkpoints/step-0000500/          a run sharded with FSDP (train.parallel: fsdp, sharded.py):
                                       shards/ (torch.distributed.checkpoint: the weights, a tied
                                       matrix once, and the optimizer, each rank's part) in place of
                                       model.safetensors, state.pt without the optimizer, and the
                                       manifest with every shard's SHA-256

A checkpoint is written into a temporary folder (files fsynced, the manifest last) and renamed
into place; LATEST is then pointed at it, and only then is the previous one removed. Nothing is
unpickled: weights load with safetensors, state with torch.load(weights_only=True), and every
file is checked against the manifest first.

Since a resume removes every checkpoint folder but the newest, nothing else may be written in
checkpoints/, nor in the run's other parts that training rewrites: check_outside_runs is the one
check of every command that writes elsewhere (export --out, analyze --out, compare).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import ConfigError, DamagedRunError, RunError
from ..files import atomic_write_json, atomic_write_text, fsync_dir, sha256_file
from . import CHECKPOINTS, CONFIG, FORMAT, MANAGED, METRICS, REPORT, check_format, writing

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
MANIFEST = "manifest.json"
SHARDS = "shards"  # a sharded checkpoint's torch.distributed.checkpoint folder


def new_checkpoint_folder(run_dir: Path, step: int) -> Path:
    """The temporary folder a checkpoint of `step` is written into before it is renamed into place."""
    root = Path(run_dir) / CHECKPOINTS
    name = f"step-{step:07d}"
    with writing(root / name):
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))


def save_checkpoint(run_dir: Path, step: int, tensors: dict | None, metadata: dict, state: dict,
                    keep_previous: bool = False, tmp: Path | None = None) -> Path:
    """Write checkpoints/step-N atomically: weights (safetensors), training state (torch.save),
    and a manifest with each file's SHA-256, in a temporary folder renamed into place; then
    LATEST is pointed at it and older checkpoints are removed. A sharded checkpoint's `tmp`
    (new_checkpoint_folder) already holds its shards, and `tensors` is None."""
    root = Path(run_dir) / CHECKPOINTS
    name = f"step-{step:07d}"
    with writing(root / name):
        tmp = tmp or new_checkpoint_folder(run_dir, step)
        final = _write_checkpoint_folder(tmp, root, name, step, tensors, metadata, state)
    with writing(root / "LATEST"):
        atomic_write_text(root / "LATEST", final.name + "\n")
    if not keep_previous:
        for old in _checkpoint_folders(root):
            if old.name != final.name:
                shutil.rmtree(old, ignore_errors=True)
    return final


def save_best_weights(run_dir: Path, step: int, tensors: dict, metadata: dict) -> Path:
    """Write checkpoints/best-step-N (weights and manifest, no training state) atomically, as
    save_checkpoint does; which one is the best is recorded in the training state, not here."""
    root = Path(run_dir) / CHECKPOINTS
    name = f"{BEST_PREFIX}{step:07d}"
    with writing(root / name):
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
        return _write_checkpoint_folder(tmp, root, name, step, tensors, {**metadata, "kind": "best"}, None)


def best_weight_folders(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.iterdir() if p.is_dir() and _BEST_DIR.fullmatch(p.name)) if root.is_dir() else []


def prune_best_weights(run_dir: Path, keep: set) -> list[str]:
    """Remove the kept-best folders whose names are not in `keep`; return their names."""
    removed = []
    for path in best_weight_folders(run_dir):
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def _write_checkpoint_folder(tmp: Path, root: Path, name: str, step: int, tensors: dict | None, metadata: dict,
                             state: dict | None) -> Path:
    """Fill tmp and rename it to root/name (or name-1, ... if that exists); tmp is removed on failure.
    Every file in tmp (a sharded checkpoint's shards too) is fsynced and named in the manifest."""
    import torch

    try:
        if tensors is not None:
            write_safetensors(tmp / MODEL_FILE, tensors, {k: str(v) for k, v in metadata.items()})
        if state is not None:
            torch.save(state, tmp / STATE_FILE)
        files = {}
        for fname in sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()):
            with open(tmp / fname, "rb") as f:
                os.fsync(f.fileno())
            files[fname] = {"sha256": sha256_file(tmp / fname), "bytes": (tmp / fname).stat().st_size}
        manifest = {"format": FORMAT, "step": step, "files": files, **{k: v for k, v in metadata.items()}}
        with writing(tmp / MANIFEST):  # named as before: inside the checkpoint's own writing()
            atomic_write_json(tmp / MANIFEST, manifest)
        final = root / name
        n = 1
        while final.exists():  # the same step saved again (a resume at it): a new name, the old one kept
            final, n = root / f"{name}-{n}", n + 1
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def write_safetensors(path: Path, tensors: dict, metadata: dict) -> None:
    """A safetensors file whose bytes follow from its tensors and metadata alone. safetensors keeps
    the metadata in a hash map whose order changes from one save to the next, so two runs with the
    same weights wrote files of other SHA-256s; here the header is written again with its keys
    sorted (padded to 8 bytes with spaces, as safetensors pads it), the tensor data unchanged."""
    from safetensors.torch import save

    raw = save(tensors, metadata=metadata)
    n = int.from_bytes(raw[:8], "little")
    header = json.dumps(json.loads(raw[8:8 + n]), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    header_bytes = header.encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        f.write(memoryview(raw)[8 + n:])


_STEP_DIR = re.compile(r"step-(\d+)(?:-(\d+))?")
BEST_PREFIX = "best-step-"
_BEST_DIR = re.compile(r"best-step-(\d+)(?:-(\d+))?")


def _checkpoint_folders(root: Path) -> list[Path]:
    """Complete checkpoint folders (step-N, or step-N-k for a step saved again), newest first.
    Temporary folders (.tmp-*) are never complete: they are renamed only once fsynced."""
    found = []
    for child in root.iterdir() if root.is_dir() else []:
        m = _STEP_DIR.fullmatch(child.name)
        if m and child.is_dir():
            found.append(((int(m.group(1)), int(m.group(2) or 0)), child))
    return [path for _, path in sorted(found, reverse=True)]


def resolve_checkpoint(run_dir: Path) -> tuple[Path | None, str | None]:
    """The checkpoint to resume from, and a note when it was not found through LATEST.

    LATEST is written after its folder is renamed into place, so a kill between the two, or a
    LATEST deleted by hand, leaves complete checkpoints without a pointer: then the newest one
    that verifies against its manifest is used. A folder whose checkpoints exist but none
    verifies is refused, never silently restarted (a restart would delete them)."""
    root = Path(run_dir) / CHECKPOINTS
    latest = root / "LATEST"
    try:
        name = latest.read_text(encoding="utf-8").strip() if latest.is_file() else None
    except (OSError, UnicodeDecodeError):
        name = "(unreadable)"
    if name is not None and _STEP_DIR.fullmatch(name) and (root / name).is_dir():
        return root / name, None
    problem = "checkpoints/LATEST is missing" if name is None else \
        f"checkpoints/LATEST points at a missing checkpoint {name!r}"
    candidates = _checkpoint_folders(root)
    for path in candidates:
        try:
            verify_checkpoint(path)
        except RunError:
            continue
        return path, f"{problem}: using {path.name}, the newest checkpoint that verifies"
    if candidates:
        shown = ", ".join(p.name for p in candidates[:3])
        raise DamagedRunError(f"{problem} and none of the checkpoints in {root} ({shown}) matches its manifest",
                              "restore the checkpoint files, or use --overwrite to start afresh",
                              "restore the checkpoint files, or retrain the run")
    if name is not None:
        raise DamagedRunError(f"{problem} and {root} holds no checkpoint (the run folder is damaged)",
                              "restore the checkpoint, or use --overwrite to start afresh",
                              "restore the checkpoint, or retrain the run")
    return None, None


def checkpoint_names(run_dir: Path) -> list[str]:
    """The run's checkpoint folders (step-N, newest first) and kept best weights (best-step-N)."""
    root = Path(run_dir) / CHECKPOINTS
    return [p.name for p in _checkpoint_folders(root)] + [p.name for p in best_weight_folders(run_dir)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    return resolve_checkpoint(run_dir)[0]


def stored_tied(manifest: dict) -> bool:
    """Whether a checkpoint's weights hold one shared matrix (the manifest records it)."""
    return manifest.get("tied") in (True, "True")


def load_weights(model, tensors: dict, manifest: dict) -> None:
    """Load a checkpoint's weights into `model`: the one way a resume, an evaluation, an export and
    the kept best weights all load them, whichever form each side has. Weights of two matrices
    (the manifest says so) into a model built tied, a run untied part-way and rebuilt from its
    config: the model is split first (a resume splits it beforehand, with its optimizer). Weights
    of one matrix into a split model, kept before the split: E fills both. The tie is asserted."""
    from ..model.blocks import load_model_tensors

    one = stored_tied(manifest)
    if not one and model.is_tied:
        model.untie()
    elif one and not model.is_tied and model.embedding_key in tensors:
        tensors = {**tensors, model.head_key: tensors[model.embedding_key].clone()}
    load_model_tensors(model, tensors, tied=model.is_tied)


def verify_checkpoint(ckpt: Path) -> dict:
    """Check every file against the manifest's SHA-256; return the manifest."""
    mpath = ckpt / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):
        raise DamagedRunError(f"checkpoint {ckpt} has no readable manifest (it is damaged)") from None
    check_format(manifest.get("format"), mpath)
    for fname, meta in manifest.get("files", {}).items():
        fpath = ckpt / fname
        if not fpath.exists():
            raise DamagedRunError(f"checkpoint file {fpath} is missing")
        if fpath.stat().st_size != meta.get("bytes") or sha256_file(fpath) != meta.get("sha256"):
            raise DamagedRunError(f"checkpoint file {fpath} does not match its SHA-256 in the manifest (truncated "
                                  "or altered); nothing was loaded")
    return manifest


def load_checkpoint(ckpt: Path, with_state: bool = True, weights: bool = True) -> tuple[dict | None, dict | None, dict]:
    """(tensors, state or None, manifest) of a verified checkpoint. Nothing is unpickled:
    weights come from safetensors, state from torch.load(weights_only=True)."""
    import torch
    from safetensors.torch import load_file

    manifest = verify_checkpoint(ckpt)
    try:
        if not weights:  # a sharded run resuming: each rank reads its own shards (sharded.py)
            tensors = None
        elif manifest.get("sharded"):
            tensors = read_sharded_weights(ckpt / SHARDS)
        else:
            tensors = load_file(str(ckpt / MODEL_FILE))
        state = torch.load(ckpt / STATE_FILE, weights_only=True) if with_state else None
    except Exception as exc:  # a file that passed the hash but still fails to parse
        raise DamagedRunError(f"checkpoint {ckpt} cannot be read ({type(exc).__name__})") from None
    return tensors, state, manifest


def read_sharded_weights(folder: Path) -> dict:
    """A sharded checkpoint's weights gathered whole in this one process (export, eval, analyze):
    every tensor allocated from the checkpoint's own metadata and read by torch.distributed.checkpoint
    without a process group. The names are the model's state dict's (a tied matrix once, under E's)."""
    import torch
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(folder))
    tensors = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
               for key, meta in reader.read_metadata().state_dict_metadata.items()
               if key.startswith("model.") and hasattr(meta, "size")}
    dcp.load(tensors, storage_reader=reader, no_dist=True)
    return {key.removeprefix("model."): t for key, t in tensors.items()}


def check_finite_weights(tensors: dict, ckpt: Path, other_weights: Callable[[], str | None] | None = None) -> None:
    """Refuse weights holding nan or inf (a run that diverged before the checkpoint was written):
    the one check behind sample, eval, analyze and export, which would otherwise crash, score nan
    or blame the export. Names the first tensor found and what it holds; `other_weights()`: how
    the command at hand reads other weights of the run (its own option), None when it cannot."""
    from ..model.finite import not_finite

    bad = not_finite(tensors.items())
    if not bad:
        return
    (first, what, _) = bad[0]
    more = f" and {len(bad) - 1} more tensor{'s' * (len(bad) > 2)}" if len(bad) > 1 else ""
    other = other_weights() if other_weights is not None else None
    fix = f"{other}, or retrain with a lower train.lr" if other else "retrain it with a lower train.lr"
    raise RunError(f"the weights in {ckpt} are not finite ({what} in {first}{more}) — the run diverged before this "
                   f"checkpoint was written; {fix}")


def is_run_folder(folder: Path) -> bool:
    """Whether `folder` holds a tiedlm run, by what only training leaves there together: a
    report.json that is tiedlm's (a JSON object with its integer `format` and a `status` or
    `config`), a checkpoints/LATEST pointer, or a config.yaml beside a metrics.jsonl. A file of
    one of those names alone (a project's own config.yaml, another tool's report.json) does not
    make a run. train writes config.yaml and report.json one right after the other, so every run
    has the report; LATEST and the metrics still mark one whose report was damaged since."""
    folder = Path(folder)
    if (folder / CHECKPOINTS / "LATEST").is_file():
        return True
    if (folder / CONFIG).is_file() and (folder / METRICS).is_file():
        return True
    report = folder / REPORT
    try:
        if not report.is_file() or report.stat().st_size > REPORT_READ_LIMIT:
            return False
        data = json.loads(report.read_bytes())
    except (OSError, ValueError):  # unreadable, not JSON, not UTF-8: not tiedlm's report
        return False
    fmt = data.get("format") if isinstance(data, dict) else None
    return isinstance(fmt, int) and not isinstance(fmt, bool) and ("status" in data or "config" in data)


REPORT_READ_LIMIT = 64 * 2**20  # a tiedlm report is kilobytes; a larger report.json is another tool's


def check_outside_runs(folder: Path, option: str = "--out") -> None:
    """A ConfigError (exit 2) when `folder` is or lies in a part of a run folder (is_run_folder)
    that training writes (runs.MANAGED: checkpoints/, tb/, tokenizer/, report.json, ...; links
    followed), where a resume or --overwrite replaces or deletes it. An ordinary folder that merely
    holds a file of such a name (a project's config.yaml) is no run."""
    p = Path(folder).expanduser().resolve()
    for part in (q for q in [p, *p.parents] if q.name in MANAGED):
        if is_run_folder(part.parent):
            raise ConfigError(f"{option} {folder} lies in {part}, a part of the run {part.parent.name} that tiedlm "
                              "manages (training replaces or deletes what is there) — choose a folder outside it")


def clear_checkpoints(run_dir: Path) -> None:
    """Remove every checkpoint (a run restarting from step 0 must not find stale ones)."""
    shutil.rmtree(Path(run_dir) / CHECKPOINTS, ignore_errors=True)


# ------------------------------------------------------------------------- RNG states


def rng_state(sampler: np.random.Generator) -> dict:
    import torch

    state = {
        "torch": torch.get_rng_state(),
        "numpy": _np_state_to_plain(np.random.get_state()),
        "python": random.getstate(),
        "sampler": sampler.bit_generator.state,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _np_state_to_plain(st: tuple) -> list:
    # the legacy tuple holds a uint32 array: store it as a tensor-free list for weights_only load
    return [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])]


def set_rng_state(state: dict, sampler: np.random.Generator) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    st = state["numpy"]
    np.random.set_state((st[0], np.array(st[1], dtype=np.uint32), st[2], st[3], st[4]))
    random.setstate(_tuplify(state["python"]))
    sampler.bit_generator.state = state["sampler"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x
