"""Guards before a verdict: what makes a comparison say less than its table seems to, found from
the runs themselves and printed before the table (the comparison's `warnings`), and the ways its
protocol differs from the main job's (`protocol`, the first line of every report).

- runs that do not beat the unigram model of their own training split (evaluate.unigram_loss,
  recorded beside each split's loss): they have not learned from context;
- runs that spent at least half their steps warming up (fewer steps than warm-up steps is refused
  before training: train.preflight);
- most runs still improving at their last evaluation: a verdict about this budget;
- evaluation lines found verbatim in the training split (data's `overlap`, measured when the data
  are read) above OVERLAP_WARN.
"""

from __future__ import annotations

from typing import Any

from ..config import warmup_steps_for
from ..formatting import fmt
from ..perplexity import perplexity
from .collect import LoadedRun

WARMUP_SHARE = 0.5  # warm-up at least this share of a run's steps: its schedule barely peaks
# More than 1% of an evaluation split's lines (of at least 32 characters: data/overlap.py), and at
# least OVERLAP_LINES of them, also in train: said before the verdict. Measured (docs/data.md): prose
# 0-0.18% (Tiny Shakespeare, WikiText-2), code 1.4-14%, licence text 87-98%.
OVERLAP_WARN = 0.01
OVERLAP_LINES = 5
MAIN_SEEDS = 3  # the main job's seeds per variant


def _names(runs: list[LoadedRun], limit: int = 3) -> str:
    shown = ", ".join(r.name for r in runs[:limit])
    return shown + (f" and {len(runs) - limit} more" if len(runs) > limit else "")


def _ppl_range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"


def unigram_warning(runs: list[LoadedRun], split: str) -> str | None:
    """Runs whose loss on `split` is not below their training split's unigram model's."""
    failing = [r for r in runs if r.at_unigram(split)]
    if not failing:
        return None
    ppl = [perplexity(r.metric(split, "loss")) for r in failing]
    uni = [perplexity(r.metric(split, "unigram_loss")) for r in failing]
    whole = len(failing) == len(runs)
    return (f"{len(failing)} of {len(runs)} runs ({_names(failing)}) do not beat the unigram model of their "
            f"training split on {split} (perplexity {_ppl_range(ppl)} against the unigram model's "
            f"{_ppl_range(uni)}): {'they have' if len(failing) > 1 else 'it has'} not learned from context, so "
            + ("nothing can be concluded about tying from this comparison" if whole else
               "their variants' results say nothing about tying")
            + " — train longer (train.max_tokens or train.max_steps), or check train.lr and train.warmup_steps")


def warmup_warning(runs: list[LoadedRun]) -> str | None:
    """Runs whose warm-up took at least WARMUP_SHARE of their steps."""
    def warm(r: LoadedRun) -> int:
        return warmup_steps_for(r.config.train, r.report.total_steps or r.report.steps)

    short = [r for r in runs if r.report.steps and warm(r) >= WARMUP_SHARE * r.report.steps]
    if not short:
        return None
    r = short[0]
    return (f"{len(short)} of {len(runs)} runs ({_names(short)}) spent at least half their steps warming up "
            f"({r.name}: {warm(r)} warm-up steps of {r.report.steps}): the learning "
            "rate barely reached its peak, so the verdict is about the warm-up as much as the models — lower "
            "train.warmup_steps (a tenth of the steps is usual) or train longer")


def improving_warning(runs: list[LoadedRun]) -> str | None:
    """Most runs (more than half of those with periodic evaluations) at their best at the last one."""
    evaluated = [r for r in runs if r.best and r.best.get("step") is not None and r.best.get("last_step") is not None]
    last = [r for r in evaluated if r.best["step"] == r.best["last_step"]]
    if not evaluated or 2 * len(last) <= len(evaluated):
        return None
    return (f"{len(last)} of {len(evaluated)} runs were still improving: their best validation evaluation was "
            "their last, so this is a verdict about this training budget, not about the models trained until "
            "they stop improving — a longer budget may change it (docs/comparing.md)")


def overlap_warning(runs: list[LoadedRun], split: str) -> str | None:
    """The share of `split`'s lines found verbatim in train, from the data the runs read, above
    OVERLAP_WARN (the largest share among the runs' data sets)."""
    worst: tuple[float, Any, LoadedRun] | None = None
    for r in runs:
        data = r.report.data if isinstance(r.report.data, dict) else {}
        row = (data.get("overlap") or {}).get(split) if isinstance(data.get("overlap"), dict) else None
        share = row.get("share") if isinstance(row, dict) else None
        if isinstance(share, (int, float)) and (worst is None or share > worst[0]):
            worst = (float(share), row, r)
    if worst is None or worst[0] <= OVERLAP_WARN:
        return None
    share, row, r = worst
    if isinstance(row.get("in_train"), int) and row["in_train"] < OVERLAP_LINES:
        return None
    unit = row.get("unit", "lines")
    carve = r.config.data.carve
    fix = ("data.carve: contiguous carves each split as one block of neighbouring lines" if carve != "contiguous"
           else "the repeats are in the text itself: deduplicate it, or give held-out files of your own")
    k, n, chars = row.get("in_train"), row.get("checked"), row.get("min_chars")
    counts = f"{k:,} of {n:,}" if isinstance(k, int) and isinstance(n, int) else ""
    counts += (", " if counts else "") + (f"of at least {chars} characters" if isinstance(chars, int) else "")
    return (f"{share:.0%} of the {split} {unit}{f' ({counts})' if counts else ''} are also in the training split, "
            f"so part of the {split} score measures memory, not generalisation — {fix}")


def guard_warnings(runs: list[LoadedRun], split: str) -> list[str]:
    """Every guard's warning for the compared runs, on the verdict's split."""
    found = [unigram_warning(runs, split), warmup_warning(runs), improving_warning(runs),
             overlap_warning(runs, split)]
    return [w for w in found if w]


def protocol_differences(select: str, primary: str, tuned: list[str], seeds: list[int],
                         one_point: bool = False) -> list[str]:
    """How this comparison's protocol differs from the main job's (each variant at its own lr chosen
    on validation, the kept best weights, the verdict on test, 3 seeds). `tuned`: the keys each
    variant chose for itself among several values; `one_point`: --tune gave one value, so nothing
    was chosen."""
    out = []
    if one_point:
        out.append("untuned (--tune gave one point: every variant at it, nothing compared)")
    elif not tuned:
        out.append("untuned (every variant at the config's own settings)")
    elif "train.lr" not in tuned:
        out.append(f"the learning rate shared (tuned: {', '.join(tuned)}; each variant's lr at the config's)")
    if select != "best":
        out.append("final weights (not each run's best kept on validation)")
    if primary != "test":
        out.append(f"the verdict on {primary} (not test)")
    if seeds and min(seeds) < MAIN_SEEDS:
        out.append(f"{min(seeds)} seed{'s' * (min(seeds) != 1)} per variant (not {MAIN_SEEDS})")
    return out


def protocol_line(differences: list[str]) -> str | None:
    if not differences:
        return None
    return ("Protocol: " + "; ".join(differences) + ". The main job tunes each variant's learning rate on validation and "
            "compares their best kept weights on test, over 3 seeds (docs/comparing.md).")


def ignored_record_warning(ignored: str | None, primary: str) -> list[str]:
    """What the comparison says first when a tuning record (tuning.json) is ignored (`ignored`, why):
    every grid point is then a variant of its own, and validation is the split that chose the tuned
    values. [] where no record was ignored."""
    if ignored is None:
        return []
    on = (f"the verdict is on {primary}, the split that chose the tuned values, so it favours each variant's "
          "chosen point — use --primary test" if primary == "validation" else f"the verdict is on {primary}")
    return [f"the tuning record was ignored: {ignored}. Every grid point is compared as a variant of its "
            f"own, not each variant at its chosen value; {on}. Rerun the sweep (or compare --config) that trained "
            "them to write the record again"]
