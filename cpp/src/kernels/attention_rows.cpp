// The row helpers of the attention drivers (attention_rows.h).
#include "attention_rows.h"

#include <cmath>

#include "pagedllm/kernels/convert.h"

namespace pagedllm::kernels {

void AttentionScratch::resize(int rows, int hd) {
  q.resize(static_cast<size_t>(rows) * hd);
  acc.assign(static_cast<size_t>(rows) * hd, 0.0f);
  row_max.assign(static_cast<size_t>(rows), -INFINITY);
  row_sum.assign(static_cast<size_t>(rows), 0.0f);
  limit.resize(static_cast<size_t>(rows));
  start.resize(static_cast<size_t>(rows));
  next_limit.resize(static_cast<size_t>(rows));
}

AttentionScratch& thread_scratch() {
  thread_local AttentionScratch scratch;
  return scratch;
}

bool is_fp8(CacheType t) { return t == CacheType::kFp8E4M3 || t == CacheType::kFp8E5M2; }

// dst[0, hd) = src[0, hd) * mul as float32 (the type switch outside the loop, so the common
// float32 / bfloat16 loops vectorise).
static void load_row(const void* src, ScalarType t, int hd, float mul, float* dst) {
  switch (t) {
    case ScalarType::kFloat32: {
      const auto* s = static_cast<const float*>(src);
      for (int d = 0; d < hd; ++d) dst[d] = s[d] * mul;
      return;
    }
    case ScalarType::kBFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int d = 0; d < hd; ++d) dst[d] = bf16_to_float(s[d]) * mul;
      return;
    }
    case ScalarType::kFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int d = 0; d < hd; ++d) dst[d] = half_to_float(s[d]) * mul;
      return;
    }
  }
}

// dst[0, hd) = src[0, hd) * mul in the activation type (round to nearest even).
static void store_row(const float* src, float mul, int hd, void* dst, ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32: {
      auto* o = static_cast<float*>(dst);
      for (int d = 0; d < hd; ++d) o[d] = src[d] * mul;
      return;
    }
    case ScalarType::kBFloat16: {
      auto* o = static_cast<uint16_t*>(dst);
      for (int d = 0; d < hd; ++d) o[d] = float_to_bf16(src[d] * mul);
      return;
    }
    case ScalarType::kFloat16: {
      auto* o = static_cast<uint16_t*>(dst);
      for (int d = 0; d < hd; ++d) o[d] = float_to_half(src[d] * mul);
      return;
    }
  }
}

// q rows of heads [head0, head0 + count) of query token `token`, times `mul`, as float32.
void load_query(const AttentionParams& p, int token, int head0, int count, float mul, float* dst) {
  const int hd = p.cache.head_dim;
  const int es = element_size(p.dtype);
  for (int g = 0; g < count; ++g) {
    const auto* src = static_cast<const char*>(p.query) +
                      (token * p.query_token_stride + (head0 + g) * p.query_head_stride) * es;
    load_row(src, p.dtype, hd, mul, dst + g * hd);
  }
}

// out[token, head] = acc * mul.
void store_out(const AttentionParams& p, int token, int head, const float* acc, float mul) {
  auto* dst = static_cast<char*>(p.out) +
              (token * p.out_token_stride + head * p.out_head_stride) * element_size(p.dtype);
  store_row(acc, mul, p.cache.head_dim, dst, p.dtype);
}

// The engine task for `rows` query rows of KV head `kvh` of sequence `seq`.
AttendTask make_task(const AttentionParams& p, int seq, int kvh, const float* q, int rows) {
  const KVCacheParams& c = p.cache;
  const int es = element_size(c.dtype);
  const int64_t head_elems = static_cast<int64_t>(c.block_size) * c.head_dim;
  AttendTask t;
  t.q = q;
  t.num_rows = rows;
  t.key_head = static_cast<const uint8_t*>(c.key_cache) + kvh * head_elems * es;
  t.value_head = static_cast<const uint8_t*>(c.value_cache) + kvh * head_elems * es;
  t.key_block_stride_bytes = c.key_block_stride * es;
  t.value_block_stride_bytes = c.value_block_stride * es;
  t.block_table = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;
  t.block_size = c.block_size;
  t.head_dim = c.head_dim;
  t.cache_dtype = c.dtype;
  return t;
}

// Factor on the query: softmax scale, fp8 k_scale, and undoing the engine's e4m3 read factor.
float query_mul(const AttentionParams& p, const EngineOps& ops) {
  if (!is_fp8(p.cache.dtype)) return p.scale;
  const float read = p.cache.dtype == CacheType::kFp8E4M3 ? ops.e4m3_read_mul : 1.0f;
  return p.scale * p.cache.k_scale / read;
}
// Factor on the output: fp8 v_scale and the engine's e4m3 read factor.
float value_mul(const AttentionParams& p, const EngineOps& ops) {
  if (!is_fp8(p.cache.dtype)) return 1.0f;
  const float read = p.cache.dtype == CacheType::kFp8E4M3 ? ops.e4m3_read_mul : 1.0f;
  return p.cache.v_scale / read;
}

}  // namespace pagedllm::kernels
