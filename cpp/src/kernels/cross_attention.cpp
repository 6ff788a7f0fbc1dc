// paged_cross_attention: validate, cut the packed query tokens into tiles, run each (tile, KV
// head) as engine tasks whose rows carry their own key range [lo, hi) (AttendTask's
// row_start / row_limit), write the normalised rows; rows with an empty range keep a zero sum
// and are written as zeros. When there are fewer (tile, KV head) pairs than ~4 tasks per
// thread (decode steps of a few sequences over long cross contexts), the key ranges are cut
// into partitions of >= kMinPartition tokens whose partial (max, sum, acc) are merged.
//
// Tiles are consecutive query tokens of one sequence (kCrossRows rows of tokens x GQA
// group), so K/V are read once per tile for the whole group; consecutive tokens of a Mllama
// prompt mostly share one range (all tokens after an image see the same images), so a tile's
// union is rarely wider than its rows' ranges. Tiles with the widest unions start first.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_rows.h"
#include "engine.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

constexpr int kCrossRows = 64;       // query rows (tokens x GQA group) per task
constexpr int kMinPartition = 256;   // tokens: shorter partitions cost more to merge than save

// A tile: `count` query tokens of sequence `seq` from packed token `first`, attending the
// union [begin, end) of their ranges (begin >= end: every row's range is empty).
struct CrossTile {
  int seq, first, count, begin, end;
};

// The tiles of every sequence, widest union first.
std::vector<CrossTile> plan_tiles(const AttentionParams& p, const int32_t* ranges,
                                  int tile_tokens) {
  std::vector<CrossTile> tiles;
  for (int s = 0; s < p.num_seqs; ++s) {
    for (int64_t i = p.cu_seqlens_q[s]; i < p.cu_seqlens_q[s + 1]; i += tile_tokens) {
      const int first = static_cast<int>(i);
      CrossTile t{s, first, std::min(tile_tokens, p.cu_seqlens_q[s + 1] - first),
                  p.context_lens[s], 0};
      for (int k = 0; k < t.count; ++k) {
        const int64_t r = 2 * (i + k);
        const int lo = ranges[r], hi = ranges[r + 1];
        if (lo >= hi) continue;
        t.begin = std::min(t.begin, lo);
        t.end = std::max(t.end, hi);
      }
      tiles.push_back(t);
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const CrossTile& a, const CrossTile& b) {
    return std::max(a.end - a.begin, 0) > std::max(b.end - b.begin, 0);
  });
  return tiles;
}

// Partition length (tokens) of the key ranges: the widest union unless that leaves threads
// idle (flash-decoding, as decode does: a decode step of one sequence has only num_kv_heads
// tiles), then partitions of >= kMinPartition tokens whose partials are merged.
int partition_len(int64_t tasks, int max_span) {
  const int64_t wanted = 4 * static_cast<int64_t>(get_num_threads());
  if (tasks >= wanted || max_span <= 2 * kMinPartition) return std::max(max_span, 1);
  const int64_t parts = (wanted + tasks - 1) / tasks;
  int64_t len = (max_span + parts - 1) / parts;
  len = std::max<int64_t>(kMinPartition, (len + 63) / 64 * 64);
  return static_cast<int>(len);
}

// Loads the query rows and key ranges of (tile, kvh) into s (rows = tile.count * group).
void load_tile(const AttentionParams& p, const int32_t* ranges, const CrossTile& tile, int kvh,
               int group, float qmul, AttentionScratch& s) {
  const int hd = p.cache.head_dim;
  for (int k = 0; k < tile.count; ++k) {
    const int token = tile.first + k;
    load_query(p, token, kvh * group, group, qmul, s.q.data() + k * group * hd);
    for (int g = 0; g < group; ++g) {
      s.start[k * group + g] = ranges[2 * static_cast<int64_t>(token)];
      s.limit[k * group + g] = ranges[2 * static_cast<int64_t>(token) + 1];
    }
  }
}

// p and ranges are validated.
void run_cross(const AttentionParams& p, const int32_t* ranges) {
  if (p.num_tokens == 0) return;
  const EngineOps& ops = current_engine();
  const int kvh_count = p.cache.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int hd = p.cache.head_dim;
  const float qmul = query_mul(p, ops);
  const float vmul = value_mul(p, ops);
  const int tile_tokens = std::max(1, kCrossRows / group);
  const std::vector<CrossTile> tiles = plan_tiles(p, ranges, tile_tokens);
  const int64_t pairs = static_cast<int64_t>(tiles.size()) * kvh_count;
  const int max_span = std::max(tiles.front().end - tiles.front().begin, 0);  // widest first
  const int part_len = partition_len(pairs, max_span);
  const int parts = partition_count(max_span, part_len);

  // Split-K partials: [pairs, parts, tile rows] x (max, sum, acc[hd]), rows padded to the
  // largest tile's.
  int64_t max_rows = 0;
  for (const CrossTile& t : tiles) max_rows = std::max<int64_t>(max_rows, t.count * group);
  const int64_t num_partials = parts > 1 ? pairs * parts * max_rows : 0;
  std::vector<float> part_max(num_partials, -INFINITY), part_sum(num_partials, 0.0f);
  std::vector<float> part_acc(num_partials * hd, 0.0f);

  parallel_for(pairs * parts, [&](int64_t i, int) {
    const int64_t pair = i / parts;
    const int part = static_cast<int>(i % parts);
    const CrossTile& tile = tiles[pair / kvh_count];
    const int kvh = static_cast<int>(pair % kvh_count);
    const int rows = tile.count * group;
    // int64: a tile's begin plus the widest span's partition offsets can pass INT32_MAX.
    const int64_t begin64 = tile.begin + static_cast<int64_t>(part) * part_len;
    if (parts > 1 && begin64 >= tile.end) return;  // an empty partition: partials stay (-inf, 0)
    const int begin = static_cast<int>(begin64);
    const int end = partition_end(tile.end, begin, part_len);
    AttentionScratch& s = thread_scratch();
    s.resize(rows, hd);
    AttendTask t = make_task(p, tile.seq, kvh, s.q.data(), rows);
    t.row_start = s.start.data();
    t.row_limit = s.limit.data();
    t.token_begin = begin;
    t.token_end = end;
    t.acc = s.acc.data();
    t.row_max = s.row_max.data();
    t.row_sum = s.row_sum.data();
    if (parts > 1) {  // partials are laid out in task order
      const int64_t base = i * max_rows;
      t.acc = part_acc.data() + base * hd;
      t.row_max = part_max.data() + base;
      t.row_sum = part_sum.data() + base;
    }
    if (begin < end) {
      load_tile(p, ranges, tile, kvh, group, qmul, s);
      ops.attend(t);
    }
    if (parts > 1) return;
    for (int r = 0; r < rows; ++r) {  // one partition: normalise and write (empty rows: 0)
      const float l = s.row_sum[r];
      store_out(p, tile.first + r / group, kvh * group + r % group, s.acc.data() + r * hd,
                l > 0.0f ? vmul / l : 0.0f);
    }
  });
  if (parts == 1) return;

  // Merge: out = sum_j acc_j e^(m_j - m) / sum_j l_j e^(m_j - m), m = max_j m_j over the
  // partitions j with l_j > 0 (none: a zero row).
  parallel_for(pairs, [&](int64_t pair, int) {
    const CrossTile& tile = tiles[pair / kvh_count];
    const int kvh = static_cast<int>(pair % kvh_count);
    std::vector<float>& merged = thread_scratch().acc;
    merged.resize(hd);
    for (int r = 0; r < tile.count * group; ++r) {
      const auto at = [&](int j) { return (pair * parts + j) * max_rows + r; };
      float m = -INFINITY;
      for (int j = 0; j < parts; ++j)
        if (part_sum[at(j)] > 0.0f) m = std::max(m, part_max[at(j)]);
      std::fill(merged.begin(), merged.end(), 0.0f);
      float l = 0.0f;
      for (int j = 0; j < parts; ++j) {
        if (!(part_sum[at(j)] > 0.0f)) continue;
        const float w = std::exp(part_max[at(j)] - m);
        l += part_sum[at(j)] * w;
        const float* a = part_acc.data() + at(j) * hd;
        for (int d = 0; d < hd; ++d) merged[d] += a[d] * w;
      }
      store_out(p, tile.first + r / group, kvh * group + r % group, merged.data(),
                l > 0.0f ? vmul / l : 0.0f);
    }
  });
}

}  // namespace

void paged_cross_attention(const AttentionParams& p, const int32_t* kv_ranges) {
  validate_cross_attention(p, kv_ranges);
  run_cross(p, kv_ranges);
}

}  // namespace pagedllm::kernels
