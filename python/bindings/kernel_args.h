// kernel_args.h — turns borrowed tensors into the kernels' params structs, checking shapes,
// dtypes, devices and layout one line at a time (values such as block ids are checked later by
// the kernels themselves). Every check throws pagedllm::Error naming the argument.
// The CPU bindings call these with on_cpu = true (each tensor must be CPU memory); the CUDA
// bindings (cuda_tensors.h) check placement themselves and pass on_cpu = false, so both share
// one set of shape / dtype / layout rules.
// Thread-safety: call with the GIL held (the Tensors were borrowed under it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlpack_tensor.h"
#include "pagedllm/kernels/params.h"

namespace pagedllm::python {

// v as int32, or ValueError naming `what`.
int32_t to_i32(int64_t v, const char* what);

// The activation type of t (float32 / float16 / bfloat16), or ValueError.
kernels::ScalarType activation_type(const Tensor& t);

// One layer's caches [num_blocks, num_kv_heads, block_size, head_dim] (inner dims contiguous)
// under kv_cache_dtype ("auto" = the tensors' own float type; fp8 = uint8 / float8).
kernels::KVCacheParams cache_params(const Tensor& kc, const Tensor& vc,
                                    const std::string& kv_cache_dtype, double k_scale,
                                    double v_scale, bool on_cpu = true);

// Checks a [num_tokens, heads, head_dim] activation with a contiguous last dim (heads < 0: any).
void check_activation(const Tensor& t, int64_t heads, int64_t head_dim, bool on_cpu = true);

// Checks a contiguous 1-D int32 array of n elements (n < 0: any length).
void check_index_1d(const Tensor& t, int64_t n, bool on_cpu = true);

// Checks block tables: int32 [num_seqs, max_blocks_per_seq], rows contiguous; returns num_seqs.
int32_t check_block_tables(const Tensor& t, bool on_cpu = true);

// reshape_and_cache's params: writable caches (cache_params), key/value
// [num_tokens, num_kv_heads, head_dim] of one float type, slot_mapping int32/int64 [num_tokens].
kernels::ReshapeAndCacheParams reshape_and_cache_params(const Tensor& kt, const Tensor& vt,
                                                        const Tensor& kc, const Tensor& vc,
                                                        const Tensor& slots,
                                                        const std::string& kv_cache_dtype,
                                                        double k_scale, double v_scale,
                                                        bool on_cpu = true);

// The params shared by decode and prefill (all but cu_seqlens_q).
kernels::AttentionParams attention_params(const Tensor& out, const Tensor& q, const Tensor& kc,
                                          const Tensor& vc, const Tensor& tables,
                                          const Tensor& lens, double scale,
                                          const std::string& kv_cache_dtype, double k_scale,
                                          double v_scale, bool on_cpu = true);

// Checks kv_ranges: a contiguous [num_tokens, 2] int32 array (bind_cross.cpp).
void check_kv_ranges(const Tensor& t, int64_t num_tokens, bool on_cpu = true);

// Decode reads one query token per sequence: throws naming both counts when they differ.
void check_decode_rows(int64_t query_tokens, int64_t table_rows);

// [k, 2] int32 / int64 (src, dst) block pairs, as int64.
std::vector<int64_t> block_pairs(const Tensor& t, bool on_cpu = true);

// A writable CPU tensor whose first dim is blocks and whose other dims are contiguous.
kernels::BlockPoolParams block_pool(const Tensor& t, bool on_cpu = true);

}  // namespace pagedllm::python
