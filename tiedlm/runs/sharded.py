"""Checkpoints of a run sharded with FSDP (train.parallel: fsdp): torch.distributed.checkpoint.

Every rank writes its part of the weights and of the optimizer's state into one temporary folder
(`checkpoints/.tmp-step-N-*/shards/`), which rank 0 made and named to the others; rank 0 then adds
state.pt (counters and RNG states, as any checkpoint's, the optimizer aside), fsyncs every file,
writes the manifest with their SHA-256s, renames the folder into place and points LATEST at it
(checkpoints.save_checkpoint: the one way a checkpoint is finished). A tied matrix is saved once,
under E's name, as in model.safetensors. A resume at the same world size reads each rank's own
shards back, bit for bit; another world size is resharded by torch.distributed.checkpoint. One
process reads the whole weights back for export and evaluation (checkpoints.read_sharded_weights).
torch is imported inside.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..distributed import Dist, barrier
from ..errors import RunError
from .checkpoints import SHARDS, new_checkpoint_folder, save_checkpoint


def _state_dicts(model, optimizer) -> dict:
    """{"model": ..., "optim": ...} with FSDP's sharded tensors, named by the model's parameters; a
    tied W_out left out (it is E)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    if model.is_tied:
        model_sd.pop(model.head_key, None)
    return {"model": model_sd, "optim": optim_sd}


def save_sharded(run_dir: Path, step: int, model, optimizer, metadata: dict, state: dict, d: Dist) -> None:
    """Every rank writes its shards; rank 0 finishes the checkpoint (the manifest, the rename, LATEST)."""
    import torch.distributed as td
    import torch.distributed.checkpoint as dcp

    holder = [str(new_checkpoint_folder(run_dir, step)) if d.main else None]
    td.broadcast_object_list(holder, src=0)  # one folder for every rank's files
    tmp = Path(holder[0])
    try:
        dcp.save(_state_dicts(model, optimizer), checkpoint_id=str(tmp / SHARDS))
        barrier(d)
    except BaseException:
        if d.main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if d.main:
        save_checkpoint(run_dir, step, None, {**metadata, "sharded": True, "world_size": d.world}, state, tmp=tmp)
    barrier(d)  # no rank goes on (or resumes) before the checkpoint is in place


def load_sharded(ckpt: Path, manifest: dict, model, optimizer) -> None:
    """Each rank's part of a sharded checkpoint's weights and optimizer state read into the sharded
    model and its optimizer; the tie asserted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not manifest.get("sharded"):
        raise RunError(f"checkpoint {ckpt} was written by a run that was not sharded — resume it with "
                       "--set train.parallel=ddp")
    tied = model.is_tied
    sd = _state_dicts(model, optimizer)
    dcp.load(sd, checkpoint_id=str(ckpt / SHARDS))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                   options=StateDictOptions(strict=not tied))
    model.check_tie(tied)
