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
#include "engine_avx512_math.h"  // vexp, vsum16 (shared with the avx512_bf16 engine)
#include "engine_lane_softmax.h"  // the decode tile's softmax in the scores' lanes

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

// out[i] = sum of the lanes of a[i], i < kAcc.
inline void vsum_tile(const V* a, float* out) { _mm512_store_ps(out, vsum16(a)); }

// fp8 e4m3fn bytes, sign-extended to 16-bit lanes, as IEEE halves of value * 2^-8, exact
// (subnormals included; the NaN byte gives a half NaN): shifting left by 7 gives
// s s eeee mmm 0000000 (the AVX2 engine's shift trick, one instruction shorter); clearing bit 14
// leaves a half whose exponent is the fp8 one rebiased by -8. Bit 14 is taken instead from
// (magnitude bits + 1 in their lowest place), which carries into it only from the NaN byte's
// seven ones: s 1 1111 111 is a half NaN. Three instructions after the shift (the
// select is one vpternlog), where two ands, a compare, an or and a masked move took five:
// 1.03-1.07x on fp8 e4m3 decode with an fp32 query (2-core Zen 4, docs/BENCHMARKS.md).
inline __m256i e4m3_to_half(__m256i sx) {
  const __m256i t = _mm256_slli_epi16(sx, 7);
  const __m256i carry = _mm256_add_epi16(_mm256_and_si256(t, _mm256_set1_epi16(0x3F80)),
                                         _mm256_set1_epi16(0x0080));
  return _mm256_ternarylogic_epi32(_mm256_set1_epi16(0x4000), carry, t, 0xCA);  // bit 14 ? c : t
}

inline __m512i e4m3_to_half(__m512i sx) {
  const __m512i t = _mm512_slli_epi16(sx, 7);
  const __m512i carry = _mm512_add_epi16(_mm512_and_si512(t, _mm512_set1_epi16(0x3F80)),
                                         _mm512_set1_epi16(0x0080));
  return _mm512_ternarylogic_epi32(_mm512_set1_epi16(0x4000), carry, t, 0xCA);  // bit 14 ? c : t
}

constexpr float kE4M3ReadMul = 1.0f / 256.0f;  // e4m3 reads come out times 2^-8
constexpr bool kPrefillTile = true;  // see engine_prefill_impl.h

// 2^x as 2^n 2^f: n the nearest integer to max(x, -160), f = x - n (exact, |f| <= 1/2), 2^f the
// polynomial c[0] + c[1] f + ... + c[N-1] f^(N-1) (Horner), 2^n by vscalefps. The bound makes
// x <= -160 (and -inf, a masked score) exactly 0, so that a masked token's value, even a NaN,
// never reaches the output (a bound of -150 would give 2^-149); NaN stays NaN (the bound is
// max's first operand).
template <int N>
inline V vexp2_fit(V x, const float (&c)[N]) {
  x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x);
  const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const V f = _mm512_sub_ps(x, n);
  V p = _mm512_set1_ps(c[N - 1]);
  for (int i = N - 2; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  return _mm512_scalef_ps(p, n);
}

// 2^f on [-1/2, 1/2], degree 5: the tile's former minimax fit of e^r on [-ln2/2, ln2/2]
// (relative error) with r = f ln 2, its coefficients times ln2^k rounded to float; 1.8e-7
// relative.
constexpr float kExp2Fit5[6] = {1.0000001192092896f, 0.6931470036506653f, 0.24022118747234344f,
                                0.05550713837146759f, 0.009675584733486176f,
                                0.001327636418864131f};

// The prefill tile's softmax exp (engine_prefill_impl.h), 2^x: 9 instructions, 5 of them
// multiply-adds (e^x this way took 11, 8), within 1.8e-7 relative over [-126, 0] (vexp: about
// 1.2e-7; the exact engines' bound allows 2e-5 of the output).
inline V vexp2_tile(V x) { return vexp2_fit(x, kExp2Fit5); }

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

// --- bf16 probabilities for p.v (the prefill tile with AttendTask::bf16_probs) ---
// Two tokens per multiply-add: pt2[t / 2][r] = (p_t[r], p_(t+1)[r]) as bf16 in a 32-bit lane
// (the even token low), vf2[t / 2][d] = (v_t[d], v_(t+1)[d]) likewise; vdpbf16ps with the
// broadcast probability pair of row r adds p_t v_t[d] + p_(t+1) v_(t+1)[d] to 16 columns.
#define PAGEDLLM_BF16_FN __attribute__((target("avx512bf16")))

// vpermt2w indices: word 2i takes word i of the first source, word 2i + 1 word i of the second
// (kPairLo: source words 0-15; kPairHi: 16-31), the second source's words numbered from 32.
alignas(64) constexpr uint16_t kPairLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) constexpr uint16_t kPairHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                              53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                              27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
// Word 2i takes word i of one source, word 2i + 1 its word 16 + i (vpermw).
alignas(64) constexpr uint16_t kPairHalves[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// 2^f on [-1/2, 1/2], degree 4: a minimax fit in relative error (coefficients rounded to
// float), 2.7e-6 relative.
constexpr float kExp2Fit4[5] = {0.9999992847442627f, 0.6931218504905701f, 0.240247443318367f,
                                0.05591766536235809f, 0.009570019319653511f};

// 2^x within 2.7e-6 relative, for probabilities that are then rounded to bf16 (unit roundoff
// 2^-9, so vexp2_tile's accuracy buys nothing there): 8 instructions.
inline V vexp2_coarse(V x) { return vexp2_fit(x, kExp2Fit4); }

// For the np (even) score vectors at pt (token-major, rows in the lanes; log2 units, as the
// tile's): p_t = 2^(s_t + neg) (vexp2_coarse) rounded to bf16 (to nearest even) and stored as
// token pairs at pt2 (16 words per pair).
// Returns per lane the sum of the rounded p (vdpbf16ps by (1, 1): exact, summed in fp32), so
// the weights the output is divided by are the ones p.v used.
PAGEDLLM_BF16_FN V bf16_prob_pairs(const float* pt, int np, V neg, uint32_t* pt2) {
  // cvtne2ps2bf16(a, b) puts b in words 0-15 and a in 16-31; interleave them to pairs.
  const __m512i idx = _mm512_load_si512(kPairHalves);
  const __m512bh ones = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3F803F80));
  V sum = _mm512_setzero_ps();
  for (int t = 0; t < np; t += 2) {
    const V p0 = vexp2_coarse(_mm512_add_ps(_mm512_loadu_ps(pt + t * 16), neg));
    const V p1 = vexp2_coarse(_mm512_add_ps(_mm512_loadu_ps(pt + (t + 1) * 16), neg));
    const __m512i pair = _mm512_permutexvar_epi16(
        idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    _mm512_storeu_si512(pt2 + t / 2 * 16, pair);
    sum = _mm512_dpbf16_ps(sum, reinterpret_cast<__m512bh>(pair), ones);
  }
  return sum;
}

// acc_r[d, d1) += sum over the token pairs of pt2[tp][r] . vf2[tp][d, d1) for R rows (acc rows
// hd apart), CC column vectors at a time; `odd`: the last pair's second token is past every
// row's range (its value half is cleared, so that nothing there, not even a NaN, reaches the
// sums). Returns d1 (the last multiple of 16 * CC reachable).
template <int R, int CC>
PAGEDLLM_BF16_FN int pv_pair_cols(const uint32_t* pt2, const uint32_t* vf2, int pairs, bool odd,
                                  float* acc, int hd, int d) {
  const __m512i low = _mm512_set1_epi32(0xFFFF);
  for (; d + 16 * CC <= hd; d += 16 * CC) {
    V o[R * CC];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) o[r * CC + c] = _mm512_loadu_ps(acc + r * hd + d + c * 16);
    const uint32_t* vr = vf2 + d;
    for (int tp = 0; tp < pairs; ++tp, vr += hd) {
      __m512bh vv[CC];
      for (int c = 0; c < CC; ++c) {
        __m512i x = _mm512_loadu_si512(vr + c * 16);
        if (odd && tp == pairs - 1) x = _mm512_and_si512(x, low);
        vv[c] = reinterpret_cast<__m512bh>(x);
      }
      for (int r = 0; r < R; ++r) {
        const __m512bh p = reinterpret_cast<__m512bh>(
            _mm512_set1_epi32(static_cast<int>(pt2[tp * 16 + r])));
        for (int c = 0; c < CC; ++c) o[r * CC + c] = _mm512_dpbf16_ps(o[r * CC + c], p, vv[c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) _mm512_storeu_ps(acc + r * hd + d + c * 16, o[r * CC + c]);
  }
  return d;
}

// All hd (a multiple of 16) columns of R rows: 4 column vectors at a time (R <= 4), then 2, 1.
template <int R>
PAGEDLLM_BF16_FN void pv_pair_rows(const uint32_t* pt2, const uint32_t* vf2, int pairs, bool odd,
                                   float* acc, int hd) {
  int d = 0;
  if constexpr (R <= 4) d = pv_pair_cols<R, 4>(pt2, vf2, pairs, odd, acc, hd, d);
  d = pv_pair_cols<R, 2>(pt2, vf2, pairs, odd, acc, hd, d);
  pv_pair_cols<R, 1>(pt2, vf2, pairs, odd, acc, hd, d);
}

// acc_r += sum_t p_t[r] v_t for the `real` rows of one row vector over its first nt tokens (the
// pairs at pt2 and vf2); 8 rows at a time on heads under 64 columns (the accumulators then
// still fill 16 registers), else 4.
PAGEDLLM_BF16_FN void bf16_pv_pairs(const uint32_t* pt2, const uint32_t* vf2, int nt, float* acc,
                                    int hd, int real) {
  const int pairs = (nt + 1) / 2;
  const bool odd = (nt & 1) != 0;
  int r = 0;
  if (hd < 64) {
    for (; r + 8 <= real; r += 8) pv_pair_rows<8>(pt2 + r, vf2, pairs, odd, acc + r * hd, hd);
  }
  for (; r + 4 <= real; r += 4) pv_pair_rows<4>(pt2 + r, vf2, pairs, odd, acc + r * hd, hd);
  if (r + 2 <= real) {
    pv_pair_rows<2>(pt2 + r, vf2, pairs, odd, acc + r * hd, hd);
    r += 2;
  }
  if (r < real) pv_pair_rows<1>(pt2 + r, vf2, pairs, odd, acc + r * hd, hd);
}

// dst[d] = the bf16 pair (v0[d], v1[d]) for d < hd (a multiple of 16), from two cache rows (v1
// null: 0). bf16 rows are interleaved as they are (vpermt2w); fp8 ones go through float32 and
// keep their high halves, exact (bf16 holds every fp8 value, times the e4m3 read factor).
template <CacheType CT>
inline void pair_value_rows(const uint8_t* v0, const uint8_t* v1, int hd, uint32_t* dst) {
  int d = 0;
  if constexpr (CT == CacheType::kBFloat16) {
    const __m512i lo = _mm512_load_si512(kPairLo);
    const __m512i hi = _mm512_load_si512(kPairHi);
    for (; d + 32 <= hd; d += 32) {
      const __m512i a = _mm512_loadu_si512(v0 + 2 * d);
      const __m512i b = v1 != nullptr ? _mm512_loadu_si512(v1 + 2 * d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + d + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
  constexpr int es = CT == CacheType::kFloat32                                      ? 4
                     : CT == CacheType::kBFloat16 || CT == CacheType::kFloat16 ? 2
                                                                               : 1;
  for (; d < hd; d += 16) {
    const __m512i a = _mm512_castps_si512(vload_cache<CT>(v0 + d * es));
    const __m512i b = v1 != nullptr ? _mm512_castps_si512(vload_cache<CT>(v1 + d * es))
                                    : _mm512_setzero_si512();
    // (a >> 16) | (b & 0xFFFF0000): 0xF8 is A | (B & C)
    _mm512_storeu_si512(dst + d, _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 16), b,
                                                           _mm512_set1_epi32(~0xFFFF), 0xF8));
  }
}
#undef PAGEDLLM_BF16_FN

#define PAGEDLLM_ENGINE_BF16_DOT 1  // engine_prefill_impl.h: use bf16_scores_pass16,
                                    // bf16_prob_pairs, bf16_pv_pairs, pair_value_rows

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS

#define PAGEDLLM_ENGINE_LANE_SOFTMAX 1  // engine_impl.h: the decode tile's softmax in the lanes
#include "engine_impl.h"
#include "engine_prefill_impl.h"

namespace pagedllm::kernels {

const EngineOps& avx512_engine() {
  static const EngineOps ops{"avx512", &PAGEDLLM_ENGINE_NS::attend_task,
                             PAGEDLLM_ENGINE_NS::kE4M3ReadMul, &PAGEDLLM_ENGINE_NS::score_bounds,
                             &PAGEDLLM_ENGINE_NS::prefill_task,
                             &PAGEDLLM_ENGINE_NS::prefill_work_floats,
                             &PAGEDLLM_ENGINE_NS::attend_heads};
  return ops;
}

}  // namespace pagedllm::kernels
