// cuda_tensors.h — turning the Python arguments of pagedllm._core.cuda into the kernels' params
// structs, with every check the CPU bindings make (shapes, dtypes, layouts, kv_cache_dtype)
// plus the placement checks of the GPU: each tensor's device comes from __dlpack_device__()
// before it is borrowed, and all of one call's tensors must be on one CUDA device.
// Tensors are borrowed through dlpack_tensor.h (zero-copy); the params hold raw device pointers
// that stay valid while the CudaCall that made them lives.
// Thread-safety: build and destroy with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "dlpack_tensor.h"
#include "pagedllm/kernels/params.h"

namespace pagedllm::python::cuda_binding {

// Where a tensor lives, from its __dlpack_device__().
struct Placement {
  int32_t type = 0;  // dlpack::kDLCPU, kDLCUDA, kDLCUDAHost, ...
  int32_t id = 0;
  bool on_gpu() const { return type == dlpack::kDLCUDA; }
  bool on_host() const { return type == dlpack::kDLCPU || type == dlpack::kDLCUDAHost; }
};

// "cpu", "cuda:1", "cuda_host", ...
std::string placement_name(const Placement& p);

// The borrowed tensors of one call and the CUDA device they share.
class CudaCall {
 public:
  // Borrows `obj`, which must be a CUDA tensor on the call's device (the first one sets it).
  const Tensor& gpu(pybind11::handle obj, const char* name);
  // Borrows `obj`, which may be a CUDA tensor (on the call's device) or host memory.
  const Tensor& any(pybind11::handle obj, const char* name, Placement* where);
  // The device of the call's CUDA tensors (-1 when none was borrowed yet).
  int device() const { return device_; }

 private:
  // Checks a CUDA tensor against the call's device (the first one sets it), then borrows it.
  const Tensor& borrow(pybind11::handle obj, const char* name, const Placement& p);

  std::deque<Tensor> tensors_;  // deque: references stay valid as it grows
  int device_ = -1;
};

// Shared part of decode / prefill params (shapes checked; ids and lengths checked on the GPU).
kernels::AttentionParams attention_params(CudaCall& call, pybind11::handle out,
                                          pybind11::handle query, pybind11::handle key_cache,
                                          pybind11::handle value_cache,
                                          pybind11::handle block_tables,
                                          pybind11::handle context_lens, double scale,
                                          const std::string& kv_cache_dtype, double k_scale,
                                          double v_scale);

// A 1-D contiguous int32 array of n elements (n < 0: any length) on the call's device.
const Tensor& index_1d(CudaCall& call, pybind11::handle obj, const char* name, int64_t n);

// A tensor whose first dim is blocks and whose other dims are contiguous.
kernels::BlockPoolParams block_pool(const Tensor& t);

// [k, 2] int32 / int64 (src, dst) pairs of a host tensor, as int64.
std::vector<int64_t> host_pairs(const Tensor& t);

}  // namespace pagedllm::python::cuda_binding
