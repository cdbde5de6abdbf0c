// All-pairs shortest-path distance for batches of sparse graphs: the torch-free core.
//
// A graph is a list of edges (source, target) over the tokens 0 .. length-1, directed or not. For a padded batch
// (edges int64 [B, E, 2] row-major, a (-1, -1) pair is padding, lengths int64 [B]) the builder writes
//   distance uint8 [B, P, P] (P >= N, the row stride): the number of edges on a shortest path from i to j (following
//     edges source -> target when directed, either way when not), 0 on the diagonal, saturating at 254;
//     255 = unreachable, and on every padding row and column (the diagonal of padding too) and beyond N.
// One breadth-first search per source token: O(length * (length + edges)) per item, parallel over the batch.
// Self-loops and duplicate edges are allowed (they change nothing). Bad input raises std::invalid_argument
// naming the batch item and edge ("batch item 2, edge 5: target 9 out of range (length 7; ...)"); with several
// bad items the lowest batch index is reported, whatever the number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace syntaxkernels {

// Reusable per-thread buffers for one graph (sized to the largest graph seen).
struct GraphWorkspace {
  std::vector<int32_t> start;      // out-neighbours of token t: neighbours[start[t] .. start[t + 1])
  std::vector<int32_t> neighbours;
  std::vector<int32_t> cursor;
  std::vector<int32_t> queue;      // one breadth-first search
};

// The error message for the edges[0 .. num_edges) (pairs, row-major) of item `where` ("batch item 3" or
// "sequence 3") over `length` tokens, or "" when they are valid: each pair is (-1, -1) (padding) or two endpoints in
// 0 .. length-1.
std::string check_graph_edges(const std::string& where, const int64_t* edges, int64_t num_edges, int64_t length);

// Builds one item: validates its edges, then writes its length x length block of `distance` (row stride `stride`)
// and 255 on the rest of the N x N block's rows and columns below `fill` (fill >= length: rows and columns
// length .. fill-1 are written 255 too). Returns "" or the error message (the block is then unspecified).
std::string build_graph_item(const std::string& where, const int64_t* edges, int64_t num_edges, int64_t length,
                             int64_t fill, int64_t stride, bool directed, uint8_t* distance,
                             GraphWorkspace& workspace);

// The padded batch on up to num_threads threads: edges [B, E, 2], lengths [B] (0 <= lengths[b] <= N), distance
// [B, P, P] with P >= N (every byte written). Validates every length first, then every item; throws
// std::invalid_argument with the message of the lowest bad item.
void build_graph_batch(const int64_t* edges, int64_t E, const int64_t* lengths, int64_t B, int64_t N, int64_t P,
                       bool directed, uint8_t* distance, int num_threads);

// A packed batch: S graphs, graph s over tokens [cu_seqlens[s], cu_seqlens[s + 1]) with its edges at
// edges[edge_offsets[s] .. edge_offsets[s + 1]) (pairs, endpoints local to the graph); its n_s x n_s block (row
// stride n_s) at distance + offsets[s] (tree_distance.h, packed_offsets). Messages read "sequence s, edge e: ..."
// (e local to the sequence). check_edge_offsets validates edge_offsets against the E pairs given.
std::string check_edge_offsets(const int64_t* edge_offsets, int64_t S, int64_t E);
void build_graph_packed(const int64_t* edges, const int64_t* edge_offsets, const int64_t* cu_seqlens, int64_t S,
                        const int64_t* offsets, bool directed, uint8_t* distance, int num_threads);

}  // namespace syntaxkernels
