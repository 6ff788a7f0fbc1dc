// attention_launch.h (internal) — the plain argument structs of the attention kernels and the
// per-(storage type, head dim) launchers. Each launcher is explicitly instantiated in one
// decode_hd*.cu / prefill_hd*.cu file (one head dim per file, so the builds run in parallel),
// and attention.cu dispatches to them with one switch over head dim and storage type.
// Thread-safety: plain data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../device_error.h"
#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::cuda::detail {

// Arguments of the split-K decode kernel (also the SIMT prefill path when cu_seqlens_q is set:
// then each query token is one "sequence row" whose key limit is its causal position + 1).
struct DecodeArgs {
  const void* q;                 // [num_tokens, num_heads, head_dim]
  int64_t q_token_stride, q_head_stride;
  void* out;                     // [num_tokens, num_heads, head_dim]
  int64_t out_token_stride, out_head_stride;
  kernels::ScalarType act;       // of q and out
  const uint8_t* key_cache;      // [num_blocks, num_kv_heads, block_size, head_dim]
  const uint8_t* value_cache;
  int64_t key_block_stride;      // bytes
  int64_t value_block_stride;
  int num_blocks, num_kv_heads, block_size;
  int num_heads, group, head_chunks;  // group = num_heads / num_kv_heads; chunks of block_heads
  int block_heads;                   // query heads per thread block: decode_heads_per_block
  const int32_t* block_tables;   // [num_seqs, max_blocks]
  int64_t block_table_stride;
  int max_blocks;
  const int32_t* context_lens;   // [num_seqs]
  const int32_t* cu_seqlens_q;   // [num_seqs + 1] (SIMT prefill) or nullptr (decode)
  int num_seqs, num_tokens;
  float q_mul;                   // softmax scale (times k_scale for fp8)
  float v_mul;                   // v_scale for fp8, else 1
  int part_len, num_parts;       // split-K partitions of each context
  float* part_acc;               // [num_tokens, num_heads, num_parts, head_dim] (num_parts > 1)
  float* part_stats;             // [num_tokens, num_heads, num_parts, 2]: running max, sum
  DeviceError* err;
  int kernel_id;
  // Block-sparse (all null for dense): list l = seq, or seq * num_kv_heads + kv head when
  // sparse_per_head; its compacted table is sparse_tables + sparse_indptr[l] (physical ids of
  // the listed blocks) and sparse_lens[l] its selected tokens (-1: a bad list, skipped).
  const int32_t* sparse_indptr;
  const int32_t* sparse_indices;
  const int32_t* sparse_tables;  // [num_indices]
  const int32_t* sparse_lens;    // [num_lists]
  int sparse_per_head;
  // Cross-attention (null otherwise; needs cu_seqlens_q): [num_tokens, 2] key range [lo, hi)
  // of each query token, non-causal; q_len is then not bounded by the context length.
  const int32_t* kv_ranges;
};

// Arguments of the tensor-core prefill kernel.
struct PrefillArgs {
  const void* q;
  int64_t q_token_stride, q_head_stride;
  void* out;
  int64_t out_token_stride, out_head_stride;
  kernels::ScalarType act;
  const uint8_t* key_cache;
  const uint8_t* value_cache;
  int64_t key_block_stride, value_block_stride;  // bytes
  int num_blocks, num_kv_heads, block_size;
  int num_heads, group;
  int tokens_per_tile;           // query tokens per 64-row tile (64 / group, rounded down)
  const int32_t* block_tables;
  int64_t block_table_stride;
  int max_blocks;
  const int32_t* context_lens;
  const int32_t* cu_seqlens_q;
  int num_seqs, num_tokens;
  float q_mul, v_mul;
  const int2* tiles;             // [*num_tiles]: (sequence, first query token of the tile)
  const int* num_tiles;
  DeviceError* err;
  const int32_t* kv_ranges;      // cross-attention ranges (as in DecodeArgs), or null: causal
};

// Constants shared by the launchers and the host planner.
constexpr int kDecodeThreads = 128;
constexpr int kDecodeMaxHeads = 8;     // query heads served per thread block, at most

// The decode kernel's heads per thread block for a GQA group: 1 (MHA), 4 (groups of 2 to 4),
// else kDecodeMaxHeads (larger groups in chunks of 8).
constexpr int decode_heads_per_block(int group) {
  return group <= 1 ? 1 : group <= 4 ? 4 : kDecodeMaxHeads;
}
constexpr int kMaxParts = 128;         // split-K partitions per context
constexpr int kMinPartition = 256;     // tokens: shorter partitions cost more to merge
constexpr int kPrefillRows = 64;       // query rows (tokens x GQA group) per prefill tile
constexpr int kPrefillThreads = 128;

template <kernels::CacheType CT, int HD>
void launch_decode(const DecodeArgs& a, cudaStream_t stream);

// Checks the CSR lists on the device (indptr shape, ids inside each sequence's used blocks,
// strictly increasing; errors recorded, the list's length set to -1) and writes each list's
// compacted table (a.sparse_tables) and selected-token count (a.sparse_lens).
void launch_sparse_compact(const DecodeArgs& a, int num_lists, int num_indices,
                           cudaStream_t stream);

template <kernels::CacheType CT, int HD>
void launch_prefill(const PrefillArgs& a, int max_tiles, cudaStream_t stream);


}  // namespace pagedllm::cuda::detail
