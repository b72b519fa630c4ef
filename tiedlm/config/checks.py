"""Checks of config values, shared by config validation (`validate`, called for every resolved
config) and the command-line options (`--device`, `--seed`, `--name`, ...), so that a value is
refused with the same words wherever the user wrote it. Types are checked earlier, while the
config is built (config/__init__.py); this module checks ranges, combinations and names, and changes
nothing it checks.

Nothing here imports config/__init__.py (config imports this module): the dataclasses appear only in
annotations.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..model.arch import ARCHS, FAMILY_KEYS, arch_of
from ..errors import ConfigError
from ..model.pretrained import TIE_FROM, TRAINABLE
from ..model.tie import check_stored

if TYPE_CHECKING:
    from . import Config, DataConfig, EvalConfig, ModelConfig, TokenizerConfig, TrainConfig

TOKENIZER_KINDS = ("bpe", "word", "char", "byte", "pretrained")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "fp32", "bf16")
PARALLEL = ("ddp", "fsdp")  # train.parallel
FSDP_INIT = ("full", "meta")  # train.fsdp_init
PROCESSES_LIMIT = 1024  # train.processes: one machine's torchrun job; more is a typo
EMBED_SCALES = ("1", "sqrt_d")
SPLITS = ("train", "validation", "test")
CARVES = ("random", "contiguous")  # data.carve: how validation/test are carved from the split they come from
TEST_FROM = ("train", "validation")  # data.test_from: the split the test split is carved from
LOG_TARGETS = ("tensorboard", "wandb", "mlflow", "trackio")  # train.log_to: where a run is recorded besides metrics.jsonl
SEED_LIMIT = 2**64  # torch.manual_seed takes seeds below 2**64 and overflows above
THREADS_LIMIT = 1024  # more than any CPU has cores; torch crashes on absurd thread counts
# builtin:synthetic generates each split in memory through Python lists (measured: about 55 bytes
# and 0.35 µs a word, before tokenizing), its class chain is a dense n_classes x n_classes matrix
# and its vocabulary a list of Python strings. The limits keep a typo (1e15) from exhausting
# memory or running for days; 10^8 words a split is ~6 GB and a minute, more than a small GPT needs.
SYNTHETIC_TOKENS_LIMIT = 100_000_000
SYNTHETIC_VOCAB_LIMIT = 1_000_000
SYNTHETIC_CLASSES_LIMIT = 1024
# Natural language has a Zipf exponent near 1; at 10 the second word of a class is already 1000
# times rarer than the first, and far beyond it the rare words' probabilities underflow to 0.
ZIPF_LIMIT = 10.0
PAD_LIMIT = 4096  # padding is for GPU-friendly sizes (64, 128); a larger multiple only adds unused rows
# Tokens per optimizer step, train.batch_size x train.grad_accum x model.block_size. The largest
# published LLM runs use 4M-16M (GPT-3: 3.2M, Llama 3 405B: 16M); 2**27 = 134M is 8x that, far past
# any small GPT, while a typo (grad_accum=100000000) passes it by orders of magnitude. Such a step
# would take hours to days on one device before the first update, so it is refused as a mistake.
TOKENS_PER_STEP_LIMIT = 2**27
# model.rope_theta, θ: pair i of a head's dimensions turns by θ^(-2i/hs) radians a position
# (model.rotary_tables, in float32 as transformers computes them). Below 1 the frequencies rise
# with i instead of falling, at 1 every pair turns at the same radian a position, so RoPE's spread
# of wavelengths, which is what tells near from far, needs θ > 1. Far below it the float32 table
# breaks outright: at 1e-300 θ rounds to 0, 0^0 = 1 and 0^x = 0 make inv_freq 1/0 = inf, and
# position 0's angle 0·inf is nan in every layer's q and k (then blamed on the learning rate). At
# float32's largest value (3.4e38) θ rounds to inf, every inv_freq but the first becomes 0 and only
# one pair still turns. Llama 2 uses 10000, Llama 3 500000; long-context models go to about 1e7.
ROPE_THETA_MIN = 1.0  # exclusive
ROPE_THETA_MAX = 3.4028234663852886e38  # float32's largest finite value, exclusive
# model.norm_eps: the norms compute in float32, where a positive value below the smallest normal
# number (1.2e-38) is subnormal or, with flush-to-zero (common on GPUs), 0 — the eps of 0 that the
# positive check refuses, under which a row of zeros normalises to 0/0 = nan.
NORM_EPS_MIN = 1.1754943508222875e-38
# Run folder names. '=' and '+' are allowed because tiedlm builds names with them itself (compare
# folders such as base-n_embd=256-tied-s0, sweep names); both are safe in file names everywhere.
# 200 characters leave room for the suffixes tiedlm appends within the usual 255-byte limit.
RUN_NAME_LIMIT = 200
RUN_NAME_RULE = ("letters, digits, '-', '_', '.', '=' and '+', not starting with '.' or '-', "
                 f"at most {RUN_NAME_LIMIT} characters")
_RUN_NAME_CHARS = re.compile(r"[A-Za-z0-9_.=+-]*")

ADD_TOKENS_LIMIT = 100_000  # tokenizer.add_tokens: N
MAPPING_VALUES = ("data_files", "hf_overrides", "also")  # keys whose value is a mapping of their own: one leaf


def flatten(data: dict, prefix: str = "", leaves: tuple[str, ...] = MAPPING_VALUES) -> dict:
    """A nested config as dotted keys (model.n_embd); a key of `leaves` (a mapping of its own, as
    model.hf_overrides) is one leaf, unless `leaves` is empty (a tracker's scalar params)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and not (leaves and key.endswith(leaves)):
            out.update(flatten(value, f"{prefix}{key}.", leaves))
        else:
            out[f"{prefix}{key}"] = value
    return out



def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


# Checks of single values, shared by validate() and the command-line options (`key` is how the
# user wrote it: a config key such as train.device, or an option such as --device).


def check_positive(value: int | float, key: str) -> None:
    _check(value > 0, f"{key} must be positive, got {value}")


def check_not_negative(value: int | float, key: str) -> None:
    _check(value >= 0, f"{key} must not be negative, got {value}")


def _num(x: int | float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _validate_threads(threads: int | str) -> None:
    if isinstance(threads, str):
        _check(threads == "auto", f"train.threads must be a number of threads, 0 (torch's default) or auto, "
               f"got {threads!r} — set a count or auto")
        return
    check_not_negative(threads, "train.threads")
    check_at_most(threads, THREADS_LIMIT, "train.threads", "more than any CPU has cores; 0 keeps torch's default")


def check_at_most(value: int | float, limit: int | float, key: str, why: str) -> None:
    _check(value <= limit, f"{key} must be at most {_num(limit)}, got {_num(value)} ({why}) — lower it")


def check_seed(value: int, key: str = "seed") -> None:
    check_not_negative(value, key)
    _check(value < SEED_LIMIT, f"{key} must be below 2**64 (the range torch seeds take), got {value}")


def check_device(name: str, key: str = "train.device") -> None:
    _check(name in DEVICES or re.fullmatch(r"cuda:[0-9]+", name) is not None,
           f"{key} must be auto, cpu, cuda, cuda:N or mps, got {name!r}")


def check_split(name: str, key: str = "eval.splits") -> None:
    _check(name in SPLITS, f"{key}: {name!r} must be train, validation or test")


def check_log_to(targets: list[str], key: str = "train.log_to") -> None:
    """Where a run is recorded besides metrics.jsonl: known loggers, each named once."""
    for target in targets:
        _check(target in LOG_TARGETS, f"{key}: {target!r} is not a logger tiedlm writes to — use "
                                      f"{', '.join(LOG_TARGETS)} (or [] for metrics.jsonl alone)")
    _check(len(set(targets)) == len(targets), f"{key} names a logger twice ({targets}) — name each once")


def check_run_name(name: str, what: str = "run name") -> None:
    """A run folder name (`--name`, the config's `name`): a plain, portable folder name that cannot
    escape its parent, hide itself or be read as a command-line option."""
    shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
    if not name:
        problem = "is empty"
    elif len(name) > RUN_NAME_LIMIT:
        problem = f"is {len(name)} characters long"
    elif not _RUN_NAME_CHARS.fullmatch(name):
        bad = "".join(dict.fromkeys(c for c in name if not _RUN_NAME_CHARS.fullmatch(c)))
        problem = f"holds {bad!r}"
    elif name[0] in ".-":
        problem = f"starts with {name[0]!r}"
    else:
        return
    raise ConfigError(f"{what} {shown} {problem} — use {RUN_NAME_RULE}")


def _check_finite(cfg: Config) -> None:
    """nan and inf slip through range checks (inf >= 0 holds) and would poison training silently."""
    for key, value in flatten(dataclasses.asdict(cfg)).items():
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            what = "hold finite numbers" if isinstance(value, list) else "be a finite number"
            raise ConfigError(f"{key} must {what}, got {value} — nan and infinities are not allowed")


def _is_paths(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))



def validate(cfg: Config) -> None:
    """Every value of a resolved config, section by section; the first problem is a ConfigError."""
    _check_finite(cfg)
    check_run_name(cfg.name, "name")
    for key, value in (("seed", cfg.seed), ("data.split_seed", cfg.data.split_seed),
                       ("data.synthetic.seed", cfg.data.synthetic.seed)):
        check_seed(value, key)
    _validate_model(cfg.model)
    _validate_train(cfg.train)
    _check(cfg.train.trainable == "all" or cfg.model.untie_at is None,
           f"train.trainable {cfg.train.trainable} with model.untie_at: the split would leave E and W_out in their "
           "tied state's trainable set — remove one of them")
    _validate_tokens_per_step(cfg.train, cfg.model)
    _validate_tokenizer(cfg.tokenizer)
    _validate_data(cfg.data)
    _validate_eval(cfg.eval, cfg.model.block_size)


def _validate_model(m: ModelConfig) -> None:
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        check_positive(getattr(m, key), f"model.{key}")
    _check(m.n_embd % m.n_head == 0,
           f"model.n_embd ({m.n_embd}) must be divisible by model.n_head ({m.n_head})")
    _check(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    if m.untie_at is not None:
        _check(0.0 < m.untie_at < 1.0, f"model.untie_at must be a fraction in (0, 1), got {m.untie_at}")
        if not m.tie.strengthened:  # soft and pull: their own message is tie.check_stored's
            _check(not m.tie.two_matrices,
                   "model.untie_at needs model.tie_embeddings: true (only a tied model can untie)")
    _check(m.embed_scale in EMBED_SCALES, f"model.embed_scale must be 1 or sqrt_d, got {m.embed_scale!r}")
    check_stored(m)
    _validate_arch(m)
    _validate_start(m)


def _validate_arch(m: ModelConfig) -> None:
    _check(m.arch in ARCHS, f"model.arch must be {' or '.join(ARCHS)}, got {m.arch!r}")
    check_positive(m.norm_eps, "model.norm_eps")
    _check(m.norm_eps >= NORM_EPS_MIN, f"model.norm_eps must be at least 1.2e-38 (float32's smallest normal number, "
                                       f"where the norms compute: below it eps is lost, as 0), got {m.norm_eps:g} — "
                                       "norms use 1e-5 or 1e-6")
    check_at_most(m.norm_eps, 1.0, "model.norm_eps", "it sits beside activations' mean square, of order 1; "
                  "norms use 1e-5 or 1e-6")
    family = arch_of(m.arch)
    for key, default in FAMILY_KEYS.items():  # another family's keys keep their resting value: they would
        if key not in family.own_keys:        # change the hash of a model they do not change
            owner = next(a for a in ARCHS.values() if key in a.own_keys)
            _check(getattr(m, key) == default, f"model.{key} applies to {owner.summary} blocks only — set "
                                               f"model.arch: {owner.name}, or remove model.{key}")
    if not family.own_keys:
        return
    if family.built_by_transformers:
        _validate_hf(m)
    for key in ("n_kv_head", "intermediate_size"):
        if getattr(m, key) is not None:
            check_positive(getattr(m, key), f"model.{key}")
    check_positive(m.multiple_of, "model.multiple_of")
    _check(ROPE_THETA_MIN < m.rope_theta < ROPE_THETA_MAX,
           f"model.rope_theta must be greater than 1 and below 3.4e38, got {m.rope_theta:g} (at 1 every rotary pair "
           "turns alike, below 1 their frequencies rise instead of falling and far below they overflow to nan; at "
           "3.4e38 float32 makes them 0) — use 10000 (Llama 2) or 500000 (Llama 3), the usual values")
    _check(m.n_head % m.kv_heads == 0, f"model.n_kv_head ({m.kv_heads}) must divide model.n_head ({m.n_head}) "
                                       "(each key/value head serves n_head / n_kv_head query heads)")
    _check((m.n_embd // m.n_head) % 2 == 0, f"the head size n_embd / n_head ({m.n_embd // m.n_head}) must be even "
                                            "for rotary embeddings (they rotate pairs of dimensions) — change model.n_head")


def _validate_start(m: ModelConfig) -> None:
    """model.init_from (model/pretrained.py resolved it: arch hf, the checkpoint's size) and its keys."""
    _check(m.tie_from is None or m.tie_from in TIE_FROM,
           f"model.tie_from must be one of {', '.join(TIE_FROM)}, got {m.tie_from!r} (where the one matrix of an "
           "untied checkpoint starts when it is tied)")
    _check(m.tie_from is None or m.init_from, "model.tie_from applies to a pretrained start — set model.init_from, "
                                               "or remove model.tie_from")
    _check(m.vocab_size is None or (isinstance(m.vocab_size, int) and m.vocab_size > 0),
           f"model.vocab_size must be a positive whole number, got {m.vocab_size!r}")
    if m.vocab_size is not None:
        check_at_most(m.vocab_size, VOCAB_LIMIT, "model.vocab_size", "real vocabularies stay below a million entries")
    if m.init_from:
        _check(m.tie.mode in ("tied", "untied") and m.untie_at is None,
               f"a pretrained start (model.init_from) is kept tied or untied, untied by copy or tied from "
               f"model.tie_from — model.tie_mode {m.tie.mode} and model.untie_at are not built for it")


def _validate_hf(m: ModelConfig) -> None:
    """arch: hf: the family is named, and tiedlm's keys that the family sets itself are left alone
    (each would silently not apply): the bias, norm epsilon and dropout are its config's
    (model.hf_overrides sets them). Every tying mode, the √d input scale and the head bias are the
    tie layer's (model/tie_layer.py) and apply to any family; a mode that needs the plain head is refused
    when the model is built, on a family whose logits are not linear in W_out."""
    _check(isinstance(m.hf_config, str) and m.hf_config.strip() != "",
           "model.arch: hf needs model.hf_config — a transformers model_type (qwen2, gemma2, olmo2, phi3, "
           "gpt_neox, llama, ...) or a local config.json or model folder")
    _check(m.hf_overrides is None or isinstance(m.hf_overrides, dict),
           f"model.hf_overrides must be a mapping of the family's config fields, got {m.hf_overrides!r} — e.g. "
           "{rms_norm_eps: 1.0e-6}")
    for key, default, field in (("bias", False, "its attention_bias / mlp_bias"), ("norm_eps", 1e-5, "rms_norm_eps"),
                                ("dropout", 0.0, "attention_dropout")):
        _check(getattr(m, key) == default, f"model.{key} is the family's own under model.arch: hf — remove it, and "
                                           f"set {field} through model.hf_overrides if the family has it")


def _validate_train(t: TrainConfig) -> None:
    check_device(t.device)
    _check(t.dtype in DTYPES, f"train.dtype must be one of {', '.join(DTYPES)}, got {t.dtype!r}")
    _check(t.max_tokens is not None or t.max_steps is not None,
           "set a training budget: train.max_tokens or train.max_steps")
    _check(t.max_tokens is None or t.max_steps is None,
           "set only one training budget: train.max_tokens or train.max_steps, not both")
    for key in ("batch_size", "grad_accum", "log_every", "eval_tokens"):
        check_positive(getattr(t, key), f"train.{key}")
    for key in ("max_tokens", "max_steps"):
        if getattr(t, key) is not None:
            check_positive(getattr(t, key), f"train.{key}")
    check_positive(t.lr, "train.lr")
    _validate_min_lr(t)
    for key in ("warmup_steps", "weight_decay", "grad_clip", "eval_every", "checkpoint_every",
                "max_skipped", "early_stop_patience", "early_stop_min_delta"):
        check_not_negative(getattr(t, key), f"train.{key}")
    if t.warmup is not None and not 0 <= t.warmup < 1:
        raise ConfigError(f"train.warmup must be a fraction of the steps, from 0 up to (not including) 1, got "
                          f"{t.warmup} — e.g. train.warmup=0.05, or train.warmup_steps for a count of steps")
    _validate_selection(t)
    check_log_to(t.log_to)
    _validate_threads(t.threads)
    # AdamW multiplies each decayed weight by 1 - lr * weight_decay every step: at 1 or more that
    # zeroes or flips the weights, so the run can only diverge.
    _check(t.lr * t.weight_decay < 1,
           f"train.lr x train.weight_decay must be below 1, got {t.lr:g} x {t.weight_decay:g} (AdamW scales weights "
           "by 1 - lr x weight_decay each step) — lower train.lr or train.weight_decay")
    _check(0.0 <= t.beta1 < 1.0 and 0.0 <= t.beta2 < 1.0, "train.beta1 and train.beta2 must be in [0, 1)")
    _check(t.trainable in TRAINABLE, f"train.trainable must be one of {', '.join(TRAINABLE)}, got {t.trainable!r} "
                                     "(head: W_out alone, E when tied; embeddings: E and W_out)")
    _check(t.parallel in PARALLEL, f"train.parallel must be one of {', '.join(PARALLEL)}, got {t.parallel!r}")
    _check(t.fsdp_init in FSDP_INIT, f"train.fsdp_init must be one of {', '.join(FSDP_INIT)}, got {t.fsdp_init!r}")
    if t.processes is not None:
        check_positive(t.processes, "train.processes")
        check_at_most(t.processes, PROCESSES_LIMIT, "train.processes", "the processes of one machine's torchrun job")


def _validate_min_lr(t: TrainConfig) -> None:
    """Where the cosine decay ends: train.min_lr (absolute) or train.min_lr_ratio (of train.lr), one of them."""
    if t.min_lr_ratio is None:
        _check(0 <= t.min_lr <= t.lr, f"train.min_lr must be between 0 and train.lr ({t.lr}), got {t.min_lr}")
        return
    _check(0.0 <= t.min_lr_ratio <= 1.0, f"train.min_lr_ratio must be a fraction in [0, 1], got {t.min_lr_ratio}")
    default = next(f.default for f in dataclasses.fields(t) if f.name == "min_lr")
    _check(t.min_lr == default,
           f"train.min_lr ({t.min_lr:g}) and train.min_lr_ratio ({t.min_lr_ratio:g}) both set where the cosine decay "
           "ends — give one of them (min_lr_ratio: a fraction of train.lr; min_lr: an absolute rate)")


def _validate_tokens_per_step(t: TrainConfig, m: ModelConfig) -> None:
    tokens = t.batch_size * t.grad_accum * m.block_size
    _check(tokens <= TOKENS_PER_STEP_LIMIT,
           f"train.batch_size x train.grad_accum x model.block_size (tokens per optimizer step) must be at most "
           f"{TOKENS_PER_STEP_LIMIT:,} (8x the largest published LLM batches), got {t.batch_size:,} x "
           f"{t.grad_accum:,} x {m.block_size:,} = {tokens:,} — lower train.grad_accum or train.batch_size")


def _validate_selection(t: TrainConfig) -> None:
    """keep_best and early stopping act on the periodic evaluations, so they need some."""
    for key, on in (("keep_best", t.keep_best), ("early_stop_patience", t.early_stop_patience)):
        _check(not on or t.eval_every > 0,
               f"train.{key} acts on the periodic validation evaluations, and train.eval_every is 0 — set "
               "train.eval_every to the steps between them (e.g. 200)")
    _check(t.early_stop_min_delta == 0 or t.early_stop_patience > 0,
           f"train.early_stop_min_delta ({t.early_stop_min_delta:g}) only applies with early stopping — set "
           "train.early_stop_patience (evaluations without improvement before stopping) or drop it")


def _validate_tokenizer(tok: TokenizerConfig) -> None:
    _check(tok.kind in TOKENIZER_KINDS,
           f"tokenizer.kind must be one of {', '.join(TOKENIZER_KINDS)}, got {tok.kind!r}")
    _check(tok.kind != "pretrained" or bool(tok.path),
           "tokenizer.kind: pretrained needs tokenizer.path (a tokenizer.json file)")
    for key in ("vocab_size", "pad_to_multiple", "max_train_bytes"):
        check_positive(getattr(tok, key), f"tokenizer.{key}")
    add = tok.add_tokens
    if add is not None:
        _check(tok.kind == "pretrained", f"tokenizer.add_tokens adds to a pretrained tokenizer (a pretrained start's, or "
                                         f"tokenizer.kind: pretrained); tokenizer.kind is {tok.kind} — remove "
                                         "tokenizer.add_tokens, or raise tokenizer.vocab_size")
        if isinstance(add, list):
            _check(bool(add) and all(isinstance(t, str) and t != "" for t in add) and len(set(add)) == len(add),
                   f"tokenizer.add_tokens must be distinct non-empty strings, or a count, got {add!r}")
        else:
            _check(isinstance(add, int) and not isinstance(add, bool) and 0 < add <= ADD_TOKENS_LIMIT,
                   f"tokenizer.add_tokens must be a list of strings or a count from 1 to {ADD_TOKENS_LIMIT:,}, got {add!r}")
    check_at_most(tok.pad_to_multiple, PAD_LIMIT, "tokenizer.pad_to_multiple",
                  "padding rounds the vocabulary up to a GPU-friendly size such as 64; more only adds unused rows")
    # the smallest vocabulary each kind can have: its fixed symbols plus the specials (<unk>, <eot>)
    least = {"byte": (257, "256 byte values + <eot>"), "bpe": (257, "256 byte values + <|endoftext|>"),
             "word": (3, "<unk> + <eot> + one word"), "char": (3, "<unk> + <eot> + one character")}
    if tok.kind in least:
        n, why = least[tok.kind]
        _check(tok.vocab_size >= n, f"tokenizer.vocab_size={tok.vocab_size} is too small for tokenizer.kind={tok.kind}: "
                                    f"it needs at least {n} ({why}) — raise tokenizer.vocab_size")


def carved_test_fits(d: DataConfig) -> bool:
    """Whether test_fraction, carved from train, leaves more to train on than it takes."""
    return d.test_fraction < 1.0 - d.validation_fraction - d.test_fraction


def _validate_data(d: DataConfig) -> None:
    _check(d.data_files is None or _is_paths(d.data_files) or (
        isinstance(d.data_files, dict) and all(_is_paths(v) for v in d.data_files.values())),
           f"data.data_files must be a path, a glob, a list of them or a mapping split: paths, got {d.data_files!r}")
    path = d.path.strip()
    # a built-in corpus reads no files: data_files beside it would be ignored and the run would
    # train on the corpus while the config seems to name the user's text
    _check(d.data_files is None or not path.startswith("builtin:"),
           f"data.data_files is set, and data.path {path} reads no files (it would train on {path}) — to "
           "train on the files set data.path to their builder (text, json, csv, parquet) or to the file itself, "
           "or drop data.data_files (--set data.data_files=null)")
    for key in ("validation_fraction", "test_fraction"):
        v = getattr(d, key)
        _check(0.0 <= v < 1.0, f"data.{key} must be a fraction in [0, 1), got {v}")
    _check(d.carve in CARVES, f"data.carve must be random or contiguous, got {d.carve!r}")
    _check(d.test_from in TEST_FROM, f"data.test_from must be train or validation, got {d.test_from!r}")
    if d.test_from == "train":
        _check(d.validation_fraction + d.test_fraction < 1.0,
               "data.validation_fraction + data.test_fraction must leave some training data")
        _check(carved_test_fits(d), f"data.test_fraction {d.test_fraction:g} of the training documents would carve a "
                                   f"test split larger than what is left to train on "
                                   f"({1.0 - d.validation_fraction - d.test_fraction:g}) — lower data.test_fraction "
                                   "(0.05 is the default)")
    else:
        _check(d.test_fraction > 0, "data.test_from: validation carves the test split from validation, and "
                                    "data.test_fraction is 0 — set data.test_fraction (of the validation documents, "
                                    "e.g. 0.5 for half) or carve test from train (--set data.test_from=train)")
        _check(not d.path.strip().startswith("builtin:"),
               f"data.test_from: validation carves test from validation, and {d.path.strip()} brings its own "
               "train, validation and test splits — use them (--set data.test_from=train)")
    for key in ("max_train_tokens", "max_eval_tokens"):
        if getattr(d, key) is not None:
            check_positive(getattr(d, key), f"data.{key}")
    _check(0.0 < d.train_fraction <= 1.0, f"data.train_fraction must be in (0, 1], got {d.train_fraction} — "
                                          "1 trains on every training token")
    _check(not d.streaming or d.max_train_tokens is not None,
           "data.streaming: true needs data.max_train_tokens (how much of the stream to take)")
    s = d.synthetic
    for key in ("vocab_size", "n_classes", "successors", "train_tokens", "validation_tokens", "test_tokens"):
        check_positive(getattr(s, key), f"data.synthetic.{key}")
    for key in ("train_tokens", "validation_tokens", "test_tokens"):
        check_at_most(getattr(s, key), SYNTHETIC_TOKENS_LIMIT, f"data.synthetic.{key}",
                      "builtin:synthetic generates each split in memory, ~6 GB at the limit")
    check_at_most(s.vocab_size, SYNTHETIC_VOCAB_LIMIT, "data.synthetic.vocab_size",
                  "builtin:synthetic holds every word as a Python string")
    check_at_most(s.n_classes, SYNTHETIC_CLASSES_LIMIT, "data.synthetic.n_classes",
                  "the class chain is a dense n_classes x n_classes matrix")
    _check(s.n_classes <= s.vocab_size, "data.synthetic.n_classes must not exceed data.synthetic.vocab_size")
    _check(s.successors <= s.n_classes, "data.synthetic.successors must not exceed data.synthetic.n_classes")
    check_positive(s.zipf, "data.synthetic.zipf")
    check_at_most(s.zipf, ZIPF_LIMIT, "data.synthetic.zipf",
                  "beyond it each class's first word takes nearly all the probability")


def _validate_eval(e: EvalConfig, block_size: int) -> None:
    _check(len(e.splits) > 0, "eval.splits must name at least one split")
    for sp in e.splits:
        check_split(sp)
    _check(e.stride is None or 0 < e.stride <= block_size,
           f"eval.stride must be in [1, model.block_size={block_size}], got {e.stride}")
    _check(all(0.0 < b < 1.0 for b in e.buckets) and list(e.buckets) == sorted(set(e.buckets)),
           f"eval.buckets must be increasing fractions in (0, 1), got {e.buckets}")
    check_positive(e.batch_size, "eval.batch_size")


# A vocabulary to count with (`params --vocab-size`): real tokenizers stay below a million entries;
# beyond 2**24 the count is arithmetic about no model anyone trains, and most likely a typo.
VOCAB_LIMIT = 2**24


def check_folder_option(value: str, option: str, must_exist: bool = False):
    """A folder given on the command line (`--out`, a run folder): not empty, no control characters
    (a newline pasted into a path), not a file; returned as a Path. An empty value is refused
    rather than read as the working directory (it is most often an unset shell variable)."""
    _check(value.strip() != "", f"{option} is empty — give a folder path")
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    _check(bad is None, f"{option} {value!r} holds a control character ({bad!r}) — give a plain folder path")
    path = Path(value)
    _check(not (path.exists() and not path.is_dir()), f"{option} {value} is a file, not a folder — give a folder")
    _check(not must_exist or path.is_dir(), f"{option} {value} does not exist — give an existing folder")
    return path
