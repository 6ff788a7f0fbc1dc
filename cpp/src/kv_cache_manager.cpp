#include "pagedllm/kv_cache_manager.h"

#include <algorithm>
#include <climits>

#include "pagedllm/error.h"

namespace pagedllm {

int32_t KVCacheManager::checked_block_size(int32_t num_blocks, int32_t block_size,
                                           int32_t watermark_blocks) {
  PAGEDLLM_CHECK_ARG(num_blocks >= 1 && num_blocks <= BlockAllocator::kMaxBlocks,
                     "KVCacheManager: num_blocks must be in [1, " << BlockAllocator::kMaxBlocks
                                                                  << "], got " << num_blocks);
  PAGEDLLM_CHECK_ARG(block_size >= 1, "KVCacheManager: block_size must be >= 1, got " << block_size);
  PAGEDLLM_CHECK_ARG(int64_t{num_blocks} * block_size <= INT32_MAX,
                     "KVCacheManager: num_blocks * block_size = " << num_blocks << " * "
                         << block_size << " = " << int64_t{num_blocks} * block_size
                         << " slots exceeds 2^31 - 1");
  PAGEDLLM_CHECK_ARG(watermark_blocks >= 0 && watermark_blocks < num_blocks,
                     "KVCacheManager: watermark_blocks must be in [0, " << num_blocks << "), got "
                                                                       << watermark_blocks);
  return block_size;
}

KVCacheManager::KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching,
                               int32_t watermark_blocks)
    // Every argument is checked before the pool and the prefix cache (num_blocks * block_size
    // token ids) are built: a refused size allocates nothing.
    : block_size_(checked_block_size(num_blocks, block_size, watermark_blocks)),
      enable_prefix_caching_(enable_prefix_caching),
      watermark_blocks_(watermark_blocks),
      allocator_(num_blocks),
      cache_(num_blocks, block_size) {
  fill_.assign(static_cast<size_t>(num_blocks), 0);
}

KVCacheManager::SeqState& KVCacheManager::state(SeqId seq) {
  const auto it = seqs_.find(seq);
  PAGEDLLM_CHECK_INDEX(it != seqs_.end(), "unknown sequence id " << seq);
  return it->second;
}

const KVCacheManager::SeqState& KVCacheManager::state(SeqId seq) const {
  const auto it = seqs_.find(seq);
  PAGEDLLM_CHECK_INDEX(it != seqs_.end(), "unknown sequence id " << seq);
  return it->second;
}

uint64_t KVCacheManager::match_prefix(const TokenId* prompt, int32_t n, uint64_t extra_key,
                                      std::vector<BlockId>& hits, const uint64_t* hashes,
                                      int32_t num_hashes, int32_t max_blocks) const {
  hits.clear();
  uint64_t parent_hash = PrefixCache::kRootHash;
  if (!enable_prefix_caching_ || n < 1) return parent_hash;
  BlockId parent = kNoBlock;
  int32_t limit = (n - 1) / block_size_;  // the last prompt token is recomputed
  if (max_blocks >= 0) limit = std::min(limit, max_blocks);
  for (int32_t i = 0; i < limit; ++i) {
    const TokenId* block_tokens = prompt + static_cast<int64_t>(i) * block_size_;
    const uint64_t h = i < num_hashes ? hashes[i]
                                      : cache_.block_hash(parent_hash, block_tokens, extra_key);
    const auto hit = cache_.lookup(h, parent, block_tokens, extra_key);
    if (!hit) break;
    hits.push_back(*hit);
    parent = *hit;
    parent_hash = h;
  }
  return parent_hash;
}

KVCacheManager::SeqState& KVCacheManager::register_seq(SeqId seq, uint64_t extra_key,
                                                       uint64_t last_hash,
                                                       const std::vector<BlockId>& hits,
                                                       int32_t num_query_tokens) {
  auto [it, inserted] = seqs_.emplace(seq, SeqState(block_size_));
  PAGEDLLM_ASSERT(inserted);
  SeqState& s = it->second;
  s.extra_key = extra_key;
  s.last_hash = last_hash;
  for (BlockId b : hits) {
    if (cache_.parked(b)) {  // hits are cached blocks: valid ids
      cache_.unpark_unchecked(b);
      tokens_stored_ += fill_[static_cast<size_t>(b)];
    }
    allocator_.incref(b);
    s.table.append_block(b);
  }
  s.num_tokens = static_cast<int32_t>(hits.size()) * block_size_;
  if (enable_prefix_caching_) {
    queries_ += num_query_tokens;
    hits_ += s.num_tokens;
  }
  note_usage();
  return s;
}

void KVCacheManager::block_hashes(const TokenId* tokens, int32_t n, uint64_t extra_key,
                                  std::vector<uint64_t>& out) const {
  PAGEDLLM_CHECK_ARG(n >= 0, "block_hashes: n must be >= 0, got " << n);
  const int32_t full = n / block_size_;
  out.resize(static_cast<size_t>(full));
  uint64_t h = PrefixCache::kRootHash;
  for (int32_t i = 0; i < full; ++i) {
    h = cache_.block_hash(h, tokens + static_cast<int64_t>(i) * block_size_, extra_key);
    out[static_cast<size_t>(i)] = h;
  }
}

std::pair<int32_t, int32_t> KVCacheManager::query_admission(
    const TokenId* tokens, int32_t n, const uint64_t* hashes, int32_t num_hashes,
    uint64_t extra_key, int32_t max_cached_tokens, int32_t want_new_tokens) const {
  PAGEDLLM_CHECK_ARG(n >= 1, "query_admission: a sequence needs at least 1 token, got " << n);
  PAGEDLLM_CHECK_ARG(want_new_tokens >= 0, "query_admission: want_new_tokens must be >= 0, got "
                                               << want_new_tokens);
  std::vector<BlockId> hits;
  match_prefix(tokens, n, extra_key, hits, hashes, num_hashes,
               std::max(max_cached_tokens, 0) / block_size_);
  int32_t parked_hits = 0;
  for (BlockId b : hits) parked_hits += cache_.parked(b) ? 1 : 0;
  const int32_t num_hits = static_cast<int32_t>(hits.size());
  const int32_t cached = num_hits * block_size_;
  const int64_t spare = int64_t{num_available_blocks()} - parked_hits - watermark_blocks_;
  int64_t fit = spare * block_size_;  // new tokens fit in fresh blocks (cached ends on a boundary)
  fit = std::max<int64_t>(fit, 0);
  const int64_t room = std::min<int64_t>(int64_t{n} - cached, want_new_tokens);
  return {cached, static_cast<int32_t>(std::min(fit, room))};
}

int32_t KVCacheManager::admit(SeqId seq, const TokenId* tokens, int32_t n, const uint64_t* hashes,
                              int32_t num_hashes, uint64_t extra_key, int32_t max_cached_tokens,
                              int32_t num_new_tokens, Slot* slots_out,
                              std::vector<CowPair>& cow_out, bool cache_new_blocks) {
  PAGEDLLM_CHECK_ARG(n >= 1, "admit: a sequence needs at least 1 token, got " << n);
  PAGEDLLM_CHECK_ARG(num_new_tokens >= 0, "admit: num_new_tokens must be >= 0, got "
                                              << num_new_tokens);
  PAGEDLLM_CHECK_STATE(!contains(seq), "admit: sequence " << seq << " is already allocated");
  std::vector<BlockId> hits;
  const uint64_t last_hash = match_prefix(tokens, n, extra_key, hits, hashes, num_hashes,
                                          std::max(max_cached_tokens, 0) / block_size_);
  const int32_t num_hits = static_cast<int32_t>(hits.size());
  const int32_t cached = num_hits * block_size_;
  PAGEDLLM_CHECK_ARG(int64_t{cached} + num_new_tokens <= n,
                     "admit: " << num_new_tokens << " new tokens after a cached prefix of "
                               << cached << " exceed the sequence's " << n << " tokens");
  int32_t parked_hits = 0;
  for (BlockId b : hits) parked_hits += cache_.parked(b) ? 1 : 0;
  const int64_t needed = blocks_for_tokens(int64_t{cached} + num_new_tokens, block_size_) - num_hits;
  if (needed > int64_t{num_available_blocks()} - parked_hits) return -1;
  SeqState& s = register_seq(seq, extra_key, last_hash, hits, n);
  if (!cache_new_blocks) {
    s.cache_new_blocks = false;
    s.partial.clear();
  }
  append_one_seq(s, tokens + cached, num_new_tokens, slots_out, cow_out);
  return cached;
}

int32_t KVCacheManager::num_cached_tokens(const TokenId* prompt, int32_t n,
                                          uint64_t extra_key) const {
  std::vector<BlockId> hits;
  match_prefix(prompt, n, extra_key, hits);
  return static_cast<int32_t>(hits.size()) * block_size_;
}

bool KVCacheManager::can_allocate(const TokenId* prompt, int32_t n, uint64_t extra_key,
                                  int32_t num_new_tokens) const {
  PAGEDLLM_CHECK_ARG(n >= 1, "can_allocate: a prompt needs at least 1 token, got " << n);
  PAGEDLLM_CHECK_ARG(num_new_tokens >= 0, "can_allocate: num_new_tokens must be >= 0, got "
                                              << num_new_tokens);
  std::vector<BlockId> hits;
  match_prefix(prompt, n, extra_key, hits);
  int32_t parked_hits = 0;
  for (BlockId b : hits) parked_hits += cache_.parked(b) ? 1 : 0;
  const int64_t cached = static_cast<int64_t>(hits.size()) * block_size_;
  // int64 throughout: 2 cached blocks plus INT32_MAX new tokens at block_size 1 is 2^31 + 1
  // blocks, which an int32 count wrapped to a negative demand that "fit".
  const int64_t needed = blocks_for_tokens(cached + num_new_tokens, block_size_) -
                         static_cast<int64_t>(hits.size());
  return needed + watermark_blocks_ <= int64_t{num_available_blocks()} - parked_hits;
}

int32_t KVCacheManager::allocate(SeqId seq, const TokenId* prompt, int32_t n, uint64_t extra_key) {
  PAGEDLLM_CHECK_ARG(n >= 1, "allocate: a prompt needs at least 1 token, got " << n);
  PAGEDLLM_CHECK_STATE(!contains(seq), "allocate: sequence " << seq << " is already allocated");
  std::vector<BlockId> hits;
  const uint64_t last_hash = match_prefix(prompt, n, extra_key, hits);
  return register_seq(seq, extra_key, last_hash, hits, n).num_tokens;
}

int32_t KVCacheManager::blocks_needed(SeqId seq, int32_t n) const {
  PAGEDLLM_CHECK_ARG(n >= 0, "blocks_needed: n must be >= 0, got " << n);
  const SeqState& s = state(seq);
  // Every append path (append, append_batch, can_append) asks here first, before any state
  // changes: a sequence's token count is int32 and must not wrap (a block-sparse stream that
  // drops its old blocks keeps growing it without holding more blocks).
  PAGEDLLM_CHECK_ARG(int64_t{s.num_tokens} + n <= kMaxSeqTokens,
                     "sequence " << seq << " holds " << s.num_tokens << " tokens; appending n = "
                                 << n << " more would exceed " << kMaxSeqTokens
                                         << " (2^31 - 1), the most a sequence can hold");
  if (n == 0) return 0;
  // < 2^31 tokens at block_size >= 1: the count fits int32.
  int32_t needed = static_cast<int32_t>(blocks_for_tokens(int64_t{s.num_tokens} + n, block_size_)) -
                   s.table.num_blocks();
  const bool writes_partial_block = s.num_tokens % block_size_ != 0;
  if (writes_partial_block && allocator_.refcount(s.table.blocks().back()) > 1) ++needed;
  return std::max(needed, 0);
}

bool KVCacheManager::can_append(SeqId seq, int32_t n) const {
  return blocks_needed(seq, n) <= num_available_blocks();
}

BlockId KVCacheManager::take_block() {
  auto id = allocator_.allocate();
  if (!id) {
    scratch_.clear();
    evictions_ += cache_.evict_lru(scratch_);
    for (BlockId b : scratch_) {
      fill_[static_cast<size_t>(b)] = 0;
      allocator_.release(b);
    }
    id = allocator_.allocate();
  }
  PAGEDLLM_CHECK_STATE(id.has_value(), "internal: no block available after the capacity check");
  fill_[static_cast<size_t>(*id)] = 0;
  return *id;
}

void KVCacheManager::append_one_seq(SeqState& s, const TokenId* tokens, int32_t n, Slot* slots_out,
                                    std::vector<CowPair>& cow_out) {
  if (n == 0) return;
  // Copy-on-write: the partially filled last block is shared with another sequence.
  if (s.num_tokens % block_size_ != 0) {
    const int32_t last = s.table.num_blocks() - 1;
    const BlockId src = s.table.block(last);
    if (allocator_.refcount(src) > 1) {
      const BlockId dst = take_block();
      fill_[static_cast<size_t>(dst)] = fill_[static_cast<size_t>(src)];
      tokens_stored_ += fill_[static_cast<size_t>(dst)];
      allocator_.decref(src);  // still referenced by the other sharer(s)
      s.table.replace_block(last, dst);
      cow_out.push_back({src, dst});
      ++cow_copies_;
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = s.num_tokens;
    const int32_t offset = pos % block_size_;
    if (offset == 0) s.table.append_block(take_block());
    const BlockId b = s.table.blocks().back();
    slots_out[i] = Slot{b} * block_size_ + offset;
    ++fill_[static_cast<size_t>(b)];
    ++tokens_stored_;
    ++s.num_tokens;
    if (enable_prefix_caching_ && s.cache_new_blocks) {
      s.partial.push_back(tokens[i]);
      if (offset == block_size_ - 1) {  // the block just filled: make it findable
        const uint64_t h = cache_.block_hash(s.last_hash, s.partial.data(), s.extra_key);
        const int32_t nb = s.table.num_blocks();
        const BlockId parent = nb >= 2 ? s.table.block(nb - 2) : kNoBlock;
        cache_.insert(h, b, parent, s.partial.data(), s.extra_key);
        s.last_hash = h;
        s.partial.clear();
      }
    }
  }
  note_usage();
}

bool KVCacheManager::append(SeqId seq, const TokenId* tokens, int32_t n, Slot* slots_out,
                            std::vector<CowPair>& cow_out) {
  SeqState& s = state(seq);
  if (blocks_needed(seq, n) > num_available_blocks()) return false;
  append_one_seq(s, tokens, n, slots_out, cow_out);
  return true;
}

bool KVCacheManager::append_batch(const SeqId* seqs, const int32_t* counts, int32_t num_seqs,
                                  const TokenId* tokens, Slot* slots_out,
                                  std::vector<CowPair>& cow_out) {
  PAGEDLLM_CHECK_ARG(num_seqs >= 0, "append_batch: num_seqs must be >= 0, got " << num_seqs);
  // Validate everything and sum the demand before touching any state.
  int64_t needed = 0;
  for (int32_t i = 0; i < num_seqs; ++i) {
    PAGEDLLM_CHECK_ARG(counts[i] >= 0, "append_batch: counts[" << i << "] = " << counts[i]
                                                               << " must be >= 0");
    needed += blocks_needed(seqs[i], counts[i]);
  }
  // A sequence listed twice would make the demand above wrong.
  seq_scratch_.assign(seqs, seqs + num_seqs);
  std::sort(seq_scratch_.begin(), seq_scratch_.end());
  const auto dup = std::adjacent_find(seq_scratch_.begin(), seq_scratch_.end());
  PAGEDLLM_CHECK_ARG(dup == seq_scratch_.end(),
                     "append_batch: sequence " << *dup << " appears more than once");
  if (needed > num_available_blocks()) return false;
  int64_t offset = 0;
  for (int32_t i = 0; i < num_seqs; ++i) {
    append_one_seq(state(seqs[i]), tokens + offset, counts[i], slots_out + offset, cow_out);
    offset += counts[i];
  }
  return true;
}

void KVCacheManager::fork(SeqId parent, SeqId child) {
  PAGEDLLM_CHECK_STATE(!contains(child), "fork: child sequence " << child << " already exists");
  const SeqState& p = state(parent);
  for (BlockId b : p.table.blocks())
    if (b != BlockTable::kDroppedBlock) allocator_.incref(b);
  seqs_.emplace(child, p);
}

void KVCacheManager::stop_caching(SeqId seq) {
  SeqState& s = state(seq);
  s.cache_new_blocks = false;
  s.partial.clear();  // the unfilled block is never hashed now
}

bool KVCacheManager::caching(SeqId seq) const {
  return enable_prefix_caching_ && state(seq).cache_new_blocks;
}

int32_t KVCacheManager::drop_blocks(SeqId seq, int32_t begin, int32_t end) {
  SeqState& s = state(seq);
  const int32_t last = s.table.num_blocks() - 1;
  PAGEDLLM_CHECK_INDEX(begin >= 0 && begin <= end && end <= std::max(last, 0),
                       "drop_blocks: range [" << begin << ", " << end << ") of sequence " << seq
                                              << " is outside [0, " << std::max(last, 0)
                                              << ") (its blocks but the last, being written)");
  int32_t dropped = 0;
  for (int32_t i = begin; i < end; ++i) {
    const BlockId b = s.table.drop_block(i);
    if (b == BlockTable::kDroppedBlock) continue;
    drop_ref(b);
    ++dropped;
  }
  return dropped;
}

void KVCacheManager::drop_ref(BlockId b) {
  // b comes from a block table: a valid id, a held block (decref checks it).
  const bool park = enable_prefix_caching_ && cache_.cached(b);
  if (!allocator_.decref(b, park)) return;
  tokens_stored_ -= fill_[static_cast<size_t>(b)];
  if (park) {
    cache_.park_unchecked(b);
  } else {
    fill_[static_cast<size_t>(b)] = 0;
  }
}

void KVCacheManager::free(SeqId seq) {
  SeqState& s = state(seq);
  const auto& blocks = s.table.blocks();
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)  // tail first
    if (*it != BlockTable::kDroppedBlock) drop_ref(*it);
  seqs_.erase(seq);
}

void KVCacheManager::reset_prefix_cache() {
  scratch_.clear();
  cache_.reset(scratch_);
  for (BlockId b : scratch_) {
    fill_[static_cast<size_t>(b)] = 0;
    allocator_.release(b);
  }
  // Live sequences keep their blocks; their next full block has no cached parent and so is
  // not registered, which keeps every cache entry's parent chain intact.
}

int32_t KVCacheManager::num_tokens(SeqId seq) const { return state(seq).num_tokens; }

const BlockTable& KVCacheManager::block_table(SeqId seq) const { return state(seq).table; }

int32_t KVCacheManager::max_num_blocks(const SeqId* seqs, int32_t num_seqs) const {
  int32_t width = 0;
  for (int32_t i = 0; i < num_seqs; ++i) width = std::max(width, state(seqs[i]).table.num_blocks());
  return width;
}

void KVCacheManager::export_block_tables(const SeqId* seqs, int32_t num_seqs, int32_t width,
                                         int32_t* out) const {
  for (int32_t i = 0; i < num_seqs; ++i) {
    const auto& blocks = state(seqs[i]).table.blocks();
    PAGEDLLM_CHECK_ARG(static_cast<int32_t>(blocks.size()) <= width,
                       "export_block_tables: sequence " << seqs[i] << " holds " << blocks.size()
                                                        << " blocks, more than width " << width);
    int32_t* row = out + static_cast<int64_t>(i) * width;
    std::copy(blocks.begin(), blocks.end(), row);
    std::fill(row + blocks.size(), row + width, 0);
  }
}

KVCacheStats KVCacheManager::stats() const {
  KVCacheStats st;
  st.num_blocks = allocator_.capacity();
  st.block_size = block_size_;
  st.used_blocks = used_blocks();
  st.cached_blocks = cache_.num_parked();
  st.free_blocks = allocator_.num_free();
  st.peak_used_blocks = peak_used_;
  st.cached_entries = cache_.num_cached();
  st.num_seqs = static_cast<int32_t>(seqs_.size());
  st.tokens_stored = tokens_stored_;
  st.slots_reserved = int64_t{st.used_blocks} * block_size_;
  st.slots_empty = st.slots_reserved - st.tokens_stored;
  st.prefix_cache_queries = queries_;
  st.prefix_cache_hits = hits_;
  st.evictions = evictions_;
  st.cow_copies = cow_copies_;
  return st;
}

}  // namespace pagedllm
