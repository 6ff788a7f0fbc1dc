// Every CPU attention engine against a double-precision reference, over the storage types and
// the shapes that select different code paths of the 8- and 16-lane engines: head_dim tails
// (not a multiple of 16 or 32), GQA groups 1..8 (register tiles of 1..8 rows), block sizes 1..256,
// context 0, partial last blocks, block-sparse lists per KV head (the heads in lockstep over
// ranges of different ends), prefill's causal rows and the prefill tile's edges. Built into
// the sanitizer run too. avx512_bf16 (bf16 dot products for bf16 / fp8 storage) is checked at
// its bf16 bound there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "pagedllm/build_info.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/kernels.h"

namespace pk = pagedllm::kernels;

namespace {

// One layer of paged K/V in storage type `ct`, sequences scattered over permuted blocks.
struct Cache {
  pk::CacheType ct;
  int kvh, heads, hd, bs, num_blocks = 0, max_blocks = 0;
  std::vector<int> lens;
  std::vector<uint8_t> k, v;    // [num_blocks, kvh, bs, hd] elements of ct
  std::vector<int32_t> tables;  // [num_seqs, max_blocks]
  std::vector<int32_t> ctx;     // [num_seqs] context lengths
  float k_scale, v_scale;

  Cache(pk::CacheType t, int kv_heads, int q_heads, int head_dim, int block, std::vector<int> l)
      : ct(t), kvh(kv_heads), heads(q_heads), hd(head_dim), bs(block), lens(std::move(l)),
        ctx(lens.begin(), lens.end()) {
    const bool fp8 = ct == pk::CacheType::kFp8E4M3 || ct == pk::CacheType::kFp8E5M2;
    k_scale = fp8 ? 0.5f : 1.0f;
    v_scale = fp8 ? 1.5f : 1.0f;
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    for (int len : lens) max_blocks = std::max(max_blocks, std::max(1, (len + bs - 1) / bs));
    num_blocks = static_cast<int>(lens.size()) * max_blocks;
    const size_t elems = static_cast<size_t>(num_blocks) * kvh * bs * hd;
    k.resize(elems * pk::element_size(ct));
    v.resize(k.size());
    for (size_t i = 0; i < elems; ++i) {
      pk::store_cache_scalar(k.data(), ct, static_cast<int64_t>(i), n01(rng));
      pk::store_cache_scalar(v.data(), ct, static_cast<int64_t>(i), n01(rng));
    }
    tables.resize(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
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
    p.cache.key_block_stride = p.cache.value_block_stride = static_cast<int64_t>(kvh) * bs * hd;
    p.cache.num_blocks = num_blocks;
    p.cache.num_kv_heads = kvh;
    p.cache.block_size = bs;
    p.cache.head_dim = hd;
    p.cache.dtype = ct;
    p.cache.k_scale = k_scale;
    p.cache.v_scale = v_scale;
    p.block_tables = tables.data();
    p.block_table_stride = max_blocks;
    p.max_blocks_per_seq = max_blocks;
    p.context_lens = ctx.data();
    p.num_seqs = static_cast<int>(lens.size());
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    return p;
  }

  // Element d of token t of KV head g of sequence s, as stored (times the fp8 scale).
  double at(const std::vector<uint8_t>& c, float scale, int s, int g, int t, int d) const {
    const int b = tables[s * max_blocks + t / bs];
    const int64_t i = ((static_cast<int64_t>(b) * kvh + g) * bs + t % bs) * hd + d;
    return static_cast<double>(pk::load_cache_scalar(c.data(), ct, i)) * scale;
  }

  // Double-precision attention of query row q (head h of sequence s) over keys [0, limit).
  std::vector<double> reference(const float* q, int s, int h, int limit) const {
    return reference_over(q, s, h, prefix(limit));
  }

  // The same over the key positions `keys` only (a block-sparse selection).
  std::vector<double> reference_over(const float* q, int s, int h,
                                     const std::vector<int>& keys) const {
    const int g = h / (heads / kvh);
    const int n = static_cast<int>(keys.size());
    std::vector<double> scores(n), out(hd, 0.0);
    double m = -INFINITY, sum = 0.0;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int i = 0; i < n; ++i) {
      double dot = 0.0;
      for (int d = 0; d < hd; ++d) dot += q[d] * at(k, k_scale, s, g, keys[i], d);
      scores[i] = dot * scale;
      m = std::max(m, scores[i]);
    }
    for (int i = 0; i < n; ++i) {
      const double w = std::exp(scores[i] - m);
      sum += w;
      for (int d = 0; d < hd; ++d) out[d] += w * at(v, v_scale, s, g, keys[i], d);
    }
    for (auto& x : out) x = sum > 0 ? x / sum : 0.0;
    return out;
  }

  static std::vector<int> prefix(int limit) {
    std::vector<int> keys(static_cast<size_t>(limit));
    std::iota(keys.begin(), keys.end(), 0);
    return keys;
  }

  // Per-element error bound of the avx512_bf16 engine (query and probabilities rounded to
  // bf16, u = 2^-8; derivation in tests/python/bf16_dot_reference.py): 1.25 x
  // sum_t w_t (E_t + E_bar + 2u) (|v_td| + |ref_d|), E_t = u * scale * sum_d |q_d k_td|.
  // exact_scores: the query is exact in bf16 and the scores are exact products summed in fp32
  // (E_t = 0): only the probabilities' rounding is left.
  std::vector<double> bf16_bound(const float* q, int s, int h, int limit,
                                 const std::vector<double>& ref, bool exact_scores = false) const {
    return bf16_bound_over(q, s, h, prefix(limit), ref, exact_scores);
  }

  // The same over the key positions `keys` only.
  std::vector<double> bf16_bound_over(const float* q, int s, int h, const std::vector<int>& keys,
                                      const std::vector<double>& ref,
                                      bool exact_scores = false) const {
    const int g = h / (heads / kvh);
    const int n = static_cast<int>(keys.size());
    const double u = 1.0 / 256.0, scale = 1.0 / std::sqrt(static_cast<double>(hd));
    std::vector<double> scores(n), err(n), bound(hd, 0.0);
    double m = -INFINITY, sum = 0.0, e_bar = 0.0;
    for (int i = 0; i < n; ++i) {
      double dot = 0.0, mag = 0.0;
      for (int d = 0; d < hd; ++d) {
        const double kd = at(k, k_scale, s, g, keys[i], d);
        dot += q[d] * kd;
        mag += std::abs(q[d] * kd);
      }
      scores[i] = dot * scale;
      err[i] = exact_scores ? 0.0 : u * scale * mag;
      m = std::max(m, scores[i]);
    }
    for (int i = 0; i < n; ++i) sum += std::exp(scores[i] - m);
    for (int i = 0; i < n; ++i) e_bar += std::exp(scores[i] - m) / sum * err[i];
    for (int i = 0; i < n; ++i) {
      const double c = std::exp(scores[i] - m) / sum * (err[i] + e_bar + 2 * u);
      for (int d = 0; d < hd; ++d)
        bound[d] += c * (std::abs(at(v, v_scale, s, g, keys[i], d)) + std::abs(ref[d]));
    }
    for (auto& b : bound) b *= 1.25;
    return bound;
  }
};

// Whether the engine under test is avx512_bf16 (set by the fixture): it rounds to bf16 for
// bf16 / fp8 storage, so those cases are checked against Cache::bf16_bound.
bool g_rounding_engine = false;

// |out - ref| <= 2e-5 * max(1, max|ref|) (float32 accumulation over a few hundred tokens),
// plus `extra` per element when given.
void expect_close(const float* out, const std::vector<double>& ref, const std::string& what,
                  const std::vector<double>* extra = nullptr) {
  double mx = 1.0;
  for (double r : ref) mx = std::max(mx, std::abs(r));
  for (size_t d = 0; d < ref.size(); ++d) {
    ASSERT_FALSE(std::isnan(out[d])) << what << " d=" << d;
    ASSERT_NEAR(out[d], ref[d], 2e-5 * mx + (extra ? (*extra)[d] : 0.0)) << what << " d=" << d;
  }
}

// expect_close for query row q (head h of sequence s, the key positions `keys`) of cache c, with
// the bf16 bound when the engine rounds for c's storage type.
void expect_row_over(const Cache& c, const float* out, const float* q, int s, int h,
                     const std::vector<int>& keys, const std::string& what) {
  const std::vector<double> ref = c.reference_over(q, s, h, keys);
  const bool rounds = g_rounding_engine && c.ct != pk::CacheType::kFloat32 &&
                      c.ct != pk::CacheType::kFloat16;
  if (!rounds) {
    expect_close(out, ref, what);
    return;
  }
  const std::vector<double> bound = c.bf16_bound_over(q, s, h, keys, ref);
  expect_close(out, ref, what, &bound);
}

// The same over keys [0, limit).
void expect_row(const Cache& c, const float* out, const float* q, int s, int h, int limit,
                const std::string& what) {
  expect_row_over(c, out, q, s, h, Cache::prefix(limit), what);
}

using Case = std::tuple<std::string, pk::CacheType>;  // engine, storage type

class EngineStorage : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const auto ok = pk::available_cpu_engines();
    if (std::find(ok.begin(), ok.end(), std::get<0>(GetParam())) == ok.end()) {
      GTEST_SKIP() << "engine " << std::get<0>(GetParam()) << " not available on this CPU";
    }
    pk::set_cpu_engine(std::get<0>(GetParam()));
    g_rounding_engine = std::get<0>(GetParam()) == "avx512_bf16";
  }
  void TearDown() override {
    pk::set_cpu_engine("auto");
    g_rounding_engine = false;
  }
  pk::CacheType ct() const { return std::get<1>(GetParam()); }
};

// Decode of every sequence of `c` (one query token each) against the reference.
void check_decode(Cache& c, const std::string& what) {
  const int n = static_cast<int>(c.lens.size());
  std::vector<float> q(static_cast<size_t>(n) * c.heads * c.hd), out(q.size(), NAN);
  std::mt19937 rng(3);
  std::normal_distribution<float> n01;
  for (auto& x : q) x = n01(rng);
  pk::paged_attention_decode(c.params(out.data(), q.data(), n));
  for (int s = 0; s < n; ++s)
    for (int h = 0; h < c.heads; ++h) {
      const size_t row = (static_cast<size_t>(s) * c.heads + h) * c.hd;
      expect_row(c, out.data() + row, q.data() + row, s, h, c.lens[s],
                 what + " seq " + std::to_string(s) + " head " + std::to_string(h));
    }
}

}  // namespace

TEST_P(EngineStorage, DecodeHeadDimTailsAndGroups) {
  for (int hd : {8, 16, 24, 32, 40, 128, 136, 264}) {
    for (auto [heads, kvh] : {std::pair{8, 1}, std::pair{6, 2}, std::pair{16, 2}, std::pair{2, 2}}) {
      Cache c(ct(), kvh, heads, hd, 16, {1, 15, 17, 40});
      check_decode(c, "hd " + std::to_string(hd) + " group " + std::to_string(heads / kvh));
    }
  }
}

TEST_P(EngineStorage, DecodeBlockSizesAndLongContext) {
  for (int bs : {1, 3, 64, 256}) {
    Cache c(ct(), 2, 8, 72, bs, {1, bs, bs + 1, 300});
    check_decode(c, "block " + std::to_string(bs));
  }
  Cache c(ct(), 1, 4, 64, 16, {1500});  // one sequence: split-K partitions, merged
  check_decode(c, "split-K");
  Cache lockstep(ct(), 4, 8, 64, 16, {1500});  // the same with KV heads in lockstep
  check_decode(lockstep, "split-K, 4 KV heads");
}

// Many sequences: the decode units are taken in runs of several per thread, and each unit's
// state starts fresh while its reads run on from the previous unit's (LockstepCall); lengths
// from 0 to a few chunks, in an order the longest-first sort permutes.
TEST_P(EngineStorage, DecodeManySequencesInRuns) {
  const int pattern[] = {17, 0, 130, 1, 64, 5, 200, 16, 33, 100};
  std::vector<int> lens;
  for (int i = 0; i < 70; ++i) lens.push_back(pattern[i % 10] + i / 10);
  for (auto [heads, kvh, hd] : {std::tuple{8, 2, 32}, std::tuple{16, 4, 64}, std::tuple{4, 1, 40}}) {
    Cache c(ct(), kvh, heads, hd, 16, lens);
    check_decode(c, "70 sequences, " + std::to_string(kvh) + " KV heads");
  }
}

TEST_P(EngineStorage, DecodeSparsePerHeadLists) {
  // Block-sparse decode with a list per (sequence, KV head) of different lengths: the heads run
  // in lockstep over ranges that end at different positions (and one head lists nothing). Two
  // sequences, 4 KV heads, a 1200-token context cut into partitions.
  const int kvh = 4, heads = 8, bs = 16;
  Cache c(ct(), kvh, heads, 64, bs, {1200, 45});
  std::vector<int32_t> indptr{0}, indices;
  std::vector<std::vector<int>> keys;  // per (sequence, KV head): the key positions listed
  for (int s = 0; s < 2; ++s) {
    const int blocks = (c.lens[s] + bs - 1) / bs;
    for (int g = 0; g < kvh; ++g) {
      std::vector<int> k;
      for (int b = 0; b < blocks; ++b) {
        const bool keep = g == 0 || (g == 1 && b % 2 == 0) || (g == 2 && b >= blocks - 3);
        if (!keep) continue;  // head 3 lists nothing
        indices.push_back(b);
        for (int t = b * bs; t < std::min((b + 1) * bs, c.lens[s]); ++t) k.push_back(t);
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
      keys.push_back(k);
    }
  }
  const int n = 2;
  std::vector<float> q(static_cast<size_t>(n) * heads * c.hd), out(q.size(), NAN);
  std::mt19937 rng(5);
  std::normal_distribution<float> n01;
  for (auto& x : q) x = n01(rng);
  pk::BlockSparseParams sp;
  sp.indptr = indptr.data();
  sp.num_lists = n * kvh;
  sp.indices = indices.data();
  sp.num_indices = static_cast<int32_t>(indices.size());
  pk::paged_attention_decode_sparse(c.params(out.data(), q.data(), n), sp);
  for (int s = 0; s < n; ++s) {
    for (int h = 0; h < heads; ++h) {
      const size_t row = (static_cast<size_t>(s) * heads + h) * c.hd;
      const std::string what = "seq " + std::to_string(s) + " head " + std::to_string(h);
      const std::vector<int>& k = keys[static_cast<size_t>(s * kvh + h / (heads / kvh))];
      if (k.empty()) {
        for (int d = 0; d < c.hd; ++d) ASSERT_EQ(out[row + d], 0.0f) << what << " d=" << d;
        continue;
      }
      expect_row_over(c, out.data() + row, q.data() + row, s, h, k, what);
    }
  }
}

TEST_P(EngineStorage, DecodeDotProductShapes) {
  // head_dim multiples of 32 (avx512_bf16's kernel: 64-element blocks, then a last 32), GQA
  // groups of 1, 3, 4 and 40 (more rows than it converts at once), blocks of 1..256 tokens.
  for (int hd : {64, 96, 256}) {
    for (auto [heads, kvh] : {std::pair{8, 8}, std::pair{12, 4}, std::pair{32, 8}, std::pair{40, 1}}) {
      for (int bs : {1, 16, 256}) {
        Cache c(ct(), kvh, heads, hd, bs, {1, 2, 17, 130});
        check_decode(c, "hd " + std::to_string(hd) + " group " + std::to_string(heads / kvh) +
                            " block " + std::to_string(bs));
      }
    }
  }
}

TEST_P(EngineStorage, ContextZeroGivesZeros) {
  Cache c(ct(), 2, 4, 40, 4, {5, 0});
  std::vector<float> q(static_cast<size_t>(2) * c.heads * c.hd, 0.5f), out(q.size(), NAN);
  pk::paged_attention_decode(c.params(out.data(), q.data(), 2));
  for (size_t i = static_cast<size_t>(c.heads) * c.hd; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f);
  for (int h = 0; h < c.heads; ++h)
    expect_row(c, out.data() + h * c.hd, q.data() + h * c.hd, 0, h, 5, "seq 0");
}

namespace {

// Prefill of the query tokens cu[s]..cu[s + 1] (the last of sequence s's context) against the
// reference; with `bf16_queries` the queries are bf16 values (the avx512 tile then takes the
// vdpbf16ps path on a bf16 cache where the CPU has AVX512_BF16).
void check_prefill(Cache& c, const std::vector<int32_t>& cu, bool bf16_queries,
                   const std::string& what) {
  const int tokens = cu.back();
  std::vector<float> q(static_cast<size_t>(tokens) * c.heads * c.hd), out(q.size(), NAN);
  std::mt19937 rng(4);
  std::normal_distribution<float> n01;
  for (auto& x : q) x = bf16_queries ? pk::bf16_to_float(pk::float_to_bf16(n01(rng))) : n01(rng);
  pk::AttentionParams p = c.params(out.data(), q.data(), tokens);
  p.cu_seqlens_q = cu.data();
  pk::paged_attention_prefill(p);
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int q_len = cu[s + 1] - cu[s];
    for (int i = 0; i < q_len; ++i)
      for (int h = 0; h < c.heads; ++h) {
        const size_t row = (static_cast<size_t>(cu[s] + i) * c.heads + h) * c.hd;
        expect_row(c, out.data() + row, q.data() + row, static_cast<int>(s), h,
                   c.lens[s] - q_len + i + 1,
                   what + " seq " + std::to_string(s) + " token " + std::to_string(i));
      }
  }
}

}  // namespace

TEST_P(EngineStorage, PrefillCausalRows) {
  Cache c(ct(), 2, 8, 136, 16, {9, 150});
  check_prefill(c, {0, 3, 3 + 70}, false, "");  // 3 new tokens of the first, 70 of the second
}

// The GEMM-shaped prefill tile's edges: GQA groups 1 and 8, block sizes 8 and 32, row counts
// that leave a partial row vector and a partial task, contexts ending inside a 64-token key
// tile, chunks starting after a context; fp32 and bf16-valued queries.
TEST_P(EngineStorage, PrefillTileEdges) {
  for (auto [heads, kvh] : {std::pair{4, 4}, std::pair{16, 2}}) {
    for (int bs : {8, 32}) {
      Cache c(ct(), kvh, heads, 64, bs, {33, 100, 9});
      for (bool bf16 : {false, true}) {
        check_prefill(c, {0, 33, 33 + 37, 33 + 37 + 9}, bf16,
                      "group " + std::to_string(heads / kvh) + " block " + std::to_string(bs) +
                          (bf16 ? " bf16 q" : ""));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllEnginesAllStorage, EngineStorage,
    ::testing::Combine(::testing::Values("generic", "avx2", "avx512", "avx512_bf16"),
                       ::testing::Values(pk::CacheType::kFloat32, pk::CacheType::kFloat16,
                                         pk::CacheType::kBFloat16, pk::CacheType::kFp8E4M3,
                                         pk::CacheType::kFp8E5M2)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return std::get<0>(info.param) + "_" + pk::cache_type_name(std::get<1>(info.param));
    });

namespace {

// n query values from N(0, 1) rounded to bf16: as stored (qb) and as float (qf).
void bf16_queries(size_t n, unsigned seed, std::vector<uint16_t>* qb, std::vector<float>* qf) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01;
  qb->resize(n);
  qf->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*qb)[i] = pk::float_to_bf16(n01(rng));
    (*qf)[i] = pk::bf16_to_float((*qb)[i]);
  }
}

}  // namespace

// "auto" decodes a bf16 query on an fp8 or bf16 cache with avx512_bf16's dot products where the
// CPU has them (the query is exact in bf16), bit for bit; a float32 query stays on the exact
// engine.
TEST(AutoEngine, Bf16QueryOnRoundedCachesUsesBf16DotProducts) {
  const auto ok = pk::available_cpu_engines();
  if (std::find(ok.begin(), ok.end(), "avx512_bf16") == ok.end()) {
    GTEST_SKIP() << "avx512_bf16 not available on this CPU: auto stays exact";
  }
  for (pk::CacheType ct : {pk::CacheType::kFp8E4M3, pk::CacheType::kBFloat16}) {
    Cache c(ct, 2, 8, 128, 16, {1, 40, 700});
    const int n = static_cast<int>(c.lens.size());
    const size_t elems = static_cast<size_t>(n) * c.heads * c.hd;
    std::vector<float> qf;
    std::vector<uint16_t> qb;
    bf16_queries(elems, 5, &qb, &qf);
    const auto run = [&](const char* engine, bool bf16) {
      pk::set_cpu_engine(engine);
      std::vector<uint16_t> ob(elems, 0x7FC0);
      std::vector<float> of(elems, NAN);
      pk::AttentionParams p = c.params(of.data(), qf.data(), n);
      if (bf16) {
        p.query = qb.data();
        p.out = ob.data();
        p.dtype = pk::ScalarType::kBFloat16;
      }
      pk::paged_attention_decode(p);
      pk::set_cpu_engine("auto");
      std::vector<float> r(elems);
      for (size_t i = 0; i < elems; ++i) r[i] = bf16 ? pk::bf16_to_float(ob[i]) : of[i];
      return r;
    };
    EXPECT_EQ(run("auto", true), run("avx512_bf16", true)) << pk::cache_type_name(ct);
    EXPECT_NE(run("auto", true), run("avx512", true)) << pk::cache_type_name(ct);
    EXPECT_EQ(run("auto", false), run("avx512", false)) << pk::cache_type_name(ct);
  }
}

// A bf16 model's prefill under "auto" on a bf16 or fp8 cache, where the CPU has AVX512_BF16:
// the avx512 tile rounds the probabilities to bf16 and multiplies them by V in vdpbf16ps (two
// tokens per multiply-add; AttendTask::bf16_probs). Checked at the bound with exact scores plus
// the output's rounding; head_dim 32, 48 and 64 (narrow and 4-vector value tiles); chunks that
// start at odd positions, so row vectors end on the first token of a pair, whose partner is
// then poisoned with NaN (GQA group 4: 4 tokens a row vector): no row that does not see it may
// read it. (A row vector's rows share its tokens, exact engine and pairs alike: with group 1 a
// NaN a later row sees reaches the earlier rows of its 16 too.) A named engine stays exact.
TEST(AutoEngine, Bf16ModelPrefillRoundsProbabilitiesInPairs) {
  for (pk::CacheType ct : {pk::CacheType::kBFloat16, pk::CacheType::kFp8E4M3}) {
    for (auto [heads, kvh, hd] : {std::tuple{8, 2, 32}, std::tuple{16, 4, 64},
                                  std::tuple{4, 4, 48}}) {
      // Sequence 0: 40 new tokens after 41 (odd offset); 1: a whole 70-token prompt; 2: 9 new
      // tokens after 24.
      Cache c(ct, kvh, heads, hd, 16, {81, 70, 33});
      const std::vector<int32_t> cu = {0, 40, 110, 119};
      // Token 49 of sequence 0: past every row of the tokens at positions 41..48.
      const int poisoned = heads / kvh == 4 ? 49 : 1 << 30;
      if (heads / kvh == 4) {
        const int b = c.tables[poisoned / c.bs];
        for (int g = 0; g < kvh; ++g)
          for (int d = 0; d < hd; ++d) {
            const int64_t row = (static_cast<int64_t>(b) * kvh + g) * c.bs + poisoned % c.bs;
            const int64_t i = row * hd + d;
            pk::store_cache_scalar(c.v.data(), ct, i, NAN);
          }
      }
      const int tokens = cu.back();
      const size_t elems = static_cast<size_t>(tokens) * heads * hd;
      std::vector<float> qf;
      std::vector<uint16_t> qb;
      bf16_queries(elems, 7, &qb, &qf);
      const auto run = [&](const char* engine) {
        pk::set_cpu_engine(engine);
        std::vector<uint16_t> ob(elems, 0x7FC0);
        std::vector<float> of(elems, NAN);
        pk::AttentionParams p = c.params(of.data(), qf.data(), tokens);
        p.query = qb.data();
        p.out = ob.data();
        p.dtype = pk::ScalarType::kBFloat16;
        p.cu_seqlens_q = cu.data();
        pk::paged_attention_prefill(p);
        pk::set_cpu_engine("auto");
        std::vector<float> r(elems);
        for (size_t i = 0; i < elems; ++i) r[i] = pk::bf16_to_float(ob[i]);
        return r;
      };
      const std::vector<float> out = run("auto");
      const std::string what = std::string(pk::cache_type_name(ct)) + " hd " + std::to_string(hd);
      for (size_t s = 0; s + 1 < cu.size(); ++s) {
        const int q_len = cu[s + 1] - cu[s];
        for (int i = 0; i < q_len; ++i) {
          const int limit = c.lens[s] - q_len + i + 1;
          for (int h = 0; h < heads; ++h) {
            const size_t row = (static_cast<size_t>(cu[s] + i) * heads + h) * hd;
            const std::string where = what + " seq " + std::to_string(s) + " token " +
                                      std::to_string(i) + " head " + std::to_string(h);
            if (s == 0 && limit > poisoned) {  // sees the NaN value: NaN out
              ASSERT_TRUE(std::isnan(out[row])) << where;
              continue;
            }
            const std::vector<double> ref = c.reference(qf.data() + row, static_cast<int>(s), h,
                                                        limit);
            std::vector<double> bound =
                c.bf16_bound(qf.data() + row, static_cast<int>(s), h, limit, ref, true);
            for (int d = 0; d < hd; ++d) bound[d] += std::abs(ref[d]) / 256.0;  // bf16 output
            expect_close(out.data() + row, ref, where, &bound);
          }
        }
      }
      const auto ok = pk::available_cpu_engines();
      if (std::find(ok.begin(), ok.end(), "avx512") != ok.end() &&
          pagedllm::cpu_features().avx512bf16) {
        EXPECT_NE(run("avx512"), out) << what << ": auto should round the probabilities";
      }
    }
  }
}
