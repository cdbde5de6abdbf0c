"""The launch configuration of the edge-list Triton kernels (:func:`edge_config`): tile sides, threads per row and
warps by dtype and head dim, a rule rather than a table (every dtype and head dim takes it)."""
import torch

__all__ = ["edge_config", "ROW_ELEMENTS"]

#: Head-dim elements of one row each thread of the edge kernels holds (``edge_config``).
ROW_ELEMENTS = 32


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def edge_config(dtype: torch.dtype, head_dim: int, row_elements: int = ROW_ELEMENTS) -> dict:
    """Launch config of the Triton kernels for the larger of the q/k and v head dims.

    ``BLOCK_D``: the padded head dim (a power of two >= 16). ``BLOCK_E``: rows (work items) per program of dQ and
    dK/dV = edge slots per main-loop iteration: 64, 32 for fp32 at 64 and for every dtype at 128.
    ``VEC``: elements of a 16-byte vector; ``TPR``: threads per row, so that each thread holds ``row_elements``
    elements of one row (the row tiles of :func:`_cols`; fewer threads per row repeat each row's scalar work,
    index math and online softmax, fewer times); ``num_warps``: one row piece per thread (dK/dV: it holds k, v,
    dk and dv rows, and spills with wider pieces). The forward and dQ: ``FWD_TPR`` / ``DQ_TPR`` threads per
    row, half of ``TPR`` for half types (a thread holds 64 elements of q and of the accumulator, about 220
    registers at D = 64 and 128 on sm_80/sm_90, without spills; the same rows in flight per SM as with twice
    the threads at half the registers); fp32 keeps ``TPR`` (its fp32 k and v rows would not fit). The forward
    runs ``FWD_BLOCK_E = 32 // FWD_TPR`` rows per program, one warp, so that its lazy-softmax test (a max over
    the block's rows) stays within a warp: no shared memory or barrier per iteration.
    """
    block_d = max(16, _next_power_of_2(head_dim))
    half = dtype in (torch.float16, torch.bfloat16)
    block_e = 32 if block_d >= 128 or (block_d >= 64 and not half) else 64
    vec = 8 if half else 4
    tpr = max(1, min(32, block_d // row_elements))
    wide = max(1, tpr // 2) if half else tpr
    return dict(BLOCK_D=block_d, BLOCK_E=block_e, TPR=tpr, VEC=vec, num_warps=max(1, block_e * tpr // 32),
                FWD_TPR=wide, FWD_BLOCK_E=32 // wide, DQ_TPR=wide)
