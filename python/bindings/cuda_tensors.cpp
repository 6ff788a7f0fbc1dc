#include "cuda_tensors.h"

#include "kernel_args.h"

#include <limits>

#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python::cuda_binding {
namespace {

Placement placement_of(py::handle obj, const char* name) {
  PAGEDLLM_CHECK_ARG(py::hasattr(obj, "__dlpack_device__"),
                     name << " must be a torch.Tensor (an object with __dlpack__), got "
                          << std::string(py::str(py::type::of(obj).attr("__name__"))));
  const py::tuple dev = obj.attr("__dlpack_device__")();
  Placement p;
  p.type = dev[0].cast<int32_t>();
  p.id = dev[1].cast<int32_t>();
  return p;
}

}  // namespace

std::string placement_name(const Placement& p) {
  switch (p.type) {
    case dlpack::kDLCPU: return "cpu";
    case dlpack::kDLCUDA: return "cuda:" + std::to_string(p.id);
    case dlpack::kDLCUDAHost: return "cuda_host (pinned cpu)";
    default: return "DLPack device type " + std::to_string(p.type);
  }
}

const Tensor& CudaCall::gpu(py::handle obj, const char* name) {
  const Placement p = placement_of(obj, name);
  PAGEDLLM_CHECK_ARG(p.on_gpu(), name << " is on " << placement_name(p)
                                      << "; pagedllm._core.cuda takes CUDA tensors (use "
                                         "pagedllm._core for CPU tensors, or pagedllm.ops to "
                                         "choose by device)");
  return borrow(obj, name, p);
}

const Tensor& CudaCall::any(py::handle obj, const char* name, Placement* where) {
  const Placement p = placement_of(obj, name);
  PAGEDLLM_CHECK_ARG(p.on_gpu() || p.on_host(),
                     name << " is on " << placement_name(p) << "; expected CUDA or CPU memory");
  *where = p;
  return borrow(obj, name, p);
}

const Tensor& CudaCall::borrow(py::handle obj, const char* name, const Placement& p) {
  if (p.on_gpu()) {
    if (device_ < 0) device_ = p.id;
    PAGEDLLM_CHECK_ARG(p.id == device_, name << " is on cuda:" << p.id
                                             << " but the call's other tensors are on cuda:"
                                             << device_);
  }
  tensors_.emplace_back(obj, name);
  return tensors_.back();
}

const Tensor& index_1d(CudaCall& call, py::handle obj, const char* name, int64_t n) {
  const Tensor& t = call.gpu(obj, name);
  python::check_index_1d(t, n, /*on_cpu=*/false);
  return t;
}

k::AttentionParams attention_params(CudaCall& call, py::handle out_obj, py::handle query,
                                    py::handle key_cache, py::handle value_cache,
                                    py::handle block_tables, py::handle context_lens,
                                    double scale, const std::string& kv_cache_dtype,
                                    double k_scale, double v_scale) {
  // Placement first (every tensor on the call's CUDA device), then the CPU bindings' rules.
  const Tensor& out = call.gpu(out_obj, "out");
  const Tensor& q = call.gpu(query, "query");
  const Tensor& kc = call.gpu(key_cache, "key_cache");
  const Tensor& vc = call.gpu(value_cache, "value_cache");
  const Tensor& tables = call.gpu(block_tables, "block_tables");
  const Tensor& lens = call.gpu(context_lens, "context_lens");
  return python::attention_params(out, q, kc, vc, tables, lens, scale, kv_cache_dtype, k_scale,
                                  v_scale, /*on_cpu=*/false);
}

k::BlockPoolParams block_pool(const Tensor& t) {
  return python::block_pool(t, /*on_cpu=*/false);
}

std::vector<int64_t> host_pairs(const Tensor& t) { return python::block_pairs(t, /*on_cpu=*/false); }

}  // namespace pagedllm::python::cuda_binding
