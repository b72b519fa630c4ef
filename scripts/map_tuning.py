"""What tuning the second key did to each cell of a tuned map: `python scripts/map_tuning.py FOLDER`.

A tuned sweep over tying (model.tie_embeddings true/false) tuned on train.lr and one other key
(model.dropout, train.weight_decay) leaves FOLDER/tuning.json. For each cell (a tied grid point
and its untied twin) this prints each variant's choice and the tied/untied effect on validation,
read from the tuning runs, at two points: each variant at its best lr with the other key held at
the config's value, at each other value of the key (each variant at its best lr there), and each at
its joint best. The difference between the first and the last is what tuning the other key did to
the cell. Readings are on validation (the split that chose them) on the tuning seeds only:
point estimates, no interval; the map's verdict, on test with its interval, is at the joint best.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

LR = "train.lr"
TIED, UNTIED = "tie_embeddings=true", "tie_embeddings=false"


def _best(points: list[dict], other: str, held) -> dict | None:
    """The point with the lowest validation loss among those with other == held."""
    line = [p for p in points if p["point"].get(other) == held and p.get("validation_loss") is not None]
    return min(line, key=lambda p: p["validation_loss"]) if line else None


def _value(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def cells(record: dict) -> tuple[str, object, list[dict]]:
    """(the other key, its held value, one row per cell) from a tuning record (tuning.json)."""
    tuning = record["tuning"]
    keys = [k for k in tuning["keys"] if k != LR]
    if LR not in tuning["keys"] or len(keys) != 1:
        raise SystemExit(f"map_tuning: the record tunes {', '.join(tuning['keys'])}: it needs train.lr and one other key")
    other = keys[0]
    held = tuning.get("config", {}).get(other)
    by_tag = {v["variant"]: v for v in tuning["variants"]}
    rows = []
    for tag, tied in by_tag.items():
        if TIED not in tag or tag.replace(TIED, UNTIED) not in by_tag:
            continue
        untied = by_tag[tag.replace(TIED, UNTIED)]
        row = {"cell": tag.replace(f"-{TIED}", "").replace(TIED, "") or "-"}
        values = sorted({p["point"].get(other) for v in (tied, untied) for p in v["points"]} - {held, None})
        row["at"] = {}
        for x in values:  # the effect with both variants at their best lr at each other value of the key
            a, b = _best(tied["points"], other, x), _best(untied["points"], other, x)
            row["at"][x] = math.expm1(a["validation_loss"] - b["validation_loss"]) if a and b else None
        for name, pick in (("held", lambda v: _best(v["points"], other, held)), ("joint", lambda v: v.get("chosen"))):
            a, b = pick(tied), pick(untied)
            ok = a is not None and b is not None and a.get("validation_loss") is not None \
                and b.get("validation_loss") is not None
            row[name] = math.expm1(a["validation_loss"] - b["validation_loss"]) if ok else None
            row[f"{name}_points"] = (a["label"] if a else None, b["label"] if b else None)
        rows.append(row)
    return other, held, rows


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.2f}%".replace("-", "−")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a tuned sweep's runs folder (it holds tuning.json)")
    args = ap.parse_args(argv)
    path = args.folder / "tuning.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"map_tuning: cannot read {path} ({type(e).__name__}) — give the runs folder of a tuned sweep",
              file=sys.stderr)
        return 2
    other, held, rows = cells(record)
    extra = sorted({x for r in rows for x in r["at"]})
    print(f"| cell | tied choice | untied choice | effect, best lr at {other} {_value(held)} | "
          + "".join(f"at {_value(x)} | " for x in extra) + "effect, joint best | moved by |")
    print("| --- | --- | --- | ---: | " + "---: | " * len(extra) + "---: | ---: |")
    for r in rows:
        moved = None if r["held"] is None or r["joint"] is None else r["joint"] - r["held"]
        moved_text = "—" if moved is None else f"{100 * moved:+.2f} points".replace("-", "−")
        print(f"| {r['cell']} | {r['joint_points'][0]} | {r['joint_points'][1]} | {_pct(r['held'])} | "
              + "".join(f"{_pct(r['at'].get(x))} | " for x in extra) + f"{_pct(r['joint'])} | {moved_text} |")
    print(f"\nvalidation, tuning seed{'s' * (len(record['tuning']['seeds']) != 1)} "
          f"{', '.join(map(str, record['tuning']['seeds']))} only: point estimates without intervals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
