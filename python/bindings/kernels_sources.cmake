# Bindings of the CPU kernels: included from python/bindings/CMakeLists.txt.
target_sources(_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/bind_kernels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bind_sparse.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bind_cross.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bind_fused.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bind_linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bind_decoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dlpack_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernel_args.cpp
)
target_compile_definitions(_core PRIVATE PAGEDLLM_WITH_KERNELS=1)
