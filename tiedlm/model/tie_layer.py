"""The one tie layer: every tying mode over any model's input embedding and output head.

A model that tiedlm trains is a `TiedLM`: its family gives the blocks (tiedlm's own GPT-2 and
Llama-style blocks in model/blocks.py, or a transformers causal LM in model/hf_model.py) and four things the
layer asks of them: the input embedding E (`get_input_embeddings`, an nn.Embedding), the output
head (`get_output_embeddings`, an nn.Linear, as transformers names them), the final hidden state
(`hidden`), and, where the family's logits are not a plain linear map of it, the family's own
logits (`family_logits`). Everything the tie does is written here once, against that interface:

- tied: the head's weight *is* E's Parameter (Press & Wolf 2017; Inan et al. 2017), one matrix
  used twice, whose gradient is the sum of both uses'; untied: a matrix of its own;
- projection, lowrank and split build W_out from E with parameters of their own (`head_proj`,
  `head_a` and `head_b`, `head_own`), drawn after every other weight so that at a seed the model
  starts with the tied model's E and blocks (model/tie.py says what each is);
- soft and pull: two matrices, W_out started as a copy of E, drawn together by a penalty in the
  loss or a decoupled step after the optimizer's;
- untie_at: `untie()` splits a tied model into two identical matrices part-way through training;
- the √d input scale (`model.embed_scale`) and the head bias (`model.lm_head_bias`).

Counting, the fused loss, checkpoints, DDP, analysis and export ask the layer, never a model
class: the tie is asserted by storage (and, for a transformers model, by its config flags too)
wherever a model is built, wrapped or loaded.

Modes that need the plain head (projection, lowrank, split) are refused on a family whose logits
are not `h @ W_outᵀ + b` (Gemma 2's final-logit soft-capping, a logit scale): the layer could not
put its W_out into the family's own logits. The rest act on the parameters alone and run there.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..errors import ConfigError
from .loss import cross_entropy, token_losses
from .tie import UNTIED, Tie


class TiedLM(nn.Module):
    """A language model and its tie. A family subclasses it, builds its blocks, E and the head,
    draws its own initialisation, then calls `attach_tie`."""

    vocab_size: int
    built_tie: Tie  # the config's tie; current_tie is the tie now (untie_at splits it)
    embed_scale: float = 1.0  # tiedlm's √d on the input side (model.embed_scale), beside any of the family's
    head_kind: str = "linear"  # or why the family's own logits are used (they are not h @ W_outᵀ + b)
    positions_key: str | None = None  # the learned position table's state-dict name, where the family has one

    # ---------------------------------------------------------------- what a family gives

    def get_input_embeddings(self) -> nn.Embedding:
        raise NotImplementedError

    def get_output_embeddings(self) -> nn.Linear:
        raise NotImplementedError

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> the final hidden state (B, T, d), what the head reads."""
        raise NotImplementedError

    def family_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """The family's own logits (B, T, V), for a head that is not linear (head_kind)."""
        raise NotImplementedError

    def position_parameters(self) -> list[nn.Parameter]:
        """A learned position table (GPT-2's wpe), decayed as the embeddings are; none by default."""
        return []

    def blocks(self) -> list[nn.Module]:
        """The repeated decoder blocks: under FSDP each is a unit of its own (fsdp.py), and E, W_out
        and what else is outside them the root's one unit, so that a tied matrix is one sharded Parameter."""
        raise NotImplementedError

    def init_family(self) -> None:
        """Draw the family's own initialisation again over the built weights (a model materialised
        from the meta device, fsdp.py)."""
        raise NotImplementedError

    def tie_flags(self) -> list[bool]:
        """The tie as the family's config states it (transformers' tie_word_embeddings); none here."""
        return []

    def set_tie_flags(self, tied: bool) -> None:
        """Write the tie into the family's config, where it has one."""

    # ---------------------------------------------------------------- building the tie

    def attach_tie(self, tie: Tie, lm_head_bias: bool = False) -> None:
        """Set the config's tie on the built model: one Parameter, or W_out a copy of E (soft,
        pull), then the modes' own parameters, which draw after every other weight."""
        if tie.built_from_e and self.head_kind != "linear":
            why = self.head_kind.removeprefix("the family's own logits ")
            raise ConfigError(f"model.tie_mode {tie.mode} builds W_out from E for a plain linear head, and this "
                              f"family's logits are not one {why} — use tied, untied, soft or pull (or "
                              "model.untie_at) on this family")
        self.built_tie = tie
        E, head = self.get_input_embeddings(), self.get_output_embeddings()
        V, d = E.weight.shape
        if lm_head_bias and head.bias is None:  # a family whose head has none: a zero bias of tiedlm's
            head.bias = nn.Parameter(torch.zeros(V, device=E.weight.device, dtype=E.weight.dtype))
        if not tie.two_matrices:
            self.tie()
        else:
            if head.weight is E.weight:  # a family that tied while it was built: two matrices
                head.weight = nn.Parameter(E.weight.detach().clone())
            self.set_tie_flags(False)
            if tie.strengthened:  # W_out starts as E's copy (its own draw replaced, so that the random
                with torch.no_grad():  # stream, and E and the blocks, are untied's at a seed)
                    head.weight.copy_(E.weight)
        on_meta = E.weight.device.type == "meta"
        if tie.mode == "projection":
            self.head_proj = nn.Linear(d, d, bias=False, device=E.weight.device)  # P: (d, d), applied as P h
        elif tie.mode == "lowrank":
            self.head_a = nn.Parameter(torch.zeros(V, tie.rank, device=E.weight.device))  # A: (V, r)
            self.head_b = nn.Parameter(torch.empty(d, tie.rank, device=E.weight.device))  # B: (d, r)
        elif tie.mode == "split":  # W_out's first r columns its own, started as E's (no draw)
            self.head_own = nn.Parameter(E.weight[:, :tie.rank].detach().clone())
        if not on_meta:
            self.init_tie_parameters()

    @torch.no_grad()
    def init_tie_parameters(self, set_full=None) -> None:
        """The modes' own starts: P the identity, lowrank's A zero and B orthonormal, split's columns
        E's. `set_full(param, value)` writes a whole value into a parameter (a sharded one's shard)."""
        set_full = set_full or (lambda p, value: p.copy_(value))
        mode, E = self.built_tie.mode, self.get_input_embeddings().weight
        d = E.shape[1]
        if mode == "projection":
            set_full(self.head_proj.weight, torch.eye(d))
        elif mode == "lowrank":
            b = torch.empty(d, self.built_tie.rank, device=E.device)
            if self.built_tie.rank:
                nn.init.orthogonal_(b)  # orthonormal columns: at r = d, A·Bᵀ moves as an untied W_out would
            self.head_a.zero_()
            set_full(self.head_b, b)
        elif mode == "split":
            self.head_own.copy_(E[:, :self.built_tie.rank])

    # ---------------------------------------------------------------- the tie now

    @property
    def is_tied(self) -> bool:
        return self.get_output_embeddings().weight is self.get_input_embeddings().weight

    @property
    def current_tie(self) -> Tie:
        """The tie the model has now: its config's, or untied once a tied model has split (untie_at)."""
        return self.built_tie if self.is_tied or self.built_tie.two_matrices else UNTIED

    @property
    def w_out_is_e(self) -> bool:
        """Whether the effective W_out is E itself now (Tie.w_out_is_e: tied, or lowrank at rank 0)."""
        return self.current_tie.w_out_is_e

    def _key_of(self, module: nn.Module) -> str:
        return next(n for n, m in self.named_modules(remove_duplicate=False) if m is module) + ".weight"

    @property
    def head_key(self) -> str:
        """W_out's name in the state dict: stored once, under E's, when tied."""
        return self._key_of(self.get_output_embeddings())

    @property
    def embedding_key(self) -> str:
        """E's name in the state dict."""
        return self._key_of(self.get_input_embeddings())

    def tie(self) -> None:
        """Make W_out the same Parameter as E (E's init is kept, the head's discarded)."""
        self.get_output_embeddings().weight = self.get_input_embeddings().weight
        self.set_tie_flags(True)
        assert self.is_tied

    def untie(self) -> nn.Parameter:
        """Split a tied model in two independent matrices with identical values (modded-nanogpt's
        untie). Returns the new W_out Parameter; the caller copies the optimizer state to it."""
        assert self.is_tied, "untie() on a model that is not tied"
        new = nn.Parameter(self.get_input_embeddings().weight.detach().clone())
        self.get_output_embeddings().weight = new
        self.set_tie_flags(False)
        assert not self.is_tied
        return new

    def check_tie(self, tied: bool) -> None:
        """Assert the tie is what it should be, by storage and by every config flag the family has;
        called wherever a model is built, wrapped or loaded."""
        flags = self.tie_flags()
        if self.is_tied != tied or any(f != tied for f in flags):
            raise AssertionError(f"expected the model to be {'tied' if tied else 'untied'}: by storage it is "
                                 f"{'tied' if self.is_tied else 'untied'}"
                                 + (f", by tie_word_embeddings {flags}" if flags else ""))

    # ---------------------------------------------------------------- the output layer

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(the head's input, its weight (V, d), its bias): logits = input @ weightᵀ + bias. Tied and
        untied: (h, W_out, b); projection: (P h, E, b), which never forms E·P; lowrank: (h, E + A·Bᵀ,
        b), formed once per call (V·d·r multiply-adds, against V·d per token for the logits)."""
        mode, E, bias = self.built_tie.mode, self.get_input_embeddings().weight, self.get_output_embeddings().bias
        if mode == "projection":
            return self.head_proj(h), E, bias
        if mode == "lowrank":
            return h, E + self.head_a @ self.head_b.T, bias
        if mode == "split":
            return h, self._split_weight(), bias
        return h, self.get_output_embeddings().weight, bias

    def _split_weight(self) -> torch.Tensor:
        """split's W_out (V, d): its own r columns, then E's last d − r (E itself at r = 0). The r
        columns get the head's gradient alone, and E none of it there."""
        E, r = self.get_input_embeddings().weight, self.built_tie.rank
        return E if r == 0 else torch.cat([self.head_own, E[:, r:]], dim=1)

    def output_weight(self) -> torch.Tensor:
        """The effective W_out (V, d), detached: logits = h @ W_outᵀ (+ bias) for every mode. For
        projection it is E·P (logits = (P h) Eᵀ = h (E P)ᵀ)."""
        with torch.no_grad():
            E, mode = self.get_input_embeddings().weight, self.built_tie.mode
            if mode == "projection":
                return E @ self.head_proj.weight
            if mode == "lowrank":
                return E + self.head_a @ self.head_b.T
            if mode == "split":
                return self._split_weight().detach()
            return self.get_output_embeddings().weight.detach()

    @contextlib.contextmanager
    def materialised_head(self):
        """For the length of the block, W_out is the effective W_out as a matrix of its own (or E,
        where it is E): what a transformers folder holds for a mode it has no form of."""
        head = self.get_output_embeddings()
        if not self.built_tie.built_from_e or self.w_out_is_e:
            yield
            return
        old = head.weight
        head.weight = nn.Parameter(self.output_weight().clone())
        self.set_tie_flags(False)
        try:
            yield
        finally:
            head.weight = old
            self.set_tie_flags(True)

    # ---------------------------------------------------------------- soft and pull

    def tie_distance(self) -> torch.Tensor | None:
        """‖W_out − E‖_F (a 0-d tensor, no gradient) of a soft or pull model, what its λ pulls to 0;
        None for the other modes."""
        if not self.built_tie.strengthened:
            return None
        with torch.no_grad():
            return _whole(torch.linalg.vector_norm(self.get_output_embeddings().weight
                                                   - self.get_input_embeddings().weight))

    def tie_penalty(self) -> torch.Tensor | None:
        """Soft's λ/2·‖W_out − E‖²_F, with its gradient: λ(W_out − E) into W_out's and −λ(W_out − E)
        into E's. None when there is none (not soft, or λ = 0: nothing is computed, so that λ = 0
        is untied from a tied start to the bit). Computed in float32 whatever the autocast: it is
        V·d elementwise work once per optimizer step."""
        if not self.built_tie.penalised:
            return None
        diff = self.get_output_embeddings().weight.float() - self.get_input_embeddings().weight.float()  # (V, d)
        return 0.5 * self.built_tie.strength * _whole(diff.square().sum())

    @torch.no_grad()
    def pull_tie(self, lr: float) -> None:
        """Pull's decoupled step, after the optimizer's: W_out and E each move c = min(1/2, lr·λ) of
        D = W_out − E towards the other (their mean is kept; D shrinks by 1 − 2c), as AdamW's
        decoupled weight decay is lr·wd. Nothing for other modes, or at λ = 0."""
        if not self.built_tie.pulled:
            return
        W, E = self.get_output_embeddings().weight, self.get_input_embeddings().weight
        c = min(0.5, lr * self.built_tie.strength)
        diff = W - E  # (V, d)
        W.sub_(diff, alpha=c)
        E.add_(diff, alpha=c)

    # ---------------------------------------------------------------- parameter groups

    def head_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The modes' own parameters (P, A and B, or split's columns): W_out's extra parameters beside E."""
        names = {"projection": ["head_proj.weight"], "lowrank": ["head_a", "head_b"],
                 "split": ["head_own"]}.get(self.built_tie.mode, [])
        params = dict(self.named_parameters())
        return [(n, params[n]) for n in names]

    def embedding_parameters(self) -> list[nn.Parameter]:
        """The embedding matrices, whose weight decay train.decay_embeddings sets: E, a learned
        position table, W_out when it is a matrix of its own, lowrank's A and B and split's own
        columns (a part of W_out). Projection's P is a d×d map like the blocks' and is not among them."""
        out = [self.get_input_embeddings().weight, *self.position_parameters()]
        if not self.is_tied:
            out.append(self.get_output_embeddings().weight)
        return out + [p for n, p in self.head_parameters() if n != "head_proj.weight"]

    # ---------------------------------------------------------------- forward

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """E's rows for idx (B, T) -> (B, T, d), times tiedlm's input scale: with a tied matrix the
        output side sees E unscaled, the input side √d·E (Vaswani et al. 2017)."""
        tok = self.get_input_embeddings()(idx)
        return tok * self.embed_scale if self.embed_scale != 1.0 else tok

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, V); given targets (B, T), the cross-entropy instead,
        by the fused loss (model/loss.py: the logits never whole): the mean (reduction="mean"), or each
        token's (reduction="none", (B, T), no gradient: evaluation). A family whose logits are not
        linear in W_out gives its own, and the loss is taken over them."""
        if reduction not in ("mean", "none"):
            raise ValueError(f"reduction must be 'mean' or 'none', not {reduction!r}")
        if self.head_kind != "linear":
            logits = self.family_logits(idx)
            if targets is None:
                return logits
            losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                                     reduction=reduction)
            return losses.view(targets.shape) if reduction == "none" else losses
        h, weight, bias = self.head(self.hidden(idx))
        if targets is None:
            return F.linear(h, weight, bias)  # (B, T, V)
        h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
        if reduction == "none":
            with torch.no_grad():
                return token_losses(h2, weight, bias, t).view(targets.shape)
        return cross_entropy(h2, weight, bias, t)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: a sum or norm over FSDP's shards (a DTensor) reduced over the ranks."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def block_biases(model: TiedLM) -> str:
    """Whether the blocks' matrices (every module with a 2-D weight inside model.blocks(): nn.Linear,
    GPT-2's Conv1D) have a bias, read from the built model: "yes" (all), "no" (none), or "K of N
    matrices" (Qwen2's q, k and v only). The config's model.bias says it only for tiedlm's own blocks."""
    mats = [m for block in model.blocks() for m in block.modules()
            if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2
            and not isinstance(m, nn.Embedding)]
    with_bias = sum(isinstance(getattr(m, "bias", None), torch.Tensor) for m in mats)
    if with_bias == 0:
        return "no"
    return "yes" if with_bias == len(mats) else f"{with_bias} of {len(mats)} matrices"


def count_params(model: TiedLM) -> dict:
    """The one place parameters are counted, for every family and mode. Every piece is reported so
    that no convention is ambiguous: nanoGPT's count is `total`; transformers'
    num_parameters(exclude_embeddings=True) drops the nn.Embedding weights, wte and wpe, and keeps an
    untied lm_head (an nn.Linear): it is total − wte − wpe; Pythia counts E and W_out separately
    (`wte` + `saved_by_tying` when tied)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() yields a shared Parameter once; be explicit anyway
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    head = model.get_output_embeddings()
    wte = model.get_input_embeddings().weight.numel()
    wpe = sum(p.numel() for p in model.position_parameters())
    tied = model.is_tied
    extra = sum(p.numel() for _, p in model.head_parameters())  # P, or A and B, or split's columns
    lm_head = extra if tied else head.weight.numel()
    lm_head_bias = head.bias.numel() if head.bias is not None else 0
    return {
        "total": total,
        "wte": wte,
        "lm_head": lm_head,  # extra parameters of W_out: 0 when it is E; P, or A and B, when built from E
        "lm_head_bias": lm_head_bias,
        "wpe": wpe,
        "non_embedding": total - wte - lm_head - wpe,  # blocks, final norm and the head's bias
        "saved_by_tying": wte - extra if tied else 0,  # V*d, less what a mode spends on W_out
        "tie_mode": model.current_tie.mode,
        "tied": tied,
        "vocab_size": model.vocab_size,
        # a transformers family's: how its loss is taken (a plain linear head, or its own logits)
        **({"head_kind": model.head_kind} if model.family.built_by_transformers else {}),
    }
