"""A plan of runs: what `compare --config` and `sweep` train, one stage at a time.

A run of a plan is a name and a resolved Config (PlannedRun); a stage is the runs trained before
anything looks at them (Stage): a tuning grid, the steps past its edges, the seeds at the chosen
points, each look of the sequential design. Whoever plans (driver, sweep, tuning.TuningSearch,
seeds.SeedDesign) builds stages as data and hands them to an executor (jobs.Executor); looking
at the finished runs decides the next stage. A tuning's points are named and set here (points,
point_label, point_tag, point_overrides). compare --config's plan (`plan_comparison`) holds the
variants of a config (tied or its tying mode, untied, and with --match params or params:width the
tied model grown, deeper or wider, to the untied one's parameters: a variant like the others,
tuned on its own grid), each at its tuning points and seeds. Nothing here trains, reads or writes
a run.
"""

from __future__ import annotations

import glob
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compare.matching import ParamMatch, match_by, match_params
from ..compare.tuned import TuneSpec
from ..errors import ConfigError
from ..config.naming import sanitize, scalar, short_keys, yaml_value
from .request import CompareRequest
from ..config import Config, budget_steps, check_warmup, load_config
from ..config.checks import RUN_NAME_LIMIT
from ..model.counting import count_params_config
from ..config.naming import legacy_override_tag, is_run_of, override_tag
from ..process import log
from ..runs import CONFIG, run_dir_for


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run folder's name under the runs folder
    cfg: Config  # the resolved Config


@dataclass
class Stage:
    """Runs trained together: every one is finished (or failed) before the next stage is planned."""

    what: str  # for people: "tuning grid", "seeds 1 to 3", ...
    runs: list[PlannedRun] = field(default_factory=list)

    def unique(self) -> list[PlannedRun]:
        """The runs, each name once (the first kept): two variants may plan the same run."""
        return list({r.name: r for r in self.runs}.values())


@dataclass(frozen=True)
class RunSource:
    """How a plan makes its runs: the config file, the overrides every run has, the run names'
    prefix, and `where` (a grid file) to name in the error of an override the config refuses."""

    config: str | Path
    overrides: tuple[str, ...] = ()
    prefix: str = ""
    where: str | None = None

    def name(self, tag: str, seed: int) -> str:
        """The run's folder name, `<prefix>-<tag>-s<seed>`: known without resolving its config. One
        longer than a run name may be is refused, naming what makes it long: the config's name."""
        name = sanitize(f"{self.prefix}-{tag}-s{seed}")
        if len(name) > RUN_NAME_LIMIT:
            fix = ("shorten the grid's name: or its axes' values" if self.where is not None else
                   "give the config a shorter name: --set name=NAME")
            raise ConfigError(f"the run name {name[:48]}… would be {len(name)} characters, more than the "
                              f"{RUN_NAME_LIMIT} a run name may have, most of them the config's name — {fix}")
        return name

    def run(self, tag: str, extra: list[str], seed: int) -> PlannedRun:
        """The run named `name(tag, seed)`, with the overrides and `extra`; a ConfigError when the
        config refuses them."""

        try:
            cfg = load_config(self.config, [*self.overrides, *extra], seed=seed)
        except ConfigError as exc:
            if self.where is None:
                raise
            raise ConfigError(f"{self.where}: {tag}: {exc}") from None
        return PlannedRun(self.name(tag, seed), cfg)


# ============================================================================ a tuning's points


def points(spec: TuneSpec, axes: dict[str, list] | None = None) -> list[dict[str, Any]]:
    """The grid: the product of the axes, each point a mapping of config keys to values."""
    axes = axes if axes is not None else spec.axes
    out = []
    for combo in itertools.product(*axes.values()):
        point: dict[str, Any] = {}
        for axis, value in zip(axes, combo):
            point.update(value if isinstance(value, dict) else {axis: value})
        out.append(point)
    return out


def point_label(point: dict[str, Any], short: dict[str, str]) -> str:
    """'lr=0.001,dropout=0.1'; a key the variant does not have (None: the untied variant's
    model.tie_strength) is left out."""
    if point and all(v is None for v in point.values()):
        return "(no " + ", ".join(short[k] for k in point) + ")"
    return ",".join(f"{short[k]}={scalar(v)}" for k, v in point.items() if v is not None)


def point_tag(point: dict[str, Any], short: dict[str, str]) -> str:
    """A point's part of its runs' names ('lr=0.001_dropout=0.1'); '' for a variant that has none
    of the tuned keys (the untied variant when model.tie_strength is tuned)."""
    return sanitize(point_label(point, short)) if any(v is not None for v in point.values()) else ""


def point_overrides(point: dict[str, Any], schedule: list[str]) -> list[str]:
    return [f"{k}={yaml_value(v)}" for k, v in point.items() if v is not None] + schedule


# ============================================================================ compare --config's plan


@dataclass
class ComparisonPlan:
    """The variants to train, (tag, overrides) each, and how their runs are made (`source`)."""

    base: Config  # the config with the request's overrides
    variants: list[tuple[str, list[str]]]
    source: RunSource
    match: ParamMatch | None = None
    points: dict[str, tuple[dict, list[str]]] = field(default_factory=dict)  # tag -> (point, overrides) when tuned
    schedule: list[str] = field(default_factory=list)  # the tuning's schedule overrides (min_lr follows lr)

    def runs(self, first: int, stop: int, point: dict | None = None) -> list[PlannedRun]:
        """Seed indices first .. stop − 1 of every variant, at its own tuned point (`points`), or
        at `point` for all of them."""
        return [self.source.run(tag, extra, seed) for tag, extra, seed in self._each(first, stop, point)]

    def dirs(self, runs_dir: Path, first: int, stop: int, point: dict | None = None) -> list[Path]:
        """The folders of runs(first, stop, point), named without resolving a config."""

        return [run_dir_for(runs_dir, self.source.name(tag, seed)) for tag, _, seed in self._each(first, stop, point)]

    def _each(self, first: int, stop: int, point: dict | None) -> list[tuple[str, list[str], int]]:
        """(tag with its point's label, overrides, seed) of each run of runs()."""
        out = []
        for tag, extra in self.variants:
            at, more = (point, self._point_overrides(point)) if point is not None else self.points.get(tag, ({}, []))
            label = self._label(at)
            out += [(f"{tag}-{label}" if label else tag, extra + more, seed)
                    for seed in range(self.base.seed + first, self.base.seed + stop)]
        return out

    def _label(self, point: dict) -> str:
        return point_tag(point, short_keys(list(point)))

    def _point_overrides(self, point: dict) -> list[str]:
        return point_overrides(point, self.schedule)


def variants_of(req: CompareRequest, base: Config) -> tuple[list[tuple[str, list[str]]], ParamMatch | None]:
    """(tag, overrides) of each variant to train, and the parameter match with --match params (the
    tied model deeper) or params:width (wider). A config with a model.tie_mode (projection, lowrank,
    split, soft, pull) is its own variant, against untied: the mode with its rank or strength."""

    m, tie = base.model, base.model.tie
    untie = ["model.untie_at=null"] if m.untie_at is not None else []  # an untie_at is for tied models
    untie += ["model.untie_rank=0"] if tie.rank else []  # and a rank for the lowrank mode
    tied = ("tied", ["model.tie_embeddings=true"])
    if tie.stored_mode is not None:  # a named mode: it is the variant set against untied
        tied = (tie.tag, [f"model.tie_mode={tie.mode}"])
        if req.match is not None:
            raise ConfigError(f"--match {req.match} grows the plain tied model, and this config's model.tie_mode "
                              f"is {tie.mode} — drop --match, or compare with model.tie_mode tied")
    if req.match is not None and m.untie_at is not None:  # the matched model would end untied
        raise ConfigError(f"--match {req.match} grows a model that stays tied, and this config's model.untie_at "
                          f"is {m.untie_at:g}: its tied variants end untied, so no count matches — drop --match, "
                          "or set model.untie_at=null")
    variants = [tied, ("untied", ["model.tie_embeddings=false", *untie])]
    by = match_by(req.match) if req.match is not None else None
    if by is None:
        return variants, None
    from ..data import prepare_data

    untied_cfg = load_config(req.config, req.overrides + variants[1][1])
    matched = match_params(untied_cfg.model, prepare_data(untied_cfg).model_vocab_size, by)
    if matched.adds_a_variant:
        variants.append((matched.tag, matched.overrides()))
    return variants, matched


def plan_comparison(req: CompareRequest) -> ComparisonPlan:

    base = load_config(req.config, req.overrides)
    from ..data import check_source

    check_source(base.data)  # a local-looking data.path that is not there: one line, before any run
    variants, matched = variants_of(req, base)
    tags = [tag for tag, _ in variants]
    for _, extra in variants:  # refused once, not once per planned run: a model its family cannot build, and
        cfg = load_config(req.config, req.overrides + extra)  # a budget shorter than its warm-up (no verdict)
        count_params_config(cfg.model, base.model.vocab_size or 0)
        check_warmup(cfg, budget_steps(cfg))
    source = RunSource(req.config, tuple(req.overrides), run_prefix(base.name, req.overrides, req.runs_dir, tags))
    return ComparisonPlan(base=base, variants=variants, source=source, match=matched)


def run_prefix(name: str, overrides: list[str], runs_dir: Path, tags: list[str]) -> str:
    """What a config's runs' names begin with: its name and its overrides in words (naming.override_tag);
    or, where runs_dir holds runs of these overrides named as before (naming.legacy_override_tag) and
    none named the new way, the old prefix, said once: the experiment carries on under its runs'
    names instead of training them all again."""
    prefix, old = name + override_tag(overrides), name + legacy_override_tag(overrides)
    if old == prefix or _has_runs(runs_dir, prefix, tags) or not _has_runs(runs_dir, old, tags):
        return prefix
    log(f"runs of these overrides are named {old}-… (as tiedlm named them before {prefix}-…): carrying on "
        "under that name")
    return old


def _has_runs(runs_dir: Path, prefix: str, tags: list[str]) -> bool:
    """Whether runs_dir holds a run of this experiment (naming.is_run_of: its prefix and variant tags)."""
    return any(is_run_of(d.name, prefix, tags) and (d / CONFIG).is_file()
               for d in Path(runs_dir).glob(f"{glob.escape(prefix)}-*"))


def check_match_tuning(req: CompareRequest, plan: ComparisonPlan, spec: TuneSpec) -> None:
    """Refuse a tuned key that changes a parameter count (model.n_layer, n_embd, ...): the match was
    made at the config's architecture, and a tuned one would leave the matched variant unmatched,
    or (a key the match sets) undo it."""

    m = plan.match
    sets = ["model.n_layer"] if m.by == "depth" else ["model.n_embd", "model.n_head", "model.n_kv_head"]
    grown = [k for k in spec.keys if k in sets]
    if grown:
        raise ConfigError(f"--match {m.option} sets {', '.join(grown)} for the matched variant, so it cannot be tuned "
                          f"too — tune other keys, or drop --match")
    for point in points(spec):
        model = {k: v for k, v in point.items() if k.startswith("model.")}
        if not model:
            continue
        cfg = load_config(req.config, req.overrides + plan.variants[1][1] + point_overrides(model, []))
        if count_params_config(cfg.model, m.vocab_size)["total"] != m.untied_total:
            keys = ", ".join(model)
            raise ConfigError(f"--match {m.option} with {keys} tuned: the match grows the tied model to the untied "
                              f"one's parameter count at the config's own architecture, and tuning {keys} changes "
                              f"that count — tune other keys (train.lr, model.dropout), or vary {keys} with --set, "
                              "one comparison per value")


