// pagedllm/prefix_cache.h — content-addressed index of full KV blocks, with LRU eviction.
//
// A full block is keyed by a chained 64-bit hash of (parent block's hash, the block's token
// ids, an extra key such as a LoRA id, a tenant salt or a multimodal content hash). The hash
// only finds a candidate: a hit is confirmed by comparing the stored token ids, the extra key
// and the parent block id. Entries are only inserted under a parent that is itself cached (or
// at the root), and removing an entry removes its cached descendants too, so the parent ids
// always name live entries: a hash collision can never yield a wrong block.
//
// Parked blocks (refcount 0, contents kept) sit in an LRU list. The KVCacheManager parks a
// sequence's blocks tail first when it frees them, so within a chain the tail is evicted
// before the head. Eviction happens only when the allocator has no free block left.
// The cache never touches the allocator: it reports which blocks the caller must release.
// Misuse through the public methods (a block id outside the pool, parking a block that is not
// cached or already parked, unparking one that is not parked) throws pagedllm::Error and
// changes nothing; the KVCacheManager, whose ids are already valid, uses unchecked twins.
// Thread-safety: none; owned by one KVCacheManager.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "pagedllm/types.h"

namespace pagedllm {

class PrefixCache {
 public:
  // Hash of the empty prefix: the parent hash of a sequence's first block.
  static constexpr uint64_t kRootHash = 0x9E3779B97F4A7C15ull;

  // An empty cache for a pool of `num_blocks` blocks of `block_size` tokens (both >= 1).
  PrefixCache(int32_t num_blocks, int32_t block_size);

  // Chained hash of one full block (block_size tokens) under `parent_hash`.
  uint64_t block_hash(uint64_t parent_hash, const TokenId* tokens, uint64_t extra_key) const;

  // The cached block whose hash, parent block, tokens and extra key all match; nullopt if none.
  // `parent_block` is kNoBlock for a sequence's first block.
  std::optional<BlockId> lookup(uint64_t hash, BlockId parent_block, const TokenId* tokens,
                                uint64_t extra_key) const;
  // Registers a full, held block. Returns false (and changes nothing) when the hash is already
  // cached, when the block is already cached, or when the parent is not cached. Throws
  // IndexError when `block` is outside the pool, or `parent_block` is neither kNoBlock nor
  // inside it.
  bool insert(uint64_t hash, BlockId block, BlockId parent_block, const TokenId* tokens,
              uint64_t extra_key);

  // True if the block is registered in the cache. Throws IndexError outside the pool.
  bool is_cached(BlockId block) const {
    check_block(block, "is_cached");
    return cached(block);
  }
  // True if the block is cached and parked in the LRU list. Throws IndexError outside the pool.
  bool is_parked(BlockId block) const {
    check_block(block, "is_parked");
    return parked(block);
  }
  // Puts a cached block whose refcount just reached 0 at the most-recent end of the LRU list.
  // Throws when the block is outside the pool, not cached, or already parked.
  void park(BlockId block);
  // Takes a parked block out of the LRU list (it was hit and is referenced again). Throws when
  // the block is outside the pool or not parked.
  void unpark(BlockId block);

  // Evicts the least recently used parked block and every cached descendant of it. Appends to
  // `to_release` each block that was parked and must now be released to the allocator.
  // Returns the number of entries removed (0 when nothing is parked).
  int32_t evict_lru(std::vector<BlockId>& to_release);
  // Removes every entry; appends the parked ones to `to_release`.
  void reset(std::vector<BlockId>& to_release);

  // Number of cached entries (held or parked).
  int32_t num_cached() const { return static_cast<int32_t>(by_hash_.size()); }
  // Number of parked (evictable) cached blocks.
  int32_t num_parked() const { return num_parked_; }
  // Least recently used parked block, or kNoBlock (for tests and stats).
  BlockId lru_front() const { return lru_head_; }
  // Number of blocks in the pool the cache indexes.
  int32_t num_blocks() const { return static_cast<int32_t>(cached_.size()); }

 private:
  // The KVCacheManager calls the unchecked twins below with ids it holds (always valid).
  friend class KVCacheManager;

  // Throws IndexError naming `what` when `block` is outside [0, num_blocks).
  void check_block(BlockId block, const char* what) const;
  bool cached(BlockId block) const { return cached_[static_cast<size_t>(block)] != 0; }
  bool parked(BlockId block) const { return parked_[static_cast<size_t>(block)] != 0; }
  void park_unchecked(BlockId block);
  void unpark_unchecked(BlockId block) { lru_unlink(block); }
  // Removes `root`'s entry and every descendant's; returns how many entries went.
  int32_t remove_subtree(BlockId root, std::vector<BlockId>& to_release);
  void lru_unlink(BlockId block);

  int32_t block_size_;
  std::unordered_map<uint64_t, BlockId> by_hash_;
  // Per-block entry fields, indexed by BlockId.
  std::vector<uint8_t> cached_;
  std::vector<uint8_t> parked_;
  std::vector<uint64_t> hash_;
  std::vector<uint64_t> extra_key_;
  std::vector<BlockId> parent_;
  std::vector<std::vector<BlockId>> children_;
  std::vector<TokenId> tokens_;  // [num_blocks * block_size]
  // Intrusive doubly linked LRU list of parked blocks: head = least recently used.
  std::vector<BlockId> lru_prev_;
  std::vector<BlockId> lru_next_;
  BlockId lru_head_ = kNoBlock;
  BlockId lru_tail_ = kNoBlock;
  int32_t num_parked_ = 0;
};

}  // namespace pagedllm
