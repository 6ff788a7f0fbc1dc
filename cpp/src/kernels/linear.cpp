// linear.h's entry points: validation, the weight packing, the portable tiles, the choice of
// tile loops (the CPU engine the attention kernels use, as fused_ops.h does) and the split of
// rows x panels over the kernel thread pool.
#include "pagedllm/kernels/linear.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "engine.h"
#include "linear_impl.h"
#include "pagedllm/build_info.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/convert.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pagedllm::kernels {
namespace {

// Rows of one parallel work item (16 register tiles). An item's first tile streams its 4 panels
// from memory and the other 15 read them from L2, so taller items stall less: at 256-1024 rows
// 96-row items ran at 0.94-1.04x oneDNN where 48-row ones ran at 0.86-0.95x (2-core Zen 4).
constexpr int kBlockRows = 16 * kLinearTileRows;
// Multiply-adds below which a call runs on the calling thread alone (no pool round trip).
// 2^16: a one-row "tiny" step's [256 x 256], [384 x 256] and [256 x 688] products (65k-176k
// multiply-adds, 3-8 us on one core from L2) gain from the second thread; at 2^18 they ran on
// one, and the 4-layer stack at one token took 151 us against 127 us (2-core Zen 4, fp32).
constexpr int64_t kMinParallelMacs = int64_t{1} << 16;

void check_dtype(ScalarType dtype, const char* what) {
  PAGEDLLM_CHECK_ARG(dtype == ScalarType::kFloat32 || dtype == ScalarType::kBFloat16,
                     what << ": dtype must be float32 or bfloat16");
}

void check_features(const char* what, int64_t out_features, int64_t in_features) {
  PAGEDLLM_CHECK_ARG(out_features >= 1 && in_features >= 1,
                     what << ": out_features and in_features must be >= 1, got [" << out_features
                          << ", " << in_features << "]");
  PAGEDLLM_CHECK_ARG(out_features < (int64_t{1} << 31) && in_features < (int64_t{1} << 31),
                     what << ": out_features and in_features must be < 2^31, got ["
                          << out_features << ", " << in_features << "]");
}

// Bytes of a [rows, cols] matrix of `es`-byte elements with rows `stride` elements apart, from
// its first element to past its last; throws when that overflows (a nonsense stride).
int64_t matrix_bytes(const char* what, const char* name, int64_t rows, int64_t stride,
                     int64_t cols, int64_t es) {
  int64_t n = 0;
  PAGEDLLM_CHECK_ARG(!__builtin_mul_overflow(rows - 1, stride, &n) &&
                         !__builtin_add_overflow(n, cols, &n) && !__builtin_mul_overflow(n, es, &n),
                     what << ": " << name << " of " << rows << " rows of stride " << stride
                          << " overflows the address space");
  return n;
}

// Throws when the written range [w, w + wn) and the read range [r, r + rn) share a byte.
void check_disjoint(const char* what, const char* written, const void* w, int64_t wn,
                    const char* read, const void* r, int64_t rn) {
  const auto a = reinterpret_cast<uintptr_t>(w), b = reinterpret_cast<uintptr_t>(r);
  PAGEDLLM_CHECK_ARG(a + static_cast<uintptr_t>(wn) <= b || b + static_cast<uintptr_t>(rn) <= a,
                     what << ": " << written << " (" << wn << " bytes at " << w
                          << ") overlaps " << read << " (" << rn << " bytes at " << r
                          << "); the output must not share memory with an input");
}

void validate(const LinearParams& p) {
  check_dtype(p.dtype, "linear");
  check_features("linear", p.out_features, p.in_features);
  PAGEDLLM_CHECK_ARG(p.rows >= 0, "linear: rows must be >= 0, got " << p.rows);
  if (p.rows == 0) return;
  PAGEDLLM_CHECK_ARG(p.x && p.packed && p.y, "linear: x, packed and y must not be null");
  PAGEDLLM_CHECK_ARG(p.rows == 1 || p.x_row_stride >= p.in_features,
                     "linear: x row stride " << p.x_row_stride << " must be >= in_features "
                                             << p.in_features);
  PAGEDLLM_CHECK_ARG(p.rows == 1 || p.y_row_stride >= p.out_features,
                     "linear: y row stride " << p.y_row_stride << " must be >= out_features "
                                             << p.out_features);
  // y is written while x, the packed weight and the bias are still being read.
  const int64_t es = element_size(p.dtype);
  const int64_t y_bytes = matrix_bytes("linear", "y", p.rows, p.y_row_stride, p.out_features, es);
  check_disjoint("linear", "y", p.y, y_bytes, "x", p.x,
                 matrix_bytes("linear", "x", p.rows, p.x_row_stride, p.in_features, es));
  check_disjoint("linear", "y", p.y, y_bytes, "packed", p.packed,
                 packed_linear_elements(p.dtype, p.out_features, p.in_features) * es);
  if (p.bias) check_disjoint("linear", "y", p.y, y_bytes, "bias", p.bias, p.out_features * es);
}

// ---- portable tiles -------------------------------------------------------------------------

inline float load_x(const LinearParams& p, int64_t r, int64_t k) {
  return p.dtype == ScalarType::kFloat32
             ? static_cast<const float*>(p.x)[r * p.x_row_stride + k]
             : bf16_to_float(static_cast<const uint16_t*>(p.x)[r * p.x_row_stride + k]);
}

// One output row of one panel, in the vector kernels' order: float32 one product per k,
// bfloat16 the pair (2 kp, 2 kp + 1) per step, each product exact in float32.
void generic_panel_row(const LinearParams& p, int64_t r, int64_t panel, float acc[kLinearPanel]) {
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  for (int c = 0; c < kLinearPanel; ++c) acc[c] = 0.0f;
  if (p.dtype == ScalarType::kFloat32) {
    const float* w = static_cast<const float*>(p.packed) + panel * depth * kLinearPanel;
    for (int64_t k = 0; k < depth; ++k) {
      const float xv = load_x(p, r, k);
      for (int c = 0; c < kLinearPanel; ++c) acc[c] += xv * w[k * kLinearPanel + c];
    }
    return;
  }
  const uint16_t* w = static_cast<const uint16_t*>(p.packed) + panel * depth * kLinearPanel * 2;
  for (int64_t kp = 0; kp < depth; ++kp) {
    const float x0 = load_x(p, r, 2 * kp);
    const float x1 = 2 * kp + 1 < p.in_features ? load_x(p, r, 2 * kp + 1) : 0.0f;
    for (int c = 0; c < kLinearPanel; ++c) {
      acc[c] += x0 * bf16_to_float(w[(kp * kLinearPanel + c) * 2]);
      acc[c] += x1 * bf16_to_float(w[(kp * kLinearPanel + c) * 2 + 1]);
    }
  }
}

void linear_block_generic(const LinearParams& p, int64_t row0, int rows, int64_t panel0,
                          int panels) {
  for (int64_t r = row0; r < row0 + rows; ++r) {
    for (int64_t panel = panel0; panel < panel0 + panels; ++panel) {
      float acc[kLinearPanel];
      generic_panel_row(p, r, panel, acc);
      const int64_t n0 = panel * kLinearPanel;
      const int cols = static_cast<int>(std::min<int64_t>(kLinearPanel, p.out_features - n0));
      for (int c = 0; c < cols; ++c) {
        float v = acc[c];
        if (p.bias) v += load_scalar(p.bias, p.dtype, n0 + c);
        store_scalar(p.y, p.dtype, r * p.y_row_stride + n0 + c, v);
      }
    }
  }
}

struct Choice {
  LinearBlockFn fn;
  const char* name;
};

Choice choose(ScalarType dtype) {
  const char* engine = current_engine().name;
  const bool avx512 = std::strcmp(engine, "avx512") == 0 || std::strcmp(engine, "avx512_bf16") == 0;
  (void)avx512;
#ifdef PAGEDLLM_HAVE_AVX512_KERNELS
  if (avx512 && dtype == ScalarType::kFloat32) return {&linear_block_avx512_f32, "avx512"};
#endif
#ifdef PAGEDLLM_HAVE_AVX512_BF16_KERNELS
  if (avx512 && dtype == ScalarType::kBFloat16 && cpu_features().avx512bf16) {
    return {&linear_block_avx512_bf16, "avx512_bf16"};
  }
#endif
#ifdef PAGEDLLM_HAVE_AVX2_KERNELS
  // the avx2 engine, and bf16 on an AVX-512 engine without AVX512_BF16 (AVX-512 implies AVX2)
  if (std::strcmp(engine, "avx2") == 0 || avx512) return {&linear_block_avx2, "avx2"};
#endif
  (void)dtype;
  return {&linear_block_generic, "generic"};
}

}  // namespace

int64_t packed_linear_elements(ScalarType dtype, int64_t out_features, int64_t in_features) {
  check_dtype(dtype, "packed_linear_elements");
  check_features("packed_linear_elements", out_features, in_features);
  const int64_t panels = (out_features + kLinearPanel - 1) / kLinearPanel;
  return panels * packed_panel_elements(dtype, in_features);
}

void pack_linear_weight(const PackLinearParams& p) {
  check_dtype(p.dtype, "pack_linear_weight");
  check_features("pack_linear_weight", p.out_features, p.in_features);
  PAGEDLLM_CHECK_ARG(p.weight && p.packed, "pack_linear_weight: weight and packed must not be null");
  PAGEDLLM_CHECK_ARG(p.out_features == 1 || p.weight_row_stride >= p.in_features,
                     "pack_linear_weight: weight row stride " << p.weight_row_stride
                                                              << " must be >= in_features "
                                                              << p.in_features);
  const int64_t es = element_size(p.dtype);
  check_disjoint("pack_linear_weight", "packed", p.packed,
                 packed_linear_elements(p.dtype, p.out_features, p.in_features) * es, "weight",
                 p.weight,
                 matrix_bytes("pack_linear_weight", "weight", p.out_features, p.weight_row_stride,
                              p.in_features, es));
  const int64_t panels = (p.out_features + kLinearPanel - 1) / kLinearPanel;
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const int64_t per_panel = packed_panel_elements(p.dtype, p.in_features);
  const int pair = p.dtype == ScalarType::kBFloat16 ? 2 : 1;
  parallel_for(panels, [&](int64_t panel, int) {
    for (int64_t d = 0; d < depth; ++d) {
      for (int c = 0; c < kLinearPanel; ++c) {
        const int64_t n = panel * kLinearPanel + c;
        for (int j = 0; j < pair; ++j) {
          const int64_t k = d * pair + j;
          const int64_t dst = panel * per_panel + (d * kLinearPanel + c) * pair + j;
          const bool inside = n < p.out_features && k < p.in_features;
          if (p.dtype == ScalarType::kFloat32) {
            static_cast<float*>(p.packed)[dst] =
                inside ? static_cast<const float*>(p.weight)[n * p.weight_row_stride + k] : 0.0f;
          } else {
            static_cast<uint16_t*>(p.packed)[dst] =
                inside ? static_cast<const uint16_t*>(p.weight)[n * p.weight_row_stride + k] : 0;
          }
        }
      }
    }
  });
}

void packed_linear_rows(const PackedRowsParams& p) {
  check_dtype(p.dtype, "packed_linear_rows");
  check_features("packed_linear_rows", p.out_features, p.in_features);
  PAGEDLLM_CHECK_ARG(p.rows >= 0, "packed_linear_rows: rows must be >= 0, got " << p.rows);
  if (p.rows == 0) return;
  PAGEDLLM_CHECK_ARG(p.packed && p.ids && p.out, "packed_linear_rows: data is null");
  PAGEDLLM_CHECK_ARG(p.rows == 1 || p.out_row_stride >= p.in_features,
                     "packed_linear_rows: out row stride " << p.out_row_stride
                                                           << " must be >= in_features "
                                                           << p.in_features);
  for (int64_t i = 0; i < p.rows; ++i) {
    PAGEDLLM_CHECK_INDEX(p.ids[i] >= 0 && p.ids[i] < p.out_features,
                         "embedding id " << p.ids[i] << " at row " << i
                                         << ": expected ids in [0, " << p.out_features << ")");
  }
  const int64_t depth = packed_depth(p.dtype, p.in_features);
  const int64_t per_panel = packed_panel_elements(p.dtype, p.in_features);
  const int pair = p.dtype == ScalarType::kBFloat16 ? 2 : 1;
  const int64_t stride = p.rows == 1 ? p.in_features : p.out_row_stride;
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t panel = p.ids[i] / kLinearPanel, c = p.ids[i] % kLinearPanel;
    for (int64_t d = 0; d < depth; ++d) {
      for (int j = 0; j < pair; ++j) {
        const int64_t k = d * pair + j;
        if (k >= p.in_features) break;
        const int64_t src = panel * per_panel + (d * kLinearPanel + c) * pair + j;
        if (p.dtype == ScalarType::kFloat32) {
          static_cast<float*>(p.out)[i * stride + k] = static_cast<const float*>(p.packed)[src];
        } else {
          static_cast<uint16_t*>(p.out)[i * stride + k] =
              static_cast<const uint16_t*>(p.packed)[src];
        }
      }
    }
  }
}

void linear(const LinearParams& p) {
  validate(p);
  if (p.rows == 0) return;
  const LinearBlockFn fn = choose(p.dtype).fn;
  const int64_t panels = (p.out_features + kLinearPanel - 1) / kLinearPanel;
  const int64_t row_blocks = (p.rows + kBlockRows - 1) / kBlockRows;
  const int64_t panel_blocks = (panels + kLinearTilePanels - 1) / kLinearTilePanels;
  const auto item = [&](int64_t i) {
    const int64_t rb = i / panel_blocks, pb = i % panel_blocks;  // panels fastest: x stays hot
    const int64_t row0 = rb * kBlockRows, panel0 = pb * kLinearTilePanels;
    fn(p, row0, static_cast<int>(std::min<int64_t>(kBlockRows, p.rows - row0)), panel0,
       static_cast<int>(std::min<int64_t>(kLinearTilePanels, panels - panel0)));
  };
  const int64_t items = row_blocks * panel_blocks;
  const int64_t macs = p.rows * p.out_features * static_cast<int64_t>(p.in_features);
  if (items == 1 || macs < kMinParallelMacs || get_num_threads() == 1) {
    for (int64_t i = 0; i < items; ++i) item(i);
    return;
  }
  parallel_for(items, [&](int64_t i, int) { item(i); });
}

const char* linear_kernel(ScalarType dtype) {
  check_dtype(dtype, "linear_kernel");
  return choose(dtype).name;
}

}  // namespace pagedllm::kernels
