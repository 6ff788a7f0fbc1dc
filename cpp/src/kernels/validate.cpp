#include "validate.h"

#include <cmath>
#include <unordered_set>

#include "pagedllm/error.h"

namespace pagedllm::kernels {
namespace {

void check_scale(float v, const char* name) {
  PAGEDLLM_CHECK_ARG(std::isfinite(v) && v > 0.0f, name << " must be finite and > 0, got " << v);
}

// Checks that pair ids are inside [0, limit); `which` is 0 (src) or 1 (dst).
void check_pair_ids(const int64_t* pairs, int32_t n, int which, int32_t limit, const char* name) {
  for (int32_t i = 0; i < n; ++i) {
    const int64_t id = pairs[2 * i + which];
    PAGEDLLM_CHECK_INDEX(id >= 0 && id < limit, "block_mapping[" << i << "][" << which << "] = "
                                                    << id << " is outside " << name
                                                    << " blocks [0, " << limit << ")");
  }
}

void check_unique_dst(const int64_t* pairs, int32_t n, bool dst_not_src) {
  std::unordered_set<int64_t> dst;
  for (int32_t i = 0; i < n; ++i) {
    PAGEDLLM_CHECK_ARG(dst.insert(pairs[2 * i + 1]).second,
                       "block_mapping: destination block " << pairs[2 * i + 1]
                                                           << " appears twice");
  }
  if (!dst_not_src) return;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t src = pairs[2 * i];
    PAGEDLLM_CHECK_ARG(src == pairs[2 * i + 1] || dst.count(src) == 0,
                       "block_mapping: block " << src
                                               << " is both a source and a destination");
  }
}

}  // namespace

void validate_block_pool(const BlockPoolParams& b, const char* name) {
  PAGEDLLM_CHECK_ARG(b.num_blocks >= 0, name << ": num_blocks must be >= 0, got " << b.num_blocks);
  PAGEDLLM_CHECK_ARG(b.block_bytes > 0, name << ": a block must hold at least one byte");
  PAGEDLLM_CHECK_ARG(b.data != nullptr || b.num_blocks == 0, name << ": data is null");
  // A block is copied whole (block_bytes from block_id * block_stride_bytes): blocks closer
  // than that overlap, and a copy would read and write the same bytes.
  PAGEDLLM_CHECK_ARG(b.num_blocks <= 1 || b.block_stride_bytes >= b.block_bytes,
                     name << ": its " << b.num_blocks << " blocks overlap: the block stride is "
                          << b.block_stride_bytes << " bytes but a block holds " << b.block_bytes
                          << " bytes (the block dimension's stride must cover a whole block)");
}

void validate_cache(const KVCacheParams& c) {
  PAGEDLLM_CHECK_ARG(c.num_blocks >= 0, "num_blocks must be >= 0, got " << c.num_blocks);
  PAGEDLLM_CHECK_ARG(c.num_kv_heads >= 1, "num_kv_heads must be >= 1, got " << c.num_kv_heads);
  PAGEDLLM_CHECK_ARG(c.block_size >= 1 && c.block_size <= 256,
                     "block_size must be in [1, 256], got " << c.block_size);
  PAGEDLLM_CHECK_ARG(c.head_dim >= 8 && c.head_dim <= 512 && c.head_dim % 8 == 0,
                     "head_dim must be a multiple of 8 in [8, 512], got " << c.head_dim);
  PAGEDLLM_CHECK_ARG(c.num_blocks == 0 || (c.key_cache && c.value_cache), "cache data is null");
  check_scale(c.k_scale, "k_scale");
  check_scale(c.v_scale, "v_scale");
}

void validate_attention_sizes(const AttentionParams& p, bool prefill) {
  const int32_t kvh = p.cache.num_kv_heads;
  PAGEDLLM_CHECK_ARG(p.num_heads >= 1 && p.num_heads % kvh == 0,
                     "num_heads (" << p.num_heads << ") must be a positive multiple of num_kv_heads ("
                                   << kvh << ")");
  PAGEDLLM_CHECK_ARG(std::isfinite(p.scale), "scale must be finite, got " << p.scale);
  PAGEDLLM_CHECK_ARG(p.num_seqs >= 0 && p.num_tokens >= 0, "negative num_seqs or num_tokens");
  PAGEDLLM_CHECK_ARG(p.max_blocks_per_seq >= 0, "max_blocks_per_seq must be >= 0");
  if (!prefill) {
    PAGEDLLM_CHECK_ARG(p.num_tokens == p.num_seqs, "decode takes one query per sequence: "
                                                       << p.num_tokens << " queries for "
                                                       << p.num_seqs << " sequences");
  } else {
    PAGEDLLM_CHECK_ARG(p.cu_seqlens_q != nullptr, "prefill needs cu_seqlens_q");
  }
}

namespace {

// cu_seqlens_q starts at 0, ends at num_tokens and never decreases.
void check_cu_seqlens(const AttentionParams& p) {
  PAGEDLLM_CHECK_ARG(p.cu_seqlens_q[0] == 0, "cu_seqlens_q[0] must be 0, got "
                                                 << p.cu_seqlens_q[0]);
  PAGEDLLM_CHECK_ARG(p.cu_seqlens_q[p.num_seqs] == p.num_tokens,
                     "cu_seqlens_q[-1] must equal the number of query tokens ("
                         << p.num_tokens << "), got " << p.cu_seqlens_q[p.num_seqs]);
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    PAGEDLLM_CHECK_ARG(p.cu_seqlens_q[s + 1] >= p.cu_seqlens_q[s],
                       "cu_seqlens_q must be non-decreasing (at " << s << ")");
  }
}

// context_lens[s] inside the table; with check_tables, the blocks it uses inside the pool.
void check_context(const AttentionParams& p, int32_t s, bool check_tables) {
  const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.cache.block_size;
  const int32_t len = p.context_lens[s];
  PAGEDLLM_CHECK_ARG(len >= 0 && len <= capacity,
                     "context_lens[" << s << "] = " << len << " is outside [0, " << capacity
                                     << "] (max_blocks_per_seq * block_size)");
  if (!check_tables) return;
  const int32_t* row = p.block_tables + static_cast<int64_t>(s) * p.block_table_stride;
  // int64: len + block_size - 1 overflows int32 for a context near 2^31 (no entry was checked).
  const int64_t used = (int64_t{len} + p.cache.block_size - 1) / p.cache.block_size;
  for (int64_t b = 0; b < used; ++b) {
    PAGEDLLM_CHECK_INDEX(row[b] >= 0 && row[b] < p.cache.num_blocks,
                         "block_tables[" << s << "][" << b << "] = " << row[b]
                                         << " is outside the pool [0, " << p.cache.num_blocks
                                         << ")");
  }
}

}  // namespace

void validate_attention(const AttentionParams& p, bool prefill, bool check_tables) {
  validate_cache(p.cache);
  validate_attention_sizes(p, prefill);
  if (prefill) check_cu_seqlens(p);
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    check_context(p, s, check_tables);
    if (!prefill) continue;
    const int32_t len = p.context_lens[s];
    const int32_t q_len = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
    PAGEDLLM_CHECK_ARG(q_len <= len, "sequence " << s << " has " << q_len
                                                 << " query tokens but a context of only " << len
                                                 << " (new tokens must be cached first)");
  }
}

void validate_cross_attention(const AttentionParams& p, const int32_t* kv_ranges) {
  validate_cache(p.cache);
  validate_attention_sizes(p, /*prefill=*/true);
  PAGEDLLM_CHECK_ARG(p.num_tokens == 0 || kv_ranges != nullptr, "kv_ranges is null");
  check_cu_seqlens(p);
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    check_context(p, s, /*check_tables=*/true);
    const int32_t len = p.context_lens[s];
    for (int32_t i = p.cu_seqlens_q[s]; i < p.cu_seqlens_q[s + 1]; ++i) {
      const int32_t lo = kv_ranges[2 * static_cast<int64_t>(i)];
      const int32_t hi = kv_ranges[2 * static_cast<int64_t>(i) + 1];
      PAGEDLLM_CHECK_ARG(lo <= hi, "kv_ranges[" << i << "] = (" << lo << ", " << hi
                                                << "): lo must be <= hi");
      PAGEDLLM_CHECK_INDEX(lo >= 0 && hi <= len,
                           "kv_ranges[" << i << "] = (" << lo << ", " << hi
                                        << ") is outside [0, " << len << "] (context_lens["
                                        << s << "], the cross tokens of query token " << i
                                        << "'s sequence)");
    }
  }
}

void validate_reshape_and_cache(const ReshapeAndCacheParams& p) {
  validate_cache(p.cache);
  PAGEDLLM_CHECK_ARG(p.num_tokens >= 0, "num_tokens must be >= 0");
  const int64_t num_slots = static_cast<int64_t>(p.cache.num_blocks) * p.cache.block_size;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping_int64 ? static_cast<const int64_t*>(p.slot_mapping)[t]
                                              : static_cast<const int32_t*>(p.slot_mapping)[t];
    PAGEDLLM_CHECK_INDEX(slot >= -1 && slot < num_slots,
                         "slot_mapping[" << t << "] = " << slot << " is outside [0, " << num_slots
                                         << ") (num_blocks * block_size; -1 skips a token)");
  }
}

void validate_rms_norm(const RMSNormParams& p) {
  PAGEDLLM_CHECK_ARG(p.rows >= 0, "rms_norm: rows must be >= 0, got " << p.rows);
  PAGEDLLM_CHECK_ARG(p.cols >= 1, "rms_norm: cols must be >= 1, got " << p.cols);
  PAGEDLLM_CHECK_ARG(std::isfinite(p.eps) && p.eps >= 0.0f,
                     "rms_norm: eps must be finite and >= 0, got " << p.eps);
  PAGEDLLM_CHECK_ARG(p.x_row_stride >= p.cols && p.out_row_stride >= p.cols,
                     "rms_norm: row strides (" << p.x_row_stride << ", " << p.out_row_stride
                                               << ") must be >= cols (" << p.cols << ")");
  PAGEDLLM_CHECK_ARG(p.rows == 0 || (p.x && p.out && p.weight), "rms_norm: data is null");
}

void validate_copy_blocks(const CopyBlocksParams& p) {
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0 && p.num_pools >= 0, "negative sizes");
  for (int32_t i = 0; i < p.num_pools; ++i) {
    validate_block_pool(p.pools[i], "caches");
    check_pair_ids(p.pairs, p.num_pairs, 0, p.pools[i].num_blocks, "the cache's");
    check_pair_ids(p.pairs, p.num_pairs, 1, p.pools[i].num_blocks, "the cache's");
  }
  check_unique_dst(p.pairs, p.num_pairs, /*dst_not_src=*/true);
}

void validate_swap_blocks(const SwapBlocksParams& p) {
  PAGEDLLM_CHECK_ARG(p.num_pairs >= 0, "negative number of pairs");
  validate_block_pool(p.src, "src");
  validate_block_pool(p.dst, "dst");
  PAGEDLLM_CHECK_ARG(p.src.block_bytes == p.dst.block_bytes,
                     "src blocks hold " << p.src.block_bytes << " bytes but dst blocks hold "
                                        << p.dst.block_bytes);
  check_pair_ids(p.pairs, p.num_pairs, 0, p.src.num_blocks, "src");
  check_pair_ids(p.pairs, p.num_pairs, 1, p.dst.num_blocks, "dst");
  check_unique_dst(p.pairs, p.num_pairs, /*dst_not_src=*/false);
}

}  // namespace pagedllm::kernels
