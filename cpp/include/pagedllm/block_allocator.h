// pagedllm/block_allocator.h — the physical block pool: a bitmap plus per-block refcounts.
//
// Each block is in one of three states:
//   free    bit clear, refcount 0: available to allocate().
//   held    bit set,   refcount >= 1: referenced by that many block tables.
//   parked  bit set,   refcount 0: no table references it but its contents are kept valid
//           (the prefix cache owns it until it is revived by incref() or given back by
//           release()). Parked blocks are not counted by num_free().
// Allocation scans the bitmap one 64-bit word at a time, finding the first clear bit with
// count-trailing-zeros, starting at a moving hint (the word of the last allocation or free),
// so allocate+free pairs cost a few nanoseconds. allocate_n is all-or-nothing.
// Misuse (decref of a free block, incref of a free block, an id outside the pool) throws
// pagedllm::Error; the pool is never silently corrupted.
// Thread-safety: none. One owner (the KVCacheManager) serializes all calls.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "pagedllm/types.h"

namespace pagedllm {

class BlockAllocator {
 public:
  // The largest pool: 2^30 blocks (4 GiB of refcounts and 128 MiB of bitmap; block ids, and
  // a KVCacheManager's slots, stay well inside int32).
  static constexpr int32_t kMaxBlocks = int32_t{1} << 30;

  // Creates a pool of `num_blocks` free blocks; throws unless 1 <= num_blocks <= kMaxBlocks.
  explicit BlockAllocator(int32_t num_blocks);

  // Takes the lowest free block at or after the hint; refcount 1. nullopt when none is free.
  std::optional<BlockId> allocate();
  // Takes `n` free blocks, appending their ids to `out`, or takes none and returns false.
  bool allocate_n(int32_t n, std::vector<BlockId>& out);
  // Adds one reference to a held or parked block (parked -> held). Throws on a free block.
  void incref(BlockId id);
  // Drops one reference. At zero the block becomes free, or parked if `park_at_zero`.
  // Returns true when the refcount reached zero. Throws on a block with refcount 0.
  bool decref(BlockId id, bool park_at_zero = false);
  // Gives a parked block back to the free pool. Throws if the block is not parked.
  void release(BlockId id);

  // Refcount of a block (0 for free and parked blocks). Throws on an id outside the pool.
  int32_t refcount(BlockId id) const;
  // True for held and parked blocks.
  bool is_allocated(BlockId id) const;
  // True for a block that is allocated with refcount 0.
  bool is_parked(BlockId id) const { return is_allocated(id) && refcount(id) == 0; }
  // Number of free blocks (parked blocks excluded).
  int32_t num_free() const { return num_free_; }
  // Number of blocks in the pool.
  int32_t capacity() const { return capacity_; }

 private:
  void check_id(BlockId id, const char* what) const;
  bool bit(BlockId id) const { return (words_[id >> 6] >> (id & 63)) & 1u; }
  void set_bit(BlockId id) { words_[id >> 6] |= (uint64_t{1} << (id & 63)); }
  void clear_bit(BlockId id) { words_[id >> 6] &= ~(uint64_t{1} << (id & 63)); }

  int32_t capacity_;
  int32_t num_free_;
  int32_t hint_word_ = 0;          // word where the next search starts
  std::vector<uint64_t> words_;    // bit set = allocated; bits past capacity are set
  std::vector<int32_t> refcount_;  // per block
};

}  // namespace pagedllm
