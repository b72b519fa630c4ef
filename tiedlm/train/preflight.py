"""Everything that can refuse a run, found before anything is written to its folder: the
device and its rank, the budget, a verified checkpoint to resume from, the start and the data and
their identities, the splits to score, and whether the model fits (train_run calls `preflight` first).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..runs import checkpoints
from .. import runs
from ..config import Config, budget_steps, check_warmup
from ..distributed import Dist
from ..errors import ConfigError, RunError
from ..trackers.live import TrainingTrackers, require
from .step import untie_step
from .old_domain import prepare_also
from ..model.counting import check_fits
from ..model.hf_config import start_change, start_identity
from ..device import resolve_dtype
from ..distributed import check_batch, main_first, start
from ..fsdp import check_launch
from ..process import log

if TYPE_CHECKING:
    import torch

    from ..data import PreparedData


@dataclass
class Preflight:
    """Everything that can refuse a run, found before anything is written to its folder."""

    device: torch.device
    dtype: str  # fp32 | bf16
    total_steps: int
    untie_step: int | None  # the step at which an untie_at run splits in two
    data: PreparedData
    checkpoint: Path | None = None  # the checkpoint to resume from
    checkpoint_note: str | None = None  # how it was found, when not through LATEST
    loaded: tuple | None = None  # checkpoints.load_checkpoint(checkpoint): verified, not yet applied
    old_report: runs.RunReport | None = None
    tb: TrainingTrackers | None = None  # train.log_to's loggers, opened by the loop once the model is built
    dist: Dist | None = None  # this process's rank among the run's processes (one by default)
    also: PreparedData | None = None  # eval.also's data
    fsdp: bool = False  # train.parallel: fsdp under torchrun: the model sharded (fsdp.py), its checkpoints too
    start: dict | None = None  # model/hf_config.start_identity: the files the model starts from, by content


def preflight(cfg: Config, run_dir: Path, device: torch.device, fresh: bool, progress: bool,
              d: Dist | None = None) -> Preflight:
    """The device this process uses (`device`, train.device resolved, or its rank's GPU), the
    budget, a verified checkpoint (resuming), the start and the data and their identities, and
    whether the model fits: any of them refuses the run while its folder is still untouched."""
    from ..data import identity_fits, prepare_data

    if cfg.train.log_to:
        require(cfg.train.log_to)  # a logger's missing package, before anything is written
    d = d or Dist()
    check_batch(cfg.train.batch_size, d)
    if d.active and cfg.model.untie_at is not None and cfg.train.compile:
        raise ConfigError("model.untie_at with train.compile under torchrun is not supported — drop one of them")
    fsdp = cfg.train.parallel == "fsdp"
    if fsdp:
        check_launch(cfg.train.parallel, d, cfg.train.keep_best, cfg.model.untie_at, cfg.train.compile)
    device = start(d, device)
    total = budget_steps(cfg)
    if cfg.model.untie_at is not None and total < 2:
        raise ConfigError(f"model.untie_at needs at least 2 training steps, the budget gives {total} — "
                          "raise train.max_steps / train.max_tokens or drop model.untie_at")
    short = check_warmup(cfg, total, verdict=False)
    if short and d.main:
        log(f"warning: {short}")
    ckpt, note = (None, None) if fresh else checkpoints.resolve_checkpoint(run_dir)
    # a sharded run's ranks read their own shards once the model is sharded (runs/sharded.py)
    loaded = checkpoints.load_checkpoint(ckpt, weights=not fsdp) if ckpt is not None else None
    best = ((loaded[1] or {}).get("best") or {}).get("weights") if loaded is not None else None
    if best and cfg.train.keep_best:  # the kept best weights the checkpoint names must be intact
        checkpoints.verify_checkpoint(run_dir / runs.CHECKPOINTS / best)
    old = None if fresh else runs.read_report(run_dir)
    begun = main_first(d, lambda: start_identity(cfg.model))  # rank 0 fills the digest memo
    _check_start(cfg, run_dir, old if loaded is not None else None, begun)
    data = main_first(d, lambda: prepare_data(cfg, progress=progress))  # rank 0 fills the token cache
    missing = [s for s in cfg.eval.splits if s not in data.splits]
    if missing:
        raise ConfigError(f"eval.splits names {missing[0]!r} but the data has no such split (it has "
                          f"{', '.join(data.splits)}) — set eval.splits to the splits there are, "
                          "or give the data that split")
    if loaded is not None and old and not identity_fits(old.data_identity, data):
        raise RunError(f"the data or tokenizer of {run_dir} changed since the run started (source fingerprint "
                       "or tokenizer key differ), so its checkpoint no longer fits the tokens — restore the "
                       "data, or start afresh with --overwrite")
    if not fsdp:  # a sharded model is planned per rank (train --dry-run), not whole
        check_fits(cfg.model, data.model_vocab_size, max(cfg.train.batch_size, cfg.eval.batch_size), device)
    also = prepare_also(cfg, data, d, progress) if cfg.eval.also is not None else None
    return Preflight(device, resolve_dtype(cfg.train.dtype, device), total, untie_step(cfg, total), data,
                     ckpt, note, loaded, old, dist=d, also=also, fsdp=fsdp, start=begun)


def _check_start(cfg: Config, run_dir: Path, old: runs.RunReport | None, start: dict | None) -> None:
    """A run resumed from its checkpoint must go on from the start it recorded (model.init_from's
    config and weights, or model.hf_config's file, by content): replaced or edited since, the run
    would go on as another model's, and its seeds would pool with runs of the other. A run that
    recorded none (trained before runs recorded it) is taken as it is."""
    recorded = old.start_identity if old is not None else None
    if recorded is None or recorded == start:
        return
    how = start_change(cfg.model, recorded if isinstance(recorded, dict) else {}, start)
    raise RunError(f"the start of {run_dir} changed since the run started ({how}), so its checkpoint would go on "
                   "as another model's run — put the start back as it was, or use --overwrite to train the run "
                   "afresh from the new one")
