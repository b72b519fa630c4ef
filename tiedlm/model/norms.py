"""GPT-2's LayerNorm with a backward pass whose result does not depend on the CPU thread count.

torch's CPU kernel for LayerNorm's backward sums the weight and bias gradients over the rows in one
buffer per thread and then adds the buffers: a different thread count adds in a different order,
and the last bits of both gradients change (then, through AdamW, every weight). `LayerNorm` here is
nn.LayerNorm (the same parameters, state-dict keys, forward kernel and input gradient) whose weight
and bias gradients are column sums over the rows, each column added by one thread whatever their
number. With MKL's strict reproducible mode for the matmuls (tiedlm.device.thread_env), that makes a
training step the same to the bit on any number of threads, so the count is free to follow the
machine's load (tiedlm.threads) without touching a result. tests/test_thread_invariance.py checks
both, op by op and over whole runs."""

from __future__ import annotations

import torch
import torch.nn as nn


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        shape = (x.shape[-1],)
        y, mean, rstd = torch.native_layer_norm(x, shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        shape = (x.shape[-1],)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        if need_x:  # each row's gradient is computed by one thread: the native kernel's is kept
            grad_x = torch.ops.aten.native_layer_norm_backward(grad, x, shape, mean, rstd, weight, bias,
                                                               [True, False, False])[0]
        rows = grad.reshape(-1, shape[0])
        if need_w:
            x_hat = (x - mean) * rstd
            grad_w = (rows * x_hat.reshape(-1, shape[0])).sum(0)
        if need_b:
            grad_b = rows.sum(0)
        return grad_x, grad_w, grad_b, None


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the last dimension, its parameters' gradients independent of the thread
    count (see the module's docstring). Falls back to nn.LayerNorm's own path where that question
    does not arise: a CUDA or MPS tensor (its kernels do not depend on the CPU threads), or no
    elementwise weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or self.weight is None or len(self.normalized_shape) != 1:
            return super().forward(x)
        if torch.is_autocast_enabled("cpu"):  # autocast runs LayerNorm in fp32
            x = x.float()
        return _LayerNorm.apply(x, self.weight, self.bias, self.eps)

