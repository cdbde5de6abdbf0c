"""The distance-bias op's host side that every path shares and Triton does not need: which implementation a call
runs (:func:`implementation`), the per-distance LUT the kernels gather from (:func:`bias_lut`), the arguments the
fused kernels take (:func:`kernel_arguments`, :func:`bucket_args`) and the table and bias-scale gradients from the
per-bucket sums of dS (:func:`table_gradients`).

Used by the Triton path (:mod:`._autograd`, :mod:`._launch`), the C++ path (:mod:`._cpu`) and the packed path
(:mod:`._varlen`, :mod:`._varlen_kernels`).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Tuple

import torch

from ... import _ext
from ...plan import register_derivation
from ...specs import MAX_PATH, BucketSpec, RelativePositionSpec
from ...trees.batch import aligned_distance
from .._dispatch import LOG2E, device_constant, kernels_or_reference, resolve_backend

#: Dtypes the C++ kernels take (float64 runs the reference).
CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: The buckets of a LUT given per distance value (:func:`.lut_attention`): one bucket per uint8 distance, 255
#: (unreachable) its own.
LUT_BUCKETS = BucketSpec(max_distance=MAX_PATH)


def cpu_kernels_take(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the C++ kernels run these inputs: CPU tensors of a :data:`CPU_DTYPES` dtype, head dims >= 1, and
    an extension built with them."""
    return (q.device.type == "cpu" and q.dtype in CPU_DTYPES and q.shape[-1] > 0 and v.shape[-1] > 0
            and _ext.available() and hasattr(_ext.load(), "bias_attention_forward"))


def implementation(q: torch.Tensor, v: torch.Tensor, backend: str = "auto") -> str:
    """What :func:`syntaxkernels.syntax_bias_attention` runs for these q and v (padded ``[B, H, N, D]`` or packed
    ``[T, H, D]``): "triton", "cpp" or "reference".

    "auto": the C++ kernels on CPU tensors they take (:func:`cpu_kernels_take`: float32, bfloat16, float16), the
    Triton kernels on CUDA tensors they take (Triton importable, sm_80 or newer, head dims up to 128), the
    reference otherwise. "triton" raises RuntimeError where Triton cannot run (not importable, or CPU tensors
    without ``TRITON_INTERPRET=1``) and ValueError for inputs the kernels do not take; "reference" is the
    reference. The op itself decides through this function.
    """
    chosen = kernels_or_reference(backend, resolve_backend(backend, q.device), q, v)
    if backend == "auto" and q.device.type == "cpu" and cpu_kernels_take(q, v):
        return "cpp"
    return chosen


def bucket_args(buckets: BucketSpec) -> Tuple[int, int, bool]:
    """``(max_distance, log_distance or 0, unreachable_bucket)``: the BucketSpec as kernel constexprs."""
    return buckets.max_distance, buckets.log_distance or 0, buckets.unreachable_bucket


def _spec(max_distance: int, log_distance: int, unreachable_bucket: bool) -> BucketSpec:
    return BucketSpec(max_distance, log_distance or None, unreachable_bucket)


def _bucket_lut(spec: BucketSpec, like: torch.Tensor) -> torch.Tensor:
    """``BucketSpec.lut()`` on ``like``'s device, built once per (spec, device) (:func:`device_constant`): no
    host-to-device copy per call."""
    return device_constant(("bucket lut", spec), like, spec.lut)


def bias_lut(table: torch.Tensor, bias_scale: torch.Tensor, buckets: BucketSpec, window: int) -> torch.Tensor:
    """The per-head distance LUT the kernels gather from: fp32 ``[H or 1, 256]``, log2 domain.

    ``lut[h, d] = c * table[h, bucket(d)] * log2(e)``, ``-inf`` for ``d > window`` (``window < 0``: none).
    Built on the table's device with a few small tensor ops (no host synchronisation).
    """
    rows = table.to(torch.float32).reshape(-1, table.shape[-1])
    lut = rows[:, _bucket_lut(buckets, table)] * (bias_scale.to(torch.float32).reshape(1, 1) * LOG2E)
    if window >= 0:
        beyond = torch.arange(256, device=table.device) > window
        lut = lut.masked_fill(beyond[None, :], float("-inf"))
    return lut.contiguous()


def kernel_arguments(q: torch.Tensor, scale: Optional[float], bias_scale):
    """What the fused kernels (Triton and C++) take for the public arguments: the float score scale (default
    ``1 / sqrt(D)``) and the bias strength as a one-element tensor (a number or None becomes a constant one,
    made once per value and device)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if bias_scale is None or not isinstance(bias_scale, torch.Tensor):
        value = 1.0 if bias_scale is None else float(bias_scale)
        bias_scale = device_constant(("bias strength", value), q, lambda: torch.full((1,), value, dtype=torch.float32))
    return scale, bias_scale


def output_like(x: torch.Tensor, last: int) -> torch.Tensor:
    """An empty tensor of ``x``'s shape (last dim ``last``), dtype and device, laid out as ``x`` is: ``[B, N, H, D]``
    memory when ``x`` is a ``[B, H, N, D]`` view of it (the heads split from a projection, as ``nn`` and transformers
    split them), so that the caller's merge of the heads, and the gradients' way back into the projections, need no
    copy; contiguous otherwise (and for packed ``[T, H, D]``)."""
    shape = tuple(x.shape[:-1]) + (last,)
    if x.dim() == 4 and x.stride(1) < x.stride(2) and x.shape[1] > 1 and x.shape[2] > 1:
        B, H, N = shape[:3]
        return torch.empty((B, N, H, last), dtype=x.dtype, device=x.device).transpose(1, 2)
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def table_gradients(bucket_grad: torch.Tensor, table: torch.Tensor, bias_scale: torch.Tensor, want_table: bool,
                    want_scale: bool):
    """``(d table, d bias_scale)`` (None where not wanted) from the per-bucket sums of dS ``G`` (``[H or 1, T]``,
    what the backward kernels return): ``d table = c * G`` and ``d c = sum_t table[t] * G[t]``."""
    bucket_grad = bucket_grad.reshape(table.shape)
    c = bias_scale.to(torch.float32).reshape(())
    dtable = (c * bucket_grad).to(table.dtype) if want_table else None
    dscale = None
    if want_scale:
        dscale = (table.to(torch.float32) * bucket_grad).sum().reshape(bias_scale.shape).to(bias_scale.dtype)
    return dtable, dscale


def _transposed_distance(plan) -> torch.Tensor:
    """A directed distance's transpose with aligned rows: what the dK/dV kernel reads at ``[b, j, i]`` (derived once
    per batch, :meth:`~syntaxkernels.plan.StructurePlan.transposed_distance`)."""
    return aligned_distance(plan.distance.transpose(1, 2))


register_derivation("transposed distance", _transposed_distance)


def packed_sequence_ids(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """int32 ``[T]``: the sequence of every packed token (empty sequences own none), on cu_seqlens' device."""
    cu = cu_seqlens.to(torch.int64)
    return torch.searchsorted(cu[1:], torch.arange(T, device=cu.device), right=True).to(torch.int32)


def packed_distance_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """int64 ``[S + 1]``: where each sequence's ``n x n`` distance block starts (``sum_{r < s} n_r^2``)."""
    cu = cu_seqlens.to(torch.int64)
    sizes = (cu[1:] - cu[:-1]) ** 2
    return torch.cat([torch.zeros(1, dtype=torch.int64, device=cu.device), torch.cumsum(sizes, 0)])


_WARNED = set()


def warn_once(message: str) -> None:
    """A RuntimeWarning, once per message (a kernel that does not fit this GPU: the reference runs instead)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def reference_gradients(needs, dout, inputs, run):
    """The gradients ``run(*leaves)`` gives for ``inputs`` (those ``needs`` says), recomputed with autograd on the
    reference: the backward of a fused call whose kernels do not fit this GPU. None where not needed."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(bool(n)) if isinstance(x, torch.Tensor) else x
                  for x, n in zip(inputs, needs)]
        wanted = [x for x, n in zip(leaves, needs) if n]
        grads = iter(torch.autograd.grad(run(*leaves), wanted, dout)) if wanted else iter(())
    return [next(grads) if n else None for n in needs]


#: The paths whose kernels take T5's relative-position term; the others run the reference for it.
POSITION_PATHS = ("cpp", "packed cpp", "triton", "packed triton")


def position_route(chosen: str, position_buckets, backend: str, packed: bool = False) -> str:
    """The path a call with T5's relative-position term runs: ``chosen`` where its kernels take the term
    (:data:`POSITION_PATHS`), else the reference (``backend="triton"``: ``ValueError``)."""
    path = ("packed " if packed else "") + chosen
    if position_buckets is None or chosen == "reference" or path in POSITION_PATHS:
        return chosen
    if backend == "triton":
        raise ValueError(f"the {path} kernels do not take the relative-position term (position_buckets) yet; use "
                         "backend='auto' (the reference runs it)")
    return "reference"


def position_lut(spec: RelativePositionSpec, table: torch.Tensor) -> torch.Tensor:
    """float32 ``[H, 2 * reach + 1]``: ``table[h, pbucket(r)] * log2(e)`` at index ``r + reach`` (``reach =
    spec.reach``): what every kernel gathers for T5's relative-position term, at ``clamp(j - i, -reach, reach) +
    reach`` (log2 domain, as the tree bias's LUT)."""
    buckets = device_constant(("position lut", spec), table, spec.lut)  # (built once per spec and device)
    return torch.index_select(table.to(torch.float32), 1, buckets) * LOG2E  # (two aten ops: replayed, cheap)


def kernel_tables(table: torch.Tensor, position: Optional[RelativePositionSpec], position_table):
    """``(rows, position_table, pos_buckets, reach)``: what the Triton forwards take for the learnable tables: the
    distance table as ``[H or 1, T]`` rows (a view), and T5's term as its table, the spec's
    ``lut()`` on the table's device (moved once per spec and device) and its reach (``None, None, 0`` without it):
    the forward kernels write :func:`position_lut`'s values themselves."""
    rows = table.reshape(-1, table.shape[-1])
    if position is None:
        return rows, None, None, 0
    buckets = device_constant(("position lut", position), position_table, position.lut)
    return rows, position_table, buckets, position.reach


def position_bounds_on(spec: RelativePositionSpec, like: torch.Tensor) -> torch.Tensor:
    """:func:`position_bounds`' boundaries on ``like``'s device, moved once per spec and device."""
    return device_constant(("position bounds", spec), like, lambda: position_bounds(spec)[0])


#: A position boundary past every offset: its sum is the whole tile's (:func:`position_bounds`).
POSITION_TOTAL = 1 << 30


def position_bounds(spec: RelativePositionSpec) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(bounds, interval_buckets)`` for the Triton kernels' position-table gradient: the offsets of one bucket
    form a range, so the clamped offsets ``[-reach, reach]`` split into K ranges ``(bounds[k - 1], bounds[k]]``
    (K at most ``num_buckets``), bucket ``interval_buckets[k]`` each. ``bounds``: int32 ``[max(16, pow2(K))]``, the
    K - 1 inner boundaries ascending, then :data:`POSITION_TOTAL` (the last range takes every larger offset, the
    first every smaller one); ``interval_buckets``: int64 ``[K]``. CPU tensors."""
    lut = spec._lut_values
    inner = spec.boundaries()
    buckets = [lut[b - 1 + spec.reach] for b in inner] + [lut[-1]]  # each range's bucket: at its last offset
    if len(set(buckets)) != len(buckets):  # (T5's buckets are ranges: never)
        raise ValueError("a position bucket that is not one range of offsets")
    inner = [b - 1 for b in inner]  # a range (b_prev, b]: its last offset is one before the next bucket's start
    pad = max(16, 1 << len(inner).bit_length())
    bounds = torch.tensor(inner + [POSITION_TOTAL] * (pad - len(inner)), dtype=torch.int32)
    return bounds, torch.tensor(buckets, dtype=torch.int64)


def _bounds_to_buckets(spec: RelativePositionSpec) -> torch.Tensor:
    """float32 ``[len(bounds), P]`` (CPU): ``A`` with ``position gradient = S @ A`` for the sums ``S`` of dS at the
    boundaries of :func:`position_bounds`: range k's sum is ``S[k] - S[k - 1]`` and goes to its bucket, so ``A[k,
    p] = [bucket(k) = p] - [bucket(k + 1) = p]`` (no term past the last range, zero rows for the padding slots)."""
    bounds, interval_buckets = position_bounds(spec)
    K = interval_buckets.numel()
    one_hot = torch.zeros(bounds.numel() + 1, spec.num_buckets)
    one_hot[torch.arange(K), interval_buckets] = 1.0
    matrix = one_hot[:-1] - one_hot[1:]
    matrix[K:] = 0.0
    return matrix


def position_matrix_on(spec: RelativePositionSpec, like: torch.Tensor) -> torch.Tensor:
    """:func:`_bounds_to_buckets`' matrix (float32 ``[len(bounds), P]``) on ``like``'s device, built once per spec and
    device: what the table-gradient kernel multiplies the boundary sums by (the padded Triton path)."""
    return device_constant(("position bounds to buckets", spec), like, lambda: _bounds_to_buckets(spec))


def position_gradient(offset_sums: torch.Tensor, spec: RelativePositionSpec, table: torch.Tensor) -> torch.Tensor:
    """The position table's gradient ``[H, P]`` (table's dtype) from the per-offset sums of dS, float32 ``[H, 2 *
    reach + 1]`` (index ``r + reach``, offsets beyond the reach summed into the ends): each bucket sums its offsets,
    by a product with the offsets' one-hot buckets (a fixed order: deterministic on every device)."""
    one_hot = device_constant(("position offsets to buckets", spec), offset_sums,
                              lambda: torch.nn.functional.one_hot(spec.lut(), spec.num_buckets).to(torch.float32))
    return (offset_sums.to(torch.float32) @ one_hot).to(table.dtype)

