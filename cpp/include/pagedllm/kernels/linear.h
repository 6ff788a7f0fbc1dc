// pagedllm/kernels/linear.h — dense linear layers, y = x W^T + b, over a weight packed once into
// 16-column panels: the GEMMs of a serving step, most of them decode-sized (a few rows each).
//
// The packed weight holds W's columns (out features) in panels of 16, each panel its rows of K
// one after the other (float32: [panels][K][16]; bfloat16: [panels][ceil(K / 2)][16][2], the
// K-pairs that one AVX512_BF16 dot product reads); the last panel and an odd K are zero-padded.
// A register tile of up to 6 rows x 4 panels (24 accumulators) streams each weight vector once
// per tile, with x broadcast from its rows as they are: at 1-16 rows every weight byte is read
// from memory once and the step is bound by memory bandwidth, not by a re-blocking of the
// weight or by a blocking made for large matrices (oneDNN's prepacked bf16 kernels on a 2-core
// Zen 4 reach half the read bandwidth at one row: docs/BENCHMARKS.md, "Linear layers").
//
// Kernels: AVX-512F (float32) and AVX512_BF16 (bfloat16) where the CPU has them, AVX2 + FMA
// tiles (both types: 4 rows x 1 panel) on other x86-64 CPUs, a portable loop elsewhere; chosen
// at run time with the attention engine. The same summation order per output in all of them
// (float32 sums in K order; bfloat16 products exact in float32). Outputs are rounded to the
// output type once (round to nearest even), after the bias is added in float32.
// Every entry point validates its params and throws pagedllm::Error before writing anything.
// Thread-safety: concurrent calls are safe when they write disjoint memory. Rows and panels are
// split over the kernel thread pool (thread_pool.h) when there is enough work.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::kernels {

// Packs weight [out_features, in_features] for linear().
struct PackLinearParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16 (weight and packed)
  const void* weight = nullptr;             // [out_features, in_features]
  int64_t weight_row_stride = 0;            // elements, >= in_features
  int32_t out_features = 0;                 // >= 1
  int32_t in_features = 0;                  // >= 1
  void* packed = nullptr;                   // packed_linear_elements(...) elements
};

// y[rows, out_features] = x[rows, in_features] W^T (+ bias), W packed by pack_linear_weight.
struct LinearParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16: x, packed, bias and y
  const void* x = nullptr;                  // [rows, in_features]
  int64_t x_row_stride = 0;                 // elements, >= in_features
  int64_t rows = 0;                         // >= 0 (0: nothing to do)
  int32_t in_features = 0;                  // >= 1, as packed
  int32_t out_features = 0;                 // >= 1, as packed
  const void* packed = nullptr;             // pack_linear_weight's output
  const void* bias = nullptr;               // [out_features] or null
  void* y = nullptr;                        // [rows, out_features]; must not overlap x,
                                            // packed or bias (checked)
  int64_t y_row_stride = 0;                 // elements, >= out_features
};

// out[i, :] = W[ids[i], :] read back from W's packed form (an embedding lookup served from a
// tied lm_head's panels): bit-identical to the weight's rows.
struct PackedRowsParams {
  ScalarType dtype = ScalarType::kFloat32;  // float32 or bfloat16: packed and out
  const void* packed = nullptr;             // pack_linear_weight's output
  int32_t out_features = 0;                 // >= 1, as packed (the rows ids index)
  int32_t in_features = 0;                  // >= 1, as packed (each row's length)
  const int64_t* ids = nullptr;             // [rows], each in [0, out_features)
  int64_t rows = 0;                         // >= 0
  void* out = nullptr;                      // [rows, in_features]
  int64_t out_row_stride = 0;               // elements, >= in_features
};

// Elements (of dtype) of the packed form of a [out_features, in_features] weight; throws on a
// dtype other than float32 / bfloat16 or a non-positive size.
int64_t packed_linear_elements(ScalarType dtype, int64_t out_features, int64_t in_features);

// Writes the packed form of p.weight to p.packed (see the layout above). Throws, writing
// nothing, on bad sizes or strides, or when packed overlaps weight.
void pack_linear_weight(const PackLinearParams& p);

// y = x W^T (+ bias), see LinearParams. Throws, writing nothing, on bad sizes or strides, or
// when y overlaps x, packed or bias.
void linear(const LinearParams& p);

// Copies rows of a packed weight out, see PackedRowsParams. Throws, writing nothing, on bad
// sizes or strides, or an id outside [0, out_features) (ErrorKind::kOutOfRange).
void packed_linear_rows(const PackedRowsParams& p);

// The kernel linear() runs for dtype on this CPU: "avx512", "avx512_bf16", "avx2" or "generic".
const char* linear_kernel(ScalarType dtype);

}  // namespace pagedllm::kernels
