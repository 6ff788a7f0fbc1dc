#include "pagedllm/build_info.h"

namespace pagedllm {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = __builtin_cpu_supports("f16c");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
    return f;
  }();
  return features;
}

std::string version() { return PAGEDLLM_VERSION; }

std::vector<std::string> compiled_cpu_kernels() {
  std::vector<std::string> v{"generic"};
#ifdef PAGEDLLM_HAVE_AVX2_KERNELS
  v.emplace_back("avx2");
#endif
#ifdef PAGEDLLM_HAVE_AVX512_KERNELS
  v.emplace_back("avx512");
#endif
  return v;
}

}  // namespace pagedllm
