"""How a config's layers combine: YAML files with `base:` inheritance, and the rules by which a
higher layer (a file over its bases, the command line's `--set` options over the file) replaces
what a lower one set of the tie (tie_embeddings or tie_mode, a mode's rank or strength), the
budget (max_tokens or max_steps) and the block's biases. config/__init__.py builds and checks the result.

No torch, and nothing from config/__init__.py: this module works on plain dicts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..model.arch import DEFAULT, default_bias
from ..errors import ConfigError
from ..model.tie import RANKED, STRENGTHENED, Tie
from .yamlsafe import load_yaml, read_yaml_text


def _read_yaml(path: Path) -> dict:
    import yaml

    text = read_yaml_text(path, "config file")  # a regular file of bounded size, or one line that says why not
    try:
        data = load_yaml(text, str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}{where}: {problem} — fix the YAML syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys (name:, model:, train:, ...)")
    return data


def deep_merge(low: dict, high: dict) -> dict:
    out = dict(low)
    for key, value in high.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


_BUDGETS = ("max_tokens", "max_steps")


def _one_budget(merged: dict, layer: dict) -> dict:
    """A layer that sets one training budget replaces the other one set by a lower layer, so that
    `--set train.max_steps=200` on a config with `max_tokens` means what it says."""
    train = layer.get("train")
    if isinstance(train, dict) and isinstance(merged.get("train"), dict):
        given = [b for b in _BUDGETS if train.get(b) is not None]
        if len(given) == 1:
            other = _BUDGETS[1 - _BUDGETS.index(given[0])]
            if other not in train:
                merged["train"][other] = None
    return merged


def _one_tying(merged: dict, layer: dict) -> dict:
    """model.tie_embeddings is the short form of model.tie_mode tied/untied: a layer (a file, or
    one --set) that sets one of the two replaces what a lower layer set in the other, and a layer
    that sets both must agree with itself (soft, two matrices, is tie_embeddings false). A layer
    that picks a mode other than lowrank or split drops a lower layer's model.untie_rank (the rank
    belongs to them), and one that picks a mode other than soft its model.tie_strength."""
    model = layer.get("model")
    if not isinstance(model, dict) or not isinstance(merged.get("model"), dict):
        return merged
    mode, tie = model.get("tie_mode"), model.get("tie_embeddings")
    if "tie_mode" in model and "tie_embeddings" in model:
        if isinstance(mode, str) and isinstance(tie, bool) and _stored_tie_embeddings(mode) != tie:
            raise ConfigError(f"model.tie_mode {mode} and model.tie_embeddings {str(tie).lower()} disagree — "
                              "set one of them (tie_embeddings true/false is short for tie_mode tied/untied)")
    elif "tie_embeddings" in model:
        merged["model"].pop("tie_mode", None)
    elif "tie_mode" in model and isinstance(mode, str):
        merged["model"]["tie_embeddings"] = _stored_tie_embeddings(mode)
    chosen = mode if "tie_mode" in model else "tied/untied" if "tie_embeddings" in model else None
    if chosen is not None and chosen not in RANKED and "untie_rank" not in model:
        merged["model"].pop("untie_rank", None)  # the rank is the lowrank mode's: another mode drops it
    if chosen is not None and chosen not in STRENGTHENED and "tie_strength" not in model:
        merged["model"].pop("tie_strength", None)  # and the strength the soft mode's
    return merged


def _stored_tie_embeddings(mode: str) -> bool:
    """model.tie_embeddings as stored for a model.tie_mode: false for the modes of two matrices."""
    return not Tie(mode).two_matrices


def _normalize_tying(data: dict) -> dict:
    """tie_mode tied/untied is stored as tie_embeddings true/false (tie_mode null), so that a config
    that names the mode and one that uses the short form are one variant, with one hash; soft is
    stored with tie_embeddings false (a file that says soft and true is refused). And
    model.bias defaults to false for arch llama (true, the dataclass default, for gpt2): a layer
    that changes model.arch without setting model.bias drops a lower layer's bias (_arch_layer)."""
    model = data.get("model")
    if isinstance(model, dict) and model.get("tie_mode") in ("tied", "untied"):
        _one_tying({"model": {}}, {"model": model})  # the disagreement check
        model["tie_embeddings"] = model.pop("tie_mode") == "tied"
    elif isinstance(model, dict) and model.get("tie_mode") in STRENGTHENED:  # two matrices: tie_embeddings false
        _one_tying({"model": {}}, {"model": model})
        model["tie_embeddings"] = False
    if isinstance(model, dict) and "bias" not in model and default_bias(model.get("arch")) is False:
        model["bias"] = False  # a family without biases by default (Llama-style) has none unless model.bias asks
    return data


def _arch_of(data: dict) -> Any:
    model = data.get("model")
    return model.get("arch", DEFAULT) if isinstance(model, dict) else DEFAULT


def _arch_layer(before: Any, merged: dict, layer_keys: set[str]) -> dict:
    """Biases follow the block: a layer (a file, or every --set of a command line together) that
    changes model.arch from `before` (the lower layers' block) without setting model.bias drops a
    lower layer's bias, so the new block gets its own default (_normalize_tying). A layer that
    names the block it already has, or sets the bias too, keeps it."""
    model = merged.get("model")
    if "arch" in layer_keys and "bias" not in layer_keys and isinstance(model, dict) and model.get("arch") != before:
        model.pop("bias", None)
    return merged


# Real configs have a base: chain two or three files deep. Each level is a few frames of recursion,
# so a chain of a thousand files would end in a RecursionError; and files that each name one base
# twice read 2^depth files, so the files read for one config are bounded as well.
BASE_DEPTH_LIMIT = 16
BASE_FILES_LIMIT = 100


# Sections a config file may carry for the experiment around its runs, not for a run: compare
# --config's tuning grid (read by experiment/tuning_spec.read_tune_block).
EXPERIMENT_SECTIONS = ("tune",)


def run_sections(data: dict) -> dict:
    """A config file's data less its experiment sections (EXPERIMENT_SECTIONS): what a run reads."""
    return {k: v for k, v in data.items() if k not in EXPERIMENT_SECTIONS}


def _load_with_bases(path: Path, stack: tuple[Path, ...] = (), read: list[int] | None = None) -> dict:
    path = Path(os.path.realpath(path))  # not resolve(): on a loop of links it raises; reading it says so in a line
    if path in stack:
        chain = " -> ".join(p.name for p in (*stack, path))
        raise ConfigError(f"base: cycle in config files ({chain}) — remove one of the base: references")
    if len(stack) >= BASE_DEPTH_LIMIT:
        raise ConfigError(f"{stack[0].name}: its base: files nest more than {BASE_DEPTH_LIMIT} deep "
                          f"({stack[0].name} -> ... -> {path.name}) — merge some of them")
    read = [0] if read is None else read
    read[0] += 1
    if read[0] > BASE_FILES_LIMIT:
        raise ConfigError(f"{stack[0].name}: it and its base: files are more than {BASE_FILES_LIMIT} files "
                          "(a file named twice is read twice) — name each base once")
    data = _read_yaml(path)
    bases = data.pop("base", None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path.name}: base must be a file path or a list of file paths")
    merged: dict = {}
    for base in bases:
        layer = _load_with_bases(path.parent / base, (*stack, path), read)
        before = _arch_of(merged)
        merged = _arch_layer(before, _one_tying(_one_budget(deep_merge(merged, layer), layer), layer), _model_keys(layer))
    before = _arch_of(merged)
    return _arch_layer(before, _one_tying(_one_budget(deep_merge(merged, data), data), data), _model_keys(data))


def _model_keys(layer: dict) -> set[str]:
    model = layer.get("model")
    return set(model) if isinstance(model, dict) else set()
