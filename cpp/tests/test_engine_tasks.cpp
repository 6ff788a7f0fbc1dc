// The engines' task contract (cpp/src/kernels/engine.h, internal): a task's running max, sum and
// output are state a later task over the next token range resumes from, in the natural units
// of the scores. The public calls run one prefill task per row over the whole context, so they
// never resume from a prefill task's max; these tests call EngineOps::prefill directly, split
// at token boundaries inside and between key tiles, and compare with one task and with
// EngineOps::attend (the row-major loop, which also takes the state in natural units).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../src/kernels/engine.h"
#include "cpu_engine_test.h"
#include "pagedllm/kernels/kernels.h"

namespace pk = pagedllm::kernels;

namespace {

// One KV head of fp32 K/V in permuted blocks, and `rows` query rows (tokens x group, causal
// limits of the last tokens of a sequence of `len`).
struct Problem {
  int hd, bs, len, rows, group;
  std::vector<float> k, v, q;
  std::vector<int32_t> table, limit;

  Problem(int head_dim, int block, int length, int tokens, int group_size)
      : hd(head_dim), bs(block), len(length), rows(tokens * group_size), group(group_size) {
    std::mt19937 rng(5);
    std::normal_distribution<float> n01;
    const int blocks = (len + bs - 1) / bs;
    k.resize(static_cast<size_t>(blocks) * bs * hd);
    v.resize(k.size());
    for (float& x : k) x = 2.0f * n01(rng);  // scores of a few units: the max moves
    for (float& x : v) x = n01(rng);
    q.resize(static_cast<size_t>(rows) * hd);
    for (float& x : q) x = n01(rng);
    table.resize(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int t = 0; t < tokens; ++t)
      for (int g = 0; g < group; ++g) limit.push_back(len - tokens + t + 1);
  }
};

// Running state of the rows: acc [rows, hd], max and sum [rows].
struct State {
  std::vector<float> acc, max, sum;
  explicit State(const Problem& p)
      : acc(static_cast<size_t>(p.rows) * p.hd, 0.0f), max(p.rows, -INFINITY), sum(p.rows, 0.0f) {}
};

pk::AttendTask task_over(const Problem& p, const float* q, float q_mul, int begin, int end,
                         State* s) {
  pk::AttendTask t;
  t.q = q;
  t.row_limit = p.limit.data();
  t.num_rows = p.rows;
  t.acc = s->acc.data();
  t.row_max = s->max.data();
  t.row_sum = s->sum.data();
  t.token_begin = begin;
  t.token_end = end;
  t.key_head = reinterpret_cast<const uint8_t*>(p.k.data());
  t.value_head = reinterpret_cast<const uint8_t*>(p.v.data());
  t.key_block_stride_bytes = static_cast<int64_t>(p.bs) * p.hd * 4;
  t.value_block_stride_bytes = t.key_block_stride_bytes;
  t.block_table = p.table.data();
  t.block_size = p.bs;
  t.head_dim = p.hd;
  t.cache_dtype = pk::CacheType::kFloat32;
  t.q_mul = q_mul;
  return t;
}

// Prefill of the rows over [0, len) as tasks split at `cuts`.
State prefill_split(const pk::EngineOps& e, const Problem& p, float scale,
                    const std::vector<int>& cuts) {
  State s(p);
  std::vector<float> work(static_cast<size_t>(e.prefill_work_floats(p.rows, p.hd)));
  int begin = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const int end = i < cuts.size() ? cuts[i] : p.len;
    e.prefill(task_over(p, p.q.data(), scale, begin, end, &s), work.data());
    begin = end;
  }
  return s;
}

void expect_same_state(const State& a, const State& b, const Problem& p, const char* what) {
  for (int r = 0; r < p.rows; ++r) {
    EXPECT_NEAR(a.max[r], b.max[r], 1e-5f * (1.0f + std::fabs(b.max[r]))) << what << " row " << r;
    for (int d = 0; d < p.hd; ++d) {
      const float x = a.acc[static_cast<size_t>(r) * p.hd + d] / a.sum[r];
      const float y = b.acc[static_cast<size_t>(r) * p.hd + d] / b.sum[r];
      ASSERT_NEAR(x, y, 2e-5f * (1.0f + std::fabs(y))) << what << " row " << r << " d " << d;
    }
  }
}

class EngineTasks : public pagedllm_test::CpuEngineTest {};

// A prefill task resumed from another's state (max in natural units) gives one task's result,
// and its max is attend's.
TEST_P(EngineTasks, PrefillResumesFromAnotherTasksState) {
  const pk::EngineOps* e = &pk::current_engine();  // the one the fixture set
  ASSERT_EQ(pk::active_cpu_kernel(), GetParam());
  for (int hd : {32, 64, 40}) {
    const Problem p(hd, 16, 300, 9, 4);  // 36 rows: two row vectors of 16 and a partial one
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const State whole = prefill_split(*e, p, scale, {});
    // cuts inside a key tile, on one, and into the causal rows' own tokens
    const State parts = prefill_split(*e, p, scale, {37, 128, 293});
    expect_same_state(parts, whole, p, "split prefill against one task");
    std::vector<float> qs(p.q);
    for (float& x : qs) x *= scale;
    State rows(p);
    e->attend(task_over(p, qs.data(), 1.0f, 0, p.len, &rows));
    expect_same_state(whole, rows, p, "prefill against attend");
    // attend resumed from a prefill task's state
    State mixed(p);
    std::vector<float> work(static_cast<size_t>(e->prefill_work_floats(p.rows, p.hd)));
    e->prefill(task_over(p, p.q.data(), scale, 0, 150, &mixed), work.data());
    e->attend(task_over(p, qs.data(), 1.0f, 150, p.len, &mixed));
    expect_same_state(mixed, rows, p, "attend resumed from prefill");
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineTasks,
                         ::testing::Values("generic", "avx2", "avx512", "avx512_bf16"));

}  // namespace
