// Binding of the CPU cross-attention kernel (paged_cross_attention, Mllama): prefill's tensors
// plus kv_ranges [num_tokens, 2] int32. Shapes and dtypes are checked here (kernel_args.h);
// the range values, lengths and block ids by the kernel before it writes anything.
#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {

namespace {

void cross_attention(py::handle out, py::handle query, py::handle key_cache,
                     py::handle value_cache, py::handle block_tables, py::handle cu_seqlens_q,
                     py::handle context_lens, py::handle kv_ranges, double scale,
                     const std::string& kv_cache_dtype, double k_scale, double v_scale) {
  const Tensor o(out, "out"), q(query, "query"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), bt(block_tables, "block_tables"),
      cu(cu_seqlens_q, "cu_seqlens_q"), cl(context_lens, "context_lens"),
      kr(kv_ranges, "kv_ranges");
  k::AttentionParams p =
      attention_params(o, q, kc, vc, bt, cl, scale, kv_cache_dtype, k_scale, v_scale);
  check_index_1d(cu, static_cast<int64_t>(p.num_seqs) + 1);
  p.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
  check_kv_ranges(kr, p.num_tokens, /*on_cpu=*/true);
  const auto* ranges = static_cast<const int32_t*>(kr.data());
  py::gil_scoped_release release;
  k::paged_cross_attention(p, ranges);
}

}  // namespace

void bind_cross_kernels(py::module_& m) {
  m.def("paged_cross_attention", &cross_attention, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("kv_ranges"),
        py::arg("scale"), py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0,
        "Non-causal cross-attention (Mllama) of packed query tokens [num_tokens, num_heads, "
        "head_dim] over their sequences' paged cross K/V: token i attends cross positions "
        "kv_ranges[i, 0] <= j < kv_ranges[i, 1] (int32 [num_tokens, 2]; an empty range gives "
        "a zero row); writes out.");
}

}  // namespace pagedllm::python
