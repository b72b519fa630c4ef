"""Starting from a pretrained model: `model.init_from`, read while a config is resolved.

`model.init_from` names a transformers model folder (a `tiedlm export`, or any causal LM saved with
`save_pretrained`), or a hub id where the network allows. The run is then that model: its family
(`model.arch: hf`, `model.hf_config` the folder), its size and its vocabulary are the checkpoint's
(a size key set to another value is refused, since the weights could not take it), and with no
tokenizer keys set the tokenizer is the folder's own `tokenizer.json`.

The run's tie is set against the checkpoint as it comes (hf_model.HFCausalLM applies it):
- a tied checkpoint kept tied, an untied one kept untied: the weights as they are;
- a tied checkpoint untied: W_out starts as a copy of E (untie by copy; never a random head);
- an untied checkpoint tied: the one matrix starts from E (`model.tie_from: e`, as transformers'
  own tie_weights does), from W_out (`w_out`), or from their mean (`mean`).

`train.trainable` trains all parameters (default), the head alone (W_out and its bias; E when
tied, since it is W_out), or the embeddings alone (E, W_out and a learned position table); the rest
are frozen (model.freeze_all_but).

`model.arch` beside `init_from` is refused unless it is `hf`: the checkpoint's own family is built.

No torch here; transformers is imported only to read a checkpoint's config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .arch import HF_SIZE_FIELDS
from ..errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TIE_FROM = ("e", "w_out", "mean")  # model.tie_from: where the one matrix of a tied untied checkpoint starts
TRAINABLE = ("all", "head", "embeddings")  # train.trainable
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name


def checkpoint_folder(name: str) -> Path:
    """The local folder of model.init_from: a folder holding config.json, or a hub id downloaded
    where the network allows (config, tokenizer and safetensors weights). One line otherwise."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.init_from {name}: the folder has no config.json — point it at a transformers "
                              "model folder (tiedlm export RUN --out DIR, or a model saved with save_pretrained)")
        return path.resolve()
    if not _HUB_ID.match(name) or path.exists():
        raise ConfigError(f"model.init_from {name}: no such model folder — give a tiedlm export, a folder saved "
                          "with save_pretrained, or a hub id (owner/name); a run trained from a folder that was "
                          "moved resumes once it is back at this path (eval, sample and export read its start/ copy)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as exc:  # offline, unknown id, gated: the hub's own errors vary by version
        raise ConfigError(f"model.init_from {name}: not a local folder, and the hub could not give it "
                          f"({type(exc).__name__}) — if it is a folder, check its path (relative to {Path.cwd()}); "
                          f"if a hub id, download it where the network allows (huggingface-cli download {name} "
                          "--local-dir DIR) and set model.init_from: DIR") from None


def checkpoint_config(folder: Path) -> PretrainedConfig:
    """The checkpoint's transformers config (its own class, with its attribute names)."""
    try:
        import transformers
    except ImportError:
        raise ConfigError("model.init_from loads a transformers model, and transformers is not installed — "
                          "pip install -e '.[hf]' (transformers)") from None
    try:
        return transformers.AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"model.init_from {folder}: its config.json is not one transformers reads "
                          f"({str(exc).splitlines()[0][:160]})") from None


def checkpoint_sizes(config: PretrainedConfig) -> dict[str, int]:
    """tiedlm's size keys as the checkpoint has them (a family without grouped-query attention or
    an intermediate_size field leaves those keys out)."""
    sizes = {}
    for key, field in HF_SIZE_FIELDS.items():
        value = getattr(config, field, None)
        if value is not None:
            sizes[key] = int(value)
    sizes["vocab_size"] = int(config.vocab_size)
    return sizes


def checkpoint_tied(config: PretrainedConfig) -> bool:
    """The checkpoint's tie as its config states it (every nested language config must agree)."""
    flags = {bool(getattr(c, "tie_word_embeddings", False))
             for c in [config, getattr(config, "text_config", None)] if c is not None}
    if len(flags) > 1:
        raise ConfigError("model.init_from: the checkpoint's config and its text_config disagree on "
                          "tie_word_embeddings — fix the folder's config.json")
    return flags.pop()


def resolve(data: dict) -> dict:
    """The raw config (after overrides) with model.init_from's checkpoint applied: arch hf, the
    family's config the folder, the size and vocabulary the checkpoint's (model.block_size may be
    shorter than its longest context), the tokenizer the folder's when tokenizer.kind is not set.
    A size key set to another value is refused."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("init_from") is None:
        return data
    name = model["init_from"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"model.init_from must be a model folder or hub id, got {name!r} — e.g. runs/export "
                          "(tiedlm export RUN --out runs/export)")
    if model.get("arch") not in (None, "hf"):  # the checkpoint's own class is built, through transformers
        raise ConfigError(f"model.arch is {model['arch']!r}, but model.init_from builds the checkpoint's own family "
                          "(model.arch: hf) — remove model.arch, or set it to hf (--set model.arch=hf)")
    folder = checkpoint_folder(name)
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ConfigError(f"model.init_from {name}: the folder has a config.json but no weights (*.safetensors or "
                          "*.bin) — point it at a folder saved with save_pretrained")
    sizes = checkpoint_sizes(checkpoint_config(folder))
    longest = sizes.pop("block_size", None)  # a shorter context than the checkpoint's longest is fine
    for key, value in sizes.items():
        given = model.get(key)
        if given is not None and given != value:
            raise ConfigError(f"model.{key} is {given}, but the checkpoint in {name} has {value} — remove model.{key} "
                              "(the size of a pretrained start is the checkpoint's)")
    if longest is not None:
        given = model.get("block_size")
        if isinstance(given, int) and given > longest:
            raise ConfigError(f"model.block_size is {given}, but the checkpoint in {name} holds positions up to "
                              f"{longest} — set model.block_size to {longest} or less")
        sizes["block_size"] = given if isinstance(given, int) else longest
    if model.get("hf_config") not in (None, str(folder)):
        raise ConfigError(f"model.hf_config is {model['hf_config']!r}, but model.init_from gives the family — remove "
                          "model.hf_config")
    model.update(sizes, arch="hf", hf_config=str(folder))
    tokenizer = data.get("tokenizer") or {}
    if isinstance(tokenizer, dict) and "kind" not in tokenizer:  # the folder's own (its other keys kept)
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"model.init_from {name}: the folder has no tokenizer.json — set tokenizer.kind: "
                              "pretrained and tokenizer.path to the tokenizer the checkpoint was trained with")
        data["tokenizer"] = {**tokenizer, "kind": "pretrained", "path": str(folder / "tokenizer.json")}
    return data


def describe_start(checkpoint_is_tied: bool, run_tied: bool, tie_from: str | None) -> str:
    """What the run's tie does to the checkpoint's, in words (the run report's line)."""
    if checkpoint_is_tied == run_tied:
        return f"kept {'tied' if run_tied else 'untied'}"
    if checkpoint_is_tied:
        return "untied by copy: W_out starts as a copy of E"
    return {"e": "tied from E: W_out's weights dropped", "w_out": "tied from W_out: E starts as W_out",
            "mean": "tied from the mean of E and W_out"}[tie_from or "e"]
