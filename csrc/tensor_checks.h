// Input checks shared by the CPU and CUDA bindings: the Python builder's ValueError messages.
#pragma once

#include <torch/extension.h>

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace syntaxkernels {

// A shape as Python prints a tuple: (2, 3), (5,), ().
inline std::string python_shape(const at::Tensor& tensor) {
  std::ostringstream out;
  out << "(";
  for (int64_t d = 0; d < tensor.dim(); ++d) out << (d ? ", " : "") << tensor.size(d);
  out << (tensor.dim() == 1 ? ",)" : ")");
  return out.str();
}

// A dtype as Python prints it: torch.float32.
inline std::string python_dtype(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    default: return std::string("torch.") + c10::toString(tensor.scalar_type());
  }
}

inline bool is_integer(const at::Tensor& tensor) {
  return at::isIntegralType(tensor.scalar_type(), /*includeBool=*/false);
}

// Checks rank, dtype, shapes and devices; returns int64 contiguous heads [B, N] and lengths [B].
inline std::pair<at::Tensor, at::Tensor> check_inputs(const at::Tensor& heads, const at::Tensor& lengths) {
  if (!heads.defined()) throw std::invalid_argument("heads must be a tensor [B, N], got None");
  if (!is_integer(heads)) throw std::invalid_argument("heads must have an integer dtype, got " + python_dtype(heads));
  if (heads.dim() != 2) {
    throw std::invalid_argument("heads must have shape [B, N], got " + python_shape(heads) + " (rank " +
                                std::to_string(heads.dim()) + ")");
  }
  const int64_t B = heads.size(0), N = heads.size(1);
  if (!lengths.defined() || !is_integer(lengths)) {
    throw std::invalid_argument("lengths must be an integer tensor [B], got dtype " +
                                (lengths.defined() ? python_dtype(lengths) : std::string("None")));
  }
  if (lengths.dim() != 1 || lengths.size(0) != B) {
    throw std::invalid_argument("lengths must have shape [B] = [" + std::to_string(B) + "], got " +
                                python_shape(lengths));
  }
  if (lengths.device() != heads.device()) {
    throw std::invalid_argument("lengths must be on the heads' device (" + heads.device().str() + "), got " +
                                lengths.device().str());
  }
  const int64_t limit = std::numeric_limits<int64_t>::max();
  if (N > 0 && (N > limit / N || B > limit / (N * N))) {
    throw std::invalid_argument("heads of shape " + python_shape(heads) +
                                " need a distance tensor [B, N, N] too large to address");
  }
  return {heads.to(at::kLong).contiguous(), lengths.to(at::kLong).contiguous()};
}

}  // namespace syntaxkernels
