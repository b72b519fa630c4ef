"""The README.md that `tiedlm export` writes into its folder: a model card in the form the Hugging
Face hub and `transformers` read (YAML front matter: library, tags, pipeline, and a model-index with
the test perplexity), then the family, the tie and how the export checked it, the parameters, the
data, the budget, the run's final scores for the weights exported, and the comparison the run took
part in, where one is found beside it (a comparison.json in the runs' folder or one of its
subfolders that names the run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .. import runs
from ..config import effective_min_lr, warmup_steps_for
from ..files import atomic_write_text

if TYPE_CHECKING:
    from . import ExportResult

CARD = "README.md"
COMPARISON = "comparison.json"  # compare/report.py's FILES["json"]


def front_matter(run: str, report: runs.RunReport, scores: dict) -> dict[str, Any]:
    cfg = report.config
    meta: dict[str, Any] = {"library_name": "transformers", "pipeline_tag": "text-generation",
                            "tags": ["tiedlm", "weight-tying", cfg.model.arch, cfg.model.tie.label]}
    if not str(cfg.data.path).startswith(("builtin:", "/", ".")) and cfg.data.path not in ("text", "json",
                                                                                          "parquet", "csv"):
        meta["datasets"] = [cfg.data.path]  # a hub id
    test = (scores.get("test") or {}).get("perplexity")
    if isinstance(test, (int, float)):
        meta["model-index"] = [{"name": run, "results": [{
            "task": {"type": "text-generation", "name": "Causal language modeling"},
            "dataset": {"name": (report.data or {}).get("source") or cfg.data.path, "type": cfg.data.path,
                        "split": cfg.data.test_split},
            "metrics": [{"type": "perplexity", "value": round(float(test), 4), "name": "Test perplexity"}]}]}]
    return meta


def tie_lines(result: ExportResult, report: runs.RunReport) -> list[str]:
    cfg = report.config
    written = ("one matrix: `lm_head` is the input embedding (`tie_word_embeddings: true`)" if result.tied
               else "two matrices: `lm_head` holds its own W_out (`tie_word_embeddings: false`)")
    lines = [f"- Tying: **{cfg.model.tie.label}** (`model.tie_mode: {cfg.model.tie.mode}`), written as {written}."]
    if result.verified:
        lines.append(f"- Checked: the folder was loaded back with transformers as `{result.hf_class}`; its tie was "
                     f"asserted by storage and by the config flag, and both implementations scored {result.tokens:,} "
                     f"validation tokens: max |logit difference| {result.max_abs_diff:.2e}, perplexity "
                     f"{result.tiedlm_perplexity:.4f} (tiedlm) and {result.hf_perplexity:.4f} (transformers).")
    else:
        lines.append(f"- Not checked with transformers ({result.note or 'transformers is not installed'}); "
                     "the tie was asserted in tiedlm when the weights were loaded.")
    ledger = report.ledger or {}
    if ledger.get("head_init"):
        lines.append(f"- W_out's initialisation: {ledger['head_init']}; E's: {ledger.get('init', 'n/a')}.")
    return lines


def find_comparison(run_dir: Path) -> Path | None:
    """The newest comparison.json beside the run (in its parent folder's subfolders) naming it."""
    run_dir = Path(run_dir).resolve()
    found = []
    for path in run_dir.parent.glob(f"*/{COMPARISON}"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        names = {(r.get("name"), str(Path(r.get("path") or "").resolve())) for r in data.get("runs") or []
                 if isinstance(r, dict)}
        if any(n == run_dir.name or p == str(run_dir) for n, p in names):
            found.append((path.stat().st_mtime, path, data))
    if not found:
        return None
    return max(found, key=lambda f: f[0])[1]


def _table(rows: list[tuple[str, Any]], head: tuple[str, str]) -> list[str]:
    return [f"| {head[0]} | {head[1]} |", "| --- | ---: |",
            *[f"| {k} | {v:,} |" if isinstance(v, int) and not isinstance(v, bool) else f"| {k} | {v} |"
              for k, v in rows]]


def card_text(run_dir: Path, report: runs.RunReport, result: ExportResult) -> str:
    cfg, run = report.config, Path(run_dir).name
    best = result.checkpoint.startswith("best-")
    scores = (report.final_best if best else report.final) or {}
    m, t = cfg.model, cfg.train
    lines = ["---", yaml.safe_dump(front_matter(run, report, scores), sort_keys=False).rstrip(), "---", "",
             f"# {run}", "",
             f"A {m.arch} causal language model ({m.n_layer} layers, d = {m.n_embd}, {m.n_head} heads, context "
             f"{m.block_size}) trained with tiedlm to measure weight tying, exported as "
             f"`{result.hf_class}` from `{result.checkpoint}` ({result.chosen or 'as asked'}).", "",
             "## The tie", "", *tie_lines(result, report), "",
             "## Parameters", "", *_table([(k, v) for k, v in (report.params or {}).items()
                                          if isinstance(v, (int, bool))], ("parameters", "count")), "",
             "## Data", "", f"- Source: {(report.data or {}).get('source') or cfg.data.path}",
             f"- Tokenizer: {cfg.tokenizer.kind}, {(report.params or {}).get('vocab_size', 'n/a')} tokens", "",
             "## Budget", "",
             f"- {report.steps or 0:,} steps, {report.tokens_seen or 0:,} tokens seen (batch {t.batch_size} × "
             f"{t.grad_accum} × {m.block_size}); lr {t.lr}, min_lr {effective_min_lr(t):g}, warmup "
             f"{warmup_steps_for(t, report.total_steps or report.steps or 0)} steps, weight decay "
             f"{t.weight_decay}; seed {report.seed}; {report.device}, {report.dtype}", "",
             "## Results", "", *_table([(f"{split} {name}", f"{res[name]:.4f}") for split, res in scores.items()
                                        for name in ("perplexity", "bits_per_byte") if isinstance(res, dict)
                                        and isinstance(res.get(name), (int, float))], ("split", "value")), ""]
    lines += comparison_lines(run_dir)
    return "\n".join(lines) + "\n"


def comparison_lines(run_dir: Path) -> list[str]:
    path = find_comparison(run_dir)
    if path is None:
        return ["## Comparison", "", "No comparison naming this run was found beside it (`tiedlm compare` writes "
                "one; its comparison.json names the runs it compared).", ""]
    data = json.loads(path.read_text(encoding="utf-8"))
    variants = ", ".join(f"{v.get('label')} ({v.get('n_seeds')} seed{'' if v.get('n_seeds') == 1 else 's'})"
                         for v in data.get("variants") or [])
    return ["## Comparison", "", f"This run was compared in `{path}`: {variants}; the verdict on "
            f"{data.get('primary')}:", "", *[f"> {s}" for s in data.get("verdicts") or []], ""]


def write_card(folder: Path, run_dir: Path, result: ExportResult) -> None:
    """README.md into the export folder (before it is moved into place)."""
    report = runs.read_report(run_dir)
    atomic_write_text(Path(folder) / CARD, card_text(run_dir, report, result))
