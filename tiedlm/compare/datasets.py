"""Data sets: runs are contrasted only with runs trained and evaluated on the same tokens, from the
same start.

A run's data is named by report.json's data_identity (written by training: the source
fingerprint, which covers the splits, and the tokenizer key) plus data.max_eval_tokens (how much
of each evaluation split is scored, which the identity leaves out). A report without
data_identity (hand-made, or older than the field) is named by its config's data and tokenizer
sections instead. Its start is report.json's start_identity (model.init_from's config and weights,
or model.hf_config's file, by content), so that seeds trained before and after a start was replaced
or edited are never pooled as one variant; a report without one (trained before runs recorded it)
is taken to share its data's start where that is one. Runs from several data sets are refused with
a line saying how the data (or the start) differ, unless --baseline picks one (variants.pick_data_set).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Config
from ..config.naming import names_file, scalar
from .collect import LoadedRun
from ..config.identity import flat
from ..model.hf_config import start_change

DATA_SECTIONS = ("data", "tokenizer")
OTHER_DATA, OTHER_START = "trained on other data", "trained from another start"  # why a variant is not compared


@dataclass
class DataSet:
    """Runs trained and evaluated on the same tokens."""

    config: Config  # its first run's config (the data and tokenizer sections are what matter here)
    identity: dict | None  # its first run's recorded data identity
    runs: list[LoadedRun] = field(default_factory=list)
    start: dict | None = None  # the start identity its runs recorded, where its path held another (None: else)
    start_path: str | None = None  # that start's path (model.init_from, or model.hf_config's file)


def start_path(cfg: Config) -> str | None:
    """The file a run's model was built from, by its path: model.init_from's folder, or a
    model.hf_config that names a file (a model_type names none); None for tiedlm's own blocks."""
    m = cfg.model
    if m.init_from:
        return str(m.init_from)
    named = m.family.built_by_transformers and m.hf_config
    return str(m.hf_config) if named and names_file(m.hf_config) else None


def data_view(cfg: Config) -> dict[str, Any]:
    """The data and tokenizer keys of a config -> their values (variant.flat)."""

    return {k: v for k, v in flat(cfg).items() if k.split(".", 1)[0] in DATA_SECTIONS}


def _blob(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _run_order(run: LoadedRun) -> tuple[str, str]:
    return run.name, run.path


def data_sets(runs: list[LoadedRun]) -> list[DataSet]:
    """The runs grouped by the data they were trained and evaluated on, in order of their first run
    name; and, where one start's path held files of other content for some of them (a start
    replaced, a config file edited between seeds), by which content they started from. Runs of
    different paths, or of none, are different variants of one data set (their configs say so),
    and a run that recorded no start joins its path's one recorded content, else a group of its own."""
    ordered = sorted(runs, key=_run_order)
    data_key = _data_keys(ordered)
    # in the order the data keys were found: recorded identities first, then the configs' views
    seq = sorted(ordered, key=lambda r: r.data_identity is None)
    starts: dict[tuple, dict[str, dict]] = {}  # (data key, start path) -> the contents recorded there, by blob
    for run in seq:
        if run.start_identity is not None:
            place = (data_key[id(run)], start_path(run.config))
            starts.setdefault(place, {}).setdefault(_blob(run.start_identity), run.start_identity)
    groups: dict[tuple, DataSet] = {}
    for run in seq:
        path = start_path(run.config)
        known = starts.get((data_key[id(run)], path), {})
        start = None  # one content at its path (or no path): no split
        if path is not None and len(known) > 1:
            start = _blob(run.start_identity) if run.start_identity is not None else ""  # "": recorded none
        key = (data_key[id(run)], path if start is not None else None, start)
        group = DataSet(run.config, run.data_identity, start=known.get(start or ""),
                        start_path=path if start is not None else None)
        groups.setdefault(key, group).runs.append(run)
    out = sorted(groups.values(), key=lambda g: min(_run_order(r) for r in g.runs))
    for group in out:
        group.runs.sort(key=_run_order)
    return out


def _data_keys(ordered: list[LoadedRun]) -> dict[int, str]:
    """id(run) -> the key of the tokens it was trained and evaluated on."""
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
    members: dict[str, list[LoadedRun]] = {}  # key -> its runs, in the order the keys were found
    for key, run in keyed:
        members.setdefault(root(key), []).append(run)
    for run in ordered:  # no recorded identity: join a key whose runs have the same data config
        if run.data_identity is None:
            view = data_view(run.config)
            twin = next((k for k, rs in members.items() if any(data_view(r.config) == view for r in rs)), None)
            members.setdefault(twin or _blob({"config": view}), []).append(run)
    return {id(run): key for key, rs in members.items() for run in rs}


def only_start_differs(a: DataSet, b: DataSet) -> bool:
    """Whether two groups hold the same data and differ in their start alone."""
    return data_view(a.config) == data_view(b.config) and (a.identity or {}) == (b.identity or {}) \
        and (a.start, a.start_path) != (b.start, b.start_path)


def data_difference(a: DataSet, b: DataSet, sep: str = " vs ") -> str:
    """How the data of two groups differ, in config keys: 'data.synthetic.vocab_size 1000 vs 4096'
    (a's value first); or which recorded identity differs when their configs do not; or, on the
    same data, how their start differs."""
    fa, fb = data_view(a.config), data_view(b.config)
    keys = sorted(k for k in fa if fa[k] != fb[k])
    if keys:
        return ", ".join(f"{k} {scalar(fa[k])}{sep}{scalar(fb[k])}" for k in keys)
    ia, ib = a.identity or {}, b.identity or {}
    if ia.get("fingerprint") != ib.get("fingerprint"):
        return "the data files changed between runs (source fingerprint differs)"
    if ia.get("tokenizer") == ib.get("tokenizer") and (a.start, a.start_path) != (b.start, b.start_path):
        if a.start_path != b.start_path:  # one is a split of a path that held two contents, the other not of it
            split = a if a.start_path is not None else b
            return (f"their start: {split.start_path}, which held other files for other runs, against "
                    f"{'another' if (b if split is a else a).start_path else 'no start file'}")
        if a.start is None or b.start is None:
            return ("their start: the runs of one recorded none (trained before runs recorded their start), and "
                    "their start's other runs were trained from files of other content")
        return f"their start, which changed between runs ({start_change(b.config.model, a.start, b.start)})"
    return ("the tokenizer changed between runs (tokenizer key differs: another tokenizer file, "
            "or a tiedlm with another cache format)")


_LISTED = 8  # the most run folders a fix lists one by one for tiedlm compare


def _run_pattern(group: DataSet, others: list[DataSet]) -> tuple[str, str | None]:
    """How to name a group's runs: (in the message, as arguments of tiedlm compare that select them
    and no other group's, quoted for the shell). A glob where one does (PARENT/PREFIX*, which compare
    expands itself), else the folders; None for the arguments when there are more than _LISTED of
    them (runs of one prefix from two starts, say, which no glob tells apart)."""
    parents = {str(Path(r.path).parent) for r in group.runs}
    prefix = os.path.commonprefix([r.name for r in group.runs])
    if len(group.runs) > 1 and len(parents) == 1 and prefix.strip("-_.="):
        foreign = [r for g in others for r in g.runs if Path(r.path).name.startswith(prefix)]
        if not foreign:
            parent = parents.pop()
            pattern = f"{prefix}*" if parent in ("", ".") else str(Path(parent) / f"{prefix}*")
            return pattern, shlex.quote(pattern)
    paths = [r.path for r in group.runs]
    shown = " ".join(paths[:4]) + (" …" if len(paths) > 4 else "")
    return shown, " ".join(shlex.quote(p) for p in paths) if len(paths) <= _LISTED else None


def mixed_data_message(groups: list[DataSet]) -> str:
    """The one-line refusal when runs on different data (or from different starts) are given
    without --baseline."""
    n = sum(len(g.runs) for g in groups)
    patterns, args = zip(*(_run_pattern(g, [o for o in groups if o is not g]) for g in groups))
    starts = [only_start_differs(groups[0], g) for g in groups[1:]]
    noun, kinds, never, theirs = (("start", "starts", "from different starts", "from that variant's start")
                                  if all(starts) else
                                  ("data set", "data sets or starts", "on different data or from different starts",
                                   "on that variant's data, from its start") if any(starts) else
                                  ("data set", "data sets", "on different data", "on that variant's data"))

    def named(i: int) -> str:
        k = len(groups[i].runs)
        return f"{noun} {i + 1} ({patterns[i]}: {k} run{'s' if k != 1 else ''})"

    if len(groups) == 2:
        how = f"{named(0)} and {named(1)} differ in {data_difference(groups[0], groups[1])}"
    else:
        how = f"{named(0)} differs from " + "; from ".join(
            f"{named(i)} in {data_difference(groups[0], groups[i])}" for i in range(1, len(groups)))
    trained = f"from {len(groups)} different {kinds}" if all(starts) else f"on {len(groups)} different {kinds}"
    one = f" (tiedlm compare {args[0]})" if args[0] is not None else ""
    return (f"these {n} runs were trained {trained}, and runs {never} are never compared: {how} — compare the "
            f"runs of one {noun} at a time{one}, or pass --baseline VARIANT (a label or a run name) to compare the "
            f"variants trained {theirs}")
