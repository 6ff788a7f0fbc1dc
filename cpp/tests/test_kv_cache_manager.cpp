#include <gtest/gtest.h>

#include <climits>
#include <numeric>
#include <string>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/kv_cache_manager.h"

namespace pagedllm {
namespace {

std::vector<TokenId> iota_tokens(int32_t n, TokenId start = 1) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Admits `seq` with `prompt` and appends the uncached part; returns the slots.
std::vector<Slot> admit(KVCacheManager& m, SeqId seq, const std::vector<TokenId>& prompt,
                        uint64_t extra = 0) {
  const int32_t n = static_cast<int32_t>(prompt.size());
  const int32_t cached = m.allocate(seq, prompt.data(), n, extra);
  std::vector<Slot> slots(static_cast<size_t>(n - cached));
  std::vector<CowPair> cow;
  EXPECT_TRUE(m.append(seq, prompt.data() + cached, n - cached, slots.data(), cow));
  EXPECT_TRUE(cow.empty());
  return slots;
}

TEST(KVCacheManager, AllocateAndAppendGiveExactSlots) {
  KVCacheManager m(8, 4);
  const auto slots = admit(m, 1, iota_tokens(6));
  EXPECT_EQ(slots, (std::vector<Slot>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(m.num_tokens(1), 6);
  EXPECT_EQ(m.block_table(1).blocks(), (std::vector<BlockId>{0, 1}));
  const auto st = m.stats();
  EXPECT_EQ(st.used_blocks, 2);
  EXPECT_EQ(st.tokens_stored, 6);
  EXPECT_EQ(st.slots_reserved, 8);
  EXPECT_EQ(st.slots_empty, 2);
  EXPECT_EQ(st.cached_entries, 1);  // the first (full) block is findable
}

TEST(KVCacheManager, PrefixHitReusesBlocksAndRecomputesLastToken) {
  KVCacheManager m(16, 4);
  const auto prompt = iota_tokens(8);  // exactly two full blocks
  admit(m, 1, prompt);
  m.free(1);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  // The whole prompt is cached, but the last token is always recomputed: only block 0 hits.
  EXPECT_EQ(m.num_cached_tokens(prompt.data(), 8, 0), 4);
  EXPECT_EQ(m.allocate(2, prompt.data(), 8, 0), 4);
  EXPECT_EQ(m.block_table(2).blocks(), (std::vector<BlockId>{0}));
  // A longer prompt with the same 8-token prefix hits both blocks.
  auto longer = iota_tokens(11);
  EXPECT_EQ(m.allocate(3, longer.data(), 11, 0), 8);
  EXPECT_EQ(m.block_table(3).blocks(), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(m.refcount(0), 2);
  const auto st = m.stats();
  EXPECT_EQ(st.prefix_cache_queries, 8 + 8 + 11);
  EXPECT_EQ(st.prefix_cache_hits, 4 + 8);
  // The extra key separates tenants.
  EXPECT_EQ(m.num_cached_tokens(longer.data(), 11, /*extra_key=*/5), 0);
}

TEST(KVCacheManager, EvictsTailBeforeHeadOnlyWhenNeeded) {
  KVCacheManager m(4, 2);
  admit(m, 1, iota_tokens(6));  // blocks 0,1,2 all full
  m.free(1);                    // parked tail first: 2, 1, 0
  EXPECT_EQ(m.stats().cached_blocks, 3);
  EXPECT_EQ(m.stats().free_blocks, 1);
  EXPECT_EQ(m.prefix_cache().lru_front(), 2);
  // A new unrelated sequence needing 2 blocks takes the free block 3, then evicts block 2.
  const auto slots = admit(m, 2, iota_tokens(4, 100));
  EXPECT_EQ(m.block_table(2).blocks(), (std::vector<BlockId>{3, 2}));
  EXPECT_EQ(slots, (std::vector<Slot>{6, 7, 4, 5}));
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_EQ(m.prefix_cache().lru_front(), 1);
  // The head of the old chain is still findable.
  const auto old = iota_tokens(6);
  EXPECT_EQ(m.num_cached_tokens(old.data(), 6, 0), 4);
}

TEST(KVCacheManager, ForkSharesBlocksAndCopiesOnWrite) {
  KVCacheManager m(8, 4);
  admit(m, 1, iota_tokens(6));  // blocks 0 (full), 1 (2 tokens)
  m.fork(1, 2);
  EXPECT_EQ(m.refcount(0), 2);
  EXPECT_EQ(m.refcount(1), 2);
  EXPECT_EQ(m.stats().used_blocks, 2);
  EXPECT_EQ(m.stats().tokens_stored, 6);  // shared blocks count once
  std::vector<Slot> slot(1);
  std::vector<CowPair> cow;
  const TokenId t = 50;
  EXPECT_EQ(m.blocks_needed(2, 1), 1);
  ASSERT_TRUE(m.append(2, &t, 1, slot.data(), cow));
  ASSERT_EQ(cow.size(), 1u);
  EXPECT_EQ(cow[0].src, 1);
  EXPECT_EQ(cow[0].dst, 2);
  EXPECT_EQ(slot[0], 2 * 4 + 2);
  EXPECT_EQ(m.block_table(2).blocks(), (std::vector<BlockId>{0, 2}));
  // The parent is now the only user of block 1: no copy.
  cow.clear();
  const TokenId u = 60;
  ASSERT_TRUE(m.append(1, &u, 1, slot.data(), cow));
  EXPECT_TRUE(cow.empty());
  EXPECT_EQ(slot[0], 1 * 4 + 2);
  EXPECT_EQ(m.stats().tokens_stored, 4 + 3 + 3);
  EXPECT_EQ(m.stats().cow_copies, 1);
}

TEST(KVCacheManager, DropBlocksFreesUnsharedBlocksOnly) {
  KVCacheManager m(8, 4, /*enable_prefix_caching=*/false);
  admit(m, 1, iota_tokens(14));  // blocks 0, 1, 2 full; 3 holds 2 tokens
  m.fork(1, 2);                  // every block shared
  EXPECT_EQ(m.drop_blocks(1, 1, 3), 2);
  EXPECT_EQ(m.block_table(1).blocks(),
            (std::vector<BlockId>{0, BlockTable::kDroppedBlock, BlockTable::kDroppedBlock, 3}));
  EXPECT_EQ(m.refcount(1), 1);  // still the child's
  EXPECT_EQ(m.stats().used_blocks, 4);
  EXPECT_EQ(m.drop_blocks(2, 0, 3), 3);  // the child lets go: blocks 1 and 2 are free now
  EXPECT_EQ(m.refcount(0), 1);
  EXPECT_EQ(m.refcount(1), 0);
  EXPECT_EQ(m.stats().used_blocks, 2);
  EXPECT_EQ(m.stats().free_blocks, 6);
  EXPECT_EQ(m.stats().tokens_stored, 4 + 2);
  EXPECT_EQ(m.drop_blocks(1, 1, 3), 0);  // idempotent
  EXPECT_THROW(m.drop_blocks(1, 0, 4), Error);  // the block being written stays
  // Appending still works; positions keep counting past the dropped blocks.
  std::vector<Slot> slot(1);
  std::vector<CowPair> cow;
  const TokenId t = 99;
  ASSERT_TRUE(m.append(1, &t, 1, slot.data(), cow));
  ASSERT_EQ(cow.size(), 1u);  // block 3 is still shared with the child: copy-on-write
  EXPECT_EQ(m.num_tokens(1), 15);
  m.fork(1, 3);  // a fork of a table with dropped entries takes no reference for them
  m.free(1);
  m.free(2);
  m.free(3);
  EXPECT_EQ(m.stats().used_blocks, 0);
  EXPECT_EQ(m.stats().free_blocks, 8);
}

TEST(KVCacheManager, DroppedCachedBlockIsParked) {
  KVCacheManager m(8, 4);
  admit(m, 1, iota_tokens(10));  // blocks 0, 1 full (cached), 2 partial
  EXPECT_EQ(m.drop_blocks(1, 1, 2), 1);
  EXPECT_EQ(m.stats().cached_blocks, 1);  // parked, reusable by a later prompt
  admit(m, 2, iota_tokens(9));
  EXPECT_EQ(m.block_table(2).blocks()[1], 1);  // the prefix hit found it
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.stats().used_blocks, 0);
}

TEST(KVCacheManager, StopCachingKeepsLaterBlocksOutOfThePrefixCache) {
  KVCacheManager m(16, 4);
  const auto prompt = iota_tokens(10);  // blocks 0, 1 full (registered), 2 holds 2 tokens
  admit(m, 1, prompt);
  EXPECT_TRUE(m.caching(1));
  m.stop_caching(1);
  EXPECT_FALSE(m.caching(1));
  std::vector<Slot> slots(6);
  std::vector<CowPair> cow;
  const auto more = iota_tokens(6, 11);  // fills block 2 and block 3
  ASSERT_TRUE(m.append(1, more.data(), 6, slots.data(), cow));
  m.fork(1, 2);
  EXPECT_FALSE(m.caching(2));  // forks inherit it
  // A prompt of the same 16 tokens finds the two blocks filled before, not the later ones.
  auto all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  all.push_back(99);
  EXPECT_EQ(m.num_cached_tokens(all.data(), static_cast<int32_t>(all.size()), 0), 8);
  m.free(1);
  m.free(2);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  EXPECT_EQ(m.stats().used_blocks, 0);
  EXPECT_THROW(m.stop_caching(7), Error);
  // admit(..., cache_new_blocks = false): the cached prefix is used, nothing new registered.
  const auto longer = iota_tokens(20, 40);
  std::vector<Slot> s3(20);
  EXPECT_EQ(m.admit(3, longer.data(), 20, nullptr, 0, 0, 0, 20, s3.data(), cow, false), 0);
  EXPECT_FALSE(m.caching(3));
  EXPECT_EQ(m.num_cached_tokens(longer.data(), 20, 0), 0);
  m.free(3);
  KVCacheManager off(4, 4, /*enable_prefix_caching=*/false);
  admit(off, 1, iota_tokens(3));
  EXPECT_FALSE(off.caching(1));
}

TEST(KVCacheManager, FailedAppendChangesNothing) {
  KVCacheManager m(3, 4, /*enable_prefix_caching=*/false);
  admit(m, 1, iota_tokens(8));
  const auto before = m.stats();
  std::vector<Slot> slots(8);
  std::vector<CowPair> cow;
  const auto more = iota_tokens(8);
  EXPECT_FALSE(m.can_append(1, 8));
  EXPECT_FALSE(m.append(1, more.data(), 8, slots.data(), cow));
  EXPECT_EQ(m.num_tokens(1), 8);
  EXPECT_EQ(m.stats().used_blocks, before.used_blocks);
  EXPECT_TRUE(m.append(1, more.data(), 4, slots.data(), cow));
}

TEST(KVCacheManager, AppendBatchIsAllOrNothing) {
  KVCacheManager m(4, 2, false);
  admit(m, 1, iota_tokens(2));
  admit(m, 2, iota_tokens(2));
  const std::vector<SeqId> seqs{1, 2};
  const std::vector<int32_t> counts{2, 3};  // needs 1 + 2 blocks, only 2 free
  const auto toks = iota_tokens(5);
  std::vector<Slot> slots(5);
  std::vector<CowPair> cow;
  EXPECT_FALSE(m.append_batch(seqs.data(), counts.data(), 2, toks.data(), slots.data(), cow));
  EXPECT_EQ(m.num_tokens(1), 2);
  EXPECT_EQ(m.num_tokens(2), 2);
  const std::vector<int32_t> fits{1, 1};
  ASSERT_TRUE(m.append_batch(seqs.data(), fits.data(), 2, toks.data(), slots.data(), cow));
  EXPECT_EQ(slots[0], 2 * 2);  // seq 1 took block 2
  EXPECT_EQ(slots[1], 3 * 2);  // seq 2 took block 3
  const std::vector<SeqId> dup{1, 1};
  EXPECT_THROW(m.append_batch(dup.data(), fits.data(), 2, toks.data(), slots.data(), cow), Error);
}

TEST(KVCacheManager, WatermarkLimitsAdmissionOnly) {
  KVCacheManager m(4, 4, false, /*watermark_blocks=*/2);
  const auto p = iota_tokens(12);
  EXPECT_FALSE(m.can_allocate(p.data(), 12, 0, 12));  // 3 blocks + 2 watermark > 4
  EXPECT_TRUE(m.can_allocate(p.data(), 12, 0, 8));
  admit(m, 1, iota_tokens(8));
  EXPECT_TRUE(m.can_append(1, 8));  // running sequences may dip into the watermark
}

TEST(KVCacheManager, ExportBlockTablesPadsWithZero) {
  KVCacheManager m(8, 2, false);
  admit(m, 1, iota_tokens(5));
  admit(m, 2, iota_tokens(1));
  const std::vector<SeqId> seqs{2, 1};
  EXPECT_EQ(m.max_num_blocks(seqs.data(), 2), 3);
  std::vector<int32_t> out(6, -7);
  m.export_block_tables(seqs.data(), 2, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{3, 0, 0, 0, 1, 2}));
  EXPECT_THROW(m.export_block_tables(seqs.data(), 2, 2, out.data()), Error);
}

TEST(KVCacheManager, ExportBlockTablesMarksDroppedBlocksMinusOne) {
  KVCacheManager m(8, 2, false);
  admit(m, 1, iota_tokens(5));  // blocks 0, 1, 2
  EXPECT_EQ(m.drop_blocks(1, 0, 1), 1);
  const SeqId seq = 1;
  std::vector<int32_t> out(4, -7);
  m.export_block_tables(&seq, 1, 4, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{BlockTable::kDroppedBlock, 1, 2, 0}));
}

TEST(KVCacheManager, ResetPrefixCacheFreesParkedBlocks) {
  KVCacheManager m(8, 2);
  admit(m, 1, iota_tokens(4));
  m.free(1);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  m.reset_prefix_cache();
  const auto st = m.stats();
  EXPECT_EQ(st.cached_blocks, 0);
  EXPECT_EQ(st.free_blocks, 8);
  EXPECT_EQ(st.cached_entries, 0);
}

TEST(KVCacheManager, ErrorsNameTheProblem) {
  KVCacheManager m(4, 4);
  const auto p = iota_tokens(3);
  m.allocate(1, p.data(), 3, 0);
  EXPECT_THROW(m.allocate(1, p.data(), 3, 0), Error);  // already allocated
  EXPECT_THROW(m.allocate(2, p.data(), 0, 0), Error);  // empty prompt
  EXPECT_THROW(m.free(9), Error);
  EXPECT_THROW(m.fork(9, 10), Error);
  EXPECT_THROW(m.fork(1, 1), Error);
  EXPECT_THROW(KVCacheManager(4, 0), Error);
  EXPECT_THROW(KVCacheManager(4, 4, true, 4), Error);
  try {
    m.free(9);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown sequence id 9"), std::string::npos);
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
  }
}

// The arguments are checked before the pool and the prefix cache are built: a size whose
// prefix cache (num_blocks * block_size token ids) could not even be allocated is refused with
// the manager's own message, not std::bad_alloc.
TEST(KVCacheManager, ConstructorChecksArgumentsBeforeAllocating) {
  const auto message = [](int32_t num_blocks, int32_t block_size, int32_t watermark) {
    try {
      KVCacheManager m(num_blocks, block_size, true, watermark);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return std::string(e.what());
    }
    ADD_FAILURE() << "KVCacheManager(" << num_blocks << ", " << block_size << ") did not throw";
    return std::string();
  };
  auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  std::string m = message(1 << 20, 1 << 20, 0);  // 2^40 slots: 4 TiB of prefix-cache ids
  EXPECT_TRUE(has(m, "KVCacheManager: num_blocks * block_size = 1048576 * 1048576")) << m;
  m = message(16, 0, 0);
  EXPECT_TRUE(has(m, "KVCacheManager: block_size must be >= 1, got 0")) << m;
  m = message(0, 4, 0);
  EXPECT_TRUE(has(m, "KVCacheManager: num_blocks must be in [1, 1073741824], got 0")) << m;
  m = message(BlockAllocator::kMaxBlocks + 1, 1, 0);
  EXPECT_TRUE(has(m, "KVCacheManager: num_blocks")) << m;
  m = message(4, 4, -1);
  EXPECT_TRUE(has(m, "KVCacheManager: watermark_blocks must be in [0, 4), got -1")) << m;
}

// can_allocate counts blocks in int64: 2 cached blocks plus INT32_MAX new tokens at block_size 1
// are 2^31 + 1 blocks, which an int32 count wrapped negative (and so "fit" a 16-block pool).
TEST(KVCacheManager, CanAllocateHugeRequestsAreFalse) {
  KVCacheManager m(16, 1);
  const auto p = iota_tokens(3);
  admit(m, 1, p);
  m.free(1);
  ASSERT_EQ(m.num_cached_tokens(p.data(), 3, 0), 2);
  EXPECT_FALSE(m.can_allocate(p.data(), 3, 0, INT32_MAX));
  EXPECT_FALSE(m.can_allocate(p.data(), 3, 0, INT32_MAX - 1));
  EXPECT_TRUE(m.can_allocate(p.data(), 3, 0, 14));  // 2 cached + 14 new = the whole pool
  EXPECT_FALSE(m.can_allocate(p.data(), 3, 0, 15));
}

// A sequence's token count is int32: a streaming sequence that drops its old blocks keeps
// growing it. Every append path refuses, changing nothing, the tokens that would pass 2^31 - 1
// (before, num_tokens wrapped negative and the slots repeated).
TEST(KVCacheManager, SequenceTokenCountNeverWraps) {
  KVCacheManager m(8, 4, false);
  admit(m, 1, iota_tokens(5));
  admit(m, 2, iota_tokens(1));
  const int32_t room = KVCacheManager::kMaxSeqTokens - 5;
  EXPECT_EQ(m.blocks_needed(1, room), (1 << 29) - 2);  // 2^31 - 1 tokens in 2^29 blocks, 2 held
  EXPECT_FALSE(m.can_append(1, room));                 // ... that this pool cannot supply
  try {
    m.can_append(1, room + 1);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sequence 1 holds 5 tokens; appending n = 2147483643 "
                                         "more would exceed 2147483647"),
              std::string::npos)
        << e.what();
  }
  std::vector<Slot> slots(8);
  std::vector<CowPair> cow;
  const auto t = iota_tokens(8);
  EXPECT_THROW(m.append(1, t.data(), room + 1, slots.data(), cow), Error);
  // append_batch checks every sequence before it appends to any.
  const SeqId seqs[2] = {2, 1};
  const int32_t counts[2] = {1, room + 1};
  EXPECT_THROW(m.append_batch(seqs, counts, 2, t.data(), slots.data(), cow), Error);
  EXPECT_EQ(m.num_tokens(1), 5);
  EXPECT_EQ(m.num_tokens(2), 1);
  EXPECT_EQ(m.stats().tokens_stored, 6);
  EXPECT_TRUE(cow.empty());
}

TEST(KVCacheManager, EverythingReturnsAfterFree) {
  KVCacheManager m(32, 4);
  for (SeqId s = 0; s < 5; ++s) admit(m, s, iota_tokens(5 + static_cast<int32_t>(s) * 3));
  m.fork(4, 10);
  for (SeqId s : {0, 1, 2, 3, 4, 10}) m.free(s);
  const auto st = m.stats();
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.free_blocks + st.cached_blocks, 32);
  EXPECT_EQ(st.tokens_stored, 0);
  EXPECT_EQ(st.num_seqs, 0);
}

// The hashed admission path (one ask, one do) agrees with allocate + append.
TEST(KVCacheManager, HashedAdmissionMatchesAllocateAppend) {
  KVCacheManager m(10, 4, true, 1);
  const auto t = iota_tokens(14);
  std::vector<uint64_t> h;
  m.block_hashes(t.data(), 14, 0, h);
  ASSERT_EQ(h.size(), 3u);
  // Nothing cached: 9 spare blocks (10 - watermark 1) would hold 36 tokens; 14 wanted.
  auto q = m.query_admission(t.data(), 14, h.data(), 3, 0, 1 << 30, 14);
  EXPECT_EQ(q, (std::pair<int32_t, int32_t>{0, 14}));
  std::vector<Slot> slots(14);
  std::vector<CowPair> cow;
  EXPECT_EQ(m.admit(1, t.data(), 14, h.data(), 3, 0, 1 << 30, 14, slots.data(), cow), 0);
  EXPECT_EQ(m.num_tokens(1), 14);
  m.free(1);
  // Its three full blocks are parked: the last prompt token is recomputed (at most 12 cached).
  q = m.query_admission(t.data(), 14, h.data(), 3, 0, 1 << 30, 14);
  EXPECT_EQ(q.first, 12);
  EXPECT_EQ(q.second, 2);
  // max_cached_tokens caps the prefix (prompt logprobs: 0; a swap-in: the computed tokens).
  EXPECT_EQ(m.query_admission(t.data(), 14, h.data(), 3, 0, 5, 14).first, 4);
  EXPECT_EQ(m.query_admission(t.data(), 14, h.data(), 0, 0, 0, 14).first, 0);
  // Hashes past the given ones are computed: the same hit without any.
  EXPECT_EQ(m.query_admission(t.data(), 14, nullptr, 0, 0, 1 << 30, 14).first, 12);
  EXPECT_EQ(m.admit(2, t.data(), 14, h.data(), 3, 0, 1 << 30, 2, slots.data(), cow), 12);
  EXPECT_EQ(m.num_tokens(2), 14);
  EXPECT_THROW(m.admit(2, t.data(), 14, h.data(), 3, 0, 0, 1, slots.data(), cow), Error);
  EXPECT_THROW(m.admit(3, t.data(), 14, h.data(), 3, 0, 0, 15, slots.data(), cow), Error);
}

TEST(KVCacheManager, AdmitOutOfBlocksChangesNothing) {
  KVCacheManager m(4, 4);
  const auto t = iota_tokens(20);
  std::vector<Slot> slots(20);
  std::vector<CowPair> cow;
  const auto q = m.query_admission(t.data(), 20, nullptr, 0, 0, 0, 20);
  EXPECT_EQ(q.second, 16);  // four blocks of four
  EXPECT_EQ(m.admit(1, t.data(), 20, nullptr, 0, 0, 0, 20, slots.data(), cow), -1);
  EXPECT_FALSE(m.contains(1));
  EXPECT_EQ(m.stats().free_blocks, 4);
}

}  // namespace
}  // namespace pagedllm
