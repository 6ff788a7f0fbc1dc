// Tensor-core prefill kernels for head_dim 128 (see prefill_kernel.cuh).
#include "prefill_kernel.cuh"

namespace pagedllm::cuda::detail {
PAGEDLLM_INSTANTIATE_PREFILL(128)
}  // namespace pagedllm::cuda::detail
