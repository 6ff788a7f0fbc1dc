// Decode kernels for head_dim 256, every storage type (see decode_kernel.cuh).
#include "decode_kernel.cuh"

namespace pagedllm::cuda::detail {
PAGEDLLM_INSTANTIATE_DECODE(256)
}  // namespace pagedllm::cuda::detail
