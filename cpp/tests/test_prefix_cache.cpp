#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/prefix_cache.h"

namespace pagedllm {
namespace {

constexpr int32_t kBs = 4;

TEST(PrefixCache, HashIsChainedAndKeyed) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  const uint64_t ha = c.block_hash(PrefixCache::kRootHash, a.data(), 0);
  EXPECT_EQ(ha, c.block_hash(PrefixCache::kRootHash, a.data(), 0));
  EXPECT_NE(ha, c.block_hash(PrefixCache::kRootHash, b.data(), 0));
  EXPECT_NE(ha, c.block_hash(PrefixCache::kRootHash, a.data(), 7));   // extra key
  EXPECT_NE(ha, c.block_hash(ha, a.data(), 0));                       // parent
}

TEST(PrefixCache, CollisionNeverYieldsAWrongBlock) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> a{1, 2, 3, 4}, b{9, 9, 9, 9};
  const uint64_t forced_hash = 42;  // pretend both blocks hash to the same value
  ASSERT_TRUE(c.insert(forced_hash, 3, kNoBlock, a.data(), 0));
  EXPECT_EQ(c.lookup(forced_hash, kNoBlock, a.data(), 0), std::optional<BlockId>(3));
  EXPECT_FALSE(c.lookup(forced_hash, kNoBlock, b.data(), 0).has_value());  // other tokens
  EXPECT_FALSE(c.lookup(forced_hash, kNoBlock, a.data(), 1).has_value());  // other extra key
  EXPECT_FALSE(c.lookup(forced_hash, 5, a.data(), 0).has_value());         // other parent
  EXPECT_FALSE(c.insert(forced_hash, 4, kNoBlock, b.data(), 0));           // hash taken
}

TEST(PrefixCache, ChildNeedsCachedParent) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> a{1, 2, 3, 4};
  EXPECT_FALSE(c.insert(7, 1, /*parent=*/0, a.data(), 0));  // block 0 is not cached
  EXPECT_TRUE(c.insert(7, 0, kNoBlock, a.data(), 0));
  EXPECT_TRUE(c.insert(8, 1, 0, a.data(), 0));
  EXPECT_FALSE(c.insert(9, 1, 0, a.data(), 0));  // block 1 already cached
  EXPECT_EQ(c.num_cached(), 2);
}

TEST(PrefixCache, EvictsLeastRecentlyParkedFirst) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> t{1, 2, 3, 4};
  for (BlockId b = 0; b < 3; ++b) ASSERT_TRUE(c.insert(100 + b, b, kNoBlock, t.data(), 0));
  c.park(2);
  c.park(0);
  c.park(1);
  EXPECT_EQ(c.lru_front(), 2);
  c.unpark(0);  // hit: no longer evictable
  std::vector<BlockId> released;
  EXPECT_EQ(c.evict_lru(released), 1);
  EXPECT_EQ(released, (std::vector<BlockId>{2}));
  EXPECT_EQ(c.evict_lru(released), 1);
  EXPECT_EQ(released, (std::vector<BlockId>{2, 1}));
  EXPECT_EQ(c.evict_lru(released), 0);  // block 0 is held, not parked
  EXPECT_TRUE(c.is_cached(0));
  EXPECT_EQ(c.num_parked(), 0);
}

TEST(PrefixCache, EvictingAParentRemovesItsDescendants) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> t{1, 2, 3, 4};
  ASSERT_TRUE(c.insert(10, 0, kNoBlock, t.data(), 0));
  ASSERT_TRUE(c.insert(11, 1, 0, t.data(), 0));
  ASSERT_TRUE(c.insert(12, 2, 1, t.data(), 0));
  c.park(0);  // parent parked first (older) to force the cascade
  c.park(2);
  c.park(1);
  std::vector<BlockId> released;
  EXPECT_EQ(c.evict_lru(released), 3);
  EXPECT_EQ(released.size(), 3u);
  EXPECT_EQ(c.num_cached(), 0);
  EXPECT_EQ(c.num_parked(), 0);
  EXPECT_FALSE(c.lookup(11, 0, t.data(), 0).has_value());
}

TEST(PrefixCache, ResetReleasesParkedBlocks) {
  PrefixCache c(8, kBs);
  const std::vector<TokenId> t{1, 2, 3, 4};
  ASSERT_TRUE(c.insert(10, 0, kNoBlock, t.data(), 0));
  ASSERT_TRUE(c.insert(11, 1, 0, t.data(), 0));
  c.park(1);
  std::vector<BlockId> released;
  c.reset(released);
  EXPECT_EQ(released, (std::vector<BlockId>{1}));
  EXPECT_EQ(c.num_cached(), 0);
  EXPECT_FALSE(c.is_cached(0));
  EXPECT_EQ(c.lru_front(), kNoBlock);
}

// The public methods check their ids and the park state: out-of-pool ids are IndexError-kind
// errors (ASan: heap-buffer-overflow before), double park / unpark of an unparked block are
// state errors in every build (they were debug-only asserts), and nothing changes.
TEST(PrefixCache, PublicMethodsCheckIdsAndState) {
  PrefixCache c(4, kBs);
  const std::vector<TokenId> t{1, 2, 3, 4};
  const auto kind_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return e.kind();
    }
    ADD_FAILURE() << "expected an error";
    return ErrorKind::kIo;
  };
  for (const BlockId b : {-1, 4, 1000000}) {
    SCOPED_TRACE(b);
    EXPECT_EQ(kind_of([&] { c.is_cached(b); }), ErrorKind::kOutOfRange);
    EXPECT_EQ(kind_of([&] { c.is_parked(b); }), ErrorKind::kOutOfRange);
    EXPECT_EQ(kind_of([&] { c.park(b); }), ErrorKind::kOutOfRange);
    EXPECT_EQ(kind_of([&] { c.unpark(b); }), ErrorKind::kOutOfRange);
    EXPECT_EQ(kind_of([&] { c.insert(50, b, kNoBlock, t.data(), 0); }), ErrorKind::kOutOfRange);
    if (b != -1)  // -1 is kNoBlock: a root block
      EXPECT_EQ(kind_of([&] { c.insert(51, 0, b, t.data(), 0); }), ErrorKind::kOutOfRange);
  }
  EXPECT_EQ(kind_of([&] { c.insert(52, 0, -2, t.data(), 0); }), ErrorKind::kOutOfRange);
  EXPECT_EQ(c.num_cached(), 0);
  EXPECT_EQ(kind_of([&] { c.park(0); }), ErrorKind::kInvalidState);  // not cached
  ASSERT_TRUE(c.insert(10, 0, kNoBlock, t.data(), 0));
  EXPECT_EQ(kind_of([&] { c.unpark(0); }), ErrorKind::kInvalidState);  // cached, not parked
  c.park(0);
  try {
    c.park(0);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("PrefixCache::park: block 0 is already parked"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.num_parked(), 1);
  EXPECT_EQ(c.lru_front(), 0);
  c.unpark(0);
  EXPECT_EQ(kind_of([&] { c.unpark(0); }), ErrorKind::kInvalidState);
  EXPECT_EQ(c.num_parked(), 0);
  EXPECT_EQ(c.lru_front(), kNoBlock);
  try {
    c.is_cached(4);
    ADD_FAILURE() << "is_cached(4) on a 4-block pool did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PrefixCache::is_cached: block 4 is outside the pool [0, 4)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagedllm
