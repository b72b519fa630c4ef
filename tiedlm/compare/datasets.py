"""Data sets: runs are contrasted only with runs trained and evaluated on the same tokens.

A run's data is named by report.json's data_identity (written by training: the source
fingerprint, which covers the splits, and the tokenizer key) plus data.max_eval_tokens (how much
of each evaluation split is scored, which the identity leaves out). A report without
data_identity (hand-made, or older than the field) is named by its config's data and tokenizer
sections instead. Runs from several data sets are refused with a line saying how the data
differ, unless --baseline picks one (variants.pick_data_set).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config
from ..config.naming import scalar
from .collect import LoadedRun
from ..config.identity import flat

DATA_SECTIONS = ("data", "tokenizer")


@dataclass
class DataSet:
    """Runs trained and evaluated on the same tokens."""

    config: Config  # its first run's config (the data and tokenizer sections are what matter here)
    identity: dict | None  # its first run's recorded data identity
    runs: list[LoadedRun] = field(default_factory=list)


def data_view(cfg: Config) -> dict[str, Any]:
    """The data and tokenizer keys of a config -> their values (variant.flat)."""

    return {k: v for k, v in flat(cfg).items() if k.split(".", 1)[0] in DATA_SECTIONS}


def _blob(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _run_order(run: LoadedRun) -> tuple[str, str]:
    return run.name, run.path


def data_sets(runs: list[LoadedRun]) -> list[DataSet]:
    """The runs grouped by the data they were trained and evaluated on, in order of their first run name."""
    ordered = sorted(runs, key=_run_order)
    groups: dict[str, DataSet] = {}

    def add(key: str, run: LoadedRun) -> None:
        groups.setdefault(key, DataSet(run.config, run.data_identity)).runs.append(run)

    # A run recorded since local files are known by their content carries its identity by the
    # files' modification times too (data.data_identity): a run recorded before, under that older
    # identity, is on the same tokens as long as the files were not touched between them.
    merged: dict[str, str] = {}

    def root(key: str) -> str:
        while merged.get(key, key) != key:
            key = merged[key]
        return key

    keyed = []
    for run in ordered:
        if run.data_identity is not None:  # how much of each evaluation split is scored, which it leaves out
            eval_set = {"max_eval_tokens": run.config.data.max_eval_tokens}
            key = _blob({"identity": run.data_identity, "eval": eval_set})
            if run.data_alias is not None:
                alias = root(_blob({"identity": run.data_alias, "eval": eval_set}))
                if alias != root(key):
                    merged[alias] = root(key)
            keyed.append((key, run))
    for key, run in keyed:
        add(root(key), run)
    for run in ordered:  # no recorded identity: join a group whose runs have the same data config
        if run.data_identity is None:
            view = data_view(run.config)
            twin = next((k for k, g in groups.items() if any(data_view(r.config) == view for r in g.runs)), None)
            add(twin or _blob({"config": view}), run)
    out = sorted(groups.values(), key=lambda g: min(_run_order(r) for r in g.runs))
    for group in out:
        group.runs.sort(key=_run_order)
    return out


def data_difference(a: DataSet, b: DataSet, sep: str = " vs ") -> str:
    """How the data of two groups differ, in config keys: 'data.synthetic.vocab_size 1000 vs 4096'
    (a's value first); or which recorded identity differs when their configs do not."""
    fa, fb = data_view(a.config), data_view(b.config)
    keys = sorted(k for k in fa if fa[k] != fb[k])
    if keys:
        return ", ".join(f"{k} {scalar(fa[k])}{sep}{scalar(fb[k])}" for k in keys)
    ia, ib = a.identity or {}, b.identity or {}
    if ia.get("fingerprint") != ib.get("fingerprint"):
        return "the data files changed between runs (source fingerprint differs)"
    return ("the tokenizer changed between runs (tokenizer key differs: another tokenizer file, "
            "or a tiedlm with another cache format)")


def _run_pattern(group: DataSet, others: list[DataSet]) -> str:
    """A glob that names a group's runs and no other group's (PARENT/PREFIX*), else the folders."""
    parents = {str(Path(r.path).parent) for r in group.runs}
    prefix = os.path.commonprefix([r.name for r in group.runs])
    if len(group.runs) > 1 and len(parents) == 1 and prefix.strip("-_.="):
        foreign = [r for g in others for r in g.runs if Path(r.path).name.startswith(prefix)]
        if not foreign:
            parent = parents.pop()
            return f"{prefix}*" if parent in ("", ".") else str(Path(parent) / f"{prefix}*")
    paths = [r.path for r in group.runs]
    return " ".join(paths[:4]) + (" ..." if len(paths) > 4 else "")


def mixed_data_message(groups: list[DataSet]) -> str:
    """The one-line refusal when runs on different data are given without --baseline."""
    n = sum(len(g.runs) for g in groups)
    patterns = [_run_pattern(g, [o for o in groups if o is not g]) for g in groups]

    def named(i: int) -> str:
        k = len(groups[i].runs)
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
