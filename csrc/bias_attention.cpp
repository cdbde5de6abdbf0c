// CPU distance-bias attention (see bias_attention.h for the contract).
//
// Log2 domain throughout: t_ij = s_ij * log2(e) = q_i . k_j * scale * log2(e) + lut[h, d_ij], p_ij = exp2(t_ij -
// lse_i) with lse_i the log2 of the row's denominator.
//
// Forward, one task per (b, h, query block of 128 rows): for each span of up to 512 live keys,
//   S = Q_blk K_span^T (sgemm), then per row t = S * scale2 + lut[d] (causal: -inf past the diagonal), the online
//   softmax update (running max and sum, the accumulator rescaled by exp2(old max - new max)), P stored over S;
//   acc += P V_span (sgemm). Epilogue: out = acc / sum, lse = max + log2(sum).
// Backward, one task per (b, key/value head) (it owns dK and dV of that head, so they are summed without atomics;
// with grouped-query attention it walks the group's query heads in order, each adding its products to the same dK
// and dV), query blocks of 64 rows in order, spans of up to 256 keys. For a block: pass A over its spans:
// S = Q_blk K^T, dP = dO_blk V^T (sgemm), P = exp2(S * scale2 + lut[d] - lse) and delta_i = sum_j P_ij dP_ij
// (exact: formed from the tile, not from the rounded output); pass B: dS = P (dP - delta) in place, the
// per-distance sums of dS (table gradient), then
//   dV_span += P^T dO_blk,  dK_span += scale dS^T Q_blk,  dQ_blk += scale dS K_span   (sgemm).
// P and dP of the block's live keys stay in a [64, N] band per task (O(N), not O(N^2), per head).
//
// Table gradient: per task eight interleaved double histograms over the 256 distance values (no store-to-load
// chain when neighbouring keys share a distance), folded into the task's double sums per query block; after the
// parallel loop the tasks' histograms are folded into buckets in (b, h) order. Same bits for any thread count.
// Double, not float: a bucket (the 'unreachable' one of packed sentences above all) sums up to N^2 values of dS
// whose total nearly cancels (every row of dS sums to 0), and float histograms of 64 x N values each lost more
// than the float reference loses (3.8e-05 against 5e-06 at N = 2048). One double add per value, like the float.
//
// Window: a [B, nQ, nK] table of each (query block x 64 keys) tile's smallest distance (one pass over the
// distance, shared by the heads); tiles whose smallest distance is beyond the window are skipped, live ones merged
// into spans.
//
// Positional window (|i - j| <= w): a query block's spans cover only the keys [i0 - w, i0 + rows - 1 + w] (the keys
// some row of the block may attend: the rest is never multiplied), and each row masks the columns of a span
// outside its own [i - w, i + w] as causality masks those past the diagonal (P = 0 there; the bias, the exp2, the
// dropout mask and the table sums run over the allowed columns only). A query block without a live key is skipped
// in both passes.
//
// Attention dropout: separate passes (a template parameter; p = 0 runs the passes above unchanged). The keep
// multipliers of a row segment (keep_scale or 0) come from one Philox-4x32-7 call per 4 keys (the loop over groups
// vectorises). Forward: applied to P after the online softmax has summed it (the sum and lse stay the undropped
// softmax's), before acc += P V. Backward pass A: generated into a [64, N] band and applied to dP before delta
// (delta = sum P dPd = rowsum(dO O)); pass B: dS = P (dPd - delta), then P turned into Pd for dV. Measured on the
// shared 2-core machine (one thread, B = 2, H = 4, N = 512, D = 64, p = 0.1, best of 40): forward 5.4 -> 8.6 ms,
// backward 13.0 -> 16.5 ms; the generator alone about 1.3 ns per key.
#include "bias_attention.h"

#include "cpu_support.h"
#include "philox.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

// The BLAS torch links. MKL builds of torch export the Fortran sgemm_ (and MKL's per-thread thread count); weak
// references resolve to them at load time and stay null elsewhere, where at::addmm is used instead.
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));  // the C interface (by value)
}

namespace syntaxkernels {
namespace {

using cpu::advise_huge_pages;
using cpu::last_dim_contiguous;

// Query rows per block (also the tile height of the window metadata) and most keys per matrix product (a span of
// consecutive live tiles), forward and backward; key columns per tile of the window metadata.
constexpr int64_t kForwardBlockM = 128, kForwardSpan = 512;
constexpr int64_t kBackwardBlockM = 64, kBackwardSpan = 256;
constexpr int64_t kTileN = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kInf = std::numeric_limits<float>::infinity();

// ------------------------------------------------------------------------------------------------ matrix products

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(A) [m, k], op(B) [k, n]; A, B, C row-major with row
// strides lda, ldb, ldc (op = transpose when trans_*). BLAS is column-major: a row-major X is the column-major
// X^T, so this is C^T = alpha * op(B)^T op(A)^T + beta * C^T.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t r = 0; r < m; ++r) {
      float* row = C + r * ldc;
      for (int64_t c = 0; c < n; ++c) row[c] = beta == 0.f ? 0.f : beta * row[c];
    }
    return;
  }
  if (sgemm_ != nullptr) {
    const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
    const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
    const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
    sgemm_(&ta, &tb, &mi, &ni, &ki, &alpha, B, &la, A, &lb, &beta, C, &lc);
    return;
  }
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor a = trans_a ? at::from_blob(const_cast<float*>(A), {k, m}, {lda, 1}, options).t()
                               : at::from_blob(const_cast<float*>(A), {m, k}, {lda, 1}, options);
  const at::Tensor b = trans_b ? at::from_blob(const_cast<float*>(B), {n, k}, {ldb, 1}, options).t()
                               : at::from_blob(const_cast<float*>(B), {k, n}, {ldb, 1}, options);
  at::Tensor c = at::from_blob(C, {m, n}, {ldc, 1}, options);
  if (beta == 0.f) {
    at::mm_out(c, a, b);
    if (alpha != 1.f) c.mul_(alpha);
  } else {
    c.addmm_(a, b, beta, alpha);
  }
}

// Keeps the BLAS single-threaded inside a task (the tasks are the parallelism), restoring its setting after.
struct SequentialBlas {
  int previous = 0;
  SequentialBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) previous = MKL_Set_Num_Threads_Local(1);
  }
  ~SequentialBlas() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous);
  }
};

// ------------------------------------------------------------------------------------------------ vector helpers

#if defined(__GNUC__)
using Vec = cpu::Lanes<float>::Vec;
using IVec = cpu::Lanes<float>::Int;
constexpr int64_t kW = cpu::Lanes<float>::kWidth;
using cpu::load_vec;
using cpu::store_vec;

SK_INLINE Vec splat(float x) { return Vec{x, x, x, x, x, x, x, x}; }

// 2^x per lane: x = n + f with n = round(x), |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (relative error
// below 1e-8 before rounding), 2^n by the exponent bits. 0 below -126 (and for -inf).
SK_INLINE Vec exp2_vec(Vec x) {
  const Vec lo = splat(-126.f), hi = splat(126.f);
  Vec c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  const Vec magic = splat(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const Vec n = (c + magic) - magic;
  const Vec f = c - n;
  Vec p = splat(1.5252733804059840e-05f);
  p = p * f + splat(1.5403530393381606e-04f);
  p = p * f + splat(1.3333558146428443e-03f);
  p = p * f + splat(9.6181291076284772e-03f);
  p = p * f + splat(5.5504108664821580e-02f);
  p = p * f + splat(2.4022650695910071e-01f);
  p = p * f + splat(6.9314718055994531e-01f);
  p = p * f + splat(1.f);
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof(Vec));
  const Vec y = p * scale;
  return x < lo ? splat(0.f) : y;
}

SK_INLINE Vec gather(const float* lut, const uint8_t* d) {
  return Vec{lut[d[0]], lut[d[1]], lut[d[2]], lut[d[3]], lut[d[4]], lut[d[5]], lut[d[6]], lut[d[7]]};
}

SK_INLINE float lanes_max(Vec v) {
  float m = v[0];
  for (int64_t l = 1; l < kW; ++l) m = std::max(m, v[l]);
  return m;
}

SK_INLINE float lanes_sum(Vec v) {
  float s = 0.f;
  for (int64_t l = 0; l < kW; ++l) s += v[l];
  return s;
}
#endif

SK_INLINE float exp2_scalar(float x) { return x < -126.f ? 0.f : std::exp2(x); }

// One row segment's log2-domain scores t[j] = s[j] * scale2 + lut[d[j]] (+ pos[j], T5's relative-position term, when
// kPos: the row's position LUT values, contiguous in j) stored over s, -inf where the bias is (outside the window);
// returns the largest t (NaN ignored: the sums see it). A pair outside the window (lut -inf) gets -inf whatever its
// product holds: a NaN or infinite q . k there is masked, as the reference masks it, never turned into a NaN score.
template <bool kPos>
SK_INLINE float biased_scores_t(float* s, const uint8_t* d, const float* lut, const float* pos, float scale2,
                                int64_t n) {
  int64_t j = 0;
  float best = -kInf;
#if defined(__GNUC__)
  Vec vbest = splat(-kInf);
  const Vec vscale = splat(scale2), vmasked = splat(-kInf);
  for (; j + kW <= n; j += kW) {
    const Vec bias = gather(lut, d + j);
    Vec sum = load_vec<Vec>(s + j) * vscale + bias;
    if constexpr (kPos) sum = sum + load_vec<Vec>(pos + j);
    const Vec t = bias == vmasked ? bias : sum;
    store_vec(s + j, t);
    vbest = t > vbest ? t : vbest;
  }
  best = lanes_max(vbest);
#endif
  for (; j < n; ++j) {
    const float bias = lut[d[j]];
    float sum = s[j] * scale2 + bias;
    if constexpr (kPos) sum = sum + pos[j];
    s[j] = bias == -kInf ? bias : sum;
    best = std::max(best, s[j]);
  }
  return best;
}

SK_INLINE float biased_scores(float* s, const uint8_t* d, const float* lut, float scale2, int64_t n) {
  return biased_scores_t<false>(s, d, lut, nullptr, scale2, n);
}

SK_INLINE float biased_scores_pos(float* s, const uint8_t* d, const float* lut, const float* pos, float scale2,
                                  int64_t n) {
  return biased_scores_t<true>(s, d, lut, pos, scale2, n);
}

// p[j] = exp2(t[j] - shift) stored over t; returns the sum (a fixed order: lanes, then the tail).
SK_INLINE float exp2_shifted(float* t, float shift, int64_t n) {
  int64_t j = 0;
  float sum = 0.f;
#if defined(__GNUC__)
  Vec vsum = splat(0.f);
  const Vec vshift = splat(shift);
  for (; j + kW <= n; j += kW) {
    const Vec p = exp2_vec(load_vec<Vec>(t + j) - vshift);
    store_vec(t + j, p);
    vsum += p;
  }
  sum = lanes_sum(vsum);
#endif
  for (; j < n; ++j) {
    t[j] = exp2_scalar(t[j] - shift);
    sum += t[j];
  }
  return sum;
}

// Backward pass A on one row segment: p = exp2(s * scale2 + lut[d] (+ pos, when kPos) - lse) over s, 0 outside the
// window (lut -inf, whatever the product holds, as in the forward); returns sum p * dp.
template <bool kPos>
SK_INLINE float probabilities_t(float* s, const float* dp, const uint8_t* d, const float* lut, const float* pos,
                                float scale2, float lse, int64_t n) {
  int64_t j = 0;
  float sum = 0.f;
#if defined(__GNUC__)
  Vec vsum = splat(0.f);
  const Vec vscale = splat(scale2), vlse = splat(lse), vmasked = splat(-kInf), vzero = splat(0.f);
  for (; j + kW <= n; j += kW) {
    const Vec bias = gather(lut, d + j);
    Vec t = load_vec<Vec>(s + j) * vscale + bias;
    if constexpr (kPos) t = t + load_vec<Vec>(pos + j);
    const Vec e = exp2_vec(t - vlse);
    const Vec p = bias == vmasked ? vzero : e;
    store_vec(s + j, p);
    vsum += p * load_vec<Vec>(dp + j);
  }
  sum = lanes_sum(vsum);
#endif
  for (; j < n; ++j) {
    const float bias = lut[d[j]];
    float t = s[j] * scale2 + bias;
    if constexpr (kPos) t = t + pos[j];
    s[j] = bias == -kInf ? 0.f : exp2_scalar(t - lse);
    sum += s[j] * dp[j];
  }
  return sum;
}

SK_INLINE float probabilities(float* s, const float* dp, const uint8_t* d, const float* lut, float scale2, float lse,
                              int64_t n) {
  return probabilities_t<false>(s, dp, d, lut, nullptr, scale2, lse, n);
}

SK_INLINE float probabilities_pos(float* s, const float* dp, const uint8_t* d, const float* lut, const float* pos,
                                  float scale2, float lse, int64_t n) {
  return probabilities_t<true>(s, dp, d, lut, pos, scale2, lse, n);
}

// The relative-position LUT of one head spread over every offset of the sequence: ext[r + N - 1] = plut[clamp(r,
// -R, R) + R] for r in [-(N - 1), N - 1], so that row i reads column j's value at ext + N - 1 - i + j (contiguous
// in j: a plain load per score, no gather, no clamp).
SK_INLINE void spread_positions(float* ext, const float* plut, int64_t R, int64_t N) {
  for (int64_t r = -(N - 1); r <= N - 1; ++r) ext[r + N - 1] = plut[std::clamp(r, -R, R) + R];
}

// Adds ds[j] (columns c0 + j of row i, j < n) into sums[clamp(c0 + j - i, -R, R) + R] (double), in column order.
SK_INLINE void offset_sums(double* sums, const float* ds, int64_t i, int64_t c0, int64_t n, int64_t R) {
  for (int64_t j = 0; j < n; ++j) {
    sums[std::clamp(c0 + j - i, -R, R) + R] += static_cast<double>(ds[j]);
  }
}

// Backward pass B on one row segment: ds = p * (dp - delta) over dp.
SK_INLINE void score_gradients(const float* p, float* dp, float delta, int64_t n) {
  int64_t j = 0;
#if defined(__GNUC__)
  const Vec vdelta = splat(delta);
  for (; j + kW <= n; j += kW) store_vec(dp + j, load_vec<Vec>(p + j) * (load_vec<Vec>(dp + j) - vdelta));
#endif
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

// ------------------------------------------------------------------------------------------------ dropout

// The keep multipliers of keys [j0, j0 + n) of query row `row` of stream (b * H + h): m[4 * (g - g0) + l] for the
// key j = 4 g + l of every group g from g0 = j0 / 4 to the group of key j0 + n - 1 (whole groups: the caller reads
// m + j0 % 4). A key is kept when word l of philox(counter (g, row, stream, 0), key (key0, key1)) is >= threshold
// (philox.h); its multiplier is keep_scale, else 0. One Philox call per 4 keys, independent across groups
// (vectorisable).
SK_INLINE void keep_multipliers(float* m, int64_t j0, int64_t n, uint32_t row, uint32_t stream, uint32_t key0,
                                uint32_t key1, uint32_t threshold, float keep_scale) {
  const int64_t g0 = j0 >> 2, groups = ((j0 + n + 3) >> 2) - g0;
  const uint64_t seed = static_cast<uint64_t>(key0) | (static_cast<uint64_t>(key1) << 32);
  for (int64_t g = 0; g < groups; ++g) {
    const philox::Words words = philox::philox4x32_7(seed, static_cast<uint32_t>(g0 + g), row, stream, 0u);
    const uint32_t c0 = words.w[0], c1 = words.w[1], c2 = words.w[2], c3 = words.w[3];
    float* out = m + 4 * g;
    out[0] = c0 >= threshold ? keep_scale : 0.f;
    out[1] = c1 >= threshold ? keep_scale : 0.f;
    out[2] = c2 >= threshold ? keep_scale : 0.f;
    out[3] = c3 >= threshold ? keep_scale : 0.f;
  }
}

// x[j] = x[j] * m[j] where m[j] != 0, else 0 (a select, as the reference's torch.where: a dropped NaN or infinite
// value becomes 0).
SK_INLINE void apply_keep(float* x, const float* m, int64_t n) {
  int64_t j = 0;
#if defined(__GNUC__)
  const Vec vzero = splat(0.f);
  for (; j + kW <= n; j += kW) {
    const Vec mj = load_vec<Vec>(m + j);
    store_vec(x + j, mj == vzero ? vzero : load_vec<Vec>(x + j) * mj);
  }
#endif
  for (; j < n; ++j) x[j] = m[j] == 0.f ? 0.f : x[j] * m[j];
}

// ------------------------------------------------------------------------------------------------ the problem

struct Problem {
  int64_t B, H, N, D, Dv, nQ, nK;
  int64_t H_kv, group;  // key/value heads, and query heads per key/value head (grouped-query attention: H / H_kv)
  int64_t block_m, span;  // query rows per block, most keys per span
  const float *q, *k, *v;
  int64_t q_b, q_h, q_n, k_b, k_h, k_n, v_b, v_h, v_n;
  const uint8_t* dist;
  int64_t d_b, d_i;
  const float* lut;
  int64_t lut_h;  // 0 for a shared table
  const int32_t* lengths;
  const uint8_t* tile_min;  // [B, nQ, nK] smallest distance of each tile (window only), else null
  int64_t window;
  int64_t position_window;  // |i - j| <= position_window (clamped to N), -1 for none
  bool causal;
  float scale, scale2;
  // forward outputs
  float* out;  // [B, H, N, Dv] contiguous
  float* lse;  // [B, H, N] contiguous (read by the backward)
  // backward
  const float* dout;
  int64_t g_b, g_h, g_n;
  float *dq, *dk, *dv;  // contiguous, zero-filled
  double* hist;         // [B * H, 256] per-task sums of dS by distance value, or null
  // T5's relative-position term: pos_ext [H, 2N] each head's LUT spread over the offsets (spread_positions), null
  // (reach -1) for none
  const float* pos_ext;
  int64_t reach;
  double* pos_hist;  // [B * H, 2R + 1] per-(b, h) sums of dS by clamped offset, or null
  // attention dropout (used by the dropout passes only): Philox key, uint32 threshold, 1 / (1 - p)
  uint32_t key0, key1, threshold;
  float keep_scale;

  int64_t length(int64_t b) const { return std::clamp<int64_t>(lengths[b], 0, N); }
};

// The spans [start, stop) of live keys of query block qb (rows [i0, i0 + rows)) of item b: keys below the length
// (and up to the block's last row when causal), within the positional window of some row of the block
// ([i0 - w, i0 + rows - 1 + w]), without the tiles the distance window rules out, cut at P.span keys.
void key_spans(const Problem& P, int64_t b, int64_t qb, int64_t i0, int64_t rows, std::vector<int64_t>& spans) {
  spans.clear();
  const int64_t L = P.length(b);
  int64_t first = 0, stop = P.causal ? std::min(L, i0 + rows) : L;
  if (P.position_window >= 0) {
    first = std::max<int64_t>(0, i0 - P.position_window);
    stop = std::min(stop, i0 + rows + P.position_window);
  }
  if (first >= stop) return;
  auto add = [&](int64_t from, int64_t to) {
    for (int64_t j = from; j < to; j += P.span) {
      spans.push_back(j);
      spans.push_back(std::min(to, j + P.span));
    }
  };
  if (P.tile_min == nullptr) {
    add(first, stop);
    return;
  }
  // Merge consecutive live tiles (query tiles and query blocks coincide: P.block_m rows).
  const uint8_t* row = P.tile_min + (b * P.nQ + qb) * P.nK;
  int64_t run = -1;
  for (int64_t kb = first / kTileN; kb * kTileN < stop; ++kb) {
    const bool live = row[kb] <= P.window;
    if (live && run < 0) run = std::max(kb * kTileN, first);
    if (!live && run >= 0) {
      add(run, kb * kTileN);
      run = -1;
    }
  }
  if (run >= 0) add(run, stop);
}

// The columns of row i of a span [j0, j1) that causality and the positional window allow, as offsets into the
// span: [lo, hi), none when hi <= lo (the length and the distance window are the spans' and the LUT's).
struct Columns {
  int64_t lo, hi;
};
SK_INLINE Columns row_columns(const Problem& P, int64_t i, int64_t j0, int64_t j1) {
  int64_t lo = j0, hi = P.causal ? std::min(j1, i + 1) : j1;
  if (P.position_window >= 0) {
    lo = std::max(lo, i - P.position_window);
    hi = std::min(hi, i + P.position_window + 1);
  }
  return {lo - j0, hi - j0};
}

// Zeroes the columns of a span's row (width values) outside c (the whole row when c is empty); returns c's width,
// <= 0 when the row has no allowed column there.
SK_INLINE int64_t zero_outside(float* row, int64_t width, Columns c) {
  if (c.hi <= c.lo) {
    std::fill(row, row + width, 0.f);
    return 0;
  }
  std::fill(row, row + c.lo, 0.f);
  std::fill(row + c.hi, row + width, 0.f);
  return c.hi - c.lo;
}

// ------------------------------------------------------------------------------------------------ forward

// Tasks [begin, end) of the flattened (b, h, query block), h a query head (reading key/value head h / group).
// kDropout: the probabilities that go into P V are the
// softmax's times the keep multipliers (the row sums, and so lse, stay those of the undropped softmax).
template <bool kDropout>
SK_INLINE void forward_body(const Problem& P, int64_t begin, int64_t end) {
  SequentialBlas sequential;
  // Scratch from torch's allocator (counted by its memory statistics and profiler like any tensor); with dropout
  // one row of keep multipliers after the rest (a span plus a group either side).
  const int64_t keep_row = kDropout ? P.span + 8 : 0;
  at::Tensor scratch = at::empty({P.block_m * (P.span + P.Dv + 2) + keep_row}, at::TensorOptions().dtype(at::kFloat));
  float* const scores = scratch.data_ptr<float>();
  float* const acc = scores + P.block_m * P.span;
  float* const row_max = acc + P.block_m * P.Dv;
  float* const row_sum = row_max + P.block_m;
  float* const keep = row_sum + P.block_m;
  std::vector<int64_t> spans;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t qb = task % P.nQ, bh = task / P.nQ, h = bh % P.H, b = bh / P.H;
    const int64_t L = P.length(b), i0 = qb * P.block_m;
    const int64_t rows = std::max<int64_t>(0, std::min(i0 + P.block_m, L) - i0);
    const int64_t block_rows = std::min(P.block_m, P.N - i0);
    float* out = P.out + (bh * P.N + i0) * P.Dv;
    float* lse = P.lse + bh * P.N + i0;
    std::fill(out, out + block_rows * P.Dv, 0.f);
    std::fill(lse, lse + block_rows, kInf);
    if (rows == 0) continue;
    const float* q = P.q + b * P.q_b + h * P.q_h + i0 * P.q_n;
    const float* k = P.k + b * P.k_b + (h / P.group) * P.k_h;
    const float* v = P.v + b * P.v_b + (h / P.group) * P.v_h;
    const float* lut = P.lut + h * P.lut_h;
    const float* pos = P.pos_ext != nullptr ? P.pos_ext + h * 2 * P.N + P.N - 1 : nullptr;  // offset 0 of head h
    std::fill(row_max, row_max + P.block_m, -kInf);
    std::fill(row_sum, row_sum + P.block_m, 0.f);
    std::fill(acc, acc + rows * P.Dv, 0.f);
    key_spans(P, b, qb, i0, rows, spans);
    for (size_t s = 0; s < spans.size(); s += 2) {
      const int64_t j0 = spans[s], j1 = spans[s + 1], width = j1 - j0;
      gemm(false, true, rows, width, P.D, 1.f, q, P.q_n, k + j0 * P.k_n, P.k_n, 0.f, scores, P.span);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float* t = scores + r * P.span;
        const Columns allowed = row_columns(P, i, j0, j1);
        const int64_t n = zero_outside(t, width, allowed), lo = allowed.lo;
        if (n <= 0) continue;
        t += lo;
        const uint8_t* d = P.dist + b * P.d_b + i * P.d_i + j0 + lo;
        const float block_max = pos == nullptr ? biased_scores(t, d, lut, P.scale2, n)
                                               : biased_scores_pos(t, d, lut, pos + j0 + lo - i, P.scale2, n);
        const float new_max = std::max(row_max[r], block_max);
        const float shift = new_max == -kInf ? 0.f : new_max;
        const float alpha = exp2_scalar(row_max[r] - shift);
        const float sum = exp2_shifted(t, shift, n);
        if constexpr (kDropout) {
          keep_multipliers(keep, j0 + lo, n, static_cast<uint32_t>(i), static_cast<uint32_t>(bh), P.key0, P.key1,
                           P.threshold, P.keep_scale);
          apply_keep(t, keep + ((j0 + lo) & 3), n);
        }
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = new_max;
        if (alpha != 1.f) {
          float* a = acc + r * P.Dv;
          for (int64_t c = 0; c < P.Dv; ++c) a[c] *= alpha;
        }
      }
      gemm(false, false, rows, P.Dv, width, 1.f, scores, P.span, v + j0 * P.v_n, P.v_n, 1.f, acc, P.Dv);
    }
    // Epilogue: normalise; a row without an allowed key (its sum exactly 0) stays 0 with lse = +inf. A NaN sum (a
    // NaN or +inf score among the allowed ones) is normalised like any other: the row and its lse are NaN, so
    // the backward's gradients are NaN too, as the reference's are.
    for (int64_t r = 0; r < rows; ++r) {
      if (row_sum[r] == 0.f) continue;
      const float inv = 1.f / row_sum[r];
      const float* a = acc + r * P.Dv;
      float* o = out + r * P.Dv;
      for (int64_t c = 0; c < P.Dv; ++c) o[c] = a[c] * inv;
      lse[r] = row_max[r] + std::log2(row_sum[r]);
    }
  }
}

SK_INLINE void forward_tasks_impl(const Problem& P, int64_t begin, int64_t end) { forward_body<false>(P, begin, end); }
SK_INLINE void forward_dropout_tasks_impl(const Problem& P, int64_t begin, int64_t end) {
  forward_body<true>(P, begin, end);
}

// ------------------------------------------------------------------------------------------------ backward

// Tasks [begin, end) of the flattened (b, key/value head kv); see the top of the file. Each walks the query heads
// h = kv * group + g, g = 0, 1, ... in order (dK and dV sum theirs in that order; dQ, the table sums and the
// dropout stream b * H + h stay the query head's). kDropout: pass A regenerates the keep
// multipliers of the block's live keys (into a [64, N rounded up to 4] band: key j of row r at r * keep_band + j)
// and drops dP with them, so delta = rowsum(P * dPd) = rowsum(dO * O) and dS = P (dPd - delta); pass B turns P into
// the dropped Pd after forming dS, for dV = Pd^T dO.
template <bool kDropout>
SK_INLINE void backward_body(const Problem& P, int64_t begin, int64_t end) {
  SequentialBlas sequential;
  const int64_t band = std::max<int64_t>(P.N, 1);
  const int64_t keep_band = kDropout ? (band + 3) / 4 * 4 : 0;
  // Scratch from torch's allocator: P and dP/dS of a query block's keys, its dQ, delta, the keep multipliers
  // (dropout), the distance stripes.
  at::Tensor scratch =
      at::empty({P.block_m * (2 * band + P.D + 1 + keep_band)}, at::TensorOptions().dtype(at::kFloat));
  float* const probs = scratch.data_ptr<float>();
  float* const grads = probs + P.block_m * band;
  float* const dq_block = grads + P.block_m * band;
  float* const delta = dq_block + P.block_m * P.D;
  float* const keep = delta + P.block_m;
  at::Tensor stripe_scratch = at::empty({8 * 256}, at::TensorOptions().dtype(at::kDouble));
  double* const stripes = stripe_scratch.data_ptr<double>();
  std::vector<int64_t> spans;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t kv = task % P.H_kv, b = task / P.H_kv, L = P.length(b);
    const float* k = P.k + b * P.k_b + kv * P.k_h;
    const float* v = P.v + b * P.v_b + kv * P.v_h;
    float* dk = P.dk + task * P.N * P.D;
    float* dv = P.dv + task * P.N * P.Dv;
    for (int64_t g = 0; g < P.group; ++g) {
      const int64_t h = kv * P.group + g, bh = b * P.H + h;
      const float* q = P.q + b * P.q_b + h * P.q_h;
      const float* dout = P.dout + b * P.g_b + h * P.g_h;
      const float* lut = P.lut + h * P.lut_h;
      const float* lse = P.lse + bh * P.N;
      float* dq = P.dq + bh * P.N * P.D;
      double* hist = P.hist != nullptr ? P.hist + bh * 256 : nullptr;
      const float* pos = P.pos_ext != nullptr ? P.pos_ext + h * 2 * P.N + P.N - 1 : nullptr;  // offset 0 of head h
      double* pos_sums = P.pos_hist != nullptr ? P.pos_hist + bh * (2 * P.reach + 1) : nullptr;
      for (int64_t qb = 0; qb * P.block_m < L; ++qb) {
        const int64_t i0 = qb * P.block_m, rows = std::min(i0 + P.block_m, L) - i0;
        const float* q_blk = q + i0 * P.q_n;
        const float* do_blk = dout + i0 * P.g_n;
        key_spans(P, b, qb, i0, rows, spans);
        if (spans.empty()) continue;
        // Pass A: P and dP of every live key, and delta = rowsum(P * dP).
        std::fill(delta, delta + P.block_m, 0.f);
        for (size_t s = 0; s < spans.size(); s += 2) {
          const int64_t j0 = spans[s], j1 = spans[s + 1], width = j1 - j0;
          gemm(false, true, rows, width, P.D, 1.f, q_blk, P.q_n, k + j0 * P.k_n, P.k_n, 0.f, probs + j0, band);
          gemm(false, true, rows, width, P.Dv, 1.f, do_blk, P.g_n, v + j0 * P.v_n, P.v_n, 0.f, grads + j0,
               band);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            float* p = probs + r * band + j0;
            const Columns allowed = row_columns(P, i, j0, j1);
            const int64_t n = zero_outside(p, width, allowed), lo = allowed.lo;
            if (n <= 0) continue;
            const int64_t c0 = j0 + lo;  // the row's first allowed column
            if constexpr (kDropout) {
              float* m = keep + r * keep_band;
              keep_multipliers(m + (c0 & ~int64_t(3)), c0, n, static_cast<uint32_t>(i), static_cast<uint32_t>(bh),
                               P.key0, P.key1, P.threshold, P.keep_scale);
              apply_keep(grads + r * band + c0, m + c0, n);
            }
            const uint8_t* d = P.dist + b * P.d_b + i * P.d_i + c0;
            delta[r] += pos == nullptr
                            ? probabilities(p + lo, grads + r * band + c0, d, lut, P.scale2, lse[i], n)
                            : probabilities_pos(p + lo, grads + r * band + c0, d, lut, pos + c0 - i, P.scale2, lse[i], n);
          }
        }
        // Pass B: dS over dP, its sums by distance, and the gradient products.
        if (hist != nullptr) std::fill(stripes, stripes + 8 * 256, 0.0);
        for (size_t s = 0; s < spans.size(); s += 2) {
          const int64_t j0 = spans[s], j1 = spans[s + 1], width = j1 - j0;
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            float* ds = grads + r * band + j0;
            score_gradients(probs + r * band + j0, ds, delta[r], width);
            const auto [lo, hi] = row_columns(P, i, j0, j1);
            const int64_t n = hi - lo;
            if (n <= 0) continue;
            if constexpr (kDropout) {
              apply_keep(probs + r * band + j0 + lo, keep + r * keep_band + j0 + lo, n);
            }
            if (pos_sums != nullptr) offset_sums(pos_sums, ds + lo, i, j0 + lo, n, P.reach);
            if (hist == nullptr) continue;
            ds += lo;
            const uint8_t* d = P.dist + b * P.d_b + i * P.d_i + j0 + lo;
            int64_t j = 0;
            for (; j + 8 <= n; j += 8) {
              for (int64_t l = 0; l < 8; ++l) stripes[l * 256 + d[j + l]] += static_cast<double>(ds[j + l]);
            }
            for (; j < n; ++j) stripes[(j & 7) * 256 + d[j]] += static_cast<double>(ds[j]);
          }
          gemm(true, false, width, P.Dv, rows, 1.f, probs + j0, band, do_blk, P.g_n, 1.f, dv + j0 * P.Dv, P.Dv);
          gemm(true, false, width, P.D, rows, P.scale, grads + j0, band, q_blk, P.q_n, 1.f, dk + j0 * P.D,
               P.D);
          gemm(false, false, rows, P.D, width, P.scale, grads + j0, band, k + j0 * P.k_n, P.k_n,
               s == 0 ? 0.f : 1.f, dq_block, P.D);
        }
        std::copy(dq_block, dq_block + rows * P.D, dq + i0 * P.D);
        if (hist != nullptr) {
          for (int64_t d = 0; d < 256; ++d) {
            double sum = 0.0;
            for (int64_t l = 0; l < 8; ++l) sum += stripes[l * 256 + d];
            hist[d] += sum;
          }
        }
      }
    }
  }
}

SK_INLINE void backward_tasks_impl(const Problem& P, int64_t begin, int64_t end) {
  backward_body<false>(P, begin, end);
}
SK_INLINE void backward_dropout_tasks_impl(const Problem& P, int64_t begin, int64_t end) {
  backward_body<true>(P, begin, end);
}

SK_DEFINE_PASS(forward_tasks)
SK_DEFINE_PASS(forward_dropout_tasks)
SK_DEFINE_PASS(backward_tasks)
SK_DEFINE_PASS(backward_dropout_tasks)

// Tasks per chunk of the thread pool: at least ~1M multiply-adds, so that a small call runs on the calling thread
// instead of waking (and leaving spinning) the pool's threads. `work` is one task's multiply-adds.
int64_t grain(int64_t work) { return std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(work, 1)); }

// ------------------------------------------------------------------------------------------------ window tiles

// The smallest distance of every block_m x kTileN tile: uint8 [B, nQ, nK].
at::Tensor tile_minima(const at::Tensor& distance, int64_t block_m, int64_t nQ, int64_t nK) {
  const int64_t B = distance.size(0), N = distance.size(1);
  at::Tensor minima = at::empty({B, nQ, nK}, at::TensorOptions().dtype(at::kByte));
  const uint8_t* dist = distance.data_ptr<uint8_t>();
  uint8_t* out = minima.data_ptr<uint8_t>();
  const int64_t d_b = distance.stride(0), d_i = distance.stride(1);
  at::parallel_for(0, B * nQ, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> row(static_cast<size_t>(std::max<int64_t>(N, 1)));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / nQ, qb = task % nQ;
      std::fill(row.begin(), row.end(), uint8_t(255));
      for (int64_t i = qb * block_m; i < std::min(N, (qb + 1) * block_m); ++i) {
        const uint8_t* d = dist + b * d_b + i * d_i;
        for (int64_t j = 0; j < N; ++j) row[j] = std::min(row[j], d[j]);
      }
      for (int64_t kb = 0; kb < nK; ++kb) {
        const auto first = row.begin() + kb * kTileN;
        out[task * nK + kb] = *std::min_element(first, row.begin() + std::min(N, (kb + 1) * kTileN));
      }
    }
  });
  return minima;
}

// ------------------------------------------------------------------------------------------------ checks

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& distance,
                  const at::Tensor& lut, const at::Tensor& lengths) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0 && k.size(2) == q.size(2) && k.size(3) == q.size(3) && v.dim() == 4 &&
                  v.size(0) == q.size(0) && v.size(1) == k.size(1) && v.size(2) == q.size(2),
              "q must be [B, H, N, D], k [B, H_kv, N, D] and v [B, H_kv, N, Dv] with H % H_kv == 0");
  for (const at::Tensor* t : {&q, &k, &v, &distance, &lut, &lengths}) {
    TORCH_CHECK(t->device().is_cpu(), "the CPU bias-attention kernels take CPU tensors");
  }
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "the CPU bias-attention kernels take float32, bfloat16 or float16");
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype, "q, k, v must share a dtype");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  TORCH_CHECK(distance.scalar_type() == at::kByte && distance.dim() == 3 && distance.size(0) == B &&
                  distance.size(1) == N && distance.size(2) == N,
              "distance must be uint8 [B, N, N]");
  TORCH_CHECK(lut.scalar_type() == at::kFloat && lut.dim() == 2 && lut.size(1) == 256 &&
                  (lut.size(0) == 1 || lut.size(0) == H),
              "lut must be float32 [1 or H, 256]");
  TORCH_CHECK(lengths.scalar_type() == at::kInt && lengths.dim() == 1 && lengths.size(0) == B,
              "lengths must be int32 [B]");
}

// fp32 with a contiguous last dim and rows at least a row apart (what the matrix products read).
at::Tensor as_rows(const at::Tensor& t) {
  at::Tensor f = t.scalar_type() == at::kFloat ? last_dim_contiguous(t) : t.to(at::kFloat).contiguous();
  // A size-1 dim may carry any stride (contiguous() keeps it): the BLAS needs row strides of at least a row.
  if (f.stride(2) < f.size(3)) f = at::empty(f.sizes(), f.options()).copy_(f);
  return f;
}

Problem make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& distance,
                     const at::Tensor& lut, const at::Tensor& lengths, double scale, int64_t window, bool causal,
                     int64_t position_window, int64_t block_m, int64_t span) {
  Problem P{};
  P.block_m = block_m, P.span = span;
  P.B = q.size(0), P.H = q.size(1), P.N = q.size(2), P.D = q.size(3), P.Dv = v.size(3);
  P.H_kv = k.size(1), P.group = P.H / P.H_kv;
  P.nQ = (P.N + P.block_m - 1) / P.block_m;
  P.nK = (P.N + kTileN - 1) / kTileN;
  P.q = q.data_ptr<float>(), P.k = k.data_ptr<float>(), P.v = v.data_ptr<float>();
  P.q_b = q.stride(0), P.q_h = q.stride(1), P.q_n = q.stride(2);
  P.k_b = k.stride(0), P.k_h = k.stride(1), P.k_n = k.stride(2);
  P.v_b = v.stride(0), P.v_h = v.stride(1), P.v_n = v.stride(2);
  P.dist = distance.data_ptr<uint8_t>();
  P.d_b = distance.stride(0), P.d_i = distance.stride(1);
  P.lut = lut.data_ptr<float>();
  P.lut_h = lut.size(0) > 1 ? lut.stride(0) : 0;
  P.lengths = lengths.data_ptr<int32_t>();
  P.window = window;
  // Every |i - j| is below N: a wider window is none (clamped, so that i + w + 1 cannot overflow).
  P.position_window = position_window < 0 ? -1 : std::min(position_window, P.N);
  P.causal = causal;
  P.scale = static_cast<float>(scale);
  P.scale2 = static_cast<float>(scale) * kLog2e;
  return P;
}

// Attention dropout's arguments: threshold a uint32 (a pair is kept when its random word is >= threshold),
// keep_scale = 1 / (1 - p) > 0. Returns whether dropout is on (threshold 0 with keep_scale 1 is p = 0).
bool check_dropout(int64_t threshold, double keep_scale) {
  TORCH_CHECK(threshold >= 0 && threshold <= int64_t(0xFFFFFFFF), "dropout_threshold must be a uint32, got ",
              threshold);
  TORCH_CHECK(std::isfinite(keep_scale) && keep_scale >= 1.0, "keep_scale must be 1 / (1 - p) >= 1, got ",
              keep_scale);
  return threshold > 0 || keep_scale != 1.0;
}

// The Philox key is the seed's bit pattern (the uint64 seed passed as int64): low word, high word.
void set_dropout(Problem& P, int64_t seed, int64_t threshold, double keep_scale) {
  const uint64_t bits = static_cast<uint64_t>(seed);
  P.key0 = static_cast<uint32_t>(bits & 0xFFFFFFFFu);
  P.key1 = static_cast<uint32_t>(bits >> 32);
  P.threshold = static_cast<uint32_t>(threshold);
  P.keep_scale = static_cast<float>(keep_scale);
}

// T5's relative-position term: position_lut float32 [H, 2 * reach + 1] (reach >= 0), or none (an empty tensor or
// reach < 0). Returns whether it is given.
bool check_positions(const at::Tensor& position_lut, int64_t reach, int64_t H) {
  if (reach < 0 || !position_lut.defined() || position_lut.numel() == 0) return false;
  TORCH_CHECK(position_lut.device().is_cpu() && position_lut.scalar_type() == at::kFloat &&
                  position_lut.dim() == 2 && position_lut.size(0) == H && position_lut.size(1) == 2 * reach + 1,
              "position_lut must be a CPU float32 [H, 2 * reach + 1] tensor (H = q's heads), got ",
              position_lut.sizes(), " for reach ", reach);
  return true;
}

// Each head's position LUT spread over the offsets of N positions: float32 [H, 2N] (spread_positions; the last
// entry of a row unused).
at::Tensor spread_lut(const at::Tensor& position_lut, int64_t reach, int64_t H, int64_t N) {
  const at::Tensor plut = position_lut.contiguous();
  at::Tensor ext = at::zeros({H, 2 * std::max<int64_t>(N, 1)}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t h = 0; h < H; ++h) {
    spread_positions(ext.data_ptr<float>() + h * 2 * std::max<int64_t>(N, 1), plut.data_ptr<float>() + h * (2 * reach + 1),
                     reach, N);
  }
  return ext;
}

}  // namespace

void bias_attention_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& distance_in, const at::Tensor& lut_in, const at::Tensor& lengths_in,
                                double scale, int64_t window, bool causal, int64_t position_window,
                                int64_t dropout_seed, int64_t dropout_threshold, double keep_scale, at::Tensor& out,
                                at::Tensor& lse, const at::Tensor& position_lut, int64_t reach) {
  check_inputs(q_in, k_in, v_in, distance_in, lut_in, lengths_in);
  const bool positions = check_positions(position_lut, reach, q_in.size(1));
  const bool dropout = check_dropout(dropout_threshold, keep_scale);
  const int64_t B = q_in.size(0), H = q_in.size(1), N = q_in.size(2), Dv = v_in.size(3);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == q_in.scalar_type() && out.dim() == 4 && out.size(0) == B &&
                  out.size(1) == H && out.size(2) == N && out.size(3) == Dv,
              "out must be a contiguous [B, H, N, Dv] tensor in q's dtype");
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == at::kFloat && lse.numel() == B * H * N,
              "lse must be a contiguous float32 [B, H, N] tensor");
  if (B * H * N == 0) return;
  TORCH_CHECK(q_in.size(3) > 0 && Dv > 0, "the CPU bias-attention kernels need head dims of at least 1");
  const at::Tensor q = as_rows(q_in), k = as_rows(k_in), v = as_rows(v_in);
  const at::Tensor distance = last_dim_contiguous(distance_in), lut = lut_in.contiguous();
  const at::Tensor lengths = lengths_in.contiguous();
  Problem P = make_problem(q, k, v, distance, lut, lengths, scale, window, causal, position_window, kForwardBlockM,
                           kForwardSpan);
  set_dropout(P, dropout_seed, dropout_threshold, keep_scale);
  at::Tensor minima;
  if (window >= 0) {
    minima = tile_minima(distance, P.block_m, P.nQ, P.nK);
    P.tile_min = minima.data_ptr<uint8_t>();
  }
  const at::Tensor pos_ext = positions ? spread_lut(position_lut, reach, H, N) : at::Tensor();
  if (positions) P.pos_ext = pos_ext.data_ptr<float>(), P.reach = reach;
  at::Tensor out32 = out.scalar_type() == at::kFloat ? out : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  advise_huge_pages(out32);
  P.out = out32.data_ptr<float>();
  P.lse = lse.data_ptr<float>();
  {
    pybind11::gil_scoped_release release;
    at::parallel_for(0, B * H * P.nQ, grain(P.block_m * N * (P.D + Dv)), [&](int64_t begin, int64_t end) {
      if (dropout) {
        SK_RUN_PASS(forward_dropout_tasks, P, begin, end);
      } else {
        SK_RUN_PASS(forward_tasks, P, begin, end);
      }
    });
  }
  if (!out32.is_same(out)) out.copy_(out32);
}

void bias_attention_backward_cpu(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, const at::Tensor& lse, const at::Tensor& distance_in,
                                 const at::Tensor& lut_in, const at::Tensor& lengths_in,
                                 const at::Tensor& bucket_index_in, double scale, int64_t window, bool causal,
                                 int64_t position_window, bool table_grad, int64_t dropout_seed,
                                 int64_t dropout_threshold, double keep_scale, at::Tensor& dq, at::Tensor& dk,
                                 at::Tensor& dv, at::Tensor& bucket_grad, const at::Tensor& position_lut,
                                 int64_t reach, bool position_grad_wanted, at::Tensor& position_grad) {
  check_inputs(q_in, k_in, v_in, distance_in, lut_in, lengths_in);
  const bool positions = check_positions(position_lut, reach, q_in.size(1));
  const bool pos_grad = positions && position_grad_wanted;
  if (positions) {
    TORCH_CHECK(position_grad.is_contiguous() && position_grad.scalar_type() == at::kFloat &&
                    position_grad.dim() == 2 && position_grad.size(0) == q_in.size(1) &&
                    position_grad.size(1) == 2 * reach + 1,
                "position_grad must be a contiguous float32 [H, 2 * reach + 1] tensor");
    position_grad.zero_();
  }
  const bool dropout = check_dropout(dropout_threshold, keep_scale);
  const int64_t B = q_in.size(0), H = q_in.size(1), N = q_in.size(2), D = q_in.size(3), Dv = v_in.size(3);
  TORCH_CHECK(dout_in.dim() == 4 && dout_in.size(0) == B && dout_in.size(1) == H && dout_in.size(2) == N &&
                  dout_in.size(3) == Dv && dout_in.scalar_type() == q_in.scalar_type(),
              "dout must be [B, H, N, Dv] in q's dtype");
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == at::kFloat && lse.numel() == B * H * N,
              "lse must be the forward's contiguous float32 [B, H, N] tensor");
  TORCH_CHECK(dq.is_contiguous() && dq.scalar_type() == q_in.scalar_type() && dq.sizes() == q_in.sizes(),
              "dq must be a contiguous [B, H, N, D] tensor in q's dtype");
  TORCH_CHECK(dk.is_contiguous() && dk.scalar_type() == q_in.scalar_type() && dk.sizes() == k_in.sizes(),
              "dk must be a contiguous [B, H_kv, N, D] tensor in q's dtype");
  TORCH_CHECK(dv.is_contiguous() && dv.scalar_type() == q_in.scalar_type() && dv.sizes() == v_in.sizes(),
              "dv must be a contiguous [B, H_kv, N, Dv] tensor in q's dtype");
  const at::Tensor bucket_index = bucket_index_in.to(at::kLong).contiguous();
  TORCH_CHECK(bucket_index.numel() == 256, "bucket_index must hold 256 entries");
  const int64_t rows = lut_in.size(0), T = bucket_grad.dim() == 2 ? bucket_grad.size(1) : -1;
  TORCH_CHECK(bucket_grad.is_contiguous() && bucket_grad.scalar_type() == at::kFloat && bucket_grad.dim() == 2 &&
                  bucket_grad.size(0) == rows,
              "bucket_grad must be a contiguous float32 [1 or H, T] tensor");
  const int64_t* bucket_of = bucket_index.data_ptr<int64_t>();
  for (int64_t d = 0; d < 256; ++d) {
    TORCH_CHECK(bucket_of[d] >= 0 && bucket_of[d] < T, "bucket_index[", d, "] = ", bucket_of[d], " is outside 0..",
                T - 1);
  }
  bucket_grad.zero_();
  if (B * H * N == 0) {
    dq.zero_(), dk.zero_(), dv.zero_();
    return;
  }
  TORCH_CHECK(D > 0 && Dv > 0, "the CPU bias-attention kernels need head dims of at least 1");
  const at::Tensor q = as_rows(q_in), k = as_rows(k_in), v = as_rows(v_in), dout = as_rows(dout_in);
  const at::Tensor distance = last_dim_contiguous(distance_in), lut = lut_in.contiguous();
  const at::Tensor lengths = lengths_in.contiguous();
  Problem P = make_problem(q, k, v, distance, lut, lengths, scale, window, causal, position_window, kBackwardBlockM,
                           kBackwardSpan);
  set_dropout(P, dropout_seed, dropout_threshold, keep_scale);
  at::Tensor minima;
  if (window >= 0) {
    minima = tile_minima(distance, P.block_m, P.nQ, P.nK);
    P.tile_min = minima.data_ptr<uint8_t>();
  }
  P.lse = const_cast<float*>(lse.data_ptr<float>());
  P.dout = dout.data_ptr<float>();
  P.g_b = dout.stride(0), P.g_h = dout.stride(1), P.g_n = dout.stride(2);
  auto accumulator = [](at::Tensor& g) {
    at::Tensor acc = g.scalar_type() == at::kFloat ? g : at::empty(g.sizes(), g.options().dtype(at::kFloat));
    advise_huge_pages(acc);
    acc.zero_();
    return acc;
  };
  at::Tensor dq32 = accumulator(dq), dk32 = accumulator(dk), dv32 = accumulator(dv);
  P.dq = dq32.data_ptr<float>(), P.dk = dk32.data_ptr<float>(), P.dv = dv32.data_ptr<float>();
  at::Tensor hist;
  if (table_grad) {
    hist = at::zeros({B * H, 256}, at::TensorOptions().dtype(at::kDouble));
    P.hist = hist.data_ptr<double>();
  }
  const at::Tensor pos_ext = positions ? spread_lut(position_lut, reach, H, N) : at::Tensor();
  if (positions) P.pos_ext = pos_ext.data_ptr<float>(), P.reach = reach;
  at::Tensor pos_hist;
  if (pos_grad) {
    pos_hist = at::zeros({B * H, 2 * reach + 1}, at::TensorOptions().dtype(at::kDouble));
    P.pos_hist = pos_hist.data_ptr<double>();
  }
  {
    pybind11::gil_scoped_release release;
    // One task per (b, key/value head): it owns that head's dK and dV (its group's query heads walked inside).
    at::parallel_for(0, B * P.H_kv, grain(P.group * 2 * N * N * (D + Dv)), [&](int64_t begin, int64_t end) {
      if (dropout) {
        SK_RUN_PASS(backward_dropout_tasks, P, begin, end);
      } else {
        SK_RUN_PASS(backward_tasks, P, begin, end);
      }
    });
  }
  if (!dq32.is_same(dq)) dq.copy_(dq32);
  if (!dk32.is_same(dk)) dk.copy_(dk32);
  if (!dv32.is_same(dv)) dv.copy_(dv32);
  if (table_grad) {
    // Fold the tasks' distance sums into buckets, (b, h) in order: the same bits for any thread count.
    std::vector<double> sums(static_cast<size_t>(rows * T), 0.0);
    const double* h_sums = hist.data_ptr<double>();
    for (int64_t bh = 0; bh < B * H; ++bh) {
      double* row = sums.data() + (rows > 1 ? bh % H : 0) * T;
      for (int64_t d = 0; d < 256; ++d) row[bucket_of[d]] += h_sums[bh * 256 + d];
    }
    float* g = bucket_grad.data_ptr<float>();
    for (int64_t e = 0; e < rows * T; ++e) g[e] = static_cast<float>(sums[static_cast<size_t>(e)]);
  }
  if (pos_grad) {
    // The per-(b, h) offset sums folded over the batch in b order: the same bits for any thread count.
    const int64_t width = 2 * reach + 1;
    std::vector<double> sums(static_cast<size_t>(H * width), 0.0);
    const double* p_sums = pos_hist.data_ptr<double>();
    for (int64_t bh = 0; bh < B * H; ++bh) {
      double* row = sums.data() + (bh % H) * width;
      for (int64_t e = 0; e < width; ++e) row[e] += p_sums[bh * width + e];
    }
    float* g = position_grad.data_ptr<float>();
    for (int64_t e = 0; e < H * width; ++e) g[e] = static_cast<float>(sums[static_cast<size_t>(e)]);
  }
}

}  // namespace syntaxkernels
