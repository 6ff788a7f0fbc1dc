// reshape_and_cache: each new token's key/value rows (one per KV head) go to their slot,
// converted to the cache's storage type. Tokens are independent: the pool takes groups of them.
#include <algorithm>
#include <cstring>

#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

constexpr int kTokensPerTask = 16;

// Whether a row can be copied byte for byte (same type, no scale).
bool same_type(ScalarType s, CacheType c) {
  return (s == ScalarType::kFloat32 && c == CacheType::kFloat32) ||
         (s == ScalarType::kFloat16 && c == CacheType::kFloat16) ||
         (s == ScalarType::kBFloat16 && c == CacheType::kBFloat16);
}

// Writes one row of head_dim elements, divided by `scale` (1 unless fp8) when converting.
void write_row(const char* src, ScalarType st, char* dst, CacheType ct, int hd, float scale,
               bool copy) {
  if (copy) {
    std::memcpy(dst, src, static_cast<size_t>(hd) * element_size(st));
    return;
  }
  for (int d = 0; d < hd; ++d) store_cache_scalar(dst, ct, d, load_scalar(src, st, d) / scale);
}

}  // namespace

void reshape_and_cache(const ReshapeAndCacheParams& p) {
  validate_reshape_and_cache(p);
  const KVCacheParams& c = p.cache;
  const int hd = c.head_dim;
  const int ses = element_size(p.dtype);
  const int ces = element_size(c.dtype);
  const bool fp8 = c.dtype == CacheType::kFp8E4M3 || c.dtype == CacheType::kFp8E5M2;
  const float k_div = fp8 ? c.k_scale : 1.0f;
  const float v_div = fp8 ? c.v_scale : 1.0f;
  const bool copy = same_type(p.dtype, c.dtype);
  const int64_t head_elems = static_cast<int64_t>(c.block_size) * hd;
  const int64_t tasks = (p.num_tokens + kTokensPerTask - 1) / kTokensPerTask;
  parallel_for(tasks, [&](int64_t task, int) {
    const int64_t end = std::min<int64_t>(p.num_tokens, (task + 1) * kTokensPerTask);
    for (int64_t t = task * kTokensPerTask; t < end; ++t) {
      const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[t]
                                                : static_cast<const int32_t*>(p.slot_mapping)[t];
      if (slot < 0) continue;  // padding
      const int64_t block = slot / c.block_size;
      const int64_t offset = slot % c.block_size;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const int64_t cache_off = h * head_elems + offset * hd;
        const auto* k = static_cast<const char*>(p.key) +
                        (t * p.key_token_stride + h * p.key_head_stride) * ses;
        const auto* v = static_cast<const char*>(p.value) +
                        (t * p.value_token_stride + h * p.value_head_stride) * ses;
        char* kd = static_cast<char*>(c.key_cache) + (block * c.key_block_stride + cache_off) * ces;
        char* vd =
            static_cast<char*>(c.value_cache) + (block * c.value_block_stride + cache_off) * ces;
        write_row(k, p.dtype, kd, c.dtype, hd, k_div, copy);
        write_row(v, p.dtype, vd, c.dtype, hd, v_div, copy);
      }
    }
  });
}

}  // namespace pagedllm::kernels
