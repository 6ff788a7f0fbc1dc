// dtypes.cuh (internal) — element types on the device: storage traits of each CacheType, exact
// conversions to float, rounding conversions from float (round to nearest even; fp8
// saturating to the largest finite value, NaN kept, as the CPU kernels' convert.h does),
// and run-time typed loads / stores of activations (float32 / float16 / bfloat16).
// Thread-safety: pure device functions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::cuda::detail {

using kernels::CacheType;
using kernels::ScalarType;

template <CacheType CT>
struct CacheTraits;
template <>
struct CacheTraits<CacheType::kFloat32> {
  static constexpr int kBytes = 4;
  static constexpr bool kFp8 = false;
};
template <>
struct CacheTraits<CacheType::kFloat16> {
  static constexpr int kBytes = 2;
  static constexpr bool kFp8 = false;
};
template <>
struct CacheTraits<CacheType::kBFloat16> {
  static constexpr int kBytes = 2;
  static constexpr bool kFp8 = false;
};
template <>
struct CacheTraits<CacheType::kFp8E4M3> {
  static constexpr int kBytes = 1;
  static constexpr bool kFp8 = true;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E4M3;
};
template <>
struct CacheTraits<CacheType::kFp8E5M2> {
  static constexpr int kBytes = 1;
  static constexpr bool kFp8 = true;
  static constexpr __nv_fp8_interpretation_t kKind = __NV_E5M2;
};

// Two fp8 bytes (low byte = first element) as an exact half2.
template <CacheType CT>
__device__ __forceinline__ __half2 fp8x2_to_half2(uint16_t two) {
  const __half2_raw r =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), CacheTraits<CT>::kKind);
  return __half2(r);
}

// 8 consecutive cache elements at `p` (aligned to 8 elements) as exact floats.
template <CacheType CT>
__device__ __forceinline__ void load8(const void* p, float (&out)[8]) {
  if constexpr (CT == CacheType::kFloat32) {
    const float4 a = static_cast<const float4*>(p)[0];
    const float4 b = static_cast<const float4*>(p)[1];
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  } else if constexpr (CT == CacheType::kFloat16) {
    const uint4 v = *static_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else if constexpr (CT == CacheType::kBFloat16) {
    const uint4 v = *static_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    const uint2 v = *static_cast<const uint2*>(p);
    const uint32_t w[2] = {v.x, v.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 lo = __half22float2(fp8x2_to_half2<CT>(static_cast<uint16_t>(w[i] & 0xFFFFu)));
      const float2 hi = __half22float2(fp8x2_to_half2<CT>(static_cast<uint16_t>(w[i] >> 16)));
      out[4 * i] = lo.x;
      out[4 * i + 1] = lo.y;
      out[4 * i + 2] = hi.x;
      out[4 * i + 3] = hi.y;
    }
  }
}

// A float rounded to the storage type (already divided by the fp8 scale), as its raw bits.
template <CacheType CT>
__device__ __forceinline__ void store_cache(void* p, int64_t i, float v) {
  if constexpr (CT == CacheType::kFloat32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (CT == CacheType::kFloat16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else if constexpr (CT == CacheType::kBFloat16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(v, __NV_SATFINITE, CacheTraits<CT>::kKind));
  }
}

// Element i of an activation array of run-time type t, as float.
__device__ __forceinline__ float load_act(const void* p, ScalarType t, int64_t i) {
  switch (t) {
    case ScalarType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ScalarType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Stores v as element i of an activation array of run-time type t (round to nearest even).
__device__ __forceinline__ void store_act(void* p, ScalarType t, int64_t i, float v) {
  switch (t) {
    case ScalarType::kFloat16: static_cast<__half*>(p)[i] = __float2half_rn(v); return;
    case ScalarType::kBFloat16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}

__host__ __device__ constexpr int act_bytes(ScalarType t) {
  return t == ScalarType::kFloat32 ? 4 : 2;
}

__host__ __device__ constexpr int cache_bytes(CacheType t) {
  return t == CacheType::kFloat32 ? 4
         : (t == CacheType::kFloat16 || t == CacheType::kBFloat16) ? 2
                                                                    : 1;
}

}  // namespace pagedllm::cuda::detail
