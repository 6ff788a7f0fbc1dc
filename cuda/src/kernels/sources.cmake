# The CUDA kernels: included from cuda/CMakeLists.txt inside the pagedllm_cuda scope.
# The attention kernels are instantiated one head dim per file (decode: 5 storage types each;
# prefill: 4), so a parallel build spreads them over the cores.
set(_pagedllm_cuda_kernels_dir ${CMAKE_CURRENT_LIST_DIR})
target_sources(pagedllm_cuda PRIVATE
  ${_pagedllm_cuda_kernels_dir}/host_checks.cu
  ${_pagedllm_cuda_kernels_dir}/reshape_and_cache.cu
  ${_pagedllm_cuda_kernels_dir}/block_copy.cu
  ${_pagedllm_cuda_kernels_dir}/attention.cu
  ${_pagedllm_cuda_kernels_dir}/sparse_compact.cu
)
foreach(_hd 64 80 96 128 256)
  target_sources(pagedllm_cuda PRIVATE
    ${_pagedllm_cuda_kernels_dir}/decode_hd${_hd}.cu
    ${_pagedllm_cuda_kernels_dir}/prefill_hd${_hd}.cu)
endforeach()
