// pagedllm/kernels/convert.h — exact scalar conversions between float32 and the storage types.
//
// float -> float16 / bfloat16 / fp8 round to nearest, ties to even. fp8 conversions saturate:
// a finite value beyond the format's largest finite value becomes that value (vLLM's
// "satfinite"), infinities too; NaN stays NaN. fp8 -> float is exact and table driven.
// These are inline scalar helpers for the portable code. Translation units compiled with
// ISA-specific flags (-mavx2 ...) must NOT include this header: an inline function compiled
// there could be chosen by the linker for the portable callers too (ODR), and run on a CPU
// that lacks the instructions. The guard below enforces that.
// Thread-safety: pure functions; the fp8 tables are immutable after static initialisation.
#pragma once

#ifdef PAGEDLLM_ISA_SPECIFIC_TU
#error "convert.h holds inline code: do not include it from an ISA-specific translation unit"
#endif

#include <cstdint>
#include <cstring>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::kernels {

// Bit casts between float and its IEEE-754 bits.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Decode tables: element i is the exact float value of the fp8 byte i (defined in convert.cpp).
extern const float (&kFp8E4M3ToFloat)[256];
extern const float (&kFp8E5M2ToFloat)[256];

// Exact value of an IEEE half.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-08f;
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (man << 13));  // inf / NaN
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Rounds the integer m right by `shift` bits (1..31), ties to even.
inline uint32_t round_shift_rne(uint32_t m, int shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Nearest IEEE half (ties to even); overflow gives infinity, as IEEE rounding does.
inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  if (u >= 0x7F800000u) return static_cast<uint16_t>(sign | (u > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (u >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: rounds to inf
  if (u < 0x38800000u) {                                                // below 2^-14: subnormal
    if (u < 0x33000000u) return static_cast<uint16_t>(sign);            // below 2^-25: zero
    const int exp = static_cast<int>(u >> 23);
    const uint32_t man = (u & 0x7FFFFFu) | 0x800000u;
    return static_cast<uint16_t>(sign | round_shift_rne(man, 126 - exp));
  }
  // Normal: rebias the exponent (127 -> 15) and round 23 mantissa bits to 10; a carry out of
  // the mantissa correctly bumps the exponent.
  const uint32_t h = round_shift_rne(u, 13) - (112u << 10);
  return static_cast<uint16_t>(sign | h);
}

// Value of a bfloat16.
inline float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Nearest bfloat16 (ties to even); NaN stays a quiet NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Nearest fp8 with `kMan` mantissa bits and exponent bias `kBias`, saturating at the largest
// finite value `max_bits` (the byte without sign); `nan_bits` is the format's NaN.
template <int kMan, int kBias>
inline uint8_t float_to_fp8(float f, uint32_t max_bits, uint32_t nan_bits, float max_value) {
  uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return static_cast<uint8_t>(sign | nan_bits);
  if (bits_float(u) >= max_value) return static_cast<uint8_t>(sign | max_bits);
  const int exp = static_cast<int>(u >> 23) - 127;  // unbiased exponent of the input
  const int min_exp = 1 - kBias;                    // exponent of the smallest normal
  uint32_t man = u & 0x7FFFFFu;
  if (u >= 0x00800000u) man |= 0x800000u;  // implicit bit (float subnormals are far below fp8's)
  // Bits dropped: 23 - kMan for a normal result, more for a subnormal one.
  const int shift = 23 - kMan + (exp < min_exp ? min_exp - exp : 0);
  if (shift > 31) return static_cast<uint8_t>(sign);  // far below the smallest subnormal
  const uint32_t q = round_shift_rne(man, shift);
  if (exp < min_exp) return static_cast<uint8_t>(sign | q);  // q == 1 << kMan is the min normal
  // q is in [2^kMan, 2^(kMan+1)]; 2^(kMan+1) carries into the exponent, which the sum handles.
  const uint32_t code = (static_cast<uint32_t>(exp + kBias) << kMan) + (q - (1u << kMan));
  return static_cast<uint8_t>(sign | code);
}

// fp8 e4m3fn: max 448 (0x7E), NaN 0x7F.
inline uint8_t float_to_fp8_e4m3(float f) { return float_to_fp8<3, 7>(f, 0x7Eu, 0x7Fu, 448.0f); }
// fp8 e5m2: max 57344 (0x7B), NaN 0x7F (quiet).
inline uint8_t float_to_fp8_e5m2(float f) { return float_to_fp8<2, 15>(f, 0x7Bu, 0x7Fu, 57344.0f); }

// Size in bytes of one element.
inline int element_size(ScalarType t) { return t == ScalarType::kFloat32 ? 4 : 2; }
inline int element_size(CacheType t) {
  switch (t) {
    case CacheType::kFloat32: return 4;
    case CacheType::kFloat16:
    case CacheType::kBFloat16: return 2;
    case CacheType::kFp8E4M3:
    case CacheType::kFp8E5M2: return 1;
  }
  return 1;
}

// Element `i` of an activation array, as float.
inline float load_scalar(const void* p, ScalarType t, int64_t i) {
  switch (t) {
    case ScalarType::kFloat32: return static_cast<const float*>(p)[i];
    case ScalarType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case ScalarType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

// Stores `v` as element `i` of an activation array, rounding to nearest even.
inline void store_scalar(void* p, ScalarType t, int64_t i, float v) {
  switch (t) {
    case ScalarType::kFloat32: static_cast<float*>(p)[i] = v; return;
    case ScalarType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(v); return;
    case ScalarType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); return;
  }
}

// Element `i` of a cache array, as float (fp8: the stored value, before the scale).
inline float load_cache_scalar(const void* p, CacheType t, int64_t i) {
  switch (t) {
    case CacheType::kFloat32: return static_cast<const float*>(p)[i];
    case CacheType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case CacheType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case CacheType::kFp8E4M3: return kFp8E4M3ToFloat[static_cast<const uint8_t*>(p)[i]];
    case CacheType::kFp8E5M2: return kFp8E5M2ToFloat[static_cast<const uint8_t*>(p)[i]];
  }
  return 0.0f;
}

// Stores `v` (already divided by the fp8 scale) as element `i` of a cache array.
inline void store_cache_scalar(void* p, CacheType t, int64_t i, float v) {
  switch (t) {
    case CacheType::kFloat32: static_cast<float*>(p)[i] = v; return;
    case CacheType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(v); return;
    case CacheType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); return;
    case CacheType::kFp8E4M3: static_cast<uint8_t*>(p)[i] = float_to_fp8_e4m3(v); return;
    case CacheType::kFp8E5M2: static_cast<uint8_t*>(p)[i] = float_to_fp8_e5m2(v); return;
  }
}

}  // namespace pagedllm::kernels
