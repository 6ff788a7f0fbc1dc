// Bindings of the decoder stack (pagedllm/kernels/decoder.h): DecoderWeights, built once per
// model, holds every layer's norm weights and packed projections (checked once, kept alive);
// decoder_stack runs one step's tokens through all layers with the GIL released.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/decoder.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/linear.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {
namespace {

// A model's decoder weights, borrowed for the object's lifetime.
class DecoderWeights {
 public:
  // layers: per layer (input_norm, post_norm, qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias,
  // down, down_bias), packed projections and biases (or None) of one float dtype.
  DecoderWeights(py::sequence layers, py::handle final_norm, int hidden, int num_heads,
                 int num_kv_heads, int head_dim, int intermediate) {
    PAGEDLLM_CHECK_ARG(hidden >= 1 && num_heads >= 1 && num_kv_heads >= 1 && head_dim >= 2 &&
                           intermediate >= 1 && num_heads % num_kv_heads == 0,
                       "DecoderWeights: hidden " << hidden << ", num_heads " << num_heads
                           << ", num_kv_heads " << num_kv_heads << ", head_dim " << head_dim
                           << ", intermediate " << intermediate
                           << ": expected sizes >= 1 and num_heads a multiple of num_kv_heads");
    PAGEDLLM_CHECK_ARG(py::len(layers) >= 1, "DecoderWeights: expected at least one layer");
    const int shape[5] = {hidden, num_heads, num_kv_heads, head_dim, intermediate};
    std::copy(shape, shape + 5, shape_);
    held_.reserve(py::len(layers) * 10 + 1);
    final_norm_ = vector_of(final_norm, "final_norm", hidden);
    const int64_t q = int64_t{num_heads} * head_dim, kv = int64_t{num_kv_heads} * head_dim;
    for (py::handle item : layers) {
      const py::sequence t = py::reinterpret_borrow<py::sequence>(item);
      PAGEDLLM_CHECK_ARG(py::len(t) == 10, "DecoderWeights: each layer is a 10-tuple (input_norm, "
                                         "post_norm, qkv, qkv_bias, o, o_bias, gate_up, "
                                         "gate_up_bias, down, down_bias), got "
                                             << py::len(t) << " items");
      k::DecoderLayerParams l;
      l.input_norm = vector_of(t[0], "input_norm", hidden);
      l.post_norm = vector_of(t[1], "post_norm", hidden);
      l.qkv = packed_of(t[2], "qkv", q + 2 * kv, hidden);
      l.qkv_bias = bias_of(t[3], "qkv_bias", q + 2 * kv);
      l.o = packed_of(t[4], "o", hidden, q);
      l.o_bias = bias_of(t[5], "o_bias", hidden);
      l.gate_up = packed_of(t[6], "gate_up", 2 * int64_t{intermediate}, hidden);
      l.gate_up_bias = bias_of(t[7], "gate_up_bias", 2 * int64_t{intermediate});
      l.down = packed_of(t[8], "down", hidden, intermediate);
      l.down_bias = bias_of(t[9], "down_bias", hidden);
      layers_.push_back(l);
    }
  }

  k::ScalarType dtype() const { return dtype_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }

  // Bytes of workspace decoder_stack needs for a step of num_tokens tokens.
  int64_t workspace_bytes(int64_t num_tokens) const {
    k::DecoderStackParams p;
    fill_shape(&p);
    p.num_tokens = num_tokens;
    return k::decoder_workspace_bytes(p);
  }

  // Sizes and dtype into p.
  void fill_shape(k::DecoderStackParams* p) const {
    p->dtype = dtype_;
    p->hidden = shape_[0];
    p->num_heads = shape_[1];
    p->num_kv_heads = shape_[2];
    p->head_dim = shape_[3];
    p->intermediate = shape_[4];
    p->final_norm = final_norm_;
  }

  const std::vector<k::DecoderLayerParams>& layers() const { return layers_; }

 private:
  // Checks t's dtype against the first tensor's; keeps t alive.
  const Tensor& hold(py::handle obj, const char* name) {
    held_.emplace_back(obj, name);
    const Tensor& t = held_.back();
    t.require_cpu();
    PAGEDLLM_CHECK_ARG(t.dtype() == DType::kFloat32 || t.dtype() == DType::kBFloat16,
                       "DecoderWeights: " << name << " must be float32 or bfloat16, got "
                                          << t.describe());
    const k::ScalarType s =
        t.dtype() == DType::kFloat32 ? k::ScalarType::kFloat32 : k::ScalarType::kBFloat16;
    if (held_.size() == 1) dtype_ = s;
    PAGEDLLM_CHECK_ARG(s == dtype_, "DecoderWeights: " << name << " is " << t.describe()
                                                       << ", the first weight "
                                                       << k::scalar_type_name(dtype_));
    t.require_inner_contiguous(0);
    return t;
  }

  const void* vector_of(py::handle obj, const char* name, int64_t n) {
    const Tensor& t = hold(obj, name);
    PAGEDLLM_CHECK_ARG(t.ndim() == 1 && t.size(0) == n,
                       "DecoderWeights: " << name << " " << t.describe() << " must be [" << n
                                          << "]");
    return t.data();
  }

  const void* bias_of(py::handle obj, const char* name, int64_t n) {
    return obj.is_none() ? nullptr : vector_of(obj, name, n);
  }

  const void* packed_of(py::handle obj, const char* name, int64_t out, int64_t in) {
    const Tensor& t = hold(obj, name);
    const int64_t n = k::packed_linear_elements(dtype_, out, in);
    PAGEDLLM_CHECK_ARG(t.ndim() == 1 && t.size(0) == n,
                       "DecoderWeights: " << name << " " << t.describe() << " must be the packed "
                                          << "form of a [" << out << ", " << in << "] weight ("
                                          << n << " elements)");
    return t.data();
  }

  std::vector<Tensor> held_;
  std::vector<k::DecoderLayerParams> layers_;
  const void* final_norm_ = nullptr;
  int shape_[5] = {};
  k::ScalarType dtype_ = k::ScalarType::kFloat32;
};

// Checks a contiguous [num_tokens, cols] activation of the weights' dtype.
void check_rows(const Tensor& t, int64_t rows, int64_t cols, k::ScalarType dtype) {
  t.require_cpu();
  const DType want = dtype == k::ScalarType::kFloat32 ? DType::kFloat32 : DType::kBFloat16;
  PAGEDLLM_CHECK_ARG(t.dtype() == want, t.name() << " is " << t.describe() << ", the weights "
                                                 << k::scalar_type_name(dtype));
  PAGEDLLM_CHECK_ARG(t.numel() == rows * cols && t.size(0) == rows,
                     t.name() << " " << t.describe() << " must hold [" << rows << ", " << cols
                              << "]");
  t.require_inner_contiguous(0);
}

void decoder_stack(const DecoderWeights& w, py::handle out, py::handle x, py::handle cos,
                   py::handle sin, py::handle slot_mapping, py::handle block_tables,
                   py::handle context_lens, py::handle cu_seqlens_q, int num_decode_seqs,
                   py::sequence key_caches, py::sequence value_caches,
                   const std::string& kv_cache_dtype, double k_scale, double v_scale,
                   double eps, double scale, py::handle workspace) {
  const Tensor ot(out, "out"), xt(x, "x"), ct(cos, "cos"), st(sin, "sin"),
      slots(slot_mapping, "slot_mapping"), bt(block_tables, "block_tables"),
      cl(context_lens, "context_lens"), cu(cu_seqlens_q, "cu_seqlens_q"), ws(workspace, "workspace");
  k::DecoderStackParams p;
  w.fill_shape(&p);
  xt.require_ndim(2);
  p.num_tokens = xt.size(0);
  check_rows(xt, p.num_tokens, p.hidden, p.dtype);
  check_rows(ot, p.num_tokens, p.hidden, p.dtype);
  check_rows(ct, p.num_tokens, p.head_dim, p.dtype);
  check_rows(st, p.num_tokens, p.head_dim, p.dtype);
  xt.require_writable();
  ot.require_writable();
  slots.require_cpu();
  PAGEDLLM_CHECK_ARG((slots.dtype() == DType::kInt32 || slots.dtype() == DType::kInt64) &&
                         slots.ndim() == 1 && slots.size(0) == p.num_tokens,
                     "slot_mapping " << slots.describe() << " must be int32 / int64 ["
                                     << p.num_tokens << "]");
  slots.require_inner_contiguous(0);
  p.num_seqs = check_block_tables(bt);
  check_index_1d(cl, p.num_seqs);
  check_index_1d(cu, int64_t{p.num_seqs} + 1);
  ws.require_cpu();
  ws.require_writable();
  ws.require_inner_contiguous(0);
  PAGEDLLM_CHECK_ARG(ws.ndim() == 1 && ws.dtype() == DType::kUInt8,
                     "workspace must be a 1-D uint8 tensor, got " << ws.describe());
  const int n_layers = w.num_layers();
  PAGEDLLM_CHECK_ARG(static_cast<int>(py::len(key_caches)) == n_layers &&
                         static_cast<int>(py::len(value_caches)) == n_layers,
                     "decoder_stack: " << py::len(key_caches) << " key and "
                                       << py::len(value_caches) << " value caches for "
                                       << n_layers << " layers");
  std::vector<Tensor> caches;
  caches.reserve(2 * static_cast<size_t>(n_layers));
  std::vector<k::DecoderLayerParams> layers = w.layers();  // a copy: the caches are per call
  for (int i = 0; i < n_layers; ++i) {
    caches.emplace_back(key_caches[i], "key_cache");
    caches.emplace_back(value_caches[i], "value_cache");
    layers[i].cache = cache_params(caches[2 * i], caches[2 * i + 1], kv_cache_dtype, k_scale,
                                   v_scale);
  }
  p.x = xt.data();
  p.out = ot.data();
  p.cos = ct.data();
  p.sin = st.data();
  p.slot_mapping = slots.data();
  p.slot_mapping_int64 = slots.dtype() == DType::kInt64;
  p.block_tables = static_cast<const int32_t*>(bt.data());
  p.block_table_stride = bt.stride(0);
  p.max_blocks_per_seq = to_i32(bt.size(1), "max_blocks_per_seq");
  p.context_lens = static_cast<const int32_t*>(cl.data());
  p.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
  p.num_decode_seqs = num_decode_seqs;
  p.layers = layers.data();
  p.num_layers = n_layers;
  p.eps = static_cast<float>(eps);
  p.scale = static_cast<float>(scale);
  p.workspace = ws.data();
  p.workspace_bytes = ws.numel();
  py::gil_scoped_release release;
  k::decoder_stack(p);
}

}  // namespace

void bind_decoder_kernels(py::module_& m) {
  py::class_<DecoderWeights>(m, "DecoderWeights",
                             "A Llama model's decoder weights for decoder_stack, borrowed (kept "
                             "alive) and checked once.")
      .def(py::init<py::sequence, py::handle, int, int, int, int, int>(), py::arg("layers"),
           py::arg("final_norm"), py::arg("hidden"), py::arg("num_heads"),
           py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("intermediate"),
           "layers: per layer (input_norm, post_norm, qkv, qkv_bias, o, o_bias, gate_up, "
           "gate_up_bias, down, down_bias): norm weights [hidden], projections packed by "
           "pack_linear_weight, biases or None; one float dtype throughout.")
      .def_property_readonly("num_layers", &DecoderWeights::num_layers)
      .def("workspace_bytes", &DecoderWeights::workspace_bytes, py::arg("num_tokens"),
           "Bytes of workspace decoder_stack needs for a step of num_tokens tokens.");
  m.def("decoder_stack", &decoder_stack, py::arg("weights"), py::arg("out"), py::arg("x"),
        py::arg("cos"), py::arg("sin"), py::arg("slot_mapping"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("cu_seqlens_q"), py::arg("num_decode_seqs"),
        py::arg("key_caches"), py::arg("value_caches"), py::arg("kv_cache_dtype"),
        py::arg("k_scale"), py::arg("v_scale"), py::arg("eps"), py::arg("scale"),
        py::arg("workspace"),
        "Runs one step's packed tokens x [num_tokens, hidden] (the residual stream, updated in "
        "place) through every decoder layer over the paged caches and writes the final "
        "RMSNorm(x) into out; cos / sin [num_tokens, (1,) head_dim] RoPE tables; the attention "
        "metadata as for paged_attention_decode / _prefill (the first num_decode_seqs "
        "sequences decode); workspace: uint8 of weights.workspace_bytes(num_tokens), 64-byte "
        "aligned.");
}

}  // namespace pagedllm::python
