// silu_and_mul: [rows, 2 f] -> [rows, f], silu(gate) * up in one pass (vLLM's silu_and_mul),
// float32 and bfloat16.
#include "fused_rows.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"

namespace pagedllm::kernels {
namespace {

constexpr int64_t kMinElementsPerGroup = 1 << 16;  // exp per element: split earlier than a norm

void validate(const SiluAndMulParams& p) {
  PAGEDLLM_CHECK_ARG(p.dtype == ScalarType::kFloat32 || p.dtype == ScalarType::kBFloat16,
                     "silu_and_mul: dtype must be float32 or bfloat16, got "
                         << scalar_type_name(p.dtype));
  PAGEDLLM_CHECK_ARG(p.rows >= 0, "silu_and_mul: rows must be >= 0, got " << p.rows);
  PAGEDLLM_CHECK_ARG(p.cols >= 1, "silu_and_mul: cols must be >= 1, got " << p.cols);
  PAGEDLLM_CHECK_ARG(p.x_row_stride >= 2 * static_cast<int64_t>(p.cols) &&
                         p.out_row_stride >= p.cols,
                     "silu_and_mul: row strides (x " << p.x_row_stride << ", out "
                                                     << p.out_row_stride << ") must be >= 2 * "
                                                     << p.cols << " and >= " << p.cols);
  PAGEDLLM_CHECK_ARG(p.rows == 0 || (p.x && p.out), "silu_and_mul: data is null");
}

template <class T> void run_rows(const SiluAndMulParams& p, void (*row)(const T*, T*, int32_t)) {
  struct Ctx {
    const SiluAndMulParams* p;
    void (*row)(const T*, T*, int32_t);
  } ctx{&p, row};
  for_row_groups(p.rows, p.cols, kMinElementsPerGroup, [](const void* c, int64_t b, int64_t e) {
    const Ctx& k = *static_cast<const Ctx*>(c);
    const SiluAndMulParams& q = *k.p;
    for (int64_t r = b; r < e; ++r) {
      k.row(static_cast<const T*>(q.x) + r * q.x_row_stride,
            static_cast<T*>(q.out) + r * q.out_row_stride, q.cols);
    }
  }, &ctx);
}

}  // namespace

void silu_and_mul(const SiluAndMulParams& p) {
  validate(p);
  const FusedRowOps& ops = current_fused_rows();
  if (p.dtype == ScalarType::kFloat32) {
    run_rows<float>(p, ops.silu_and_mul_f32);
  } else {
    run_rows<uint16_t>(p, ops.silu_and_mul_bf16);
  }
}

}  // namespace pagedllm::kernels
