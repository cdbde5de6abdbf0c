// Torch binding of the CUDA tree-distance builder (implemented in launcher.cpp; CUDA builds only).
#pragma once

#include <torch/extension.h>

#include <tuple>

namespace syntaxkernels {

// (distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N]) on the heads' CUDA device, for
// heads int [B, N] and lengths int [B] on that device. Raises std::invalid_argument (ValueError) with the
// CPU builder's messages.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_distance_cuda(const at::Tensor& heads, const at::Tensor& lengths);

}  // namespace syntaxkernels
