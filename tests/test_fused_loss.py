"""The fused cross-entropy (tiedlm/model/loss.py) computes what F.cross_entropy(h @ W.T + b, y) does:
the loss and the gradients of h, W and b to fp32 rounding, at vocabularies the chunk does and
does not divide, with ignored targets, in the gradient-in-forward and the recompute modes;
gradcheck in float64; never a whole batch's logits; under autocast the matmuls in its dtype and
the reductions in fp32; and in a model, tied and untied, one training step's gradients and the
evaluation's per-token losses are the plain path's."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tiedlm.config import ModelConfig
from tiedlm.model.loss import chunk_rows, cross_entropy, token_losses
from tiedlm.model.blocks import GPT, lm_loss

# fp32 tolerances: the loss to 1e-6 relative; each gradient to 1e-5 relative per element plus
# 1e-6 of the tensor's largest element (a sum over the chunks is rounded in another order)
LOSS_RTOL, GRAD_RTOL, GRAD_ATOL = 1e-6, 1e-5, 1e-6


def head_case(N, d, V, bias, seed=0, ignored=()):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g).requires_grad_()  # a LayerNorm's output: unit scale
    W = (0.5 * torch.randn(V, d, generator=g)).requires_grad_()
    b = (0.5 * torch.randn(V, generator=g)).requires_grad_() if bias else None
    y = torch.randint(0, V, (N,), generator=g)
    y[list(ignored)] = -100
    return h, W, b, y


def close(a, b):
    torch.testing.assert_close(a, b, rtol=GRAD_RTOL, atol=GRAD_ATOL * b.abs().max().item())


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("V", [5, 500, 4096, 1001])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_loss_and_gradients_are_f_cross_entropys(V, bias, recompute):
    h, W, b, y = head_case(70, 24, V, bias, ignored=(3, 40))
    chunk = 9 * 4 * V  # 9 rows a chunk: 8 chunks, the last of 7 rows
    assert chunk_rows(V, chunk) == 9
    fused = cross_entropy(h, W, b, y, chunk_bytes=chunk, recompute=recompute)
    plain = F.cross_entropy(F.linear(h, W, b), y)
    assert fused.dtype == torch.float32 and fused.item() == pytest.approx(plain.item(), rel=LOSS_RTOL)
    for ours, ref in zip(grads_of(fused, (h, W, b)), grads_of(plain, (h, W, b))):
        close(ours, ref)


def test_grad_output_scales_the_gradients_and_only_what_is_asked_is_computed():
    h, W, b, y = head_case(33, 8, 50, True)
    W.requires_grad_(False)
    fused = cross_entropy(h, W, b, y, chunk_bytes=4 * 4 * 50)
    plain = F.cross_entropy(F.linear(h, W, b), y)
    gh, gb = torch.autograd.grad(3.5 * fused, (h, b))
    rh, rb = torch.autograd.grad(3.5 * plain, (h, b))
    close(gh, rh)
    close(gb, rb)


def test_every_target_ignored_gives_nan_as_f_cross_entropy_does():
    h, W, b, y = head_case(6, 4, 9, False, ignored=range(6))
    assert torch.isnan(cross_entropy(h, W, b, y)) and torch.isnan(F.cross_entropy(F.linear(h, W, b), y))


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 3, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.tensor([0, 4, -100, 2, 2, 1, 3])
    for recompute in (False, True):  # 2 rows a chunk: 4 chunks, the last of one row
        fn = lambda h, W, b: cross_entropy(h, W, b, y, chunk_bytes=2 * 4 * 5, recompute=recompute)  # noqa: E731
        assert fn(h, W, b).dtype == torch.float64
        assert torch.autograd.gradcheck(fn, (h, W, b), eps=1e-6, atol=1e-8)


def test_token_losses_are_f_cross_entropys_to_the_bit():
    h, W, b, y = head_case(70, 24, 1001, True, ignored=(5,))
    with torch.no_grad():
        plain = F.cross_entropy(F.linear(h, W, b), y, reduction="none")
        fused = token_losses(h, W, b, y, chunk_bytes=9 * 4 * 1001)
        mean = cross_entropy(h, W, b, y, chunk_bytes=9 * 4 * 1001)
    assert torch.equal(fused, plain)
    assert mean.grad_fn is None and mean.item() == pytest.approx(plain.sum().item() / 69, rel=LOSS_RTOL)


class Biggest(TorchDispatchMode):
    """The largest tensor any operation returns, and the dtypes each operation's matrices came out in."""

    def __init__(self):
        super().__init__()
        self.largest, self.dtypes = 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        name = func.__name__.split(".")[0]
        if isinstance(out, torch.Tensor) and min(out.shape, default=2) > 1:  # matrices (not grad_b's sum over rows)
            self.dtypes.setdefault(name, set()).add(out.dtype)
        return out


def test_no_more_than_one_chunk_of_logits_exists():
    h, W, b, y = head_case(64, 8, 700, False)
    with Biggest() as seen:
        cross_entropy(h, W, b, y, chunk_bytes=16 * 4 * 700).backward()
    assert seen.largest == 16 * 700  # one chunk's logits (of 64 x 700); W and its gradient are 8 x 700
    with Biggest() as seen:
        F.cross_entropy(F.linear(h, W, b), y).backward()
    assert seen.largest == 64 * 700


@pytest.mark.parametrize("recompute", [False, True])
def test_under_autocast_the_matmuls_run_in_bf16_and_the_reductions_in_fp32(recompute):
    h, W, b, y = head_case(40, 16, 300, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with Biggest() as seen:
            fused = cross_entropy(h, W, b, y, chunk_bytes=16 * 4 * 300, recompute=recompute)
            ours = grads_of(fused, (h, W, b))  # computed in the forward, or recomputed in backward
        plain = F.cross_entropy(F.linear(h, W, b).float(), y)
    assert seen.dtypes["addmm"] == seen.dtypes["mm"] == {torch.bfloat16}  # the logits, grad_h and grad_W
    assert set().union(*(v for k, v in seen.dtypes.items() if k.endswith("log_softmax"))) == {torch.float32}
    assert fused.dtype == torch.float32 and fused.item() == pytest.approx(plain.item(), rel=1e-6)
    for g, ref, t in zip(ours, grads_of(plain, (h, W, b)), (h, W, b)):
        assert g.dtype == t.dtype == torch.float32
        torch.testing.assert_close(g, ref, rtol=2e-2, atol=1e-2 * ref.abs().max().item())


def model_and_batch(tied: bool, bias: bool = False, V: int = 333):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, tie_embeddings=tied,
                            lm_head_bias=bias), V)
    x = torch.randint(0, V, (4, 17), generator=torch.Generator().manual_seed(1))
    return model, x[:, :-1], x[:, 1:]


def plain_loss(model, x, y):
    """The plain path the fused loss replaced: the whole logits, then F.cross_entropy."""
    logits = model(x)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))


class LogitsOnly(torch.nn.Module):
    """A module that gives only logits: evaluate.score_tokens scores it by F.cross_entropy."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, idx):
        return self.inner(idx)


def step_grads(model, loss) -> dict:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied, bias", [(True, False), (False, False), (False, True)])
def test_a_training_steps_gradients_are_the_plain_paths(tied, bias):
    model, x, y = model_and_batch(tied, bias)
    fused = lm_loss(model, x, y)  # the training loss
    g_fused = step_grads(model, fused)
    plain = plain_loss(model, x, y)
    g_plain = step_grads(model, plain)
    assert fused.item() == pytest.approx(plain.item(), rel=LOSS_RTOL)
    assert g_fused.keys() == g_plain.keys() and ("lm_head.bias" in g_fused) == bias
    for name in g_plain:
        rel = ((g_fused[name] - g_plain[name]).norm() / g_plain[name].norm()).item()
        assert rel < 1e-6, (name, rel)


def test_the_models_forward_with_targets_is_the_loss():
    model, x, y = model_and_batch(False, True)
    with torch.no_grad():
        logits = model(x)
        per_token = model(x, y, reduction="none")
        mean = model(x, y)
    assert torch.equal(per_token, F.cross_entropy(logits.reshape(-1, 333), y.reshape(-1), reduction="none").view(4, 16))
    assert mean.item() == pytest.approx(per_token.mean().item(), rel=LOSS_RTOL)
    with pytest.raises(ValueError, match="reduction"):
        model(x, y, reduction="sum")


def test_evaluation_scores_are_the_plain_paths_to_the_bit():
    from tiedlm.evaluate import score_tokens

    model, _, _ = model_and_batch(True)
    tokens = np.random.default_rng(0).integers(0, 333, size=16 * 7 + 5)
    targets, fused = score_tokens(model, tokens, 16, 16, 3, torch.device("cpu"))
    targets_plain, plain = score_tokens(LogitsOnly(model), tokens, 16, 16, 3, torch.device("cpu"))
    assert np.array_equal(targets, targets_plain) and np.array_equal(fused, plain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_autocast_on_cuda_agrees_with_the_plain_path():  # pragma: no cover - no GPU on the CI machine
    h, W, b, y = (t.cuda() if t is not None else None for t in head_case(4096, 128, 8192, True, ignored=(7,)))
    h, W, b = (t.detach().requires_grad_() for t in (h, W, b))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fused = cross_entropy(h, W, b, y)
        plain = F.cross_entropy(F.linear(h, W, b).float(), y)
    assert fused.dtype == torch.float32 and fused.item() == pytest.approx(plain.item(), rel=1e-5)
    for g, ref in zip(grads_of(fused, (h, W, b)), grads_of(plain, (h, W, b))):
        torch.testing.assert_close(g, ref, rtol=2e-2, atol=1e-2 * ref.abs().max().item())
