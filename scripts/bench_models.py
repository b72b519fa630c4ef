"""The models scripts/bench.py times and their training steps: tiedlm's (GPT-2-style or Llama-style
blocks) and transformers' of the same dimensions, the bench's plain loss, and the step functions.

A shape is a tuple (name, n_layer, n_head, n_embd, block_size, batch_size, vocab[, arch]): arch
"gpt2" when left off (beside GPT2LMHeadModel), or "llama" (beside LlamaForCausalLM: grouped-query
attention with n_head / 2 key/value heads, the SwiGLU width by tiedlm's default rule,
ModelConfig.mlp_size, rotary embeddings, RMSNorm, no biases). Both sides of a shape have the same
parameters (hf_model asserts the counts are equal) and train on the same tokens with the same AdamW.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHUNK_LOGITS_BYTES = 256 * 2**20  # plain_loss: above this, a batch's fp32 logits are never held whole
BENCH = Path(__file__).with_name("bench.py")  # its --child runs one timing in a fresh process


def child_result(spec: dict, what: str):
    """`bench.py --child SPEC` in a fresh process: the JSON of its last stdout line. Its stderr
    (warnings, or why it failed) is passed on; where it failed or printed no result, None and a
    line on stderr that starts with `what`, so that a full bench goes on without it."""
    out = subprocess.run([sys.executable, str(BENCH), "--child", json.dumps(spec)], capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    try:
        if out.returncode != 0:
            raise ValueError(f"exit {out.returncode}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:  # a failed child, or one that printed no result
        print(f"{what} ({e}); the bench goes on without it", file=sys.stderr)
        return None


def bench_device(name: str):
    """The bench's --device as a torch device; a device this machine lacks is a ConfigError whose
    message names the bench's own option, which main() prints as one line."""
    from tiedlm.device import resolve_device

    return resolve_device(name, "--device", "--device auto")


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_turn(device, dtype: str, n: int):
    """(fn, flops): one turn of the n³ matmul that a timing's ceiling comes from, timed beside the
    models. fn runs one product on a CPU and 20 on a GPU, where one would time the launch."""
    import torch

    mdt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=mdt) for _ in range(2))
    reps = 20 if device.type == "cuda" else 1

    def products():
        for _ in range(reps):
            a @ b

    return products, 2 * n**3 * reps


def dims(shape) -> tuple[int, int, int, int, int, int]:
    """(n_layer, n_head, n_embd, block_size, batch_size, vocab) of a shape."""
    return tuple(shape[1:7])


def arch(shape) -> str:
    return shape[7] if len(shape) > 7 else "gpt2"


def step_flops(shape) -> float:
    """A training step's FLOPs at the shape (tiedlm.model.counting.flops_per_token, a batch of B·T tokens)."""
    from tiedlm.model.counting import flops_per_token

    _, _, _, T, B, V = dims(shape)
    return B * T * flops_per_token(model_config(shape), V)["train"]


def model_config(shape, tied: bool = True):
    """tiedlm's ModelConfig of a shape (a llama one as a config file's `model.arch: llama` gives it:
    no biases, n_kv_head = n_head / 2, the default intermediate size)."""
    from tiedlm.config import ModelConfig

    L, H, d, T, _, _ = dims(shape)
    if arch(shape) == "llama":
        return ModelConfig(n_layer=L, n_head=H, n_embd=d, block_size=T, tie_embeddings=tied, arch="llama",
                           bias=False, n_kv_head=max(1, H // 2))
    return ModelConfig(n_layer=L, n_head=H, n_embd=d, block_size=T, tie_embeddings=tied)


def tiedlm_model(shape, tied: bool, device):
    import torch

    from tiedlm.config import TrainConfig
    from tiedlm.model.blocks import GPT
    from tiedlm.train.step import build_optimizer

    torch.manual_seed(0)
    model = GPT(model_config(shape, tied), dims(shape)[5]).to(device)
    return model, build_optimizer(model, TrainConfig(max_steps=1))


def archhf_model(shape, tied: bool, device):
    """tiedlm's `model.arch: hf` of a shape: transformers' LlamaForCausalLM blocks (a llama shape,
    rms_norm_eps as tiedlm's) or GPT2LMHeadModel's (a GPT-2 shape, exact GELU as tiedlm's) under
    tiedlm's tie layer, loop and fused loss, with tiedlm's optimizer; None without transformers.
    Its parameter count is asserted equal to tiedlm's own block's."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    import dataclasses

    import torch

    from tiedlm.config import TrainConfig
    from tiedlm.model.blocks import build_model
    from tiedlm.train.step import build_optimizer

    ours = model_config(shape, tied)
    if arch(shape) == "llama":
        cfg = dataclasses.replace(ours, arch="hf", hf_config="llama", n_kv_head=ours.kv_heads,
                                  intermediate_size=ours.mlp_size, hf_overrides={"rms_norm_eps": ours.norm_eps})
    else:
        cfg = dataclasses.replace(ours, arch="hf", hf_config="gpt2", bias=False, hf_overrides={
            "activation_function": "gelu", "layer_norm_epsilon": ours.norm_eps, "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    torch.manual_seed(0)
    model = build_model(cfg, dims(shape)[5]).to(device)
    native = unique_params(tiedlm_model(shape, tied, torch.device("cpu"))[0])
    assert unique_params(model) == native, f"{shape[0]}: arch: hf {unique_params(model):,} params, tiedlm {native:,}"
    return model, build_optimizer(model, TrainConfig(max_steps=1))


def unique_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def hf_model(shape, tied: bool, device):
    """transformers' model of the same dimensions with SDPA attention, AdamW over the same groups
    (matrices decayed) with tiedlm's hyperparameters, or None when transformers is not installed.
    gpt2: GPT2LMHeadModel (exact GELU, biases); llama: LlamaForCausalLM. Its parameter count is
    asserted equal to tiedlm's model of the shape."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    import torch

    L, H, d, T, B, V = dims(shape)
    torch.manual_seed(0)
    if arch(shape) == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        ours = model_config(shape, tied)
        cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=ours.mlp_size, num_hidden_layers=L,
                          num_attention_heads=H, num_key_value_heads=ours.kv_heads, max_position_embeddings=T,
                          rms_norm_eps=ours.norm_eps, tie_word_embeddings=tied, attention_bias=False, mlp_bias=False,
                          rope_parameters={"rope_type": "default", "rope_theta": ours.rope_theta},
                          bos_token_id=None, eos_token_id=None, use_cache=False)
        cfg._attn_implementation = "sdpa"
        model = LlamaForCausalLM(cfg).to(device)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=d, n_layer=L, n_head=H, activation_function="gelu",
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
                         bos_token_id=None, eos_token_id=None)
        cfg._attn_implementation = "sdpa"
        model = GPT2LMHeadModel(cfg).to(device)
    model.train()
    tied_there = model.lm_head.weight is model.get_input_embeddings().weight
    assert tied_there == tied, f"transformers' model is {'' if tied_there else 'not '}tied"
    ours = unique_params(tiedlm_model(shape, tied, torch.device("cpu"))[0])
    assert unique_params(model) == ours, f"{shape[0]}: transformers {unique_params(model):,} params, tiedlm {ours:,}"
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    return model, opt


def plain_loss(model, x, y, amp=None, chunk_bytes: int = CHUNK_LOGITS_BYTES):
    """The loss tiedlm had before its fused cross-entropy, kept here to time against it: the logits
    and F.cross_entropy. When a batch's fp32 logits would exceed chunk_bytes (GPT-2's 50,257 tokens
    at block 1024: 206 MB per sequence, and as much again for their gradient), the head and the loss
    run over chunks of tokens under activation checkpointing: no more than one chunk's logits exist
    at a time, forward or backward, for one extra head matmul in the backward pass. The sum of the
    chunks' losses equals the whole batch's."""
    import contextlib

    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    amp = amp if amp is not None else contextlib.nullcontext()
    V, n = model.vocab_size, y.numel()
    if n * V * 4 <= chunk_bytes:
        with amp:
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))
    with amp:
        h, weight, bias = model.head(model.hidden(x))
        h = h.reshape(n, -1)
    rows = max(1, chunk_bytes // (4 * V))
    targets = y.reshape(-1)

    def chunk_loss(h_chunk, y_chunk):
        with amp:
            logits = F.linear(h_chunk, weight, bias)
        return F.cross_entropy(logits.float(), y_chunk, reduction="sum")

    total = sum(checkpoint(chunk_loss, h[i:i + rows], targets[i:i + rows], use_reentrant=False)
                for i in range(0, n, rows))
    return total / n


def logits_only(model):
    """The model as a module that gives only logits, which evaluate.score_tokens scores by
    F.cross_entropy (the plain path) instead of the fused loss."""
    import torch

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, idx):
            return self.inner(idx)

    return LogitsOnly(model)


def step_fn(kind: str, model, opt, x, amp, chunk_bytes: int | None = None):
    """kind: "tiedlm" (the fused loss), "plain" (tiedlm with the plain loss) or "transformers"."""
    import torch

    from tiedlm.model.blocks import lm_loss

    chunk_bytes = chunk_bytes or CHUNK_LOGITS_BYTES

    params = list(model.parameters())

    def step():
        if kind == "tiedlm":
            loss = lm_loss(model, x[:, :-1], x[:, 1:], amp)
        elif kind == "plain":
            loss = plain_loss(model, x[:, :-1], x[:, 1:], amp, chunk_bytes)
        else:
            with amp:
                logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                     x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step
