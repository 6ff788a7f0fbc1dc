# CPU paged-attention kernels: included from cpp/CMakeLists.txt inside the pagedllm_core scope.
# engine_avx2.cpp, engine_avx512.cpp, engine_avx512_bf16.cpp, fused_rows_{avx2,avx512}.cpp,
# linear_avx2.cpp and linear_avx512{,_bf16}.cpp are the only translation units compiled with ISA
# flags; the kernels choose one at run time after checking the CPU (see attention.cpp), so the
# library still runs anywhere.
set(_pagedllm_kernels_dir ${CMAKE_CURRENT_LIST_DIR})
target_sources(pagedllm_core PRIVATE
  ${_pagedllm_kernels_dir}/thread_pool.cpp
  ${_pagedllm_kernels_dir}/convert.cpp
  ${_pagedllm_kernels_dir}/validate.cpp
  ${_pagedllm_kernels_dir}/engine_generic.cpp
  ${_pagedllm_kernels_dir}/attention_rows.cpp
  ${_pagedllm_kernels_dir}/attention.cpp
  ${_pagedllm_kernels_dir}/cross_attention.cpp
  ${_pagedllm_kernels_dir}/block_sparse.cpp
  ${_pagedllm_kernels_dir}/quest_select.cpp
  ${_pagedllm_kernels_dir}/reshape_and_cache.cpp
  ${_pagedllm_kernels_dir}/copy_blocks.cpp
  ${_pagedllm_kernels_dir}/rms_norm.cpp
  ${_pagedllm_kernels_dir}/fused_norm.cpp
  ${_pagedllm_kernels_dir}/activation.cpp
  ${_pagedllm_kernels_dir}/rope.cpp
  ${_pagedllm_kernels_dir}/argmax.cpp
  ${_pagedllm_kernels_dir}/token_rows.cpp
  ${_pagedllm_kernels_dir}/fused_rows.cpp
  ${_pagedllm_kernels_dir}/fused_rows_generic.cpp
  ${_pagedllm_kernels_dir}/membw.cpp
  ${_pagedllm_kernels_dir}/linear.cpp
  ${_pagedllm_kernels_dir}/decoder.cpp
)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86)$")
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/engine_avx2.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/engine_avx2.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  target_compile_definitions(pagedllm_core PRIVATE PAGEDLLM_HAVE_AVX2_KERNELS)
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/linear_avx2.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/linear_avx2.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/engine_avx512.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/engine_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
  target_compile_definitions(pagedllm_core PRIVATE PAGEDLLM_HAVE_AVX512_KERNELS)
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/engine_avx512_bf16.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/engine_avx512_bf16.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512bf16;-mavx512vbmi;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
  target_compile_definitions(pagedllm_core PRIVATE PAGEDLLM_HAVE_AVX512_BF16_KERNELS)
  # linear.h's register tiles: float32 with the avx512 engine's flags, bfloat16 with AVX512_BF16.
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/linear_avx512.cpp
                                       ${_pagedllm_kernels_dir}/linear_avx512_bf16.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/linear_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
  set_source_files_properties(${_pagedllm_kernels_dir}/linear_avx512_bf16.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512bf16;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c")
  # The fused element-wise row loops (fused_ops.h), one per instruction set; no contraction of
  # mul + add into FMA, so they round as the torch expressions they replace.
  target_sources(pagedllm_core PRIVATE ${_pagedllm_kernels_dir}/fused_rows_avx2.cpp
                                       ${_pagedllm_kernels_dir}/fused_rows_avx512.cpp)
  set_source_files_properties(${_pagedllm_kernels_dir}/fused_rows_avx2.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-ffp-contract=off")
  set_source_files_properties(${_pagedllm_kernels_dir}/fused_rows_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-ffp-contract=off")
endif()
set_source_files_properties(${_pagedllm_kernels_dir}/fused_rows_generic.cpp PROPERTIES
  COMPILE_OPTIONS "-ffp-contract=off")
