// engine_prefill_impl.h (internal) — the GEMM-shaped prefill tile, written once over float
// vectors of kW lanes. Each ISA translation unit includes it right after engine_impl.h (same
// conventions: no include guard, internal linkage, no standard-library code), and defines two
// vector operations and one constant more before both:
//   vkeep_lt(V s, V pos, V lim) -> s in the lanes where pos < lim, -inf in the others
//   vexp2_tile(V x) -> 2^x for the softmax (to about vexp's accuracy; x <= 0 or NaN here)
//   kPrefillTile: whether prefill uses the tile at all (the portable engine measured slower
//   with it, 13-26% on a Zen 4, so it keeps the row-major loop for every prefill task)
//
// Why a second kernel: attend_task computes each score as a dot product along head_dim inside
// one vector, so every score ends in a horizontal reduction; with many query rows (prefill)
// those reductions are most of the work. Here the query rows of a task sit in the lanes, so a
// score is an FMA chain along head_dim with no reduction at all:
//   qt [head_dim][rows_pad]        the task's queries transposed once (row r in lane r % kW of
//                                  row vector r / kW; padding lanes 0 and never visible)
//   kf [kKeyTile][kStageStride]    one key tile converted to float32 (a compile-time row stride,
//                                  so the scores loop reaches each token by a constant offset)
//   vf [kKeyTile][head_dim]        the tile's values converted to float32
//   pt [kKeyTile][kW]              scores, then probabilities, of one row vector, token-major
// Each key tile is staged once (converting bf16 / fp16 / fp8 once, not once per row) and reused
// by every row vector of the task; for each row vector that sees one of its tokens:
//   scores  S[t] (kW rows in lanes) = sum_d kf[t][d] * qt[d]   kAcc tokens per register pass
//   mask    only where the tile reaches a row's causal limit (diagonal tiles) or its end
//   softmax per lane: m' = max(m, max_t S[t]), p_t = 2^(S[t] - m'), l = l 2^(m - m') + sum p
// The tile works in log2 units: the query is scaled by q_mul log2(e) (the scores come out as
// log2 of the weights, so 2^x needs no multiply by log2 e, and its argument reduction no
// two-part ln 2: 3 fewer multiply-adds per exp), and the running max is converted from and
// back to AttendTask's natural units at the task's ends.
//   values  acc_r += sum_t p_t[r] vf[t]   broadcast p, R rows x CC value vectors per pass
// Tasks of fewer than kMinTileRows rows run attend_task instead. The query arrives unscaled
// (AttendTask::q_mul); with a bf16 or fp8 cache, an exact bf16 query and AVX512_BF16 (the
// avx512 engine defines PAGEDLLM_ENGINE_BF16_DOT, bf16_scores_pass16 and vstore_bf16 /
// vstore8_bf16), qt and kf hold bf16 pairs (fp8 keys converted exactly: bf16 holds every fp8
// value, times the e4m3 read factor) and the scores are vdpbf16ps dot products, exact
// products summed in fp32 (twice the multiply-adds per instruction). With AttendTask::bf16_probs
// too (a bf16 model under "auto") and head_dim a multiple of 16, p.v is vdpbf16ps as well: the
// probabilities rounded to bf16 in token pairs (bf16_prob_pairs), the values staged as token
// pairs (stage_value_pairs / pair_value_rows), two tokens per multiply-add (bf16_pv_pairs).

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

// Tokens per staged key tile (a multiple of kAcc). 64 rather than 32 halves the per-tile work of
// every row vector (the rescale of its accumulators, the accumulator loads and stores of p.v,
// the pass set-ups): 1.00-1.04x (fp32) and 1.03-1.11x (bf16) on the prefill kernel at head_dim
// 32-128 on a 2-core Zen 4 (docs/BENCHMARKS.md); 128 was no faster than 64.
constexpr int kKeyTile = 64;
constexpr int kStageStride = 528;  // floats per staged key row: >= the largest head_dim (512);
                                   // 2112 bytes (33 lines), so the tile's 64 rows start in
                                   // distinct L1 sets
// Fewer rows than one vector's lanes leave lanes idle, and the row-major kernel was as fast or
// faster there (a chunk of 4-12 rows after 2k tokens of context, head_dim 64, on a Zen 4).
constexpr int kMinTileRows = kW;
constexpr float kMaxFinite = 3.402823466e+38f;
constexpr float kLog2E = 1.44269504088896341f;  // the tile's scores and max: natural x log2 e
constexpr float kLn2 = 0.693147180559945309f;   // back to natural units

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The scratch of one task, carved out of the caller's `work` floats (pieces 64-byte aligned
// relative to `work`).
struct PrefillWork {
  float* qt;
  float* kf;
  float* vf;
  float* pt;
  float* m;      // [rows_pad] running max per row
  float* l;      // [rows_pad] running sum per row
  float* lim;    // [rows_pad] causal limit per row, as a float (0 on padding rows)
  float* alpha;  // [kW] one row vector's rescale factors
  uint32_t* pt2; // [kKeyTile / 2][kW] probability pairs (bf16 p.v; vf then holds value pairs)
  int rows_pad;
};

// Carves the pieces for `rows` rows of head_dim `hd` out of `w` (null: only counts); returns
// the floats used.
inline long long carve(float* w, int rows, int hd, PrefillWork* out) {
  const int rp = round_up(rows, kW);
  const long long sizes[9] = {static_cast<long long>(hd) * rp, kKeyTile * kStageStride,
                              static_cast<long long>(kKeyTile) * hd, kKeyTile * kW, rp, rp, rp,
                              kW, kKeyTile / 2 * kW};
  float* piece[9];
  long long used = 0;
  for (int i = 0; i < 9; ++i) {
    piece[i] = w != nullptr ? w + used : nullptr;
    used += (sizes[i] + 15) / 16 * 16;
  }
  if (out != nullptr) *out = PrefillWork{piece[0], piece[1], piece[2], piece[3], piece[4],
                                         piece[5], piece[6], piece[7],
                                         reinterpret_cast<uint32_t*>(piece[8]), rp};
  return used;
}

long long prefill_work_floats(int num_rows, int head_dim) {
  if (!kPrefillTile) return static_cast<long long>(num_rows) * head_dim;  // the scaled query
  return carve(nullptr, num_rows, head_dim, nullptr);
}

// dst[0, hd) = the cache row at src as float32.
template <CacheType CT>
void stage_row(const uint8_t* src, int hd, float* dst) {
  constexpr int es = cache_elem_size<CT>();
  int d = 0;
  for (; d + kW <= hd; d += kW) vstore(dst + d, vload_cache<CT>(src + d * es));
  for (; d < hd; d += 8) vstore8(dst + d, vload_cache8<CT>(src + d * es));
}

inline void zero_row(float* dst, int hd) {
  int d = 0;
  for (; d + kW <= hd; d += kW) vstore(dst + d, vzero());
  for (; d < hd; d += 8) vstore8(dst + d, vzero());
}

// qt[d][r] = q[r][d] * mul for r < rows, 0 for rows <= r < rows_pad.
inline void transpose_queries(const float* q, float mul, int rows, int hd, int rows_pad,
                              float* qt) {
  for (int d = 0; d < hd; ++d) {
    float* o = qt + static_cast<long long>(d) * rows_pad;
    for (int r = 0; r < rows; ++r) o[r] = q[static_cast<long long>(r) * hd + d] * mul;
    for (int r = rows; r < rows_pad; ++r) o[r] = 0.0f;
  }
}

inline unsigned bits_of(float f) {
  unsigned u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}

#ifdef PAGEDLLM_ENGINE_BF16_DOT
// Whether every element of q[rows][hd] is a bfloat16 value (low 16 bits zero).
inline bool query_is_bf16(const float* q, int rows, int hd) {
  unsigned low = 0;
  for (long long i = 0; i < static_cast<long long>(rows) * hd; ++i) low |= bits_of(q[i]) & 0xFFFFu;
  return low == 0;
}

// q2[d2][r] = the bf16 pair (q[r][2 d2], q[r][2 d2 + 1]), the first in the low half; padding
// rows 0.
inline void pack_query_pairs(const float* q, int rows, int hd, int rows_pad, uint32_t* q2) {
  for (int d2 = 0; d2 < hd / 2; ++d2) {
    uint32_t* o = q2 + static_cast<long long>(d2) * rows_pad;
    for (int r = 0; r < rows; ++r) {
      const float* qr = q + static_cast<long long>(r) * hd + 2 * d2;
      o[r] = (bits_of(qr[0]) >> 16) | (bits_of(qr[1]) & 0xFFFF0000u);
    }
    for (int r = rows; r < rows_pad; ++r) o[r] = 0;
  }
}

// The tile's key rows as bf16 pairs, kStageStride words apart (zero rows up to the next
// multiple of kAcc, as stage_tile): bf16 rows copied, fp8 rows converted (exactly).
template <CacheType CT>
inline void stage_bf16_keys(const Chunk& c, int hd, uint32_t* kf2) {
  for (int t = 0; t < c.n; ++t) {
    if constexpr (CT == CacheType::kBFloat16) {
      __builtin_memcpy(kf2 + t * kStageStride, c.k[t], static_cast<unsigned long>(hd) * 2);
    } else {
      auto* dst = reinterpret_cast<uint16_t*>(kf2 + t * kStageStride);
      int d = 0;
      for (; d + kW <= hd; d += kW) vstore_bf16(dst + d, vload_cache<CT>(c.k[t] + d));
      for (; d < hd; d += 8) vstore8_bf16(dst + d, vload_cache8<CT>(c.k[t] + d));
    }
  }
  for (int t = c.n; t < round_up(c.n, kAcc); ++t) {
    for (int d2 = 0; d2 < hd / 2; ++d2) kf2[t * kStageStride + d2] = 0;
  }
}
#endif

#ifdef PAGEDLLM_ENGINE_BF16_DOT
// The tile's value rows as token pairs: vf2[t / 2][d] = (v_t[d], v_(t+1)[d]) in bf16, hd words
// a pair (an odd last token paired with 0).
template <CacheType CT>
inline void stage_value_pairs(const Chunk& c, int hd, uint32_t* vf2) {
  for (int t = 0; t < c.n; t += 2) {
    pair_value_rows<CT>(c.v[t], t + 1 < c.n ? c.v[t + 1] : nullptr, hd,
                        vf2 + static_cast<long long>(t / 2) * hd);
  }
}
#endif

// pt[t] = sum_d kf[t][d] * qt[d] for the TT staged tokens at kf (kW rows in the lanes; qt is
// the row vector's column, rows_pad floats apart per d).
template <int TT>
void scores_pass(const float* qt, int rows_pad, const float* kf, int hd, float* pt) {
  V acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = vzero();
  for (int d = 0; d < hd; ++d) {
    const V q = vload(qt + static_cast<long long>(d) * rows_pad);
    for (int t = 0; t < TT; ++t) acc[t] = vfmadd(vset1(kf[t * kStageStride + d]), q, acc[t]);
  }
  for (int t = 0; t < TT; ++t) vstore(pt + t * kW, acc[t]);
}

// acc_r[d, d1) += sum_{t < nt} pt[t][r] vf[t][d, d1) for R rows (acc rows hd apart, pt lanes
// from r = 0), CC value vectors at a time; returns d1 (the last multiple of kW * CC reachable).
template <int R, int CC>
int pv_cols(const float* pt, const float* vf, int nt, float* acc, int hd, int d) {
  for (; d + kW * CC <= hd; d += kW * CC) {
    V o[R * CC];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) o[r * CC + c] = vload(acc + r * hd + d + c * kW);
    const float* vr = vf + d;
    for (int t = 0; t < nt; ++t, vr += hd) {
      V vv[CC];
      for (int c = 0; c < CC; ++c) vv[c] = vload(vr + c * kW);
      for (int r = 0; r < R; ++r) {
        const V p = vset1(pt[t * kW + r]);
        for (int c = 0; c < CC; ++c) o[r * CC + c] = vfmadd(p, vv[c], o[r * CC + c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) vstore(acc + r * hd + d + c * kW, o[r * CC + c]);
  }
  return d;
}

// The same for the 8 columns [d, d + 8) (kW = 16 only: a head_dim tail).
template <int R>
void pv_tail8(const float* pt, const float* vf, int nt, float* acc, int hd, int d) {
  V o[R];
  for (int r = 0; r < R; ++r) o[r] = vload8(acc + r * hd + d);
  for (int t = 0; t < nt; ++t) {
    const V vv = vload8(vf + static_cast<long long>(t) * hd + d);
    for (int r = 0; r < R; ++r) o[r] = vfmadd(vset1(pt[t * kW + r]), vv, o[r]);
  }
  for (int r = 0; r < R; ++r) vstore8(acc + r * hd + d, o[r]);
}

// acc_r[d, hd) += sum_t pt[t][r] vf[t][d, hd): CC vectors at a time, then CC / 2, ..., 1, tail.
template <int R, int CC>
void pv_from(const float* pt, const float* vf, int nt, float* acc, int hd, int d) {
  d = pv_cols<R, CC>(pt, vf, nt, acc, hd, d);
  if (d >= hd) return;
  if constexpr (CC > 1) {
    pv_from<R, CC / 2>(pt, vf, nt, acc, hd, d);
  } else {
    pv_tail8<R>(pt, vf, nt, acc, hd, d);
  }
}

template <int R>
void pv_rows(const float* pt, const float* vf, int nt, float* acc, int hd) {
  constexpr int kCC = kAcc / R >= 4 ? 4 : (kAcc / R >= 2 ? 2 : 1);
  pv_from<R, kCC>(pt, vf, nt, acc, hd, 0);
}

// Values of `real` rows (<= kW) whose probabilities are the lanes of pt, RP rows at a time.
template <int RP>
void pv_rows_by(const float* pt, const float* vf, int nt, float* acc, int hd, int real) {
  int r = 0;
  for (; r + RP <= real; r += RP) pv_rows<RP>(pt + r, vf, nt, acc + r * hd, hd);
  const int left = real - r;
  if (left == 0) return;
  if constexpr (RP > 1) {
    if (left >= RP / 2) {
      pv_rows<RP / 2>(pt + r, vf, nt, acc + r * hd, hd);
      r += RP / 2;
    }
    pv_rows_by<RP / 2>(pt + r, vf, nt, acc + r * hd, hd, real - r);
  }
}

// 4 rows x 4 column vectors where head_dim has room for them; a narrow head (under 4 vectors,
// e.g. 32 on AVX-512) takes kAcc / 2 rows x 2 vectors, so the tile still fills kAcc
// accumulators and each value vector feeds more rows.
inline void pv_row_vector(const float* pt, const float* vf, int nt, float* acc, int hd,
                          int real) {
  if (hd < 4 * kW && kAcc / 2 > 4) {
    pv_rows_by<kAcc / 2>(pt, vf, nt, acc, hd, real);
  } else {
    pv_rows_by<4>(pt, vf, nt, acc, hd, real);
  }
}

// Row vector r0 (its first `real` rows are real; `hi`: their largest causal limit, `lo`: the
// least) against the staged tile of n tokens at positions [pos0, pos0 + n); hi > pos0.
// dot: qt and kf hold bf16 pairs (the query unscaled: q_mul, log2 e included, is applied to
// the scores).
// pairs: p.v in bf16 pairs (vf holds value pairs, stage_value_pairs; AttendTask::bf16_probs).
inline void tile_row_vector(const PrefillWork& w, int r0, int real, int lo, int hi, int pos0,
                            int n, int hd, bool dot, bool pairs, float q_mul, float* acc) {
  const int nt = imin(n, hi - pos0);     // tokens some row of the vector sees
  const int np = round_up(nt, kAcc);     // tokens computed (<= kKeyTile; the rest masked)
  float* pt = w.pt;
  for (int t0 = 0; t0 < np; t0 += kAcc) {
#ifdef PAGEDLLM_ENGINE_BF16_DOT
    if (dot) {
      bf16_scores_pass16(reinterpret_cast<const uint32_t*>(w.qt) + r0, w.rows_pad,
                         reinterpret_cast<const uint32_t*>(w.kf) + t0 * kStageStride,
                         kStageStride, hd, q_mul, pt + t0 * kW);
      continue;
    }
#else
    (void)dot;
    (void)q_mul;
#endif
    scores_pass<kAcc>(w.qt + r0, w.rows_pad, w.kf + t0 * kStageStride, hd, pt + t0 * kW);
  }
  if (np > nt || pos0 + np > lo) {  // tokens past some row's limit (or past nt): masked
    const V lim = vload(w.lim + r0);
    for (int t = 0; t < np; ++t) {
      const V s = t < nt ? vkeep_lt(vload(pt + t * kW), vset1(static_cast<float>(pos0 + t)), lim)
                         : vset1(kNegInf);
      vstore(pt + t * kW, s);
    }
  }
  const V m_old = vload(w.m + r0);
  V m_new = m_old;
  for (int t = 0; t < np; ++t) m_new = vmax(m_new, vload(pt + t * kW));
  // Lanes that have seen nothing yet stay at -inf; a finite stand-in keeps exp() at 0 there.
  const V neg = vmul(vmax(m_new, vset1(-kMaxFinite)), vset1(-1.0f));
  V sum = vzero();
#ifdef PAGEDLLM_ENGINE_BF16_DOT
  if (pairs) {
    sum = bf16_prob_pairs(pt, np, neg, w.pt2);
  } else {
#else
  (void)pairs;
  {
#endif
    for (int t = 0; t < np; ++t) {
      const V p = vexp2_tile(vadd(vload(pt + t * kW), neg));
      vstore(pt + t * kW, p);
      sum = vadd(sum, p);
    }
  }
  const V alpha = vexp2_tile(vadd(m_old, neg));  // 0 where m_old = -inf, 1 where the max held
  vstore(w.l + r0, vadd(vmul(vload(w.l + r0), alpha), sum));
  vstore(w.m + r0, m_new);
  vstore(w.alpha, alpha);
  float* acc0 = acc + static_cast<long long>(r0) * hd;
  for (int r = 0; r < real; ++r)
    if (w.alpha[r] != 1.0f) scale_row(acc0 + r * hd, hd, w.alpha[r]);
#ifdef PAGEDLLM_ENGINE_BF16_DOT
  if (pairs) {
    bf16_pv_pairs(w.pt2, reinterpret_cast<const uint32_t*>(w.vf), nt, acc0, hd, real);
    return;
  }
#endif
  pv_row_vector(pt, w.vf, nt, acc0, hd, real);
}

// Stages the tile's n tokens as float32 (K rows kStageStride apart, V rows hd apart; K rows up
// to the next multiple of kAcc zeroed, so the masked scores stay finite); with `raw_keys` the
// keys are left to stage_bf16_keys.
// `value_pairs`: the values go to stage_value_pairs instead.
template <CacheType CT>
void stage_tile(const Chunk& c, int hd, bool raw_keys, bool value_pairs, const PrefillWork& w) {
  for (int t = 0; t < c.n; ++t) {
    if (!raw_keys) stage_row<CT>(c.k[t], hd, w.kf + t * kStageStride);
    if (!value_pairs) stage_row<CT>(c.v[t], hd, w.vf + static_cast<long long>(t) * hd);
  }
  if (raw_keys) return;
  for (int t = c.n; t < round_up(c.n, kAcc); ++t) zero_row(w.kf + t * kStageStride, hd);
}

template <CacheType CT>
void prefill_typed(const AttendTask& task, float* work) {
  const int rows = task.num_rows;
  const int hd = task.head_dim;
  int limit = 0;
  for (int r = 0; r < rows; ++r) limit = imax(limit, task.row_limit[r]);
  const int end = imin(task.token_end, limit);
  if (task.token_begin >= end) return;
  PrefillWork w;
  carve(work, rows, hd, &w);
  const float q_mul = task.q_mul * kLog2E;  // the scores in log2 units
#ifdef PAGEDLLM_ENGINE_BF16_DOT
  constexpr bool bf16_keys = CT == CacheType::kBFloat16 || CT == CacheType::kFp8E4M3 ||
                             CT == CacheType::kFp8E5M2;
  const bool dot = bf16_keys && task.bf16_dot && query_is_bf16(task.q, rows, hd);
  const bool pairs = dot && task.bf16_probs && hd % 16 == 0;
  if (dot) {
    pack_query_pairs(task.q, rows, hd, w.rows_pad, reinterpret_cast<uint32_t*>(w.qt));
  } else {
    transpose_queries(task.q, q_mul, rows, hd, w.rows_pad, w.qt);
  }
#else
  const bool dot = false;
  const bool pairs = false;
  transpose_queries(task.q, q_mul, rows, hd, w.rows_pad, w.qt);
#endif
  for (int r = 0; r < w.rows_pad; ++r) {
    const bool real = r < rows;
    w.m[r] = real ? task.row_max[r] * kLog2E : kNegInf;
    w.l[r] = real ? task.row_sum[r] : 0.0f;
    w.lim[r] = real ? static_cast<float>(task.row_limit[r]) : 0.0f;
  }
  Chunk chunks[2];
  int cur = 0;
  gather_chunk<CT>(task, task.token_begin, imin(kKeyTile, end - task.token_begin), &chunks[0]);
  prefetch_chunk<CT>(chunks[0], hd);
  for (;;) {
    const Chunk& c = chunks[cur];
    const int next_pos = c.pos0 + c.n;
    if (next_pos < end) {  // requested now, read after this tile's arithmetic
      gather_chunk<CT>(task, next_pos, imin(kKeyTile, end - next_pos), &chunks[cur ^ 1]);
      prefetch_chunk<CT>(chunks[cur ^ 1], hd);
    }
    stage_tile<CT>(c, hd, dot, pairs, w);
#ifdef PAGEDLLM_ENGINE_BF16_DOT
    if (dot) stage_bf16_keys<CT>(c, hd, reinterpret_cast<uint32_t*>(w.kf));
    if (pairs) stage_value_pairs<CT>(c, hd, reinterpret_cast<uint32_t*>(w.vf));
#endif
    for (int r0 = 0; r0 < rows; r0 += kW) {
      const int real = imin(kW, rows - r0);
      int lo = task.row_limit[r0], hi = lo;
      for (int r = 1; r < real; ++r) {
        lo = imin(lo, task.row_limit[r0 + r]);
        hi = imax(hi, task.row_limit[r0 + r]);
      }
      if (hi > c.pos0) {
        tile_row_vector(w, r0, real, lo, hi, c.pos0, c.n, hd, dot, pairs, q_mul, task.acc);
      }
    }
    if (next_pos >= end) break;
    cur ^= 1;
  }
  for (int r = 0; r < rows; ++r) {
    task.row_max[r] = w.m[r] * kLn2;
    task.row_sum[r] = w.l[r];
  }
}

// A prefill task: the tile above, or attend_task when too few rows fill the lanes, the engine
// has no tile, or rows have a first visible position (row_start: the tile masks only above).
void prefill_task(const AttendTask& task, float* work) {
  if (!kPrefillTile || task.num_rows < kMinTileRows || task.row_start != nullptr) {
    if (task.q_mul == 1.0f) {
      attend_task(task);
      return;
    }
    AttendTask scaled = task;  // attend_task takes the query scaled: a copy in `work`
    const long long n = static_cast<long long>(task.num_rows) * task.head_dim;
    for (long long i = 0; i < n; ++i) work[i] = task.q[i] * task.q_mul;
    scaled.q = work;
    scaled.q_mul = 1.0f;
    attend_task(scaled);
    return;
  }
  switch (task.cache_dtype) {
    case CacheType::kFloat32: prefill_typed<CacheType::kFloat32>(task, work); return;
    case CacheType::kFloat16: prefill_typed<CacheType::kFloat16>(task, work); return;
    case CacheType::kBFloat16: prefill_typed<CacheType::kBFloat16>(task, work); return;
    case CacheType::kFp8E4M3: prefill_typed<CacheType::kFp8E4M3>(task, work); return;
    case CacheType::kFp8E5M2: prefill_typed<CacheType::kFp8E5M2>(task, work); return;
  }
}

}  // namespace
}  // namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS
