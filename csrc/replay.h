// The host side of a launcher replay (syntaxkernels/ops/_replay.py) in C++: a call's shape-class key and the
// tensors a replayed program makes before its launches. Both do what the module's Python fallback does, in one
// call instead of one Python-level torch call per tensor.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <vector>

namespace syntaxkernels {

// Appends the tensors of `values` (a tuple or list, nested tuples and lists walked in order) to `leaves` and their
// shape class to `key`: per tensor (torch.Tensor or nn.Parameter exactly) the tuple (dim, sizes..., strides...,
// scalar type, device type, device index, data pointer mod 16, index of its first occurrence among the leaves);
// per tuple or list (its type, its length) and then its items; any other value as it is. Returns false (key and
// leaves then partial) when a value is a tensor of another class (a fake or functional tensor: a traced call).
bool replay_flatten(pybind11::handle values, pybind11::list leaves, pybind11::list key);

// The tensors a program makes from nothing but its recording: fresh buffers (torch.empty / empty_strided, an
// optional view of the buffer; torch.zeros / full of a floating dtype) and views of the call's arguments. Built once per program; run() stores each into
// the program's registers.
class ReplayTensors {
 public:
  struct Spec {
    int64_t out;                    // register written
    int64_t base;                   // -1: a fresh buffer; else the register (an argument) viewed
    std::vector<int64_t> alloc;     // fresh buffer: its sizes (contiguous) when strided is false
    bool strided;                   // fresh buffer allocated as empty_strided(sizes, strides)
    bool view;                      // as_strided(sizes, strides, offset) of the buffer or of the base
    bool filled;                    // fresh buffer filled with `value` (torch.zeros / torch.full)
    double value;
    std::vector<int64_t> sizes, strides;
    int64_t offset;                 // storage offset of the view (relative to the base's own)
    at::ScalarType dtype;
    at::Device device;
  };

  void add_buffer(int64_t out, std::vector<int64_t> alloc, at::ScalarType dtype, at::Device device);
  void add_strided_buffer(int64_t out, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                          at::ScalarType dtype, at::Device device);
  void add_buffer_view(int64_t out, std::vector<int64_t> alloc, std::vector<int64_t> sizes,
                       std::vector<int64_t> strides, int64_t offset, at::ScalarType dtype, at::Device device);
  void add_view(int64_t out, int64_t base, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                int64_t offset);
  void add_filled_buffer(int64_t out, std::vector<int64_t> alloc, double value, at::ScalarType dtype,
                         at::Device device);
  void run(pybind11::list registers) const;
  size_t size() const { return specs_.size(); }

 private:
  std::vector<Spec> specs_;
};

}  // namespace syntaxkernels
