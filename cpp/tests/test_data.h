// test_data.h — random test inputs shared by the kernel tests (test_fused_ops.cpp,
// test_linear.cpp): normal floats from a fixed seed and their bfloat16 bits.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "pagedllm/kernels/convert.h"

namespace pagedllm_test {

// n floats drawn from N(0, scale^2) with generator seed `seed`.
inline std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The bfloat16 bits of each element (round to nearest even).
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = pagedllm::kernels::float_to_bf16(v[i]);
  return b;
}

}  // namespace pagedllm_test
