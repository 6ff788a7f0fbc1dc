// pagedllm/build_info.h — what this build of the core contains and what the CPU offers.
// Thread-safety: all functions are safe from any thread (results computed once).
#pragma once

#include <string>
#include <vector>

namespace pagedllm {

// Instruction-set features of the running CPU that the kernels can use.
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  bool avx512vbmi = false;
  bool amx_bf16 = false;  // AMX tiles with bf16 (oneDNN's bf16 GEMMs use them: linear.h)
};

// Features of the CPU this process runs on, each only if the OS also saves the registers it
// uses (CPUID + XGETBV, detected once, at first call).
const CpuFeatures& cpu_features();

// The library version, e.g. "0.1.0".
std::string version();

// Names of the CPU kernel variants compiled into this build, e.g. {"generic", "avx2"}.
std::vector<std::string> compiled_cpu_kernels();

// Block store backends compiled into this build: {"file"} or {"file", "rocksdb"}.
std::vector<std::string> compiled_block_store_backends();

}  // namespace pagedllm
