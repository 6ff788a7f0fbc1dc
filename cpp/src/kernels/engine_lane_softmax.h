// engine_lane_softmax.h (internal) — the online-softmax step of a decode register tile whose
// scores stay in the lanes vsum16 leaves them in, shared by the avx512 engine (engine_impl.h,
// PAGEDLLM_ENGINE_LANE_SOFTMAX) and the avx512_bf16 engine.
//
// A tile of R query rows scores TT = 16 / R tokens per reduction: lane r TT + j of a score
// vector is row r's score of token t0 + j. When every row sees all n tokens of a chunk (decode),
// the scores stay in those vectors (one per TT tokens, -inf in the lanes of tokens at or past n
// and in the lanes from R TT up), the chunk's max is gathered while they are computed
// (mx = max over the vectors), every exp covers all R rows at once, and the rows' max, alpha and
// sum are found together: by butterflies over the rows' lane groups when TT is a power of two
// (R = 1, 2, 4, 8), by one masked reduction per row otherwise. The per-row path this replaces
// stored each score, reloaded them for a max pass and an exp pass, and paid two full reductions
// and a scalar exp per row and chunk (docs/BENCHMARKS.md).
//
// Internal linkage and no standard-library code, as engine_avx512_math.h; include only from files
// compiled with at least -mavx512f -mavx512dq -mavx2 -mfma.
#pragma once

#include <immintrin.h>

#include "chunk_rows.h"           // kChunk
#include "engine_avx512_math.h"  // vexp

namespace pagedllm::kernels {
namespace {

// Lanes r TT + j, r < R and j < k (k <= TT = 16 / R): the R rows' first k tokens of a vector.
template <int R>
inline __mmask16 tile_lanes(int k) {
  constexpr int TT = 16 / R;
  unsigned m = 0;
  for (int r = 0; r < R; ++r) m |= ((1u << k) - 1) << (r * TT);
  return static_cast<__mmask16>(m);
}

// Row r's lanes of a vector.
template <int R>
inline __mmask16 row_lanes(int r) {
  constexpr int TT = 16 / R;
  return static_cast<__mmask16>(((1u << TT) - 1) << (r * TT));
}

// A chunk's score vectors for R rows, one per TT = 16 / R tokens, as tile_scores hands them
// over: sv[t0 / TT] with -inf in the lanes of tokens at or past n and from R TT up, and mx, their
// lane-wise max (a NaN score reaches it: max's second operand wins).
template <int R>
struct LaneScores {
  static constexpr int TT = 16 / R;
  alignas(64) float sv[(kChunk + TT - 1) / TT][16];
  __m512 mx = _mm512_set1_ps(-__builtin_inff());

  void add(int t0, int n, __m512 sums) {
    const int k = n - t0 < TT ? n - t0 : TT;
    const __m512 v = _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), tile_lanes<R>(k), sums);
    _mm512_store_ps(sv[t0 / TT], v);
    mx = _mm512_max_ps(mx, v);
  }
};

// Whether the rows' lane groups (TT = 16 / R lanes) are powers of two, reduced by butterflies.
template <int R>
constexpr bool butterfly_groups() {
  return R == 1 || R == 2 || R == 4 || R == 8;
}

// Every lane of a row's group gets op over the group (butterfly_groups<R>()): swaps of lane
// pairs and quads inside the 128-bit lanes, then swaps of 128-bit lanes.
template <int R, class Op>
inline __m512 group_all(__m512 x, Op op) {
  static_assert(butterfly_groups<R>(), "groups of 2, 4, 8 or 16 lanes");
  x = op(x, _mm512_permute_ps(x, 0xB1));  // lanes [1, 0, 3, 2] of each 128-bit lane
  if constexpr (R <= 4) x = op(x, _mm512_permute_ps(x, 0x4E));  // [2, 3, 0, 1]
  if constexpr (R <= 2) x = op(x, _mm512_shuffle_f32x4(x, x, 0xB1));  // 128-bit lanes [1, 0, 3, 2]
  if constexpr (R == 1) x = op(x, _mm512_shuffle_f32x4(x, x, 0x4E));  // [2, 3, 0, 1]
  return x;
}

// One row group's online-softmax step: m' = max(m, the chunk's max), p = exp(s - m'),
// l = l alpha + sum p, acc *= alpha with alpha = e^(m - m') (0 for a row with no max yet).
struct LaneStep {
  __m512 shift;  // -m' in each row's lanes (0 in unused lanes): p = vexp(s + shift)
  __m512 alpha;  // alpha in each row's lanes
};

// Starts the step for R rows from the chunk's score maxima mx (lane-wise over its vectors):
// row_max[0, R) = m', as row_softmax: m > m_blk ? m : m_blk (a NaN block max is kept).
template <int R>
inline LaneStep lane_step_begin(__m512 mx, float* row_max) {
  constexpr int TT = 16 / R;
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 m_old, m_new;
  if constexpr (butterfly_groups<R>()) {
    constexpr int kLog2 = R == 8 ? 1 : R == 4 ? 2 : R == 2 ? 3 : 4;  // log2(TT)
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 rows = static_cast<__mmask16>((1u << R) - 1);
    m_old = _mm512_permutexvar_ps(_mm512_srli_epi32(iota, kLog2),  // lane l: row l / TT
                                  _mm512_maskz_loadu_ps(rows, row_max));
    m_new = _mm512_max_ps(m_old, group_all<R>(mx, [](__m512 a, __m512 b) {
                            return _mm512_max_ps(a, b);
                          }));
    _mm512_mask_storeu_ps(row_max, rows,
                          _mm512_permutexvar_ps(_mm512_slli_epi32(iota, kLog2), m_new));
  } else {
    alignas(64) float olds[16] = {}, news[16] = {};  // 0 in the lanes from R TT up
    for (int r = 0; r < R; ++r) {
      const float m_blk = _mm512_mask_reduce_max_ps(row_lanes<R>(r), mx);
      const float m = row_max[r] > m_blk ? row_max[r] : m_blk;
      for (int j = 0; j < TT; ++j) {
        olds[r * TT + j] = row_max[r];
        news[r * TT + j] = m;
      }
      row_max[r] = m;
    }
    m_old = _mm512_load_ps(olds);
    m_new = _mm512_load_ps(news);
  }
  const __mmask16 seen = _mm512_cmp_ps_mask(m_old, neg_inf, _CMP_NEQ_UQ);
  return {_mm512_sub_ps(_mm512_setzero_ps(), m_new),
          _mm512_maskz_mov_ps(seen, vexp(_mm512_sub_ps(m_old, m_new)))};
}

// Ends the step: row_sum[r] = row_sum[r] alpha + the sum of row r's lanes of lsum (the lane-wise
// sums of the chunk's p), then rescale(r, alpha in every lane) for each row whose alpha != 1.
template <int R, class Rescale>
inline void lane_step_end(const LaneStep& st, __m512 lsum, float* row_sum, Rescale&& rescale) {
  constexpr int TT = 16 / R;
  if constexpr (butterfly_groups<R>()) {
    constexpr int kLog2 = R == 8 ? 1 : R == 4 ? 2 : R == 2 ? 3 : 4;
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 rows = static_cast<__mmask16>((1u << R) - 1);
    const __m512 l_old = _mm512_permutexvar_ps(_mm512_srli_epi32(iota, kLog2),
                                               _mm512_maskz_loadu_ps(rows, row_sum));
    const __m512 l_new = _mm512_add_ps(_mm512_mul_ps(l_old, st.alpha),
                                       group_all<R>(lsum, [](__m512 a, __m512 b) {
                                         return _mm512_add_ps(a, b);
                                       }));
    _mm512_mask_storeu_ps(row_sum, rows,
                          _mm512_permutexvar_ps(_mm512_slli_epi32(iota, kLog2), l_new));
  } else {
    alignas(64) float alphas[16];
    _mm512_store_ps(alphas, st.alpha);
    for (int r = 0; r < R; ++r) {
      row_sum[r] = row_sum[r] * alphas[r * TT] + _mm512_mask_reduce_add_ps(row_lanes<R>(r), lsum);
    }
  }
  const unsigned changed = _mm512_cmp_ps_mask(st.alpha, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
  for (int r = 0; r < R; ++r) {
    if ((changed >> (r * TT)) & 1u) rescale(r, _mm512_permutexvar_ps(_mm512_set1_epi32(r * TT), st.alpha));
  }
}

}  // namespace
}  // namespace pagedllm::kernels
