// pagedllm/kernels/params.h — what the CPU kernels are given: raw pointers, strides, sizes.
//
// The kernels know nothing of Python or torch (FlashInfer's `paged_kv_t` style): a binding
// layer fills these structs from tensors and the kernel entry points (kernels.h) validate the
// values (ids inside the pool, lengths inside the tables) before touching any memory.
// All strides count elements of the array they index, not bytes.
//
// KV cache layout, per layer: [num_blocks, num_kv_heads, block_size, head_dim]. The inner three
// dims are contiguous (one (block, head) is one run of block_size * head_dim elements); the
// block dim may have any stride, so per-layer views of one block-major pool
// [num_blocks, num_layers, 2, num_kv_heads, block_size, head_dim] are valid caches.
// A slot is block_id * block_size + offset_in_block.
// Plain data, no inline code (safe to include from ISA-specific translation units).
#pragma once

#include <cstdint>

#include "pagedllm/kernels/dtypes.h"

namespace pagedllm::kernels {

// One layer's paged K and V caches.
struct KVCacheParams {
  void* key_cache = nullptr;        // [num_blocks, num_kv_heads, block_size, head_dim]
  void* value_cache = nullptr;      // same shape as key_cache
  int64_t key_block_stride = 0;     // elements between blocks of key_cache
  int64_t value_block_stride = 0;   // elements between blocks of value_cache
  CacheType dtype = CacheType::kFloat32;
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t block_size = 0;           // tokens per block, 1..256
  int32_t head_dim = 0;             // a multiple of 8, at most 512
  float k_scale = 1.0f;             // fp8 only: stored = key / k_scale, read = stored * k_scale
  float v_scale = 1.0f;             // fp8 only: same for values
};

// reshape_and_cache: writes new keys/values into their slots.
struct ReshapeAndCacheParams {
  const void* key = nullptr;        // [num_tokens, num_kv_heads, head_dim], last dim contiguous
  const void* value = nullptr;      // same shape as key
  ScalarType dtype = ScalarType::kFloat32;  // of key and value
  int64_t key_token_stride = 0;
  int64_t key_head_stride = 0;
  int64_t value_token_stride = 0;
  int64_t value_head_stride = 0;
  const void* slot_mapping = nullptr;  // [num_tokens] int32 or int64; -1 skips the token
  bool slot_mapping_int64 = false;
  int32_t num_tokens = 0;
  KVCacheParams cache;
};

// Paged attention. Decode: one query token per sequence (cu_seqlens_q == nullptr). Prefill:
// the new tokens of each sequence packed; query token i of a sequence with context length L and
// q_len Q sits at position L - Q + i and attends keys 0 .. L - Q + i (causal).
struct AttentionParams {
  void* out = nullptr;              // [num_tokens, num_heads, head_dim], last dim contiguous
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  const void* query = nullptr;      // [num_tokens, num_heads, head_dim], last dim contiguous
  int64_t query_token_stride = 0;
  int64_t query_head_stride = 0;
  ScalarType dtype = ScalarType::kFloat32;  // of query and out
  int32_t num_tokens = 0;           // decode: == num_seqs
  int32_t num_heads = 0;            // a multiple of cache.num_kv_heads (GQA / MQA)
  KVCacheParams cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t block_table_stride = 0;         // elements between rows of block_tables
  int32_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [num_seqs]: tokens in the cache, new ones included
  const int32_t* cu_seqlens_q = nullptr;  // prefill: [num_seqs + 1], 0 .. num_tokens
  int32_t num_seqs = 0;
  float scale = 1.0f;               // softmax scale, usually 1/sqrt(head_dim)
};

// One cache tensor whose first dim is blocks and whose rest is contiguous.
struct BlockPoolParams {
  void* data = nullptr;
  int64_t block_stride_bytes = 0;   // bytes between consecutive blocks
  int64_t block_bytes = 0;          // bytes of one block (its contiguous inner dims)
  int32_t num_blocks = 0;
};

// copy_blocks: block src -> block dst inside each of several pools (copy-on-write).
struct CopyBlocksParams {
  const BlockPoolParams* pools = nullptr;
  int32_t num_pools = 0;
  const int64_t* pairs = nullptr;   // [num_pairs, 2]: (src, dst)
  int32_t num_pairs = 0;
};

// swap_blocks: block src of one pool -> block dst of another (device <-> host later).
struct SwapBlocksParams {
  BlockPoolParams src;
  BlockPoolParams dst;
  const int64_t* pairs = nullptr;   // [num_pairs, 2]: (src id in src, dst id in dst)
  int32_t num_pairs = 0;
};

// rms_norm: out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), float32 (a model's RMSNorm).
struct RMSNormParams {
  const float* x = nullptr;         // [rows, cols], rows at x_row_stride, cols contiguous
  int64_t x_row_stride = 0;
  float* out = nullptr;             // [rows, cols]; may be x itself
  int64_t out_row_stride = 0;
  const float* weight = nullptr;    // [cols]
  int64_t rows = 0;
  int32_t cols = 0;
  float eps = 0.0f;
};

// Block-sparse attention (FlashInfer's CSR convention): which logical blocks of each sequence
// a query attends to. List l covers sequence l (one list per sequence: every KV head reads the
// same blocks) or, with num_seqs * num_kv_heads lists, the pair (l / num_kv_heads,
// l % num_kv_heads). A list's logical block ids are strictly increasing and inside the blocks
// its sequence's context uses; the rest of the context is skipped. All blocks = dense.
struct BlockSparseParams {
  const int32_t* indptr = nullptr;   // [num_lists + 1]: list l is indices[indptr[l], indptr[l+1])
  int32_t num_lists = 0;             // num_seqs or num_seqs * num_kv_heads
  const int32_t* indices = nullptr;  // [num_indices] logical block ids
  int32_t num_indices = 0;
};

// quest_select: per (sequence, KV head) the blocks with the largest upper bound of q.k (Quest),
// from per-block key bounds; the caller sizes the output lists (out_indptr).
struct QuestSelectParams {
  const void* query = nullptr;         // [num_seqs, num_heads, head_dim], last dim contiguous
  ScalarType dtype = ScalarType::kFloat32;
  int64_t query_token_stride = 0;
  int64_t query_head_stride = 0;
  int32_t num_heads = 0;
  const void* key_min = nullptr;       // [num_blocks, num_kv_heads, head_dim], last dim contiguous
  const void* key_max = nullptr;       // same layout and strides as key_min
  int64_t bound_block_stride = 0;      // elements
  int64_t bound_head_stride = 0;
  CacheType bound_dtype = CacheType::kFloat32;
  int32_t num_blocks = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t block_table_stride = 0;
  int32_t max_blocks_per_seq = 0;
  const int32_t* num_seq_blocks = nullptr;  // [num_seqs] blocks each sequence uses
  const int32_t* budget = nullptr;        // [num_seqs] blocks per KV head; 0: the forced list
  const int32_t* forced_indptr = nullptr; // [num_seqs + 1] CSR of the always-read blocks
  const int32_t* forced_indices = nullptr;
  int32_t num_forced = 0;
  int32_t num_seqs = 0;
  const int32_t* out_indptr = nullptr;    // [num_seqs * num_kv_heads + 1]
  int32_t* out_indices = nullptr;         // [out_indptr[-1]]
  int32_t num_out = 0;
};

}  // namespace pagedllm::kernels
