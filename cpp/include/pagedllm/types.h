// pagedllm/types.h — the small value types shared by the core.
#pragma once

#include <cstdint>

namespace pagedllm {

using BlockId = int32_t;  // physical block index in [0, num_blocks)
using SeqId = int64_t;    // caller-chosen sequence identifier
using TokenId = int32_t;  // vocabulary index
using Slot = int64_t;     // block_id * block_size + offset inside the block

constexpr BlockId kNoBlock = -1;

}  // namespace pagedllm
