// rms_norm: a model's RMSNorm over rows of float32, the vectorised row loop of add_rms_norm
// (fused_norm.cpp) with no residual. torch's rms_norm on this CPU takes 1-4 ms for 512 x 1024
// (measured in docs/BENCHMARKS.md); this runs at memory speed. Rows are independent: the pool
// takes groups of them.
#include "pagedllm/kernels/fused_ops.h"
#include "pagedllm/kernels/kernels.h"
#include "validate.h"

namespace pagedllm::kernels {

void rms_norm(const RMSNormParams& p) {
  validate_rms_norm(p);
  AddRMSNormParams a;
  a.dtype = ScalarType::kFloat32;
  a.x = const_cast<float*>(p.x);  // not written: there is no delta
  a.x_row_stride = p.x_row_stride;
  a.out = p.out;
  a.out_row_stride = p.out_row_stride;
  a.weight = p.weight;
  a.rows = p.rows;
  a.cols = p.cols;
  a.eps = p.eps;
  add_rms_norm(a);
}

}  // namespace pagedllm::kernels
