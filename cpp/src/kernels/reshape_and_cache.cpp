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

// One row of head_dim elements, converted, divided by `scale` (1 unless fp8). The types are
// template constants so the per-element switches of convert.h fold away.
template <ScalarType S, CacheType C>
void convert_row(const char* src, char* dst, int hd, float scale) {
  for (int d = 0; d < hd; ++d) store_cache_scalar(dst, C, d, load_scalar(src, S, d) / scale);
}

using RowWriter = void (*)(const char* src, char* dst, int hd, float scale);

template <ScalarType S>
RowWriter row_writer_for(CacheType c) {
  switch (c) {
    case CacheType::kFloat32: return &convert_row<S, CacheType::kFloat32>;
    case CacheType::kFloat16: return &convert_row<S, CacheType::kFloat16>;
    case CacheType::kBFloat16: return &convert_row<S, CacheType::kBFloat16>;
    case CacheType::kFp8E4M3: return &convert_row<S, CacheType::kFp8E4M3>;
    case CacheType::kFp8E5M2: return &convert_row<S, CacheType::kFp8E5M2>;
  }
  return nullptr;
}

void copy_row(const char* src, char* dst, int hd, float /*scale*/) {
  std::memcpy(dst, src, static_cast<size_t>(hd) * 4);
}
void copy_row16(const char* src, char* dst, int hd, float /*scale*/) {
  std::memcpy(dst, src, static_cast<size_t>(hd) * 2);
}

// The row writer for activations of type s into a cache of type c (a copy when they match).
RowWriter row_writer(ScalarType s, CacheType c) {
  if (same_type(s, c)) return s == ScalarType::kFloat32 ? &copy_row : &copy_row16;
  switch (s) {
    case ScalarType::kFloat32: return row_writer_for<ScalarType::kFloat32>(c);
    case ScalarType::kFloat16: return row_writer_for<ScalarType::kFloat16>(c);
    case ScalarType::kBFloat16: return row_writer_for<ScalarType::kBFloat16>(c);
  }
  return nullptr;
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
  const RowWriter write_row = row_writer(p.dtype, c.dtype);
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
        write_row(k, kd, hd, k_div);
        write_row(v, vd, hd, v_div);
      }
    }
  });
}

}  // namespace pagedllm::kernels
