"""A tuning as the judging side reads it: what was tuned (`TuneSpec`, its axes), each variant's
points on the tuning seeds and its choice (`Tuning`, comparison.json's `tuning`), which key moved
the verdict (`JointEffect`, for train.lr and one other key), and a tuned sweep's record beside its
runs (tuning.json: `read_record`, so that `tiedlm compare FOLDER` compares each grid point at its
chosen values). The experiment side (experiment/tuning.py) fills these in and writes the record;
reports, sections and plots read them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import foreign_files, read_json, written_here
from ..perplexity import relative

EXTEND_LIMIT = 3  # steps past each edge of the grid, per variant and axis
LR_KEY, MIN_LR_KEY, RATIO_KEY = "train.lr", "train.min_lr", "train.min_lr_ratio"


def paired(values: list) -> bool:
    """A paired axis: each value a mapping of several keys set together."""
    return bool(values) and all(isinstance(v, dict) for v in values)


@dataclass
class TuneSpec:
    """What to tune: axes (a config key -> values, or a name -> mappings of keys to values) and how."""

    axes: dict[str, list] = field(default_factory=dict)
    seeds: list[int] | None = None  # None: the comparison's first seed
    extend: bool = True
    extend_limit: int = EXTEND_LIMIT
    shared_seeds: bool = False

    @property
    def keys(self) -> list[str]:
        """Every config key the grid sets, in axis order."""
        out: list[str] = []
        for axis, values in self.axes.items():
            for k in (values[0].keys() if paired(values) else [axis]):
                if k not in out:
                    out.append(k)
        return out

    def to_json(self) -> dict:
        return {"axes": self.axes, "seeds": self.seeds, "extend": self.extend, "extend_limit": self.extend_limit,
                "shared_seeds": self.shared_seeds}


# The range of each bounded numeric key (config/checks.py refuses the rest): (low, low allowed, high, high
# allowed), None where a side is open-ended. A step past the grid's edge never leaves it: it stops at


# ============================================================================ the tuning itself


@dataclass
class TunedPoint:
    """One point of one variant's grid: its runs on the tuning seeds and their validation scores."""

    point: dict[str, Any]
    label: str
    runs: dict[int, str]  # tuning seed -> run name
    loss: float | None = None  # mean validation loss over the tuning seeds (the selection's)
    perplexity: float | None = None  # exp(loss)
    best_step: float | None = None  # the mean step of the best periodic evaluation
    tokens: float = 0.0  # tokens the runs trained on, together
    failed: list[str] = field(default_factory=list)  # runs that did not finish

    def to_json(self) -> dict:
        return {"point": self.point, "label": self.label, "validation_loss": self.loss,
                "validation_perplexity": self.perplexity, "best_step": self.best_step,
                "runs": {str(s): n for s, n in self.runs.items()}, "failed": self.failed}


@dataclass
class VariantTuning:
    tag: str  # tied, untied
    overrides: list[str]  # the variant's own overrides
    axes: dict[str, list]  # this variant's axes, extended where its choice sat at an edge
    points: list[TunedPoint] = field(default_factory=list)
    chosen: TunedPoint | None = None
    extensions: dict[str, int] = field(default_factory=dict)  # "axis:-1" / "axis:+1" -> steps added
    edge: str | None = None  # why the choice is still at an edge of the grid, if it is
    bound: str | None = None  # where the choice is at the bound of a key's range (dropout 0): not an edge

    def point(self, label: str) -> TunedPoint | None:
        return next((p for p in self.points if p.label == label), None)

    def at(self, values: dict[str, Any]) -> TunedPoint | None:  # by value, not label: 0 is 0.0
        return next((p for p in self.points if all(p.point.get(k) in (x, None) for k, x in values.items())), None)

    def to_json(self) -> dict:
        return {"variant": self.tag, "chosen": self.chosen.to_json() if self.chosen else None,
                "points": [p.to_json() for p in self.points], "axes": self.axes,
                "extensions": self.extensions, "edge": self.edge, "bound": self.bound}


@dataclass
class Tuning:
    """The whole tuning of a comparison, what comparison.json's `tuning` holds."""

    spec: TuneSpec
    keys: list[str]
    seeds: list[int]  # the tuning seeds
    selection: str  # what chose: "kept best weights" or "final weights"
    variants: list[VariantTuning]
    schedule: list[str]  # the overrides that keep the schedule's shape (train.min_lr_ratio)
    shared: dict | None = None  # the verdict with both variants at the config's own point
    runs: int = 0  # distinct tuning runs (variant x point x tuning seed)
    tokens: float = 0.0  # the tokens they trained on
    config: dict[str, Any] = field(default_factory=dict)  # the config's own value of each tuned key

    @property
    def joint(self) -> JointEffect | None:
        """Which key moved the verdict, for a tune of train.lr and one other key (else None)."""
        return joint_effect(self)

    def variant(self, tag: str) -> VariantTuning | None:
        return next((v for v in self.variants if v.tag == tag), None)

    @property
    def only_point(self) -> str | None:
        """The label of the grid's one point when no variant tried another (a single value per
        axis, which no edge can extend): nothing was compared, so nothing was chosen. Else None."""
        return single_point([[p.label for p in v.points] for v in self.variants])

    def labels(self) -> list[str]:
        """Every point any variant tried, in grid order (the first axis' values ascending)."""
        seen: dict[str, dict] = {}
        for v in self.variants:
            for p in v.points:
                seen.setdefault(p.label, p.point)
        order = lambda x: (0, x) if isinstance(x, (int, float)) else (1, str(x))  # noqa: E731
        return sorted(seen, key=lambda lab: tuple(order(x) for x in seen[lab].values()))

    def to_json(self) -> dict:
        return {"keys": self.keys, "seeds": self.seeds, "selected_on": "validation", "selection": self.selection,
                "spec": self.spec.to_json(), "schedule": self.schedule,
                "variants": [v.to_json() for v in self.variants], "shared": self.shared, "config": self.config,
                "joint": self.joint.to_json() if self.joint is not None else None,
                "cost": {"runs": self.runs, "tokens": self.tokens}}


def single_point(labels: list[list[str]]) -> str | None:
    """Each variant's tried point labels -> the one label when every variant tried that one alone."""
    every = {lab for each in labels for lab in each}
    return next(iter(every)) if labels and len(every) == 1 and all(len(each) == 1 for each in labels) else None


def not_compared(keys: list[str], label: str) -> str:
    """What a tuning of one point says instead of a choice."""
    given = f"{keys[0]} was given one value" if len(keys) == 1 else f"{', '.join(keys)} were given one value each"
    return (f"{given}, {label}, so every variant trained at it and nothing was compared or chosen on validation — "
            "give two or more values to tune")



# ---------------------------------------------------------------------------- which key moved the verdict


@dataclass
class Reading:
    """The tied/untied effect on validation with each variant at one kind of point (tuning runs)."""

    points: dict[str, dict[str, Any]]  # variant tag -> its point
    labels: dict[str, str]
    perplexity: dict[str, float]  # variant tag -> validation perplexity there
    effect: float | None  # exp(loss of the variant − loss of the reference) − 1
    at_edge: list[str] = field(default_factory=list)  # variants whose best lr here is the end of the lr tried there

    def to_json(self) -> dict:
        return {"points": self.points, "labels": self.labels, "validation_perplexity": self.perplexity,
                "relative": self.effect, "lr_at_edge": self.at_edge}


@dataclass
class JointEffect:
    """A tune of train.lr and one other key, decomposed: the effect at the config's own point, at
    each variant's best lr with the other key held at the config's value, and at the joint best;
    all on validation (the split that chose), from the tuning runs, without an interval."""

    variant: str
    reference: str
    other: str  # the key tuned beside train.lr
    held: Any  # the config's value of it
    seeds: list[int]  # the tuning seeds the readings average over
    config: Reading | None  # both at the config's own point (None where not every variant tried it)
    lr_alone: Reading | None  # None where the held value is not in every variant's grid
    joint: Reading

    @property
    def moved_by(self) -> str | None:
        """The key whose tuning changed the effect more: train.lr (config -> lr alone) or the other
        key (lr alone -> joint); None when either step is unknown or they moved it equally."""
        if self.config is None or self.lr_alone is None or None in (self.config.effect, self.lr_alone.effect,
                                                                     self.joint.effect):
            return None
        by_lr, by_other = abs(self.lr_alone.effect - self.config.effect), abs(self.joint.effect - self.lr_alone.effect)
        return None if by_lr == by_other else LR_KEY if by_lr > by_other else self.other

    def to_json(self) -> dict:
        return {"variant": self.variant, "reference": self.reference, "split": "validation", "other": self.other,
                "held": self.held, "seeds": self.seeds, "interval": None, "moved_by": self.moved_by,
                **{k: r.to_json() if r is not None else None
                   for k, r in (("config", self.config), ("lr_alone", self.lr_alone), ("joint", self.joint))}}


def _reading(pick: dict[str, TunedPoint | None], variant: str, reference: str) -> Reading | None:
    if any(p is None or p.loss is None for p in pick.values()):
        return None
    return Reading(points={t: p.point for t, p in pick.items()}, labels={t: p.label for t, p in pick.items()},
                   perplexity={t: p.perplexity for t, p in pick.items()},
                   effect=relative(pick[variant].loss - pick[reference].loss))


def _best_at(v: VariantTuning, key: str, value: Any) -> TunedPoint | None:
    """The variant's best scored point with `key` at `value` (its best lr there)."""
    scored = [p for p in v.points if p.loss is not None and p.point.get(key) in (value, None)]  # None: not its key
    return min(scored, key=lambda p: p.loss) if scored else None


def joint_effect(tuning: Tuning) -> JointEffect | None:
    """The decomposition of a tune of exactly two plain axes, one of them train.lr, for the first
    variant against untied (tied vs untied; with --match, the primary contrast); else None."""
    axes, ref = tuning.spec.axes, tuning.variant("untied")
    if (len(axes) != 2 or LR_KEY not in axes or any(paired(vals) for vals in axes.values()) or ref is None
            or len(tuning.variants) < 2 or tuning.only_point is not None):
        return None
    pair = [next(v for v in tuning.variants if v is not ref), ref]
    variant, reference = (v.tag for v in pair)
    other = next(k for k in axes if k != LR_KEY)
    held = next((x for v in pair for x in v.axes[other] if x == tuning.config.get(other)), tuning.config.get(other))
    joint = _reading({v.tag: v.chosen for v in pair}, variant, reference)
    if joint is None:
        return None
    alone_pick = {v.tag: _best_at(v, other, held) for v in pair}
    alone = _reading(alone_pick, variant, reference)
    for v in pair if alone is not None else []:
        line = sorted(p.point[LR_KEY] for p in v.points if p.point.get(other) in (held, None))
        if len(line) > 1 and alone_pick[v.tag].point[LR_KEY] in (line[0], line[-1]):
            alone.at_edge.append(v.tag)
    return JointEffect(variant=variant, reference=reference, other=other, held=held, seeds=list(tuning.seeds),
                       config=_reading({v.tag: v.at(tuning.config) for v in pair}, variant, reference), lr_alone=alone,
                       joint=joint)


def tuned_keys(tuning: Tuning | None) -> list[str]:
    """Keys that differ between variants by design when each is tuned: the tuned ones and the
    schedule's (labels and the twin matching leave them out; the tuning table shows them); [] untuned."""
    return [*tuning.keys, MIN_LR_KEY, RATIO_KEY] if tuning is not None else []


# ---------------------------------------------------------------------------- a tuned sweep's record

RECORD = "tuning.json"  # in a tuned sweep's runs folder: which runs are each grid point's choice


@dataclass
class TuningRecord:
    """What a tuned sweep leaves beside its runs, so that `tiedlm compare FOLDER` compares each
    grid point at its own chosen values (and leaves the other tuning runs out) without being told.
    It is read only when the folder itself is compared (read_record) and only when every run there
    is one of the sweep's, so a record never decides about runs it does not know."""

    folder: Path
    keys: list[str]  # the tuned keys and the schedule's: what variants differ in by design
    chosen: list[str]  # the run names at the chosen points, every seed
    runs: list[str]  # every run the sweep trained: its tuning runs and the chosen ones
    tuning: dict  # Tuning.to_json()
    ignored: str | None = None  # why a record that is, or was, in the folder cannot be used (then empty)

    @property
    def usable(self) -> bool:
        return self.ignored is None

    def notes(self) -> list[str]:
        """The comparison's notes: what was tuned, and each variant's choice."""
        if not self.usable:
            return []
        tuned = self.tuning.get("keys") or self.keys[:1]
        variants = [v for v in self.tuning.get("variants") or [] if isinstance(v, dict)]
        only = single_point([[p.get("label") for p in v.get("points") or [] if isinstance(p, dict)]
                             for v in variants])
        if only is not None:
            return [f"{not_compared(tuned, only)} ({self.folder / RECORD}); each grid point is compared "
                    "at it, on test"]
        choices = [f"{v.get('variant')}: {(v.get('chosen') or {}).get('label', 'none')}"
                   + (f" (edge: {v['edge']})" if v.get("edge") else "")
                   + (f" (bound: {v['bound']})" if v.get("bound") else "")
                   for v in self.tuning.get("variants") or []]
        return [f"{', '.join(tuned)} tuned per variant on validation ({self.folder / RECORD}): each "
                "variant is compared at its own choice, on test; labels and twins leave the tuned keys out",
                *(["chosen: " + "; ".join(choices)] if choices else [])]


def read_record(folder: Path, run_dirs: list[Path]) -> TuningRecord | None:
    """The tuning record of `folder` (the one folder compared); None where tiedlm never wrote one.
    It is used (`usable`) when tiedlm wrote it, nobody changed it since, and every run in run_dirs
    is one of its sweep's runs: it never speaks for runs it does not know. Otherwise the record
    returned is empty and says, in `ignored`, why (a comparison then says so first)."""
    folder = Path(folder)
    path = folder / RECORD
    ignored = functools.partial(TuningRecord, folder, [], [], [], {})  # a record that says why it is not used
    if not path.exists():
        return ignored(ignored=f"{path}, which a tuned sweep or compare --config wrote, is missing") if written_here(folder, RECORD) else None
    if foreign_files(folder, [RECORD]):
        return ignored(ignored=f"{path} was not written by tiedlm, or was changed since")
    data = read_json(path)
    keys, chosen, runs = (data.get(k) for k in ("keys", "chosen", "runs")) if isinstance(data, dict) else (None,) * 3
    if (not isinstance(data, dict) or data.get("format") != 1
            or not all(isinstance(x, list) and all(isinstance(i, str) for i in x) for x in (keys, chosen, runs))):
        return ignored(ignored=f"{path} is not a tuning record this tiedlm reads")
    strangers = sorted(Path(d).name for d in run_dirs
                       if Path(d).resolve().parent != folder.resolve() or Path(d).name not in set(runs))
    if strangers:
        more = ", …" if len(strangers) > 3 else ""
        return ignored(ignored=f"{len(strangers)} run{'s' * (len(strangers) != 1)} here the tuning did not train "
                       f"({', '.join(strangers[:3])}{more}: renamed, or added since)")
    return TuningRecord(folder, keys, chosen, runs, data.get("tuning") if isinstance(data.get("tuning"), dict) else {})
