"""Shared ``@triton.jit`` helpers for the fused attention kernels (bias attention, sub-network attention).

These are the building blocks every attention kernel of the package uses; their signatures are stable
(other kernels import them), so extend by adding functions, not by changing these.

Conventions:
    - Scores are kept in the log2 domain inside the kernels (``s2 = s * log2(e)``) so the softmax uses
      ``exp2``; ``LOG2E`` / ``LN2`` convert.
    - Distance tiles are read as uint8 and widened to int32; out-of-range pairs read as 255 (unreachable).
    - "Empty" rows (no allowed key) keep ``running_max = -inf``; :func:`online_softmax_step` never forms
      ``-inf - -inf``, so they end with ``running_sum = 0`` and no NaN.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def load_tile(ptr, offs_r, offs_c, stride_r, stride_c, n_rows, n_cols):
    """Load a ``[R, C]`` tile ``ptr[offs_r * stride_r + offs_c * stride_c]``, zero outside ``n_rows x n_cols``.

    Args:
        ptr: base pointer (already offset to the batch/head).
        offs_r: int32 ``[R]`` row indices; offs_c: int32 ``[C]`` column indices.
        stride_r, stride_c: element strides of rows and columns.
        n_rows, n_cols: valid extent (rows >= n_rows or columns >= n_cols read 0).
    """
    mask = (offs_r[:, None] < n_rows) & (offs_c[None, :] < n_cols)
    return tl.load(ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c, mask=mask, other=0.0)


@triton.jit
def store_tile(ptr, value, offs_r, offs_c, stride_r, stride_c, n_rows, n_cols):
    """Store a ``[R, C]`` tile (converted to the pointer's dtype), masked to ``n_rows x n_cols``."""
    mask = (offs_r[:, None] < n_rows) & (offs_c[None, :] < n_cols)
    tl.store(ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c, value.to(ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr):
    """``tl.dot(a, b)`` with fp32 accumulation.

    ``DOT_PRECISION``: "ieee" (exact fp32, for fp32 inputs), "tf32" (the default of half types: tensor
    cores), or "upcast": the operands are widened to fp32 first. Launchers pass "upcast" for bfloat16 under
    ``TRITON_INTERPRET=1``, whose bf16 ``tl.dot`` returns garbage in Triton 3.6; products of bf16 values are
    exact in fp32, so the result equals a tensor-core dot with fp32 accumulation.
    """
    if DOT_PRECISION == "upcast":
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        result = tl.dot(a, b, input_precision=DOT_PRECISION)
    return result


@triton.jit
def mma_acc(a, b, acc, DOT_PRECISION: tl.constexpr):
    """``acc + a @ b`` (fp32 ``acc``), with the precision modes of :func:`mma`; the accumulation is fused
    into the tensor-core instruction."""
    if DOT_PRECISION == "upcast":
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return result


@triton.jit
def load_rows(ptr, offs_r, offs_c, stride_r, stride_c, n_rows, n_cols, MASK_ROWS: tl.constexpr,
              EVEN_COLS: tl.constexpr):
    """Load a ``[R, C]`` tile with only the masks it needs (zero where masked).

    ``MASK_ROWS``: rows ``>= n_rows`` read 0 (a boundary tile); otherwise every row is known to be in range.
    ``EVEN_COLS``: ``C == n_cols`` (the head dim is a power of two), so columns need no mask. A row-only
    mask is constant along the contiguous dimension and still allows vector loads.
    """
    ptrs = ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
    if MASK_ROWS:
        if EVEN_COLS:
            tile = tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(offs_r[:, None] < n_rows) & (offs_c[None, :] < n_cols), other=0.0)
    else:
        if EVEN_COLS:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=offs_c[None, :] < n_cols, other=0.0)
    return tile


@triton.jit
def load_distance_tile(dist_ptr, offs_m, offs_n, stride_i, stride_j, n_valid):
    """The uint8 distance tile ``[M, N]`` as int32; pairs outside ``n_valid x n_valid`` read 255.

    Args:
        dist_ptr: pointer to ``distance[b]`` (uint8).
        offs_m: query token indices ``[M]``; offs_n: key token indices ``[N]``.
        stride_i, stride_j: strides of the distance matrix.
        n_valid: tokens < n_valid are read (the sequence length, or N).
    """
    mask = (offs_m[:, None] < n_valid) & (offs_n[None, :] < n_valid)
    d = tl.load(dist_ptr + offs_m[:, None] * stride_i + offs_n[None, :] * stride_j, mask=mask, other=255)
    return d.to(tl.int32)


@triton.jit
def bucket_of(distance, lut_ptr):
    """Table index of each distance (int32 tile) through the 256-entry int32 LUT (``BucketSpec.lut()``)."""
    return tl.load(lut_ptr + distance)


@triton.jit
def bucket_from_distance(distance, MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr,
                         UNREACHABLE_BUCKET: tl.constexpr):
    """Table index of each distance (int32 tile) computed with integer ALU ops, equal to ``BucketSpec.lut()``.

    ``d' = min(d, MAX_DISTANCE)``; with ``LOG_DISTANCE = E > 0`` and ``d' > E`` the bucket is
    ``E + ceil(log2(d' / E))``, counted exactly as the number of ``k >= 0`` with ``E * 2^k < d'``;
    ``LOG_DISTANCE = 0`` is the clamp scheme. With ``UNREACHABLE_BUCKET``, 255 maps to the last bucket
    (``bucket(MAX_DISTANCE) + 1``). No memory access: the gather of a LUT would be one more dependent
    load per score element.
    """
    clamped = tl.minimum(distance, MAX_DISTANCE)
    bucket = clamped
    if LOG_DISTANCE > 0:
        steps = tl.zeros_like(clamped)
        for k in tl.static_range(8):
            steps += ((LOG_DISTANCE << k) < clamped).to(tl.int32)
        bucket = tl.where(clamped > LOG_DISTANCE, LOG_DISTANCE + steps, clamped)
    if UNREACHABLE_BUCKET:
        last = MAX_DISTANCE
        if LOG_DISTANCE > 0:
            last = LOG_DISTANCE
            for k in tl.static_range(8):
                if (LOG_DISTANCE << k) < MAX_DISTANCE:
                    last += 1
        bucket = tl.where(distance == 255, last + 1, bucket)
    return bucket


@triton.jit
def gather_bias(bucket, table_ptr, bias_scale, NUM_BUCKETS: tl.constexpr, SELECT_MAX: tl.constexpr = 16):
    """``bias_scale * table[bucket]`` as fp32 (``table_ptr``: one head's fp32 row of the table).

    Small tables (``NUM_BUCKETS <= SELECT_MAX``) use a chain of selects over loop-invariant scalar loads:
    a per-element gather from memory is a dependent load the software pipeliner stages through shared
    memory, which costs ~60 registers per thread at 64x64 tiles (measured with ptxas for sm_90). Larger
    tables fall back to the gather.
    """
    if NUM_BUCKETS <= SELECT_MAX:
        bias = tl.zeros(bucket.shape, dtype=tl.float32)
        for t in tl.static_range(NUM_BUCKETS):
            bias = tl.where(bucket == t, tl.load(table_ptr + t).to(tl.float32), bias)
    else:
        bias = tl.load(table_ptr + bucket).to(tl.float32)
    return bias * bias_scale


@triton.jit
def pair_allowed(offs_m, offs_n, length, distance, window, HAS_WINDOW: tl.constexpr, CAUSAL: tl.constexpr):
    """bool ``[M, N]``: query i may attend key j (DESIGN.md §2).

    Both tokens ``< length``; ``distance <= window`` when ``HAS_WINDOW`` (255 = unreachable never passes a
    window <= 254); ``j <= i`` when ``CAUSAL``.
    """
    allowed = (offs_m[:, None] < length) & (offs_n[None, :] < length)
    if HAS_WINDOW:
        allowed = allowed & (distance <= window)
    if CAUSAL:
        allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
    return allowed


@triton.jit
def online_softmax_step(running_max, running_sum, scores2):
    """One step of the streaming softmax over a new score tile (log2 domain, disallowed pairs = -inf).

    Args:
        running_max: fp32 ``[M]`` (``-inf`` until a row sees an allowed key).
        running_sum: fp32 ``[M]`` sum of ``exp2(s2 - running_max)`` so far.
        scores2: fp32 ``[M, N]`` scores times log2(e), ``-inf`` where not allowed.
    Returns:
        ``(new_max, alpha, p, new_sum)``: ``alpha [M]`` rescales the old accumulator, ``p [M, N]`` are the
        unnormalised weights of this tile (0 where not allowed); empty rows give ``alpha = p = 0``.
    """
    new_max = tl.maximum(running_max, tl.max(scores2, 1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    alpha = tl.exp2(running_max - safe_max)
    p = tl.exp2(scores2 - safe_max[:, None])
    new_sum = running_sum * alpha + tl.sum(p, 1)
    return new_max, alpha, p, new_sum


@triton.jit
def finish_softmax(accumulator, running_max, running_sum):
    """Normalise the output accumulator and form the log2-sum-exp of every row.

    Returns ``(out [M, D], lse2 [M])``; rows with ``running_sum == 0`` (no allowed key) give ``out = 0`` and
    ``lse2 = 0`` (their weights are masked to 0 in the backward anyway, so any finite value works).
    """
    empty = running_sum == 0.0
    denom = tl.where(empty, 1.0, running_sum)
    out = accumulator / denom[:, None]
    lse2 = tl.where(empty, 0.0, running_max + tl.log2(denom))
    return out, lse2


@triton.jit
def accumulate_bucket_sums(acc, bucket, values, allowed, bucket_ids, NUM_BUCKETS: tl.constexpr):
    """``acc[t] += sum(values[bucket == t])`` over the allowed pairs of one tile, on chip.

    Only the buckets present in the tile are visited (a loop from the tile's smallest to its largest
    allowed bucket), so a tile whose pairs share one bucket costs a single reduction.

    Args:
        acc: fp32 ``[T_PAD]`` running per-bucket sums; bucket_ids: ``tl.arange(0, T_PAD)``.
        bucket: int32 ``[M, N]`` table index of every pair; values: fp32 ``[M, N]``.
        allowed: bool ``[M, N]``; disallowed pairs contribute nothing.
        NUM_BUCKETS: T (buckets >= T never occur).
    """
    lowest = tl.min(tl.where(allowed, bucket, NUM_BUCKETS), axis=1)
    lowest = tl.min(lowest, axis=0)
    highest = tl.max(tl.where(allowed, bucket, -1), axis=1)
    highest = tl.max(highest, axis=0)
    values = tl.where(allowed, values, 0.0)
    for t in range(lowest, highest + 1):
        part = tl.sum(tl.sum(tl.where(bucket == t, values, 0.0), axis=1), axis=0)
        acc += tl.where(bucket_ids == t, part, 0.0)
    return acc


_LAUNCH_HOOK = None


def set_launch_hook(hook):
    """Route every :func:`launch` to ``hook(kernel, grid, args, kwargs)`` instead (None restores launching).

    Used by :mod:`syntaxkernels.inspection`, which compiles each launch for a GPU this machine lacks. Returns
    the previous hook.
    """
    global _LAUNCH_HOOK
    previous, _LAUNCH_HOOK = _LAUNCH_HOOK, hook
    return previous


def launch(kernel, grid, *args, **kwargs):
    """Launch a ``@triton.jit`` kernel from inside a ``torch.library.triton_op`` (Python helper, not jit).

    Goes through ``torch.library.wrap_triton`` so ``torch.compile`` sees the kernel. Under
    ``TRITON_INTERPRET=1`` the kernel is a Python function that cannot run on FakeTensors; when the op is
    being traced for shapes only (fake tensors among the arguments) the launch is skipped, which is what the
    fake implementation needs (outputs are allocated by the caller).
    """
    import os

    import torch
    from torch._subclasses.fake_tensor import is_fake

    if _LAUNCH_HOOK is not None:
        _LAUNCH_HOOK(kernel, grid, args, kwargs)
        return
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        if any(isinstance(a, torch.Tensor) and is_fake(a) for a in list(args) + list(kwargs.values())):
            return
        kernel[grid](*args, **kwargs)
        return
    torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


@triton.jit
def accumulate_bucket_row_sums(ds_rows, p_rows, bucket, ds, p, allowed, bucket_ids, NUM_BUCKETS: tl.constexpr):
    """Per-row, per-bucket sums of dS and of P over one tile: ``ds_rows[i, t] += sum_{j in t} ds_ij``.

    With :func:`finish_bucket_sums` this gives the table gradient of an exact softmax backward even when
    ``delta_i = dO_i . O_i`` was formed from a rounded (fp16/bf16) output: the row error
    ``e_i = sum_j dS_ij`` (zero in exact arithmetic) is removed as ``dS_ij - P_ij e_i``. Without it the
    small per-row errors add up over every row in each bucket sum.

    Args:
        ds_rows, p_rows: fp32 ``[M, T_PAD]`` running sums; bucket_ids: ``tl.arange(0, T_PAD)``.
        bucket: int32 ``[M, N]``; ds, p: fp32 ``[M, N]``; allowed: bool ``[M, N]``.
    """
    lowest = tl.min(tl.min(tl.where(allowed, bucket, NUM_BUCKETS), axis=1), axis=0)
    highest = tl.max(tl.max(tl.where(allowed, bucket, -1), axis=1), axis=0)
    ds = tl.where(allowed, ds, 0.0)
    p = tl.where(allowed, p, 0.0)
    for t in range(lowest, highest + 1):
        in_bucket = bucket == t
        column = bucket_ids[None, :] == t
        ds_rows += tl.where(column, tl.sum(tl.where(in_bucket, ds, 0.0), axis=1)[:, None], 0.0)
        p_rows += tl.where(column, tl.sum(tl.where(in_bucket, p, 0.0), axis=1)[:, None], 0.0)
    return ds_rows, p_rows


@triton.jit
def finish_bucket_sums(ds_rows, p_rows):
    """``G[t] = sum_i (ds_rows[i, t] - e_i * p_rows[i, t])`` with ``e_i = sum_t ds_rows[i, t]`` (fp32 ``[T_PAD]``)."""
    row_error = tl.sum(ds_rows, axis=1)
    return tl.sum(ds_rows - row_error[:, None] * p_rows, axis=0)
