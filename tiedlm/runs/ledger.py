"""The confound ledger: what a variant's embedding matrices received besides the tie.

A tied and an untied model should differ in the tie and nothing else, but a comparison can hide
more: each variant tuned to its own learning rate, weight decay that reaches W_out in one and not
the other, a head drawn afresh against one copied from E. The ledger lists, per run and per
variant, what E and W_out received:

- the learning rate (train.lr, and where the cosine ends: config.effective_min_lr);
- the AdamW weight decay on E, on W_out's own parameters (E's when W_out is E: one matrix, decayed
  once) and on the other matrices (train/step.py: the embedding matrices, model.embedding_parameters,
  follow train.decay_embeddings; every other matrix is decayed at train.weight_decay); none on what
  train.trainable froze, which is not in the optimizer;
- the initialisation and the initial scale: a fresh draw (model.GPT.init_weights draws E and
  W_out from normal(0, 0.02); an `arch: hf` family initialises by its own rules) or a pretrained
  start (model.init_from: the checkpoint's weights), the std of E and of W_out where tiedlm draws
  them, and the input scale (model.embed_scale); the blocks' own initialisation (arch.Init: GPT-2's
  residual projections at 0.02/√(2·n_layer), Llama's at 0.02);
- the head's initialisation: E itself (tied), its own draw (untied), a copy of E (soft, pull, and
  untie_at at its split), or built from E (projection, lowrank, split: W_out starts as E); from a
  checkpoint, what the run's tie did to the checkpoint's (pretrained.describe_start);
- what train.trainable freezes (E, when only an untied head trains; the blocks);
- whether the blocks' matrices and the head have biases, as the built model has them (the run's
  parameter breakdown: `block_biases`, `lm_head_bias`), since model.bias is tiedlm's own blocks' key
  and a transformers family has its own (GPT-2's biases, Phi's head bias);
- V·d and its share of the model's parameters (the run's parameter breakdown).

`differences` names what two variants differ in beyond the tie: the ledger's fields and any other
key of their configs (variant.flat's variant view) besides the tie's own. A run's report.json holds
its ledger (`ledger`); for a run written before it, `ledger_of` computes the same from the stored
config and parameters.

No torch here: training, report.md and compare use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..config import effective_min_lr
from ..config.identity import ADDED_KEYS, flat
from ..config.naming import yaml_value
from ..model.tie import STORED_KEYS

if TYPE_CHECKING:
    from ..config import Config

INIT_STD = 0.02  # model.GPT.init_weights: normal(0, 0.02) for every matrix and embedding
TIE_KEYS = (*STORED_KEYS, "model.untie_at", "model.tie_from")  # the tie itself: what a difference in is not a confound
RECORDED = "recorded by the run"
FROM_CONFIG = "computed from the run's stored config (the run predates the ledger)"
# (field, words): the ledger's fields two variants are compared on, in the order a difference is said
COMPARED = (("init", "initialisation"), ("block_init", "block initialisation"), ("lr", "learning rate"),
            ("min_lr", "final learning rate"), ("weight_decay_e", "weight decay on E"),
            ("weight_decay_w_out", "weight decay on W_out"),
            ("weight_decay_other", "weight decay on the other matrices"),
            ("init_std_e", "init std of E"), ("init_std_w_out", "init std of W_out"),
            ("embed_scale", "input embedding scale"), ("lm_head_bias", "head bias"),
            ("block_biases", "biases of the blocks' matrices"))
# a tuned key -> the ledger's fields it sets (the cosine's end follows a tuned lr through min_lr_ratio)
TUNED_FIELDS = {"train.lr": ("lr", "min_lr"), "train.min_lr": ("min_lr",), "train.min_lr_ratio": ("min_lr",),
                "train.weight_decay": ("weight_decay_e", "weight_decay_w_out", "weight_decay_other"),
                "train.decay_embeddings": ("weight_decay_e", "weight_decay_w_out"),
                "model.embed_scale": ("embed_scale",), "model.lm_head_bias": ("lm_head_bias",)}
# config keys the ledger's fields already say: not repeated as "other keys"
# (model.bias: block_biases says it from the built model, where the key applies only to tiedlm's blocks)
COVERED_KEYS = ("train.lr", "train.min_lr", "train.min_lr_ratio", "train.weight_decay", "train.decay_embeddings",
                "model.embed_scale", "model.lm_head_bias", "model.init_from", "model.bias")


@dataclass(frozen=True)
class Ledger:
    """What one run's (or variant's) E and W_out received. None: not known (an `arch: hf` family's
    own initialisation; V·d where no parameter breakdown was recorded)."""

    tie: str  # Tie.label
    init: str  # where the weights come from: a fresh draw, or a checkpoint (model.init_from)
    head_init: str  # how W_out starts
    frozen: str  # what train.trainable freezes: nothing, the blocks, or E and the blocks
    lr: float
    min_lr: float
    weight_decay_e: float | None  # None: frozen (train.trainable), not in the optimizer
    weight_decay_w_out: float | None  # on W_out's own parameters; E's when W_out is E
    weight_decay_other: float | None  # on every other matrix (biases and norm gains never)
    init_std_e: float | None  # None: not drawn by tiedlm (an arch: hf family's own rules, or a checkpoint)
    init_std_w_out: float | None
    embed_scale: str  # "1" or "sqrt_d": the input side sees E or √d·E; or the family's own ("×5.657, the family's own")
    lm_head_bias: bool  # the built model's head has a bias (model.lm_head_bias, or the family's own)
    vd: int | None  # V·d: E's parameters, what tying saves
    vd_share: float | None  # V·d / the model's parameters
    block_init: str | None = None  # the blocks' own initialisation (arch.Init.words); None: not recorded
    block_biases: str | None = None  # yes, no, "K of N matrices" (tie_layer.block_biases); None: not recorded
    source: str = RECORDED

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "source"}

    @classmethod
    def from_json(cls, data: Any) -> Ledger | None:
        """The ledger a report.json holds, or None when it holds none (or one this version cannot read)."""
        if not isinstance(data, dict):
            return None
        names = {f.name for f in dataclasses.fields(cls)} - {"source"}
        try:
            return cls(**{k: v for k, v in data.items() if k in names})
        except TypeError:  # a field missing: written by another version
            return None


def _init(cfg: Config, hf: bool) -> str:
    """Where the weights come from, in words."""
    if cfg.model.init_from:
        return f"the checkpoint {cfg.model.init_from}"
    return "the family's own initialisation" if hf else f"normal(0, {INIT_STD:g}), drawn at the run's seed"


def _head_init(cfg: Config, hf: bool, params: dict) -> str:
    """How W_out starts, in words."""
    tie, untie_at = cfg.model.tie, cfg.model.untie_at
    if cfg.model.init_from:
        start = params.get("start")
        words = start.get("start") if isinstance(start, dict) else None
        return f"the checkpoint's ({words})" if words else "the checkpoint's"
    own = "its own draw, by the family's initialisation" if hf else f"its own draw, normal(0, {INIT_STD:g})"
    words = {"tied": "E itself (one matrix)",
             "untied": own,
             "soft": "a copy of E, drawn apart by training (λ's penalty)",
             "pull": "a copy of E, drawn apart by training (λ's pull)",
             "projection": "built from E: E through P, P the identity at the start (W_out starts as E)",
             "lowrank": "built from E: E + A·Bᵀ, A zero at the start (W_out starts as E)",
             "split": f"built from E: {tie.rank} columns of its own, copied from E (W_out starts as E)"}[tie.mode]
    if tie.mode == "tied" and untie_at:
        return f"E itself until {untie_at:g} of training, then a copy of E trained apart (untie_at)"
    return words


def _frozen(cfg: Config) -> str:
    """What train.trainable leaves untrained (model.freeze_all_but)."""
    trainable = cfg.train.trainable
    if trainable == "all":
        return "nothing"
    if trainable == "head" and cfg.model.tie.two_matrices:
        return "E and the blocks"  # only W_out (and a mode's own head parameters) trains
    return "the blocks"  # head of a tied model (E is W_out), or the embeddings


def _decays(cfg: Config) -> tuple[float | None, float | None, float | None]:
    """(on E, on W_out's own parameters, on the other matrices): train/step.py's groups; None for
    what train.trainable froze (model.freeze_all_but), which the optimizer never sees."""
    t, tie = cfg.train, cfg.model.tie
    embeddings = t.weight_decay if t.decay_embeddings else 0.0
    if tie.w_out_is_e:
        w_out = embeddings  # one matrix: E's decay is W_out's
    elif tie.mode == "projection":
        w_out = t.weight_decay  # P is a d×d matrix like the blocks'
    else:  # untied, soft, pull: W_out; lowrank's A and B, split's columns: with the embeddings
        w_out = embeddings
    if t.trainable == "all":
        return embeddings, w_out, t.weight_decay
    e_trains = t.trainable == "embeddings" or not tie.two_matrices  # head: E trains only as W_out
    w_out_trains = t.trainable == "head" or tie.mode != "projection"  # embeddings: P is not among them
    return embeddings if e_trains else None, w_out if w_out_trains else None, None


def _embed_scale(cfg: Config, params: dict) -> str:
    """What the input side multiplies E's rows by: tiedlm's model.embed_scale, or the family's own
    (Gemma's √d), which the built model's count records."""
    family = params.get("family_embed_scale")
    if isinstance(family, (int, float)) and family != 1.0:
        return f"×{family:.4g}, the family's own"
    return str(cfg.model.embed_scale)


def _biases(cfg: Config, p: dict) -> tuple[bool, str | None]:
    """(the head has a bias, the blocks' matrices' biases): the built model's, where the run's
    parameters record them; else the config's, which says them for tiedlm's own blocks only."""
    head = p.get("lm_head_bias")
    head = head > 0 if isinstance(head, int) else bool(cfg.model.lm_head_bias)
    blocks = p.get("block_biases")
    if not isinstance(blocks, str):
        blocks = None if cfg.model.family.built_by_transformers else "yes" if cfg.model.bias else "no"
    return head, blocks


def ledger_of(cfg: Config, params: dict | None, source: str = RECORDED) -> Ledger:
    """The ledger of a run of `cfg` whose parameter breakdown (model.count_params) is `params`."""
    hf = cfg.model.family.built_by_transformers
    std = None if hf or cfg.model.init_from else INIT_STD
    e, w_out, other = _decays(cfg)
    p = params if isinstance(params, dict) else {}
    vd, total = p.get("wte"), p.get("total")
    vd = vd if isinstance(vd, int) else None
    share = vd / total if vd is not None and isinstance(total, int) and total > 0 else None
    head_bias, block_biases = _biases(cfg, p)
    return Ledger(tie=cfg.model.tie.label, init=_init(cfg, hf), head_init=_head_init(cfg, hf, p),
                  frozen=_frozen(cfg), lr=cfg.train.lr,
                  min_lr=effective_min_lr(cfg.train), weight_decay_e=e, weight_decay_w_out=w_out,
                  weight_decay_other=other, init_std_e=std, init_std_w_out=std, embed_scale=_embed_scale(cfg, p),
                  lm_head_bias=head_bias, vd=vd, vd_share=share, block_biases=block_biases,
                  block_init=("the checkpoint's" if cfg.model.init_from else
                              cfg.model.family.init.words(cfg.model.n_layer)),
                  source=source)


def stored_ledger(recorded: Any, cfg: Config, params: dict | None) -> Ledger:
    """A run's ledger: the one its report.json recorded, else computed from its stored config. A
    ledger recorded before the biases were read from the built model takes them from its run's
    parameters (or, for tiedlm's own blocks, its config)."""
    found = Ledger.from_json(recorded)
    if found is None:
        return ledger_of(cfg, params, FROM_CONFIG)
    if found.block_biases is None:
        head, blocks = _biases(cfg, params if isinstance(params, dict) else {})
        found = dataclasses.replace(found, block_biases=blocks, lm_head_bias=found.lm_head_bias or head)
    return found


def value_words(field: str, value: Any) -> str:
    """A ledger value (or a config key's) as the reports write it: 0.003, 0.1, sqrt_d, yes, a
    mapping as YAML; an init std tiedlm did not draw (see `init`) is "—", the decay of what
    train.trainable froze "— (frozen)"."""
    if value is None:
        if field.startswith("weight_decay"):
            return "— (frozen)"
        return "—" if field.startswith("init_std") else "null" if "." in field else "not recorded"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return yaml_value(value)  # {rms_norm_eps: 1.0e-06}, as a config writes it
    return str(value)


def differences(a: Ledger, b: Ledger, cfg_a: Config | None = None, cfg_b: Config | None = None,
                tuned: Sequence[str] = (), chosen: bool = False) -> list[str]:
    """What variant a differs from b in besides the tie: "learning rate 0.003 vs 0.01", then any
    other key of their configs (the variant view) as "model.dropout 0.1 vs 0". `tuned`: the keys
    each variant chose for itself on validation (compare --tune), and the ledger's fields that
    follow them (TUNED_FIELDS): left out, or with `chosen`, the only ones given — a difference the
    protocol makes on purpose, not a confound."""
    own = {f for k in tuned for f in TUNED_FIELDS.get(k, ())}
    # a frozen matrix has no decay: that difference is train.trainable's, said once as that key
    frozen = {k for k, _ in COMPARED if k.startswith("weight_decay") and None in (getattr(a, k), getattr(b, k))}
    out = [f"{words} {value_words(k, getattr(a, k))} vs {value_words(k, getattr(b, k))}"
           for k, words in COMPARED if getattr(a, k) != getattr(b, k) and (k in own) == chosen and k not in frozen]
    if cfg_a is not None and cfg_b is not None:
        fa, fb = ({**ADDED_KEYS, **flat(c, variant=True)} for c in (cfg_a, cfg_b))  # a key left out: its default
        keys = sorted(k for k in set(fa) | set(fb)
                      if k not in TIE_KEYS and k not in COVERED_KEYS and fa.get(k) != fb.get(k) and (k in tuned) == chosen)
        out += [f"{k} {value_words(k, fa.get(k))} vs {value_words(k, fb.get(k))}" for k in keys]
    return out


def differs_sentence(found: list[str]) -> str:
    """The one line a comparison gives per contrast."""
    if not found:
        return "the variants differ only in the tie."
    return "they also differ in: " + "; ".join(found) + "."


def share_words(ledger: Ledger) -> str:
    """V·d and its share: "262,144 (39.9% of the model)"."""
    if ledger.vd is None:
        return "not recorded"
    return f"{ledger.vd:,}" + (f" ({ledger.vd_share:.1%} of the model)" if ledger.vd_share is not None else "")


def run_lines(ledger: Ledger) -> list[str]:
    """report.md's section: what this run's E and W_out received."""
    w = value_words
    return ["## Confound ledger", "",
            "What this run's embedding matrices received: the fields a comparison checks, so that two "
            "variants that differ in more than the tie are seen to.", "",
            f"- tie: {ledger.tie}; W_out at the start: {ledger.head_init}",
            f"- initialisation: {ledger.init}; blocks: {w('block_init', ledger.block_init)}; frozen: {ledger.frozen}",
            f"- learning rate {w('lr', ledger.lr)} (cosine to {w('min_lr', ledger.min_lr)})",
            f"- weight decay: E {w('weight_decay_e', ledger.weight_decay_e)}, W_out "
            f"{w('weight_decay_w_out', ledger.weight_decay_w_out)}, other matrices "
            f"{w('weight_decay_other', ledger.weight_decay_other)}",
            f"- init std: E {w('init_std_e', ledger.init_std_e)}, W_out {w('init_std_w_out', ledger.init_std_w_out)}; "
            f"input embedding scale {ledger.embed_scale}; head bias {w('lm_head_bias', ledger.lm_head_bias)}; "
            f"biases of the blocks' matrices {w('block_biases', ledger.block_biases)}",
            f"- V·d {share_words(ledger)}", ""]
