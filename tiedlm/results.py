"""`tiedlm.load_results(path)`: runs or a comparison as a pandas DataFrame, one row per run, for
a user's own notebooks and plots. pandas is optional (`pip install 'tiedlm[pandas]'`) and imported
only here, when called.

`path` is a comparison (its folder or comparison.json): its runs as it compared them (the weights
it chose), with the keys its tuning tuned; or a run folder, or a folder of runs (every folder in
it with a report.json), as each report holds them, with the config keys whose values differ
between the runs as the tuned keys. The columns: run, variant, seed, config_hash, each tuned key
(by its dotted name), params_total (and the breakdown for runs), then `<split>_loss`,
`<split>_perplexity` and `<split>_bits_per_byte` for every split scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import runs
from .errors import ConfigError, NotARunError
from .config.identity import flat

if TYPE_CHECKING:
    import pandas

COMPARISON = "comparison.json"  # compare/report.py's FILES["json"]
METRICS = ("loss", "perplexity", "bits_per_byte")
SPLITS = ("train", "validation", "test")


def load_results(path: str | Path) -> pandas.DataFrame:
    """Runs, or a comparison, as a DataFrame with one row per run (see the module's docstring)."""
    try:
        import pandas
    except ImportError:
        raise ConfigError("tiedlm.load_results needs pandas — pip install 'tiedlm[pandas]'") from None
    path = Path(path)
    if path.is_file() and path.name == COMPARISON or (path / COMPARISON).is_file():
        rows = comparison_rows(path if path.is_file() else path / COMPARISON)
    else:
        rows = run_rows(run_folders(path))
    return pandas.DataFrame(rows)


def comparison_rows(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise NotARunError(f"{path} cannot be read as a comparison ({exc}) — give a folder tiedlm compare wrote") from None
    keys = list((data.get("tuning") or {}).get("keys") or [])
    configs = {v.get("label"): v.get("config") or {} for v in data.get("variants") or []}
    rows = []
    for r in data.get("runs") or []:
        config = configs.get(r.get("variant"), {})
        row = {"run": r.get("name"), "variant": r.get("variant"), "seed": r.get("seed"),
               "config_hash": r.get("config_hash")}
        row.update({key: _dotted(config, key) for key in keys})
        row["params_total"] = r.get("params_total")
        row.update({f"{s}_{m}": r.get(f"{s}_{m}") for s in SPLITS for m in METRICS if r.get(f"{s}_{m}") is not None})
        rows.append(row)
    return rows


def _dotted(config: dict, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def run_folders(path: Path) -> list[Path]:
    """A run folder, or the run folders (with a report.json) directly inside a folder."""
    if (path / runs.REPORT).is_file():
        return [path]
    found = sorted(p for p in path.iterdir() if (p / runs.REPORT).is_file()) if path.is_dir() else []
    if not found:
        raise NotARunError(f"{path} is neither a comparison, a run nor a folder of runs (no {COMPARISON} or "
                           f"{runs.REPORT}) — give a run folder, a folder of runs or a comparison's folder")
    return found


def run_rows(folders: list[Path]) -> list[dict[str, Any]]:
    reports = [(d, runs.read_report(d)) for d in folders]
    flats = [flat(r.config, variant=True) if r.config is not None else {} for _, r in reports]
    keys = sorted({k for f in flats for k in f if len({json.dumps(g.get(k), default=str) for g in flats}) > 1})
    rows = []
    for (folder, report), values in zip(reports, flats):
        cfg = report.config
        row = {"run": folder.name, "variant": cfg.model.tie.label if cfg is not None else None, "seed": report.seed,
               "config_hash": report.config_hash, "status": report.status}
        row.update({key: values.get(key) for key in keys})
        row.update({f"params_{k}": v for k, v in (report.params or {}).items() if isinstance(v, int)
                    and not isinstance(v, bool)})
        for split, result in (report.final or {}).items():
            row.update({f"{split}_{m}": result.get(m) for m in METRICS if isinstance(result, dict)})
        row.update(steps=report.steps, tokens_seen=report.tokens_seen, tokens_per_s=report.tokens_per_s)
        rows.append(row)
    return rows
