"""`tiedlm analyze`: the two matrices themselves — why tying helps or hurts, not only whether.

E says "token t lives at e_t"; W_out says "a hidden state produces t in proportion to how much it
resembles w_t". Tying asserts they are one geometry. For each run this reads the latest checkpoint
(weights only, never the optimizer state; a run still training is analysed as it stands, and
marked so), the run's data (token counts of the training split, the evaluation split) and writes
analysis.json, analysis.md and plots into the run folder (or --out):

    measures    each matrix, the pair, the direct path, the synthetic language's asymmetry
    render      analysis.md, analysis.json and the plots

Neighbour and pairwise statistics use seeded samples of tokens (say so in the report); the
direct path is scored on the first `max_pairs` consecutive pairs of the split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import runs
from ..runs.checkpoints import check_outside_runs
from ..device import cpu_threads
from ..errors import ConfigError, RunError, TiedlmError
from ..files import check_foreign
from ..formatting import fmt
from ..runs import FolderLock
from .measures import direct_path, finite, language_asymmetry, matrix_stats, pair_stats, per_token_arrays
from .render import (
    ANALYSIS_JSON,
    ANALYSIS_MD,
    analysis_files,
    tie_kind,
    write_analysis,
)  # render imports nothing from here

if TYPE_CHECKING:
    from ..data import SplitData
    from ..evaluate import RunModel

FORMAT = 1


def _load(run_dir: Path):
    """The run's model and data; a checkpoint replaced by a training run between finding and
    reading it is looked up again."""
    from ..evaluate import load_run_model

    try:
        return load_run_model(run_dir)
    except RunError:
        report = _status(run_dir)
        if report != "running":
            raise
        return load_run_model(run_dir)  # the next checkpoint replaced the one found: read that one


def _status(run_dir: Path) -> str | None:

    try:
        report = runs.read_report(run_dir)
    except Exception:  # a damaged report: the first error stands
        return None
    return report.status if report is not None else None


def analyze_run(run_dir: str | Path, out: str | Path | None = None, split: str = "validation", sample: int = 2000,
                seed: int = 0, max_pairs: int = 200_000, pairs: int = 20_000, overwrite: bool = False,
                overwrite_option: str = "--overwrite") -> dict:
    """Analyse one run: returns what analysis.json holds, and writes it with analysis.md and the
    plots into `out` (default: the run folder), with the run's train.threads as in training.

    A file of those names that tiedlm did not write there (files.recording) is refused, before
    anything is read, with a ConfigError naming `overwrite_option`, unless `overwrite`; so is an
    `out` inside a run's managed parts (checkpoints/, tb/, ...)."""

    run_dir = Path(run_dir)
    check_target(run_dir if out is None else Path(out), overwrite, overwrite_option, out is not None, run_dir)
    rm = _load(run_dir)
    with cpu_threads(rm.cfg.train.threads):
        return _analyze(rm, run_dir, out, split, sample, seed, max_pairs, pairs, overwrite, overwrite_option)


def check_target(target: Path, overwrite: bool = False, overwrite_option: str = "--overwrite",
                 is_out: bool = True, run_dir: Path | None = None) -> None:
    """Refuse, before anything is written, an analysis folder (an --out) inside a run's managed
    parts, and files there of the analysis' names that tiedlm did not write: the names of the
    run's analysis, untied (with the pair-cosine plot) unless its config says tied for good
    (_may_be_untied). write_analysis checks them again once the weights are read."""
    if is_out:
        check_outside_runs(target, "--out")
    untied = run_dir is not None and _may_be_untied(run_dir)
    check_foreign(target, analysis_files(tied=not untied), overwrite_option, overwrite)


def _may_be_untied(run_dir: Path) -> bool:
    """Whether the run's config makes a W_out other than E: untied, projection or lowrank of a
    rank above 0 (W_out built from E is a matrix of its own), or an untie_at (which splits the tied
    matrix part-way, so its latest checkpoint may be either). False when the config cannot be
    read: such a run is refused when it is loaded, and nothing is written for it."""

    try:
        config = runs.read_config(Path(run_dir))
    except (TiedlmError, OSError):
        return False
    return config is not None and (not config.model.tie.w_out_is_e or config.model.untie_at is not None)


def _analyze(rm: RunModel, run_dir: Path, out: str | Path | None, split: str, sample: int, seed: int, max_pairs: int,
             pairs: int, overwrite: bool = False, overwrite_option: str = "--overwrite") -> dict:
    cfg, data, model = rm.cfg, rm.data, rm.model
    if split not in data.splits:
        raise ConfigError(f"--split {split}: the run's data has no such split (it has {', '.join(data.splits)}) — "
                          "choose one of those")
    V = data.vocab_size
    counts = data.train_counts[:V]
    from ..evaluate import frequency_buckets

    bucket_of, names = frequency_buckets(counts, cfg.eval.buckets, data.tokenizer.unk_id)
    E, W = per_token_arrays(model, V)
    matrices = {"E": matrix_stats(E, counts, bucket_of, names, seed, pairs)}
    pair: dict[str, Any]
    if model.w_out_is_e:
        pair = {"tied": True, "cosine": 1.0, "aligned_cosine": 1.0, "cka": 1.0, "relative_drift": 0.0}
    else:
        matrices["W_out"] = matrix_stats(W, counts, bucket_of, names, seed, pairs)
        pair = {"tied": False, **pair_stats(E, W, bucket_of, names, seed, sample)}
    status = rm.report.status if rm.report is not None else None
    result = {
        "format": FORMAT, "run": run_dir.name, "path": str(run_dir), "checkpoint": rm.checkpoint.name,
        "status": status, "still_training": status != "finished", "tied": model.w_out_is_e,
        "tie_mode": model.built_tie.stored_mode, "tie_label": cfg.model.tie.label,
        "untied_at_step": rm.report.untied_at_step if rm.report is not None else None,
        "vocab_size": V, "model_vocab_size": data.model_vocab_size, "n_embd": cfg.model.n_embd,
        "split": split, "seed": seed, "sample": min(sample, V), "anisotropy_pairs": pairs,
        "matrices": matrices, "pair": pair,
        "direct_path": {**direct_path(model, data.splits[split].tokens, V, max_pairs, _bytes_per_token(data.splits[split])),
                        "split": split},
        "model_loss": _model_loss(rm.report, split), "floor": _floor(rm.report, split),
        "language": language_asymmetry(cfg.data.synthetic) if cfg.data.path == "builtin:synthetic" else None,
    }
    result = _strict(result)
    target = Path(out) if out is not None else run_dir
    arrays = {"counts": counts, "bucket_of": bucket_of, "names": names, "E": E, "W": None if model.w_out_is_e else W}

    with FolderLock(target):  # another analysis or comparison writing there finishes first: no mixed files
        write_analysis(result, arrays, target, overwrite, overwrite_option)
    return result


def _bytes_per_token(split: SplitData) -> float | None:
    """The split's UTF-8 bytes per token (None when its bytes are not known)."""
    return split.n_bytes / len(split.tokens) if split.n_bytes and len(split.tokens) else None


def _model_loss(report: runs.RunReport | None, split: str) -> float | None:
    final = getattr(report, "final", None) or {}
    section = final.get(split) if isinstance(final, dict) else None
    return section.get("loss") if isinstance(section, dict) else None


def _floor(report: runs.RunReport | None, split: str) -> dict | None:
    """The synthetic language's per-token loss on this split (the true model, which is a bigram
    model of words: each word fixes its class), where the run recorded it."""
    floor = getattr(report, "floor", None) or {}
    f = (floor.get("splits") or {}).get(split) if isinstance(floor, dict) else None
    if not isinstance(f, dict) or f.get("nats_per_token") is None:
        return None
    return {"label": f.get("label"), "nats_per_token": f["nats_per_token"], "perplexity": f.get("perplexity")}


def _strict(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return finite(obj)


def read_analysis(run_dir: str | Path) -> dict | None:
    """A run's analysis.json, or None when it has none (or an unreadable one)."""
    path = Path(run_dir) / ANALYSIS_JSON
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def summary_line(r: dict, where: Path) -> str:
    """One line per analysed run for the terminal."""

    e = r["matrices"]["E"]
    d = r["direct_path"]
    parts = [f"{r['run']} ({tie_kind(r)}, {r['checkpoint']}"
             + (", still training" if r["still_training"] else "") + ")",
             f"E: norm-frequency rho {fmt(e['norm_frequency_spearman'], 2)}, anisotropy "
             f"{fmt(e['anisotropy']['mean_cosine'], 3)}, effective rank {fmt(e['effective_rank'], 1)}/{r['n_embd']}"]
    if not r["tied"]:
        p = r["pair"]
        parts.append(f"pair cosine {fmt(p['cosine'], 3)} (aligned {fmt(p['aligned_cosine'], 3)}), CKA {fmt(p['cka'], 3)}")
    path = "direct path not measured (arch: hf)" if d.get("skipped") else f"direct path {fmt(d['nll'], 3)} nats"
    if d.get("with_e_as_w_out"):
        path += f" (with W_out := E {fmt(d['with_e_as_w_out']['nll'], 3)})"
    parts.append(path)
    return "; ".join(parts) + f" — wrote {Path(where) / ANALYSIS_MD}"


__all__ = ["analyze_run", "check_target", "read_analysis", "summary_line", "ANALYSIS_JSON", "ANALYSIS_MD"]
