// The "avx512_bf16" CPU engine: the avx512 engine, except that attention over bf16 and fp8 K/V
// (head_dim a multiple of 32) runs a kernel whose q.k and p.v products are AVX512_BF16 dot
// products: vdpbf16ps adds two bf16 x bf16 products into each fp32 lane per instruction, so a
// bf16 key row is used as loaded (no widening) and the multiply-adds per byte halve.
// fp8 bytes become bf16 in the loads, exactly, by two vpermi2b table lookups per 64 bytes.
// This file is compiled with -mavx512bf16 -mavx512vbmi plus the avx512 engine's flags and is
// only called after a run-time CPU check (attention.cpp). Like engine_impl.h it uses no
// standard-library code (no ODR hazard with the other compilations).
//
// Numerics (docs/ARCHITECTURE.md, "bf16 dot-product decode"):
// - the query rows are rounded to bf16 once per task, unscaled (the softmax scale and the fp8
//   factors, AttendTask::q_mul, multiply the fp32 scores): exact for a bf16 query (a bf16
//   model's, which is why "auto" decodes such queries on fp8 caches here: attention.cpp);
//   an fp32 query's scores gain an error of at most u * sum_d |q_d k_d|, u = 2^-8 the bf16
//   unit roundoff;
// - the probabilities are rounded to bf16 for p.v and the running sum adds the rounded values,
//   so the output weights still sum to 1 and each is within 2u of its exact value;
// - the products are exact in fp32 and the sums fp32 (vdpbf16ps flushes fp32 denormals and
//   reads bf16 denormals as 0: the fp8 conversions below never produce bf16 denormals);
// - fp32 and fp16 K/V, and other head sizes, go to the avx512 engine unchanged (exact).
//
// Loop structure of one task, as in engine_impl.h: chunks of up to kChunk tokens whose row
// addresses are gathered first, the chunk kAhead ahead prefetched slice by slice while the
// current one computes; per chunk, register tiles of up to 4 query rows:
//   scores  s[r][t] = q_r . k_t  (R rows x TT tokens <= 16 accumulators, one reduction)
//   softmax m' = max(m, max_t s), p = bf16(exp(s - m')), l = l e^(m - m') + sum p, acc *= ...
//   values  acc_r += sum_t p[r][t] v_t, two tokens per vdpbf16ps: the V rows of a token pair
//           interleaved by vpunpck{l,h}wd, which leaves acc in a permuted order within blocks
//           of 32 or 64 elements (permuted in at the task's start and back at its end).
#define PAGEDLLM_ISA_SPECIFIC_TU 1

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and warn about it when inlined
// into loops (GCC bug 105593, a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "chunk_rows.h"  // Chunk, gather_chunk, prefetch_range / _lines / _chunk, chunk_tokens
#include "engine.h"
#include "engine_avx512_math.h"  // vexp, vsum16 (the avx512 engine's)
#include "engine_lane_softmax.h"
#include "fp8_bf16_avx512.h"

namespace pagedllm::kernels {
namespace avx512_bf16_engine_ns {
namespace {

constexpr int kTile = 4;         // query rows per register tile
constexpr int kMaxRows = 32;     // query rows converted to bf16 at once (larger tasks: slices)
constexpr int kMaxHeadDim = 512;
constexpr int kAhead = 2;        // chunks prefetched ahead (as engine_impl.h)
constexpr float kNegInf = -__builtin_inff();

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

// ---- the permuted layouts -------------------------------------------------------------------
//
// p.v interleaves two tokens' rows with vpunpck{l,h}wd, so acc rows are held permuted within
// blocks of elements, and fp8 keys come out of fp8x64_to_bf16 permuted, so the bf16 query is
// stored in the same order (the dot product does not care about the order, only that both
// agree). Rows are permuted in at a task's start and back at its end (a few shuffles per 16
// elements).
// - 32-element blocks (bf16; fp8's last block when head_dim % 64 == 32): element 8 L + j of the
//   block sits at 4 L + j (j < 4, the vpunpcklwd vector) or 16 + 4 L + j - 4 (vpunpckhwd);
// - 64-element blocks (fp8): element 16 L + 4 k + i of the block sits at 16 k + 4 L + i (k-th
//   of the four vpunpck{l,h}wd vectors of the two vpunpck{l,h}bw halves), and the query's
//   element 16 L + j at 8 L + j (j < 8) or 32 + 8 L + j - 8.

// x[0, 32) = its two halves a = x[0, 16) and b = x[16, 32) through two-source permutes: lane
// i of lo / hi picks a[i'] for i' < 16 and b[i' - 16] above.
inline void permute32(float* x, __m512i lo, __m512i hi) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  _mm512_storeu_ps(x, _mm512_permutex2var_ps(a, lo, b));
  _mm512_storeu_ps(x + 16, _mm512_permutex2var_ps(a, hi, b));
}

// The 32-element blocks' permutation: positions 0-15 hold elements 0-3, 8-11, 16-19, 24-27
// and positions 16-31 the other quads.
inline void acc32_in(float* x) {
  permute32(x, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
            _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31));
}

// acc32_in undone.
inline void acc32_out(float* x) {
  permute32(x, _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
            _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31));
}

// The 64-element blocks' permutation: the 4 x 4 transpose of the block's 4-element quads
// (vector k of the result = quad k of each of the 4 vectors); its own inverse.
inline void acc64_transpose(float* x) {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
  const __m512 t0 = _mm512_shuffle_f32x4(x0, x1, 0x44), t1 = _mm512_shuffle_f32x4(x0, x1, 0xEE);
  const __m512 t2 = _mm512_shuffle_f32x4(x2, x3, 0x44), t3 = _mm512_shuffle_f32x4(x2, x3, 0xEE);
  _mm512_storeu_ps(x, _mm512_shuffle_f32x4(t0, t2, 0x88));
  _mm512_storeu_ps(x + 16, _mm512_shuffle_f32x4(t0, t2, 0xDD));
  _mm512_storeu_ps(x + 32, _mm512_shuffle_f32x4(t1, t3, 0x88));
  _mm512_storeu_ps(x + 48, _mm512_shuffle_f32x4(t1, t3, 0xDD));
}

// row[0, hd) from natural order to the acc layout (in) or back (out).
template <CacheType CT>
inline void permute_acc(float* row, int hd, bool in) {
  int d = 0;
  if constexpr (is_fp8<CT>()) {
    for (; d + 64 <= hd; d += 64) acc64_transpose(row + d);
  }
  for (; d < hd; d += 32) {
    if (in) {
      acc32_in(row + d);
    } else {
      acc32_out(row + d);
    }
  }
}

// qb[0, hd) = the query row q in bf16, in the keys' order: 64-element blocks (fp8) as
// fp8x64_to_bf16 leaves the keys (elements 0-7 and 16-23 of the block, then 32-39 and 48-55,
// then the other halves of each 16), 32-element ones as they are.
template <CacheType CT>
inline void query_to_bf16(const float* q, int hd, uint16_t* qb) {
  int d = 0;
  if constexpr (is_fp8<CT>()) {
    for (; d + 64 <= hd; d += 64) {
      const __m512 x0 = _mm512_loadu_ps(q + d), x1 = _mm512_loadu_ps(q + d + 16);
      const __m512 x2 = _mm512_loadu_ps(q + d + 32), x3 = _mm512_loadu_ps(q + d + 48);
      const __m512bh first = _mm512_cvtne2ps_pbh(_mm512_shuffle_f32x4(x2, x3, 0x44),
                                                 _mm512_shuffle_f32x4(x0, x1, 0x44));
      const __m512bh second = _mm512_cvtne2ps_pbh(_mm512_shuffle_f32x4(x2, x3, 0xEE),
                                                  _mm512_shuffle_f32x4(x0, x1, 0xEE));
      _mm512_storeu_si512(qb + d, reinterpret_cast<__m512i>(first));
      _mm512_storeu_si512(qb + d + 32, reinterpret_cast<__m512i>(second));
    }
  }
  for (; d < hd; d += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + d + 16), _mm512_loadu_ps(q + d));
    _mm512_storeu_si512(qb + d, reinterpret_cast<__m512i>(b));
  }
}

// ---- one register tile ---------------------------------------------------------------------

// mul * (q_r . k_t) for the R bf16 query rows qb ([R, hd]) and t < n, TT = 16 / R tokens at a
// time: sink(t0, sums) gets lane r TT + j = row r's score of token t0 + j (j < TT; lanes of tokens
// at or past n and lanes from R TT up hold junk). Prefetches the K rows of the chunk ahead when
// `next` is set.
template <CacheType CT, int R, class Sink>
void tile_scores(const uint16_t* qb, int hd, float mul, const Chunk& c, int n, const Chunk* next,
                 Sink&& sink) {
  constexpr int TT = 16 / R;  // tokens per pass: R x TT <= 16 accumulators
  constexpr int es = cache_elem_size<CT>();
  for (int t0 = 0; t0 < n; t0 += TT) {
    const uint8_t* kp[TT];
    for (int j = 0; j < TT; ++j) kp[j] = c.k[imin(t0 + j, n - 1)];  // tail: repeat, then drop
    if (next != nullptr) {
      for (int j = 0; j < TT && t0 + j < next->n; ++j) prefetch_range(next->k[t0 + j], 0, hd * es);
    }
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    int d = 0;
    if constexpr (is_fp8<CT>()) {
      for (; d + 64 <= hd; d += 64) {  // 64 bytes per load, the query in the matching order
        for (int j = 0; j < TT; ++j) {
          __m512i w0, w1;
          fp8x64_to_bf16<CT>(kp[j] + d, &w0, &w1);
          for (int r = 0; r < R; ++r) {
            const __m512bh q0 = as_bh(_mm512_loadu_si512(qb + r * hd + d));
            const __m512bh q1 = as_bh(_mm512_loadu_si512(qb + r * hd + d + 32));
            acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], q0, as_bh(w0));
            acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], q1, as_bh(w1));
          }
        }
      }
    }
    for (; d < hd; d += 32) {
      for (int j = 0; j < TT; ++j) {
        const __m512bh kv = as_bh(load_bf16x32<CT>(kp[j] + d * es));
        for (int r = 0; r < R; ++r) {
          const __m512bh qv = as_bh(_mm512_loadu_si512(qb + r * hd + d));
          acc[r * TT + j] = _mm512_dpbf16_ps(acc[r * TT + j], qv, kv);
        }
      }
    }
    sink(t0, _mm512_mul_ps(vsum16(acc), _mm512_set1_ps(mul)));
  }
}

// s[r][t] = the tile's scores (tile_scores), t < n: each row's lanes stored straight from the
// register, masked to tokens below n. The store's lane 0 sits r TT floats before s[r][t0], still
// inside s (TT <= kChunk); masked-off lanes are never accessed.
template <CacheType CT, int R>
void scores_to_rows(const uint16_t* qb, int hd, float mul, const Chunk& c, int n,
                    const Chunk* next, float (*s)[kChunk]) {
  constexpr int TT = 16 / R;
  tile_scores<CT, R>(qb, hd, mul, c, n, next, [&](int t0, __m512 sums) {
    const __mmask16 tokens = static_cast<__mmask16>((1u << imin(TT, n - t0)) - 1);
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(&s[r][t0] - r * TT, static_cast<__mmask16>(tokens << (r * TT)), sums);
    }
  });
}

// acc[0, hd) *= a (every lane a).
inline void scale_acc_row(float* acc, int hd, __m512 a) {
  for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), a));
}

// Online-softmax step of one row: p[0, nw) = bf16(exp(s - m')) (0 before `first` and at and
// past `visible`, first < visible, nw = n rounded up to 16), updates max / sum (of the rounded
// p) and rescales the row's acc.
inline void row_softmax(float* s, int first, int visible, int n, float* row_max, float* row_sum,
                        float* acc, int hd, uint16_t* p) {
  const int nw = (n + 15) & ~15;
  for (int t = 0; t < first; ++t) s[t] = kNegInf;
  for (int t = visible; t < nw; ++t) s[t] = kNegInf;
  __m512 mv = _mm512_set1_ps(kNegInf);
  for (int t = 0; t < nw; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + t));
  const float m_old = *row_max;
  const float m_blk = _mm512_reduce_max_ps(mv);
  const float m_new = m_old > m_blk ? m_old : m_blk;
  const __m512 shift = _mm512_set1_ps(-m_new);
  __m512 sumv = _mm512_setzero_ps();
  for (int t = 0; t < nw; t += 16) {
    const __m256i pb = reinterpret_cast<__m256i>(
        _mm512_cvtneps_pbh(vexp(_mm512_add_ps(_mm512_loadu_ps(s + t), shift))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + t), pb);
    const __m512 rounded = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16));
    sumv = _mm512_add_ps(sumv, rounded);
  }
  alignas(64) float alphas[16];
  _mm512_store_ps(alphas, vexp(_mm512_set1_ps(m_old - m_new)));
  const float alpha = m_old == kNegInf ? 0.0f : alphas[0];
  *row_sum = *row_sum * alpha + _mm512_reduce_add_ps(sumv);
  *row_max = m_new;
  if (alpha != 1.0f) scale_acc_row(acc, hd, _mm512_set1_ps(alpha));
}

// ---- the decode tile's softmax in the scores' lanes (engine_lane_softmax.h) ---------------------

// p[r][t0, t0 + TT) = the bf16 lanes r TT + j of pb (TT = 16 / R; t0 + TT <= kChunk for R != 3:
// plain stores of the rows' pieces; R = 3 stores masked, inside p for the same reason as
// scores_to_rows).
template <int R>
inline void store_p_rows(__m256i pb, uint16_t (*p)[kChunk], int t0) {
  if constexpr (R == 4) {
    const __m128i lo = _mm256_castsi256_si128(pb), hi = _mm256_extracti128_si256(pb, 1);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p[0] + t0), lo);
    _mm_storeh_pd(reinterpret_cast<double*>(p[1] + t0), _mm_castsi128_pd(lo));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p[2] + t0), hi);
    _mm_storeh_pd(reinterpret_cast<double*>(p[3] + t0), _mm_castsi128_pd(hi));
  } else if constexpr (R == 2) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p[0] + t0), _mm256_castsi256_si128(pb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p[1] + t0), _mm256_extracti128_si256(pb, 1));
  } else if constexpr (R == 1) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p[0] + t0), pb);
  } else {
    constexpr int TT = 16 / R;
    const int k = imin(TT, kChunk - t0);
    for (int r = 0; r < R; ++r) {
      _mm256_mask_storeu_epi16(p[r] + t0 - r * TT, static_cast<__mmask16>(((1u << k) - 1) << (r * TT)), pb);
    }
  }
}

// p[r][0, n) = bf16(exp(score + shift)) from the score vectors sv (lane r TT + j: row r, token
// t0 + j; -inf past n), and p[r][n] = 0 when n is odd (the values' last pair); returns the lanes'
// sums of the rounded p.
template <int R>
inline __m512 lane_probabilities(const float (*sv)[16], int n, __m512 shift, uint16_t (*p)[kChunk]) {
  constexpr int TT = 16 / R;
  __m512 lsum = _mm512_setzero_ps();
  for (int t0 = 0; t0 < n; t0 += TT) {
    const __m256i pb = reinterpret_cast<__m256i>(
        _mm512_cvtneps_pbh(vexp(_mm512_add_ps(_mm512_load_ps(sv[t0 / TT]), shift))));
    store_p_rows<R>(pb, p, t0);
    lsum = _mm512_add_ps(lsum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16)));
  }
  if (n & 1) {
    for (int r = 0; r < R; ++r) p[r][n] = 0;
  }
  return lsum;
}

// The tile's scores (tile_scores) and its online-softmax step for rows that all see the chunk's
// n tokens: p[r][0, n) = bf16(exp(s - m')) (and p[r][n] = 0 when n is odd, the values' last
// pair), each row's max and sum (of the rounded p) updated and its acc rescaled, as row_softmax
// does for one row.
template <CacheType CT, int R>
void scores_softmax_lanes(const AttendTask& task, const uint16_t* qb, int row0, const Chunk& c,
                          int n, const Chunk* next, uint16_t (*p)[kChunk]) {
  const int hd = task.head_dim;
  LaneScores<R> ls;
  tile_scores<CT, R>(qb + row0 * hd, hd, task.q_mul, c, n, next,
                     [&](int t0, __m512 sums) { ls.add(t0, n, sums); });
  const LaneStep st = lane_step_begin<R>(ls.mx, task.row_max + row0);
  const __m512 lsum = lane_probabilities<R>(ls.sv, n, st.shift, p);
  lane_step_end<R>(st, lsum, task.row_sum + row0, [&](int r, __m512 alpha) {
    scale_acc_row(task.acc + (row0 + r) * hd, hd, alpha);
  });
}

// acc_r[d, d + 32 * NB) += sum_t p[r][t] v_t over the same elements for the R rows (acc in the
// permuted layout), for every d0 <= d < d1 in steps of 32 * NB; two tokens per vdpbf16ps (n
// odd: the last pair's second row repeats the first with p = 0). Prefetches the same bytes of
// the chunk ahead's V rows when `next` is set. Returns the first d not done.
template <CacheType CT, int R, int NB>
int tile_values(const Chunk& c, int n, const Chunk* next, const uint16_t (*p)[kChunk], float* acc,
                int hd, int d0) {
  constexpr int es = cache_elem_size<CT>();
  constexpr int kLines = (32 * NB * es + 63) / 64;  // lines of a V row's slice (d * es % 64 == 0)
  const int pf_n = next != nullptr ? imin(n, next->n) : 0;
  int d = d0;
  for (; d + 32 * NB <= hd; d += 32 * NB) {
    __m512 o[R][2 * NB];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 2 * NB; ++i) o[r][i] = _mm512_loadu_ps(acc + r * hd + d + 16 * i);
    for (int t = 0; t < n; t += 2) {
      const uint8_t* va = c.v[t];
      const uint8_t* vb = c.v[imin(t + 1, n - 1)];
      if (t < pf_n) prefetch_lines<kLines>(next->v[t] + d * es);
      if (t + 1 < pf_n) prefetch_lines<kLines>(next->v[t + 1] + d * es);
      __m512bh lo[NB], hi[NB];
      for (int b = 0; b < NB; ++b) {
        const __m512i a = load_bf16x32<CT>(va + (d + 32 * b) * es);
        const __m512i bb = load_bf16x32<CT>(vb + (d + 32 * b) * es);
        lo[b] = as_bh(_mm512_unpacklo_epi16(a, bb));
        hi[b] = as_bh(_mm512_unpackhi_epi16(a, bb));
      }
      for (int r = 0; r < R; ++r) {
        const __m512bh pp = as_bh(_mm512_broadcastd_epi32(_mm_loadu_si32(p[r] + t)));
        for (int b = 0; b < NB; ++b) {
          o[r][2 * b] = _mm512_dpbf16_ps(o[r][2 * b], lo[b], pp);
          o[r][2 * b + 1] = _mm512_dpbf16_ps(o[r][2 * b + 1], hi[b], pp);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 2 * NB; ++i) _mm512_storeu_ps(acc + r * hd + d + 16 * i, o[r][i]);
  }
  return d;
}

// tile_values for fp8 over the 64-element blocks from d0 (acc in their layout): the two tokens'
// bf16 halves from fp8x64_to_bf16 interleaved by vpunpck{l,h}wd, 4 accumulators per row.
template <CacheType CT, int R>
int tile_values_fp8x64(const Chunk& c, int n, const Chunk* next, const uint16_t (*p)[kChunk],
                       float* acc, int hd, int d0) {
  const int pf_n = next != nullptr ? imin(n, next->n) : 0;
  int d = d0;
  for (; d + 64 <= hd; d += 64) {
    __m512 o[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) o[r][i] = _mm512_loadu_ps(acc + r * hd + d + 16 * i);
    for (int t = 0; t < n; t += 2) {
      if (t < pf_n) prefetch_lines<1>(next->v[t] + d);
      if (t + 1 < pf_n) prefetch_lines<1>(next->v[t + 1] + d);
      __m512i a0, a1, b0, b1;
      fp8x64_to_bf16<CT>(c.v[t] + d, &a0, &a1);
      fp8x64_to_bf16<CT>(c.v[imin(t + 1, n - 1)] + d, &b0, &b1);
      const __m512bh pv[4] = {as_bh(_mm512_unpacklo_epi16(a0, b0)),
                              as_bh(_mm512_unpackhi_epi16(a0, b0)),
                              as_bh(_mm512_unpacklo_epi16(a1, b1)),
                              as_bh(_mm512_unpackhi_epi16(a1, b1))};
      for (int r = 0; r < R; ++r) {
        const __m512bh pp = as_bh(_mm512_broadcastd_epi32(_mm_loadu_si32(p[r] + t)));
        for (int i = 0; i < 4; ++i) o[r][i] = _mm512_dpbf16_ps(o[r][i], pv[i], pp);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + r * hd + d + 16 * i, o[r][i]);
  }
  return d;
}

// One register tile of R <= 4 query rows (starting at row0) against one chunk; `next` (the
// chunk kAhead ahead, or null) is prefetched along the way.
template <CacheType CT, int R>
void attend_tile(const AttendTask& task, const uint16_t* qb, int row0, const Chunk& c,
                 const Chunk* next) {
  const int hd = task.head_dim;
  int first[R], visible[R];  // row r sees the chunk's tokens [first[r], visible[r])
  int n = 0;  // tokens any row of the tile sees
  for (int r = 0; r < R; ++r) {
    visible[r] = imax(0, imin(c.n, task.row_limit[row0 + r] - c.pos0));
    first[r] = task.row_start == nullptr
                   ? 0
                   : imax(0, imin(c.n, task.row_start[row0 + r] - c.pos0));
    if (first[r] < visible[r]) n = imax(n, visible[r]);
  }
  if (n == 0) return;
  alignas(64) uint16_t p[R][kChunk];
  bool whole = true;  // every row sees all n tokens (decode)
  for (int r = 0; r < R; ++r) whole = whole && first[r] == 0 && visible[r] == n;
  if (whole) {
    scores_softmax_lanes<CT, R>(task, qb, row0, c, n, next, p);
  } else {
    alignas(64) float s[R][kChunk];
    scores_to_rows<CT, R>(qb + row0 * hd, hd, task.q_mul, c, n, next, s);
    for (int r = 0; r < R; ++r) {
      if (first[r] >= visible[r]) {
        for (int t = 0; t < n + 1 && t < kChunk; ++t) p[r][t] = 0;
        continue;
      }
      row_softmax(s[r], first[r], visible[r], n, task.row_max + row0 + r,
                  task.row_sum + row0 + r, task.acc + (row0 + r) * hd, hd, p[r]);
    }
  }
  float* acc = task.acc + row0 * hd;
  // Blocks of 64 (fp8: converted 64 at a time; bf16: 2 blocks of 32; 16 accumulators at
  // R = 4), then a last block of 32 when hd % 64 == 32.
  int d = 0;
  if constexpr (is_fp8<CT>()) {
    d = tile_values_fp8x64<CT, R>(c, n, next, p, acc, hd, 0);
  } else {
    d = tile_values<CT, R, 2>(c, n, next, p, acc, hd, 0);
  }
  if (d < hd) tile_values<CT, R, 1>(c, n, next, p, acc, hd, d);
}

template <CacheType CT>
void attend_rows(const AttendTask& task, const uint16_t* qb, int row0, int rows, const Chunk& c,
                 const Chunk* next) {
  switch (rows) {
    case 1: attend_tile<CT, 1>(task, qb, row0, c, next); return;
    case 2: attend_tile<CT, 2>(task, qb, row0, c, next); return;
    case 3: attend_tile<CT, 3>(task, qb, row0, c, next); return;
    default: attend_tile<CT, 4>(task, qb, row0, c, next); return;
  }
}

// The task (<= kMaxRows rows, acc in the permuted layout, qb its rows in bf16) over its range.
template <CacheType CT>
void attend_typed(const AttendTask& task, const uint16_t* qb) {
  int limit = 0;
  for (int r = 0; r < task.num_rows; ++r) limit = imax(limit, task.row_limit[r]);
  const int end = imin(task.token_end, limit);
  if (task.token_begin >= end) return;
  int first_limit = 0;  // the furthest token the first register tile reads
  for (int r = 0; r < imin(kTile, task.num_rows); ++r)
    first_limit = imax(first_limit, task.row_limit[r]);
  const int kTokens = chunk_tokens<CT>(task.head_dim);
  constexpr int kRing = kAhead + 1;
  Chunk chunks[kRing];
  int pos = task.token_begin;  // the first token not yet gathered
  for (int i = 0; i < kAhead && pos < end; ++i) {  // the first chunks: requested at once
    gather_chunk<CT>(task, pos, imin(kTokens, end - pos), &chunks[i]);
    prefetch_chunk<CT>(chunks[i], task.head_dim);
    pos += chunks[i].n;
  }
  for (int i = 0;; ++i) {
    const Chunk& c = chunks[i % kRing];
    const Chunk* ahead = nullptr;
    if (pos < end) {
      Chunk* a = &chunks[(i + kAhead) % kRing];
      gather_chunk<CT>(task, pos, imin(kTokens, end - pos), a);
      pos += a->n;
      ahead = a;
      if (first_limit < c.pos0 + c.n) {  // the first tile stops short of c: request at once
        prefetch_chunk<CT>(*a, task.head_dim);
        ahead = nullptr;
      }
    }
    for (int row0 = 0; row0 < task.num_rows; row0 += kTile) {
      attend_rows<CT>(task, qb, row0, imin(kTile, task.num_rows - row0), c,
                      row0 == 0 ? ahead : nullptr);
    }
    if (c.pos0 + c.n >= end) break;
  }
}

// A task's rows (<= kMaxRows) into the decode's form: q to bf16 (in the keys' order) into qb,
// acc permuted in.
template <CacheType CT>
void enter_rows(const AttendTask& task, uint16_t* qb) {
  const int hd = task.head_dim;
  for (int r = 0; r < task.num_rows; ++r) {
    query_to_bf16<CT>(task.q + r * hd, hd, qb + r * hd);
    permute_acc<CT>(task.acc + r * hd, hd, true);
  }
}

// acc permuted back out.
template <CacheType CT>
void leave_rows(const AttendTask& task) {
  const int hd = task.head_dim;
  for (int r = 0; r < task.num_rows; ++r) permute_acc<CT>(task.acc + r * hd, hd, false);
}

// One slice of <= kMaxRows rows: in, the chunk loop, out.
template <CacheType CT>
void attend_slice(const AttendTask& task) {
  alignas(64) uint16_t qb[kMaxRows * kMaxHeadDim];
  enter_rows<CT>(task, qb);
  attend_typed<CT>(task, qb);
  leave_rows<CT>(task);
}

// The KV heads of one sequence in lockstep (chunks_in_lockstep), every head's rows in bf16 in
// one buffer (num x num_rows x head_dim <= kMaxRows x kMaxHeadDim).
template <CacheType CT>
void heads_typed(const LockstepCall& call) {
  const AttendTask* tasks = call.tasks;
  const int num = call.num;
  const long long per_head = static_cast<long long>(tasks[0].num_rows) * tasks[0].head_dim;
  alignas(64) uint16_t qb[kMaxRows * kMaxHeadDim];
  for (int h = 0; h < num; ++h) enter_rows<CT>(tasks[h], qb + h * per_head);
  chunks_in_lockstep<CT>(call, [&](int h, const Chunk& c, const Chunk* next) {
    const AttendTask& t = tasks[h];
    for (int row0 = 0; row0 < t.num_rows; row0 += kTile) {
      attend_rows<CT>(t, qb + h * per_head, row0, imin(kTile, t.num_rows - row0), c,
                      row0 == 0 ? next : nullptr);
    }
  });
  for (int h = 0; h < num; ++h) leave_rows<CT>(tasks[h]);
}

bool decodes(CacheType cache_dtype, int head_dim) {
  return (cache_dtype == CacheType::kBFloat16 || cache_dtype == CacheType::kFp8E4M3 ||
          cache_dtype == CacheType::kFp8E5M2) &&
         head_dim % 32 == 0 && head_dim <= kMaxHeadDim;
}

// The engine's attend: bf16 / fp8 K/V with head_dim % 32 == 0 here (scores times q_mul), in
// slices of kMaxRows rows; everything else through the avx512 engine.
void attend_task(const AttendTask& task) {
  if (!decodes(task.cache_dtype, task.head_dim)) {
    avx512_engine().attend(task);
    return;
  }
  for (int r0 = 0; r0 < task.num_rows; r0 += kMaxRows) {
    AttendTask slice = task;
    const int64_t off = static_cast<int64_t>(r0) * task.head_dim;
    slice.num_rows = imin(kMaxRows, task.num_rows - r0);
    slice.q = task.q + off;
    slice.acc = task.acc + off;
    slice.row_limit = task.row_limit + r0;
    slice.row_start = task.row_start != nullptr ? task.row_start + r0 : nullptr;
    slice.row_max = task.row_max + r0;
    slice.row_sum = task.row_sum + r0;
    switch (task.cache_dtype) {
      case CacheType::kBFloat16: attend_slice<CacheType::kBFloat16>(slice); break;
      case CacheType::kFp8E4M3: attend_slice<CacheType::kFp8E4M3>(slice); break;
      default: attend_slice<CacheType::kFp8E5M2>(slice); break;  // the three types `ours` has
    }
  }
}

// The engine's attend_heads: bf16 / fp8 K/V (as attend_task) in lockstep when every head's
// query rows fit one bf16 buffer, each head on its own otherwise; everything else through the
// avx512 engine.
void attend_heads(const LockstepCall& call) {
  const AttendTask& t0 = call.tasks[0];
  if (!decodes(t0.cache_dtype, t0.head_dim)) {
    avx512_engine().attend_heads(call);
    return;
  }
  if (t0.num_rows > kMaxRows ||
      static_cast<long long>(call.num) * t0.num_rows * t0.head_dim > kMaxRows * kMaxHeadDim) {
    // (call.next goes unused: every unit of a decode call has this shape, so no lockstep
    // call follows that would count on its first rows being requested)
    for (int h = 0; h < call.num; ++h) attend_task(call.tasks[h]);
    return;
  }
  switch (t0.cache_dtype) {
    case CacheType::kBFloat16: heads_typed<CacheType::kBFloat16>(call); return;
    case CacheType::kFp8E4M3: heads_typed<CacheType::kFp8E4M3>(call); return;
    default: heads_typed<CacheType::kFp8E5M2>(call); return;
  }
}

}  // namespace
}  // namespace avx512_bf16_engine_ns

bool avx512_bf16_decodes(CacheType cache_dtype, int head_dim) {
  return avx512_bf16_engine_ns::decodes(cache_dtype, head_dim);
}

const EngineOps& avx512_bf16_engine() {
  // The avx512 engine's entries (bounds scoring, and the same e4m3 read factor: 2^-8 here
  // too), with this decode kernel for attend.
  static const EngineOps ops = [] {
    EngineOps o = avx512_engine();
    o.name = "avx512_bf16";
    o.attend = &avx512_bf16_engine_ns::attend_task;
    o.attend_heads = &avx512_bf16_engine_ns::attend_heads;
    return o;
  }();
  return ops;
}

}  // namespace pagedllm::kernels
