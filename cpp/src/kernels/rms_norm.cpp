// rms_norm: a model's RMSNorm over rows of float32. One pass for the sum of squares (eight
// partial sums, so the compiler keeps them in vector registers), one for the scaled output.
// torch's rms_norm on this CPU takes 1-4 ms for 512 x 1024 (measured in docs/BENCHMARKS.md);
// this runs at memory speed. Rows are independent: the pool takes groups of them.
#include <algorithm>
#include <cmath>

#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"
#include "validate.h"

namespace pagedllm::kernels {
namespace {

constexpr int64_t kMinElementsPerTask = 1 << 17;  // below, a pool round trip costs more

void norm_row(const float* x, float* out, const float* w, int32_t cols, float eps) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += x[c + k] * x[c + k];
  }
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; c < cols; ++c) sum += x[c] * x[c];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(cols) + eps);
  for (int32_t i = 0; i < cols; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

void rms_norm(const RMSNormParams& p) {
  validate_rms_norm(p);
  if (p.rows == 0) return;
  const int64_t rows_per_task = std::max<int64_t>(1, kMinElementsPerTask / p.cols);
  const int64_t tasks = (p.rows + rows_per_task - 1) / rows_per_task;
  auto run = [&](int64_t task, int) {
    const int64_t end = std::min(p.rows, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < end; ++r) {
      norm_row(p.x + r * p.x_row_stride, p.out + r * p.out_row_stride, p.weight, p.cols, p.eps);
    }
  };
  if (tasks == 1) {
    run(0, 0);  // small inputs: no pool round trip
  } else {
    parallel_for(tasks, run);
  }
}

}  // namespace pagedllm::kernels
