// paged_attention_decode / paged_attention_prefill: validate, cut the work into engine tasks
// (one KV head of one sequence each, so a GQA group shares one read of K/V), run them on the
// thread pool, merge split-K partitions, write the outputs.
// The block-sparse calls run the same drivers over a SparseView (block_sparse.h): each task's
// block table is then its list's compacted table, its lengths and limits compacted ones.
//
// Decode with 2-64 KV heads of up to 32 KiB per block each: units are (sequence, partition),
// each running all of the sequence's KV heads in lockstep chunk by chunk
// (EngineOps::attend_heads), so the reads walk each block's heads in address order. When there
// are fewer sequences than ~4 units per thread, each context is split into partitions of
// >= kMinPartition tokens (flash-decoding), whose partial (max, sum, acc) are merged
// afterwards, so a single long sequence still uses every core. Otherwise (one KV head, more
// than 64, or longer runs per head and block): tasks are (sequence, kv head, partition),
// partitioned the same way counting (sequence, kv head) pairs.
// Prefill: tasks are (sequence, kv head, tile of query tokens); rows are token-major so a
// register tile holds consecutive tokens of the group and their causal limits stay close. They
// run the engine's GEMM-shaped prefill tile (engine_prefill_impl.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "attention_rows.h"
#include "block_sparse.h"
#include "engine.h"
#include "pagedllm/build_info.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

constexpr int kMinPartition = 256;  // tokens: smaller partitions cost more to merge than save
// Query rows (tokens x GQA group) per prefill task: each staged K/V tile then serves more row
// vectors (192 against 64: 1.03-1.10x on the prefill kernel, 1.01-1.03x end to end on "tiny"
// long prompts, 2-core Zen 4, docs/BENCHMARKS.md); kPrefillRowsFew when the larger tasks would
// leave fewer than 4 per thread.
constexpr int kPrefillRows = 192;
constexpr int kPrefillRowsFew = 64;
// Decode runs a sequence's KV heads in lockstep when one head's rows in a block are at most this
// many bytes; longer runs already stream, and one head at a time read them faster (fp32 at
// block 128, 64 KiB runs: lockstep 0.93-0.99x; bf16 there, 32 KiB: 1.04-1.08x; 2-core Zen 4).
constexpr int64_t kMaxLockstepRun = 32 * 1024;

// The engine the calls dispatch to (null until the first call), and whether it was chosen as
// "auto" (not named by PAGEDLLM_CPU_ENGINE or set_cpu_engine).
std::atomic<const EngineOps*> g_engine{nullptr};
std::atomic<bool> g_auto{true};

// The engine compiled under `name`, or null (unknown or not compiled in).
const EngineOps* compiled_engine(const std::string& name) {
  if (name == "generic") return &generic_engine();
#ifdef PAGEDLLM_HAVE_AVX2_KERNELS
  if (name == "avx2") return &avx2_engine();
#endif
#ifdef PAGEDLLM_HAVE_AVX512_KERNELS
  if (name == "avx512") return &avx512_engine();
#endif
#ifdef PAGEDLLM_HAVE_AVX512_BF16_KERNELS
  if (name == "avx512_bf16") return &avx512_bf16_engine();
#endif
  return nullptr;
}

// Whether this CPU (and OS) has every feature the engine `name` is compiled for.
bool cpu_runs(const std::string& name) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (name == "avx2") return avx2;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (name == "avx512") return avx512;
  if (name == "avx512_bf16") return avx512 && f.avx512bf16 && f.avx512vbmi;
  return name == "generic";
}

// The exact engines, best first ("auto" takes the first this CPU runs), then the opt-in ones
// that round the query and probabilities to bf16 (avx512_bf16: engine_avx512_bf16.cpp).
constexpr const char* kEngineNames[] = {"avx512", "avx2", "generic", "avx512_bf16"};
constexpr int kExactEngines = 3;

// The engine `name`, or a pagedllm::Error naming what is wrong (`what`: where the name came from).
const EngineOps& checked_engine(const std::string& name, const char* what) {
  const bool known = name == "generic" || name == "avx2" || name == "avx512" ||
                     name == "avx512_bf16";
  PAGEDLLM_CHECK_ARG(known, what << ": unknown CPU engine '" << name
                                 << "' (expected auto, generic, avx2, avx512 or avx512_bf16)");
  const EngineOps* ops = compiled_engine(name);
  PAGEDLLM_CHECK_ARG(ops != nullptr, what << ": CPU engine '" << name
                                          << "' is not compiled into this build (x86 only)");
  PAGEDLLM_CHECK_ARG(cpu_runs(name),
                     what << ": CPU engine '" << name << "' needs "
                          << (name == "avx2"     ? "AVX2, FMA and F16C"
                              : name == "avx512" ? "AVX-512 F/BW/VL/DQ (and AVX2, FMA, F16C)"
                                                 : "AVX512_BF16, AVX512_VBMI and AVX-512 "
                                                   "F/BW/VL/DQ (and AVX2, FMA, F16C)")
                          << ", which this CPU (or its OS) does not provide");
  return *ops;
}

// The best exact engine compiled in that this CPU runs.
const EngineOps& best_engine() {
  for (int i = 0; i < kExactEngines; ++i) {
    const char* name = kEngineNames[i];
    const EngineOps* ops = compiled_engine(name);
    if (ops != nullptr && cpu_runs(name)) return *ops;
  }
  return generic_engine();
}

// The engine the calls use (chosen at the first call: PAGEDLLM_CPU_ENGINE, else the best).
const EngineOps& engine() {
  const EngineOps* e = g_engine.load(std::memory_order_acquire);
  if (e != nullptr) return *e;
  const char* env = std::getenv("PAGEDLLM_CPU_ENGINE");
  const bool forced = env != nullptr && *env != '\0' && std::string(env) != "auto";
  e = forced ? &checked_engine(env, "PAGEDLLM_CPU_ENGINE") : &best_engine();
  g_auto.store(!forced, std::memory_order_relaxed);
  g_engine.store(e, std::memory_order_release);
  return *e;
}

// The engine decode runs p on: engine(), except that under "auto" a bf16 query (a bf16
// model's) on a bf16 or fp8 cache takes the avx512_bf16 engine's dot products where the CPU has
// them. Such a query is exact in bf16 and enters them unscaled; only the probabilities are
// rounded to bf16 for p.v, as a bf16 model's own attention rounds them (softmax in fp32, then
// cast to bf16). At 2 threads on Zen 4 (docs/BENCHMARKS.md): 1.4-1.6x faster on fp8 caches,
// 1.1-1.3x on bf16 ones.
const EngineOps& decode_engine(const AttentionParams& p) {
  const EngineOps& e = engine();
#ifdef PAGEDLLM_HAVE_AVX512_BF16_KERNELS
  static const bool has_bf16_dot = cpu_runs("avx512_bf16");
  const bool rounded_cache = is_fp8(p.cache.dtype) || p.cache.dtype == CacheType::kBFloat16;
  if (has_bf16_dot && g_auto.load(std::memory_order_relaxed) &&
      p.dtype == ScalarType::kBFloat16 && rounded_cache &&
      avx512_bf16_decodes(p.cache.dtype, p.cache.head_dim)) {
    return avx512_bf16_engine();
  }
#else
  (void)p;
#endif
  return e;
}

// Whether ops.attend applies AttendTask::q_mul itself on p's cache (the query then goes in
// unscaled); otherwise the query rows are loaded scaled and q_mul stays 1.
bool attend_scales(const EngineOps& ops, const AttentionParams& p) {
#ifdef PAGEDLLM_HAVE_AVX512_BF16_KERNELS
  return &ops == &avx512_bf16_engine() && avx512_bf16_decodes(p.cache.dtype, p.cache.head_dim);
#else
  (void)ops;
  (void)p;
  return false;
#endif
}

// Partition length (tokens) for decode over `units` units of work (sequences, or (sequence, KV
// head) pairs) of up to max_len tokens: the whole context unless that leaves threads idle.
int decode_partition_len(int64_t units, int max_len) {
  const int64_t wanted = 4 * static_cast<int64_t>(get_num_threads());
  if (units >= wanted || max_len <= kMinPartition) return std::max(max_len, 1);
  const int64_t parts = (wanted + units - 1) / units;
  int64_t len = (max_len + parts - 1) / parts;
  len = std::max<int64_t>(kMinPartition, (len + 63) / 64 * 64);
  return static_cast<int>(len);
}

// Decode's split-K partials, [num_seqs, kv heads, parts, group] x (max, sum, acc[hd]); empty
// when parts == 1.
struct Partials {
  std::vector<float> max, sum, acc;

  Partials(const AttentionParams& p, int parts, int group) {
    if (parts == 1) return;
    const int64_t n = static_cast<int64_t>(p.num_seqs) * p.cache.num_kv_heads * parts * group;
    max.assign(n, -INFINITY);
    sum.assign(n, 0.0f);
    acc.assign(n * p.cache.head_dim, 0.0f);
  }

  // Points t's state at the partials from row `base` of the layout above.
  void bind(AttendTask& t, int64_t base) {
    t.acc = acc.data() + base * t.head_dim;
    t.row_max = max.data() + base;
    t.row_sum = sum.data() + base;
  }
};

// Merges decode's split-K partials and writes the outputs:
// out = sum_j acc_j e^(m_j - m) / sum_j l_j e^(m_j - m), m = max_j m_j.
void merge_partials(const AttentionParams& p, int parts, int group, const Partials& pa,
                    float vmul) {
  const int kvh_count = p.cache.num_kv_heads;
  const int hd = p.cache.head_dim;
  parallel_for(static_cast<int64_t>(p.num_seqs) * kvh_count, [&](int64_t pair, int) {
    const int seq = static_cast<int>(pair / kvh_count);
    const int kvh = static_cast<int>(pair % kvh_count);
    std::vector<float>& merged = thread_scratch().acc;
    merged.assign(hd, 0.0f);
    for (int g = 0; g < group; ++g) {
      float m = -INFINITY;
      for (int j = 0; j < parts; ++j) m = std::max(m, pa.max[(pair * parts + j) * group + g]);
      std::fill(merged.begin(), merged.end(), 0.0f);
      float l = 0.0f;
      for (int j = 0; j < parts && m != -INFINITY; ++j) {
        const int64_t k = (pair * parts + j) * group + g;
        if (pa.sum[k] == 0.0f) continue;
        const float w = std::exp(pa.max[k] - m);
        l += pa.sum[k] * w;
        const float* a = pa.acc.data() + k * hd;
        for (int d = 0; d < hd; ++d) merged[d] += a[d] * w;
      }
      store_out(p, seq, kvh * group + g, merged.data(), l > 0.0f ? vmul / l : 0.0f);
    }
  });
}

// Decode with each sequence's KV heads in lockstep (EngineOps::attend_heads): units are
// (sequence, partition), each running all KV heads of its range chunk by chunk, so the reads
// walk each block's heads in address order. Against one task per (sequence, KV head), on a
// 2-core Zen 4 at block 16 (docs/BENCHMARKS.md): 1.05-1.48x on the decode kernel. p is
// validated; with a SparseView each head reads its own compacted list (lockstep by position).
// Units are taken in runs of consecutive ones (longest sequences first), and each call names the
// next unit of its run, whose first rows its last steps prefetch (LockstepCall): short
// sequences then read as one stream, not each from a cold start.
void run_decode_heads(const AttentionParams& p, const SparseView* sv, const EngineOps& ops) {
  const bool in_engine = attend_scales(ops, p);
  const int kvh_count = p.cache.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int hd = p.cache.head_dim;
  const int rows = kvh_count * group;
  // Context (compacted when sparse) of (sequence, kv head), and a sequence's longest.
  const auto context = [&](int seq, int kvh) {
    return sv ? sv->length(sv->list(seq, kvh)) : p.context_lens[seq];
  };
  std::vector<int> seq_len(static_cast<size_t>(p.num_seqs), 0);
  int max_len = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int h = 0; h < (sv ? kvh_count : 1); ++h)
      seq_len[s] = std::max(seq_len[s], context(s, h));
    max_len = std::max(max_len, seq_len[s]);
  }
  const int part_len = decode_partition_len(p.num_seqs, max_len);  // units: sequences
  const int parts = partition_count(max_len, part_len);
  const float qmul = query_mul(p, ops);
  const float vmul = value_mul(p, ops);
  Partials partials(p, parts, group);
  // Units (sequence, partition), longest sequences first: the threads take runs of them in
  // order from a shared counter, so the last ones taken are the shortest and no thread is left
  // with a long one while the others idle.
  std::vector<int> order(static_cast<size_t>(p.num_seqs));
  for (int s = 0; s < p.num_seqs; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return seq_len[a] > seq_len[b]; });
  const int64_t num_units = static_cast<int64_t>(p.num_seqs) * parts;
  const int64_t num_runs =
      std::min<int64_t>(num_units, 8 * static_cast<int64_t>(get_num_threads()));
  // Whether unit i reads anything (a partition past a sequence's context does not).
  const auto unit_runs = [&](int64_t i) {
    const int seq = order[static_cast<size_t>(i / parts)];
    const int part = static_cast<int>(i % parts);
    return part * part_len < seq_len[seq] || parts == 1;
  };
  // The tasks of unit i, every KV head (`limit`: kvh_count x group row limits; the query, the
  // state and q_mul are the caller's to set).
  const auto unit_tasks = [&](int64_t i, int32_t* limit, AttendTask* tasks) {
    const int seq = order[static_cast<size_t>(i / parts)];
    const int begin = static_cast<int>(i % parts) * part_len;
    for (int h = 0; h < kvh_count; ++h) {
      const int len = context(seq, h);
      std::fill(limit + h * group, limit + (h + 1) * group, len);
      AttendTask& t = tasks[h];
      t = make_task(p, seq, h, nullptr, group);
      if (sv) t.block_table = sv->table(sv->list(seq, h));
      t.row_limit = limit + h * group;
      t.token_begin = begin;
      t.token_end = partition_end(len, begin, part_len);
    }
    return seq;
  };
  parallel_for(num_runs, [&](int64_t r, int) {
    const int64_t run_end = (r + 1) * num_units / num_runs;
    AttentionScratch& s = thread_scratch();
    AttendTask tasks[kMaxLockstepHeads];
    AttendTask next[kMaxLockstepHeads];
    bool primed = false;
    int64_t i = r * num_units / num_runs;
    while (i < run_end && !unit_runs(i)) ++i;
    while (i < run_end) {
      int64_t j = i + 1;  // the next unit of the run that reads anything
      while (j < run_end && !unit_runs(j)) ++j;
      s.resize(rows, hd);  // the state reset for this unit
      const int seq = unit_tasks(i, s.limit.data(), tasks);
      load_query(p, seq, 0, rows, in_engine ? 1.0f : qmul, s.q.data());
      const int part = static_cast<int>(i % parts);
      for (int h = 0; h < kvh_count; ++h) {
        AttendTask& t = tasks[h];
        const int64_t row0 = static_cast<int64_t>(h) * group;
        t.q = s.q.data() + row0 * hd;
        t.q_mul = in_engine ? qmul : 1.0f;
        if (parts == 1) {
          t.acc = s.acc.data() + row0 * hd;
          t.row_max = s.row_max.data() + row0;
          t.row_sum = s.row_sum.data() + row0;
        } else {
          partials.bind(t, ((static_cast<int64_t>(seq) * kvh_count + h) * parts + part) * group);
        }
      }
      LockstepCall call;
      call.tasks = tasks;
      call.num = kvh_count;
      call.primed = primed;
      if (j < run_end) {
        unit_tasks(j, s.next_limit.data(), next);
        call.next = next;
        call.next_num = kvh_count;
      }
      ops.attend_heads(call);
      primed = call.next != nullptr;
      if (parts == 1) {
        for (int row = 0; row < rows; ++row) {
          const float l = s.row_sum[row];
          store_out(p, seq, row, s.acc.data() + static_cast<int64_t>(row) * hd,
                    l > 0.0f ? vmul / l : 0.0f);
        }
      }
      i = j;
    }
  });
  if (parts == 1) return;
  merge_partials(p, parts, group, partials, vmul);
}

// Decode over every block (sv null) or the blocks of a SparseView; p is validated.
void run_decode(const AttentionParams& p, const SparseView* sv) {
  if (p.num_seqs == 0) return;
  const EngineOps& ops = decode_engine(p);
  const int64_t head_run = static_cast<int64_t>(p.cache.block_size) * p.cache.head_dim *
                           element_size(p.cache.dtype);  // bytes of one head in one block
  if (p.cache.num_kv_heads > 1 && p.cache.num_kv_heads <= kMaxLockstepHeads &&
      head_run <= kMaxLockstepRun) {
    run_decode_heads(p, sv, ops);  // each sequence's KV heads in lockstep
    return;
  }
  const bool in_engine = attend_scales(ops, p);  // q_mul applied by the engine, not load_query
  const int kvh_count = p.cache.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int hd = p.cache.head_dim;
  // Context (compacted when sparse) and block table of (sequence, kv head).
  const auto context = [&](int seq, int kvh) {
    return sv ? sv->length(sv->list(seq, kvh)) : p.context_lens[seq];
  };
  int max_len = 0;
  for (int s = 0; s < p.num_seqs; ++s)
    for (int h = 0; h < (sv ? kvh_count : 1); ++h) max_len = std::max(max_len, context(s, h));
  const int part_len = decode_partition_len(static_cast<int64_t>(p.num_seqs) * kvh_count, max_len);
  const int parts = partition_count(max_len, part_len);
  const float qmul = query_mul(p, ops);
  const float vmul = value_mul(p, ops);
  Partials partials(p, parts, group);

  // Units (sequence, KV head, partition), taken in runs of consecutive ones: while a unit
  // computes, the next unit's first K/V rows are requested (its own chunk prefetch starts only
  // when it does), so short contexts do not start every unit on a cold miss.
  const int64_t num_tasks = static_cast<int64_t>(p.num_seqs) * kvh_count * parts;
  const int64_t num_runs =
      std::min<int64_t>(num_tasks, 8 * static_cast<int64_t>(get_num_threads()));
  const int es = element_size(p.cache.dtype);
  struct Unit {
    int part, kvh, seq, len, begin;
  };
  const auto unit_of = [&](int64_t i) {
    Unit u;
    u.part = static_cast<int>(i % parts);
    u.kvh = static_cast<int>((i / parts) % kvh_count);
    u.seq = static_cast<int>(i / parts / kvh_count);
    u.len = context(u.seq, u.kvh);
    u.begin = u.part * part_len;
    return u;
  };
  const auto prefetch_start = [&](int64_t i) {
    const auto [part, kvh, seq, len, begin] = unit_of(i);
    if (begin >= len) return;
    AttendTask t = make_task(p, seq, kvh, nullptr, group);
    if (sv) t.block_table = sv->table(sv->list(seq, kvh));
    const int bs = t.block_size;
    const int first = begin / bs;
    const int last = std::min((partition_end(len, begin, part_len) - 1) / bs, first + 1);
    for (int b = first; b <= last; ++b) {
      const int64_t id = t.block_table[b];
      const int tokens = std::min(bs, len - b * bs);
      const int64_t bytes = static_cast<int64_t>(tokens) * hd * es;
      const uint8_t* k = t.key_head + id * t.key_block_stride_bytes;
      const uint8_t* v = t.value_head + id * t.value_block_stride_bytes;
      for (int64_t o = 0; o < bytes; o += 64) {
        __builtin_prefetch(k + o, 0, 2);
        __builtin_prefetch(v + o, 0, 2);
      }
    }
  };
  const auto run_unit = [&](int64_t i) {
    const auto [part, kvh, seq, len, begin] = unit_of(i);
    if (begin >= len && !(part == 0 && parts == 1)) return;  // empty partition
    AttentionScratch& s = thread_scratch();
    s.resize(group, hd);
    load_query(p, seq, kvh * group, group, in_engine ? 1.0f : qmul, s.q.data());
    std::fill(s.limit.begin(), s.limit.end(), len);
    AttendTask t = make_task(p, seq, kvh, s.q.data(), group);
    t.q_mul = in_engine ? qmul : 1.0f;
    if (sv) t.block_table = sv->table(sv->list(seq, kvh));
    t.row_limit = s.limit.data();
    t.token_begin = begin;
    t.token_end = partition_end(len, begin, part_len);
    if (parts == 1) {
      t.acc = s.acc.data();
      t.row_max = s.row_max.data();
      t.row_sum = s.row_sum.data();
      ops.attend(t);
      for (int g = 0; g < group; ++g) {
        const float l = s.row_sum[g];
        store_out(p, seq, kvh * group + g, s.acc.data() + g * hd, l > 0.0f ? vmul / l : 0.0f);
      }
      return;
    }
    partials.bind(t, i * group);  // partials are laid out in task order
    ops.attend(t);
  };
  parallel_for(num_runs, [&](int64_t r, int) {
    const int64_t end = (r + 1) * num_tasks / num_runs;
    for (int64_t i = r * num_tasks / num_runs; i < end; ++i) {
      if (i + 1 < end) prefetch_start(i + 1);
      run_unit(i);
    }
  });
  if (parts == 1) return;

  merge_partials(p, parts, group, partials, vmul);
}

// Prefill over every block (sv null) or the blocks of a SparseView; p is validated.
void run_prefill(const AttentionParams& p, const SparseView* sv) {
  if (p.num_tokens == 0) return;
  const EngineOps& ops = engine();
  const int kvh_count = p.cache.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int hd = p.cache.head_dim;
  const auto tiles_of = [&](int tile_tokens) {
    int64_t n = 0;
    for (int s = 0; s < p.num_seqs; ++s)
      n += (int64_t{p.cu_seqlens_q[s + 1]} - p.cu_seqlens_q[s] + tile_tokens - 1) / tile_tokens;
    return n;
  };
  int tile_tokens = std::max(1, kPrefillRows / group);
  if (tiles_of(tile_tokens) * kvh_count < 4 * static_cast<int64_t>(get_num_threads()))
    tile_tokens = std::max(1, kPrefillRowsFew / group);
  const float qmul = query_mul(p, ops);
  const bool bf16_dot = cpu_features().avx512bf16;
  // A bf16 model's probabilities go to p.v rounded to bf16, as its own attention rounds them
  // (AttendTask::bf16_probs); a named engine stays exact.
  const bool bf16_probs =
      p.dtype == ScalarType::kBFloat16 && g_auto.load(std::memory_order_relaxed);
  const float vmul = value_mul(p, ops);

  // Tasks: (sequence, first query token of the tile), the deepest tiles first so the costly
  // ones start early; each runs for every KV head.
  struct Tile {
    int seq, first;
  };
  std::vector<Tile> tiles;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    for (int64_t i = 0; i < q_len; i += tile_tokens) tiles.push_back({s, static_cast<int>(i)});
  }
  std::stable_sort(tiles.begin(), tiles.end(), [&](const Tile& a, const Tile& b) {
    const auto depth = [&](const Tile& t) {
      const int q_len = p.cu_seqlens_q[t.seq + 1] - p.cu_seqlens_q[t.seq];
      return p.context_lens[t.seq] - q_len + t.first;
    };
    return depth(a) > depth(b);
  });

  parallel_for(static_cast<int64_t>(tiles.size()) * kvh_count, [&](int64_t i, int) {
    const Tile& tile = tiles[i / kvh_count];
    const int kvh = static_cast<int>(i % kvh_count);
    const int len = p.context_lens[tile.seq];
    const int q0 = p.cu_seqlens_q[tile.seq];
    const int q_len = p.cu_seqlens_q[tile.seq + 1] - q0;
    const int tokens = std::min(tile_tokens, q_len - tile.first);
    const int rows = tokens * group;
    const int list = sv ? sv->list(tile.seq, kvh) : 0;
    AttentionScratch& s = thread_scratch();
    s.resize(rows, hd);
    for (int k = 0; k < tokens; ++k) {  // unscaled: the engine applies qmul (t.q_mul)
      const int i_tok = tile.first + k;
      load_query(p, q0 + i_tok, kvh * group, group, 1.0f, s.q.data() + k * group * hd);
      const int causal = len - q_len + i_tok + 1;
      const int limit = sv ? sv->compact_limit(list, causal) : causal;
      for (int g = 0; g < group; ++g) s.limit[k * group + g] = limit;
    }
    AttendTask t = make_task(p, tile.seq, kvh, s.q.data(), rows);
    if (sv) t.block_table = sv->table(list);
    t.row_limit = s.limit.data();
    t.token_begin = 0;
    t.token_end = sv ? sv->length(list) : len;
    t.acc = s.acc.data();
    t.row_max = s.row_max.data();
    t.row_sum = s.row_sum.data();
    t.q_mul = qmul;
    t.bf16_dot = bf16_dot;
    t.bf16_probs = bf16_probs;
    s.work.resize(static_cast<size_t>(ops.prefill_work_floats(rows, hd)));
    ops.prefill(t, s.work.data());
    for (int k = 0; k < tokens; ++k) {
      for (int g = 0; g < group; ++g) {
        const int r = k * group + g;
        const float l = s.row_sum[r];
        store_out(p, q0 + tile.first + k, kvh * group + g, s.acc.data() + r * hd,
                  l > 0.0f ? vmul / l : 0.0f);
      }
    }
  });
}

}  // namespace

void paged_attention_decode(const AttentionParams& p) {
  validate_attention(p, /*prefill=*/false);
  run_decode(p, nullptr);
}

void paged_attention_prefill(const AttentionParams& p) {
  validate_attention(p, /*prefill=*/true);
  run_prefill(p, nullptr);
}

void paged_attention_decode_sparse(const AttentionParams& p, const BlockSparseParams& sparse) {
  validate_attention(p, /*prefill=*/false, /*check_tables=*/false);
  const SparseView sv(p, sparse);
  run_decode(p, &sv);
}

void paged_attention_prefill_sparse(const AttentionParams& p, const BlockSparseParams& sparse) {
  validate_attention(p, /*prefill=*/true, /*check_tables=*/false);
  const SparseView sv(p, sparse);
  run_prefill(p, &sv);
}

const EngineOps& current_engine() { return engine(); }

std::string active_cpu_kernel() { return engine().name; }

void set_cpu_engine(const std::string& name) {
  const bool automatic = name == "auto";
  const EngineOps* e = automatic ? &best_engine() : &checked_engine(name, "set_cpu_engine");
  g_auto.store(automatic, std::memory_order_relaxed);
  g_engine.store(e, std::memory_order_release);
}

std::vector<std::string> available_cpu_engines() {
  std::vector<std::string> names;
  for (const char* name : kEngineNames)
    if (compiled_engine(name) != nullptr && cpu_runs(name)) names.emplace_back(name);
  return names;
}

void force_generic_kernels(bool on) { set_cpu_engine(on ? "generic" : "auto"); }

}  // namespace pagedllm::kernels
