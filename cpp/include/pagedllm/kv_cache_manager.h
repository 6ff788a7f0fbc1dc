// pagedllm/kv_cache_manager.h — the scheduler's one view of KV-cache memory.
//
// Owns the BlockAllocator, one BlockTable per sequence and the PrefixCache. Verbs come in
// ask/do pairs: can_allocate/allocate admit a sequence (taking its cached prefix blocks),
// can_append/append reserve slots for new tokens (prompt chunks or decoded tokens), fork shares
// every block of a sequence with a new one (refcount + 1), free gives a sequence's blocks back.
// Running out of blocks is a normal result (false), never an exception; a failed append changes
// nothing. Appending into a block that another sequence shares triggers copy-on-write: the
// manager moves the writer to a fresh block and returns the (src, dst) pair that the kernels
// must copy before the step runs. Full blocks are immutable and, with prefix caching on, are
// registered in the PrefixCache as soon as they fill; when a sequence is freed its cached
// blocks are parked (tail first) and evicted LRU only when the pool has no free block left.
// Admission keeps `watermark_blocks` blocks in reserve for the sequences already running.
// Thread-safety: none. The engine calls it from one thread.
#pragma once

#include <climits>
#include <cstdint>
#include <utility>
#include <unordered_map>
#include <vector>

#include "pagedllm/block_allocator.h"
#include "pagedllm/block_table.h"
#include "pagedllm/prefix_cache.h"
#include "pagedllm/types.h"

namespace pagedllm {

// A block copy the kernels must perform before the step that writes into `dst`.
struct CowPair {
  BlockId src;
  BlockId dst;
};

// A snapshot of the pool. used + cached + free == num_blocks.
struct KVCacheStats {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t used_blocks = 0;           // referenced by at least one block table
  int32_t cached_blocks = 0;         // parked: no user, contents kept for prefix hits, evictable
  int32_t free_blocks = 0;           // neither used nor cached
  int32_t peak_used_blocks = 0;      // most used_blocks seen since construction / reset_peak()
  int32_t cached_entries = 0;        // blocks registered in the prefix cache (used or parked)
  int32_t num_seqs = 0;              // live sequences
  int64_t tokens_stored = 0;         // tokens held in used blocks (a shared block counts once)
  int64_t slots_reserved = 0;        // used_blocks * block_size
  int64_t slots_empty = 0;           // slots_reserved - tokens_stored (internal fragmentation)
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up by allocate()
  int64_t prefix_cache_hits = 0;     // of those, tokens found cached
  int64_t evictions = 0;             // cache entries evicted to make room
  int64_t cow_copies = 0;            // copy-on-write block copies requested
};

class KVCacheManager {
 public:
  // Most tokens one sequence can hold (its count is int32), dropped blocks' tokens included.
  static constexpr int32_t kMaxSeqTokens = INT32_MAX;

  // A pool of `num_blocks` blocks of `block_size` tokens. num_blocks must be in
  // [1, BlockAllocator::kMaxBlocks], block_size >= 1, num_blocks * block_size <= 2^31 - 1 slots,
  // watermark_blocks in [0, num_blocks); all are checked before any memory is allocated.
  KVCacheManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching = true,
                 int32_t watermark_blocks = 0);

  // --- admission ----------------------------------------------------------------------------
  // Leading prompt tokens whose blocks are cached: a multiple of block_size, at most n - 1 (the
  // last prompt token is always recomputed). No side effects; 0 with prefix caching off.
  int32_t num_cached_tokens(const TokenId* prompt, int32_t n, uint64_t extra_key) const;
  // True if allocate() followed by append() of `num_new_tokens` tokens would succeed now and
  // still leave the watermark free.
  bool can_allocate(const TokenId* prompt, int32_t n, uint64_t extra_key,
                    int32_t num_new_tokens) const;
  // Registers `seq`, gives it the cached prefix blocks and returns how many prompt tokens they
  // hold (their K/V need not be computed). Reserves no other slot: call append() next.
  // Throws if `seq` is already registered or n < 1.
  int32_t allocate(SeqId seq, const TokenId* prompt, int32_t n, uint64_t extra_key);

  // --- admission with precomputed hashes (the engine's path: one ask, one do) ---------------
  // Chained prefix-cache hashes of the n / block_size full blocks of `tokens` under
  // `extra_key`, written to out (resized). Computed once per prompt and kept by the caller.
  void block_hashes(const TokenId* tokens, int32_t n, uint64_t extra_key,
                    std::vector<uint64_t>& out) const;
  // The ask: leading tokens of `tokens` whose blocks are cached (at most min(n - 1,
  // max_cached_tokens), a multiple of block_size) and the most new tokens, at most
  // `want_new_tokens`, that admit() could reserve after them now while leaving the watermark
  // free (0 when not even one fits). `hashes[0..num_hashes)` are block_hashes() of a prefix of
  // `tokens` under `extra_key` (blocks past them are hashed here). No side effects.
  std::pair<int32_t, int32_t> query_admission(const TokenId* tokens, int32_t n,
                                              const uint64_t* hashes, int32_t num_hashes,
                                              uint64_t extra_key, int32_t max_cached_tokens,
                                              int32_t want_new_tokens) const;
  // The do: registers `seq` with its cached prefix (as query_admission found it), then
  // reserves slots for the `num_new_tokens` tokens of `tokens` after that prefix, written to
  // slots_out[0..num_new_tokens) (copy-on-write pairs to cow_out). Returns the cached length,
  // or -1 (nothing changed) when the pool cannot supply the blocks. With cache_new_blocks
  // false the sequence starts as after stop_caching (a swapped-in sequence holding sparse
  // K/V). Throws if `seq` is registered, n < 1, or the prefix plus num_new_tokens exceeds n.
  int32_t admit(SeqId seq, const TokenId* tokens, int32_t n, const uint64_t* hashes,
                int32_t num_hashes, uint64_t extra_key, int32_t max_cached_tokens,
                int32_t num_new_tokens, Slot* slots_out, std::vector<CowPair>& cow_out,
                bool cache_new_blocks = true);

  // --- growth -------------------------------------------------------------------------------
  // Blocks append(seq, n) would take from the pool (new blocks plus a copy-on-write copy).
  // Throws if n < 0 or num_tokens(seq) + n would exceed kMaxSeqTokens (so do can_append,
  // append and append_batch, before changing anything).
  int32_t blocks_needed(SeqId seq, int32_t n) const;
  // True if append(seq, n) would succeed now (no watermark: running sequences may use it).
  bool can_append(SeqId seq, int32_t n) const;
  // Reserves slots for the `n` tokens `tokens` that follow `seq`'s current ones, writes their
  // slots to slots_out[0..n) and appends copy-on-write pairs to cow_out. Returns false and
  // changes nothing when the pool cannot supply the blocks; throws (changing nothing) when the
  // sequence would exceed kMaxSeqTokens tokens.
  bool append(SeqId seq, const TokenId* tokens, int32_t n, Slot* slots_out,
              std::vector<CowPair>& cow_out);
  // append() for many sequences at once, all or nothing: counts[i] tokens for seqs[i], their
  // ids concatenated in `tokens`, their slots concatenated in `slots_out`.
  bool append_batch(const SeqId* seqs, const int32_t* counts, int32_t num_seqs,
                    const TokenId* tokens, Slot* slots_out, std::vector<CowPair>& cow_out);

  // --- sharing and release ------------------------------------------------------------------
  // Registers `child` as a copy of `parent` sharing every block (refcount + 1 each).
  void fork(SeqId parent, SeqId child);
  // Drops logical blocks [begin, end) of `seq` from its table (never read again: block-sparse
  // streaming attention); each loses this sequence's reference and goes back to the allocator
  // (or to the prefix cache's parked list) once no other table holds it. The last block (the
  // one being written) cannot be dropped. Returns the blocks newly dropped from the table.
  int32_t drop_blocks(SeqId seq, int32_t begin, int32_t end);
  // Registers none of `seq`'s blocks that fill from now on in the prefix cache (its blocks
  // registered so far stay findable); its forks inherit this. For K/V that other sequences
  // must not reuse: computed by approximate (block-sparse) attention. Throws if unknown.
  void stop_caching(SeqId seq);
  // Whether `seq`'s blocks are still registered as they fill (false after stop_caching, and
  // with prefix caching off). Throws if unknown.
  bool caching(SeqId seq) const;
  // Drops `seq`'s references (tail first) and forgets it. Cached blocks that reach refcount 0
  // are parked for later hits; the others become free.
  void free(SeqId seq);
  // Empties the prefix cache: parked blocks become free, used ones stop being findable.
  void reset_prefix_cache();

  // --- queries ------------------------------------------------------------------------------
  // True if `seq` is registered.
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  // Tokens with reserved slots for `seq`. Throws if unknown.
  int32_t num_tokens(SeqId seq) const;
  // The block table of `seq`. Throws if unknown.
  const BlockTable& block_table(SeqId seq) const;
  // Most blocks held by any of `seqs`.
  int32_t max_num_blocks(const SeqId* seqs, int32_t num_seqs) const;
  // Writes the block tables of `seqs` as rows of `width` ids into out[num_seqs * width]: a
  // dropped block (drop_blocks) is -1 (BlockTable::kDroppedBlock), the entries past a table's
  // end are 0. Throws if a table is wider than `width`.
  void export_block_tables(const SeqId* seqs, int32_t num_seqs, int32_t width, int32_t* out) const;
  // Refcount of block `b` (number of block tables holding it).
  int32_t refcount(BlockId b) const { return allocator_.refcount(b); }
  // Blocks that allocation may take now: free plus parked (evictable).
  int32_t num_available_blocks() const { return allocator_.num_free() + cache_.num_parked(); }
  // Current figures.
  KVCacheStats stats() const;
  // Sets peak_used_blocks to the current used count.
  void reset_peak() { peak_used_ = used_blocks(); }

  // Underlying parts, read-only (tests, stats, the property-test model).
  const BlockAllocator& allocator() const { return allocator_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return allocator_.capacity(); }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  int32_t watermark_blocks() const { return watermark_blocks_; }

 private:
  struct SeqState {
    explicit SeqState(int32_t block_size) : table(block_size) {}
    BlockTable table;
    int32_t num_tokens = 0;
    uint64_t extra_key = 0;
    uint64_t last_hash = PrefixCache::kRootHash;  // hash of the last full block
    std::vector<TokenId> partial;                 // tokens of the unfilled last block
    bool cache_new_blocks = true;                 // register blocks as they fill
  };

  // Walks the prefix cache; fills `hits` with matched blocks, returns the last block's hash.
  // At most max_blocks blocks (-1: the (n - 1) / block_size rule alone); hashes[0..num_hashes)
  // are reused where given.
  uint64_t match_prefix(const TokenId* prompt, int32_t n, uint64_t extra_key,
                        std::vector<BlockId>& hits, const uint64_t* hashes = nullptr,
                        int32_t num_hashes = 0, int32_t max_blocks = -1) const;
  // Registers `seq` holding the matched `hits` (last_hash: the last hit's hash).
  SeqState& register_seq(SeqId seq, uint64_t extra_key, uint64_t last_hash,
                         const std::vector<BlockId>& hits, int32_t num_query_tokens);
  // Checks the constructor's arguments (before any member is built); returns block_size.
  static int32_t checked_block_size(int32_t num_blocks, int32_t block_size,
                                    int32_t watermark_blocks);
  SeqState& state(SeqId seq);
  const SeqState& state(SeqId seq) const;
  // Takes one block from the pool, evicting a parked cached block if none is free.
  BlockId take_block();
  // Drops one reference of `b`, parking or freeing it at zero.
  void drop_ref(BlockId b);
  void append_one_seq(SeqState& s, const TokenId* tokens, int32_t n, Slot* slots_out,
                      std::vector<CowPair>& cow_out);
  int32_t used_blocks() const {
    return allocator_.capacity() - allocator_.num_free() - cache_.num_parked();
  }
  void note_usage() { if (used_blocks() > peak_used_) peak_used_ = used_blocks(); }

  int32_t block_size_;
  bool enable_prefix_caching_;
  int32_t watermark_blocks_;
  BlockAllocator allocator_;
  PrefixCache cache_;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::vector<int32_t> fill_;  // tokens written in each block
  int64_t tokens_stored_ = 0;
  int32_t peak_used_ = 0;
  int64_t queries_ = 0;
  int64_t hits_ = 0;
  int64_t evictions_ = 0;
  int64_t cow_copies_ = 0;
  std::vector<BlockId> scratch_;    // reused buffer for released block ids
  std::vector<SeqId> seq_scratch_;  // reused buffer for append_batch's duplicate check
};

}  // namespace pagedllm
