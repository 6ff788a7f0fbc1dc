// paged_cross_attention through its C++ params API (no Python): every engine against a
// double-precision reference over scattered fp32 blocks, with per-token key ranges (empty,
// partial, full) in one tile and split-K over long ranges, and its validation (bad ranges
// throw before anything is written).
// The exhaustive sweeps (dtypes, GQA, block sizes) live in
// tests/python/test_kernels_cross_attention.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu_engine_test.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pk = pagedllm::kernels;

namespace {

// Cross K/V of several sequences in permuted fp32 blocks, packed query tokens and their ranges.
struct CrossFixture {
  int kvh = 2, heads = 8, hd = 64, bs = 4, num_blocks = 0, max_blocks = 0;
  std::vector<int32_t> ctx;      // [num_seqs] cross tokens
  std::vector<int32_t> cu;       // [num_seqs + 1]
  std::vector<int32_t> ranges;   // [num_tokens, 2]
  std::vector<float> k, v;       // [num_blocks, kvh, bs, hd]
  std::vector<int32_t> tables;   // [num_seqs, max_blocks]
  std::vector<float> q, out;     // [num_tokens, heads, hd]

  // ranges_per_seq[s]: the (lo, hi) of each query token of sequence s.
  CrossFixture(std::vector<int32_t> lens,
               const std::vector<std::vector<std::pair<int, int>>>& ranges_per_seq)
      : ctx(std::move(lens)) {
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    for (int len : ctx) max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    max_blocks = std::max(max_blocks, 1);
    num_blocks = static_cast<int>(ctx.size()) * max_blocks;
    k.resize(static_cast<size_t>(num_blocks) * kvh * bs * hd);
    v.resize(k.size());
    for (auto& x : k) x = n01(rng);
    for (auto& x : v) x = n01(rng);
    tables.resize(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    cu.push_back(0);
    for (const auto& rs : ranges_per_seq) {
      for (const auto& r : rs) {
        ranges.push_back(r.first);
        ranges.push_back(r.second);
      }
      cu.push_back(cu.back() + static_cast<int32_t>(rs.size()));
    }
    q.resize(static_cast<size_t>(cu.back()) * heads * hd);
    for (auto& x : q) x = n01(rng);
    out.assign(q.size(), NAN);
  }

  pk::AttentionParams params() {
    pk::AttentionParams p;
    p.out = out.data();
    p.query = q.data();
    p.out_token_stride = p.query_token_stride = heads * hd;
    p.out_head_stride = p.query_head_stride = hd;
    p.num_tokens = cu.back();
    p.num_heads = heads;
    p.cache.key_cache = k.data();
    p.cache.value_cache = v.data();
    p.cache.key_block_stride = p.cache.value_block_stride = kvh * bs * hd;
    p.cache.num_blocks = num_blocks;
    p.cache.num_kv_heads = kvh;
    p.cache.block_size = bs;
    p.cache.head_dim = hd;
    p.block_tables = tables.data();
    p.block_table_stride = max_blocks;
    p.max_blocks_per_seq = max_blocks;
    p.context_lens = ctx.data();
    p.cu_seqlens_q = cu.data();
    p.num_seqs = static_cast<int>(ctx.size());
    p.scale = 0.125f;
    return p;
  }

  // Runs the kernel and checks every output row against reference() (empty ranges: exact 0).
  void run_and_check() {
    pk::paged_cross_attention(params(), ranges.data());
    for (int s = 0; s + 1 < static_cast<int>(cu.size()); ++s) {
      for (int i = cu[s]; i < cu[s + 1]; ++i) {
        for (int h = 0; h < heads; ++h) {
          const auto ref = reference(s, i, h);
          const float* row = out.data() + (static_cast<size_t>(i) * heads + h) * hd;
          const bool empty = ranges[2 * i] == ranges[2 * i + 1];
          for (int d = 0; d < hd; ++d) {
            if (empty) {
              ASSERT_EQ(row[d], 0.0f) << "token " << i << " head " << h;
            } else {
              ASSERT_NEAR(row[d], ref[d], 1e-5) << "token " << i << " head " << h;
            }
          }
        }
      }
    }
  }

  // Double-precision attention of query token i, head h, of sequence s over keys [lo, hi).
  std::vector<double> reference(int s, int i, int h) const {
    const int lo = ranges[2 * i], hi = ranges[2 * i + 1];
    const int g = h / (heads / kvh);
    const float* qr = q.data() + (static_cast<size_t>(i) * heads + h) * hd;
    std::vector<double> out_row(hd, 0.0);
    if (lo >= hi) return out_row;
    auto at = [&](const std::vector<float>& c, int t, int d) {
      const int b = tables[s * max_blocks + t / bs];
      return static_cast<double>(c[((static_cast<size_t>(b) * kvh + g) * bs + t % bs) * hd + d]);
    };
    std::vector<double> scores(hi - lo);
    double m = -INFINITY, sum = 0.0;
    for (int t = lo; t < hi; ++t) {
      double dot = 0.0;
      for (int d = 0; d < hd; ++d) dot += qr[d] * at(k, t, d);
      scores[t - lo] = dot * 0.125;
      m = std::max(m, scores[t - lo]);
    }
    for (int t = lo; t < hi; ++t) {
      const double w = std::exp(scores[t - lo] - m);
      sum += w;
      for (int d = 0; d < hd; ++d) out_row[d] += w * at(v, t, d);
    }
    for (auto& x : out_row) x /= sum;
    return out_row;
  }
};

// Runs each test once per CPU engine; engines this CPU lacks are skipped.
class CrossEngines : public pagedllm_test::CpuEngineTest {};

}  // namespace

TEST_P(CrossEngines, RangesMatchReferenceAndEmptyRowsAreZero) {
  // A decode row, then a prefill chunk whose rows share a tile with different ranges
  // (inside one block, across blocks and chunks, empty at 0 and at the end), then a sequence
  // with no cross tokens.
  CrossFixture f({7, 300, 0},
                 {{{0, 7}},
                  {{0, 300}, {0, 0}, {3, 4}, {5, 290}, {128, 256}, {299, 300}, {300, 300},
                   {0, 300}, {0, 1}},
                  {{0, 0}, {0, 0}}});
  f.run_and_check();
}

TEST_P(CrossEngines, SplitKOverLongRangesMatchesReference) {
  // One sequence, two KV heads, 8 pool threads: the key ranges are cut into partitions whose
  // partials are merged; rows whose range misses partitions (or all of them) included.
  struct PoolThreads {  // restored even when a check fails
    int before = pk::get_num_threads();
    ~PoolThreads() { pk::set_num_threads(before); }
  } restore;
  pk::set_num_threads(8);
  CrossFixture f({2000}, {{{0, 2000}, {0, 0}, {700, 701}, {1, 1999}, {1500, 2000}}});
  f.run_and_check();
}

INSTANTIATE_TEST_SUITE_P(AllEngines, CrossEngines, ::testing::Values("generic", "avx2", "avx512"));

namespace {

// Expects paged_cross_attention to throw an error of `kind` whose message contains `text`,
// with the output untouched.
void expect_rejected(CrossFixture& f, pagedllm::ErrorKind kind, const std::string& text) {
  std::fill(f.out.begin(), f.out.end(), 3.0f);
  try {
    pk::paged_cross_attention(f.params(), f.ranges.data());
    FAIL() << "expected an error containing '" << text << "'";
  } catch (const pagedllm::Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  for (float x : f.out) ASSERT_EQ(x, 3.0f);
}

}  // namespace

TEST(CrossValidation, BadRangesThrowBeforeWriting) {
  const std::vector<std::vector<std::pair<int, int>>> ok = {{{0, 5}, {1, 2}}, {{0, 9}}};
  {
    CrossFixture f({5, 9}, ok);
    f.ranges[3] = 6;  // token 1: (1, 6) past context_lens[0] = 5
    expect_rejected(f, pagedllm::ErrorKind::kOutOfRange, "kv_ranges[1] = (1, 6) is outside [0, 5]");
  }
  {
    CrossFixture f({5, 9}, ok);
    f.ranges[4] = -1;  // token 2: (-1, 9)
    expect_rejected(f, pagedllm::ErrorKind::kOutOfRange, "kv_ranges[2] = (-1, 9)");
  }
  {
    CrossFixture f({5, 9}, ok);
    f.ranges[0] = 4;
    f.ranges[1] = 2;  // token 0: lo > hi
    expect_rejected(f, pagedllm::ErrorKind::kInvalidArgument, "lo must be <= hi");
  }
  {
    CrossFixture f({5, 9}, ok);
    f.tables[f.max_blocks + 2] = f.num_blocks;  // a block sequence 1 uses: outside the pool
    expect_rejected(f, pagedllm::ErrorKind::kOutOfRange, "outside the pool");
  }
  {
    CrossFixture f({5, 9}, ok);
    f.cu[1] = 4;  // cu_seqlens_q {0, 4, 3}: decreasing
    expect_rejected(f, pagedllm::ErrorKind::kInvalidArgument, "non-decreasing");
  }
  {
    CrossFixture f({5, 9}, ok);
    pk::AttentionParams p = f.params();
    EXPECT_THROW(pk::paged_cross_attention(p, nullptr), pagedllm::Error);  // ranges missing
  }
}
