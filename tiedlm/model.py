"""A GPT-2-style decoder with weight-tying options, parameter counting and FLOPs per token.

Reads top to bottom: CausalSelfAttention, MLP, Block, GPT. Names follow GPT-2 / nanoGPT
(wte, wpe, h, ln_f, lm_head, n_layer, n_embd) so that counts can be checked against them.

Tying (Press & Wolf 2017; Inan et al. 2017): `lm_head.weight` *is* `wte.weight`, one Parameter
used twice, so its gradient is the sum of the gradients of both uses and AdamW keeps one state.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .config import ModelConfig
from .device import device_memory
from .errors import ConfigError, RunError
from .formatting import format_bytes


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
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, cfg.n_embd),  # E: (V, d)
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, vocab_size, bias=cfg.lm_head_bias)  # W_out: (V, d)
        # sqrt(d) scaling of the input embedding (Vaswani et al. 2017, Gemma): with a tied matrix
        # the output side sees E unscaled, the input side sees sqrt(d)*E.
        self.embed_scale = math.sqrt(cfg.n_embd) if cfg.embed_scale == "sqrt_d" else 1.0
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) (two per block)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        if cfg.tie_embeddings:
            self.tie()

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

    # ---------------------------------------------------------------- forward

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, V)."""
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        tok = self.transformer.wte(idx)  # (B, T, C)
        if self.embed_scale != 1.0:
            tok = tok * self.embed_scale
        x = self.transformer.drop(tok + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # (B, T, V)


# -------------------------------------------------------------------- weights in and out


def model_tensors(model) -> tuple[dict, dict]:
    """State dict for safetensors: a tied matrix is stored once (under wte), with the tie recorded."""
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.is_tied:
        del sd["lm_head.weight"]
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
    missing = set(missing) - ({"lm_head.weight"} if tied else set())
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
    ambiguous: nanoGPT's count is `total`; HF's exclude_embeddings drops wte (and the head when
    untied) and wpe; Pythia counts E and W_out separately (`wte` + `saved_by_tying` when tied)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() yields a shared Parameter once; be explicit anyway
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    wte = model.transformer.wte.weight.numel()
    wpe = model.transformer.wpe.weight.numel()
    tied = model.is_tied
    lm_head = 0 if tied else model.lm_head.weight.numel()
    lm_head_bias = model.lm_head.bias.numel() if model.lm_head.bias is not None else 0
    return {
        "total": total,
        "wte": wte,
        "lm_head": lm_head,  # extra parameters of W_out; 0 when it is E
        "lm_head_bias": lm_head_bias,
        "wpe": wpe,
        "non_embedding": total - wte - lm_head - wpe,  # blocks, ln_f and the head's bias
        "saved_by_tying": wte if tied else 0,  # V*d
        "tied": tied,
        "vocab_size": model.vocab_size,
    }


def count_params_config(model_cfg: ModelConfig, vocab_size: int) -> dict:
    """The breakdown count_params gives for GPT(model_cfg, vocab_size), by arithmetic: instant for
    any size (nothing is built), so absurd configs can be refused before they are allocated.
    tests/test_model.py checks it against count_params on built models of every option."""
    d, L, V, b = model_cfg.n_embd, model_cfg.n_layer, vocab_size, int(model_cfg.bias)
    ln = d * (1 + b)  # gain, and a bias when bias=True
    attn = d * 3 * d + b * 3 * d + d * d + b * d  # c_attn, c_proj
    mlp = d * 4 * d + b * 4 * d + 4 * d * d + b * d  # c_fc, c_proj
    block = 2 * ln + attn + mlp
    tied = model_cfg.tie_embeddings
    wte, wpe = V * d, model_cfg.block_size * d
    lm_head = 0 if tied else V * d
    lm_head_bias = V if model_cfg.lm_head_bias else 0
    total = wte + wpe + L * block + ln + lm_head + lm_head_bias
    return {"total": total, "wte": wte, "lm_head": lm_head, "lm_head_bias": lm_head_bias, "wpe": wpe,
            "non_embedding": total - wte - lm_head - wpe, "saved_by_tying": wte if tied else 0,
            "tied": tied, "vocab_size": V}


# Bytes per parameter while training in fp32 with AdamW: the weight, its gradient, two moments.
TRAIN_BYTES_PER_PARAM = 16


def training_memory(model_cfg: ModelConfig, vocab_size: int, batch_size: int) -> dict:
    """A lower bound on the memory one fp32 training step needs, by arithmetic: weights, gradients
    and AdamW moments (16 bytes per parameter), plus what autograd must keep of one micro-batch:
    at least 16 floats per token and layer (the block's inputs, q/k/v, the MLP's 4d hidden layer
    and its GELU) and two (B, T, V) logit-sized tensors (the logits and their gradient). Real use
    is higher (allocator slack, temporaries): this only refuses what can never fit."""
    P = count_params_config(model_cfg, vocab_size)["total"]
    tokens = batch_size * model_cfg.block_size
    activations = 4 * tokens * (16 * model_cfg.n_embd * model_cfg.n_layer + 2 * vocab_size)
    return {"params": P, "state_bytes": TRAIN_BYTES_PER_PARAM * P, "activation_bytes": activations,
            "total_bytes": TRAIN_BYTES_PER_PARAM * P + activations}


def check_fits(model_cfg: ModelConfig, vocab_size: int | None, batch_size: int, device) -> None:
    """Refuse a model that cannot fit in memory before anything is allocated or written: a
    typo like n_layer=100000000000 would otherwise hang while the model is built. With
    vocab_size None (the data not prepared yet) only the layers are counted."""
    need = training_memory(model_cfg, vocab_size or 0, batch_size)
    have, where = device_memory(device)
    if have is not None and need["total_bytes"] > have:
        what = "this model" if vocab_size is not None else "this model's layers alone (without embeddings)"
        raise ConfigError(
            f"{what} need{'s' if vocab_size is not None else ''} at least {format_bytes(need['total_bytes'])} to train "
            f"({need['params']:,} parameters x 16 bytes for weights, gradients and AdamW state, plus a batch's "
            f"activations), more than the {format_bytes(have)} of {where} — lower model.n_layer, model.n_embd, "
            "model.block_size, tokenizer.vocab_size or train.batch_size")


def flops_per_token(model_cfg: ModelConfig, vocab_size: int) -> dict:
    """Matmul FLOPs per token (2 per multiply-add), the head counted whether or not it is tied:
    tying saves parameters, never compute. Attention scores count the full T x T product
    (as PaLM and nanoGPT's MFU estimate do). Backward = 2 x forward; train = 3 x forward.
    Embedding lookups, LayerNorms, GELU and softmax are not matmuls and are left out."""
    d, L, T, V = model_cfg.n_embd, model_cfg.n_layer, model_cfg.block_size, vocab_size
    per_layer = 2 * (3 * d * d + d * d + 8 * d * d)  # qkv, attention output, MLP (d->4d->d)
    attention = 2 * 2 * T * d  # q@k^T and att@v, per layer
    head = 2 * d * V
    forward = L * (per_layer + attention) + head
    return {"forward": forward, "train": 3 * forward, "head": head,
            "non_head_matmul_params": L * 12 * d * d}
