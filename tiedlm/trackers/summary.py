"""A comparison as its summary run holds it, read from comparison.json's form (Comparison.to_json):
the verdict table (a row per variant: seeds, the primary split's perplexity and interval, the
effect against its reference with its interval and p-value, parameters), the verdict sentences,
the interval's definition, the tuning table (a row per point each variant tried) and the figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import ComparisonSummary


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def verdict_rows(data: dict) -> list[dict]:
    primary = data.get("primary") or "validation"
    rows = []
    for v in data.get("variants") or []:
        ppl = ((v.get("metrics") or {}).get(primary) or {}).get("perplexity") or {}
        vs = (v.get("vs_baseline") or {})
        effect = vs.get(primary) or {}
        rows.append({"variant": v.get("label"), "seeds": v.get("n_seeds"), f"{primary} perplexity": ppl.get("mean"),
                     "ci low": ppl.get("ci_low"), "ci high": ppl.get("ci_high"), "against": vs.get("baseline"),
                     "effect": effect.get("relative"), "effect ci low": effect.get("relative_ci_low"),
                     "effect ci high": effect.get("relative_ci_high"), "p": effect.get("p_value"),
                     "significant": effect.get("significant"), "params": (v.get("params") or {}).get("total")})
    return rows


def tuning_rows(data: dict) -> list[dict]:
    tuning = data.get("tuning") or {}
    rows = []
    for v in tuning.get("variants") or []:
        chosen = (v.get("chosen") or {}).get("label")
        for p in v.get("points") or []:
            rows.append({"variant": v.get("variant"), **{k: str(x) for k, x in (p.get("point") or {}).items()},
                         "validation loss": p.get("validation_loss"),
                         "validation perplexity": p.get("validation_perplexity"),
                         "chosen": p.get("label") == chosen})
    return rows


def primary_scalars(rows: list[dict]) -> dict[str, float]:
    """Each variant's effect, its interval and p-value as metrics (effect/<variant>, ...)."""
    out = {}
    for row in rows:
        for key, name in (("effect", "effect"), ("effect ci low", "effect_ci_low"),
                          ("effect ci high", "effect_ci_high"), ("p", "p_value")):
            if _number(row.get(key)) is not None and row.get("variant"):
                out[f"{name}/{row['variant']}"] = float(row[key])
    return out


def comparison_summary(data: dict, files: dict[str, str], group: str) -> ComparisonSummary:
    folder = Path(data.get("out") or ".")
    rows = verdict_rows(data)
    figures = [Path(p) for k, p in sorted(files.items()) if str(p).endswith(".png") and Path(p).is_file()]
    md = Path(files["markdown"]) if files.get("markdown") and Path(files["markdown"]).is_file() else None
    name = f"{group}-compare" if folder.name == "compare" else folder.name  # compare/, the folder of earlier versions: by group
    return ComparisonSummary(name=name, group=group, folder=folder, table=rows,
                             verdicts=[str(s) for s in data.get("verdicts") or []],
                             interval=str(data.get("interval") or ""), tuning=tuning_rows(data), figures=figures,
                             markdown=md, scalars=primary_scalars(rows))
