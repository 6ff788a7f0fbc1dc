// paged_cross_attention: validate, cut the packed query tokens into tiles, run each (tile, KV
// head) as one engine task whose rows carry their own key range [lo, hi) (AttendTask's
// row_start / row_limit), write the normalised rows. No split-K: a task covers the whole
// union of its rows' ranges; rows with an empty range keep a zero sum and are written as zeros.
//
// Tiles are consecutive query tokens of one sequence (kPrefillRows rows of tokens x GQA
// group), so K/V are read once per tile for the whole group; consecutive tokens of a Mllama
// prompt mostly share one range (all tokens after an image see the same images), so a tile's
// union is rarely wider than its rows' ranges. Tiles with the widest unions start first.
#include <algorithm>
#include <vector>

#include "attention_rows.h"
#include "engine.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

constexpr int kCrossRows = 64;  // query rows (tokens x GQA group) per task

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
    for (int i = p.cu_seqlens_q[s]; i < p.cu_seqlens_q[s + 1]; i += tile_tokens) {
      CrossTile t{s, i, std::min(tile_tokens, p.cu_seqlens_q[s + 1] - i), p.context_lens[s], 0};
      for (int k = 0; k < t.count; ++k) {
        const int lo = ranges[2 * (i + k)], hi = ranges[2 * (i + k) + 1];
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

// p and ranges are validated.
void run_cross(const AttentionParams& p, const int32_t* ranges) {
  if (p.num_tokens == 0) return;
  const EngineOps& ops = current_engine();
  const int kvh_count = p.cache.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int hd = p.cache.head_dim;
  const float qmul = query_mul(p, ops);
  const float vmul = value_mul(p, ops);
  const std::vector<CrossTile> tiles = plan_tiles(p, ranges, std::max(1, kCrossRows / group));

  parallel_for(static_cast<int64_t>(tiles.size()) * kvh_count, [&](int64_t i, int) {
    const CrossTile& tile = tiles[i / kvh_count];
    const int kvh = static_cast<int>(i % kvh_count);
    const int rows = tile.count * group;
    AttentionScratch& s = thread_scratch();
    s.resize(rows, hd);
    if (tile.begin < tile.end) {
      for (int k = 0; k < tile.count; ++k) {
        const int token = tile.first + k;
        load_query(p, token, kvh * group, group, qmul, s.q.data() + k * group * hd);
        for (int g = 0; g < group; ++g) {
          s.start[k * group + g] = ranges[2 * token];
          s.limit[k * group + g] = ranges[2 * token + 1];
        }
      }
      AttendTask t = make_task(p, tile.seq, kvh, s.q.data(), rows);
      t.row_start = s.start.data();
      t.row_limit = s.limit.data();
      t.token_begin = tile.begin;
      t.token_end = tile.end;
      t.acc = s.acc.data();
      t.row_max = s.row_max.data();
      t.row_sum = s.row_sum.data();
      ops.attend(t);
    }
    for (int r = 0; r < rows; ++r) {
      const float l = s.row_sum[r];
      store_out(p, tile.first + r / group, kvh * group + r % group, s.acc.data() + r * hd,
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
