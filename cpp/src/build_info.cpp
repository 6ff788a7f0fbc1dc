#include "pagedllm/build_info.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace pagedllm {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0: which register states the OS saves on a context switch (0 when XGETBV is unavailable).
uint64_t os_saved_states(bool osxsave) {
  if (!osxsave) return 0;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

// Reads the features from CPUID, each gated on the OS saving the registers it needs (XGETBV):
// ymm state (XCR0 bits 1-2) for AVX2/FMA/F16C, plus opmask and zmm state (bits 5-7) for
// AVX-512, and the tile state (bits 17-18) for AMX.
CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const uint64_t xcr0 = os_saved_states((c >> 27) & 1u);
  const bool ymm = (xcr0 & 0x6) == 0x6;
  const bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;
  f.fma = ymm && ((c >> 12) & 1u);
  f.f16c = ymm && ((c >> 29) & 1u);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = ymm && ((b >> 5) & 1u);
  f.avx512f = zmm && ((b >> 16) & 1u);
  f.avx512dq = zmm && ((b >> 17) & 1u);
  f.avx512bw = zmm && ((b >> 30) & 1u);
  f.avx512vl = zmm && ((b >> 31) & 1u);
  f.avx512vbmi = zmm && ((c >> 1) & 1u);
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA state
  f.amx_bf16 = tiles && ((d >> 22) & 1u) && ((d >> 24) & 1u);
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512bf16 = zmm && ((a >> 5) & 1u);
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
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
#ifdef PAGEDLLM_HAVE_AVX512_BF16_KERNELS
  v.emplace_back("avx512_bf16");
#endif
  return v;
}

}  // namespace pagedllm
