// Python bindings of syntaxkernels._C: the tree-distance builders (contract in syntaxkernels/_ext.py).
//
// tree_distance(heads int64 [B, N] CPU, lengths int64 [B] CPU, num_threads)
//     -> (distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N])
// tree_distance_cuda(heads [B, N] CUDA, lengths [B] CUDA) -> the same on the GPU (CUDA builds only)
// has_cuda() -> whether tree_distance_cuda was compiled in.
// Bad input raises ValueError (std::invalid_argument) with the Python builder's messages.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <stdexcept>
#include <string>
#include <tuple>

#include "tensor_checks.h"
#include "tree_distance.h"

#ifdef WITH_CUDA
#include "cuda/launcher.h"
#endif

namespace syntaxkernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_distance_cpu(const at::Tensor& heads_in,
                                                                 const at::Tensor& lengths_in,
                                                                 int64_t num_threads) {
  if (heads_in.defined() && !heads_in.device().is_cpu()) {
    throw std::invalid_argument("tree_distance needs CPU tensors, got heads on " + heads_in.device().str() +
                                " (use tree_distance_cuda)");
  }
  auto [heads, lengths] = check_inputs(heads_in, lengths_in);
  const int64_t B = heads.size(0), N = heads.size(1);
  auto distance = at::empty({B, N, N}, at::TensorOptions().dtype(at::kByte));
  auto depth = at::empty({B, N}, at::TensorOptions().dtype(at::kInt));
  auto segment = at::empty({B, N}, at::TensorOptions().dtype(at::kInt));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  {
    pybind11::gil_scoped_release release;
    build_batch(heads.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), B, N, distance.data_ptr<uint8_t>(),
                depth.data_ptr<int32_t>(), segment.data_ptr<int32_t>(),
                static_cast<int>(std::min<int64_t>(num_threads, 1024)));
  }
  return {distance, depth, segment};
}

}  // namespace syntaxkernels

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "syntaxkernels C++ extension: all-pairs tree-distance builders";
  m.def("tree_distance", &syntaxkernels::tree_distance_cpu, pybind11::arg("heads"), pybind11::arg("lengths"),
        pybind11::arg("num_threads") = 0,
        "(distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N]) for heads int64 [B, N] and "
        "lengths int64 [B] on the CPU; num_threads 0 = torch's intra-op thread count. Releases the GIL.");
#ifdef WITH_CUDA
  m.def("tree_distance_cuda", &syntaxkernels::tree_distance_cuda, pybind11::arg("heads"), pybind11::arg("lengths"),
        "The same as tree_distance for CUDA tensors, built on the GPU.");
  m.def("has_cuda", []() { return true; });
#else
  m.def("has_cuda", []() { return false; });
#endif
}
