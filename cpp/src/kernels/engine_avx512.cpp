// The AVX-512 attention engine: engine_impl.h over 16-lane float vectors. This file is compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c and is only
// called after a run-time CPU check (attention.cpp). It includes no header with inline code
// other than the intrinsics and the internal-linkage kernel headers (see engine_impl.h on why).
// Conversions are fused into the loads: fp16 by vcvtph2ps, bf16 by a 16-bit shift, fp8 e5m2 as
// the high byte of a half, fp8 e4m3 by the shift trick of the AVX2 engine on 32 bytes at once.
// head_dim tails of 8 elements use masked loads, which never touch the masked-out bytes.
#define PAGEDLLM_ISA_SPECIFIC_TU 1

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and warn about it when inlined
// into loops (GCC bug 105593, a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "engine.h"
#include "engine_avx512_math.h"  // vexp (shared with the avx512_bf16 engine)

#define PAGEDLLM_ENGINE_NS avx512_engine_ns

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

constexpr int kW = 16;
using V = __m512;
constexpr __mmask16 kLow8 = 0x00FF;

inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float f) { return _mm512_set1_ps(f); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vload8(const float* p) { return _mm512_maskz_loadu_ps(kLow8, p); }
inline void vstore8(float* p, V v) { _mm512_mask_storeu_ps(p, kLow8, v); }
// x in the low 256 bits, 0 above (AVX-512F only; _mm512_zextps256_ps512 needs a newer compiler).
inline V zext256(__m256 x) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(x), 0));
}
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline float vhmax(V a) { return _mm512_reduce_max_ps(a); }
inline V vkeep_lt(V s, V pos, V lim) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(pos, lim, _CMP_LT_OQ),
                              _mm512_set1_ps(-__builtin_inff()), s);
}
inline float vhsum(V a) { return _mm512_reduce_add_ps(a); }

constexpr int kAcc = 16;  // accumulators per register tile, of 32 vector registers

// out[i] = sum of the lanes of a[i] for 8 vectors: halves added, then a transposing hadd tree.
inline void vsum8(const V* a, float* out) {
  __m256 h[8];
  for (int i = 0; i < 8; ++i) {
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
  }
  const __m256 t0 = _mm256_hadd_ps(h[0], h[1]);
  const __m256 t1 = _mm256_hadd_ps(h[2], h[3]);
  const __m256 t2 = _mm256_hadd_ps(h[4], h[5]);
  const __m256 t3 = _mm256_hadd_ps(h[6], h[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  const __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(u0, u1, 0x31);
  _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

// out[i] = sum of the lanes of a[i], i < kAcc.
inline void vsum_tile(const V* a, float* out) {
  vsum8(a, out);
  vsum8(a + 8, out + 8);
}

// fp8 e4m3fn bytes, sign-extended to 16-bit lanes, as IEEE halves of value * 2^-8, exact
// (subnormals included; the NaN byte gives a half NaN): shifting left by 7 gives
// s s eeee mmm 0000000 (the AVX2 engine's shift trick, one instruction shorter); clearing bit 14
// leaves a half whose exponent is the fp8 one rebiased by -8.
inline __m256i e4m3_to_half(__m256i sx) {
  const __m256i t = _mm256_slli_epi16(sx, 7);
  const __m256i h = _mm256_and_si256(t, _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(t, _mm256_set1_epi16(0x3F80)),
                                                _mm256_set1_epi16(0x3F80));
  return _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(h, _mm256_set1_epi16(0x7E00)));
}

inline __m512i e4m3_to_half(__m512i sx) {
  const __m512i t = _mm512_slli_epi16(sx, 7);
  const __m512i h = _mm512_and_si512(t, _mm512_set1_epi16(static_cast<short>(0xBFFF)));
  const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(t, _mm512_set1_epi16(0x3F80)),
                                                _mm512_set1_epi16(0x3F80));
  return _mm512_mask_mov_epi16(h, nan, _mm512_or_si512(h, _mm512_set1_epi16(0x7E00)));
}

constexpr float kE4M3ReadMul = 1.0f / 256.0f;  // e4m3 reads come out times 2^-8
constexpr bool kPrefillTile = true;  // see engine_prefill_impl.h

// 8 fp8 bytes as halves in the low 128 bits.
template <CacheType CT>
inline __m128i fp8x8_to_half(const uint8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (CT == CacheType::kFp8E5M2) {
    return _mm_slli_epi16(_mm_cvtepu8_epi16(b), 8);  // an e5m2 byte: the high byte of a half
  } else {
    return _mm256_castsi256_si128(e4m3_to_half(_mm256_castsi128_si256(_mm_cvtepi8_epi16(b))));
  }
}

template <CacheType CT>
inline V vload_cache(const uint8_t* p) {
  if constexpr (CT == CacheType::kFloat32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (CT == CacheType::kFloat16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else if constexpr (CT == CacheType::kBFloat16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i h = CT == CacheType::kFp8E5M2 ? _mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8)
                                                : e4m3_to_half(_mm256_cvtepi8_epi16(b));
    return _mm512_cvtph_ps(h);
  }
}

// 32 elements: the fp8 types convert all 32 in one 512-bit integer pass.
template <CacheType CT>
inline void vload_cache2(const uint8_t* p, V* lo, V* hi) {
  if constexpr (CT == CacheType::kFp8E4M3 || CT == CacheType::kFp8E5M2) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512i h = CT == CacheType::kFp8E5M2 ? _mm512_slli_epi16(_mm512_cvtepu8_epi16(b), 8)
                                                : e4m3_to_half(_mm512_cvtepi8_epi16(b));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  } else {
    *lo = vload_cache<CT>(p);
    *hi = vload_cache<CT>(p + (CT == CacheType::kFloat32 ? 64 : 32));
  }
}

// 8 elements in the low lanes, 0 above; reads exactly the 8 elements' bytes.
template <CacheType CT>
inline V vload_cache8(const uint8_t* p) {
  if constexpr (CT == CacheType::kFloat32) {
    return _mm512_maskz_loadu_ps(kLow8, reinterpret_cast<const float*>(p));
  } else if constexpr (CT == CacheType::kFloat16) {
    return zext256(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (CT == CacheType::kBFloat16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return zext256(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  } else {
    return zext256(_mm256_cvtph_ps(fp8x8_to_half<CT>(p)));
  }
}

// pt[t] = mul * sum_d kf[t][d] q[d] for TT tokens by bf16 pair dot products: q2 holds the row
// vector's query pairs (d, d + 1) as bf16 in each 32-bit lane, hd / 2 vectors rows_pad lanes
// apart; kf2 the staged bf16 key rows as 32-bit pairs, kStride pairs apart. Products are exact
// and summed in fp32 (denormals flushed). Called only when the CPU has AVX512_BF16.
__attribute__((target("avx512bf16"))) void bf16_scores_pass16(const uint32_t* q2, int rows_pad,
                                                              const uint32_t* kf2, int kStride,
                                                              int hd, float mul, float* pt) {
  V acc[16];
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  for (int d2 = 0; d2 < hd / 2; ++d2) {
    const __m512bh q = reinterpret_cast<__m512bh>(
        _mm512_loadu_si512(q2 + static_cast<long long>(d2) * rows_pad));
    for (int t = 0; t < 16; ++t) {
      const __m512bh k = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(kf2[t * kStride + d2])));
      acc[t] = _mm512_dpbf16_ps(acc[t], q, k);
    }
  }
  const V m = _mm512_set1_ps(mul);
  for (int t = 0; t < 16; ++t) _mm512_storeu_ps(pt + t * 16, _mm512_mul_ps(acc[t], m));
}
// The 16 (vstore_bf16) or low 8 (vstore8_bf16) floats of x as bf16 by truncation: exact for
// values that bf16 holds (the prefill tile's fp8 keys, whose 3 or 2 mantissa bits it keeps).
inline void vstore_bf16(uint16_t* dst, V x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
inline void vstore8_bf16(uint16_t* dst, V x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                   _mm256_cvtepi32_epi16(_mm256_srli_epi32(
                       _mm256_castps_si256(_mm512_castps512_ps256(x)), 16)));
}
#define PAGEDLLM_ENGINE_BF16_DOT 1  // engine_prefill_impl.h: use bf16_scores_pass16

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS

#include "engine_impl.h"
#include "engine_prefill_impl.h"

namespace pagedllm::kernels {

const EngineOps& avx512_engine() {
  static const EngineOps ops{"avx512", &PAGEDLLM_ENGINE_NS::attend_task,
                             PAGEDLLM_ENGINE_NS::kE4M3ReadMul, &PAGEDLLM_ENGINE_NS::score_bounds,
                             &PAGEDLLM_ENGINE_NS::prefill_task,
                             &PAGEDLLM_ENGINE_NS::prefill_work_floats};
  return ops;
}

}  // namespace pagedllm::kernels
