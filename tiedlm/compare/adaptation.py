"""A pretrained start's comparison (model.init_from): per variant, what was done to the
checkpoint's tie, its old domain's perplexity before and after (eval.also, on the weights the
comparison judges), and the new tokens' loss (tokenizer.add_tokens) on the primary split, each
the mean over the variant's seeds. Read from the runs' reports; nothing here is new arithmetic but
the means (losses averaged, then exponentiated, as the comparison's perplexities are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formatting import markdown_table, percent
from ..perplexity import perplexity


@dataclass
class Adapted:
    variant: str
    seeds: int
    start: str | None  # params.start's words: kept tied, untied by copy, tied from ...
    old_before: float | None  # the old domain's perplexity at the start (eval.also)
    old_after: float | None  # ... after training, on the judged weights
    new_tokens_loss: float | None  # the new tokens' mean loss on the primary split (nats)
    new_tokens_share: float | None  # their share of that split's predicted tokens


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ppl(loss: float | None) -> float | None:
    return perplexity(loss) if loss is not None else None


def adapted_variant(label: str, runs: list[Any], primary: str) -> Adapted | None:
    """One variant's row, or None when none of its runs started from a checkpoint, scored eval.also
    or added tokens (collect.LoadedRun.adapted, which decides whether a comparison has this table)."""
    if not any(r.adapted for r in runs):
        return None
    starts = {(r.params.get("start") or {}).get("start") for r in runs} - {None}
    before, after = [], []
    for r in runs:
        also = r.report.also or {}
        judged = also.get("after_best" if r.weights == "best" else "after")
        if also.get("before") and judged:
            before.append(also["before"]["loss"])
            after.append(judged["loss"])
    new = [r.final.get(primary, {}).get("new_tokens") for r in runs]
    new = [n for n in new if n and n.get("loss") is not None]
    return Adapted(label, len(runs), ", ".join(sorted(starts)) or None, _ppl(_mean(before)), _ppl(_mean(after)),
                   _mean([n["loss"] for n in new]), _mean([n["share"] for n in new]))


def adaptation_rows(labels: list[str], kept: dict, primary: str) -> list[Adapted]:
    rows = [adapted_variant(lab, kept[h], primary) for lab, h in zip(labels, kept)]
    return [r for r in rows if r is not None]


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def adaptation_markdown(rows: list[Adapted], primary: str) -> list[str]:
    if not rows:
        return []
    table = [[a.variant, str(a.seeds), a.start or "—", _f(a.old_before), _f(a.old_after),
              "—" if a.old_before is None or a.old_after is None else f"{a.old_after / a.old_before - 1:+.2%}",
              _f(a.new_tokens_loss, ".3f"), "—" if a.new_tokens_share is None else f"{a.new_tokens_share:.2%}"]
             for a in rows]
    return ["", "## The pretrained start, the old domain and the new tokens", "",
            "What each variant did to the checkpoint's tie; the old domain's test perplexity (eval.also) at the start "
            "and after training, on the weights compared; and the new tokens' mean loss on the "
            f"{primary} split with their share of its tokens (tokenizer.add_tokens). Means over each variant's seeds.",
            "", markdown_table(["variant", "seeds", "start", "old domain before", "after", "change",
                                "new tokens' loss", "their share"], table, "lrlrrrrr")]


def adaptation_lines(rows: list[Adapted], primary: str) -> list[str]:
    """The terminal's lines: per variant, what it did to the checkpoint's tie, the old domain's
    perplexity before and after, and the new tokens' loss (the same numbers as the markdown's)."""
    out = []
    for a in rows:
        parts = [f"{a.variant}" + (f" ({a.start})" if a.start else "")]
        if a.old_before is not None and a.old_after is not None:
            parts.append(f"the old domain's test perplexity {a.old_before:,.2f} → {a.old_after:,.2f} "
                         f"({percent(a.old_after / a.old_before - 1, 1)})")
        if a.new_tokens_loss is not None:
            share = f", {a.new_tokens_share:.2%} of its tokens" if a.new_tokens_share is not None else ""
            parts.append(f"the new tokens' loss {a.new_tokens_loss:.3f} nats on {primary}{share}")
        out.append("Adaptation: " + "; ".join(parts) + f" (mean over {a.seeds} seed{'s' if a.seeds != 1 else ''}).")
    return out
