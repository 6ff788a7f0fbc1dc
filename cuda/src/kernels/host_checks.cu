#include <cstdint>
#include <mutex>
#include <vector>

#include "../cuda_check.h"
#include "dtypes.cuh"
#include "host_checks.h"
#include "validate.h"
#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda {

bool attention_head_dim_supported(int hd) {
  return hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256;
}

namespace detail {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void check_cache(const kernels::KVCacheParams& c) {
  kernels::validate_cache(c);  // the CPU kernels' checks; then what the CUDA loads need
  const int es = cache_bytes(c.dtype);
  PAGEDLLM_CHECK_ARG(aligned16(c.key_cache) && aligned16(c.value_cache),
                     "the CUDA kernels need 16-byte aligned key_cache and value_cache data");
  PAGEDLLM_CHECK_ARG((c.key_block_stride * es) % 16 == 0 && (c.value_block_stride * es) % 16 == 0,
                     "the CUDA kernels need block strides that are multiples of 16 bytes (got "
                         << c.key_block_stride * es << " and " << c.value_block_stride * es
                         << ")");
}

void check_attention(const kernels::AttentionParams& p, bool prefill) {
  check_cache(p.cache);
  PAGEDLLM_CHECK_ARG(attention_head_dim_supported(p.cache.head_dim),
                     "head_dim " << p.cache.head_dim
                                 << " is not compiled into the CUDA attention kernels "
                                    "(supported: 64, 80, 96, 128, 256)");
  kernels::validate_attention_sizes(p, prefill);
  PAGEDLLM_CHECK_ARG(p.num_heads <= 65535, "num_heads " << p.num_heads
                                                      << " exceeds the CUDA grid limit 65535");
  PAGEDLLM_CHECK_ARG(static_cast<int64_t>(p.max_blocks_per_seq) * p.cache.block_size <= INT32_MAX,
                     "max_blocks_per_seq * block_size does not fit in int32");
  PAGEDLLM_CHECK_ARG(p.num_seqs == 0 || (p.block_tables && p.context_lens),
                     "block_tables / context_lens are null");
}

int multiprocessor_count() {
  static std::mutex mutex;
  static std::vector<int> counts;
  int device = 0;
  PAGEDLLM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(counts.size()) <= device) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    PAGEDLLM_CUDA_CHECK(
        cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return counts[device];
}

}  // namespace detail
}  // namespace pagedllm::cuda
