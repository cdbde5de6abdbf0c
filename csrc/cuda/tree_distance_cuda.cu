// The CUDA tree-distance builder: the same result as the CPU core (csrc/tree_distance.cpp), computed on the
// GPU from device tensors. Plain CUDA C++ on raw pointers: no torch headers here, so the file compiles with
// any nvcc (launcher.cpp does the torch binding).
//
// One thread block per batch item:
//   1. every distance entry of the item's [N, N] block is set to 255, depth and segment to -1;
//   2. the length and the heads are validated (range, self-loop); a bad item records its index in the
//      error slots (atomicMin, so the lowest bad item wins) and stops;
//   3. roots are numbered by position (block-wide prefix count) and form level 0 of a breadth-first order;
//   4. level by level, the tokens whose head is on the previous level join the order; a new token's path
//      to any placed token runs through its head, so entry (v, u) = entry (head(v), u) + 1 (saturating at
//      254, 255 stays 255): first against the tokens of earlier levels (mirrored into the column), then
//      against the tokens of its own level (whose entries with the previous level were just written).
//      O(L^2) pair updates in all, each O(1);
//   5. tokens never placed lie on or behind a cycle: the item is recorded as bad.
// The host turns the error slots into the CPU builder's message (launcher.cpp).
#include "tree_distance_cuda.h"

#include <cuda_runtime.h>

namespace syntaxkernels {
namespace {

constexpr int kThreads = 256;
constexpr uint8_t kUnreachable = 255;
constexpr uint8_t kMaxDistance = 254;

__device__ __forceinline__ uint8_t one_further(uint8_t d) {
  return static_cast<uint8_t>(d + (d < kMaxDistance));
}

__global__ void init_errors_kernel(int32_t* errors, int32_t none) {
  if (threadIdx.x < kNumErrorSlots) errors[threadIdx.x] = none;
}

// Grid: one block (kThreads threads) per batch item b = blockIdx.x.
__global__ void __launch_bounds__(kThreads) tree_distance_kernel(const int64_t* __restrict__ heads,
                                                                 const int64_t* __restrict__ lengths, int64_t N,
                                                                 uint8_t* __restrict__ distance,
                                                                 int32_t* __restrict__ depth,
                                                                 int32_t* __restrict__ segment,
                                                                 int32_t* __restrict__ order_scratch,
                                                                 int32_t* __restrict__ errors) {
  __shared__ int32_t bad;
  __shared__ int64_t root_count[kThreads];
  __shared__ int64_t placed;      // tokens of levels < current level + 1 in order[0 .. placed)
  __shared__ int64_t next_end;    // end of the level being discovered
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  const int64_t* head = heads + b * N;
  uint8_t* dist = distance + b * N * N;
  int32_t* dep = depth + b * N;
  int32_t* seg = segment + b * N;
  int32_t* order = order_scratch + b * N;

  // 1. Defaults, padding included.
  for (int64_t e = tid; e < N * N; e += kThreads) dist[e] = kUnreachable;
  for (int64_t i = tid; i < N; i += kThreads) {
    dep[i] = -1;
    seg[i] = -1;
  }
  const int64_t length = lengths[b];
  if (length < 0 || length > N) {
    if (tid == 0) atomicMin(&errors[0], static_cast<int32_t>(b));
    return;
  }
  if (length == 0) return;

  // 2. Range and self-loop checks.
  if (tid == 0) bad = 0;
  __syncthreads();
  for (int64_t i = tid; i < length; i += kThreads) {
    const int64_t h = head[i];
    if (h < -1 || h >= length || h == i) bad = 1;
  }
  __syncthreads();
  if (bad) {
    if (tid == 0) atomicMin(&errors[1], static_cast<int32_t>(b));
    return;
  }

  // 3. Roots, numbered by position: each thread counts the roots of its chunk, then a prefix count.
  const int64_t chunk = (length + kThreads - 1) / kThreads;
  const int64_t chunk_begin = min(length, tid * chunk);
  const int64_t chunk_end = min(length, chunk_begin + chunk);
  int64_t local = 0;
  for (int64_t i = chunk_begin; i < chunk_end; ++i) local += head[i] == -1;
  root_count[tid] = local;
  __syncthreads();
  if (tid == 0) {
    int64_t total = 0;
    for (int t = 0; t < kThreads; ++t) {
      const int64_t count = root_count[t];
      root_count[t] = total;
      total += count;
    }
    placed = total;
  }
  __syncthreads();
  int64_t rank = root_count[tid];
  for (int64_t i = chunk_begin; i < chunk_end; ++i) {
    if (head[i] == -1) {
      order[rank] = static_cast<int32_t>(i);
      seg[i] = static_cast<int32_t>(rank);
      dep[i] = 0;
      dist[i * N + i] = 0;
      ++rank;
    }
  }
  __syncthreads();

  // 4. Breadth-first levels.
  for (int32_t level = 0;; ++level) {
    const int64_t old_count = placed;
    if (tid == 0) next_end = old_count;
    __syncthreads();
    // Discover the next level. A token written in this pass gets level + 1, never read as `level`.
    for (int64_t v = tid; v < length; v += kThreads) {
      const int64_t h = head[v];
      if (h >= 0 && dep[v] == -1 && dep[h] == level) {
        dep[v] = level + 1;
        seg[v] = seg[h];
        order[atomicAdd(reinterpret_cast<unsigned long long*>(&next_end), 1ULL)] = static_cast<int32_t>(v);
      }
    }
    __syncthreads();
    const int64_t new_count = next_end - old_count;
    if (new_count == 0) break;
    const int32_t* level_tokens = order + old_count;
    // New tokens against earlier levels (entries final), mirrored.
    for (int64_t pair = tid; pair < new_count * old_count; pair += kThreads) {
      const int64_t v = level_tokens[pair / old_count];
      const int64_t u = order[pair % old_count];
      const uint8_t d = one_further(dist[head[v] * N + u]);
      dist[v * N + u] = d;
      dist[u * N + v] = d;
    }
    __syncthreads();
    // New tokens against each other: the head's entry with u was written just above.
    for (int64_t pair = tid; pair < new_count * new_count; pair += kThreads) {
      const int64_t v = level_tokens[pair / new_count];
      const int64_t u = level_tokens[pair % new_count];
      dist[v * N + u] = v == u ? 0 : one_further(dist[head[v] * N + u]);
    }
    __syncthreads();
    if (tid == 0) placed = next_end;
    __syncthreads();
  }

  // 5. Unplaced tokens never reach a root.
  if (tid == 0 && placed < length) atomicMin(&errors[1], static_cast<int32_t>(b));
}

}  // namespace

int launch_tree_distance(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, uint8_t* distance,
                         int32_t* depth, int32_t* segment, int32_t* order_scratch, int32_t* errors, void* stream) {
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  init_errors_kernel<<<1, 32, 0, cuda_stream>>>(errors, static_cast<int32_t>(B));
  if (B > 0) {
    tree_distance_kernel<<<static_cast<unsigned int>(B), kThreads, 0, cuda_stream>>>(
        heads, lengths, N, distance, depth, segment, order_scratch, errors);
  }
  return static_cast<int>(cudaGetLastError());
}

const char* cuda_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace syntaxkernels
