// Torch binding of the CUDA tree-distance builder: checks, allocation, launch on the current stream, and
// the error report. The kernels themselves live in tree_distance_cuda.cu (no torch headers there).
#include "launcher.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "../tensor_checks.h"
#include "../tree_distance.h"
#include "tree_distance_cuda.h"

namespace syntaxkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_distance_cuda(const at::Tensor& heads_in,
                                                                  const at::Tensor& lengths_in) {
  if (heads_in.defined() && !heads_in.device().is_cuda()) {
    throw std::invalid_argument("tree_distance_cuda needs CUDA tensors, got heads on " + heads_in.device().str() +
                                " (use tree_distance)");
  }
  auto [heads, lengths] = check_inputs(heads_in, lengths_in);
  const int64_t B = heads.size(0), N = heads.size(1);
  if (B > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("the CUDA tree builder supports at most 2^31 - 1 batch items, got " +
                                std::to_string(B));
  }
  const c10::cuda::CUDAGuard device_guard(heads.device());
  const auto options = heads.options();
  auto distance = at::empty({B, N, N}, options.dtype(at::kByte));
  auto depth = at::empty({B, N}, options.dtype(at::kInt));
  auto segment = at::empty({B, N}, options.dtype(at::kInt));
  auto order = at::empty({B, N}, options.dtype(at::kInt));
  auto errors = at::empty({kNumErrorSlots}, options.dtype(at::kInt));
  const int status = launch_tree_distance(heads.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), B, N,
                                          distance.data_ptr<uint8_t>(), depth.data_ptr<int32_t>(),
                                          segment.data_ptr<int32_t>(), order.data_ptr<int32_t>(),
                                          errors.data_ptr<int32_t>(), c10::cuda::getCurrentCUDAStream().stream());
  if (status != 0) throw std::runtime_error(std::string("tree_distance_cuda: ") + cuda_error_string(status));

  // The one device-to-host transfer of a successful call: the 8-byte error slots, read back (a stream
  // synchronisation) so that bad input raises here. The distances never leave the GPU. Only when an item
  // is bad is its length or heads row copied over, so the message is the CPU builder's, word for word.
  const auto slots = errors.cpu();
  const int32_t bad_length = slots.data_ptr<int32_t>()[0];
  const int32_t bad_heads = slots.data_ptr<int32_t>()[1];
  if (bad_length < B) {
    const int64_t length = lengths[bad_length].item<int64_t>();
    throw std::invalid_argument(check_length(bad_length, length, N));
  }
  if (bad_heads < B) {
    const int64_t length = lengths[bad_heads].item<int64_t>();
    const auto row = heads[bad_heads].slice(0, 0, length).cpu().contiguous();
    TreeWorkspace workspace;
    std::string message = check_sentence(bad_heads, row.data_ptr<int64_t>(), length, workspace);
    if (message.empty()) message = "batch item " + std::to_string(bad_heads) + ": invalid tree";
    throw std::invalid_argument(message);
  }
  return {distance, depth, segment};
}

}  // namespace syntaxkernels
