"""tiedlm's own decoder blocks, GPT-2-style and Llama-style, and the weights' way in and out.

Reads top to bottom: the GPT-2 block (CausalSelfAttention, MLP, Block), the Llama-style block
(rotary embeddings, GroupedQueryAttention, SwiGLU, LlamaBlock), then GPT, which stacks either kind
(`model.arch`) and draws its family's own initialisation (arch.Arch.init). Names follow GPT-2 /
nanoGPT (wte, wpe, h, ln_f, lm_head, n_layer, n_embd) on both, so that counts can be checked
against them; export/__init__.py renames to each transformers class. A Llama-style block (Touvron et al.
2023; the block of Llama 3.2 and SmolLM2) is pre-norm RMSNorm, attention with rotary embeddings on
q and k and n_kv_head key/value heads, and a gated MLP (SwiGLU); the model has no position matrix,
so E is its only embedding, and a final RMSNorm.

The tie and every tying mode are not here: GPT is a tie_layer.TiedLM, which acts on any model
through its input embedding and output head (`get_input_embeddings`, `get_output_embeddings`), this
one and a transformers family (model/hf_model.py) alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..config import ModelConfig
from ..errors import RunError
from .norms import LayerNorm
from .tie_layer import TiedLM, count_params  # noqa: F401  (count_params: the library's name for it here)


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


class GPT(TiedLM):
    """tiedlm's own decoder: E, the blocks of its family (model.arch), the final norm and the head;
    the tie and its modes are tie_layer.TiedLM's."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.family = cfg.family  # the block family (arch.Arch): what it builds is asked of it
        parts = dict(wte=nn.Embedding(vocab_size, cfg.n_embd))  # E: (V, d)
        if self.family.learned_positions:  # GPT-2; a rotary model rotates q and k instead
            parts["wpe"] = nn.Embedding(cfg.block_size, cfg.n_embd)
            self.positions_key = "transformer.wpe.weight"
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
        self.init_weights()
        self.attach_tie(cfg.tie)

    def init_weights(self) -> None:
        """The family's own initialisation (arch.Arch.init): normal(0, 0.02) for every matrix and
        embedding, zero biases, unit norm gains, as GPT-2 and Llama both draw them; then GPT-2's
        residual projections (the attention output and the MLP's down projection, two per block)
        again at 0.02/√(2·n_layer) (Radford et al. 2019). Llama draws those at 0.02 like the rest."""
        init = self.family.init
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=init.std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual = init.residual_std(self.cfg.n_layer)
        if residual != init.std:
            for block in self.transformer.h:
                for proj in (block.attn.c_proj, block.mlp.c_proj):
                    nn.init.normal_(proj.weight, mean=0.0, std=residual)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.h)

    def init_family(self) -> None:
        """init_weights, with the norms' unit gains and zero biases set again."""
        for module in self.modules():
            if isinstance(module, (LayerNorm, nn.RMSNorm)):
                module.reset_parameters()
        self.init_weights()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.transformer.wte

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def position_parameters(self) -> list[nn.Parameter]:
        return [self.transformer.wpe.weight] if self.family.learned_positions else []

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> the final norm's output (B, T, C), what the head reads."""
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        tok = self.embed(idx)  # (B, T, C)
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
    (model/loss.py) takes the head and the cross-entropy over chunks of a few MB of logits and computes
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


def rebuild_model(cfg: ModelConfig, vocab_size: int, kept: Path | None = None) -> nn.Module:
    """A run's model, to take its own checkpoint's weights (evaluate.load_run_model): built as
    training built it, except that a pretrained start's weights are not read (the checkpoint holds
    every weight), and model.hf_config's file (a start's config.json, or a local config.json) is
    read from `kept`, the copy the run keeps of it (runs/layout.py START), where it has one: so that
    the run is rebuilt as it was trained after its start was moved, replaced, edited or deleted."""
    if not cfg.family.built_by_transformers:
        return GPT(cfg, vocab_size)
    from .hf_model import HFCausalLM

    if kept is not None:
        cfg = dataclasses.replace(cfg, hf_config=str(kept))
    return HFCausalLM(cfg, vocab_size, start_weights=False)


def freeze_all_but(model: nn.Module, trainable: str) -> None:
    """train.trainable: leave the head's parameters (W_out, its bias where it has one — tiedlm's
    model.lm_head_bias or the family's own, as Phi's — and a tie mode's own; E when tied, as it is
    W_out), the embedding matrices (model.embedding_parameters: E, W_out, a learned position table),
    or all of them trainable, and freeze the rest."""
    if trainable != "all":
        head = model.get_output_embeddings()
        keep = ([head.weight, *([head.bias] if head.bias is not None else []),
                 *(p for _, p in model.head_parameters())] if trainable == "head"
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
    mats = [model.get_input_embeddings().weight] + ([] if model.is_tied else [model.get_output_embeddings().weight])
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
    from .. import __version__

    return __version__
