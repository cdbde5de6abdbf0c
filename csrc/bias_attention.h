// CPU distance-bias attention (ATen): for every (batch b, head h, query i) a softmax over the allowed keys j of
//     s_ij = scale * q[b, h, i] . k[b, h, j] + lut[h, distance[b, i, j]] / log2(e),
// out[b, h, i] = sum_j p_ij v[b, h, j]. The LUT is the Triton kernels' (ops/bias_attention.py, bias_lut): fp32
// [H or 1, 256], log2 domain, c * table[bucket(d)] * log2(e), -inf for distances past the window. Allowed pairs:
// i, j < lengths[b], j <= i when causal, |i - j| <= position_window when given, finite LUT entry. Rows past the
// length and rows without an allowed key output 0 with zero gradients.
//
// Tiles of 128 queries x up to 512 keys (backward: 64 x 256), an online softmax in the log2 domain (one exp2 per
// score), the bias gathered from the LUT per score: no [N, N] buffer per head. Matrix products through the BLAS
// torch links (MKL's sgemm_ when torch exports it, else at::addmm), one thread each; the rest vectorised (AVX2+FMA
// chosen at run time). With a window, key tiles without a pair inside it are skipped (one pass over the distance per call);
// with a positional window, the keys no row of a query block may attend.
// fp32 kernels; bf16 and fp16 inputs are converted to fp32 once per call (fp32 accumulation), outputs back.
// Deterministic: every output element has one writer and every sum a fixed order, whatever the thread count.
#pragma once

#include <torch/extension.h>

namespace syntaxkernels {

// q [B, H, N, D]; k [B, H_kv, N, D], v [B, H_kv, N, Dv] with H % H_kv == 0 (grouped-query attention: query head h reads
// key/value head h / (H / H_kv); H_kv = H is the plain op) (float32, bfloat16 or float16, one dtype; last dim
// contiguous, other strides free); distance uint8 [B, N, N]; lut float32 [1 or H, 256]; lengths int32 [B]. window < 0:
// none (the LUT holds it; here it only enables tile skipping). position_window >= 0: only |i - j| <= position_window
// (a sliding window over positions, masked like causality; keys outside every row's window of a query block are
// skipped), < 0: none. Writes out [B, H, N, Dv] (q's dtype, contiguous) and lse
// [B, H, N] (float32, contiguous; log2 of the row's softmax denominator at the log2-domain scores, +inf for an empty
// row).
//
// T5's relative-position term: position_lut float32 [H, 2R + 1] (R = reach; an empty tensor or R < 0: none), in
// the log2 domain (_host.position_lut); each allowed log2-domain score gains position_lut[h, clamp(j - i, -R, R) +
// R] (h the query head), not multiplied by the bias scale. The backward recomputes the scores with it and, when
// position_grad_wanted, writes position_grad float32 [H, 2R + 1]: the sums of dS over the pairs of each clamped
// offset (per-(b, h) double sums, folded in b order: deterministic). None given: the kernels run as before.
//
// Attention dropout (dropout_threshold > 0 or keep_scale != 1; threshold 0 and keep_scale 1 run the kernels
// without it): out = Pd V with Pd_ij = P_ij * keep_ij * keep_scale (keep_scale = 1 / (1 - p)), P the softmax (lse
// stays the undropped one's). keep_ij of item b, query head h: word j % 4 of Philox-4x32-7 of the counter
// (j / 4, i, b * H + h, 0) under the key (low, high 32 bits of dropout_seed, the uint64 seed's bit pattern) is
// >= dropout_threshold (uint32, reference.dropout_threshold(p)): reference.dropout_keep, the same mask.
void bias_attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& distance, const at::Tensor& lut, const at::Tensor& lengths,
                                double scale, int64_t window, bool causal, int64_t position_window,
                                int64_t dropout_seed, int64_t dropout_threshold, double keep_scale, at::Tensor& out,
                                at::Tensor& lse, const at::Tensor& position_lut, int64_t reach);

// Gradients of the forward from dout [B, H, N, Dv] (last dim contiguous) and the forward's lse: dq [B, H, N, D], dk [B,
// H_kv, N, D], dv [B, H_kv, N, Dv] (q's dtype, contiguous; a key/value head's gradients are the sums over its group's
// query heads, added in head order by the one task that owns it) and, when table_grad, bucket_grad float32 [1 or H, T]
// (like the LUT's rows): the sums of dS (the gradient of the natural-log scores) over the pairs whose distance d has
// bucket_index[d] == t (bucket_index int64 [256]); d table = c * bucket_grad, d c = sum(table * bucket_grad).
// The row term delta_i = sum_j p_ij dp_ij is formed from the recomputed tile (the output is not read back).
// Dropout (the forward's arguments; the mask regenerated from the seed, never stored): dV = Pd^T dO,
// dPd = (dO V^T) * keep * keep_scale, delta_i = sum_j P_ij dPd_ij (= rowsum(dO * O)), dS = P (dPd - delta).
void bias_attention_backward_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& lse, const at::Tensor& distance,
                                 const at::Tensor& lut, const at::Tensor& lengths, const at::Tensor& bucket_index,
                                 double scale, int64_t window, bool causal, int64_t position_window, bool table_grad,
                                 int64_t dropout_seed, int64_t dropout_threshold, double keep_scale, at::Tensor& dq,
                                 at::Tensor& dk, at::Tensor& dv, at::Tensor& bucket_grad,
                                 const at::Tensor& position_lut, int64_t reach, bool position_grad_wanted,
                                 at::Tensor& position_grad);

}  // namespace syntaxkernels
