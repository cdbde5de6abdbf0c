// Maximum spanning dependency trees (Chu-Liu/Edmonds): the torch-free core (see mst_decode.h for the contract).
#include "mst_decode.h"

#include "batch_items.h"
#include "tree_distance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace syntaxkernels {
namespace {

constexpr double kNoArc = -std::numeric_limits<double>::infinity();

// (roots_a, score_a) > (roots_b, score_b), lexicographically.
inline bool heavier(int64_t roots_a, double score_a, int64_t roots_b, double score_b) {
  return roots_a > roots_b || (roots_a == roots_b && score_a > score_b);
}

std::string format_score(float value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

std::string decode_tree_item(const std::string& where, const float* scores, int64_t length, int64_t stride,
                             int64_t* heads, MstWorkspace& w) {
  const int64_t n = length;
  for (int64_t h = 0; h < n; ++h) {
    for (int64_t d = 0; d < n; ++d) {
      const float s = scores[h * stride + d];
      if (std::isnan(s) || s == std::numeric_limits<float>::infinity()) {
        return where + ": scores[" + std::to_string(h) + ", " + std::to_string(d) + "] = " + format_score(s) +
               " (scores must be finite, or -inf for a forbidden arc)";
      }
    }
  }
  if (n == 0) return "";

  // Nodes: 0 = the artificial root, 1 + i = word i; a root arc 0 -> 1 + d weighs (-1, scores[d, d]).
  const int64_t m = n + 1;
  const size_t mm = static_cast<size_t>(m * m);
  w.roots.assign(mm, 0);
  w.score.assign(mm, kNoArc);
  w.arc_head.resize(mm);
  w.arc_dep.resize(mm);
  int64_t* roots = w.roots.data();
  double* score = w.score.data();
  int32_t* arc_head = w.arc_head.data();
  int32_t* arc_dep = w.arc_dep.data();
  for (int64_t h = 0; h < n; ++h) {
    for (int64_t d = 0; d < n; ++d) {
      const int64_t from = h == d ? 0 : h + 1, to = d + 1;
      const int64_t at = from * m + to;
      score[at] = static_cast<double>(scores[h * stride + d]);
      roots[at] = h == d ? -1 : 0;
      arc_head[at] = static_cast<int32_t>(from);
      arc_dep[at] = static_cast<int32_t>(to);
    }
  }

  w.parent.assign(static_cast<size_t>(m), -1);
  w.mark.assign(static_cast<size_t>(m), 0);  // 0 unvisited, 1 reaches the root, 2 on the current walk
  w.alive.assign(static_cast<size_t>(m), 1);
  w.group.resize(static_cast<size_t>(m));
  for (int64_t v = 0; v < m; ++v) w.group[v] = static_cast<int32_t>(v);
  w.mark[0] = 1;
  w.cycle_members.clear();
  w.cycle_start.assign(1, 0);
  w.cycle_rep.clear();
  w.cycle_arc_head.clear();
  w.cycle_arc_dep.clear();
  w.cycle_group.clear();
  int32_t* parent = w.parent.data();
  int32_t* mark = w.mark.data();
  int32_t* alive = w.alive.data();

  // The best incoming arc of node v among the live nodes, or -1.
  auto best_parent = [&](int64_t v) -> int32_t {
    int32_t best = -1;
    for (int64_t u = 0; u < m; ++u) {
      if (!alive[u] || u == v || score[u * m + v] == kNoArc) continue;
      if (best < 0 || heavier(roots[u * m + v], score[u * m + v], roots[best * m + v], score[best * m + v])) {
        best = static_cast<int32_t>(u);
      }
    }
    return best;
  };
  for (int64_t v = 1; v < m; ++v) {
    parent[v] = best_parent(v);
    if (parent[v] < 0) {
      return where + ", word " + std::to_string(v - 1) + ": no allowed head (every score in column " +
             std::to_string(v - 1) + " is -inf)";
    }
  }

  std::vector<int32_t>& walk = w.walk;
  for (;;) {
    int64_t start = -1;
    for (int64_t v = 1; v < m; ++v) {
      if (alive[v] && mark[v] == 0) {
        start = v;
        break;
      }
    }
    if (start < 0) break;
    walk.clear();
    int64_t node = start;
    while (mark[node] == 0) {
      mark[node] = 2;
      walk.push_back(static_cast<int32_t>(node));
      node = parent[node];
    }
    if (mark[node] == 1) {
      for (int32_t v : walk) mark[v] = 1;
      continue;
    }
    for (int32_t v : walk) mark[v] = 0;

    // A cycle through `node`: contract it into c = node, recording its arcs and the groups before contraction.
    const int64_t c = node;
    const size_t first = w.cycle_members.size();
    int64_t v = c;
    do {
      w.cycle_members.push_back(static_cast<int32_t>(v));
      w.cycle_arc_head.push_back(arc_head[parent[v] * m + v]);
      w.cycle_arc_dep.push_back(arc_dep[parent[v] * m + v]);
      mark[v] = 3;
      v = parent[v];
    } while (v != c);
    const size_t last = w.cycle_members.size();
    w.cycle_start.push_back(static_cast<int32_t>(last));
    w.cycle_rep.push_back(static_cast<int32_t>(c));
    w.cycle_group.insert(w.cycle_group.end(), w.group.begin(), w.group.end());

    for (int64_t u = 0; u < m; ++u) {
      if (!alive[u] || mark[u] == 3) continue;
      // Into the cycle: the arc u -> member, less the member's cycle arc (what replacing that arc changes).
      int64_t in_roots = 0, in_member = -1;
      double in_score = kNoArc;
      int64_t out_member = -1;
      for (size_t k = first; k < last; ++k) {
        const int64_t x = w.cycle_members[k];
        if (score[u * m + x] != kNoArc) {
          const int64_t r = roots[u * m + x] - roots[parent[x] * m + x];
          const double s = score[u * m + x] - score[parent[x] * m + x];
          if (in_member < 0 || heavier(r, s, in_roots, in_score)) {
            in_roots = r;
            in_score = s;
            in_member = x;
          }
        }
        if (u != 0 && score[x * m + u] != kNoArc &&
            (out_member < 0 ||
             heavier(roots[x * m + u], score[x * m + u], roots[out_member * m + u], score[out_member * m + u]))) {
          out_member = x;
        }
      }
      if (in_member >= 0) {
        roots[u * m + c] = in_roots;
        score[u * m + c] = in_score;
        arc_head[u * m + c] = arc_head[u * m + in_member];
        arc_dep[u * m + c] = arc_dep[u * m + in_member];
      } else {
        score[u * m + c] = kNoArc;
      }
      if (u != 0) {
        if (out_member >= 0) {
          roots[c * m + u] = roots[out_member * m + u];
          score[c * m + u] = score[out_member * m + u];
          arc_head[c * m + u] = arc_head[out_member * m + u];
          arc_dep[c * m + u] = arc_dep[out_member * m + u];
        } else {
          score[c * m + u] = kNoArc;
        }
      }
    }
    for (size_t k = first; k < last; ++k) {
      const int32_t x = w.cycle_members[k];
      if (x != c) alive[x] = 0;
      mark[x] = 0;
    }
    for (int64_t x = 0; x < m; ++x) {
      if (!alive[w.group[x]]) w.group[x] = static_cast<int32_t>(c);  // a member other than c
    }
    // Live nodes whose best head was a member now take c (the best of the members' arcs, the same weight).
    for (int64_t u = 1; u < m; ++u) {
      if (alive[u] && u != c && !alive[parent[u]]) parent[u] = static_cast<int32_t>(c);
    }
    parent[c] = best_parent(c);
    if (parent[c] < 0) return where + ": the allowed arcs (scores above -inf) form no tree";
  }

  // Expansion: the arc entering each live node, then each cycle (last contracted first) takes the arc entering
  // its contracted node at the member holding that arc's dependent, and its own arcs everywhere else.
  w.enter_head.assign(static_cast<size_t>(m), -1);
  w.enter_dep.assign(static_cast<size_t>(m), -1);
  for (int64_t v = 1; v < m; ++v) {
    if (!alive[v]) continue;
    w.enter_head[v] = arc_head[parent[v] * m + v];
    w.enter_dep[v] = arc_dep[parent[v] * m + v];
  }
  for (int64_t k = static_cast<int64_t>(w.cycle_rep.size()) - 1; k >= 0; --k) {
    const int32_t c = w.cycle_rep[k];
    const int32_t h = w.enter_head[c], d = w.enter_dep[c];
    const int32_t holder = w.cycle_group[static_cast<size_t>(k * m + d)];
    for (int32_t j = w.cycle_start[k]; j < w.cycle_start[k + 1]; ++j) {
      const int32_t x = w.cycle_members[j];
      if (x == holder) {
        w.enter_head[x] = h;
        w.enter_dep[x] = d;
      } else {
        w.enter_head[x] = w.cycle_arc_head[j];
        w.enter_dep[x] = w.cycle_arc_dep[j];
      }
    }
  }
  int64_t root_words = 0;
  for (int64_t v = 1; v < m; ++v) {
    if (w.enter_dep[v] != v) return where + ": internal error in the tree decoder (expansion)";
    heads[v - 1] = w.enter_head[v] - 1;
    root_words += w.enter_head[v] == 0;
  }
  if (root_words != 1) {
    return where + ": the allowed arcs (scores above -inf) form no tree with a single root word (the best has " +
           std::to_string(root_words) + ")";
  }
  return "";
}

void decode_tree_batch(const float* scores, const int64_t* lengths, int64_t B, int64_t N, int64_t* heads,
                       int num_threads) {
  for (int64_t b = 0; b < B; ++b) {
    std::string message = check_length(b, lengths[b], N);
    if (!message.empty()) throw std::invalid_argument(message);
  }
  if (B == 0 || N == 0) return;
  const int64_t work = B * N * N * 4;
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, B, std::max<int64_t>(1, work / 65536)});
  for_each_item<MstWorkspace>(B, threads, [&](int64_t b, MstWorkspace& workspace) {
    int64_t* row = heads + b * N;
    std::fill(row, row + N, int64_t{-1});
    return decode_tree_item("batch item " + std::to_string(b), scores + b * N * N, lengths[b], N, row, workspace);
  });
}

}  // namespace syntaxkernels
