// engine_avx512_math.h (internal) — what the avx512 engine (engine_avx512.cpp) and the
// avx512_bf16 engine (engine_avx512_bf16.cpp) share: vexp, the 16-lane exponential, written once
// so that the two give the same softmax weights bit for bit, and vsum16, the scores' reduction.
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

// Lane i of the result = the sum of the 16 lanes of a[i], i < 16 (a register tile's scores).
// A transposing tree that reduces inside the 128-bit lanes first: 12 steps of two vshufps and
// an add (in-lane shuffles: on Zen 4 they issue beside the dot products and FMAs for free),
// then 3 of two vshuff32x4 and an add across the lanes. It replaces a tree of 16 halving
// extracts and 12 vhaddps (half a vhaddps per cycle on Zen 4, two vshufps and an add on Intel).
inline __m512 vsum16(const __m512* a) {
  // Pairs (x, y) -> per 128-bit lane [x0 + x1, x2 + x3, y0 + y1, y2 + y3].
  const auto fold2 = [](__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
  };
  __m512 z[8];
  for (int k = 0; k < 8; ++k) z[k] = fold2(a[2 * k], a[2 * k + 1]);
  __m512 u[4];  // u[m], 128-bit lane L: lane L's partial sums of a[4m .. 4m + 3]
  for (int m = 0; m < 4; ++m) u[m] = fold2(z[2 * m], z[2 * m + 1]);
  // Across the 128-bit lanes: [u0.L0 + u0.L1, u0.L2 + u0.L3, u1.L0 + u1.L1, u1.L2 + u1.L3].
  const auto fold_lanes = [](__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
  };
  return fold_lanes(fold_lanes(u[0], u[1]), fold_lanes(u[2], u[3]));
}

}  // namespace
}  // namespace pagedllm::kernels
