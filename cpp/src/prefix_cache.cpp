#include "pagedllm/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "pagedllm/error.h"

namespace pagedllm {
namespace {

// splitmix64 finalizer: a fast 64-bit mixer with full avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
  PAGEDLLM_CHECK_ARG(num_blocks >= 1, "PrefixCache: num_blocks must be >= 1, got " << num_blocks);
  PAGEDLLM_CHECK_ARG(block_size >= 1, "PrefixCache: block_size must be >= 1, got " << block_size);
  const auto n = static_cast<size_t>(num_blocks);
  cached_.assign(n, 0);
  parked_.assign(n, 0);
  hash_.assign(n, 0);
  extra_key_.assign(n, 0);
  parent_.assign(n, kNoBlock);
  children_.resize(n);
  tokens_.assign(n * static_cast<size_t>(block_size), 0);
  lru_prev_.assign(n, kNoBlock);
  lru_next_.assign(n, kNoBlock);
  by_hash_.reserve(n);
}

uint64_t PrefixCache::block_hash(uint64_t parent_hash, const TokenId* tokens,
                                 uint64_t extra_key) const {
  uint64_t h = mix64(parent_hash ^ mix64(extra_key + 0x51ED27ull));
  for (int32_t i = 0; i < block_size_; ++i) {
    h = mix64(h ^ static_cast<uint32_t>(tokens[i]));
  }
  return h;
}

std::optional<BlockId> PrefixCache::lookup(uint64_t hash, BlockId parent_block,
                                           const TokenId* tokens, uint64_t extra_key) const {
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockId b = it->second;
  const auto i = static_cast<size_t>(b);
  if (parent_[i] != parent_block || extra_key_[i] != extra_key) return std::nullopt;
  const TokenId* stored = tokens_.data() + i * static_cast<size_t>(block_size_);
  if (std::memcmp(stored, tokens, sizeof(TokenId) * static_cast<size_t>(block_size_)) != 0) {
    return std::nullopt;  // a hash collision: same hash, other tokens
  }
  return b;
}

void PrefixCache::check_block(BlockId block, const char* what) const {
  PAGEDLLM_CHECK_INDEX(block >= 0 && block < num_blocks(),
                       "PrefixCache::" << what << ": block " << block << " is outside the pool [0, "
                                       << num_blocks() << ")");
}

bool PrefixCache::insert(uint64_t hash, BlockId block, BlockId parent_block, const TokenId* tokens,
                         uint64_t extra_key) {
  check_block(block, "insert");
  PAGEDLLM_CHECK_INDEX(parent_block == kNoBlock || (parent_block >= 0 && parent_block < num_blocks()),
                       "PrefixCache::insert: parent_block " << parent_block
                           << " is neither kNoBlock (-1) nor inside the pool [0, " << num_blocks()
                           << ")");
  const auto i = static_cast<size_t>(block);
  if (cached_[i]) return false;
  if (parent_block != kNoBlock && !cached_[static_cast<size_t>(parent_block)]) return false;
  if (!by_hash_.emplace(hash, block).second) return false;
  cached_[i] = 1;
  hash_[i] = hash;
  extra_key_[i] = extra_key;
  parent_[i] = parent_block;
  std::memcpy(tokens_.data() + i * static_cast<size_t>(block_size_), tokens,
              sizeof(TokenId) * static_cast<size_t>(block_size_));
  if (parent_block != kNoBlock) children_[static_cast<size_t>(parent_block)].push_back(block);
  return true;
}

void PrefixCache::park(BlockId block) {
  check_block(block, "park");
  PAGEDLLM_CHECK_STATE(cached(block), "PrefixCache::park: block " << block
                                                                  << " is not cached (insert it first)");
  PAGEDLLM_CHECK_STATE(!parked(block), "PrefixCache::park: block " << block << " is already parked");
  park_unchecked(block);
}

void PrefixCache::park_unchecked(BlockId block) {
  const auto i = static_cast<size_t>(block);
  PAGEDLLM_ASSERT(cached_[i] && !parked_[i]);
  parked_[i] = 1;
  lru_prev_[i] = lru_tail_;
  lru_next_[i] = kNoBlock;
  if (lru_tail_ != kNoBlock) lru_next_[static_cast<size_t>(lru_tail_)] = block;
  lru_tail_ = block;
  if (lru_head_ == kNoBlock) lru_head_ = block;
  ++num_parked_;
}

void PrefixCache::lru_unlink(BlockId block) {
  const auto i = static_cast<size_t>(block);
  const BlockId prev = lru_prev_[i];
  const BlockId next = lru_next_[i];
  if (prev != kNoBlock) lru_next_[static_cast<size_t>(prev)] = next; else lru_head_ = next;
  if (next != kNoBlock) lru_prev_[static_cast<size_t>(next)] = prev; else lru_tail_ = prev;
  lru_prev_[i] = lru_next_[i] = kNoBlock;
  parked_[i] = 0;
  --num_parked_;
}

void PrefixCache::unpark(BlockId block) {
  check_block(block, "unpark");
  PAGEDLLM_CHECK_STATE(parked(block), "PrefixCache::unpark: block " << block << " is not parked");
  unpark_unchecked(block);
}

int32_t PrefixCache::remove_subtree(BlockId root, std::vector<BlockId>& to_release) {
  // Detach the root from its parent; its descendants go with it.
  const BlockId parent = parent_[static_cast<size_t>(root)];
  if (parent != kNoBlock) {
    auto& siblings = children_[static_cast<size_t>(parent)];
    const auto it = std::find(siblings.begin(), siblings.end(), root);
    PAGEDLLM_ASSERT(it != siblings.end());
    *it = siblings.back();
    siblings.pop_back();
  }
  // Iterative depth-first walk (chains can be many thousands of blocks deep).
  std::vector<BlockId> stack{root};
  int32_t removed = 0;
  while (!stack.empty()) {
    const BlockId b = stack.back();
    stack.pop_back();
    const auto i = static_cast<size_t>(b);
    for (BlockId child : children_[i]) stack.push_back(child);
    children_[i].clear();
    if (parked_[i]) {
      lru_unlink(b);
      to_release.push_back(b);
    }
    by_hash_.erase(hash_[i]);
    cached_[i] = 0;
    parent_[i] = kNoBlock;
    ++removed;
  }
  return removed;
}

int32_t PrefixCache::evict_lru(std::vector<BlockId>& to_release) {
  if (lru_head_ == kNoBlock) return 0;
  return remove_subtree(lru_head_, to_release);
}

void PrefixCache::reset(std::vector<BlockId>& to_release) {
  for (size_t i = 0; i < cached_.size(); ++i) {
    if (parked_[i]) to_release.push_back(static_cast<BlockId>(i));
    cached_[i] = parked_[i] = 0;
    parent_[i] = lru_prev_[i] = lru_next_[i] = kNoBlock;
    children_[i].clear();
  }
  by_hash_.clear();
  lru_head_ = lru_tail_ = kNoBlock;
  num_parked_ = 0;
}

}  // namespace pagedllm
