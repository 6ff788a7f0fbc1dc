// engine.h (internal) — the attention inner loop, compiled once per instruction set.
//
// An AttendTask is a set of float32 query rows (scaled, or scaled inside the engine by q_mul)
// that share one KV head of one sequence, each with its own causal limit, attended over a
// token range of that sequence's paged K/V with an online softmax; a row may also have a
// first visible position (row_start, cross-attention's key ranges). The state (running max,
// running sum, unnormalised output row) lives in caller memory, so a task can be one partition
// of a long sequence (split-K) and the caller merges the partitions. The engine reads only
// tokens below max(row_limit) within [token_begin, token_end): never cache memory past a
// sequence's context.
// Plain data and function pointers only (included by ISA-specific translation units).
// Thread-safety: tasks writing disjoint state may run concurrently.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::kernels {

struct AttendTask {
  const float* q = nullptr;           // [num_rows, head_dim] float32, scale folded in, or
                                      // times q_mul where the engine applies it (below)
  const int32_t* row_limit = nullptr; // [num_rows]: row r sees token positions < row_limit[r]
  const int32_t* row_start = nullptr; // [num_rows] or null: row r sees positions >= row_start[r]
                                      // (null: no lower bound); start >= limit: sees nothing
  int32_t num_rows = 0;
  float* acc = nullptr;               // [num_rows, head_dim] unnormalised output (in/out)
  float* row_max = nullptr;           // [num_rows] running max of the scores (in/out)
  float* row_sum = nullptr;           // [num_rows] running sum of exp(score - max) (in/out)
  int32_t token_begin = 0;            // token positions of the sequence to attend over
  int32_t token_end = 0;
  const uint8_t* key_head = nullptr;  // key_cache + kv_head * block_size * head_dim elements
  const uint8_t* value_head = nullptr;
  int64_t key_block_stride_bytes = 0;
  int64_t value_block_stride_bytes = 0;
  const int32_t* block_table = nullptr;  // the sequence's physical block ids, logical order
  int32_t block_size = 0;
  int32_t head_dim = 0;               // multiple of 8, <= 512
  CacheType cache_dtype = CacheType::kFloat32;
  // q is scaled by this inside the engine, so a bf16 query reaches it exact and unscaled:
  // prefill (EngineOps::prefill) always; attend only in the avx512_bf16 engine on the caches
  // avx512_bf16_decodes() names (its scores are multiplied by it), 1 everywhere else. And
  // whether the CPU has AVX512_BF16 dot products (prefill: then the avx512 engine's tile
  // multiplies an exact bf16 query by a bf16 cache with vdpbf16ps).
  float q_mul = 1.0f;
  bool bf16_dot = false;
  // Prefill: the probabilities may be rounded to bf16 for p.v, as a bf16 model's own attention
  // rounds them (softmax in fp32, cast to bf16, then the p.v matmul): set for a bf16 query under
  // "auto". With bf16_dot on a bf16 or fp8 cache the avx512 tile then multiplies them by V in
  // vdpbf16ps too (two tokens per multiply-add); everywhere else it is ignored (exact p.v).
  bool bf16_probs = false;
};

// Quest's block scores for one (sequence, KV head): for each listed block b,
// score[i] = max over the group's query heads g of sum_d (qp[g][d] hi_b[d] + qn[g][d] lo_b[d]),
// with lo_b / hi_b the block's key-bound rows (read like cache rows: fp8 e4m3 values come
// times e4m3_read_mul, a common factor that leaves the ranking unchanged).
struct BoundsTask {
  const float* qp = nullptr;          // [group, head_dim] max(q, 0)
  const float* qn = nullptr;          // [group, head_dim] min(q, 0)
  int32_t group = 0;
  const uint8_t* key_min = nullptr;   // the head's row of block 0 (+ id * block_stride_bytes)
  const uint8_t* key_max = nullptr;
  int64_t block_stride_bytes = 0;
  const int32_t* blocks = nullptr;    // [num_blocks] physical ids
  int32_t num_blocks = 0;
  int32_t head_dim = 0;               // multiple of 8
  CacheType dtype = CacheType::kFloat32;
  float* score = nullptr;             // [num_blocks]
};

// One call of EngineOps::attend_heads: the `num` decode tasks of one unit (a sequence's KV
// heads, or one partition of them), and the next unit a thread runs after it (`next`,
// `next_num`; null / 0 when none), whose first rows this call's last steps prefetch, so that the
// reads of short sequences run on as one stream instead of starting cold at each unit.
// `primed`: the previous call named this unit as its `next` (its first rows are requested).
// The next unit's tasks are read for their block tables, heads, token ranges and row limits
// only.
struct LockstepCall {
  const AttendTask* tasks = nullptr;
  int num = 0;
  const AttendTask* next = nullptr;
  int next_num = 0;
  bool primed = false;
};

// Engine entry points of one instruction set.
struct EngineOps {
  const char* name;
  // Runs one task (updates acc / row_max / row_sum).
  void (*attend)(const AttendTask& task);
  // The engine reads an fp8 e4m3 element as its value times this power of two (a cheaper
  // decode); the caller multiplies the query and the output by its inverse, exactly.
  float e4m3_read_mul;
  // Scores the blocks of one BoundsTask.
  void (*score_bounds)(const BoundsTask& task);
  // Runs one prefill task (same contract as attend) with the GEMM-shaped tile of
  // engine_prefill_impl.h; `work`: prefill_work_floats(num_rows, head_dim) floats of scratch
  // that no other thread uses meanwhile.
  void (*prefill)(const AttendTask& task, float* work);
  // Floats of scratch `prefill` needs for a task of num_rows rows of head_dim.
  long long (*prefill_work_floats)(int num_rows, int head_dim);
  // Runs call.num (<= kMaxLockstepHeads) decode tasks of one sequence's KV heads in lockstep:
  // the same token_begin, each its own head, block table, end, query and state; every row of a
  // task sees all of its range. Each task's results are attend's up to rounding (the online
  // softmax may step at other chunk boundaries: lockstep_tokens, chunk_rows.h); call.next only
  // changes what is prefetched.
  void (*attend_heads)(const LockstepCall& call);
};

constexpr int kMaxLockstepHeads = 64;  // EngineOps::attend_heads: tasks per call, at most

// The engine the attention calls dispatch to (attention.cpp: chosen at the first call).
const EngineOps& current_engine();

// The portable engine (always compiled).
const EngineOps& generic_engine();
// The AVX2 + FMA + F16C engine; only when PAGEDLLM_HAVE_AVX2_KERNELS is defined.
const EngineOps& avx2_engine();
// The AVX-512 F/BW/VL/DQ engine; only when PAGEDLLM_HAVE_AVX512_KERNELS is defined.
const EngineOps& avx512_engine();
// The avx512 engine with bf16 dot-product decode for bf16 / fp8 K/V (engine_avx512_bf16.cpp):
// needs AVX512_BF16 and AVX512_VBMI too; only when PAGEDLLM_HAVE_AVX512_BF16_KERNELS is defined.
const EngineOps& avx512_bf16_engine();
// Whether avx512_bf16_engine().attend runs its own bf16 dot-product kernel on this cache (bf16
// or fp8, head_dim a multiple of 32 up to 512), which applies AttendTask::q_mul to the scores;
// on other caches it runs the avx512 engine's attend (q_mul must then be 1).
bool avx512_bf16_decodes(CacheType cache_dtype, int head_dim);

}  // namespace pagedllm::kernels
