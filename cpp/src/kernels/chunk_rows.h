// chunk_rows.h (internal) — the row addresses of a chunk of a task's tokens and their
// prefetch, shared by the attention loops of every CPU engine (engine_impl.h) and by the
// avx512_bf16 engine.
//
// Everything is in an anonymous namespace (internal linkage): each ISA translation unit gets
// its own copy compiled with its own flags, so they never meet at link time. No standard-library
// code, for the same reason as engine_impl.h.
#pragma once

#include <cstdint>

#include "engine.h"

namespace pagedllm::kernels {
namespace {

constexpr int kChunk = 128;  // most tokens per chunk (array sizes)

template <CacheType CT>
constexpr int cache_elem_size() {
  return CT == CacheType::kFloat32 ? 4
         : (CT == CacheType::kFloat16 || CT == CacheType::kBFloat16) ? 2
                                                                      : 1;
}

// Tokens per chunk: 128 bytes of each head_dim element (32 fp32 tokens, 64 half, 128 fp8), or
// more for heads under 128 elements: 16 KiB of K rows (and as much of V), up to kChunk tokens
// (head_dim 32: 128 of any type). A chunk's prefetch then covers about the same memory time,
// and small heads do not pay the per-chunk work (online softmax and rescale per row, prefetch
// bookkeeping) every 32 tokens: at head_dim 32 in fp32 that made the decode kernel about 1.2x
// faster (docs/BENCHMARKS.md).
template <CacheType CT>
inline int chunk_tokens(int head_dim) {
  const int base = 128 / cache_elem_size<CT>();
  const int tokens = ((16384 / cache_elem_size<CT>()) / head_dim) & ~15;
  return tokens <= base ? base : tokens > kChunk ? kChunk : tokens;
}

// Row addresses of the tokens of one chunk.
struct Chunk {
  const uint8_t* k[kChunk];
  const uint8_t* v[kChunk];
  int pos0;  // position of the chunk's first token in its sequence
  int n;     // tokens in the chunk
};

// Prefetches (into L2) the lines of the byte range [b0, b1) of `row`: the loops call it on a
// chunk ahead with the range they read of the current chunk's row, so a chunk's reads request
// a later chunk's lines at the pace they are consumed. Lines are those starting inside the range.
inline void prefetch_range(const uint8_t* row, int b0, int b1) {
  for (int b = (b0 + 63) & ~63; b < b1; b += 64) __builtin_prefetch(row + b, 0, 2);
}

// Prefetches (into L2) the N lines from p on (p + 64 i, i < N): a fixed count the compiler
// unrolls, for loops whose slice of a row is a compile-time number of whole lines (a loop
// over a run-time range cost the avx512_bf16 value loops about 4% of their rate,
// docs/BENCHMARKS.md).
template <int N>
inline void prefetch_lines(const uint8_t* p) {
  for (int i = 0; i < N; ++i) __builtin_prefetch(p + 64 * i, 0, 2);
}

// Gathers the row addresses of the tokens [pos0, pos0 + n) of the task's sequence: one table
// lookup and one multiply per block, then consecutive rows (a loop the compiler vectorises).
template <CacheType CT>
void gather_chunk(const AttendTask& task, int pos0, int n, Chunk* c) {
  const int64_t token_bytes = static_cast<int64_t>(task.head_dim) * cache_elem_size<CT>();
  c->pos0 = pos0;
  c->n = n;
  int block = pos0 / task.block_size;
  int offset = pos0 - block * task.block_size;
  for (int i = 0; i < n; ++block, offset = 0) {
    const int64_t id = task.block_table[block];
    const uint8_t* k = task.key_head + id * task.key_block_stride_bytes + offset * token_bytes;
    const uint8_t* v = task.value_head + id * task.value_block_stride_bytes + offset * token_bytes;
    const int rows = task.block_size - offset < n - i ? task.block_size - offset : n - i;
    for (int j = 0; j < rows; ++j) {
      c->k[i + j] = k + j * token_bytes;
      c->v[i + j] = v + j * token_bytes;
    }
    i += rows;
  }
}

// Asks the memory system for every cache line of a chunk's K and V rows (the first chunk of a
// task; later ones are prefetched slice by slice while the previous one computes). Blocks are
// scattered, so the hardware prefetchers cannot run ahead across them.
template <CacheType CT>
void prefetch_chunk(const Chunk& c, int head_dim) {
  const int token_bytes = head_dim * cache_elem_size<CT>();
  for (int i = 0; i < c.n; ++i) {
    prefetch_range(c.k[i], 0, token_bytes);
    prefetch_range(c.v[i], 0, token_bytes);
  }
}

// Tokens per chunk when a sequence's KV heads run in lockstep: half of chunk_tokens (8 KiB of
// each head's K rows), since a lockstep step reads that much of every head. Against
// chunk_tokens itself (with a whole chunk prefetched ahead): 1.01-1.24x (fp32) and 1.00-1.12x
// (bf16) at 32 / 8 heads of 128 on a 2-core Zen 4 (docs/BENCHMARKS.md).
template <CacheType CT>
inline int lockstep_tokens(int head_dim) {
  const int t = chunk_tokens<CT>(head_dim) / 2;
  return t < 16 ? 16 : t;
}

// The token a task's rows read up to: token_end clipped to its rows' largest limit.
inline int task_end(const AttendTask& t) {
  int end = 0;
  for (int r = 0; r < t.num_rows; ++r) end = end > t.row_limit[r] ? end : t.row_limit[r];
  return end < t.token_end ? end : t.token_end;
}

// Head-chunks (one head's rows of one chunk, 16 KiB of K and V at lockstep_tokens) that the
// lockstep loop prefetches ahead of the one computing: about the 64 KiB the per-head loop keeps
// in flight (kAhead chunks). Against one whole chunk (every head) ahead: 1.01-1.25x on a 2-core
// Zen 4 (2 and 4 alike, 1 less on bf16; docs/BENCHMARKS.md).
constexpr int kLockstepAhead = 4;

// Runs the KV heads of one sequence in lockstep from their common token_begin (each task its
// own head, block table, query, state and end, task_end; decode: every row of a task sees all
// of its range, so reading a chunk covers all of it and a prefetched one is whole): step
// (chunk i, head h) calls attend(h, head h's rows of chunk i, next) for every head whose range
// reaches chunk i, `next` being the rows of the step kLockstepAhead later in the stream of this
// unit's steps followed by call.next's (null where that step reads nothing), which attend
// prefetches as it reads. So a unit's last steps request the next unit's first rows, and short
// sequences (a few blocks each) read as one stream. The stream's first kLockstepAhead steps are
// requested at once, except, when call.primed, those of this unit (the previous call requested
// them as its own last steps ran).
// A block holds its KV heads one after another, so the reads walk each block's heads in address
// order (long runs, as with large blocks) instead of one head's block_size rows per block; the
// hardware and the TLB see one stream where per-head tasks see scattered short runs.
// call.num, call.next_num <= kMaxLockstepHeads (engine.h).
template <CacheType CT, class Attend>
void chunks_in_lockstep(const LockstepCall& call, Attend&& attend) {
  const AttendTask* tasks = call.tasks;
  const int num = call.num;
  const int hd = tasks[0].head_dim;
  const int begin = tasks[0].token_begin;
  const int tokens = lockstep_tokens<CT>(hd);
  int ends[kMaxLockstepHeads];
  int next_ends[kMaxLockstepHeads];
  int last = begin;
  for (int h = 0; h < num; ++h) {
    ends[h] = task_end(tasks[h]);
    last = last > ends[h] ? last : ends[h];
  }
  const int next_num = call.next != nullptr ? call.next_num : 0;
  for (int h = 0; h < next_num; ++h) next_ends[h] = task_end(call.next[h]);
  const int steps = (last - begin + tokens - 1) / tokens * num;  // this unit's
  // Gathers step j of the stream (this unit's steps, then the next unit's) into *out; false
  // where it reads nothing (past its head's end, or past the stream).
  const auto gather = [&](int j, Chunk* out) {
    const AttendTask* ts = tasks;
    const int* es = ends;
    int n = num;
    if (j >= steps) {
      j -= steps;
      ts = call.next;
      es = next_ends;
      n = next_num;
      if (n == 0) return false;
    }
    const int h = j % n;
    const int pos = ts[h].token_begin + j / n * tokens;
    if (pos >= es[h]) return false;
    gather_chunk<CT>(ts[h], pos, es[h] - pos < tokens ? es[h] - pos : tokens, out);
    return true;
  };
  Chunk c, a;
  // The previous call requested this unit's first min(kLockstepAhead, steps) steps.
  const int requested = !call.primed ? 0 : steps < kLockstepAhead ? steps : kLockstepAhead;
  for (int k = requested; k < kLockstepAhead; ++k) {
    if (gather(k, &c)) prefetch_chunk<CT>(c, hd);
  }
  for (int j = 0; j < steps; ++j) {
    if (!gather(j, &c)) continue;
    const bool has_next = gather(j + kLockstepAhead, &a);
    attend(j % num, static_cast<const Chunk&>(c), has_next ? &a : nullptr);
  }
}

}  // namespace
}  // namespace pagedllm::kernels
