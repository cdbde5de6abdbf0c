// Per-row key lists of the tree relations (Syntax-BERT masks) and of tree windows: the torch-free core.
//
// For a batch heads [B, N] (row-major int64, -1 = root) with lengths [B], the builder emits, for every
// sequence b, query token i and relation r, the keys j of (query i, key j) pairs in that relation, in CSR
// form over the rows (b, i, r) (row id (b * N + i) * R + r):
//
//   row_ptr int32 [B * N * R + 1]   keys of row (b, i, r): col[row_ptr[row] .. row_ptr[row + 1]), increasing
//   col     int32 [E]               the key token j (0 .. N-1, within the sequence)
//   rel     int32 [E]               the relation r of each edge (so the edges of one query over every relation,
//                                   col[row_ptr[(b*N + i)*R] .. row_ptr[(b*N + i + 1)*R]), can be walked at once)
//
// and the transposed lists, what a backward needs to gather per key without atomics, over rows (b, j, r):
//
//   t_ptr   int32 [B * N * R + 1]   queries of key row (b, j, r): t_col[t_ptr[row] .. t_ptr[row + 1]), increasing
//   t_col   int32 [E]               the query token i
//   t_rel   int32 [E]               the relation r
//
// Relations (query i, key j; docs/semantics.md, "Syntax-BERT masks"): the kinds the spec lists, in its order
// (from Python, MaskSpec.relation_kinds: the order of syntaxkernels.specs.RELATIONS), D relations each:
//   parent_d  (d = 1..D):   i is an ancestor of j at distance d   (the descendants of i d levels down)
//   child_d   (d = 1..D):   i is a descendant of j at distance d  (at most one key: i's ancestor d levels up)
//   sibling_d (d = 2..D+1): same tree, neither an ancestor of the other, distance d
// or, in window mode, one relation: every key j with d(i, j) <= window (i itself included; window 254 = the
// whole tree, as distances saturate at 254).
//
// Work and memory are O(E + N * D) per sequence: each row walks up its ancestors and enumerates only the
// tokens it pairs with (a depth-limited walk down from each ancestor that skips the branch it came from);
// no N x N matrix is read or written. Padding rows (i >= lengths[b]) are empty. Bad input throws
// std::invalid_argument with the tree-distance builder's messages (the lowest bad batch item is reported).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tree_distance.h"

namespace syntaxkernels {

// The relation kinds the builder walks (each has its walk in enumerate_row), named as in
// syntaxkernels.specs.RELATIONS. A new kind: an entry here and in kRelationKindNames (relation_lists.cpp), and its
// walk.
enum class RelationKind : int32_t { kParent = 0, kChild = 1, kSibling = 2 };
constexpr int kNumRelationKinds = 3;

// The name of a kind ("parent", ...).
const char* relation_kind_name(RelationKind kind);

// The kinds of `names` (Python's MaskSpec.relation_kinds) into `kinds`, in order; "" or why not (an unknown name).
std::string relation_kinds_of(const std::vector<std::string>& names, std::vector<RelationKind>& kinds);

struct ListSpec {
  int32_t max_distance = 3;  // D of the relation masks (1..64)
  std::vector<RelationKind> relations;  // the kinds in output order: the n-th gives relations n * D .. n * D + D - 1
  int32_t window = -1;  // >= 0: window mode (0..254); the relation kinds are then ignored

  // R: the number of relations (1 in window mode).
  int64_t num_relations() const {
    if (window >= 0) return 1;
    return static_cast<int64_t>(max_distance) * static_cast<int64_t>(relations.size());
  }
};

struct EdgeLists {
  int64_t B = 0, N = 0, R = 0;
  std::vector<int32_t> row_ptr, col, rel;
  std::vector<int32_t> t_ptr, t_col, t_rel;
};

// "" or why the spec is invalid (max_distance outside 1..64, window outside -1..254, no relation kind, a kind
// listed twice).
std::string check_list_spec(const ListSpec& spec);

// The lists of one batch on up to num_threads threads (<= 1: the calling thread). Validates the spec, every
// length, then every sentence, like build_batch; throws std::invalid_argument on bad input and
// std::length_error when B * N * R or the number of edges does not fit in int32.
EdgeLists build_edge_lists(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, const ListSpec& spec,
                           int num_threads);

// The balanced work lists of the GPU edge kernels over lists (row_ptr, t_ptr: [B * N * R + 1]); see
// syntaxkernels.trees.batch.EdgeSchedule for the contract. A work item is up to `chunk` consecutive edges of a unit
// (forward: a row (b, i, r); dQ: a token over every relation; dK/dV: a key token's transposed edges); units with
// more edges are split, their items numbered by consecutive partial slots (in edge order). Items are sorted by edge
// count, longest first, stably (a counting sort). Tables are row-major: rows b, i, (r,) first, count, slot.
struct EdgeSchedule {
  std::vector<int32_t> f_items;  // [6, I_f]
  std::vector<int32_t> merge_rows, merge_ptr;
  std::vector<int32_t> q_items;  // [5, I_q]
  std::vector<int32_t> dq_tokens, dq_ptr;
  std::vector<int32_t> k_items;  // [5, I_k]
  std::vector<int32_t> dk_tokens, dk_ptr;
  int64_t pieces = 0, dq_slots = 0, dk_slots = 0;
};

// Throws std::invalid_argument for chunk < 1 or offsets that are not [B * N * R + 1] non-decreasing from 0.
EdgeSchedule build_edge_schedule(const int32_t* row_ptr, const int32_t* t_ptr, int64_t B, int64_t N, int64_t R,
                                 int64_t chunk);

// Tiles of tile x tile (query block, key block) per sequence holding at least one listed pair (any relation).
int64_t count_live_tiles(const int32_t* row_ptr, const int32_t* col, int64_t B, int64_t N, int64_t R, int64_t tile);

}  // namespace syntaxkernels
