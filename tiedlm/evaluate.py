"""Perplexity, bits per byte, perplexity per word and loss per frequency bucket over whole splits.

A split's perplexity is exp(total NLL / total predicted tokens), through `mean_perplexity` and
`nats.perplexity`, the one place a loss becomes a perplexity. Every token of a split but the first is predicted once, and every predicted token has at
least one token of context (a window's first target is predicted from the window's first input):
windows do not overlap by default; with `eval.stride < block_size` each window re-reads
`block_size - stride` tokens of context and scores only its last `stride` targets. (The
synthetic language's floor, corpora.synthetic_floor, scores the same targets of each split with
the true model, so its per-token values compare with these directly.)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import runs, threads
from .device import autocast_ctx, cpu_threads, resolve_device, resolve_dtype
from .errors import ConfigError, NotARunError, RunError
from .perplexity import bits_per_byte, perplexity

if TYPE_CHECKING:
    import torch

    from .config import Config
    from .data import PreparedData


def mean_perplexity(total_nll: float, n_tokens: float) -> float:
    """exp(total NLL / n_tokens) (nats.perplexity: inf when it overflows); nan for no tokens."""
    return perplexity(total_nll / n_tokens) if n_tokens > 0 else math.nan


def windows(n_tokens: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, length, first_scored) for each window over a split of n_tokens tokens.

    A window's inputs are tokens[start : start+length], its targets tokens[start+1 : start+length+1];
    targets before `first_scored` (an index into the window) are context only. Together the
    windows score target positions 1..n_tokens-1 exactly once."""
    out = []
    a = 1  # first target position not yet scored
    while a < n_tokens:
        b = min(a + stride, n_tokens)  # score targets [a, b)
        start = max(0, b - 1 - block_size)
        out.append((start, b - 1 - start, a - 1 - start))
        a = b
    return out


def score_tokens(model, tokens: np.ndarray, block_size: int, stride: int, batch_size: int,
                 device: torch.device | str, autocast: contextlib.AbstractContextManager | None = None,
                 shard: tuple[int, int] = (0, 1),
                 reduce: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-token NLL (nats, float64) and target ids for every predicted token of `tokens`. With
    shard=(rank, world), this process scores every world-th window from its rank and `reduce`
    sums the per-token arrays over the processes, so each token is scored exactly once."""
    import torch
    from torch.nn import functional as F

    rank, world = shard
    wins = windows(len(tokens), block_size, stride)[rank::world]
    n_pred = max(len(tokens) - 1, 0)
    nll = np.zeros(n_pred, dtype=np.float64) if world > 1 else np.empty(n_pred, dtype=np.float64)
    targets = np.asarray(tokens[1:], dtype=np.int64)
    # group windows of equal length so each batch is one dense tensor
    by_len: dict[int, list[tuple[int, int]]] = {}
    for start, length, first in wins:
        by_len.setdefault(length, []).append((start, first))
    was_training = model.training
    model.eval()
    ctx = autocast if autocast is not None else contextlib.nullcontext()
    # a tiedlm model (tie_layer.TiedLM) scores by the fused loss; any other module that gives logits, by F.cross_entropy
    fused = hasattr(model, "hidden") and hasattr(model, "get_output_embeddings")
    try:
        with torch.inference_mode():
            for length, group in by_len.items():
                for i in range(0, len(group), batch_size):
                    chunk = group[i:i + batch_size]
                    rows = np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64) for s, _ in chunk])
                    xy = torch.from_numpy(rows).to(device)
                    x, y = xy[:, :-1], xy[:, 1:]  # (b, length)
                    with ctx:
                        if fused:  # the loss by chunks of logits (loss.token_losses): the same per-token values
                            loss = model(x, y, reduction="none")
                        else:
                            logits = model(x)
                    if not fused:
                        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1),
                                               reduction="none").view(len(chunk), length)
                    loss = loss.double().cpu().numpy()
                    threads.tick()  # a long evaluation follows the load too (train.threads: auto)
                    for row, (start, first) in zip(loss, chunk):
                        # target index t in the window is split position start+1+t
                        nll[start + first:start + length] = row[first:]
    finally:
        model.train(was_training)
    return targets, (reduce(nll) if reduce is not None else nll)


def _ranked_types(counts: np.ndarray, unk_id: int | None) -> np.ndarray:
    """Token ids seen in training (but <unk>), by count descending, ties by id."""
    seen = np.flatnonzero(counts > 0)
    if unk_id is not None:
        seen = seen[seen != unk_id]
    return seen[np.lexsort((seen, -counts[seen]))]


def _bucket_names(fractions: list[float], suffix: str, unk_id: int | None) -> list[str]:
    names, prev = [], 0.0
    for b in range(len(fractions) + 1):
        frac = fractions[b] if b < len(fractions) else 1.0
        label = "top" if b == 0 else ("rest" if b == len(fractions) else "next")
        names.append(f"{label} {round(100 * (frac - prev))}%{suffix}")
        prev = frac
    return names + ["unseen"] + (["<unk>"] if unk_id is not None else [])


def frequency_buckets(train_counts: np.ndarray, fractions: list[float],
                      unk_id: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Bucket every token id by its training-set frequency rank, by types.

    Token types seen in training are ranked by count (ties by id); `fractions` are cumulative
    cut points over those types, e.g. [0.1, 0.5] -> top 10%, next 40%, rest 50% of the types.
    Types never seen in training (and padding ids) form the bucket "unseen". Given the
    tokenizer's unk_id, <unk> - a frequent token that stands for the rarest words - is not
    ranked but gets the last bucket, "<unk>", of its own; without it (the default), it is ranked
    by its count like any token. The end-of-text token is ranked by its count. Returns (bucket id
    per token id, bucket names)."""
    counts = np.asarray(train_counts)
    order = _ranked_types(counts, unk_id)
    cuts = [0] + [int(round(f * len(order))) for f in fractions] + [len(order)]
    bucket = np.full(len(counts), len(fractions) + 1, dtype=np.int64)  # default: unseen
    for b, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        bucket[order[lo:hi]] = b
    if unk_id is not None and 0 <= unk_id < len(counts):
        bucket[unk_id] = len(fractions) + 2
    return bucket, _bucket_names(fractions, "", unk_id)


def mass_buckets(train_counts: np.ndarray, fractions: list[float],
                 unk_id: int | None = None) -> tuple[np.ndarray, list[str]]:
    """Bucket every token id by its training-set frequency rank, by token mass.

    As frequency_buckets, but `fractions` are cumulative shares of the training tokens (those of
    ranked types: <unk>, given unk_id, is in its own bucket and not counted): [0.1, 0.5] -> the
    most frequent types that hold the first 10% of the training tokens, the next 40%, the rest.
    A type goes where the middle of its own mass falls, so a bucket's share is close to nominal
    (a type holding more than a bucket's share makes its neighbour smaller, or empty)."""
    counts = np.asarray(train_counts)
    order = _ranked_types(counts, unk_id)
    bucket = np.full(len(counts), len(fractions) + 1, dtype=np.int64)
    if len(order):
        c = counts[order].astype(np.float64)
        middle = (np.cumsum(c) - c / 2) / c.sum()
        bucket[order] = np.searchsorted(np.asarray(fractions), middle, side="right")
    if unk_id is not None and 0 <= unk_id < len(counts):
        bucket[unk_id] = len(fractions) + 2
    return bucket, _bucket_names(fractions, " of tokens", unk_id)


def _bucket_rows(bucket_of: np.ndarray, names: list[str], targets: np.ndarray, nll: np.ndarray) -> list[dict]:
    b = bucket_of[np.clip(targets, 0, len(bucket_of) - 1)]
    sums = np.bincount(b, weights=nll, minlength=len(names))
    cnts = np.bincount(b, minlength=len(names))
    return [{"name": name, "tokens": int(c), "loss": float(s / c) if c else None,
             "perplexity": mean_perplexity(float(s), int(c)) if c else None}
            for name, s, c in zip(names, sums, cnts)]


def unigram_loss(train_counts: np.ndarray, targets: np.ndarray) -> float:
    """The loss (nats per token) of the training split's unigram model on `targets`: each token's
    training count plus one, over the training tokens plus the vocabulary (add-one smoothing, so a
    token unseen in training costs log(N + V) rather than infinity). The cheapest model that uses
    no context: a run that does not beat it has not learned from context."""
    counts = np.asarray(train_counts, dtype=np.float64)
    log_p = np.log(counts + 1.0) - math.log(float(counts.sum()) + len(counts))
    return float(-log_p[np.asarray(targets, dtype=np.int64)].mean())


def summarize_nll(targets: np.ndarray, nll: np.ndarray, n_tokens: int, n_bytes: int | None = None,
                  n_words: int | None = None, train_counts: np.ndarray | None = None,
                  fractions: list[float] | None = None, unk_id: int | None = None,
                  new_ids: list[int] | None = None) -> dict:
    """Aggregate per-token NLL into the figures of a report. Bytes and words are apportioned to the
    predicted tokens (all but the first of n_tokens), so bits per byte and perplexity per word use
    the same text as the token perplexity. Given train_counts and fractions: loss per bucket by
    types ("buckets", frequency_buckets) and by token mass ("mass_buckets", mass_buckets, whose
    rows also give train_share: the bucket's share of all training tokens, <unk> included). Given
    unk_id, <unk> is the last bucket of both, "<unk>". Given new_ids (tokenizer.add_tokens), the
    targets that are new tokens are a bucket of their own, "new_tokens"."""
    total = float(nll.sum())
    n = int(len(nll))
    out: dict[str, Any] = {"tokens": n, "loss": total / n if n else float("nan"),
                           "perplexity": mean_perplexity(total, n)}
    share = n / n_tokens if n_tokens else 0.0
    if n_bytes:
        out["bits_per_byte"] = bits_per_byte(total, n_bytes * share)
    if n_words:
        out["word_perplexity"] = mean_perplexity(total, n_words * share)
    if train_counts is not None and n:
        out["unigram_loss"] = unigram_loss(train_counts, targets)
    if train_counts is not None and fractions is not None:
        out["buckets"] = _bucket_rows(*frequency_buckets(train_counts, fractions, unk_id), targets, nll)
        bucket_of, names = mass_buckets(train_counts, fractions, unk_id)
        counts = np.asarray(train_counts, dtype=np.float64)
        held = np.bincount(bucket_of, weights=counts, minlength=len(names)) / max(counts.sum(), 1.0)
        out["mass_buckets"] = [{**row, "train_share": float(h)}
                               for row, h in zip(_bucket_rows(bucket_of, names, targets, nll), held)]
    if new_ids:
        is_new = np.isin(targets, np.asarray(new_ids))
        k = int(is_new.sum())
        out["new_tokens"] = {"types": len(new_ids), "tokens": k, "share": k / n if n else 0.0,
                             "loss": float(nll[is_new].sum()) / k if k else None}
    return out


def evaluate_split(model, split, block_size: int, stride: int | None, batch_size: int, device: torch.device | str,
                   autocast: contextlib.AbstractContextManager | None = None, train_counts: np.ndarray | None = None,
                   fractions: list[float] | None = None, max_tokens: int | None = None,
                   unk_id: int | None = None, shard: tuple[int, int] = (0, 1),
                   reduce: Callable[[np.ndarray], np.ndarray] | None = None,
                   new_ids: list[int] | None = None) -> dict:
    """Score a whole split (or its first max_tokens+1 tokens, for the periodic evaluation).
    unk_id: the tokenizer's <unk>, bucketed on its own; new_ids: new tokens' (summarize_nll)."""
    tokens = split.tokens
    n_bytes, n_words = split.n_bytes, split.n_words
    if max_tokens is not None and len(tokens) > max_tokens + 1:
        keep = max_tokens + 1
        n_bytes = n_bytes * keep / len(tokens) if n_bytes else n_bytes
        n_words = n_words * keep / len(tokens) if n_words else n_words
        tokens = tokens[:keep]
    targets, nll = score_tokens(model, tokens, block_size, stride or block_size, batch_size, device, autocast,
                                shard, reduce)
    return summarize_nll(targets, nll, len(tokens), n_bytes, n_words, train_counts, fractions, unk_id, new_ids)


@dataclass
class RunModel:
    """A run's model rebuilt from a checkpoint, with the data its config prepares."""

    run_dir: Path
    cfg: Config
    data: PreparedData
    model: torch.nn.Module  # model.GPT (or arch: hf's HFCausalLM), on the CPU
    checkpoint: Path  # the checkpoint folder
    tied: bool  # as stored: a run untied late (untie_at) is two matrices
    report: runs.RunReport | None


def load_run_model(run_dir, best: bool = False, checkpoint: str | None = None,
                   chooser: str | None = None) -> RunModel:
    """Rebuild a run's model from its latest checkpoint (with `best`, the weights it kept at its best
    validation evaluation), never loading the optimizer state. The data are prepared from the
    run's own config (a token-cache hit when nothing changed); they must be the tokens it was
    trained on. The model is built from the copy the run keeps of its start, never from the start's
    weights, so a run whose start was moved, replaced or deleted is rebuilt as it was trained.
    `chooser`: the command's option that chooses other weights of the run (--best, --checkpoint),
    named when these are not finite; None for a command that has none."""
    from .runs import checkpoints
    from .data import identity_fits, prepare_data
    from .model.blocks import rebuild_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NotARunError(f"{run_dir} does not exist or is not a folder — give a run folder, one holding config.yaml "
                           "(the main job writes runs/shakespeare-tied-lr=0.003-s0)")
    cfg = runs.read_config(run_dir)
    if cfg is None:
        raise NotARunError(f"{run_dir} has no config.yaml — is it a tiedlm run folder?")
    if checkpoint is not None and checkpoint != "latest":  # `latest`: the latest checkpoint, as with none named
        ckpt = _named_checkpoint(run_dir, checkpoint)
    else:
        ckpt = _best_weights(run_dir) if best else checkpoints.latest_checkpoint(run_dir)
    if ckpt is None:
        raise NotARunError(f"{run_dir} has no checkpoint yet — train it first (tiedlm train --config ...)")
    tensors, _, manifest = checkpoints.load_checkpoint(ckpt, with_state=False)
    # nan weights: one line, not a crash or a nan score
    checkpoints.check_finite_weights(tensors, ckpt, lambda: _other_weights(run_dir, ckpt, chooser))
    tied = checkpoints.stored_tied(manifest)
    kept = _kept_start(run_dir, cfg)
    data = prepare_data(cfg, progress=False, tokenizer_copy=_kept_tokenizer(cfg, kept))
    report = runs.read_report(run_dir)
    recorded = report.data_identity if report is not None else None
    if not identity_fits(recorded, data):
        raise RunError(f"the data or tokenizer of {run_dir} changed since it was trained (source fingerprint or "
                       "tokenizer key differ), so its checkpoint no longer fits the tokens — restore the data")
    vocab = int(manifest.get("vocab_size", data.model_vocab_size))
    if vocab != data.model_vocab_size:
        raise RunError(f"the checkpoint has a vocabulary of {vocab} but the data prepared from the run's config "
                       f"gives {data.model_vocab_size} — the tokenizer changed; re-train the run")
    model = rebuild_model(cfg.model, vocab, kept)  # from the run's copy of its start, without the start's weights
    checkpoints.load_weights(model, tensors, manifest)  # a run untied late (untie_at) is stored as two matrices
    return RunModel(run_dir, cfg, data, model, ckpt, tied, report)


def _kept_start(run_dir: Path, cfg: Config) -> Path | None:
    """The copy the run keeps of its start (runs/layout.py START), which its model is rebuilt from.
    A pretrained start's run without one (trained before runs kept one) needs the start where it was:
    gone, that is one line here, before its config or tokenizer is missed there."""
    kept, m = runs.kept_start(run_dir), cfg.model
    if kept is None and m.init_from and not Path(m.hf_config or "").is_dir():
        raise RunError(f"{run_dir} was trained from model.init_from {m.init_from}, which is no longer at "
                       f"{m.hf_config}, and the run keeps no copy of its start (it was trained before runs kept "
                       f"one) — put the start back at {m.hf_config}")
    return kept


def _kept_tokenizer(cfg: Config, kept: Path | None) -> Path | None:
    """The run's copy of its pretrained start's tokenizer.json, where that file is its tokenizer
    (tokenizer.path is the start's own, as model.init_from sets it): its tokens are then prepared
    from the copy, wherever the start went."""
    copy, own = (kept or Path()) / "tokenizer.json", Path(cfg.model.hf_config or "") / "tokenizer.json"
    mine = cfg.model.init_from and cfg.tokenizer.kind == "pretrained" and Path(cfg.tokenizer.path or "") == own
    return copy if mine and kept is not None and copy.is_file() else None


def evaluate_run(run_dir, splits: list[str] | None = None, stride: int | None = None,
                 device: str = "auto", best: bool = False) -> dict:
    """`tiedlm eval RUN`: rebuild a run's model from its checkpoint (with `best`, from the weights
    it kept at its best validation evaluation) and score whole splits."""
    stored = runs.read_config(Path(run_dir)) if Path(run_dir).is_dir() else None
    if stored is not None and stride is not None:  # refused before any data are prepared
        block = stored.model.block_size
        if not 1 <= stride <= block:
            raise ConfigError(f"--stride must be between 1 and the run's block_size ({block}), got {stride}")
    rm = load_run_model(run_dir, best=best, chooser="--best")
    cfg, data = rm.cfg, rm.data
    device = resolve_device(device, "--device", "--device auto")
    dtype = resolve_dtype(cfg.train.dtype, device)
    model = rm.model.to(device)
    results = {}
    for split in splits or [s for s in cfg.eval.splits if s in data.splits]:
        if split not in data.splits:
            raise ConfigError(f"split {split!r} is not in this run's data (it has {', '.join(data.splits)}) — "
                              "choose one of those")
        with cpu_threads(cfg.train.threads):  # the run's threads, as in training
            results[split] = evaluate_split(model, data.splits[split], cfg.model.block_size,
                                            stride or cfg.eval.stride, cfg.eval.batch_size, device,
                                            autocast_ctx(device, dtype), train_counts=data.train_counts,
                                            fractions=cfg.eval.buckets, unk_id=data.tokenizer.unk_id,
                                            new_ids=getattr(data.tokenizer, "added_ids", None))
        if results[split]["tokens"] and not math.isfinite(results[split]["loss"]):
            raise RunError(f"the loss of {rm.checkpoint} on {split} is not finite although its weights are (the "
                           "activations overflow) — the run diverged; use an earlier checkpoint if the run kept one "
                           "(--best), or retrain with a lower train.lr")
    lines = [f"{rm.run_dir.name} ({rm.checkpoint.name}, {'tied' if rm.tied else 'untied'})"]
    for split, r in results.items():
        bpb = f"  bits/byte {r['bits_per_byte']:.4f}" if "bits_per_byte" in r else ""
        lines.append(f"{split:>10}: loss {r['loss']:.4f}  perplexity {r['perplexity']:.3f}{bpb}  "
                     f"({r['tokens']:,} tokens)")
    return {"results": results, "text": "\n".join(lines)}


def _recorded_best(run_dir: Path) -> str | None:
    """The kept best weights a run's report names (report.json's best.weights), or None."""
    report = runs.read_report(run_dir)
    kept = (report.best or {}).get("weights") if report is not None and isinstance(report.best, dict) else None
    return kept if isinstance(kept, str) and kept else None


def kept_best(run_dir) -> str | None:
    """The name of the weights a run kept at its best validation evaluation (best-step-N), when its
    report names them and they are in its checkpoints folder; None otherwise."""
    from .runs import checkpoints

    kept = _recorded_best(Path(run_dir))
    name = kept.rsplit("/", 1)[-1] if kept else None
    return name if name in {p.name for p in checkpoints.best_weight_folders(Path(run_dir))} else None


def _best_weights(run_dir):
    """The folder of the weights a run kept at its best validation evaluation (report.json's best)."""
    from .runs import checkpoints

    kept = _recorded_best(run_dir)
    if not kept:
        raise NotARunError(f"{run_dir} kept no best weights (train.keep_best was off, or the run has not finished) — "
                       "drop --best to score its last checkpoint")
    folders = {p.name: p for p in checkpoints.best_weight_folders(run_dir)}
    name = kept.rsplit("/", 1)[-1]
    if name not in folders:
        raise RunError(f"{run_dir}'s report names kept best weights {kept!r} that are not in its checkpoints folder "
                       "— restore them, or drop --best to score its last checkpoint")
    return folders[name]


def _other_weights(run_dir, ckpt, chooser: str | None) -> str | None:
    """How a command reads weights of the run other than `ckpt`, through its own option (`chooser`),
    when the run has any: eval's --best when it kept best weights, export's --checkpoint naming
    the others. None when the command has no such option or the run no other weights."""
    from .runs import checkpoints

    if chooser == "--checkpoint":
        others = [n for n in checkpoints.checkpoint_names(run_dir) if n != ckpt.name]
        if others:
            shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
            return f"choose other weights of the run with --checkpoint (it has {shown})"
    elif chooser == "--best":
        try:
            kept = _best_weights(run_dir)
        except Exception:  # no kept best weights (or none that can be found): nothing to offer
            return None
        if kept.name != ckpt.name:
            return f"score the weights it kept at its best evaluation ({kept.name}) with --best"
    return None


def _named_checkpoint(run_dir, name: str):
    """checkpoints/<name> (step-N or best-step-N), which must be one of the run's checkpoints."""
    from .runs import checkpoints

    have = checkpoints.checkpoint_names(run_dir)
    if name not in have:
        shown = ", ".join(have[:6]) or "none"
        raise NotARunError(f"{run_dir} has no checkpoint {name!r} (it has {shown}) — choose one of those")
    return run_dir / checkpoints.CHECKPOINTS / name
