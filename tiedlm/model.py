"""A decoder of GPT-2-style or Llama-style blocks, with weight-tying options, and its counting.

Reads top to bottom: the GPT-2 block (CausalSelfAttention, MLP, Block), the Llama-style block
(rotary embeddings, GroupedQueryAttention, SwiGLU, LlamaBlock), then GPT, which stacks either kind
(`model.arch`). Names follow GPT-2 / nanoGPT (wte, wpe, h, ln_f, lm_head, n_layer, n_embd) on
both, so that counts can be checked against them; export.py renames to each transformers class.
A Llama-style block (Touvron et al. 2023; the blocks of Llama 3.2 and SmolLM2) is pre-norm
RMSNorm, attention with rotary embeddings on q and k and n_kv_head key/value heads, and a gated MLP
(SwiGLU); the model has no position matrix, so E is its only embedding, and a final RMSNorm.

Tying (Press & Wolf 2017; Inan et al. 2017): `lm_head.weight` *is* `wte.weight`, one Parameter
used twice, so its gradient is the sum of the gradients of both uses and AdamW keeps one state.
Three modes build W_out from that shared E (`model.tie_mode`; `lm_head.weight` is still E):
`projection`, Press & Wolf's, logits = (P h) Eᵀ with a learned d×d map P (`head_proj`, starting at
the identity, weight-decayed); `lowrank`, W_out = E + A·Bᵀ with A (V×r, `head_a`, starting at
zero) and B (d×r, `head_b`, orthonormal columns), a dial from tied (r = 0) towards untied; and
`split`, W_out = [W_r, E[:, r:]] with W_r (V×r, `head_own`, starting as E's first r columns) a
matrix of its own: the dial that reaches both ends (r = 0 tied, r = d untied from a tied start).
All three start as the tied model. `head()` gives what the output layer computes with; `output_weight()` the
effective W_out (V×d), which analyze and export use. Two more, `soft` and `pull`, are two matrices, as
untied: W_out starts as a copy of E, and soft's training loss adds λ/2·‖W_out − E‖² (`tie_penalty()`,
added once per optimizer step by train/step.py, never to an evaluation's loss); `pull` is soft
decoupled from Adam (`pull_tie()`, a step of W_out and E towards each other after the optimizer's).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .config import ModelConfig
from .errors import RunError
from .norms import LayerNorm
from .tie import UNTIED, Tie
from .loss import cross_entropy, token_losses


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, nh, T, hs)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm residual block (GPT-2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# -------------------------------------------------------------------- the Llama-style block


def rotary_tables(head_size: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (length, head_size / 2) of the rotary embedding's angles, position · θ^(-2i/hs),
    in float32, as transformers' Llama computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.int64).float() / head_size))
    angles = torch.outer(torch.arange(length, dtype=torch.int64).float(), inv_freq)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of x (B, heads, T, hs): dimension i is paired with i + hs/2 (the
    "rotate half" layout of transformers' Llama, so export needs no permutation of q and k)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GroupedQueryAttention(nn.Module):
    """Causal attention with n_kv_head key/value heads, each shared by n_head / n_kv_head query
    heads (n_kv_head = n_head is multi-head attention), and rotary embeddings on q and k."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.kv_heads
        self.head_size = cfg.n_embd // cfg.n_head
        # q, k and v in one matmul: n_head + 2·n_kv_head heads of head_size
        self.c_attn = nn.Linear(cfg.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs, kv = self.head_size, self.n_kv_head * self.head_size
        q, k, v = self.c_attn(x).split([C, kv, kv], dim=2)
        # rotated in float32 (the tables' dtype) and rounded once: under autocast q and k are bf16
        q = rotate(q.view(B, T, self.n_head, hs).transpose(1, 2).float(), cos, sin).to(v.dtype)  # (B, nh, T, hs)
        k = rotate(k.view(B, T, self.n_kv_head, hs).transpose(1, 2).float(), cos, sin).to(v.dtype)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_head != self.n_head,  # query head j reads key/value head j // (nh / nkv)
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class SwiGLU(nn.Module):
    """The gated MLP (Shazeer 2020): down(silu(gate x) * up x), gate and up in one matmul (c_fc's
    first and second halves), of width model.intermediate_size (ModelConfig.mlp_size)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 2 * cfg.mlp_size, bias=cfg.bias)  # [gate; up]
        self.c_proj = nn.Linear(cfg.mlp_size, cfg.n_embd, bias=cfg.bias)  # down
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.dropout(self.c_proj(F.silu(gate) * up))


class LlamaBlock(nn.Module):
    """Pre-RMSNorm residual block (Llama)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.attn = GroupedQueryAttention(cfg)
        self.ln_2 = nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


# -------------------------------------------------------------------- the model


BLOCKS = {"gpt2": Block, "llama": LlamaBlock}  # each family's block (arch.ARCHS names them)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.family = cfg.family  # the block family (arch.Arch): what it builds is asked of it
        parts = dict(wte=nn.Embedding(vocab_size, cfg.n_embd))  # E: (V, d)
        if self.family.learned_positions:  # GPT-2; a rotary model rotates q and k instead
            parts["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
        block = BLOCKS[self.family.name]
        parts["drop"] = nn.Dropout(cfg.dropout)
        parts["h"] = nn.ModuleList([block(cfg) for _ in range(cfg.n_layer)])
        parts["ln_f"] = (nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps) if self.family.rms_norm
                         else LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=cfg.bias))
        self.transformer = nn.ModuleDict(parts)
        if self.family.rotary:  # not in the state dict: a function of the config
            cos, sin = rotary_tables(cfg.n_embd // cfg.n_head, cfg.block_size, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.lm_head = nn.Linear(cfg.n_embd, vocab_size, bias=cfg.lm_head_bias)  # W_out: (V, d)
        # sqrt(d) scaling of the input embedding (Vaswani et al. 2017, Gemma): with a tied matrix
        # the output side sees E unscaled, the input side sees sqrt(d)*E.
        self.embed_scale = math.sqrt(cfg.n_embd) if cfg.embed_scale == "sqrt_d" else 1.0
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) (two per block)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        self.built_tie = cfg.tie  # the config's tie; current_tie is the tie now (untie_at splits it)
        if not self.built_tie.two_matrices:
            self.tie()
        elif self.built_tie.strengthened:  # W_out starts as E's copy (its own init drawn, then replaced,
            with torch.no_grad():  # so that the random stream, and E and the blocks, are untied's at a seed)
                self.lm_head.weight.copy_(self.transformer.wte.weight)
        # The modes' extra parameters come after every other initialisation, so that their weights
        # draw nothing from the random stream the tied model's weights are drawn from: at a seed, a
        # projection or lowrank model starts with the tied model's E and blocks exactly.
        if self.built_tie.mode == "projection":
            self.head_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)  # P: (d, d), applied as P h
            with torch.no_grad():
                self.head_proj.weight.copy_(torch.eye(cfg.n_embd))
        elif self.built_tie.mode == "lowrank":
            r = self.built_tie.rank
            self.head_a = nn.Parameter(torch.zeros(vocab_size, r))  # A: (V, r)
            b = torch.empty(cfg.n_embd, r)
            if r:
                nn.init.orthogonal_(b)  # orthonormal columns: at r = d, A·Bᵀ moves as an untied W_out would
            self.head_b = nn.Parameter(b)  # B: (d, r)
        elif self.built_tie.mode == "split":  # W_out's first r columns its own, started as E's (no draw)
            self.head_own = nn.Parameter(self.transformer.wte.weight[:, :self.built_tie.rank].detach().clone())

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # nanoGPT / GPT-2 init: normal(0, 0.02) for every matrix and embedding, zero biases.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # ---------------------------------------------------------------- tying

    @property
    def is_tied(self) -> bool:
        return self.lm_head.weight is self.transformer.wte.weight

    head_key = "lm_head.weight"  # W_out's name in the state dict: stored once, under E's, when tied

    @property
    def current_tie(self) -> Tie:
        """The tie the model has now: its config's, or untied once a tied model has split (untie_at)."""
        return self.built_tie if self.is_tied or self.built_tie.two_matrices else UNTIED

    @property
    def w_out_is_e(self) -> bool:
        """Whether the effective W_out is E itself now (Tie.w_out_is_e: tied, or lowrank at rank 0)."""
        return self.current_tie.w_out_is_e

    def tie(self) -> None:
        """Make W_out the same Parameter as E (E's init is kept, the head's discarded)."""
        self.lm_head.weight = self.transformer.wte.weight
        assert self.is_tied

    def untie(self) -> nn.Parameter:
        """Split a tied model in two independent matrices with identical values (modded-nanogpt's
        untie). Returns the new W_out Parameter; the caller copies the optimizer state to it."""
        assert self.is_tied, "untie() on a model that is not tied"
        new = nn.Parameter(self.transformer.wte.weight.detach().clone())
        self.lm_head.weight = new
        assert not self.is_tied
        return new

    def check_tie(self, tied: bool) -> None:
        """Assert the tie is what it should be; called wherever a model is built, wrapped or loaded."""
        if self.is_tied != tied:
            raise AssertionError(f"expected the model to be {'tied' if tied else 'untied'}, it is not")

    # ---------------------------------------------------------------- the output layer

    def head(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(the head's input, its weight (V, d), its bias): logits = input @ weightᵀ + bias. Tied and
        untied: (h, W_out, b); projection: (P h, E, b), which never forms E·P; lowrank: (h, E + A·Bᵀ,
        b), formed once per call (V·d·r multiply-adds, against V·d per token for the logits)."""
        mode = self.built_tie.mode
        if mode == "projection":
            return self.head_proj(h), self.transformer.wte.weight, self.lm_head.bias
        if mode == "lowrank":
            return h, self.transformer.wte.weight + self.head_a @ self.head_b.T, self.lm_head.bias
        if mode == "split":
            return h, self._split_weight(), self.lm_head.bias
        return h, self.lm_head.weight, self.lm_head.bias

    def _split_weight(self) -> torch.Tensor:
        """split's W_out (V, d): its own r columns, then E's last d − r (E itself at r = 0). The r
        columns get the head's gradient alone, and E none of it there: E's gradient from the head
        is in its last d − r columns only."""
        E, r = self.transformer.wte.weight, self.built_tie.rank
        return E if r == 0 else torch.cat([self.head_own, E[:, r:]], dim=1)

    def output_weight(self) -> torch.Tensor:
        """The effective W_out (V, d), detached: logits = h @ W_outᵀ (+ bias) for every mode. For
        projection it is E·P (logits = (P h) Eᵀ = h (E P)ᵀ)."""
        with torch.no_grad():
            if self.built_tie.mode == "projection":
                return self.transformer.wte.weight @ self.head_proj.weight
            if self.built_tie.mode == "lowrank":
                return self.transformer.wte.weight + self.head_a @ self.head_b.T
            if self.built_tie.mode == "split":
                return self._split_weight().detach()
            return self.lm_head.weight.detach()

    def tie_distance(self) -> torch.Tensor | None:
        """‖W_out − E‖_F (a 0-d tensor, no gradient) of a soft model, what its λ pulls to 0; None
        for the other modes."""
        if not self.built_tie.strengthened:
            return None
        with torch.no_grad():
            return torch.linalg.vector_norm(self.lm_head.weight - self.transformer.wte.weight)

    def tie_penalty(self) -> torch.Tensor | None:
        """Soft's λ/2·‖W_out − E‖²_F, with its gradient: λ(W_out − E) into W_out's and −λ(W_out − E)
        into E's. None when there is none (not soft, or λ = 0: nothing is computed, so that λ = 0
        is untied from a tied start to the bit). Computed in float32 whatever the autocast: it is
        V·d elementwise work once per optimizer step."""
        if not self.built_tie.penalised:
            return None
        diff = self.lm_head.weight.float() - self.transformer.wte.weight.float()  # (V, d)
        return 0.5 * self.built_tie.strength * diff.square().sum()

    @torch.no_grad()
    def pull_tie(self, lr: float) -> None:
        """Pull's decoupled step, after the optimizer's: W_out and E each move c = min(1/2, lr·λ) of
        D = W_out − E towards the other (their mean is kept; D shrinks by 1 − 2c), as AdamW's
        decoupled weight decay is lr·wd. Nothing for other modes, or at λ = 0."""
        if not self.built_tie.pulled:
            return
        W, E = self.lm_head.weight, self.transformer.wte.weight
        c = min(0.5, lr * self.built_tie.strength)
        diff = W - E  # (V, d)
        W.sub_(diff, alpha=c)
        E.add_(diff, alpha=c)

    def head_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The modes' own parameters (P, A and B, or split's columns): W_out's extra parameters beside E."""
        names = {"projection": ["head_proj.weight"], "lowrank": ["head_a", "head_b"],
                 "split": ["head_own"]}.get(self.built_tie.mode, [])
        params = dict(self.named_parameters())
        return [(n, params[n]) for n in names]

    def embedding_parameters(self) -> list[nn.Parameter]:
        """The embedding matrices, whose weight decay train.decay_embeddings sets: E, the position
        embeddings, W_out when it is a matrix of its own, lowrank's A and B and split's own columns
        (a part of W_out).
        Projection's P is a d×d map like the blocks' and is not among them."""
        t = self.transformer
        out = [t.wte.weight] + ([t.wpe.weight] if self.family.learned_positions else [])
        if not self.is_tied:
            out.append(self.lm_head.weight)
        if self.built_tie.mode == "lowrank":
            out += [self.head_a, self.head_b]
        if self.built_tie.mode == "split":
            out.append(self.head_own)
        return out

    # ---------------------------------------------------------------- forward

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduction: str = "mean") -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, V); given targets (B, T), the cross-entropy instead,
        by the fused loss (loss.py: the logits never whole): the mean (reduction="mean"), or each
        token's (reduction="none", (B, T), no gradient: evaluation)."""
        h, weight, bias = self.head(self.hidden(idx))
        if targets is None:
            return F.linear(h, weight, bias)  # (B, T, V)

        h2, t = h.reshape(-1, h.size(-1)), targets.reshape(-1)
        if reduction == "none":
            return token_losses(h2, weight, bias, t).view(targets.shape)
        if reduction != "mean":
            raise ValueError(f"reduction must be 'mean' or 'none', not {reduction!r}")
        return cross_entropy(h2, weight, bias, t)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> the final norm's output (B, T, C), what the head reads."""
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        tok = self.transformer.wte(idx)  # (B, T, C)
        if self.embed_scale != 1.0:
            tok = tok * self.embed_scale
        if self.family.rotary:
            x = self.transformer.drop(tok)
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            for block in self.transformer.h:
                x = block(x, cos, sin)
        else:
            x = self.transformer.drop(tok + self.transformer.wpe(torch.arange(T, device=idx.device)))
            for block in self.transformer.h:
                x = block(x)
        return self.transformer.ln_f(x)


# -------------------------------------------------------------------- the loss


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, amp=None) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch: the model's forward with the targets, whose loss
    (loss.py) takes the head and the cross-entropy over chunks of a few MB of logits and computes
    the gradients as it goes; the logits are never whole and their gradient never a separate
    buffer. It goes through the wrapper, so it is the same under DistributedDataParallel."""
    with amp if amp is not None else contextlib.nullcontext():
        return model(x, y)


# -------------------------------------------------------------------- weights in and out


def build_model(cfg: ModelConfig, vocab_size: int) -> nn.Module:
    """The model a config names: tiedlm's own blocks (GPT), or a transformers family (arch: hf)."""
    if cfg.family.built_by_transformers:
        from .hf_model import HFCausalLM

        return HFCausalLM(cfg, vocab_size)
    return GPT(cfg, vocab_size)


def freeze_all_but(model: nn.Module, trainable: str) -> None:
    """train.trainable: leave the head's parameters (W_out and a tie mode's own; E when tied, as it
    is W_out), the embedding matrices, or all of them trainable, and freeze the rest. Returns the
    number of trainable values (a shared matrix once)."""
    if trainable != "all":
        keep = ([model.lm_head.weight, *(p for _, p in model.head_parameters())] if trainable == "head"
                else model.embedding_parameters())
        kept = {id(p) for p in keep}
        for p in model.parameters():
            p.requires_grad_(id(p) in kept)


@torch.no_grad()
def init_new_rows(model: nn.Module, ids: list[int]) -> None:
    """New tokens (tokenizer.add_tokens): their rows of E, and of W_out when it is a matrix of its
    own, drawn from a normal with the mean and covariance of the rows of the ids before them (the
    tokenizer's old ids), scaled by 1e-9 as transformers' mean_resizing does (Hewitt, 2021): each new
    row starts at the old rows' mean, so that its logit starts at the average token's and
    generation does not collapse onto it. The mean alone where the covariance is singular (fewer
    old rows than dimensions)."""
    if not ids:
        return
    first = min(ids)
    new = torch.as_tensor(ids)
    mats = [model.transformer.wte.weight] + ([] if model.is_tied else [model.lm_head.weight])
    for W in mats:
        old = W[:first].float()
        mean = old.mean(0)
        centered = old - mean
        cov = centered.T @ centered / max(first, 1)
        try:
            dist = torch.distributions.MultivariateNormal(mean, covariance_matrix=1e-9 * cov)
            W[new] = dist.sample((len(ids),)).to(W.dtype)
        except (ValueError, RuntimeError):  # not positive definite
            W[new] = mean.to(W.dtype).expand(len(ids), -1)


def model_tensors(model) -> tuple[dict, dict]:
    """State dict for safetensors: a tied matrix is stored once (under E's name), with the tie recorded."""
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.is_tied:
        del sd[model.head_key]
    return sd, {"tied": model.is_tied, "vocab_size": model.vocab_size, "tiedlm_version": _version()}


def load_model_tensors(model, tensors: dict, tied: bool) -> None:
    """Load weights; the tie is restored (one Parameter, not a copy) and asserted."""
    if tied and not model.is_tied:
        model.tie()
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # shape mismatch
        first = str(exc).strip().splitlines()[-1].strip()
        raise RunError(f"checkpoint does not fit the model ({first}) — was the config changed?") from None
    missing = set(missing) - ({model.head_key} if tied else set())
    if missing or unexpected:
        raise RunError(f"checkpoint does not fit the model (missing {sorted(missing)[:3]}, unexpected "
                       f"{sorted(unexpected)[:3]}) — was the config changed?")
    model.check_tie(tied)


def _version() -> str:
    from . import __version__

    return __version__


# -------------------------------------------------------------------- counting


def count_params(model: GPT) -> dict:
    """The one place parameters are counted. Every piece is reported so that no convention is
    ambiguous: nanoGPT's count is `total`; transformers' num_parameters(exclude_embeddings=True)
    drops the nn.Embedding weights, wte and wpe, and keeps an untied lm_head (an nn.Linear): it is
    total − wte − wpe; Pythia counts E and W_out separately (`wte` + `saved_by_tying` when tied)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() yields a shared Parameter once; be explicit anyway
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    wte = model.transformer.wte.weight.numel()
    wpe = model.transformer.wpe.weight.numel() if model.family.learned_positions else 0
    tied = model.is_tied
    extra = sum(p.numel() for _, p in model.head_parameters())  # P, or A and B
    lm_head = extra if tied else model.lm_head.weight.numel()
    lm_head_bias = model.lm_head.bias.numel() if model.lm_head.bias is not None else 0
    return {
        "total": total,
        "wte": wte,
        "lm_head": lm_head,  # extra parameters of W_out: 0 when it is E; P, or A and B, when built from E
        "lm_head_bias": lm_head_bias,
        "wpe": wpe,
        "non_embedding": total - wte - lm_head - wpe,  # blocks, ln_f and the head's bias
        "saved_by_tying": wte - extra if tied else 0,  # V*d, less what a mode spends on W_out
        "tie_mode": model.current_tie.mode,
        "tied": tied,
        "vocab_size": model.vocab_size,
        **({"head_kind": model.head_kind} if hasattr(model, "head_kind") else {}),  # arch: hf: how the loss is taken
    }
