// engine_avx512_math.h (internal) — vexp, the 16-lane exponential the avx512 engine
// (engine_avx512.cpp) and the avx512_bf16 engine (engine_avx512_bf16.cpp) share, written once
// so that the two give the same softmax weights bit for bit. (Their vsum8 stay in each file:
// the same operations, but written alike they compile to different code in one of the two.)
//
// Everything is in an anonymous namespace (internal linkage): each of those ISA translation
// units gets its own copy compiled with its own flags, so they never meet at link time. No
// standard-library code, for the same reason as engine_impl.h. Include only from files compiled
// with at least -mavx512f -mavx512dq -mavx2 -mfma.
#pragma once

#include <immintrin.h>

namespace pagedllm::kernels {
namespace {

// exp(x): x = n ln2 + r, e^r by its degree-7 Taylor polynomial, 2^n through the exponent bits;
// below -87.3 (and -inf) gives 0; NaN stays NaN (a NaN score, from a NaN key or query or an
// infinite one, makes the output NaN as in the portable engine, never a weight of 0: the
// bounds are the first operands of max / min, which return their second operand, x, when
// either is NaN). The same polynomial and results as the AVX2 engine's.
inline __m512 vexp(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow),
                             _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

}  // namespace
}  // namespace pagedllm::kernels
