// device_guard.h (internal) — makes a device current for a scope and restores the previous one.
// Thread-safety: the current device is per host thread, as in CUDA.
#pragma once

#include <cuda_runtime.h>

#include "cuda_check.h"

namespace pagedllm::cuda::detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    PAGEDLLM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) PAGEDLLM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace pagedllm::cuda::detail
