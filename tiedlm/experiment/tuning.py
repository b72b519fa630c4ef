"""Each variant at its own best setting: the tuning of `compare --config` (`--tune train.lr=...`
or a `tune:` block in the config) and of a sweep (a `tune:` block in the grid file, each grid
point a variant).

    tune:
      train.lr: [3.0e-4, 1.0e-3, 3.0e-3]    # an axis: a config key and its values
      schedule:                              # a paired axis: each value sets several keys at once
        - {train.lr: 1.0e-3, train.warmup_steps: 100}
        - {train.lr: 3.0e-3, train.warmup_steps: 200}
      seeds: [0]                             # the tuning seeds (default: the comparison's first seed)
      extend: true                           # move past an edge of the grid (default true)
      extend_limit: 3                        # at most this many steps past each edge
      shared_seeds: false                    # train every seed at the shared value too

The protocol (Melis, Dyer & Blunsom 2018): every variant trains every point of the grid (the
product of the axes) on the tuning seeds; each variant's point is chosen on validation (the loss
of the kept best weights when train.keep_best is on, else the final validation loss; never test);
when a variant's choice is the smallest or largest value of a numeric axis, that axis is extended
one step in that direction (the grid's own ratio, or its step when a value is not positive) for
that variant, up to extend_limit steps, until the choice is interior; then the remaining seeds
train at each variant's chosen point, and the verdict is on test. With two or more axes a step
trains one point, the choice with that axis moved (the line through the choice, not a whole row),
and a choice that moves is checked along each axis on its own line: a neighbour another line has
is filled in (no step counted). A step stays in the key's range (tuning_spec.BOUNDS: dropout
halfway to 1, never onto it; dropout or weight decay down to 0, where the choice is final, a
bound rather than an edge). With train.lr and one other key, `Tuning.joint` reads from the tuning
runs which of the two moved the tied/untied effect on validation. Tuning runs are ordinary runs,
named by their point (`base-tied-lr=0.001-s0`), so an interrupted tuning resumes and a rerun
trains nothing that is finished.

Tuning train.lr keeps the schedule's shape: unless the config sets train.min_lr_ratio, the tuned
runs get the config's own ratio min_lr / lr, so the minimum follows the peak.

The block and `--tune` are read and checked in tuning_spec.py. The tuning is recorded here too:
tuning.json beside a tuned sweep's (or a tuned `compare --config`'s) runs, so that `tiedlm compare
FOLDER` compares each grid point at its own chosen values without being told (compare/tuned.py's
read_record reads it).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compare.tuned import (
    LR_KEY,
    MIN_LR_KEY,
    RATIO_KEY,
    RECORD,
    TunedPoint,
    TuneSpec,
    Tuning,
    VariantTuning,
    paired,
    tuned_keys,
)
from ..config import Config, TrainConfig
from ..errors import ConfigError, TiedlmError
from ..files import atomic_write_json, foreign_files, recording
from ..perplexity import perplexity
from ..config.naming import scalar, short_keys
from ..runs import read_report
from ..config.identity import flat
from .plan import PlannedRun, RunSource, Stage, point_label, point_overrides, point_tag, points
from .tuning_spec import at_bound, bounds_of, extend_value, range_text, relative_bound, relative_bound_text, whole_key

if TYPE_CHECKING:
    from ..model.tie import Tie


# Keys of one tie's own: tuned for the variants whose tie has them, absent (None) from the others,
# so that tuning a pull model's strength never hands a strength to the untied model it is judged against.
TIE_OWN_KEYS = {"model.tie_strength": "strengthened", "model.untie_rank": "ranked"}


def variant_axes(axes: dict[str, list], tie: Tie) -> dict[str, list]:
    """A variant's axes: a key of a tie it does not have (TIE_OWN_KEYS) is the single value None."""
    return {k: (list(vals) if k not in TIE_OWN_KEYS or getattr(tie, TIE_OWN_KEYS[k]) else [None])
            for k, vals in axes.items()}


def schedule_overrides(spec: TuneSpec, base: Config) -> list[str]:
    """With train.lr tuned and no train.min_lr_ratio in the config: the config's own ratio, so the
    cosine minimum follows the peak (and min_lr back at its default, as the ratio replaces it)."""
    if LR_KEY not in spec.keys or getattr(base.train, "min_lr_ratio", None) is not None:
        return []

    ratio = base.train.min_lr / base.train.lr if base.train.lr else 0.0
    # min_lr back at its default: the ratio replaces it, and config/checks.py refuses a non-default min_lr beside it
    return [f"{RATIO_KEY}={float(f'{ratio:.6g}')!r}", f"{MIN_LR_KEY}={TrainConfig.min_lr!r}"]



def score_run(run_dir: Path) -> tuple[float | None, float | None, float]:
    """(validation loss that selects, the best step, tokens seen) of a finished run; None when it
    did not finish or cannot be read. The loss is the kept best weights' when the run kept them,
    else the final one; test is never read."""

    try:
        report = read_report(run_dir)
    except (TiedlmError, OSError):
        return None, None, 0.0
    if report is None or report.status != "finished":
        return None, None, 0.0
    kept = report.final_best if isinstance(report.final_best, dict) and "validation" in report.final_best else None
    section = kept or (report.final if isinstance(report.final, dict) else {})
    validation = section.get("validation")
    loss = validation.get("loss") if isinstance(validation, dict) else None
    best = report.best if isinstance(report.best, dict) else {}
    step = best.get("step") if isinstance(best.get("step"), (int, float)) else None
    tokens = float(report.tokens_seen) if isinstance(report.tokens_seen, (int, float)) else 0.0
    return (float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else None), step, tokens


def _score(p: TunedPoint, runs_dir: Path) -> None:
    losses, steps, tokens, failed = [], [], 0.0, []
    for name in p.runs.values():
        loss, step, seen = score_run(runs_dir / name)
        tokens += seen
        if loss is None:
            failed.append(name)
            continue
        losses.append(loss)
        if step is not None:
            steps.append(step)
    p.tokens, p.failed = tokens, failed
    if losses and not failed:
        p.loss = sum(losses) / len(losses)
        p.perplexity = perplexity(p.loss)
        p.best_step = sum(steps) / len(steps) if steps else None


def _choose(v: VariantTuning) -> TunedPoint | None:
    scored = [p for p in v.points if p.loss is not None]
    return min(scored, key=lambda p: p.loss) if scored else None


def _line(v: VariantTuning, axis: str) -> list:
    """The values of `axis` tried with every other key at the chosen point's: the line through the
    choice along that axis (the whole axis in the grid; only part of it once the grid has grown
    along another axis, as a step past an edge trains one point, not a whole row)."""
    others = [k for k in v.chosen.point if k != axis]
    return sorted({p.point[axis] for p in v.points if all(p.point.get(k) == v.chosen.point[k] for k in others)})


def _edges(v: VariantTuning) -> list[tuple[str, int]]:
    """(axis, direction) where the chosen point has no tried neighbour along a numeric axis of this
    variant: the end of the axis, or (past a step along another axis) of the values tried on its line."""
    out = []
    for axis, values in v.axes.items():
        if paired(values) or len(values) < 2 or v.chosen is None:
            continue
        line, value = _line(v, axis), v.chosen.point[axis]
        out += [(axis, d) for d, end in ((-1, line[0]), (+1, line[-1])) if value == end]
    return out


def _edge_note(v: VariantTuning, edges: list[tuple[str, int]], why: dict[tuple[str, int], str]) -> str | None:
    if not edges or v.chosen is None:
        return None
    parts = []
    for axis, d in edges:
        value = scalar(v.chosen.point[axis])
        parts.append(f"{axis} {value} is the {'smallest' if d < 0 else 'largest'} value tried ({why[(axis, d)]})")
    return "; ".join(parts) + " — the best value may lie beyond"


def _bound_note(v: VariantTuning, edges: list[tuple[str, int]], relative: dict[str, tuple[str, Any]]) -> str | None:
    """What a choice at the bound of a key's range says instead of an edge: nothing lies past it.
    `relative`: the keys bounded by another key's value there (n_kv_head by n_head), and that value."""
    if not edges or v.chosen is None:
        return None
    return "; ".join(f"{axis} {scalar(v.chosen.point[axis])} is the {'lowest' if d < 0 else 'highest'} value it can "
                     f"take ({_range_of(axis, d, relative)})" for axis, d in edges) + ": the choice is final there"


def _range_of(axis: str, d: int, relative: dict[str, tuple[str, Any]]) -> str:
    """'model.dropout is in [0, 1)', or, for a key bounded above by another's value, 'model.n_kv_head
    is at most model.n_head, 4, and must divide it'."""
    if axis in relative and d > 0:
        return relative_bound_text(axis, *relative[axis])
    return f"{axis} is in {range_text(axis)}"


class TuningSearch:
    """Every variant's grid on the tuning seeds, extended past an edge where the choice lies, each
    variant's point chosen on validation. A stage at a time: `next_stage` gives the runs to train
    (a Stage), and, called again once they are trained, reads them (each point scored once) and
    gives the next, or None when every choice is interior or its edge is final; `tuning` is then
    complete. `variants` are (tag, overrides) pairs; `source` makes each run (a ConfigError for a
    point the config refuses)."""

    def __init__(self, spec: TuneSpec, variants: list[tuple[str, list[str]]], source: RunSource,
                 runs_dir: Path, first_seed: int, selection: str, base: Config):
        self.spec, self.source, self.runs_dir = spec, source, Path(runs_dir)
        self.seeds = spec.seeds if spec.seeds is not None else [first_seed]
        self.short = short_keys(spec.keys)

        values = flat(base)
        self.tuning = Tuning(spec=spec, keys=spec.keys, seeds=self.seeds, selection=selection, variants=[],
                             schedule=schedule_overrides(spec, base), config={k: values.get(k) for k in spec.keys})
        self.why: dict[tuple[str, str, int], str] = {}  # why an edge was not extended
        self.fresh: list[TunedPoint] = []  # points planned and not yet scored
        self.configs: dict[tuple[str, str], Any] = {}  # (variant, point label) -> a run's resolved config
        runs: list[PlannedRun] = []
        for tag, extra in variants:
            tie = source.run(tag, extra, self.seeds[0]).cfg.model.tie
            v = VariantTuning(tag=tag, overrides=extra, axes=variant_axes(spec.axes, tie))
            self.tuning.variants.append(v)
            for p in points(spec, v.axes):
                runs += self._add(v, p)
        self.pending: Stage | None = Stage("tuning grid", runs) if self.fresh else None
        if self.pending is None:
            self._finish()

    def _add(self, v: VariantTuning, point: dict[str, Any]) -> list[PlannedRun]:
        """The runs of a point new to the variant ([] when it has it already)."""
        label = point_label(point, self.short)
        if v.point(label) is not None:
            return []
        tag = point_tag(point, self.short)
        runs = [self.source.run(f"{v.tag}-{tag}" if tag else v.tag, v.overrides + point_overrides(point, self.tuning.schedule),
                                s) for s in self.seeds]
        tp = TunedPoint(point=point, label=label, runs={s: r.name for s, r in zip(self.seeds, runs)})
        if runs:
            self.configs[(v.tag, label)] = runs[0].cfg
        v.points.append(tp)
        self.fresh.append(tp)
        return runs

    def next_stage(self) -> Stage | None:
        if self.pending is not None:
            stage, self.pending = self.pending, None
            return stage
        if not self.fresh:
            return None
        for tp in self.fresh:  # each point is scored once, when its runs are done
            _score(tp, self.runs_dir)
        self.fresh = []
        runs = [run for v in self.tuning.variants for run in self._extend(v)]
        if not self.fresh:
            self._finish()
            return None
        return Stage("steps past the grid's edges", runs)

    def _extend(self, v: VariantTuning) -> list[PlannedRun]:
        """Choose the variant's point and plan a step past each edge it lies on (within the limit):
        the next value of the axis where another line of the grid has one, else a new value."""
        spec, runs = self.spec, []
        v.chosen = _choose(v)
        for axis, d in _edges(v):
            value = v.chosen.point[axis]
            beyond = [x for x in v.axes[axis] if (x - value) * d > 0]
            if beyond:  # tried on another line: filled in here, the grid does not grow
                new = min(beyond, key=lambda x: abs(x - value))
            elif self._at_bound(v, axis, d):  # dropout 0, n_kv_head = n_head: nothing lies past it (a bound)
                continue
            elif not spec.extend:
                self.why[(v.tag, axis, d)] = "tune.extend is off"
                continue
            elif (steps := v.extensions.get(f"{axis}:{d:+d}", 0)) >= spec.extend_limit:
                self.why[(v.tag, axis, d)] = f"extended {steps} time{'s' * (steps != 1)}, the limit (tune.extend_limit)"
                continue
            else:
                new = extend_value(v.axes[axis], value, d, whole_key(axis), bounds_of(axis))
            todo: list[PlannedRun] = []
            self.why[(v.tag, axis, d)] = "no valid value beyond it"
            if new is not None:
                try:
                    todo = self._add(v, {**v.chosen.point, axis: new})
                except ConfigError as e:  # beyond what the config accepts (lr × weight_decay ≥ 1, say)
                    self.why[(v.tag, axis, d)] = f"the config refuses {scalar(new)}: {e}"
            if not todo:
                continue
            if not beyond:
                v.axes[axis] = sorted(v.axes[axis] + [new])
                v.extensions[f"{axis}:{d:+d}"] = v.extensions.get(f"{axis}:{d:+d}", 0) + 1
            runs += todo
        return runs

    def _relative_bound(self, v: VariantTuning, axis: str) -> tuple[str, Any] | None:
        """The other key bounding `axis` from above, and its value at the variant's chosen point."""
        return relative_bound(axis, self.configs.get((v.tag, v.chosen.label))) if v.chosen is not None else None

    def _at_bound(self, v: VariantTuning, axis: str, d: int) -> bool:
        """Whether the chosen value of `axis` is the bound of its range on that side: the key's own
        (tuning_spec.BOUNDS), or, upwards, another key's value (model.n_kv_head at model.n_head)."""
        value = v.chosen.point[axis]
        if at_bound(axis, value, d):
            return True
        other = self._relative_bound(v, axis) if d > 0 else None
        return other is not None and value >= other[1]

    def _finish(self) -> None:
        for v in self.tuning.variants:
            edges = _edges(v)
            bound = [(a, d) for a, d in edges if self._at_bound(v, a, d)]
            edges = [e for e in edges if e not in bound]
            v.edge = _edge_note(v, edges, {(a, d): self.why.get((v.tag, a, d), "") for a, d in edges})
            relative = {a: r for a, _ in bound if (r := self._relative_bound(v, a)) is not None}
            v.bound = _bound_note(v, bound, relative)
        self.tuning.runs = sum(len(p.runs) for v in self.tuning.variants for p in v.points)
        self.tuning.tokens = sum(p.tokens for v in self.tuning.variants for p in v.points)


def shared_point(tuning: Tuning, base: Config) -> dict[str, Any] | None:
    """The config's own value of every tuned key, as the grid spells it, when every variant tried
    that point: where the untuned comparison would have put both variants. Values are compared,
    not labels: a config's dropout 0.0 is the grid's 0."""

    values = flat(base)
    tried = [v.at({k: values.get(k) for k in tuning.keys}) for v in tuning.variants]
    return dict(tried[0].point) if tried and all(p is not None for p in tried) else None


# ------------------------------------------------------------------------- the record: tuning.json


def check_record_target(folder: Path, remove: bool = True) -> None:
    """Before a tuned sweep or a tuned compare --config trains: refuse a tuning.json in its runs
    folder that tiedlm did not write, and (`remove`, a sweep) remove tiedlm's own (an earlier
    sweep's, perhaps of another grid): the new one is written when this sweep's runs are done, so an
    interrupted sweep leaves no stale record."""

    folder = Path(folder)
    found = foreign_files(folder, [RECORD])
    if found:
        raise ConfigError(f"{found[0]} was not written by tiedlm, or was changed since — move it away, or train into "
                          "another folder (out: in a grid file, --out for compare --config)")
    if remove:  # a tuned compare --config keeps another command's record until it writes its own
        (folder / RECORD).unlink(missing_ok=True)


def record_runs(tuning: Tuning, chosen: list[str], others: list[str] = ()) -> list[str]:
    """Every run a record speaks for: the chosen ones, `others`, and each tuning point's runs."""
    return sorted({*chosen, *others, *(name for v in tuning.variants for p in v.points for name in p.runs.values())})


def write_record(folder: Path, tuning: Tuning, chosen: list[str], others: list[str] = ()) -> Path:
    """tuning.json into a tuned sweep's (or a tuned `compare --config`'s) runs folder, atomically,
    recorded as tiedlm's. `others` are runs it trained that are neither tuning runs nor compared
    (--seeds auto's shared-value runs)."""

    folder = Path(folder)
    with recording(folder, [RECORD], "out:", overwrite=True):
        atomic_write_json(folder / RECORD, {"format": 1, "keys": tuned_keys(tuning), "chosen": sorted(chosen),
                                            "runs": record_runs(tuning, chosen, list(others)), "tuning": tuning.to_json()})
    return folder / RECORD


