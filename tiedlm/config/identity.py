"""What identifies a variant: the config hash, and the keys that do not count towards it.

A variant is a resolved config less its seed, its name, the operational keys (how a run is carried
out, not what it trains) and the keys added since the hash was first defined while they hold the
value that means "as before". Runs of one variant are its seeds; `compare` groups runs by it and a
rerun skips a finished run of it. config/__init__.py re-exports every name here.

Nothing here imports config/__init__.py at run time (config imports this module): the dataclasses appear
only in annotations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any

from .checks import flatten

if TYPE_CHECKING:
    from . import Config

_NO = object()

# Keys that change how a run is carried out but not what it trains: a run may resume with other
# values (another machine's thread count, a different checkpoint interval), and runs that differ
# only in them are seeds of one variant. Device, dtype and everything in the model, data and
# optimizer do change results, and are not here.
OPERATIONAL_KEYS = ("train.threads", "train.compile", "train.checkpoint_every", "train.log_every",
                    "train.eval_every", "train.eval_tokens", "eval.batch_size", "train.log_to",
                    "train.parallel", "train.processes")
# The periodic evaluation decides when early stopping ends a run and which weights keep_best keeps:
# with either on, its interval and slice are part of what a run is.
SELECTION_KEYS = ("train.eval_every", "train.eval_tokens")

# Keys added after the config hash was first defined, with the value that means "as before". At
# that value a key is left out of the config hash (and of the data's cache key, data/__init__.py),
# so that a config hashes the same whether it sets the key to that value or leaves it out.
ADDED_KEYS = {"train.keep_best": False, "train.early_stop_patience": 0, "train.early_stop_min_delta": 0.0,
              "train.log_to": [], "train.min_lr_ratio": None, "data.carve": "random", "data.test_from": "train",
              "data.train_fraction": 1.0, "model.tie_mode": None, "model.untie_rank": 0,
              "model.arch": "gpt2", "model.norm_eps": 1e-5, "model.n_kv_head": None, "model.intermediate_size": None,
              "model.multiple_of": 64, "model.rope_theta": 10000.0, "model.tie_strength": 0.0,
              "model.hf_config": None, "model.hf_overrides": None, "model.init_from": None, "model.tie_from": None,
              "model.vocab_size": None, "train.trainable": "all", "eval.also": None,
              "tokenizer.add_tokens": None, "train.fsdp_init": "full", "train.warmup": None}


def selects_checkpoints(cfg: Config) -> bool:
    """True when a config keeps its best weights or stops early (see SELECTION_KEYS)."""
    return bool(cfg.train.keep_best) or bool(cfg.train.early_stop_patience)


def operational_keys(cfg: Config) -> tuple[str, ...]:
    """OPERATIONAL_KEYS of this config: without SELECTION_KEYS when it selects checkpoints."""
    if selects_checkpoints(cfg):
        return tuple(k for k in OPERATIONAL_KEYS if k not in SELECTION_KEYS)
    return OPERATIONAL_KEYS


def variant_dict(cfg: Config) -> dict:
    """The resolved config without seed, name, the operational keys and ADDED_KEYS at their "as
    before" values: what identifies a variant."""
    out = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
    del out["seed"], out["name"]
    values = flat(cfg)
    for key in (*operational_keys(cfg), *(k for k, v in ADDED_KEYS.items() if values[k] == v)):
        section, leaf = key.split(".")
        out[section].pop(leaf, None)
    return out


def flat(cfg: Config, variant: bool = False) -> dict[str, Any]:
    """The config as dotted keys -> values (`model.n_embd`: 128), the view in which labels, matched
    twins and data sets compare configs; with `variant`, only the keys of variant_dict."""
    return flatten(variant_dict(cfg) if variant else dataclasses.asdict(cfg))


def config_hash(cfg: Config) -> str:
    """Identifies a variant: the hash of the resolved config, seed, name and OPERATIONAL_KEYS excluded."""
    blob = json.dumps(variant_dict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def with_added_keys(stored: dict) -> dict:
    """A stored config (a run folder's config.yaml, as written) with each key added since it was
    written at its "as before" value (ADDED_KEYS), so that it compares equal to the same config
    loaded today."""
    out = json.loads(json.dumps(stored))
    for key, value in ADDED_KEYS.items():
        section, leaf = key.split(".")
        if isinstance(out.get(section), dict):
            out[section].setdefault(leaf, value)
    return out


def diff_keys(a: dict, b: dict) -> list[str]:
    """Dotted keys whose values differ between two (nested) config dicts."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k, _NO) != fb.get(k, _NO))
