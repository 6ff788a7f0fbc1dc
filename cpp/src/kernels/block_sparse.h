// block_sparse.h (internal) — the checked, compacted form of a BlockSparseParams that the
// attention driver (attention.cpp) hands to the engines.
//
// The engines attend over a token range of one block table. A sparse list is turned into a
// compacted table: the physical ids of the listed blocks in order, so the selected tokens sit
// at consecutive "compacted" positions and the engines' inner loops run unchanged. Every listed
// block but a sequence's last one is full, so compacted position = rank of the token among the
// selected ones, and a causal limit maps to the count of selected tokens below it.
// On all blocks the compacted table is the block table itself and every limit is unchanged.
// Thread-safety: read-only after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedllm/kernels/params.h"

namespace pagedllm::kernels {

class SparseView {
 public:
  // Checks `s` against `p` (list count, indptr, sorted ids inside each sequence's used blocks,
  // the listed blocks' physical ids inside the pool: unlisted table entries are never read and
  // may be anything, e.g. -1 for a dropped block; throws pagedllm::Error naming the bad entry)
  // and builds the compacted tables.
  SparseView(const AttentionParams& p, const BlockSparseParams& s);

  // The list of (sequence, KV head).
  int list(int seq, int kv_head) const { return per_head_ ? seq * kv_heads_ + kv_head : seq; }
  // The compacted block table of list l: physical ids of its listed blocks, in order.
  const int32_t* table(int l) const { return phys_.data() + indptr_[l]; }
  // Selected tokens of list l (its compacted context length).
  int32_t length(int l) const { return lengths_[l]; }
  // Selected tokens of list l at positions < limit (a causal limit in compacted positions).
  int32_t compact_limit(int l, int32_t limit) const;

 private:
  bool per_head_;
  int32_t kv_heads_;
  int32_t block_size_;
  const int32_t* indptr_;
  const int32_t* indices_;
  std::vector<int32_t> phys_;     // [num_indices]
  std::vector<int32_t> lengths_;  // [num_lists]
};

}  // namespace pagedllm::kernels
