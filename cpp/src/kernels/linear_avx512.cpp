// linear.h's float32 tiles on AVX-512F: one FMA of a broadcast x element and a 16-column weight
// vector per depth step and accumulator (linear_tiles_impl.h). Compiled with the avx512 engine's
// flags and only called after its run-time CPU check (linear.cpp follows the engine choice).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as engine_avx512.cpp
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "linear_impl.h"

namespace pagedllm::kernels {
namespace {

struct Traits {
  using Elem = float;
  using W = __m512;
  static constexpr int kPair = 1;
  static W load_w(const float* p) { return _mm512_loadu_ps(p); }
  static __m512i broadcast(const float* x, int64_t d) {
    return _mm512_castps_si512(_mm512_set1_ps(x[d]));
  }
  static __m512i broadcast_last(const float* x, int64_t d) { return broadcast(x, d); }
  static __m512 madd(__m512 acc, W w, __m512i xb) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(xb), w, acc);
  }
  static __m512 load_bias(const float* b, __mmask16 m) { return _mm512_maskz_loadu_ps(m, b); }
  static void store(float* y, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(y, m, v); }
};

#include "linear_tiles_impl.h"

}  // namespace

void linear_block_avx512_f32(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                             int panels) {
  block(p, row0, rows, panel0, panels);
}

}  // namespace pagedllm::kernels
