// All-pairs tree distance: the torch-free core (see tree_distance.h for the contract).
#include "tree_distance.h"

#include "batch_items.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace syntaxkernels {
namespace {

std::string item_prefix(int64_t b, int64_t token) {
  return "batch item " + std::to_string(b) + ", token " + std::to_string(token) + ": ";
}

// Head out of range, then self-loop (the Python builder's order); "" when neither occurs.
std::string check_heads_local(int64_t b, const int64_t* heads, int64_t length) {
  for (int64_t i = 0; i < length; ++i) {
    const int64_t h = heads[i];
    if (h < -1 || h >= length) {
      return item_prefix(b, i) + "head " + std::to_string(h) + " out of range (length " +
             std::to_string(length) + "; expected -1 for a root or 0.." + std::to_string(length - 1) + ")";
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    if (heads[i] == i) return item_prefix(b, i) + "self-loop (its head is itself; use -1 for a root)";
  }
  return "";
}

// The message for tokens that never reach a root (depth < 0): peels the tokens no unreached token
// points to; what remains lies on cycles; names the smallest such token and its cycle.
std::string cycle_message(int64_t b, const int64_t* heads, int64_t length, const int32_t* depth,
                          TreeWorkspace& workspace) {
  std::vector<int32_t>& indegree = workspace.scratch;
  indegree.assign(static_cast<size_t>(2 * length), 0);
  int32_t* removed = indegree.data() + length;
  for (int64_t i = 0; i < length; ++i) {
    if (depth[i] < 0) ++indegree[heads[i]];  // an unreached token's head is never a root, never -1
  }
  std::vector<int32_t>& stack = workspace.children;  // free once the breadth-first pass is over
  stack.clear();
  for (int64_t i = 0; i < length; ++i) {
    if (depth[i] < 0 && indegree[i] == 0) stack.push_back(static_cast<int32_t>(i));
  }
  while (!stack.empty()) {
    const int32_t i = stack.back();
    stack.pop_back();
    removed[i] = 1;
    const int64_t p = heads[i];
    if (--indegree[p] == 0) stack.push_back(static_cast<int32_t>(p));
  }
  int64_t start = -1;
  for (int64_t i = 0; i < length; ++i) {
    if (depth[i] < 0 && !removed[i]) {
      start = i;
      break;
    }
  }
  std::string path = std::to_string(start);
  for (int64_t node = heads[start]; node != start; node = heads[node]) path += " -> " + std::to_string(node);
  path += " -> " + std::to_string(start);
  return item_prefix(b, start) + "on a cycle (" + path + ") that never reaches a root";
}

// Validates one sentence and orders its tokens breadth-first from the roots (roots first, by position).
// Fills workspace.order, depth[0 .. length) and segment[0 .. length). Returns "" or the error message.
std::string order_tokens(int64_t b, const int64_t* heads, int64_t length, int32_t* depth, int32_t* segment,
                         TreeWorkspace& workspace) {
  std::string message = check_heads_local(b, heads, length);
  if (!message.empty()) return message;

  // Children lists (compressed rows), each in increasing token order.
  std::vector<int32_t>& start = workspace.child_start;
  std::vector<int32_t>& children = workspace.children;
  std::vector<int32_t>& order = workspace.order;
  start.assign(static_cast<size_t>(length + 1), 0);
  for (int64_t i = 0; i < length; ++i) {
    if (heads[i] >= 0) ++start[heads[i] + 1];
  }
  for (int64_t t = 0; t < length; ++t) start[t + 1] += start[t];
  children.resize(static_cast<size_t>(start[length]));
  std::vector<int32_t>& cursor = workspace.scratch;
  cursor.assign(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < length; ++i) {
    if (heads[i] >= 0) children[cursor[heads[i]]++] = static_cast<int32_t>(i);
  }

  // Breadth-first order: every token comes after its head.
  order.resize(static_cast<size_t>(length));
  int64_t placed = 0;
  int32_t trees = 0;
  for (int64_t i = 0; i < length; ++i) {
    depth[i] = -1;
    segment[i] = -1;
  }
  for (int64_t i = 0; i < length; ++i) {
    if (heads[i] == -1) {
      order[placed++] = static_cast<int32_t>(i);
      depth[i] = 0;
      segment[i] = trees++;
    }
  }
  for (int64_t next = 0; next < placed; ++next) {
    const int32_t v = order[next];
    for (int32_t c = start[v]; c < start[v + 1]; ++c) {
      const int32_t child = children[c];
      order[placed++] = child;
      depth[child] = depth[v] + 1;
      segment[child] = segment[v];
    }
  }
  if (placed < length) return cycle_message(b, heads, length, depth, workspace);
  return "";
}

}  // namespace

std::string check_length(int64_t b, int64_t length, int64_t N) {
  const std::string prefix = "batch item " + std::to_string(b) + ": lengths[" + std::to_string(b) + "] = " +
                             std::to_string(length);
  if (length < 0) return prefix + " is negative";
  if (length > N) return prefix + " is larger than N = " + std::to_string(N);
  return "";
}

std::string order_sentence(int64_t b, const int64_t* heads, int64_t length, int32_t* depth, int32_t* segment,
                           TreeWorkspace& workspace) {
  return order_tokens(b, heads, length, depth, segment, workspace);
}

std::string check_sentence(int64_t b, const int64_t* heads, int64_t length, TreeWorkspace& workspace) {
  std::vector<int32_t> depth(static_cast<size_t>(length)), segment(static_cast<size_t>(length));
  return order_tokens(b, heads, length, depth.data(), segment.data(), workspace);
}

// What every item builder does first: the distance block all unreachable, padding depth and segment -1, the
// tokens ordered (order_tokens). False when the builder has nothing more to do: an empty item (message "") or
// heads that are not a forest (the message names the item and token).
bool start_item(int64_t b, const int64_t* heads, int64_t length, int64_t N, uint8_t* distance, int32_t* depth,
                int32_t* segment, TreeWorkspace& workspace, std::string& message) {
  std::memset(distance, kUnreachable, static_cast<size_t>(N * N));
  for (int64_t i = length; i < N; ++i) {
    depth[i] = -1;
    segment[i] = -1;
  }
  message.clear();
  if (length == 0) return false;
  message = order_tokens(b, heads, length, depth, segment, workspace);
  return message.empty();
}

std::string build_item(int64_t b, const int64_t* heads, int64_t length, int64_t N, uint8_t* distance,
                       int32_t* depth, int32_t* segment, TreeWorkspace& workspace) {
  std::string message;
  if (!start_item(b, heads, length, N, distance, depth, segment, workspace, message)) return message;

  // Subtree sizes (children before their head: reverse breadth-first order), then preorder positions:
  // the subtree of v is the tokens u with first[v] <= first[u] < first[v] + size[v].
  const int32_t* order = workspace.order.data();
  workspace.subtree_size.assign(static_cast<size_t>(length), 0);
  workspace.preorder.resize(static_cast<size_t>(length));
  int32_t* size = workspace.subtree_size.data();
  int32_t* first = workspace.preorder.data();
  for (int64_t k = length - 1; k >= 0; --k) {
    const int32_t v = order[k];
    size[v] += 1;
    if (heads[v] >= 0) size[heads[v]] += size[v];
  }
  int32_t next = 0;
  for (int64_t k = 0; k < length && heads[order[k]] == -1; ++k) {
    first[order[k]] = next;
    next += size[order[k]];
  }
  const int32_t* child_start = workspace.child_start.data();
  const int32_t* children = workspace.children.data();
  for (int64_t k = 0; k < length; ++k) {
    const int32_t v = order[k];
    int32_t position = first[v] + 1;
    for (int32_t c = child_start[v]; c < child_start[v + 1]; ++c) {
      first[children[c]] = position;
      position += size[children[c]];
    }
  }

  // Each tree's span of positions [span_begin, span_end): outside it a row stays 255.
  int64_t roots = 0;
  while (roots < length && heads[order[roots]] == -1) ++roots;
  workspace.span.assign(static_cast<size_t>(2 * roots), 0);
  int32_t* span_begin = workspace.span.data();
  int32_t* span_end = span_begin + roots;
  for (int64_t t = 0; t < roots; ++t) span_begin[t] = static_cast<int32_t>(length);
  for (int64_t u = 0; u < length; ++u) {
    span_begin[segment[u]] = std::min(span_begin[segment[u]], static_cast<int32_t>(u));
    span_end[segment[u]] = static_cast<int32_t>(u + 1);
  }

  // Rows in breadth-first order, each from its head's row, O(1) per entry and every access sequential:
  // a token u in the subtree of v is depth[u] - depth[v] away; any other token's path from v runs through
  // v's head, so it is one further than from the head (255 stays 255, saturating at 254). A root's row
  // is its descendants' depths and 255 elsewhere. Only the columns of the token's tree's span are visited.
  for (int64_t k = 0; k < length; ++k) {
    const int64_t v = order[k];
    uint8_t* row = distance + v * N;
    const int64_t begin = span_begin[segment[v]], end = span_end[segment[v]];
    const int32_t v_first = first[v];
    const uint32_t v_size = static_cast<uint32_t>(size[v]);
    const int32_t v_depth = depth[v];
    const int64_t p = heads[v];
    if (p >= 0) {
      const uint8_t* parent_row = distance + p * N;
      for (int64_t u = begin; u < end; ++u) {
        const int32_t below = std::min(depth[u] - v_depth, static_cast<int32_t>(kMaxDistance));
        const uint8_t through_head = static_cast<uint8_t>(parent_row[u] + (parent_row[u] < kMaxDistance));
        const bool inside = static_cast<uint32_t>(first[u] - v_first) < v_size;
        row[u] = inside ? static_cast<uint8_t>(below) : through_head;
      }
    } else {
      for (int64_t u = begin; u < end; ++u) {
        const int32_t below = std::min(depth[u] - v_depth, static_cast<int32_t>(kMaxDistance));
        const bool inside = static_cast<uint32_t>(first[u] - v_first) < v_size;
        row[u] = inside ? static_cast<uint8_t>(below) : kUnreachable;
      }
    }
  }
  return "";
}

std::string build_item_leak_free(int64_t b, const int64_t* heads, int64_t length, int64_t N, uint8_t* distance,
                                 int32_t* depth, int32_t* segment, TreeWorkspace& workspace) {
  std::string message;
  if (!start_item(b, heads, length, N, distance, depth, segment, workspace, message)) return message;

  // Row i: a breadth-first search from i over the edges whose both ends are <= i. The row itself marks the
  // visited tokens (255 = not yet reached; distances saturate at 254, never 255). In a forest every token is
  // reached once, from its neighbour on the path back to i.
  const int32_t* child_start = workspace.child_start.data();
  const int32_t* children = workspace.children.data();
  workspace.scratch.resize(static_cast<size_t>(length));
  int32_t* queue = workspace.scratch.data();
  for (int64_t i = 0; i < length; ++i) {
    uint8_t* row = distance + i * N;
    row[i] = 0;
    queue[0] = static_cast<int32_t>(i);
    int64_t head = 0, tail = 1;
    while (head < tail) {
      const int32_t v = queue[head++];
      const uint8_t next = static_cast<uint8_t>(row[v] + (row[v] < kMaxDistance));
      const int64_t p = heads[v];
      if (p >= 0 && p <= i && row[p] == kUnreachable) {
        row[p] = next;
        queue[tail++] = static_cast<int32_t>(p);
      }
      for (int32_t c = child_start[v]; c < child_start[v + 1]; ++c) {
        const int32_t child = children[c];
        if (child > i) break;  // children are increasing
        if (row[child] == kUnreachable) {
          row[child] = next;
          queue[tail++] = child;
        }
      }
    }
  }
  return "";
}

void build_batch(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, uint8_t* distance,
                 int32_t* depth, int32_t* segment, int num_threads, bool leak_free) {
  for (int64_t b = 0; b < B; ++b) {
    std::string message = check_length(b, lengths[b], N);
    if (!message.empty()) throw std::invalid_argument(message);
  }
  if (B == 0 || N == 0) return;

  // Threads only pay off with enough work (each start costs tens of microseconds).
  const int64_t work = B * N * N;
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, B, std::max<int64_t>(1, work / 65536)});

  const auto build = leak_free ? &build_item_leak_free : &build_item;
  for_each_item<TreeWorkspace>(B, threads, [&](int64_t b, TreeWorkspace& workspace) {
    return build(b, heads + b * N, lengths[b], N, distance + b * N * N, depth + b * N, segment + b * N, workspace);
  });
}

std::string check_cu_seqlens(const int64_t* cu_seqlens, int64_t S, int64_t T) {
  if (cu_seqlens[0] != 0) return "cu_seqlens[0] = " + std::to_string(cu_seqlens[0]) + " (expected 0)";
  for (int64_t s = 0; s < S; ++s) {
    if (cu_seqlens[s + 1] < cu_seqlens[s]) {
      return "sequence " + std::to_string(s) + ": cu_seqlens[" + std::to_string(s + 1) + "] = " +
             std::to_string(cu_seqlens[s + 1]) + " is smaller than cu_seqlens[" + std::to_string(s) + "] = " +
             std::to_string(cu_seqlens[s]) + " (a negative length)";
    }
  }
  if (cu_seqlens[S] != T) {
    return "cu_seqlens[" + std::to_string(S) + "] = " + std::to_string(cu_seqlens[S]) + " but there are " +
           std::to_string(T) + " heads (the last entry must be the token count)";
  }
  return "";
}

void packed_offsets(const int64_t* cu_seqlens, int64_t S, int64_t* offsets) {
  offsets[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = cu_seqlens[s + 1] - cu_seqlens[s];
    offsets[s + 1] = offsets[s] + n * n;
  }
}

namespace {

// "batch item s, token i: ..." (build_item's wording) as "sequence s, token i: ...".
std::string as_sequence_message(const std::string& message) {
  const std::string prefix = "batch item ";
  if (message.compare(0, prefix.size(), prefix) == 0) return "sequence " + message.substr(prefix.size());
  return message;
}

}  // namespace

void build_packed(const int64_t* heads, const int64_t* cu_seqlens, int64_t S, const int64_t* offsets,
                  uint8_t* distance, int32_t* depth, int32_t* segment, int num_threads, bool leak_free) {
  const int64_t T = cu_seqlens[S];
  if (S == 0 || T == 0) return;
  const int64_t work = offsets[S];
  int64_t threads = std::max<int64_t>(1, num_threads);
  threads = std::min<int64_t>({threads, S, std::max<int64_t>(1, work / 65536)});
  const auto build = leak_free ? &build_item_leak_free : &build_item;
  try {
    for_each_item<TreeWorkspace>(S, threads, [&](int64_t s, TreeWorkspace& workspace) {
      const int64_t start = cu_seqlens[s], n = cu_seqlens[s + 1] - start;
      return build(s, heads + start, n, n, distance + offsets[s], depth + start, segment + start, workspace);
    });
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(as_sequence_message(error.what()));
  }
}

}  // namespace syntaxkernels
