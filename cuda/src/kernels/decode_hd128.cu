// Decode kernels for head_dim 128, every storage type (see decode_kernel.cuh).
#include "decode_kernel.cuh"

namespace pagedllm::cuda::detail {
PAGEDLLM_INSTANTIATE_DECODE(128)
}  // namespace pagedllm::cuda::detail
