"""Autograd over the distance-bias op's Triton launchers (:mod:`._launch`): :class:`_SyntaxBiasAttention` (a
learnable table and bias strength) and :class:`_LutAttention` (a fixed per-distance bias).

In eager mode the Functions call the launchers directly (no ``torch.library`` dispatch on the way); while
``torch.compile`` traces they call the ``torch.library`` Triton ops (``syntaxkernels::bias_attention_fwd`` /
``_bwd``), whose kernels Inductor sees. Every tensor the kernels read is an argument of the Function: the
structure's metadata (:func:`._launch.forward_metadata`, :func:`._launch.backward_metadata`) comes in with q, k, v.
"""
from typing import Optional, Tuple

import torch

from ...specs import BucketSpec
from .. import _replay
from .._dispatch import device_constant
from ... import reference
from .._primitives import KernelDoesNotFit, seed_bits
from ...specs import RelativePositionSpec
from ._host import (LUT_BUCKETS, _bucket_lut, _spec, bucket_args, kernel_tables, position_bounds_on,
                    position_matrix_on, reference_gradients, warn_once)
from ._launch import (BackwardMetadata, backward_configs, backward_metadata, bias_attention_backward,
                      bias_attention_forward, forward_metadata, launch_configs)

_META = len(BackwardMetadata._fields)


def _forward(q, k, v, distance, table, bias_scale, bucket_lut, lengths, kv_list, kv_count, scale, window, causal,
             dropout_p=0.0, dropout_seed=0, band=-1, position_table=None, pos_buckets=None, reach=0, short_rows=-1):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_attention_fwd(q, k, v, distance, table, bias_scale, bucket_lut, lengths,
                                                          kv_list, kv_count, scale, window, causal, dropout_p,
                                                          seed_bits(dropout_seed), band, position_table, pos_buckets,
                                                          reach, short_rows)
    return bias_attention_forward(q, k, v, distance, table, bias_scale, bucket_lut, lengths, kv_list, kv_count, scale,
                                  window, causal, dropout_p, dropout_seed, band, position_table, pos_buckets, reach,
                                  short_rows)


def _backward(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal, spec, table, bias_scale,
              want_table, want_scale, dropout_p=0.0, dropout_seed=0, band=-1, pos_lut=None, reach=0,
              pos_bounds=None, pos_matrix=None, short_rows=-1):
    if torch.compiler.is_compiling():
        return torch.ops.syntaxkernels.bias_attention_bwd(
            dout, q, k, v, out, lse, distance, lut, lengths, *meta, scale, window, causal, *bucket_args(spec), table,
            bias_scale, want_table, want_scale, dropout_p, seed_bits(dropout_seed), band, pos_lut, reach, pos_bounds,
            pos_matrix, short_rows)
    return bias_attention_backward(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal, spec,
                                   table, bias_scale, want_table, want_scale, dropout_p, dropout_seed, band, pos_lut,
                                   reach, pos_bounds, pos_matrix, short_rows)


@_replay.replayed(seed=15)
def _forward_step(q, k, v, table, bias_scale, position_table, distance, lengths, kv_list, kv_count, scale, window,
                  causal, bucket_spec, dropout_p, dropout_seed, band, position, short_rows):
    """The forward of :class:`_SyntaxBiasAttention` but its autograd bookkeeping: ``(out, lse, lut, rows, pos_lut)``
    (``rows``: the table as ``[H or 1, T]``; ``pos_lut``: T5's term's LUT, or None). One replayed unit
    (:mod:`.._replay`): a call of a recorded shape class runs none of this Python."""
    rows, ptable, pos_buckets, reach = kernel_tables(table, position, position_table)
    out, lse, lut, pos_lut = _forward(q, k, v, distance, rows, bias_scale, _bucket_lut(_spec(*bucket_spec), q),
                                      lengths, kv_list, kv_count, scale, window, causal, dropout_p, dropout_seed, band,
                                      ptable, pos_buckets, reach, short_rows)
    return out, lse, lut, rows, pos_lut if position is not None else None


@_replay.replayed(seed=19)
def _backward_step(dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal, bucket_spec, rows,
                   bias_scale, want_table, want_scale, dropout_p, dropout_seed, band, pos_lut, position,
                   want_position, position_table, short_rows):
    """The kernels of :class:`_SyntaxBiasAttention`'s backward, one replayed unit: :func:`_backward`'s results, the
    last T5's table's gradient in its dtype (None without ``want_position``)."""
    dq, dk, dv, dtable, dscale, dposition = _backward(
        dout, q, k, v, out, lse, distance, lut, lengths, meta, scale, window, causal, _spec(*bucket_spec), rows,
        bias_scale, want_table, want_scale, dropout_p, dropout_seed, band, pos_lut,
        0 if position is None else position.reach, position_bounds_on(position, q) if want_position else None,
        position_matrix_on(position, q) if want_position else None, short_rows)
    return dq, dk, dv, dtable, dscale, dposition.to(position_table.dtype) if want_position else None


class _SyntaxBiasAttention(torch.autograd.Function):
    """Autograd over the Triton launchers; gradients for q, k, v, the table, a tensor ``bias_scale`` and T5's
    position table.

    Inputs: ``q, k, v, table, bias_scale, position_table`` (``[H, P]``, or None: no relative-position term),
    ``distance, lengths, kv_list, kv_count`` (the forward's metadata), the
    nine tensors of :class:`._launch.BackwardMetadata` (None where a call needs none), then one tuple of the
    call's other arguments (one input, not ten: a Function's apply costs about half a microsecond per input):
    ``scale, window, causal`` and the BucketSpec as :func:`._host.bucket_args`, ``fallback`` (a backward kernel that
    does not fit this GPU, :class:`KernelDoesNotFit`, then gives way to the reference, with a warning, instead of
    raising), ``dropout_p, dropout_seed`` (the backward regenerates the forward's mask from the seed), ``band`` (the
    positional window ``|i - j| <= band``, -1: none), ``position`` (the RelativePositionSpec, or None),
    ``short_rows`` (the plan's: which tiles, :func:`._launch.launch_configs`) and ``same_t``: the
    transposed distance is the distance itself (symmetric), passed once (torch.compile traces no Function taking
    one tensor twice) and its metadata slot None. The forward
    kernel writes the LUT (from the table, the strength and the buckets) that the backward reads; the backward's
    last kernel writes the table's and the strength's gradients."""

    @staticmethod
    def forward(ctx, q, k, v, table, bias_scale, position_table, distance, lengths, kv_list, kv_count, *rest):
        meta = BackwardMetadata(*rest[:_META])
        (scale, window, causal, bucket_spec, fallback, dropout_p, dropout_seed, band, position, short_rows,
         same_t) = rest[_META]
        out, lse, lut, rows, pos_lut = _forward_step(q, k, v, table, bias_scale, position_table, distance, lengths,
                                                     kv_list, kv_count, scale, window, causal, bucket_spec,
                                                     dropout_p, dropout_seed, band, position, short_rows)
        ctx.save_for_backward(q, k, v, out, lse, distance, rows, bias_scale, lengths, lut, pos_lut, position_table,
                              *meta)
        ctx.scale, ctx.window, ctx.causal, ctx.bucket_spec = scale, window, causal, bucket_spec
        ctx.dropout, ctx.band, ctx.same_t, ctx.position = (dropout_p, dropout_seed), band, same_t, position
        ctx.table_shape, ctx.fallback, ctx.short_rows = table.shape, fallback, short_rows
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, rows, bias_scale, lengths, lut, pos_lut, position_table, *meta = ctx.saved_tensors
        want_table, want_scale = bool(ctx.needs_input_grad[3]), bool(ctx.needs_input_grad[4])
        want_position = bool(ctx.needs_input_grad[5])
        rest = (None,) * (4 + _META + 1)
        meta = BackwardMetadata(*meta)
        if ctx.same_t:  # a symmetric distance is its own transpose (one tensor, passed once)
            meta = meta._replace(distance_t=distance)
        spec = ctx.position
        try:
            dq, dk, dv, dtable, dscale, dposition = _backward_step(
                dout, q, k, v, out, lse, distance, lut, lengths, meta, ctx.scale, ctx.window, ctx.causal,
                ctx.bucket_spec, rows, bias_scale, want_table, want_scale, *ctx.dropout, ctx.band, pos_lut, spec,
                want_position, position_table, ctx.short_rows)
        except KernelDoesNotFit as error:
            if not ctx.fallback:
                raise
            warn_once(f"syntax_bias_attention's backward runs the reference on this GPU: {error}")
            window = None if ctx.window < 0 else ctx.window

            def run(q, k, v, table, c, position_table):
                return reference.syntax_bias_attention(q, k, v, distance, table, buckets=_spec(*ctx.bucket_spec),
                                                       scale=ctx.scale, bias_scale=c, lengths=lengths, window=window,
                                                       causal=ctx.causal, dropout_p=ctx.dropout[0],
                                                       dropout_seed=ctx.dropout[1],
                                                       position_window=None if ctx.band < 0 else ctx.band,
                                                       position_buckets=spec,
                                                       position_table=None if spec is None else position_table)
            return tuple(reference_gradients(ctx.needs_input_grad[:6], dout,
                                             (q, k, v, rows.view(ctx.table_shape), bias_scale, position_table),
                                             run)) + rest
        return ((dq, dk, dv, dtable.view(ctx.table_shape) if want_table else None, dscale if want_scale else None,
                 dposition) + rest)


class _LutAttention(torch.autograd.Function):
    """Attention with a fixed per-distance bias (no table gradient): gradients for q, k, v. Inputs: ``q, k, v,
    distance, lut [H or 1, 256]`` (natural log, ``-inf`` = not allowed), ``lengths, distance_t, scale, short_rows``
    (``distance_t`` None: the distance is its own transpose, passed once; ``short_rows``: the plan's)."""

    @staticmethod
    def forward(ctx, q, k, v, distance, lut, lengths, distance_t, scale, short_rows):
        one = device_constant(("bias strength", 1.0), q, lambda: torch.ones(1, dtype=torch.float32))
        # The LUT is a table of one bucket per distance value (LUT_BUCKETS); the kernel scales it to log2.
        out, lse, lut2, _ = _forward(q, k, v, distance, lut, one, _bucket_lut(LUT_BUCKETS, q), lengths, None, None,
                                     scale, -1, False, short_rows=short_rows)
        ctx.save_for_backward(q, k, v, out, lse, distance, lut2, lengths, distance_t, lut, one)
        ctx.scale, ctx.short_rows = scale, short_rows
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, distance, lut2, lengths, distance_t, lut, one = ctx.saved_tensors
        distance_t = distance if distance_t is None else distance_t
        try:
            dq, dk, dv, _, _, _ = _backward(dout, q, k, v, out, lse, distance, lut2, lengths,
                                         BackwardMetadata(distance_t=distance_t), ctx.scale, -1, False, LUT_BUCKETS,
                                         lut, one, False, False, short_rows=ctx.short_rows)
        except KernelDoesNotFit as error:
            warn_once(f"lut_attention's backward runs the reference on this GPU: {error}")
            table = lut[0] if lut.shape[0] == 1 else lut

            def run(q, k, v):
                return reference.syntax_bias_attention(q, k, v, distance, table, buckets=LUT_BUCKETS, scale=ctx.scale,
                                                       lengths=lengths)
            dq, dk, dv = reference_gradients(ctx.needs_input_grad[:3], dout, (q, k, v), run)
        return dq, dk, dv, None, None, None, None, None, None


def _short_rows(plan) -> int:
    """The plan's ``short_rows`` as the launchers take it: 1, 0, or -1 (not known)."""
    short = getattr(plan, "short_rows", None)
    return -1 if short is None else int(short)


def bias_attention(q, k, v, table, bias_scale, plan, *, scale: float, window: int, causal: bool,
                   buckets: BucketSpec, fallback: bool = False, dropout_p: float = 0.0,
                   dropout_seed: Optional[int] = None, position_window: int = -1,
                   position_buckets: Optional[RelativePositionSpec] = None,
                   position_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:class:`_SyntaxBiasAttention` on a padded plan: its metadata derived (once per batch) and passed in
    (``position_window``: the positional window, -1 for none; ``position_buckets``, ``position_table``: T5's
    relative-position term, or None)."""
    B, H, N, D = q.shape
    short_rows = _short_rows(plan)
    configs = launch_configs(N, D, v.shape[-1], q.dtype, 1 if table.dim() == 1 else H, window, buckets,
                             position_table is not None, H > k.shape[1], scale, causal, dropout_p > 0.0,
                             position_window, short_rows)
    configs = backward_configs(configs, N, dropout_p > 0.0)
    forward_meta = forward_metadata(plan, configs, window, causal, position_window)
    meta = BackwardMetadata()
    grads = (q, k, v, table, bias_scale) + (() if position_table is None else (position_table,))
    if torch.is_grad_enabled() and any(t.requires_grad for t in grads):
        table_grad = table.requires_grad or bias_scale.requires_grad
        meta = backward_metadata(plan, configs, window, causal, buckets, table_grad, position_window)
    same_t = meta.distance_t is not None and meta.distance_t is plan.distance
    if same_t:
        meta = meta._replace(distance_t=None)
    return _SyntaxBiasAttention.apply(q, k, v, table, bias_scale, position_table, plan.distance, plan.kernel_lengths,
                                      *forward_meta, *meta, (scale, window, causal, bucket_args(buckets), fallback,
                                                             dropout_p, dropout_seed if dropout_p > 0.0 else 0,
                                                             position_window, position_buckets, short_rows,
                                                             same_t))


def lut_attention(q, k, v, lut, plan, scale: float) -> torch.Tensor:
    """:class:`_LutAttention` on a padded plan (``lut`` fp32 ``[H or 1, 256]``, natural log)."""
    distance_t: Optional[torch.Tensor] = None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        distance_t = plan.transposed_distance()
        if distance_t is plan.distance:  # (torch.compile traces no Function taking one tensor twice)
            distance_t = None
    return _LutAttention.apply(q, k, v, plan.distance, lut, plan.kernel_lengths, distance_t, scale, _short_rows(plan))


__all__: Tuple[str, ...] = ("bias_attention", "lut_attention")
