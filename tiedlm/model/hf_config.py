"""model.arch: hf — any transformers causal LM, built from its configuration (never from hub
weights) and trained by tiedlm's loop like its own blocks.

`model.hf_config` names the family: a transformers model_type (`qwen2`, `gemma2`, `olmo2`, `phi3`,
`gpt_neox`, `llama`, `mistral`, …) or a local `config.json` or folder holding one. tiedlm's keys set
its size, mapped to transformers' field names (SIZE_FIELDS); `model.hf_overrides` sets any other
field. A size key the family's config does not have is refused in one line. The tie is the
config's `tie_word_embeddings` (and a nested text config's), set from tiedlm's tie, and asserted
by storage and by that flag wherever the model is built or loaded.

`hf_model.HFCausalLM` gives the model the interface tiedlm's loop, evaluation, checkpoints and counting ask
of `model.GPT`: E is the family's input embeddings, W_out its output embeddings. Where the head is
a plain linear map of the final hidden state (checked on the built model), the loss is tiedlm's
fused one over it; where it is not (Gemma 2's final-logit soft-capping, a logit scale), the
family's own logits are used, and the report says so (`HFCausalLM.head_kind`).

A file model.hf_config names (a local config.json, or a pretrained start's folder: model.init_from)
is named by its path in the config, so a run also knows it by content: `start_identity` (the file's
digest, and a start's weight files') is recorded in report.json, checked on a resume and compared
by compare, and `start_files` is what the run keeps a copy of, to be rebuilt from (runs/layout.py).

transformers is an optional extra: without it this arch says which extra to install.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .arch import HF_SIZE_FIELDS
from ..config.naming import names_file
from ..data.sources import file_stamps
from ..errors import ConfigError
from .pretrained import checkpoint_config

if TYPE_CHECKING:
    from types import ModuleType

    from transformers import PretrainedConfig

    from ..config import ModelConfig

SIZE_FIELDS = HF_SIZE_FIELDS  # tiedlm's size keys -> transformers' config fields (model/arch.py)
# The MLP's width where a family names it otherwise than intermediate_size, set from
# model.intermediate_size, else at the multiple of n_embd the family publishes: OPT's and XGLM's
# ffn_dim and Falcon's ffn_hidden_size are absolute (3072 at any width), so a d = 32 model had a
# 96·d MLP; GPT-2's n_inner is None for 4·d, kept unless set.
OTHER_MLP_FIELDS = {"ffn_dim": 4, "ffn_hidden_size": 4, "n_inner": None}
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")  # None: no row of E is a frozen padding row
NESTED = ("text_config",)  # multimodal configs keep the language model's fields here
EXTRA = "pip install -e '.[hf]' (transformers)"


def require_transformers() -> ModuleType:
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"model.arch: hf builds its model with transformers, which is not installed — {EXTRA}") \
            from None
    return transformers


def config_file(name: str) -> Path | None:
    """The file a model.hf_config names: a local config.json, or the one in a model folder (a
    pretrained start's); None for a transformers model_type, which names no file. One that is not
    there is refused in one line."""
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not (names_file(name) or path.exists()):
        return None
    if not path.is_file():
        raise ConfigError(f"model.hf_config {name}: no such config.json — give a transformers model_type "
                          "(qwen2, gemma2, olmo2, ...) or a local config.json or model folder")
    return path


def _base_config(name: str) -> tuple[str, dict, Any]:
    """(model_type, the fields a local config.json gives, the family's config built from them):
    a model_type names the family at its defaults; a config.json or a folder holding one, at its own."""
    transformers = require_transformers()
    path = config_file(name)
    data: dict = {}
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.hf_config {path} is not a JSON config ({exc}) — give a transformers "
                              "config.json") from None
        if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
            raise ConfigError(f"model.hf_config {path} has no model_type — give a transformers config.json")
        name = data.pop("model_type")
        data = {k: v for k, v in data.items() if k not in ("architectures", "transformers_version")}
    try:
        return name, data, transformers.AutoConfig.for_model(name, **data)
    except ValueError:
        raise ConfigError(f"model.hf_config {name!r} is not a transformers model_type — e.g. qwen2, gemma2, olmo2, "
                          "phi3, gpt_neox, llama, mistral (transformers "
                          f"{transformers.__version__}), or a local config.json") from None


def language_configs(cfg: PretrainedConfig) -> list[Any]:
    """The config and its nested language-model configs (text_config), each to be set alike."""
    return [cfg] + [getattr(cfg, k) for k in NESTED if getattr(cfg, k, None) is not None]


def hf_model_config(m: ModelConfig, vocab_size: int) -> PretrainedConfig:
    """The family's config with tiedlm's size, the vocabulary, the tie and model.hf_overrides set,
    built by the family's own config class from them (so that what it derives from the size, such
    as each layer's attention type, follows the size)."""
    if m.init_from:
        return _checkpoint_config(m, vocab_size)
    kind, data, probe = _base_config(m.hf_config)
    if any(getattr(probe, k, None) is not None for k in NESTED):
        raise ConfigError(f"model.hf_config {kind} keeps its language model in a nested config (text_config), which "
                          "tiedlm's sizes and vocabulary would not reach — use the family's text-only model_type "
                          f"(e.g. {kind}_text where transformers has one), or start from a checkpoint with "
                          "model.init_from")
    fields: dict[str, Any] = {}
    other_mlp = {f: ratio for f, ratio in OTHER_MLP_FIELDS.items() if hasattr(probe, f)}
    for field, ratio in other_mlp.items():  # OPT's ffn_dim: 3072 at any width unless set
        fields[field] = m.intermediate_size or (ratio * m.n_embd if ratio else None)
    for key, field in SIZE_FIELDS.items():
        if key in ("n_kv_head", "intermediate_size") and getattr(probe, field, None) is None:  # not every family's
            if key == "intermediate_size" and other_mlp:
                continue  # set above, under the family's own name
            if getattr(m, key) is not None:
                raise ConfigError(f"model.{key} does not apply to {kind} (its config has no {field}) — remove "
                                  f"model.{key}")
            continue
        fields[field] = {"n_kv_head": m.kv_heads, "intermediate_size": m.mlp_size}.get(key, getattr(m, key))
    if getattr(probe, "head_dim", None) is not None:
        fields["head_dim"] = m.n_embd // m.n_head  # tiedlm's head size, as its own blocks have it
    if isinstance(data.get("layer_types"), list) and len(data["layer_types"]) != m.n_layer:
        data.pop("layer_types")  # the family derives them again for this depth
    tied = m.tie.w_out_is_e
    fields.update(vocab_size=vocab_size, tie_word_embeddings=tied, use_cache=False,
                  **{t: None for t in TOKEN_FIELDS if hasattr(probe, t)})
    _check_overrides(m, kind, probe)
    base = buildable(kind, lambda: type(probe)(**{**data, **fields, **(m.hf_overrides or {})}))
    for c in language_configs(base):
        c.tie_word_embeddings = tied
    return base


def buildable(kind: str, build: Callable[[], Any]) -> Any:
    """build(), transformers' own code run on the user's settings, with what it raises for settings
    its family cannot take (a size it cannot divide, a field with no setter, an override of the
    wrong type, a rotary size that does not fit the head) said in one line, and its log quiet
    meanwhile (its warnings on such settings print whole configs). Out of memory passes through."""
    transformers = require_transformers()
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity(transformers.utils.logging.CRITICAL)  # its errors precede its raise
    try:
        return build()
    except (ConfigError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":
            raise
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"model.hf_config {kind} cannot be built with these settings ({type(exc).__name__}: "
                          f"{why}) — check model.hf_overrides and the sizes against transformers' config of "
                          f"{kind}, or choose another family") from None
    finally:
        transformers.utils.logging.set_verbosity(verbosity)


DTYPE_KEYS = ("dtype", "torch_dtype")  # the weights' precision, which train.dtype decides


def _check_overrides(m: ModelConfig, kind: str, probe: PretrainedConfig) -> None:
    for key in (m.hf_overrides or {}):
        if key in DTYPE_KEYS:
            raise ConfigError(f"model.hf_overrides: {key} would set the weights' precision behind train.dtype, "
                              "which the report states — drop it and use --set train.dtype=bf16 (or fp32)")
        if not hasattr(probe, key):
            raise ConfigError(f"model.hf_overrides: {key} is not a field of {kind}'s config — check its name in "
                              f"transformers' {type(probe).__name__}")
        if key == "tie_word_embeddings" or key in SIZE_FIELDS.values() or key == "vocab_size":
            raise ConfigError(f"model.hf_overrides: {key} is set by tiedlm's own key — use {_own_key(key)} instead")


def _checkpoint_config(m: ModelConfig, vocab_size: int) -> PretrainedConfig:
    """A pretrained start's config: the checkpoint's own (its size, vocabulary and token ids), with
    model.hf_overrides and the run's tie set on it, and its vocabulary grown to `vocab_size` where
    new tokens need more rows (tokenizer.add_tokens)."""
    base = checkpoint_config(Path(m.hf_config))
    base.vocab_size = max(base.vocab_size, vocab_size)
    _check_overrides(m, base.model_type, base)
    for key, value in (m.hf_overrides or {}).items():
        setattr(base, key, value)
    base.use_cache = False
    for c in language_configs(base):
        c.tie_word_embeddings = m.tie.w_out_is_e
    return base


def _own_key(field: str) -> str:
    if field == "tie_word_embeddings":
        return "model.tie_embeddings"
    if field == "vocab_size":
        return "tokenizer.vocab_size"
    return "model." + next(k for k, f in SIZE_FIELDS.items() if f == field)


def config_flags_tied(cfg: PretrainedConfig) -> list[bool]:
    """tie_word_embeddings of the config and of each nested language config."""
    return [bool(getattr(c, "tie_word_embeddings", False)) for c in language_configs(cfg)]


# ------------------------------------------------------------------ a run's start, known by its content

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")  # what transformers loads


def start_files(m: ModelConfig) -> dict[str, Path]:
    """What a run keeps of its start (runs/layout.py START), by the name the copy takes: model.hf_config's
    file as config.json (a pretrained start's config.json, or a local config.json), and a pretrained
    start's tokenizer.json where it has one. Nothing for a transformers model_type or tiedlm's own
    blocks, which name no file."""
    path = config_file(m.hf_config) if m.family.built_by_transformers and m.hf_config else None
    if path is None:
        return {}
    tokenizer = path.parent / "tokenizer.json"
    return {"config.json": path, **({"tokenizer.json": tokenizer} if m.init_from and tokenizer.is_file() else {})}


def start_identity(m: ModelConfig) -> dict | None:
    """What a run starts from, by content: `config`, the digest of model.hf_config's file, and for
    a pretrained start (model.init_from) `weights`, each weight file's digest by its name
    (safetensors, bin and their sharded indexes). None where the start names no file (a model_type:
    the family's defaults, which the transformers version in the report fixes; tiedlm's own blocks).
    Training records it in report.json beside the data's identity; a resume refuses a start that
    changed, and compare never pools runs of different starts. Each file is hashed once per size,
    mtime, ctime and inode it shows (the data files' digest memo), so a start's gigabytes are read
    once, not at every run."""
    files = start_files(m)
    if not files:
        return None
    config = files["config.json"]
    # by the name the start's folder gives each file, its content read through any link (a hub
    # cache's snapshot links each name to a blob named by its hash)
    weights = sorted({p for pattern in WEIGHT_FILES for p in config.parent.glob(pattern)}) if m.init_from else []
    stamps, _ = file_stamps([config.resolve(), *(p.resolve() for p in weights)])
    ident: dict = {"config": stamps[0][2]}
    if m.init_from:
        ident["weights"] = {p.name: digest for p, (_, _, digest) in zip(weights, stamps[1:])}
    return ident


def start_change(m: ModelConfig, before: dict, after: dict | None) -> str:
    """How a start differs from the one a run recorded, in words: 'model.init_from runs/export: its
    model.safetensors differs' (the files whose digests differ), or 'model.hf_config my.json: its
    content differs'."""
    after = after or {}
    if not m.init_from:
        return f"model.hf_config {m.hf_config}: its content differs"
    w0, w1 = before.get("weights") or {}, after.get("weights") or {}
    names = (["config.json"] if before.get("config") != after.get("config") else []) + \
        sorted(n for n in set(w0) | set(w1) if w0.get(n) != w1.get(n))
    shown = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names) or "files"
    return f"model.init_from {m.init_from}: its {shown} differ{'s' if len(names) == 1 else ''}"
