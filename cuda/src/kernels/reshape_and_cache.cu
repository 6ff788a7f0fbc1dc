// reshape_and_cache on the GPU: one thread block per new token; each thread converts runs of
// 8 elements of one KV head (input type read at run time, storage type a template), and the
// slot -1 skips the token. A slot outside the pool is recorded as an error and skipped.
#include "../cuda_check.h"
#include "../device_error.h"
#include "dtypes.cuh"
#include "host_checks.h"
#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda {
namespace detail {
namespace {

constexpr int kThreads = 128;

struct ReshapeArgs {
  const void* key;
  const void* value;
  ScalarType act;
  int64_t key_token_stride, key_head_stride, value_token_stride, value_head_stride;
  const void* slots;
  bool slots_int64;
  uint8_t* key_cache;
  uint8_t* value_cache;
  int64_t key_block_stride, value_block_stride;  // elements
  int num_kv_heads, block_size, head_dim, num_blocks;
  float k_div, v_div;                              // fp8 scales, else 1
  DeviceError* err;
};

template <CacheType CT>
__global__ void __launch_bounds__(kThreads) reshape_and_cache_kernel(const ReshapeArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t slot = a.slots_int64 ? static_cast<const int64_t*>(a.slots)[t]
                                     : static_cast<const int32_t*>(a.slots)[t];
  if (slot == -1) return;  // padding
  const int64_t num_slots = static_cast<int64_t>(a.num_blocks) * a.block_size;
  if (slot < 0 || slot >= num_slots) {
    if (threadIdx.x == 0) report_error(a.err, kErrSlot, kKernelReshapeAndCache, t, slot, num_slots);
    return;
  }
  const int64_t block = slot / a.block_size;
  const int64_t offset = slot - block * a.block_size;
  const int runs = a.head_dim / 8;
  for (int i = threadIdx.x; i < a.num_kv_heads * runs; i += kThreads) {
    const int h = i / runs;
    const int d0 = (i - h * runs) * 8;
    const int64_t dst = (static_cast<int64_t>(h) * a.block_size + offset) * a.head_dim + d0;
    const int64_t ks = t * a.key_token_stride + h * a.key_head_stride + d0;
    const int64_t vs = t * a.value_token_stride + h * a.value_head_stride + d0;
    void* kd = a.key_cache + (block * a.key_block_stride + dst) * CacheTraits<CT>::kBytes;
    void* vd = a.value_cache + (block * a.value_block_stride + dst) * CacheTraits<CT>::kBytes;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      store_cache<CT>(kd, e, load_act(a.key, a.act, ks + e) / a.k_div);
      store_cache<CT>(vd, e, load_act(a.value, a.act, vs + e) / a.v_div);
    }
  }
}

}  // namespace
}  // namespace detail

void reshape_and_cache(const kernels::ReshapeAndCacheParams& p, Stream stream) {
  using namespace detail;
  const kernels::KVCacheParams& c = p.cache;
  check_cache(c);
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 0, "num_tokens must be >= 0");
  if (p.num_tokens == 0) return;
  PAGEDLLM_CHECK_ARG(p.slot_mapping != nullptr, "slot_mapping is null");
  const bool fp8 = c.dtype == CacheType::kFp8E4M3 || c.dtype == CacheType::kFp8E5M2;
  ReshapeArgs a{};
  a.key = p.key;
  a.value = p.value;
  a.act = p.dtype;
  a.key_token_stride = p.key_token_stride;
  a.key_head_stride = p.key_head_stride;
  a.value_token_stride = p.value_token_stride;
  a.value_head_stride = p.value_head_stride;
  a.slots = p.slot_mapping;
  a.slots_int64 = p.slot_mapping_int64;
  a.key_cache = static_cast<uint8_t*>(c.key_cache);
  a.value_cache = static_cast<uint8_t*>(c.value_cache);
  a.key_block_stride = c.key_block_stride;
  a.value_block_stride = c.value_block_stride;
  a.num_kv_heads = c.num_kv_heads;
  a.block_size = c.block_size;
  a.head_dim = c.head_dim;
  a.num_blocks = c.num_blocks;
  a.k_div = fp8 ? c.k_scale : 1.0f;
  a.v_div = fp8 ? c.v_scale : 1.0f;
  a.err = error_record();
  const dim3 grid(p.num_tokens);
  switch (c.dtype) {
    case CacheType::kFloat32: reshape_and_cache_kernel<CacheType::kFloat32><<<grid, kThreads, 0, stream>>>(a); break;
    case CacheType::kFloat16: reshape_and_cache_kernel<CacheType::kFloat16><<<grid, kThreads, 0, stream>>>(a); break;
    case CacheType::kBFloat16: reshape_and_cache_kernel<CacheType::kBFloat16><<<grid, kThreads, 0, stream>>>(a); break;
    case CacheType::kFp8E4M3: reshape_and_cache_kernel<CacheType::kFp8E4M3><<<grid, kThreads, 0, stream>>>(a); break;
    case CacheType::kFp8E5M2: reshape_and_cache_kernel<CacheType::kFp8E5M2><<<grid, kThreads, 0, stream>>>(a); break;
  }
  PAGEDLLM_CUDA_CHECK_LAUNCH("reshape_and_cache kernel");
  finish_call(stream);
}

}  // namespace pagedllm::cuda
