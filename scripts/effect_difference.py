"""Does the tying effect differ between two comparisons (two blocks, corpora or scales)?

    python scripts/effect_difference.py runs/compare-shakespeare/comparison.json \
        runs/compare-shakespeare-llama/comparison.json \
        --name-a gpt2 --name-b llama [--split test] [--variant tied] [--reference untied] [--json out.json]

Welch's t-test on the two comparisons' per-seed loss differences (tiedlm/compare/effect_difference.py). The
test takes the two comparisons as independent: two given the same file, the same contents or any
of the same runs are refused, not tested. A runs folder or its compare/ folder stands for the
comparison.json in it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiedlm.compare.effect_difference import describe, effect_difference  # noqa: E402
from tiedlm.files import json_text, os_error_line  # noqa: E402

NAME = "comparison.json"
FIX = "give the comparison.json that tiedlm compare wrote (OUT/compare-NAME/comparison.json)"


class Refused(ValueError):
    """An input this script cannot use, or two that are not two comparisons: one line, exit 2."""


def comparison_path(path: Path) -> Path:
    """The comparison.json a path stands for: the file itself, the one in a comparison's folder, or
    a runs folder's one comparison (compare-NAME/comparison.json, or compare/ as it was before)."""
    if not path.is_dir():
        return path
    if (path / NAME).is_file():
        return path / NAME
    found = sorted(p for p in path.glob(f"compare*/{NAME}") if p.is_file())
    if not found:
        raise Refused(f"{path} is a folder without a {NAME} (nor compare-NAME/{NAME}) — {FIX}")
    if len(found) > 1:
        names = ", ".join(str(p.parent) for p in found[:3]) + (", …" if len(found) > 3 else "")
        raise Refused(f"{path} holds {len(found)} comparisons ({names}) — give the one you mean")
    return found[0]


def read_comparison(path: Path) -> dict:
    """The comparison in path, checked for the shape compare/effect_difference.py reads: a Refused otherwise (an
    OSError for a file that cannot be read at all)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"{path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}), so not a "
                      f"comparison — {FIX}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise Refused(f"{path} is not JSON ({getattr(exc, 'msg', exc)}, line {getattr(exc, 'lineno', '?')}) — "
                      f"{FIX}") from None
    if not isinstance(data, dict):
        kind = {list: "a JSON list", str: "a JSON string", type(None): "JSON null"}.get(type(data), "a JSON number")
        raise Refused(f"{path} holds {kind}, not a comparison — {FIX}")
    variants, runs = data.get("variants"), data.get("runs")
    if not isinstance(variants, list) or not isinstance(runs, list):
        raise Refused(f"{path} is not a comparison (it has no list of variants and runs) — {FIX}")
    if not all(isinstance(v, dict) and isinstance(v.get("runs", []), list) for v in variants) \
            or not all(isinstance(r, dict) for r in runs):
        raise Refused(f"{path} has a variant or run that is not an object with its fields — {FIX}")
    listed = {name for v in variants for name in v.get("runs", []) if isinstance(name, str)}
    unseeded = [r.get("name") for r in runs if r.get("name") in listed
                and (not isinstance(r.get("seed"), int) or isinstance(r.get("seed"), bool))]
    if unseeded:
        raise Refused(f"{path}: run {unseeded[0]} has no whole-number seed, and each seed pairs the variant's run with "
                      f"the reference's — {FIX}")
    return data


def _runs(comparison: dict, labels: tuple[str, str], split: str) -> dict:
    """{identity: run name} of the runs the two variants hold: by path where it is absolute (a
    relative one is relative to where compare ran), and by name, seed and loss together (a copied
    comparison's runs keep these; another corpus' run of the same name has another loss)."""
    names = {n for v in comparison["variants"] if v.get("label") in labels for n in v.get("runs", [])}
    out = {}
    for r in comparison["runs"]:
        if r.get("name") not in names:
            continue
        if isinstance(r.get("path"), str) and Path(r["path"]).is_absolute():
            out[("path", str(Path(r["path"]).resolve()))] = r["name"]
        loss = r.get(f"{split}_loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            out[("run", r["name"], r.get("seed"), float(loss))] = r["name"]
    return out


def same_comparison(pa: Path, pb: Path, a: dict, b: dict, labels: tuple[str, str], split: str) -> str | None:
    """Why a and b are not two comparisons (the same file, the same contents, runs in common), or
    None. Welch's test takes them as independent; one set of runs given twice would be tested as two."""
    fix = ("and Welch's test would take one set of runs as two independent ones — give two comparisons trained "
           "apart (two blocks, corpora or scales)")
    if pa.resolve() == pb.resolve():
        return f"{pa} and {pb} are the same comparison (one file), {fix}"
    if a == b:
        return f"{pa} and {pb} are the same comparison (the same contents), {fix}"
    ra, rb = _runs(a, labels, split), _runs(b, labels, split)
    common = ra.keys() & rb.keys()
    if not common:
        return None
    shared = sorted({ra[k] for k in common})
    every = shared == sorted(set(ra.values())) and {rb[k] for k in common} == set(rb.values())
    which = "the same runs" if every else f"{len(shared)} of the same runs"
    more = ", …" if len(shared) > 3 else ""
    return f"{pa} and {pb} compare {which} ({', '.join(shared[:3])}{more}), {fix}"


def check_json_target(path: Path, inputs: list[Path]) -> None:
    """--json must name a file that can be written in a folder that exists, and not an input."""
    if path.is_dir():
        raise Refused(f"--json {path} is a folder — give a file name, such as {path / 'effect_difference.json'}")
    if not path.parent.is_dir():
        raise Refused(f"--json {path}: the folder {path.parent} does not exist — create it, or give a file in a "
                      "folder that exists")
    if any(path.resolve() == p.resolve() for p in inputs):
        raise Refused(f"--json {path} is one of the comparisons compared — give another file name")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--name-a", default="a")
    ap.add_argument("--name-b", default="b")
    ap.add_argument("--split", default="test")
    ap.add_argument("--variant", default="tied")
    ap.add_argument("--reference", default="untied")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        pa, pb = comparison_path(args.a), comparison_path(args.b)
        if args.json:
            check_json_target(args.json, [pa, pb])
        a, b = read_comparison(pa), read_comparison(pb)
        same = same_comparison(pa, pb, a, b, (args.variant, args.reference), args.split)
        if same:
            raise Refused(same)
        result = effect_difference(a, b, args.variant, args.reference, args.split)
    except OSError as exc:  # a missing or unreadable file: tiedlm's own line for it
        print(f"effect_difference: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:  # Refused and NotComparable (a missing variant, seed or split)
        print(f"effect_difference: {exc}", file=sys.stderr)
        return 2
    print(describe(result, args.name_a, args.name_b))
    if args.json:
        try:
            args.json.write_text(json_text(result.to_json()))
        except OSError as exc:
            print(f"effect_difference: {os_error_line(exc)}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
