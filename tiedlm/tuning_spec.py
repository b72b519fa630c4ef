"""What to tune, as given: a `tune:` block (a config's or a grid file's) or `--tune KEY=V1,V2,...`,
checked into a TuneSpec before anything trains. tuning.py runs it; see its docstring for the block
and the protocol."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

EXTEND_LIMIT = 3  # steps past each edge of the grid, per variant and axis
SETTINGS = ("seeds", "extend", "extend_limit", "shared_seeds")  # a tune: block's own keys; the rest are axes


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
            for k in (values[0].keys() if _paired(values) else [axis]):
                if k not in out:
                    out.append(k)
        return out

    def to_json(self) -> dict:
        return {"axes": self.axes, "seeds": self.seeds, "extend": self.extend, "extend_limit": self.extend_limit,
                "shared_seeds": self.shared_seeds}


def _paired(values: list) -> bool:
    return bool(values) and all(isinstance(v, dict) for v in values)


# Sections whose settings change what the validation loss is measured on: another corpus, split or
# vocabulary gives a perplexity of another kind, so the lowest one would only pick the easiest text
# or the smallest vocabulary, and variants that chose differently would be compared on different data.
DATA_SECTIONS = ("data", "tokenizer")


def _block(where: str) -> str:
    """How a message names the tuning spec: `--tune` itself, or the file's tune: block."""
    return "--tune" if where == "--tune" else f"{where}: tune:"


def _sections() -> set[str]:
    from .config import ALL_KEYS

    return {k for k in ALL_KEYS if any(o.startswith(k + ".") for o in ALL_KEYS)}


def _unknown_key(key: str, where: str) -> ConfigError:
    """A tune: key that is neither a config key nor one of the block's own settings, with the
    closest of either (a known setting in no section, lr, is pointed to its place, train.lr)."""
    import difflib

    from .config import ALL_KEYS

    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, SETTINGS, n=1, cutoff=0.75)
    close = close or [k for k in ALL_KEYS if k.rsplit(".", 1)[-1] == leaf][:1]
    close = close or difflib.get_close_matches(key, ALL_KEYS, n=1, cutoff=0.6)
    hint = (f" — did you mean {close[0]}?" if close else
            f" — give a config key such as train.lr, a paired axis (a list of mappings) or one of {', '.join(SETTINGS)}")
    return ConfigError(f"{_block(where)} unknown key {key!r}{hint}")


def _check_key(key: str, where: str) -> None:
    from .config import ALL_KEYS

    if key not in ALL_KEYS:
        raise _unknown_key(key, where)
    if key in _sections():
        raise ConfigError(f"{_block(where)} {key} is a section of the config, not a setting — tune one of its keys, "
                          f"e.g. {next(k for k in ALL_KEYS if k.startswith(key + '.'))}")
    if key.split(".")[0] in DATA_SECTIONS:
        raise ConfigError(f"{where}: {key} cannot be tuned — validation perplexity is not comparable across corpora "
                          "or vocabularies (the lowest would pick the easiest text or the smallest vocabulary); vary "
                          "it as a sweep's grid: axis or with --set instead, each value compared on its own")
    if key in ("seed", "name", "model.tie_embeddings", "model.tie_mode", "model.untie_rank"):
        raise ConfigError(f"{where}: {key} cannot be tuned — tuning chooses a setting per variant; seeds, names "
                          "and tying are what the comparison varies itself")


def _check_axis(axis: str, values: Any, where: str) -> list:
    if not isinstance(values, list) or not values:
        raise ConfigError(f"{where}: {axis} must be a non-empty list of values, e.g. train.lr: [3.0e-4, 1.0e-3]")
    if _paired(values):
        keys = list(values[0])
        if not keys or any(list(v) != keys for v in values):
            raise ConfigError(f"{where}: the points of {axis} must each set the same keys ({', '.join(keys)})")
        for k in keys:
            _check_key(str(k), where)
            if not all(_number(v[k]) for v in values):
                raise ConfigError(f"{where}: {axis}: {k} must be a number in every point (tuning is for numeric "
                                  "settings)")
        return [{str(k): v[k] for k in keys} for v in values]
    if any(isinstance(v, dict) for v in values):
        raise ConfigError(f"{where}: {axis} mixes mappings and single values — give one or the other")
    _check_key(axis, where)
    if not all(_number(v) for v in values):
        raise ConfigError(f"{where}: {axis} must list numbers, got {values!r} (tuning is for numeric settings)")
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: {axis} repeats a value: {values!r}")
    return list(values)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def spec_from_block(data: Any, where: str) -> TuneSpec:
    """A config's tune: block, checked (an unknown key, an empty or non-numeric axis: one line, exit 2)."""
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: tune: must map config keys to lists of values, e.g. tune: {{train.lr: [3.0e-4, "
                          "1.0e-3, 3.0e-3]}}")
    spec = TuneSpec()
    for key, value in data.items():
        key = str(key)
        if key == "seeds":
            spec.seeds = _seeds(value, where)
        elif key in ("extend", "shared_seeds"):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: tune.{key} must be true or false, got {value!r}")
            setattr(spec, key, value)
        elif key == "extend_limit":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 20:
                raise ConfigError(f"{where}: tune.extend_limit must be a whole number from 0 to 20, got {value!r}")
            spec.extend_limit = value
        elif isinstance(value, dict):
            inner = next(iter(value), "KEY")
            raise ConfigError(f"{_block(where)} {key} holds a mapping — write tuned keys dotted, e.g. tune: {{{key}."
                              f"{inner}: [...]}} (a paired axis is a list of mappings)")
        elif _paired(value if isinstance(value, list) else []):
            spec.axes[key] = _check_axis(key, value, where)  # a paired axis: its name is free
        else:
            _check_key(key, where)  # unknown, a section, or not tunable: said before the values are
            spec.axes[key] = _check_axis(key, value, where)
    if not spec.axes:
        raise ConfigError(f"{where}: tune: names no setting to tune — add one, e.g. train.lr: [3.0e-4, 1.0e-3]")
    keys = [k for axis, vals in spec.axes.items() for k in (vals[0] if _paired(vals) else [axis])]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{where}: a key is tuned on two axes ({', '.join(sorted(k for k in set(keys) if keys.count(k) > 1))})"
                          " — give it on one")
    return spec


def _seeds(value: Any, where: str) -> list[int]:
    from .checks import check_seed

    if isinstance(value, int) and not isinstance(value, bool):
        # A grid file's `seeds: 3` is a count (seeds 0, 1, 2); here it would name one seed. Neither
        # reading is silently taken: the list form says which is meant.
        count = f"[{', '.join(str(i) for i in range(value))}]" if 1 < value <= 10 else "[0, 1, 2]"
        raise ConfigError(f"{where}: tune: seeds: {value} is ambiguous (a grid file's seeds: {value} is a count) — "
                          f"write seeds: [{value}] to tune on seed {value}, or seeds: {count} for that many "
                          "tuning seeds")
    if (not isinstance(value, list) or not value
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in value)):
        raise ConfigError(f"{where}: tune seeds must be a list of whole numbers, e.g. seeds: [0], got {value!r}")
    for s in value:
        check_seed(s, "tune seeds")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: tune seeds repeat a seed: {value!r}")
    return list(value)


def spec_from_options(items: list[str], base: TuneSpec | None = None) -> TuneSpec | None:
    """`--tune KEY=V1,V2,...` (repeatable; also seeds=0,1, extend=false, extend_limit=N,
    shared_seeds=true), on top of the config's block (an axis given here replaces the block's)."""
    import yaml

    from .config import load_yaml

    if not items:
        return base
    block: dict[str, Any] = {}
    if base is not None:
        block.update({k: v for k, v in base.axes.items()})
        block.update({"extend": base.extend, "extend_limit": base.extend_limit, "shared_seeds": base.shared_seeds})
        if base.seeds is not None:
            block["seeds"] = base.seeds
    for item in items:
        if "=" not in item or not item.split("=", 1)[1].strip():
            raise ConfigError(f"--tune {item!r} must look like KEY=V1,V2,..., e.g. --tune train.lr=3e-4,1e-3,3e-3")
        key, raw = (part.strip() for part in item.split("=", 1))
        if not key:
            raise ConfigError(f"--tune {item!r} has no key before '=' — give KEY=V1,V2,..., e.g. --tune "
                              "train.lr=3e-4,1e-3,3e-3")
        try:
            values = [load_yaml(v, f"--tune {key}") for v in raw.split(",")]
        except yaml.YAMLError:
            raise ConfigError(f"--tune {item!r}: a value is not a number — give numbers separated by commas") from None
        values = [_as_number(v) for v in values]
        block[key] = values[0] if key in ("extend", "extend_limit", "shared_seeds") else values
    return spec_from_block(block, "--tune")


def _as_number(v: Any) -> Any:
    """YAML reads 3e-4 as a string (no dot): a number written that way is a number here."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def read_tune_block(cfg_path: str | Path) -> TuneSpec | None:
    """The tune: block of a config file (through its base: files), or None."""
    from .config import _load_with_bases

    data = _load_with_bases(Path(cfg_path))
    block = data.get("tune")
    return None if block is None else spec_from_block(block, str(cfg_path))
