// fp8_bf16_avx512.h (internal) — fp8 e4m3 / e5m2 bytes to bf16 with AVX-512 BW + VBMI, exactly,
// for the avx512_bf16 engine (engine_avx512_bf16.cpp, the only file that includes this: it is
// compiled with those ISA flags). Internal linkage, no standard-library code (as engine_impl.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine.h"

namespace pagedllm::kernels::avx512_bf16_engine_ns {
namespace {

// ---- fp8 -> bf16, fused into the loads ---------------------------------------------------
//
// A byte sign-extended to 16 bits and shifted left (by 4 for e4m3, 5 for e5m2) holds the sign
// in bit 15 and the exponent and mantissa fields right-aligned under the bf16 ones; masking out
// the sign copies between them and adding 112 to the exponent rebiases it (e4m3 bias 7 -> 127
// gives value * 2^-8, the avx512 engine's e4m3 read factor; e5m2 bias 15 -> 127 is exact).
// Zero and the subnormals (exponent 0) and the NaN / inf bytes are not normal bf16 after that;
// their low 5 bits index a 32-entry table (vpermw) instead. Every finite fp8 value thereby
// becomes a normal bf16 (or zero), exactly.

// bf16 bits, by the byte's low 5 bits where the exponent field is 0 (m * 2^-17, m = 0..7) or
// the byte is the NaN 0x7f / 0xff (index 31).
alignas(64) constexpr uint16_t kE4M3Fixups[32] = {
    0x0000, 0x3700, 0x3780, 0x37C0, 0x3800, 0x3820, 0x3840, 0x3860, 0, 0, 0, 0, 0, 0, 0, 0,
    0,      0,      0,      0,      0,      0,      0,      0,      0, 0, 0, 0, 0, 0, 0, 0x7FC0};
// e5m2: exponent 0 (m * 2^-16, m = 0..3) at 0..3, inf at 28, NaN at 29..31.
alignas(64) constexpr uint16_t kE5M2Fixups[32] = {
    0x0000, 0x3780, 0x3800, 0x3840, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,      0,      0,
    0,      0,      0,      0,      0, 0, 0, 0, 0, 0, 0, 0, 0x7F80, 0x7FC0, 0x7FC0, 0x7FC0};

// 32 fp8 bytes as 32 bf16 (e4m3 times 2^-8).
template <CacheType CT>
inline __m512i fp8x32_to_bf16(const uint8_t* p) {
  constexpr bool e4 = CT == CacheType::kFp8E4M3;
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i t = _mm512_slli_epi16(w, e4 ? 4 : 5);
  const __m512i normal = _mm512_add_epi16(
      _mm512_and_si512(t, _mm512_set1_epi16(static_cast<short>(e4 ? 0x87FF : 0x8FFF))),
      _mm512_set1_epi16(0x3800));
  const __m512i expo = _mm512_set1_epi16(e4 ? 0x78 : 0x7C);      // the byte's exponent field
  const __m512i special = _mm512_set1_epi16(e4 ? 0x7F : 0x7C);   // NaN (e4m3) / inf-NaN (e5m2)
  const __mmask32 fix =
      _mm512_testn_epi16_mask(w, expo) |
      _mm512_cmpeq_epi16_mask(_mm512_and_si512(w, special), special);
  const __m512i table = _mm512_load_si512(e4 ? kE4M3Fixups : kE5M2Fixups);
  const __m512i v = _mm512_mask_permutexvar_epi16(normal, fix, w, table);
  return _mm512_ternarylogic_epi32(v, t, _mm512_set1_epi16(static_cast<short>(0x8000)),
                                   0xF8);  // v | (t & sign)
}

// bf16 bits of the fp8 byte b (its low 7 bits; the sign is added separately), e4m3 times 2^-8,
// by the same rules as fp8x32_to_bf16.
constexpr uint16_t fp8_bf16_bits(bool e4, int b) {
  if (e4) {
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 0) return kE4M3Fixups[m];
    if ((b & 0x7F) == 0x7F) return kE4M3Fixups[31];
    return static_cast<uint16_t>(((e + 112) << 7) | (m << 4));
  }
  const int e = (b >> 2) & 31, m = b & 3;
  if (e == 0) return kE5M2Fixups[m];
  if (e == 31) return kE5M2Fixups[28 + m];
  return static_cast<uint16_t>(((e + 112) << 7) | (m << 5));
}

// The high and low bytes of fp8_bf16_bits for the 128 byte values without sign: the tables of
// two vpermi2b lookups (AVX512_VBMI) that convert 64 bytes at once.
struct ByteTables {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
};
constexpr ByteTables make_byte_tables(bool e4) {
  ByteTables t{};
  for (int b = 0; b < 128; ++b) {
    t.hi[b] = static_cast<uint8_t>(fp8_bf16_bits(e4, b) >> 8);
    t.lo[b] = static_cast<uint8_t>(fp8_bf16_bits(e4, b) & 0xFF);
  }
  return t;
}
constexpr ByteTables kE4M3Bytes = make_byte_tables(true);
constexpr ByteTables kE5M2Bytes = make_byte_tables(false);

// 64 fp8 bytes as 64 bf16 in two vectors, by 128-bit lane L: *w0 holds elements 16 L + j and
// *w1 elements 16 L + 8 + j (j = 0..7; vpunpck{l,h}bw of the looked-up low and high bytes).
template <CacheType CT>
inline void fp8x64_to_bf16(const uint8_t* p, __m512i* w0, __m512i* w1) {
  const ByteTables& t = CT == CacheType::kFp8E4M3 ? kE4M3Bytes : kE5M2Bytes;
  const __m512i x = _mm512_loadu_si512(p);
  const __m512i hi = _mm512_ternarylogic_epi32(
      _mm512_permutex2var_epi8(_mm512_load_si512(t.hi), x, _mm512_load_si512(t.hi + 64)), x,
      _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // | the byte's sign
  const __m512i lo =
      _mm512_permutex2var_epi8(_mm512_load_si512(t.lo), x, _mm512_load_si512(t.lo + 64));
  *w0 = _mm512_unpacklo_epi8(lo, hi);
  *w1 = _mm512_unpackhi_epi8(lo, hi);
}

template <CacheType CT>
constexpr bool is_fp8() {
  return CT == CacheType::kFp8E4M3 || CT == CacheType::kFp8E5M2;
}

// 32 cache elements as bf16.
template <CacheType CT>
inline __m512i load_bf16x32(const uint8_t* p) {
  if constexpr (CT == CacheType::kBFloat16) {
    return _mm512_loadu_si512(p);
  } else {
    return fp8x32_to_bf16<CT>(p);
  }
}

}  // namespace
}  // namespace pagedllm::kernels::avx512_bf16_engine_ns
