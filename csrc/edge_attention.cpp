// CPU edge-list attention (see edge_attention.h for the contract).
//
// Forward, rows in the order of out (b, r, h, i): the row's scores s_j = scale * q_i . k_j are kept in a small
// buffer, then p_j = exp(s_j - max) and out = sum p_j v_j / sum p_j (two passes over the list: one exp per edge,
// no rescaling of the accumulator).
// Backward (p_e = exp(s_e - lse_ri), dp_e = dO_ri . v_j, ds_e = p_e (dp_e - delta_ri), delta_ri = dO_ri . O_ri
// = sum_e p_e dp_e over the row, formed from the edges so O is never read):
//   dq_i = scale * sum over the edges of row i, every relation: ds_e k_j           (rows (b, h, i))
//   dk_j = scale * sum over the transposed edges of key j: ds_e q_i, dv_j = sum p_e dO_ri   (rows (b, h, j))
// The first pass also stores delta; the second reads it. A row with a single key (every child_d row) is a
// gather: out = v_j, and its ds is 0 (only dv receives dO). Scores and softmax in float (double for double).
//
// Attention dropout (dropout_p > 0): edge e of relation r is kept or dropped by the Philox mask of seed
// stream_seed(seed, r) (philox.h), m_e = keep_e / (1 - p) or 0; the forward sums p_e m_e v_j over the undropped
// normaliser, and the backward regenerates m_e: dp_e = m_e dO_ri . v_j, dv_j += p_e m_e dO_ri, and ds_e =
// p_e (dp_e - delta_ri) with delta_ri = sum_e p_e dp_e = dO_ri . O_ri of the dropped output.
#include "edge_attention.h"

#include "cpu_support.h"
#include "philox.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace syntaxkernels {
namespace {

using cpu::AccOf;
using cpu::advise_huge_pages;
using cpu::last_dim_contiguous;
#if defined(__GNUC__)
using cpu::Lanes;
using cpu::load_vec;
#endif

// ------------------------------------------------------------------------------------------------ vector helpers

// a . b over n entries; a fixed summation order (two vector accumulators, then the lanes in order).
template <typename T>
SK_INLINE T dot(const T* a, const T* b, int64_t n) {
#if defined(__GNUC__)
  using V = typename Lanes<T>::Vec;
  constexpr int64_t W = Lanes<T>::kWidth;
  V s0 = {}, s1 = {};
  int64_t d = 0;
  for (; d + 2 * W <= n; d += 2 * W) {
    s0 += load_vec<V>(a + d) * load_vec<V>(b + d);
    s1 += load_vec<V>(a + d + W) * load_vec<V>(b + d + W);
  }
  if (d + W <= n) {
    s0 += load_vec<V>(a + d) * load_vec<V>(b + d);
    d += W;
  }
  s0 += s1;
  T s = 0;
  for (int64_t l = 0; l < W; ++l) s += s0[l];
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
#else
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
#endif
}

// y += alpha * x
template <typename T>
SK_INLINE void axpy(T* __restrict y, T alpha, const T* __restrict x, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

// A row of n entries in the accumulation type: the row itself when the types agree, else a converted copy.
template <typename scalar_t, typename acc_t>
SK_INLINE const acc_t* as_acc(const scalar_t* src, acc_t* buffer, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    (void)buffer;
    (void)n;
    return src;
  } else {
    for (int64_t d = 0; d < n; ++d) buffer[d] = static_cast<acc_t>(src[d]);
    return buffer;
  }
}

// Whether x[0..n) holds no NaN or infinity (x in the accumulation type).
template <typename T>
SK_INLINE bool all_finite(const T* x, int64_t n) {
  bool finite = true;
  for (int64_t d = 0; d < n; ++d) finite &= std::isfinite(x[d]);
  return finite;
}

template <typename scalar_t, typename acc_t>
SK_INLINE void store_row(scalar_t* dst, const acc_t* src, acc_t factor, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<scalar_t>(src[d] * factor);
}

// ------------------------------------------------------------------------------------------------ the problem

template <typename scalar_t>
struct Problem {
  using acc_t = typename AccOf<scalar_t>::type;
  int64_t B, H, N, D, Dv, R;
  const scalar_t *q, *k, *v;
  int64_t q_b, q_h, q_n, k_b, k_h, k_n, v_b, v_h, v_n;
  const int32_t *row_ptr, *col, *rel, *t_ptr, *t_col, *t_rel;
  acc_t scale;
  // forward outputs / backward inputs: [B, R, H, N, Dv] with strides; lse, delta contiguous [B, R, H, N]
  scalar_t* out;
  int64_t o_b, o_r, o_h, o_n;
  const scalar_t* dout;
  int64_t g_b, g_r, g_h, g_n;
  acc_t* lse;
  acc_t* delta;
  // gradients, contiguous
  scalar_t *dq, *dk, *dv;
  // attention dropout: off unless ``dropout``; relation r draws its mask with stream_seed(seed, r). token_item,
  // token_pos ([B * N], or null for (b, i)): a token's item and position in the mask's numbering (a packed row:
  // its sequence and its position in it).
  bool dropout = false;
  uint64_t seed = 0;
  uint32_t threshold = 0;
  acc_t keep_scale = 1;
  const int32_t* token_item = nullptr;
  const int32_t* token_pos = nullptr;

  const scalar_t* q_row(int64_t b, int64_t h, int64_t i) const { return q + b * q_b + h * q_h + i * q_n; }
  const scalar_t* k_row(int64_t b, int64_t h, int64_t j) const { return k + b * k_b + h * k_h + j * k_n; }
  const scalar_t* v_row(int64_t b, int64_t h, int64_t j) const { return v + b * v_b + h * v_h + j * v_n; }
  int64_t stat(int64_t b, int64_t r, int64_t h, int64_t i) const { return ((b * R + r) * H + h) * N + i; }
  // m_e of pair (query i, key j) of relation r, head h, item b: 1 without dropout, else 1 / (1 - p) if kept, 0 if not.
  acc_t keep_factor(int64_t b, int64_t r, int64_t h, int64_t i, int64_t j) const {
    if (!dropout) return acc_t(1);
    int64_t item = b, row = i, col_ = j;
    if (token_item != nullptr) {
      item = token_item[b * N + i];
      row = token_pos[b * N + i];
      col_ = token_pos[b * N + j];
    }
    const bool kept = philox::keep(philox::stream_seed(seed, static_cast<uint64_t>(r)), threshold,
                                   static_cast<uint32_t>(item * H + h), static_cast<uint32_t>(row),
                                   static_cast<uint32_t>(col_));
    return kept ? keep_scale : acc_t(0);
  }
};

// Whether row (b, r, h, i), which holds one key, is a plain gather for the backward: p = 1 and ds = 0 exactly, so
// it adds dO to dv and nothing to dq or dk. True when its score (the forward's lse) and its value row are finite;
// a NaN or infinite one takes the general path, whose NaNs reach dq and dk as the reference's do. ``buffer``
// holds Dv values of the accumulation type.
template <typename scalar_t>
SK_INLINE bool gather_row(const Problem<scalar_t>& P, int64_t b, int64_t r, int64_t h, int64_t i,
                          typename AccOf<scalar_t>::type* buffer) {
  const int32_t* ptr = P.row_ptr + (b * P.N + i) * P.R + r;
  if (ptr[1] - ptr[0] != 1 || !std::isfinite(P.lse[P.stat(b, r, h, i)])) return false;
  return all_finite(as_acc(P.v_row(b, h, P.col[ptr[0]]), buffer, P.Dv), P.Dv);
}

// Forward of the output rows [begin, end) of the flattened (b, r, h, i): the order of out, so every write is
// sequential and a task's gathers stay inside one (b, h) slice of k and v.
template <typename scalar_t>
SK_INLINE void forward_rows_impl(const Problem<scalar_t>& P, int64_t begin, int64_t end) {
  using acc_t = typename AccOf<scalar_t>::type;
  std::vector<acc_t> q_buffer(static_cast<size_t>(P.D)), k_buffer(static_cast<size_t>(P.D));
  std::vector<acc_t> v_buffer(static_cast<size_t>(P.Dv)), acc(static_cast<size_t>(P.Dv));
  std::vector<acc_t> scores;
  const acc_t inf = std::numeric_limits<acc_t>::infinity();
  for (int64_t row = begin; row < end; ++row) {
    const int64_t i = row % P.N, h = (row / P.N) % P.H, r = (row / (P.N * P.H)) % P.R, b = row / (P.N * P.H * P.R);
    const int32_t* ptr = P.row_ptr + (b * P.N + i) * P.R + r;
    const int32_t start = ptr[0], count = ptr[1] - ptr[0];
    scalar_t* o = P.out + b * P.o_b + r * P.o_r + h * P.o_h + i * P.o_n;
    acc_t* lse = P.lse + row;  // lse is [B, R, H, N], contiguous: the same flattening
    if (count == 0) {
      std::fill(o, o + P.Dv, scalar_t(0));
      *lse = inf;
      continue;
    }
    const acc_t* qi = as_acc(P.q_row(b, h, i), q_buffer.data(), P.D);
    if (count == 1) {  // a gather: p = 1 (every child_d row, many parent_d rows), when the score is finite
      const scalar_t* vj = P.v_row(b, h, P.col[start]);
      const acc_t s = P.scale * dot(qi, as_acc(P.k_row(b, h, P.col[start]), k_buffer.data(), P.D), P.D);
      if (std::isfinite(s)) {
        *lse = s;
        if (P.dropout) {
          store_row(o, as_acc(vj, v_buffer.data(), P.Dv), P.keep_factor(b, r, h, i, P.col[start]), P.Dv);
        } else {
          std::copy(vj, vj + P.Dv, o);
        }
        continue;
      }
      // A NaN or infinite score: p = exp(s - s) is NaN, as in the reference; the row and its lse are NaN (the
      // backward reads a non-finite lse as "not a gather" and propagates it).
      std::fill(o, o + P.Dv, static_cast<scalar_t>(std::numeric_limits<acc_t>::quiet_NaN()));
      *lse = std::numeric_limits<acc_t>::quiet_NaN();
      continue;
    }
    if (scores.size() < static_cast<size_t>(count)) scores.resize(static_cast<size_t>(count));
    acc_t row_max = -inf;
    for (int32_t t = 0; t < count; ++t) {
      const acc_t* kj = as_acc(P.k_row(b, h, P.col[start + t]), k_buffer.data(), P.D);
      const acc_t s = P.scale * dot(qi, kj, P.D);
      scores[static_cast<size_t>(t)] = s;
      row_max = std::max(row_max, s);
    }
    acc_t sum = 0;
    std::fill(acc.begin(), acc.end(), acc_t(0));
    for (int32_t t = 0; t < count; ++t) {
      const acc_t p = std::exp(scores[static_cast<size_t>(t)] - row_max);
      sum += p;  // the undropped normaliser
      const acc_t m = P.keep_factor(b, r, h, i, P.col[start + t]);
      axpy(acc.data(), p * m, as_acc(P.v_row(b, h, P.col[start + t]), v_buffer.data(), P.Dv), P.Dv);
    }
    store_row(o, acc.data(), acc_t(1) / sum, P.Dv);
    *lse = row_max + std::log(sum);
  }
}

// dq of the rows [begin, end) of the flattened (b, h, i) (the order of dq); stores delta for the dk/dv pass.
// Per row with two or more keys: p_e and dp_e of every edge, delta = sum_e p_e dp_e (= dO . O, without reading
// O), then dq += p_e (dp_e - delta) k_j. A row with one key has p = 1 and ds = dp - delta = 0: it adds nothing to
// dq or dk (unless its score or value is not finite: gather_row).
template <typename scalar_t>
SK_INLINE void dq_rows_impl(const Problem<scalar_t>& P, int64_t begin, int64_t end) {
  using acc_t = typename AccOf<scalar_t>::type;
  std::vector<acc_t> q_buffer(static_cast<size_t>(P.D)), k_buffer(static_cast<size_t>(P.D));
  std::vector<acc_t> v_buffer(static_cast<size_t>(P.Dv)), do_buffer(static_cast<size_t>(P.Dv));
  std::vector<acc_t> grad(static_cast<size_t>(P.D)), p(16), dp(16);
  for (int64_t row = begin; row < end; ++row) {
    const int64_t i = row % P.N, h = (row / P.N) % P.H, b = row / (P.N * P.H);
    const int32_t* ptr = P.row_ptr + (b * P.N + i) * P.R;
    scalar_t* dq = P.dq + row * P.D;
    if (ptr[P.R] - ptr[0] <= P.R) {  // every relation row holds at most one key (with a finite score): dq = 0
      bool single = true;
      for (int64_t r = 0; r < P.R && single; ++r) {
        single = ptr[r + 1] - ptr[r] == 0 || gather_row(P, b, r, h, i, v_buffer.data());
      }
      if (single) {
        std::fill_n(dq, P.D, scalar_t(0));
        continue;
      }
    }
    {
      const acc_t* qi = as_acc(P.q_row(b, h, i), q_buffer.data(), P.D);
      std::fill(grad.begin(), grad.end(), acc_t(0));
      for (int64_t r = 0; r < P.R; ++r) {
        const int32_t start = ptr[r], count = ptr[r + 1] - ptr[r];
        if (count == 0 || (count == 1 && gather_row(P, b, r, h, i, v_buffer.data()))) continue;  // adds nothing
        if (p.size() < static_cast<size_t>(count)) {
          p.resize(static_cast<size_t>(count));
          dp.resize(static_cast<size_t>(count));
        }
        const int64_t s_index = P.stat(b, r, h, i);
        const acc_t* dO = as_acc(P.dout + b * P.g_b + r * P.g_r + h * P.g_h + i * P.g_n, do_buffer.data(), P.Dv);
        const acc_t lse = P.lse[s_index];
        acc_t delta = 0;
        for (int32_t t = 0; t < count; ++t) {
          const int64_t j = P.col[start + t];
          const acc_t pe = std::exp(P.scale * dot(qi, as_acc(P.k_row(b, h, j), k_buffer.data(), P.D), P.D) - lse);
          const acc_t dpe = P.keep_factor(b, r, h, i, j) * dot(dO, as_acc(P.v_row(b, h, j), v_buffer.data(), P.Dv), P.Dv);
          p[static_cast<size_t>(t)] = pe;
          dp[static_cast<size_t>(t)] = dpe;
          delta += pe * dpe;
        }
        P.delta[s_index] = delta;
        for (int32_t t = 0; t < count; ++t) {
          const acc_t ds = p[static_cast<size_t>(t)] * (dp[static_cast<size_t>(t)] - delta);
          axpy(grad.data(), ds, as_acc(P.k_row(b, h, P.col[start + t]), k_buffer.data(), P.D), P.D);
        }
      }
      store_row(dq, grad.data(), P.scale, P.D);
    }
  }
}

// dk and dv of the key rows [begin, end) of the flattened (b, h, j) (the order of dk, dv), over the transposed
// lists. An edge whose query row holds only this key has p = 1 and ds = 0: it adds dO to dv and nothing to dk
// (unless its score or value is not finite: gather_row).
template <typename scalar_t>
SK_INLINE void dkdv_rows_impl(const Problem<scalar_t>& P, int64_t begin, int64_t end) {
  using acc_t = typename AccOf<scalar_t>::type;
  std::vector<acc_t> q_buffer(static_cast<size_t>(P.D)), k_buffer(static_cast<size_t>(P.D));
  std::vector<acc_t> v_buffer(static_cast<size_t>(P.Dv)), do_buffer(static_cast<size_t>(P.Dv));
  std::vector<acc_t> grad_k(static_cast<size_t>(P.D)), grad_v(static_cast<size_t>(P.Dv));
  for (int64_t row = begin; row < end; ++row) {
    const int64_t j = row % P.N, h = (row / P.N) % P.H, b = row / (P.N * P.H);
    const int32_t start = P.t_ptr[(b * P.N + j) * P.R], stop = P.t_ptr[(b * P.N + j + 1) * P.R];
    {
      scalar_t* dk = P.dk + row * P.D;
      scalar_t* dv = P.dv + row * P.Dv;
      if (start == stop) {
        std::fill_n(dk, P.D, scalar_t(0));
        std::fill_n(dv, P.Dv, scalar_t(0));
        continue;
      }
      const acc_t* kj = as_acc(P.k_row(b, h, j), k_buffer.data(), P.D);
      const acc_t* vj = as_acc(P.v_row(b, h, j), v_buffer.data(), P.Dv);
      const bool vj_finite = all_finite(vj, P.Dv);
      std::fill(grad_k.begin(), grad_k.end(), acc_t(0));
      std::fill(grad_v.begin(), grad_v.end(), acc_t(0));
      for (int32_t e = start; e < stop; ++e) {
        const int64_t i = P.t_col[e], r = P.t_rel[e];
        const acc_t* dO = as_acc(P.dout + b * P.g_b + r * P.g_r + h * P.g_h + i * P.g_n, do_buffer.data(), P.Dv);
        const int32_t* query_row = P.row_ptr + (b * P.N + i) * P.R + r;
        const int64_t s_index = P.stat(b, r, h, i);
        const acc_t m = P.keep_factor(b, r, h, i, j);
        if (query_row[1] - query_row[0] == 1 && vj_finite && std::isfinite(P.lse[s_index])) {  // a gather
          axpy(grad_v.data(), m, dO, P.Dv);
          continue;
        }
        const acc_t* qi = as_acc(P.q_row(b, h, i), q_buffer.data(), P.D);
        const acc_t p = std::exp(P.scale * dot(qi, kj, P.D) - P.lse[s_index]);
        const acc_t dp = m * dot(dO, vj, P.Dv);
        axpy(grad_k.data(), p * (dp - P.delta[s_index]), qi, P.D);
        axpy(grad_v.data(), p * m, dO, P.Dv);
      }
      store_row(dk, grad_k.data(), P.scale, P.D);
      store_row(dv, grad_v.data(), acc_t(1), P.Dv);
    }
  }
}

SK_DEFINE_PASS(forward_rows)
SK_DEFINE_PASS(dq_rows)
SK_DEFINE_PASS(dkdv_rows)

// Rows per task: enough work to amortise a task (~32k multiply-adds), at least one row.
int64_t grain(int64_t rows, int64_t edges, int64_t H, int64_t D) {
  const int64_t per_row = std::max<int64_t>(1, (edges / std::max<int64_t>(rows, 1) + 1) * H * D);
  return std::max<int64_t>(1, 32768 / per_row);
}

// ------------------------------------------------------------------------------------------------ checks

// The lists must index inside the tensors: offsets from 0 to E, never decreasing, tokens in 0..N-1 and
// relations in 0..R-1 (relation may be undefined). O(rows + E), small beside the attention itself.
void check_lists(const at::Tensor& ptr, const at::Tensor& index, const at::Tensor& relation, int64_t rows,
                 int64_t N, int64_t R, const char* name) {
  const bool has_relation = relation.defined();
  TORCH_CHECK(ptr.device().is_cpu() && index.device().is_cpu() && (!has_relation || relation.device().is_cpu()),
              name, " lists must be CPU tensors");
  TORCH_CHECK(ptr.scalar_type() == at::kInt && index.scalar_type() == at::kInt &&
                  (!has_relation || relation.scalar_type() == at::kInt),
              name, " lists must be int32");
  TORCH_CHECK(ptr.dim() == 1 && ptr.numel() == rows + 1 && ptr.is_contiguous(), name,
              " offsets must be a contiguous int32 tensor of B * N * R + 1 = ", rows + 1, " entries, got ",
              ptr.numel());
  TORCH_CHECK(index.dim() == 1 && index.is_contiguous(), name, " indices must be a contiguous int32 vector");
  TORCH_CHECK(!has_relation || (relation.dim() == 1 && relation.is_contiguous() && relation.numel() == index.numel()),
              name, " relations must be a contiguous int32 vector as long as the indices");
  const int32_t* p = ptr.data_ptr<int32_t>();
  const int32_t* x = index.data_ptr<int32_t>();
  TORCH_CHECK(p[0] == 0 && p[rows] == index.numel(), name, " offsets must run from 0 to the number of edges");
  for (int64_t row = 0; row < rows; ++row) {
    TORCH_CHECK(p[row] <= p[row + 1], name, " offsets must not decrease (row ", row, ")");
  }
  for (int64_t e = 0; e < index.numel(); ++e) {
    TORCH_CHECK(x[e] >= 0 && x[e] < N, name, " edge ", e, " names token ", x[e], " outside 0..", N - 1);
  }
  if (has_relation) {
    const int32_t* r = relation.data_ptr<int32_t>();
    for (int64_t e = 0; e < relation.numel(); ++e) {
      TORCH_CHECK(r[e] >= 0 && r[e] < R, name, " edge ", e, " names relation ", r[e], " outside 0..", R - 1);
    }
  }
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(0) == q.size(0) &&
                  v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "q, k must be [B, H, N, D] and v [B, H, N, Dv]");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "q, k, v must be CPU tensors");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), "q, k, v must share a dtype");
}

template <typename scalar_t>
Problem<scalar_t> make_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t R,
                               double scale) {
  Problem<scalar_t> P{};
  P.B = q.size(0);
  P.H = q.size(1);
  P.N = q.size(2);
  P.D = q.size(3);
  P.Dv = v.size(3);
  P.R = R;
  P.q = q.data_ptr<scalar_t>();
  P.k = k.data_ptr<scalar_t>();
  P.v = v.data_ptr<scalar_t>();
  P.q_b = q.stride(0), P.q_h = q.stride(1), P.q_n = q.stride(2);
  P.k_b = k.stride(0), P.k_h = k.stride(1), P.k_n = k.stride(2);
  P.v_b = v.stride(0), P.v_h = v.stride(1), P.v_n = v.stride(2);
  P.scale = static_cast<typename AccOf<scalar_t>::type>(scale);
  return P;
}

// Attention dropout's arguments into P: dropout_p in [0, 1) (0: off), seed (the uint64 seed's bit pattern),
// token_item / token_pos (both or neither: int32 [B * N], a token's item and position in the mask's numbering).
template <typename scalar_t>
void set_dropout(Problem<scalar_t>& P, double dropout_p, int64_t seed, const std::optional<at::Tensor>& token_item,
                 const std::optional<at::Tensor>& token_pos) {
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "dropout_p must be in [0, 1), got ", dropout_p);
  const bool has_item = token_item.has_value() && token_item->defined();
  const bool has_pos = token_pos.has_value() && token_pos->defined();
  TORCH_CHECK(has_item == has_pos, "token_item and token_pos come together");
  if (dropout_p == 0.0) return;
  P.dropout = true;
  P.seed = static_cast<uint64_t>(seed);
  // reference.dropout_threshold: floor(p * 2^32) (exact in double), at most 2^32 - 1
  P.threshold = static_cast<uint32_t>(std::min(std::floor(dropout_p * 4294967296.0), 4294967295.0));
  P.keep_scale = static_cast<typename AccOf<scalar_t>::type>(1.0 / (1.0 - dropout_p));
  if (has_item) {
    for (const at::Tensor* t : {&*token_item, &*token_pos}) {
      TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kInt && t->is_contiguous() &&
                      t->numel() == P.B * P.N,
                  "token_item and token_pos must be contiguous int32 CPU tensors of B * N = ", P.B * P.N,
                  " entries");
    }
    P.token_item = token_item->data_ptr<int32_t>();
    P.token_pos = token_pos->data_ptr<int32_t>();
  }
}

}  // namespace

void edge_attention_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& row_ptr, const at::Tensor& col, double scale, at::Tensor& out,
                                at::Tensor& lse, double dropout_p, int64_t seed,
                                const std::optional<at::Tensor>& token_item,
                                const std::optional<at::Tensor>& token_pos) {
  check_qkv(q_in, k_in, v_in);
  const at::Tensor q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in), v = last_dim_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), Dv = v.size(3);
  TORCH_CHECK(out.dim() == 5 && out.size(0) == B && out.size(2) == H && out.size(3) == N && out.size(4) == Dv &&
                  out.stride(4) == 1 && out.scalar_type() == q.scalar_type(),
              "out must be [B, R, H, N, Dv] in q's dtype with a contiguous last dim");
  const int64_t R = out.size(1);
  const auto acc_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == acc_type && lse.dim() == 4 && lse.size(0) == B &&
                  lse.size(1) == R && lse.size(2) == H && lse.size(3) == N,
              "lse must be a contiguous [B, R, H, N] tensor in the accumulation dtype");
  check_lists(row_ptr, col, at::Tensor(), B * N * R, N, R, "row");
  if (B * N * R * H == 0) return;
  advise_huge_pages(out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "edge_attention_forward_cpu", [&] {
    Problem<scalar_t> P = make_problem<scalar_t>(q, k, v, R, scale);
    set_dropout(P, dropout_p, seed, token_item, token_pos);
    P.row_ptr = row_ptr.data_ptr<int32_t>();
    P.col = col.data_ptr<int32_t>();
    P.out = out.data_ptr<scalar_t>();
    P.o_b = out.stride(0), P.o_r = out.stride(1), P.o_h = out.stride(2), P.o_n = out.stride(3);
    P.lse = lse.data_ptr<typename AccOf<scalar_t>::type>();
    pybind11::gil_scoped_release release;
    at::parallel_for(0, B * R * H * N, grain(B * R * N, col.numel(), 1, P.D + Dv), [&](int64_t begin, int64_t end) {
      SK_RUN_PASS(forward_rows, P, begin, end);
    });
  });
}

void edge_attention_backward_cpu(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse,
                                 const at::Tensor& row_ptr, const at::Tensor& col, const at::Tensor& rel,
                                 const at::Tensor& t_ptr, const at::Tensor& t_col, const at::Tensor& t_rel,
                                 double scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, double dropout_p,
                                 int64_t seed, const std::optional<at::Tensor>& token_item,
                                 const std::optional<at::Tensor>& token_pos) {
  check_qkv(q_in, k_in, v_in);
  const at::Tensor q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in), v = last_dim_contiguous(v_in);
  const at::Tensor dout = last_dim_contiguous(dout_in), &out = out_in;  // out: shapes only (delta comes from the edges)
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  TORCH_CHECK(out.dim() == 5 && dout.sizes() == out.sizes() && out.size(0) == B && out.size(2) == H &&
                  out.size(3) == N && out.size(4) == Dv && out.scalar_type() == q.scalar_type() &&
                  dout.scalar_type() == q.scalar_type(),
              "out and dout must be [B, R, H, N, Dv] in q's dtype");
  const int64_t R = out.size(1);
  const auto acc_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == acc_type && lse.numel() == B * R * H * N,
              "lse must be the forward's [B, R, H, N] tensor");
  for (const at::Tensor* g : {&dq, &dk}) {
    TORCH_CHECK(g->is_contiguous() && g->scalar_type() == q.scalar_type() && g->sizes() == q.sizes(),
                "dq and dk must be contiguous [B, H, N, D] tensors in q's dtype");
  }
  TORCH_CHECK(dv.is_contiguous() && dv.scalar_type() == q.scalar_type() && dv.sizes() == v.sizes(),
              "dv must be a contiguous [B, H, N, Dv] tensor in q's dtype");
  check_lists(row_ptr, col, rel, B * N * R, N, R, "row");
  check_lists(t_ptr, t_col, t_rel, B * N * R, N, R, "transposed");
  TORCH_CHECK(t_col.numel() == col.numel(), "the transposed lists must hold as many edges as the lists");
  if (B * N * H == 0) return;
  for (const at::Tensor* g : {&dq, &dk, &dv}) advise_huge_pages(*g);
  at::Tensor delta = at::zeros_like(lse);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "edge_attention_backward_cpu", [&] {
    using acc_t = typename AccOf<scalar_t>::type;
    Problem<scalar_t> P = make_problem<scalar_t>(q, k, v, R, scale);
    set_dropout(P, dropout_p, seed, token_item, token_pos);
    P.row_ptr = row_ptr.data_ptr<int32_t>();
    P.col = col.data_ptr<int32_t>();
    P.rel = rel.data_ptr<int32_t>();
    P.t_ptr = t_ptr.data_ptr<int32_t>();
    P.t_col = t_col.data_ptr<int32_t>();
    P.t_rel = t_rel.data_ptr<int32_t>();
    P.dout = dout.data_ptr<scalar_t>();
    P.g_b = dout.stride(0), P.g_r = dout.stride(1), P.g_h = dout.stride(2), P.g_n = dout.stride(3);
    P.lse = const_cast<acc_t*>(lse.data_ptr<acc_t>());
    P.delta = delta.data_ptr<acc_t>();
    P.dq = dq.data_ptr<scalar_t>();
    P.dk = dk.data_ptr<scalar_t>();
    P.dv = dv.data_ptr<scalar_t>();
    pybind11::gil_scoped_release release;
    const int64_t g = grain(B * N, col.numel(), 1, 2 * D + Dv);
    at::parallel_for(0, B * H * N, g, [&](int64_t begin, int64_t end) { SK_RUN_PASS(dq_rows, P, begin, end); });
    at::parallel_for(0, B * H * N, g, [&](int64_t begin, int64_t end) { SK_RUN_PASS(dkdv_rows, P, begin, end); });
  });
}

}  // namespace syntaxkernels
