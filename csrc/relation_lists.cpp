// Per-row key lists of the tree relations and of tree windows (see relation_lists.h for the contract).
#include "relation_lists.h"

#include "batch_items.h"

#include <algorithm>
#include <array>
#include <limits>
#include <stdexcept>
#include <utility>

namespace syntaxkernels {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kUnlimited = std::numeric_limits<int32_t>::max();

// By RelationKind.
constexpr std::array<const char*, kNumRelationKinds> kRelationKindNames{"parent", "child", "sibling"};

// The first relation of each kind (its position in spec.relations times D), -1 for a kind not listed.
using RelationOffsets = std::array<int32_t, kNumRelationKinds>;

RelationOffsets relation_offsets(const ListSpec& spec) {
  RelationOffsets offsets;
  offsets.fill(-1);
  for (size_t n = 0; n < spec.relations.size(); ++n) {
    offsets[static_cast<size_t>(spec.relations[n])] = static_cast<int32_t>(n) * spec.max_distance;
  }
  return offsets;
}

// "parent, child and sibling": every kind's name.
std::string every_kind() {
  std::string out;
  for (int k = 0; k < kNumRelationKinds; ++k) {
    out += (k == 0 ? "" : k + 1 == kNumRelationKinds ? " and " : ", ");
    out += kRelationKindNames[static_cast<size_t>(k)];
  }
  return out;
}

// The lists of one batch item, rows (i, r) for i < length only.
struct ItemLists {
  std::vector<int32_t> counts;    // [length * R] keys per row (i, r)
  std::vector<int32_t> col, rel;  // edges in row order, keys increasing within a row
  std::vector<int32_t> t_counts;  // [length * R] queries per transposed row (j, r)
  std::vector<int32_t> t_col, t_rel;
};

struct ItemWorkspace {
  TreeWorkspace tree;
  std::vector<int32_t> depth, segment;
  std::vector<std::vector<int32_t>> bucket;        // [R]: the keys of the current row, per relation
  std::vector<std::pair<int32_t, int32_t>> stack;  // (token, depth below the walk's top)
  std::vector<int32_t> cursor;
};

// Calls emit(j, k) for every token j of the subtree of `top` at depth k = 1..max_depth below it, except the
// subtree of top's child `skip` (-1: none). Visits only the tokens it emits.
template <typename Emit>
void walk_down(int32_t top, int32_t skip, int32_t max_depth, const int32_t* child_start, const int32_t* children,
               std::vector<std::pair<int32_t, int32_t>>& stack, Emit&& emit) {
  if (max_depth <= 0) return;
  stack.clear();
  for (int32_t c = child_start[top + 1] - 1; c >= child_start[top]; --c) {
    if (children[c] != skip) stack.emplace_back(children[c], 1);
  }
  while (!stack.empty()) {
    const auto [token, below] = stack.back();
    stack.pop_back();
    emit(token, below);
    if (below < max_depth) {
      for (int32_t c = child_start[token + 1] - 1; c >= child_start[token]; --c) {
        stack.emplace_back(children[c], below + 1);
      }
    }
  }
}

// Fills workspace.bucket[r] with the keys of query i for every relation r (unsorted): one walk per relation kind.
void enumerate_row(int32_t i, const int64_t* heads, const ListSpec& spec, const RelationOffsets& offsets,
                   const int32_t* child_start, const int32_t* children, ItemWorkspace& ws) {
  auto& stack = ws.stack;
  if (spec.window >= 0) {
    // Every token within `window` edges: walk up the ancestors a_u (distance u) and, from each, down into
    // the branches not already visited (distance u + k).
    const int32_t limit = spec.window >= kMaxDistance ? kUnlimited : spec.window;
    std::vector<int32_t>& keys = ws.bucket[0];
    keys.push_back(i);
    walk_down(i, -1, limit, child_start, children, stack, [&](int32_t j, int32_t) { keys.push_back(j); });
    int32_t a = i;
    for (int32_t u = 1; u <= limit && heads[a] >= 0; ++u) {
      const int32_t from = a;
      a = static_cast<int32_t>(heads[a]);
      keys.push_back(a);
      walk_down(a, from, limit - u, child_start, children, stack, [&](int32_t j, int32_t) { keys.push_back(j); });
    }
    return;
  }
  const int32_t D = spec.max_distance;
  const int32_t parent = offsets[static_cast<size_t>(RelationKind::kParent)];
  const int32_t child = offsets[static_cast<size_t>(RelationKind::kChild)];
  const int32_t sibling = offsets[static_cast<size_t>(RelationKind::kSibling)];
  if (parent >= 0) {  // parent_d: i is an ancestor of j, the tokens d levels below i
    walk_down(i, -1, D, child_start, children, stack,
              [&](int32_t j, int32_t k) { ws.bucket[parent + k - 1].push_back(j); });
  }
  if (child < 0 && sibling < 0) return;
  int32_t a = i;
  for (int32_t u = 1; u <= D && heads[a] >= 0; ++u) {
    const int32_t from = a;
    a = static_cast<int32_t>(heads[a]);
    if (child >= 0) ws.bucket[child + u - 1].push_back(a);  // child_u: i is a descendant of a at distance u
    if (sibling >= 0) {
      // sibling_d: below a, outside the branch of i (lowest common ancestor a), distance d = u + k in 2..D+1.
      walk_down(a, from, D + 1 - u, child_start, children, stack,
                [&](int32_t j, int32_t k) { ws.bucket[sibling + u + k - 2].push_back(j); });
    }
  }
}

std::string build_item_lists(int64_t b, const int64_t* heads, int64_t length, const ListSpec& spec,
                             ItemWorkspace& ws, ItemLists& out) {
  const int64_t R = spec.num_relations();
  out.counts.assign(static_cast<size_t>(length * R), 0);
  out.t_counts.assign(static_cast<size_t>(length * R), 0);
  out.col.clear();
  out.rel.clear();
  out.t_col.clear();
  out.t_rel.clear();
  if (length == 0) return "";
  ws.depth.resize(static_cast<size_t>(length));
  ws.segment.resize(static_cast<size_t>(length));
  std::string message = order_sentence(b, heads, length, ws.depth.data(), ws.segment.data(), ws.tree);
  if (!message.empty()) return message;
  const int32_t* child_start = ws.tree.child_start.data();
  const int32_t* children = ws.tree.children.data();
  ws.bucket.resize(static_cast<size_t>(R));
  const RelationOffsets offsets = relation_offsets(spec);

  for (int64_t i = 0; i < length; ++i) {
    for (auto& keys : ws.bucket) keys.clear();
    enumerate_row(static_cast<int32_t>(i), heads, spec, offsets, child_start, children, ws);
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int32_t>& keys = ws.bucket[static_cast<size_t>(r)];
      if (!std::is_sorted(keys.begin(), keys.end())) std::sort(keys.begin(), keys.end());
      out.counts[static_cast<size_t>(i * R + r)] = static_cast<int32_t>(keys.size());
      out.col.insert(out.col.end(), keys.begin(), keys.end());
      out.rel.insert(out.rel.end(), keys.size(), static_cast<int32_t>(r));
      for (const int32_t j : keys) ++out.t_counts[static_cast<size_t>(j * R + r)];
    }
    if (out.col.size() > static_cast<size_t>(kInt32Max)) {
      throw std::length_error("edge lists: batch item " + std::to_string(b) + " has more than 2^31 - 1 edges");
    }
  }

  // Transposed lists: a counting sort of the edges by (key, relation); walking the edges in row order keeps
  // the queries of each transposed row increasing.
  const size_t edges = out.col.size();
  out.t_col.resize(edges);
  out.t_rel.resize(edges);
  ws.cursor.resize(static_cast<size_t>(length * R));
  int32_t position = 0;
  for (size_t row = 0; row < ws.cursor.size(); ++row) {
    ws.cursor[row] = position;
    position += out.t_counts[row];
  }
  size_t e = 0;
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t r = 0; r < R; ++r) {
      for (int32_t n = 0; n < out.counts[static_cast<size_t>(i * R + r)]; ++n, ++e) {
        const int32_t slot = ws.cursor[static_cast<size_t>(out.col[e] * R + r)]++;
        out.t_col[static_cast<size_t>(slot)] = static_cast<int32_t>(i);
        out.t_rel[static_cast<size_t>(slot)] = static_cast<int32_t>(r);
      }
    }
  }
  return "";
}

// One CSR over the rows (b, i, r) from the items' per-row counts (padding rows empty).
void assemble(const std::vector<ItemLists>& items, const int64_t* lengths, int64_t N, int64_t R, bool transposed,
              std::vector<int32_t>& ptr, std::vector<int32_t>& index, std::vector<int32_t>& relation) {
  const int64_t B = static_cast<int64_t>(items.size());
  ptr.assign(static_cast<size_t>(B * N * R + 1), 0);
  int64_t offset = 0;
  for (int64_t b = 0; b < B; ++b) {
    const ItemLists& item = items[static_cast<size_t>(b)];
    const std::vector<int32_t>& counts = transposed ? item.t_counts : item.counts;
    int32_t* row = ptr.data() + b * N * R;
    const int64_t filled = lengths[b] * R;
    for (int64_t k = 0; k < N * R; ++k) {
      row[k] = static_cast<int32_t>(offset);
      if (k < filled) offset += counts[static_cast<size_t>(k)];
    }
  }
  ptr[static_cast<size_t>(B * N * R)] = static_cast<int32_t>(offset);
  index.resize(static_cast<size_t>(offset));
  relation.resize(static_cast<size_t>(offset));
  size_t at = 0;
  for (const ItemLists& item : items) {
    const std::vector<int32_t>& from_index = transposed ? item.t_col : item.col;
    const std::vector<int32_t>& from_relation = transposed ? item.t_rel : item.rel;
    std::copy(from_index.begin(), from_index.end(), index.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(from_relation.begin(), from_relation.end(), relation.begin() + static_cast<std::ptrdiff_t>(at));
    at += from_index.size();
  }
}

}  // namespace

const char* relation_kind_name(RelationKind kind) { return kRelationKindNames[static_cast<size_t>(kind)]; }

std::string relation_kinds_of(const std::vector<std::string>& names, std::vector<RelationKind>& kinds) {
  kinds.clear();
  for (const std::string& name : names) {
    const auto* found = std::find(kRelationKindNames.begin(), kRelationKindNames.end(), name);
    if (found == kRelationKindNames.end()) {
      return "unknown relation kind '" + name + "' (the builder walks " + every_kind() + ")";
    }
    kinds.push_back(static_cast<RelationKind>(found - kRelationKindNames.begin()));
  }
  return "";
}

std::string check_list_spec(const ListSpec& spec) {
  if (spec.window < -1 || spec.window > kMaxDistance) {
    return "window must be in 0..254 (or -1 for the relation lists), got " + std::to_string(spec.window);
  }
  if (spec.window >= 0) return "";
  if (spec.max_distance < 1 || spec.max_distance > 64) {
    return "max_distance must be in 1..64, got " + std::to_string(spec.max_distance);
  }
  if (spec.relations.empty()) return "no relation enabled (" + every_kind() + " are all off)";
  RelationOffsets seen;
  seen.fill(0);
  for (const RelationKind kind : spec.relations) {
    const int k = static_cast<int>(kind);
    if (k < 0 || k >= kNumRelationKinds) return "unknown relation kind " + std::to_string(k);
    if (seen[static_cast<size_t>(k)]++) {
      return std::string("relation kind '") + relation_kind_name(kind) + "' listed twice";
    }
  }
  return "";
}

EdgeLists build_edge_lists(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, const ListSpec& spec,
                           int num_threads) {
  std::string message = check_list_spec(spec);
  if (!message.empty()) throw std::invalid_argument(message);
  for (int64_t b = 0; b < B; ++b) {
    message = check_length(b, lengths[b], N);
    if (!message.empty()) throw std::invalid_argument(message);
  }
  const int64_t R = spec.num_relations();
  if (N > 0 && B > 0 && B * N > (kInt32Max - 1) / R) {
    throw std::length_error("edge lists: B * N * R = " + std::to_string(B) + " * " + std::to_string(N) + " * " +
                            std::to_string(R) + " rows do not fit in int32");
  }
  std::vector<ItemLists> items(static_cast<size_t>(B));
  int64_t tokens = 0;
  for (int64_t b = 0; b < B; ++b) tokens += lengths[b];
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, B, std::max<int64_t>(1, tokens * R / 16384)});
  for_each_item<ItemWorkspace>(B, threads, [&](int64_t b, ItemWorkspace& ws) {
    return build_item_lists(b, heads + b * N, lengths[b], spec, ws, items[static_cast<size_t>(b)]);
  });

  int64_t edges = 0;
  for (const ItemLists& item : items) edges += static_cast<int64_t>(item.col.size());
  if (edges > kInt32Max) {
    throw std::length_error("edge lists: " + std::to_string(edges) + " edges do not fit in int32 offsets");
  }
  EdgeLists lists;
  lists.B = B;
  lists.N = N;
  lists.R = R;
  assemble(items, lengths, N, R, false, lists.row_ptr, lists.col, lists.rel);
  assemble(items, lengths, N, R, true, lists.t_ptr, lists.t_col, lists.t_rel);
  return lists;
}

namespace {

// Items of up to `chunk` edges for units u = 0..U-1 with edges [ptr[u * stride], ptr[(u + 1) * stride]), each unit
// also named by `coordinates(u, out)` (b, i, (r)), sorted longest first (stable); appends the split units and their
// slot offsets. Returns the number of slots.
template <typename Coordinates>
int64_t chunked_items(const int32_t* ptr, int64_t U, int64_t stride, int64_t chunk, int64_t num_coordinates,
                      Coordinates&& coordinates, std::vector<int32_t>& table, std::vector<int32_t>& split_units,
                      std::vector<int32_t>& split_ptr) {
  struct Item {
    int64_t unit, first, count, slot;
  };
  std::vector<Item> items;
  int64_t slots = 0;
  split_units.clear();
  split_ptr.assign(1, 0);
  for (int64_t u = 0; u < U; ++u) {
    const int64_t first = ptr[u * stride], degree = ptr[(u + 1) * stride] - first;
    if (degree <= 0) continue;
    const int64_t pieces = (degree + chunk - 1) / chunk;
    for (int64_t k = 0; k < pieces; ++k) {
      items.push_back({u, first + k * chunk, std::min(chunk, degree - k * chunk), pieces > 1 ? slots + k : -1});
    }
    if (pieces > 1) {
      slots += pieces;
      split_units.push_back(static_cast<int32_t>(u));
      split_ptr.push_back(static_cast<int32_t>(slots));
    }
  }
  // Counting sort by count, longest first; stable.
  std::vector<int64_t> start(static_cast<size_t>(chunk + 2), 0);
  for (const Item& item : items) ++start[static_cast<size_t>(chunk - item.count + 1)];
  for (size_t c = 1; c < start.size(); ++c) start[c] += start[c - 1];
  std::vector<int64_t> order(items.size());
  for (size_t n = 0; n < items.size(); ++n) order[static_cast<size_t>(start[static_cast<size_t>(chunk - items[n].count)]++)] = static_cast<int64_t>(n);
  const int64_t I = static_cast<int64_t>(items.size());
  const int64_t rows = num_coordinates + 3;
  table.assign(static_cast<size_t>(rows * I), 0);
  int32_t values[3];
  for (int64_t n = 0; n < I; ++n) {
    const Item& item = items[static_cast<size_t>(order[static_cast<size_t>(n)])];
    coordinates(item.unit, values);
    for (int64_t c = 0; c < num_coordinates; ++c) table[static_cast<size_t>(c * I + n)] = values[c];
    table[static_cast<size_t>(num_coordinates * I + n)] = static_cast<int32_t>(item.first);
    table[static_cast<size_t>((num_coordinates + 1) * I + n)] = static_cast<int32_t>(item.count);
    table[static_cast<size_t>((num_coordinates + 2) * I + n)] = static_cast<int32_t>(item.slot);
  }
  return slots;
}

void check_offsets(const int32_t* ptr, int64_t rows, const char* name) {
  if (ptr[0] != 0) throw std::invalid_argument(std::string(name) + " must start at 0");
  for (int64_t r = 0; r < rows; ++r) {
    if (ptr[r + 1] < ptr[r]) throw std::invalid_argument(std::string(name) + " must be non-decreasing");
  }
}

}  // namespace

EdgeSchedule build_edge_schedule(const int32_t* row_ptr, const int32_t* t_ptr, int64_t B, int64_t N, int64_t R,
                                 int64_t chunk) {
  if (chunk < 1) throw std::invalid_argument("chunk must be a positive int, got " + std::to_string(chunk));
  if (B < 0 || N < 0 || R < 1) throw std::invalid_argument("bad list shape");
  const int64_t rows = B * N * R;
  check_offsets(row_ptr, rows, "row_ptr");
  check_offsets(t_ptr, rows, "t_ptr");
  EdgeSchedule s;
  s.pieces = chunked_items(row_ptr, rows, 1, chunk, 3, [&](int64_t row, int32_t* out) {
    out[0] = static_cast<int32_t>(row / (N * R));
    out[1] = static_cast<int32_t>((row / R) % N);
    out[2] = static_cast<int32_t>(row % R);
  }, s.f_items, s.merge_rows, s.merge_ptr);
  auto token = [&](int64_t t, int32_t* out) {
    out[0] = static_cast<int32_t>(t / N);
    out[1] = static_cast<int32_t>(t % N);
  };
  s.dq_slots = chunked_items(row_ptr, B * N, R, chunk, 2, token, s.q_items, s.dq_tokens, s.dq_ptr);
  s.dk_slots = chunked_items(t_ptr, B * N, R, chunk, 2, token, s.k_items, s.dk_tokens, s.dk_ptr);
  return s;
}

int64_t count_live_tiles(const int32_t* row_ptr, const int32_t* col, int64_t B, int64_t N, int64_t R, int64_t tile) {
  if (tile < 1) throw std::invalid_argument("tile must be positive");
  const int64_t nt = (N + tile - 1) / tile;
  std::vector<int64_t> seen(static_cast<size_t>(nt), -1);  // key block -> last query block that marked it
  int64_t live = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t qb = 0; qb < nt; ++qb) {
      const int64_t stamp = b * nt + qb;
      const int64_t lo = row_ptr[(b * N + qb * tile) * R];
      const int64_t hi = row_ptr[(b * N + std::min(N, (qb + 1) * tile)) * R];
      for (int64_t e = lo; e < hi; ++e) {
        const int64_t kb = col[e] / tile;
        if (kb >= 0 && kb < nt && seen[static_cast<size_t>(kb)] != stamp) {
          seen[static_cast<size_t>(kb)] = stamp;
          ++live;
        }
      }
    }
  }
  return live;
}

}  // namespace syntaxkernels
