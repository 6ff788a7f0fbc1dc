// copy_blocks (copy-on-write inside each pool) and swap_blocks (between two pools): whole-block
// memcpy, pairs spread over the thread pool.
#include <cstring>

#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

void copy_block(const BlockPoolParams& from, int64_t src, const BlockPoolParams& to, int64_t dst) {
  const auto* s = static_cast<const char*>(from.data) + src * from.block_stride_bytes;
  auto* d = static_cast<char*>(to.data) + dst * to.block_stride_bytes;
  if (s != d) std::memcpy(d, s, static_cast<size_t>(from.block_bytes));
}

}  // namespace

void copy_blocks(const CopyBlocksParams& p) {
  validate_copy_blocks(p);
  const int64_t n = static_cast<int64_t>(p.num_pools) * p.num_pairs;
  parallel_for(n, [&](int64_t i, int) {
    const BlockPoolParams& pool = p.pools[i / p.num_pairs];
    const int64_t pair = i % p.num_pairs;
    copy_block(pool, p.pairs[2 * pair], pool, p.pairs[2 * pair + 1]);
  });
}

void swap_blocks(const SwapBlocksParams& p) {
  validate_swap_blocks(p);
  parallel_for(p.num_pairs, [&](int64_t i, int) {
    copy_block(p.src, p.pairs[2 * i], p.dst, p.pairs[2 * i + 1]);
  });
}

}  // namespace pagedllm::kernels
