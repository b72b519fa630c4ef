"""eval.also: another data set's test split scored with the run's tokenizer before training (the
start's weights; a pretrained start's, for an adaptation) and after it (the last weights, and the
kept best ones), so that what an adaptation forgets of its old domain stands beside its gain."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import Config, also_config
from ..data import PreparedData, prepare_data
from ..distributed import Dist, main_first
from ..device import autocast_ctx
from ..distributed import sum_arrays

if TYPE_CHECKING:
    import torch

    from .preflight import Preflight

SPLIT = "test"


def prepare_also(cfg: Config, data: PreparedData, d: Dist, progress: bool) -> PreparedData | None:
    """eval.also's data prepared like the run's own (rank 0 fills the token cache), with the run's
    tokenizer and its new tokens, or None."""
    if cfg.eval.also is None:
        return None
    added = getattr(data.tokenizer, "added", None)
    return main_first(d, lambda: prepare_data(also_config(cfg, added), progress=progress))


def score_also(cfg: Config, pre: Preflight, model: torch.nn.Module) -> dict:
    """The also-data's test split scored whole, as the final evaluation scores a split (every token
    once, shared across ranks), its buckets by the also-data's own training frequencies."""
    from ..evaluate import evaluate_split

    also, dist = pre.also, pre.dist
    return evaluate_split(model, also.splits[SPLIT], cfg.model.block_size, cfg.eval.stride, cfg.eval.batch_size,
                          pre.device, autocast_ctx(pre.device, pre.dtype), train_counts=also.train_counts,
                          fractions=cfg.eval.buckets, unk_id=also.tokenizer.unk_id, shard=(dist.rank, dist.world),
                          reduce=lambda nll: sum_arrays(dist, nll, pre.device))


def also_record(cfg: Config, before: dict | None, after: dict | None = None, after_best: dict | None = None) -> dict:
    """report.json's `also`: the data, the split, and its scores before and after training (None
    before: a resume whose first attempt's report was lost)."""
    out: dict[str, Any] = {"data": label(cfg.eval.also), "split": SPLIT,
                           "before": _short(before) if before is not None else None}
    if after is not None:
        out["after"] = _short(after)
    if after_best is not None:
        out["after_best"] = _short(after_best)
    return out


def _short(res: dict) -> dict:
    return {k: res[k] for k in ("loss", "perplexity", "tokens") if k in res}



def label(also: dict) -> str:
    """eval.also's data in a few words: its path, config name and files."""
    parts = [str(also.get("path", "builtin:synthetic"))]
    if also.get("name"):
        parts.append(str(also["name"]))
    files = also.get("data_files")
    if isinstance(files, dict):
        parts.append(", ".join(f"{k}: {v}" for k, v in files.items()))
    elif files:
        parts.append(str(files))
    return " ".join(parts)
