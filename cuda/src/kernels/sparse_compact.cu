// The block-sparse prologue of the split-K attention kernel: checks each CSR block list on the
// device and writes its compacted table (physical ids of the listed blocks, in order) and its
// selected-token count, so decode_kernel reads the listed blocks as one contiguous context
// (the CPU kernels' SparseView, cpp/src/kernels/block_sparse.h, in device form).
// One thread block per list.
#include "../cuda_check.h"
#include "attention_launch.h"

namespace pagedllm::cuda::detail {
namespace {

constexpr int kCompactThreads = 128;

__global__ void sparse_compact_kernel(const DecodeArgs a, int num_lists, int num_indices) {
  __shared__ int bad;
  const int l = blockIdx.x;
  const int seq = a.sparse_per_head ? l / a.num_kv_heads : l;
  const int begin = a.sparse_indptr[l];
  const int end = a.sparse_indptr[l + 1];
  const int len = a.context_lens[seq];
  const int capacity = a.max_blocks * a.block_size;
  const int used = len >= 0 && len <= capacity ? (len + a.block_size - 1) / a.block_size : 0;
  if (threadIdx.x == 0) {
    const bool shape_ok = begin >= 0 && end >= begin && end <= num_indices &&
                          (l != 0 || begin == 0) && (l != num_lists - 1 || end == num_indices);
    bad = shape_ok ? 0 : 1;
    if (!shape_ok) report_error(a.err, kErrSparseIndptr, a.kernel_id, l, begin, end, num_indices);
  }
  __syncthreads();
  if (bad == 0) {
    const int32_t* row = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
    auto* tables = const_cast<int32_t*>(a.sparse_tables);
    for (int j = begin + threadIdx.x; j < end; j += kCompactThreads) {
      const int b = a.sparse_indices[j];
      if (b < 0 || b >= used) {
        report_error(a.err, kErrSparseIndex, a.kernel_id, j, b, l, used);
        bad = 1;
      } else if (j > begin && b <= a.sparse_indices[j - 1]) {
        report_error(a.err, kErrSparseOrder, a.kernel_id, j, a.sparse_indices[j - 1], b);
        bad = 1;
      }
      tables[j] = (b >= 0 && b < used) ? row[b] : -1;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    auto* lens = const_cast<int32_t*>(a.sparse_lens);
    const int n = end - begin;
    const int last = n > 0 ? a.sparse_indices[end - 1] : 0;
    lens[l] = bad ? -1
                  : (n == 0 ? 0 : (n - 1) * a.block_size + min(a.block_size, len - last * a.block_size));
  }
}

}  // namespace

void launch_sparse_compact(const DecodeArgs& a, int num_lists, int num_indices,
                           cudaStream_t stream) {
  if (num_lists == 0) return;
  sparse_compact_kernel<<<num_lists, kCompactThreads, 0, stream>>>(a, num_lists, num_indices);
  PAGEDLLM_CUDA_CHECK_LAUNCH("block-sparse list compaction kernel");
}

}  // namespace pagedllm::cuda::detail
