// pagedllm/block_table.h — one sequence's map from logical blocks to physical blocks.
//
// Logical block i of a sequence holds its tokens [i * block_size, (i + 1) * block_size).
// The table only grows at the end (append_block); the one exception is copy-on-write, which
// swaps the physical id of the block being written (replace_block). A block that will never
// be read again (block-sparse streaming attention) can be dropped (drop_block): its entry
// becomes kDroppedBlock and logical indices keep counting, so positions are unchanged. It
// knows nothing of refcounts: the KVCacheManager keeps those in the BlockAllocator.
// Thread-safety: none; owned by one KVCacheManager.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/types.h"

namespace pagedllm {

class BlockTable {
 public:
  // The entry of a dropped logical block.
  static constexpr BlockId kDroppedBlock = -1;

  // An empty table for blocks of `block_size` tokens (block_size >= 1).
  explicit BlockTable(int32_t block_size);

  // Appends a physical block at the end of the table.
  void append_block(BlockId id) { blocks_.push_back(id); }
  // Replaces the physical block at logical index `index` (copy-on-write). Throws if out of range.
  void replace_block(int32_t index, BlockId id);
  // Removes every block (the caller has already dropped their references).
  void clear() {
    blocks_.clear();
    num_dropped_ = 0;
  }
  // Marks logical block `index` dropped; returns its physical id, or kDroppedBlock when it
  // already was. Throws IndexError when out of range.
  BlockId drop_block(int32_t index);
  // Logical blocks dropped so far.
  int32_t num_dropped() const { return num_dropped_; }

  // Slot of the token at `position`: block_id * block_size + position % block_size.
  // Throws IndexError when position is negative, beyond the blocks held or in a dropped block.
  Slot slot(int64_t position) const;
  // Physical block at logical index `index`; throws when out of range.
  BlockId block(int32_t index) const;
  // Number of blocks held.
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Number of token slots the table can address (num_blocks * block_size).
  int64_t capacity_tokens() const { return int64_t{num_blocks()} * block_size_; }
  // Tokens per block.
  int32_t block_size() const { return block_size_; }
  // All physical ids in logical order.
  const std::vector<BlockId>& blocks() const { return blocks_; }

 private:
  int32_t block_size_;
  std::vector<BlockId> blocks_;
  int32_t num_dropped_ = 0;
};

// Number of blocks needed to hold `num_tokens` tokens (ceil division), exact for every
// num_tokens >= 0 up to INT64_MAX (the result is int64: 2^40 tokens of 1 token per block are
// 2^40 blocks). Throws when num_tokens < 0 or block_size < 1.
inline int64_t blocks_for_tokens(int64_t num_tokens, int32_t block_size) {
  PAGEDLLM_CHECK_ARG(num_tokens >= 0,
                     "blocks_for_tokens: num_tokens must be >= 0, got " << num_tokens);
  PAGEDLLM_CHECK_ARG(block_size >= 1,
                     "blocks_for_tokens: block_size must be >= 1, got " << block_size);
  // q + (r != 0) rather than (n + bs - 1) / bs: the sum overflows near INT64_MAX.
  return num_tokens / block_size + (num_tokens % block_size != 0 ? 1 : 0);
}

}  // namespace pagedllm
