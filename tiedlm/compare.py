"""Compare finished runs: group them into variants, aggregate seeds, test the differences.

A *variant* is a resolved config apart from its seed, name and operational keys (runs with the same `config_hash`).
Each variant is labelled by the keys in which its config differs from the other variants
(`tied`/`untied` for model.tie_embeddings, `n_embd=128` for the rest).

Only runs trained and evaluated on the same tokens are contrasted (see data_groups: report.json's
data_identity, else the config's data and tokenizer sections). Runs from several data sets are
refused with a line saying how the data differ, unless --baseline picks one: then the variants
on the baseline's data are compared and the others listed as not compared, with the reason.

Statistics, all over seeds (the unit of replication):
- mean ± sample standard deviation (n - 1 in the denominator) of the final metric;
- a 95% Student-t confidence interval for the *mean* over seeds: mean ± t(0.975, n-1)·sd/√n;
- against the baseline, the difference of mean perplexities (variant − baseline) with a
  confidence interval and a two-sided p-value: a paired t-test on the per-seed differences when
  both variants have the same seeds (same seed = same data order, so pairing removes that noise),
  Welch's t-test with Welch–Satterthwaite degrees of freedom otherwise.
The t distribution is implemented here (regularised incomplete beta by continued fraction) so
that tiedlm needs no scipy; tests/test_compare.py checks it against scipy.stats.

Outputs (written atomically): comparison.md, comparison.csv, comparison.json and three PNG plots.
matplotlib is imported inside the plotting functions so that `tiedlm --help` stays instant.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import hashlib
import io
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from .errors import ConfigError, RunError, TiedlmError

LEVEL = 0.95  # confidence level of every interval
ALPHA = 0.05  # significance level of the verdicts
SPLITS = ("validation", "test")
TIE_KEY = "model.tie_embeddings"
COMPARE_DIR = "compare"
PLOTS = {
    "curve": "perplexity_vs_tokens.png",
    "params": "perplexity_vs_params.png",
    "buckets": "bucket_loss.png",
}


# ============================================================================ the t distribution


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))  # even step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))  # odd step
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # the continued fraction converges fast for x < (a+1)/(a+b+2); use the symmetry otherwise
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom (df may be fractional, as Welch's is)."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    # P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2): precise in the tails, where p-values live
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    return t_sf(-t, df)


def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on t_sf, to float precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf needs 0 < p < 1, got {p}")
    if p == 0.5:
        return 0.0
    q = 1.0 - p if p > 0.5 else p  # the upper-tail probability of |quantile|
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > q:  # bracket the root
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            break
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if t_sf(mid, df) > q:
            lo = mid
        else:
            hi = mid
    x = 0.5 * (lo + hi)
    return x if p > 0.5 else -x


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of a t statistic."""
    return min(1.0, 2.0 * t_sf(abs(t), df))


# ============================================================================ summaries and tests


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def summarize(values: Iterable[Any], level: float = LEVEL) -> dict:
    """Mean, sample SD and a Student-t interval for the mean. Missing numbers are None (JSON-safe)."""
    xs = _finite(values)
    n = len(xs)
    out: dict[str, Any] = {"n": n, "mean": None, "sd": None, "ci_low": None, "ci_high": None,
                           "level": level, "min": None, "max": None, "values": xs, "note": None}
    if n == 0:
        out["note"] = "no values"
        return out
    mean = sum(xs) / n
    out.update(mean=mean, min=min(xs), max=max(xs))
    if n == 1:
        out["note"] = "one seed: no standard deviation or interval can be given"
        return out
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    out.update(sd=sd, ci_low=mean - half, ci_high=mean + half)
    return out


def _test_result(kind: str, diff: float, se: float, df: float, level: float, **extra: Any) -> dict:
    out = {"test": kind, "difference": diff, "se": None, "df": None, "t": None, "p_value": None,
           "ci_low": None, "ci_high": None, "level": level, "note": None, **extra}
    if se == 0.0 or not math.isfinite(se):
        out["note"] = ("no spread between seeds: the difference is the same for every seed, so no "
                       "interval or p-value can be computed")
        return out
    t = diff / se
    half = t_ppf(0.5 + level / 2.0, df) * se
    out.update(se=se, df=df, t=t, p_value=t_two_sided_p(t, df), ci_low=diff - half, ci_high=diff + half)
    return out


def paired_test(a: list[float], b: list[float], level: float = LEVEL) -> dict:
    """Paired t-test of mean(a - b) = 0, with a Student-t interval for mean(a - b)."""
    if len(a) != len(b):
        raise ValueError("paired_test needs two lists of equal length")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n if n else float("nan")
    if n < 2:
        return {"test": "paired", "difference": mean if n else None, "n": n, "se": None, "df": None,
                "t": None, "p_value": None, "ci_low": None, "ci_high": None, "level": level,
                "note": "one seed: no interval or p-value can be given; run more seeds"}
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    return _test_result("paired", mean, sd / math.sqrt(n), n - 1, level, n=n)


def welch_test(a: list[float], b: list[float], level: float = LEVEL) -> dict:
    """Welch's t-test of mean(a) = mean(b), Welch–Satterthwaite degrees of freedom."""
    na, nb = len(a), len(b)
    ma = sum(a) / na if na else float("nan")
    mb = sum(b) / nb if nb else float("nan")
    diff = ma - mb
    if na < 2 or nb < 2:
        return {"test": "welch", "difference": diff if na and nb else None, "n_a": na, "n_b": nb,
                "se": None, "df": None, "t": None, "p_value": None, "ci_low": None, "ci_high": None,
                "level": level,
                "note": "one seed on at least one side: no interval or p-value can be given; run more seeds"}
    va = sum((x - ma) ** 2 for x in a) / (na - 1) / na  # squared standard errors
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1)) if se > 0 else float("nan")
    return _test_result("welch", diff, se, df, level, n_a=na, n_b=nb)


def compare_by_seed(a: dict[int, float], b: dict[int, float], level: float = LEVEL) -> dict:
    """Difference of means a − b: paired by seed when both have the same seeds, Welch otherwise."""
    a = {s: v for s, v in a.items() if _finite([v])}
    b = {s: v for s, v in b.items() if _finite([v])}
    if not a or not b:
        return {"test": None, "difference": None, "p_value": None, "ci_low": None, "ci_high": None,
                "level": level, "note": "missing on one side"}
    if set(a) == set(b):
        seeds = sorted(a)
        out = paired_test([a[s] for s in seeds], [b[s] for s in seeds], level)
    else:
        out = welch_test(list(a.values()), list(b.values()), level)
    out["seeds_a"], out["seeds_b"] = sorted(a), sorted(b)
    return out


# ============================================================================ reading run folders


def _reason_from_report(report: dict) -> str:
    status = report.get("status")
    error = report.get("error")
    text = f"status {status}" if status else "report.json has no status"
    if error:
        text += f": {str(error).strip().splitlines()[0][:200]}"
    hint = {"running": " (still training, or killed: run the same train command again to resume)",
            "interrupted": " (run the same train command again to resume)",
            "diverged": " (training loss became non-finite; lower train.lr or raise warmup_steps)"}
    return text + hint.get(str(status), "")


def _number(value: Any) -> float | None:
    return float(value) if _finite([value]) else None


def _read_curve(run_dir: Path) -> tuple[list[tuple[float, float]], list[str]]:
    """Validation (tokens, perplexity) points from metrics.jsonl, and notes on unreadable lines."""
    from .runs import METRICS

    path = run_dir / METRICS
    if not path.exists():
        return [], [f"{run_dir.name}: no {METRICS}, so no learning curve"]
    points: list[tuple[float, float]] = []
    bad = 0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [], [f"{run_dir.name}: cannot read {METRICS} ({exc}), so no learning curve"]
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        if rec.get("kind") == "eval" and rec.get("split", "validation") == "validation":
            tokens, ppl = _number(rec.get("tokens")), _number(rec.get("perplexity"))
            if ppl is None and _number(rec.get("loss")) is not None:
                ppl = math.exp(min(rec["loss"], 700.0))
            if tokens is not None and ppl is not None:
                points.append((tokens, ppl))
    notes = [f"{run_dir.name}: skipped {bad} unreadable line{'s' if bad != 1 else ''} of {METRICS}"] if bad else []
    return sorted(points), notes


def _hash_of(config: dict) -> str:
    from .config import config_hash, from_dict

    return config_hash(from_dict(config))


def load_run(run_dir: Path) -> tuple[dict | None, str | None]:
    """(run, None) for a finished, readable run; (None, reason) for one to leave out."""
    from .runs import CONFIG, REPORT, read_config, read_report

    run_dir = Path(run_dir)
    if not run_dir.exists():
        return None, "does not exist"
    if not run_dir.is_dir():
        return None, "is not a folder"
    try:
        report = read_report(run_dir)
    except TiedlmError as exc:
        return None, f"unreadable {REPORT}: {exc}"
    except OSError as exc:
        return None, f"cannot read {REPORT}: {exc}"
    if report is None:
        if (run_dir / CONFIG).exists():
            return None, f"no {REPORT} yet (training has not finished its first report, or crashed early)"
        return None, f"not a run folder (no {REPORT} or {CONFIG})"
    if report.get("status") != "finished":
        return None, _reason_from_report(report)
    config = report.get("config")
    if not isinstance(config, dict):
        try:
            config = read_config(run_dir)
        except TiedlmError as exc:
            return None, f"unreadable {CONFIG}: {exc}"
        if config is None:
            return None, f"no config in {REPORT} and no {CONFIG}"
    if not isinstance(config.get("model"), dict):
        return None, f"the config in {REPORT} has no model section"
    final = report.get("final")
    final = {k: v for k, v in final.items() if isinstance(v, dict)} if isinstance(final, dict) else {}
    if not final:
        return None, f"{REPORT} has no final evaluation (final.validation / final.test)"
    for section in final.values():  # tolerate hand-edited reports: buckets must be a list of dicts
        if not isinstance(section.get("buckets"), list):
            section["buckets"] = []
    report["final"] = final
    if not isinstance(report.get("params"), dict):
        report["params"] = {}
    # recompute the hash from the stored config, so that runs written before a config field
    # existed (it gets its default) or a key became operational group with newer runs
    try:
        chash = _hash_of(config)
    except TiedlmError as exc:
        chash = report.get("config_hash")
        if not isinstance(chash, str) or not chash:
            return None, f"no config_hash in {REPORT} and its config does not load: {exc}"
    seed = report.get("seed", config.get("seed"))
    if not isinstance(seed, int) or isinstance(seed, bool):
        return None, f"{REPORT} has no integer seed"
    curve, notes = _read_curve(run_dir)
    run = {"name": run_dir.name, "path": str(run_dir), "seed": seed,
           "config": config, "config_hash": chash, "report": report, "curve": curve, "notes": notes,
           "data": _data_sections(config), "data_identity": _recorded_identity(report)}
    return run, None


def _has_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


def _is_run_folder(path: Path) -> bool:
    from .runs import CONFIG, REPORT

    return (path / REPORT).exists() or (path / CONFIG).exists()


def discover(paths: list[str | Path] | None, runs_dir: Path, out: Path) -> tuple[list[Path], list[dict]]:
    """Run folders to read, and entries left out before reading (paths that match nothing)."""
    found: list[Path] = []
    missing: list[dict] = []
    skip = {Path(out).resolve()}

    def children(parent: Path) -> list[Path]:
        return [c for c in sorted(parent.iterdir())
                if c.is_dir() and not c.name.startswith(".") and c.name != COMPARE_DIR
                and c.resolve() not in skip and _is_run_folder(c)]

    if not paths:
        runs_dir = Path(runs_dir)
        if not runs_dir.is_dir():
            raise RunError(f"no runs folder {runs_dir} — train runs first, e.g. "
                           "tiedlm compare --config configs/base.yaml")
        found = children(runs_dir)
    else:
        for item in paths:
            text = str(item)
            matches = sorted(Path(p) for p in glob.glob(text)) if _has_glob(text) else [Path(text)]
            matches = [m for m in matches if m.resolve() not in skip]
            if not matches:
                missing.append({"path": text, "name": Path(text).name,
                                "reason": "no run folder matches" if _has_glob(text) else "does not exist"})
            for m in matches:
                if m.is_dir() and not _is_run_folder(m) and children(m):
                    found.extend(children(m))  # a folder of runs, like runs/
                else:
                    found.append(m)
    unique, seen = [], set()
    for p in found:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique, missing


# ============================================================================ data groups
#
# Runs are contrasted only with runs trained and evaluated on the same tokens. A run's data is
# named by report.json's data_identity (written by train.py: the source fingerprint, which covers
# the splits, and the tokenizer key) plus data.max_eval_tokens (how much of each evaluation split
# is scored, which the identity leaves out). A report without data_identity (hand-made, or older
# than the field) is named by its config's data and tokenizer sections instead.

DATA_SECTIONS = ("data", "tokenizer")
EVAL_SET_KEYS = ("max_eval_tokens",)


def _data_sections(config: dict) -> dict:
    """The config's data and tokenizer sections, with defaults filled in for fields it lacks."""
    from .config import from_dict, to_dict

    try:
        full = to_dict(from_dict(config))
    except (TiedlmError, TypeError, ValueError, AttributeError):
        full = config
    sections = {s: full.get(s) if isinstance(full.get(s), dict) else {} for s in DATA_SECTIONS}
    return json.loads(json.dumps(sections, default=str))


def _recorded_identity(report: dict) -> dict | None:
    ident = report.get("data_identity")
    if not isinstance(ident, dict):
        return None
    ident = {"fingerprint": ident.get("fingerprint"), "tokenizer": ident.get("tokenizer")}
    return ident if any(v is not None for v in ident.values()) else None


def _blob(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def data_groups(runs: list[dict]) -> list[dict]:
    """The runs grouped by the data they were trained and evaluated on, in order of their first run
    name. Each group: {"runs", "data" (the data and tokenizer sections of its first run), "identity"}."""
    ordered = sorted(runs, key=lambda r: (r["name"], r["path"]))
    groups: dict[str, dict] = {}

    def add(key: str, run: dict) -> None:
        group = groups.setdefault(key, {"runs": [], "data": run["data"], "identity": run["data_identity"]})
        group["runs"].append(run)

    for run in ordered:
        if run["data_identity"] is not None:
            eval_set = {k: run["data"].get("data", {}).get(k) for k in EVAL_SET_KEYS}
            add(_blob({"identity": run["data_identity"], "eval": eval_set}), run)
    for run in ordered:  # no recorded identity: join a group whose runs have the same data config
        if run["data_identity"] is None:
            twin = next((k for k, g in groups.items() if any(r["data"] == run["data"] for r in g["runs"])), None)
            add(twin or _blob({"config": run["data"]}), run)
    out = sorted(groups.values(), key=lambda g: min((r["name"], r["path"]) for r in g["runs"]))
    for group in out:
        group["runs"].sort(key=lambda r: (r["name"], r["path"]))
    return out


def data_difference(a: dict, b: dict, sep: str = " vs ") -> str:
    """How the data of two groups differ, in config keys: 'data.synthetic.vocab_size 1000 vs 4096'
    (a's value first); or which recorded identity differs when their configs do not."""
    from .config import diff_keys, flatten

    keys = diff_keys(a["data"], b["data"])
    if keys:
        fa, fb = flatten(a["data"]), flatten(b["data"])
        return ", ".join(f"{k} {_scalar(fa.get(k))}{sep}{_scalar(fb.get(k))}" for k in keys)
    ia, ib = a["identity"] or {}, b["identity"] or {}
    if ia.get("fingerprint") != ib.get("fingerprint"):
        return "the data files changed between runs (source fingerprint differs)"
    return ("the tokenizer changed between runs (tokenizer key differs: another tokenizer file, "
            "or a tiedlm with another cache format)")


def _run_pattern(group: dict, others: list[dict]) -> str:
    """A glob that names a group's runs and no other group's (PARENT/PREFIX*), else the folders."""
    runs = group["runs"]
    parents = {str(Path(r["path"]).parent) for r in runs}
    prefix = os.path.commonprefix([r["name"] for r in runs])
    if len(runs) > 1 and len(parents) == 1 and prefix.strip("-_.="):
        foreign = [r for g in others for r in g["runs"] if Path(r["path"]).name.startswith(prefix)]
        if not foreign:
            parent = parents.pop()
            return f"{prefix}*" if parent in ("", ".") else str(Path(parent) / f"{prefix}*")
    paths = [r["path"] for r in runs]
    return " ".join(paths[:4]) + (" ..." if len(paths) > 4 else "")


def _mixed_data_message(groups: list[dict]) -> str:
    """The one-line refusal when runs on different data are given without --baseline."""
    n = sum(len(g["runs"]) for g in groups)
    patterns = [_run_pattern(g, [o for o in groups if o is not g]) for g in groups]

    def named(i: int) -> str:
        k = len(groups[i]["runs"])
        return f"data set {i + 1} ({patterns[i]}: {k} run{'s' if k != 1 else ''})"

    if len(groups) == 2:
        how = f"{named(0)} and {named(1)} differ in {data_difference(groups[0], groups[1])}"
    else:
        how = f"{named(0)} differs from " + "; from ".join(
            f"{named(i)} in {data_difference(groups[0], groups[i])}" for i in range(1, len(groups)))
    return (f"these {n} runs were trained on {len(groups)} different data sets, and runs on different data are "
            f"never compared: {how} — compare the runs of one data set at a time "
            f"(tiedlm compare {patterns[0]}), or pass --baseline VARIANT (a label or a run name) to compare "
            "the variants trained on that variant's data")


# ============================================================================ variants and labels


def _scalar(value: Any) -> str:
    """A value as YAML would write it: true, 128, 0.001, null, [0.1, 0.5]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(", ", ": "))


def short_keys(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key that no other key in the list ends with."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for i in range(len(parts) - 1, -1, -1):
            suffix = ".".join(parts[i:])
            if not any(o != key and (o == suffix or o.endswith("." + suffix)) for o in keys):
                out[key] = suffix
                break
        else:
            out[key] = key
    return out


def _variant_config(config: dict) -> dict:
    from .config import strip_variant_keys

    return strip_variant_keys(config)


def label_variants(configs: list[dict]) -> tuple[list[str], list[str]]:
    """Labels for variant configs (seed and name excluded) and the dotted keys that tell them apart."""
    from .config import diff_keys, flatten

    if not configs:
        return [], []
    keys: set[str] = set()
    for other in configs[1:]:
        keys.update(diff_keys(_variant_config(configs[0]), _variant_config(other)))
    ordered = sorted(keys, key=lambda k: (k != TIE_KEY, k))
    short = short_keys(ordered)
    labels = []
    for cfg in configs:
        flat = flatten(_variant_config(cfg))
        parts = []
        for key in ordered:
            if key == TIE_KEY and isinstance(flat.get(key), bool):
                parts.append("tied" if flat[key] else "untied")
            else:
                parts.append(f"{short[key]}={_scalar(flat.get(key))}")
        if not parts:  # a single variant: say what matters most
            tied = flat.get(TIE_KEY)
            parts.append("tied" if tied else "untied" if tied is False else "all runs")
        labels.append(", ".join(parts))
    return labels, ordered


def _is_untied(variant: dict) -> bool:
    return variant["config"].get("model", {}).get("tie_embeddings") is False


def choose_baseline(variants: list[dict], baseline: str | None) -> tuple[dict, str]:
    """The baseline variant and a sentence saying why it was chosen."""
    if baseline:
        query = baseline.strip()
        by_label = [v for v in variants if v["label"] == query]
        if len(by_label) == 1:
            return by_label[0], f"chosen with --baseline {query!r}"
        by_run = [v for v in variants if query in v["runs"]]
        if len(by_run) == 1:
            return by_run[0], f"the variant of run {query}, chosen with --baseline"
        want = {p.strip() for p in query.split(",") if p.strip()}
        want = {{"tie_embeddings=true": "tied", "tie_embeddings=false": "untied"}.get(p, p) for p in want}
        by_parts = [v for v in variants if want <= {p.strip() for p in v["label"].split(",")}]
        if len(by_parts) == 1:
            return by_parts[0], f"chosen with --baseline {query!r}"
        candidates = by_parts or [v for v in variants if query in v["label"]]
        if len(candidates) == 1:
            return candidates[0], f"chosen with --baseline {query!r}"
        labels = "; ".join(v["label"] for v in (candidates or variants))
        if candidates:
            raise ConfigError(f"--baseline {query!r} matches several variants ({labels}) — give the "
                              "whole label or a run name")
        raise ConfigError(f"--baseline {query!r} matches no variant or run — the variants are: {labels}")
    untied = [v for v in variants if _is_untied(v)]
    if len(untied) == 1:
        return untied[0], "the untied variant"
    pool = untied or variants
    # deterministic: most seeds, then the label in alphabetical order
    pick = sorted(pool, key=lambda v: (-len(v["seeds"]), v["label"]))[0]
    what = "untied variants" if untied else "variants (none is untied)"
    return pick, (f"chosen automatically among {len(pool)} {what}: the one with the most seeds, then "
                  "the first label alphabetically; pass --baseline to choose another")


# ============================================================================ aggregation


def _final(run: dict, split: str, key: str) -> float | None:
    section = (run["report"].get("final") or {}).get(split)
    return _number(section.get(key)) if isinstance(section, dict) else None


def _bucket_names(runs: list[dict], split: str) -> list[str]:
    names: list[str] = []
    for run in runs:
        section = (run["report"].get("final") or {}).get(split) or {}
        for b in section.get("buckets") or []:
            if isinstance(b, dict) and isinstance(b.get("name"), str) and b["name"] not in names:
                names.append(b["name"])
    return names


def _bucket(run: dict, split: str, name: str) -> dict | None:
    section = (run["report"].get("final") or {}).get(split) or {}
    for b in section.get("buckets") or []:
        if isinstance(b, dict) and b.get("name") == name:
            return b
    return None


def _curve(runs: list[dict]) -> list[dict]:
    """Mean, min and max validation perplexity over seeds at each number of tokens seen."""
    by_tokens: dict[float, list[float]] = {}
    for run in runs:
        for tokens, ppl in run["curve"]:
            by_tokens.setdefault(tokens, []).append(ppl)
    return [{"tokens": t, "mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}
            for t, v in sorted(by_tokens.items())]


def _aggregate(label: str, runs: list[dict]) -> dict:
    first = runs[0]
    report = first["report"]
    variant: dict[str, Any] = {
        "label": label,
        "config_hash": first["config_hash"],
        "config": _variant_config(first["config"]),
        "tied": first["config"].get("model", {}).get("tie_embeddings"),
        "seeds": [r["seed"] for r in runs],
        "runs": [r["name"] for r in runs],
        "n_seeds": len(runs),
        "metrics": {},
    }
    for split in SPLITS:
        if not any(_final(r, split, "perplexity") is not None for r in runs):
            continue
        buckets = []
        for name in _bucket_names(runs, split):
            found = [_bucket(r, split, name) or {} for r in runs]
            buckets.append({"name": name, "loss": summarize(b.get("loss") for b in found),
                            "by_seed": {r["seed"]: b.get("loss") for r, b in zip(runs, found)},
                            "perplexity": summarize(b.get("perplexity") for b in found),
                            "tokens": _number(next((b.get("tokens") for b in found if b.get("tokens") is not None), None))})
        variant["metrics"][split] = {
            "perplexity": summarize(_final(r, split, "perplexity") for r in runs),
            "bits_per_byte": summarize(_final(r, split, "bits_per_byte") for r in runs),
            "loss": summarize(_final(r, split, "loss") for r in runs),
            "word_perplexity": summarize(_final(r, split, "word_perplexity") for r in runs),
            "by_seed": {r["seed"]: _final(r, split, "perplexity") for r in runs},
            "buckets": buckets,
        }
    # a run untied part-way (model.untie_at) ends with both matrices: count what it ends with
    final_params = report.get("params_after_untie") or report.get("params")
    params = final_params if isinstance(final_params, dict) else {}
    variant["params"] = params
    variant["flops_per_token"] = report.get("flops_per_token")
    variant["cost"] = {key: summarize(r["report"].get(key) for r in runs)
                       for key in ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps")}
    variant["device"] = sorted({str(r["report"].get("device")) for r in runs if r["report"].get("device")})
    variant["dtype"] = sorted({str(r["report"].get("dtype")) for r in runs if r["report"].get("dtype")})
    variant["floor"] = next((r["report"]["floor"] for r in runs if isinstance(r["report"].get("floor"), dict)), None)
    variant["tokenizer_kind"] = first["config"].get("tokenizer", {}).get("kind")
    variant["curve"] = _curve(runs)
    return variant


def _versus(variant: dict, base: dict) -> dict:
    out: dict[str, Any] = {"baseline": base["label"]}
    for split in SPLITS:
        mv, mb = variant["metrics"].get(split), base["metrics"].get(split)
        if not mv or not mb:
            continue
        diff = compare_by_seed(mv["by_seed"], mb["by_seed"])
        base_mean = mb["perplexity"]["mean"]
        rel = lambda x: (x / base_mean) if (x is not None and base_mean) else None  # noqa: E731
        diff["relative"] = rel(diff.get("difference"))
        diff["relative_ci_low"], diff["relative_ci_high"] = rel(diff.get("ci_low")), rel(diff.get("ci_high"))
        diff["significant"] = (diff["p_value"] < ALPHA) if diff.get("p_value") is not None else None
        diff["variant_mean"], diff["baseline_mean"] = mv["perplexity"]["mean"], base_mean
        # the tying literature's claim is about rare tokens: test each bucket's loss difference too
        base_buckets = {b["name"]: b for b in mb.get("buckets", [])}
        diff["buckets"] = {b["name"]: compare_by_seed(b["by_seed"], base_buckets[b["name"]]["by_seed"])
                           for b in mv.get("buckets", []) if b["name"] in base_buckets}
        out[split] = diff
    tv, tb = variant["params"].get("total"), base["params"].get("total")
    if isinstance(tv, int) and isinstance(tb, int) and tb:
        out["params_difference"] = tv - tb
        out["params_relative"] = (tv - tb) / tb
    else:
        out["params_difference"] = out["params_relative"] = None
    return out


# ============================================================================ text


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}"


def _fmt_signed(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    return f"{x:+.{digits}f}".replace("-", "−")


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "—"
    if p < 0.001:
        return "p<0.001"
    return f"p={p:.3f}"


def _fmt_int(x: Any) -> str:
    return f"{int(x):,}" if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "—"


def _fmt_count(x: Any) -> str:
    """1234567 -> 1.23M."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "—"
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:g}"


def _fmt_bytes(x: Any) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not x:
        return "—"
    for div, suffix in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if x >= div:
            return f"{x / div:.1f} {suffix}"
    return f"{int(x)} B"


def _fmt_seconds(x: Any) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "—"
    if x >= 3600:
        return f"{x / 3600:.1f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.1f} s"


def _mean_sd(s: dict, digits: int = 2) -> str:
    if s["mean"] is None:
        return "—"
    if s["sd"] is None:
        return _fmt(s["mean"], digits)
    return f"{_fmt(s['mean'], digits)} ± {_fmt(s['sd'], digits)}"


def _ci(s: dict, digits: int = 2) -> str:
    if s["ci_low"] is None:
        return "one seed: no interval" if s["n"] == 1 else "—"
    return f"{_fmt(s['ci_low'], digits)} – {_fmt(s['ci_high'], digits)}"


def _test_words(d: dict) -> str:
    if d["test"] == "paired":
        return f"paired over {d['n']} seeds"
    return f"Welch, {d['n_a']} vs {d['n_b']} seeds"


def verdict(variant: dict, split: str) -> str | None:
    """One plain-English sentence on the variant against the baseline on one split."""
    vs = variant.get("vs_baseline") or {}
    d = vs.get(split)
    if not d or d.get("difference") is None or d.get("relative") is None:
        return None
    rel = d["relative"]
    if rel == 0:
        claim = f"has the same perplexity as **{vs['baseline']}**"
    else:
        claim = f"is {abs(rel) * 100:.1f}% {'lower' if rel < 0 else 'higher'} perplexity than **{vs['baseline']}**"
    head = (f"**{variant['label']}** {claim} on {split} "
            f"({_fmt(d['variant_mean'])} vs {_fmt(d['baseline_mean'])}")
    if d.get("p_value") is None:
        return head + f"; {d.get('note') or 'no interval can be given'})."
    ci = (f"{_fmt_signed(d['relative_ci_low'] * 100, 1)}% to {_fmt_signed(d['relative_ci_high'] * 100, 1)}%")
    sig = ("significant at 0.05" if d["significant"]
           else "not significant at 0.05 (the interval includes zero)")
    return (head + f"; 95% CI of the difference {ci}, {_fmt_p(d['p_value'])}, {_test_words(d)}): {sig}.")


def _params_sentence(variant: dict, base_label: str) -> str | None:
    vs = variant.get("vs_baseline") or {}
    rel = vs.get("params_relative")
    if rel is None:
        return None
    total = variant["params"].get("total")
    base_total = total - vs["params_difference"]
    if rel == 0:
        return f"Same parameter count as {base_label} ({_fmt_int(total)})."
    more = "fewer" if rel < 0 else "more"
    return f"It has {abs(rel) * 100:.1f}% {more} parameters ({_fmt_int(total)} vs {_fmt_int(base_total)})."


# ============================================================================ the comparison


def _by_variant(runs: list[dict], skipped: list[dict]) -> dict[str, list[dict]]:
    """Runs grouped by config hash in a stable order (first appearance by run name), one run per
    seed; the duplicates are added to `skipped`."""
    groups: dict[str, list[dict]] = {}
    for run in sorted(runs, key=lambda r: (r["name"], r["path"])):
        groups.setdefault(run["config_hash"], []).append(run)
    kept: dict[str, list[dict]] = {}
    for chash, members in groups.items():
        by_seed: dict[int, dict] = {}
        for run in members:
            if run["seed"] in by_seed:
                skipped.append({"path": run["path"], "name": run["name"],
                                "reason": f"same config and seed {run['seed']} as {by_seed[run['seed']]['name']} "
                                          "(a copy?); only the first is used"})
            else:
                by_seed[run["seed"]] = run
        kept[chash] = [by_seed[s] for s in sorted(by_seed)]
    return kept


def _labels(kept: dict[str, list[dict]]) -> tuple[list[str], list[str]]:
    hashes = list(kept)
    labels, keys = label_variants([kept[h][0]["config"] for h in hashes])
    if len(set(labels)) != len(labels):  # configs that differ only where the hash saw it
        labels = [f"{lab} [{h[:6]}]" for lab, h in zip(labels, hashes)]
    return labels, keys


def _pick_data_group(groups: list[dict], kept_by_group: list[dict[str, list[dict]]],
                     baseline: str) -> tuple[int, str, str, list[dict]]:
    """With runs on several data sets and --baseline: (the baseline's group, its config hash, why it
    was chosen, the other groups' variants as "not compared" entries). The baseline is looked up
    among labels computed over all the runs, which name the data keys that tell the groups apart."""
    entries = [(gi, h) for gi, kept in enumerate(kept_by_group) for h in kept]
    labels, _ = label_variants([kept_by_group[gi][h][0]["config"] for gi, h in entries])
    if len(set(labels)) != len(labels):  # the same config on other data (the data files changed)
        labels = [f"{lab} [data set {gi + 1}]" for lab, (gi, _h) in zip(labels, entries)]
    light = [{"label": lab, "runs": [r["name"] for r in kept_by_group[gi][h]], "group": gi, "config_hash": h,
              "seeds": [r["seed"] for r in kept_by_group[gi][h]],
              "config": _variant_config(kept_by_group[gi][h][0]["config"])}
             for lab, (gi, h) in zip(labels, entries)]
    base, why = choose_baseline(light, baseline)
    home = groups[base["group"]]
    not_compared = []
    for v in light:
        if v["group"] == base["group"]:
            continue
        runs = kept_by_group[v["group"]][v["config_hash"]]
        how = data_difference(groups[v["group"]], home, sep=" instead of ")
        not_compared.append({"variant": v["label"], "runs": v["runs"], "paths": [r["path"] for r in runs],
                             "seeds": v["seeds"], "data_set": v["group"] + 1, "difference": how,
                             "reason": f"trained on other data ({how})"})
    return base["group"], base["config_hash"], why, not_compared


def _build(runs: list[dict], skipped: list[dict], baseline: str | None, out: Path,
           match: dict | None = None) -> dict:
    groups = data_groups(runs)
    kept_by_group = [_by_variant(g["runs"], skipped) for g in groups]
    not_compared: list[dict] = []
    if len(groups) == 1:
        home, base_hash = 0, None
    elif not baseline or not baseline.strip():
        raise RunError(_mixed_data_message(groups))
    else:
        home, base_hash, why, not_compared = _pick_data_group(groups, kept_by_group, baseline)
    kept = kept_by_group[home]
    runs = groups[home]["runs"]
    hashes = list(kept)
    labels, keys = _labels(kept)  # within the data set, so that labels name only what differs there
    variants = [_aggregate(lab, kept[h]) for lab, h in zip(labels, hashes)]
    if base_hash is None:
        base, why = choose_baseline(variants, baseline)
    else:
        base = next(v for v in variants if v["config_hash"] == base_hash)
    variants.sort(key=lambda v: (v is not base, v["label"]))
    verdicts = []
    for v in variants:
        v["is_baseline"] = v is base
        v["vs_baseline"] = None if v is base else _versus(v, base)
        v["verdicts"] = []
        if v is base:
            continue
        for split in SPLITS:
            line = verdict(v, split)
            if line:
                v["verdicts"].append(line)
        ps = _params_sentence(v, base["label"])
        if ps and v["verdicts"]:
            v["verdicts"][0] += " " + ps
        verdicts.extend(v["verdicts"])
    notes = [n for r in runs for n in r["notes"]]
    run_rows = []
    label_of = {h: lab for h, lab in zip(hashes, labels)}
    for h in hashes:
        for r in kept[h]:
            run_rows.append({
                "name": r["name"], "path": r["path"], "variant": label_of[h], "seed": r["seed"],
                "config_hash": h,
                **{f"{s}_{k}": _final(r, s, k) for s in SPLITS for k in ("perplexity", "bits_per_byte", "loss")},
                "buckets": {s: {n: _number((_bucket(r, s, n) or {}).get("loss")) for n in _bucket_names([r], s)}
                            for s in SPLITS},
                "params_total": (r["report"].get("params") or {}).get("total"),
                **{k: _number(r["report"].get(k)) for k in
                   ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps")},
                "device": r["report"].get("device"),
            })
    from . import __version__

    return {
        "format": 1,
        "tiedlm_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "out": str(out),
        "level": LEVEL,
        "alpha": ALPHA,
        "interval": ("95% Student-t confidence interval for the mean over seeds: "
                     "mean ± t(0.975, n−1)·sd/√n, sd the sample standard deviation (n−1)"),
        "difference": ("variant − baseline, in perplexity; paired t-test on per-seed differences when "
                       "both variants have the same seeds, Welch's t-test (Welch–Satterthwaite df) otherwise; "
                       "two-sided p-values"),
        "baseline": {"label": base["label"], "reason": why},
        "differing_keys": keys,
        "variants": variants,
        "runs": run_rows,
        "skipped": skipped,
        "notes": notes,
        "match": match,
        "verdicts": verdicts,
        "data_sets": len(groups),
        "not_compared": not_compared,
        "files": {},
    }


def _compare(run_dirs: list[Path], missing: list[dict], out: Path, baseline: str | None,
             runs_dir: Path, match: dict | None = None, reasons: dict[str, str] | None = None) -> dict:
    runs, skipped = [], list(missing)
    for d in run_dirs:
        run, reason = load_run(d)
        extra = (reasons or {}).get(Path(d).name)
        if run is not None and extra:  # e.g. a finished run of an older config: not this comparison's
            run, reason = None, "training this run failed"
        if run is None:
            skipped.append({"path": str(d), "name": Path(d).name,
                            "reason": reason if not extra else f"{reason}: {extra}"})
        else:
            runs.append(run)
    if not runs:
        where = ", ".join(str(d) for d in run_dirs[:3]) if run_dirs else str(runs_dir)
        left = (f" ({len(skipped)} left out: " + "; ".join(f"{s['name']}: {s['reason']}" for s in skipped[:3])
                + ("; ..." if len(skipped) > 3 else "") + ")") if skipped else ""
        raise RunError(f"no finished runs to compare in {where}{left} — train some first: "
                       "tiedlm compare --config configs/base.yaml (trains tied and untied), or "
                       "tiedlm train --config CONFIG --seed N")
    result = _build(runs, skipped, baseline, out, match)
    write_outputs(result, Path(out))
    return result


def compare_runs(paths: list[str | Path] | None = None, runs_dir: Path = Path("runs"),
                 out: Path | None = None, baseline: str | None = None) -> dict:
    """Compare finished runs (run folders, folders of runs, or globs; default: every run under
    runs_dir). Writes comparison.md/.csv/.json and plots to `out` (default runs_dir/compare) and
    returns the comparison. Unfinished or unreadable runs are listed in result["skipped"]."""
    runs_dir = Path(runs_dir)
    out = Path(out) if out is not None else runs_dir / COMPARE_DIR
    run_dirs, missing = discover(list(paths) if paths else None, runs_dir, out)
    return _compare(run_dirs, missing, out, baseline, runs_dir)


# ============================================================================ compare --config


def match_layers(model_cfg: Any, vocab_size: int, count: Any = None) -> dict:
    """The n_layer of a tied model whose total is closest to the untied model's (MobileLLM's
    argument: reinvest the V·d parameters tying frees in depth). `count` is count_params_config."""
    import dataclasses

    if count is None:
        from .model import count_params_config as count
    tied = dataclasses.replace(model_cfg, tie_embeddings=True, untie_at=None)
    untied_total = count(dataclasses.replace(model_cfg, tie_embeddings=False, untie_at=None), vocab_size)["total"]
    tied_total = count(tied, vocab_size)["total"]
    best_layers, best_total = tied.n_layer, tied_total
    layers = tied.n_layer
    while True:
        layers += 1
        total = count(dataclasses.replace(tied, n_layer=layers), vocab_size)["total"]
        if abs(total - untied_total) < abs(best_total - untied_total):
            best_layers, best_total = layers, total
        if total >= untied_total or layers > tied.n_layer + 100_000:
            break
    per_layer = (count(dataclasses.replace(tied, n_layer=tied.n_layer + 1), vocab_size)["total"] - tied_total)
    return {"untied_total": untied_total, "tied_total": tied_total, "matched_total": best_total,
            "n_layer": tied.n_layer, "matched_n_layer": best_layers, "layer_params": per_layer,
            "vocab_size": vocab_size}


def _override_tag(overrides: list[str]) -> str:
    """'-n_embd=256,lr=0.002' for --set model.n_embd=256 --set train.lr=2e-3, so that runs of the
    config with other overrides get folders of their own instead of clashing with the plain runs
    (a hash when that would be long). Seed and name overrides name nothing new."""
    from .config import parse_override
    from .sweep import _sanitize

    parts = []
    for item in overrides:
        keys, value = parse_override(item)
        if keys[0] in ("seed", "name"):
            continue
        parts.append(f"{keys[-1]}={_scalar(value)}")
    if not parts:
        return ""
    tag = _sanitize(",".join(parts))
    if len(tag) > 48:
        tag = "set-" + hashlib.sha256(" ".join(overrides).encode()).hexdigest()[:10]
    return "-" + tag


def compare_config(cfg_path: str | Path, overrides: list[str] | None = None, seeds: int = 1,
                   match: str | None = None, runs_dir: Path = Path("runs"), baseline: str | None = None,
                   progress: bool = True, out: Path | None = None, overwrite: bool = False) -> dict:
    """Train the tied and untied variants of a config (seeds cfg.seed .. cfg.seed+seeds-1; finished
    runs are reused) and compare exactly those runs. match="params" adds a tied variant with extra
    layers whose total is as close as possible to the untied one's. Training failures do not stop
    the others; they are listed in result["train_failures"] and among the runs left out."""
    from .config import load_config

    if match not in (None, "params"):
        raise ConfigError(f"--match {match!r} is not supported — the only option is --match params")
    if seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {seeds}")
    overrides = list(overrides or [])
    runs_dir = Path(runs_dir)
    base = load_config(cfg_path, overrides)
    seed_list = list(range(base.seed, base.seed + seeds))
    # an untie_at in the config belongs to tied models only
    untie = ["model.untie_at=null"] if base.model.untie_at is not None else []
    variants = [("tied", ["model.tie_embeddings=true"]), ("untied", ["model.tie_embeddings=false", *untie])]
    match_info = None
    if match == "params":
        from .data import prepare_data

        untied_cfg = load_config(cfg_path, overrides + variants[1][1])
        vocab = prepare_data(untied_cfg).model_vocab_size
        match_info = match_layers(untied_cfg.model, vocab)
        if match_info["matched_n_layer"] == match_info["n_layer"]:
            match_info["note"] = ("tying saves fewer parameters than half a layer holds, so the matched "
                                  "variant is the tied one; no third variant was trained")
        else:
            variants.append(("tied-matched", ["model.tie_embeddings=true",
                                              f"model.n_layer={match_info['matched_n_layer']}"]))
    prefix = base.name + _override_tag(overrides)
    jobs = []
    for tag, extra in variants:
        for seed in seed_list:
            cfg = load_config(cfg_path, overrides + extra, seed=seed)
            jobs.append((f"{prefix}-{tag}-s{seed}", cfg))

    from .sweep import train_jobs

    entries = train_jobs(jobs, runs_dir, progress, overwrite_other_config=overwrite)
    failures = {e["name"]: e["error"] for e in entries if e["status"] == "failed"}
    out = Path(out) if out is not None else runs_dir / COMPARE_DIR
    result = _compare([runs_dir / name for name, _ in jobs], [], out, baseline, runs_dir,
                      match=match_info, reasons=failures)
    result["train_failures"] = [{"name": n, "error": e} for n, e in failures.items()]
    return result


# ============================================================================ writing outputs


def _atomic_text(path: Path, text: str) -> None:
    from .runs import atomic_write_text

    atomic_write_text(path, text)


def _json_safe(obj: Any) -> Any:
    """NaN and infinities become None, so comparison.json is strict JSON; int keys become strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def write_outputs(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {"markdown": "comparison.md", "csv": "comparison.csv", "json": "comparison.json",
             **{f"plot_{k}": v for k, v in PLOTS.items()}}
    result["files"] = {k: str(out / v) for k, v in files.items()}
    plot_curve(result, out / PLOTS["curve"])
    plot_params(result, out / PLOTS["params"])
    plot_buckets(result, out / PLOTS["buckets"])
    _atomic_text(out / "comparison.csv", to_csv(result))
    _atomic_text(out / "comparison.md", to_markdown(result))
    _atomic_text(out / "comparison.json", json.dumps(_json_safe(result), indent=2, allow_nan=False) + "\n")


def _cell(x: Any) -> Any:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return x


def to_csv(result: dict) -> str:
    """One row per run, one per variant, one per run not compared (other data) and one per run left out;
    the row_type column tells them apart."""
    bucket_names: list[str] = []
    for v in result["variants"]:
        for b in (v["metrics"].get("validation") or {}).get("buckets", []):
            if b["name"] not in bucket_names:
                bucket_names.append(b["name"])
    cols = ["row_type", "variant", "run", "seeds", "n_seeds", "config_hash"]
    for s in SPLITS:
        cols += [f"{s}_perplexity", f"{s}_perplexity_sd", f"{s}_perplexity_ci_low", f"{s}_perplexity_ci_high",
                 f"{s}_bits_per_byte", f"{s}_bits_per_byte_sd", f"{s}_loss"]
    cols += [f"validation_loss[{n}]" for n in bucket_names]
    cols += ["params_total", "params_wte", "params_lm_head", "params_wpe", "params_non_embedding",
             "params_saved_by_tying", "tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen",
             "steps", "device", "is_baseline"]
    for s in SPLITS:
        cols += [f"{s}_perplexity_diff", f"{s}_perplexity_diff_ci_low", f"{s}_perplexity_diff_ci_high",
                 f"{s}_p_value", f"{s}_test"]
    cols += ["params_relative_change", "reason", "path"]
    rows = []
    for v in result["variants"]:
        row: dict[str, Any] = {"row_type": "variant", "variant": v["label"],
                               "seeds": " ".join(map(str, v["seeds"])), "n_seeds": v["n_seeds"],
                               "config_hash": v["config_hash"], "is_baseline": v["is_baseline"]}
        for s in SPLITS:
            m = v["metrics"].get(s)
            if m:
                p = m["perplexity"]
                row.update({f"{s}_perplexity": p["mean"], f"{s}_perplexity_sd": p["sd"],
                            f"{s}_perplexity_ci_low": p["ci_low"], f"{s}_perplexity_ci_high": p["ci_high"],
                            f"{s}_bits_per_byte": m["bits_per_byte"]["mean"],
                            f"{s}_bits_per_byte_sd": m["bits_per_byte"]["sd"], f"{s}_loss": m["loss"]["mean"]})
            d = (v["vs_baseline"] or {}).get(s)
            if d:
                row.update({f"{s}_perplexity_diff": d.get("difference"), f"{s}_perplexity_diff_ci_low": d.get("ci_low"),
                            f"{s}_perplexity_diff_ci_high": d.get("ci_high"), f"{s}_p_value": d.get("p_value"),
                            f"{s}_test": d.get("test")})
        for b in (v["metrics"].get("validation") or {}).get("buckets", []):
            row[f"validation_loss[{b['name']}]"] = b["loss"]["mean"]
        for k in ("total", "wte", "lm_head", "wpe", "non_embedding", "saved_by_tying"):
            row[f"params_{k}"] = v["params"].get(k)
        for k in ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps"):
            row[k] = v["cost"][k]["mean"]
        row["device"] = " ".join(v["device"])
        row["params_relative_change"] = (v["vs_baseline"] or {}).get("params_relative")
        rows.append(row)
    for r in result["runs"]:
        row = {"row_type": "run", "variant": r["variant"], "run": r["name"], "seeds": r["seed"], "n_seeds": 1,
               "config_hash": r["config_hash"], "path": r["path"], "params_total": r["params_total"],
               "device": r["device"]}
        for s in SPLITS:
            row.update({f"{s}_perplexity": r[f"{s}_perplexity"], f"{s}_bits_per_byte": r[f"{s}_bits_per_byte"],
                        f"{s}_loss": r[f"{s}_loss"]})
        for n, loss in r["buckets"].get("validation", {}).items():
            row[f"validation_loss[{n}]"] = loss
        for k in ("tokens_per_s", "wall_time_s", "peak_memory_bytes", "tokens_seen", "steps"):
            row[k] = r[k]
        rows.append(row)
    for n in result.get("not_compared") or []:
        for name, seed, path in zip(n["runs"], n["seeds"], n["paths"]):
            rows.append({"row_type": "not_compared", "variant": n["variant"], "run": name, "seeds": seed,
                         "reason": n["reason"], "path": path})
    for s in result["skipped"]:
        rows.append({"row_type": "skipped", "run": s["name"], "reason": s["reason"], "path": s["path"]})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in cols})
    return buf.getvalue()


def _table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _name(v: dict) -> str:
    return f"{v['label']} (baseline)" if v["is_baseline"] else v["label"]


def to_markdown(result: dict) -> str:
    variants = result["variants"]
    n_runs = sum(v["n_seeds"] for v in variants)
    base = result["baseline"]
    md = ["# tiedlm comparison", ""]
    md.append(f"{n_runs} finished run{'s' if n_runs != 1 else ''} in {len(variants)} "
              f"variant{'s' if len(variants) != 1 else ''}; baseline **{base['label']}** ({base['reason']}). "
              f"Written by tiedlm {result['tiedlm_version']} on {result['created']}.")
    if result["differing_keys"]:
        md.append("")
        md.append("The variants differ in: " + ", ".join(f"`{k}`" for k in result["differing_keys"]) + ".")
    if result.get("not_compared"):
        n_other = len(result["not_compared"])
        md.append("")
        md.append(f"Only variants trained on the baseline's data are compared: the runs came from "
                  f"{result['data_sets']} data sets, and {n_other} variant{'s' if n_other != 1 else ''} "
                  f"trained on other data {'are' if n_other != 1 else 'is'} listed under *Not compared*.")
    md += ["", "## Verdict", ""]
    if result["verdicts"]:
        md.append("Percentages are of the baseline's mean perplexity; the interval is the 95% confidence "
                  "interval of the difference in mean perplexity, expressed the same way. Lower is better.")
        md.append("")
        md += [f"- {line}" for line in result["verdicts"]]
    elif len(variants) == 1:
        md.append("- Only one variant: nothing to compare against. Train another (for example "
                  "`tiedlm compare --config CONFIG`, which trains both tied and untied).")
    if any(v["n_seeds"] == 1 for v in variants):
        md.append("- Some variants have a single seed: no confidence interval or p-value can be given for "
                  "them. Use `--seeds 3` or more.")
    if result.get("match"):
        m = result["match"]
        md += ["", "## Parameter matching (--match params)", ""]
        md.append(f"The untied model has {_fmt_int(m['untied_total'])} parameters and the tied one "
                  f"{_fmt_int(m['tied_total'])}. The matched variant is tied with n_layer={m['matched_n_layer']} "
                  f"instead of {m['n_layer']} (one layer holds {_fmt_int(m['layer_params'])}), for "
                  f"{_fmt_int(m['matched_total'])} parameters: "
                  f"{m['matched_total'] - m['untied_total']:+,} against the untied model.".replace("-", "−"))
        if m.get("note"):
            md.append("")
            md.append(m["note"] + ".")

    md += ["", "## Results", ""]
    md.append("Mean ± standard deviation over seeds; the 95% interval is a Student-t confidence interval "
              "for the mean over seeds (mean ± t(0.975, n−1)·sd/√n) — where the average run of this "
              "variant would land, not the range of single runs. Lower is better.")
    md.append("")
    header = ["variant", "seeds"]
    present = [s for s in SPLITS if any(s in v["metrics"] for v in variants)]
    for s in present:
        header += [f"{s} perplexity", "95% CI", f"{s} bits/byte"]
    rows = []
    for v in variants:
        row = [_name(v), str(v["n_seeds"])]
        for s in present:
            m = v["metrics"].get(s)
            if not m:
                row += ["—", "—", "—"]
                continue
            row += [_mean_sd(m["perplexity"]), _ci(m["perplexity"]), _mean_sd(m["bits_per_byte"], 4)]
        rows.append(row)
    md.append(_table(header, rows))
    floors = [(v, v["floor"]) for v in variants if v.get("floor")]
    if floors:
        f = floors[0][1]
        bpb = f.get("bits_per_byte") or {}
        md.append("")
        md.append(f"Floor of the synthetic language (its true entropy rate): {_fmt(f.get('perplexity_per_word'))} "
                  f"perplexity per word, {_fmt(bpb.get('validation'), 4)} bits per byte on validation, "
                  f"{_fmt(bpb.get('test'), 4)} on test. No model can do better on average."
                  + (f" ({f['note'].rstrip('.')}.)" if f.get("note") else ""))

    others = [v for v in variants if not v["is_baseline"]]
    if others:
        md += ["", f"## Difference from the baseline ({base['label']})", ""]
        md.append("Difference in mean perplexity, variant − baseline (negative: the variant is better), with its "
                  "95% confidence interval and two-sided p-value: paired t-test on per-seed differences when both "
                  "have the same seeds, Welch's t-test otherwise.")
        md.append("")
        rows = []
        for v in others:
            for s in present:
                d = (v["vs_baseline"] or {}).get(s)
                if not d or d.get("difference") is None:
                    continue
                if d.get("p_value") is None:
                    ci, p, how = "no interval", "—", d.get("note") or "—"
                else:
                    ci = f"{_fmt_signed(d['ci_low'])} to {_fmt_signed(d['ci_high'])}"
                    p, how = _fmt_p(d["p_value"])[1:].lstrip("="), _test_words(d)
                rel = _fmt_signed(d["relative"] * 100, 1) + "%" if d.get("relative") is not None else "—"
                sig = "—" if d.get("significant") is None else ("yes" if d["significant"] else "no")
                rows.append([v["label"], s, _fmt_signed(d["difference"]), rel, ci, p, sig, how])
        md.append(_table(["variant", "split", "Δ perplexity", "relative", "95% CI", "p", "p < 0.05", "test"],
                         rows, "llrrrrll"))

    bucket_rows, bucket_names = [], []
    for v in variants:
        for b in (v["metrics"].get("validation") or {}).get("buckets", []):
            if b["name"] not in bucket_names:
                bucket_names.append(b["name"])
    if bucket_names:
        base_v = next(v for v in variants if v["is_baseline"])
        base_b = {b["name"]: b for b in (base_v["metrics"].get("validation") or {}).get("buckets", [])}
        for v in variants:
            mine = {b["name"]: b for b in (v["metrics"].get("validation") or {}).get("buckets", [])}
            row = [_name(v)]
            for n in bucket_names:
                b = mine.get(n)
                if not b or b["loss"]["mean"] is None:
                    row.append("—")
                    continue
                cell = _mean_sd(b["loss"], 3)
                ref = base_b.get(n)
                if not v["is_baseline"] and ref and ref["loss"]["mean"] is not None:
                    test = (((v["vs_baseline"] or {}).get("validation") or {}).get("buckets") or {}).get(n) or {}
                    p = test.get("p_value")
                    cell += (f" ({_fmt_signed(b['loss']['mean'] - ref['loss']['mean'], 3)}"
                             + (f", {_fmt_p(p)}" if p is not None else "") + ")")
                row.append(cell)
            bucket_rows.append(row)
        first_buckets = {b["name"]: b for v in variants for b in (v["metrics"].get("validation") or {}).get("buckets", [])}
        md += ["", "## Loss by token frequency (validation)", ""]
        md.append("Mean loss in nats per token of each frequency bucket (vocabulary ranked by training-set "
                  "count), ± SD over seeds; in brackets the difference from the baseline and its p-value (the same "
                  "test as for perplexity: paired by seed where the seeds match). The weight-tying literature "
                  "expects tying to help rare tokens most.")
        md.append("")
        header = ["variant"] + [f"{n} ({_fmt_count(first_buckets[n].get('tokens'))} tokens)"
                                if first_buckets[n].get("tokens") else n for n in bucket_names]
        md.append(_table(header, bucket_rows))

    md += ["", "## Parameters", ""]
    md.append("Unique parameters. `lm_head` counts W_out's extra parameters (0 when it is E); "
              "`saved by tying` is V·d, also 16 bytes each of AdamW training memory in fp32.")
    md.append("")
    rows = []
    for v in variants:
        p = v["params"]
        rel = (v["vs_baseline"] or {}).get("params_relative")
        rows.append([_name(v), _fmt_int(p.get("total")), _fmt_int(p.get("wte")), _fmt_int(p.get("lm_head")),
                     _fmt_int(p.get("wpe")), _fmt_int(p.get("non_embedding")), _fmt_int(p.get("saved_by_tying")),
                     "—" if rel is None else _fmt_signed(rel * 100, 1) + "%"])
    md.append(_table(["variant", "total", "wte (E)", "lm_head (W_out)", "wpe", "non-embedding",
                      "saved by tying", "vs baseline"], rows))

    md += ["", "## Cost", ""]
    md.append("Means over seeds. Tying saves parameters and memory, never FLOPs: the output matmul runs either way.")
    md.append("")
    rows = []
    for v in variants:
        c = v["cost"]
        rows.append([_name(v), _fmt_int(c["tokens_per_s"]["mean"]), _fmt_seconds(c["wall_time_s"]["mean"]),
                     _fmt_bytes(c["peak_memory_bytes"]["mean"]), _fmt_count(c["tokens_seen"]["mean"]),
                     _fmt_int(c["steps"]["mean"]), ", ".join(v["device"] + v["dtype"]) or "—"])
    md.append(_table(["variant", "tokens/s", "wall time", "peak memory", "tokens seen", "steps", "device"], rows,
                     "lrrrrrl"))

    md += ["", "## Plots", ""]
    md.append(f"![validation perplexity against tokens seen]({PLOTS['curve']})")
    md.append("")
    md.append("Validation perplexity during training (on the fixed evaluation slice): mean over seeds, "
              "band from the lowest to the highest seed, log scale.")
    md.append("")
    md.append(f"![final validation perplexity against parameter count]({PLOTS['params']})")
    md.append("")
    md.append(f"![validation loss by frequency bucket]({PLOTS['buckets']})")

    md += ["", "## Runs", ""]
    rows = []
    for r in result["runs"]:
        rows.append([r["name"], r["variant"], str(r["seed"]), _fmt(r["validation_perplexity"]),
                     _fmt(r["test_perplexity"]), _fmt(r["validation_bits_per_byte"], 4),
                     _fmt_int(r["params_total"]), _fmt_seconds(r["wall_time_s"])])
    md.append(_table(["run", "variant", "seed", "validation ppl", "test ppl", "validation bits/byte",
                      "parameters", "wall time"], rows, "lllrrrrr"))
    if result.get("not_compared"):
        md += ["", "## Not compared (trained on other data)", ""]
        md.append("Runs trained or evaluated on other tokens than the baseline's (another data source, split, "
                  "tokenizer or evaluation set) are never contrasted with it. Compare them among themselves, "
                  "for example with `--baseline` set to one of them.")
        md.append("")
        md += [f"- **{n['variant']}** ({', '.join(f'`{r}`' for r in n['runs'])}): {n['reason']}"
               for n in result["not_compared"]]
    if result["skipped"]:
        md += ["", "## Left out", ""]
        md += [f"- `{s['path']}`: {s['reason']}" for s in result["skipped"]]
    if result["notes"]:
        md += ["", "## Notes", ""]
        md += [f"- {n}" for n in result["notes"]]
    md.append("")
    return "\n".join(md)


def format_terminal_table(result: dict) -> str:
    """The compact table printed after a comparison: one line per variant, then verdicts and left-out runs."""
    variants = result["variants"]
    base = result["baseline"]["label"]
    header = ["variant", "seeds", "val ppl", "95% CI", f"Δ vs {base}", "p", "params"]
    rows = []
    for v in variants:
        m = v["metrics"].get("validation") or {}
        ppl = m.get("perplexity") or summarize([])
        d = (v["vs_baseline"] or {}).get("validation") or {}
        if v["is_baseline"]:
            delta, p = "baseline", ""
        elif d.get("difference") is None:
            delta, p = "—", ""
        else:
            rel = f" ({_fmt_signed(d['relative'] * 100, 1)}%)" if d.get("relative") is not None else ""
            delta = _fmt_signed(d["difference"]) + rel
            p = _fmt_p(d.get("p_value"))[1:].lstrip("=") if d.get("p_value") is not None else "n/a"
        prel = (v["vs_baseline"] or {}).get("params_relative")
        params = _fmt_count(v["params"].get("total")) + (f" ({_fmt_signed(prel * 100, 1)}%)" if prel else "")
        rows.append([v["label"], str(v["n_seeds"]), _mean_sd(ppl), _ci(ppl) if ppl["n"] else "—", delta, p, params])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for line in result["verdicts"]:
        lines.append(line.replace("**", ""))
    if any(v["n_seeds"] == 1 for v in variants):
        lines.append("Single-seed variants: no confidence interval or p-value can be given; use --seeds 3 or more.")
    for n in result.get("not_compared") or []:
        k = len(n["runs"])
        lines.append(f"not compared: {n['variant']} ({k} run{'s' if k != 1 else ''}: {', '.join(n['runs'])}): "
                     f"{n['reason']}")
    for s in result["skipped"]:
        lines.append(f"left out {s['path']}: {s['reason']}")
    for f in result.get("train_failures") or []:
        lines.append(f"training failed: {f['name']}: {f['error']}")
    if result.get("files", {}).get("markdown"):
        lines.append(f"wrote {result['files']['markdown']} (and .csv, .json, plots)")
    return "\n".join(lines)


# ============================================================================ plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def _figure(path: Path, title: str):
    """One plot: yields its axes, then titles it, writes the PNG atomically and frees the figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        yield ax
        ax.set_title(title, fontsize=10)
        _save(fig, path)
    finally:
        plt.close(fig)


def _save(fig: Any, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    from .runs import atomic_write_bytes

    atomic_write_bytes(path, buf.getvalue())


def _plain_ticks(ax: Any, which: str, log: bool = False) -> None:
    """Tick labels as 60, 100, 200k, 1.2M instead of 6x10^1 or an offset 1e6."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    fmt = FuncFormatter(lambda x, _: _fmt_count(x) if abs(x) >= 1000 else f"{x:g}")
    axis.set_major_formatter(fmt)
    if log:
        lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
        # minor ticks (20, 30, ..., 90) are labelled only when the axis spans little more than a decade
        axis.set_minor_formatter(fmt if lo > 0 and hi / lo < 20 else NullFormatter())


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _floor_ppl(variants: list[dict]) -> float | None:
    for v in variants:
        if v.get("floor") and v.get("tokenizer_kind") == "word":  # a word-level floor is per token there
            return _number(v["floor"].get("perplexity_per_word"))
    return None


def plot_curve(result: dict, path: Path) -> None:
    with _figure(path, "Validation perplexity during training (mean, min–max band over seeds)") as ax:
        drawn = False
        for i, v in enumerate(result["variants"]):
            pts = v["curve"]
            if not pts:
                continue
            color = f"C{i % 10}"
            x = [p["tokens"] for p in pts]
            ax.plot(x, [p["mean"] for p in pts], color=color, label=f"{v['label']} (n={v['n_seeds']})")
            if v["n_seeds"] > 1:
                ax.fill_between(x, [p["min"] for p in pts], [p["max"] for p in pts], color=color, alpha=0.2,
                                linewidth=0)
            drawn = True
        if drawn:
            floor = _floor_ppl(result["variants"])
            if floor:
                ax.axhline(floor, color="0.3", linestyle="--", linewidth=1, label="floor (true entropy rate)")
            ax.set_yscale("log")
            _plain_ticks(ax, "x")
            _plain_ticks(ax, "y", log=True)
            ax.set_xlabel("tokens seen")
            ax.set_ylabel("validation perplexity (log scale)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no validation evaluations in metrics.jsonl (train.eval_every = 0?)")


def plot_params(result: dict, path: Path) -> None:
    with _figure(path, "Final validation perplexity against parameters (seeds, mean and 95% CI)") as ax:
        drawn = False
        for i, v in enumerate(result["variants"]):
            total = v["params"].get("total")
            m = (v["metrics"].get("validation") or {}).get("perplexity")
            if not isinstance(total, (int, float)) or not m or m["mean"] is None:
                continue
            color = f"C{i % 10}"
            ax.scatter([total] * len(m["values"]), m["values"], color=color, alpha=0.35, s=18)
            yerr = None
            if m["ci_low"] is not None:
                yerr = [[m["mean"] - m["ci_low"]], [m["ci_high"] - m["mean"]]]
            ax.errorbar([total], [m["mean"]], yerr=yerr, fmt="o", color=color, capsize=4, markersize=7,
                        label=v["label"])
            drawn = True
        if drawn:
            ax.set_xlabel("total parameters (unique)")
            ax.set_ylabel("final validation perplexity")
            _plain_ticks(ax, "x")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no final validation perplexity or parameter counts")


def plot_buckets(result: dict, path: Path) -> None:
    with _figure(path, "Validation loss by token frequency (mean ± SD over seeds)") as ax:
        names: list[str] = []
        for v in result["variants"]:
            for b in (v["metrics"].get("validation") or {}).get("buckets", []):
                if b["name"] not in names:
                    names.append(b["name"])
        variants = result["variants"]
        if names:
            width = 0.8 / max(1, len(variants))
            for i, v in enumerate(variants):
                mine = {b["name"]: b for b in (v["metrics"].get("validation") or {}).get("buckets", [])}
                xs, ys, errs = [], [], []
                for j, n in enumerate(names):
                    b = mine.get(n)
                    if b and b["loss"]["mean"] is not None:
                        xs.append(j - 0.4 + width * (i + 0.5))
                        ys.append(b["loss"]["mean"])
                        errs.append(b["loss"]["sd"] or 0.0)
                ax.bar(xs, ys, width=width, yerr=errs if any(errs) else None, capsize=3,
                       color=f"C{i % 10}", label=v["label"])
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names)
            ax.set_xlabel("token frequency bucket (training-set counts)")
            ax.set_ylabel("validation loss (nats per token)")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        else:
            _empty(ax, "no per-bucket losses in the reports")
