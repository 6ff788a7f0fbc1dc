// The portable row loops of fused_ops.h: fused_rows_impl.h over 8-lane arrays (the compiler
// vectorises them for the baseline instruction set), exp and sqrt from the C library.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fused_rows.h"

namespace pagedllm::kernels {
namespace {

constexpr int kW = 8;
constexpr const char* kFusedRowsName = "generic";
struct V {
  float v[kW];
};

template <class F> inline V map(F f) {
  V r;
  for (int i = 0; i < kW; ++i) r.v[i] = f(i);
  return r;
}
inline V vzero() { return map([](int) { return 0.0f; }); }
inline V vset1(float f) { return map([f](int) { return f; }); }
inline V vadd(V a, V b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
inline V vsub(V a, V b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
inline V vmul(V a, V b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
inline V vdiv(V a, V b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
inline V vneg(V a) { return map([&](int i) { return -a.v[i]; }); }
inline V vfmadd(V a, V b, V c) { return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; }); }
inline V vexp(V a) { return map([&](int i) { return std::exp(a.v[i]); }); }
inline float vsum(V a) {
  return ((a.v[0] + a.v[4]) + (a.v[1] + a.v[5])) + ((a.v[2] + a.v[6]) + (a.v[3] + a.v[7]));
}
inline float scalar_sqrt(float f) { return std::sqrt(f); }

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// Round to nearest even; NaN becomes the quiet NaN 0x7FC0 (torch's c10::BFloat16).
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
inline V ld(const float* p) { return map([p](int i) { return p[i]; }); }
inline V ld(const uint16_t* p) { return map([p](int i) { return bf16_to_float(p[i]); }); }
inline void st(float* p, V v) {
  for (int i = 0; i < kW; ++i) p[i] = v.v[i];
}
inline void st(uint16_t* p, V v) {
  for (int i = 0; i < kW; ++i) p[i] = float_to_bf16(v.v[i]);
}
inline V vround_bf16(V v) { return map([&](int i) { return bf16_to_float(float_to_bf16(v.v[i])); }); }

inline int64_t argmax_row(const float* x, int64_t n, float* max_value) {
  float best = x[0];
  int64_t index = 0;
  bool nan = std::isnan(best);
  if (nan) best = -INFINITY;
  for (int64_t i = 1; i < n; ++i) {
    nan |= std::isnan(x[i]);
    if (x[i] > best) {
      best = x[i];
      index = i;
    }
  }
  *max_value = nan ? NAN : best;
  return index;
}

#include "fused_rows_impl.h"

}  // namespace

const FusedRowOps& generic_fused_rows() { return kFusedRows; }

}  // namespace pagedllm::kernels
