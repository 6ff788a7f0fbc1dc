#include "pagedllm/block_table.h"

#include "pagedllm/error.h"

namespace pagedllm {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  PAGEDLLM_CHECK_ARG(block_size >= 1, "BlockTable: block_size must be >= 1, got " << block_size);
}

void BlockTable::replace_block(int32_t index, BlockId id) {
  PAGEDLLM_CHECK_INDEX(index >= 0 && index < num_blocks(),
                       "replace_block: index " << index << " outside [0, " << num_blocks() << ")");
  blocks_[static_cast<size_t>(index)] = id;
}

Slot BlockTable::slot(int64_t position) const {
  PAGEDLLM_CHECK_INDEX(position >= 0 && position < capacity_tokens(),
                       "slot: position " << position << " outside [0, " << capacity_tokens()
                                         << ") held by this block table");
  const BlockId id = blocks_[static_cast<size_t>(position / block_size_)];
  PAGEDLLM_CHECK_INDEX(id != kDroppedBlock, "slot: position " << position
                                                              << " is in dropped logical block "
                                                              << position / block_size_);
  return Slot{id} * block_size_ + position % block_size_;
}

BlockId BlockTable::drop_block(int32_t index) {
  PAGEDLLM_CHECK_INDEX(index >= 0 && index < num_blocks(),
                       "drop_block: index " << index << " outside [0, " << num_blocks() << ")");
  BlockId& entry = blocks_[static_cast<size_t>(index)];
  const BlockId id = entry;
  if (id != kDroppedBlock) {
    entry = kDroppedBlock;
    ++num_dropped_;
  }
  return id;
}

BlockId BlockTable::block(int32_t index) const {
  PAGEDLLM_CHECK_INDEX(index >= 0 && index < num_blocks(),
                       "block: index " << index << " outside [0, " << num_blocks() << ")");
  return blocks_[static_cast<size_t>(index)];
}

}  // namespace pagedllm
