// All-pairs shortest-path distance of sparse graphs: the torch-free core (see graph_distance.h for the contract).
#include "graph_distance.h"

#include "batch_items.h"
#include "tree_distance.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace syntaxkernels {

std::string check_graph_edges(const std::string& where, const int64_t* edges, int64_t num_edges, int64_t length) {
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = edges[2 * e], t = edges[2 * e + 1];
    if (s == -1 && t == -1) continue;
    const std::string pair = "(" + std::to_string(s) + ", " + std::to_string(t) + ")";
    const std::string prefix = where + ", edge " + std::to_string(e) + ": ";
    if (s < 0 || t < 0) {
      return prefix + pair + " has a negative endpoint (only a (-1, -1) pair pads an edge list)";
    }
    if (s >= length || t >= length) {
      const bool source = s >= length;
      return prefix + pair + ": " + (source ? "source " : "target ") + std::to_string(source ? s : t) +
             " out of range (length " + std::to_string(length) + "; expected 0.." + std::to_string(length - 1) + ")";
    }
  }
  return "";
}

std::string build_graph_item(const std::string& where, const int64_t* edges, int64_t num_edges, int64_t length,
                             int64_t fill, int64_t stride, bool directed, uint8_t* distance,
                             GraphWorkspace& workspace) {
  std::string message = check_graph_edges(where, edges, num_edges, length);
  if (!message.empty()) return message;
  for (int64_t i = 0; i < fill; ++i) std::memset(distance + i * stride, kUnreachable, static_cast<size_t>(fill));
  if (length == 0) return "";

  // Out-neighbours in compressed rows (both directions when undirected); self-loops dropped.
  std::vector<int32_t>& start = workspace.start;
  std::vector<int32_t>& neighbours = workspace.neighbours;
  std::vector<int32_t>& cursor = workspace.cursor;
  start.assign(static_cast<size_t>(length + 1), 0);
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = edges[2 * e], t = edges[2 * e + 1];
    if (s < 0 || s == t) continue;
    ++start[s + 1];
    if (!directed) ++start[t + 1];
  }
  for (int64_t v = 0; v < length; ++v) start[v + 1] += start[v];
  neighbours.resize(static_cast<size_t>(start[length]));
  cursor.assign(start.begin(), start.end() - 1);
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = edges[2 * e], t = edges[2 * e + 1];
    if (s < 0 || s == t) continue;
    neighbours[cursor[s]++] = static_cast<int32_t>(t);
    if (!directed) neighbours[cursor[t]++] = static_cast<int32_t>(s);
  }

  // One breadth-first search per source, level by level; the row itself marks what is reached (255 = not yet:
  // a level past 254 is written 254, which still reads as reached).
  std::vector<int32_t>& queue = workspace.queue;
  queue.resize(static_cast<size_t>(length));
  for (int64_t source = 0; source < length; ++source) {
    uint8_t* row = distance + source * stride;
    row[source] = 0;
    queue[0] = static_cast<int32_t>(source);
    int64_t head = 0, tail = 1, level = 0;
    while (head < tail) {
      const int64_t layer_end = tail;
      ++level;
      const uint8_t value = static_cast<uint8_t>(std::min<int64_t>(level, kMaxDistance));
      for (; head < layer_end; ++head) {
        const int32_t v = queue[head];
        for (int32_t c = start[v]; c < start[v + 1]; ++c) {
          const int32_t u = neighbours[c];
          if (row[u] == kUnreachable) {
            row[u] = value;
            queue[tail++] = u;
          }
        }
      }
    }
  }
  return "";
}

void build_graph_batch(const int64_t* edges, int64_t E, const int64_t* lengths, int64_t B, int64_t N, int64_t P,
                       bool directed, uint8_t* distance, int num_threads) {
  for (int64_t b = 0; b < B; ++b) {
    std::string message = check_length(b, lengths[b], N);
    if (!message.empty()) throw std::invalid_argument(message);
  }
  if (B == 0) return;
  const int64_t work = B * (N * N + N * E);
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, B, std::max<int64_t>(1, work / 65536)});
  for_each_item<GraphWorkspace>(B, threads, [&](int64_t b, GraphWorkspace& workspace) {
    uint8_t* block = distance + b * P * P;
    std::string message = build_graph_item("batch item " + std::to_string(b), edges + b * E * 2, E, lengths[b], P,
                                           P, directed, block, workspace);
    return message;
  });
}

std::string check_edge_offsets(const int64_t* edge_offsets, int64_t S, int64_t E) {
  if (edge_offsets[0] != 0) return "edge_offsets[0] = " + std::to_string(edge_offsets[0]) + " (expected 0)";
  for (int64_t s = 0; s < S; ++s) {
    if (edge_offsets[s + 1] < edge_offsets[s]) {
      return "sequence " + std::to_string(s) + ": edge_offsets[" + std::to_string(s + 1) + "] = " +
             std::to_string(edge_offsets[s + 1]) + " is smaller than edge_offsets[" + std::to_string(s) + "] = " +
             std::to_string(edge_offsets[s]);
    }
  }
  if (edge_offsets[S] != E) {
    return "edge_offsets[" + std::to_string(S) + "] = " + std::to_string(edge_offsets[S]) + " but there are " +
           std::to_string(E) + " edges (the last entry must be the edge count)";
  }
  return "";
}

void build_graph_packed(const int64_t* edges, const int64_t* edge_offsets, const int64_t* cu_seqlens, int64_t S,
                        const int64_t* offsets, bool directed, uint8_t* distance, int num_threads) {
  if (S == 0) return;
  const int64_t work = offsets[S] + edge_offsets[S] * 8;
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, S, std::max<int64_t>(1, work / 65536)});
  for_each_item<GraphWorkspace>(S, threads, [&](int64_t s, GraphWorkspace& workspace) {
    const int64_t n = cu_seqlens[s + 1] - cu_seqlens[s];
    return build_graph_item("sequence " + std::to_string(s), edges + 2 * edge_offsets[s],
                            edge_offsets[s + 1] - edge_offsets[s], n, n, n, directed, distance + offsets[s],
                            workspace);
  });
}

}  // namespace syntaxkernels
