// cpu_engine_test.h — the gtest fixture base that runs a parameterized kernel test once per CPU
// engine name (test_kernels.cpp, test_kernel_cross.cpp): engines not compiled in or not
// supported by this CPU are skipped, and the choice goes back to "auto" after each test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "pagedllm/kernels/kernels.h"

namespace pagedllm_test {

// Selects the engine GetParam() names for the test (or skips it); restores "auto" after.
class CpuEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto ok = pagedllm::kernels::available_cpu_engines();
    if (std::find(ok.begin(), ok.end(), GetParam()) == ok.end()) {
      GTEST_SKIP() << "engine " << GetParam() << " not compiled in or not supported by this CPU";
    }
    pagedllm::kernels::set_cpu_engine(GetParam());
  }
  void TearDown() override { pagedllm::kernels::set_cpu_engine("auto"); }
};

}  // namespace pagedllm_test
