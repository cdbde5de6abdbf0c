"""Edge-list attention: per (batch b, head h, relation r, query row i) a softmax over the keys of the row's list.

``out[b, r, h, i] = sum_j p_j v[b, h, j]`` with ``p = softmax_j(scale * q[b, h, i] . k[b, h, j])`` over the keys
j of row (b, i, r) of an :class:`~syntaxkernels.trees.batch.EdgeLists` (CSR, int32); an empty row outputs 0
and gets zero gradients. The work is O(E * H * D) for E listed pairs: this is the O(M * D * E) path of the
Syntax-BERT relation masks (a ``child_d`` row holds at most one key, so its output is that key's value row;
all ``parent_d`` rows together hold at most N keys; ``sibling_d`` rows a few in real trees) and of the
syntax GAT's tree window. No ``[.., N, N]`` tensor exists, forward or backward.

Layers (one file, as every fused op):

- Triton kernels (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``): ``_edge_fwd_kernel`` (one program per
  ``BLOCK_E`` query rows of one (b, h, r); its main loop takes one edge per row per iteration, ``BLOCK_E``
  edge slots, with an online softmax), ``_edge_bwd_delta_kernel`` (``delta = rowsum(dO * O)``),
  ``_edge_bwd_dq_kernel`` (``BLOCK_E`` query rows of one (b, h), walking every relation's edges of each row
  at once) and ``_edge_bwd_dkdv_kernel`` (``BLOCK_E`` key rows, walking the transposed lists). Each gradient
  row is written by one program: no atomics, deterministic.
- CPU kernels in C++ (``csrc/edge_attention.cpp``: ATen, ``at::parallel_for``, vectorised over D,
  deterministic), called through ``syntaxkernels._C``.
- ``torch.library`` ops: ``syntaxkernels::edge_attention_fwd`` / ``_bwd`` (Triton launchers, ``triton_op``)
  and ``syntaxkernels::edge_attention_cpu_fwd`` / ``_cpu_bwd`` (C++), each with a fake implementation, plus
  ``syntaxkernels::edge_attention_cpu_fwd_into`` (the C++ forward writing into a slice of a larger output).
- ``_EdgeAttention`` (autograd.Function) and the public :func:`edge_list_attention`; :func:`syntax_window_attention`
  (the GAT's windowed attention) on top of it.

The row logsumexp saved for the backward is base 2 on the Triton path and natural on the C++ path (each pair
of ops reads its own).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .. import _ext
from .. import _validation as V
from .. import reference
from ..trees.batch import EdgeLists, TreeBatch, python_edge_lists
from ._dispatch import kernels_or_reference, resolve_backend, triton_status

__all__ = ["edge_list_attention", "syntax_window_attention", "edge_config", "edge_attention_forward",
           "edge_attention_backward", "edge_attention_cpu_forward", "edge_attention_cpu_forward_into",
           "edge_attention_cpu_backward", "resolve_edge_backend", "EDGE_DENSITY_LIMIT"]

# On CUDA, the GAT's window attention runs on the edge lists when they are already built and hold at most this
# fraction of the B * N * N pairs; denser windows take the fused dense kernel (tensor cores, block skipping).
# An estimate (an edge costs ~10x a score element of a dense tensor-core tile), to be measured on a GPU.
EDGE_DENSITY_LIMIT = 1.0 / 16.0

_HAS_TRITON = triton_status() == "ok"


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def edge_config(dtype: torch.dtype, head_dim: int) -> dict:
    """Launch config of the Triton kernels for the larger of the q/k and v head dims.

    ``BLOCK_D``: the padded head dim (a power of two >= 16). ``BLOCK_E``: rows per program = edge slots per
    main-loop iteration, chosen so that a ``[BLOCK_E, BLOCK_D]`` fp32 tile holds 16 elements per thread: 4 warps
    at ``BLOCK_D = 32`` and for fp32 at 64; 8 warps at 128 (4 warps over 16-row tiles compile to a divergent slow
    path) and for half types at 64 (4 warps over 32 rows spill 8 bytes on sm_90, while fp32 spills with 8).
    Measured by compiling for sm_80/sm_90 as launched (:mod:`syntaxkernels.inspection`): no spills for bf16,
    fp16, fp32 and D = 32, 64, 128.
    """
    block_d = max(16, _next_power_of_2(head_dim))
    half = dtype in (torch.float16, torch.bfloat16)
    num_warps = 8 if block_d >= 128 or (block_d >= 64 and half) else 4
    return dict(BLOCK_D=block_d, BLOCK_E=max(16, min(64, 16 * 32 * num_warps // block_d)), num_warps=num_warps)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


# --------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------

if _HAS_TRITON:
    import triton
    import triton.language as tl

    from ._primitives import LOG2E, launch, launch_grid, program_ids, program_ids_r

    @triton.jit
    def _gather_rows(base, rows, stride_n, offs, n_cols, live, EVEN: tl.constexpr):
        """fp32 ``[E, C]`` rows ``base[rows[e] * stride_n + offs]`` (last dim contiguous); 0 where not ``live``."""
        ptrs = base + rows[:, None] * stride_n + offs[None, :]
        if EVEN:
            tile = tl.load(ptrs, mask=live[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=live[:, None] & (offs[None, :] < n_cols), other=0.0)
        return tile.to(tl.float32)

    @triton.jit
    def _token_edges(PTR, b, tokens, N, R):
        """The edges of every relation of ``tokens`` (consecutive in the CSR ``PTR``: ``[B * N * R + 1]``):
        ``(ok, first, count, longest)``, ``ok`` = token < N, the span ``[first, first + count)`` per token, and the
        longest count of the block."""
        ok = tokens < N
        first = tl.load(PTR + (b * N + tokens) * R, mask=ok, other=0)
        count = tl.load(PTR + (b * N + tokens) * R + R, mask=ok, other=0) - first
        return ok, first, count, tl.max(count, axis=0)

    @triton.jit
    def _edge_fwd_kernel(
        Q, K, V, ROW_PTR, COL, OUT, LSE,
        stride_qb, stride_qh, stride_qn,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_ob, stride_or, stride_oh, stride_on,
        H, N, R, D, DV, qk_scale2,
        BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    ):
        """Forward of ``BLOCK_E`` query rows of one (batch, head, relation).

        Args:
            Q, K: ``[B, H, N, D]``; V: ``[B, H, N, DV]`` (last dim contiguous, other strides free).
            ROW_PTR: int32 ``[B * N * R + 1]``, COL: int32 ``[E]`` (rows (b, i, r)).
            OUT: ``[B, R, H, N, DV]`` (strided, last dim contiguous); LSE: fp32 ``[B, R, H, N]`` contiguous, the
                base-2 logsumexp of the row's scores (``qk_scale2 = scale * log2(e)``), +inf for an empty row.
        Grid: ``launch_grid(cdiv(N, BLOCK_E), B, H, R)`` (1-D). The main loop runs as long as the block's longest list; each
        iteration takes edge ``t`` of every row (``BLOCK_E`` edge slots): gather k and v rows, one dot, an
        online-softmax step.
        """
        block, bh, r, b, h = program_ids_r(tl.cdiv(N, BLOCK_E), H, R)
        rows = block * BLOCK_E + tl.arange(0, BLOCK_E)
        row_ok = rows < N
        list_rows = (b * N + rows) * R + r
        start = tl.load(ROW_PTR + list_rows, mask=row_ok, other=0)
        count = tl.load(ROW_PTR + list_rows + 1, mask=row_ok, other=0) - start
        longest = tl.max(count, axis=0)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = _gather_rows(Q + b * stride_qb + h * stride_qh, rows, stride_qn, offs_d, D, count > 0, EVEN_D)
        q = q * qk_scale2
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        run_max = tl.full([BLOCK_E], float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros([BLOCK_E], dtype=tl.float32)
        acc = tl.zeros([BLOCK_E, BLOCK_DV], dtype=tl.float32)
        for t in range(0, longest):
            live = t < count
            j = tl.load(COL + start + t, mask=live, other=0)
            k = _gather_rows(k_base, j, stride_kn, offs_d, D, live, EVEN_D)
            v = _gather_rows(v_base, j, stride_vn, offs_dv, DV, live, EVEN_DV)
            s = tl.where(live, tl.sum(q * k, axis=1), float("-inf"))
            new_max = tl.maximum(run_max, s)
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            alpha = tl.exp2(run_max - safe)
            p = tl.exp2(s - safe)
            acc = acc * alpha[:, None] + p[:, None] * v
            run_sum = run_sum * alpha + p
            run_max = new_max
        nonempty = run_sum > 0.0
        denom = tl.where(nonempty, run_sum, 1.0)
        out = acc * tl.where(nonempty, 1.0 / denom, 0.0)[:, None]
        out_ptrs = (OUT + b * stride_ob + r * stride_or + h * stride_oh + rows[:, None] * stride_on
                    + offs_dv[None, :])
        tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < DV))
        lse = tl.where(nonempty, run_max + tl.log2(denom), float("inf"))
        tl.store(LSE + ((b * R + r) * H + h) * N + rows, lse, mask=row_ok)

    @triton.jit
    def _edge_bwd_delta_kernel(
        OUT, DOUT, DELTA,
        stride_ob, stride_or, stride_oh, stride_on,
        stride_gb, stride_gr, stride_gh, stride_gn,
        H, N, R, DV,
        BLOCK_E: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):
        """``DELTA[b, r, h, i] = sum_d dO * O`` (fp32 ``[B, R, H, N]`` contiguous). Grid ``launch_grid(cdiv(N, BLOCK_E),
        B, H, R)`` (1-D)."""
        block, bh, r, b, h = program_ids_r(tl.cdiv(N, BLOCK_E), H, R)
        rows = block * BLOCK_E + tl.arange(0, BLOCK_E)
        offs = tl.arange(0, BLOCK_DV)
        mask = (rows[:, None] < N) & (offs[None, :] < DV)
        o = tl.load(OUT + b * stride_ob + r * stride_or + h * stride_oh + rows[:, None] * stride_on + offs[None, :],
                    mask=mask, other=0.0).to(tl.float32)
        do = tl.load(DOUT + b * stride_gb + r * stride_gr + h * stride_gh + rows[:, None] * stride_gn
                     + offs[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DELTA + ((b * R + r) * H + h) * N + rows, tl.sum(o * do, axis=1), mask=rows < N)

    @triton.jit
    def _edge_bwd_dq_kernel(
        Q, K, V, DOUT, LSE, DELTA, ROW_PTR, COL, REL, DQ,
        stride_qb, stride_qh, stride_qn,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_gb, stride_gr, stride_gh, stride_gn,
        H, N, R, D, DV, qk_scale2, sm_scale,
        BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    ):
        """dq of ``BLOCK_E`` query rows of one (batch, head), summed over every relation.

        The R rows of a query are consecutive in the CSR, so one loop walks all the query's edges (each with its
        relation from REL): per edge, gather k_j, v_j and dO of (r, i); ``p = exp2(s - lse)``,
        ``ds = p (dO . v_j - delta)``, ``dq += ds k_j``. DQ: ``[B, H, N, D]`` contiguous. Grid
        ``launch_grid(cdiv(N, BLOCK_E), B, H)`` (1-D).
        """
        block, bh, b, h = program_ids(tl.cdiv(N, BLOCK_E), H)
        rows = block * BLOCK_E + tl.arange(0, BLOCK_E)
        row_ok, first, count, longest = _token_edges(ROW_PTR, b, rows, N, R)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = _gather_rows(Q + b * stride_qb + h * stride_qh, rows, stride_qn, offs_d, D, count > 0, EVEN_D)
        q = q * qk_scale2
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        do_base = DOUT + b * stride_gb + h * stride_gh
        stat_base = b * R * H * N + h * N + rows
        dq = tl.zeros([BLOCK_E, BLOCK_D], dtype=tl.float32)
        for t in range(0, longest):
            live = t < count
            j = tl.load(COL + first + t, mask=live, other=0)
            rel = tl.load(REL + first + t, mask=live, other=0)
            stat = stat_base + rel * (H * N)
            lse = tl.load(LSE + stat, mask=live, other=float("inf"))
            delta = tl.load(DELTA + stat, mask=live, other=0.0)
            k = _gather_rows(k_base, j, stride_kn, offs_d, D, live, EVEN_D)
            v = _gather_rows(v_base, j, stride_vn, offs_dv, DV, live, EVEN_DV)
            do = _gather_rows(do_base + rel.to(tl.int64)[:, None] * stride_gr, rows, stride_gn, offs_dv, DV, live,
                              EVEN_DV)
            p = tl.exp2(tl.sum(q * k, axis=1) - lse)
            ds = p * (tl.sum(do * v, axis=1) - delta)
            dq += ds[:, None] * k
        dq_ptrs = DQ + (bh.to(tl.int64) * N + rows[:, None]) * D + offs_d[None, :]
        tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))

    @triton.jit
    def _edge_bwd_dkdv_kernel(
        Q, K, V, DOUT, LSE, DELTA, T_PTR, T_COL, T_REL, DK, DV_OUT,
        stride_qb, stride_qh, stride_qn,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_gb, stride_gr, stride_gh, stride_gn,
        H, N, R, D, DV, qk_scale2, sm_scale,
        BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    ):
        """dk and dv of ``BLOCK_E`` key rows of one (batch, head), over the transposed lists (every relation).

        Per transposed edge (query i, relation r): gather q_i and dO of (r, i); ``p = exp2(s - lse)``,
        ``ds = p (dO . v_j - delta)``, ``dk += ds q_i``, ``dv += p dO``. DK ``[B, H, N, D]``, DV_OUT
        ``[B, H, N, DV]``, contiguous. Grid ``launch_grid(cdiv(N, BLOCK_E), B, H)`` (1-D).
        """
        block, bh, b, h = program_ids(tl.cdiv(N, BLOCK_E), H)
        keys = block * BLOCK_E + tl.arange(0, BLOCK_E)
        key_ok, first, count, longest = _token_edges(T_PTR, b, keys, N, R)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        k = _gather_rows(K + b * stride_kb + h * stride_kh, keys, stride_kn, offs_d, D, count > 0, EVEN_D)
        k = k * qk_scale2
        v = _gather_rows(V + b * stride_vb + h * stride_vh, keys, stride_vn, offs_dv, DV, count > 0, EVEN_DV)
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DOUT + b * stride_gb + h * stride_gh
        stat_base = b * R * H * N + h * N
        dk = tl.zeros([BLOCK_E, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_E, BLOCK_DV], dtype=tl.float32)
        for t in range(0, longest):
            live = t < count
            i = tl.load(T_COL + first + t, mask=live, other=0)
            rel = tl.load(T_REL + first + t, mask=live, other=0)
            stat = stat_base + rel * (H * N) + i
            lse = tl.load(LSE + stat, mask=live, other=float("inf"))
            delta = tl.load(DELTA + stat, mask=live, other=0.0)
            q = _gather_rows(q_base, i, stride_qn, offs_d, D, live, EVEN_D)
            do = _gather_rows(do_base + rel.to(tl.int64)[:, None] * stride_gr, i, stride_gn, offs_dv, DV, live,
                              EVEN_DV)
            p = tl.exp2(tl.sum(q * k, axis=1) - lse)
            ds = p * (tl.sum(do * v, axis=1) - delta)
            dk += ds[:, None] * q
            dv += p[:, None] * do
        out_rows = bh.to(tl.int64) * N + keys[:, None]
        tl.store(DK + out_rows * D + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_d[None, :] < D))
        tl.store(DV_OUT + out_rows * DV + offs_dv[None, :], dv.to(DV_OUT.dtype.element_ty),
                 mask=key_ok[:, None] & (offs_dv[None, :] < DV))

    # ----------------------------------------------------------------------------------------------------
    # Launchers (torch.library Triton ops)
    # ----------------------------------------------------------------------------------------------------

    def _tiles(q: torch.Tensor, v: torch.Tensor) -> dict:
        D, DV = q.shape[-1], v.shape[-1]
        cfg = edge_config(q.dtype, max(D, DV))
        block_d, block_dv = max(16, _next_power_of_2(D)), max(16, _next_power_of_2(DV))
        return dict(BLOCK_E=cfg["BLOCK_E"], BLOCK_D=block_d, BLOCK_DV=block_dv, EVEN_D=block_d == D,
                    EVEN_DV=block_dv == DV, num_warps=cfg["num_warps"])

    @torch.library.triton_op("syntaxkernels::edge_attention_fwd", mutates_args=())
    def edge_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_ptr: torch.Tensor,
                               col: torch.Tensor, num_relations: int,
                               scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        """Triton forward launcher: ``(out [B, R, H, N, Dv] in q's dtype, lse2 fp32 [B, R, H, N])``.

        Args:
            q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]`` (any strides; a non-contiguous last dim is copied).
            row_ptr: int32 ``[B * N * R + 1]``; col: int32 ``[E]`` (an :class:`EdgeLists`' rows).
            num_relations: R; scale: score scale.
        """
        B, H, N, D = q.shape
        DV = v.shape[-1]
        R = num_relations
        out = torch.empty((B, R, H, N, DV), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, R, H, N), dtype=torch.float32, device=q.device)
        if out.numel() == 0:
            lse.fill_(float("inf"))
            return out, lse
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        tiles = _tiles(q, v)
        launch(_edge_fwd_kernel, launch_grid(triton.cdiv(N, tiles["BLOCK_E"]), B, H, R),
               q, k, v, row_ptr, col, out, lse,
               q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), out.stride(3),
               H, N, R, D, DV, scale * LOG2E, **tiles)
        return out, lse

    @torch.library.triton_op("syntaxkernels::edge_attention_bwd", mutates_args=())
    def edge_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                out: torch.Tensor, lse: torch.Tensor, row_ptr: torch.Tensor, col: torch.Tensor,
                                rel: torch.Tensor, t_ptr: torch.Tensor, t_col: torch.Tensor, t_rel: torch.Tensor,
                                scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Triton backward launcher: ``(dq, dk [B, H, N, D], dv [B, H, N, Dv])`` in q's dtype.

        Args: as :func:`edge_attention_forward`, plus ``dout`` (like out, any strides), the forward's ``out`` and
        ``lse``, the relation of every edge ``rel`` and the transposed lists ``t_ptr``, ``t_col``, ``t_rel``.
        """
        B, H, N, D = q.shape
        DV = v.shape[-1]
        R = out.shape[1]
        dq = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
        dk = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
        dv = torch.empty((B, H, N, DV), dtype=q.dtype, device=q.device)
        if B * H * N == 0:
            return dq, dk, dv
        if R == 0 or D == 0 or DV == 0:
            return dq.zero_(), dk.zero_(), dv.zero_()
        q, k, v, out, dout = (_last_dim_contiguous(t) for t in (q, k, v, out, dout))
        tiles = _tiles(q, v)
        delta = torch.empty((B, R, H, N), dtype=torch.float32, device=q.device)
        launch(_edge_bwd_delta_kernel, launch_grid(triton.cdiv(N, 64), B, H, R),
               out, dout, delta, out.stride(0), out.stride(1), out.stride(2), out.stride(3),
               dout.stride(0), dout.stride(1), dout.stride(2), dout.stride(3), H, N, R, DV,
               BLOCK_E=64, BLOCK_DV=tiles["BLOCK_DV"], num_warps=4)
        strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                   v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2),
                   dout.stride(3))
        grid = launch_grid(triton.cdiv(N, tiles["BLOCK_E"]), B, H)
        launch(_edge_bwd_dq_kernel, grid, q, k, v, dout, lse, delta, row_ptr, col, rel, dq, *strides,
               H, N, R, D, DV, scale * LOG2E, scale, **tiles)
        launch(_edge_bwd_dkdv_kernel, grid, q, k, v, dout, lse, delta, t_ptr, t_col, t_rel, dk, dv, *strides,
               H, N, R, D, DV, scale * LOG2E, scale, **tiles)
        return dq, dk, dv
else:  # pragma: no cover - depends on the install
    edge_attention_forward = edge_attention_backward = None


# --------------------------------------------------------------------------------------------------------
# C++ (CPU) ops
# --------------------------------------------------------------------------------------------------------

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("syntaxkernels::edge_attention_cpu_fwd", mutates_args=(), device_types="cpu")
def edge_attention_cpu_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_ptr: torch.Tensor,
                               col: torch.Tensor, num_relations: int,
                               scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """C++ forward: ``(out [B, R, H, N, Dv] in q's dtype, lse [B, R, H, N])`` (natural log; float64 for
    float64 inputs, else float32). Arguments as :func:`edge_attention_forward`."""
    B, H, N, _ = q.shape
    out = torch.empty((B, num_relations, H, N, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((B, num_relations, H, N), dtype=_acc_dtype(q.dtype))
    _ext.load().edge_attention_forward(q, k, v, row_ptr, col, float(scale), out, lse)
    return out, lse


@edge_attention_cpu_forward.register_fake
def _(q, k, v, row_ptr, col, num_relations, scale):
    B, H, N, _ = q.shape
    return (q.new_empty((B, num_relations, H, N, v.shape[-1])),
            q.new_empty((B, num_relations, H, N), dtype=_acc_dtype(q.dtype)))


@torch.library.custom_op("syntaxkernels::edge_attention_cpu_fwd_into", mutates_args=("out", "lse"),
                         device_types="cpu")
def edge_attention_cpu_forward_into(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_ptr: torch.Tensor,
                                    col: torch.Tensor, scale: float, out: torch.Tensor, lse: torch.Tensor) -> None:
    """C++ forward writing into ``out`` (``[B, R, H, N, Dv]``, any strides with a contiguous last dim: e.g. the
    first R masks of a ``[B, M, H, N, Dv]`` output) and ``lse`` (contiguous ``[B, R, H, N]``, float64 for
    float64 inputs, else float32)."""
    _ext.load().edge_attention_forward(q, k, v, row_ptr, col, float(scale), out, lse)


@torch.library.custom_op("syntaxkernels::edge_attention_cpu_bwd", mutates_args=(), device_types="cpu")
def edge_attention_cpu_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                out: torch.Tensor, lse: torch.Tensor, row_ptr: torch.Tensor, col: torch.Tensor,
                                rel: torch.Tensor, t_ptr: torch.Tensor, t_col: torch.Tensor, t_rel: torch.Tensor,
                                scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """C++ backward: ``(dq, dk, dv)`` in q's dtype (contiguous). Arguments as :func:`edge_attention_backward`."""
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=q.dtype)
    dv = torch.empty(v.shape, dtype=q.dtype)
    _ext.load().edge_attention_backward(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel,
                                        float(scale), dq, dk, dv)
    return dq, dk, dv


@edge_attention_cpu_backward.register_fake
def _(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, scale):
    # Contiguous like the real op's outputs, whatever q, k, v's strides (the modules pass transposed views).
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape))


# --------------------------------------------------------------------------------------------------------
# Autograd and the public functions
# --------------------------------------------------------------------------------------------------------

class _EdgeAttention(torch.autograd.Function):
    """Autograd over the edge ops (Triton or C++): gradients for q, k, v (the lists get none)."""

    @staticmethod
    def forward(ctx, q, k, v, row_ptr, col, rel, t_ptr, t_col, t_rel, num_relations, scale, use_triton):
        if use_triton:
            out, lse = torch.ops.syntaxkernels.edge_attention_fwd(q, k, v, row_ptr, col, num_relations, scale)
        else:
            out, lse = torch.ops.syntaxkernels.edge_attention_cpu_fwd(q, k, v, row_ptr, col, num_relations, scale)
        ctx.save_for_backward(q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel)
        ctx.scale, ctx.use_triton = scale, use_triton
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel = ctx.saved_tensors
        op = torch.ops.syntaxkernels.edge_attention_bwd if ctx.use_triton else \
            torch.ops.syntaxkernels.edge_attention_cpu_bwd
        dq, dk, dv = op(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, ctx.scale)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None




def resolve_edge_backend(backend: str, q: torch.Tensor, v: torch.Tensor) -> str:
    """'cpp', 'triton' or 'reference' for an edge-list op on q's device and dtype.

    "auto": the C++ kernels on CPU tensors (when the extension is built), Triton on CUDA tensors (float16,
    bfloat16, float32, head dims up to _dispatch.MAX_HEAD_DIM), the reference otherwise. "triton": the Triton kernels (CPU
    tensors only under ``TRITON_INTERPRET=1``); raises ValueError for inputs they do not take.
    """
    chosen = resolve_backend(backend, q.device)
    if backend == "auto" and q.device.type == "cpu":
        return "cpp" if _ext.available() and hasattr(_ext.load(), "edge_attention_forward") else "reference"
    return kernels_or_reference(backend, chosen, q, v)


def _check_lists(lists: EdgeLists, q: torch.Tensor) -> None:
    if not isinstance(lists, EdgeLists):
        raise TypeError(f"lists must be an EdgeLists (TreeBatch.relation_lists / window_lists), got "
                        f"{type(lists).__name__}")
    B, _, N, _ = q.shape
    if (lists.batch_size, lists.max_len) != (B, N):
        raise ValueError(f"lists are for B = {lists.batch_size}, N = {lists.max_len} but q has B = {B}, N = {N}")
    if lists.device != q.device:
        raise ValueError(f"lists are on {lists.device} but q is on {q.device}")


def _reference_edge_attention(q, k, v, lists: EdgeLists, scale: float) -> torch.Tensor:
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = (q @ k.transpose(-1, -2)).to(acc) * scale
    allowed = lists.to_dense()
    return torch.stack([reference.masked_attention(scores, allowed[:, r, None], v)
                        for r in range(lists.num_relations)], dim=1)


def edge_list_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lists: EdgeLists, *,
                   scale: Optional[float] = None, backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention restricted to per-row key lists: one softmax per (batch, head, relation, query row).

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``; one float dtype and device.
        lists: an :class:`~syntaxkernels.trees.batch.EdgeLists` for B sequences of N tokens on q's device
            (``trees.relation_lists(masks)``, ``trees.window_lists(window)``).
        scale: score scale, default ``1 / sqrt(D)``.
        backend: "auto" (C++ on CPU tensors, Triton on CUDA tensors), "triton" or "reference" (dense masks
            from the lists: the specification, O(N^2)).
    Returns:
        ``out [B, R, H, N, Dv]`` in q's dtype (zero for an empty row, whose gradients are zero too) and
        ``nonempty bool [B, R, N]``.

    Equivalent PyTorch::

        allowed = lists.to_dense()                                   # [B, R, N, N]
        s = (q @ k.transpose(-1, -2)).float() * scale
        out = torch.stack([masked_attention(s, allowed[:, r, None], v) for r in range(R)], dim=1)
    """
    V.check_qkv(q, k, v)
    _check_lists(lists, q)
    chosen = resolve_edge_backend(backend, q, v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if chosen == "reference":
        return _reference_edge_attention(q, k, v, lists, scale), lists.nonempty
    out = _EdgeAttention.apply(q, k, v, lists.row_ptr, lists.col, lists.rel, lists.t_ptr, lists.t_col,
                               lists.t_rel, lists.num_relations, float(scale), chosen == "triton")
    return out, lists.nonempty


_ZERO_TABLES = {}


def _window_lists(trees, window: int, lengths, q: torch.Tensor, build: bool) -> Optional[EdgeLists]:
    """The window lists for these inputs, or None where getting them would synchronise a GPU (``build``
    False: only cached lists of a TreeBatch whose own lengths apply)."""
    own_lengths = isinstance(trees, TreeBatch) and (lengths is None or lengths is trees.lengths)
    if own_lengths:
        return trees.window_lists(window) if build else trees.cached_window_lists(window)
    if not build:
        return None
    distance = trees.distance if isinstance(trees, TreeBatch) else trees
    lengths = V.normalize_lengths(lengths, q)
    if isinstance(trees, TreeBatch):
        if lengths is None or torch.equal(lengths.to(trees.lengths.device), trees.lengths.to(torch.int64)):
            return trees.window_lists(window)
        segment = trees.segment
    else:
        B, N, _ = distance.shape
        reachable = (distance != 255).any(dim=-1)  # padding tokens reach nothing, not even themselves
        segment = torch.where(reachable, 0, -1).to(torch.int32)
    depth = torch.zeros_like(segment)
    return python_edge_lists(distance, depth, segment, window=window, lengths=lengths)


def syntax_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, trees, *, window: int,
                            lengths=None, scale: Optional[float] = None, backend: str = "auto") -> torch.Tensor:
    """The syntax GAT's windowed attention: query i attends key j only where ``d(i, j) <= window``.

    Same result as :func:`syntaxkernels.reference.gat_attention`. On CPU it always runs on the window's edge
    lists (C++, or Triton under ``backend="triton"`` with the interpreter): O(E) work for E pairs within the
    window. On CUDA it runs on the edge lists when they are already built (``trees.window_lists(window)``, e.g.
    by ``TreeCollator(windows=...)``) and hold at most ``EDGE_DENSITY_LIMIT`` of the pairs, else on the fused
    dense kernel with block skipping (:func:`syntaxkernels.syntax_bias_attention` with a zero table).

    Args:
        q, k: ``[B, H, N, D]``; v: ``[B, H, N, Dv]``.
        trees: a :class:`TreeBatch` (its window lists are built once and cached) or ``uint8 distance
            [B, N, N]`` (lists built from it on every call); or a :class:`~syntaxkernels.trees.PackedTreeBatch`,
            with q, k, v ``[T, H, D]`` and a ``[T, H, Dv]`` result
            (:func:`~syntaxkernels.ops.bias_attention_varlen.packed_window_attention`).
        window: delta, an int in 0..254 (0: a token sees only itself).
        lengths: ``int [B]`` or a boolean key-padding mask; default: the TreeBatch's lengths (or all N).
        scale: default ``1 / sqrt(D)``.
        backend: "auto", "triton" or "reference".
    Returns:
        ``[B, H, N, Dv]`` in q's dtype; rows past the length are 0.
    """
    from ..trees.packed import PackedTreeBatch

    if isinstance(trees, PackedTreeBatch):  # packed batch: q, k, v [T, H, D] (bias_attention_varlen)
        from .bias_attention_varlen import packed_window_attention

        return packed_window_attention(q, k, v, trees, window=window, scale=scale, backend=backend)
    V.check_qkv(q, k, v)
    if isinstance(trees, TreeBatch):
        V.check_trees(trees, q)
    else:
        V.check_distance(trees, q)
    if window is None:
        raise ValueError("window must be an int in 0..254, got None")
    V.check_window(window)
    distance = trees.distance if isinstance(trees, TreeBatch) else trees
    chosen = resolve_edge_backend(backend, q, v)
    if chosen == "reference":
        if lengths is None and isinstance(trees, TreeBatch):
            lengths = trees.lengths
        return reference.gat_attention(q, k, v, distance, window=window, lengths=lengths, scale=scale)
    on_gpu = q.device.type == "cuda"
    lists = _window_lists(trees, window, lengths, q, build=not on_gpu)
    B, _, N, _ = q.shape
    if lists is None or (on_gpu and lists.num_edges > EDGE_DENSITY_LIMIT * B * N * N):
        from .bias_attention import syntax_bias_attention
        from ..specs import BucketSpec

        if lengths is None and isinstance(trees, TreeBatch):
            lengths = trees.lengths
        key = (q.device, q.dtype)
        if key not in _ZERO_TABLES:
            _ZERO_TABLES[key] = torch.zeros(BucketSpec(max_distance=1).num_buckets, dtype=q.dtype, device=q.device)
        return syntax_bias_attention(q, k, v, distance, _ZERO_TABLES[key], buckets=BucketSpec(max_distance=1),
                                     scale=scale, lengths=lengths, window=window, backend="triton",
                                     symmetric=True if isinstance(trees, TreeBatch) else None)
    out, _ = edge_list_attention(q, k, v, lists, scale=scale, backend="triton" if chosen == "triton" else "auto")
    return out[:, 0]
