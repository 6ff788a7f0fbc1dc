// Bindings of the fused element-wise kernels (pagedllm/kernels/fused_ops.h): rms_norm,
// fused_add_rms_norm, silu_and_mul, rotary_embedding, argmax_rows and greedy_tokens (sampling),
// token_rows (a step's embedding and RoPE rows). Shapes, dtypes, devices and layouts are
// checked here one line at a time, then the GIL is released for the work.
#include <cstdint>
#include <utility>
#include <vector>

#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/linear.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {
namespace {

// The element type of every tensor of one call: float32 or bfloat16, all the same.
k::ScalarType common_float_type(std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts) {
    t->require_cpu();
    PAGEDLLM_CHECK_ARG(t->dtype() == DType::kFloat32 || t->dtype() == DType::kBFloat16,
                       t->name() << " must be float32 or bfloat16, got " << t->describe());
    PAGEDLLM_CHECK_ARG(t->dtype() == first.dtype(), t->name() << " is " << t->describe() << " but "
                                                              << first.name() << " is "
                                                              << dtype_name(first.dtype()));
  }
  return first.dtype() == DType::kFloat32 ? k::ScalarType::kFloat32 : k::ScalarType::kBFloat16;
}

// Checks t is [rows, cols] (`what`: where that shape comes from) with contiguous rows; returns
// the row stride (a single row may report any stride).
int64_t row_stride(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  t.require_ndim(2);
  PAGEDLLM_CHECK_ARG(t.size(0) == rows && t.size(1) == cols,
                     t.name() << " " << t.describe() << " must have the shape of " << what << " ["
                              << rows << ", " << cols << "]");
  t.require_inner_contiguous(1);
  return rows > 1 ? t.stride(0) : cols;
}

void add_rms_norm(py::handle out, py::handle x, py::handle delta, py::handle weight, double eps) {
  const Tensor ot(out, "out"), xt(x, "x"), wt(weight, "weight");
  const bool fused = !delta.is_none();
  const Tensor dt(fused ? delta : x, fused ? "delta" : "x");
  k::AddRMSNormParams p;
  p.dtype = common_float_type({&xt, &ot, &wt, &dt});
  xt.require_ndim(2);
  p.rows = xt.size(0);
  p.cols = to_i32(xt.size(1), "cols");
  p.x_row_stride = row_stride(xt, p.rows, p.cols, "x");
  p.out_row_stride = row_stride(ot, p.rows, p.cols, "x");
  ot.require_writable();
  if (fused) {
    xt.require_writable();
    p.delta_row_stride = row_stride(dt, p.rows, p.cols, "x");
    p.delta = dt.data();
  }
  wt.require_ndim(1);
  PAGEDLLM_CHECK_ARG(wt.size(0) == p.cols, "weight " << wt.describe() << " must be [" << p.cols
                                                     << "] (x's last dim)");
  wt.require_inner_contiguous(0);
  p.x = xt.data();
  p.out = ot.data();
  p.weight = wt.data();
  p.eps = static_cast<float>(eps);
  py::gil_scoped_release release;
  k::add_rms_norm(p);
}

void rms_norm(py::handle out, py::handle x, py::handle weight, double eps) {
  add_rms_norm(out, x, py::none(), weight, eps);
}

void silu_and_mul(py::handle out, py::handle x) {
  const Tensor ot(out, "out"), xt(x, "x");
  k::SiluAndMulParams p;
  p.dtype = common_float_type({&xt, &ot});
  xt.require_ndim(2);
  PAGEDLLM_CHECK_ARG(xt.size(1) % 2 == 0 && xt.size(1) > 0,
                     "x " << xt.describe() << " must be [rows, 2 * f] (gate then up), f >= 1");
  p.rows = xt.size(0);
  p.cols = to_i32(xt.size(1) / 2, "cols");
  p.x_row_stride = row_stride(xt, p.rows, 2 * int64_t{p.cols}, "x");
  p.out_row_stride = row_stride(ot, p.rows, p.cols, "half of x (out)");
  ot.require_writable();
  p.x = xt.data();
  p.out = ot.data();
  py::gil_scoped_release release;
  k::silu_and_mul(p);
}

// A [num_tokens, head_dim] or [num_tokens, 1, head_dim] table; returns its token stride.
int64_t table_stride(const Tensor& t, int64_t tokens, int64_t head_dim) {
  PAGEDLLM_CHECK_ARG(t.ndim() == 2 || (t.ndim() == 3 && t.size(1) == 1),
                     t.name() << " " << t.describe() << " must be [num_tokens, head_dim] or "
                                                        "[num_tokens, 1, head_dim]");
  const int last = t.ndim() - 1;
  PAGEDLLM_CHECK_ARG(t.size(0) == tokens && t.size(last) == head_dim,
                     t.name() << " " << t.describe() << " must have " << tokens
                              << " tokens of head_dim " << head_dim << " (x's)");
  t.require_inner_contiguous(last);
  return tokens > 1 ? t.stride(0) : head_dim;
}

void rotary_embedding(py::handle x, py::handle cos, py::handle sin) {
  const Tensor xt(x, "x"), ct(cos, "cos"), st(sin, "sin");
  k::RotaryParams p;
  p.dtype = common_float_type({&xt, &ct, &st});
  xt.require_ndim(3);
  xt.require_writable();
  xt.require_inner_contiguous(2);
  p.num_tokens = xt.size(0);
  p.num_heads = to_i32(xt.size(1), "num_heads");
  p.head_dim = to_i32(xt.size(2), "head_dim");
  PAGEDLLM_CHECK_ARG(p.head_dim % 2 == 0, "x " << xt.describe() << ": head_dim must be even");
  p.x_token_stride = xt.stride(0);
  p.x_head_stride = xt.stride(1);
  p.cos_token_stride = table_stride(ct, p.num_tokens, p.head_dim);
  p.sin_token_stride = table_stride(st, p.num_tokens, p.head_dim);
  p.x = xt.data();
  p.cos = ct.data();
  p.sin = st.data();
  py::gil_scoped_release release;
  k::rotary_embedding(p);
}

int64_t argmax_rows(py::handle x, py::handle index, py::handle max_value) {
  const Tensor xt(x, "x"), it(index, "index"), mt(max_value, "max_value");
  for (const Tensor* t : {&xt, &it, &mt}) t->require_cpu();
  PAGEDLLM_CHECK_ARG(xt.dtype() == DType::kFloat32, "x must be float32, got " << xt.describe());
  PAGEDLLM_CHECK_ARG(it.dtype() == DType::kInt64, "index must be int64, got " << it.describe());
  PAGEDLLM_CHECK_ARG(mt.dtype() == DType::kFloat32,
                     "max_value must be float32, got " << mt.describe());
  xt.require_ndim(2);
  k::ArgmaxParams p;
  p.rows = xt.size(0);
  p.cols = xt.size(1);
  p.x_row_stride = row_stride(xt, p.rows, p.cols, "x");
  for (const Tensor* t : {&it, &mt}) {
    t->require_ndim(1);
    PAGEDLLM_CHECK_ARG(t->size(0) == p.rows, t->name() << " " << t->describe() << " must be ["
                                                      << p.rows << "] (x's rows)");
    t->require_inner_contiguous(0);
    t->require_writable();
  }
  p.x = static_cast<const float*>(xt.data());
  p.index = static_cast<int64_t*>(it.data());
  p.max_value = static_cast<float*>(mt.data());
  py::gil_scoped_release release;
  return k::argmax_rows(p);
}

// Greedy sampling's tokens: argmax_rows into buffers of its own, handed back as a list (None
// when a row needs the exact non-finite handling), so a step makes no index tensors.
py::object greedy_tokens(py::handle x) {
  const Tensor xt(x, "x");
  xt.require_cpu();
  PAGEDLLM_CHECK_ARG(xt.dtype() == DType::kFloat32, "x must be float32, got " << xt.describe());
  xt.require_ndim(2);
  k::ArgmaxParams p;
  p.rows = xt.size(0);
  p.cols = xt.size(1);
  p.x_row_stride = row_stride(xt, p.rows, p.cols, "x");
  std::vector<int64_t> index(static_cast<size_t>(p.rows));
  std::vector<float> maxima(static_cast<size_t>(p.rows));
  p.x = static_cast<const float*>(xt.data());
  p.index = index.data();
  p.max_value = maxima.data();
  int64_t bad = 0;
  {
    py::gil_scoped_release release;
    bad = k::argmax_rows(p);
  }
  if (bad) return py::none();
  py::list out(static_cast<size_t>(p.rows));
  for (int64_t r = 0; r < p.rows; ++r) out[static_cast<size_t>(r)] = py::int_(index[r]);
  return std::move(out);
}

// Checks t holds `rows` x `cols` contiguous elements of dtype (any rank: [rows, 1, cols] too).
void check_contiguous_rows(const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  t.require_cpu();
  PAGEDLLM_CHECK_ARG(t.dtype() == dtype && t.ndim() >= 1 && t.size(0) == rows &&
                         t.numel() == rows * cols,
                     t.name() << " " << t.describe() << " must hold [" << rows << ", " << cols
                              << "] " << dtype_name(dtype));
  t.require_inner_contiguous(0);
}

int64_t token_rows(py::handle x, py::handle cos, py::handle sin, py::handle ids,
                   py::handle positions, py::handle embedding, int64_t vocab, bool packed,
                   py::handle cos_table, py::handle sin_table) {
  const Tensor xt(x, "x"), ct(cos, "cos"), st(sin, "sin"), it(ids, "ids"), pt(positions, "positions"),
      et(embedding, "embedding"), ctt(cos_table, "cos_table"), stt(sin_table, "sin_table");
  k::TokenRowsParams p;
  p.dtype = common_float_type({&xt, &ct, &st, &et, &ctt, &stt});
  for (const Tensor* t : {&it, &pt}) {
    t->require_cpu();
    PAGEDLLM_CHECK_ARG(t->dtype() == DType::kInt64 && t->ndim() == 1,
                       t->name() << " " << t->describe() << ": expected a 1-D int64 vector");
    t->require_inner_contiguous(0);
  }
  p.num_tokens = it.size(0);
  PAGEDLLM_CHECK_ARG(pt.size(0) == p.num_tokens, "positions " << pt.describe() << " must be ["
                                                              << p.num_tokens << "] (ids')");
  xt.require_ndim(2);
  p.hidden = to_i32(xt.size(1), "hidden");
  p.vocab = to_i32(vocab, "vocab");
  p.embedding_packed = packed;
  if (packed) {
    et.require_ndim(1);
    PAGEDLLM_CHECK_ARG(et.size(0) == k::packed_linear_elements(p.dtype, p.vocab, p.hidden),
                       "embedding " << et.describe() << " must be a packed [" << p.vocab << ", "
                                    << p.hidden << "] weight");
    et.require_inner_contiguous(0);
  } else {
    PAGEDLLM_CHECK_ARG(et.size(0) == p.vocab, "embedding " << et.describe() << " must have "
                                                           << p.vocab << " rows");
    p.embedding_row_stride = row_stride(et, p.vocab, p.hidden, "the embedding");
  }
  check_contiguous_rows(xt, xt.dtype(), p.num_tokens, p.hidden);
  PAGEDLLM_CHECK_ARG(ctt.ndim() >= 1, "cos_table " << ctt.describe() << " has no head_dim");
  p.head_dim = to_i32(ctt.size(ctt.ndim() - 1), "head_dim");  // tables [rows, (1,) head_dim]
  check_contiguous_rows(ct, xt.dtype(), p.num_tokens, p.head_dim);
  check_contiguous_rows(st, xt.dtype(), p.num_tokens, p.head_dim);
  p.table_rows = ctt.size(0);
  check_contiguous_rows(ctt, xt.dtype(), p.table_rows, p.head_dim);
  check_contiguous_rows(stt, xt.dtype(), p.table_rows, p.head_dim);
  for (const Tensor* t : {&xt, &ct, &st}) t->require_writable();
  p.ids = static_cast<const int64_t*>(it.data());
  p.positions = static_cast<const int64_t*>(pt.data());
  p.embedding = et.data();
  p.cos_table = ctt.data();
  p.sin_table = stt.data();
  p.x = xt.data();
  p.cos = ct.data();
  p.sin = st.data();
  py::gil_scoped_release release;
  return k::gather_token_rows(p);
}

}  // namespace

void bind_fused_kernels(py::module_& m) {
  m.def("rms_norm", &rms_norm, py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("eps"),
        "out = weight * x / sqrt(mean(x^2, last dim) + eps) for x [rows, cols], float32 or "
        "bfloat16 (normalised row rounded before the weight, as transformers); out may be x.");
  m.def("fused_add_rms_norm", &add_rms_norm, py::arg("out"), py::arg("x"), py::arg("delta"),
        py::arg("weight"), py::arg("eps"),
        "x += delta in place (the residual stream), then out = rms_norm(x); float32 or "
        "bfloat16 [rows, cols]; delta None: a plain rms_norm.");
  m.def("silu_and_mul", &silu_and_mul, py::arg("out"), py::arg("x"),
        "out [rows, f] = silu(x[:, :f]) * x[:, f:] for x [rows, 2 f], float32 or bfloat16.");
  m.def("rotary_embedding", &rotary_embedding, py::arg("x"), py::arg("cos"), py::arg("sin"),
        "RoPE in place on x [num_tokens, heads, head_dim] (head_dim contiguous; the token and "
        "head dims may lie in memory in either order, e.g. a [heads, tokens, head_dim] tensor "
        "transposed, as long as no two heads overlap): "
        "x = x * cos + swap_halves(x) * sin with cos / sin [num_tokens, (1,) head_dim] "
        "(sin's first half negated: pagedllm.model.rope's tables); float32 or bfloat16.");
  m.def("greedy_tokens", &greedy_tokens, py::arg("x"),
        "Per row of float32 x [rows, cols] the index of its first maximum, as a list of ints; "
        "None when a row's maximum is not a finite float above the lowest one (NaN, +-inf: "
        "those rows need the exact non-finite handling). argmax_rows without index tensors.");
  m.def("token_rows", &token_rows, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("ids"),
        py::arg("positions"), py::arg("embedding"), py::arg("vocab"), py::arg("packed"),
        py::arg("cos_table"), py::arg("sin_table"),
        "A step's input rows in one call: x [n, hidden] = embedding rows ids (int64 [n]; the "
        "embedding a dense [vocab, hidden] matrix, or packed=True: pack_linear_weight's panels), "
        "cos / sin [n, (1,) head_dim] = the tables' rows at positions (int64 [n]); float32 or "
        "bfloat16, copies. Returns 0, or (writing nothing) the table rows the largest position "
        "needs when the tables are shorter. IndexError: an id outside [0, vocab), a negative "
        "position.");
  m.def("argmax_rows", &argmax_rows, py::arg("x"), py::arg("index"), py::arg("max_value"),
        "Per row of float32 x [rows, cols]: index (int64 [rows]) of its first maximum and "
        "max_value (float32 [rows]; NaN if the row holds one). Returns how many rows have a "
        "maximum that is not a finite float above the lowest one.");
}

}  // namespace pagedllm::python
