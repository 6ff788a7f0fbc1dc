# Bindings of the CUDA kernels (pagedllm._core.cuda): included from
# python/bindings/CMakeLists.txt when PAGEDLLM_WITH_CUDA is set. The DLPack import
# (dlpack_tensor.cpp) comes with the CPU kernels' bindings (kernels_sources.cmake).
target_sources(_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/bind_cuda.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cuda_tensors.cpp
)
