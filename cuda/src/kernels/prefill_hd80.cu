// Tensor-core prefill kernels for head_dim 80 (see prefill_kernel.cuh).
#include "prefill_kernel.cuh"

namespace pagedllm::cuda::detail {
PAGEDLLM_INSTANTIATE_PREFILL(80)
}  // namespace pagedllm::cuda::detail
