"""Topical mixing: the step of Syntax-BERT's topical attention that weighs a token's M sub-network outputs.

:func:`topical_mix` (an ``autograd.Function`` with a hand-written backward, :class:`_TopicalMix`) is what
:class:`syntaxkernels.nn.TopicalAttention` runs between its query and its value weights; the specification of the
whole attention is :func:`syntaxkernels.reference.topical_attention`. Plain PyTorch on any device; no Triton.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["topical_mix"]


class _TopicalMix(torch.autograd.Function):
    """The mixing step of :class:`syntaxkernels.nn.TopicalAttention` before its value weights, forward and
    backward by hand.

    Inputs ``outputs [B, M, H, N, D]``, ``nonempty bool [B, M, N]``, ``u [H, D]`` (= ``scale * Wk_h q_h``:
    ``q_h . (H_m Wk_h) * scale = H_m . u_h``). Output ``mixed [H, B, N, D]`` (heads first, so the value weights
    are one batched matmul) with ``mixed[h, b, n] = sum_m w[b, m, h, n] outputs[b, m, h, n]``,
    ``w = softmax_m(outputs . u_h)`` over the non-empty m (0 for a token whose masks are all empty).

    No ``[B, M, H, N, D]`` intermediate is allocated besides the gradient of ``outputs``: the mixing and the
    weight gradients walk the M sub-networks one at a time (each slice stays in cache), the scores are one
    matmul, the gradient of ``outputs`` two elementwise passes and that of ``u`` one batched matmul. Softmax
    and accumulation run in float32 (float64 for float64 inputs).
    """

    @staticmethod
    def forward(ctx, outputs: torch.Tensor, nonempty: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        B, M, H, N, D = outputs.shape
        acc = torch.float64 if outputs.dtype == torch.float64 else torch.float32
        flat = outputs.reshape(B * M * H * N, D)
        # Scores of every (b, m, h, n) row against every head's u, [B*M*H*N, H]: one matmul; the entries whose
        # two head indices agree are the scores (H times the needed products, far cheaper than B*M*H GEMVs).
        scores = (flat @ u.to(outputs.dtype).t()).view(B, M, H, N, H).diagonal(dim1=2, dim2=4)  # [B, M, N, H]
        scores = scores.permute(0, 1, 3, 2).to(acc, copy=True)  # [B, M, H, N]
        scores.masked_fill_(~nonempty[:, :, None, :], float("-inf"))
        top = scores.amax(dim=1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # all masks empty: weights stay 0
        weights = scores.sub_(top).exp_()
        total = weights.sum(dim=1, keepdim=True)
        weights.div_(total.masked_fill_(total == 0, 1.0))
        mixed = torch.zeros(H, B, N, D, dtype=acc, device=outputs.device)
        mixed_bhnd = mixed.permute(1, 0, 2, 3)
        for out_m, w_m in zip(outputs.unbind(1), weights[..., None].unbind(1)):
            mixed_bhnd.addcmul_(out_m, w_m)
        ctx.save_for_backward(outputs, weights, u)
        return mixed.to(outputs.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_mixed: torch.Tensor):
        outputs, weights, u = ctx.saved_tensors
        B, M, H, N, D = outputs.shape
        acc = weights.dtype
        grad = grad_mixed.to(outputs.dtype).permute(1, 0, 2, 3)  # [B, H, N, D]
        # d mixed / d w_m = outputs_m: one dot product per (b, m, h, n).
        grad_w = torch.empty(B, M, H, N, dtype=outputs.dtype, device=outputs.device)
        for out_m, grad_w_m in zip(outputs.unbind(1), grad_w.unbind(1)):
            torch.linalg.vecdot(out_m, grad, out=grad_w_m)
        grad_w = grad_w.to(acc)
        # Softmax backward (masked entries have w = 0, so their score gradient is 0).
        grad_s = weights * (grad_w - (weights * grad_w).sum(dim=1, keepdim=True))
        # d outputs_m = w_m * grad + grad_s_m * u_h.
        w_out, s_out = weights.to(outputs.dtype), grad_s.to(outputs.dtype)
        grad_outputs = torch.mul(w_out[..., None], grad[:, None], out=torch.empty_like(outputs))
        grad_outputs.addcmul_(s_out[..., None], u.to(outputs.dtype)[None, None, :, None, :])
        # d u_h = sum over (b, m, n) of grad_s * outputs: a [1, N] x [N, D] product per (b, m, h), then summed.
        grad_u = torch.matmul(s_out.view(B * M, H, 1, N), outputs.reshape(B * M, H, N, D)).sum(dim=0)
        return grad_outputs, None, grad_u.view(H, D).to(u.dtype)


def topical_mix(outputs: torch.Tensor, nonempty: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``mixed [H, B, N, D]`` (heads first), ``mixed[h, b, n] = sum_m w[b, m, h, n] * outputs[b, m, h, n]``.

    ``outputs [B, M, H, N, D]`` (the M sub-networks' outputs), ``nonempty bool [B, M, N]`` (whether token n has
    a key under mask m), ``u [H, D]`` (each head's query through its key weights, scaled: ``scale * Wk_h q_h``);
    ``w = softmax_m(outputs . u_h)`` over the non-empty m, 0 for a token whose masks are all empty. Differentiable
    in ``outputs`` and ``u`` (first derivatives only: differentiating the backward again raises a
    ``RuntimeError``). The inputs are not checked (the module checks them).
    """
    return _TopicalMix.apply(outputs, nonempty, u)
