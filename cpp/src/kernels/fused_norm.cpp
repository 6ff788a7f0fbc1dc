// add_rms_norm: residual add + RMSNorm in one call (vLLM's fused_add_rms_norm), float32 and
// bfloat16; with no delta, a plain RMSNorm (rms_norm.cpp's float32 entry point comes here too).
#include <cmath>

#include "fused_rows.h"
#include "pagedllm/error.h"
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"

namespace pagedllm::kernels {
namespace {

constexpr int64_t kMinElementsPerGroup = 1 << 17;  // below, a pool round trip costs more

void validate(const AddRMSNormParams& p) {
  PAGEDLLM_CHECK_ARG(p.dtype == ScalarType::kFloat32 || p.dtype == ScalarType::kBFloat16,
                     "rms_norm: dtype must be float32 or bfloat16, got "
                         << scalar_type_name(p.dtype));
  PAGEDLLM_CHECK_ARG(p.rows >= 0, "rms_norm: rows must be >= 0, got " << p.rows);
  PAGEDLLM_CHECK_ARG(p.cols >= 1, "rms_norm: cols must be >= 1, got " << p.cols);
  PAGEDLLM_CHECK_ARG(std::isfinite(p.eps) && p.eps >= 0.0f,
                     "rms_norm: eps must be finite and >= 0, got " << p.eps);
  PAGEDLLM_CHECK_ARG(p.x_row_stride >= p.cols && p.out_row_stride >= p.cols &&
                         (p.delta == nullptr || p.delta_row_stride >= p.cols),
                     "rms_norm: row strides (x " << p.x_row_stride << ", out " << p.out_row_stride
                                                 << ", delta " << p.delta_row_stride
                                                 << ") must be >= cols (" << p.cols << ")");
  PAGEDLLM_CHECK_ARG(p.rows == 0 || (p.x && p.out && p.weight), "rms_norm: data is null");
}

template <class T>
void run_rows(const AddRMSNormParams& p,
              void (*row)(T*, const T*, T*, const T*, int32_t, float)) {
  struct Ctx {
    const AddRMSNormParams* p;
    void (*row)(T*, const T*, T*, const T*, int32_t, float);
  } ctx{&p, row};
  for_row_groups(p.rows, p.cols, kMinElementsPerGroup, [](const void* c, int64_t b, int64_t e) {
    const Ctx& k = *static_cast<const Ctx*>(c);
    const AddRMSNormParams& q = *k.p;
    for (int64_t r = b; r < e; ++r) {
      const T* d = q.delta ? static_cast<const T*>(q.delta) + r * q.delta_row_stride : nullptr;
      k.row(static_cast<T*>(q.x) + r * q.x_row_stride, d,
            static_cast<T*>(q.out) + r * q.out_row_stride, static_cast<const T*>(q.weight),
            q.cols, q.eps);
    }
  }, &ctx);
}

}  // namespace

void add_rms_norm(const AddRMSNormParams& p) {
  validate(p);
  const FusedRowOps& ops = current_fused_rows();
  if (p.dtype == ScalarType::kFloat32) {
    run_rows<float>(p, ops.add_rms_norm_f32);
  } else {
    run_rows<uint16_t>(p, ops.add_rms_norm_bf16);
  }
}

}  // namespace pagedllm::kernels
