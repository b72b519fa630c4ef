"""The block family as one value, like the tie (tie.Tie): `model.arch` names it, and every module
asks the `Arch` it names instead of comparing the name (tests/test_architecture.py forbids reading
`arch ==` anywhere but here). An Arch knows its position scheme, norm, MLP, the keys that apply to
it only (refused on the other families), its default for `model.bias`, its MLP width, its own initialisation
(`Init`: torchtitan's model folders and transformers' `_init_weights` each carry theirs), what a
report calls it, and the transformers class it exports to. No torch: model/blocks.py builds the blocks an
Arch names, model/counting.py counts them, export/__init__.py writes them.

Adding a family: an entry in ARCHS, its blocks in model/blocks.py, its export adapter, and its tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Init:
    """A family's own initialisation of its blocks, as the family publishes it: every matrix and
    embedding drawn from normal(0, std) (transformers' initializer_range), biases zero, norm gains
    one; with `residual_scaled`, the residual projections (each block's attention output and MLP
    down projection) drawn again at std/√(2·n_layer), as GPT-2 does (Radford et al. 2019) and
    Llama does not. `own` is a family that initialises itself (a transformers class's
    _init_weights), which tiedlm does not draw."""

    std: float = 0.02
    residual_scaled: bool = False
    own: bool = False

    def residual_std(self, n_layer: int) -> float:
        """The residual projections' std at this depth."""
        return self.std / math.sqrt(2 * n_layer) if self.residual_scaled else self.std

    def words(self, n_layer: int) -> str:
        """What the ledger records: "normal(0, 0.02); residual projections 0.005 (0.02/√(2·8))"."""
        if self.own:
            return "the family's own (its transformers class's _init_weights)"
        if not self.residual_scaled:
            return f"normal(0, {self.std:g}), the residual projections too"
        return (f"normal(0, {self.std:g}); residual projections {self.residual_std(n_layer):.4g} "
                f"({self.std:g}/√(2·{n_layer}))")


@dataclass(frozen=True)
class Arch:
    """One block family."""

    name: str  # model.arch's value
    positions: str  # "learned" (a V-independent block_size × d matrix, wpe) or "rotary" (q and k rotated)
    norm: str  # "layernorm" (gain and, with model.bias, a bias) or "rmsnorm" (a gain)
    mlp: str  # "gelu" (d -> 4d -> d) or "swiglu" (gate and up d -> h, down h -> d)
    default_bias: bool  # model.bias when a config does not set it
    own_keys: dict[str, Any]  # model keys of this family only -> the value the other families must keep
    export_class: str  # the transformers class `tiedlm export` writes
    summary: str  # how a report names the block: "" for the default family, which reports leave unnamed
    init: Init  # the family's own initialisation of its blocks

    @property
    def built_by_transformers(self) -> bool:
        """Whether transformers builds the model (arch: hf): counted on the meta device, exported
        as the family's own folder."""
        return self.name == "hf"

    @property
    def rotary(self) -> bool:
        return self.positions == "rotary"

    @property
    def learned_positions(self) -> bool:
        return self.positions == "learned"

    @property
    def rms_norm(self) -> bool:
        return self.norm == "rmsnorm"

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (SwiGLU): three matrices of d × hidden instead of two."""
        return self.mlp == "swiglu"

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    def mlp_size(self, n_embd: int, intermediate_size: int | None, multiple_of: int) -> int:
        """The MLP's hidden width: 4·d (GELU); for SwiGLU intermediate_size, or Llama's rule, 8/3·d
        rounded up to a multiple of multiple_of."""
        if not self.gated:
            return 4 * n_embd
        if intermediate_size is not None:
            return intermediate_size
        hidden = int(8 * n_embd / 3)
        return multiple_of * -(-hidden // multiple_of)


_LLAMA_KEYS = {"n_kv_head": None, "intermediate_size": None, "multiple_of": 64, "rope_theta": 10000.0}

GPT2 = Arch(name="gpt2", positions="learned", norm="layernorm", mlp="gelu", default_bias=True, own_keys={},
            export_class="GPT2LMHeadModel", summary="", init=Init(residual_scaled=True))
LLAMA = Arch(name="llama", positions="rotary", norm="rmsnorm", mlp="swiglu", default_bias=False,
             own_keys=_LLAMA_KEYS, export_class="LlamaForCausalLM", summary="Llama-style", init=Init())

# Any transformers causal LM (hf_config.py): its positions, norms and MLP are its family's own; tiedlm's
# keys set its size, model.hf_config names it and model.hf_overrides sets the rest. Unless
# model.intermediate_size is set, its MLP width is the gated families' rule (8/3·d, as llama).
# arch: hf — tiedlm's size keys -> transformers' config fields (each family's config maps its own
# names onto these through its attribute_map: GPT-2's n_layer, GPT-NeoX's rotary_pct stay the family's)
HF_SIZE_FIELDS = {"n_layer": "num_hidden_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
                  "n_kv_head": "num_key_value_heads", "intermediate_size": "intermediate_size",
                  "block_size": "max_position_embeddings"}
HF = Arch(name="hf", positions="the family's", norm="the family's", mlp="swiglu", default_bias=False,
          own_keys={"n_kv_head": None, "intermediate_size": None, "multiple_of": 64, "hf_config": None,
                    "hf_overrides": None}, export_class="(the family's own class)",
          summary="transformers", init=Init(own=True))

ARCHS = {a.name: a for a in (GPT2, LLAMA, HF)}
DEFAULT = GPT2.name
# every family's own keys, with the value a family without them must leave them at
FAMILY_KEYS = {k: v for a in ARCHS.values() for k, v in a.own_keys.items()}


def arch_of(name: str) -> Arch:
    """The Arch named; a KeyError for an unknown name (config/checks.py refuses it first, in one line)."""
    return ARCHS[name]


def default_bias(name: Any) -> bool | None:
    """model.bias for a family named in a config dict that does not set it; None for a name that
    is not a family (the config check refuses it)."""
    a = ARCHS.get(name) if isinstance(name, str) else None
    return a.default_bias if a is not None else None
