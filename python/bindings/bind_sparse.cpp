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
  check_decode_rows(q.size(0), bt.size(0));
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

// The storage type of key bounds: kv_cache_dtype's fp8 format for uint8 bounds, else theirs.
k::CacheType bound_type(const Tensor& t, const std::string& kv_cache_dtype) {
  k::CacheType named = k::CacheType::kFloat32;
  const bool explicit_type = k::parse_kv_cache_dtype(kv_cache_dtype, &named);
  switch (t.dtype()) {
    case DType::kFloat32: return k::CacheType::kFloat32;
    case DType::kFloat16: return k::CacheType::kFloat16;
    case DType::kBFloat16: return k::CacheType::kBFloat16;
    case DType::kFloat8E4M3FN: return k::CacheType::kFp8E4M3;
    case DType::kFloat8E5M2: return k::CacheType::kFp8E5M2;
    case DType::kUInt8:
      PAGEDLLM_CHECK_ARG(explicit_type && (named == k::CacheType::kFp8E4M3 ||
                                           named == k::CacheType::kFp8E5M2),
                         t.name() << " is uint8: kv_cache_dtype must name the fp8 format, got '"
                                  << kv_cache_dtype << "'");
      return named;
    default: break;
  }
  PAGEDLLM_CHECK_ARG(false, t.name() << " must be a float or fp8 cache type, got " << t.describe());
  return named;
}

void quest_select(py::handle query, py::handle key_min, py::handle key_max,
                  py::handle block_tables, py::handle num_seq_blocks, py::handle budget, py::handle forced_indptr, py::handle forced_indices,
                  py::handle out_indptr, py::handle out_indices,
                  const std::string& kv_cache_dtype) {
  const Tensor q(query, "query"), lo(key_min, "key_min"), hi(key_max, "key_max"),
      bt(block_tables, "block_tables"), cl(num_seq_blocks, "num_seq_blocks"),
      bu(budget, "budget"),
      fp(forced_indptr, "forced_indptr"), fi(forced_indices, "forced_indices"),
      op(out_indptr, "out_indptr"), oi(out_indices, "out_indices");
  k::QuestSelectParams p;
  for (const Tensor* t : {&lo, &hi}) {
    t->require_cpu();
    t->require_ndim(3);
    t->require_inner_contiguous(2);
  }
  PAGEDLLM_CHECK_ARG(lo.dtype() == hi.dtype() && lo.size(0) == hi.size(0) &&
                         lo.size(1) == hi.size(1) && lo.size(2) == hi.size(2) &&
                         lo.stride(0) == hi.stride(0) && lo.stride(1) == hi.stride(1),
                     "key_min " << lo.describe() << " and key_max " << hi.describe()
                                << " must match in shape, dtype and strides");
  p.num_blocks = to_i32(lo.size(0), "num_blocks");
  p.num_kv_heads = to_i32(lo.size(1), "num_kv_heads");
  p.head_dim = to_i32(lo.size(2), "head_dim");
  p.bound_block_stride = lo.stride(0);
  p.bound_head_stride = lo.stride(1);
  p.bound_dtype = bound_type(lo, kv_cache_dtype);
  p.key_min = lo.data();
  p.key_max = hi.data();
  check_activation(q, -1, p.head_dim);
  p.query = q.data();
  p.dtype = activation_type(q);
  p.query_token_stride = q.stride(0);
  p.query_head_stride = q.stride(1);
  p.num_heads = to_i32(q.size(1), "num_heads");
  p.num_seqs = check_block_tables(bt);
  PAGEDLLM_CHECK_ARG(q.size(0) == bt.size(0), "query has " << q.size(0) << " rows but block_tables "
                                                           << bt.size(0));
  p.block_tables = static_cast<const int32_t*>(bt.data());
  p.block_table_stride = bt.stride(0);
  p.max_blocks_per_seq = to_i32(bt.size(1), "max_blocks_per_seq");
  check_index_1d(cl, p.num_seqs);
  check_index_1d(bu, p.num_seqs);
  check_index_1d(fp, static_cast<int64_t>(p.num_seqs) + 1);
  check_index_1d(fi, -1);
  check_index_1d(op, static_cast<int64_t>(p.num_seqs) * p.num_kv_heads + 1);
  check_index_1d(oi, -1);
  oi.require_writable();
  p.num_seq_blocks = static_cast<const int32_t*>(cl.data());
  p.budget = static_cast<const int32_t*>(bu.data());
  p.forced_indptr = static_cast<const int32_t*>(fp.data());
  p.forced_indices = static_cast<const int32_t*>(fi.data());
  p.num_forced = to_i32(fi.size(0), "forced ids");
  p.out_indptr = static_cast<const int32_t*>(op.data());
  p.out_indices = static_cast<int32_t*>(oi.data());
  p.num_out = to_i32(oi.size(0), "output ids");
  py::gil_scoped_release release;
  k::quest_select(p);
}

}  // namespace

void bind_sparse_kernels(py::module_& m) {
  m.def("quest_select", &quest_select, py::arg("query"), py::arg("key_min"), py::arg("key_max"),
        py::arg("block_tables"), py::arg("num_seq_blocks"), py::arg("budget"), py::arg("forced_indptr"), py::arg("forced_indices"),
        py::arg("out_indptr"), py::arg("out_indices"), py::arg("kv_cache_dtype") = "auto",
        "Quest's per-(sequence, KV head) block choice from per-block key bounds [num_blocks, "
        "num_kv_heads, head_dim]: the forced blocks plus the best upper bounds of q.k up to "
        "budget blocks (0: the forced list), sorted, written into out_indices at out_indptr.");
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
