"""Autograd over the distance-bias op's Triton launchers (:mod:`._launch`): :class:`_SyntaxBiasAttention` (a
learnable table and bias strength) and :class:`_LutAttention` (a fixed per-distance bias)."""
import torch

from . import _launch  # noqa: F401 (registers the torch.library ops)
from ._host import LUT_BUCKETS, _spec, bias_lut, bucket_args, table_gradients


class _SyntaxBiasAttention(torch.autograd.Function):
    """Autograd over the two Triton ops; gradients for q, k, v, the table and a tensor ``bias_scale``."""

    @staticmethod
    def forward(ctx, q, k, v, distance, table, bias_scale, lengths, scale, window, causal, bucket_spec, symmetric):
        lut = bias_lut(table, bias_scale, _spec(*bucket_spec), window)
        out, lse = torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, lut, lengths, scale, window, causal)
        ctx.save_for_backward(q, k, v, out, lse, distance, table, bias_scale, lengths, lut)
        ctx.scale, ctx.window, ctx.causal, ctx.bucket_spec = scale, window, causal, bucket_spec
        ctx.symmetric = symmetric
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, table, bias_scale, lengths, lut = ctx.saved_tensors
        table_grad = bool(ctx.needs_input_grad[4] or ctx.needs_input_grad[5])
        dq, dk, dv, bucket_grad = torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, lut, lengths, ctx.scale, ctx.window, ctx.causal, *ctx.bucket_spec,
            table_grad, ctx.symmetric)
        dtable, dscale = table_gradients(bucket_grad, table, bias_scale, *ctx.needs_input_grad[4:6])
        return dq, dk, dv, None, dtable, dscale, None, None, None, None, None, None


class _LutAttention(torch.autograd.Function):
    """Attention with a fixed per-distance bias (no table gradient): gradients for q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, distance, lut2, lengths, scale, symmetric):
        out, lse = torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, lut2, lengths, scale, -1, False)
        ctx.save_for_backward(q, k, v, out, lse, distance, lut2, lengths)
        ctx.scale, ctx.symmetric = scale, symmetric
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, lut2, lengths = ctx.saved_tensors
        # The LUT is a table of one bucket per distance value (LUT_BUCKETS); it gets no gradient.
        dq, dk, dv, _ = torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, lut2, lengths, ctx.scale, -1, False, *bucket_args(LUT_BUCKETS),
            False, ctx.symmetric)
        return dq, dk, dv, None, None, None, None, None
