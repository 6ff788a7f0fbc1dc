// linear.h's tiles on AVX2 + FMA (8-lane vectors): a register tile is up to 6 rows x 1 panel,
// or 1-3 rows x 2-4 panels (a panel's 16 columns are two vectors; at most 12 accumulators,
// within the 16 ymm registers). float32: per depth step the tile's weight vectors are loaded
// once and each row's x element is broadcast into 2 FMAs per panel. bfloat16: a 32-byte load
// holds 8 columns' K-pair (lane = k1 << 16 | k0), so a mask gives k1's float32 and a shift k0's,
// exactly; each product goes through an FMA into float32 sums (no AVX512_BF16 here), the
// output rounded once to bfloat16 (round to nearest even, NaN kept quiet). Compiled with -mavx2
// -mfma and only called after the run-time CPU check (linear.cpp follows the engine choice). No
// header with inline code other than the intrinsics and linear_impl.h's static helpers.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "linear_impl.h"

namespace pagedllm::kernels {
namespace {

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

// Rows [row0, row0 + MR) x panels [panel0, panel0 + NP) of y = x W^T (+ bias), float32 (the
// accumulators, MR x NP x 2 <= 12, stay in registers beside 2 weight vectors and a broadcast).
template <int MR, int NP>
void tile_f32(const LinearParams& p, int64_t row0, int64_t panel0) {
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const int64_t per_panel = packed_panel_elements(p.dtype, p.in_features);
  const float* x = static_cast<const float*>(p.x) + row0 * p.x_row_stride;
  const float* w = static_cast<const float*>(p.packed) + panel0 * per_panel;
  __m256 acc[MR][2 * NP];  // [m][2 j]: panel j's columns 0-7, [m][2 j + 1]: 8-15
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * NP; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    __m256 w0[NP], w1[NP];
    for (int j = 0; j < NP; ++j) {
      w0[j] = _mm256_loadu_ps(w + j * per_panel + d * 16);
      w1[j] = _mm256_loadu_ps(w + j * per_panel + d * 16 + 8);
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * p.x_row_stride + d);
      for (int j = 0; j < NP; ++j) {
        acc[m][2 * j] = _mm256_fmadd_ps(xb, w0[j], acc[m][2 * j]);
        acc[m][2 * j + 1] = _mm256_fmadd_ps(xb, w1[j], acc[m][2 * j + 1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j) {
    const int64_t n0 = (panel0 + j) * kLinearPanel;
    const int cols = static_cast<int>(p.out_features - n0 < 16 ? p.out_features - n0 : 16);
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    if (p.bias) {
      alignas(32) float b[16] = {};
      for (int c = 0; c < cols; ++c) b[c] = static_cast<const float*>(p.bias)[n0 + c];
      b0 = _mm256_load_ps(b);
      b1 = _mm256_load_ps(b + 8);
    }
    float* y = static_cast<float*>(p.y) + row0 * p.y_row_stride + n0;
#pragma GCC unroll 8  // constant indices keep acc in registers (a loop would spill it to memory)
    for (int m = 0; m < MR; ++m) {
      store_f32(y + m * p.y_row_stride, _mm256_add_ps(acc[m][2 * j], b0),
                _mm256_add_ps(acc[m][2 * j + 1], b1), cols);
    }
  }
}

// The same in bfloat16 (packed K-pairs; an odd K's last pair holds x[K - 1] and a zero). Each
// row's K-pair is broadcast as one 32-bit element, from which a shift gives k0's float32 and a
// mask k1's, as the weights' lanes are split.
template <int MR, int NP>
void tile_bf16(const LinearParams& p, int64_t row0, int64_t panel0) {
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const int64_t per_panel = packed_panel_elements(p.dtype, p.in_features);
  const int64_t full = p.in_features / 2;  // K-pairs with both elements in x
  const uint16_t* x = static_cast<const uint16_t*>(p.x) + row0 * p.x_row_stride;
  const uint16_t* w = static_cast<const uint16_t*>(p.packed) + panel0 * per_panel;
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m256 acc[MR][2 * NP];  // [m][2 j]: panel j's columns 0-7, [m][2 j + 1]: 8-15
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 2 * NP; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < depth; ++d) {
    __m256 a0[NP], a1[NP], b0[NP], b1[NP];
    for (int j = 0; j < NP; ++j) {
      const uint16_t* wd = w + j * per_panel + d * 32;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wd));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wd + 16));
      a0[j] = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));  // columns 0-7, k = 2 d
      a1[j] = _mm256_castsi256_ps(_mm256_and_si256(a, hi_mask));  // k = 2 d + 1
      b0[j] = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));  // columns 8-15
      b1[j] = _mm256_castsi256_ps(_mm256_and_si256(b, hi_mask));
    }
    for (int m = 0; m < MR; ++m) {
      const uint16_t* xr = x + m * p.x_row_stride + 2 * d;
      __m256i pair;
      if (d < full) {
        int32_t bits;
        std::memcpy(&bits, xr, sizeof bits);
        pair = _mm256_set1_epi32(bits);
      } else {  // the odd K's last element alone (x[K] is not x's)
        pair = _mm256_set1_epi32(static_cast<int32_t>(xr[0]));
      }
      const __m256 x0 = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
      const __m256 x1 = _mm256_castsi256_ps(_mm256_and_si256(pair, hi_mask));
      for (int j = 0; j < NP; ++j) {
        acc[m][2 * j] = _mm256_fmadd_ps(x1, a1[j], _mm256_fmadd_ps(x0, a0[j], acc[m][2 * j]));
        acc[m][2 * j + 1] =
            _mm256_fmadd_ps(x1, b1[j], _mm256_fmadd_ps(x0, b0[j], acc[m][2 * j + 1]));
      }
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j) {
    const int64_t n0 = (panel0 + j) * kLinearPanel;
    const int cols = static_cast<int>(p.out_features - n0 < 16 ? p.out_features - n0 : 16);
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
    if (p.bias) {
      alignas(16) uint16_t bb[16] = {};
      for (int c = 0; c < cols; ++c) bb[c] = static_cast<const uint16_t*>(p.bias)[n0 + c];
      bias0 = bf16x8_to_f32(_mm_load_si128(reinterpret_cast<const __m128i*>(bb)));
      bias1 = bf16x8_to_f32(_mm_load_si128(reinterpret_cast<const __m128i*>(bb + 8)));
    }
    uint16_t* y = static_cast<uint16_t*>(p.y) + row0 * p.y_row_stride + n0;
#pragma GCC unroll 8  // as tile_f32
    for (int m = 0; m < MR; ++m) {
      store_bf16(y + m * p.y_row_stride, _mm256_add_ps(acc[m][2 * j], bias0),
                 _mm256_add_ps(acc[m][2 * j + 1], bias1), cols);
    }
  }
}

template <bool BF16, int MR, int NP>
void tile(const LinearParams& p, int64_t row0, int64_t panel0) {
  if constexpr (BF16) {
    tile_bf16<MR, NP>(p, row0, panel0);
  } else {
    tile_f32<MR, NP>(p, row0, panel0);
  }
}

// MR rows against panels [panel0, panel0 + panels), NP at a time (then one by one).
template <bool BF16, int MR, int NP>
void row_tile(const LinearParams& p, int64_t row0, int64_t panel0, int panels) {
  int j = 0;
  for (; j + NP <= panels; j += NP) tile<BF16, MR, NP>(p, row0, panel0 + j);
  for (; j < panels; ++j) tile<BF16, MR, 1>(p, row0, panel0 + j);
}

// Each panel's rows in balanced tiles of up to MaxRows rows x 1 panel, one after another, so the
// panel's weights are read from memory once and then from L1/L2.
template <bool BF16, int MaxRows>
void panels_by_row_tiles(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                         int panels) {
  const int tiles = (rows + MaxRows - 1) / MaxRows;
  for (int64_t panel = panel0; panel < panel0 + panels; ++panel) {
    int r = 0;
    for (int t = 0; t < tiles; ++t) {
      const int mr = (rows - r) / (tiles - t);  // balanced, as linear_tiles_impl.h
      switch (mr) {
        case 1: tile<BF16, 1, 1>(p, row0 + r, panel); break;
        case 2: tile<BF16, 2, 1>(p, row0 + r, panel); break;
        case 3: tile<BF16, 3, 1>(p, row0 + r, panel); break;
        case 4: tile<BF16, 4, 1>(p, row0 + r, panel); break;
        case 5: if constexpr (MaxRows >= 5) tile<BF16, 5, 1>(p, row0 + r, panel); break;
        default: if constexpr (MaxRows >= 6) tile<BF16, 6, 1>(p, row0 + r, panel); break;
      }
      r += mr;
    }
  }
}

}  // namespace

// float32: 1-3 rows (decode) take 2-4 panels per tile, so that 8-12 independent accumulators
// hide the FMA latency; from 4 rows a tile is one panel of up to 6 rows (12 accumulators: 2
// weight loads and 6 broadcasts per 12 FMAs). bfloat16 also holds a depth step's 4 converted
// weight vectors and the mask, so its tiles stop at 4 rows x 1 panel (and 1 row x 2 panels)
// to stay within the 16 registers.
void linear_block_avx2(const LinearParams& p, int64_t row0, int rows, int64_t panel0, int panels) {
  if (p.dtype == ScalarType::kFloat32) {
    if (rows == 1) return row_tile<false, 1, 4>(p, row0, panel0, panels);
    if (rows == 2) return row_tile<false, 2, 2>(p, row0, panel0, panels);
    if (rows == 3) return row_tile<false, 3, 2>(p, row0, panel0, panels);
    return panels_by_row_tiles<false, 6>(p, row0, rows, panel0, panels);
  }
  if (rows == 1) return row_tile<true, 1, 2>(p, row0, panel0, panels);
  return panels_by_row_tiles<true, 4>(p, row0, rows, panel0, panels);
}

}  // namespace pagedllm::kernels
