#!/usr/bin/env python3
"""Training throughput of tiedlm's model on this machine, tied and untied, against the machine's
own fp32 matmul ceiling; and the data preparation's cold and warm (cache-hit) times.

    python scripts/bench.py                 # the README's table
    python scripts/bench.py --steps 20 --device cuda --dtype bf16

Throughput is measured on the real training step (forward, backward, clipping, AdamW) with random
tokens, after warm-up steps; achieved FLOP/s uses tiedlm.model.flops_per_token (the head counted
whether tied or not), so tied and untied models of one shape do the same work.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

SHAPES = [  # (name, n_layer, n_head, n_embd, block_size, batch_size, vocab)
    ("base.yaml", 2, 4, 128, 64, 32, 4096),
    ("wide vocab", 2, 4, 128, 64, 32, 16384),
    ("deeper", 6, 6, 384, 128, 8, 4096),
]


def matmul_ceiling(device, dtype, n=2048, reps=5) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(3):  # the best of three: the ceiling, not an average
        sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t))
    return best


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def train_throughput(shape, tied: bool, device, dtype: str, steps: int) -> tuple[float, float]:
    import torch
    from torch.nn import functional as F

    from tiedlm.config import ModelConfig, TrainConfig
    from tiedlm.model import GPT, flops_per_token
    from tiedlm.device import autocast_ctx
    from tiedlm.train import build_optimizer

    _, L, H, d, T, B, V = shape
    cfg = ModelConfig(n_layer=L, n_head=H, n_embd=d, block_size=T, tie_embeddings=tied)
    torch.manual_seed(0)
    model = GPT(cfg, V).to(device)
    opt = build_optimizer(model, TrainConfig(max_steps=1))
    amp = autocast_ctx(device, dtype)
    x = torch.randint(0, V, (B, T + 1), device=device)

    def step():
        with amp:
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    tok_s = B * T * steps / (time.perf_counter() - t)
    return tok_s, tok_s * flops_per_token(cfg, V)["train"]


def data_times() -> list[tuple[str, float, float]]:
    """Cold (empty cache) and warm (cache hit) prepare_data times, in seconds."""
    from tiedlm.config import load_config
    from tiedlm.data import prepare_data

    root = Path(__file__).resolve().parents[1]
    cases = [("builtin:synthetic (base.yaml, 2.4M words, word)", str(root / "configs/base.yaml"), [])]
    shk = root.parent / "shared/data/tinyshakespeare/input.txt"
    if shk.exists():
        cases.append(("Tiny Shakespeare (1.1 MB, bpe 4096)", str(root / "configs/shakespeare-bpe.yaml"),
                      [f"data.data_files={shk}"]))
    out = []
    for label, path, over in cases:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["TIEDLM_CACHE"] = cache
            cfg = load_config(path, over)
            t = time.perf_counter()
            prepare_data(cfg, progress=False)
            cold = time.perf_counter() - t
            t = time.perf_counter()
            prepare_data(cfg, progress=False)
            out.append((label, cold, time.perf_counter() - t))
    return out


def main() -> None:
    import torch

    from tiedlm.device import resolve_device, resolve_dtype

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-data", action="store_true", help="skip the data preparation timings")
    args = ap.parse_args()
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    ceiling = matmul_ceiling(device, torch.bfloat16 if dtype == "bf16" else torch.float32)
    print(f"device {device}, dtype {dtype}, torch threads {torch.get_num_threads()}, "
          f"2048^3 matmul ceiling {ceiling / 1e9:.0f} GFLOP/s\n")
    print("| model (L, d, T, batch, V) | tying | tokens/s | GFLOP/s | % of the 2048³ matmul rate |")
    print("| --- | --- | ---: | ---: | ---: |")
    for shape in SHAPES:
        name, L, H, d, T, B, V = shape
        for tied in (True, False):
            tok_s, flops = train_throughput(shape, tied, device, dtype, args.steps)
            print(f"| {name} ({L}, {d}, {T}, {B}, {V}) | {'tied' if tied else 'untied'} | {tok_s:,.0f} | "
                  f"{flops / 1e9:.1f} | {100 * flops / ceiling:.0f}% |")
    if not args.no_data:
        print("\n| data | cold prepare (s) | warm, cache hit (s) |")
        print("| --- | ---: | ---: |")
        for label, cold, warm in data_times():
            print(f"| {label} | {cold:.2f} | {warm:.3f} |")


if __name__ == "__main__":
    main()
