// The AVX2 + FMA + F16C attention engine (this file is compiled with -mavx2 -mfma -mf16c and is
// only called after a run-time CPU check). It includes no header with inline code other than
// the intrinsics (see engine_impl.h on why).
#define PAGEDLLM_ISA_SPECIFIC_TU 1

#include <immintrin.h>

#include <cstdint>

#include "engine.h"

#define PAGEDLLM_ENGINE_NS avx2_engine_ns

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

using V8 = __m256;

inline V8 vzero() { return _mm256_setzero_ps(); }
inline V8 vset1(float f) { return _mm256_set1_ps(f); }
inline V8 vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V8 v) { _mm256_storeu_ps(p, v); }
inline V8 vfmadd(V8 a, V8 b, V8 c) { return _mm256_fmadd_ps(a, b, c); }
inline V8 vadd(V8 a, V8 b) { return _mm256_add_ps(a, b); }
inline V8 vmul(V8 a, V8 b) { return _mm256_mul_ps(a, b); }
inline V8 vmax(V8 a, V8 b) { return _mm256_max_ps(a, b); }
inline V8 vkeep_lt(V8 s, V8 pos, V8 lim) {
  return _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()), s,
                          _mm256_cmp_ps(pos, lim, _CMP_LT_OQ));
}

inline float vhmax(V8 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float vhsum(V8 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane i of the result is the sum of the lanes of a[i] (a transposing reduction tree).
inline V8 vsum8(const V8* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // per 128-bit half: sums of a0..a3 halves
  const __m256 u1 = _mm256_hadd_ps(t2, t3);  // same for a4..a7
  const __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(u0, u1, 0x31);
  return _mm256_add_ps(lo, hi);
}

// e^r for |r| <= ln2 / 2 by its degree-7 Taylor polynomial, times 2^n through the exponent
// bits; 0 in the lanes of `underflow`.
inline V8 exp_scaled(__m256 r, __m256 n, __m256 underflow) {
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// exp(x) to about 1 ulp: x = n ln2 + r, |r| <= ln2 / 2 (exp_scaled). Inputs below -87.3
// (including -inf) give exactly 0; NaN stays NaN (the bounds are max / min's first operands:
// those return x when either is NaN).
inline V8 vexp(V8 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);   // ln2, high bits
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-06f), r);       // ln2, low bits
  return exp_scaled(r, n, underflow);
}

// 2^x for the prefill tile's softmax (engine_prefill_impl.h), as vexp: x = n + f, |f| <= 1/2
// exact, 2^f = e^(f ln 2) (exp_scaled). Below -126 (and -inf) gives 0; NaN stays NaN.
inline V8 vexp2_tile(V8 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-126.0f), x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_mul_ps(_mm256_sub_ps(x, n), _mm256_set1_ps(0.693147180559945309f));
  return exp_scaled(r, n, underflow);
}

// fp8 e4m3fn bytes (zero-extended to 16-bit lanes) as IEEE halves of value * 2^-8, exact,
// subnormals included: shifting the byte to the top and back by one (arithmetic) gives
// s s eeee mmm 0000000; clearing bit 14 leaves s 0 eeee mmm 0000000, a half whose exponent is
// the fp8 one rebiased by -8. The NaN byte (magnitude 0x7F) is turned into a half NaN.
inline __m128i e4m3_to_half(__m128i w) {
  const __m128i t = _mm_srai_epi16(_mm_slli_epi16(w, 8), 1);
  const __m128i h = _mm_and_si128(t, _mm_set1_epi16(static_cast<short>(0xBFFF)));
  const __m128i mag = _mm_and_si128(t, _mm_set1_epi16(0x3F80));
  const __m128i nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3F80));
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7E00)));
}

inline __m256i e4m3_to_half(__m256i w) {
  const __m256i t = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1);
  const __m256i h = _mm256_and_si256(t, _mm256_set1_epi16(static_cast<short>(0xBFFF)));
  const __m256i mag = _mm256_and_si256(t, _mm256_set1_epi16(0x3F80));
  const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3F80));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7E00)));
}

constexpr float kE4M3ReadMul = 1.0f / 256.0f;  // e4m3 reads come out times 2^-8
constexpr bool kPrefillTile = true;  // see engine_prefill_impl.h

template <CacheType CT>
inline V8 vload_cache(const uint8_t* p) {
  if constexpr (CT == CacheType::kFloat32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (CT == CacheType::kFloat16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (CT == CacheType::kBFloat16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else if constexpr (CT == CacheType::kFp8E5M2) {
    // An e5m2 byte is the high byte of the IEEE half of the same value.
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_slli_epi16(w, 8));
  } else {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(e4m3_to_half(w));
  }
}

// 16 elements: the fp8 types convert all 16 in one 256-bit integer pass.
template <CacheType CT>
inline void vload_cache2(const uint8_t* p, V8* lo, V8* hi) {
  if constexpr (CT == CacheType::kFp8E4M3 || CT == CacheType::kFp8E5M2) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = CT == CacheType::kFp8E5M2 ? _mm256_slli_epi16(w, 8) : e4m3_to_half(w);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  } else {
    *lo = vload_cache<CT>(p);
    *hi = vload_cache<CT>(p + (CT == CacheType::kFloat32 ? 32 : 16));
  }
}

// The width engine_impl.h is written over, and its 8-element forms (the full ones here: a
// head_dim tail never occurs with 8 lanes).
constexpr int kW = 8;
constexpr int kAcc = 8;  // of 16 vector registers
using V = V8;
inline V vload8(const float* p) { return vload(p); }
inline void vstore8(float* p, V v) { vstore(p, v); }
template <CacheType CT>
inline V vload_cache8(const uint8_t* p) {
  return vload_cache<CT>(p);
}
inline void vsum_tile(const V* a, float* out) { vstore(out, vsum8(a)); }

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS

#include "engine_impl.h"
#include "engine_prefill_impl.h"

namespace pagedllm::kernels {

const EngineOps& avx2_engine() {
  static const EngineOps ops{"avx2", &PAGEDLLM_ENGINE_NS::attend_task,
                             PAGEDLLM_ENGINE_NS::kE4M3ReadMul, &PAGEDLLM_ENGINE_NS::score_bounds,
                             &PAGEDLLM_ENGINE_NS::prefill_task,
                             &PAGEDLLM_ENGINE_NS::prefill_work_floats,
                             &PAGEDLLM_ENGINE_NS::attend_heads};
  return ops;
}

}  // namespace pagedllm::kernels
