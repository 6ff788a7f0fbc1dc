// stream_read_sum: a memory read-bandwidth probe for the benchmarks (what the attention
// kernels are measured against). Each task sums 1 MiB with 16 independent accumulators.
#include <algorithm>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pagedllm::kernels {

double stream_read_sum(const float* data, int64_t n) {
  PAGEDLLM_CHECK_ARG(n >= 0, "n must be >= 0");
  constexpr int64_t kPiece = 1 << 18;  // floats per task (1 MiB)
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  std::vector<double> partial(static_cast<size_t>(pieces), 0.0);
  parallel_for(pieces, [&](int64_t piece, int) {
    const int64_t begin = piece * kPiece;
    const int64_t end = std::min(n, begin + kPiece);
    float acc[16] = {};
    int64_t i = begin;
    for (; i + 16 <= end; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += data[i + j];
    double s = 0.0;
    for (; i < end; ++i) s += data[i];
    for (float a : acc) s += a;
    partial[piece] = s;
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace pagedllm::kernels
