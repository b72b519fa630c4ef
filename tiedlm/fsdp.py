"""One run sharded over the processes of torchrun: FSDP2 (`fully_shard`), train.parallel: fsdp.

Each decoder block is a unit of its own (`TiedLM.blocks`); everything outside the blocks (E, W_out,
a position table, the final norm, a tying mode's own parameters) is the root's one unit. A tied
W_out *is* E's Parameter, so FSDP manages it once: one sharded matrix, gathered once for both uses,
its gradient the sum of both and reduce-scattered once. Sharding E and W_out in different units is
what silently unties a model elsewhere (accelerate #3870, torchtitan #2252); here the tie is
asserted after wrapping, by identity and by the unit that holds it.

train.fsdp_init: full builds the whole model on every rank as one process does (the same weights
at a seed), then shards it; meta builds it on the meta device, shards it, and each rank draws its
own shards with the family's own scheme (`TiedLM.init_family`): nothing is ever whole. Mixed
precision (MixedPrecisionPolicy: bf16 compute, fp32 reductions) where the device has bf16; fp32
on the CPU. torch is imported inside.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .distributed import Dist
from .errors import ConfigError

if TYPE_CHECKING:
    import torch


def check_launch(parallel: str, d: Dist, keep_best: bool, untie_at: float | None, compile_: bool) -> None:
    """Refuse what FSDP cannot do here, in one line each, before anything is written."""
    if parallel != "fsdp":
        return
    if not d.active:
        raise ConfigError("train.parallel: fsdp shards the model over the processes torchrun starts — launch with "
                          "torchrun --standalone --nproc_per_node=2 -m tiedlm train ..., or set train.parallel=ddp")
    if untie_at is not None:
        raise ConfigError("model.untie_at splits E from W_out part-way, and under train.parallel: fsdp the two would "
                          "need new units mid-run — use --set train.parallel=ddp, or a tie_mode such as soft")
    if keep_best:
        raise ConfigError("train.keep_best under train.parallel: fsdp is not supported (kept weights are not "
                          "sharded) — use --set train.keep_best=false, or --set train.parallel=ddp")
    if compile_:
        raise ConfigError("train.compile under train.parallel: fsdp is not supported — use --set train.compile=false")


@dataclass
class Sharding:
    """What the report records of a sharded run."""

    units: int  # blocks, plus the root's unit
    world_size: int
    local_params: int  # this rank's share of every parameter (rank 0's is recorded)
    params: int  # every unique parameter, whole
    root_params: int  # the root unit's, whole: E (once when tied), W_out, positions, final norm
    mixed_precision: str  # "bf16 compute, fp32 reductions" or "fp32"

    def to_json(self) -> dict:
        return {"units": self.units, "world_size": self.world_size, "local_params": self.local_params,
                "params": self.params, "root_params": self.root_params, "mixed_precision": self.mixed_precision,
                "state_bytes_per_rank": 16 * self.local_params}


@contextlib.contextmanager
def parameters_on_meta():
    """Build a model whose parameters are on the meta device (no memory, no draws) and whose buffers
    (rotary tables) are computed as usual, as accelerate's init_empty_weights(include_buffers=False)."""
    import torch.nn as nn

    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def shard(model, d: Dist, device: torch.device, dtype: str) -> Sharding:
    """fully_shard every block, then the root (E, W_out and the rest in one unit); the tie asserted
    after wrapping. `model` is sharded in place (FSDP2 swaps its class)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    tied = model.is_tied
    blocks = model.blocks()
    if not blocks:
        raise ConfigError(f"train.parallel: fsdp found no decoder blocks to shard in {type(model).__name__} — use "
                          "--set train.parallel=ddp for this family")
    whole = sum(p.numel() for p in model.parameters())
    in_blocks = sum(p.numel() for b in blocks for p in b.parameters())
    bf16 = dtype == "bf16" and device.type == "cuda"
    kw = {"mesh": init_device_mesh(device.type, (d.world,))}
    if bf16:  # the compute in bf16, the gradients reduced and the weights kept in fp32
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    check_sharded_tie(model, tied)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    return Sharding(units=len(blocks) + 1, world_size=d.world, local_params=local, params=whole,
                    root_params=whole - in_blocks, mixed_precision="bf16 compute, fp32 reductions" if bf16 else "fp32")


def check_sharded_tie(model, tied: bool) -> None:
    """After wrapping: the tie by identity and the family's flags (TiedLM.check_tie), a tied W_out
    the very DTensor E is, and E, W_out and a mode's own head parameters in the root's unit."""
    model.check_tie(tied)
    E, W = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if tied and not (hasattr(E, "to_local") and W.to_local().data_ptr() == E.to_local().data_ptr()):
        raise AssertionError("after fully_shard the head's weight is not the embedding's sharded Parameter")
    in_root = {id(p) for p in _unit_parameters(model)}
    if in_root:  # torch's FSDP2 says which parameters its root unit manages
        head = [W, *(p for _, p in model.head_parameters())]
        if id(E) not in in_root or any(id(p) not in in_root for p in head):
            raise AssertionError("E and W_out are not in one FSDP unit: the tie would be sharded apart")


def _unit_parameters(module) -> list:
    """The parameters FSDP2's unit at `module` manages (empty where this torch does not say)."""
    try:
        group = module._get_fsdp_state()._fsdp_param_group
        return [fp.sharded_param for fp in group.fsdp_params]
    except Exception:  # a private interface: absent or changed in another torch
        return []


def materialise(model, device: torch.device, seed: int, rank: int) -> None:
    """A model built with parameters_on_meta and sharded: its shards allocated on `device`, drawn
    with the family's own scheme from a stream of (seed, rank), so that no rank draws another's
    shard; the modes' own starts set whole (they are small); the tie asserted."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    tied = model.is_tied
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():  # to_empty leaves them unset: they were computed, keep them
            b.copy_(buffers[name])
        state = torch.get_rng_state()
        torch.manual_seed(seed * 1_000_003 + rank)
        model.init_family()
        E, W = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        if model.built_tie.strengthened:  # soft and pull start from W_out = E, as when built whole
            W.copy_(E)

        def set_full(param, value):
            param.copy_(distribute_tensor(value.to(param.dtype), param.device_mesh, param.placements)
                        if hasattr(param, "device_mesh") else value)

        model.init_tie_parameters(set_full)
        torch.set_rng_state(state)
    model.check_tie(tied)


def plan_memory(params: int, root_params: int, largest_block: int, activation_bytes: int,
                worlds: tuple[int, ...] = (1, 2, 4, 8)) -> list[dict]:
    """Bytes per rank of an fp32 AdamW run at each world size, computed, not measured: the sharded
    state (weights, gradients and both moments: 16 bytes a parameter, over N ranks), the root unit
    whole while it is gathered (weights and gradients, 8 bytes a parameter), two blocks gathered at
    once (one computing, one prefetched), and a micro-batch's activations on each rank's slice."""
    out = []
    for n in worlds:
        state = 16 * params // n
        gathered = 0 if n == 1 else 8 * root_params + 2 * 8 * largest_block
        acts = activation_bytes // n
        out.append({"world_size": n, "state_bytes": state, "gathered_bytes": gathered, "activation_bytes": acts,
                    "total_bytes": state + gathered + acts})
    return out
