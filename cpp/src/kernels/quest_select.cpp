// quest_select: Quest's query-aware block choice on the CPU, one task per (sequence, KV head)
// on the kernel thread pool. Per block, the attention engine in use (engine.h: score_bounds,
// the same vector operations as its attention loop) reads the bounds rows (min, max of the
// block's keys, in the cache's storage type) and for each query head g of the GQA group
// computes ub_g = sum_d (max(q_gd, 0) max_d + min(q_gd, 0) min_d); the score is max_g ub_g.
// Forced blocks score +inf; the budget's best are kept (nth_element), then sorted by id.
// The bounds are 2 rows per block against block_size K and V rows, so this reads
// 1 / block_size of what dense attention reads.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pagedllm::kernels {
namespace {

// Checks sizes, the forced lists, budgets and the output layout; the used blocks' ids of the
// sequences with a budget.
void validate_quest(const QuestSelectParams& p) {
  PAGEDLLM_CHECK_ARG(p.num_seqs >= 0 && p.num_kv_heads >= 1 && p.num_heads >= 1 &&
                         p.num_heads % p.num_kv_heads == 0,
                     "quest_select: num_heads (" << p.num_heads
                                                 << ") must be a positive multiple of "
                                                    "num_kv_heads ("
                                                 << p.num_kv_heads << ")");
  PAGEDLLM_CHECK_ARG(p.head_dim >= 8 && p.head_dim <= 512 && p.head_dim % 8 == 0,
                     "quest_select: head_dim must be a multiple of 8 in [8, 512], got "
                         << p.head_dim);
  PAGEDLLM_CHECK_ARG(p.forced_indptr[0] == 0 && p.forced_indptr[p.num_seqs] == p.num_forced,
                     "quest_select: forced_indptr must run from 0 to the number of forced ids ("
                         << p.num_forced << ")");
  const int kvh = p.num_kv_heads;
  PAGEDLLM_CHECK_ARG(p.out_indptr[0] == 0 && p.out_indptr[p.num_seqs * kvh] == p.num_out,
                     "quest_select: out_indptr must run from 0 to the output's length ("
                         << p.num_out << ")");
  for (int s = 0; s < p.num_seqs; ++s) {
    const int used = p.num_seq_blocks[s];
    PAGEDLLM_CHECK_ARG(used >= 0 && used <= p.max_blocks_per_seq,
                       "quest_select: num_seq_blocks[" << s << "] = " << used
                                                       << " is outside [0, "
                                                       << p.max_blocks_per_seq
                                                       << "] (the block table's width)");
    const int f0 = p.forced_indptr[s], f1 = p.forced_indptr[s + 1];
    PAGEDLLM_CHECK_ARG(f1 >= f0, "quest_select: forced_indptr must be non-decreasing");
    for (int j = f0; j < f1; ++j) {
      PAGEDLLM_CHECK_INDEX(p.forced_indices[j] >= 0 && p.forced_indices[j] < used &&
                               (j == f0 || p.forced_indices[j] > p.forced_indices[j - 1]),
                           "quest_select: forced_indices[" << j << "] = " << p.forced_indices[j]
                                                           << " must increase inside [0, " << used
                                                           << ")");
    }
    const int b = p.budget[s];
    const int want = b > 0 ? b : f1 - f0;
    PAGEDLLM_CHECK_ARG(b == 0 || (b >= f1 - f0 && b <= used),
                       "quest_select: budget[" << s << "] = " << b << " must be 0 or in ["
                                               << f1 - f0 << ", " << used << "]");
    for (int h = 0; h < kvh; ++h) {
      const int l = s * kvh + h;
      PAGEDLLM_CHECK_ARG(p.out_indptr[l + 1] - p.out_indptr[l] == want,
                         "quest_select: out list " << l << " has room for "
                                                   << p.out_indptr[l + 1] - p.out_indptr[l]
                                                   << " ids, expected " << want);
    }
    if (b == 0) continue;
    const int32_t* row = p.block_tables + static_cast<int64_t>(s) * p.block_table_stride;
    for (int i = 0; i < used; ++i) {
      PAGEDLLM_CHECK_INDEX(row[i] >= 0 && row[i] < p.num_blocks,
                           "quest_select: block_tables[" << s << "][" << i << "] = " << row[i]
                                                         << " is outside the pool [0, "
                                                         << p.num_blocks << ")");
    }
  }
}

}  // namespace

void quest_select(const QuestSelectParams& p) {
  validate_quest(p);
  const int kvh = p.num_kv_heads;
  const int group = p.num_heads / kvh;
  const int hd = p.head_dim;
  parallel_for(static_cast<int64_t>(p.num_seqs) * kvh, [&](int64_t task, int) {
    const int s = static_cast<int>(task / kvh);
    const int h = static_cast<int>(task % kvh);
    const int32_t* forced = p.forced_indices + p.forced_indptr[s];
    const int num_forced = p.forced_indptr[s + 1] - p.forced_indptr[s];
    int32_t* out = p.out_indices + p.out_indptr[s * kvh + h];
    const int budget = p.budget[s];
    if (budget == 0) {
      std::copy(forced, forced + num_forced, out);
      return;
    }
    const int used = p.num_seq_blocks[s];
    // q+ and q- of the group's heads: [group, hd] each
    std::vector<float> qp(static_cast<size_t>(group) * hd), qn(qp.size());
    for (int g = 0; g < group; ++g) {
      const int64_t off = s * p.query_token_stride + (h * group + g) * p.query_head_stride;
      for (int d = 0; d < hd; ++d) {
        const float q = load_scalar(p.query, p.dtype, off + d);
        qp[g * hd + d] = q > 0.0f ? q : 0.0f;
        qn[g * hd + d] = q < 0.0f ? q : 0.0f;
      }
    }
    std::vector<float> score(static_cast<size_t>(used));
    const int es = element_size(p.bound_dtype);
    BoundsTask t;
    t.qp = qp.data();
    t.qn = qn.data();
    t.group = group;
    t.key_min = static_cast<const uint8_t*>(p.key_min) + h * p.bound_head_stride * es;
    t.key_max = static_cast<const uint8_t*>(p.key_max) + h * p.bound_head_stride * es;
    t.block_stride_bytes = p.bound_block_stride * es;
    t.blocks = p.block_tables + static_cast<int64_t>(s) * p.block_table_stride;
    t.num_blocks = used;
    t.head_dim = hd;
    t.dtype = p.bound_dtype;
    t.score = score.data();
    current_engine().score_bounds(t);
    for (int j = 0; j < num_forced; ++j) score[forced[j]] = INFINITY;
    std::vector<int32_t> ids(static_cast<size_t>(used));
    std::iota(ids.begin(), ids.end(), 0);
    const auto better = [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    };
    std::nth_element(ids.begin(), ids.begin() + (budget - 1), ids.end(), better);
    std::sort(ids.begin(), ids.begin() + budget);
    std::copy(ids.begin(), ids.begin() + budget, out);
  });
}

}  // namespace pagedllm::kernels
