"""The language-model loss without a whole batch's logits: a fused linear cross-entropy.

`cross_entropy(h, weight, bias, target)` is F.cross_entropy(F.linear(h, weight, bias), target)
(the mean over the targets that are not ignore_index, as F.cross_entropy's default), computed over
chunks of rows so that the N x V logits exist one chunk at a time, and their gradient never as a
separate buffer. For each chunk the logits are computed once (into a reused buffer), their
log-softmax taken (into a second one) and the rows' losses gathered from it; then, in place, the
log-softmax becomes the softmax gradient (exp, minus one at each target) and is multiplied into
grad_h = G W and grad_W += G^T h (and grad_b += the sum of G's rows) while it is in cache. The
gradients are computed in the forward pass whenever they will be needed (a training step always
calls backward), so no head matmul is repeated; backward only scales them by grad_output / n.
With recompute=True the forward keeps nothing but its inputs and backward recomputes each chunk's
logits instead (nothing held between forward and backward, one more head matmul: slower).

Under autocast the matmuls run in the autocast dtype (bf16 on CUDA) and the reductions - the
log-softmax, the loss, the softmax gradient, the accumulation of grad_W and grad_b - in fp32;
without autocast everything runs in the inputs' dtype (fp32, or float64 for gradcheck).

`token_losses` is the forward alone, per token, for evaluation: the same kernels as
F.cross_entropy(reduction="none") on the same logits, so the same values to the bit on the CPU.
"""

from __future__ import annotations

# Rows per chunk (chunk_rows): as many as make CHUNK_BYTES of fp32 logits, and at least MIN_ROWS, so
# that the chunk's matmuls stay efficient at large vocabularies (on CUDA, CHUNK_BYTES_CUDA: there
# the chunks only bound the memory, and fewer kernel launches are better). Measured on the bench's
# CPU (2 cores, 2 MiB of L2 each; the head and loss, forward and backward, one thread; see also
# scripts/bench.py --chunks): at V = 4,096, 1 - 8 MiB within 5% of each other, 2.3x faster than the
# plain path, 16 MiB 1.6x; at V = 16,384 and 8,192 (d = 256), 4 - 8 MiB best (2.2x and 1.7x) and
# fewer than 64 rows slower than the plain path; at V = 50,257, 83 - 166 rows (16 - 32 MiB) best.
CHUNK_BYTES = 4 * 2**20
MIN_ROWS = 128
CHUNK_BYTES_CUDA = 64 * 2**20  # not yet measured on a GPU


def chunk_rows(vocab: int, chunk_bytes: int | None = None, device_type: str = "cpu") -> int:
    """Rows of a chunk: chunk_bytes of fp32 logits; by default CHUNK_BYTES (CHUNK_BYTES_CUDA on CUDA)
    and at least MIN_ROWS, read at each call."""
    if chunk_bytes is not None:
        return max(1, chunk_bytes // (4 * vocab))
    return max(MIN_ROWS, (CHUNK_BYTES_CUDA if device_type == "cuda" else CHUNK_BYTES) // (4 * vocab))


def _compute_dtype(h, weight):
    """The autocast dtype where autocast is on for h's device, else the inputs' common dtype."""
    import torch

    dev = h.device.type
    try:
        on = torch.is_autocast_enabled(dev)
        dtype = torch.get_autocast_dtype(dev) if on else None
    except TypeError:  # torch < 2.4: no device_type argument
        on = torch.is_autocast_cpu_enabled() if dev == "cpu" else torch.is_autocast_enabled()
        dtype = (torch.get_autocast_cpu_dtype() if dev == "cpu" else torch.get_autocast_gpu_dtype()) if on else None
    return dtype if on else torch.promote_types(h.dtype, weight.dtype)


def _passes(h, weight, bias, target, ignore_index: int, chunk_bytes: int | None, grads: bool):
    """The chunked pass. Returns (per-row nll, valid mask, grad_h, grad_W, grad_b), the gradients
    unscaled (sums of softmax - one-hot over the valid rows) and None unless grads.

    Per chunk: the logits (one matmul into a reused buffer), their log-softmax (into a second
    one), the rows' losses gathered from it - the same kernels as F.cross_entropy, so each row's
    loss is the plain path's to the bit - then, for the gradients, exp in place (the softmax),
    minus one at each valid target (one element a row, not a pass) and the two matmuls."""
    import torch

    N, d = h.shape
    V = weight.shape[0]
    cd = _compute_dtype(h, weight)
    rd = torch.promote_types(cd, torch.float32)  # reductions: fp32, or float64 for float64 inputs
    dev = h.device
    with torch.autocast(dev.type, enabled=False):
        hc, wc = h.to(cd), weight.to(cd)
        bc = bias.to(cd) if bias is not None else None
        valid = target != ignore_index
        tgt = torch.where(valid, target, torch.zeros_like(target)).unsqueeze(1)
        nll = torch.empty(N, dtype=rd, device=dev)
        rows = min(N, chunk_rows(V, chunk_bytes, dev.type))
        logits_buf = torch.empty(rows, V, dtype=cd, device=dev)
        ls_buf = torch.empty(rows, V, dtype=rd, device=dev)
        gh = torch.empty(N, d, dtype=cd, device=dev) if grads else None
        gw = gb = None
        if grads:
            vc = valid.to(cd).unsqueeze(1)
            hm = hc * vc  # rows of ignored targets contribute nothing to grad_W
            minus = -valid.to(rd).unsqueeze(1)
        for i in range(0, N, rows):
            j = min(i + rows, N)
            logits = logits_buf[:j - i]
            if bc is not None:
                torch.addmm(bc, hc[i:j], wc.t(), out=logits)
            else:
                torch.mm(hc[i:j], wc.t(), out=logits)
            ls = ls_buf[:j - i]
            torch.log_softmax(logits, 1, dtype=rd, out=ls)
            torch.neg(ls.gather(1, tgt[i:j]).squeeze(1), out=nll[i:j])
            if not grads:
                continue
            g = ls.exp_()  # the softmax
            g.scatter_add_(1, tgt[i:j], minus[i:j])  # minus the one-hot, valid rows only
            if bias is not None:
                part = valid[i:j].to(rd) @ g
                gb = part if gb is None else gb.add_(part)
            gc = g.to(cd)
            torch.mm(gc, wc, out=gh[i:j])
            if gw is None:
                gw = (gc.t() @ hm[i:j]).to(rd)
            elif rd == cd:
                gw.addmm_(gc.t(), hm[i:j])
            else:
                gw.add_(gc.t() @ hm[i:j])
        if grads:
            gh.mul_(vc)
    return nll, valid, gh, gw, gb


def _mean(nll, valid):
    import torch

    n = valid.sum()
    return torch.where(valid, nll, torch.zeros_like(nll)).sum() / n, n


def _fused_function():
    import torch

    class FusedCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, weight, bias, target, ignore_index, chunk_bytes, recompute):
            grads = not recompute and any(ctx.needs_input_grad[:3])
            nll, valid, gh, gw, gb = _passes(h, weight, bias, target, ignore_index, chunk_bytes, grads)
            loss, n = _mean(nll, valid)
            ctx.recompute, ctx.ignore_index, ctx.chunk_bytes = recompute, ignore_index, chunk_bytes
            ctx.dtypes = (h.dtype, weight.dtype, bias.dtype if bias is not None else None)
            if recompute:
                ctx.save_for_backward(h, weight, bias, target, n)
            else:
                ctx.save_for_backward(gh, gw, gb, n)
            return loss

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad_out):
            if ctx.recompute:
                h, weight, bias, target, n = ctx.saved_tensors
                _, _, gh, gw, gb = _passes(h, weight, bias, target, ctx.ignore_index, ctx.chunk_bytes, True)
            else:
                gh, gw, gb, n = ctx.saved_tensors
            scale = grad_out / n
            hd, wd, bd = ctx.dtypes
            out = [None if g is None else g.to(dt) * scale.to(dt) for g, dt in ((gh, hd), (gw, wd), (gb, bd))]
            need = ctx.needs_input_grad
            return (out[0] if need[0] else None, out[1] if need[1] else None, out[2] if need[2] else None,
                    None, None, None, None)

    return FusedCrossEntropy


_FUNCTION = None


def cross_entropy(h, weight, bias, target, ignore_index: int = -100, chunk_bytes: int | None = None,
                  recompute: bool = False):
    """Mean cross-entropy of h (N, d) through the head weight (V, d) and bias (V,) or None, against
    target (N,): F.cross_entropy(F.linear(h, weight, bias), target, ignore_index=ignore_index), fp32."""
    import torch

    global _FUNCTION
    needs = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias))
    if not needs:  # evaluation: the forward alone, no gradient computed or kept
        nll, valid, *_ = _passes(h, weight, bias, target, ignore_index, chunk_bytes, False)
        return _mean(nll, valid)[0]
    if _FUNCTION is None:
        _FUNCTION = _fused_function()
    return _FUNCTION.apply(h, weight, bias, target, ignore_index, chunk_bytes, recompute)


def token_losses(h, weight, bias, target, ignore_index: int = -100, chunk_bytes: int | None = None):
    """Per-token cross-entropy (N,) in fp32 (0 for ignored targets), without gradient."""
    import torch

    with torch.no_grad():
        nll, valid, *_ = _passes(h, weight, bias, target, ignore_index, chunk_bytes, False)
        return torch.where(valid, nll, torch.zeros_like(nll))
