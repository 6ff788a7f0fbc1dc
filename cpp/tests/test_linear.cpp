// The packed linear layers (linear.h) on every CPU engine this machine runs, against
// double-precision references: float32 and bfloat16, row counts that make every register-tile
// height (1-6) and several parallel row blocks, out_features with a partial last panel and
// panel groups of 1-4, an odd in_features (bfloat16 pairs), bias, strided rows; the packed layout
// itself; the argument checks. Built into the sanitizer run too (the tails use masked loads).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cpu_engine_test.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/linear.h"
#include "pagedllm/kernels/thread_pool.h"
#include "test_data.h"

namespace pk = pagedllm::kernels;

namespace {

using pagedllm_test::randn;

// Rounds every element to bfloat16 and back, so both operands are exact in either type.
std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = pk::bf16_to_float(pk::float_to_bf16(x));
  return v;
}

// Packs w [N, K] and runs linear on x [R, K] (row stride xs) in dtype dt (bfloat16: the bits
// of the given values), into y [R, ys] preset to `fill`; returns y as floats.
std::vector<float> run_linear(pk::ScalarType dt, const std::vector<float>& x, int xs,
                              const std::vector<float>& w, const std::vector<float>* bias, int R,
                              int N, int K, int ys, float fill) {
  const bool bf = dt == pk::ScalarType::kBFloat16;
  const int64_t packed_n = pk::packed_linear_elements(dt, N, K);
  std::vector<float> pf(bf ? 0 : packed_n), yf(bf ? 0 : size_t(R) * ys, fill);
  std::vector<uint16_t> pb(bf ? packed_n : 0), yb(bf ? size_t(R) * ys : 0, pk::float_to_bf16(fill));
  const std::vector<uint16_t> xb = pagedllm_test::to_bf16(x), wb = pagedllm_test::to_bf16(w);
  const std::vector<uint16_t> bb = bias ? pagedllm_test::to_bf16(*bias) : std::vector<uint16_t>{};
  pk::PackLinearParams pp;
  pp.dtype = dt;
  pp.weight = bf ? static_cast<const void*>(wb.data()) : w.data();
  pp.weight_row_stride = K;
  pp.out_features = N;
  pp.in_features = K;
  pp.packed = bf ? static_cast<void*>(pb.data()) : pf.data();
  pk::pack_linear_weight(pp);
  pk::LinearParams p;
  p.dtype = dt;
  p.x = bf ? static_cast<const void*>(xb.data()) : x.data();
  p.x_row_stride = xs;
  p.rows = R;
  p.in_features = K;
  p.out_features = N;
  p.packed = pp.packed;
  if (bias) p.bias = bf ? static_cast<const void*>(bb.data()) : bias->data();
  p.y = bf ? static_cast<void*>(yb.data()) : yf.data();
  p.y_row_stride = ys;
  pk::linear(p);
  if (!bf) return yf;
  std::vector<float> y(yb.size());
  for (size_t i = 0; i < yb.size(); ++i) y[i] = pk::bf16_to_float(yb[i]);
  return y;
}

struct Case {
  int rows, out_features, in_features;
  bool bias;
};

class Linear : public pagedllm_test::CpuEngineTest {
 protected:
  void SetUp() override {
    CpuEngineTest::SetUp();
    pk::set_num_threads(2);
  }
};

// y = x W^T + b against the float64 sum, within the float32 sums' bound (K u sum |x w| with
// u = 2^-24) plus, in bfloat16, half an ulp of the rounded output.
void check(pk::ScalarType dt, const Case& c) {
  const bool bf = dt == pk::ScalarType::kBFloat16;
  const int R = c.rows, N = c.out_features, K = c.in_features;
  const int xs = K + 3, ys = N + 5;  // strided rows
  std::vector<float> x = randn(size_t(R) * xs, R * 7 + K), w = randn(size_t(N) * K, N + K, 0.1f);
  std::vector<float> b = randn(N, N * 3);
  if (bf) {
    x = bf16_values(x);
    w = bf16_values(w);
    b = bf16_values(b);
  }
  const std::vector<float> y = run_linear(dt, x, xs, w, c.bias ? &b : nullptr, R, N, K, ys, -7.0f);
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < N; ++n) {
      double ref = c.bias ? b[n] : 0.0, mag = std::fabs(ref);
      for (int k = 0; k < K; ++k) {
        ref += double(x[size_t(r) * xs + k]) * w[size_t(n) * K + k];
        mag += std::fabs(double(x[size_t(r) * xs + k]) * w[size_t(n) * K + k]);
      }
      const double got = y[size_t(r) * ys + n];
      const double sums = (K + 2) * std::ldexp(1.0, -24) * mag;
      const double out = bf ? std::ldexp(1.0, -8) * (std::fabs(ref) + sums) : 0.0;
      ASSERT_LE(std::fabs(got - ref), sums + out + 1e-30)
          << (bf ? "bf16" : "fp32") << " row " << r << " col " << n << " of [" << R << ", " << N
          << ", " << K << "] (kernel " << pk::linear_kernel(dt) << ")";
    }
    for (int n = N; n < ys; ++n) {  // the row stride's padding is untouched
      ASSERT_EQ(y[size_t(r) * ys + n], -7.0f);
    }
  }
}

TEST_P(Linear, MatchesFloat64AtEveryTileShape) {
  const Case cases[] = {
      {1, 1, 1, false},    {1, 16, 32, true},   {2, 17, 31, false}, {3, 33, 64, true},
      {4, 64, 5, false},   {5, 80, 100, true},  {6, 100, 48, false}, {7, 129, 33, true},
      {16, 256, 96, false}, {47, 70, 64, true}, {49, 48, 40, false}, {130, 300, 24, true},
      // long K: odd K in bfloat16 (1025: 513 pairs), K 8192 (an item's panels exceed L2)
      {7, 40, 600, true},  {16, 70, 513, false}, {100, 33, 1031, true}, {13, 20, 1025, false},
      {12, 17, 8192, false},
      // 7-8 rows at K >= 1024: the tall tile (one tile of all rows per 2 panels; 3 and 5
      // panels leave one alone), also as the last 8-row block after a 96-row one
      {7, 40, 1030, true}, {8, 70, 1025, false}, {8, 16, 2048, true}, {104, 35, 1024, false},
  };
  for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
    for (const Case& c : cases) check(dt, c);
  }
}

// A row's sums run in k order whatever tile it lands in: a row of a 16-row call (tiles of 6, 5
// and 5 rows) or of an 8-row one (the tall tile) is bit-identical to the same row alone.
TEST_P(Linear, ARowIsTheSameInAnyTile) {
  const int N = 36;
  for (const auto& [R, K] : {std::pair{16, 777}, std::pair{8, 1100}}) {
    for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
      const std::vector<float> x = bf16_values(randn(size_t(R) * K, 5)),
                               w = bf16_values(randn(size_t(N) * K, 6, 0.1f));
      const std::vector<float> all = run_linear(dt, x, K, w, nullptr, R, N, K, N, 0.0f);
      for (int r = 0; r < R; r += 5) {
        const std::vector<float> row(x.begin() + size_t(r) * K, x.begin() + size_t(r + 1) * K);
        const std::vector<float> one = run_linear(dt, row, K, w, nullptr, 1, N, K, N, 0.0f);
        for (int n = 0; n < N; ++n) {
          ASSERT_EQ(one[n], all[size_t(r) * N + n]) << R << " rows, row " << r << " col " << n;
        }
      }
    }
  }
}

TEST_P(Linear, ZeroRowsWritesNothing) {
  for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
    pk::LinearParams p;
    p.dtype = dt;
    p.rows = 0;
    p.in_features = 8;
    p.out_features = 8;
    EXPECT_NO_THROW(pk::linear(p));  // null pointers are fine with nothing to do
  }
}

TEST_P(Linear, SpecialValuesPropagate) {
  // An inf or NaN in x reaches exactly the outputs of its row, as in a plain matrix product.
  for (pk::ScalarType dt : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
    const int R = 3, N = 20, K = 10;
    std::vector<float> x = bf16_values(randn(R * K, 5)), w = bf16_values(randn(N * K, 6, 0.1f));
    x[0 * K + 3] = INFINITY;
    x[1 * K + 4] = NAN;
    for (int n = 0; n < N; ++n) w[n * K + 3] = std::fabs(w[n * K + 3]) + 0.5f;  // inf * (> 0)
    const std::vector<float> y = run_linear(dt, x, K, w, nullptr, R, N, K, N, 0.0f);
    for (int n = 0; n < N; ++n) {
      EXPECT_EQ(y[0 * N + n], INFINITY) << n;
      EXPECT_TRUE(std::isnan(y[1 * N + n])) << n;
      EXPECT_TRUE(std::isfinite(y[2 * N + n])) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, Linear, ::testing::Values("generic", "avx2", "avx512", "avx512_bf16"),
                         [](const auto& info) { return info.param; });

TEST(LinearLayout, PanelsOf16ColumnsAndKPairs) {
  // float32: [panels][K][16]; bfloat16: [panels][ceil(K / 2)][16][2], zero-padded.
  const int N = 20, K = 3;
  std::vector<float> w(N * K);
  for (int i = 0; i < N * K; ++i) w[i] = float(i + 1);
  ASSERT_EQ(pk::packed_linear_elements(pk::ScalarType::kFloat32, N, K), 2 * K * 16);
  ASSERT_EQ(pk::packed_linear_elements(pk::ScalarType::kBFloat16, N, K), 2 * 2 * 16 * 2);
  std::vector<float> pf(2 * K * 16, -1.0f);
  pk::PackLinearParams pp;
  pp.dtype = pk::ScalarType::kFloat32;
  pp.weight = w.data();
  pp.weight_row_stride = K;
  pp.out_features = N;
  pp.in_features = K;
  pp.packed = pf.data();
  pk::pack_linear_weight(pp);
  for (int panel = 0; panel < 2; ++panel)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < 16; ++c) {
        const int n = panel * 16 + c;
        EXPECT_EQ(pf[(panel * K + k) * 16 + c], n < N ? w[n * K + k] : 0.0f);
      }
  const std::vector<uint16_t> wb = pagedllm_test::to_bf16(w);
  std::vector<uint16_t> pb(2 * 2 * 16 * 2, 0xFFFF);
  pp.dtype = pk::ScalarType::kBFloat16;
  pp.weight = wb.data();
  pp.packed = pb.data();
  pk::pack_linear_weight(pp);
  for (int panel = 0; panel < 2; ++panel)
    for (int kp = 0; kp < 2; ++kp)
      for (int c = 0; c < 16; ++c)
        for (int j = 0; j < 2; ++j) {
          const int n = panel * 16 + c, k = 2 * kp + j;
          EXPECT_EQ(pb[((panel * 2 + kp) * 16 + c) * 2 + j], n < N && k < K ? wb[n * K + k] : 0);
        }
}

TEST(LinearLayout, PackedRowsReadTheWeightBack) {
  // float32 and bfloat16 (odd K: the last pair padded), rows in any order, repeated; an id out
  // of range throws kOutOfRange before anything is written.
  const int N = 37, K = 5;
  std::vector<float> w(N * K);
  for (int i = 0; i < N * K; ++i) w[i] = float(i) * 0.5f - 3.0f;
  const std::vector<uint16_t> wb = pagedllm_test::to_bf16(w);
  const std::vector<int64_t> ids = {36, 0, 17, 17, 16, 15};
  for (const auto dtype : {pk::ScalarType::kFloat32, pk::ScalarType::kBFloat16}) {
    const bool f32 = dtype == pk::ScalarType::kFloat32;
    const int64_t es = f32 ? 4 : 2;
    std::vector<char> packed(pk::packed_linear_elements(dtype, N, K) * es);
    pk::PackLinearParams pp;
    pp.dtype = dtype;
    pp.weight = f32 ? static_cast<const void*>(w.data()) : wb.data();
    pp.weight_row_stride = K;
    pp.out_features = N;
    pp.in_features = K;
    pp.packed = packed.data();
    pk::pack_linear_weight(pp);
    std::vector<char> out(ids.size() * (K + 2) * es, 0x5A);
    pk::PackedRowsParams p;
    p.dtype = dtype;
    p.packed = packed.data();
    p.out_features = N;
    p.in_features = K;
    p.ids = ids.data();
    p.rows = static_cast<int64_t>(ids.size());
    p.out = out.data();
    p.out_row_stride = K + 2;  // a wider output: the two extra columns stay untouched
    pk::packed_linear_rows(p);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int k = 0; k < K + 2; ++k) {
        const char* got = out.data() + (i * (K + 2) + k) * es;
        if (k >= K) {
          EXPECT_EQ(got[0], 0x5A);
        } else if (f32) {
          EXPECT_EQ(*reinterpret_cast<const float*>(got), w[ids[i] * K + k]);
        } else {
          EXPECT_EQ(*reinterpret_cast<const uint16_t*>(got), wb[ids[i] * K + k]);
        }
      }
    }
    const std::vector<char> before = out;
    const std::vector<int64_t> bad = {3, N};
    p.ids = bad.data();
    p.rows = 2;
    try {
      pk::packed_linear_rows(p);
      ADD_FAILURE() << "an id out of range was accepted";
    } catch (const pagedllm::Error& e) {
      EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kOutOfRange);
    }
    EXPECT_EQ(out, before);
  }
}

TEST(LinearArgs, BadParamsThrowBeforeWriting) {
  std::vector<float> x(4 * 8), packed(pk::packed_linear_elements(pk::ScalarType::kFloat32, 8, 8)),
      y(4 * 8, 3.0f);
  pk::LinearParams p;
  p.dtype = pk::ScalarType::kFloat32;
  p.x = x.data();
  p.x_row_stride = 8;
  p.rows = 4;
  p.in_features = 8;
  p.out_features = 8;
  p.packed = packed.data();
  p.y = y.data();
  p.y_row_stride = 8;
  auto bad = p;
  bad.dtype = pk::ScalarType::kFloat16;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  bad = p;
  bad.in_features = 0;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  bad = p;
  bad.x_row_stride = 7;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  bad = p;
  bad.y_row_stride = 7;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  bad = p;
  bad.packed = nullptr;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  bad = p;
  bad.rows = -1;
  EXPECT_THROW(pk::linear(bad), pagedllm::Error);
  for (float v : y) ASSERT_EQ(v, 3.0f);
  // y sharing memory with an input it is computed from: packed, x, bias.
  std::vector<float> packed_copy = packed;
  const auto message = [](const pk::LinearParams& q) {
    try {
      pk::linear(q);
    } catch (const pagedllm::Error& e) {
      EXPECT_EQ(e.kind(), pagedllm::ErrorKind::kInvalidArgument);
      return std::string(e.what());
    }
    ADD_FAILURE() << "expected an error";
    return std::string();
  };
  bad = p;
  bad.y = packed.data() + 4;  // inside the packed weight
  EXPECT_NE(message(bad).find("linear: y (128 bytes at 0x"), std::string::npos) << message(bad);
  EXPECT_NE(message(bad).find(") overlaps packed ("), std::string::npos);
  EXPECT_EQ(packed, packed_copy);
  bad = p;
  bad.y = x.data() + 31;  // its first element is x's last
  EXPECT_NE(message(bad).find("overlaps x"), std::string::npos);
  bad = p;
  std::vector<float> bias(8, 0.0f);
  bad.bias = bias.data();
  bad.y = bias.data();
  bad.rows = 1;
  EXPECT_NE(message(bad).find("overlaps bias"), std::string::npos);
  for (float v : x) ASSERT_EQ(v, 0.0f);
  for (float v : bias) ASSERT_EQ(v, 0.0f);
  bad = p;
  std::vector<float> xy(64, 0.0f);  // y right after x: adjacent, disjoint, allowed
  bad.x = xy.data();
  bad.y = xy.data() + 32;
  EXPECT_NO_THROW(pk::linear(bad));
  EXPECT_THROW(pk::packed_linear_elements(pk::ScalarType::kFloat32, 0, 8), pagedllm::Error);
  EXPECT_THROW(pk::packed_linear_elements(pk::ScalarType::kFloat16, 8, 8), pagedllm::Error);
  pk::PackLinearParams pp;
  pp.weight = x.data();
  pp.weight_row_stride = 4;  // < in_features
  pp.out_features = 4;
  pp.in_features = 8;
  pp.packed = packed.data();
  EXPECT_THROW(pk::pack_linear_weight(pp), pagedllm::Error);
}

}  // namespace
