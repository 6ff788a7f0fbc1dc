// engine_impl.h (internal) — the attention inner loop, written once over float vectors of kW
// lanes (8 or 16).
//
// No include guard on purpose: each ISA translation unit (engine_generic.cpp, engine_avx2.cpp,
// engine_avx512.cpp) first defines PAGEDLLM_ENGINE_NS and, inside namespace
// pagedllm::kernels::PAGEDLLM_ENGINE_NS, an anonymous namespace with these vector operations
// (V = kW floats, kW = 8 or 16):
//   vzero() vset1(f) vload(const float*) vstore(float*, V) vfmadd(a, b, c) = a * b + c
//   vadd(a, b) vmul(a, b) vmax(a, b) vexp(V) (exp(-inf) = 0) vhmax(V) vhsum(V)
//   vload8(const float*) -> 8 floats in the low lanes, 0 above; vstore8(float*, V): low 8 lanes
//   kAcc: accumulators per register tile (8 with 16 registers, 16 with 32)
//   vsum_tile(const V a[kAcc], float out[kAcc]) -> out[i] = sum of the lanes of a[i]
//   vload_cache<CacheType>(const uint8_t*) -> kW cache elements as floats
//   vload_cache2<CacheType>(const uint8_t*, V* lo, V* hi) -> 2 kW of them
//   vload_cache8<CacheType>(const uint8_t*) -> 8 of them in the low lanes, 0 above
//   kE4M3ReadMul: what vload_cache multiplies an fp8 e4m3 value by (a power of two that the
//   caller folds into the query and output scales; every other type reads exactly)
// (with kW = 8 the "8" forms are the full ones and are never reached: head_dim is a multiple
// of 8; with kW = 16 they handle a head_dim tail of 8 elements, and must not read past them)
// and, optionally, PAGEDLLM_ENGINE_LANE_SOFTMAX (16-lane engines with kAcc = 16 that include
// engine_lane_softmax.h: decode tiles run their online softmax in the scores' lanes),
// then includes this file, which adds attend_task() and attend_heads() (a sequence's KV heads
// in lockstep, chunk_rows.h) in the same namespaces. Everything has
// internal linkage, so the compilations never meet at link time (no ODR hazard), and this
// file uses no standard-library code for the same reason.
//
// Loop structure of one task: the token range is cut into chunks of up to kChunk tokens (from
// any number of blocks: their row addresses are gathered first, so block_size does not shape
// the loops); for each chunk, the query rows are taken in register tiles of up to 8 rows:
//   scores  s[r][t] = q_r . k_t        (R rows x TT tokens <= kAcc accumulators, one reduction)
//   softmax m' = max(m, max_t s), p = exp(s - m'), l = l * exp(m - m') + sum p, acc *= ...
//   values  acc_r += sum_t p[r][t] v_t (<= 4 rows x CC column vectors <= kAcc accumulators)
// All tiles of a chunk reuse the chunk's K/V rows from L1/L2, so K/V are read from memory once
// per task whatever the number of query rows (the GQA group, and in prefill its tokens).
// The rows of the chunk kAhead ahead are prefetched a slice at a time while the current one
// computes (prefetch_range), so memory requests stay in flight all along rather than in bursts.

#include "chunk_rows.h"  // Chunk, gather_chunk, prefetch_range / prefetch_chunk, chunk_tokens

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

constexpr int kTile = 8;     // query rows per register tile
constexpr float kNegInf = -__builtin_inff();

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

// q_r . k_t for the R rows of the tile and t < n, TT = kAcc / R tokens at a time:
// sink(t0, sums) gets sums[r TT + j] = row r's score of token t0 + j (j < TT; entries of tokens at
// or past n hold junk). Prefetches the same bytes of the K rows of the chunk ahead when `next`
// is set.
template <CacheType CT, int R, class Sink>
void tile_scores(const float* q, int hd, const Chunk& c, int n, const Chunk* next, Sink&& sink) {
  constexpr int TT = kAcc / R;  // tokens per pass
  constexpr int es = cache_elem_size<CT>();
  for (int t0 = 0; t0 < n; t0 += TT) {
    const uint8_t* kp[TT];
    for (int j = 0; j < TT; ++j) kp[j] = c.k[imin(t0 + j, n - 1)];  // tail: repeat, then drop
    if (next != nullptr) {
      for (int j = 0; j < TT && t0 + j < next->n; ++j) prefetch_range(next->k[t0 + j], 0, hd * es);
    }
    V acc[kAcc];
    for (int i = 0; i < kAcc; ++i) acc[i] = vzero();
    int d = 0;
    for (; d + 2 * kW <= hd; d += 2 * kW) {  // 2 kW elements per load: wide conversions
      for (int j = 0; j < TT; ++j) {
        V lo, hi;
        vload_cache2<CT>(kp[j] + d * es, &lo, &hi);
        for (int r = 0; r < R; ++r) {
          acc[r * TT + j] = vfmadd(vload(q + r * hd + d), lo, acc[r * TT + j]);
          acc[r * TT + j] = vfmadd(vload(q + r * hd + d + kW), hi, acc[r * TT + j]);
        }
      }
    }
    for (; d + kW <= hd; d += kW) {
      for (int j = 0; j < TT; ++j) {
        const V kv = vload_cache<CT>(kp[j] + d * es);
        for (int r = 0; r < R; ++r) acc[r * TT + j] = vfmadd(vload(q + r * hd + d), kv, acc[r * TT + j]);
      }
    }
    for (; d < hd; d += 8) {  // kW = 16 only: a tail of 8 elements
      for (int j = 0; j < TT; ++j) {
        const V kv = vload_cache8<CT>(kp[j] + d * es);
        for (int r = 0; r < R; ++r) acc[r * TT + j] = vfmadd(vload8(q + r * hd + d), kv, acc[r * TT + j]);
      }
    }
    alignas(64) float sums[kAcc];
    vsum_tile(acc, sums);
    sink(t0, static_cast<const float*>(sums));
  }
}

// s[r][t] = q_r . k_t for the R rows of the tile and t < n (tile_scores).
template <CacheType CT, int R>
void scores_to_rows(const float* q, int hd, const Chunk& c, int n, const Chunk* next,
                    float (*s)[kChunk]) {
  constexpr int TT = kAcc / R;
  tile_scores<CT, R>(q, hd, c, n, next, [&](int t0, const float* sums) {
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < TT && t0 + j < n; ++j) s[r][t0 + j] = sums[r * TT + j];
  });
}

// row[0, hd) *= a (hd a multiple of 8).
inline void scale_row(float* row, int hd, float a) {
  const V av = vset1(a);
  int d = 0;
  for (; d + kW <= hd; d += kW) vstore(row + d, vmul(vload(row + d), av));
  for (; d < hd; d += 8) vstore8(row + d, vmul(vload8(row + d), av));
}

// Online-softmax step of one row: turns s[0, n) into probabilities p (in place; tokens before
// `first` or at or past `visible` get 0), updates max/sum and rescales the row's accumulator.
// first < visible. s has room for n rounded up to kW (kChunk is a multiple of 16).
inline void row_softmax(float* s, int first, int visible, int n, float* row_max, float* row_sum,
                        float* acc, int hd) {
  const int nw = (n + kW - 1) & ~(kW - 1);
  for (int t = 0; t < first; ++t) s[t] = kNegInf;
  for (int t = visible; t < nw; ++t) s[t] = kNegInf;
  V mv = vset1(kNegInf);
  for (int t = 0; t < nw; t += kW) mv = vmax(mv, vload(s + t));
  const float m_old = *row_max;
  const float m_blk = vhmax(mv);
  const float m_new = m_old > m_blk ? m_old : m_blk;
  const V shift = vset1(-m_new);
  V sumv = vzero();
  for (int t = 0; t < nw; t += kW) {
    const V p = vexp(vadd(vload(s + t), shift));
    vstore(s + t, p);
    sumv = vadd(sumv, p);
  }
  alignas(64) float alphas[kW];
  vstore(alphas, vexp(vset1(m_old - m_new)));
  const float alpha = m_old == kNegInf ? 0.0f : alphas[0];
  *row_sum = *row_sum * alpha + vhsum(sumv);
  *row_max = m_new;
  if (alpha != 1.0f) scale_row(acc, hd, alpha);
}

#ifdef PAGEDLLM_ENGINE_LANE_SOFTMAX
// The online softmax of a decode tile in the scores' lanes (engine_lane_softmax.h; engines of
// 16-lane vectors and kAcc = 16 only).

// row[0, hd) *= a (every lane a; hd a multiple of 8).
inline void scale_row_v(float* row, int hd, V a) {
  int d = 0;
  for (; d + kW <= hd; d += kW) vstore(row + d, vmul(vload(row + d), a));
  for (; d < hd; d += 8) vstore8(row + d, vmul(vload8(row + d), a));
}

// p[r][t0, t0 + TT) = lanes r TT + j of pv (TT = 16 / R; t0 + TT <= kChunk when TT is a power of
// two: plain stores of the rows' pieces; otherwise masked stores, each addressing its lane 0 r TT
// floats before p[r][t0], inside p, masked-off lanes never accessed).
template <int R>
inline void store_prob_rows(V pv, float (*p)[kChunk], int t0) {
  if constexpr (R == 1) {
    _mm512_storeu_ps(p[0] + t0, pv);
  } else if constexpr (R == 2) {
    _mm256_storeu_ps(p[0] + t0, _mm512_castps512_ps256(pv));
    _mm256_storeu_ps(p[1] + t0, _mm512_extractf32x8_ps(pv, 1));
  } else if constexpr (R == 4) {
    _mm_storeu_ps(p[0] + t0, _mm512_castps512_ps128(pv));
    _mm_storeu_ps(p[1] + t0, _mm512_extractf32x4_ps(pv, 1));
    _mm_storeu_ps(p[2] + t0, _mm512_extractf32x4_ps(pv, 2));
    _mm_storeu_ps(p[3] + t0, _mm512_extractf32x4_ps(pv, 3));
  } else if constexpr (R == 8) {
    const __m128 q[4] = {_mm512_castps512_ps128(pv), _mm512_extractf32x4_ps(pv, 1),
                         _mm512_extractf32x4_ps(pv, 2), _mm512_extractf32x4_ps(pv, 3)};
    for (int i = 0; i < 4; ++i) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p[2 * i] + t0), q[i]);
      _mm_storeh_pi(reinterpret_cast<__m64*>(p[2 * i + 1] + t0), q[i]);
    }
  } else {
    constexpr int TT = 16 / R;
    const int k = imin(TT, kChunk - t0);
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(&p[r][t0] - r * TT,
                            static_cast<__mmask16>(((1u << k) - 1) << (r * TT)), pv);
    }
  }
}

// The tile's scores and its online-softmax step when every row sees the chunk's n tokens:
// s[r][0, n) = exp(score - m') (what row_softmax leaves there), each row's max and sum updated
// and its acc rescaled.
template <CacheType CT, int R>
void scores_softmax_lanes(const AttendTask& task, int row0, const Chunk& c, int n,
                          const Chunk* next, float (*s)[kChunk]) {
  static_assert(kAcc == 16 && kW == 16, "one 16-lane vector per TT tokens");
  constexpr int TT = 16 / R;
  const int hd = task.head_dim;
  LaneScores<R> ls;
  tile_scores<CT, R>(task.q + row0 * hd, hd, c, n, next,
                     [&](int t0, const float* sums) { ls.add(t0, n, vload(sums)); });
  const LaneStep st = lane_step_begin<R>(ls.mx, task.row_max + row0);
  V lsum = vzero();
  for (int t0 = 0; t0 < n; t0 += TT) {
    const V pv = vexp(vadd(_mm512_load_ps(ls.sv[t0 / TT]), st.shift));
    store_prob_rows<R>(pv, s, t0);
    lsum = vadd(lsum, pv);
  }
  lane_step_end<R>(st, lsum, task.row_sum + row0, [&](int r, V alpha) {
    scale_row_v(task.acc + (row0 + r) * hd, hd, alpha);
  });
}
#endif  // PAGEDLLM_ENGINE_LANE_SOFTMAX

// acc_r[d0, d1) += sum_t p[r][t] v_t[d0, d1) for the R rows of the tile, CC vectors at a time
// (d1: the last multiple of kW * CC reachable from d0); returns d1. Prefetches the same bytes
// of the chunk ahead's V rows when `next` is set.
template <CacheType CT, int R, int CC>
int tile_values(const Chunk& c, int n, const Chunk* next, float (*p)[kChunk], float* acc, int hd,
                int d0) {
  constexpr int es = cache_elem_size<CT>();
  int d = d0;
  for (; d + kW * CC <= hd; d += kW * CC) {
    V o[R * CC];
    for (int r = 0; r < R; ++r)
      for (int cc = 0; cc < CC; ++cc) o[r * CC + cc] = vload(acc + r * hd + d + kW * cc);
    const int pf_n = next != nullptr ? imin(n, next->n) : 0;
    for (int t = 0; t < n; ++t) {
      if (t < pf_n) prefetch_range(next->v[t], d * es, (d + kW * CC) * es);
      V vv[CC];
      if constexpr (CC % 2 == 0) {
        for (int cc = 0; cc < CC; cc += 2)
          vload_cache2<CT>(c.v[t] + (d + kW * cc) * es, &vv[cc], &vv[cc + 1]);
      } else {
        for (int cc = 0; cc < CC; ++cc) vv[cc] = vload_cache<CT>(c.v[t] + (d + kW * cc) * es);
      }
      for (int r = 0; r < R; ++r) {
        const V pr = vset1(p[r][t]);
        for (int cc = 0; cc < CC; ++cc) o[r * CC + cc] = vfmadd(pr, vv[cc], o[r * CC + cc]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int cc = 0; cc < CC; ++cc) vstore(acc + r * hd + d + kW * cc, o[r * CC + cc]);
  }
  return d;
}

// acc_r[d0, d0 + 8) += sum_t p[r][t] v_t[d0, d0 + 8): the tail of 8 elements (kW = 16 only).
template <CacheType CT, int R>
void tile_values_tail8(const Chunk& c, int n, const Chunk* next, float (*p)[kChunk], float* acc,
                       int hd, int d0) {
  constexpr int es = cache_elem_size<CT>();
  V o[R];
  for (int r = 0; r < R; ++r) o[r] = vload8(acc + r * hd + d0);
  const int pf_n = next != nullptr ? imin(n, next->n) : 0;
  for (int t = 0; t < n; ++t) {
    if (t < pf_n) prefetch_range(next->v[t], d0 * es, hd * es);
    const V vv = vload_cache8<CT>(c.v[t] + d0 * es);
    for (int r = 0; r < R; ++r) o[r] = vfmadd(vset1(p[r][t]), vv, o[r]);
  }
  for (int r = 0; r < R; ++r) vstore8(acc + r * hd + d0, o[r]);
}

// acc_r[d, hd) += sum_t p[r][t] v_t[d, hd): column blocks of CC vectors, then CC / 2, ... 1,
// then the tail of 8.
template <CacheType CT, int R, int CC>
void values_from(const Chunk& c, int n, const Chunk* next, float (*p)[kChunk], float* acc, int hd,
                 int d) {
  d = tile_values<CT, R, CC>(c, n, next, p, acc, hd, d);
  if (d >= hd) return;
  if constexpr (CC > 1) {
    values_from<CT, R, CC / 2>(c, n, next, p, acc, hd, d);
  } else {
    tile_values_tail8<CT, R>(c, n, next, p, acc, hd, d);
  }
}

// acc_r += sum_t p[r][t] v_t over all of head_dim for R <= 4 rows (R x CC <= kAcc accumulators,
// CC <= 8 so the value vectors fit in registers too).
template <CacheType CT, int R>
void values_pass(const Chunk& c, int n, const Chunk* next, float (*p)[kChunk], float* acc,
                 int hd) {
  constexpr int CC = kAcc / R < 8 ? kAcc / R : 8;
  values_from<CT, R, CC>(c, n, next, p, acc, hd, 0);
}

// One register tile of R query rows (starting at row0) against one chunk; `next` (the chunk
// kAhead ahead, or null) is prefetched along the way.
template <CacheType CT, int R>
void attend_tile(const AttendTask& task, int row0, const Chunk& c, const Chunk* next) {
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
  alignas(64) float s[R][kChunk];
#ifdef PAGEDLLM_ENGINE_LANE_SOFTMAX
  bool whole = true;  // every row sees all n tokens (decode)
  for (int r = 0; r < R; ++r) whole = whole && first[r] == 0 && visible[r] == n;
  if (whole) {
    scores_softmax_lanes<CT, R>(task, row0, c, n, next, s);
  } else
#endif
  {
    scores_to_rows<CT, R>(task.q + row0 * hd, hd, c, n, next, s);
    for (int r = 0; r < R; ++r) {
      if (first[r] >= visible[r]) {
        for (int t = 0; t < n; ++t) s[r][t] = 0.0f;
        continue;
      }
      row_softmax(s[r], first[r], visible[r], n, task.row_max + row0 + r,
                  task.row_sum + row0 + r, task.acc + (row0 + r) * hd, hd);
    }
  }
  float* acc = task.acc + row0 * hd;
  if constexpr (R > 4) {
    // Two passes of <= 4 rows: each value vector then feeds 2 column accumulators per row,
    // halving the probability broadcasts per multiply-add (V rows are re-read from L1).
    values_pass<CT, 4>(c, n, next, s, acc, hd);
    values_pass<CT, R - 4>(c, n, nullptr, s + 4, acc + 4 * hd, hd);
  } else {
    values_pass<CT, R>(c, n, next, s, acc, hd);
  }
}

template <CacheType CT>
void attend_rows(const AttendTask& task, int row0, int rows, const Chunk& c, const Chunk* next) {
  switch (rows) {
    case 1: attend_tile<CT, 1>(task, row0, c, next); return;
    case 2: attend_tile<CT, 2>(task, row0, c, next); return;
    case 3: attend_tile<CT, 3>(task, row0, c, next); return;
    case 4: attend_tile<CT, 4>(task, row0, c, next); return;
    case 5: attend_tile<CT, 5>(task, row0, c, next); return;
    case 6: attend_tile<CT, 6>(task, row0, c, next); return;
    case 7: attend_tile<CT, 7>(task, row0, c, next); return;
    default: attend_tile<CT, 8>(task, row0, c, next); return;
  }
}


// Chunks prefetched ahead of the one computing (1, 2 and 3 measured alike on a 2-core Zen 4;
// locality hint 2: into L2, a hint of 3 (into L1) halved the single-thread rate there).
constexpr int kAhead = 2;

template <CacheType CT>
void attend_typed(const AttendTask& task) {
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
      // The first tile prefetches `ahead` as it reads `c`; if it does not read all of `c`
      // (causal prefill rows), `ahead` is requested at once instead.
      if (first_limit < c.pos0 + c.n) {
        prefetch_chunk<CT>(*a, task.head_dim);
        ahead = nullptr;
      }
    }
    for (int row0 = 0; row0 < task.num_rows; row0 += kTile) {
      attend_rows<CT>(task, row0, imin(kTile, task.num_rows - row0), c,
                      row0 == 0 ? ahead : nullptr);
    }
    if (c.pos0 + c.n >= end) break;
  }
}

// The KV heads of one sequence in lockstep (EngineOps::attend_heads, chunks_in_lockstep):
// each head's register tiles against its rows of each chunk in turn.
template <CacheType CT>
void attend_heads_typed(const LockstepCall& call) {
  chunks_in_lockstep<CT>(call, [&](int h, const Chunk& c, const Chunk* next) {
    const AttendTask& t = call.tasks[h];
    for (int row0 = 0; row0 < t.num_rows; row0 += kTile)
      attend_rows<CT>(t, row0, imin(kTile, t.num_rows - row0), c, row0 == 0 ? next : nullptr);
  });
}

void attend_heads(const LockstepCall& call) {
  switch (call.tasks[0].cache_dtype) {
    case CacheType::kFloat32: attend_heads_typed<CacheType::kFloat32>(call); return;
    case CacheType::kFloat16: attend_heads_typed<CacheType::kFloat16>(call); return;
    case CacheType::kBFloat16: attend_heads_typed<CacheType::kBFloat16>(call); return;
    case CacheType::kFp8E4M3: attend_heads_typed<CacheType::kFp8E4M3>(call); return;
    case CacheType::kFp8E5M2: attend_heads_typed<CacheType::kFp8E5M2>(call); return;
  }
}

// Quest bounds of one (sequence, KV head), see BoundsTask.
template <CacheType CT>
void score_bounds_typed(const BoundsTask& t) {
  constexpr int es = cache_elem_size<CT>();
  const int hd = t.head_dim;
  for (int i = 0; i < t.num_blocks; ++i) {
    const int64_t off = static_cast<int64_t>(t.blocks[i]) * t.block_stride_bytes;
    const uint8_t* lo = t.key_min + off;
    const uint8_t* hi = t.key_max + off;
    float best = kNegInf;
    for (int g = 0; g < t.group; ++g) {
      const float* qp = t.qp + g * hd;
      const float* qn = t.qn + g * hd;
      V acc = vzero();
      int d = 0;
      for (; d + kW <= hd; d += kW) {
        acc = vfmadd(vload(qp + d), vload_cache<CT>(hi + d * es), acc);
        acc = vfmadd(vload(qn + d), vload_cache<CT>(lo + d * es), acc);
      }
      for (; d < hd; d += 8) {  // kW = 16 only: a tail of 8 elements
        acc = vfmadd(vload8(qp + d), vload_cache8<CT>(hi + d * es), acc);
        acc = vfmadd(vload8(qn + d), vload_cache8<CT>(lo + d * es), acc);
      }
      const float ub = vhsum(acc);
      best = ub > best ? ub : best;
    }
    t.score[i] = best;
  }
}

void score_bounds(const BoundsTask& t) {
  switch (t.dtype) {
    case CacheType::kFloat32: score_bounds_typed<CacheType::kFloat32>(t); return;
    case CacheType::kFloat16: score_bounds_typed<CacheType::kFloat16>(t); return;
    case CacheType::kBFloat16: score_bounds_typed<CacheType::kBFloat16>(t); return;
    case CacheType::kFp8E4M3: score_bounds_typed<CacheType::kFp8E4M3>(t); return;
    case CacheType::kFp8E5M2: score_bounds_typed<CacheType::kFp8E5M2>(t); return;
  }
}

void attend_task(const AttendTask& task) {
  switch (task.cache_dtype) {
    case CacheType::kFloat32: attend_typed<CacheType::kFloat32>(task); return;
    case CacheType::kFloat16: attend_typed<CacheType::kFloat16>(task); return;
    case CacheType::kBFloat16: attend_typed<CacheType::kBFloat16>(task); return;
    case CacheType::kFp8E4M3: attend_typed<CacheType::kFp8E4M3>(task); return;
    case CacheType::kFp8E5M2: attend_typed<CacheType::kFp8E5M2>(task); return;
  }
}

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS
