#!/usr/bin/env python3
"""Where a training step of tiedlm's Llama-style model goes, and what alternatives to its parts cost,
at scripts/bench.py's "llama base" shape (L 2, H 4, n_kv_head 2, d 128, SwiGLU 384, T 64, batch 32,
V 4,096). Prototypes live here only: tiedlm/model/blocks.py is not changed by this script.

    python scripts/bench_llama.py --profile          # torch.profiler over tiedlm llama steps: the ops, by part
    python scripts/bench_llama.py --parts            # each part forward + backward, now and the prototypes
    python scripts/bench_llama.py --variants         # whole steps: tiedlm, tiedlm with prototypes, transformers
    python scripts/bench_llama.py --shape "llama wide vocab" --variants

Everything timed is interleaved (A B C A B C ...) and reported as the median over rounds, with the
per-round ratio to the first entry, so that a loaded machine's noise falls on all alike.

The prototypes (each gives the same values as the current code; --check compares them):
- rotary "q and k at once": the rotation of c_attn's q and k heads as one (B, T, H + n_kv, hs) slab
  before the transpose (one set of kernels for both, the tables broadcast over heads);
- rotary "Function": the same under a torch.autograd.Function whose backward is the rotation by
  minus the angle (out-of-place, in two addcmul-style kernels) instead of autograd's chain of
  chunk / mul / sub / cat backwards;
- RMSNorm "Function": x · rsqrt(mean(x²) + eps) · w with a hand-written backward, for CPUs where
  torch's RMSNorm is a composite (pow, mean, add, rsqrt, mul, mul: each with its own backward);
- SwiGLU "Function": silu(gate) · up from c_fc's output, with a hand-written backward that writes
  grad_gate and grad_up into one (.., 2m) buffer (no cat of the two halves' gradients).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from bench_models import dims, hf_model, model_config, step_fn, tiedlm_model  # noqa: E402

SHAPES = {"llama base": ("llama base", 2, 4, 128, 64, 32, 4096, "llama"),
          "llama wide vocab": ("llama wide vocab", 2, 4, 128, 64, 32, 16384, "llama")}


# ------------------------------------------------------------------------- the prototypes


def rotate_qk(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, heads, hs) rotated (rotate-half layout), the tables cos, sin (T, hs/2) broadcast over heads."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def _rot(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """[x1 c - x2 s, x2 c + x1 s] of x (.., hs) into a new tensor, c and s broadcast over (.., hs/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out[..., :h], out[..., h:]
    torch.mul(x1, c, out=o1)
    o1.sub_(x2 * s)
    torch.mul(x2, c, out=o2)
    o2.addcmul_(x1, s)
    return out


class Rotary(torch.autograd.Function):
    """The rotation by the angles (cos, sin), whose backward is the rotation by minus them."""

    @staticmethod
    def forward(ctx, x, c, s):
        ctx.save_for_backward(c, s)
        return _rot(x, c, s)

    @staticmethod
    def backward(ctx, g):
        c, s = ctx.saved_tensors
        return _rot(g, c, -s), None, None


class RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, w)
        return xhat * w

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w = ctx.saved_tensors
        gw = g * w
        gx = (gw - xhat * (gw * xhat).mean(-1, keepdim=True)) * rstd
        gweight = (g * xhat).reshape(-1, g.shape[-1]).sum(0)
        return gx, gweight, None


class SwiGLUFn(torch.autograd.Function):
    """silu(gate) · up of h = [gate; up] (.., 2m); backward writes both halves' gradients into one buffer."""

    @staticmethod
    def forward(ctx, h):
        gate, up = h.chunk(2, dim=-1)
        ctx.save_for_backward(h)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        gate, up = h.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        out = torch.empty_like(h)
        m = gate.shape[-1]
        torch.mul(g, silu, out=out[..., m:])  # grad up
        # grad gate: g · up · sig · (1 + gate · (1 - sig)) = g · up · (sig + silu · (1 - sig))
        dg = out[..., :m]
        torch.mul(silu, 1 - sig, out=dg)
        dg.add_(sig).mul_(up).mul_(g)
        return out


def attn_forward(self, x, cos, sin, rotary: str = "now"):
    """GroupedQueryAttention.forward with the rotary variant `rotary` ("qk": q and k at once,
    "fn": the same under Rotary)."""
    B, T, C = x.shape
    hs, H, kv = self.head_size, self.n_head, self.n_kv_head
    qk, v = self.c_attn(x).view(B, T, H + 2 * kv, hs).split([H + kv, kv], dim=2)
    cos, sin = cos.to(qk.dtype), sin.to(qk.dtype)
    qk = Rotary.apply(qk, cos[:, None, :], sin[:, None, :]) if rotary == "fn" else rotate_qk(qk, cos, sin)
    q, k, v = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
                                       enable_gqa=kv != H)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


def patch(model, rotary: str | None = None, norm: bool = False, swiglu: bool = False):
    """tiedlm's llama model with some parts replaced by the prototypes (instance methods only)."""
    from tiedlm.model.blocks import LlamaBlock

    norms = [model.transformer.ln_f]
    for block in model.transformer.h:
        assert isinstance(block, LlamaBlock)
        if rotary:
            block.attn.forward = types.MethodType(lambda self, x, c, s, r=rotary: attn_forward(self, x, c, s, r),
                                                  block.attn)
        if swiglu:
            block.mlp.forward = types.MethodType(
                lambda self, x: self.dropout(self.c_proj(SwiGLUFn.apply(self.c_fc(x)))), block.mlp)
        norms += [block.ln_1, block.ln_2]
    if norm:
        for n in norms:
            n.forward = types.MethodType(lambda self, x: RMSNormFn.apply(x, self.weight, self.eps), n)
    return model


VARIANTS = {  # name: patch() arguments
    "tiedlm": {},
    "+ rotary q,k at once": {"rotary": "qk"},
    "+ rotary Function": {"rotary": "fn"},
    "+ RMSNorm Function": {"norm": True},
    "+ SwiGLU Function": {"swiglu": True},
    "+ all three (rotary Function)": {"rotary": "fn", "norm": True, "swiglu": True},
}


# ------------------------------------------------------------------------- timing


def interleaved(fns: dict, rounds: int, steps: int, warmup: int) -> dict:
    for f in fns.values():
        for _ in range(warmup):
            f()
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(steps):
                f()
            times[k].append((time.perf_counter() - t) / steps)
    return times


def report(times: dict, unit: str = "ms", per: str = "step") -> None:
    first = next(iter(times.values()))
    print(f"| variant | {unit} per {per} (median) | min – max | against the first (median of rounds) |")
    print("| --- | ---: | ---: | ---: |")
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(first, v))
        print(f"| {k} | {1e3 * statistics.median(v):.2f} | {1e3 * min(v):.2f} – {1e3 * max(v):.2f} | {ratio:.2f}× |")


def check(shape) -> None:
    """Each variant's loss and gradients against tiedlm's as it is (same weights, same batch)."""
    L, H, d, T, B, V = dims(shape)
    x = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(1))
    ref = None
    for name, kw in VARIANTS.items():
        model = patch(tiedlm_model(shape, True, torch.device("cpu"))[0], **kw)
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        if ref is None:
            ref = (loss.item(), grads)
            continue
        worst = max(((g - ref[1][n]).abs().max() / ref[1][n].abs().max().clamp_min(1e-30)).item()
                    for n, g in grads.items())
        print(f"{name}: loss {loss.item():.7f} (tiedlm {ref[0]:.7f}), largest gradient difference {worst:.1e} "
              "of its tensor's largest")
        assert abs(loss.item() - ref[0]) < 1e-5 and worst < 1e-4, name


def variants(shape, args) -> None:
    import contextlib

    L, H, d, T, B, V = dims(shape)
    x = torch.randint(0, V, (B, T + 1))
    fns = {}
    for name, kw in VARIANTS.items():
        model, opt = tiedlm_model(shape, True, torch.device("cpu"))
        fns[name] = step_fn("tiedlm", patch(model, **kw), opt, x, contextlib.nullcontext())
    built = hf_model(shape, True, torch.device("cpu"))
    if built:
        fns["transformers (LlamaForCausalLM, SDPA)"] = step_fn("transformers", *built, x, contextlib.nullcontext())
    print(f"\n{shape[0]}: whole training steps, tied, fp32, {torch.get_num_threads()} threads, "
          f"{B * T:,} tokens a step ({args.rounds} rounds of {args.steps})")
    report(interleaved(fns, args.rounds, args.steps, args.warmup))


def parts(shape, args) -> None:
    """Forward + backward of each part alone at the shape's sizes (one layer's worth)."""
    L, H, d, T, B, V = dims(shape)
    cfg = model_config(shape)
    kv, hs, m = cfg.kv_heads, d // H, cfg.mlp_size
    from tiedlm.model.blocks import rotary_tables, rotate

    cos, sin = rotary_tables(hs, T, cfg.rope_theta)
    qkv = torch.randn(B, T, (H + 2 * kv) * hs, requires_grad=True)
    g_qk = torch.randn(B, H + kv, T, hs)

    def rot_now():
        q, k, _ = qkv.split([H * hs, kv * hs, kv * hs], dim=2)
        q = rotate(q.view(B, T, H, hs).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, kv, hs).transpose(1, 2), cos, sin)
        torch.autograd.backward([q, k], [g_qk[:, :H], g_qk[:, H:]])

    def rot_qk(fn=False):
        qk, _ = qkv.view(B, T, H + 2 * kv, hs).split([H + kv, kv], dim=2)
        qk = Rotary.apply(qk, cos[:, None], sin[:, None]) if fn else rotate_qk(qk, cos, sin)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
        torch.autograd.backward([q, k], [g_qk[:, :H], g_qk[:, H:]])

    x = torch.randn(B, T, d, requires_grad=True)
    norm = torch.nn.RMSNorm(d, eps=1e-5)
    g_d = torch.randn(B, T, d)
    h = torch.randn(B, T, 2 * m, requires_grad=True)
    g_m = torch.randn(B, T, m)
    q = torch.randn(B, H, T, hs, requires_grad=True)
    k = torch.randn(B, kv, T, hs, requires_grad=True)
    v = torch.randn(B, kv, T, hs, requires_grad=True)
    g_q = torch.randn(B, H, T, hs)

    def swiglu_now():
        gate, up = h.chunk(2, dim=-1)
        (F.silu(gate) * up).backward(g_m)

    def sdpa(gqa=True):
        kk, vv = (k, v) if gqa else (k.repeat_interleave(H // kv, 1), v.repeat_interleave(H // kv, 1))
        F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa).backward(g_q)

    groups = {
        "rotary (q and k of one layer)": {"now: rotate(q), rotate(k)": rot_now, "q,k at once": rot_qk,
                                          "q,k at once, Function": lambda: rot_qk(True)},
        "RMSNorm (one of 2L + 1)": {"now: nn.RMSNorm": lambda: norm(x).backward(g_d),
                                    "Function": lambda: RMSNormFn.apply(x, norm.weight, 1e-5).backward(g_d)},
        "SwiGLU activation (one layer)": {"now: silu(gate) * up": swiglu_now,
                                          "Function": lambda: SwiGLUFn.apply(h).backward(g_m)},
        "attention (one layer)": {"now: sdpa, enable_gqa": sdpa, "repeat k, v; sdpa": lambda: sdpa(False)},
    }
    print(f"\n{shape[0]}: parts alone, forward + backward, fp32, {torch.get_num_threads()} threads "
          f"(B {B}, T {T}, H {H}, n_kv {kv}, hs {hs}, SwiGLU {m})")
    for title, fns in groups.items():
        print(f"\n{title}")
        report(interleaved(fns, args.rounds, args.steps * 4, args.warmup), per="call")


def profile(shape, args) -> None:
    """torch.profiler over tiedlm llama steps (tied): self CPU time by op, and by part, the ops told
    apart by the shapes they run on (rotary on the (B, heads, T, hs/2) halves, SwiGLU on (B, T, m),
    norms and residual adds on (B, T, d))."""
    import contextlib

    from torch.profiler import ProfilerActivity, profile as prof

    L, H, d, T, B, V = dims(shape)
    cfg = model_config(shape)
    model, opt = tiedlm_model(shape, True, torch.device("cpu"))
    x = torch.randint(0, V, (B, T + 1))
    step = step_fn("tiedlm", model, opt, x, contextlib.nullcontext())
    for _ in range(args.warmup):
        step()
    with prof(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(args.steps):
            step()
    events = [e for e in p.key_averages(group_by_input_shape=True)]
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\n{shape[0]}: {args.steps} profiled steps, {total / 1e3 / args.steps:.1f} ms of self CPU time a step")
    by_op: dict = {}
    for e in events:
        by_op[e.key] = by_op.get(e.key, 0) + e.self_cpu_time_total
    print("| op | % of the step |\n| --- | ---: |")
    for k, v in sorted(by_op.items(), key=lambda kv_: -kv_[1])[:25]:
        print(f"| {k} | {100 * v / total:.1f}% |")
    kv, hs, m = cfg.kv_heads, d // H, cfg.mlp_size
    half = {(B, H, T, hs // 2), (B, kv, T, hs // 2), (B, T, H + kv, hs // 2)}
    parts: dict = {}
    for e in events:
        shapes = [tuple(s) for s in (e.input_shapes or []) if s]
        k = e.key
        if any(w in k for w in ("mm", "addmm", "linear", "matmul", "bmm")):
            part = "matmuls (c_attn, c_proj, c_fc, head)"
        elif "scaled_dot_product" in k or "ScaledDotProduct" in k:
            part = "attention (sdpa)"
        elif "adam" in k.lower() or "foreach" in k or k in ("aten::lerp_", "aten::addcdiv_", "aten::addcmul_",
                                                             "aten::sqrt", "aten::_fused_adamw_"):
            part = "AdamW and clipping (foreach ops)"
        elif any(s in half for s in shapes) or any(len(s) == 4 and s[-1] == hs for s in shapes) and "cat" in k:
            part = "rotary (chunk, mul, sub/add, cat and their backwards)"
        elif any(s[-1:] == (m,) or s[-1:] == (2 * m,) for s in shapes) and "mm" not in k:
            part = "SwiGLU activation (chunk, silu, mul and backwards)"
        elif (any(w in k for w in ("rsqrt", "pow", "mean", "rms_norm", "RmsNorm", "PowBackward", "MeanBackward",
                                   "RsqrtBackward")) or (B, T, 1) in shapes
              or ((B, T, d) in shapes and (d,) in shapes)):
            part = "RMSNorm (pow, mean, rsqrt, mul and backwards)"
        elif any(w in k for w in ("log_softmax", "exp", "cross", "gather", "scatter")):
            part = "fused loss's softmax work"
        elif k in ("aten::add", "aten::add_") and shapes.count((B, T, d)) == 2:
            part = "residual adds, gradient sums (B, T, d)"
        elif any(s[-1:] == (d,) for s in shapes):
            part = "other (B, T, d) elementwise: copies, embedding"
        else:
            part = "other (views, autograd bookkeeping, embedding, ...)"
        parts[part] = parts.get(part, 0) + e.self_cpu_time_total
    print("\n| part (ops attributed by name and input shape) | % of the step | ms a step |\n| --- | ---: | ---: |")
    for k, v in sorted(parts.items(), key=lambda kv_: -kv_[1]):
        print(f"| {k} | {100 * v / total:.1f}% | {v / 1e3 / args.steps:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama base", choices=list(SHAPES))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--check", action="store_true", help="the prototypes' losses and gradients against tiedlm's")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; matmul (2048³ fp32) "
          f"{bench_models_matmul() / 1e9:,.0f} GFLOP/s")
    if args.check:
        check(shape)
    if args.profile:
        profile(shape, args)
    if args.parts:
        parts(shape, args)
    if args.variants:
        variants(shape, args)


def bench_models_matmul() -> float:
    import bench

    return bench.matmul_rate(torch.device("cpu"), torch.float32)


if __name__ == "__main__":
    main()
