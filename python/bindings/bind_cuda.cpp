// pagedllm._core.cuda — the CUDA kernels (same Python signatures as the CPU kernels in
// pagedllm._core, plus a keyword-only `stream`), the engine's Streams, device queries and the
// validation mode. Every function checks its tensors (shapes, dtypes, placement: CUDA tensors
// on one device) before touching the GPU, raises RuntimeError when no device exists, and
// releases the GIL while it queues work. Calls run on `stream` when given (an int handle, e.g.
// torch.cuda.current_stream().cuda_stream), else on the thread's current stream set by
// set_current_stream (initially 0, the legacy default stream torch uses by default).
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "cuda_tensors.h"
#include "kernel_args.h"
#include "pagedllm/cuda/kernels.h"
#include "pagedllm/cuda/runtime.h"
#include "pagedllm/cuda/streams.h"
#include "pagedllm/error.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;
namespace cu = pagedllm::cuda;

namespace pagedllm::python {
namespace {

using cuda_binding::CudaCall;
using cuda_binding::Placement;

thread_local uintptr_t t_current_stream = 0;

cu::Stream to_stream(std::optional<uintptr_t> handle) {
  return reinterpret_cast<cu::Stream>(handle ? *handle : t_current_stream);
}

void require_gpu() {
  PAGEDLLM_CHECK_STATE(cu::device_count() > 0,
                       "no CUDA device is available (no driver or no GPU; "
                       "build_info()['gpu_count'] == 0): use the CPU kernels in pagedllm._core");
}

void reshape_and_cache(py::handle key, py::handle value, py::handle key_cache,
                       py::handle value_cache, py::handle slot_mapping,
                       const std::string& kv_cache_dtype, double k_scale, double v_scale,
                       std::optional<uintptr_t> stream) {
  CudaCall call;
  const Tensor& kt = call.gpu(key, "key");
  const Tensor& vt = call.gpu(value, "value");
  const Tensor& kc = call.gpu(key_cache, "key_cache");
  const Tensor& vc = call.gpu(value_cache, "value_cache");
  const Tensor& slots = call.gpu(slot_mapping, "slot_mapping");
  // Placement first (every tensor on the call's CUDA device), then the CPU bindings' rules.
  const k::ReshapeAndCacheParams p = python::reshape_and_cache_params(
      kt, vt, kc, vc, slots, kv_cache_dtype, k_scale, v_scale, /*on_cpu=*/false);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::reshape_and_cache(p, s);
}

void decode(py::handle out, py::handle query, py::handle key_cache, py::handle value_cache,
            py::handle block_tables, py::handle context_lens, double scale,
            const std::string& kv_cache_dtype, double k_scale, double v_scale,
            std::optional<uintptr_t> stream) {
  CudaCall call;
  k::AttentionParams p =
      cuda_binding::attention_params(call, out, query, key_cache, value_cache, block_tables,
                                     context_lens, scale, kv_cache_dtype, k_scale, v_scale);
  check_decode_rows(p.num_tokens, p.num_seqs);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::paged_attention_decode(p, s);
}

// Sets p->cu_seqlens_q from cu_seqlens_q (int32, [p->num_seqs + 1], on the call's GPU).
void set_cu_seqlens_q(CudaCall& call, py::handle cu_seqlens_q, k::AttentionParams* p) {
  const Tensor& cuq = cuda_binding::index_1d(call, cu_seqlens_q, "cu_seqlens_q",
                                             static_cast<int64_t>(p->num_seqs) + 1);
  p->cu_seqlens_q = static_cast<const int32_t*>(cuq.data());
}

void prefill(py::handle out, py::handle query, py::handle key_cache, py::handle value_cache,
             py::handle block_tables, py::handle cu_seqlens_q, py::handle context_lens,
             double scale, const std::string& kv_cache_dtype, double k_scale, double v_scale,
             std::optional<uintptr_t> stream) {
  CudaCall call;
  k::AttentionParams p =
      cuda_binding::attention_params(call, out, query, key_cache, value_cache, block_tables,
                                     context_lens, scale, kv_cache_dtype, k_scale, v_scale);
  set_cu_seqlens_q(call, cu_seqlens_q, &p);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::paged_attention_prefill(p, s);
}

// CSR block lists on the call's device: indptr [num_lists + 1], indices [num_indices] int32.
k::BlockSparseParams sparse_lists(CudaCall& call, py::handle indptr, py::handle indices) {
  const Tensor& ip = cuda_binding::index_1d(call, indptr, "sparse_indptr", -1);
  const Tensor& ix = cuda_binding::index_1d(call, indices, "sparse_indices", -1);
  PAGEDLLM_CHECK_ARG(ip.size(0) >= 1, "sparse_indptr must have num_lists + 1 >= 1 entries");
  k::BlockSparseParams sp;
  sp.indptr = static_cast<const int32_t*>(ip.data());
  sp.num_lists = python::to_i32(ip.size(0) - 1, "sparse lists");
  sp.indices = static_cast<const int32_t*>(ix.data());
  sp.num_indices = python::to_i32(ix.size(0), "sparse indices");
  return sp;
}

void decode_sparse(py::handle out, py::handle query, py::handle key_cache,
                   py::handle value_cache, py::handle block_tables, py::handle context_lens,
                   py::handle sparse_indptr, py::handle sparse_indices, double scale,
                   const std::string& kv_cache_dtype, double k_scale, double v_scale,
                   std::optional<uintptr_t> stream) {
  CudaCall call;
  k::AttentionParams p =
      cuda_binding::attention_params(call, out, query, key_cache, value_cache, block_tables,
                                     context_lens, scale, kv_cache_dtype, k_scale, v_scale);
  check_decode_rows(p.num_tokens, p.num_seqs);
  const k::BlockSparseParams sp = sparse_lists(call, sparse_indptr, sparse_indices);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::paged_attention_decode_sparse(p, sp, s);
}

void prefill_sparse(py::handle out, py::handle query, py::handle key_cache,
                    py::handle value_cache, py::handle block_tables, py::handle cu_seqlens_q,
                    py::handle context_lens, py::handle sparse_indptr, py::handle sparse_indices,
                    double scale, const std::string& kv_cache_dtype, double k_scale,
                    double v_scale, std::optional<uintptr_t> stream) {
  CudaCall call;
  k::AttentionParams p =
      cuda_binding::attention_params(call, out, query, key_cache, value_cache, block_tables,
                                     context_lens, scale, kv_cache_dtype, k_scale, v_scale);
  set_cu_seqlens_q(call, cu_seqlens_q, &p);
  const k::BlockSparseParams sp = sparse_lists(call, sparse_indptr, sparse_indices);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::paged_attention_prefill_sparse(p, sp, s);
}

void cross_attention(py::handle out, py::handle query, py::handle key_cache,
                     py::handle value_cache, py::handle block_tables, py::handle cu_seqlens_q,
                     py::handle context_lens, py::handle kv_ranges, double scale,
                     const std::string& kv_cache_dtype, double k_scale, double v_scale,
                     std::optional<uintptr_t> stream) {
  CudaCall call;
  k::AttentionParams p =
      cuda_binding::attention_params(call, out, query, key_cache, value_cache, block_tables,
                                     context_lens, scale, kv_cache_dtype, k_scale, v_scale);
  set_cu_seqlens_q(call, cu_seqlens_q, &p);
  const Tensor& kr = call.gpu(kv_ranges, "kv_ranges");
  check_kv_ranges(kr, p.num_tokens, /*on_cpu=*/false);
  const auto* ranges = static_cast<const int32_t*>(kr.data());
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::paged_cross_attention(p, ranges, s);
}

void copy_blocks(py::sequence caches, py::handle block_mapping, std::optional<uintptr_t> stream) {
  CudaCall call;
  std::vector<k::BlockPoolParams> pools;
  for (py::handle c : caches) pools.push_back(cuda_binding::block_pool(call.gpu(c, "caches[i]")));
  Placement where;
  const Tensor& m = call.any(block_mapping, "block_mapping", &where);
  k::CopyBlocksParams p;
  p.pools = pools.data();
  p.num_pools = static_cast<int32_t>(pools.size());
  if (pools.empty()) return;
  const cu::Stream s = to_stream(stream);
  if (where.on_host()) {
    const std::vector<int64_t> pairs = cuda_binding::host_pairs(m);
    p.pairs = pairs.data();
    p.num_pairs = static_cast<int32_t>(pairs.size() / 2);
    py::gil_scoped_release release;
    cu::DeviceScope scope(call.device());
    cu::copy_blocks(p, s);
    return;
  }
  m.require_ndim(2);
  PAGEDLLM_CHECK_ARG(m.size(1) == 2 && m.dtype() == DType::kInt64,
                     "a CUDA block_mapping must be int64 [num_pairs, 2], got " << m.describe());
  m.require_inner_contiguous(0);
  p.pairs = static_cast<const int64_t*>(m.data());
  p.num_pairs = python::to_i32(m.size(0), "num_pairs");
  py::gil_scoped_release release;
  cu::DeviceScope scope(call.device());
  cu::copy_blocks_device_pairs(p, s);
}

// Checks and converts swap_blocks' arguments; returns whether host memory takes part.
struct SwapArgs {
  k::SwapBlocksParams params;
  std::vector<int64_t> pairs;
  bool host_involved = false;
  bool pageable_host = false;
  int device = -1;
};
SwapArgs swap_args(CudaCall& call, py::handle src, py::handle dst, py::handle block_mapping) {
  Placement ps, pd, pm;
  const Tensor& s = call.any(src, "src", &ps);
  const Tensor& d = call.any(dst, "dst", &pd);
  const Tensor& m = call.any(block_mapping, "block_mapping", &pm);
  PAGEDLLM_CHECK_ARG(ps.on_gpu() || pd.on_gpu(),
                     "src and dst are both host memory: use pagedllm._core.swap_blocks");
  PAGEDLLM_CHECK_ARG(pm.on_host(), "block_mapping must be a CPU tensor (its pairs drive the "
                                   "copies from the host), got one on "
                                       << cuda_binding::placement_name(pm));
  PAGEDLLM_CHECK_ARG(s.dtype() == d.dtype(), "src is " << dtype_name(s.dtype()) << " but dst is "
                                                       << dtype_name(d.dtype()));
  SwapArgs a;
  a.params.src = cuda_binding::block_pool(s);
  a.params.dst = cuda_binding::block_pool(d);
  a.pairs = cuda_binding::host_pairs(m);
  a.params.pairs = a.pairs.data();
  a.params.num_pairs = static_cast<int32_t>(a.pairs.size() / 2);
  a.host_involved = ps.on_host() || pd.on_host();
  a.device = call.device();
  if (ps.on_host() && !cu::is_pinned_host(s.data())) a.pageable_host = true;
  if (pd.on_host() && !cu::is_pinned_host(d.data())) a.pageable_host = true;
  return a;
}

void swap_blocks(py::handle src, py::handle dst, py::handle block_mapping,
                 std::optional<uintptr_t> stream) {
  CudaCall call;
  SwapArgs a = swap_args(call, src, dst, block_mapping);
  const cu::Stream s = to_stream(stream);
  py::gil_scoped_release release;
  cu::DeviceScope scope(a.device);
  cu::swap_blocks(a.params, s);
  // Like the CPU kernel, return with the copies done when host memory takes part.
  if (a.host_involved) cu::synchronize_stream(s);
}

// Streams plus the Python objects that async swaps still read (kept until their ticket is done).
class PyStreams {
 public:
  // compute: a stream handle to borrow (0: the legacy default stream), or none: one is created.
  PyStreams(int device, std::optional<uintptr_t> compute)
      : streams_(compute ? std::make_unique<cu::Streams>(device,
                                                         reinterpret_cast<cu::Stream>(*compute))
                         : std::make_unique<cu::Streams>(device)) {}

  cu::Streams& get() { return *streams_; }

  uint64_t swap_async(py::object src, py::object dst, py::handle block_mapping, uint64_t after) {
    CudaCall call;
    SwapArgs a = swap_args(call, src, dst, block_mapping);
    PAGEDLLM_CHECK_ARG(a.device == streams_->device(),
                       "the tensors are on cuda:" << a.device << " but the streams on cuda:"
                                                  << streams_->device());
    PAGEDLLM_CHECK_ARG(!a.pageable_host,
                       "swap_blocks_async needs pinned host memory (allocate the host pool with "
                       "torch.empty(..., pin_memory=True)); pageable memory would block");
    uint64_t ticket = 0;
    {
      py::gil_scoped_release release;
      ticket = streams_->swap_blocks_async(a.params, after);
    }
    release_finished();
    keep_.emplace_back(ticket, py::make_tuple(src, dst));
    return ticket;
  }

  void release_finished() {
    std::vector<std::pair<uint64_t, py::object>> still;
    for (auto& [ticket, objs] : keep_) {
      if (!streams_->done(ticket)) still.emplace_back(ticket, std::move(objs));
    }
    keep_.swap(still);
  }

  size_t pending() const { return keep_.size(); }

 private:
  // Declared before streams_ so that it is destroyed after it: ~Streams waits for the queued
  // copies, and only then may the tensors they read and write be released.
  std::vector<std::pair<uint64_t, py::object>> keep_;
  std::unique_ptr<cu::Streams> streams_;
};

cu::Validation parse_validation(const std::string& mode) {
  if (mode == "sync") return cu::Validation::kSync;
  if (mode == "deferred") return cu::Validation::kDeferred;
  PAGEDLLM_CHECK_ARG(false, "validation mode must be 'sync' or 'deferred', got '" << mode << "'");
  return cu::Validation::kSync;
}

}  // namespace

void bind_cuda(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "cuda", "CUDA paged-attention kernels (same signatures as the CPU ones), streams, devices");
  const auto stream_arg = py::arg("stream") = py::none();
  m.def("reshape_and_cache", &reshape_and_cache, py::arg("key"), py::arg("value"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        py::kw_only(), stream_arg,
        "Writes key/value [num_tokens, num_kv_heads, head_dim] (CUDA) into their slots of the "
        "paged caches; slot -1 skips a token.");
  m.def("paged_attention_decode", &decode, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("kv_cache_dtype") = "auto",
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::kw_only(), stream_arg,
        "Attention of one query token per sequence over its paged context (CUDA); writes out.");
  m.def("paged_attention_prefill", &prefill, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("scale"),
        py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0,
        py::kw_only(), stream_arg,
        "Causal attention of packed new tokens over their sequences' paged context (CUDA).");
  m.def("paged_attention_decode_sparse", &decode_sparse, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("sparse_indptr"), py::arg("sparse_indices"),
        py::arg("scale"), py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0, py::kw_only(), stream_arg,
        "Decode attention over the CSR-listed logical blocks only (CUDA; lists on the GPU).");
  m.def("paged_attention_prefill_sparse", &prefill_sparse, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("sparse_indptr"),
        py::arg("sparse_indices"), py::arg("scale"), py::arg("kv_cache_dtype") = "auto",
        py::arg("k_scale") = 1.0, py::arg("v_scale") = 1.0, py::kw_only(), stream_arg,
        "Causal prefill over the CSR-listed logical blocks only (CUDA).");
  m.def("paged_cross_attention", &cross_attention, py::arg("out"), py::arg("query"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("block_tables"),
        py::arg("cu_seqlens_q"), py::arg("context_lens"), py::arg("kv_ranges"),
        py::arg("scale"), py::arg("kv_cache_dtype") = "auto", py::arg("k_scale") = 1.0,
        py::arg("v_scale") = 1.0, py::kw_only(), stream_arg,
        "Non-causal cross-attention (Mllama) over each token's key range kv_ranges[i] = "
        "(lo, hi) of its sequence's paged cross K/V (CUDA; empty range: zeros).");
  m.def("copy_blocks", &copy_blocks, py::arg("caches"), py::arg("block_mapping"), py::kw_only(),
        stream_arg,
        "Copies block src -> dst in every CUDA cache tensor; block_mapping is a CPU int [k, 2] "
        "tensor (checked) or a CUDA int64 one (ids range-checked on the GPU).");
  m.def("swap_blocks", &swap_blocks, py::arg("src"), py::arg("dst"), py::arg("block_mapping"),
        py::kw_only(), stream_arg,
        "Copies block src of `src` to block dst of `dst` (CUDA <-> CUDA or host); returns when "
        "the copies are done if host memory takes part. block_mapping is a CPU tensor.");

  m.def("device_count", &cu::device_count, "CUDA devices visible (0 without a driver or GPU).");
  m.def("device_name", &cu::device_name, py::arg("device") = 0, "Name of a device.");
  m.def(
      "mem_get_info",
      [](int device) {
        size_t free_bytes = 0, total = 0;
        cu::mem_get_info(device, &free_bytes, &total);
        return py::make_tuple(free_bytes, total);
      },
      py::arg("device") = 0, "(free, total) bytes of a device's memory.");
  m.def("compute_capability", &cu::compute_capability, py::arg("device") = 0,
        "Compute capability as major * 10 + minor (90 for H100 / H200).");
  m.def(
      "synchronize",
      [](int device) {
        py::gil_scoped_release release;
        cu::synchronize_device(device);
      },
      py::arg("device") = 0, "Waits for all work on a device.");
  m.def("attention_head_dims", [] { return std::vector<int>{64, 80, 96, 128, 256}; },
        "Head dims compiled into the CUDA attention kernels.");
  m.def(
      "set_validation", [](const std::string& mode) { cu::set_validation(parse_validation(mode)); },
      py::arg("mode"),
      "'sync' (default): each call waits and raises bad device-side values (block ids, "
      "lengths, slots) at once; 'deferred': nothing waits, check_errors() raises them later.");
  m.def(
      "get_validation",
      [] { return cu::validation() == cu::Validation::kSync ? "sync" : "deferred"; },
      "The validation mode.");
  m.def(
      "check_errors",
      [](int device) {
        require_gpu();
        py::gil_scoped_release release;
        cu::check_errors(device);
      },
      py::arg("device") = 0,
      "Waits for the device, then raises the first error a kernel recorded (and clears it).");
  m.def(
      "set_current_stream", [](uintptr_t handle) { t_current_stream = handle; },
      py::arg("handle"),
      "Sets this thread's stream for calls without `stream` (0: the legacy default stream).");
  m.def("current_stream", [] { return t_current_stream; }, "This thread's current stream.");

  py::class_<PyStreams>(m, "Streams",
                        "A compute stream and a (higher-priority, non-blocking) copy stream with "
                        "ticketed events ordering them; see pagedllm/cuda/streams.h.")
      .def(py::init([](int device, std::optional<uintptr_t> compute) {
             require_gpu();
             return std::make_unique<PyStreams>(device, compute);
           }),
           py::arg("device") = 0, py::arg("compute_stream") = py::none(),
           "compute_stream: an existing stream handle to borrow (torch's current stream, say; 0 is "
           "the legacy default stream); None creates one.")
      .def_property_readonly("device", [](PyStreams& s) { return s.get().device(); })
      .def_property_readonly(
          "compute_stream",
          [](PyStreams& s) { return reinterpret_cast<uintptr_t>(s.get().compute()); })
      .def_property_readonly(
          "copy_stream", [](PyStreams& s) { return reinterpret_cast<uintptr_t>(s.get().copy()); })
      .def_property_readonly("owns_compute", [](PyStreams& s) { return s.get().owns_compute(); })
      .def("record_compute", [](PyStreams& s) { return s.get().record_compute(); },
           "Ticket of the work queued so far on the compute stream.")
      .def("record_copy", [](PyStreams& s) { return s.get().record_copy(); },
           "Ticket of the work queued so far on the copy stream.")
      .def("compute_wait", [](PyStreams& s, uint64_t t) { s.get().compute_wait(t); },
           py::arg("ticket"), "The compute stream waits (on the device) for a ticket.")
      .def("copy_wait", [](PyStreams& s, uint64_t t) { s.get().copy_wait(t); },
           py::arg("ticket"), "The copy stream waits (on the device) for a ticket.")
      .def("done", [](PyStreams& s, uint64_t t) { return s.get().done(t); }, py::arg("ticket"),
           "Whether a ticket's work has finished (never blocks).")
      .def(
          "synchronize",
          [](PyStreams& s, uint64_t t) {
            {
              py::gil_scoped_release release;
              s.get().synchronize(t);
            }
            s.release_finished();
          },
          py::arg("ticket"), "Blocks until a ticket's work has finished.")
      .def(
          "synchronize_all",
          [](PyStreams& s) {
            {
              py::gil_scoped_release release;
              s.get().synchronize_all();
            }
            s.release_finished();
          },
          "Blocks until both streams are idle.")
      .def("swap_blocks_async", &PyStreams::swap_async, py::arg("src"), py::arg("dst"),
           py::arg("block_mapping"), py::arg("after") = 0,
           "Queues swap_blocks on the copy stream after ticket `after`; returns its ticket. Host "
           "memory must be pinned; src and dst are kept alive until the copies finish.")
      .def_property_readonly("pending_swaps", &PyStreams::pending,
                             "Async swaps whose tensors are still held.")
      .def_property_readonly("live_events", [](PyStreams& s) { return s.get().live_events(); });
}

}  // namespace pagedllm::python
