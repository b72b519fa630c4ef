"""The update: AdamW over parameter groups in which a tied matrix appears once, its schedule
(linear warmup then cosine decay), the budget in steps and the untie_at split; then one optimizer
step: the batch sampler that draws random windows of the training tokens, and `train_step`,
gradient accumulation over micro-batches with clipping and a finite-only update. The loop around
them (evaluation, checkpoints, signals) is train/__init__.py's."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import threads
from ..config import Config, TrainConfig, effective_min_lr, warmup_steps_for
from ..perplexity import representable

if TYPE_CHECKING:
    import torch


# ------------------------------------------------------------------------- the optimizer and its schedule


def build_optimizer(model, tcfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over each unique parameter once (a tied matrix is one entry). Matrices are decayed;
    biases and LayerNorm gains never are; the embedding matrices (E, W_out, positions) follow
    train.decay_embeddings (the lowrank mode's A and B with them). W_out goes last in its group so that a model untied late
    (`untie_at`) and one built untied have the same parameter order for optimizer state."""
    # the model names its embedding matrices (the lowrank mode's A and B among them: part of W_out);
    # projection's P is a matrix like any other (Press & Wolf regularise it), decayed at train.weight_decay
    embeds = {id(p) for p in model.embedding_parameters()}
    w_out = None if model.is_tied else model.get_output_embeddings().weight  # a W_out of its own goes last
    decay, no_decay = [], []
    for p in model.parameters():  # yields a shared Parameter once
        if not p.requires_grad:  # frozen by train.trainable
            continue
        wants_decay = tcfg.decay_embeddings if id(p) in embeds else p.dim() >= 2
        (decay if wants_decay else no_decay).append(p)
    last = lambda p: p is w_out  # noqa: E731
    decay.sort(key=last)
    no_decay.sort(key=last)
    groups = [
        {"params": decay, "weight_decay": tcfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # Fused AdamW on CUDA (one kernel for all parameters). On the CPU it is 2 ms a step faster at
    # base.yaml's shape (~2% of the step) but not bit-identical to the default implementation, so
    # the default stays there and CPU results do not depend on the torch build's fused kernels.
    # torch.optim.AdamW as it is. Its first step imports torch._dynamo (1.6-1.8 s on 2 CPU cores),
    # once per process: `--jobs` workers live across their runs and pay it once.
    import torch

    fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8,
                             **({"fused": True} if fused else {}))


def lr_at(step: int, total: int, tcfg) -> float:
    """Linear warmup from 0 to lr over the warm-up's steps (train.warmup_steps, or train.warmup of
    `total`), then cosine decay to the effective min_lr (train.min_lr, or lr x train.min_lr_ratio)
    at `total`."""
    warm = warmup_steps_for(tcfg, total)
    if step < warm:
        return tcfg.lr * (step + 1) / warm
    if total <= warm:
        return tcfg.lr
    progress = min(1.0, (step - warm) / (total - warm))
    low = effective_min_lr(tcfg)
    return low + 0.5 * (tcfg.lr - low) * (1.0 + math.cos(math.pi * progress))


def untie_step(cfg: Config, total: int) -> int | None:
    if cfg.model.untie_at is None:
        return None
    return max(1, min(total - 1, round(cfg.model.untie_at * total))) if total > 1 else None


def untie_with_optimizer(model, optimizer) -> None:
    """Split the tied matrix in two; W_out gets an identical copy of E's AdamW state."""
    old = model.get_input_embeddings().weight
    new = model.untie()
    for group in optimizer.param_groups:
        if any(p is old for p in group["params"]):
            group["params"].append(new)
            break
    state = optimizer.state.get(old)
    if state:
        optimizer.state[new] = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in state.items()}


# ------------------------------------------------------------------------- one step


class BatchSampler:
    """Random windows of the training tokens: (B, T) inputs and the (B, T) targets one token on.
    With shard=(rank, world), every process draws the same global batch of B windows from the
    same seeded generator and keeps its slice: B / world rows, the rank-th block of them."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, device: torch.device,
                 rng: np.random.Generator, shard: tuple[int, int] = (0, 1)):
        self.tokens, self.B, self.device, self.rng = tokens, batch_size, device, rng
        self.rows = slice(shard[0] * batch_size // shard[1], (shard[0] + 1) * batch_size // shard[1])
        self.offsets = np.arange(block_size + 1)
        self.high = len(tokens) - block_size - 1

    def __call__(self):
        import torch

        starts = self.rng.integers(0, self.high + 1, size=self.B)[self.rows]
        xy = torch.from_numpy(np.asarray(self.tokens[starts[:, None] + self.offsets], dtype=np.int64))
        if self.device.type == "cuda":  # page-locked, so that the copy overlaps the previous step's work
            xy = xy.pin_memory()
        xy = xy.to(self.device, non_blocking=True)
        return xy[:, :-1], xy[:, 1:]


def train_step(fwd, optimizer, params: list, next_batch: Callable, amp: contextlib.AbstractContextManager | None,
               tcfg: TrainConfig, lr: float, stop: Callable[[], bool] | None = None) -> tuple[float, float] | None:
    """One optimizer step over train.grad_accum micro-batches: the mean loss, the gradient norm
    (before clipping); AdamW steps only when both are finite. `stop` is asked between micro-batches:
    when it says yes the partial step is abandoned (gradients dropped, no update) and None returned.

    The losses are summed as they come, into one detached float64 tensor on the device: memory does
    not grow with train.grad_accum, and there is still one device-to-host copy per step.

    A soft tie's penalty λ/2·‖W_out − E‖² (model.tie_penalty) is a function of the weights alone, so
    its gradient is added once per step, after the micro-batches (outside the DistributedDataParallel
    backward: it is the same on every rank, and needs no all-reduce). The loss returned is the
    cross-entropy alone, comparable with every other run's; the penalty is logged on its own. A
    pull tie's decoupled step (model.pull_tie) follows the optimizer's, when that is taken."""
    import torch

    from ..model.blocks import lm_loss

    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = None
    for i in range(tcfg.grad_accum):
        if i and stop is not None and stop():
            optimizer.zero_grad(set_to_none=True)
            return None
        x, y = next_batch()
        # under DDP the gradients are all-reduced once, with the last micro-batch's backward
        sync = contextlib.nullcontext() if i == tcfg.grad_accum - 1 or not hasattr(fwd, "no_sync") else fwd.no_sync()
        with sync:
            loss = lm_loss(fwd, x, y, amp)
            (loss / tcfg.grad_accum).backward()
        loss = loss.detach().double()
        loss_sum = loss if loss_sum is None else loss_sum + loss
        del loss, x, y
        threads.tick()  # train.threads: auto follows the load (a step is the same to the bit on any count)
    penalty = _model_of(fwd).tie_penalty()
    if penalty is not None:
        penalty.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip if tcfg.grad_clip > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):  # under FSDP the norm over every rank's shards (a DTensor)
        norm = norm.full_tensor()
    # one device-to-host copy per step: the mean loss and the gradient norm together
    loss_val, grad_norm = torch.stack([loss_sum / tcfg.grad_accum, norm.double()]).tolist()
    if representable(loss_val) and math.isfinite(grad_norm):  # a loss past exp()'s range is no step either
        optimizer.step()
        _model_of(fwd).pull_tie(lr)  # pull's decoupled step (model.tie_mode pull), after Adam's
    optimizer.zero_grad(set_to_none=True)
    return loss_val, grad_norm


def _model_of(fwd):
    """The GPT inside what the step calls: compiled (`_orig_mod`), in DistributedDataParallel (`module`)."""
    inner = getattr(fwd, "_orig_mod", fwd)
    return getattr(inner, "module", inner)
