"""The distance-bias op on the CPU: the fused C++ kernels (``csrc/bias_attention.cpp``), forward and backward.

``softmax(q k^T * scale + c * table[bucket(d)]) v`` over the allowed pairs, as
:func:`syntaxkernels.reference.syntax_bias_attention`, without an ``[N, N]`` tensor per head: tiles of 128 queries x
up to 512 keys (backward 64 x 256) with an online softmax, the bias gathered per score from the Triton kernels'
per-head 256-entry LUT (:func:`._host.bias_lut`: log2 domain, ``-inf`` past the window); matrix products through the
BLAS torch links, the rest vectorised (AVX2+FMA chosen at run time); key tiles with no pair inside the window
skipped (and, with a positional window ``|i - j| <= w``, the keys outside every row's window of a query block; the
pairs outside a row's own window masked as causality masks them). The backward gives dq, dk, dv and the per-bucket
sums of dS, from which the table and bias-scale gradients follow (``d table = c * G``, ``d c = sum(table * G)``). Deterministic: the same bits run to run and for any thread
count (every output has one writer, every sum a fixed order). Attention dropout (``dropout_p > 0``) drops the
probabilities with :func:`syntaxkernels.reference.dropout_keep`'s mask (batch item b = the mask's item b),
generated in the kernels and regenerated in the backward; ``dropout_p == 0`` runs kernels compiled without it.
T5's relative-position term (``position_buckets``, ``position_table``) runs in the kernels: each log2-domain score
gains the per-head per-offset LUT's ``[h, clamp(j - i, -reach, reach) + reach]`` (:func:`._host.position_lut`), the
backward writes the per-offset sums of dS (per (b, h), folded in b order) and :func:`._host.position_gradient` makes
the table's gradient; without it the kernels run as before.

Grouped-query attention: k and v may have ``H_kv`` heads (``H % H_kv == 0``; query head h reads key/value head
``h // (H / H_kv)``), read in place (no copy per query head); dk and dv come back ``[B, H_kv, N, *]``, each the
sum over its group's query heads in head order (one task owns a key/value head and walks its group), and the
dropout mask stays numbered by the query head (stream ``b * H + h``).

Limits: CPU tensors; float32, bfloat16 and float16 (computed in float32; bf16/fp16 inputs are converted once per
call); float64 runs the reference; any head dim >= 1, any N. Parallel over batch, heads and query blocks in the
forward, over batch and key/value heads in the backward (a task owns one key/value head's dK and dV), on ATen's
thread pool. Needs no
Triton (the LUT builder and the rest this path shares with the others live in :mod:`._host`).

Layers: ``torch.library`` ops ``syntaxkernels::bias_attention_cpu_fwd`` / ``_cpu_bwd`` (with fake implementations),
the autograd Function :class:`_SyntaxBiasAttentionCPU`, and :func:`cpu_bias_attention`, which
:func:`syntaxkernels.syntax_bias_attention` calls for CPU tensors under ``backend="auto"`` (where
:func:`._host.implementation` says "cpp": :func:`._host.cpu_kernels_take`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ... import _ext
from ...plan import as_plan
from ...specs import BucketSpec, RelativePositionSpec
from .._dispatch import dropout_arguments
from ._host import (_bucket_lut, _spec, bias_lut, bucket_args, kernel_arguments, position_gradient,
                    position_lut, table_gradients)

__all__ = ["cpu_bias_attention", "bias_attention_cpu_forward", "bias_attention_cpu_backward"]


@torch.library.custom_op("syntaxkernels::bias_attention_cpu_fwd", mutates_args=(), device_types="cpu")
def bias_attention_cpu_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance: torch.Tensor,
                               lut: torch.Tensor, lengths: torch.Tensor, scale: float, window: int,
                               causal: bool, dropout_seed: int = 0, dropout_threshold: int = 0,
                               keep_scale: float = 1.0, position_window: int = -1,
                               position_lut: Optional[torch.Tensor] = None,
                               reach: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """C++ forward: ``(out [B, H, N, Dv] in q's dtype, lse2 float32 [B, H, N])`` (log2, +inf for empty rows).

    Args: q ``[B, H, N, D]``, k ``[B, H_kv, N, D]``, v ``[B, H_kv, N, Dv]`` (``H % H_kv == 0``, grouped-query
    attention; last dim contiguous, other strides free); distance uint8
    ``[B, N, N]``; lut float32 ``[1 or H, 256]`` (:func:`bias_lut`); lengths int32 ``[B]``; window -1 for none
    (the LUT holds it; here it enables tile skipping); causal: only ``j <= i``; position_window: only ``|i - j| <=
    position_window`` (-1 for none; the keys outside every row's window of a query block are skipped). Attention
    dropout
    (:func:`.._dispatch.dropout_arguments`; the defaults are none): ``dropout_seed`` the uint64 seed's bit pattern as an
    int64, ``dropout_threshold`` the uint32 threshold, ``keep_scale`` ``1 / (1 - p)``; the mask is
    :func:`syntaxkernels.reference.dropout_keep`'s (item = batch index), lse the undropped softmax's. T5's
    relative-position term: ``position_lut`` float32 ``[H, 2 * reach + 1]`` (:func:`._host.position_lut`, log2
    domain) added at ``clamp(j - i, -reach, reach) + reach``; None (or ``reach < 0``) for none.
    """
    B, H, N, _ = q.shape
    out = torch.empty((B, H, N, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((B, H, N), dtype=torch.float32)
    _ext.load().bias_attention_forward(q, k, v, distance, lut, lengths, float(scale), int(window), bool(causal),
                                       int(position_window), int(dropout_seed), int(dropout_threshold),
                                       float(keep_scale), out, lse, _or_empty(position_lut), int(reach))
    return out, lse


def _or_empty(t: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32) if t is None else t


@bias_attention_cpu_forward.register_fake
def _(q, k, v, distance, lut, lengths, scale, window, causal, dropout_seed=0, dropout_threshold=0,
      keep_scale=1.0, position_window=-1, position_lut=None, reach=-1):
    B, H, N, _ = q.shape
    return q.new_empty((B, H, N, v.shape[-1])), q.new_empty((B, H, N), dtype=torch.float32)


@torch.library.custom_op("syntaxkernels::bias_attention_cpu_bwd", mutates_args=(), device_types="cpu")
def bias_attention_cpu_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                lse: torch.Tensor, distance: torch.Tensor, lut: torch.Tensor, lengths: torch.Tensor,
                                bucket_index: torch.Tensor, num_buckets: int, scale: float, window: int, causal: bool,
                                table_grad: bool, dropout_seed: int = 0, dropout_threshold: int = 0,
                                keep_scale: float = 1.0, position_window: int = -1,
                                position_lut: Optional[torch.Tensor] = None, reach: int = -1,
                                position_grad: bool = False
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """C++ backward: ``(dq, dk, dv, G, PG)`` (dq like q, dk and dv like k and v: ``[B, H_kv, N, *]``, summed over each
    group's query heads), G float32 ``[1 or H, num_buckets]`` the per-bucket sums of dS (zeros
    unless ``table_grad``); ``bucket_index`` int64 ``[256]`` is ``BucketSpec.lut()``. Other arguments as the
    forward's (the dropout ones and the positional window the forward's: the mask is regenerated from the seed),
    plus ``dout`` (like out, any strides) and the forward's ``lse``. PG float32 ``[H, 2 * reach + 1]``: the sums of
    dS by clamped offset ``j - i`` (zeros unless ``position_grad`` and a ``position_lut``; ``[H, 0]`` without
    one)."""
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=q.dtype)
    dv = torch.empty(v.shape, dtype=q.dtype)
    bucket_grad = torch.empty((lut.shape[0], num_buckets), dtype=torch.float32)
    width = 2 * int(reach) + 1 if position_lut is not None and reach >= 0 else 0
    pos_grad = torch.zeros((q.shape[1], width), dtype=torch.float32)
    _ext.load().bias_attention_backward(dout, q, k, v, lse, distance, lut, lengths, bucket_index, float(scale),
                                        int(window), bool(causal), int(position_window), bool(table_grad),
                                        int(dropout_seed), int(dropout_threshold), float(keep_scale), dq, dk, dv,
                                        bucket_grad, _or_empty(position_lut), int(reach) if width else -1,
                                        bool(position_grad), pos_grad)
    return dq, dk, dv, bucket_grad, pos_grad


@bias_attention_cpu_backward.register_fake
def _(dout, q, k, v, lse, distance, lut, lengths, bucket_index, num_buckets, scale, window, causal, table_grad,
      dropout_seed=0, dropout_threshold=0, keep_scale=1.0, position_window=-1, position_lut=None, reach=-1,
      position_grad=False):
    # Contiguous like the real op's outputs, whatever q, k, v's strides (the modules pass transposed views).
    width = 2 * reach + 1 if position_lut is not None and reach >= 0 else 0
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape),
            q.new_empty((lut.shape[0], num_buckets), dtype=torch.float32),
            q.new_empty((q.shape[1], width), dtype=torch.float32))


class _SyntaxBiasAttentionCPU(torch.autograd.Function):
    """Autograd over the two C++ ops; gradients for q, k, v, the table and a tensor ``bias_scale`` (the table and
    bias-scale gradients from the per-bucket sums, as ``_SyntaxBiasAttention`` does on the Triton path).
    ``dropout_p``, ``dropout_seed``: attention dropout (saved, not the mask: the backward regenerates it);
    ``position_window``: ``|i - j| <= position_window`` (-1: none); ``position_spec`` (the
    :class:`~syntaxkernels.RelativePositionSpec` itself, or None: passed as the object, as the Triton Functions take
    it, since building one from its numbers reads its bucket table to the host, a graph break under
    ``torch.compile``) and ``position_table`` ``[H, P]``: T5's relative-position term (its gradient from the
    kernels' per-offset sums by :func:`._host.position_gradient`)."""

    @staticmethod
    def forward(ctx, q, k, v, distance, table, bias_scale, lengths, scale, window, causal, bucket_spec,
                dropout_p=0.0, dropout_seed=None, position_window=-1, position_spec=None, position_table=None):
        spec = _spec(*bucket_spec)
        lut = bias_lut(table, bias_scale, spec, window)
        plut, reach = None, -1
        if position_spec is not None:
            plut, reach = position_lut(position_spec, position_table), position_spec.reach
        out, lse = torch.ops.syntaxkernels.bias_attention_cpu_fwd(
            q, k, v, distance, lut, lengths, scale, window, causal,
            *dropout_arguments(dropout_p, dropout_seed), position_window, plut, reach)
        ctx.save_for_backward(q, k, v, lse, distance, table, bias_scale, lengths, lut, plut, position_table)
        ctx.position_spec, ctx.reach = position_spec, reach
        ctx.scale, ctx.window, ctx.causal, ctx.bucket_spec = scale, window, causal, bucket_spec
        ctx.dropout_p, ctx.dropout_seed, ctx.position_window = dropout_p, dropout_seed, position_window
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, lse, distance, table, bias_scale, lengths, lut, plut, position_table = ctx.saved_tensors
        table_grad = bool(ctx.needs_input_grad[4] or ctx.needs_input_grad[5])
        wants_position = plut is not None and bool(ctx.needs_input_grad[15])
        spec = _spec(*ctx.bucket_spec)
        dq, dk, dv, bucket_grad, offset_sums = torch.ops.syntaxkernels.bias_attention_cpu_bwd(
            dout, q, k, v, lse, distance, lut, lengths, _bucket_lut(spec, distance), spec.num_buckets, ctx.scale,
            ctx.window, ctx.causal, table_grad, *dropout_arguments(ctx.dropout_p, ctx.dropout_seed),
            ctx.position_window, plut, ctx.reach, wants_position)
        dtable, dscale = table_gradients(bucket_grad, table, bias_scale, *ctx.needs_input_grad[4:6])
        dposition = (position_gradient(offset_sums, ctx.position_spec, position_table)
                     if wants_position else None)
        return (dq, dk, dv, None, dtable, dscale, None, None, None, None, None, None, None, None, None,
                dposition)


def cpu_bias_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, distance, table: torch.Tensor, *,
                       buckets: BucketSpec, scale: Optional[float] = None, bias_scale=None, lengths=None,
                       window: Optional[int] = None, causal: bool = False, dropout_p: float = 0.0,
                       dropout_seed: Optional[int] = None, position_window: Optional[int] = None,
                       position_buckets: Optional[RelativePositionSpec] = None,
                       position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`syntaxkernels.syntax_bias_attention` on the C++ kernels (CPU tensors; inputs already validated, and
    :func:`._host.cpu_kernels_take` true): ``distance`` the batch's padded :class:`~syntaxkernels.plan.StructurePlan`
    (a TreeBatch) or a distance tensor with its ``lengths``. Same arguments and result; see that function.

    Equivalent PyTorch::

        bias = table[..., buckets.lut()[distance.long()]] * c           # [B, 1 or H, N, N]
        s = (q @ k.transpose(-1, -2)) * scale + bias
        allowed = allowed_pairs(distance, lengths, window, causal, position_window)[:, None]
        p = s.masked_fill(~allowed, -inf).softmax(-1)       # NaN in a row with a NaN or +inf allowed score
        p = reference.apply_attention_dropout(p, dropout_p, dropout_seed)   # when dropout_p > 0
        out = p.masked_fill(~allowed.any(-1, keepdim=True), 0) @ v    # a row with no allowed key: 0

    Attention dropout runs in the kernels: one Philox-4x32-7 call per 4 keys of a row, the mask regenerated in the
    backward from the seed (never stored); ``dropout_p == 0`` runs the kernels without it. A positional window
    (``position_window``) masks ``|i - j| > position_window`` in the kernels and skips the keys outside every row's
    window of a query block. T5's relative-position term (``position_buckets`` with ``position_table`` ``[H, P]``)
    adds ``position_table[h, pbucket(j - i)]`` to each score in the kernels (gradient included).
    """
    plan = as_plan(distance, lengths)
    scale, bias_scale = kernel_arguments(q, scale, bias_scale)
    return _SyntaxBiasAttentionCPU.apply(q, k, v, plan.distance, table, bias_scale, plan.kernel_lengths, float(scale),
                                         -1 if window is None else int(window), bool(causal), bucket_args(buckets),
                                         float(dropout_p), None if dropout_p == 0.0 else int(dropout_seed),
                                         -1 if position_window is None else int(position_window),
                                         position_buckets,
                                         position_table if position_buckets is not None else None)
