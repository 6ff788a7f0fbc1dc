// pagedllm/kernels/dtypes.h — the element types the CPU kernels read and write.
//
// Activations (queries, outputs, new keys/values) are float32, float16 or bfloat16. A KV cache
// stores its elements in one of five storage types; fp8 caches hold raw bytes (uint8) with a
// per-tensor scale applied on write (x / scale) and removed on read (x * scale), as vLLM does.
// Accumulation is always float32.
// This header holds plain enums only (no inline code), so that translation units compiled for a
// specific instruction set can include it without ODR hazards.
// Thread-safety: no state.
#pragma once

#include <cstdint>

namespace pagedllm::kernels {

// Element type of activation tensors.
enum class ScalarType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
};

// Storage type of a KV cache.
enum class CacheType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFp8E4M3,  // OCP e4m3fn: bias 7, no infinities, max 448, NaN = 0x7F / 0xFF ("fp8", "fp8_e4m3")
  kFp8E5M2,  // OCP e5m2: bias 15, IEEE-like infinities and NaNs, max 57344 ("fp8_e5m2")
};

}  // namespace pagedllm::kernels
