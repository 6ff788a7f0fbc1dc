#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "pagedllm/block_allocator.h"
#include "pagedllm/error.h"

namespace pagedllm {
namespace {

TEST(BlockAllocator, AllocatesLowestFreeIdsInOrder) {
  BlockAllocator a(5);
  EXPECT_EQ(a.capacity(), 5);
  EXPECT_EQ(a.num_free(), 5);
  for (BlockId expected = 0; expected < 5; ++expected) EXPECT_EQ(*a.allocate(), expected);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_FALSE(a.allocate().has_value());  // running out is a result, not an error
}

TEST(BlockAllocator, ReusesFreedBlockFromHint) {
  BlockAllocator a(200);
  for (int i = 0; i < 200; ++i) a.allocate();
  EXPECT_TRUE(a.decref(130));
  EXPECT_TRUE(a.decref(7));
  // The hint moved to block 7's word, so 7 comes first, then 130.
  EXPECT_EQ(*a.allocate(), 7);
  EXPECT_EQ(*a.allocate(), 130);
  EXPECT_FALSE(a.allocate().has_value());
}

TEST(BlockAllocator, NeverReturnsIdsPastCapacity) {
  BlockAllocator a(65);  // one full word plus one bit
  std::vector<BlockId> ids;
  ASSERT_TRUE(a.allocate_n(65, ids));
  for (int i = 0; i < 65; ++i) EXPECT_EQ(ids[static_cast<size_t>(i)], i);
  EXPECT_FALSE(a.allocate().has_value());
}

TEST(BlockAllocator, AllocateNIsAllOrNothing) {
  BlockAllocator a(4);
  std::vector<BlockId> ids;
  EXPECT_FALSE(a.allocate_n(5, ids));
  EXPECT_TRUE(ids.empty());
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_TRUE(a.allocate_n(3, ids));
  EXPECT_EQ(ids, (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(a.num_free(), 1);
}

TEST(BlockAllocator, RefcountsFreeAtZero) {
  BlockAllocator a(2);
  const BlockId b = *a.allocate();
  a.incref(b);
  EXPECT_EQ(a.refcount(b), 2);
  EXPECT_FALSE(a.decref(b));
  EXPECT_TRUE(a.is_allocated(b));
  EXPECT_TRUE(a.decref(b));
  EXPECT_FALSE(a.is_allocated(b));
  EXPECT_EQ(a.num_free(), 2);
}

TEST(BlockAllocator, ParkedBlocksStayAllocatedUntilReleased) {
  BlockAllocator a(2);
  const BlockId b = *a.allocate();
  EXPECT_TRUE(a.decref(b, /*park_at_zero=*/true));
  EXPECT_TRUE(a.is_parked(b));
  EXPECT_EQ(a.num_free(), 1);  // parked blocks are not free
  a.incref(b);                 // revive
  EXPECT_EQ(a.refcount(b), 1);
  EXPECT_TRUE(a.decref(b, true));
  a.release(b);
  EXPECT_FALSE(a.is_allocated(b));
  EXPECT_EQ(a.num_free(), 2);
}

TEST(BlockAllocator, MisuseThrowsAndLeavesStateIntact) {
  BlockAllocator a(3);
  const BlockId b = *a.allocate();
  EXPECT_TRUE(a.decref(b));
  EXPECT_THROW(a.decref(b), Error);   // double free
  EXPECT_THROW(a.incref(b), Error);   // use of a free block
  EXPECT_THROW(a.release(b), Error);  // not parked
  EXPECT_THROW(a.refcount(3), Error);
  EXPECT_THROW(a.decref(-1), Error);
  EXPECT_EQ(a.num_free(), 3);
  try {
    a.decref(b);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos);
  }
  try {
    a.incref(99);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
  }
  EXPECT_THROW(BlockAllocator(0), Error);
}

// Sizes past kMaxBlocks are refused with a message (INT32_MAX overflowed the bitmap's word
// count, (n + 63) / 64 in int32, into a negative vector size).
TEST(BlockAllocator, RefusesPoolsLargerThanItSupports) {
  for (const int32_t n : {INT32_MAX, INT32_MAX - 10, BlockAllocator::kMaxBlocks + 1, -5}) {
    try {
      BlockAllocator a(n);
      ADD_FAILURE() << "BlockAllocator(" << n << ") did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("BlockAllocator: num_blocks must be in [1, 1073741824], got " +
                                           std::to_string(n)),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace pagedllm
