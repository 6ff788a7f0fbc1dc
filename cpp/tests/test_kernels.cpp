// CPU kernels through their C++ params API (no Python): storage conversions, decode and prefill
// against a double-precision reference on scattered blocks (both engines), validation, and the
// thread pool. The exhaustive sweeps live in tests/python/test_kernels_*.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_engine_test.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pk = pagedllm::kernels;

TEST(KernelConvert, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(pk::float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(pk::float_to_half(1.0f + 1.0f / 2048), 0x3C00);        // tie -> even
  EXPECT_EQ(pk::float_to_half(1.0f + 3.0f / 2048), 0x3C02);        // tie -> even (up)
  EXPECT_EQ(pk::float_to_half(65520.0f), 0x7C00);                  // overflow -> inf
  EXPECT_EQ(pk::float_to_half(5.9604645e-08f), 0x0001);            // smallest subnormal
  EXPECT_EQ(pk::float_to_bf16(1.0f + 1.0f / 256), 0x3F80);         // tie -> even
  EXPECT_EQ(pk::float_to_fp8_e4m3(1000.0f), 0x7E);                 // saturates at 448
  EXPECT_EQ(pk::float_to_fp8_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(pk::float_to_fp8_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(pk::float_to_fp8_e5m2(1e6f), 0x7B);                    // saturates at 57344
  EXPECT_EQ(pk::float_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(pk::float_to_fp8_e4m3(-0.0f), 0x80);
}

TEST(KernelConvert, Fp8TablesRoundTrip) {
  for (int b = 0; b < 256; ++b) {
    const float e4 = pk::kFp8E4M3ToFloat[b];
    const float e5 = pk::kFp8E5M2ToFloat[b];
    if (!std::isnan(e4)) {
      EXPECT_EQ(pk::float_to_fp8_e4m3(e4), b) << b;
    }
    if (std::isfinite(e5)) {
      EXPECT_EQ(pk::float_to_fp8_e5m2(e5), b) << b;
    }
  }
  EXPECT_EQ(pk::kFp8E4M3ToFloat[0x7E], 448.0f);
  EXPECT_EQ(pk::kFp8E4M3ToFloat[0x01], std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(pk::kFp8E5M2ToFloat[0x7C]));
}

namespace {

// One layer of paged fp32 K/V with sequences scattered over permuted blocks.
struct Fixture {
  int kvh = 2, heads = 8, hd = 64, bs = 4, num_blocks = 0, max_blocks = 0;
  std::vector<int> lens;
  std::vector<float> k, v;       // [num_blocks, kvh, bs, hd]
  std::vector<int32_t> tables;   // [num_seqs, max_blocks]
  std::vector<int32_t> ctx;

  explicit Fixture(std::vector<int> l) : lens(std::move(l)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> n01;
    for (int len : lens) max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    num_blocks = static_cast<int>(lens.size()) * max_blocks;
    k.resize(static_cast<size_t>(num_blocks) * kvh * bs * hd);
    v.resize(k.size());
    for (auto& x : k) x = n01(rng);
    for (auto& x : v) x = n01(rng);
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables = perm;
    for (int len : lens) ctx.push_back(len);
  }

  pk::AttentionParams params(float* out, const float* q, int num_tokens) {
    pk::AttentionParams p;
    p.out = out;
    p.query = q;
    p.out_token_stride = p.query_token_stride = heads * hd;
    p.out_head_stride = p.query_head_stride = hd;
    p.num_tokens = num_tokens;
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
    p.num_seqs = static_cast<int>(lens.size());
    p.scale = 0.125f;
    return p;
  }

  // Double-precision attention of one query row of head h of sequence s over keys [0, limit).
  std::vector<double> reference(const float* q, int s, int h, int limit) const {
    const int g = h / (heads / kvh);
    std::vector<double> scores(limit), out(hd, 0.0);
    double m = -INFINITY, sum = 0.0;
    auto at = [&](const std::vector<float>& c, int t, int d) {
      const int b = tables[s * max_blocks + t / bs];
      return static_cast<double>(c[((static_cast<size_t>(b) * kvh + g) * bs + t % bs) * hd + d]);
    };
    for (int t = 0; t < limit; ++t) {
      double dot = 0.0;
      for (int d = 0; d < hd; ++d) dot += q[d] * at(k, t, d);
      scores[t] = dot * 0.125;
      m = std::max(m, scores[t]);
    }
    for (int t = 0; t < limit; ++t) {
      const double w = std::exp(scores[t] - m);
      sum += w;
      for (int d = 0; d < hd; ++d) out[d] += w * at(v, t, d);
    }
    for (auto& x : out) x /= sum;
    return out;
  }
};

// Runs each test once per CPU engine; engines this CPU lacks are skipped.
class KernelEngines : public pagedllm_test::CpuEngineTest {};

}  // namespace

TEST_P(KernelEngines, DecodeMatchesReference) {
  Fixture f({1, 4, 5, 700});  // one token, an exact block, one past it, a split-K length
  const int n = static_cast<int>(f.lens.size());
  std::vector<float> q(static_cast<size_t>(n) * f.heads * f.hd), out(q.size(), NAN);
  std::mt19937 rng(1);
  std::normal_distribution<float> n01;
  for (auto& x : q) x = n01(rng);
  pk::paged_attention_decode(f.params(out.data(), q.data(), n));
  for (int s = 0; s < n; ++s)
    for (int h = 0; h < f.heads; ++h) {
      const size_t row = (static_cast<size_t>(s) * f.heads + h) * f.hd;
      const auto ref = f.reference(q.data() + row, s, h, f.lens[s]);
      for (int d = 0; d < f.hd; ++d) ASSERT_NEAR(out[row + d], ref[d], 1e-5) << s << " " << h;
    }
}

TEST_P(KernelEngines, PrefillIsCausal) {
  Fixture f({9, 30});
  std::vector<int32_t> cu = {0, 3, 33};  // 3 new tokens of the first, all 30 of the second
  const int tokens = cu.back();
  std::vector<float> q(static_cast<size_t>(tokens) * f.heads * f.hd), out(q.size(), NAN);
  std::mt19937 rng(2);
  std::normal_distribution<float> n01;
  for (auto& x : q) x = n01(rng);
  pk::AttentionParams p = f.params(out.data(), q.data(), tokens);
  p.cu_seqlens_q = cu.data();
  pk::paged_attention_prefill(p);
  for (int s = 0; s < 2; ++s) {
    const int q_len = cu[s + 1] - cu[s];
    for (int i = 0; i < q_len; ++i)
      for (int h = 0; h < f.heads; ++h) {
        const size_t row = (static_cast<size_t>(cu[s] + i) * f.heads + h) * f.hd;
        const auto ref = f.reference(q.data() + row, s, h, f.lens[s] - q_len + i + 1);
        for (int d = 0; d < f.hd; ++d) ASSERT_NEAR(out[row + d], ref[d], 1e-5);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllEngines, KernelEngines,
                         ::testing::Values("generic", "avx2", "avx512"));

TEST(KernelEngineChoice, UnknownOrUnavailableEnginesThrowAndChangeNothing) {
  const std::string before = pk::active_cpu_kernel();
  EXPECT_THROW(pk::set_cpu_engine("sse9"), pagedllm::Error);
  const auto ok = pk::available_cpu_engines();
  ASSERT_FALSE(ok.empty());
  // the exact engines, best first, end with generic; only opt-in engines may follow it
  const auto generic = std::find(ok.begin(), ok.end(), "generic");
  ASSERT_NE(generic, ok.end());
  for (auto it = generic + 1; it != ok.end(); ++it) EXPECT_EQ(*it, "avx512_bf16");
  for (const char* name : {"avx2", "avx512", "avx512_bf16"}) {
    if (std::find(ok.begin(), ok.end(), name) == ok.end()) {
      EXPECT_THROW(pk::set_cpu_engine(name), pagedllm::Error) << name;
    }
  }
  EXPECT_EQ(pk::active_cpu_kernel(), before);
  pk::set_cpu_engine("auto");
  EXPECT_EQ(pk::active_cpu_kernel(), ok.front());
}

TEST(KernelValidation, BadBlockIdThrowsBeforeWriting) {
  Fixture f({5});
  f.tables[1] = f.num_blocks;  // second block of the only sequence: outside the pool
  std::vector<float> q(static_cast<size_t>(f.heads) * f.hd, 1.0f), out(q.size(), 3.0f);
  try {
    pk::paged_attention_decode(f.params(out.data(), q.data(), 1));
    FAIL() << "expected an error";
  } catch (const pagedllm::Error& e) {
    EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kOutOfRange);
  }
  for (float x : out) ASSERT_EQ(x, 3.0f);
}

// copy_blocks / swap_blocks copy whole blocks: a pool whose block stride is under a block's
// bytes has overlapping blocks (an overlapping memcpy) and is refused before any copy.
TEST(KernelValidation, BlockPoolsWithOverlappingBlocksAreRefused) {
  std::vector<float> data(16);
  std::iota(data.begin(), data.end(), 0.0f);
  const auto before = data;
  pk::BlockPoolParams pool;
  pool.data = data.data();
  pool.num_blocks = 8;
  pool.block_bytes = 4 * sizeof(float);
  pool.block_stride_bytes = sizeof(float);  // block i starts one float after block i - 1
  const int64_t pairs[2] = {0, 1};
  pk::CopyBlocksParams c;
  c.pools = &pool;
  c.num_pools = 1;
  c.pairs = pairs;
  c.num_pairs = 1;
  try {
    pk::copy_blocks(c);
    ADD_FAILURE() << "expected an error";
  } catch (const pagedllm::Error& e) {
    EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("caches: its 8 blocks overlap: the block stride is 4 "
                                         "bytes but a block holds 16 bytes"),
              std::string::npos)
        << e.what();
  }
  pk::SwapBlocksParams sw;
  sw.src = pool;
  sw.dst = pool;
  sw.dst.data = nullptr;
  std::vector<float> other(32);
  sw.dst.data = other.data();
  sw.dst.block_stride_bytes = sw.dst.block_bytes;
  sw.pairs = pairs;
  sw.num_pairs = 1;
  EXPECT_THROW(pk::swap_blocks(sw), pagedllm::Error);
  EXPECT_EQ(data, before);
  pool.block_stride_bytes = pool.block_bytes;  // 4 disjoint blocks of 4 floats
  pool.num_blocks = 4;
  pk::copy_blocks(c);
  EXPECT_EQ(std::vector<float>(data.begin() + 4, data.begin() + 8),
            std::vector<float>(before.begin(), before.begin() + 4));
}

// A context of 2^31 - 1 tokens: one block of 256 tokens, a table of 2^23 entries. Block counts
// derived from it are int64 (len + block_size - 1 overflowed int32: decode checked no table
// entry and read garbage through -1 ids; sparse calls refused valid lists or saw no token).
struct HugeContext {
  static constexpr int32_t kBs = 256, kHd = 8, kWidth = 1 << 23;
  std::vector<float> k = std::vector<float>(kBs * kHd, 1.0f), v = k, q = std::vector<float>(kHd, 1.0f);
  std::vector<float> out = std::vector<float>(kHd, 3.0f);
  std::vector<int32_t> table;
  int32_t len = INT32_MAX;
  int32_t cu[2] = {0, 1};

  explicit HugeContext(int32_t fill) : table(kWidth, fill) {}

  pk::AttentionParams params() {
    pk::AttentionParams p;
    p.out = out.data();
    p.query = q.data();
    p.out_token_stride = p.query_token_stride = p.out_head_stride = p.query_head_stride = kHd;
    p.num_tokens = 1;
    p.num_heads = 1;
    p.cache.key_cache = k.data();
    p.cache.value_cache = v.data();
    p.cache.key_block_stride = p.cache.value_block_stride = kBs * kHd;
    p.cache.num_blocks = 1;
    p.cache.num_kv_heads = 1;
    p.cache.block_size = kBs;
    p.cache.head_dim = kHd;
    p.block_tables = table.data();
    p.block_table_stride = p.max_blocks_per_seq = kWidth;
    p.context_lens = &len;
    p.num_seqs = 1;
    p.scale = 0.1f;
    return p;
  }
};

TEST(KernelValidation, ContextNearInt32MaxChecksItsBlocks) {
  HugeContext c(-1);  // every entry outside the pool
  for (const bool prefill : {false, true}) {
    pk::AttentionParams p = c.params();
    if (prefill) p.cu_seqlens_q = c.cu;
    try {
      prefill ? pk::paged_attention_prefill(p) : pk::paged_attention_decode(p);
      ADD_FAILURE() << "expected an error (prefill " << prefill << ")";
    } catch (const pagedllm::Error& e) {
      EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kOutOfRange);
      EXPECT_NE(std::string(e.what()).find("block_tables[0][0] = -1 is outside the pool [0, 1)"),
                std::string::npos)
          << e.what();
    }
    for (float x : c.out) ASSERT_EQ(x, 3.0f);
  }
}

TEST(KernelValidation, SparseListAtTheEndOfAnInt32MaxContext) {
  HugeContext c(0);  // every entry: block 0, all ones
  const int32_t indptr[2] = {0, 1};
  const int32_t last = HugeContext::kWidth - 1;  // holds tokens [2^31 - 256, 2^31 - 1): 255
  pk::BlockSparseParams sp;
  sp.indptr = indptr;
  sp.num_lists = 1;
  sp.indices = &last;
  sp.num_indices = 1;
  for (const bool prefill : {false, true}) {
    pk::AttentionParams p = c.params();
    if (prefill) p.cu_seqlens_q = c.cu;
    std::fill(c.out.begin(), c.out.end(), 3.0f);
    prefill ? pk::paged_attention_prefill_sparse(p, sp) : pk::paged_attention_decode_sparse(p, sp);
    for (float x : c.out) EXPECT_NEAR(x, 1.0f, 1e-6f) << "prefill " << prefill;  // mean of ones
  }
  // A listed block past the context's 2^23 blocks is still refused.
  const int32_t past = HugeContext::kWidth;
  sp.indices = &past;
  EXPECT_THROW(pk::paged_attention_decode_sparse(c.params(), sp), pagedllm::Error);
}

TEST(KernelThreadPool, EveryIndexOnceAndErrorsRethrown) {
  std::vector<std::atomic<int>> hits(1000);
  pk::parallel_for(1000, [&](int64_t i, int) { hits[i].fetch_add(1); });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  EXPECT_THROW(pk::parallel_for(50, [](int64_t i, int) {
                 if (i == 17) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  std::atomic<int> inner{0};
  pk::parallel_for(4, [&](int64_t, int) { pk::parallel_for(3, [&](int64_t, int) { ++inner; }); });
  EXPECT_EQ(inner.load(), 12);
  EXPECT_THROW(pk::set_num_threads(0), pagedllm::Error);
}

// The built-in pool's workers spin on the next job for a while, then sleep: calls back to back
// (spinning workers), after pauses longer than the spin (sleeping workers woken), and jobs whose
// last indices outlast the spin (the caller sleeps until the workers finish) all run every
// index once, with every worker taking part.
TEST(KernelThreadPool, SpinningAndSleepingWorkersRunEveryJob) {
  const int old_threads = pk::get_num_threads();
  const bool was_openmp = pk::parallel_runtime() != "builtin";
  pk::use_builtin_pool();
  pk::set_num_threads(3);
  std::vector<std::atomic<int>> hits(257);
  int64_t expected = 0;
  for (int round = 0; round < 60; ++round) {
    if (round % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // > spin
    const bool slow = round % 20 == 5;  // one index that outlasts the caller's spin
    pk::parallel_for(257, [&](int64_t i, int) {
      if (slow && i == 256) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      hits[static_cast<size_t>(i)].fetch_add(1);
    });
    ++expected;
    for (auto& h : hits) ASSERT_EQ(h.load(), expected) << "round " << round;
  }
  std::vector<std::atomic<int>> by_worker(3);
  for (int round = 0; round < 20; ++round) {
    pk::parallel_for(64, [&](int64_t, int w) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // every worker gets some
      by_worker[static_cast<size_t>(w)].fetch_add(1);
    });
  }
  for (auto& w : by_worker) EXPECT_GT(w.load(), 0);
  pk::set_num_threads(old_threads);
  if (was_openmp) pk::adopt_loaded_openmp();
}

// The built-in pool's caller waits only for the indices workers took: a worker that comes to a
// job late finds its indices gone and must never call that job's body, whose captures are gone
// once parallel_for returns (ASan sees a stale call as a use after scope). Many small jobs back
// to back, some with an index that sleeps, check every index runs once, in its own job.
TEST(KernelThreadPool, LateWorkersNeverRunAFinishedJob) {
  const int old_threads = pk::get_num_threads();
  const bool was_openmp = pk::parallel_runtime() != "builtin";
  pk::use_builtin_pool();
  pk::set_num_threads(3);
  std::atomic<int> stale{0};
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 2 + job % 3;
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<bool> open{true};
    pk::parallel_for(n, [&, job](int64_t i, int w) {
      if (!open.load()) stale.fetch_add(1);
      if (job % 997 == 0 && i == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
      ASSERT_GE(w, 0);
      ASSERT_LT(w, 3);
      hits[static_cast<size_t>(i)].fetch_add(1);
    });
    open.store(false);
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "job " << job;
  }
  EXPECT_EQ(stale.load(), 0);
  pk::set_num_threads(old_threads);
  if (was_openmp) pk::adopt_loaded_openmp();
}

TEST(KernelRMSNorm, MatchesDoubleReferenceInPlaceAndAcrossTasks) {
  // 300 rows x 1000 cols: several pool tasks, a tail after the 8-wide loop, out aliasing x.
  const int64_t rows = 300;
  const int32_t cols = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * cols), w(cols);
  for (float& v : x) v = 3 * normal(rng);
  for (float& v : w) v = normal(rng);
  std::vector<double> expected(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int32_t c = 0; c < cols; ++c) ss += double(x[r * cols + c]) * x[r * cols + c];
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
    for (int32_t c = 0; c < cols; ++c) expected[r * cols + c] = w[c] * x[r * cols + c] * inv;
  }
  pk::RMSNormParams p;
  p.x = x.data();
  p.out = x.data();
  p.weight = w.data();
  p.rows = rows;
  p.cols = cols;
  p.x_row_stride = p.out_row_stride = cols;
  p.eps = 1e-5f;
  pk::rms_norm(p);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(x[i], expected[i], 2e-6 * (1 + std::fabs(expected[i]))) << "at " << i;
  }
  p.eps = -1.0f;
  EXPECT_THROW(pk::rms_norm(p), pagedllm::Error);
  p.eps = 1e-5f;
  p.x_row_stride = cols - 1;
  EXPECT_THROW(pk::rms_norm(p), pagedllm::Error);
}
