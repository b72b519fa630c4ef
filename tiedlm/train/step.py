"""One optimizer step: the batch sampler that draws random windows of the training tokens, and
`train_step`, gradient accumulation over micro-batches with clipping and a finite-only update.
The loop around them (schedule, evaluation, checkpoints, signals) is train/__init__.py's."""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import threads
from ..nats import representable

if TYPE_CHECKING:
    import torch

    from ..config import TrainConfig


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

    from ..model import lm_loss

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
