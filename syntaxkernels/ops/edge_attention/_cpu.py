"""The C++ kernels of edge-list attention (``csrc/edge_attention.cpp``: ATen, ``at::parallel_for``, vectorised over
D, deterministic), called through ``syntaxkernels._C``, as ``torch.library`` ops with fake implementations:
``syntaxkernels::edge_attention_cpu_fwd`` / ``_cpu_bwd`` and ``syntaxkernels::edge_attention_cpu_fwd_into`` (the
forward writing into a slice of a larger output). The row logsumexp is natural (the Triton kernels' is base 2:
each pair of ops reads its own). Needs no Triton."""
from typing import Optional, Tuple

import torch

from ... import _ext

__all__ = ["edge_attention_cpu_forward", "edge_attention_cpu_forward_into", "edge_attention_cpu_backward"]


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("syntaxkernels::edge_attention_cpu_fwd", mutates_args=(), device_types="cpu")
def edge_attention_cpu_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row_ptr: torch.Tensor,
                               col: torch.Tensor, num_relations: int, scale: float, dropout_p: float = 0.0,
                               seed: int = 0, token_item: Optional[torch.Tensor] = None,
                               token_pos: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """C++ forward: ``(out [B, R, H, N, Dv] in q's dtype, lse [B, R, H, N])`` (natural log; float64 for
    float64 inputs, else float32; the undropped normaliser's). Arguments as the Triton
    :func:`._kernels.edge_attention_forward` (dropout: relation r's mask of ``stream_seed(seed, r)``, ``seed``
    the int64 bit pattern; ``token_item`` / ``token_pos`` the pairs' numbering of a packed row)."""
    B, H, N, _ = q.shape
    out = torch.empty((B, num_relations, H, N, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((B, num_relations, H, N), dtype=_acc_dtype(q.dtype))
    _ext.load().edge_attention_forward(q, k, v, row_ptr, col, float(scale), out, lse, float(dropout_p), int(seed),
                                       token_item, token_pos)
    return out, lse


@edge_attention_cpu_forward.register_fake
def _(q, k, v, row_ptr, col, num_relations, scale, dropout_p=0.0, seed=0, token_item=None, token_pos=None):
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
                                scale: float, dropout_p: float = 0.0, seed: int = 0,
                                token_item: Optional[torch.Tensor] = None, token_pos: Optional[torch.Tensor] = None
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """C++ backward: ``(dq, dk, dv)`` in q's dtype (contiguous). Arguments as the Triton
    :func:`._kernels.edge_attention_backward` (the forward's dropout arguments: its mask regenerated)."""
    dq = torch.empty(q.shape, dtype=q.dtype)
    dk = torch.empty(k.shape, dtype=q.dtype)
    dv = torch.empty(v.shape, dtype=q.dtype)
    _ext.load().edge_attention_backward(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel,
                                        float(scale), dq, dk, dv, float(dropout_p), int(seed), token_item, token_pos)
    return dq, dk, dv


@edge_attention_cpu_backward.register_fake
def _(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, scale, dropout_p=0.0, seed=0,
      token_item=None, token_pos=None):
    # Contiguous like the real op's outputs, whatever q, k, v's strides (the modules pass transposed views).
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape))
