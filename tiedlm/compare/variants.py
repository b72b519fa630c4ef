"""Variants, their aggregates over seeds, and their contrasts with the baseline.

A *variant* is a resolved config apart from its seed, name and operational keys (runs with the
same config hash). Each is labelled by the keys in which its config differs from the other
variants of its data set (`tied`/`untied` for model.tie_embeddings, `n_embd=128` for the rest),
with the values of its `Config` (variant.flat), never of a stored dict.
Each variant but the baseline is contrasted with the baseline per split, and per frequency
bucket (the tying literature's claim is about rare tokens), by stats.compare_by_seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..config import Config
from ..errors import ConfigError
from ..runs.ledger import Ledger, differences, stored_ledger
from ..perplexity import perplexity, relative
from ..config.naming import scalar, short_keys
from ..model.tie import STORED_KEYS
from .collect import LoadedRun
from .matching import PARAM_MATCH
from .stats import (
    AdjustedLevel,
    GeometricSummary,
    Power,
    Summary,
    TestResult,
    compare_by_seed,
    geometric,
    holm,
    significant,
    log_of,
    number,
    power_analysis,
    summarize,
)
from ..config.identity import diff_keys, flat, variant_dict

SPLITS = ("train", "validation", "test")  # in report order; only the splits the runs have appear
MODE_KEYS = STORED_KEYS  # the tie's stored keys make one label part: tied, untied, lowrank r=8 ...
TYING_KEYS = (*MODE_KEYS, "model.untie_at", "model.tie_from")  # what a matched contrast may differ in
COST_KEYS = ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps")
COMPUTE_MATCH = 0.01  # training FLOPs within 1% of the reference's: compute-matched


# ============================================================================ aggregates


@dataclass
class BucketMetrics:
    """One frequency bucket's loss over a variant's seeds (its perplexity: the geometric view)."""

    name: str
    loss: Summary
    by_seed: dict[int, Any]  # seed -> the bucket's loss (None where a run lacks the bucket)
    perplexity: GeometricSummary
    tokens: float | None

    def to_json(self) -> dict:
        return {"name": self.name, "loss": self.loss.to_json(), "by_seed": self.by_seed,
                "perplexity": self.perplexity.to_json(), "tokens": self.tokens}


@dataclass
class SplitMetrics:
    """A variant's final metrics on one split, over its seeds. Everything is computed on the loss:
    `perplexity` is exp(mean loss) with exp(CI) bounds (geometric), never a mean of perplexities."""

    perplexity: GeometricSummary
    bits_per_byte: Summary
    loss: Summary
    word_perplexity: GeometricSummary
    by_seed: dict[int, float | None]  # seed -> final perplexity as reported (exp(loss) where it is not)
    loss_by_seed: dict[int, float | None]  # seed -> final loss (nats per token): what is tested
    buckets: list[BucketMetrics]
    # seeds whose loss is not below the unigram model of their training split (guards.unigram_warning):
    # they have not learned from context
    at_unigram: list[int] = field(default_factory=list)

    def bucket(self, name: str) -> BucketMetrics | None:
        return next((b for b in self.buckets if b.name == name), None)

    def to_json(self) -> dict:
        return {"perplexity": self.perplexity.to_json(), "bits_per_byte": self.bits_per_byte.to_json(),
                "loss": self.loss.to_json(), "word_perplexity": self.word_perplexity.to_json(),
                "by_seed": self.by_seed, "loss_by_seed": self.loss_by_seed,
                "buckets": [b.to_json() for b in self.buckets], "at_unigram": self.at_unigram}


@dataclass
class CurvePoint:
    """Validation perplexity over seeds at one number of tokens seen (mean: the geometric mean)."""

    tokens: float
    mean: float
    min: float
    max: float
    n: int


# ============================================================================ contrasts


@dataclass
class BucketContrast(TestResult):
    """A frequency bucket's loss difference (variant − reference, nats per token), with its own
    interval; `p_holm` is its p-value Holm-adjusted over the buckets of the same contrast."""

    p_holm: float | None = None

    def to_json(self) -> dict:
        return {**super().to_json(), "p_holm": self.p_holm}


@dataclass
class SplitContrast(TestResult):
    """A variant against its reference on one split, tested on the loss: `difference` is the mean
    Δloss (paired by seed, or Welch), `relative` = exp(Δloss) − 1 is the ratio of the geometric-mean
    perplexities minus one, with exp(CI) − 1 bounds. `perplexity_difference` (variant − reference
    geometric means) is descriptive only: no interval is computed on the perplexity scale."""

    relative: float | None = None
    relative_ci_low: float | None = None
    relative_ci_high: float | None = None
    significant: bool | None = None
    variant_mean: float | None = None
    baseline_mean: float | None = None
    perplexity_difference: float | None = None
    power: Power | None = None
    buckets: dict[str, BucketContrast] = field(default_factory=dict)
    adjusted: AdjustedLevel | None = None  # the sequential design's level, where it judges this contrast
    p_holm: float | None = None  # in a grid: Holm's adjustment over its settings' contrasts, which `significant` uses
    holm_family: int = 0  # how many contrasts that adjustment is over

    def to_json(self) -> dict:
        return {**super().to_json(), "relative": self.relative, "relative_ci_low": self.relative_ci_low,
                "relative_ci_high": self.relative_ci_high, "significant": self.significant,
                "variant_mean": self.variant_mean, "baseline_mean": self.baseline_mean,
                "perplexity_difference": self.perplexity_difference, "p_holm": self.p_holm,
                "power": self.power.to_json() if self.power else None,
                "buckets": {n: t.to_json() for n, t in self.buckets.items()}}


@dataclass
class Contrast:
    """A variant against its reference (the baseline, or in a grid the matched untied variant): per
    split, in parameters, and in training FLOPs (per token × tokens seen)."""

    baseline: str  # the reference's label
    kind: str = "baseline"  # "baseline", or "matched": the untied variant identical in every other key
    splits: dict[str, SplitContrast] = field(default_factory=dict)
    params_difference: int | None = None
    params_relative: float | None = None
    parameter_matched: bool | None = None  # within PARAM_MATCH (10%) of the reference's total
    train_flops_per_token: float | None = None  # the variant's, then the reference's
    baseline_train_flops_per_token: float | None = None
    train_flops_relative: float | None = None  # total training FLOPs, variant / reference − 1
    confounds: list[str] | None = None  # ledger.differences: what else than the tie tells the two apart
    tuned_differences: list[str] = field(default_factory=list)  # what each chose for itself (compare --tune)

    def split(self, name: str) -> SplitContrast | None:
        return self.splits.get(name)

    def bucket(self, split: str, name: str) -> BucketContrast | None:
        s = self.splits.get(split)
        return s.buckets.get(name) if s else None

    @property
    def compute_matched(self) -> bool | None:
        r = self.train_flops_relative
        return None if r is None else abs(r) < COMPUTE_MATCH

    def to_json(self) -> dict:
        return {"baseline": self.baseline, "kind": self.kind, **{s: c.to_json() for s, c in self.splits.items()},
                "params_difference": self.params_difference, "params_relative": self.params_relative,
                "parameter_matched": self.parameter_matched, "train_flops_per_token": self.train_flops_per_token,
                "baseline_train_flops_per_token": self.baseline_train_flops_per_token,
                "train_flops_relative": self.train_flops_relative, "compute_matched": self.compute_matched,
                "confounds": self.confounds, "tuned_differences": self.tuned_differences}


# ============================================================================ variants


@dataclass
class Variant:
    """The runs of one config (seeds apart) resolved to one device type and dtype, and their aggregates."""

    label: str
    config_hash: str
    config: Config  # its first run's resolved config (comparison.json shows variant.variant_dict of it)
    tied: bool | None
    seeds: list[int]
    runs: list[str]  # run folder names, in seed order
    metrics: dict[str, SplitMetrics]  # split -> metrics; splits no run has are absent
    params: dict  # the first run's parameter breakdown (after untying, for an untie_at run)
    flops_per_token: dict | None
    cost: dict[str, Summary]  # COST_KEYS -> summary over seeds
    device: list[str]
    dtype: list[str]
    floor: dict | None  # builtin:synthetic's entropy rate
    tokenizer_kind: str | None
    curve: list[CurvePoint]
    best_points: list[tuple[float, float]] = field(default_factory=list)  # each run's best (tokens, perplexity)
    matrices: dict[str, Summary] = field(default_factory=dict)  # tiedlm analyze's figures over seeds
    resolution: str = ""  # "cuda, bf16": the device type and dtype the runs resolved to
    key: str = ""  # config_hash, plus the resolution when one config resolved several ways
    is_baseline: bool = False
    vs_baseline: Contrast | None = None  # against the baseline, or its matched untied variant
    verdicts: list[str] = field(default_factory=list)  # the verdict, confirmation and seeds-needed sentences
    ledger: Ledger | None = None  # what its E and W_out received: its first run's, recorded or from its config

    @property
    def n_seeds(self) -> int:
        return len(self.runs)

    @property
    def name(self) -> str:
        """The label, marked when it is the baseline (the first column of every table)."""
        return f"{self.label} (baseline)" if self.is_baseline else self.label

    @property
    def train_flops_per_token(self) -> float | None:
        return number((self.flops_per_token or {}).get("train"))

    @property
    def train_flops(self) -> float | None:
        """Total training FLOPs: per token × the mean tokens seen."""
        per, tokens = self.train_flops_per_token, self.cost["tokens_seen"].mean if "tokens_seen" in self.cost else None
        return per * tokens if per is not None and tokens is not None else None

    def split(self, name: str) -> SplitMetrics | None:
        return self.metrics.get(name)

    def buckets(self, split: str = "validation") -> list[BucketMetrics]:
        m = self.metrics.get(split)
        return m.buckets if m else []

    def contrast(self, split: str) -> SplitContrast | None:
        return self.vs_baseline.split(split) if self.vs_baseline else None

    def to_json(self) -> dict:

        return {"label": self.label, "config_hash": self.config_hash, "config": variant_dict(self.config),
                "tied": self.tied, "seeds": self.seeds, "runs": self.runs, "n_seeds": self.n_seeds,
                "metrics": {s: m.to_json() for s, m in self.metrics.items()}, "params": self.params,
                "flops_per_token": self.flops_per_token, "train_flops": self.train_flops,
                "cost": {k: s.to_json() for k, s in self.cost.items()},
                "device": self.device, "dtype": self.dtype, "resolution": self.resolution, "floor": self.floor,
                "tokenizer_kind": self.tokenizer_kind, "curve": [asdict(p) for p in self.curve],
                "best_points": [list(p) for p in self.best_points],
                "matrices": {k: s.to_json() for k, s in self.matrices.items()},
                "is_baseline": self.is_baseline,
                "vs_baseline": self.vs_baseline.to_json() if self.vs_baseline else None,
                "verdicts": self.verdicts,
                "ledger": ({**self.ledger.to_json(), "source": self.ledger.source} if self.ledger else None)}


@dataclass
class Candidate:
    """A variant as the baseline choice sees it (before aggregation): label, runs, seeds, config."""

    label: str
    runs: list[str]
    seeds: list[int]
    config: Config  # its first run's resolved config
    config_hash: str  # the variant key (config hash, plus the resolution where it splits one)
    data_set: int = 0  # index into the data sets


# ============================================================================ labels and baseline


def label_variants(configs: list[Config], ignore: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Labels for variants' configs (seed and name excluded) and the dotted keys that tell them apart.
    `ignore`: keys that differ by design and are reported elsewhere (the tuned settings)."""

    if not configs:
        return [], []
    views = [flat(cfg, variant=True) for cfg in configs]  # what tells variants apart
    keys = {k for other in views[1:] for k in diff_keys(views[0], other) if k not in ignore}
    ordered = sorted(keys, key=lambda k: (k not in MODE_KEYS, k))
    short = short_keys(ordered)
    mode = next((k for k in ordered if k in MODE_KEYS), None)  # the tying keys make one part, named after the mode
    labels = []
    for cfg in configs:
        # The values from the whole config, so that a key that is operational in one run (eval_every
        # without keep_best) and part of the variant in another shows its real value in both labels.
        values = flat(cfg)
        parts = [cfg.model.tie.label if key == mode else f"{short[key]}={scalar(values[key])}"
                 for key in ordered if key not in MODE_KEYS or key == mode]
        labels.append(", ".join(parts) or ("untied" if cfg.model.tie.mode == "untied" else "tied"))  # a single variant
    return labels, ordered


def _is_untied(variant: Candidate | Variant) -> bool:
    """The plain untied model, the default baseline: soft and pull have two matrices too, but they
    are dials set against it."""
    return variant.config.model.tie.mode == "untied"


def _baseline_by_query(variants: Sequence[Any], query: str) -> tuple[Any, str]:
    by_label = [v for v in variants if v.label == query]
    if len(by_label) == 1:
        return by_label[0], f"chosen with --baseline {query!r}"
    by_run = [v for v in variants if query in v.runs]
    if len(by_run) == 1:
        return by_run[0], f"the variant of run {query}, chosen with --baseline"
    want = {p.strip() for p in query.split(",") if p.strip()}
    want = {{"tie_embeddings=true": "tied", "tie_embeddings=false": "untied"}.get(p, p) for p in want}
    by_parts = [v for v in variants if want <= {p.strip() for p in v.label.split(",")}]
    if len(by_parts) == 1:
        return by_parts[0], f"chosen with --baseline {query!r}"
    candidates = by_parts or [v for v in variants if query in v.label]
    if len(candidates) == 1:
        return candidates[0], f"chosen with --baseline {query!r}"
    labels = "; ".join(v.label for v in (candidates or variants))
    if candidates:
        raise ConfigError(f"--baseline {query!r} matches several variants ({labels}) — give the "
                          "whole label or a run name")
    raise ConfigError(f"--baseline {query!r} matches no variant or run — the variants are: {labels}")


def choose_baseline(variants: Sequence[Any], baseline: str | None) -> tuple[Any, str]:
    """The baseline among variants (Variant or Candidate) and a sentence saying why it was chosen."""
    if baseline:
        return _baseline_by_query(variants, baseline.strip())
    untied = [v for v in variants if _is_untied(v)]
    if len(untied) == 1:
        return untied[0], "the untied variant"
    pool = untied or list(variants)
    # deterministic: most seeds, then the label in alphabetical order
    pick = sorted(pool, key=lambda v: (-len(v.seeds), v.label))[0]
    what = "untied variants" if untied else "variants (none is untied)"
    return pick, (f"chosen automatically among {len(pool)} {what}: the one with the most seeds, then "
                  "the first label alphabetically; pass --baseline to choose another")


# ============================================================================ aggregation


def run_loss(run: LoadedRun, split: str) -> float | None:
    """A run's final mean NLL on split (nats per token); log(perplexity) when a report lacks the loss."""
    loss = run.metric(split, "loss")
    return loss if loss is not None else log_of(run.metric(split, "perplexity"))


def resolution(run: LoadedRun) -> str:
    """The device type and dtype a run resolved to: "cuda, bf16" ("cuda:1" counts as cuda)."""
    device = str(run.report.device).split(":")[0] if run.report.device else "device unknown"
    return f"{device}, {run.report.dtype or 'dtype unknown'}"


def _curve(runs: list[LoadedRun]) -> list[CurvePoint]:
    """Geometric mean, min and max validation perplexity over seeds at each number of tokens seen."""
    by_tokens: dict[float, list[float]] = {}
    for run in runs:
        for tokens, ppl in run.curve:
            if ppl > 0:
                by_tokens.setdefault(tokens, []).append(ppl)
    return [CurvePoint(t, perplexity(sum(map(math.log, v)) / len(v)), min(v), max(v), len(v))
            for t, v in sorted(by_tokens.items())]


def _best_points(runs: list[LoadedRun]) -> list[tuple[float, float]]:
    """(tokens, perplexity) of each run's best periodic validation evaluation, where it recorded one."""
    points = []
    for run in runs:
        tokens, ppl = number((run.best or {}).get("tokens")), number((run.best or {}).get("perplexity"))
        if tokens is not None and ppl is not None:
            points.append((tokens, ppl))
    return points


def _matrices(runs: list[LoadedRun]) -> dict[str, Summary]:
    """tiedlm analyze's per-run figures (analyze.render.summary_row) over the seeds that have them."""
    from ..analyze.render import summary_row

    rows = [summary_row(r.analysis) for r in runs if r.analysis]
    if not rows:
        return {}
    return {k: summarize(row.get(k) for row in rows) for k in rows[0]}


def _bucket_metrics(runs: list[LoadedRun], split: str) -> list[BucketMetrics]:
    names: list[str] = []
    for run in runs:
        names += [n for n in run.bucket_names(split) if n not in names]
    out = []
    for name in names:
        found = [run.bucket(split, name) or {} for run in runs]
        tokens = next((b.get("tokens") for b in found if b.get("tokens") is not None), None)
        loss = summarize(b.get("loss") for b in found)
        out.append(BucketMetrics(name=name, loss=loss, by_seed={r.seed: b.get("loss") for r, b in zip(runs, found)},
                                 perplexity=geometric(loss), tokens=number(tokens)))
    return out


def _perplexity(run: LoadedRun, split: str, loss: float | None) -> float | None:
    """The perplexity the run reported, else exp(loss)."""
    ppl = run.metric(split, "perplexity")
    return ppl if ppl is not None else perplexity(loss)


def _split_metrics(runs: list[LoadedRun], split: str) -> SplitMetrics:
    losses = {r.seed: run_loss(r, split) for r in runs}
    loss = summarize(losses.values())
    return SplitMetrics(perplexity=geometric(loss), bits_per_byte=summarize(r.metric(split, "bits_per_byte") for r in runs),
                        loss=loss, word_perplexity=geometric(summarize(log_of(r.metric(split, "word_perplexity"))
                                                                       for r in runs)),
                        by_seed={r.seed: _perplexity(r, split, losses[r.seed]) for r in runs},
                        loss_by_seed=losses, buckets=_bucket_metrics(runs, split),
                        at_unigram=[r.seed for r in runs if r.at_unigram(split)])


def aggregate(label: str, runs: list[LoadedRun], key: str = "") -> Variant:
    """The variant of runs (one per seed, in seed order)."""
    first = runs[0]
    report = first.report
    # a run untied part-way (model.untie_at) ends with both matrices: count what it ends with
    params = report.params_after_untie or first.params
    return Variant(
        label=label, config_hash=first.config_hash, config=first.config, tied=first.config.model.tie.mode != "untied",
        seeds=[r.seed for r in runs], runs=[r.name for r in runs],
        metrics={s: _split_metrics(runs, s) for s in SPLITS if any(run_loss(r, s) is not None for r in runs)},
        params=params if isinstance(params, dict) else {},
        flops_per_token=report.flops_per_token,
        cost={key: summarize(getattr(r.report, key) for r in runs) for key in COST_KEYS},
        device=sorted({str(r.report.device) for r in runs if r.report.device}),
        dtype=sorted({str(r.report.dtype) for r in runs if r.report.dtype}),
        floor=next((r.report.floor for r in runs if isinstance(r.report.floor, dict)), None),
        tokenizer_kind=first.config.tokenizer.kind,
        curve=_curve(runs), best_points=_best_points(runs), matrices=_matrices(runs), resolution=resolution(first),
        key=key or first.config_hash, ledger=stored_ledger(report.ledger, first.config, first.params),
    )


def _bucket_contrasts(mv: SplitMetrics, mb: SplitMetrics) -> dict[str, BucketContrast]:
    """Each bucket's loss difference, its p-value Holm-adjusted over this contrast's buckets."""
    base = {b.name: b for b in mb.buckets}
    tests = {b.name: BucketContrast(**vars(compare_by_seed(b.by_seed, base[b.name].by_seed)))
             for b in mv.buckets if b.name in base}
    for t, p in zip(tests.values(), holm([t.p_value for t in tests.values()])):
        t.p_holm = p
    return tests


def _split_contrast(mv: SplitMetrics, mb: SplitMetrics) -> SplitContrast:
    test = compare_by_seed(mv.loss_by_seed, mb.loss_by_seed)
    vm, bm = mv.perplexity.mean, mb.perplexity.mean
    return SplitContrast(
        **vars(test), relative=relative(test.difference), relative_ci_low=relative(test.ci_low),
        relative_ci_high=relative(test.ci_high),
        significant=significant(test.p_value),
        variant_mean=vm, baseline_mean=bm, perplexity_difference=vm - bm if vm is not None and bm is not None else None,
        power=power_analysis(test) if test.test else None, buckets=_bucket_contrasts(mv, mb))


def versus(variant: Variant, base: Variant, kind: str = "baseline", tuned: Sequence[str] = ()) -> Contrast:
    """variant against base on every split both have, in total parameters and in training FLOPs."""
    out = Contrast(baseline=base.label, kind=kind)
    for split in SPLITS:
        mv, mb = variant.metrics.get(split), base.metrics.get(split)
        if mv and mb:
            out.splits[split] = _split_contrast(mv, mb)
    tv, tb = variant.params.get("total"), base.params.get("total")
    if isinstance(tv, int) and isinstance(tb, int) and tb:
        out.params_difference = tv - tb
        out.params_relative = (tv - tb) / tb
        out.parameter_matched = abs(tv - tb) <= PARAM_MATCH * tb
    out.train_flops_per_token, out.baseline_train_flops_per_token = (variant.train_flops_per_token,
                                                                      base.train_flops_per_token)
    fv, fb = variant.train_flops, base.train_flops
    if fv is None or fb is None:  # no tokens seen recorded: per token
        fv, fb = out.train_flops_per_token, out.baseline_train_flops_per_token
    if fv is not None and fb:
        out.train_flops_relative = fv / fb - 1.0
    if variant.ledger is not None and base.ledger is not None:
        out.confounds = differences(variant.ledger, base.ledger, variant.config, base.config, tuned)
        out.tuned_differences = differences(variant.ledger, base.ledger, variant.config, base.config, tuned, chosen=True)
    return out
