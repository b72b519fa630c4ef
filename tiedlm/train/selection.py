"""Choosing a checkpoint on validation: the best periodic evaluation, early stopping, the kept
best weights.

Every run with periodic evaluations (train.eval_every) tracks the lowest validation loss on its
fixed slice (train.eval_tokens), with its step and tokens, and says in its report whether the last
evaluation ended more than OVERTRAINED_MARGIN above it. `train.keep_best` also keeps those weights
(checkpoints/best-step-N/, written atomically like every checkpoint) and scores them at the end
beside the last ones. `train.early_stop_patience` ends training after that many evaluations in a
row without a fall of more than `train.early_stop_min_delta` nats.

The tracker's state travels in every checkpoint, so a resumed run keeps its best and its count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..runs.checkpoints import BEST_PREFIX, load_checkpoint, load_weights, prune_best_weights, save_best_weights
from ..perplexity import perplexity, relative

OVERTRAINED_MARGIN = 0.02  # a last evaluation more than 2% above the best perplexity is flagged


@dataclass
class BestTracker:
    """The best periodic validation evaluation so far, the last one, and the early-stopping count."""

    step: int | None = None  # the best evaluation's step, tokens, loss (nats per token)
    tokens: int | None = None
    loss: float | None = None
    last_step: int | None = None  # the most recent evaluation
    last_tokens: int | None = None
    last_loss: float | None = None
    evals: int = 0  # periodic evaluations so far
    stop_loss: float | None = None  # early stopping's reference: the last loss that improved by min_delta
    stale: int = 0  # evaluations since then
    stopped_at: int | None = None  # the step at which early stopping ended training
    weights: str | None = None  # the folder of the kept best weights under checkpoints/ (keep_best)
    slice_tokens: int | None = None  # the validation tokens each evaluation scores

    def observe(self, step: int, tokens: int, loss: float, min_delta: float = 0.0) -> bool:
        """Take one evaluation; True when it is a new best (a lower loss than every earlier one).
        A non-finite loss is never a best and never an improvement."""
        self.evals += 1
        self.last_step, self.last_tokens, self.last_loss = step, tokens, loss
        finite = math.isfinite(loss)
        if finite and (self.stop_loss is None or loss < self.stop_loss - min_delta):
            self.stop_loss, self.stale = loss, 0
        else:
            self.stale += 1
        if finite and (self.loss is None or loss < self.loss):
            self.step, self.tokens, self.loss = step, tokens, loss
            return True
        return False

    def should_stop(self, patience: int) -> bool:
        return patience > 0 and self.stale >= patience

    def to_state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | None) -> "BestTracker":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (state or {}).items() if k in names})

    def summary(self) -> dict | None:
        """What report.json's `best` says: the best and last evaluations and how far apart they are."""
        if self.loss is None or self.last_loss is None:
            return None
        above = relative(self.last_loss - self.loss)
        above = math.inf if above is None else above
        out = {"split": "validation", "eval_tokens": self.slice_tokens, "evaluations": self.evals,
               "step": self.step, "tokens": self.tokens, "loss": self.loss, "perplexity": perplexity(self.loss),
               "last_step": self.last_step, "last_tokens": self.last_tokens, "last_loss": self.last_loss,
               "last_perplexity": perplexity(self.last_loss),
               "last_above_best": above, "margin": OVERTRAINED_MARGIN, "overtrained": above > OVERTRAINED_MARGIN}
        if self.weights:
            out["weights"] = f"checkpoints/{self.weights}"
        return out


def stop_reason(tracker: BestTracker, patience: int, min_delta: float) -> str:
    by = f"a fall of more than {min_delta:g} nats" if min_delta else "a lower loss"
    return (f"early stopping: {patience} validation evaluation{'s' * (patience != 1)} in a row without "
            f"{by}; best loss {tracker.loss:.4f} at step {tracker.step}")


# ------------------------------------------------------------------------- the kept weights


def keep_best_weights(run_dir: Path, tracker: BestTracker, step: int, model, covered: str | None,
                      write: bool = True) -> None:
    """Write the model's weights as the new best (checkpoints/best-step-N/) and remove the kept
    weights that are neither these nor `covered`, the ones the last checkpoint's state names
    (a resume from that checkpoint needs them)."""
    from ..model.blocks import model_tensors

    if not write:  # a rank other than 0 of a distributed run: rank 0 writes these very weights
        tracker.weights = f"{BEST_PREFIX}{step:07d}"
        return
    prune_best_weights(run_dir, keep={covered})  # an earlier best that no checkpoint names: not needed
    tensors, meta = model_tensors(model)
    tracker.weights = save_best_weights(run_dir, step, tensors, meta).name


def evaluate_best(run_dir: Path, model, tracker: BestTracker, evaluate) -> dict:
    """Load the kept best weights into `model` (the trained model, no longer needed as it is) and
    return evaluate(model). Weights kept while an untie_at run was still tied load into both
    matrices of the untied model."""
    tensors, _, manifest = load_checkpoint(Path(run_dir) / "checkpoints" / tracker.weights, with_state=False)
    load_weights(model, tensors, manifest)
    return evaluate(model)
