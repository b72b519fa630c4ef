"""Training one run on several processes: PyTorch's DistributedDataParallel under `torchrun`.

`torchrun --nproc_per_node=N -m tiedlm train --config X` sets RANK, WORLD_SIZE and LOCAL_RANK;
tiedlm reads them here, starts the process group (NCCL on CUDA, gloo on the CPU) and gives every
rank the same view of the run: the same seeded global batch, of which each rank takes its slice;
the same decisions (a signal on any rank stops every rank at the same step); one writer, rank 0.
Without those variables everything here is a no-op for one process. torch is imported inside.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

from .errors import ConfigError
from .errors import RunError

if TYPE_CHECKING:
    import numpy as np
    import torch

T = TypeVar("T")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The one rank that writes the run folder, logs and shows progress."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def from_env(env: dict | None = None) -> Dist:
    """RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them; one process when they are absent."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return Dist()
    try:
        d = Dist(int(env.get("RANK", 0)), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
    except ValueError:
        raise ConfigError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers (got {env.get('RANK')!r}, "
                          f"{env.get('WORLD_SIZE')!r}, {env.get('LOCAL_RANK')!r}) — launch with torchrun") from None
    if not (d.world >= 1 and 0 <= d.rank < d.world):
        raise ConfigError(f"RANK {d.rank} is not within WORLD_SIZE {d.world} — launch with torchrun")
    if d.world > 1 and not env.get("MASTER_ADDR"):
        raise ConfigError("WORLD_SIZE is set but MASTER_ADDR is not — launch distributed runs with torchrun "
                          "(torchrun --nproc_per_node=N -m tiedlm train ...)")
    return d


def is_main_process(env: dict | None = None) -> bool:
    """False only in a torchrun process of rank > 0, which neither logs nor writes the run folder.
    Never raises: from_env reports a malformed launch environment."""
    env = os.environ if env is None else env
    return "WORLD_SIZE" not in env or env.get("RANK", "0").strip() in ("", "0")


# The rank of the process group started in this process (start), None until one is: from then on
# this process is known to be one of several, whatever its environment says.
_started_rank: int | None = None


def leaves_errors_to_rank_0(env: dict | None = None) -> bool:
    """Whether an error that every rank meets alike (a refused config or option) goes unsaid here
    because rank 0 says it: true only in a rank > 0 that is surely one of several processes — one
    whose process group was started in this process, or one that torchrun launched (its
    TORCHELASTIC_RUN_ID) with a well-formed environment (from_env accepts it). A hand-set or
    malformed RANK / WORLD_SIZE never silences an error: such a process may be the only one, and
    from_env's refusal of it is meant for whoever set it."""
    if _started_rank is not None:
        return _started_rank != 0
    env = os.environ if env is None else env
    if not env.get("TORCHELASTIC_RUN_ID"):
        return False
    try:
        d = from_env(env)
    except ConfigError:
        return False
    return d.active and not d.main


def start(d: Dist, device: torch.device) -> torch.device:
    """Start the process group (once) and return the device this rank uses: cuda:LOCAL_RANK on GPUs."""
    global _started_rank
    if not d.active:
        return device
    import torch
    import torch.distributed as td

    if device.type == "cuda":
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=d.rank, world_size=d.world)
    _started_rank = d.rank  # kept after stop(): an error raised during the teardown is still every rank's
    return device


def stop(d: Dist) -> None:
    if d.active:
        import torch.distributed as td

        # A DistributedDataParallel wrapper left in a reference cycle still holds the group's gloo
        # connections: freed at interpreter exit instead, after the group is gone, its threads can
        # abort the process ("terminate called without an active exception"). Free it first.
        gc.collect()
        if td.is_initialized():
            td.destroy_process_group()


def barrier(d: Dist) -> None:
    if d.active:
        import torch.distributed as td

        td.barrier()


def main_first(d: Dist, fn: Callable[[], T]) -> T:
    """fn() on rank 0, then on the others: what rank 0 writes (the token cache) the others then read."""
    if d.main:
        out = fn()
        barrier(d)
        return out
    barrier(d)
    return fn()


def all_mean(d: Dist, values: list[float], device: torch.device) -> list[float]:
    """The mean over ranks of each value (a float64 all-reduce)."""
    if not d.active:
        return values
    import torch
    import torch.distributed as td

    t = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(t)
    return (t / d.world).tolist()


def any_rank(d: Dist, flag: bool, device: torch.device) -> bool:
    """True on every rank when it is true on any (a signal on one rank stops them all)."""
    if not d.active:
        return flag
    return all_mean(d, [1.0 if flag else 0.0], device)[0] > 0


def sum_arrays(d: Dist, array: np.ndarray, device: torch.device) -> np.ndarray:
    """The element-wise sum over ranks of a float64 numpy array (each rank filled its own entries)."""
    if not d.active:
        return array
    import torch
    import torch.distributed as td

    t = torch.from_numpy(array).to(device)
    td.all_reduce(t)
    return t.cpu().numpy()


def wrap(model: torch.nn.Module, d: Dist, device: torch.device) -> torch.nn.Module:
    """The model in DistributedDataParallel (itself with one process), the tie asserted after wrapping:
    a tied matrix is one Parameter there too, so its one gradient is all-reduced once."""
    if not d.active:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    tied = model.is_tied
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    model.check_tie(tied)  # wrapping keeps one Parameter for a tied matrix
    expected = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    if allreduce_bytes(ddp) not in (None, expected):
        raise AssertionError(f"DistributedDataParallel reduces {allreduce_bytes(ddp)} bytes, not {expected}: "
                             "it sees a parameter (the tied matrix?) twice")
    return ddp


def allreduce_bytes(ddp: torch.nn.parallel.DistributedDataParallel) -> int | None:
    """Bytes of gradient DDP all-reduces per step, as DDP itself counted its parameters (None when
    this torch does not say)."""
    try:
        return int(ddp._get_ddp_logging_data()["total_parameter_size_bytes"])
    except Exception:  # a private interface: absent or changed in another torch
        return None


def check_batch(batch_size: int, d: Dist) -> int:
    """Each rank's share of train.batch_size (the global batch); an indivisible batch is refused."""
    if batch_size % d.world:
        raise ConfigError(f"train.batch_size ({batch_size}) is the global batch and must divide among the "
                          f"{d.world} processes — use a multiple of {d.world}, or raise train.grad_accum instead")
    return batch_size // d.world


def same_on_every_rank(d: Dist, tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether a tensor (the shared matrix) is bit-identical on every rank: its sum and sum of
    squares in float64 compared (a checksum, not a proof, but any drift changes them)."""
    if not d.active:
        return True
    import torch
    import torch.distributed as td

    t = tensor.detach().double()
    mine = torch.stack([t.sum(), (t * t).sum()]).to(device)
    every = [torch.zeros_like(mine) for _ in range(d.world)]
    td.all_gather(every, mine)
    return all(torch.equal(every[0], e) for e in every)


def check_in_step(d: Dist, model: torch.nn.Module, device: torch.device) -> None:
    """Under DDP, every rank must end training with the same weights (all of them, checksummed)."""
    if not d.active:
        return
    import torch

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not same_on_every_rank(d, flat, device):
        raise RunError("the ranks of this distributed run ended training with different weights — "
                       "DistributedDataParallel did not keep them in step; the checkpoint is rank 0's")
