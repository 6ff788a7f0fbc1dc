// Bindings of the block-sparse CPU attention kernels (paged_attention_{decode,prefill}_sparse):
// the dense calls' tensors plus the CSR block lists `sparse_indptr` / `sparse_indices` (int32,
// contiguous, CPU). Shapes are checked here; the lists' values by the kernels.
#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {
namespace {

// The CSR lists as BlockSparseParams (1-D int32 each; indptr of at least one entry).
k::BlockSparseParams sparse_params(const Tensor& indptr, const Tensor& indices) {
  check_index_1d(indptr, -1);
  check_index_1d(indices, -1);
  PAGEDLLM_CHECK_ARG(indptr.size(0) >= 1, "sparse_indptr must have num_lists + 1 >= 1 entries");
  k::BlockSparseParams s;
  s.indptr = static_cast<const int32_t*>(indptr.data());
  s.num_lists = to_i32(indptr.size(0) - 1, "sparse lists");
  s.indices = static_cast<const int32_t*>(indices.data());
  s.num_indices = to_i32(indices.size(0), "sparse indices");
  return s;
}

void decode_sparse(py::handle out, py::handle query, py::handle key_cache,
                   py::handle value_cache, py::handle block_tables, py::handle context_lens,
                   py::handle sparse_indptr, py::handle sparse_indices, double scale,
                   const std::string& kv_cache_dtype, double k_scale, double v_scale) {
  const Tensor o(out, "out"), q(query, "query"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), bt(block_tables, "block_tables"),
      cl(context_lens, "context_lens"), ip(sparse_indptr, "sparse_indptr"),
      ix(sparse_indices, "sparse_indices");
  k::AttentionParams p =
      attention_params(o, q, kc, vc, bt, cl, scale, kv_cache_dtype, k_scale, v_scale);
  PAGEDLLM_CHECK_ARG(q.size(0) == bt.size(0), "query has " << q.size(0)
                                                           << " tokens but block_tables has "
                                                           << bt.size(0)
                                                           << " rows (decode: one per sequence)");
  const k::BlockSparseParams s = sparse_params(ip, ix);
  py::gil_scoped_release release;
  k::paged_attention_decode_sparse(p, s);
}

void prefill_sparse(py::handle out, py::handle query, py::handle key_cache,
                    py::handle value_cache, py::handle block_tables, py::handle cu_seqlens_q,
                    py::handle context_lens, py::handle sparse_indptr, py::handle sparse_indices,
                    double scale, const std::string& kv_cache_dtype, double k_scale,
                    double v_scale) {
  const Tensor o(out, "out"), q(query, "query"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), bt(block_tables, "block_tables"),
      cu(cu_seqlens_q, "cu_seqlens_q"), cl(context_lens, "context_lens"),
      ip(sparse_indptr, "sparse_indptr"), ix(sparse_indices, "sparse_indices");
  k::AttentionParams p =
      attention_params(o, q, kc, vc, bt, cl, scale, kv_cache_dtype, k_scale, v_scale);
  check_index_1d(cu, static_cast<int64_t>(p.num_seqs) + 1);
  p.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
  const k::BlockSparseParams s = sparse_params(ip, ix);
  py::gil_scoped_release release;
  k::paged_attention_prefill_sparse(p, s);
}

}  // namespace

void bind_sparse_kernels(py::module_& m) {
  m.def("paged_attention_decode_sparse", &decode_sparse, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("sparse_indptr"), py::arg("sparse_indices"),
        py::arg("scale"), py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0,
        "Decode attention over the logical blocks listed per sequence (or per (sequence, KV "
        "head)) in CSR form: indptr [num_lists + 1], indices (sorted block ids per list).");
  m.def("paged_attention_prefill_sparse", &prefill_sparse, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("sparse_indptr"),
        py::arg("sparse_indices"), py::arg("scale"), py::arg("kv_cache_dtype") = "auto",
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        "Causal prefill attention over the listed logical blocks only (CSR as for decode).");
}

}  // namespace pagedllm::python
