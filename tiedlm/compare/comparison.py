"""The comparison: the runs of one data set grouped into variants (one per config and resolved
device type and dtype), each contrasted with the baseline, or in a grid with its matched untied
variant (build_comparison); and the Comparison that comparison.json, comparison.md, the CSV, the
terminal table and the plots are written from. One split, the primary endpoint, carries the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ConfigError, RunError
from .adaptation import adaptation_rows
from .collect import LeftOut, LoadedRun
from .datasets import OTHER_DATA, OTHER_START, DataSet, data_difference, data_sets, mixed_data_message, \
    only_start_differs
from .grid import MatchedContrast, matched_contrasts
from .matching import MatchFamily, ParamMatch, found_match, match_family
from .stats import ALPHA, LEVEL, POWER, number
from .trajectory import Trajectory, contrast_trajectories, variant_json
from .tying_line import TyingLine, tying_line
from .variants import (
    COST_KEYS,
    SPLITS,
    Candidate,
    Variant,
    aggregate,
    choose_baseline,
    label_variants,
    resolution,
    run_loss,
    versus,
)
from .datasets import data_view
from .map_measures import MapSection, map_section, missing_map_note

if TYPE_CHECKING:
    from .sequential import Sequential
    from .tuned import Tuning

PRIMARY = "validation"  # the default primary endpoint


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
    train_perplexity: float | None
    train_bits_per_byte: float | None
    train_loss: float | None
    params_total: Any
    tokens_per_s: float | None
    wall_time_s: float | None
    peak_memory_bytes: float | None
    tokens_seen: float | None
    steps: float | None
    device: str | None
    dtype: str | None
    weights: str = "last"  # the weights scored: the last, or the kept best
    best_step: int | None = None  # the best periodic validation evaluation
    last_above_best: float | None = None  # the last one's perplexity over the best's, minus one
    overtrained: bool | None = None  # last_above_best over the margin (selection.OVERTRAINED_MARGIN)

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
    baseline_label: str | None  # None in matched mode: each tied variant has its own untied reference
    baseline_reason: str
    differing_keys: list[str]
    variants: list[Variant]  # the baseline first, then by label
    runs: list[RunRow]
    skipped: list[LeftOut]  # runs left out, with the reason
    notes: list[str]
    data_sets: int
    not_compared: list[NotCompared]
    match: ParamMatch | None = None  # compare --config --match params (or params:width)
    family: MatchFamily | None = None  # with the match: its two contrasts against untied, judged by Holm
    files: dict[str, str] = field(default_factory=dict)  # output kind -> path, once written
    train_failures: list[TrainFailure] = field(default_factory=list)
    trained: int | None = None  # compare --config: the runs it trained or found finished (its tuning's too)
    tiedlm_version: str = ""
    level: float = LEVEL
    alpha: float = ALPHA
    primary: str = PRIMARY  # the split whose loss carries the verdict; the others confirm
    mode: str = "baseline"  # "baseline": every variant against one; "matched": tied vs untied per setting
    matched: list[MatchedContrast] = field(default_factory=list)
    select: str = "final"  # whose scores are compared: each run's last weights, or its kept best ones
    select_reason: str = ""
    trajectories: dict[str, Trajectory] = field(default_factory=dict)  # variant label -> its contrast over training
    tuning: Tuning | None = None  # each variant's own setting, chosen on validation (compare --tune)
    sequential: Sequential | None = None  # --seeds auto, the looks and why the seeds stopped
    tying_map: MapSection | None = None  # a two-key numeric grid's map, with the matrices beside it
    tying_line: TyingLine | None = None  # a one-key numeric grid's line and its crossing
    warnings: list[str] = field(default_factory=list)  # what changes how the verdict reads: first on every report
    protocol: str | None = None  # how the protocol differs from the main job's (guards.protocol_line): at the top
    replaced: str | None = None  # the line saying an earlier comparison of other runs in its folder was replaced
    adaptation: list = field(default_factory=list)  # adaptation.Adapted: a pretrained start's rows, per variant
    at_chance: set = field(default_factory=set)  # runs that do not beat their unigram model on the primary split

    @property
    def verdicts(self) -> list[str]:
        return [line for v in self.variants for line in v.verdicts]

    @property
    def baseline(self) -> Variant | None:
        return next((v for v in self.variants if v.is_baseline), None)

    @property
    def confirmations(self) -> list[str]:
        """The splits that confirm the primary one: the other splits some variant has (not validation
        when it chose the compared weights: its scores of them are biased)."""
        return [s for s in SPLITS if s != self.primary and any(s in v.metrics for v in self.variants)
                and not (s == "validation" and self.select == "best")]

    def variant(self, label: str) -> Variant:
        return next(v for v in self.variants if v.label == label)

    def primary_contrast(self) -> tuple[Variant, Any] | None:
        """(the variant, its contrast on the primary split): with --match the tied variant at equal
        architecture (the family's primary contrast), else the first variant with one."""
        if self.family is not None and self.family.split == self.primary:
            v = self.variant(self.family.primary.label)
            d = v.contrast(self.primary)
            if d is not None and d.difference is not None:
                return v, d
        for v in self.variants:
            d = v.contrast(self.primary)
            if d is not None and d.difference is not None:
                return v, d
        return None

    def bucket_names(self, split: str = "validation") -> list[str]:
        """The buckets of every variant on split, in order of first appearance."""
        names: list[str] = []
        for v in self.variants:
            names += [b.name for b in v.buckets(split) if b.name not in names]
        return names

    def to_json(self) -> dict:
        """comparison.json: strict JSON (NaN and infinities as null, integer keys as strings)."""
        return _json_safe({
            "format": 2, "tiedlm_version": self.tiedlm_version, "created": self.created, "out": self.out,
            "level": self.level, "alpha": self.alpha, "power": POWER, "interval": INTERVAL, "difference": DIFFERENCE,
            "primary": self.primary, "confirmation": self.confirmations, "secondary": SECONDARY,
            "select": {"weights": self.select, "reason": self.select_reason},
            "mode": self.mode, "baseline": {"label": self.baseline_label, "reason": self.baseline_reason},
            "differing_keys": self.differing_keys,
            "adaptation": [asdict(a) for a in self.adaptation],
            "variants": [variant_json(v, self.trajectories) for v in self.variants],  # with each contrast's trajectory
            "runs": [asdict(r) for r in self.runs], "skipped": [asdict(s) for s in self.skipped],
            "notes": self.notes, "match": self.match.to_json() if self.match else None,
            "match_contrasts": self.family.to_json() if self.family is not None else None,
            "verdicts": self.verdicts, "data_sets": self.data_sets,
            "not_compared": [asdict(n) for n in self.not_compared],
            "matched": [m.to_json(self.primary) for m in self.matched], "files": self.files,
            "tuning": self.tuning.to_json() if self.tuning is not None else None,
            "tying_map": self.tying_map.to_json() if self.tying_map is not None else None,
            "tying_line": self.tying_line.to_json() if self.tying_line is not None else None,
            "sequential": self.sequential.to_json() if self.sequential is not None else None,
            "warnings": self.warnings, "protocol": self.protocol,
        })


INTERVAL = ("95% Student-t confidence interval for the mean loss over seeds, mean ± t(0.975, n−1)·sd/√n "
            "(sd the sample standard deviation, n−1); perplexities are exp(mean loss), the geometric mean "
            "over seeds, with exp() of the loss interval as bounds")
DIFFERENCE = ("variant − reference in loss (nats per token), shown as exp(Δloss) − 1, the ratio of the "
              "perplexities minus one, with exp(CI) − 1 bounds; paired t-test on per-seed differences when "
              "both variants have the same seeds, Welch's t-test (Welch–Satterthwaite df) otherwise; two-sided "
              "p-values; no spread between seeds: the interval is the point and p = 0 (undefined, null, when "
              "the difference is 0 too)")
SECONDARY = ("per-bucket loss differences: own 95% intervals, p-values Holm-adjusted over the buckets of one "
             "contrast (p_holm)")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _one_per_seed(runs: list[LoadedRun], skipped: list[LeftOut]) -> dict[str, list[LoadedRun]]:
    """Runs grouped by config hash and resolved device type and dtype, in a stable order (first
    appearance by run name), one run per seed; the duplicates are added to `skipped`. The key is the
    config hash, followed by "|" and the resolution when runs of one hash resolved several ways."""
    ordered = sorted(runs, key=lambda r: (r.name, r.path))
    ways: dict[str, set[str]] = {}
    for run in ordered:
        ways.setdefault(run.config_hash, set()).add(resolution(run))
    groups: dict[str, list[LoadedRun]] = {}
    for run in ordered:
        split = len(ways[run.config_hash]) > 1
        groups.setdefault(f"{run.config_hash}|{resolution(run)}" if split else run.config_hash, []).append(run)
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


def _resolved(labels: list[str], firsts: list[LoadedRun]) -> list[str]:
    """Labels with the resolved device type and dtype appended ("tied (cuda, bf16)") when the runs
    did not all resolve alike."""
    ways = [resolution(r) for r in firsts]
    return labels if len(set(ways)) <= 1 else [f"{lab} ({w})" for lab, w in zip(labels, ways)]


def _labels(kept: dict[str, list[LoadedRun]], tuned: list[str] = ()) -> tuple[list[str], list[str]]:
    hashes = list(kept)
    labels, keys = label_variants([kept[h][0].config for h in hashes], ignore=tuned)
    labels = _resolved(labels, [kept[h][0] for h in hashes])
    if len(set(labels)) != len(labels):  # configs that differ only where the hash saw it
        labels = [f"{lab} [{h[:6]}]" for lab, h in zip(labels, hashes)]
    return labels, keys


def _resolution_note(variants: list[Variant]) -> list[str]:
    ways = sorted({v.resolution for v in variants})
    if len(ways) <= 1:
        return []
    return [f"the runs resolved to different devices or dtypes ({'; '.join(ways)}): each is a variant of its own, "
            "labelled with it, and a contrast across them mixes the effect with the numerics of the device"]


def pick_data_set(groups: list[DataSet], kept_by_group: list[dict[str, list[LoadedRun]]],
                  baseline: str) -> tuple[int, str, str, list[NotCompared]]:
    """With runs on several data sets and --baseline: (the baseline's data set, its config hash, why
    it was chosen, the other data sets' variants, not compared). The baseline is looked up among
    labels computed over all the runs, which name the data keys that tell the data sets apart."""
    entries = [(gi, h) for gi, kept in enumerate(kept_by_group) for h in kept]
    labels, _ = label_variants([kept_by_group[gi][h][0].config for gi, h in entries])
    labels = _resolved(labels, [kept_by_group[gi][h][0] for gi, h in entries])
    if len(set(labels)) != len(labels):  # the same config on other data (the data files changed), or another start
        noun = "start" if all(only_start_differs(groups[0], g) for g in groups[1:]) else "data set"
        labels = [f"{lab} [{noun} {gi + 1}]" for lab, (gi, _h) in zip(labels, entries)]
    candidates = []
    for lab, (gi, h) in zip(labels, entries):
        runs = kept_by_group[gi][h]
        candidates.append(Candidate(label=lab, runs=[r.name for r in runs], seeds=[r.seed for r in runs],
                                    config=runs[0].config, config_hash=h, data_set=gi))
    base, why = choose_baseline(candidates, baseline)
    home = groups[base.data_set]
    not_compared = []
    for c in candidates:
        if c.data_set == base.data_set:
            continue
        how = data_difference(groups[c.data_set], home, sep=" instead of ")
        other = OTHER_START if only_start_differs(groups[c.data_set], home) else OTHER_DATA
        not_compared.append(NotCompared(
            variant=c.label, runs=c.runs, paths=[r.path for r in kept_by_group[c.data_set][c.config_hash]],
            seeds=c.seeds, data_set=c.data_set + 1, difference=how, reason=f"{other} ({how})"))
    return base.data_set, base.config_hash, why, not_compared


def _run_row(run: LoadedRun, label: str) -> RunRow:
    finals = {f"{s}_{k}": run.metric(s, k) for s in SPLITS for k in ("perplexity", "bits_per_byte", "loss")}
    for s in SPLITS:  # the loss is what is tested: log(perplexity) where a report lacks it
        finals[f"{s}_loss"] = run_loss(run, s)
    return RunRow(name=run.name, path=run.path, variant=label, seed=run.seed, config_hash=run.config_hash,
                  **finals,
                  buckets={s: {n: number((run.bucket(s, n) or {}).get("loss")) for n in run.bucket_names(s)}
                           for s in SPLITS},
                  params_total=run.params.get("total"),
                  **{k: number(getattr(run.report, k)) for k in COST_KEYS}, device=run.report.device,
                  dtype=run.report.dtype, weights=run.weights, best_step=(run.best or {}).get("step"),
                  last_above_best=number((run.best or {}).get("last_above_best")),
                  overtrained=(run.best or {}).get("overtrained"))


def _check_primary(variants: list[Variant], primary: str) -> None:
    if not any(primary in v.metrics for v in variants):
        have = [s for s in SPLITS if any(s in v.metrics for v in variants)]
        raise ConfigError(f"--primary {primary}: no compared run has a final {primary} evaluation (eval.splits) "
                          f"— choose one the runs have: {', '.join(have) or 'none'}")


def _contrast(variants: list[Variant], keys: list[str], baseline: str | None, base_key: str | None,
              match: ParamMatch | None, tuned: Sequence[str] = ()) -> tuple[Variant | None, str, list[MatchedContrast]]:
    """Set every variant's contrast: tied against its untied twin in a grid (no --baseline, no
    --match), else every variant against one baseline. Returns (the baseline or None, why, the
    matched contrasts)."""
    if base_key is None and not baseline and match is None:
        matched = matched_contrasts(variants, keys, tuned)
        if matched:
            return None, ("none: the variants differ in more than tying, so each tied variant is contrasted with "
                          "the untied variant identical in every other key (pass --baseline for one baseline)"), matched
    if base_key is None:
        base, why = choose_baseline(variants, baseline)
    else:
        base, why = next(v for v in variants if v.key == base_key), ""
    for v in variants:
        v.is_baseline = v is base
        v.vs_baseline = None if v is base else versus(v, base, tuned=tuned)
    return base, why, []


def _twins_across_data_sets(kept_by_group: list[dict[str, list[LoadedRun]]], tuned: Sequence[str],
                            match: ParamMatch | None) -> tuple | None:
    """A grid whose points differ in their data (a tokenizer axis, say): (kept, labels, keys, variants,
    matched contrasts) when every variant has its twin, identical in every other key, trained on the
    same data set, so that no contrast crosses data; None otherwise (the comparison is refused as
    before). Perplexities of different data sets are never contrasted; the effects are ratios within one."""
    if match is not None:
        return None
    entries = [(gi, h) for gi, kept in enumerate(kept_by_group) for h in kept]
    if len({h for _, h in entries}) != len(entries):  # one config on two data sets: the files changed
        return None
    kept = {h: kept_by_group[gi][h] for gi, h in entries}
    home = {h: gi for gi, h in entries}
    labels, keys = _labels(kept, tuned)
    variants = [aggregate(lab, kept[h], h) for lab, h in zip(labels, kept)]
    matched = matched_contrasts(variants, keys, tuned)
    by_label = {v.label: v for v in variants}
    paired = {lab for m in matched for lab in (m.tied, m.untied)}
    if (not matched or paired != set(by_label)
            or any(home[by_label[m.tied].key] != home[by_label[m.untied].key] for m in matched)):
        return None  # these variants are discarded: the contrasts they were given go with them
    return kept, labels, keys, variants, matched


def _across_note(groups: list[DataSet], across: tuple | None) -> list[str]:
    if across is None:
        return []

    views = [[data_view(r.config) for r in g.runs] for g in groups]
    own = [k for k in views[0][0] if all(len({repr(v[k]) for v in vs}) == 1 for vs in views)
           and len({repr(vs[0][k]) for vs in views}) > 1]  # one value in each data set, not the same in all
    what = ", ".join(own) if own else data_difference(groups[0], groups[1])
    return [f"the runs are on {len(groups)} data sets (they differ in {what}); each tied variant is contrasted with its untied twin on the "
            "same data, so every effect is a ratio within one data set, and perplexities of different data sets "
            "are not comparable with each other"]


def _found_match_note(match: ParamMatch | None) -> list[str]:
    """The note of a parameter match recognised in the runs (matching.found_match)."""
    if match is None:
        return []
    return [f"these runs are a --match {match.option} comparison's (the tied model with {match.grown()} is the one "
            "closest to the untied parameter count), so its two contrasts against untied are judged together by "
            "Holm over the two, at fixed-seed levels"]


def build_comparison(runs: list[LoadedRun], skipped: list[LeftOut], baseline: str | None, out: str,
                     match: ParamMatch | None = None, primary: str = PRIMARY, tuned: list[str] = ()) -> Comparison:
    """Group runs into data sets and variants, aggregate, and contrast: in a grid without --baseline,
    each tied variant with its matched untied variant; otherwise each variant with the baseline.
    Runs on several data sets are compared as a grid when every tied variant has its untied twin on
    its own data (_twins_across_data_sets); otherwise they need --baseline (a RunError without it),
    and then only the baseline's data set is compared. The primary split must be one the runs were evaluated on (a ConfigError)."""
    from .. import __version__

    groups = data_sets(runs)
    kept_by_group = [_one_per_seed(g.runs, skipped) for g in groups]
    not_compared: list[NotCompared] = []
    why, across = "", None
    if len(groups) == 1:
        home, base_key = 0, None
    elif not baseline or not baseline.strip():
        across = _twins_across_data_sets(kept_by_group, tuned, match)
        if across is None:
            raise RunError(mixed_data_message(groups))
        home, base_key = 0, None
    else:
        home, base_key, why, not_compared = pick_data_set(groups, kept_by_group, baseline)
    found = None  # a parameter match recognised in the runs (a --match comparison's, compared as a folder)
    if across is not None:
        kept, labels, keys, variants, matched = across
        _check_primary(variants, primary)
        base, reason = None, ("none: the runs are on several data sets, so each tied variant is contrasted with the "
                              "untied variant identical in every other key, on its own data")
    else:
        kept = kept_by_group[home]
        labels, keys = _labels(kept, tuned)  # within the data set, so that labels name only what differs there
        variants = [aggregate(lab, kept[h], h) for lab, h in zip(labels, kept)]
        _check_primary(variants, primary)
        if match is None and not baseline and base_key is None and len(variants) == 3:  # --match's three variants
            match = found = found_match(variants, tuned)
        base, reason, matched = _contrast(variants, keys, baseline, base_key, match, tuned)
    family = match_family(match, variants, base, primary) if match is not None else None
    if found is not None and family is None:  # recognised, but not judged as a family: compared as before
        match = found = None
    order = {label: i for i, m in enumerate(matched) for label in (m.tied, m.untied)}  # settings in numeric order
    if family is not None:  # the primary contrast (equal architecture) first, then the matched one
        order = {m.label: i for i, m in enumerate(family.members)}
    variants.sort(key=lambda v: (v is not base, order.get(v.label, len(order)), v.label))
    rows = [_run_row(r, lab) for lab, h in zip(labels, kept) for r in kept[h]]

    tmap = map_section(matched, primary, variants) if matched else None  # a grid's settings: a map or a line
    return Comparison(
        tying_map=tmap, tying_line=tying_line(matched, primary, variants) if matched and tmap is None else None,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), out=out,
        baseline_label=base.label if base else None, baseline_reason=why or reason, differing_keys=keys,
        variants=variants, runs=rows, skipped=skipped,
        notes=[n for g in (groups if across is not None else [groups[home]]) for r in g.runs for n in r.notes]
        + _across_note(groups, across) + _resolution_note(variants)
        + (missing_map_note(matched) if matched and tmap is None else []) + _found_match_note(found), data_sets=len(groups),
        not_compared=not_compared, match=match, family=family, tiedlm_version=__version__, primary=primary,
        mode="matched" if matched else "baseline", matched=matched,
        trajectories=contrast_trajectories(variants, kept),  # on the runs: metrics.jsonl, read again
        adaptation=adaptation_rows(labels, kept, primary) if any(r.adapted for g in kept.values() for r in g) else [])
