"""`tiedlm train --dry-run`: what a run would hold per process, before anything is built or trained.

The model is built on the meta device (no memory, any size), its unique parameters, its root unit
(E, W_out, the rest outside the blocks) and its largest block counted; the memory per rank at 1, 2,
4 and 8 processes follows by arithmetic (fsdp.plan_memory), and the FLOPs per step from the count
(model/counting.py's flops_per_token). Everything here is computed, nothing measured.
"""

from __future__ import annotations

from ..config import Config
from ..formatting import format_bytes
from ..fsdp import plan_memory
from .counting import flops_per_token, training_memory
from .params_report import params_report


def plan_text(cfg: Config, world: int = 1) -> str:
    """The plan `train --dry-run` prints: counts, memory per rank by world size, FLOPs per step."""
    import torch

    from .blocks import build_model

    V = params_report(cfg).vocab_size
    with torch.device("meta"):
        model = build_model(cfg.model, V)
    params = sum(p.numel() for p in model.parameters())  # a tied matrix once
    blocks = model.blocks()
    largest = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    root = params - sum(p.numel() for b in blocks for p in b.parameters())
    t = cfg.train
    acts = training_memory(cfg.model, V, t.batch_size)["activation_bytes"]
    worlds = tuple(sorted({1, 2, 4, 8, world}))
    rows = plan_memory(params, root, largest, acts, worlds)
    tokens = t.batch_size * t.grad_accum * cfg.model.block_size
    counted = flops_per_token(cfg.model, V, t.batch_size * cfg.model.block_size, tokens)
    flops = counted.get("train", 0) * tokens
    lines = [f"{cfg.name}: {params:,} parameters ({model.current_tie.mode}), V={V:,}, {len(blocks)} blocks of "
             f"{largest:,}, root unit {root:,} (E, W_out and the rest outside the blocks); counted on the meta device",
             f"memory per process, fp32 AdamW, computed (train.parallel: {t.parallel}; "
             "a GPU adds its context and allocator slack):",
             f"  {'processes':>9}  {'ddp (whole)':>12}  {'fsdp state':>11}  {'gathered':>9}  {'activations':>11}  "
             f"{'fsdp total':>10}"]
    for r in rows:
        mark = "  <- this launch" if r["world_size"] == world and world > 1 else ""
        whole = 16 * params + acts // r["world_size"]
        lines.append(f"  {r['world_size']:>9}  {format_bytes(whole):>12}  {format_bytes(r['state_bytes']):>11}  "
                     f"{format_bytes(r['gathered_bytes']):>9}  {format_bytes(r['activation_bytes']):>11}  "
                     f"{format_bytes(r['total_bytes']):>10}{mark}")
    lines.append(f"training FLOPs per step: {flops:.3e} ({tokens:,} tokens of {flops / tokens:.3e}); "
                 f"the run's {t.max_steps or '?'} steps: "
                 + (f"{flops * t.max_steps:.3e}" if t.max_steps else f"{flops / tokens * t.max_tokens:.3e}"))
    return "\n".join(lines)
