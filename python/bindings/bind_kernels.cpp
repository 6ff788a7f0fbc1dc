// Bindings of the CPU kernels: tensors come in by DLPack (torch or numpy, zero-copy), their
// shapes / dtypes / devices / layouts are checked by kernel_args.cpp while it fills the plain
// params structs of pagedllm/kernels/params.h, and the GIL is released for the work. The
// kernels then check the values (block ids, lengths) before writing anything.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "dlpack_tensor.h"
#include "kernel_args.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python {
namespace {

void reshape_and_cache(py::handle key, py::handle value, py::handle key_cache,
                       py::handle value_cache, py::handle slot_mapping,
                       const std::string& kv_cache_dtype, double k_scale, double v_scale) {
  const Tensor kt(key, "key"), vt(value, "value"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), slots(slot_mapping, "slot_mapping");
  const k::ReshapeAndCacheParams p =
      reshape_and_cache_params(kt, vt, kc, vc, slots, kv_cache_dtype, k_scale, v_scale);
  py::gil_scoped_release release;
  k::reshape_and_cache(p);
}

void decode(py::handle out, py::handle query, py::handle key_cache, py::handle value_cache,
            py::handle block_tables, py::handle context_lens, double scale,
            const std::string& kv_cache_dtype, double k_scale, double v_scale) {
  const Tensor o(out, "out"), q(query, "query"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), bt(block_tables, "block_tables"),
      cl(context_lens, "context_lens");
  k::AttentionParams p =
      attention_params(o, q, kc, vc, bt, cl, scale, kv_cache_dtype, k_scale, v_scale);
  check_decode_rows(q.size(0), bt.size(0));
  py::gil_scoped_release release;
  k::paged_attention_decode(p);
}

void prefill(py::handle out, py::handle query, py::handle key_cache, py::handle value_cache,
             py::handle block_tables, py::handle cu_seqlens_q, py::handle context_lens,
             double scale, const std::string& kv_cache_dtype, double k_scale, double v_scale) {
  const Tensor o(out, "out"), q(query, "query"), kc(key_cache, "key_cache"),
      vc(value_cache, "value_cache"), bt(block_tables, "block_tables"),
      cu(cu_seqlens_q, "cu_seqlens_q"), cl(context_lens, "context_lens");
  k::AttentionParams p =
      attention_params(o, q, kc, vc, bt, cl, scale, kv_cache_dtype, k_scale, v_scale);
  check_index_1d(cu, static_cast<int64_t>(p.num_seqs) + 1);
  p.cu_seqlens_q = static_cast<const int32_t*>(cu.data());
  py::gil_scoped_release release;
  k::paged_attention_prefill(p);
}

void copy_blocks(py::sequence caches, py::handle block_mapping) {
  std::vector<Tensor> tensors;
  tensors.reserve(caches.size());
  for (py::handle c : caches) tensors.emplace_back(c, "caches[i]");
  std::vector<k::BlockPoolParams> pools;
  for (const Tensor& t : tensors) pools.push_back(block_pool(t));
  const Tensor m(block_mapping, "block_mapping");
  const std::vector<int64_t> pairs = block_pairs(m);
  k::CopyBlocksParams p;
  p.pools = pools.data();
  p.num_pools = static_cast<int32_t>(pools.size());
  p.pairs = pairs.data();
  p.num_pairs = static_cast<int32_t>(pairs.size() / 2);
  py::gil_scoped_release release;
  k::copy_blocks(p);
}

void swap_blocks(py::handle src, py::handle dst, py::handle block_mapping) {
  const Tensor s(src, "src"), d(dst, "dst"), m(block_mapping, "block_mapping");
  k::SwapBlocksParams p;
  p.src = block_pool(s);
  p.dst = block_pool(d);
  PAGEDLLM_CHECK_ARG(s.dtype() == d.dtype(), "src is " << dtype_name(s.dtype()) << " but dst is "
                                                       << dtype_name(d.dtype()));
  const std::vector<int64_t> pairs = block_pairs(m);
  p.pairs = pairs.data();
  p.num_pairs = static_cast<int32_t>(pairs.size() / 2);
  py::gil_scoped_release release;
  k::swap_blocks(p);
}

double stream_read_sum(py::handle x) {
  const Tensor t(x, "x");
  t.require_cpu();
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kFloat32, "x must be float32, got " << t.describe());
  t.require_inner_contiguous(0);
  const auto* data = static_cast<const float*>(t.data());
  const int64_t n = t.numel();
  py::gil_scoped_release release;
  return k::stream_read_sum(data, n);
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("reshape_and_cache", &reshape_and_cache, py::arg("key"), py::arg("value"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        "Writes key/value [num_tokens, num_kv_heads, head_dim] into their slots of the paged "
        "caches [num_blocks, num_kv_heads, block_size, head_dim]; slot -1 skips a token.");
  m.def("paged_attention_decode", &decode, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("kv_cache_dtype") = "auto",
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        "Attention of one query token per sequence over its paged context; writes out.");
  m.def("paged_attention_prefill", &prefill, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("scale"),
        py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        "Causal attention of packed new tokens over their sequences' paged context.");
  m.def("copy_blocks", &copy_blocks, py::arg("caches"), py::arg("block_mapping"),
        "Copies block src -> dst (int [k, 2] pairs) inside every cache tensor of `caches`.");
  m.def("swap_blocks", &swap_blocks, py::arg("src"), py::arg("dst"), py::arg("block_mapping"),
        "Copies block src of `src` to block dst of `dst` for each (src, dst) pair.");
  m.def("set_num_threads", &k::set_num_threads, py::arg("n"),
        "Sets the number of threads of the kernel thread pool.");
  m.def("get_num_threads", &k::get_num_threads, "Threads of the kernel thread pool.");
  m.def("adopt_loaded_openmp", &k::adopt_loaded_openmp,
        "Runs the kernels on the team of an OpenMP runtime already loaded in the process "
        "(torch's); returns False when there is none.");
  m.def("use_builtin_pool", &k::use_builtin_pool, "Runs the kernels on the built-in pool.");
  m.def("parallel_runtime", &k::parallel_runtime,
        "Where the kernels run: 'builtin' or 'openmp:<library>'.");
  m.def("stream_read_sum", &stream_read_sum, py::arg("x"),
        "Sums a contiguous float32 tensor with all pool threads (memory read-bandwidth probe).");
  m.def("cpu_kernel", &k::active_cpu_kernel,
        "The CPU attention engine in use: 'avx512', 'avx2', 'generic' or 'avx512_bf16'.");
  m.def("get_cpu_engine", &k::active_cpu_kernel,
        "The CPU attention engine in use: 'avx512', 'avx2', 'generic' or 'avx512_bf16'.");
  m.def("set_cpu_engine", &k::set_cpu_engine, py::arg("name"),
        "Uses CPU attention engine `name` ('generic', 'avx2', 'avx512', 'avx512_bf16' (bf16 "
        "dot products for bf16 / fp8 K/V, opt-in), or 'auto' for the best exact one this CPU "
        "runs (except decode of a bf16 query on an fp8 cache: avx512_bf16 where it runs); "
        "ValueError if unknown, not compiled in, or not supported by this CPU.");
  m.def("cpu_engines", &k::available_cpu_engines,
        "The CPU attention engines compiled in that this CPU runs: the exact ones best first, "
        "then the opt-in avx512_bf16.");
  m.def("force_generic_kernels", &k::force_generic_kernels, py::arg("on"),
        "Forces the portable attention kernel (True) or the best one for this CPU (False).");
  bind_fused_kernels(m);  // bind_fused.cpp: rms_norm, fused_add_rms_norm, silu_and_mul, RoPE
  bind_linear_kernels(m);  // bind_linear.cpp: packed linear layers
  bind_decoder_kernels(m);  // bind_decoder.cpp: the decoder stack
}

}  // namespace pagedllm::python
