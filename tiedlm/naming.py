"""Names tiedlm builds from config values: variant labels (`tied, n_embd=128`) and run folder
names (`base-n_embd=256-tied-s0`, `base-tie_embeddings=true-n_embd=64-s0`). Shared by compare and
sweep, so that neither imports the other; pure functions of plain values."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any


def scalar(value: Any) -> str:
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


def sanitize(text: str) -> str:
    """Keep run names portable folder names: letters, digits and . _ = + - only."""
    text = re.sub(r"[^A-Za-z0-9._=+-]+", "_", text)
    return text.lstrip(".") or "run"


def override_tag(overrides: list[str]) -> str:
    """'-n_embd=256,lr=0.002' for --set model.n_embd=256 --set train.lr=2e-3, so that runs of the
    config with other overrides get folders of their own instead of clashing with the plain runs
    (a hash when that would be long). Seed and name overrides name nothing new."""
    from .config import parse_override

    parts = []
    for item in overrides:
        keys, value = parse_override(item)
        if keys[0] in ("seed", "name"):
            continue
        parts.append(f"{keys[-1]}={scalar(value)}")
    if not parts:
        return ""
    tag = sanitize(",".join(parts))
    if len(tag) > 48:
        tag = "set-" + hashlib.sha256(" ".join(overrides).encode()).hexdigest()[:10]
    return "-" + tag


def yaml_value(value: Any) -> str:
    """A value as the text of `--set key=TEXT` that YAML reads back as the same value."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    return text.strip()
