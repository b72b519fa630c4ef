"""Matched contrasts in grids: when variants differ in more than the tying keys
(model.tie_embeddings, model.untie_at), each tied variant is contrasted with the untied variant
identical in every other key (and resolved to the same device type and dtype), so that the tying
effect is measured at each setting of everything else. Without --baseline these are the main
result of a grid; the embedding share of parameters (V·d / the untied total) says how much of the
model tying touches at each setting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..config.naming import scalar, short_keys
from .variants import TYING_KEYS, Contrast, SplitContrast, Variant, versus
from ..config.identity import flat


@dataclass
class MatchedContrast:
    """A tied variant against the untied variant with the same setting of every other key."""

    setting: dict[str, Any]  # the differing keys other than the tying keys -> their value here
    label: str  # the setting in short keys: "n_embd=64"
    tied: str  # the tied variant's label
    untied: str  # the untied variant's label
    contrast: Contrast  # the tied variant's vs_baseline (kind "matched")
    embedding_share: float | None  # V·d / the untied model's total parameters
    tied_params: int | None
    untied_params: int | None

    def split(self, name: str) -> SplitContrast | None:
        return self.contrast.split(name)

    def to_json(self, primary: str) -> dict:
        """The row of the tying-effect table, on the primary split (the whole contrast is the tied
        variant's vs_baseline)."""
        d = self.split(primary)
        return {"setting": self.setting, "label": self.label, "tied": self.tied, "untied": self.untied,
                "split": primary, "tied_perplexity": d.variant_mean if d else None,
                "untied_perplexity": d.baseline_mean if d else None,
                "effect": d.relative if d else None, "ci_low": d.relative_ci_low if d else None,
                "ci_high": d.relative_ci_high if d else None, "p_value": d.p_value if d else None,
                "test": d.test if d else None, "seeds": d.seeds if d else None,
                "embedding_share": self.embedding_share, "tied_params": self.tied_params,
                "untied_params": self.untied_params,
                "power": d.power.to_json() if d and d.power else None}


def _setting_key(v: Variant, tuned: Sequence[str] = ()) -> str:
    """Everything but the tying keys and the tuned ones (each variant's own choice), and the
    resolution: what a matched pair shares."""

    view = {k: val for k, val in flat(v.config, variant=True).items() if k not in TYING_KEYS and k not in tuned}
    return json.dumps({"config": view, "resolution": v.resolution}, sort_keys=True, default=str)


def _share(untied: Variant) -> float | None:
    """V·d / total of the untied model (its input embedding E is V·d)."""
    wte, total = untied.params.get("wte"), untied.params.get("total")
    if isinstance(wte, int) and isinstance(total, int) and total > 0:
        return wte / total
    return None


def matched_contrasts(variants: list[Variant], differing_keys: list[str],
                      tuned: Sequence[str] = ()) -> list[MatchedContrast]:
    """One contrast per tied variant that has exactly one untied twin; [] when the variants differ
    only in the tying keys (then a single baseline serves). Sets each paired tied variant's
    vs_baseline. In the order of the settings, then the tied labels. `tuned`: keys each variant
    chose for itself (tuning), which twins may differ in."""

    other = [k for k in differing_keys if k not in TYING_KEYS]
    if not other:
        return []
    groups: dict[str, list[Variant]] = {}
    for v in variants:
        groups.setdefault(_setting_key(v, tuned), []).append(v)
    short = short_keys(other)
    out = []
    for members in groups.values():
        untied = [v for v in members if v.tied is False]
        if len(untied) != 1:
            continue
        ref = untied[0]
        for tied in sorted((v for v in members if v.tied), key=lambda v: v.label):
            # The values from the whole config (as the labels take theirs): a key that is operational
            # here (eval_every without keep_best) is not part of the variant, yet it has a value.
            values = flat(tied.config)
            setting = {k: values[k] for k in other}
            tied.vs_baseline = versus(tied, ref, kind="matched", tuned=tuned)
            out.append(MatchedContrast(
                setting=setting, label=", ".join(f"{short[k]}={scalar(values[k])}" for k in other),
                tied=tied.label, untied=ref.label, contrast=tied.vs_baseline, embedding_share=_share(ref),
                tied_params=tied.params.get("total"), untied_params=ref.params.get("total")))
    _name_the_ties(out, variants)
    return sorted(out, key=lambda m: (_sort_key(m.setting, other), m.tied))


def _tie_words(v: Variant) -> str:
    """The tied variant's tie as the reports name it: 'tied', 'lowrank r=8', 'tied, untie_at=0.5'."""
    m = v.config.model
    return m.tie.label + (f", untie_at={scalar(m.untie_at)}" if m.untie_at is not None else "")


def _name_the_ties(matched: list[MatchedContrast], variants: list[Variant]) -> None:
    """Where the tied variants are not all plain tied (a grid over tie modes, or untie_at), each
    row's label starts with its tie, so that two modes at one setting never read as one row."""
    by_label = {v.label: v for v in variants}
    words = {m.tied: _tie_words(by_label[m.tied]) for m in matched}
    if set(words.values()) <= {"tied"}:
        return
    for m in matched:
        m.label = f"{words[m.tied]}, {m.label}"


def _sort_key(setting: dict[str, Any], keys: list[str]) -> tuple:
    """Numbers in numeric order, anything else after them as text."""
    out = []
    for k in keys:
        v = setting.get(k)
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        out.append((0, float(v), "") if numeric else (1, 0.0, str(v)))
    return tuple(out)


def numeric_key(matched: list[MatchedContrast]) -> str | None:
    """The swept key to plot the effect against: the one differing key when its values are numbers."""
    keys = {k for m in matched for k in m.setting}
    if len(keys) != 1:
        return None
    key = keys.pop()
    values = [m.setting[key] for m in matched]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return key
    return None
