// The fused element-wise kernels (fused_ops.h) on every CPU engine this machine runs, against
// double-precision references: residual add + RMSNorm and SiLU-and-mul in float32 and bfloat16,
// RoPE, the greedy argmax; sizes with vector tails and rows enough to split over the pool; the
// argument checks. Built into the sanitizer run too (the tails go through stack buffers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "test_data.h"

namespace pk = pagedllm::kernels;

namespace {

using pagedllm_test::randn;
using pagedllm_test::to_bf16;

class FusedOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto ok = pk::available_cpu_engines();
    if (std::find(ok.begin(), ok.end(), GetParam()) == ok.end()) {
      GTEST_SKIP() << "this CPU does not run the " << GetParam() << " engine";
    }
    pk::set_cpu_engine(GetParam());
    pk::set_num_threads(2);
  }
  void TearDown() override { pk::set_cpu_engine("auto"); }
};

TEST_P(FusedOps, AddRMSNormFloat32AndBFloat16) {
  for (int cols : {1, 13, 256, 1000}) {
    const int rows = cols == 256 ? 600 : 5;  // 600 x 256: more than one group of rows
    const auto x0 = randn(size_t(rows) * cols, cols, 2.0f), d = randn(x0.size(), cols + 1);
    const auto w = randn(cols, cols + 2);
    for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
      const bool bf = dt == pk::ScalarType::kBFloat16;
      std::vector<float> xf = x0, out(x0.size());
      std::vector<uint16_t> xb = to_bf16(x0), db = to_bf16(d), wb = to_bf16(w), ob(x0.size());
      pk::AddRMSNormParams p;
      p.dtype = dt;
      p.x = bf ? static_cast<void*>(xb.data()) : xf.data();
      p.delta = bf ? static_cast<const void*>(db.data()) : d.data();
      p.out = bf ? static_cast<void*>(ob.data()) : out.data();
      p.weight = bf ? static_cast<const void*>(wb.data()) : w.data();
      p.x_row_stride = p.delta_row_stride = p.out_row_stride = cols;
      p.rows = rows;
      p.cols = cols;
      p.eps = 1e-5f;
      pk::add_rms_norm(p);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        std::vector<double> s(cols);
        for (int c = 0; c < cols; ++c) {
          const size_t i = size_t(r) * cols + c;
          // the sum as the kernel must store it: one rounding to the element type
          const float sum = bf ? pk::bf16_to_float(pk::float_to_bf16(
                                     pk::bf16_to_float(pk::float_to_bf16(x0[i])) +
                                     pk::bf16_to_float(db[i])))
                               : x0[i] + d[i];
          ASSERT_EQ(bf ? pk::bf16_to_float(xb[i]) : xf[i], sum) << r << "," << c;
          s[c] = sum;
          ss += s[c] * s[c];
        }
        const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
        for (int c = 0; c < cols; ++c) {
          const size_t i = size_t(r) * cols + c;
          const double ref = (bf ? pk::bf16_to_float(wb[c]) : w[c]) * s[c] * inv;
          const double got = bf ? pk::bf16_to_float(ob[i]) : out[i];
          const double tol = bf ? 2.0 * std::ldexp(std::fabs(ref), -8) + 1e-6
                                : 4e-6 * std::fabs(ref) + 1e-6;
          ASSERT_NEAR(got, ref, tol) << "cols " << cols << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST_P(FusedOps, SiluAndMulFloat32AndBFloat16) {
  for (int f : {1, 7, 45, 688, 2816}) {
    const int rows = f == 688 ? 100 : 3;
    const auto x = randn(size_t(rows) * 2 * f, f, 4.0f);
    const auto xb = to_bf16(x);
    std::vector<float> out(size_t(rows) * f);
    std::vector<uint16_t> ob(out.size());
    for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
      const bool bf = dt == pk::ScalarType::kBFloat16;
      pk::SiluAndMulParams p;
      p.dtype = dt;
      p.x = bf ? static_cast<const void*>(xb.data()) : x.data();
      p.out = bf ? static_cast<void*>(ob.data()) : out.data();
      p.x_row_stride = 2 * f;
      p.out_row_stride = f;
      p.rows = rows;
      p.cols = f;
      pk::silu_and_mul(p);
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < f; ++c) {
          const size_t gi = size_t(r) * 2 * f + c;
          const double g = bf ? pk::bf16_to_float(xb[gi]) : x[gi];
          const double u = bf ? pk::bf16_to_float(xb[gi + f]) : x[gi + f];
          const double ref = g / (1.0 + std::exp(-g)) * u;
          const double got = bf ? pk::bf16_to_float(ob[size_t(r) * f + c]) : out[size_t(r) * f + c];
          // bf16: two roundings (silu, then the product)
          const double tol = bf ? 3.0 * std::ldexp(std::fabs(ref), -8) + 1e-30
                                : 1e-6 * std::fabs(ref) + 1e-30;
          ASSERT_NEAR(got, ref, tol) << "f " << f << " row " << r << " col " << c;
        }
      }
    }
  }
}

// In-place RoPE of x (token and head strides in floats) with cos / sin rows of d floats.
pk::RotaryParams rotary_params(std::vector<float>& x, int64_t token_stride, int64_t head_stride,
                               const std::vector<float>& cos, const std::vector<float>& sin,
                               int tokens, int heads, int d) {
  pk::RotaryParams p;
  p.x = x.data();
  p.x_token_stride = token_stride;
  p.x_head_stride = head_stride;
  p.cos = cos.data();
  p.sin = sin.data();
  p.cos_token_stride = p.sin_token_stride = d;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.head_dim = d;
  return p;
}

TEST_P(FusedOps, RotaryInPlaceOnStridedHeads) {
  for (int d : {8, 32, 40, 128, 136}) {
    const int tokens = 9, heads = 5, token_stride = (heads + 2) * d;  // heads of a qkv row
    auto x = randn(size_t(tokens) * token_stride, d);
    const auto x0 = x;
    const auto cos = randn(size_t(tokens) * d, d + 1), sin = randn(cos.size(), d + 2);
    pk::rotary_embedding(rotary_params(x, token_stride, d, cos, sin, tokens, heads, d));
    const int half = d / 2;
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < heads + 2; ++h) {
        for (int i = 0; i < d; ++i) {
          const size_t at = size_t(t) * token_stride + size_t(h) * d + i;
          if (h >= heads) {
            ASSERT_EQ(x[at], x0[at]);  // past num_heads: untouched
            continue;
          }
          const size_t pair = i < half ? at + half : at - half;
          // each product rounded, then the sum (exactly the float expression)
          const float ref = x0[at] * cos[size_t(t) * d + i] + x0[pair] * sin[size_t(t) * d + i];
          ASSERT_EQ(x[at], ref) << "d " << d << " t " << t << " h " << h << " i " << i;
        }
      }
    }
  }
}

// Heads before tokens in memory ([heads, tokens, head_dim] seen as [tokens, heads, head_dim]):
// the token stride is head_dim, smaller than a token's heads, and that is fine.
TEST_P(FusedOps, RotaryInPlaceOnHeadMajorLayout) {
  const int tokens = 3, heads = 2, d = 8, half = d / 2;
  auto x = randn(size_t(tokens) * heads * d, 5);
  const auto x0 = x;
  const auto cos = randn(size_t(tokens) * d, 6), sin = randn(cos.size(), 7);
  pk::rotary_embedding(rotary_params(x, d, int64_t{tokens} * d, cos, sin, tokens, heads, d));
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < d; ++i) {
        const size_t at = (size_t(h) * tokens + t) * d + i;
        const size_t pair = i < half ? at + half : at - half;
        const float ref = x0[at] * cos[size_t(t) * d + i] + x0[pair] * sin[size_t(t) * d + i];
        ASSERT_EQ(x[at], ref) << "t " << t << " h " << h << " i " << i;
      }
    }
  }
}

TEST_P(FusedOps, ArgmaxFirstMaximumAndNonFiniteRows) {
  const int rows = 70, cols = 4099;  // a tail; enough rows for the pool
  auto x = randn(size_t(rows) * cols, 3);
  x[size_t(5) * cols + 17] = x[size_t(5) * cols + 4000] = 50.0f;      // tie: first wins
  x[size_t(6) * cols + 4098] = 50.0f;                                  // in the tail
  x[size_t(7) * cols + 9] = std::numeric_limits<float>::quiet_NaN();
  x[size_t(8) * cols + 9] = std::numeric_limits<float>::infinity();
  for (int c = 0; c < cols; ++c) x[size_t(9) * cols + c] = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> index(rows, -1);
  std::vector<float> maxima(rows);
  pk::ArgmaxParams p;
  p.x = x.data();
  p.x_row_stride = cols;
  p.rows = rows;
  p.cols = cols;
  p.index = index.data();
  p.max_value = maxima.data();
  EXPECT_EQ(pk::argmax_rows(p), 3);  // the NaN, +inf and all -inf rows
  for (int r = 0; r < rows; ++r) {
    if (r == 7) {
      EXPECT_TRUE(std::isnan(maxima[r]));
      continue;
    }
    int64_t best = 0;
    for (int c = 1; c < cols; ++c) {
      if (x[size_t(r) * cols + c] > x[size_t(r) * cols + best]) best = c;
    }
    EXPECT_EQ(index[r], best) << "row " << r;
    EXPECT_EQ(maxima[r], x[size_t(r) * cols + best]);
  }
  EXPECT_EQ(index[5], 17);
  EXPECT_EQ(index[6], 4098);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, FusedOps, ::testing::Values("avx512", "avx2", "generic"),
                         [](const auto& info) { return info.param; });

TEST(TokenRows, EmbeddingAndRopeRowsOrTheRowsNeeded) {
  const int V = 11, H = 6, D = 4, R = 9;
  std::vector<float> emb(V * (H + 1)), cos_t(R * D), sin_t(R * D);
  for (size_t i = 0; i < emb.size(); ++i) emb[i] = float(i);
  for (int i = 0; i < R * D; ++i) {
    cos_t[i] = float(i) + 0.25f;
    sin_t[i] = -float(i);
  }
  const std::vector<int64_t> ids = {10, 0, 4, 4}, pos = {8, 0, 2, 2};
  const int n = static_cast<int>(ids.size());
  std::vector<float> x(n * H, 7.0f), cs(n * D, 7.0f), sn(n * D, 7.0f);
  pk::TokenRowsParams p;
  p.ids = ids.data();
  p.positions = pos.data();
  p.num_tokens = n;
  p.embedding = emb.data();
  p.embedding_row_stride = H + 1;  // a strided embedding: rows of H + 1
  p.vocab = V;
  p.hidden = H;
  p.cos_table = cos_t.data();
  p.sin_table = sin_t.data();
  p.table_rows = R;
  p.head_dim = D;
  p.x = x.data();
  p.cos = cs.data();
  p.sin = sn.data();
  EXPECT_EQ(pk::gather_token_rows(p), 0);
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < H; ++h) EXPECT_EQ(x[i * H + h], emb[ids[i] * (H + 1) + h]);
    for (int d = 0; d < D; ++d) {
      EXPECT_EQ(cs[i * D + d], cos_t[pos[i] * D + d]);
      EXPECT_EQ(sn[i * D + d], sin_t[pos[i] * D + d]);
    }
  }
  // a position past the tables: the rows it needs, nothing written
  std::fill(x.begin(), x.end(), 7.0f);
  std::fill(cs.begin(), cs.end(), 7.0f);
  const std::vector<int64_t> far = {1, 30, 2, 3};
  p.positions = far.data();
  EXPECT_EQ(pk::gather_token_rows(p), 31);
  EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return v == 7.0f; }));
  EXPECT_TRUE(std::all_of(cs.begin(), cs.end(), [](float v) { return v == 7.0f; }));
  // an id out of range or a negative position: kOutOfRange, nothing written
  const std::vector<int64_t> bad_id = {1, 11, 2, 3}, bad_pos = {1, -1, 2, 3};
  for (const auto& [i, q] : {std::pair{&bad_id, &pos}, std::pair{&ids, &bad_pos}}) {
    p.ids = i->data();
    p.positions = q->data();
    try {
      pk::gather_token_rows(p);
      ADD_FAILURE() << "bad input was accepted";
    } catch (const pagedllm::Error& e) {
      EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kOutOfRange);
    }
    EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return v == 7.0f; }));
  }
}

TEST(FusedOpsChecks, BadParamsThrowBeforeWriting) {
  std::vector<float> x(16, 1.0f), out(16, 7.0f), w(8, 1.0f);
  pk::AddRMSNormParams n;
  n.x = x.data();
  n.out = out.data();
  n.weight = w.data();
  n.x_row_stride = n.out_row_stride = 8;
  n.rows = 2;
  n.cols = 8;
  n.eps = -1.0f;
  EXPECT_THROW(pk::add_rms_norm(n), pagedllm::Error);
  n.eps = 1e-5f;
  n.dtype = pk::ScalarType::kFloat16;
  EXPECT_THROW(pk::add_rms_norm(n), pagedllm::Error);
  EXPECT_EQ(out, std::vector<float>(16, 7.0f));
  pk::SiluAndMulParams s;
  s.x = x.data();
  s.out = out.data();
  s.rows = 2;
  s.cols = 4;
  s.x_row_stride = 4;  // < 2 * cols
  s.out_row_stride = 4;
  EXPECT_THROW(pk::silu_and_mul(s), pagedllm::Error);
  pk::RotaryParams r;
  r.x = x.data();
  r.cos = r.sin = w.data();
  r.num_tokens = 1;
  r.num_heads = 2;
  r.head_dim = 7;
  EXPECT_THROW(pk::rotary_embedding(r), pagedllm::Error);
  // Overlapping heads, in either dim order, are refused.
  r.head_dim = 4;
  r.x_token_stride = 8;
  r.x_head_stride = 2;  // < head_dim
  r.cos_token_stride = r.sin_token_stride = 4;
  EXPECT_THROW(pk::rotary_embedding(r), pagedllm::Error);
  r.num_tokens = 2;
  r.x_token_stride = 4;
  r.x_head_stride = 4;  // token 1's head 0 is token 0's head 1
  EXPECT_THROW(pk::rotary_embedding(r), pagedllm::Error);
  r.x_head_stride = 6;  // head-major, but the 2 tokens (8 elements) do not fit under 6
  EXPECT_THROW(pk::rotary_embedding(r), pagedllm::Error);
  EXPECT_EQ(x, std::vector<float>(16, 1.0f));
  pk::ArgmaxParams a;
  a.rows = 1;
  a.cols = 0;
  EXPECT_THROW(pk::argmax_rows(a), pagedllm::Error);
}

}  // namespace
