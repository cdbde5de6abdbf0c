// Python bindings of syntaxkernels._C: the tree-distance builders (contract in syntaxkernels/_ext.py).
//
// tree_distance(heads int64 [B, N] CPU, lengths int64 [B] CPU, num_threads)
//     -> (distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N])
// tree_distance_cuda(heads [B, N] CUDA, lengths [B] CUDA) -> the same on the GPU (CUDA builds only)
// tree_distance_lists(rows, lengths int tensor [B] or None, num_threads)
//     -> (heads int64 [B, N], lengths int64 [B], distance, depth, segment) from a ragged list/tuple of
//        list/tuple rows of Python ints or NumPy integers (padded with -1), or None when some row is not
//        a plain list or tuple (the caller then takes the Python path, which converts such rows).
// edge_lists(heads int64 [B, N] CPU, lengths int64 [B] CPU, max_distance, relations, window, num_threads)
//     -> (row_ptr, col, rel, t_ptr, t_col, t_rel), int32 CSR lists of the tree relations (window -1; relations:
//     the kinds' names in output order, MaskSpec.relation_kinds) or of the tree window (window >= 0); see
//     relation_lists.h.
// edge_attention_forward(q, k, v, row_ptr, col, scale, out, lse) and
// edge_attention_backward(dout, q, k, v, out, lse, row_ptr, col, rel, t_ptr, t_col, t_rel, scale, dq, dk, dv)
//     (both with optional dropout_p, seed, token_item, token_pos):
//     CPU edge-list attention writing into the given tensors; see edge_attention.h.
// bias_attention_forward(q, k, v, distance, lut, lengths, scale, window, causal, position_window, dropout_seed,
//     dropout_threshold, keep_scale, out, lse) and
// bias_attention_backward(dout, q, k, v, lse, distance, lut, lengths, bucket_index, scale, window, causal,
//     position_window, table_grad, dropout_seed, dropout_threshold, keep_scale, dq, dk, dv, bucket_grad): CPU distance-bias
//     attention (attention dropout when dropout_threshold > 0 or keep_scale != 1) writing into the given tensors;
//     see bias_attention.h.
// packed_tree_distance(heads int64 [T] CPU, cu_seqlens int64 [S + 1] CPU, num_threads)
//     -> (distance uint8 [sum n_s^2], offsets int64 [S + 1], depth int32 [T], segment int32 [T]): a packed
//        batch, the distance stored per sequence (tree_distance.h, build_packed). Releases the GIL.
// leak_free_tree_distance(heads, lengths, num_threads) and packed_leak_free_tree_distance(heads, cu_seqlens,
//     num_threads): the same outputs as tree_distance / packed_tree_distance with leak-free distances for causal
//     models (tree_distance.h, build_item_leak_free). Release the GIL.
// packed_tree_distance_lists(rows, num_threads) -> the same plus heads, cu_seqlens, positions, sequence ids and
//     max_seqlen, read straight from a list of per-sequence lists (None when a row is not a plain list/tuple).
// graph_distance(edges int64 [B, E, 2] CPU, lengths int64 [B] CPU, N, P, directed, num_threads)
//     -> distance uint8 [B, P, P] (P >= N, every byte written: 255 beyond each item's length): all-pairs shortest
//        paths of sparse graphs, a (-1, -1) pair pads an edge list (graph_distance.h). Releases the GIL.
// packed_graph_distance(edges int64 [E, 2] CPU, edge_offsets int64 [S + 1], cu_seqlens int64 [S + 1], directed,
//     num_threads) -> (distance uint8 [sum n_s^2], offsets int64 [S + 1]): the same per packed sequence.
// decode_tree(scores float32 [B, N, N] CPU, lengths int64 [B] CPU, num_threads) -> heads int64 [B, N]: the
//     maximum spanning tree with one root word of each item (Chu-Liu/Edmonds, mst_decode.h), -1 for the root word
//     and padding. Releases the GIL.
// has_cuda() -> whether tree_distance_cuda was compiled in.
// replay_flatten(values, leaves, key) -> bool and ReplayTensors: a launcher replay's shape-class key and the buffers
//     and argument views of a replayed program (replay.h; syntaxkernels/ops/_replay.py holds the same in Python).
// Bad input raises ValueError (std::invalid_argument) with the Python builder's messages.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "bias_attention.h"
#include "edge_attention.h"
#include "graph_distance.h"
#include "mst_decode.h"
#include "relation_lists.h"
#include "replay.h"
#include "tensor_checks.h"
#include "tree_distance.h"

#ifdef WITH_CUDA
#include "cuda/launcher.h"
#endif

namespace syntaxkernels {

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_distance_impl(const at::Tensor& heads_in,
                                                                  const at::Tensor& lengths_in, int64_t num_threads,
                                                                  bool leak_free) {
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
                static_cast<int>(std::min<int64_t>(num_threads, 1024)), leak_free);
  }
  return {distance, depth, segment};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> packed_tree_distance_impl(
    const at::Tensor& heads_in, const at::Tensor& cu_in, int64_t num_threads, bool leak_free) {
  if (!heads_in.device().is_cpu() || !cu_in.device().is_cpu()) {
    throw std::invalid_argument("packed_tree_distance needs CPU tensors, got heads on " + heads_in.device().str() +
                                " and cu_seqlens on " + cu_in.device().str());
  }
  if (heads_in.dim() != 1) {
    throw std::invalid_argument("packed heads must have shape [T], got " + python_shape(heads_in));
  }
  if (cu_in.dim() != 1 || cu_in.size(0) < 1) {
    throw std::invalid_argument("cu_seqlens must have shape [S + 1] (S >= 0), got " + python_shape(cu_in));
  }
  const at::Tensor heads = heads_in.to(at::kLong).contiguous();
  const at::Tensor cu = cu_in.to(at::kLong).contiguous();
  const int64_t T = heads.size(0), S = cu.size(0) - 1;
  const int64_t* cu_ptr = cu.data_ptr<int64_t>();
  const std::string message = check_cu_seqlens(cu_ptr, S, T);
  if (!message.empty()) throw std::invalid_argument(message);
  at::Tensor offsets = at::empty({S + 1}, at::TensorOptions().dtype(at::kLong));
  packed_offsets(cu_ptr, S, offsets.data_ptr<int64_t>());
  auto distance = at::empty({offsets.data_ptr<int64_t>()[S]}, at::TensorOptions().dtype(at::kByte));
  auto depth = at::empty({T}, at::TensorOptions().dtype(at::kInt));
  auto segment = at::empty({T}, at::TensorOptions().dtype(at::kInt));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  {
    pybind11::gil_scoped_release release;
    build_packed(heads.data_ptr<int64_t>(), cu_ptr, S, offsets.data_ptr<int64_t>(), distance.data_ptr<uint8_t>(),
                 depth.data_ptr<int32_t>(), segment.data_ptr<int32_t>(),
                 static_cast<int>(std::min<int64_t>(num_threads, 1024)), leak_free);
  }
  return {distance, offsets, depth, segment};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_distance_cpu(const at::Tensor& heads_in,
                                                                 const at::Tensor& lengths_in,
                                                                 int64_t num_threads) {
  return tree_distance_impl(heads_in, lengths_in, num_threads, false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> leak_free_tree_distance_cpu(const at::Tensor& heads_in,
                                                                           const at::Tensor& lengths_in,
                                                                           int64_t num_threads) {
  return tree_distance_impl(heads_in, lengths_in, num_threads, true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> packed_tree_distance_cpu(
    const at::Tensor& heads_in, const at::Tensor& cu_in, int64_t num_threads) {
  return packed_tree_distance_impl(heads_in, cu_in, num_threads, false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> packed_leak_free_tree_distance_cpu(
    const at::Tensor& heads_in, const at::Tensor& cu_in, int64_t num_threads) {
  return packed_tree_distance_impl(heads_in, cu_in, num_threads, true);
}

namespace {

// Rank, integer dtype and CPU device of an edge tensor: int64 contiguous.
at::Tensor check_edges(const at::Tensor& edges, int64_t rank) {
  if (!edges.defined()) throw std::invalid_argument("edges must be a tensor, got None");
  if (!edges.device().is_cpu()) {
    throw std::invalid_argument("graph_distance needs CPU tensors, got edges on " + edges.device().str());
  }
  if (!is_integer(edges)) throw std::invalid_argument("edges must have an integer dtype, got " + python_dtype(edges));
  if (edges.dim() != rank || edges.size(rank - 1) != 2) {
    throw std::invalid_argument(std::string("edges must have shape ") + (rank == 3 ? "[B, E, 2]" : "[E, 2]") +
                                ", got " + python_shape(edges));
  }
  return edges.to(at::kLong).contiguous();
}

}  // namespace

at::Tensor graph_distance_cpu(const at::Tensor& edges_in, const at::Tensor& lengths_in, int64_t N, int64_t P,
                              bool directed, int64_t num_threads) {
  const at::Tensor edges = check_edges(edges_in, 3);
  const int64_t B = edges.size(0), E = edges.size(1);
  if (!lengths_in.defined() || !is_integer(lengths_in) || !lengths_in.device().is_cpu()) {
    throw std::invalid_argument("lengths must be an integer CPU tensor [B]");
  }
  if (lengths_in.dim() != 1 || lengths_in.size(0) != B) {
    throw std::invalid_argument("lengths must have shape [B] = [" + std::to_string(B) + "], got " +
                                python_shape(lengths_in));
  }
  if (N < 0 || P < N) {
    throw std::invalid_argument("graph_distance: N = " + std::to_string(N) + " and P = " + std::to_string(P) +
                                " (expected 0 <= N <= P)");
  }
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  auto distance = at::empty({B, P, P}, at::TensorOptions().dtype(at::kByte));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  {
    pybind11::gil_scoped_release release;
    build_graph_batch(edges.data_ptr<int64_t>(), E, lengths.data_ptr<int64_t>(), B, N, P, directed,
                      distance.data_ptr<uint8_t>(), static_cast<int>(std::min<int64_t>(num_threads, 1024)));
  }
  return distance;
}

std::tuple<at::Tensor, at::Tensor> packed_graph_distance_cpu(const at::Tensor& edges_in,
                                                             const at::Tensor& edge_offsets_in,
                                                             const at::Tensor& cu_in, bool directed,
                                                             int64_t num_threads) {
  const at::Tensor edges = check_edges(edges_in, 2);
  for (const at::Tensor* t : {&edge_offsets_in, &cu_in}) {
    if (!t->defined() || !is_integer(*t) || !t->device().is_cpu() || t->dim() != 1 || t->size(0) < 1) {
      throw std::invalid_argument("edge_offsets and cu_seqlens must be integer CPU tensors [S + 1] (S >= 0)");
    }
  }
  if (edge_offsets_in.size(0) != cu_in.size(0)) {
    throw std::invalid_argument("edge_offsets has shape " + python_shape(edge_offsets_in) + " but cu_seqlens " +
                                python_shape(cu_in) + " (one entry per sequence, plus one)");
  }
  const at::Tensor edge_offsets = edge_offsets_in.to(at::kLong).contiguous();
  const at::Tensor cu = cu_in.to(at::kLong).contiguous();
  const int64_t S = cu.size(0) - 1, E = edges.size(0);
  const int64_t* cu_ptr = cu.data_ptr<int64_t>();
  std::string message = check_cu_seqlens(cu_ptr, S, cu_ptr[S]);  // cu_seqlens[0] == 0, non-decreasing
  if (message.empty()) message = check_edge_offsets(edge_offsets.data_ptr<int64_t>(), S, E);
  if (!message.empty()) throw std::invalid_argument(message);
  at::Tensor offsets = at::empty({S + 1}, at::TensorOptions().dtype(at::kLong));
  packed_offsets(cu_ptr, S, offsets.data_ptr<int64_t>());
  auto distance = at::empty({offsets.data_ptr<int64_t>()[S]}, at::TensorOptions().dtype(at::kByte));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  {
    pybind11::gil_scoped_release release;
    build_graph_packed(edges.data_ptr<int64_t>(), edge_offsets.data_ptr<int64_t>(), cu_ptr, S,
                       offsets.data_ptr<int64_t>(), directed, distance.data_ptr<uint8_t>(),
                       static_cast<int>(std::min<int64_t>(num_threads, 1024)));
  }
  return {distance, offsets};
}

at::Tensor decode_tree_cpu(const at::Tensor& scores_in, const at::Tensor& lengths_in, int64_t num_threads) {
  if (!scores_in.defined()) throw std::invalid_argument("scores must be a tensor [B, N, N], got None");
  if (!scores_in.device().is_cpu()) {
    throw std::invalid_argument("decode_tree needs CPU tensors, got scores on " + scores_in.device().str());
  }
  if (!at::isFloatingType(scores_in.scalar_type())) {
    throw std::invalid_argument("scores must have a floating dtype, got " + python_dtype(scores_in));
  }
  if (scores_in.dim() != 3 || scores_in.size(1) != scores_in.size(2)) {
    throw std::invalid_argument("scores must have shape [B, N, N], got " + python_shape(scores_in));
  }
  const int64_t B = scores_in.size(0), N = scores_in.size(1);
  if (!lengths_in.defined() || !is_integer(lengths_in) || !lengths_in.device().is_cpu()) {
    throw std::invalid_argument("lengths must be an integer CPU tensor [B]");
  }
  if (lengths_in.dim() != 1 || lengths_in.size(0) != B) {
    throw std::invalid_argument("lengths must have shape [B] = [" + std::to_string(B) + "], got " +
                                python_shape(lengths_in));
  }
  const at::Tensor scores = scores_in.to(at::kFloat).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kLong).contiguous();
  auto heads = at::empty({B, N}, at::TensorOptions().dtype(at::kLong));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  {
    pybind11::gil_scoped_release release;
    decode_tree_batch(scores.data_ptr<float>(), lengths.data_ptr<int64_t>(), B, N, heads.data_ptr<int64_t>(),
                      static_cast<int>(std::min<int64_t>(num_threads, 1024)));
  }
  return heads;
}

namespace {

namespace py = pybind11;

bool is_plain_sequence(PyObject* object) { return PyList_CheckExact(object) || PyTuple_CheckExact(object); }

std::string python_repr(PyObject* object) { return py::repr(py::handle(object)).cast<std::string>(); }

enum class HeadRead { kOk, kNotInteger, kOverflow };

// numpy.integer, imported on first use (only entries that are not Python ints need it); never released.
PyObject* numpy_integer_type() {
  static PyObject* type = py::object(py::module_::import("numpy").attr("integer")).release().ptr();
  return type;
}

// One list entry as int64: Python ints (not bools) and NumPy integers are accepted, as in _pad_rows.
HeadRead read_head(PyObject* entry, int64_t& value) {
  PyObject* number = entry;
  py::object index;
  if (!PyLong_Check(entry) || PyBool_Check(entry)) {
    if (PyBool_Check(entry)) return HeadRead::kNotInteger;
    const int is_integer = PyObject_IsInstance(entry, numpy_integer_type());
    if (is_integer < 0) throw py::error_already_set();
    if (is_integer == 0) return HeadRead::kNotInteger;
    index = py::reinterpret_steal<py::object>(PyNumber_Index(entry));
    if (!index) throw py::error_already_set();
    number = index.ptr();
  }
  int overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(number, &overflow);
  if (overflow != 0) return HeadRead::kOverflow;
  if (result == -1 && PyErr_Occurred()) throw py::error_already_set();
  value = static_cast<int64_t>(result);
  return HeadRead::kOk;
}

// The lengths checks of normalize_heads for list input, in its order and with its messages.
at::Tensor check_list_lengths(const py::object& lengths_object, const std::vector<int64_t>& row_lengths,
                              int64_t N) {
  const int64_t B = static_cast<int64_t>(row_lengths.size());
  const at::Tensor lengths = lengths_object.cast<at::Tensor>();
  const auto dtype = lengths.scalar_type();
  if (dtype != at::kChar && dtype != at::kShort && dtype != at::kInt && dtype != at::kLong && dtype != at::kByte) {
    throw std::invalid_argument("lengths must be an integer tensor [B], got dtype " +
                                py::str(lengths_object.attr("dtype")).cast<std::string>());
  }
  if (lengths.dim() != 1 || lengths.size(0) != B) {
    throw std::invalid_argument("lengths must have shape [B] = [" + std::to_string(B) + "], got " +
                                python_shape(lengths));
  }
  at::Tensor result = lengths.to(at::kLong).to(at::kCPU).contiguous();
  const int64_t* values = result.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t value = values[b];
    const std::string item = "batch item " + std::to_string(b) + ": lengths[" + std::to_string(b) + "] = " +
                             std::to_string(value);
    if (value < 0) throw std::invalid_argument(item + " is negative");
    if (value > N) throw std::invalid_argument(item + " is larger than N = " + std::to_string(N));
    if (value > row_lengths[static_cast<size_t>(b)]) {
      throw std::invalid_argument(item + " is larger than the " + std::to_string(row_lengths[static_cast<size_t>(b)]) +
                                  " heads given");
    }
  }
  return result;
}

}  // namespace

// The list-of-lists path of build_tree_tensors in one call: reads the rows without building NumPy
// arrays, pads heads [B, N] with -1, checks lengths, then builds as tree_distance_cpu. Errors (ValueError)
// are the Python path's, in its order: the first non-integer entry, else the first entry that does not
// fit in int64, then lengths, then the sentences.
py::object tree_distance_lists(py::handle rows, py::object lengths, int64_t num_threads) {
  PyObject* outer = rows.ptr();
  if (!is_plain_sequence(outer)) {
    throw std::invalid_argument("heads must be a tensor [B, N] or a list of lists, got " +
                                py::type::handle_of(rows).attr("__name__").cast<std::string>());
  }
  const int64_t B = static_cast<int64_t>(PySequence_Fast_GET_SIZE(outer));
  PyObject** items = PySequence_Fast_ITEMS(outer);
  std::vector<int64_t> row_lengths(static_cast<size_t>(B));
  int64_t N = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (!is_plain_sequence(items[b])) return py::none();
    row_lengths[static_cast<size_t>(b)] = static_cast<int64_t>(PySequence_Fast_GET_SIZE(items[b]));
    N = std::max(N, row_lengths[static_cast<size_t>(b)]);
  }
  const int64_t limit = std::numeric_limits<int64_t>::max();
  if (N > 0 && B > limit / N) throw std::invalid_argument("heads: too many entries to address");

  at::Tensor heads = at::empty({B, N}, at::TensorOptions().dtype(at::kLong));
  int64_t* out = heads.data_ptr<int64_t>();
  py::object first_overflow;
  int64_t overflow_b = -1, overflow_i = -1;
  for (int64_t b = 0; b < B; ++b) {
    PyObject* row = items[b];
    const int64_t length = row_lengths[static_cast<size_t>(b)];
    PyObject** entries = PySequence_Fast_ITEMS(row);
    int64_t* out_row = out + b * N;
    for (int64_t i = 0; i < length; ++i) {
      int64_t value = 0;
      const HeadRead read = read_head(entries[i], value);
      if (read == HeadRead::kNotInteger) {
        throw std::invalid_argument("batch item " + std::to_string(b) + ", token " + std::to_string(i) +
                                    ": head " + python_repr(entries[i]) + " is not an integer");
      }
      if (read == HeadRead::kOverflow && overflow_b < 0) {
        first_overflow = py::reinterpret_borrow<py::object>(entries[i]);
        overflow_b = b;
        overflow_i = i;
      }
      out_row[i] = value;
    }
    std::fill(out_row + length, out_row + N, int64_t{-1});
  }
  if (overflow_b >= 0) {
    throw std::invalid_argument("batch item " + std::to_string(overflow_b) + ", token " +
                                std::to_string(overflow_i) + ": head " + python_repr(first_overflow.ptr()) +
                                " does not fit in int64");
  }

  at::Tensor lengths_tensor;
  if (lengths.is_none()) {
    lengths_tensor = at::empty({B}, at::TensorOptions().dtype(at::kLong));
    std::copy(row_lengths.begin(), row_lengths.end(), lengths_tensor.data_ptr<int64_t>());
  } else {
    lengths_tensor = check_list_lengths(lengths, row_lengths, N);
  }
  auto [distance, depth, segment] = tree_distance_cpu(heads, lengths_tensor, num_threads);
  return py::make_tuple(heads, lengths_tensor, distance, depth, segment);
}

// The packed list path in one call: rows (a list/tuple of list/tuple rows of ints, one per sequence) ->
// (heads int64 [T], cu_seqlens int32 [S + 1], distance uint8 [sum n^2], offsets int64 [S + 1], depth int32 [T],
// segment int32 [T], positions int32 [T], sequence int32 [T], max_seqlen), or None when some row is not a plain
// list or tuple. Errors name the sequence and token ("sequence s, token i: head 'x' is not an integer").
py::object packed_tree_distance_lists(py::handle rows, int64_t num_threads) {
  PyObject* outer = rows.ptr();
  if (!is_plain_sequence(outer)) {
    throw std::invalid_argument("heads must be a list of per-sequence lists, got " +
                                py::type::handle_of(rows).attr("__name__").cast<std::string>());
  }
  const int64_t S = static_cast<int64_t>(PySequence_Fast_GET_SIZE(outer));
  PyObject** items = PySequence_Fast_ITEMS(outer);
  at::Tensor cu = at::empty({S + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* cu_ptr = cu.data_ptr<int64_t>();
  cu_ptr[0] = 0;
  int64_t max_seqlen = 0;
  for (int64_t s = 0; s < S; ++s) {
    if (!is_plain_sequence(items[s])) return py::none();
    const int64_t n = static_cast<int64_t>(PySequence_Fast_GET_SIZE(items[s]));
    cu_ptr[s + 1] = cu_ptr[s] + n;
    max_seqlen = std::max(max_seqlen, n);
  }
  const int64_t T = cu_ptr[S];
  at::Tensor heads = at::empty({T}, at::TensorOptions().dtype(at::kLong));
  int64_t* out = heads.data_ptr<int64_t>();
  for (int64_t s = 0; s < S; ++s) {
    PyObject** entries = PySequence_Fast_ITEMS(items[s]);
    const int64_t n = cu_ptr[s + 1] - cu_ptr[s];
    for (int64_t i = 0; i < n; ++i) {
      int64_t value = 0;
      const HeadRead read = read_head(entries[i], value);
      if (read != HeadRead::kOk) {
        throw std::invalid_argument("sequence " + std::to_string(s) + ", token " + std::to_string(i) + ": head " +
                                    python_repr(entries[i]) +
                                    (read == HeadRead::kNotInteger ? " is not an integer" : " does not fit in int64"));
      }
      out[cu_ptr[s] + i] = value;
    }
  }
  auto [distance, offsets, depth, segment] = packed_tree_distance_cpu(heads, cu, num_threads);
  at::Tensor positions = at::empty({T}, at::TensorOptions().dtype(at::kInt));
  at::Tensor sequence = at::empty({T}, at::TensorOptions().dtype(at::kInt));
  int32_t* pos = positions.data_ptr<int32_t>();
  int32_t* seq = sequence.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = cu_ptr[s]; t < cu_ptr[s + 1]; ++t) {
      pos[t] = static_cast<int32_t>(t - cu_ptr[s]);
      seq[t] = static_cast<int32_t>(s);
    }
  }
  return py::make_tuple(heads, cu.to(at::kInt), distance, offsets, depth, segment, positions, sequence, max_seqlen);
}

// The relation (or window) lists of a batch as int32 tensors: validates like tree_distance_cpu.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> edge_lists_cpu(
    const at::Tensor& heads_in, const at::Tensor& lengths_in, int64_t max_distance,
    const std::vector<std::string>& relations, int64_t window, int64_t num_threads) {
  if (heads_in.defined() && !heads_in.device().is_cpu()) {
    throw std::invalid_argument("edge_lists needs CPU tensors, got heads on " + heads_in.device().str());
  }
  auto [heads, lengths] = check_inputs(heads_in, lengths_in);
  ListSpec spec;
  spec.max_distance = static_cast<int32_t>(std::clamp<int64_t>(max_distance, -1, 1 << 20));
  const std::string unknown = relation_kinds_of(relations, spec.relations);
  if (!unknown.empty()) throw std::invalid_argument(unknown);
  spec.window = static_cast<int32_t>(std::clamp<int64_t>(window, -2, 1 << 20));
  if (num_threads <= 0) num_threads = at::get_num_threads();
  EdgeLists lists;
  {
    pybind11::gil_scoped_release release;
    lists = build_edge_lists(heads.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), heads.size(0), heads.size(1),
                             spec, static_cast<int>(std::min<int64_t>(num_threads, 1024)));
  }
  auto tensor = [](const std::vector<int32_t>& values) {
    at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(at::kInt));
    std::copy(values.begin(), values.end(), t.data_ptr<int32_t>());
    return t;
  };
  return {tensor(lists.row_ptr), tensor(lists.col), tensor(lists.rel), tensor(lists.t_ptr), tensor(lists.t_col),
          tensor(lists.t_rel)};
}

// The GPU edge kernels' balanced schedule of CPU int32 lists (see relation_lists.h): the nine int32 tables and
// (pieces, dq_slots, dk_slots).
py::tuple edge_schedule_cpu(const at::Tensor& row_ptr, const at::Tensor& t_ptr, int64_t B, int64_t N, int64_t R,
                            int64_t chunk) {
  for (const at::Tensor* t : {&row_ptr, &t_ptr}) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kInt || !t->is_contiguous() || t->dim() != 1 ||
        t->numel() != B * N * R + 1) {
      throw std::invalid_argument("edge_schedule needs contiguous CPU int32 offsets of B * N * R + 1 entries");
    }
  }
  EdgeSchedule s;
  {
    pybind11::gil_scoped_release release;
    s = build_edge_schedule(row_ptr.data_ptr<int32_t>(), t_ptr.data_ptr<int32_t>(), B, N, R, chunk);
  }
  auto tensor = [](const std::vector<int32_t>& values, int64_t rows) {
    const int64_t n = static_cast<int64_t>(values.size());
    at::Tensor t = at::empty(rows ? std::vector<int64_t>{rows, n / rows} : std::vector<int64_t>{n},
                             at::TensorOptions().dtype(at::kInt));
    std::copy(values.begin(), values.end(), t.data_ptr<int32_t>());
    return t;
  };
  return py::make_tuple(tensor(s.f_items, 6), tensor(s.merge_rows, 0), tensor(s.merge_ptr, 0), tensor(s.q_items, 5),
                        tensor(s.dq_tokens, 0), tensor(s.dq_ptr, 0), tensor(s.k_items, 5), tensor(s.dk_tokens, 0),
                        tensor(s.dk_ptr, 0), s.pieces, s.dq_slots, s.dk_slots);
}

int64_t live_tiles_cpu(const at::Tensor& row_ptr, const at::Tensor& col, int64_t B, int64_t N, int64_t R,
                       int64_t tile) {
  if (!row_ptr.device().is_cpu() || row_ptr.scalar_type() != at::kInt || !row_ptr.is_contiguous() ||
      row_ptr.numel() != B * N * R + 1 || !col.device().is_cpu() || col.scalar_type() != at::kInt ||
      !col.is_contiguous()) {
    throw std::invalid_argument("live_tiles needs contiguous CPU int32 lists");
  }
  pybind11::gil_scoped_release release;
  return count_live_tiles(row_ptr.data_ptr<int32_t>(), col.data_ptr<int32_t>(), B, N, R, tile);
}

}  // namespace syntaxkernels

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "syntaxkernels C++ extension: tree-distance builders, tree relation lists, CPU edge-list and distance-bias "
          "attention";
  m.def("tree_distance", &syntaxkernels::tree_distance_cpu, pybind11::arg("heads"), pybind11::arg("lengths"),
        pybind11::arg("num_threads") = 0,
        "(distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N]) for heads int64 [B, N] and "
        "lengths int64 [B] on the CPU; num_threads 0 = torch's intra-op thread count. Releases the GIL.");
  m.def("leak_free_tree_distance", &syntaxkernels::leak_free_tree_distance_cpu, pybind11::arg("heads"),
        pybind11::arg("lengths"), pybind11::arg("num_threads") = 0,
        "(distance uint8 [B, N, N], depth int32 [B, N], segment int32 [B, N]) as tree_distance, the distance "
        "leak-free for causal models: row i is the forest induced on tokens 0..i (255 for j > i and for paths "
        "through a later token; not symmetric); depth and segment the whole tree's. Releases the GIL.");
  m.def("tree_distance_lists", &syntaxkernels::tree_distance_lists, pybind11::arg("rows"),
        pybind11::arg("lengths") = pybind11::none(), pybind11::arg("num_threads") = 0,
        "(heads int64 [B, N], lengths int64 [B], distance, depth, segment) from a ragged list/tuple of "
        "list/tuple rows of ints (padded with -1; lengths: None = the row lengths, or an integer tensor [B]), "
        "or None when some row is not a plain list or tuple. Raises ValueError with the Python path's messages.");
  m.def("edge_lists", &syntaxkernels::edge_lists_cpu, pybind11::arg("heads"), pybind11::arg("lengths"),
        pybind11::arg("max_distance"), pybind11::arg("relations"), pybind11::arg("window") = -1,
        pybind11::arg("num_threads") = 0,
        "(row_ptr, col, rel, t_ptr, t_col, t_rel) int32 CSR lists over rows (b, i, r) of the relations of the "
        "kinds named in `relations` (e.g. ['parent', 'child', 'sibling']: parent_1..D, child_1..D, sibling_2..D+1, "
        "in that order; window = -1) or of the pairs within `window` edges (window >= 0), with the transposed lists "
        "over rows (b, j, r). Validates like tree_distance (ValueError). Releases the GIL.");
  m.def("edge_schedule", &syntaxkernels::edge_schedule_cpu, pybind11::arg("row_ptr"), pybind11::arg("t_ptr"),
        pybind11::arg("B"), pybind11::arg("N"), pybind11::arg("R"), pybind11::arg("chunk"),
        "The GPU edge kernels' balanced schedule of int32 CPU lists: (f_items [6, I], merge_rows, merge_ptr, "
        "q_items [5, I], dq_tokens, dq_ptr, k_items [5, I], dk_tokens, dk_ptr, pieces, dq_slots, dk_slots). "
        "Releases the GIL.");
  m.def("live_tiles", &syntaxkernels::live_tiles_cpu, pybind11::arg("row_ptr"), pybind11::arg("col"),
        pybind11::arg("B"), pybind11::arg("N"), pybind11::arg("R"), pybind11::arg("tile"),
        "Tiles of tile x tile per sequence holding a listed pair. Releases the GIL.");
  m.def("edge_attention_forward", &syntaxkernels::edge_attention_forward_cpu, pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("row_ptr"), pybind11::arg("col"),
        pybind11::arg("scale"), pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("dropout_p") = 0.0,
        pybind11::arg("seed") = 0, pybind11::arg("token_item") = pybind11::none(),
        pybind11::arg("token_pos") = pybind11::none(),
        "CPU edge-list attention forward: writes out [B, R, H, N, Dv] and lse [B, R, H, N] (natural log, +inf "
        "for an empty row); attention dropout dropout_p with relation r's mask of stream_seed(seed, r), pairs "
        "numbered by token_item / token_pos when given. Releases the GIL.");
  m.def("edge_attention_backward", &syntaxkernels::edge_attention_backward_cpu, pybind11::arg("dout"),
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("out"), pybind11::arg("lse"),
        pybind11::arg("row_ptr"), pybind11::arg("col"), pybind11::arg("rel"), pybind11::arg("t_ptr"),
        pybind11::arg("t_col"), pybind11::arg("t_rel"), pybind11::arg("scale"), pybind11::arg("dq"),
        pybind11::arg("dk"), pybind11::arg("dv"), pybind11::arg("dropout_p") = 0.0, pybind11::arg("seed") = 0,
        pybind11::arg("token_item") = pybind11::none(), pybind11::arg("token_pos") = pybind11::none(),
        "CPU edge-list attention backward: writes dq, dk [B, H, N, D] and dv [B, H, N, Dv] (dropout arguments as "
        "the forward's). Releases the GIL.");
  m.def("bias_attention_forward", &syntaxkernels::bias_attention_forward_cpu, pybind11::arg("q"),
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("distance"), pybind11::arg("lut"),
        pybind11::arg("lengths"), pybind11::arg("scale"), pybind11::arg("window"), pybind11::arg("causal"),
        pybind11::arg("position_window"), pybind11::arg("dropout_seed"), pybind11::arg("dropout_threshold"), pybind11::arg("keep_scale"),
        pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("position_lut"), pybind11::arg("reach"),
        "CPU distance-bias attention forward: writes out [B, H, N, Dv] and lse [B, H, N] (log2, +inf for an empty "
        "row). Releases the GIL.");
  m.def("bias_attention_backward", &syntaxkernels::bias_attention_backward_cpu, pybind11::arg("dout"),
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("lse"), pybind11::arg("distance"),
        pybind11::arg("lut"), pybind11::arg("lengths"), pybind11::arg("bucket_index"), pybind11::arg("scale"),
        pybind11::arg("window"), pybind11::arg("causal"), pybind11::arg("position_window"),
        pybind11::arg("table_grad"),
        pybind11::arg("dropout_seed"), pybind11::arg("dropout_threshold"), pybind11::arg("keep_scale"),
        pybind11::arg("dq"), pybind11::arg("dk"), pybind11::arg("dv"), pybind11::arg("bucket_grad"),
        pybind11::arg("position_lut"), pybind11::arg("reach"), pybind11::arg("position_grad_wanted"),
        pybind11::arg("position_grad"),
        "CPU distance-bias attention backward: writes dq, dk, dv and the per-bucket sums of dS bucket_grad "
        "[1 or H, T]. Releases the GIL.");
  m.def("packed_tree_distance", &syntaxkernels::packed_tree_distance_cpu, pybind11::arg("heads"),
        pybind11::arg("cu_seqlens"), pybind11::arg("num_threads") = 0,
        "(distance uint8 [sum n_s^2], offsets int64 [S + 1], depth int32 [T], segment int32 [T]) of a packed batch: "
        "heads int64 [T] local to each sequence, cu_seqlens int64 [S + 1]. ValueError names the sequence and "
        "token. Releases the GIL.");
  m.def("packed_leak_free_tree_distance", &syntaxkernels::packed_leak_free_tree_distance_cpu,
        pybind11::arg("heads"), pybind11::arg("cu_seqlens"), pybind11::arg("num_threads") = 0,
        "packed_tree_distance with leak_free_tree_distance's distances (each sequence's block leak-free). "
        "Releases the GIL.");
  m.def("packed_tree_distance_lists", &syntaxkernels::packed_tree_distance_lists, pybind11::arg("rows"),
        pybind11::arg("num_threads") = 0,
        "(heads, cu_seqlens int32, distance, offsets, depth, segment, positions int32, sequence int32, max_seqlen) "
        "of a packed batch from a list/tuple of per-sequence list/tuple rows of ints, or None when some row is not "
        "a plain list or tuple. ValueError names the sequence and token.");
  m.def("graph_distance", &syntaxkernels::graph_distance_cpu, pybind11::arg("edges"), pybind11::arg("lengths"),
        pybind11::arg("N"), pybind11::arg("P"), pybind11::arg("directed"), pybind11::arg("num_threads") = 0,
        "distance uint8 [B, P, P] (all-pairs shortest paths, 0 diagonal, saturating at 254, 255 unreachable and "
        "padding) of edges int64 [B, E, 2] ((-1, -1) pads) over lengths int64 [B] <= N <= P tokens. ValueError names "
        "the batch item and edge. Releases the GIL.");
  m.def("packed_graph_distance", &syntaxkernels::packed_graph_distance_cpu, pybind11::arg("edges"),
        pybind11::arg("edge_offsets"), pybind11::arg("cu_seqlens"), pybind11::arg("directed"),
        pybind11::arg("num_threads") = 0,
        "(distance uint8 [sum n_s^2], offsets int64 [S + 1]) of packed graphs: sequence s's edges (local pairs) at "
        "edges[edge_offsets[s] .. edge_offsets[s + 1]). ValueError names the sequence and edge. Releases the GIL.");
  m.def("decode_tree", &syntaxkernels::decode_tree_cpu, pybind11::arg("scores"), pybind11::arg("lengths"),
        pybind11::arg("num_threads") = 0,
        "heads int64 [B, N] of the maximum spanning tree with one root word of each item (Chu-Liu/Edmonds): scores "
        "[B, N, N] with scores[b, h, d] the score of head h for dependent d and the diagonal the root-word score; "
        "-1 for the root word and padding. ValueError names the batch item. Releases the GIL.");
  m.def("replay_flatten", &syntaxkernels::replay_flatten, pybind11::arg("values"), pybind11::arg("leaves"),
        pybind11::arg("key"),
        "Appends the tensors of values (a tuple or list, nested ones walked) to leaves and their shape class to key "
        "(per tensor: dim, sizes, strides, scalar type, device type and index, data pointer mod 16, index of its "
        "first occurrence); False when a value is a tensor subclass (a traced call).");
  pybind11::class_<syntaxkernels::ReplayTensors>(m, "ReplayTensors",
                                                 "The buffers and argument views a replayed program makes.")
      .def(pybind11::init<>())
      .def("add_buffer", &syntaxkernels::ReplayTensors::add_buffer, "torch.empty(sizes, dtype, device)")
      .def("add_strided_buffer", &syntaxkernels::ReplayTensors::add_strided_buffer,
           "torch.empty_strided(sizes, strides, dtype, device)")
      .def("add_buffer_view", &syntaxkernels::ReplayTensors::add_buffer_view,
           "torch.empty(alloc, dtype, device).as_strided(sizes, strides, offset)")
      .def("add_filled_buffer", &syntaxkernels::ReplayTensors::add_filled_buffer,
           "torch.full(sizes, value, dtype, device), a floating dtype")
      .def("add_view", &syntaxkernels::ReplayTensors::add_view,
           "registers[base].as_strided(sizes, strides, registers[base].storage_offset() + offset)")
      .def("run", &syntaxkernels::ReplayTensors::run, pybind11::arg("registers"),
           "Stores each tensor into registers (a list) at its index.")
      .def("__len__", &syntaxkernels::ReplayTensors::size);
#ifdef WITH_CUDA
  m.def("tree_distance_cuda", &syntaxkernels::tree_distance_cuda, pybind11::arg("heads"), pybind11::arg("lengths"),
        "The same as tree_distance for CUDA tensors, built on the GPU.");
  m.def("has_cuda", []() { return true; });
#else
  m.def("has_cuda", []() { return false; });
#endif
}
