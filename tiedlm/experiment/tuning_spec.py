"""What to tune, as given: a `tune:` block (a config's or a grid file's) or `--tune KEY=V1,V2,...`,
checked into a TuneSpec before anything trains; and the values a tuned key may take past the grid
(its type, its range, the grid's own step). tuning.py runs it; see its docstring for the block and
the protocol."""

from __future__ import annotations

import difflib
import math
import typing
from pathlib import Path
from typing import Any

from ..config.checks import NORM_EPS_MIN, ROPE_THETA_MAX, ROPE_THETA_MIN
from ..compare.tuned import TuneSpec, paired
from ..errors import ConfigError
from ..config.checks import check_seed
from ..config import ALL_KEYS, Config
from ..config.layers import _load_with_bases
from ..config.identity import flat
from ..config.yamlsafe import load_yaml

SETTINGS = ("seeds", "extend", "extend_limit", "shared_seeds")  # a tune: block's own keys; the rest are axes


# an allowed bound, or goes halfway to one that is not allowed (dropout 0.9 -> 0.95, never 1).
POSITIVE_WHOLE = (1, True, None, False)
BOUNDS: dict[str, tuple] = {
    "model.dropout": (0.0, True, 1.0, False),
    "model.untie_at": (0.0, False, 1.0, False),
    "model.tie_strength": (0.0, True, None, False),  # soft, pull: 0 is the untied end of the dial
    "model.norm_eps": (NORM_EPS_MIN, True, 1.0, True),
    "model.rope_theta": (ROPE_THETA_MIN, False, ROPE_THETA_MAX, False),  # config/checks.py says why
    "train.lr": (0.0, False, None, False),
    "train.min_lr": (0.0, True, None, False),
    "train.min_lr_ratio": (0.0, True, 1.0, True),
    "train.weight_decay": (0.0, True, None, False),
    "train.grad_clip": (0.0, True, None, False),
    "train.warmup_steps": (0, True, None, False),
    "train.beta1": (0.0, True, 1.0, False),
    "train.beta2": (0.0, True, 1.0, False),
    **{f"model.{k}": POSITIVE_WHOLE for k in ("n_layer", "n_head", "n_embd", "block_size", "n_kv_head",
                                              "intermediate_size", "multiple_of")},
    **{f"train.{k}": POSITIVE_WHOLE for k in ("batch_size", "grad_accum")},
}


# Keys whose range ends at another key's value in the same config (config/checks.py): a key/value head
# serves whole query heads, so model.n_kv_head is at most model.n_head (and divides it). A choice
# there is at the key's bound, not at an edge of the grid to step past.
RELATIVE_BOUNDS = {"model.n_kv_head": ("model.n_head", "must divide")}


def bounds_of(key: str) -> tuple | None:
    return BOUNDS.get(key)


def relative_bound(key: str, cfg: Config | None) -> tuple[str, Any] | None:
    """(the other key, its value in `cfg`) where `key`'s highest value is that key's value there
    (RELATIVE_BOUNDS); None for any other key, or without a config."""
    other = RELATIVE_BOUNDS.get(key)
    if other is None or cfg is None:
        return None

    value = flat(cfg).get(other[0])
    return (other[0], value) if isinstance(value, (int, float)) else None


def relative_bound_text(key: str, other: str, value: float) -> str:
    """'model.n_kv_head is at most model.n_head, 4, and must divide it'."""
    return f"{key} is at most {other}, {value:g}, and {RELATIVE_BOUNDS[key][1]} it"


def range_text(key: str) -> str:
    """model.dropout -> '[0, 1)', train.weight_decay -> '[0, ∞)'."""
    lo, lo_in, hi, hi_in = BOUNDS[key]
    return (f"{'[' if lo_in else '('}{'−∞' if lo is None else f'{lo:g}'}, "
            f"{'∞' if hi is None else f'{hi:g}'}{']' if hi_in and hi is not None else ')'}")


def at_bound(key: str, value: float, direction: int) -> bool:
    """Whether `value` is the allowed bound of the key's range on that side: nothing lies past it."""
    b = BOUNDS.get(key)
    if b is None:
        return False
    lo, lo_in, hi, hi_in = b
    return (lo_in and lo is not None and value <= lo) if direction < 0 else (hi_in and hi is not None and value >= hi)


def whole_key(key: str) -> bool | None:
    """Whether a config key takes whole numbers (int), real ones (float), or None when neither
    (an unknown key, a free type): the key's type decides, not how its values happen to be written."""
    tp: Any = Config
    for part in key.split("."):
        hints = typing.get_type_hints(tp) if isinstance(tp, type) else {}
        if part not in hints:
            return None
        tp = hints[part]
    kinds = set(typing.get_args(tp) or (tp,)) - {type(None)}
    return True if kinds == {int} else False if kinds == {float} else None


def extend_value(values: list, edge: float, direction: int, whole: bool | None = None,
                 bounds: tuple | None = None) -> float | None:
    """One step past `edge` (the smallest value when direction < 0, the largest when > 0): the
    grid's own ratio between the two outermost values when both are positive, else their difference.
    `whole` (whole_key: the key's type) keeps an integer setting whole and lets a real one, though
    written 5 and 8, extend to 3.12; None: whole when every value is. `bounds` (tuning_spec.BOUNDS:
    low, low allowed, high, high allowed) keeps the step in the key's range: a step past an allowed
    bound stops at it, one past a bound that is not allowed goes halfway to it; down towards a range
    that starts at 0 (dropout, weight decay), the step is the difference, so 0 itself is reached
    (0.1, 0.2 -> 0; 0.01, 0.1 -> 0), where a ratio would never get there. None when the axis
    has fewer than two values, the step repeats one, or no value of the range lies beyond."""
    nums = sorted(set(values))
    if len(nums) < 2:
        return None
    a, b = (nums[0], nums[1]) if direction < 0 else (nums[-1], nums[-2])
    lo, lo_in, hi, hi_in = bounds if bounds is not None else (None, False, None, False)
    down_to_zero = direction < 0 and lo == 0 and lo_in  # dropout, weight decay: ratios never reach 0, their end
    new = a * (a / b) if a > 0 and b > 0 and not down_to_zero else a + (a - b)
    if direction < 0 and lo is not None and (new < lo or (new == lo and not lo_in)):
        new = lo if lo_in else (a + lo) / 2
    if direction > 0 and hi is not None and (new > hi or (new == hi and not hi_in)):
        new = hi if hi_in else (a + hi) / 2
    if whole is None:
        whole = all(isinstance(v, int) for v in nums)
    if whole:
        new = int(round(new))
    else:  # 3 significant digits, more where 3 would round onto the bound or back onto the edge (0.9995)
        new = next((x for x in (float(f"{new:.{n}g}") for n in (3, 6, 12)) if not _outside(x, bounds) and x != a),
                   float(f"{new:.3g}"))
    return None if new in nums or _outside(new, bounds) or (new - a) * direction <= 0 else new


def _outside(x: float, bounds: tuple | None) -> bool:
    """Whether x is outside a key's range (tuning_spec.BOUNDS' form; None: no bounds)."""
    if bounds is None:
        return False
    lo, lo_in, hi, hi_in = bounds
    return bool((lo is not None and (x < lo or (x == lo and not lo_in)))
                or (hi is not None and (x > hi or (x == hi and not hi_in))))



# Sections whose settings change what the validation loss is measured on: another corpus, split or
# vocabulary gives a perplexity of another kind, so the lowest one would only pick the easiest text
# or the smallest vocabulary, and variants that chose differently would be compared on different data.
DATA_SECTIONS = ("data", "tokenizer")


def _block(where: str) -> str:
    """How a message names the tuning spec: `--tune` itself, or the file's tune: block."""
    return "--tune" if where == "--tune" else f"{where}: tune:"


def _sections() -> set[str]:

    return {k for k in ALL_KEYS if any(o.startswith(k + ".") for o in ALL_KEYS)}


def _unknown_key(key: str, where: str) -> ConfigError:
    """A tune: key that is neither a config key nor one of the block's own settings, with the
    closest of either (a known setting in no section, lr, is pointed to its place, train.lr)."""
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, SETTINGS, n=1, cutoff=0.75)
    close = close or [k for k in ALL_KEYS if k.rsplit(".", 1)[-1] == leaf][:1]
    close = close or difflib.get_close_matches(key, ALL_KEYS, n=1, cutoff=0.6)
    hint = (f" — did you mean {close[0]}?" if close else
            f" — give a config key such as train.lr, a paired axis (a list of mappings) or one of {', '.join(SETTINGS)}")
    return ConfigError(f"{_block(where)} unknown key {key!r}{hint}")


def _check_key(key: str, where: str) -> None:

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
    if paired(values):
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
        elif paired(value if isinstance(value, list) else []):
            spec.axes[key] = _check_axis(key, value, where)  # a paired axis: its name is free
        else:
            _check_key(key, where)  # unknown, a section, or not tunable: said before the values are
            spec.axes[key] = _check_axis(key, value, where)
    if not spec.axes:
        raise ConfigError(f"{where}: tune: names no setting to tune — add one, e.g. train.lr: [3.0e-4, 1.0e-3]")
    keys = [k for axis, vals in spec.axes.items() for k in (vals[0] if paired(vals) else [axis])]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{where}: a key is tuned on two axes ({', '.join(sorted(k for k in set(keys) if keys.count(k) > 1))})"
                          " — give it on one")
    return spec


def _seeds(value: Any, where: str) -> list[int]:

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

    if not items:
        return base
    block: dict[str, Any] = {}
    if base is not None:
        block.update({k: v for k, v in base.axes.items()})
        block.update({"extend": base.extend, "extend_limit": base.extend_limit, "shared_seeds": base.shared_seeds})
        if base.seeds is not None:
            block["seeds"] = base.seeds
    given: dict[str, str] = {}  # key -> its values as given here: a key given twice is refused
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
        if key in given:  # the second would silently replace the first
            raise ConfigError(f"--tune {key} is given twice ({given[key]} and {raw}) — give its values once, e.g. "
                              f"--tune {key}={given[key]},{raw}")
        given[key] = raw
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

    data = _load_with_bases(Path(cfg_path))
    block = data.get("tune")  # one of config_layers.EXPERIMENT_SECTIONS, which load_config leaves out
    return None if block is None else spec_from_block(block, str(cfg_path))
