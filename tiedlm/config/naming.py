"""Names tiedlm builds from config values: variant labels (`tied, n_embd=128`) and run folder
names (`base-n_embd=256-tied-s0`, `base-tie_embeddings=true-n_embd=64-s0`). Shared by compare and
sweep, so that neither imports the other; pure functions of plain values."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from . import parse_override


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


# The override keys that say which data a run trains on, and what a data file's name may end with
# (stripped from a run's data name: my.txt.gz names the data "my").
DATA_KEYS = ("data.path", "data.data_files")
_DATA_SUFFIX = re.compile(r"\.(txt|text|md|jsonl|json|csv|tsv|parquet|arrow|gz|bz2|xz|zst|zip|tar)$", re.IGNORECASE)
_BUILDER_NAMES = ("text", "json", "jsonl", "csv", "parquet")


def data_name(value: Any) -> str:
    """A short name for the data a data.path or data.data_files value names: a file's stem, a
    folder's name, a hub id's last part or a built-in corpus's name (corpus2.txt → corpus2,
    ../texts/ → texts, roneneldan/TinyStories → TinyStories, builtin:pydoc → pydoc); for a list or
    a split mapping, its (train) first file; a glob's part without wildcards."""
    if isinstance(value, dict):
        value = value.get("train", next(iter(value.values()), None))
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    text = scalar(value).strip() if value is not None else ""
    if text.startswith("builtin:"):
        text = text[len("builtin:"):]
    parts = [q for q in re.split(r"[\\/]+", text) if q not in ("", ".", "..", "~") and not re.search(r"[*?\[\]{}]", q)]
    name = parts[-1] if parts else ""
    while _DATA_SUFFIX.search(name) and _DATA_SUFFIX.sub("", name):
        name = _DATA_SUFFIX.sub("", name)
    name = sanitize(name)[:32].rstrip("._-=+")
    return name if name and name != "run" else "data"


def _data_tag(items: list[tuple[str, Any, str]]) -> str:
    """'my-1a2b3c4d' for --set data.path=my.txt: the data's short name (data_name of data.path, or
    of data.data_files where data.path is a builder such as text or is not overridden) and a hash
    of the data overrides as written, so that two files of one name, or two spellings of one path
    (which configs record as they are written), never share a run folder."""
    paths = [value for key, value, _ in items if key == DATA_KEYS[0]]
    files = [value for key, value, _ in items if key == DATA_KEYS[1]]  # the last of each counts, as in the config
    named = paths[-1] if paths and (not files or scalar(paths[-1]).strip() not in _BUILDER_NAMES) else files[-1]
    digest = hashlib.sha256(" ".join(item for _, _, item in items).encode()).hexdigest()[:8]
    return f"{data_name(named)}-{digest}"


# The override keys that say which model family a run is, named first in its runs' names.
FAMILY_KEYS = ("model.arch", "model.hf_config", "model.init_from")
_TAG_LIMIT = 48  # the longest the settings' part of a name gets before it is cut, with a hash


def _digest(items: list[str]) -> str:
    return hashlib.sha256(" ".join(items).encode()).hexdigest()[:8]


def names_file(value: str) -> bool:
    """Whether a model.hf_config value names a file (a path separator in it, or .json at its end),
    not a transformers model_type (qwen2): the one rule for run names, the model's build and compare."""
    return bool(re.search(r"[\\/]|\.json$", value.strip()))


def _family_tag(items: list[tuple[str, Any, str]]) -> str:
    """The family a run's overrides choose, in words: hf-qwen2 for model.arch=hf with
    model.hf_config=qwen2 (transformers' qwen2, never confused with tiedlm's own llama), llama for
    model.arch=llama, from-NAME-HASH for model.init_from=PATH and NAME-HASH for an hf_config file
    (a path's last part, with a hash of what was written: two files of one name never share a
    folder)."""
    chosen = dict.fromkeys(FAMILY_KEYS)
    for key, value, _ in items:  # the last of each counts, as in the config
        chosen[key] = value
    arch, family, start = chosen.values()  # in FAMILY_KEYS' order
    words = []
    if start is not None:
        words.append(f"from-{data_name(start)}-{_digest([scalar(start)])}")
    if family is not None:
        text = scalar(family).strip()
        words.append(f"{data_name(text)}-{_digest([text])}" if names_file(text) else f"hf-{sanitize(text)}")
    elif arch is not None and not (start is not None and scalar(arch) == "hf"):
        words.append(sanitize(scalar(arch)))
    return "-".join(words)


def _settings_tag(items: list[str], parts: list[str]) -> str:
    """'n_embd=256_lr=0.002' for the other overrides; past _TAG_LIMIT characters, as many as fit,
    then how many more and a hash of them all: 'n_kv_head=2_n_layer=4+3-c120b06a'."""
    tag = sanitize(",".join(parts))
    if len(tag) <= _TAG_LIMIT:
        return tag
    kept: list[str] = []
    for part in parts:
        if len(sanitize(",".join(kept + [part]))) > _TAG_LIMIT - 12:
            break
        kept.append(part)
    return sanitize(",".join(kept)) + f"+{len(parts) - len(kept)}-{_digest(items)}"


def _named(overrides: list[str]) -> list[tuple[str, Any, str]]:
    """(dotted key, value, the override as typed) of each override that names something in a run's
    name: seed and name overrides name nothing new."""
    out = []
    for item in overrides:
        keys, value = parse_override(item)
        if keys[0] not in ("seed", "name"):
            out.append((".".join(keys), value, item))
    return out


def _parts(items: list[tuple[str, Any, str]]) -> list[str]:
    """'n_embd=256' for each override: its key's last part and its value as YAML writes it."""
    return [f"{key.rsplit('.', 1)[-1]}={scalar(value)}" for key, value, _ in items]


def override_tag(overrides: list[str]) -> str:
    """'-n_embd=256_lr=0.002' for --set model.n_embd=256 --set train.lr=2e-3, so that runs of the
    config with other overrides get folders of their own instead of clashing with the plain runs.
    Seed and name overrides name nothing new. The family comes first, in words (_family_tag:
    '-hf-qwen2-…'), then the data (data.path, data.data_files: its short name and a hash of what
    was written, '-corpus2-1a2b3c4d'), then the other settings (_settings_tag), each read as
    written: a long list is cut and hashed, never replaced by a hash alone."""

    items = _named(overrides)
    family = [(k, v, i.strip()) for k, v, i in items if k in FAMILY_KEYS]
    data = [(k, v, i.strip()) for k, v, i in items if k in DATA_KEYS]
    rest = [item for item in items if item[0] not in FAMILY_KEYS + DATA_KEYS]
    tags = [_family_tag(family) if family else "", _data_tag(data) if data else "",
            _settings_tag([i for *_, i in rest], _parts(rest)) if rest else ""]
    tag = "-".join(t for t in tags if t)
    return "-" + tag if tag else ""


def legacy_override_tag(overrides: list[str]) -> str:
    """override_tag as it was before the family was named in words and a long list was cut
    (a hash alone, 'set-c120b06adb', of every override as typed where there is no data override):
    the names of runs trained then, so that an experiment of those runs carries on under their
    names (experiment/plan.py)."""

    items = _named(overrides)
    data = [(k, v, i.strip()) for k, v, i in items if k in DATA_KEYS]
    rest = [item for item in items if item[0] not in DATA_KEYS]
    tag = sanitize(",".join(_parts(rest))) if rest else ""
    if len(tag) > 48:
        tag = "set-" + hashlib.sha256(" ".join([i for *_, i in rest] if data else overrides).encode()).hexdigest()[:10]
    if data:
        tag = _data_tag(data) + ("-" + tag if tag else "")
    return "-" + tag if tag else ""


def yaml_value(value: Any) -> str:
    """A value as the text of `--set key=TEXT` that YAML reads back as the same value."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    return text.strip()


# A comparison's default folder under the runs folder: compare-NAME, NAME the experiment its runs
# share (the config's name with its overrides, as their run names begin). `compare/` alone is the
# folder every comparison went to before, still read (results, model cards) and never taken for a run.
COMPARISON_PREFIX = "compare"
_SEED_SUFFIX = re.compile(r"-s\d+$")


def common_name(run_names: list[str]) -> str:
    """The name a set of runs shares: the leading `-`-separated parts common to every run's name,
    its seed left off (shakespeare-tied-s0, shakespeare-untied-lr=0.01-s1 → shakespeare). Runs of
    several experiments with no part in common: their first parts joined by `+` (gpt2+llama), a hash
    of the names when that would be long."""
    if not run_names:
        return "runs"
    parts = [_SEED_SUFFIX.sub("", name).split("-") for name in run_names]
    common: list[str] = []
    for column in zip(*parts):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    name = sanitize("-".join(common)).strip("-") if common else ""
    if not name:
        firsts = sorted({p[0] for p in parts if p and p[0]})
        name = sanitize("+".join(firsts))
        if len(name) > 48:
            name = f"{len(run_names)}-runs-" + hashlib.sha256(" ".join(sorted(run_names)).encode()).hexdigest()[:8]
    return name


def is_run_of(run_name: str, prefix: str, tags: list[str]) -> bool:
    """Whether a run's name is one compare --config gives the runs of `prefix` with these variant
    tags: PREFIX-TAG-s0, or PREFIX-TAG-POINT-s0 for a tuning point; never another experiment's
    whose prefix merely begins alike (PREFIX-lr=0.01-tied-s0 is not of PREFIX)."""
    alternatives = "|".join(re.escape(t) for t in tags)
    return re.fullmatch(rf"{re.escape(prefix)}-({alternatives})(-.+)?-s\d+", run_name) is not None


def comparison_folder(experiment: str) -> str:
    """The default folder name of a comparison of `experiment`'s runs: compare-shakespeare."""
    return f"{COMPARISON_PREFIX}-{experiment}"
