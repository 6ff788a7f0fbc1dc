// Bindings of the packed linear layers (pagedllm/kernels/linear.h): packed_linear_elements,
// pack_linear_weight, linear, linear_kernel. Shapes, dtypes, devices and layouts are checked
// here one line at a time, then the GIL is released for the work.
#include <cstdint>
#include <string>

#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/linear.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {
namespace {

k::ScalarType dtype_named(const std::string& name) {
  if (name == "float32") return k::ScalarType::kFloat32;
  if (name == "bfloat16") return k::ScalarType::kBFloat16;
  PAGEDLLM_CHECK_ARG(false, "dtype '" << name << "': expected float32 or bfloat16");
  return k::ScalarType::kFloat32;
}

// t's element type, which must be float32 or bfloat16 and, when `like` is set, like's.
k::ScalarType float_type(const Tensor& t, const Tensor* like) {
  t.require_cpu();
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kFloat32 || t.dtype() == DType::kBFloat16,
                     t.name() << " must be float32 or bfloat16, got " << t.describe());
  if (like != nullptr) {
    PAGEDLLM_CHECK_ARG(t.dtype() == like->dtype(), t.name() << " is " << t.describe() << " but "
                                                            << like->name() << " is "
                                                            << dtype_name(like->dtype()));
  }
  return t.dtype() == DType::kFloat32 ? k::ScalarType::kFloat32 : k::ScalarType::kBFloat16;
}

// Checks t is [rows, cols] with contiguous rows; returns the row stride.
int64_t matrix_stride(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  t.require_ndim(2);
  PAGEDLLM_CHECK_ARG(t.size(0) == rows && t.size(1) == cols,
                     t.name() << " " << t.describe() << " must be " << what << " [" << rows
                              << ", " << cols << "]");
  t.require_inner_contiguous(1);
  return rows > 1 ? t.stride(0) : cols;
}

// Checks `packed` is the 1-D packed form of an [out_features, in_features] weight of dtype.
void check_packed(const Tensor& packed, k::ScalarType dtype, int64_t out_features,
                  int64_t in_features) {
  const int64_t n = k::packed_linear_elements(dtype, out_features, in_features);
  packed.require_ndim(1);
  PAGEDLLM_CHECK_ARG(packed.size(0) == n, "packed " << packed.describe() << " must hold " << n
                                                    << " elements (a packed [" << out_features
                                                    << ", " << in_features << "] weight)");
  packed.require_inner_contiguous(0);
}

int64_t packed_elements(const std::string& dtype, int64_t out_features, int64_t in_features) {
  return k::packed_linear_elements(dtype_named(dtype), out_features, in_features);
}

void pack_weight(py::handle packed, py::handle weight) {
  const Tensor pt(packed, "packed"), wt(weight, "weight");
  k::PackLinearParams p;
  p.dtype = float_type(wt, nullptr);
  float_type(pt, &wt);
  wt.require_ndim(2);
  p.out_features = to_i32(wt.size(0), "out_features");
  p.in_features = to_i32(wt.size(1), "in_features");
  p.weight_row_stride = matrix_stride(wt, wt.size(0), wt.size(1), "the weight");
  check_packed(pt, p.dtype, p.out_features, p.in_features);
  pt.require_writable();
  p.weight = wt.data();
  p.packed = pt.data();
  py::gil_scoped_release release;
  k::pack_linear_weight(p);
}

void linear(py::handle y, py::handle x, py::handle packed, py::handle bias) {
  const Tensor yt(y, "y"), xt(x, "x"), pt(packed, "packed");
  k::LinearParams p;
  p.dtype = float_type(xt, nullptr);
  float_type(yt, &xt);
  float_type(pt, &xt);
  xt.require_ndim(2);
  yt.require_ndim(2);
  p.rows = xt.size(0);
  p.in_features = to_i32(xt.size(1), "in_features");
  p.out_features = to_i32(yt.size(1), "out_features");
  p.x_row_stride = matrix_stride(xt, p.rows, p.in_features, "x");
  p.y_row_stride = matrix_stride(yt, p.rows, p.out_features, "y (x's rows x out_features)");
  yt.require_writable();
  check_packed(pt, p.dtype, p.out_features, p.in_features);
  if (!bias.is_none()) {
    const Tensor bt(bias, "bias");
    float_type(bt, &xt);
    bt.require_ndim(1);
    PAGEDLLM_CHECK_ARG(bt.size(0) == p.out_features,
                       "bias " << bt.describe() << " must be [" << p.out_features << "]");
    bt.require_inner_contiguous(0);
    p.bias = bt.data();
  }
  p.x = xt.data();
  p.packed = pt.data();
  p.y = yt.data();  // k::linear refuses a y that overlaps x, packed or bias
  py::gil_scoped_release release;
  k::linear(p);
}

void packed_rows(py::handle out, py::handle packed, int64_t out_features, py::handle ids) {
  const Tensor ot(out, "out"), pt(packed, "packed"), it(ids, "ids");
  k::PackedRowsParams p;
  p.dtype = float_type(pt, nullptr);
  float_type(ot, &pt);
  it.require_cpu();
  PAGEDLLM_CHECK_ARG(it.dtype() == DType::kInt64 && it.ndim() == 1,
                     "ids " << it.describe() << ": expected a 1-D int64 index vector");
  it.require_inner_contiguous(0);
  ot.require_ndim(2);
  p.rows = it.size(0);
  p.out_features = to_i32(out_features, "out_features");
  p.in_features = to_i32(ot.size(1), "in_features");
  check_packed(pt, p.dtype, p.out_features, p.in_features);
  p.out_row_stride = matrix_stride(ot, p.rows, p.in_features, "out (ids' rows x in_features)");
  ot.require_writable();
  p.packed = pt.data();
  p.ids = static_cast<const int64_t*>(it.data());
  p.out = ot.data();
  py::gil_scoped_release release;
  k::packed_linear_rows(p);
}

}  // namespace

void bind_linear_kernels(py::module_& m) {
  m.def("packed_linear_elements", &packed_elements, py::arg("dtype"), py::arg("out_features"),
        py::arg("in_features"),
        "Elements of the packed form of an [out_features, in_features] linear weight "
        "(dtype 'float32' or 'bfloat16'; 16-column panels, zero-padded).");
  m.def("pack_linear_weight", &pack_weight, py::arg("packed"), py::arg("weight"),
        "Writes weight [out_features, in_features] (float32 or bfloat16, rows contiguous) into "
        "packed (1-D, packed_linear_elements(...) elements of the same dtype) for linear().");
  m.def("linear", &linear, py::arg("y"), py::arg("x"), py::arg("packed"), py::arg("bias"),
        "y [rows, out_features] = x [rows, in_features] @ W.T (+ bias [out_features] or None), "
        "W packed by pack_linear_weight; float32 or bfloat16, float32 sums, y rounded once.");
  m.def("packed_rows", &packed_rows, py::arg("out"), py::arg("packed"), py::arg("out_features"),
        py::arg("ids"),
        "out [n, in_features] = W[ids] (ids: int64 [n], each in [0, out_features)) read from "
        "W's packed form (pack_linear_weight): an embedding lookup from a tied lm_head's panels, "
        "bit-identical to the weight's rows; IndexError on an id out of range.");
  m.def("linear_kernel", [](const std::string& dtype) { return std::string(k::linear_kernel(dtype_named(dtype))); },
        py::arg("dtype"),
        "The tile loops linear() runs for dtype here: 'avx512', 'avx512_bf16', 'avx2' or 'generic' "
        "(they follow set_cpu_engine).");
}

}  // namespace pagedllm::python
