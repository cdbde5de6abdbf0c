// Maximum spanning dependency trees from arc scores: the torch-free core.
//
// Scores of one sentence of n words (row-major, row stride `stride`): scores[h * stride + d] for h != d is the
// score of word h as the head of word d; the diagonal scores[d * stride + d] is the score of word d as the root
// word. The decoder returns the heads (0-based, -1 for the root word) of the tree of highest total score with
// exactly one root word: the heads' convention of TreeBatch.from_heads (syntaxkernels/trees/batch.py).
//
// Algorithm: Chu-Liu/Edmonds (non-projective) over the n words plus an artificial root node whose arcs are the
// diagonal, with the dense O(n^2) bookkeeping: best incoming arcs, one walk per node along them, and each cycle
// contracted in place into one of its members (only the arcs of the contracted node change). The single-root
// constraint is exact: an arc weighs the pair (-[it is a root arc], score), compared lexicographically, and the
// maximum of the summed pairs is the tree with the fewest root arcs (one, when any single-rooted tree exists) and,
// among those, the highest score. Scores are summed in double precision. Ties go to the lower head index.
//
// -inf marks a forbidden arc. NaN and +inf scores raise std::invalid_argument naming the batch item and the arc;
// so does a sentence whose allowed arcs form no single-rooted tree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace syntaxkernels {

// Reusable per-thread buffers for one sentence (sized to the longest sentence seen).
struct MstWorkspace {
  std::vector<int64_t> roots;     // [m, m] weights: minus the number of root arcs an arc stands for
  std::vector<double> score;      // [m, m] weights: the score; -inf = no arc
  std::vector<int32_t> arc_head;  // [m, m] the original arc (head node, dependent node) an arc stands for
  std::vector<int32_t> arc_dep;
  std::vector<int32_t> parent, mark, group, walk, alive;
  std::vector<int32_t> cycle_members, cycle_start, cycle_rep, cycle_arc_head, cycle_arc_dep, cycle_group;
  std::vector<int32_t> enter_head, enter_dep;
};

// Decodes one sentence of `length` words (scores as above, row stride `stride`) into heads[0 .. length). `where`
// names the sentence in messages ("batch item 3"). Returns "" or the error message (heads then unspecified).
std::string decode_tree_item(const std::string& where, const float* scores, int64_t length, int64_t stride,
                             int64_t* heads, MstWorkspace& workspace);

// A padded batch: scores float [B, N, N], lengths [B] (0 <= lengths[b] <= N), heads int64 [B, N] (-1 beyond each
// length). Validates every length first, then decodes on up to num_threads threads; throws std::invalid_argument
// with the lowest bad item's message.
void decode_tree_batch(const float* scores, const int64_t* lengths, int64_t B, int64_t N, int64_t* heads,
                       int num_threads);

}  // namespace syntaxkernels
