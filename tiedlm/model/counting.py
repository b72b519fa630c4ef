"""Parameter counts, the training-memory lower bound and FLOPs per token of a config, by
arithmetic: nothing is built and torch is not imported, so `tiedlm params` is instant for any size
and absurd configs are refused before anything is allocated. model.count_params counts a built
model; tests/test_model.py checks the two against each other for every option."""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig
from ..device import device_memory
from ..errors import ConfigError
from ..formatting import format_bytes


def count_params_config(model_cfg: ModelConfig, vocab_size: int) -> dict:
    """The breakdown count_params gives for GPT(model_cfg, vocab_size), by arithmetic: instant for
    any size (nothing is built), so absurd configs can be refused before they are allocated.
    tests/test_model.py checks it against count_params on built models of every option."""
    if model_cfg.family.built_by_transformers:
        return _count_hf(model_cfg, vocab_size)
    d, L, V, b = model_cfg.n_embd, model_cfg.n_layer, vocab_size, int(model_cfg.bias)
    family = model_cfg.family
    ln = d if family.rms_norm else d * (1 + b)  # gain, and a bias when bias=True (an RMSNorm has none)
    qkv, hidden = _qkv_width(model_cfg), model_cfg.mlp_size
    attn = d * qkv + b * qkv + d * d + b * d  # c_attn (q, k, v), c_proj
    up = 2 * hidden if family.gated else hidden  # SwiGLU's c_fc is gate and up
    mlp = d * up + b * up + hidden * d + b * d  # c_fc, c_proj
    block = 2 * ln + attn + mlp
    tie = model_cfg.tie
    tied = not tie.two_matrices
    wte, wpe = V * d, model_cfg.block_size * d if family.learned_positions else 0
    lm_head = tie.head_params(V, d)  # W_out's own parameters: none when it is E, V·d untied, P or A and B
    lm_head_bias = V if model_cfg.lm_head_bias else 0
    total = wte + wpe + L * block + ln + lm_head + lm_head_bias
    return {"total": total, "wte": wte, "lm_head": lm_head, "lm_head_bias": lm_head_bias, "wpe": wpe,
            "non_embedding": total - wte - lm_head - wpe, "saved_by_tying": wte - lm_head if tied else 0,
            "tied": tied, "tie_mode": tie.mode, "vocab_size": V}


def _qkv_width(model_cfg: ModelConfig) -> int:
    """The width of the fused q, k, v projection: 3·d, or (n_head + 2·n_kv_head)·head_size with
    grouped-query attention (llama)."""
    head_size = model_cfg.n_embd // model_cfg.n_head
    return (model_cfg.n_head + 2 * model_cfg.kv_heads) * head_size


# Bytes per parameter while training in fp32 with AdamW: the weight, its gradient, two moments.
TRAIN_BYTES_PER_PARAM = 16


def training_memory(model_cfg: ModelConfig, vocab_size: int, batch_size: int) -> dict:
    """A lower bound on the memory one fp32 training step needs, by arithmetic: weights, gradients
    and AdamW moments (16 bytes per parameter), plus what autograd must keep of one micro-batch:
    at least 16 floats per token and layer (the block's inputs, q/k/v, the MLP's hidden layer and
    its activation: 4d and its GELU, or SwiGLU's gate and up) and two (B, T, V) logit-sized tensors (the logits and their gradient). Real use
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
            f"activations), more than the {format_bytes(have)} of {where} — lower {_size_keys(model_cfg)}")


def _size_keys(model_cfg: ModelConfig) -> str:
    """The keys that set a model's training memory, as the memory refusal lists them: the MLP's
    width among them where a llama config's width is not Llama's rule at the default rounding (a
    config's one form keeps a width set through model.multiple_of as model.intermediate_size)."""
    keys = ["model.n_layer", "model.n_embd"]
    by_rule = dataclasses.replace(model_cfg, intermediate_size=None, multiple_of=ModelConfig.multiple_of).mlp_size
    if model_cfg.family.gated and model_cfg.mlp_size != by_rule:
        keys.append("model.intermediate_size (or model.multiple_of)")
    keys += ["model.block_size", "tokenizer.vocab_size"]
    return ", ".join(keys) + " or train.batch_size"


# Above this many parameters (by a Llama-shaped estimate) a transformers model is not built even on
# the meta device to count it: a typo like n_layer=100000000000 would hang building its modules.
HF_BUILD_LIMIT = 10 ** 12


def _count_hf(model_cfg: ModelConfig, vocab_size: int) -> dict:
    """arch: hf, counted on the meta device (hf.count_on_meta); past HF_BUILD_LIMIT, the estimate
    of a Llama-style block of that size, which only serves to refuse it."""
    d, L = model_cfg.n_embd, model_cfg.n_layer
    estimate = L * (4 * d * d + 3 * d * model_cfg.mlp_size) + 2 * vocab_size * d
    if estimate > HF_BUILD_LIMIT:
        return {"total": estimate, "estimate": True}
    key = (repr(model_cfg), vocab_size)  # one meta build per model: the memory check, params and FLOPs ask alike
    if key not in _HF_COUNTS:
        from .hf_model import count_on_meta

        _HF_COUNTS[key] = count_on_meta(model_cfg, vocab_size)
    return dict(_HF_COUNTS[key])


_HF_COUNTS: dict[tuple[str, int], dict] = {}  # _count_hf's results, by the model config and vocabulary


def flops_per_token(model_cfg: ModelConfig, vocab_size: int, tokens_per_forward: int | None = None,
                    tokens_per_step: int | None = None) -> dict:
    """Matmul FLOPs per token (2 per multiply-add), the head counted whether or not it is tied:
    tying saves parameters, never compute. Attention scores count the full T x T product
    (as PaLM and nanoGPT's MFU estimate do). Backward = 2 x forward; train = 3 x forward.
    Embedding lookups, norms, GELU/SiLU, the gate's product, rotary embeddings and softmax are not
    matmuls and are left out. A Llama-style layer's matmuls are q, k, v (n_head + 2·n_kv_head heads),
    the attention output and the gated MLP's three d × intermediate_size matrices. The projection
    mode's P h is 2d² more per token. The lowrank mode forms E + A·Bᵀ once per forward pass (2·V·d·r,
    and twice that backward, for A and B), shared by the batch's tokens: with `tokens_per_forward`
    (a micro-batch: batch_size × block_size) it is spread over them as `head_formation`; without,
    it is left out (it is not a property of one token). The soft mode's penalty λ/2·‖W_out − E‖² is
    computed once per optimizer step, forward and backward 6·V·d (Tie.penalty_flops; elementwise,
    not a matmul): with `tokens_per_step` (batch_size × block_size × grad_accum) it is spread over
    them as `tie_penalty` and added to `train` only (evaluation has no penalty); without, left out.
    The pull mode's decoupled step (5·V·d per optimizer step) is counted the same way."""
    d, L, T, V = model_cfg.n_embd, model_cfg.n_layer, model_cfg.block_size, vocab_size
    if model_cfg.family.built_by_transformers:  # its layers' matmul weights, from the model on the meta device
        matmul_params = _count_hf(model_cfg, V).get("non_head_matmul_params", 0) // max(L, 1)  # layers alike
    else:
        mlp = model_cfg.family.mlp_matrices * d * model_cfg.mlp_size  # d->4d->d, or gate, up, down
        matmul_params = d * _qkv_width(model_cfg) + d * d + mlp  # a layer's weights: qkv, attention output, MLP
    per_layer = 2 * matmul_params
    attention = 2 * 2 * T * d  # q@k^T and att@v, per layer
    head = model_cfg.tie.head_flops(V, d)
    formation: float = 0  # an int unless the lowrank formation is spread over a micro-batch
    per_pass = model_cfg.tie.formation_flops(V, d)
    if per_pass is not None and tokens_per_forward:
        formation = per_pass / tokens_per_forward
    forward = L * (per_layer + attention) + head
    out = {"forward": forward + formation, "train": 3 * (forward + formation), "head": head,
           "non_head_matmul_params": L * matmul_params}
    if formation:
        out["head_formation"] = formation  # per token, forward; train counts it 3 times
    per_step = model_cfg.tie.penalty_flops(V, d)
    if per_step is not None and tokens_per_step:
        out["tie_penalty"] = per_step / tokens_per_step  # per token, forward and backward together
        out["train"] += out["tie_penalty"]
    return out
