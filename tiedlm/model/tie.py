"""The tie between the input embedding E and the output projection W_out, as one value.

`model.tie_mode` names it: tied, untied, projection, lowrank or split (with `model.untie_rank` r),
soft or pull (with `model.tie_strength` λ); `model.tie_embeddings: true/false` is its short form,
read while a config is parsed (config/__init__.py's merge rules). A config stores it as it always has
(`tie_embeddings`, `tie_mode` null for tied and untied, `untie_rank`; soft and pull are
`tie_embeddings: false` with their `tie_mode` and `tie_strength`), so config hashes and run folders
written before stay valid. Only config/__init__.py, this module and runs/ read those fields; every other module asks `ModelConfig.tie`, a
Tie, for what it needs: the label, the run tag, whether W_out is E, whether there are two matrices,
and what the head costs in parameters and FLOPs.

Soft is a dial between the ends: W_out is a matrix of its own (two matrices, as untied), copied
from E at the start, and the training loss adds λ/2·‖W_out − E‖²_F. λ = 0 is untied from a tied
start; as λ grows the two are pulled together. Under AdamW the penalty's gradient enters Adam's
moments and drowns the cross-entropy's, so a large λ learns worse than tied; `pull` is its
decoupled form (as AdamW decouples weight decay): after each optimizer step W_out and E move
towards their mean, W_out − E shrinking by 1 − 2·min(1/2, lr·λ), outside Adam. λ = 0 is again
untied from a tied start, and lr·λ ≥ 1/2 averages the two after every step: one matrix again.

Split is the rank dial that reaches both ends: W_out's first r columns are a matrix of its own
(V×r, started as E's), the other d − r columns are E's. W_out − E has rank at most r, as lowrank's
A·Bᵀ; but those r columns get no gradient into E and do not follow E's moves, so at r = d the
model is untied from a tied start exactly (soft at λ = 0), where lowrank at r = d stays "E plus a
correction" (docs/studies/tying-map.md, the rank dial).

One answer for lowrank and split at rank 0: A·Bᵀ (or W_out's own columns) has no columns and
W_out = E exactly, so W_out *is* E there, everywhere (the model, analysis and export). It stays a
lowrank (split) model for its label and tag.

No torch here: config/__init__.py, `tiedlm params` and the CLI use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import ModelConfig

MODES = ("tied", "untied", "projection", "lowrank", "split", "soft", "pull")
BUILT_FROM_E = ("projection", "lowrank", "split")  # W_out made from E by parameters of its own
RANKED = ("lowrank", "split")  # the modes of model.untie_rank r
TWO_MATRICES = ("untied", "soft", "pull")  # W_out a Parameter of its own beside E
STRENGTHENED = ("soft", "pull")  # the modes of model.tie_strength λ
NAMED_MODES = (*BUILT_FROM_E, *STRENGTHENED)  # the modes stored under model.tie_mode (tied/untied: null)
# The dotted keys a config stores the tie under: what a diff of two configs sees of it.
STORED_KEYS = ("model.tie_embeddings", "model.tie_mode", "model.untie_rank", "model.tie_strength")


@dataclass(frozen=True)
class Tie:
    mode: str = "tied"  # one of MODES
    rank: int = 0  # lowrank's r; 0 for every other mode
    strength: float = 0.0  # soft's λ; 0 for every other mode

    @classmethod
    def stored(cls, tie_embeddings: bool, tie_mode: str | None, untie_rank: int, tie_strength: float = 0.0) -> Tie:
        """The tie of a config's stored fields."""
        return cls(tie_mode or ("tied" if tie_embeddings else "untied"), untie_rank, tie_strength)

    def fields(self) -> dict[str, Any]:
        """The stored fields of this tie (what ModelConfig.with_tie writes)."""
        return {"tie_embeddings": not self.two_matrices, "tie_mode": self.stored_mode, "untie_rank": self.rank,
                "tie_strength": self.strength}

    @property
    def stored_mode(self) -> str | None:
        """`model.tie_mode` as stored: the mode when it builds W_out from E or is soft, else None."""
        return self.mode if self.mode in NAMED_MODES else None

    @property
    def label(self) -> str:
        """How reports name it: tied, untied, projection, lowrank r=8, split r=8, soft λ=0.01, pull λ=100."""
        if self.strengthened:
            return f"{self.mode} λ={self.strength:g}"
        return f"{self.mode} r={self.rank}" if self.mode in RANKED else self.mode

    @property
    def tag(self) -> str:
        """How run names spell it: tied, untied, projection, lowrank-r8, split-r8, soft-l0.01 or pull-l100 (run
        names allow letters, digits and - _ . = +: 1e-05 and 1e+03 are kept as they are)."""
        if self.strengthened:
            return f"{self.mode}-l{self.strength:g}"
        return f"{self.mode}-r{self.rank}" if self.mode in RANKED else self.mode

    @property
    def two_matrices(self) -> bool:
        """Whether W_out is a Parameter of its own beside E (TWO_MATRICES); otherwise W_out is E or
        is built from it, and `lm_head.weight` is E."""
        return self.mode in TWO_MATRICES

    @property
    def ranked(self) -> bool:
        """Whether the mode has a rank r (lowrank, split)."""
        return self.mode in RANKED

    @property
    def strengthened(self) -> bool:
        """Whether the mode has a strength λ (soft, pull): two matrices that λ draws together."""
        return self.mode in STRENGTHENED

    @property
    def penalised(self) -> bool:
        """Whether the training loss adds soft's λ/2·‖W_out − E‖² (soft with λ > 0; at λ = 0 the
        term is not computed at all, so the run is untied from a tied start exactly)."""
        return self.mode == "soft" and self.strength > 0

    @property
    def pulled(self) -> bool:
        """Whether each optimizer step ends with pull's decoupled step of W_out and E towards each
        other (pull with λ > 0)."""
        return self.mode == "pull" and self.strength > 0

    @property
    def built_from_e(self) -> bool:
        """Whether W_out is built from E by parameters of its own (projection's P, lowrank's A, B)."""
        return self.mode in BUILT_FROM_E

    @property
    def w_out_is_e(self) -> bool:
        """Whether the effective W_out is E itself: tied, or lowrank or split at rank 0 (the docstring)."""
        return self.mode == "tied" or (self.mode in RANKED and self.rank == 0)

    def head_params(self, vocab_size: int, n_embd: int) -> int:
        """W_out's parameters beside E (its bias aside): V·d untied and soft, 0 tied, P's d² for
        projection, A's and B's r·(V + d) for lowrank, its own columns' V·r for split."""
        V, d, r = vocab_size, n_embd, self.rank
        return {"untied": V * d, "soft": V * d, "pull": V * d, "projection": d * d, "lowrank": r * (V + d),
                "split": V * r}.get(self.mode, 0)

    def head_flops(self, vocab_size: int, n_embd: int) -> int:
        """Matmul FLOPs of the head per token, forward: the logits (2·d·V, tied or not: tying saves
        no compute), and projection's P h (2·d²)."""
        d = n_embd
        return 2 * d * vocab_size + (2 * d * d if self.mode == "projection" else 0)

    def formation_flops(self, vocab_size: int, n_embd: int) -> int | None:
        """FLOPs of forming W_out once per forward pass, shared by the pass' tokens: lowrank's
        E + A·Bᵀ (2·V·d·r); None for the modes that form nothing (split's W_out is its own columns
        beside E's, put side by side: a copy, no arithmetic)."""
        return 2 * vocab_size * n_embd * self.rank if self.mode == "lowrank" else None

    def penalty_flops(self, vocab_size: int, n_embd: int) -> int | None:
        """FLOPs of soft's penalty, once per optimizer step (not per token, nor per micro-batch),
        forward and backward together: D = W_out − E and ΣD² (3·V·d), then λD added into W_out's
        gradient and subtracted from E's (3·V·d): 6·V·d. Elementwise work, not matmuls, but the
        one cost soft adds to untied. Pull's decoupled step, D = W_out − E and c·D taken from one and
        added to the other: 5·V·d. None when there is neither (another mode, or λ = 0)."""
        return 6 * vocab_size * n_embd if self.penalised else 5 * vocab_size * n_embd if self.pulled else None

    def cost_words(self, tokens: int, grad_accum: int) -> str:
        """What the mode adds to the FLOPs of tied and untied, in words (`tiedlm params`), for a
        micro-batch of `tokens` and `grad_accum` of them a step. Every mode has its sentence: a mode
        added without one is a KeyError here, never another mode's words."""
        step = f"once per optimizer step of {tokens * grad_accum:,} tokens"
        return {"tied": "nothing: the head's matmul runs either way", "untied": "nothing: the head's matmul runs "
                "either way", "projection": "P h: 2d² more per token",
                "lowrank": f"with A·Bᵀ formed once per micro-batch of {tokens:,} tokens",
                "split": "W_out's own columns beside E's: no FLOPs beyond the head's",
                "soft": f"with λ/2·‖W_out − E‖², 6·V·d, {step}",
                "pull": f"with the decoupled pull, 5·V·d, {step}"}[self.mode]


UNTIED = Tie("untied")


def check_stored(m: ModelConfig) -> None:
    """The stored fields of a ModelConfig `m` make one tie, and its rank or strength fits (config
    validation)."""
    mode = m.tie_mode
    _check(mode in (None, *NAMED_MODES),
           f"model.tie_mode must be {', '.join(MODES[:-1])} or {MODES[-1]}, got {mode!r}")
    if mode in STRENGTHENED:
        _check(not m.tie_embeddings, f"model.tie_mode {mode} trains W_out as a matrix of its own, so it needs "
                                     "model.tie_embeddings: false — drop model.tie_embeddings")
        _check(m.untie_at is None, f"model.untie_at splits a tied model in two; model.tie_mode {mode} starts as two "
                                   "matrices already (W_out a copy of E) — drop one of them")
    elif mode is not None:
        _check(m.tie_embeddings, f"model.tie_mode {mode} builds W_out from E, so it needs model.tie_embeddings: "
                                 "true — drop model.tie_embeddings")
        _check(m.untie_at is None, f"model.untie_at splits a tied model in two; with model.tie_mode {mode} W_out "
                                   "is built from E and cannot split — drop one of them")
    _check(m.untie_rank >= 0, f"model.untie_rank must be 0 or more, got {m.untie_rank}")
    if m.untie_rank:
        _check(mode in RANKED, f"model.untie_rank {m.untie_rank} applies to model.tie_mode: lowrank or split only "
                               "— set one, or drop model.untie_rank")
        what = f"A·Bᵀ has rank at most {m.n_embd}" if mode == "lowrank" else f"W_out has {m.n_embd} columns"
        _check(m.untie_rank <= m.n_embd, f"model.untie_rank {m.untie_rank} is above model.n_embd ({m.n_embd}): "
                                         f"{what}, so the rest adds parameters and no rank — use at most {m.n_embd}")
    strength = m.tie_strength
    _check(math.isfinite(strength) and strength >= 0,
           f"model.tie_strength must be a finite number, 0 or more, got {strength}")
    if strength:
        _check(mode in STRENGTHENED, f"model.tie_strength {strength:g} applies to model.tie_mode: soft or pull only "
                                     "— set one, or drop model.tie_strength")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)
