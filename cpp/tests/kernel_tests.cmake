# CPU kernel tests: included from cpp/tests/CMakeLists.txt (target pagedllm_core_tests).
target_sources(pagedllm_core_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/test_kernels.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_kernel_engines.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_engine_tasks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_kernel_cross.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_fused_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_decoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_thread_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_membw.cpp)
