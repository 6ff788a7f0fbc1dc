// validate.h (internal) — the value checks every kernel entry point runs before any write.
// Each throws pagedllm::Error naming the offending argument and the expected range. The CUDA
// kernels (cuda/) run the same checks on the host for everything that lives in host memory.
// Thread-safety: read-only.
#pragma once

#include "pagedllm/kernels/params.h"

namespace pagedllm::kernels {

// Sizes, pointers and scales of one layer's caches.
void validate_cache(const KVCacheParams& c);

// The fields of attention held in the params themselves (no array is read): the GQA ratio, a
// finite scale, non-negative sizes, one query per sequence in decode, cu_seqlens_q in prefill.
void validate_attention_sizes(const AttentionParams& p, bool prefill);

// Sizes of the query/output, the GQA ratio, and per sequence: context length inside the table,
// the blocks it uses inside the pool; prefill also cu_seqlens_q (0, non-decreasing, ends at
// num_tokens, each q_len <= its context length). check_tables false skips the block ids (a
// block-sparse call checks only the listed ones: see block_sparse.h).
void validate_attention(const AttentionParams& p, bool prefill, bool check_tables = true);

// paged_cross_attention: the cache, sizes, cu_seqlens_q (0, non-decreasing, ends at
// num_tokens; q_len is not bounded by the context), context lengths inside the table, the
// blocks they use inside the pool, and each token's kv range 0 <= lo <= hi <= its sequence's
// context length.
void validate_cross_attention(const AttentionParams& p, const int32_t* kv_ranges);

// Sizes of key/value and every slot in [-1, num_blocks * block_size).
void validate_reshape_and_cache(const ReshapeAndCacheParams& p);

// Sizes, pointers and eps of rms_norm (eps finite and >= 0, strides >= cols).
void validate_rms_norm(const RMSNormParams& p);

// One block pool: non-negative size, a positive block size, data unless empty, blocks that do
// not overlap (stride >= block bytes).
void validate_block_pool(const BlockPoolParams& b, const char* name);

// Pool sizes and pair ids; copy: destinations distinct and not sources.
void validate_copy_blocks(const CopyBlocksParams& p);
void validate_swap_blocks(const SwapBlocksParams& p);

}  // namespace pagedllm::kernels
