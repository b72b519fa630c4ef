"""Does the tying effect differ between two comparisons (two blocks, corpora or scales)?

    python scripts/effect_difference.py runs/compare/comparison.json runs/llama/compare/comparison.json \
        --name-a gpt2 --name-b llama [--split test] [--variant tied] [--reference untied] [--json out.json]

Welch's t-test on the two comparisons' per-seed loss differences (tiedlm/compare/between.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiedlm.compare.between import describe, effect_difference  # noqa: E402
from tiedlm.files import json_text, os_error_line  # noqa: E402


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
        a, b = (json.loads(p.read_text()) for p in (args.a, args.b))
        result = effect_difference(a, b, args.variant, args.reference, args.split)
    except OSError as exc:  # a missing or unreadable file: tiedlm's own line for it
        print(f"effect_difference: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:  # NotComparable is a ValueError, as is a bad JSON file
        print(f"effect_difference: {exc}", file=sys.stderr)
        return 2
    print(describe(result, args.name_a, args.name_b))
    if args.json:
        args.json.write_text(json_text(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
