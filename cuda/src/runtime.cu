#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "device_guard.h"
#include "pagedllm/cuda/kernels.h"
#include "pagedllm/cuda/runtime.h"

namespace pagedllm::cuda {
namespace {

std::string format_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}

std::string runtime_version() { return format_version(CUDART_VERSION); }

std::string driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess || v == 0) {
    cudaGetLastError();
    return "";
  }
  return format_version(v);
}

namespace {

void require_device(int index) {
  const int n = device_count();
  PAGEDLLM_CHECK_STATE(n > 0, "no CUDA device is available (no driver or no GPU)");
  PAGEDLLM_CHECK_ARG(index >= 0 && index < n,
                     "device " << index << " does not exist (" << n << " CUDA devices)");
}

}  // namespace

void mem_get_info(int index, size_t* free_bytes, size_t* total_bytes) {
  require_device(index);
  detail::DeviceGuard guard(index);
  PAGEDLLM_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

int compute_capability(int index) {
  require_device(index);
  int major = 0, minor = 0;
  PAGEDLLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  PAGEDLLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  return major * 10 + minor;
}

void synchronize_device(int index) {
  require_device(index);
  detail::DeviceGuard guard(index);
  PAGEDLLM_CUDA_CHECK(cudaDeviceSynchronize());
}

bool is_pinned_host(const void* ptr) {
  if (device_count() == 0 || ptr == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void synchronize_stream(Stream stream) { PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(stream)); }

DeviceScope::DeviceScope(int device) {
  require_device(device);
  PAGEDLLM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    PAGEDLLM_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (changed_) cudaSetDevice(previous_);
}

}  // namespace pagedllm::cuda
