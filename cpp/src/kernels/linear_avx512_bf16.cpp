// linear.h's bfloat16 tiles on AVX512_BF16: one vdpbf16ps per depth step (a K-pair) and
// accumulator, x's pair broadcast as one 32-bit element (linear_tiles_impl.h). Products are
// exact in float32, sums float32 (vdpbf16ps reads bf16 denormals as 0 and flushes float32
// denormal results, as oneDNN's bf16 kernels on the same instruction do); the output is rounded
// to bfloat16 once (vcvtneps2bf16, round to nearest even). Compiled with -mavx512bf16 plus the
// avx512 engine's flags and only called after the run-time CPU check (linear.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as engine_avx512.cpp
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "linear_impl.h"

namespace pagedllm::kernels {
namespace {

struct Traits {
  using Elem = uint16_t;
  using W = __m512i;
  static constexpr int kPair = 2;
  static W load_w(const uint16_t* p) { return _mm512_loadu_si512(p); }
  static __m512i broadcast(const uint16_t* x, int64_t d) {
    int32_t pair;
    std::memcpy(&pair, x + 2 * d, sizeof pair);
    return _mm512_set1_epi32(pair);
  }
  static __m512i broadcast_last(const uint16_t* x, int64_t d) {
    return _mm512_set1_epi32(static_cast<int32_t>(x[2 * d]));
  }
  static __m512 madd(__m512 acc, W w, __m512i xb) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(xb));
  }
  static __m512 load_bias(const uint16_t* b, __mmask16 m) {
    const __m256i bits = _mm256_maskz_loadu_epi16(m, b);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static void store(uint16_t* y, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(y, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
};

#include "linear_tiles_impl.h"

}  // namespace

void linear_block_avx512_bf16(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                              int panels) {
  block(p, row0, rows, panel0, panels);
}

}  // namespace pagedllm::kernels
