#include <cuda_runtime.h>

#include <string>

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

}  // namespace pagedllm::cuda
