// The CUDA tree-distance builder: plain C++ interface (no torch), implemented in tree_distance_cuda.cu.
#pragma once

#include <cstdint>

namespace syntaxkernels {

// Error slots written by the builder: errors[0] = lowest batch item with a bad length, errors[1] = lowest
// batch item with bad heads (out of range, self-loop or cycle); B when there is none.
constexpr int kNumErrorSlots = 2;

// Enqueues the builder on `stream` (a cudaStream_t). All pointers are device pointers:
//   heads int64 [B, N], lengths int64 [B] (read);
//   distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N] (written, padding included);
//   order_scratch int32 [B, N] (scratch), errors int32 [kNumErrorSlots] (written).
// One thread block per batch item. Returns the launch's cudaError_t as an int (0 = success).
// Requires 0 <= B <= 2^31 - 1.
int launch_tree_distance(const int64_t* heads, const int64_t* lengths, int64_t B, int64_t N, uint8_t* distance,
                         int32_t* depth, int32_t* segment, int32_t* order_scratch, int32_t* errors, void* stream);

// A readable message for a cudaError_t returned by launch_tree_distance.
const char* cuda_error_string(int error);

}  // namespace syntaxkernels
