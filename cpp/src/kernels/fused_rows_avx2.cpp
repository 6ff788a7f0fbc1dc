// The AVX2 row loops of fused_ops.h: fused_rows_impl.h over 8-lane vectors. Compiled with
// -mavx2 -mfma -ffp-contract=off and only called after the run-time CPU check of the engine
// choice (attention.cpp). It includes no header with inline code other than the intrinsics
// (fused_rows_impl.h says why).
#include <immintrin.h>

#include <cstdint>

#include "fused_rows.h"

namespace pagedllm::kernels {
namespace {

constexpr int kW = 8;
constexpr const char* kFusedRowsName = "avx2";
using V = __m256;

inline V vzero() { return _mm256_setzero_ps(); }
inline V vset1(float f) { return _mm256_set1_ps(f); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vneg(V a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
inline V vfmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float scalar_sqrt(float f) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(f))); }

inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline V vround(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V vfnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
// y * 2^n for integral n in [-150, 128], as two exponent-field factors 2^(n/2) 2^(n - n/2).
inline V vldexp(V y, V n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const V e1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const V e2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return vmul(vmul(y, e1), e2);
}
// e, except x where x is NaN.
inline V vkeep_nan(V e, V x) { return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)); }

inline V ld(const float* p) { return _mm256_loadu_ps(p); }
inline V ld(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline void st(float* p, V v) { _mm256_storeu_ps(p, v); }
// The bits of v rounded to bfloat16 (nearest even) in the high halves; NaN lanes quiet NaN.
inline __m256i bf16_bits(V v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), nan);
}
inline void st(uint16_t* p, V v) {
  const __m256i h = _mm256_srli_epi32(bf16_bits(v), 16);
  // packus works per 128-bit lane: [h0..3 h0..3 | h4..7 h4..7]; qwords 0 and 2 hold h0..h7
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline V vround_bf16(V v) {
  return _mm256_castsi256_ps(_mm256_and_si256(bf16_bits(v), _mm256_set1_epi32(-65536)));
}

// As the AVX-512 one: per lane the first maximum and its index, then the smallest index among
// the lanes holding the maximum; the tail (< 8 elements) after, scalar.
inline int64_t argmax_row(const float* x, int64_t n, float* max_value) {
  V best = vset1(-__builtin_inff());
  __m256i best_i = _mm256_setzero_si256();
  __m256i cur = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(kW);
  int nan = 0;
  int64_t c = 0;
  for (; c + kW <= n; c += kW) {
    const V v = _mm256_loadu_ps(x + c);
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const V gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, gt);
    best_i = _mm256_blendv_epi8(best_i, cur, _mm256_castps_si256(gt));
    cur = _mm256_add_epi32(cur, step);
  }
  alignas(32) float lane_best[kW];
  alignas(32) int32_t lane_index[kW];
  _mm256_store_ps(lane_best, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_index), best_i);
  float m = -__builtin_inff();
  int64_t index = 0;
  if (c > 0) {
    for (int l = 0; l < kW; ++l) m = lane_best[l] > m ? lane_best[l] : m;
    index = INT32_MAX;
    for (int l = 0; l < kW; ++l) {
      if (lane_best[l] == m && lane_index[l] < index) index = lane_index[l];
    }
  }
  for (; c < n; ++c) {
    nan |= x[c] != x[c];
    if (x[c] > m) {
      m = x[c];
      index = c;
    }
  }
  *max_value = nan ? __builtin_nanf("") : m;
  return index;
}

#include "fused_rows_vexp.h"
#include "fused_rows_impl.h"

}  // namespace

const FusedRowOps& avx2_fused_rows() { return kFusedRows; }

}  // namespace pagedllm::kernels
