// copy_blocks (copy-on-write inside each pool) and swap_blocks (between pools, across the
// host/device boundary). copy_blocks is one kernel, a thread block per (pair, pool), copying
// 16 bytes per thread when the pool allows it; swap_blocks is one cudaMemcpyAsync per run of
// consecutive blocks (a run is one copy when both pools store their blocks back to back).
#include <cstring>
#include <vector>

#include "../cuda_check.h"
#include "../device_error.h"
#include "../workspace.h"
#include "pagedllm/cuda/kernels.h"
#include "validate.h"

namespace pagedllm::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    copy_blocks_kernel(const kernels::BlockPoolParams* pools, const int64_t* pairs,
                       int num_pairs, DeviceError* err) {
  const int pair = blockIdx.x;
  const kernels::BlockPoolParams pool = pools[blockIdx.y];
  const int64_t src = pairs[2 * pair], dst = pairs[2 * pair + 1];
  if (src < 0 || src >= pool.num_blocks || dst < 0 || dst >= pool.num_blocks) {
    if (threadIdx.x == 0) {
      const bool bad_src = src < 0 || src >= pool.num_blocks;
      report_error(err, kErrPairId, kKernelCopyBlocks, pair, bad_src ? 0 : 1, bad_src ? src : dst,
                   pool.num_blocks);
    }
    return;
  }
  const char* s = static_cast<const char*>(pool.data) + src * pool.block_stride_bytes;
  char* d = static_cast<char*>(pool.data) + dst * pool.block_stride_bytes;
  if (s == d) return;
  const bool vec = ((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) |
                     static_cast<uintptr_t>(pool.block_bytes)) & 15u) == 0;
  if (vec) {
    const int64_t n = pool.block_bytes / 16;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < pool.block_bytes; i += kThreads) d[i] = s[i];
  }
}

// Uploads pools (and, when given, host pairs) to the stream's workspace and launches.
void launch_copy(const kernels::CopyBlocksParams& p, const int64_t* device_pairs, Stream stream) {
  const size_t pool_bytes = align256(sizeof(kernels::BlockPoolParams) * p.num_pools);
  const size_t pair_bytes = device_pairs ? 0 : sizeof(int64_t) * 2 * p.num_pairs;
  std::vector<uint8_t> staging(pool_bytes + pair_bytes);
  std::memcpy(staging.data(), p.pools, sizeof(kernels::BlockPoolParams) * p.num_pools);
  if (!device_pairs) std::memcpy(staging.data() + pool_bytes, p.pairs, pair_bytes);
  auto* ws = static_cast<uint8_t*>(workspace(stream, staging.size()));
  // Pageable source: the call returns once the bytes are staged, so `staging` may go.
  PAGEDLLM_CUDA_CHECK(
      cudaMemcpyAsync(ws, staging.data(), staging.size(), cudaMemcpyHostToDevice, stream));
  const auto* pools = reinterpret_cast<const kernels::BlockPoolParams*>(ws);
  const auto* pairs =
      device_pairs ? device_pairs : reinterpret_cast<const int64_t*>(ws + pool_bytes);
  copy_blocks_kernel<<<dim3(p.num_pairs, p.num_pools), kThreads, 0, stream>>>(
      pools, pairs, p.num_pairs, error_record());
  PAGEDLLM_CUDA_CHECK_LAUNCH("copy_blocks kernel");
}

}  // namespace
}  // namespace detail

void copy_blocks(const kernels::CopyBlocksParams& p, Stream stream) {
  using namespace detail;
  kernels::validate_copy_blocks(p);  // pairs are in host memory: every id is checked here
  if (p.num_pairs == 0 || p.num_pools == 0) return;
  launch_copy(p, nullptr, stream);
  finish_call(stream);
}

void copy_blocks_device_pairs(const kernels::CopyBlocksParams& p, Stream stream) {
  using namespace detail;
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0 && p.num_pools >= 0, "negative sizes");
  for (int32_t i = 0; i < p.num_pools; ++i) kernels::validate_block_pool(p.pools[i], "caches");
  if (p.num_pairs == 0 || p.num_pools == 0) return;
  launch_copy(p, p.pairs, stream);
  finish_call(stream);
}

void swap_blocks(const kernels::SwapBlocksParams& p, Stream stream) {
  kernels::validate_swap_blocks(p);
  const int64_t bytes = p.src.block_bytes;
  const bool src_dense = p.src.block_stride_bytes == bytes;
  const bool dst_dense = p.dst.block_stride_bytes == bytes;
  for (int32_t i = 0; i < p.num_pairs;) {
    const int64_t s = p.pairs[2 * i], d = p.pairs[2 * i + 1];
    int32_t run = 1;  // pairs (s + k, d + k) that can go in one copy
    while (src_dense && dst_dense && i + run < p.num_pairs && p.pairs[2 * (i + run)] == s + run &&
           p.pairs[2 * (i + run) + 1] == d + run) {
      ++run;
    }
    const char* from = static_cast<const char*>(p.src.data) + s * p.src.block_stride_bytes;
    char* to = static_cast<char*>(p.dst.data) + d * p.dst.block_stride_bytes;
    PAGEDLLM_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes) * run,
                                        cudaMemcpyDefault, stream));
    i += run;
  }
}

}  // namespace pagedllm::cuda
