// pagedllm/cuda/runtime.h — what the CUDA runtime reports, usable without a GPU or driver.
// Thread-safety: safe from any thread.
#pragma once

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

}  // namespace pagedllm::cuda
