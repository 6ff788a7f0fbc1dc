#include <map>
#include <mutex>
#include <utility>

#include "cuda_check.h"
#include "workspace.h"

namespace pagedllm::cuda::detail {
namespace {

struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
};

std::mutex g_mutex;
std::map<std::pair<int, Stream>, Buffer> g_buffers;

}  // namespace

void* workspace(Stream stream, size_t bytes) {
  int device = 0;
  PAGEDLLM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  Buffer& b = g_buffers[{device, stream}];
  if (b.bytes >= bytes) return b.data;
  size_t grown = b.bytes ? b.bytes : (1 << 20);
  while (grown < bytes) grown *= 2;
  if (b.data) {
    PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier work may still read it
    PAGEDLLM_CUDA_CHECK(cudaFree(b.data));
    b = Buffer{};
  }
  PAGEDLLM_CUDA_CHECK(cudaMalloc(&b.data, grown));
  b.bytes = grown;
  return b.data;
}

}  // namespace pagedllm::cuda::detail
