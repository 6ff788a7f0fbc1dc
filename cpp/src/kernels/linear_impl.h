// linear_impl.h (internal) — the tile loops behind linear.h, one per instruction set
// (linear.cpp: portable; linear_avx2.cpp: both types on AVX2 + FMA; linear_avx512.cpp: float32
// on AVX-512F; linear_avx512_bf16.cpp: bfloat16 on AVX512_BF16), and the packed layout they share. Plain data and function pointers
// only (included by ISA-specific translation units). bfloat16 elements travel as uint16_t bits.
// Thread-safety: a block function writes only its own rows x columns of y.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/linear.h"

namespace pagedllm::kernels {

constexpr int kLinearPanel = 16;      // output columns per packed panel (one zmm of float32)
constexpr int kLinearTileRows = 6;    // rows of a register tile (6 x 4 panels = 24 accumulators)
constexpr int kLinearTilePanels = 4;  // panels of a register tile
constexpr int kLinearTallRows = 8;      // blocks of 7-8 rows run as one tall tile per 2 panels
constexpr int kLinearTallMinK = 1024;   // ... when in_features is at least this (linear_tiles_impl.h)

// Rows [row0, row0 + rows) x panels [panel0, panel0 + panels) of y = x W^T (+ bias), in register
// tiles of at most kLinearTileRows x kLinearTilePanels; the caller validated p.
using LinearBlockFn = void (*)(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                               int panels);

// The packed K extent of one panel row: in_features (float32) or its pairs (bfloat16). Static:
// each translation unit (ISA-specific ones too) keeps its own copy, so no ODR merging.
static inline int64_t packed_depth(ScalarType dtype, int64_t in_features) {
  return dtype == ScalarType::kBFloat16 ? (in_features + 1) / 2 : in_features;
}

// Elements of one packed panel (depth x 16, or depth x 16 x 2 for bfloat16).
static inline int64_t packed_panel_elements(ScalarType dtype, int64_t in_features) {
  return packed_depth(dtype, in_features) * kLinearPanel *
         (dtype == ScalarType::kBFloat16 ? 2 : 1);
}

// AVX2 + FMA tiles, float32 and bfloat16; only when PAGEDLLM_HAVE_AVX2_KERNELS is defined.
void linear_block_avx2(const LinearParams& p, int64_t row0, int rows, int64_t panel0, int panels);
// AVX-512F float32 tiles; only when PAGEDLLM_HAVE_AVX512_KERNELS is defined.
void linear_block_avx512_f32(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                             int panels);
// AVX512_BF16 bfloat16 tiles; only when PAGEDLLM_HAVE_AVX512_BF16_KERNELS is defined.
void linear_block_avx512_bf16(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                              int panels);

}  // namespace pagedllm::kernels
