// pagedllm/kernels/fused_ops.h — the element-wise ops of a Llama layer, fused (vLLM's CPU ops):
// residual add + RMSNorm, SiLU-and-mul, RoPE applied in place; and the step's row gathers and
// reductions around them: the input rows (embedding + RoPE), the greedy argmax.
//
// Each op makes one pass over its rows (the norm two, the second from L1) instead of the
// three to six torch kernels and temporaries of the eager expressions, in float32 or bfloat16.
// The arithmetic is that of the torch expressions they replace, operation for operation (the
// same roundings, no fused multiply-add where torch has none), so only RMSNorm's sum of squares
// (vector partial sums) and exp's last bit (SiLU, a polynomial on the AVX2 / AVX-512 engines)
// differ. Vectorised per instruction set: the calls use the CPU engine the attention kernels use
// (kernels.h: active_cpu_kernel / set_cpu_engine), so the tests force each in turn.
// Rows are split over the kernel thread pool when there are enough of them.
// Every entry point validates its params and throws pagedllm::Error before writing anything.
// Thread-safety: concurrent calls are safe when they write disjoint memory.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::kernels {

// x += delta (when delta is set), then out = weight * x / sqrt(mean(x^2) + eps) per row.
// bfloat16: the sum is rounded to bfloat16 (torch's add), statistics in float32, the normalised
// row rounded to bfloat16 before the weight multiplies it (transformers' LlamaRMSNorm).
struct AddRMSNormParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16, every tensor
  void* x = nullptr;              // [rows, cols]; updated in place when delta is set
  int64_t x_row_stride = 0;       // elements
  const void* delta = nullptr;    // [rows, cols] or null (a plain RMSNorm)
  int64_t delta_row_stride = 0;
  void* out = nullptr;            // [rows, cols]; may be x itself
  int64_t out_row_stride = 0;
  const void* weight = nullptr;   // [cols]
  int64_t rows = 0;
  int32_t cols = 0;
  float eps = 0.0f;
};

// out[r] = silu(x[r, :cols]) * x[r, cols:2 cols], silu(g) = g / (1 + exp(-g)); bfloat16:
// silu rounded to bfloat16, then the product (torch's silu then mul).
struct SiluAndMulParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16, both tensors
  const void* x = nullptr;        // [rows, 2 * cols]: gate then up
  int64_t x_row_stride = 0;       // elements
  void* out = nullptr;            // [rows, cols]
  int64_t out_row_stride = 0;
  int64_t rows = 0;
  int32_t cols = 0;               // intermediate size (>= 1)
};

// Rotates every head of every token in place, Llama's half-split ("neox") layout:
// x = x * cos + (x2, x1) * sin, with x1, x2 the halves of the head and cos / sin the token's
// rows of pagedllm.model.rope's tables (sin's first half negated). Each product is rounded
// before the sum (torch's mul, mul, add).
struct RotaryParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16: x and the tables
  void* x = nullptr;              // [num_tokens, num_heads, head_dim], head_dim contiguous;
                                  // token and head strides in either order, heads disjoint
  int64_t x_token_stride = 0;     // elements
  int64_t x_head_stride = 0;
  const void* cos = nullptr;      // [num_tokens, head_dim]
  int64_t cos_token_stride = 0;
  const void* sin = nullptr;      // [num_tokens, head_dim]
  int64_t sin_token_stride = 0;
  int64_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;           // even, >= 2
};

// Greedy sampling's argmax: per row of float32 logits the index of its first maximum (torch's
// argmax tie rule) and the maximum (NaN when the row holds a NaN).
struct ArgmaxParams {
  const float* x = nullptr;       // [rows, cols]
  int64_t x_row_stride = 0;       // elements
  int64_t rows = 0;
  int64_t cols = 0;               // 1 .. 2^31 - 1
  int64_t* index = nullptr;       // [rows]
  float* max_value = nullptr;     // [rows]
};

// A step's input rows, gathered in one pass: each token's embedding (a dense [vocab, hidden]
// matrix, or the panels of a tied lm_head packed by pack_linear_weight) and its RoPE rows from
// pagedllm.model.rope's tables. Copies only: bit-identical to the tables' rows.
struct TokenRowsParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16: embedding, tables, outputs
  const int64_t* ids = nullptr;             // [num_tokens], each in [0, vocab)
  const int64_t* positions = nullptr;       // [num_tokens], each >= 0
  int64_t num_tokens = 0;
  const void* embedding = nullptr;          // [vocab, hidden] rows, or packed (below)
  int64_t embedding_row_stride = 0;         // elements (dense only), >= hidden
  bool embedding_packed = false;            // pack_linear_weight's [vocab, hidden] panels
  int32_t vocab = 0;                        // >= 1
  int32_t hidden = 0;                       // >= 1
  const void* cos_table = nullptr;          // [table_rows, head_dim] contiguous
  const void* sin_table = nullptr;          // [table_rows, head_dim] contiguous
  int64_t table_rows = 0;                   // >= 0
  int32_t head_dim = 0;                     // >= 1
  void* x = nullptr;                        // [num_tokens, hidden] contiguous
  void* cos = nullptr;                      // [num_tokens, head_dim] contiguous
  void* sin = nullptr;                      // [num_tokens, head_dim] contiguous
};

// x += delta (if given), then out = RMSNorm(x) per row (see AddRMSNormParams).
void add_rms_norm(const AddRMSNormParams& p);

// out = silu(gate) * up per row (see SiluAndMulParams).
void silu_and_mul(const SiluAndMulParams& p);

// RoPE in place on every head of every token (see RotaryParams).
void rotary_embedding(const RotaryParams& p);

// Gathers a step's input rows (see TokenRowsParams). Returns 0, or, writing nothing, the table
// rows the largest position needs when that is more than table_rows (grow the tables and call
// again). Throws, writing nothing, on bad sizes, an id outside [0, vocab) or a negative position
// (ErrorKind::kOutOfRange).
int64_t gather_token_rows(const TokenRowsParams& p);

// Fills index / max_value per row (see ArgmaxParams). Returns how many rows have a maximum that
// is not a finite float above the lowest one (NaN, +-inf, or the lowest float): for the other
// rows the index is also the argmax of the logits with NaN and +-inf clamped to the finite range.
int64_t argmax_rows(const ArgmaxParams& p);

}  // namespace pagedllm::kernels
