"""The kernel layer every fused op builds on: ``@triton.jit`` helpers and the host-side launch helpers.

Device helpers (``@triton.jit``):

- :func:`program_ids` / :func:`program_ids_r`: decode a 1-D launch grid into (block, batch, head[, relation]);
- :func:`load_rows`: a ``[R, C]`` tile with only the masks it needs; :func:`distance_tile` /
  :func:`load_distance_tile`: the uint8 distance tile (255 outside the sequence);
- :func:`mma` / :func:`mma_acc`: ``tl.dot`` with fp32 accumulation and the project's precision modes;
- :func:`bucket_from_distance` (a tile of bucket indices) and :func:`in_bucket` (the pairs of one bucket,
  resolved at compile time): equal to ``BucketSpec.lut()``;
- :func:`opaque_int32`: an int32 copy the compiler cannot fold back into its packed source;
- :func:`build_lut`: the forward's first step, one row of the per-distance bias LUT from the table;
  :func:`build_position_lut`: likewise one head's row of T5's relative-position LUT;
- :func:`dropout_keep` (a tile) / :func:`dropout_keep_pairs` (any pairs): the attention-dropout keep mask, a
  Philox function of (seed, item and head, query, key) equal to :func:`syntaxkernels.reference.dropout_keep`.

Host helpers: ``LOG2E`` (from :mod:`._dispatch`, which needs no Triton), :func:`launch` (through ``torch.library.wrap_triton``;
:func:`set_launch_hook` lets the inspection report compile instead of launching), :func:`launch_grid`, :func:`head_block`, :func:`dot_precision`,
:func:`arch_family` / :func:`current_arch` (the GPU families, :data:`ARCH_FAMILY`, and their shared-memory
limits, :data:`SHARED_LIMIT`), :func:`launches_on` (whether a kernel launch for a tensor runs or is captured).

Conventions: scores are kept in the log2 domain inside the kernels (``s2 = s * log2(e)``), so softmaxes use
``exp2``; distance tiles are uint8, 255 = unreachable (and out of range).
"""
import triton
import triton.language as tl
from triton import knobs as _knobs
from triton.runtime import driver as _driver
from triton.runtime.errors import OutOfResources

from ._dispatch import LOG2E, dropout_arguments, interpreting, seed_bits  # noqa: F401 (the kernel layer's names)
from ._dispatch import RECORDING as _RECORDING

__all__ = ["LOG2E", "program_ids", "program_ids_r", "load_rows", "distance_tile", "load_distance_tile", "mma",
           "mma_acc", "bucket_from_distance", "in_bucket", "opaque_int32", "launch", "KernelDoesNotFit",
           "set_launch_hook", "launches_on", "launch_grid", "lut_bias", "head_block", "dot_precision", "arch_family",
           "current_arch", "interpret_as", "SHARED_LIMIT", "ARCH_FAMILY", "interpreting", "multiprocessors",
           "MULTIPROCESSORS", "dropout_keep", "dropout_keep_pairs", "PHILOX_ROUNDS", "dropout_arguments", "dropout_stream_seed",
           "seed_bits"]


# ---------------------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------------------


@triton.jit
def program_ids(num_blocks, H):
    """Decode the 1-D grid of :func:`launch_grid`: ``(block, batch * H + head, batch, head)``, the blocks of one
    head adjacent (batch and head as int64)."""
    pid = tl.program_id(0)
    block = pid % num_blocks
    bh = pid // num_blocks
    return block, bh, (bh // H).to(tl.int64), (bh % H).to(tl.int64)


@triton.jit
def program_ids_r(num_blocks, H, R):
    """:func:`program_ids` with a relation axis: ``(block, batch * H + head, relation, batch, head)`` for a grid
    of ``num_blocks * B * H * R`` programs (relations of one head adjacent; relation, batch and head as int64:
    ``r * stride`` passes 2^31 at ``R * H * N * Dv >= 2^31``)."""
    pid = tl.program_id(0)
    block = pid % num_blocks
    rest = pid // num_blocks
    r = rest % R
    bh = rest // R
    return block, bh, r.to(tl.int64), (bh // H).to(tl.int64), (bh % H).to(tl.int64)


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
def distance_tile(dist_base, offs_r, offs_c, stride_r, stride_c, N, MASK: tl.constexpr, EVEN_N: tl.constexpr):
    """The uint8 distance tile ``dist[offs_r, offs_c]``; out-of-range pairs read 255 (unreachable).

    Interior tiles mask nothing when N is a multiple of both tile sides (``EVEN_N``), else only rows past N
    (a mask constant along the contiguous dimension, so the load stays vectorised).
    """
    ptrs = dist_base + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
    if MASK:
        dist = tl.load(ptrs, mask=(offs_r[:, None] < N) & (offs_c[None, :] < N), other=255)
    elif EVEN_N:
        dist = tl.load(ptrs)
    else:
        dist = tl.load(ptrs, mask=offs_r[:, None] < N, other=255)
    return dist


@triton.jit
def load_distance_tile(dist_ptr, offs_m, offs_n, stride_i, stride_j, n_valid):
    """The uint8 distance tile ``[M, N]`` as int32; pairs outside ``n_valid x n_valid`` read 255."""
    mask = (offs_m[:, None] < n_valid) & (offs_n[None, :] < n_valid)
    d = tl.load(dist_ptr + offs_m[:, None] * stride_i + offs_n[None, :] * stride_j, mask=mask, other=255)
    return d.to(tl.int32)


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr):
    """``tl.dot(a, b)`` with fp32 accumulation.

    ``DOT_PRECISION`` (:func:`dot_precision`): "ieee" (exact fp32 products, for fp32 inputs), "tf32" (the
    tensor cores of half types), or "upcast": the operands are widened to fp32 first. Launchers pass "upcast"
    for bfloat16 under ``TRITON_INTERPRET=1``, whose bf16 ``tl.dot`` returns garbage in Triton 3.6; products of
    bf16 values are exact in fp32, so the result equals a tensor-core dot with fp32 accumulation.
    """
    if DOT_PRECISION == "upcast":
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        result = tl.dot(a, b, input_precision=DOT_PRECISION)
    return result


@triton.jit
def mma_acc(a, b, acc, DOT_PRECISION: tl.constexpr):
    """``acc + a @ b`` (fp32 ``acc``) with the precision modes of :func:`mma`; the accumulation is fused into
    the tensor-core instruction."""
    if DOT_PRECISION == "upcast":
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    return result


@triton.jit
def bucket_from_distance(distance, MAX_DISTANCE: tl.constexpr, LOG_DISTANCE: tl.constexpr,
                         UNREACHABLE_BUCKET: tl.constexpr):
    """Table index of each distance (int32 tile) computed with integer ALU ops, equal to ``BucketSpec.lut()``.

    ``d' = min(d, MAX_DISTANCE)``; with ``LOG_DISTANCE = E > 0`` and ``d' > E`` the bucket is
    ``E + ceil(log2(d' / E))``, counted exactly as the number of ``k >= 0`` with ``E * 2^k < d'``;
    ``LOG_DISTANCE = 0`` is the clamp scheme. With ``UNREACHABLE_BUCKET``, 255 maps to the last bucket
    (``bucket(MAX_DISTANCE) + 1``).
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
def in_bucket(dist, t: tl.constexpr, LOG_DISTANCE: tl.constexpr, UNREACHABLE_BUCKET: tl.constexpr,
              LAST_DISTANCE_BUCKET: tl.constexpr):
    """bool tile: the distance falls in bucket ``t`` of the BucketSpec (equal to ``BucketSpec.lut()``).

    Buckets are contiguous distance ranges, resolved at compile time: ``{t}`` for exact buckets, the log
    ranges ``(E 2^(k-1), E 2^k]`` for ``t = E + k``, everything from the last range's start up to 254 (and 255
    unless it has its own bucket) for the last distance bucket, and 255 alone for the unreachable bucket.
    """
    if t > LAST_DISTANCE_BUCKET:  # the unreachable bucket
        sel = dist == 255
    elif LOG_DISTANCE == 0 or t <= LOG_DISTANCE:  # exact distances
        if t < LAST_DISTANCE_BUCKET:
            sel = dist == t
        elif UNREACHABLE_BUCKET:
            sel = (dist >= t) & (dist != 255)
        else:
            sel = dist >= t
    else:  # log-spaced: (E 2^(k-1), E 2^k] with k = t - E
        above = dist > LOG_DISTANCE * (1 << (t - LOG_DISTANCE - 1))
        if t < LAST_DISTANCE_BUCKET:
            sel = above & (dist <= LOG_DISTANCE * (1 << (t - LOG_DISTANCE)))
        elif UNREACHABLE_BUCKET:
            sel = above & (dist != 255)
        else:
            sel = above
    return sel


@triton.jit
def opaque_int32(x, like, INTERPRETED: tl.constexpr):
    """``x`` (an int32 tile) materialised in ``like``'s layout, in registers the compiler cannot fold back.

    A tile compared many times (once per bucket) is otherwise re-extracted from its packed uint8 source, or
    its mask converted between layouts, at every compare: an opaque ``mov`` (with ``like`` as a dummy operand
    fixing the layout) keeps one copy. The interpreter has no inline assembly; there it is the identity.
    """
    if INTERPRETED:
        result = x
    else:
        result = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [x, like], dtype=tl.int32, is_pure=True,
                                           pack=1)
    return result


@triton.jit
def opaque_f32(x, INTERPRETED: tl.constexpr):
    """``x`` (an fp32 tile) through an opaque ``mov`` that Triton's layout passes do not look through.

    Triton 3.6 picks the ``kWidth`` of a dot's register operands (mma.sync) from the narrowest load in the
    operands' backward slice: a product of P (or dS) whose bias was gathered by a uint8 distance gets the
    8-bit ``kWidth = 4``, which turns the accumulator-to-operand conversion into shuffles and selects and
    every ``ldmatrix.trans`` operand into register moves. A non-pure inline ``mov`` ends the slice (ptxas
    drops the move). The interpreter has no inline assembly; there it is the identity.
    """
    if INTERPRETED:
        result = x
    else:
        result = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=False,
                                           pack=1)
    return result


@triton.jit
def lut_bias(lut_ptr, dist, OPAQUE_BIAS: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 tile ``lut[dist]``: the bias of each pair, gathered from a 256-entry LUT at its uint8 distance.

    ``OPAQUE_BIAS`` (the launchers set it on GPUs whose products lower to ``mma.sync``: sm_80 and the small
    family) passes the gathered tile through :func:`opaque_f32`, so that the products of P and dS, which carry
    the bias, get 16-bit operand layouts instead of the uint8 distance's.
    """
    bias = tl.load(lut_ptr + dist.to(tl.int32))
    if OPAQUE_BIAS:
        bias = opaque_f32(bias, INTERPRETED)
    return bias


@triton.jit
def position_bias(pos_row, offset, reach):
    """fp32 tile: T5's relative-position term of pairs at key-minus-query ``offset`` (int32), gathered from one
    head's log2-domain LUT ``[2 * reach + 1]`` (:func:`~syntaxkernels.ops.bias_attention._host.position_lut`) at
    ``clamp(offset, -reach, reach) + reach``: no ``[N, N]`` tensor, four integer operations and a cached load a
    pair."""
    return tl.load(pos_row + (tl.minimum(tl.maximum(offset, -reach), reach) + reach))


@triton.jit
def opaque_offsets(offs, INTERPRETED: tl.constexpr):
    """``offs`` (an int32 vector) through a non-pure ``mov``: a value the compiler cannot hoist out of the loop it
    is formed in. The short-row kernels form each head's :func:`position_bias` index tile from it inside their head
    loop: hoisted, that loop-invariant tile would hold 32 more registers a thread across the loop (they sit at the
    255-register limit). The interpreter has no inline assembly; there it is the identity."""
    if INTERPRETED:
        result = offs
    else:
        result = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [offs], dtype=tl.int32, is_pure=False,
                                           pack=1)
    return result


@triton.jit
def build_lut(TABLE, SCALE, BUCKETS, lut_row, table_row, window, HAS_WINDOW: tl.constexpr):
    """Write one row of the bias LUT the kernels gather from: ``lut[d] = c * table[bucket(d)] * log2(e)`` for the 256
    uint8 distances (``-inf`` past ``window`` when HAS_WINDOW), then a barrier so that every thread of the program
    reads what the others wrote.

    The forward kernels call it first (``BUILD_LUT``): no separate launch builds the LUT. Every program of a call
    writes the same values to the same row (a benign race), and reads it back only after its own writes; the
    backward reads the row the forward wrote. ``table_row``: the table row's start (``TABLE + h * T`` per head);
    ``BUCKETS``: int32 ``[256]`` (``BucketSpec.lut()``); ``SCALE``: one element (the strength c). The same values
    as the host's ``bias_lut``: ``table * (c * log2(e))`` in fp32.
    """
    d = tl.arange(0, 256)
    bucket = tl.load(BUCKETS + d)
    value = tl.load(table_row + bucket).to(tl.float32) * (tl.load(SCALE).to(tl.float32) * 1.4426950408889634)
    if HAS_WINDOW:
        value = tl.where(d > window, float("-inf"), value)
    tl.store(lut_row + d, value)
    tl.debug_barrier()


@triton.jit
def build_position_lut(pos_row, table_row, PBUCKETS, width, POS_WIDTH: tl.constexpr):
    """Write one head's row of T5's relative-position LUT the kernels gather from (:func:`position_bias`):
    ``pos_row[r] = table_row[PBUCKETS[r]] * log2(e)`` for the ``width = 2 * reach + 1`` clamped offsets (POS_WIDTH:
    a power of two at least ``width``), then a barrier so that every thread of the program reads what the others
    wrote. The forward kernels call it first for each head they walk (as :func:`build_lut`): no aten gather and
    product a layer. ``PBUCKETS``: int ``[width]`` (``RelativePositionSpec.lut()``); ``table_row``: the head's row
    of the ``[H, P]`` position table (any float dtype). The same values as the host's ``position_lut``."""
    r = tl.arange(0, POS_WIDTH)
    inside = r < width
    bucket = tl.load(PBUCKETS + r, mask=inside, other=0)
    value = tl.load(table_row + bucket, mask=inside, other=0.0).to(tl.float32) * 1.4426950408889634
    tl.store(pos_row + r, value, mask=inside)
    tl.debug_barrier()


PHILOX_ROUNDS = tl.constexpr(7)  # reference.PHILOX_ROUNDS


@triton.jit
def dropout_keep(seed, threshold, bh, offs_m, n_start, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """bool ``[BLOCK_M, BLOCK_N]``: the attention-dropout keep mask (:func:`syntaxkernels.reference.dropout_keep`)
    of query rows ``offs_m`` and keys ``n_start + arange(BLOCK_N)`` (positions in the sequence; ``n_start`` a
    multiple of 4) of row key ``bh = item * heads + head``: one Philox call per four keys, its four words
    interleaved along the keys."""
    groups = (n_start // 4 + tl.arange(0, BLOCK_N // 4)).to(tl.uint32)
    zero = tl.zeros([BLOCK_M, BLOCK_N // 4], dtype=tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, groups[None, :] + zero, offs_m.to(tl.uint32)[:, None] + zero,
                               bh.to(tl.uint32) + zero, zero, PHILOX_ROUNDS)
    words = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_M, BLOCK_N])  # (join adds a last axis)
    return words >= threshold.to(tl.uint32)


@triton.jit
def dropout_stream_seed(seed, stream):
    """:func:`syntaxkernels.reference.stream_seed` on the device: ``seed + stream * 0x9E3779B97F4A7C15`` in wrapping
    int64 arithmetic (the bits of the uint64 sum), for kernels that run several attentions (streams) per call."""
    return seed.to(tl.int64) + stream.to(tl.int64) * -7046029254386353131  # (0x9E3779B97F4A7C15 - 2^64)


@triton.jit
def dropout_keep_pairs(seed, threshold, bh, rows, cols):
    """bool: the keep mask of the pairs ``(rows, cols)`` (int tensors of one shape, positions in the sequence; ``bh``
    a scalar or a tensor of that shape) -- :func:`dropout_keep` for pairs in no tile order: one Philox call per
    pair, the word of lane ``cols % 4`` kept."""
    zero = (rows * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, (cols // 4).to(tl.uint32) + zero, rows.to(tl.uint32) + zero,
                               bh.to(tl.uint32) + zero, zero, PHILOX_ROUNDS)
    lane = cols % 4
    words = tl.where(lane == 0, r0, tl.where(lane == 1, r1, tl.where(lane == 2, r2, r3)))
    return words >= threshold.to(tl.uint32)


# ---------------------------------------------------------------------------------------------------------
# Host helpers
# ---------------------------------------------------------------------------------------------------------

_LAUNCH_HOOK = None


def set_launch_hook(hook):
    """Route every :func:`launch` to ``hook(kernel, grid, args, kwargs)`` instead (None restores launching).

    Used by :mod:`syntaxkernels.tools.inspection`, which compiles each launch for a GPU this machine lacks. Returns
    the previous hook.
    """
    global _LAUNCH_HOOK
    previous, _LAUNCH_HOOK = _LAUNCH_HOOK, hook
    return previous


def launches_on(tensor) -> bool:
    """Whether :func:`launch` runs (or captures) kernels for ``tensor``: a CUDA tensor, the interpreter, or a
    launch hook installed (the inspection report compiling launches for a GPU this machine lacks). Else the
    caller computes in PyTorch (e.g. the block metadata of CPU tensors)."""
    return (tensor.device.type != "cpu" or interpreting() or _LAUNCH_HOOK is not None
            or _DIRECT_LAUNCH_OVERRIDE is not None)


class KernelDoesNotFit(RuntimeError):
    """A kernel's config asks for more shared memory (or registers) than this GPU has: Triton's
    ``OutOfResources`` at the first launch, with what to do about it. ``backend="auto"`` then runs the reference."""


def launch(kernel, grid, *args, **kwargs):
    """Launch a ``@triton.jit`` kernel from inside a ``torch.library.triton_op``.

    Goes through ``torch.library.wrap_triton`` so ``torch.compile`` sees the kernel. Under
    ``TRITON_INTERPRET=1`` the kernel is a Python function that cannot run on FakeTensors; when the op is
    being traced for shapes only (fake tensors among the arguments) the launch is skipped, which is what the
    fake implementation needs (outputs are allocated by the caller). On a GPU other than the current one the
    launch runs under that device (Triton itself launches on the current device). A config that does not fit
    the GPU raises :class:`KernelDoesNotFit` (never Triton's bare error). Returns what :func:`_direct_launch`
    launched with (for :func:`launch_with_entry`), or None.
    """
    recorder = getattr(_RECORDING, "recorder", None)
    if recorder is not None:  # a launcher being recorded (ops._replay): note the launch, then launch
        recorder.launch(kernel, grid, args, kwargs)
        recorder.paused = True
    try:
        return _launch(kernel, grid, args, kwargs)
    except OutOfResources as error:
        raise KernelDoesNotFit(
            f"{getattr(getattr(kernel, 'fn', kernel), '__name__', kernel)} does not fit this GPU "
            f"(sm_{current_arch()}, config family '{arch_family()}'): {error}. Every family's configs are compiled "
            "against its limits (python -m syntaxkernels inspect): please report this GPU; backend='reference' "
            "runs meanwhile") from error
    finally:
        if recorder is not None:
            recorder.paused = False



def launch_with_entry(kernel, grid, args, kwargs, entry):
    """:func:`launch` for a replayed launch (:mod:`._replay`): with ``entry``, what an earlier launch of the same
    program step returned (the same kernel, constexprs and specialisation: the program's key guarantees it), straight
    to Triton's C launcher; else through :func:`launch`. Returns the entry for the next replay (None when the launch
    did not take the direct path: the interpreter, a hook, another device)."""
    if entry is not None and _LAUNCH_HOOK is None:
        compiled, trailing, slots, device = entry
        active = _driver.active
        if device == active.get_current_device() and not _profiler_hooks():
            _run_compiled(compiled, trailing, slots, grid, args, kwargs, active, device)
            return entry
    return launch(kernel, grid, *args, **kwargs)


def _launch(kernel, grid, args, kwargs):
    import torch

    global _PLAIN, _COMPILING
    if not _PLAIN:
        _PLAIN = (torch.Tensor, torch.nn.Parameter)
        _COMPILING = torch.compiler.is_compiling

    if _LAUNCH_HOOK is not None:
        _LAUNCH_HOOK(kernel, grid, args, kwargs)
        return
    if interpreting():
        from torch._subclasses.fake_tensor import is_fake

        if any(isinstance(a, torch.Tensor) and is_fake(a) for a in list(args) + list(kwargs.values())):
            return
        kernel[grid](*args, **kwargs)
        return
    if _COMPILING():  # Dynamo traces the launch (a Triton kernel in the graph)
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)
        return
    key, device = _specialisation(args)
    if device is not None and device.type == "cuda" and device.index not in (None, torch.cuda.current_device()):
        with torch.cuda.device(device):  # Triton launches on the current device, not the tensors' one
            _launch_on_current_device(kernel, grid, args, kwargs, key)
        return None
    return _launch_on_current_device(kernel, grid, args, kwargs, key)


#: Tensor types a launch passes to Triton as they are (fake and functional tensors of a traced op go through
#: ``wrap_triton``) and ``torch.compiler.is_compiling``; filled on first use (torch is imported lazily here).
_PLAIN: tuple = ()
_COMPILING = None


def _specialisation(args):
    """``(key, device)``: what a Triton launch specialises the positional arguments on, in one pass: a tensor's
    dtype and 16-byte alignment, an integer's value (finer than Triton's ``== 1`` / ``% 16`` / 64-bit classes, so
    never coarser), a float's type, anything else as it is; and the first tensor's device. The key is None when a
    tensor is not a plain one (a fake or functional tensor of a traced op)."""
    key = []
    device = None
    plain = _PLAIN
    for a in args:
        kind = a.__class__
        if kind is int:  # (large ones by Triton's classes: a seed changes every call)
            key.append(a if -_SMALL < a < _SMALL else _int_class(a))
        elif kind is bool or a is None:
            key.append(a)
        elif kind is float:
            key.append(float)
        elif kind in plain:
            if device is None:
                device = a.device
            key.append((a.dtype, a.data_ptr() & 15))
        elif hasattr(a, "data_ptr"):
            return None, a.device if device is None else device
        else:
            key.append(a)
    return tuple(key), device


#: Integers below this magnitude key a specialisation by value; larger ones by :func:`_int_class`.
_SMALL = 1 << 20


def _int_class(value: int) -> tuple:
    """What Triton specialises a runtime integer argument on, and finer: ``== 1``, divisible by 16, and its type
    (int32, int64, uint64). Large integers (a dropout seed, different every call) key a launch by this class, so
    that every seed reuses one compiled entry instead of adding one."""
    return ("int", value == 1, value % 16 == 0, -(1 << 31) <= value < (1 << 31), value >= (1 << 63))


def _launch_on_current_device(kernel, grid, args, kwargs, key):
    import torch

    if key is None:  # a torch.library op being traced (fake or functional tensors): through wrap_triton
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)
        return None
    return _direct_launch(kernel, grid, args, kwargs, key)


#: ``(kernel, device, specialisation key, constexprs and options) -> (compiled kernel, the values of the kernel's
#: parameters after the positional ones)``: what :func:`_direct_launch` launches without Triton's dispatch.
_COMPILED: dict = {}
#: Replaces the final launch of :func:`_direct_launch` (and compiles without launching on a miss): the host-cost
#: report times the whole host path up to the driver call with it (:mod:`syntaxkernels.tools.host`).
_DIRECT_LAUNCH_OVERRIDE = None


def _direct_launch(kernel, grid, args, kwargs, key):
    """Launch a compiled kernel through Triton's C launcher, skipping the JIT's Python dispatch (argument binding,
    specialisation, cache lookup: 15-50 microseconds a launch on the host) after the first launch of each
    specialisation, which goes through ``JITFunction.run`` and compiles. The key holds everything the JIT
    specialises on (:func:`_specialisation` of the positional arguments, the constexprs and options), so a kernel is
    reused only where the JIT would pick it too. Launch hooks (profilers) take the JIT's own path."""
    if _profiler_hooks():
        kernel[grid](*args, **kwargs)
        return
    active = _driver.active
    device = active.get_current_device()
    full_key = (kernel, device, key, _keyword_key(kernel, kwargs))
    entry = _COMPILED.get(full_key)
    if entry is None:
        compiled = kernel.run(*args, grid=grid, warmup=_DIRECT_LAUNCH_OVERRIDE is not None, **kwargs)
        _COMPILED[full_key] = (compiled, *_trailing_arguments(kernel, len(args), kwargs))
        return
    compiled, trailing, slots = entry
    _run_compiled(compiled, trailing, slots, grid, args, kwargs, active, device)
    return compiled, trailing, slots, device


def _run_compiled(compiled, trailing, slots, grid, args, kwargs, active, device):
    """Triton's C launcher of ``compiled`` on ``args`` and the trailing parameters (``slots``: the tensors and
    runtime values passed by name, taken from ``kwargs``)."""
    if slots:  # passed by name: this call's, at their places (the entry keeps no tensor alive)
        trailing = list(trailing)
        for index, name in slots:
            trailing[index] = kwargs[name]
        trailing = tuple(trailing)
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    if _DIRECT_LAUNCH_OVERRIDE is not None:
        _DIRECT_LAUNCH_OVERRIDE(compiled, grid[0], grid_1, grid_2, tuple(args) + trailing)
        return
    stream = active.get_current_stream(device)
    compiled.run(grid[0], grid_1, grid_2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                 *args, *trailing)


def _profiler_hooks() -> bool:
    """Whether Triton's launch enter or exit hook is set (a profiler): launches then take the JIT's own path."""
    runtime = _knobs.runtime
    return _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: a chain of hooks with any in it (Triton 3.6 keeps an empty chain), or any
    other callable."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


def _keyword_key(kernel, kwargs) -> tuple:
    """What a launch specialises on in its keyword arguments: each value as it is (a constexpr), a large integer of a
    runtime parameter by :func:`_int_class` (as :func:`_specialisation` takes the positional ones), a tensor as its
    dtype and 16-byte alignment, never the tensor itself (a key holding it would never match the next call's tensor,
    and would keep it alive)."""
    plain = _PLAIN
    constexprs = _constexpr_names(kernel)
    key = []
    for name, value in kwargs.items():
        kind = value.__class__
        if kind in plain:
            value = (value.dtype, value.data_ptr() & 15)
        elif kind is int and not -_SMALL < value < _SMALL and name not in constexprs:
            value = _int_class(value)
        key.append((name, value))
    return tuple(key)


def _constexpr_names(kernel) -> frozenset:
    """The names of ``kernel``'s constexpr parameters (remembered per kernel)."""
    names = _CONSTEXPR_NAMES.get(kernel)
    if names is None:
        names = _CONSTEXPR_NAMES[kernel] = frozenset(p.name for p in kernel.params if p.is_constexpr)
    return names


_CONSTEXPR_NAMES: dict = {}


def _trailing_arguments(kernel, positional: int, kwargs) -> tuple:
    """``(values, slots)``: the values of the kernel's parameters after the first ``positional`` ones, in signature
    order (from ``kwargs``, else their defaults): what a compiled kernel's launcher takes after the positional
    arguments (the JIT passes every bound argument, constexprs included), with None where a tensor or a runtime
    (not constexpr) parameter is passed by name; ``slots``: ``(index, name)`` of those, which each launch fills with
    its own values (a seed differs every call). The rest is fixed for a specialisation: its key holds ``kwargs``
    (:func:`_keyword_key`)."""
    if any(p.is_constexpr for p in kernel.params[:positional]):  # (the keys take positional integers as runtime ones)
        raise TypeError(f"{kernel.fn.__name__}: constexpr parameters must be passed by name")
    params = list(kernel.signature.parameters.values())[positional:]
    constexprs = _constexpr_names(kernel)
    values, slots = [], []
    for index, p in enumerate(params):
        value = kwargs[p.name] if p.name in kwargs else p.default
        if value.__class__ in _PLAIN or (p.name in kwargs and p.name not in constexprs):
            slots.append((index, p.name))
            value = None
        values.append(value)
    return tuple(values), tuple(slots)


def launch_grid(num_blocks: int, B: int, H: int, R: int = 1):
    """The 1-D launch grid ``(num_blocks * B * H * R,)`` that :func:`program_ids` (``R = 1``) and
    :func:`program_ids_r` decode: any batch and head count launches (CUDA caps the second and third grid axes
    at 65535, which 2048 sentences x 32 heads would exceed); past 2^31 - 1 programs it says why."""
    total = num_blocks * B * H * R
    if total >= 2 ** 31:
        raise ValueError(f"{B} x {H} heads x {R} x {num_blocks} blocks = {total} programs exceeds one grid axis "
                         "(2^31 - 1); split the batch")
    return (total,)


def head_block(dim: int) -> int:
    """The padded head dim of the kernels: a power of two >= 32 (plain integer arithmetic: Triton's
    ``next_power_of_2`` is a ``constexpr_function`` whose every host call costs microseconds)."""
    return max(32, 1 << (int(dim) - 1).bit_length()) if dim > 1 else 32


def dot_precision(dtype) -> str:
    """The :func:`mma` mode for inputs of ``dtype``: exact fp32 products for fp32 (TF32 would miss the fp32
    tolerance), tensor cores for half types, bf16 widened under the interpreter (see :func:`mma`)."""
    import torch

    if dtype == torch.float32:
        return "ieee"
    if dtype == torch.bfloat16 and interpreting():
        return "upcast"
    return "tf32"


#: Dynamic shared memory one block may use, in bytes, per compute capability (``sm_XY`` = XY): the limit every
#: config of a family must fit (checked by the inspection report, compiled as launched).
SHARED_LIMIT = {75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
                110: 232448, 120: 101376, 121: 101376}

#: The config family of each compute capability: "sm90" (~227 KB of shared memory a block: Hopper, datacenter
#: Blackwell), "sm80" (~163 KB: A100, Orin), "small" (~99 KB: RTX 30/40/50, L4, L40S, RTX PRO Blackwell);
#: compute capabilities not listed (sm_75 and older: 64 KB, no bf16 tensor cores) have no Triton configs.
ARCH_FAMILY = {80: "sm80", 87: "sm80", 86: "small", 89: "small", 120: "small", 121: "small", 90: "sm90",
               100: "sm90", 103: "sm90", 110: "sm90"}


#: Under ``TRITON_INTERPRET=1``: the compute capability whose configs (tiles, warps, stages) the kernels run
#: with (tests set it to run every family's tiles on the CPU; :func:`interpret_as`). 90 by default.
_INTERPRETED_ARCH = 90


def interpret_as(arch: int) -> int:
    """Run the interpreted kernels with the configs of ``sm_<arch>`` from now on; returns the previous arch.
    Only meaningful under ``TRITON_INTERPRET=1`` (a real GPU always takes its own configs)."""
    global _INTERPRETED_ARCH
    previous, _INTERPRETED_ARCH = _INTERPRETED_ARCH, int(arch)
    return previous


def current_arch() -> int:
    """The compute capability Triton compiles for (``major * 10 + minor``); under the interpreter the one of
    :func:`interpret_as` (90 unless a test chose another)."""
    if interpreting():
        return _INTERPRETED_ARCH
    active = _driver.active
    device = active.get_current_device()
    key = (id(active), device)
    arch = _ARCHS.get(key)
    if arch is None:  # (the driver's target per device: asked once, the launch path asks every call)
        target = active.get_current_target()
        arch = _ARCHS[key] = target.arch if isinstance(target.arch, int) else 0
    return arch


_ARCHS: dict = {}


#: Streaming multiprocessors of the commonest GPU of each compute capability: the count the grids are sized for
#: where no GPU can be asked (the interpreter, the inspection's compiled-as-launched model): A100 108, A40/A10
#: class 84, RTX 4090 128, H100/H200 132, B200 148, RTX 5090 170. A real GPU gives its own count.
MULTIPROCESSORS = {80: 108, 86: 84, 87: 16, 89: 128, 90: 132, 100: 148, 103: 148, 110: 148, 120: 170, 121: 48}

#: Tests may set the count the grids are sized for (None: the GPU's, or :data:`MULTIPROCESSORS`).
_MULTIPROCESSORS_OVERRIDE = None

_SM_COUNTS: dict = {}


def multiprocessors(device=None) -> int:
    """The streaming multiprocessors the grids of a launch on ``device`` should fill: the CUDA device's own count
    (asked once per device), else that of the GPU Triton compiles for (:data:`MULTIPROCESSORS` at
    :func:`current_arch`; 132 for an unlisted one)."""
    if _MULTIPROCESSORS_OVERRIDE is not None:
        return _MULTIPROCESSORS_OVERRIDE
    if device is not None and getattr(device, "type", None) == "cuda":
        index = device.index if device.index is not None else -1
        count = _SM_COUNTS.get(index)
        if count is None:
            import torch

            props = torch.cuda.get_device_properties(device if index >= 0 else torch.cuda.current_device())
            count = _SM_COUNTS[index] = int(props.multi_processor_count)
        return count
    return MULTIPROCESSORS.get(current_arch(), 132)


def arch_family(arch: int = None) -> str:
    """The config family of ``arch`` (default: the GPU Triton compiles for, :func:`current_arch`):
    see :data:`ARCH_FAMILY`. An unlisted newer GPU takes the family of the listed one below it with the same
    major version, else "small" (the configs that fit any GPU of 99 KB or more); an older one than sm_80 has
    none ("unsupported": ``ops._dispatch.triton_unsupported`` says why, and the ops run the reference)."""
    arch = current_arch() if arch is None else arch
    if arch in ARCH_FAMILY:
        return ARCH_FAMILY[arch]
    same_major = [a for a in ARCH_FAMILY if a // 10 == arch // 10 and a < arch]
    if same_major:
        return ARCH_FAMILY[max(same_major)]
    return "small" if arch >= 80 else "unsupported"
