#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>

#include "pagedllm/block_table.h"
#include "pagedllm/error.h"

namespace pagedllm {
namespace {

TEST(BlockTable, MapsPositionsToSlots) {
  BlockTable t(4);
  t.append_block(9);
  t.append_block(2);
  EXPECT_EQ(t.num_blocks(), 2);
  EXPECT_EQ(t.capacity_tokens(), 8);
  EXPECT_EQ(t.slot(0), 36);
  EXPECT_EQ(t.slot(3), 39);
  EXPECT_EQ(t.slot(4), 8);
  EXPECT_EQ(t.slot(7), 11);
  EXPECT_THROW(t.slot(8), Error);
  EXPECT_THROW(t.slot(-1), Error);
}

TEST(BlockTable, ReplaceBlockForCopyOnWrite) {
  BlockTable t(16);
  t.append_block(1);
  t.append_block(5);
  t.replace_block(1, 6);
  EXPECT_EQ(t.blocks(), (std::vector<BlockId>{1, 6}));
  EXPECT_THROW(t.replace_block(2, 0), Error);
  EXPECT_THROW(t.block(2), Error);
}

TEST(BlockTable, BlocksForTokens) {
  EXPECT_EQ(blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(blocks_for_tokens(17, 16), 2);
  EXPECT_THROW(BlockTable(0), Error);
}

// Exact over the whole int64 range (the result was an int32 and the sum overflowed).
TEST(BlockTable, BlocksForTokensOverTheWholeRange) {
  EXPECT_EQ(blocks_for_tokens(int64_t{1} << 40, 1), int64_t{1} << 40);
  EXPECT_EQ(blocks_for_tokens((int64_t{1} << 40) + 1, 256), (int64_t{1} << 32) + 1);
  EXPECT_EQ(blocks_for_tokens(INT64_MAX, 16), INT64_MAX / 16 + 1);
  EXPECT_EQ(blocks_for_tokens(INT64_MAX, 1), INT64_MAX);
  EXPECT_EQ(blocks_for_tokens(INT64_MAX - 7, 8), INT64_MAX / 8);
  EXPECT_EQ(blocks_for_tokens(INT32_MAX, INT32_MAX), 1);
  EXPECT_THROW(blocks_for_tokens(-1, 16), Error);
  try {
    blocks_for_tokens(5, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("block_size must be >= 1, got 0"), std::string::npos);
  }
}

TEST(BlockTable, DropBlockKeepsPositions) {
  BlockTable t(4);
  for (BlockId b : {7, 3, 9}) t.append_block(b);
  EXPECT_EQ(t.drop_block(1), 3);
  EXPECT_EQ(t.drop_block(1), BlockTable::kDroppedBlock);  // already dropped: no change
  EXPECT_EQ(t.num_dropped(), 1);
  EXPECT_EQ(t.num_blocks(), 3);
  EXPECT_EQ(t.slot(9), 9 * 4 + 1);  // later positions unchanged
  EXPECT_THROW(t.slot(5), Error);
  EXPECT_THROW(t.drop_block(3), Error);
}

}  // namespace
}  // namespace pagedllm
