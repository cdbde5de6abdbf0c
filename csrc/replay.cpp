// See replay.h.
#include "replay.h"

#include <torch/csrc/autograd/python_variable.h>

#include <stdexcept>

namespace syntaxkernels {

namespace {

PyObject* int_object(int64_t value) {
  PyObject* out = PyLong_FromLongLong(value);
  if (out == nullptr) throw pybind11::error_already_set();
  return out;
}

// The shape-class tuple of one tensor (replay.h); `identity`: the index of its first occurrence among the leaves.
pybind11::object tensor_class(const at::Tensor& t, Py_ssize_t identity) {
  const int64_t dim = t.dim();
  PyObject* out = PyTuple_New(1 + 2 * dim + 5);
  if (out == nullptr) throw pybind11::error_already_set();
  pybind11::object result = pybind11::reinterpret_steal<pybind11::object>(out);
  Py_ssize_t n = 0;
  PyTuple_SET_ITEM(out, n++, int_object(dim));
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (int64_t i = 0; i < dim; ++i) PyTuple_SET_ITEM(out, n++, int_object(sizes[i]));
  for (int64_t i = 0; i < dim; ++i) PyTuple_SET_ITEM(out, n++, int_object(strides[i]));
  PyTuple_SET_ITEM(out, n++, int_object(static_cast<int64_t>(t.scalar_type())));
  const at::Device device = t.device();
  PyTuple_SET_ITEM(out, n++, int_object(static_cast<int64_t>(device.type())));
  PyTuple_SET_ITEM(out, n++, int_object(device.index()));
  const auto address = t.has_storage() ? reinterpret_cast<uintptr_t>(t.data_ptr()) : uintptr_t{0};
  PyTuple_SET_ITEM(out, n++, int_object(static_cast<int64_t>(address & 15)));
  PyTuple_SET_ITEM(out, n++, int_object(identity));
  return result;
}

void append(pybind11::list& list, PyObject* item) {
  if (PyList_Append(list.ptr(), item) != 0) throw pybind11::error_already_set();
}

bool flatten(PyObject* values, pybind11::list& leaves, pybind11::list& key) {
  const bool is_list = PyList_Check(values);
  const Py_ssize_t count = is_list ? PyList_GET_SIZE(values) : PyTuple_GET_SIZE(values);
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* value = is_list ? PyList_GET_ITEM(values, i) : PyTuple_GET_ITEM(values, i);
    if (THPVariable_CheckExact(value)) {
      const Py_ssize_t index = PyList_GET_SIZE(leaves.ptr());
      Py_ssize_t identity = index;
      for (Py_ssize_t j = 0; j < index; ++j) {
        if (PyList_GET_ITEM(leaves.ptr(), j) == value) {
          identity = j;
          break;
        }
      }
      append(leaves, value);
      append(key, tensor_class(THPVariable_Unpack(value), identity).ptr());
    } else if (PyTuple_Check(value) || PyList_Check(value)) {
      pybind11::tuple head = pybind11::make_tuple(
          pybind11::handle(reinterpret_cast<PyObject*>(Py_TYPE(value))),
          PyList_Check(value) ? PyList_GET_SIZE(value) : PyTuple_GET_SIZE(value));
      append(key, head.ptr());
      if (!flatten(value, leaves, key)) return false;
    } else if (THPVariable_Check(value)) {  // a tensor of another class: a traced call
      return false;
    } else {
      append(key, value);
    }
  }
  return true;
}

at::TensorOptions options(at::ScalarType dtype, at::Device device) {
  return at::TensorOptions().dtype(dtype).device(device);
}

}  // namespace

bool replay_flatten(pybind11::handle values, pybind11::list leaves, pybind11::list key) {
  if (!PyTuple_Check(values.ptr()) && !PyList_Check(values.ptr())) {
    throw std::invalid_argument("replay_flatten: values must be a tuple or a list");
  }
  return flatten(values.ptr(), leaves, key);
}

void ReplayTensors::add_buffer(int64_t out, std::vector<int64_t> alloc, at::ScalarType dtype, at::Device device) {
  specs_.push_back(Spec{out, -1, std::move(alloc), false, false, false, 0.0, {}, {}, 0, dtype, device});
}

void ReplayTensors::add_strided_buffer(int64_t out, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                                       at::ScalarType dtype, at::Device device) {
  specs_.push_back(
      Spec{out, -1, {}, true, false, false, 0.0, std::move(sizes), std::move(strides), 0, dtype, device});
}

void ReplayTensors::add_buffer_view(int64_t out, std::vector<int64_t> alloc, std::vector<int64_t> sizes,
                                    std::vector<int64_t> strides, int64_t offset, at::ScalarType dtype,
                                    at::Device device) {
  specs_.push_back(Spec{out, -1, std::move(alloc), false, true, false, 0.0, std::move(sizes), std::move(strides),
                        offset, dtype, device});
}

void ReplayTensors::add_view(int64_t out, int64_t base, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                             int64_t offset) {
  specs_.push_back(Spec{out, base, {}, false, true, false, 0.0, std::move(sizes), std::move(strides), offset,
                        at::ScalarType::Undefined, at::Device(at::kCPU)});
}

void ReplayTensors::add_filled_buffer(int64_t out, std::vector<int64_t> alloc, double value, at::ScalarType dtype,
                                      at::Device device) {
  if (!at::isFloatingType(dtype)) throw std::invalid_argument("ReplayTensors.add_filled_buffer: a floating dtype");
  specs_.push_back(Spec{out, -1, std::move(alloc), false, false, true, value, {}, {}, 0, dtype, device});
}

void ReplayTensors::run(pybind11::list registers) const {
  PyObject* list = registers.ptr();
  for (const Spec& spec : specs_) {
    if (spec.out < 0 || spec.out >= PyList_GET_SIZE(list) || spec.base >= PyList_GET_SIZE(list)) {
      throw std::invalid_argument("ReplayTensors.run: a register out of range");
    }
    at::Tensor tensor;
    if (spec.base >= 0) {
      PyObject* base_object = PyList_GET_ITEM(list, spec.base);
      if (!THPVariable_Check(base_object)) throw std::invalid_argument("ReplayTensors.run: a view of a non-tensor");
      const at::Tensor& base = THPVariable_Unpack(base_object);
      tensor = base.as_strided(spec.sizes, spec.strides, base.storage_offset() + spec.offset);
    } else if (spec.filled) {
      tensor = at::full(spec.alloc, spec.value, options(spec.dtype, spec.device));
    } else if (spec.strided) {
      tensor = at::empty_strided(spec.sizes, spec.strides, options(spec.dtype, spec.device));
    } else {
      tensor = at::empty(spec.alloc, options(spec.dtype, spec.device));
      if (spec.view) tensor = tensor.as_strided(spec.sizes, spec.strides, spec.offset);
    }
    PyObject* wrapped = THPVariable_Wrap(std::move(tensor));
    if (wrapped == nullptr) throw pybind11::error_already_set();
    PyList_SetItem(list, spec.out, wrapped);  // (steals the reference; releases the item it replaces)
  }
}

}  // namespace syntaxkernels
