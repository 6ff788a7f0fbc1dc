// copy_blocks (copy-on-write inside each pool) and swap_blocks (between pools, across the
// host/device boundary). copy_blocks is one kernel, a thread block per (pair, pool), copying
// 16 bytes per thread when the pool allows it; swap_blocks is one cudaMemcpyAsync per run of
// consecutive blocks (a run is one copy when both pools store their blocks back to back).
#include <cstring>
#include <unordered_set>
#include <vector>

#include "../cuda_check.h"
#include "../device_error.h"
#include "../workspace.h"
#include "pagedllm/cuda/kernels.h"

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

void check_pool(const kernels::BlockPoolParams& b, const char* name) {
  PAGEDLLM_CHECK_ARG(b.num_blocks >= 0, name << ": num_blocks must be >= 0, got " << b.num_blocks);
  PAGEDLLM_CHECK_ARG(b.block_bytes > 0, name << ": a block must hold at least one byte");
  PAGEDLLM_CHECK_ARG(b.data != nullptr || b.num_blocks == 0, name << ": data is null");
}

void check_pair_ids(const int64_t* pairs, int32_t n, int which, int32_t limit, const char* name) {
  for (int32_t i = 0; i < n; ++i) {
    const int64_t id = pairs[2 * i + which];
    PAGEDLLM_CHECK_INDEX(id >= 0 && id < limit, "block_mapping[" << i << "][" << which << "] = "
                                                    << id << " is outside " << name
                                                    << " blocks [0, " << limit << ")");
  }
}

void check_unique_dst(const int64_t* pairs, int32_t n, bool dst_not_src) {
  std::unordered_set<int64_t> dst;
  for (int32_t i = 0; i < n; ++i) {
    PAGEDLLM_CHECK_ARG(dst.insert(pairs[2 * i + 1]).second,
                       "block_mapping: destination block " << pairs[2 * i + 1] << " appears twice");
  }
  if (!dst_not_src) return;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t src = pairs[2 * i];
    PAGEDLLM_CHECK_ARG(src == pairs[2 * i + 1] || dst.count(src) == 0,
                       "block_mapping: block " << src << " is both a source and a destination");
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
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0 && p.num_pools >= 0, "negative sizes");
  for (int32_t i = 0; i < p.num_pools; ++i) {
    check_pool(p.pools[i], "caches");
    check_pair_ids(p.pairs, p.num_pairs, 0, p.pools[i].num_blocks, "the cache's");
    check_pair_ids(p.pairs, p.num_pairs, 1, p.pools[i].num_blocks, "the cache's");
  }
  check_unique_dst(p.pairs, p.num_pairs, /*dst_not_src=*/true);
  if (p.num_pairs == 0 || p.num_pools == 0) return;
  launch_copy(p, nullptr, stream);
  finish_call(stream);
}

void copy_blocks_device_pairs(const kernels::CopyBlocksParams& p, Stream stream) {
  using namespace detail;
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0 && p.num_pools >= 0, "negative sizes");
  for (int32_t i = 0; i < p.num_pools; ++i) check_pool(p.pools[i], "caches");
  if (p.num_pairs == 0 || p.num_pools == 0) return;
  launch_copy(p, p.pairs, stream);
  finish_call(stream);
}

void swap_blocks(const kernels::SwapBlocksParams& p, Stream stream) {
  using namespace detail;
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0, "negative number of pairs");
  check_pool(p.src, "src");
  check_pool(p.dst, "dst");
  PAGEDLLM_CHECK_ARG(p.src.block_bytes == p.dst.block_bytes,
                     "src blocks hold " << p.src.block_bytes << " bytes but dst blocks hold "
                                        << p.dst.block_bytes);
  check_pair_ids(p.pairs, p.num_pairs, 0, p.src.num_blocks, "src");
  check_pair_ids(p.pairs, p.num_pairs, 1, p.dst.num_blocks, "dst");
  check_unique_dst(p.pairs, p.num_pairs, /*dst_not_src=*/false);
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
