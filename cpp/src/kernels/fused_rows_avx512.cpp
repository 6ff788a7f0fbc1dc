// The AVX-512 row loops of fused_ops.h: fused_rows_impl.h over 16-lane vectors. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -ffp-contract=off and only called
// after the run-time CPU check of the engine choice (attention.cpp). It includes no header with
// inline code other than the intrinsics (fused_rows_impl.h says why).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as engine_avx512.cpp
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "fused_rows.h"

namespace pagedllm::kernels {
namespace {

constexpr int kW = 16;
constexpr const char* kFusedRowsName = "avx512";
using V = __m512;

inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float f) { return _mm512_set1_ps(f); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vneg(V a) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
}
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(V a) { return _mm512_reduce_add_ps(a); }
inline float scalar_sqrt(float f) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(f))); }

inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vround(V a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline V vfnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
// y * 2^n for integral n in [-150, 128], as two exponent-field factors 2^(n/2) 2^(n - n/2).
inline V vldexp(V y, V n) {
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const V e1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const V e2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return vmul(vmul(y, e1), e2);
}
// e, except x where x is NaN.
inline V vkeep_nan(V e, V x) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), e, x);
}

inline V ld(const float* p) { return _mm512_loadu_ps(p); }
inline V ld(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void st(float* p, V v) { _mm512_storeu_ps(p, v); }
// The bits of v rounded to bfloat16 (nearest even) in the high halves; NaN lanes quiet NaN.
inline __m512i bf16_bits(V v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r,
                                 _mm512_set1_epi32(0x7FC00000));
}
inline void st(uint16_t* p, V v) {
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
}
inline V vround_bf16(V v) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_bits(v), _mm512_set1_epi32(-65536)));
}

// One pass: per lane the first maximum and its index (strictly greater replaces), then the
// smallest index among the lanes holding the row's maximum.
inline int64_t argmax_row(const float* x, int64_t n, float* max_value) {
  const V ninf = vset1(-__builtin_inff());
  V best = ninf;
  __m512i best_i = _mm512_setzero_si512();
  __m512i cur = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(kW);
  __mmask16 nan = 0;
  int64_t c = 0;
  for (; c + kW <= n; c += kW) {
    const V v = _mm512_loadu_ps(x + c);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    best_i = _mm512_mask_mov_epi32(best_i, gt, cur);
    cur = _mm512_add_epi32(cur, step);
  }
  if (c < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - c)) - 1u);
    const V v = _mm512_mask_loadu_ps(ninf, tail, x + c);
    nan |= _mm512_mask_cmp_ps_mask(tail, v, v, _CMP_UNORD_Q);
    const __mmask16 gt = _mm512_mask_cmp_ps_mask(tail, v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    best_i = _mm512_mask_mov_epi32(best_i, gt, cur);
  }
  const float m = _mm512_reduce_max_ps(best);
  const __mmask16 eq = _mm512_cmp_ps_mask(best, vset1(m), _CMP_EQ_OQ);
  const int32_t index =
      _mm512_reduce_min_epi32(_mm512_mask_mov_epi32(_mm512_set1_epi32(INT32_MAX), eq, best_i));
  *max_value = nan ? __builtin_nanf("") : m;
  return index;
}

#include "fused_rows_vexp.h"
#include "fused_rows_impl.h"

}  // namespace

const FusedRowOps& avx512_fused_rows() { return kFusedRows; }

}  // namespace pagedllm::kernels
