// All-pairs tree distance for batches of dependency trees: the torch-free core.
//
// A tree is a vector of 0-based head indices, -1 for a root; several roots make a forest. For a batch
// heads [B, N] (row-major int64) with lengths [B], the builder writes
//   distance uint8 [B, N, N]: edges on the tree path, 0 on the diagonal, saturating at 254,
//                             255 = unreachable (different trees, or padding);
//   depth    int32 [B, N]:    edges to the token's root, -1 for padding;
//   segment  int32 [B, N]:    which tree the token is in (trees numbered by their root's position),
//                             -1 for padding.
// Bad input raises std::invalid_argument with the same message as the Python builder
// (syntaxkernels/trees/batch.py), naming the batch item and token; with several bad items the lowest
// batch index is reported, whatever the number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace syntaxkernels {

constexpr uint8_t kUnreachable = 255;
constexpr uint8_t kMaxDistance = 254;

// Reusable per-thread buffers for one sentence (sized to the longest sentence seen).
struct TreeWorkspace {
  std::vector<int32_t> order;         // tokens in breadth-first order (roots first, by position)
  std::vector<int32_t> child_start;   // children of token t: children[child_start[t] .. child_start[t+1])
  std::vector<int32_t> children;
  std::vector<int32_t> scratch;       // cycle search
  std::vector<int32_t> subtree_size;  // tokens in the subtree of t, t included
  std::vector<int32_t> preorder;      // position of t in a depth-first preorder of the forest
  std::vector<int32_t> span;          // first and one-past-last position of each tree
};

// The error message for a bad lengths[b] (negative or larger than N), or "" when it is valid.
std::string check_length(int64_t b, int64_t length, int64_t N);

// Validates heads[0 .. length) of batch item b (as check_sentence) and orders the sentence: fills
// workspace.order (breadth first, roots first by position), workspace.child_start / workspace.children (the
// children of token t, increasing, are children[child_start[t] .. child_start[t+1])), depth[0 .. length) and
// segment[0 .. length). Returns "" or the error message (the workspace is then unspecified).
std::string order_sentence(int64_t b, const int64_t* heads, int64_t length, int32_t* depth, int32_t* segment,
                           TreeWorkspace& workspace);

// The error message for heads[0 .. length) of batch item b (head out of range, self-loop, cycle), or ""
// when the sentence is a valid forest. Checks in the Python builder's order: range, then self-loops,
// then cycles (naming the smallest token on a cycle, with the cycle's path).
std::string check_sentence(int64_t b, const int64_t* heads, int64_t length, TreeWorkspace& workspace);

// Builds one batch item. heads points at the item's row (N entries, the first `length` used); distance
// at its [N, N] block (row stride N), depth and segment at its N entries. Writes every entry, padding
// included. Returns "" on success or the error message (outputs are then unspecified).
// O(length^2) with O(1) work per pair: rows are built in breadth-first order, each from its head's row
// (plus one outside the token's subtree, the depth difference inside it), reading and writing sequentially.
std::string build_item(int64_t b, const int64_t* heads, int64_t length, int64_t N, uint8_t* distance,
                       int32_t* depth, int32_t* segment, TreeWorkspace& workspace);

// Leak-free distances for causal models, one batch item (arguments and validation as build_item):
// distance[i, j] for j <= i is the path length between i and j in the forest induced on tokens 0..i (the
// edges whose both ends are <= i): the tree path when every token on it is <= i, else 255; distance[i, j] = 255
// for j > i. Not symmetric. Row i never depends on the heads of tokens > i. depth and segment are the whole
// tree's (as build_item's). O(length^2): one breadth-first search per row over the induced forest (children
// lists are increasing, so a search stops at the first child > i).
std::string build_item_leak_free(int64_t b, const int64_t* heads, int64_t length, int64_t N, uint8_t* distance,
                                 int32_t* depth, int32_t* segment, TreeWorkspace& workspace);

// Builds the whole batch on up to num_threads threads (num_threads <= 1: the calling thread only).
// Validates every length first, then every sentence; throws std::invalid_argument with the message of
// the lowest bad batch item. Never reads heads beyond [B, N] nor writes beyond the outputs.
// leak_free: build_item_leak_free's distances instead of build_item's.
void build_batch(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, uint8_t* distance,
                 int32_t* depth, int32_t* segment, int num_threads, bool leak_free = false);

// Packed batches: S sequences in T tokens, sequence s at tokens [cu_seqlens[s], cu_seqlens[s + 1]) with its
// heads local to the sequence (0-based, -1 for a root). The distance is stored per sequence: sequence s's
// n_s x n_s block (row stride n_s) starts at distance + offsets[s], offsets[s] = sum_{r < s} n_r^2 (so the
// buffer holds sum n_s^2 bytes, never T^2); depth and segment are per token (segment numbers the trees
// within the sequence). Validates cu_seqlens (cu_seqlens[0] == 0, non-decreasing, cu_seqlens[S] == T)
// and then every sequence; throws std::invalid_argument with the message of the lowest bad sequence, worded
// "sequence s, token i: ..." (i local to the sequence).
std::string check_cu_seqlens(const int64_t* cu_seqlens, int64_t S, int64_t T);
void packed_offsets(const int64_t* cu_seqlens, int64_t S, int64_t* offsets);  // offsets [S + 1]
void build_packed(const int64_t* heads, const int64_t* cu_seqlens, int64_t S, const int64_t* offsets,
                  uint8_t* distance, int32_t* depth, int32_t* segment, int num_threads, bool leak_free = false);

}  // namespace syntaxkernels
