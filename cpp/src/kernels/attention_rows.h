// attention_rows.h (internal) — what the attention drivers (attention.cpp, cross_attention.cpp)
// share around the engine: per-thread scratch, query rows in and output rows out (activation
// type <-> float32), the engine task of one (sequence, KV head), the split-K partition counts,
// and the scale factors that fold the softmax scale, fp8 scales and the engine's e4m3 read
// factor into the query and output.
// Thread-safety: thread_scratch() is per thread; the rest is stateless.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine.h"
#include "pagedllm/kernels/params.h"

namespace pagedllm::kernels {

// Per-thread buffers of one task (reused across calls).
struct AttentionScratch {
  std::vector<float> q, acc, row_max, row_sum;  // [rows, hd], [rows, hd], [rows], [rows]
  std::vector<float> work;                      // the prefill tile's (EngineOps::prefill)
  std::vector<int32_t> limit, start;            // [rows] each
  std::vector<int32_t> next_limit;              // [rows] the next unit's (lockstep decode)
  // Sizes the buffers for `rows` rows of head_dim `hd`; acc, row_max and row_sum are reset.
  void resize(int rows, int hd);
};

// This thread's scratch.
AttentionScratch& thread_scratch();

bool is_fp8(CacheType t);

// q rows of heads [head0, head0 + count) of query token `token`, times `mul`, as float32 into
// dst [count, head_dim].
void load_query(const AttentionParams& p, int token, int head0, int count, float mul, float* dst);

// out[token, head] = acc [head_dim] * mul, in the activation type (round to nearest even).
void store_out(const AttentionParams& p, int token, int head, const float* acc, float mul);

// The engine task for `rows` query rows (q [rows, head_dim]) of KV head `kvh` of sequence `seq`
// (limits, range and state pointers left for the caller).
AttendTask make_task(const AttentionParams& p, int seq, int kvh, const float* q, int rows);

// Partitions of part_len tokens covering max_len tokens (at least 1), counted in int64: the sum
// max_len + part_len - 1 overflows int32 for a context near 2^31.
inline int partition_count(int max_len, int part_len) {
  return static_cast<int>(std::max<int64_t>(1, (int64_t{max_len} + part_len - 1) / part_len));
}

// End of the partition starting at `begin` of a context of len tokens: min(len, begin +
// part_len), the sum in int64 (it passes INT32_MAX in the last partition of a 2^31 context).
inline int partition_end(int len, int begin, int part_len) {
  return static_cast<int>(std::min<int64_t>(len, int64_t{begin} + part_len));
}

// Factor on the query: softmax scale, fp8 k_scale, and undoing the engine's e4m3 read factor.
float query_mul(const AttentionParams& p, const EngineOps& ops);
// Factor on the output: fp8 v_scale and the engine's e4m3 read factor.
float value_mul(const AttentionParams& p, const EngineOps& ops);

}  // namespace pagedllm::kernels
