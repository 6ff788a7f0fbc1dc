#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "../cuda_check.h"
#include "dtypes.cuh"
#include "host_checks.h"
#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda {

bool attention_head_dim_supported(int hd) {
  return hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256;
}

namespace detail {
namespace {

void check_scale(float v, const char* name) {
  PAGEDLLM_CHECK_ARG(std::isfinite(v) && v > 0.0f, name << " must be finite and > 0, got " << v);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void check_cache(const kernels::KVCacheParams& c) {
  PAGEDLLM_CHECK_ARG(c.num_blocks >= 0, "num_blocks must be >= 0, got " << c.num_blocks);
  PAGEDLLM_CHECK_ARG(c.num_kv_heads >= 1, "num_kv_heads must be >= 1, got " << c.num_kv_heads);
  PAGEDLLM_CHECK_ARG(c.block_size >= 1 && c.block_size <= 256,
                     "block_size must be in [1, 256], got " << c.block_size);
  PAGEDLLM_CHECK_ARG(c.head_dim >= 8 && c.head_dim <= 512 && c.head_dim % 8 == 0,
                     "head_dim must be a multiple of 8 in [8, 512], got " << c.head_dim);
  PAGEDLLM_CHECK_ARG(c.num_blocks == 0 || (c.key_cache && c.value_cache), "cache data is null");
  check_scale(c.k_scale, "k_scale");
  check_scale(c.v_scale, "v_scale");
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
  const int32_t kvh = p.cache.num_kv_heads;
  PAGEDLLM_CHECK_ARG(p.num_heads >= 1 && p.num_heads % kvh == 0,
                     "num_heads (" << p.num_heads << ") must be a positive multiple of num_kv_heads ("
                                   << kvh << ")");
  PAGEDLLM_CHECK_ARG(p.num_heads <= 65535, "num_heads " << p.num_heads
                                                      << " exceeds the CUDA grid limit 65535");
  PAGEDLLM_CHECK_ARG(std::isfinite(p.scale), "scale must be finite, got " << p.scale);
  PAGEDLLM_CHECK_ARG(p.num_seqs >= 0 && p.num_tokens >= 0, "negative num_seqs or num_tokens");
  PAGEDLLM_CHECK_ARG(p.max_blocks_per_seq >= 0, "max_blocks_per_seq must be >= 0");
  PAGEDLLM_CHECK_ARG(static_cast<int64_t>(p.max_blocks_per_seq) * p.cache.block_size <= INT32_MAX,
                     "max_blocks_per_seq * block_size does not fit in int32");
  if (!prefill) {
    PAGEDLLM_CHECK_ARG(p.num_tokens == p.num_seqs, "decode takes one query per sequence: "
                                                       << p.num_tokens << " queries for "
                                                       << p.num_seqs << " sequences");
  } else {
    PAGEDLLM_CHECK_ARG(p.cu_seqlens_q != nullptr, "prefill needs cu_seqlens_q");
  }
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
