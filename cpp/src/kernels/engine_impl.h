// engine_impl.h (internal) — the attention inner loop, written once over 8-lane float vectors.
//
// No include guard on purpose: each ISA translation unit (engine_generic.cpp, engine_avx2.cpp)
// first defines PAGEDLLM_ENGINE_NS and, inside namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS,
// an anonymous namespace with these vector operations (V8 = 8 floats):
//   vzero() vset1(f) vload(const float*) vstore(float*, V8) vfmadd(a, b, c) = a * b + c
//   vadd(a, b) vmul(a, b) vmax(a, b) vexp(V8) (exp(-inf) = 0) vhmax(V8) vhsum(V8)
//   vsum8(const V8 a[8]) -> lane i = sum of the lanes of a[i]
//   vload_cache<CacheType>(const uint8_t*) -> 8 cache elements as floats
//   vload_cache2<CacheType>(const uint8_t*, V8* lo, V8* hi) -> 16 of them
//   kE4M3ReadMul: what vload_cache multiplies an fp8 e4m3 value by (a power of two that the
//   caller folds into the query and output scales; every other type reads exactly)
// then includes this file, which adds attend_task() in the same namespaces. Everything has
// internal linkage, so the two compilations never meet at link time (no ODR hazard), and this
// file uses no standard-library code for the same reason.
//
// Loop structure of one task: the token range is cut into chunks of up to kChunk tokens (from
// any number of blocks: their row addresses are gathered first, so block_size does not shape
// the loops); for each chunk, the query rows are taken in register tiles of up to 8 rows:
//   scores  s[r][t] = q_r . k_t        (R rows x TT tokens = 8 accumulators, one reduction)
//   softmax m' = max(m, max_t s), p = exp(s - m'), l = l * exp(m - m') + sum p, acc *= ...
//   values  acc_r += sum_t p[r][t] v_t (<= 4 rows x CC column vectors = 8 accumulators)
// All tiles of a chunk reuse the chunk's K/V rows from L1, so K/V are read from memory once
// per task whatever the number of query rows (the GQA group, and in prefill its tokens).

namespace pagedllm::kernels::PAGEDLLM_ENGINE_NS {
namespace {

constexpr int kChunk = 128;  // most tokens per chunk (array sizes)
constexpr int kTile = 8;     // accumulators per register tile
constexpr float kNegInf = -__builtin_inff();

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

template <CacheType CT>
constexpr int cache_elem_size() {
  return CT == CacheType::kFloat32 ? 4
         : (CT == CacheType::kFloat16 || CT == CacheType::kBFloat16) ? 2
                                                                      : 1;
}

// Tokens per chunk: 128 bytes of each head_dim element per chunk whatever the type (32 fp32
// tokens, 64 half, 128 fp8), so a chunk's prefetch covers about the same memory time.
template <CacheType CT>
constexpr int chunk_tokens() {
  return 128 / cache_elem_size<CT>();
}

// Row addresses of the tokens of one chunk.
struct Chunk {
  const uint8_t* k[kChunk];
  const uint8_t* v[kChunk];
  int pos0;  // position of the chunk's first token in its sequence
  int n;     // tokens in the chunk
};

// s[r][t] = q_r . k_t for the R rows of the tile and t < n.
template <CacheType CT, int R>
void tile_scores(const float* q, int hd, const Chunk& c, int n, float (*s)[kChunk]) {
  constexpr int TT = kTile / R;  // tokens per pass
  constexpr int es = cache_elem_size<CT>();
  for (int t0 = 0; t0 < n; t0 += TT) {
    const uint8_t* kp[TT];
    for (int j = 0; j < TT; ++j) kp[j] = c.k[imin(t0 + j, n - 1)];  // tail: repeat, then drop
    V8 acc[kTile];
    for (int i = 0; i < kTile; ++i) acc[i] = vzero();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {  // 16 elements per load: wide conversions
      for (int j = 0; j < TT; ++j) {
        V8 lo, hi;
        vload_cache2<CT>(kp[j] + d * es, &lo, &hi);
        for (int r = 0; r < R; ++r) {
          acc[r * TT + j] = vfmadd(vload(q + r * hd + d), lo, acc[r * TT + j]);
          acc[r * TT + j] = vfmadd(vload(q + r * hd + d + 8), hi, acc[r * TT + j]);
        }
      }
    }
    for (; d < hd; d += 8) {
      for (int j = 0; j < TT; ++j) {
        const V8 kv = vload_cache<CT>(kp[j] + d * es);
        for (int r = 0; r < R; ++r) acc[r * TT + j] = vfmadd(vload(q + r * hd + d), kv, acc[r * TT + j]);
      }
    }
    alignas(32) float sums[kTile];
    vstore(sums, vsum8(acc));
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < TT && t0 + j < n; ++j) s[r][t0 + j] = sums[r * TT + j];
  }
}

// Online-softmax step of one row: turns s[0, n) into probabilities p (in place; tokens at or
// past `visible` get 0), updates max/sum and rescales the row's accumulator.
inline void row_softmax(float* s, int visible, int n, float* row_max, float* row_sum, float* acc,
                        int hd) {
  const int n8 = (n + 7) & ~7;
  for (int t = visible; t < n8; ++t) s[t] = kNegInf;
  V8 m8 = vset1(kNegInf);
  for (int t = 0; t < n8; t += 8) m8 = vmax(m8, vload(s + t));
  const float m_old = *row_max;
  const float m_blk = vhmax(m8);
  const float m_new = m_old > m_blk ? m_old : m_blk;
  const V8 shift = vset1(-m_new);
  V8 sum8 = vzero();
  for (int t = 0; t < n8; t += 8) {
    const V8 p = vexp(vadd(vload(s + t), shift));
    vstore(s + t, p);
    sum8 = vadd(sum8, p);
  }
  alignas(32) float alpha8[8];
  vstore(alpha8, vexp(vset1(m_old - m_new)));
  const float alpha = m_old == kNegInf ? 0.0f : alpha8[0];
  *row_sum = *row_sum * alpha + vhsum(sum8);
  *row_max = m_new;
  if (alpha != 1.0f) {
    const V8 a = vset1(alpha);
    for (int d = 0; d < hd; d += 8) vstore(acc + d, vmul(vload(acc + d), a));
  }
}

// acc_r[d0, d1) += sum_t p[r][t] v_t[d0, d1) for the R rows of the tile, CC vectors at a time.
template <CacheType CT, int R, int CC>
int tile_values(const Chunk& c, int n, float (*p)[kChunk], float* acc, int hd, int d0) {
  constexpr int es = cache_elem_size<CT>();
  int d = d0;
  for (; d + 8 * CC <= hd; d += 8 * CC) {
    V8 o[R * CC];
    for (int r = 0; r < R; ++r)
      for (int cc = 0; cc < CC; ++cc) o[r * CC + cc] = vload(acc + r * hd + d + 8 * cc);
    for (int t = 0; t < n; ++t) {
      V8 vv[CC];
      if constexpr (CC % 2 == 0) {
        for (int cc = 0; cc < CC; cc += 2)
          vload_cache2<CT>(c.v[t] + (d + 8 * cc) * es, &vv[cc], &vv[cc + 1]);
      } else {
        for (int cc = 0; cc < CC; ++cc) vv[cc] = vload_cache<CT>(c.v[t] + (d + 8 * cc) * es);
      }
      for (int r = 0; r < R; ++r) {
        const V8 pr = vset1(p[r][t]);
        for (int cc = 0; cc < CC; ++cc) o[r * CC + cc] = vfmadd(pr, vv[cc], o[r * CC + cc]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int cc = 0; cc < CC; ++cc) vstore(acc + r * hd + d + 8 * cc, o[r * CC + cc]);
  }
  return d;
}

// acc_r += sum_t p[r][t] v_t over all of head_dim for R <= 4 rows.
template <CacheType CT, int R>
void values_pass(const Chunk& c, int n, float (*p)[kChunk], float* acc, int hd) {
  constexpr int CC = kTile / R;
  const int d = tile_values<CT, R, CC>(c, n, p, acc, hd, 0);
  if (d < hd) tile_values<CT, R, 1>(c, n, p, acc, hd, d);
}

// One register tile of R query rows (starting at row0) against one chunk.
template <CacheType CT, int R>
void attend_tile(const AttendTask& task, int row0, const Chunk& c) {
  const int hd = task.head_dim;
  int visible[R];
  int n = 0;  // tokens any row of the tile sees
  for (int r = 0; r < R; ++r) {
    visible[r] = imax(0, imin(c.n, task.row_limit[row0 + r] - c.pos0));
    n = imax(n, visible[r]);
  }
  if (n == 0) return;
  alignas(32) float s[R][kChunk];
  tile_scores<CT, R>(task.q + row0 * hd, hd, c, n, s);
  for (int r = 0; r < R; ++r) {
    if (visible[r] == 0) {
      for (int t = 0; t < n; ++t) s[r][t] = 0.0f;
      continue;
    }
    row_softmax(s[r], visible[r], n, task.row_max + row0 + r, task.row_sum + row0 + r,
                task.acc + (row0 + r) * hd, hd);
  }
  float* acc = task.acc + row0 * hd;
  if constexpr (R > 4) {
    // Two passes of <= 4 rows: each value vector then feeds 2 column accumulators per row,
    // halving the probability broadcasts per multiply-add (V rows are re-read from L1).
    values_pass<CT, 4>(c, n, s, acc, hd);
    values_pass<CT, R - 4>(c, n, s + 4, acc + 4 * hd, hd);
  } else {
    values_pass<CT, R>(c, n, s, acc, hd);
  }
}

template <CacheType CT>
void attend_rows(const AttendTask& task, int row0, int rows, const Chunk& c) {
  switch (rows) {
    case 1: attend_tile<CT, 1>(task, row0, c); return;
    case 2: attend_tile<CT, 2>(task, row0, c); return;
    case 3: attend_tile<CT, 3>(task, row0, c); return;
    case 4: attend_tile<CT, 4>(task, row0, c); return;
    case 5: attend_tile<CT, 5>(task, row0, c); return;
    case 6: attend_tile<CT, 6>(task, row0, c); return;
    case 7: attend_tile<CT, 7>(task, row0, c); return;
    default: attend_tile<CT, 8>(task, row0, c); return;
  }
}

// Gathers the row addresses of the tokens [pos0, pos0 + n) of the task's sequence.
template <CacheType CT>
void gather_chunk(const AttendTask& task, int pos0, int n, Chunk* c) {
  const int64_t token_bytes = static_cast<int64_t>(task.head_dim) * cache_elem_size<CT>();
  c->pos0 = pos0;
  c->n = n;
  int block = pos0 / task.block_size;
  int offset = pos0 - block * task.block_size;
  for (int i = 0; i < n; ++i) {
    const int64_t id = task.block_table[block];
    c->k[i] = task.key_head + id * task.key_block_stride_bytes + offset * token_bytes;
    c->v[i] = task.value_head + id * task.value_block_stride_bytes + offset * token_bytes;
    if (++offset == task.block_size) {
      offset = 0;
      ++block;
    }
  }
}

// Asks the memory system for every cache line of a chunk's K and V rows. Blocks are scattered,
// so the hardware prefetchers cannot run ahead across them; this keeps the next chunk's loads
// in flight while the current one computes.
template <CacheType CT>
void prefetch_chunk(const Chunk& c, int head_dim) {
  const int token_bytes = head_dim * cache_elem_size<CT>();
  for (int i = 0; i < c.n; ++i) {
    for (int b = 0; b < token_bytes; b += 64) {
      __builtin_prefetch(c.k[i] + b, 0, 2);
      __builtin_prefetch(c.v[i] + b, 0, 2);
    }
  }
}

template <CacheType CT>
void attend_typed(const AttendTask& task) {
  int limit = 0;
  for (int r = 0; r < task.num_rows; ++r) limit = imax(limit, task.row_limit[r]);
  const int end = imin(task.token_end, limit);
  if (task.token_begin >= end) return;
  Chunk chunks[2];
  int cur = 0;
  constexpr int kTokens = chunk_tokens<CT>();
  gather_chunk<CT>(task, task.token_begin, imin(kTokens, end - task.token_begin), &chunks[cur]);
  prefetch_chunk<CT>(chunks[cur], task.head_dim);
  for (;;) {
    const Chunk& c = chunks[cur];
    const int next_pos = c.pos0 + c.n;
    if (next_pos < end) {
      gather_chunk<CT>(task, next_pos, imin(kTokens, end - next_pos), &chunks[cur ^ 1]);
      prefetch_chunk<CT>(chunks[cur ^ 1], task.head_dim);
    }
    for (int row0 = 0; row0 < task.num_rows; row0 += kTile)
      attend_rows<CT>(task, row0, imin(kTile, task.num_rows - row0), c);
    if (next_pos >= end) break;
    cur ^= 1;
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
