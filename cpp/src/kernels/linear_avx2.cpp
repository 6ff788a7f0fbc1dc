// linear.h's tiles on AVX2 + FMA (8-lane vectors): a register tile is up to 4 rows x 1 panel
// (a panel's 16 columns are two vectors; 8 accumulators, within the 16 ymm registers). float32:
// per depth step the panel's two weight vectors are loaded once and each row's x element is
// broadcast into 2 FMAs. bfloat16: a 32-byte load holds 8 columns' K-pair (lane = k1 << 16 | k0),
// so a mask gives k1's float32 and a shift k0's, exactly; each product goes through an FMA into
// float32 sums (no AVX512_BF16 here), the output rounded once to bfloat16 (round to nearest
// even, NaN kept quiet). Compiled with -mavx2 -mfma and only called after the run-time CPU
// check (linear.cpp follows the engine choice). No header with inline code other than the
// intrinsics and linear_impl.h's static helpers.
#include <immintrin.h>

#include <cstdint>

#include "linear_impl.h"

namespace pagedllm::kernels {
namespace {

constexpr int kTileRows = 4;

inline __m256 bf16x8_to_f32(__m128i bits) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// float32 -> bfloat16 bits of 8 lanes, round to nearest even; NaN stays a quiet NaN.
inline __m128i f32x8_to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
  // pack the low 16 bits of 8 lanes (each < 2^16) into 8 uint16
  const __m256i packed = _mm256_packus_epi32(r, r);  // per 128-bit half: 4 values twice
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Stores 16 - tail columns of one row from two float32 vectors (tail: columns to drop, 0-15).
inline void store_f32(float* y, __m256 lo, __m256 hi, int cols) {
  if (cols >= 16) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  alignas(32) float tmp[16];
  _mm256_store_ps(tmp, lo);
  _mm256_store_ps(tmp + 8, hi);
  for (int c = 0; c < cols; ++c) y[c] = tmp[c];
}

inline void store_bf16(uint16_t* y, __m256 lo, __m256 hi, int cols) {
  alignas(16) uint16_t tmp[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), f32x8_to_bf16(lo));
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp + 8), f32x8_to_bf16(hi));
  for (int c = 0; c < cols && c < 16; ++c) y[c] = tmp[c];
}

// Rows [row0, row0 + MR) x one panel of y = x W^T (+ bias), float32.
template <int MR>
void tile_f32(const LinearParams& p, int64_t row0, int64_t panel) {
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const float* x = static_cast<const float*>(p.x) + row0 * p.x_row_stride;
  const float* w = static_cast<const float*>(p.packed) + panel * packed_panel_elements(p.dtype, p.in_features);
  __m256 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    const __m256 w0 = _mm256_loadu_ps(w + d * 16), w1 = _mm256_loadu_ps(w + d * 16 + 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_set1_ps(x[m * p.x_row_stride + d]);
      acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  const int64_t n0 = panel * kLinearPanel;
  const int cols = static_cast<int>(p.out_features - n0 < 16 ? p.out_features - n0 : 16);
  __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
  if (p.bias) {
    alignas(32) float b[16] = {};
    for (int c = 0; c < cols; ++c) b[c] = static_cast<const float*>(p.bias)[n0 + c];
    b0 = _mm256_load_ps(b);
    b1 = _mm256_load_ps(b + 8);
  }
  float* y = static_cast<float*>(p.y) + row0 * p.y_row_stride + n0;
  for (int m = 0; m < MR; ++m) {
    store_f32(y + m * p.y_row_stride, _mm256_add_ps(acc[m][0], b0), _mm256_add_ps(acc[m][1], b1), cols);
  }
}

// The same in bfloat16 (packed K-pairs; an odd K's last pair holds x[K - 1] and a zero).
template <int MR>
void tile_bf16(const LinearParams& p, int64_t row0, int64_t panel) {
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const uint16_t* x = static_cast<const uint16_t*>(p.x) + row0 * p.x_row_stride;
  const uint16_t* w = static_cast<const uint16_t*>(p.packed) + panel * packed_panel_elements(p.dtype, p.in_features);
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + d * 32));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + d * 32 + 16));
    const __m256 a0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));  // columns 0-7, k = 2 d
    const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(a, hi_mask));  // k = 2 d + 1
    const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));  // columns 8-15
    const __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(b, hi_mask));
    const bool second = 2 * d + 1 < p.in_features;
    for (int m = 0; m < MR; ++m) {
      const uint16_t* xr = x + m * p.x_row_stride + 2 * d;
      const __m256 x0 = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(uint32_t{xr[0]} << 16)));
      const __m256 x1 = _mm256_castsi256_ps(
          _mm256_set1_epi32(second ? static_cast<int>(uint32_t{xr[1]} << 16) : 0));
      acc[m][0] = _mm256_fmadd_ps(x1, a1, _mm256_fmadd_ps(x0, a0, acc[m][0]));
      acc[m][1] = _mm256_fmadd_ps(x1, b1, _mm256_fmadd_ps(x0, b0, acc[m][1]));
    }
  }
  const int64_t n0 = panel * kLinearPanel;
  const int cols = static_cast<int>(p.out_features - n0 < 16 ? p.out_features - n0 : 16);
  __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
  if (p.bias) {
    alignas(16) uint16_t bb[16] = {};
    for (int c = 0; c < cols; ++c) bb[c] = static_cast<const uint16_t*>(p.bias)[n0 + c];
    bias0 = bf16x8_to_f32(_mm_load_si128(reinterpret_cast<const __m128i*>(bb)));
    bias1 = bf16x8_to_f32(_mm_load_si128(reinterpret_cast<const __m128i*>(bb + 8)));
  }
  uint16_t* y = static_cast<uint16_t*>(p.y) + row0 * p.y_row_stride + n0;
  for (int m = 0; m < MR; ++m) {
    store_bf16(y + m * p.y_row_stride, _mm256_add_ps(acc[m][0], bias0),
               _mm256_add_ps(acc[m][1], bias1), cols);
  }
}

template <int MR>
void tile(const LinearParams& p, int64_t row0, int64_t panel) {
  if (p.dtype == ScalarType::kFloat32) {
    tile_f32<MR>(p, row0, panel);
  } else {
    tile_bf16<MR>(p, row0, panel);
  }
}

}  // namespace

void linear_block_avx2(const LinearParams& p, int64_t row0, int rows, int64_t panel0, int panels) {
  const int tiles = (rows + kTileRows - 1) / kTileRows;
  for (int64_t panel = panel0; panel < panel0 + panels; ++panel) {
    int r = 0;
    for (int t = 0; t < tiles; ++t) {
      const int mr = (rows - r) / (tiles - t);  // balanced, as linear_tiles_impl.h
      switch (mr) {
        case 1: tile<1>(p, row0 + r, panel); break;
        case 2: tile<2>(p, row0 + r, panel); break;
        case 3: tile<3>(p, row0 + r, panel); break;
        default: tile<4>(p, row0 + r, panel); break;
      }
      r += mr;
    }
  }
}

}  // namespace pagedllm::kernels
