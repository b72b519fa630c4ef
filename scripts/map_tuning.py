"""What tuning did to each cell of a tuned map: `python scripts/map_tuning.py FOLDER`.

A tuned sweep (a `tune:` block in the grid file) or a tuned `tiedlm compare --config ... --tune`
leaves FOLDER/tuning.json. A cell is a setting of the keys other than the tie; in it each tied
variant (tied, projection, lowrank, split, soft, pull, a --match variant: any tie but untied) is set
against the cell's untied twin. For each such pair this prints each variant's choice and the
effect (variant vs untied) on validation, read from the tuning runs:

- with train.lr and one other key tuned (model.dropout, train.weight_decay; or any two plain
  axes, the first one playing lr's part): each variant at its best lr with the other key held at
  the config's value, at each other value of the key (each variant at its best lr there), and
  each at its joint best. The difference between the first and the last is what tuning the other
  key did to the cell;
- with one tuned key (or a paired schedule, or more than two keys): both variants at the config's
  own values of the tuned keys, and each at its choice. The difference is what the tuning did.

Readings are on validation (the split that chose them) on the tuning seeds only: point
estimates, no interval; the verdict, on test with its interval, is `tiedlm compare FOLDER`'s.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiedlm.model.tie import STORED_KEYS  # noqa: E402

LR = "train.lr"
RECORD = "tuning.json"
# The tie's keys, by their last part (sweep tags name keys by their shortest distinct suffix).
TYING = {k.rsplit(".", 1)[-1] for k in (*STORED_KEYS, "model.untie_at")}
UNTIED = "untied"  # compare --config's reference tag
FIX = "give the runs folder of a tuned sweep or a tuned compare --config (it holds the tuning.json tiedlm wrote)"


class Refused(ValueError):
    """A record this script cannot read: the message says what is wrong and what to give instead."""


class Table:
    """The rows of a record, and how they were read (a plain class: the script is also loaded as a
    module that is not in sys.modules, which dataclasses need)."""

    def __init__(self, keys: list[str], inner: str | None, other: str | None, held: Any, config: dict,
                 seeds: list) -> None:
        self.keys = keys  # the tuned axes
        self.inner = inner  # with two plain axes: the one each variant is best at along a line (train.lr)
        self.other = other  # and the one held at the config's value
        self.held = held  # the config's value of `other`
        self.config = config  # the config's value of each tuned key
        self.seeds = seeds
        self.rows: list[dict] = []


def _best(points: list[dict], other: str, held) -> dict | None:
    """The point with the lowest validation loss among those with other == held."""
    line = [p for p in points if p["point"].get(other) == held and _loss(p) is not None]
    return min(line, key=_loss) if line else None


def _at(points: list[dict], values: dict) -> dict | None:
    """The point at the config's value of every tuned key (by value: 0 is 0.0), if it was tried."""
    return next((p for p in points if values and all(p["point"].get(k) == x for k, x in values.items())), None)


def _loss(p: dict | None) -> float | None:
    x = p.get("validation_loss") if isinstance(p, dict) else None
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _effect(a: dict | None, b: dict | None) -> float | None:
    la, lb = _loss(a), _loss(b)
    return None if la is None or lb is None else math.expm1(la - lb)


def _value(x) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    return f"{x:g}" if isinstance(x, float) else str(x)


def _order(x) -> tuple:
    """Numbers in numeric order, anything else after them as text."""
    return (0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x))


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


# A sweep's tag is its grid point, "short=value" parts joined by "-" (values may hold "-": 1e-05).
_PART = re.compile(r"-(?=[A-Za-z_][A-Za-z0-9_.]*=)")


def side(tag: str) -> tuple[str, str, bool | None]:
    """(the cell, the tie, whether it is the untied reference; None when the tag names no tie) of a
    variant's tag: compare --config's (tied, untied, projection, lowrank-r8, soft-l0.1, tied-matched)
    or a sweep's grid point (n_embd=64-tie_embeddings=true, vocab_size=128-tie_mode=untied)."""
    if "=" not in tag:  # compare --config: one cell, the tag is the tie
        return "", tag, tag == UNTIED
    parts = [p.partition("=") for p in _PART.split(tag)]
    tie = {_short(k): v for k, _, v in parts if _short(k) in TYING}
    cell = ", ".join(f"{k}={v}" for k, _, v in parts if _short(k) not in TYING)
    if not tie:
        return cell, "", None
    mode = tie.get("tie_mode", "null")
    untied = mode == UNTIED or (mode == "null" and tie.get("tie_embeddings") == "false")
    return cell, ", ".join(f"{k}={v}" for k, v in tie.items()), untied


def _variants(tuning: dict) -> list[dict]:
    variants = tuning.get("variants")
    if not isinstance(variants, list) or not variants:
        raise Refused("holds no tuned variants (tuning.variants)")
    for v in variants:
        points = v.get("points") if isinstance(v, dict) else None
        if (not isinstance(v.get("variant") if isinstance(v, dict) else None, str) or not isinstance(points, list)
                or not all(isinstance(p, dict) and isinstance(p.get("point"), dict) for p in points)
                or not (v.get("chosen") is None or isinstance(v["chosen"], dict))):
            raise Refused("has a variant without its tag, points or choice (tuning.variants)")
    return variants


def _axes(tuning: dict, variants: list[dict]) -> tuple[list[str], bool]:
    """(the tuned axes, whether any is a paired schedule) from the spec, else the tuned keys."""
    axes = (tuning.get("spec") or {}).get("axes") if isinstance(tuning.get("spec"), dict) else None
    if isinstance(axes, dict) and axes:
        return list(axes), any(isinstance(x, dict) for vals in axes.values() if isinstance(vals, list) for x in vals)
    keys = tuning.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        keys = list(dict.fromkeys(k for v in variants for p in v["points"] for k in p["point"]))
    if not keys:
        raise Refused("names no tuned key (tuning.keys)")
    return keys, False


def table(record: Any) -> Table:
    """Each pair (a tied variant and its cell's untied twin) of a tuning record (tuning.json): a
    Refused when the record is not one or has no such pair."""
    if not isinstance(record, dict):
        kind = {list: "a JSON list", str: "a JSON string", type(None): "JSON null"}.get(type(record), "a JSON number")
        raise Refused(f"holds {kind}, not a tuning record")
    if record.get("format", 1) != 1:
        raise Refused(f"is a tuning record of format {record.get('format')!r}, and this script reads format 1")
    tuning = record.get("tuning")
    if not isinstance(tuning, dict):
        raise Refused("is not a tuning record (it has no tuning)")
    variants = _variants(tuning)
    keys, paired = _axes(tuning, variants)
    config = tuning.get("config") if isinstance(tuning.get("config"), dict) else {}
    seeds = tuning.get("seeds") if isinstance(tuning.get("seeds"), list) else []
    inner = other = None
    if len(keys) == 2 and not paired:  # the decomposition: lr (or the first axis) along each line of the other
        inner = LR if LR in keys else keys[0]
        other = next(k for k in keys if k != inner)
    tried = {k for v in variants for p in v["points"] for k in p["point"]}  # a paired axis' keys too
    out = Table(keys, inner, other, config.get(other) if other else None,
                {k: x for k, x in config.items() if k in tried}, seeds)
    cells: dict[str, list[tuple[str, dict]]] = {}
    untied: dict[str, list[dict]] = {}
    for v in variants:
        cell, tie, is_untied = side(v["variant"])
        if is_untied:
            untied.setdefault(cell, []).append(v)
        elif is_untied is False:
            cells.setdefault(cell, []).append((tie, v))
    for cell, members in cells.items():
        if len(untied.get(cell, [])) != 1:  # no twin, or no one twin: as compare's grid, no contrast
            continue
        ref = untied[cell][0]
        for tie, v in members:
            out.rows.append(_row(out, cell or "-", tie, v, ref))
    if not out.rows:
        tags = ", ".join(v["variant"] for v in variants[:4]) + (", …" if len(variants) > 4 else "")
        raise Refused(f"has no tied variant with an untied twin in its cell (variants: {tags}) — tune a grid with "
                      "model.tie_embeddings: [true, false] (or a model.tie_mode beside untied), or compare --config")
    return out


def _row(t: Table, cell: str, tie: str, tied: dict, untied: dict) -> dict:
    row = {"cell": cell, "variant": tie, "at": {}}
    chosen = (tied.get("chosen"), untied.get("chosen"))
    row["joint"] = _effect(*chosen)
    row["joint_points"] = tuple(c.get("label") if c else None for c in chosen)
    if t.other is not None:
        values = []  # the other key's values besides the held one (by value: 0 is 0.0), each a column
        for x in (p["point"].get(t.other) for v in (tied, untied) for p in v["points"]):
            if isinstance(x, (int, float, str)) and x != t.held and x not in values:
                values.append(x)
        for x in sorted(values, key=_order):
            row["at"][x] = _effect(_best(tied["points"], t.other, x), _best(untied["points"], t.other, x))
        first = (_best(tied["points"], t.other, t.held), _best(untied["points"], t.other, t.held))
    else:  # both at the config's own point
        first = (_at(tied["points"], t.config), _at(untied["points"], t.config))
    row["held"] = _effect(*first)
    row["held_points"] = tuple(p.get("label") if p else None for p in first)
    return row


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.2f}%".replace("-", "−")


def print_table(t: Table) -> None:
    extra = sorted({x for r in t.rows for x in r["at"]}, key=_order)
    if t.other is not None:
        first = f"effect, best {_short(t.inner)} at {t.other} {_value(t.held)}"
    else:
        at = ", ".join(f"{k} {_value(x)}" for k, x in t.config.items()) or "its own values"
        first = f"effect, config's point ({at})"
    print(f"| cell | variant | variant's choice | untied choice | {first} | "
          + "".join(f"at {_value(x)} | " for x in extra) + "effect, joint best | moved by |")
    print("| --- | --- | --- | --- | ---: | " + "---: | " * len(extra) + "---: | ---: |")
    for r in t.rows:
        moved = None if r["held"] is None or r["joint"] is None else r["joint"] - r["held"]
        moved_text = "—" if moved is None else f"{100 * moved:+.2f} points".replace("-", "−")
        choice = [x if x is not None else "none" for x in r["joint_points"]]
        print(f"| {r['cell']} | {r['variant']} | {choice[0]} | {choice[1]} | {_pct(r['held'])} | "
              + "".join(f"{_pct(r['at'].get(x))} | " for x in extra) + f"{_pct(r['joint'])} | {moved_text} |")
    seeds = f" {', '.join(map(str, t.seeds))}" if t.seeds else "s"
    print(f"\nvalidation, tuning seed{'s' * (len(t.seeds) > 1)}{seeds} only ({', '.join(t.keys)} tuned): "
          "point estimates without intervals")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a tuned sweep's (or tuned compare --config's) runs folder, which "
                                              "holds tuning.json; or that file")
    args = ap.parse_args(argv)
    path = args.folder if args.folder.is_file() else args.folder / RECORD
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # missing, unreadable, not UTF-8 (a ValueError), not JSON
        print(f"map_tuning: cannot read {path} ({type(e).__name__}) — {FIX}", file=sys.stderr)
        return 2
    try:
        t = table(record)
    except Refused as e:
        print(f"map_tuning: {path} {e}" + ("" if " — " in str(e) else f" — {FIX}"), file=sys.stderr)
        return 2
    print_table(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
