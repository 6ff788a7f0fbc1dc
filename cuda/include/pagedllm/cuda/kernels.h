// pagedllm/cuda/kernels.h — the CUDA kernels of the paged KV cache, with the contracts of the
// CPU kernels (pagedllm/kernels/kernels.h): the same params structs, layouts and numerics
// (float32 accumulation; fp8 stored as x / scale, saturated; a context of 0 gives zeros).
//
// Every pointer in the params is device memory of the current device, except in swap_blocks
// (one side may be host memory) and the pair lists (see each function). Calls are asynchronous
// on `stream` (nullptr = the legacy default stream) unless stated otherwise.
//
// Bad values that live in device memory (context lengths, block ids, slots, cu_seqlens_q) are
// checked by the kernels themselves: an offending sequence or token is skipped (attention
// outputs of that sequence are NaN) and the first error is recorded on the device. In
// Validation::kSync mode (the default) each call then waits for its stream and throws
// pagedllm::Error naming the value, like the CPU kernels; in kDeferred mode nothing waits and
// check_errors() throws the first recorded error later (once per engine step, say). No input
// makes a kernel read or write outside the tensors the params describe.
// Limits: attention head_dim in {64, 80, 96, 128, 256}; reshape_and_cache any multiple of 8
// up to 512; block_size 1..256; cache base pointers and block strides 16-byte aligned.
// Thread-safety: calls on different streams may run concurrently; the attention workspace is
// per stream.
#pragma once

#include <cstdint>

#include "pagedllm/kernels/params.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header does not need the CUDA headers

namespace pagedllm::cuda {

using Stream = CUstream_st*;

// When kernel-side argument checks are reported (see the header comment).
enum class Validation { kSync, kDeferred };

// Sets / reads the process-wide validation mode.
void set_validation(Validation mode);
Validation validation();

// Throws the first error recorded by any kernel on `device` since the last check, then clears
// it. Waits for all work on the device first.
void check_errors(int device);

// reshape_and_cache on the GPU; slot_mapping is device memory.
void reshape_and_cache(const kernels::ReshapeAndCacheParams& p, Stream stream);

// Decode attention: one query token per sequence (thread block per (sequence, KV head), split-K
// over long contexts with a merge kernel). block_tables / context_lens are device memory.
void paged_attention_decode(const kernels::AttentionParams& p, Stream stream);

// Causal prefill over paged K/V with cached prefixes (tensor cores for fp16/bf16/fp8 caches).
// block_tables / context_lens / cu_seqlens_q are device memory.
void paged_attention_prefill(const kernels::AttentionParams& p, Stream stream);

// Cross-attention (Mllama) with the CPU kernel's contract (kernels.h): the packed query tokens
// of each sequence attend, non-causally, the keys kv_ranges[2i] <= j < kv_ranges[2i + 1] of
// its cross block table (an empty range gives zeros). block_tables / context_lens /
// cu_seqlens_q / kv_ranges ([num_tokens, 2] int32) are device memory; a bad range is recorded
// (that token's tile of rows is NaN; kSync throws naming kv_ranges[i]). Tensor cores as in
// prefill; float32 caches, and one token per sequence (decode), run the split-K kernel.
void paged_cross_attention(const kernels::AttentionParams& p, const int32_t* kv_ranges,
                           Stream stream);

// Decode attention over only the logical blocks listed per sequence (or per (sequence, KV
// head)) in `sparse` (CSR, device memory; the CPU kernels' contract: on all blocks it equals
// the dense call). Lists are checked on the device (ids inside the used blocks, strictly
// increasing); a bad list's outputs are NaN and the error is recorded.
void paged_attention_decode_sparse(const kernels::AttentionParams& p,
                                   const kernels::BlockSparseParams& sparse, Stream stream);

// Causal prefill over the listed blocks only (the split-K SIMT path, one row per query token).
void paged_attention_prefill_sparse(const kernels::AttentionParams& p,
                                    const kernels::BlockSparseParams& sparse, Stream stream);

// copy_blocks on the GPU. `p.pairs` is HOST memory, checked here like the CPU kernel
// (ids in range, destinations distinct and not sources) and uploaded on `stream`.
void copy_blocks(const kernels::CopyBlocksParams& p, Stream stream);

// Same with the pairs already in device memory ([num_pairs, 2] int64); ids are range-checked
// on the device (distinctness is the caller's contract).
void copy_blocks_device_pairs(const kernels::CopyBlocksParams& p, Stream stream);

// swap_blocks between any two of device / pinned host / pageable host memory: one
// cudaMemcpyAsync per run of consecutive blocks. `p.pairs` is host memory, checked here.
// Asynchronous on `stream`; pageable host memory makes the copies synchronous.
void swap_blocks(const kernels::SwapBlocksParams& p, Stream stream);

// Blocks until all work queued on `stream` (of the current device) has finished.
void synchronize_stream(Stream stream);

// Head dims the attention kernels are compiled for.
bool attention_head_dim_supported(int head_dim);

}  // namespace pagedllm::cuda
