"""The comparison: the runs of one data set grouped into variants, each contrasted with the
baseline (build_comparison), and the Comparison that comparison.json, comparison.md, the CSV,
the terminal table and the plots are written from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import RunError
from .collect import LeftOut, LoadedRun
from .datasets import DataSet, data_difference, data_sets, mixed_data_message
from .matching import ParamMatch
from .stats import ALPHA, LEVEL, number
from .variants import (
    COST_KEYS,
    SPLITS,
    Candidate,
    Variant,
    aggregate,
    choose_baseline,
    label_variants,
    variant_config,
    versus,
)


@dataclass
class RunRow:
    """One compared run, as the Runs table and the CSV show it."""

    name: str
    path: str
    variant: str
    seed: int
    config_hash: str
    validation_perplexity: float | None
    validation_bits_per_byte: float | None
    validation_loss: float | None
    test_perplexity: float | None
    test_bits_per_byte: float | None
    test_loss: float | None
    buckets: dict[str, dict[str, float | None]]  # split -> bucket name -> loss
    params_total: Any
    tokens_per_s: float | None
    wall_time_s: float | None
    peak_memory_bytes: float | None
    tokens_seen: float | None
    steps: float | None
    device: str | None

    def metric(self, split: str, key: str) -> float | None:
        return getattr(self, f"{split}_{key}")


@dataclass
class NotCompared:
    """A variant trained on other data than the baseline's, with how the data differ."""

    variant: str
    runs: list[str]
    paths: list[str]
    seeds: list[int]
    data_set: int  # 1-based, as the messages count them
    difference: str
    reason: str


@dataclass
class TrainFailure:
    """A run that compare --config failed to train (not part of comparison.json)."""

    name: str
    error: str | None


@dataclass
class Comparison:
    """The whole comparison: what comparison.json holds (to_json), and what the reports show."""

    created: str
    out: str
    baseline_label: str
    baseline_reason: str
    differing_keys: list[str]
    variants: list[Variant]  # the baseline first, then by label
    runs: list[RunRow]
    skipped: list[LeftOut]  # runs left out, with the reason
    notes: list[str]
    data_sets: int
    not_compared: list[NotCompared]
    match: ParamMatch | None = None  # compare --config --match params
    files: dict[str, str] = field(default_factory=dict)  # output kind -> path, once written
    train_failures: list[TrainFailure] = field(default_factory=list)
    tiedlm_version: str = ""
    level: float = LEVEL
    alpha: float = ALPHA

    @property
    def verdicts(self) -> list[str]:
        return [line for v in self.variants for line in v.verdicts]

    @property
    def baseline(self) -> Variant:
        return next(v for v in self.variants if v.is_baseline)

    def variant(self, label: str) -> Variant:
        return next(v for v in self.variants if v.label == label)

    def bucket_names(self, split: str = "validation") -> list[str]:
        """The buckets of every variant on split, in order of first appearance."""
        names: list[str] = []
        for v in self.variants:
            names += [b.name for b in v.buckets(split) if b.name not in names]
        return names

    def to_json(self) -> dict:
        """comparison.json: strict JSON (NaN and infinities as null, integer keys as strings)."""
        return _json_safe({
            "format": 1, "tiedlm_version": self.tiedlm_version, "created": self.created, "out": self.out,
            "level": self.level, "alpha": self.alpha, "interval": INTERVAL, "difference": DIFFERENCE,
            "baseline": {"label": self.baseline_label, "reason": self.baseline_reason},
            "differing_keys": self.differing_keys, "variants": [v.to_json() for v in self.variants],
            "runs": [asdict(r) for r in self.runs], "skipped": [asdict(s) for s in self.skipped],
            "notes": self.notes, "match": self.match.to_json() if self.match else None,
            "verdicts": self.verdicts, "data_sets": self.data_sets,
            "not_compared": [asdict(n) for n in self.not_compared], "files": self.files,
        })


INTERVAL = ("95% Student-t confidence interval for the mean over seeds: "
            "mean ± t(0.975, n−1)·sd/√n, sd the sample standard deviation (n−1)")
DIFFERENCE = ("variant − baseline, in perplexity; paired t-test on per-seed differences when "
              "both variants have the same seeds, Welch's t-test (Welch–Satterthwaite df) otherwise; "
              "two-sided p-values")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _one_per_seed(runs: list[LoadedRun], skipped: list[LeftOut]) -> dict[str, list[LoadedRun]]:
    """Runs grouped by config hash in a stable order (first appearance by run name), one run per
    seed; the duplicates are added to `skipped`."""
    groups: dict[str, list[LoadedRun]] = {}
    for run in sorted(runs, key=lambda r: (r.name, r.path)):
        groups.setdefault(run.config_hash, []).append(run)
    kept: dict[str, list[LoadedRun]] = {}
    for chash, members in groups.items():
        by_seed: dict[int, LoadedRun] = {}
        for run in members:
            if run.seed in by_seed:
                skipped.append(LeftOut(run.path, run.name, f"same config and seed {run.seed} as "
                                       f"{by_seed[run.seed].name} (a copy?); only the first is used"))
            else:
                by_seed[run.seed] = run
        kept[chash] = [by_seed[s] for s in sorted(by_seed)]
    return kept


def _labels(kept: dict[str, list[LoadedRun]]) -> tuple[list[str], list[str]]:
    hashes = list(kept)
    labels, keys = label_variants([kept[h][0].config for h in hashes])
    if len(set(labels)) != len(labels):  # configs that differ only where the hash saw it
        labels = [f"{lab} [{h[:6]}]" for lab, h in zip(labels, hashes)]
    return labels, keys


def pick_data_set(groups: list[DataSet], kept_by_group: list[dict[str, list[LoadedRun]]],
                  baseline: str) -> tuple[int, str, str, list[NotCompared]]:
    """With runs on several data sets and --baseline: (the baseline's data set, its config hash, why
    it was chosen, the other data sets' variants, not compared). The baseline is looked up among
    labels computed over all the runs, which name the data keys that tell the data sets apart."""
    entries = [(gi, h) for gi, kept in enumerate(kept_by_group) for h in kept]
    labels, _ = label_variants([kept_by_group[gi][h][0].config for gi, h in entries])
    if len(set(labels)) != len(labels):  # the same config on other data (the data files changed)
        labels = [f"{lab} [data set {gi + 1}]" for lab, (gi, _h) in zip(labels, entries)]
    candidates = []
    for lab, (gi, h) in zip(labels, entries):
        runs = kept_by_group[gi][h]
        candidates.append(Candidate(label=lab, runs=[r.name for r in runs], seeds=[r.seed for r in runs],
                                    config=variant_config(runs[0].config), config_hash=h, data_set=gi))
    base, why = choose_baseline(candidates, baseline)
    home = groups[base.data_set]
    not_compared = []
    for c in candidates:
        if c.data_set == base.data_set:
            continue
        how = data_difference(groups[c.data_set], home, sep=" instead of ")
        not_compared.append(NotCompared(
            variant=c.label, runs=c.runs, paths=[r.path for r in kept_by_group[c.data_set][c.config_hash]],
            seeds=c.seeds, data_set=c.data_set + 1, difference=how, reason=f"trained on other data ({how})"))
    return base.data_set, base.config_hash, why, not_compared


def _run_row(run: LoadedRun, label: str) -> RunRow:
    finals = {f"{s}_{k}": run.metric(s, k) for s in SPLITS for k in ("perplexity", "bits_per_byte", "loss")}
    return RunRow(name=run.name, path=run.path, variant=label, seed=run.seed, config_hash=run.config_hash,
                  **finals,
                  buckets={s: {n: number((run.bucket(s, n) or {}).get("loss")) for n in run.bucket_names(s)}
                           for s in SPLITS},
                  params_total=run.params.get("total"),
                  **{k: number(getattr(run.report, k)) for k in COST_KEYS}, device=run.report.device)


def build_comparison(runs: list[LoadedRun], skipped: list[LeftOut], baseline: str | None, out: str,
                     match: ParamMatch | None = None) -> Comparison:
    """Group runs into data sets and variants, aggregate, and contrast each variant with the
    baseline. Runs on several data sets need --baseline (a RunError otherwise); then only the
    baseline's data set is compared."""
    from .. import __version__

    groups = data_sets(runs)
    kept_by_group = [_one_per_seed(g.runs, skipped) for g in groups]
    not_compared: list[NotCompared] = []
    if len(groups) == 1:
        home, base_hash = 0, None
    elif not baseline or not baseline.strip():
        raise RunError(mixed_data_message(groups))
    else:
        home, base_hash, why, not_compared = pick_data_set(groups, kept_by_group, baseline)
    kept = kept_by_group[home]
    labels, keys = _labels(kept)  # within the data set, so that labels name only what differs there
    variants = [aggregate(lab, kept[h]) for lab, h in zip(labels, kept)]
    if base_hash is None:
        base, why = choose_baseline(variants, baseline)
    else:
        base = next(v for v in variants if v.config_hash == base_hash)
    variants.sort(key=lambda v: (v is not base, v.label))
    for v in variants:
        v.is_baseline = v is base
        v.vs_baseline = None if v is base else versus(v, base)
    rows = [_run_row(r, lab) for lab, h in zip(labels, kept) for r in kept[h]]
    return Comparison(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), out=out, baseline_label=base.label,
        baseline_reason=why, differing_keys=keys, variants=variants, runs=rows, skipped=skipped,
        notes=[n for r in groups[home].runs for n in r.notes], data_sets=len(groups),
        not_compared=not_compared, match=match, tiedlm_version=__version__)
