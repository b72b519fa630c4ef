"""A `model.arch: llama` run as a Hugging Face `LlamaForCausalLM` (export/__init__.py writes and checks the folder).

tiedlm's Llama-style block is transformers' Llama up to names and two fused matmuls: c_attn holds
q, k and v one above the other (n_head, n_kv_head and n_kv_head heads of head_size rows) and is
split into q_proj, k_proj and v_proj; SwiGLU's c_fc holds [gate; up] and is split into gate_proj
and up_proj. Both use nn.Linear's (out, in) layout, so nothing is transposed, and the rotary
embedding already pairs dimension i with i + head_size/2 ("rotate half"), so q and k need no
permutation. Biases exist exactly when `model.bias` is true (attention_bias, mlp_bias).

`embed_scale: sqrt_d`, which LlamaForCausalLM lacks, is folded into the weights: √d·E is the
embedding. Untied, the head keeps its own (unscaled) W_out. Tied, the one stored matrix is √d·E and
the head would see it too, so the final RMSNorm's gain is divided by √d: the head then computes
(g/√d ⊙ n)·(√d·E)ᵀ = (g ⊙ n)·Eᵀ, tiedlm's logits, with the tie kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import RunError

if TYPE_CHECKING:
    from ..config import Config
    from ..model.blocks import GPT

CLASS = "LlamaForCausalLM"


def llama_config(cfg: Config, vocab: int, tied: bool, eot_id: int) -> dict:
    """config.json of the LlamaForCausalLM."""
    m = cfg.model
    return {"architectures": [CLASS], "model_type": "llama", "vocab_size": vocab, "hidden_size": m.n_embd,
            "intermediate_size": m.mlp_size, "num_hidden_layers": m.n_layer, "num_attention_heads": m.n_head,
            "num_key_value_heads": m.kv_heads, "head_dim": m.n_embd // m.n_head, "hidden_act": "silu",
            "max_position_embeddings": m.block_size, "rms_norm_eps": m.norm_eps,
            # rope_theta is what transformers 4 reads; transformers 5 reads rope_parameters (and converts rope_theta)
            "rope_theta": m.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_theta},
            "attention_bias": m.bias, "mlp_bias": m.bias, "attention_dropout": m.dropout,
            "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
            "tie_word_embeddings": tied, "bos_token_id": eot_id, "eos_token_id": eot_id, "torch_dtype": "float32"}


def llama_state_dict(model: GPT, sd: dict, tied: bool) -> dict:
    """`sd` (tiedlm's names, the modes' parameters already folded into lm_head.weight, which is
    absent when tied) under LlamaForCausalLM's names (see the module docstring)."""
    cfg = model.cfg
    hs = cfg.n_embd // cfg.n_head
    q, kv = cfg.n_head * hs, cfg.kv_heads * hs
    out = {"model.embed_tokens.weight": sd.pop("transformer.wte.weight"),
           "model.norm.weight": sd.pop("transformer.ln_f.weight")}
    if model.embed_scale != 1.0:
        out["model.embed_tokens.weight"] = out["model.embed_tokens.weight"] * model.embed_scale
        if tied:  # the head reads the scaled E too: scale its input back down
            out["model.norm.weight"] = out["model.norm.weight"] / model.embed_scale
    if not tied:
        out["lm_head.weight"] = sd.pop("lm_head.weight")
    for i in range(cfg.n_layer):
        t, h = f"transformer.h.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = sd.pop(t + "ln_1.weight")
        out[h + "post_attention_layernorm.weight"] = sd.pop(t + "ln_2.weight")
        for kind in ("weight", "bias") if cfg.bias else ("weight",):
            for name, part in zip(("q_proj", "k_proj", "v_proj"), sd.pop(f"{t}attn.c_attn.{kind}").split([q, kv, kv])):
                out[f"{h}self_attn.{name}.{kind}"] = part.contiguous()
            out[f"{h}self_attn.o_proj.{kind}"] = sd.pop(f"{t}attn.c_proj.{kind}")
            gate, up = sd.pop(f"{t}mlp.c_fc.{kind}").chunk(2, dim=0)
            out[f"{h}mlp.gate_proj.{kind}"], out[f"{h}mlp.up_proj.{kind}"] = gate.contiguous(), up.contiguous()
            out[f"{h}mlp.down_proj.{kind}"] = sd.pop(f"{t}mlp.c_proj.{kind}")
    if sd:  # a tensor with no place in LlamaForCausalLM: the model grew a part the export does not know
        raise RunError(f"tiedlm's export has no LlamaForCausalLM name for {sorted(sd)[:3]} — this is a bug in "
                       "tiedlm's export; please report it")
    return out

