"""Variants, their aggregates over seeds, and their contrasts with the baseline.

A *variant* is a resolved config apart from its seed, name and operational keys (runs with the
same config hash). Each is labelled by the keys in which its config differs from the other
variants of its data set (`tied`/`untied` for model.tie_embeddings, `n_embd=128` for the rest).
Each variant but the baseline is contrasted with the baseline per split, and per frequency
bucket (the tying literature's claim is about rare tokens), by stats.compare_by_seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..errors import ConfigError
from ..naming import scalar, short_keys
from .collect import LoadedRun
from .stats import ALPHA, Summary, TestResult, compare_by_seed, number, summarize

SPLITS = ("validation", "test")
TIE_KEY = "model.tie_embeddings"
COST_KEYS = ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps")


# ============================================================================ aggregates


@dataclass
class BucketMetrics:
    """One frequency bucket's loss over a variant's seeds."""

    name: str
    loss: Summary
    by_seed: dict[int, Any]  # seed -> the bucket's loss (None where a run lacks the bucket)
    perplexity: Summary
    tokens: float | None

    def to_json(self) -> dict:
        return {"name": self.name, "loss": self.loss.to_json(), "by_seed": self.by_seed,
                "perplexity": self.perplexity.to_json(), "tokens": self.tokens}


@dataclass
class SplitMetrics:
    """A variant's final metrics on one split, over its seeds."""

    perplexity: Summary
    bits_per_byte: Summary
    loss: Summary
    word_perplexity: Summary
    by_seed: dict[int, float | None]  # seed -> final perplexity
    buckets: list[BucketMetrics]

    def bucket(self, name: str) -> BucketMetrics | None:
        return next((b for b in self.buckets if b.name == name), None)

    def to_json(self) -> dict:
        return {"perplexity": self.perplexity.to_json(), "bits_per_byte": self.bits_per_byte.to_json(),
                "loss": self.loss.to_json(), "word_perplexity": self.word_perplexity.to_json(),
                "by_seed": self.by_seed, "buckets": [b.to_json() for b in self.buckets]}


@dataclass
class CurvePoint:
    """Validation perplexity over seeds at one number of tokens seen."""

    tokens: float
    mean: float
    min: float
    max: float
    n: int


# ============================================================================ contrasts


@dataclass
class SplitContrast(TestResult):
    """A variant against the baseline on one split: the test of the perplexity difference (variant
    − baseline), that difference relative to the baseline's mean, and one test per bucket loss."""

    relative: float | None = None
    relative_ci_low: float | None = None
    relative_ci_high: float | None = None
    significant: bool | None = None
    variant_mean: float | None = None
    baseline_mean: float | None = None
    buckets: dict[str, TestResult] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**super().to_json(), "relative": self.relative, "relative_ci_low": self.relative_ci_low,
                "relative_ci_high": self.relative_ci_high, "significant": self.significant,
                "variant_mean": self.variant_mean, "baseline_mean": self.baseline_mean,
                "buckets": {n: t.to_json() for n, t in self.buckets.items()}}


@dataclass
class Contrast:
    """A variant against the baseline: per split, and in parameters."""

    baseline: str  # the baseline's label
    splits: dict[str, SplitContrast] = field(default_factory=dict)
    params_difference: int | None = None
    params_relative: float | None = None

    def split(self, name: str) -> SplitContrast | None:
        return self.splits.get(name)

    def bucket(self, split: str, name: str) -> TestResult | None:
        s = self.splits.get(split)
        return s.buckets.get(name) if s else None

    def to_json(self) -> dict:
        return {"baseline": self.baseline, **{s: c.to_json() for s, c in self.splits.items()},
                "params_difference": self.params_difference, "params_relative": self.params_relative}


# ============================================================================ variants


@dataclass
class Variant:
    """The runs of one config (seeds apart) and their aggregates."""

    label: str
    config_hash: str
    config: dict  # without seed, name and operational keys
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
    is_baseline: bool = False
    vs_baseline: Contrast | None = None  # None for the baseline
    verdicts: list[str] = field(default_factory=list)  # one sentence per split, against the baseline

    @property
    def n_seeds(self) -> int:
        return len(self.runs)

    @property
    def name(self) -> str:
        """The label, marked when it is the baseline (the first column of every table)."""
        return f"{self.label} (baseline)" if self.is_baseline else self.label

    def split(self, name: str) -> SplitMetrics | None:
        return self.metrics.get(name)

    def buckets(self, split: str = "validation") -> list[BucketMetrics]:
        m = self.metrics.get(split)
        return m.buckets if m else []

    def contrast(self, split: str) -> SplitContrast | None:
        return self.vs_baseline.split(split) if self.vs_baseline else None

    def to_json(self) -> dict:
        return {"label": self.label, "config_hash": self.config_hash, "config": self.config, "tied": self.tied,
                "seeds": self.seeds, "runs": self.runs, "n_seeds": self.n_seeds,
                "metrics": {s: m.to_json() for s, m in self.metrics.items()}, "params": self.params,
                "flops_per_token": self.flops_per_token, "cost": {k: s.to_json() for k, s in self.cost.items()},
                "device": self.device, "dtype": self.dtype, "floor": self.floor,
                "tokenizer_kind": self.tokenizer_kind, "curve": [asdict(p) for p in self.curve],
                "is_baseline": self.is_baseline,
                "vs_baseline": self.vs_baseline.to_json() if self.vs_baseline else None,
                "verdicts": self.verdicts}


@dataclass
class Candidate:
    """A variant as the baseline choice sees it (before aggregation): label, runs, seeds, config."""

    label: str
    runs: list[str]
    seeds: list[int]
    config: dict
    config_hash: str
    data_set: int = 0  # index into the data sets


def variant_config(config: dict) -> dict:
    from ..config import strip_variant_keys

    return strip_variant_keys(config)


# ============================================================================ labels and baseline


def label_variants(configs: list[dict]) -> tuple[list[str], list[str]]:
    """Labels for variant configs (seed and name excluded) and the dotted keys that tell them apart."""
    from ..config import diff_keys, flatten

    if not configs:
        return [], []
    keys: set[str] = set()
    for other in configs[1:]:
        keys.update(diff_keys(variant_config(configs[0]), variant_config(other)))
    ordered = sorted(keys, key=lambda k: (k != TIE_KEY, k))
    short = short_keys(ordered)
    labels = []
    for cfg in configs:
        flat = flatten(variant_config(cfg))
        parts = []
        for key in ordered:
            if key == TIE_KEY and isinstance(flat.get(key), bool):
                parts.append("tied" if flat[key] else "untied")
            else:
                parts.append(f"{short[key]}={scalar(flat.get(key))}")
        if not parts:  # a single variant: say what matters most
            tied = flat.get(TIE_KEY)
            parts.append("tied" if tied else "untied" if tied is False else "all runs")
        labels.append(", ".join(parts))
    return labels, ordered


def _is_untied(variant: Candidate | Variant) -> bool:
    return variant.config.get("model", {}).get("tie_embeddings") is False


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


def _curve(runs: list[LoadedRun]) -> list[CurvePoint]:
    """Mean, min and max validation perplexity over seeds at each number of tokens seen."""
    by_tokens: dict[float, list[float]] = {}
    for run in runs:
        for tokens, ppl in run.curve:
            by_tokens.setdefault(tokens, []).append(ppl)
    return [CurvePoint(t, sum(v) / len(v), min(v), max(v), len(v)) for t, v in sorted(by_tokens.items())]


def _bucket_metrics(runs: list[LoadedRun], split: str) -> list[BucketMetrics]:
    names: list[str] = []
    for run in runs:
        names += [n for n in run.bucket_names(split) if n not in names]
    out = []
    for name in names:
        found = [run.bucket(split, name) or {} for run in runs]
        tokens = next((b.get("tokens") for b in found if b.get("tokens") is not None), None)
        out.append(BucketMetrics(name=name, loss=summarize(b.get("loss") for b in found),
                                 by_seed={r.seed: b.get("loss") for r, b in zip(runs, found)},
                                 perplexity=summarize(b.get("perplexity") for b in found), tokens=number(tokens)))
    return out


def _split_metrics(runs: list[LoadedRun], split: str) -> SplitMetrics:
    def over_seeds(key: str) -> Summary:
        return summarize(r.metric(split, key) for r in runs)

    return SplitMetrics(perplexity=over_seeds("perplexity"), bits_per_byte=over_seeds("bits_per_byte"),
                        loss=over_seeds("loss"), word_perplexity=over_seeds("word_perplexity"),
                        by_seed={r.seed: r.metric(split, "perplexity") for r in runs},
                        buckets=_bucket_metrics(runs, split))


def aggregate(label: str, runs: list[LoadedRun]) -> Variant:
    """The variant of runs (one per seed, in seed order)."""
    first = runs[0]
    report = first.report
    # a run untied part-way (model.untie_at) ends with both matrices: count what it ends with
    params = report.params_after_untie or first.params
    return Variant(
        label=label, config_hash=first.config_hash, config=variant_config(first.config),
        tied=first.config.get("model", {}).get("tie_embeddings"),
        seeds=[r.seed for r in runs], runs=[r.name for r in runs],
        metrics={s: _split_metrics(runs, s) for s in SPLITS
                 if any(r.metric(s, "perplexity") is not None for r in runs)},
        params=params if isinstance(params, dict) else {},
        flops_per_token=report.flops_per_token,
        cost={key: summarize(getattr(r.report, key) for r in runs) for key in COST_KEYS},
        device=sorted({str(r.report.device) for r in runs if r.report.device}),
        dtype=sorted({str(r.report.dtype) for r in runs if r.report.dtype}),
        floor=next((r.report.floor for r in runs if isinstance(r.report.floor, dict)), None),
        tokenizer_kind=first.config.get("tokenizer", {}).get("kind"),
        curve=_curve(runs),
    )


def _split_contrast(mv: SplitMetrics, mb: SplitMetrics) -> SplitContrast:
    test = compare_by_seed(mv.by_seed, mb.by_seed)
    base_mean = mb.perplexity.mean

    def rel(x: float | None) -> float | None:
        return x / base_mean if (x is not None and base_mean) else None

    base_buckets = {b.name: b for b in mb.buckets}
    return SplitContrast(
        **vars(test), relative=rel(test.difference), relative_ci_low=rel(test.ci_low),
        relative_ci_high=rel(test.ci_high),
        significant=(test.p_value < ALPHA) if test.p_value is not None else None,
        variant_mean=mv.perplexity.mean, baseline_mean=base_mean,
        buckets={b.name: compare_by_seed(b.by_seed, base_buckets[b.name].by_seed)
                 for b in mv.buckets if b.name in base_buckets})


def versus(variant: Variant, base: Variant) -> Contrast:
    """variant against base on every split both have, and in total parameters."""
    out = Contrast(baseline=base.label)
    for split in SPLITS:
        mv, mb = variant.metrics.get(split), base.metrics.get(split)
        if mv and mb:
            out.splits[split] = _split_contrast(mv, mb)
    tv, tb = variant.params.get("total"), base.params.get("total")
    if isinstance(tv, int) and isinstance(tb, int) and tb:
        out.params_difference = tv - tb
        out.params_relative = (tv - tb) / tb
    return out

