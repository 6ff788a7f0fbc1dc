// fused_rows.h (internal) — the row loops behind fused_ops.h, compiled once per instruction set
// (fused_rows_generic.cpp, fused_rows_avx2.cpp, fused_rows_avx512.cpp from fused_rows_impl.h),
// and the helpers the entry points share. bfloat16 elements travel as their uint16_t bits.
// Plain data and function pointers only (included by ISA-specific translation units).
// Thread-safety: the row functions write only their own row.
#pragma once

#include <cstdint>

namespace pagedllm::kernels {

// One instruction set's row loops (the semantics are fused_ops.h's, one row at a time).
struct FusedRowOps {
  const char* name;
  // x += delta (delta may be null), out = RMSNorm(x); cols >= 1.
  void (*add_rms_norm_f32)(float* x, const float* delta, float* out, const float* weight,
                           int32_t cols, float eps);
  void (*add_rms_norm_bf16)(uint16_t* x, const uint16_t* delta, uint16_t* out,
                            const uint16_t* weight, int32_t cols, float eps);
  // out[i] = silu(x[i]) * x[cols + i], i < cols.
  void (*silu_and_mul_f32)(const float* x, float* out, int32_t cols);
  void (*silu_and_mul_bf16)(const uint16_t* x, uint16_t* out, int32_t cols);
  // RoPE of the num_heads heads of one token (head h at x + h * head_stride), head_dim = 2 * half.
  void (*rotary_f32)(float* x, int64_t head_stride, int32_t num_heads, const float* cos,
                     const float* sin, int32_t half);
  void (*rotary_bf16)(uint16_t* x, int64_t head_stride, int32_t num_heads, const uint16_t* cos,
                      const uint16_t* sin, int32_t half);
  // The index of the first maximum of x[0, n) (n >= 1, n < 2^31) and the maximum in *max_value
  // (NaN when x holds a NaN; the index is then that of the largest non-NaN element).
  int64_t (*argmax_f32)(const float* x, int64_t n, float* max_value);
};

// The portable loops (always compiled).
const FusedRowOps& generic_fused_rows();
// AVX2 + FMA; only when PAGEDLLM_HAVE_AVX2_KERNELS is defined.
const FusedRowOps& avx2_fused_rows();
// AVX-512 F/BW/VL/DQ; only when PAGEDLLM_HAVE_AVX512_KERNELS is defined.
const FusedRowOps& avx512_fused_rows();

// The loops of the CPU engine the attention calls use (engine.h: current_engine()).
const FusedRowOps& current_fused_rows();

// Runs fn(first_row, end_row) over [0, rows) in groups of about `min_elements` elements
// (row_elements each), on the kernel pool when there is more than one group.
void for_row_groups(int64_t rows, int64_t row_elements, int64_t min_elements,
                    void (*fn)(const void* ctx, int64_t begin, int64_t end), const void* ctx);

}  // namespace pagedllm::kernels
