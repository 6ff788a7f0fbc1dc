// The choice of row loops for fused_ops.h (the attention engine's instruction set) and the row
// splitting its entry points share.
#include "fused_rows.h"

#include <algorithm>
#include <cstring>

#include "engine.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pagedllm::kernels {

const FusedRowOps& current_fused_rows() {
  const char* name = current_engine().name;
#ifdef PAGEDLLM_HAVE_AVX512_KERNELS
  // avx512_bf16 rounds only attention's dot products: its element-wise rows are avx512's
  if (std::strcmp(name, "avx512") == 0 || std::strcmp(name, "avx512_bf16") == 0) {
    return avx512_fused_rows();
  }
#endif
#ifdef PAGEDLLM_HAVE_AVX2_KERNELS
  if (std::strcmp(name, "avx2") == 0) return avx2_fused_rows();
#endif
  (void)name;
  return generic_fused_rows();
}

void for_row_groups(int64_t rows, int64_t row_elements, int64_t min_elements,
                    void (*fn)(const void* ctx, int64_t begin, int64_t end), const void* ctx) {
  if (rows <= 0) return;
  const int64_t rows_per_group = std::max<int64_t>(1, min_elements / std::max<int64_t>(1, row_elements));
  const int64_t groups = (rows + rows_per_group - 1) / rows_per_group;
  if (groups == 1 || get_num_threads() == 1) {
    fn(ctx, 0, rows);  // small inputs: no pool round trip
    return;
  }
  parallel_for(groups, [&](int64_t g, int) {
    fn(ctx, g * rows_per_group, std::min(rows, (g + 1) * rows_per_group));
  });
}

}  // namespace pagedllm::kernels
