// pagedllm/cuda/runtime.h — what the CUDA runtime reports, usable without a GPU or driver.
// Thread-safety: safe from any thread.
#pragma once

#include <cstddef>
#include <string>

namespace pagedllm::cuda {

// Number of CUDA devices visible now; 0 when there is no driver or no device (never throws).
int device_count();
// Name of device `index` ("" when it cannot be queried).
std::string device_name(int index);
// CUDA runtime version this module was compiled against, e.g. "13.0".
std::string runtime_version();
// Driver version of this machine, e.g. "13.0", or "" when no driver is present.
std::string driver_version();
// Free and total bytes of device `index` (throws pagedllm::Error when it cannot be queried).
void mem_get_info(int index, size_t* free_bytes, size_t* total_bytes);
// Compute capability of device `index` as major * 10 + minor (throws when unavailable).
int compute_capability(int index);
// Blocks until all work on device `index` has finished (throws on a CUDA error).
void synchronize_device(int index);
// Whether `ptr` is host memory the GPU can reach directly (pinned or registered); false for
// pageable memory and device memory, and when no device is present.
bool is_pinned_host(const void* ptr);

// Makes `device` the calling thread's current CUDA device for a scope (throws without one).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace pagedllm::cuda
