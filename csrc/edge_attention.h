// CPU edge-list attention (ATen): for every (batch b, head h, relation r, query i) a softmax over the keys of
// the row's list, out[b, r, h, i] = sum_j p_j v[b, h, j], p = softmax_j(scale * q[b, h, i] . k[b, h, j]).
//
// Lists are the CSR of relation_lists.h: rows (b, i, r) (row_ptr int32 [B * N * R + 1], col, rel int32 [E])
// and the transposed rows (b, j, r) (t_ptr, t_col, t_rel). An empty row gives a zero output and zero
// gradients. No [.., N, N] buffer: work and memory are O(E * H * D) and O(B * R * H * N) (lse, delta).
// Deterministic: every output element is written by one task, sums run in a fixed order, no atomics.
// Vectorised over the head dimension (8 floats / 4 doubles a step; AVX2+FMA code chosen at run time on x86).
#pragma once

#include <torch/extension.h>

#include <optional>

namespace syntaxkernels {

// q, k [B, H, N, D]; v [B, H, N, Dv] (one float dtype: float32, float64, float16, bfloat16; the last dim
// contiguous, other strides free). Writes out [B, R, H, N, Dv] (q's dtype, any strides, last one 1) and
// lse [B, R, H, N] (contiguous, float64 for float64 inputs, else float32; natural log of the row's softmax
// denominator at the scaled scores, +inf for an empty row).
// Attention dropout (dropout_p in (0, 1); 0 = none): relation r's probabilities are dropped with the Philox mask
// of seed stream_seed(seed, r) (philox.h; seed: the uint64 seed's bit pattern), the kept ones scaled by
// 1 / (1 - p), the normaliser (and lse) undropped. Pair (i, j) of head h of item b is numbered (b, i, j), or, with
// token_item and token_pos (int32 [B * N], both or neither), (token_item[b, i], token_pos[b, i], token_pos[b, j]):
// a packed row's sequence and positions in it.
void edge_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& row_ptr, const at::Tensor& col, double scale, at::Tensor& out,
                                at::Tensor& lse, double dropout_p = 0.0, int64_t seed = 0,
                                const std::optional<at::Tensor>& token_item = std::nullopt,
                                const std::optional<at::Tensor>& token_pos = std::nullopt);

// Gradients of the forward: dq, dk [B, H, N, D], dv [B, H, N, Dv] (contiguous, q's dtype) from dout
// [B, R, H, N, Dv] (any strides, last one 1) and the forward's lse (out is checked for its shape only: the
// softmax-gradient term dO . O is formed from the edges). dq gathers over the rows' lists, dk and dv over the
// transposed lists. Dropout arguments as the forward's (the same ones: the mask is regenerated).
void edge_attention_backward_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                 const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& rel,
                                 const at::Tensor& t_ptr, const at::Tensor& t_col, const at::Tensor& t_rel,
                                 double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                                 double dropout_p = 0.0, int64_t seed = 0,
                                 const std::optional<at::Tensor>& token_item = std::nullopt,
                                 const std::optional<at::Tensor>& token_pos = std::nullopt);

}  // namespace syntaxkernels
