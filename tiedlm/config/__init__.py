"""Experiment configuration: typed dataclasses, YAML with `base:` inheritance, `--set` overrides.

Precedence, lowest first (written down once, here):
    dataclass defaults -> `base:` file(s), in order -> this file -> `--set a.b=value` (in order) -> `--seed`

This module imports no torch, so `tiedlm --help` and config errors are instant.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .checks import validate
from ..model.arch import Arch, arch_of
from .layers import _arch_layer, _arch_of, _load_with_bases, _normalize_tying, _one_budget, _one_tying, run_sections
from ..model import pretrained
from ..errors import ConfigError
from ..model.tie import Tie
from .yamlsafe import load_yaml


@dataclass
class SyntheticConfig:
    """Parameters of `builtin:synthetic`: a class-based Markov language with an exact entropy rate."""

    vocab_size: int = 2048  # number of distinct words
    n_classes: int = 32  # latent word classes; each word belongs to exactly one
    successors: int = 4  # each class can be followed by this many classes (a sparse Markov chain)
    zipf: float = 1.1  # exponent of the Zipf law of words within a class
    train_tokens: int = 1_000_000  # words generated for each split
    validation_tokens: int = 100_000
    test_tokens: int = 100_000
    seed: int = 0  # the corpus seed; independent of the run seed so that seeds share data


@dataclass
class DataConfig:
    """Where the text comes from and how it is split."""

    path: str = "builtin:synthetic"  # hub id, local folder/file, builder name, load_from_disk folder or builtin:NAME
    name: str | None = None  # the Hugging Face config name, e.g. wikitext-2-raw-v1
    data_files: Any = None  # path, glob, list, or {split: files}, for builders and local folders
    revision: str | None = None  # hub revision (branch, tag or commit)
    text_column: str = "text"
    train_split: str = "train"
    validation_split: str | None = "validation"  # used when the dataset has it, else carved from train
    test_split: str | None = "test"
    validation_fraction: float = 0.05  # of the training documents, when there is no validation split
    test_fraction: float = 0.05  # of the documents of data.test_from's split, when there is no test split
    split_seed: int = 0  # the carving is deterministic for this seed (not the run seed: seeds share data)
    carve: str = "random"  # random (documents drawn by split_seed) | contiguous (blocks in source order, at the end)
    test_from: str = "train"  # the split test is carved from: train | validation (test_fraction is then of it)
    streaming: bool = False  # stream from the hub instead of downloading whole; needs max_train_tokens
    max_train_tokens: int | None = None  # keep at most this many training tokens
    train_fraction: float = 1.0  # train on the first fraction of the training tokens (a data-size axis)
    max_eval_tokens: int | None = None  # keep at most this many tokens of each evaluation split
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class TokenizerConfig:
    kind: str = "word"  # bpe | word | char | byte | pretrained
    vocab_size: int = 8192  # the most the tokenizer may have; the model gets the real size
    path: str | None = None  # tokenizer.json for kind=pretrained
    eot_token: str | None = None  # pretrained: the token between documents; None = find <|endoftext|>, </s>, ...
    max_train_bytes: int = 50_000_000  # text used to train bpe/word/char vocabularies
    pad_to_multiple: int = 1  # pad the model's vocabulary to a multiple of this (64 is common on GPUs)
    # pretrained: new tokens, a list of strings or N, the N most frequent pieces of the training text (as
    # the tokenizer's pre-tokenizer cuts them) that it splits or reads as <unk>; their rows of E and W_out
    # start from the old rows' mean and covariance, and their loss is a bucket of its own
    add_tokens: Union[list[str], int, None] = None


@dataclass
class ModelConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms (GPT-2: true)
    # The tie, in its stored form (model/tie.py): read it as `.tie`, build another with `.with_tie`.
    tie_embeddings: bool = True  # W_out = E, one Parameter used twice (Press & Wolf 2017)
    untie_at: float | None = None  # fraction of training after which a tied model splits in two
    tie_mode: str | None = None  # projection | lowrank | split | soft | pull (None: tie_embeddings says)
    untie_rank: int = 0  # lowrank: W_out = E + A·Bᵀ, A (V×r), B (d×r); split: r columns of its own; 0 is tied
    tie_strength: float = 0.0  # soft: λ of the loss' λ/2·‖W_out − E‖²; pull: its decoupled step's λ
    embed_scale: str = "1"  # "1" or "sqrt_d": multiply token embeddings by sqrt(n_embd) (Vaswani et al.)
    lm_head_bias: bool = False  # a bias on the output projection; never shared
    # The block (model/blocks.py): gpt2 (LayerNorm, GELU MLP, learned positions) or llama (RMSNorm,
    # SwiGLU, rotary positions, grouped-query attention; no biases unless model.bias says so).
    arch: str = "gpt2"
    norm_eps: float = 1e-5  # epsilon of every LayerNorm (gpt2) or RMSNorm (llama)
    n_kv_head: int | None = None  # llama: key/value heads (grouped-query attention); None: n_head
    intermediate_size: int | None = None  # llama: SwiGLU width; None: 8/3·n_embd rounded up to multiple_of
    multiple_of: int = 64  # llama: the rounding of the default intermediate_size
    rope_theta: float = 10000.0  # llama: base of the rotary embeddings' frequencies
    # hf (hf_config.py): any transformers causal LM, built from its configuration: a model_type (qwen2, gemma2,
    # olmo2, ...) or a local config.json or folder; hf_overrides sets any other field of that config
    hf_config: str | None = None
    hf_overrides: dict | None = None
    # a pretrained start (model/pretrained.py): a transformers model folder or hub id, whose family, size,
    # vocabulary and (with no tokenizer keys) tokenizer the run takes; tie_from: where the one matrix
    # of an untied checkpoint tied starts (e, w_out or mean; None: e)
    init_from: str | None = None
    tie_from: str | None = None
    vocab_size: int | None = None  # the model's vocabulary; None: the tokenizer's, padded (init_from sets it)

    @property
    def kv_heads(self) -> int:
        """Key/value heads: model.n_kv_head, or one per query head."""
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def family(self) -> Arch:
        """The block family model.arch names, the one value every module asks (arch.Arch)."""
        return arch_of(self.arch)

    @property
    def mlp_size(self) -> int:
        """The MLP's hidden width: 4·n_embd (gpt2); for llama model.intermediate_size, or Llama's
        rule, 8/3·n_embd rounded up to a multiple of model.multiple_of."""
        return self.family.mlp_size(self.n_embd, self.intermediate_size, self.multiple_of)

    @property
    def tie(self) -> Tie:
        """The tie between E and W_out, the one value every module asks."""
        return Tie.stored(self.tie_embeddings, self.tie_mode, self.untie_rank, self.tie_strength)

    def with_tie(self, tie: Tie) -> ModelConfig:
        """This model config with another tie (untie_at kept: it is the schedule, not the tie)."""
        return dataclasses.replace(self, **tie.fields())


@dataclass
class TrainConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto (bf16 autocast where the hardware has it, else fp32) | fp32 | bf16
    compile: bool = False  # torch.compile the model
    threads: int | str = "auto"  # CPU threads: auto follows the load (tiedlm.threads); 0 torch's default; or a count
    batch_size: int = 32  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    max_tokens: int | None = None  # training budget in tokens (one of max_tokens / max_steps)
    max_steps: int | None = None  # training budget in optimizer steps
    lr: float = 1e-3
    min_lr: float = 1e-4  # cosine decay ends here (absolute)
    min_lr_ratio: float | None = None  # or here, as a fraction of lr (replaces min_lr); see effective_min_lr
    warmup_steps: int = 100  # linear warmup from 0
    warmup: float | None = None  # or over this fraction of the steps (replaces warmup_steps); see warmup_steps_for
    weight_decay: float = 0.1  # on matrices; never on biases and LayerNorm gains
    decay_embeddings: bool = True  # whether E, W_out and the position embeddings are weight-decayed
    trainable: str = "all"  # all | head (W_out and its bias; E when tied) | embeddings (E, W_out, positions)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    eval_every: int = 200  # steps between evaluations on a fixed validation slice; 0 disables
    eval_tokens: int = 65_536  # tokens in that slice
    checkpoint_every: int = 500  # steps between checkpoints; 0 writes only the final one
    log_every: int = 10  # steps between training-loss lines in metrics.jsonl
    max_skipped: int = 0  # non-finite steps to skip before the run counts as diverged
    keep_best: bool = False  # keep the weights of the best periodic evaluation; score them at the end too
    early_stop_patience: int = 0  # stop after this many evaluations without improvement; 0 never stops
    early_stop_min_delta: float = 0.0  # a fall in validation loss (nats) must exceed this to count as improvement
    log_to: list[str] = field(default_factory=list)  # loggers beside metrics.jsonl: tensorboard (<run>/tb/)
    parallel: str = "ddp"  # under torchrun: ddp (a whole model per rank) | fsdp (sharded, FSDP2; docs/fsdp.md)
    fsdp_init: str = "full"  # fsdp: full (built whole, then sharded: one process's weights) | meta (sharded as built)
    processes: int | None = None  # fsdp runs compare --config launches: torchrun's processes (None: the GPUs, or 2)


@dataclass
class EvalConfig:
    splits: list[str] = field(default_factory=lambda: ["validation", "test"])  # scored at the end
    stride: int | None = None  # window stride; None = block_size (every token scored once, no overlap)
    buckets: list[float] = field(default_factory=lambda: [0.1, 0.5])  # cumulative vocabulary fractions
    batch_size: int = 16
    # another data set (a data section's keys) whose test split is scored with the run's tokenizer
    # before training and after: what an adaptation forgets of its old domain (tokenizer.kind pretrained)
    also: dict | None = None


@dataclass
class Config:
    name: str = "run"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# --------------------------------------------------------------------------------------------
# Building dataclasses from nested dicts, with type checks and "did you mean" for unknown keys


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        keys.append(key)
        if dataclasses.is_dataclass(hints[f.name]):
            keys.extend(_all_keys(hints[f.name], key + "."))
    return keys


ALL_KEYS = _all_keys(Config)


def _unknown_key(key: str) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    # a known field put in the wrong section (data.n_embd -> model.n_embd) first, then a typo
    close = [k for k in ALL_KEYS if k.rsplit(".", 1)[-1] == leaf][:1]
    close = close or difflib.get_close_matches(key, ALL_KEYS, n=1, cutoff=0.6)
    hint = f" — did you mean {close[0]}?" if close else " (see the config reference in docs/configuration.md)"
    return ConfigError(f"unknown key {key}{hint}")


# what a mapping-valued key's type error shows as an example (YAML's inline form, as --set takes it)
_MAPPING_EXAMPLES = {"model.hf_overrides": "{rms_norm_eps: 1.0e-6}", "eval.also": "{path: builtin:shakespeare}"}


def _type_name(tp: Any, key: str = "") -> str:
    """A type as a config error says it: an integer, true/false, a mapping such as {rms_norm_eps: 1.0e-6}."""
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a, key) for a in typing.get_args(tp))
    if origin is list:
        (arg,) = typing.get_args(tp)
        return f"a list of {_type_name(arg, key)}"
    if tp is dict:
        return f"a mapping such as {_MAPPING_EXAMPLES.get(key, '{key: value}')}"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


_NO = object()
# Other spellings of a value, replaced while the config is built (validation changes nothing).
_ALIASES = {"model.embed_scale": {"1.0": "1", "none": "1", "None": "1",
                                  "sqrt": "sqrt_d", "sqrt(d)": "sqrt_d", "sqrt_n_embd": "sqrt_d"}}


_EXPONENT = re.compile(r"^[-+]?([0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")  # 1e-6, 2.5E+3


def _coerce(value: Any, tp: Any) -> Any:
    """Return value as type tp, or _NO. Accepts ints for floats and '1e-3' strings for numbers."""
    if tp is Any:
        return value
    if tp is type(None):
        return None if value is None else _NO
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            out = _coerce(value, arg)
            if out is not _NO:
                return out
        return _NO
    if origin is list:
        (arg,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            return _NO
        items = [_coerce(v, arg) for v in value]
        return _NO if any(i is _NO for i in items) else items
    if tp is dict:  # model.hf_overrides: a mapping with string keys, its values as YAML gives them, but
        # 1e-6 as the number it is: PyYAML (YAML 1.1) reads an exponent without a dot as a string, which
        # transformers would keep as the string '1e-6' (rms_norm_eps: 1e-6, as published configs write it)
        if not (isinstance(value, dict) and all(isinstance(k, str) for k in value)):
            return _NO
        return {k: float(v) if isinstance(v, str) and _EXPONENT.match(v.strip()) else v for k, v in value.items()}
    if tp is bool:
        return value if isinstance(value, bool) else _NO
    if tp is int:
        if isinstance(value, bool):
            return _NO
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)  # 1e6 in YAML is a float
        if isinstance(value, str):
            try:
                f = float(value.replace("_", ""))
            except ValueError:
                return _NO
            return int(f) if f.is_integer() else _NO
        return _NO
    if tp is float:
        if isinstance(value, bool):
            return _NO
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _NO
        return _NO
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # embed_scale: 1
        return _NO
    return _NO


def _build(cls: type, data: dict, prefix: str = "") -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'} must be a mapping of keys, not {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key(prefix + str(key))
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        key = prefix + name
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value if value is not None else {}, key + ".")
            continue
        out = _coerce(value, tp)
        if out is _NO:
            raise ConfigError(f"{key} must be {_type_name(tp, key)}, got {value!r}")
        kwargs[name] = _ALIASES[key].get(out, out) if key in _ALIASES else out
    return cls(**kwargs)


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def from_dict(data: dict) -> Config:
    cfg = _build(Config, _normalize_tying(copy.deepcopy(data)) if isinstance(data, dict) else data)
    validate(cfg)
    return _one_block_form(cfg)


def _one_block_form(cfg: Config) -> Config:
    """A Llama-style model written in one form, so that one model has one hash: n_kv_head equal to
    n_head is stored as null (multi-head attention), and the MLP's width as intermediate_size
    null when Llama's rule at the default multiple_of gives it, else as the width itself, with
    multiple_of back at its default (it only serves the rule)."""
    m = cfg.model
    if not m.family.own_keys:  # one form of the keys a family has of its own
        return cfg
    by_rule = dataclasses.replace(m, intermediate_size=None, multiple_of=ModelConfig.multiple_of).mlp_size
    one = dataclasses.replace(m, n_kv_head=None if m.kv_heads == m.n_head else m.n_kv_head,
                              intermediate_size=None if m.mlp_size == by_rule else m.mlp_size,
                              multiple_of=ModelConfig.multiple_of)
    return dataclasses.replace(cfg, model=one)


# --------------------------------------------------------------------------------------------
# overrides (YAML files, `base:` inheritance and how each layer replaces a lower one's tie, budget
# and block are config/layers.py's)


def parse_override(item: str) -> tuple[list[str], Any]:
    import yaml

    if "=" not in item:
        raise ConfigError(f"--set {item!r} must look like key=value, e.g. --set model.n_embd=256")
    key, raw = item.split("=", 1)
    key = key.strip()
    if key not in ALL_KEYS:
        raise _unknown_key(key)
    try:
        value = load_yaml(raw, f"--set {key}") if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str] | None) -> dict:
    data = json.loads(json.dumps(data, default=str))  # a deep copy
    before, model_keys = _arch_of(data), set()
    for item in overrides or []:
        parts, value = parse_override(item)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
        if parts[0] == "train" and len(parts) == 2:  # an override is a layer of its own
            _one_budget(data, {"train": {parts[1]: value}})
        if parts[0] == "model" and len(parts) == 2:
            _one_tying(data, {"model": {parts[1]: value}})
            model_keys.add(parts[1])
    return _arch_layer(before, data, model_keys)  # the --set options are one layer for the block's biases


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                seed: int | None = None) -> Config:
    """Resolve a config: defaults -> base files -> file -> overrides -> seed."""
    data = run_sections(_load_with_bases(Path(path))) if path is not None else {}
    data = apply_overrides(data, overrides)
    data = pretrained.resolve(data)  # model.init_from: the checkpoint's family, size and tokenizer
    if seed is not None:
        data["seed"] = seed
    cfg = from_dict(data)
    _check_rank_given(cfg, data)
    if cfg.eval.also is not None:
        also_config(cfg)  # its data keys checked now, before any run
    return cfg


def also_config(cfg: Config, added: list[str] | None = None) -> Config:
    """The config of eval.also's data: the run's with its data section replaced (the tokenizer, a
    tokenizer.json, encodes it as it encodes the run's own). `added`: the run's new tokens as its
    tokenizer holds them (tokenizer.add_tokens: N picks them from the run's own training text)."""
    if not isinstance(cfg.eval.also, dict) or not cfg.eval.also:
        raise ConfigError(f"eval.also must be a data section (path, name, data_files, ...), got {cfg.eval.also!r} "
                          "— e.g. {path: builtin:shakespeare}")
    if cfg.tokenizer.kind != "pretrained":
        raise ConfigError(f"eval.also scores another data set with the run's own tokenizer, which must be a file: "
                          f"tokenizer.kind is {cfg.tokenizer.kind} — use tokenizer.kind: pretrained (a pretrained start, "
                          "model.init_from, has its folder's)")
    data = to_dict(cfg)
    data["data"], data["eval"]["also"] = copy.deepcopy(cfg.eval.also), None
    if added:
        data["tokenizer"]["add_tokens"] = list(added)
    try:
        return from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"eval.also: {exc}") from None


def _check_rank_given(cfg: Config, data: dict) -> None:
    """model.tie_mode lowrank must come with its model.untie_rank. The dataclass default, 0, is the
    tied model itself, so a missing rank would train a tied model under a lowrank label. A rank of 0
    written out is kept: it is the check that lowrank at rank 0 is tied. Likewise soft with its
    model.tie_strength (0, written out, is untied from a tied start). Checked after validate, so
    a config that is wrong in other ways gets that message first."""
    model = data.get("model")
    mode = cfg.model.tie_mode
    if mode == "split" and not (isinstance(model, dict) and "untie_rank" in model):
        raise ConfigError(f"model.tie_mode split needs its rank — set model.untie_rank: r, from 1 to model.n_embd "
                          f"({cfg.model.n_embd}) (W_out's first r columns its own; 0 is the tied model itself, "
                          "n_embd untied from a tied start)")
    if mode == "soft" and not (isinstance(model, dict) and "tie_strength" in model):
        raise ConfigError("model.tie_mode soft needs its strength — set model.tie_strength: λ, 0 or more (the loss "
                          "adds λ/2·‖W_out − E‖²; 0 is untied from a tied start, a large λ holds W_out at E)")
    if mode == "pull" and not (isinstance(model, dict) and "tie_strength" in model):
        raise ConfigError("model.tie_mode pull needs its strength — set model.tie_strength: λ, 0 or more (each step "
                          "moves W_out and E towards their mean by min(1/2, lr·λ) of W_out − E; 0 is untied from a "
                          "tied start, lr·λ ≥ 1/2 trains as tied)")
    if cfg.model.tie_mode == "lowrank" and not (isinstance(model, dict) and "untie_rank" in model):
        raise ConfigError(f"model.tie_mode lowrank needs its rank — set model.untie_rank: r, from 1 to model.n_embd "
                          f"({cfg.model.n_embd}) (W_out = E + A·Bᵀ, A·Bᵀ of rank r; 0 is the tied model itself)")


def to_yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)


def effective_min_lr(t: TrainConfig) -> float:
    """Where the cosine decay ends: train.lr x train.min_lr_ratio when the ratio is set (so the
    schedule keeps its shape when lr changes), else the absolute train.min_lr."""
    return t.lr * t.min_lr_ratio if t.min_lr_ratio is not None else t.min_lr


def warmup_steps_for(t: TrainConfig, total: int) -> int:
    """The steps the learning rate warms up over: train.warmup x the budget's steps (rounded) when
    the fraction is set, so that a change of budget keeps the warm-up's share; else
    train.warmup_steps."""
    return round(t.warmup * total) if t.warmup is not None else t.warmup_steps


def budget_steps(cfg: Config) -> int:
    """The optimizer steps a run's budget gives: train.max_steps, or train.max_tokens over the tokens of a step."""
    t = cfg.train
    if t.max_steps is not None:
        return t.max_steps
    per_step = t.batch_size * t.grad_accum * cfg.model.block_size
    return max(1, math.ceil(t.max_tokens / per_step))


def check_warmup(cfg: Config, total: int, verdict: bool = True) -> str | None:
    """A budget of fewer optimizer steps than warm-up steps: the learning rate never reaches
    train.lr. Where runs carry a verdict (`verdict`: compare --config) that is refused, since a
    comparison of such runs compares their warm-ups; for one run (a smoke test of
    train.max_steps=10) it is the warning returned, and the run goes on. None when the budget is
    long enough."""
    t = cfg.train
    if t.warmup is not None or total >= t.warmup_steps:  # a fraction of the steps always fits
        return None
    budget = (f"train.max_steps {t.max_steps}" if t.max_steps is not None else
              f"train.max_tokens {t.max_tokens:,} / ({t.batch_size} batch x {cfg.model.block_size} tokens x "
              f"{t.grad_accum} grad_accum)")
    per_step = t.batch_size * t.grad_accum * cfg.model.block_size
    more = (f"train.max_steps to at least {t.warmup_steps}" if t.max_steps is not None else
            f"train.max_tokens to at least {t.warmup_steps * per_step:,}")
    fix = (f"lower train.warmup_steps (a tenth of the steps: {max(1, total // 10)}), set train.warmup=0.1 (a tenth "
           f"of any budget), or raise {more}")
    said = (f"train.warmup_steps {t.warmup_steps} is more than the {total} optimizer steps the budget gives "
            f"({budget}): the learning rate would never finish warming up")
    if verdict:
        raise ConfigError(f"{said} — {fix}")
    return f"{said}, so this run is a smoke test rather than a measurement (compare --config refuses it) — {fix}"
