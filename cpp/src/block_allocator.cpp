#include "pagedllm/block_allocator.h"

#include "pagedllm/error.h"

namespace pagedllm {

BlockAllocator::BlockAllocator(int32_t num_blocks) : capacity_(num_blocks), num_free_(num_blocks) {
  PAGEDLLM_CHECK_ARG(num_blocks >= 1 && num_blocks <= kMaxBlocks,
                     "BlockAllocator: num_blocks must be in [1, " << kMaxBlocks << "], got "
                                                                  << num_blocks);
  const int64_t num_words = (int64_t{num_blocks} + 63) / 64;
  words_.assign(static_cast<size_t>(num_words), 0);
  // Mark the bits past the end of the pool as allocated so the scan never returns them.
  const int32_t tail = num_blocks & 63;
  if (tail != 0) words_.back() = ~uint64_t{0} << tail;
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
}

void BlockAllocator::check_id(BlockId id, const char* what) const {
  PAGEDLLM_CHECK_INDEX(id >= 0 && id < capacity_,
                       what << ": block id " << id << " is outside the pool [0, " << capacity_ << ")");
}

std::optional<BlockId> BlockAllocator::allocate() {
  if (num_free_ == 0) return std::nullopt;
  const int32_t num_words = static_cast<int32_t>(words_.size());
  int32_t w = hint_word_;
  for (int32_t scanned = 0; scanned < num_words; ++scanned) {
    const uint64_t free_bits = ~words_[w];
    if (free_bits != 0) {
      const BlockId id = (w << 6) + __builtin_ctzll(free_bits);
      words_[w] |= free_bits & (~free_bits + 1);  // set the lowest clear bit
      refcount_[id] = 1;
      --num_free_;
      hint_word_ = w;
      return id;
    }
    if (++w == num_words) w = 0;
  }
  PAGEDLLM_ASSERT(false);  // num_free_ > 0 but no clear bit: the bitmap is corrupt
  return std::nullopt;
}

bool BlockAllocator::allocate_n(int32_t n, std::vector<BlockId>& out) {
  PAGEDLLM_CHECK_ARG(n >= 0, "allocate_n: n must be >= 0, got " << n);
  if (n > num_free_) return false;
  out.reserve(out.size() + static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out.push_back(*allocate());
  return true;
}

void BlockAllocator::incref(BlockId id) {
  check_id(id, "incref");
  PAGEDLLM_CHECK_STATE(bit(id), "incref: block " << id << " is free (not allocated)");
  ++refcount_[id];
}

bool BlockAllocator::decref(BlockId id, bool park_at_zero) {
  check_id(id, "decref");
  PAGEDLLM_CHECK_STATE(bit(id), "decref: block " << id << " is already free (double free)");
  PAGEDLLM_CHECK_STATE(refcount_[id] > 0, "decref: block " << id << " is parked with refcount 0");
  if (--refcount_[id] > 0) return false;
  if (!park_at_zero) {
    clear_bit(id);
    ++num_free_;
    hint_word_ = id >> 6;
  }
  return true;
}

void BlockAllocator::release(BlockId id) {
  check_id(id, "release");
  PAGEDLLM_CHECK_STATE(bit(id) && refcount_[id] == 0,
                       "release: block " << id << " is not parked (refcount " << refcount_[id]
                                         << (bit(id) ? ", allocated)" : ", free)"));
  clear_bit(id);
  ++num_free_;
  hint_word_ = id >> 6;
}

int32_t BlockAllocator::refcount(BlockId id) const {
  check_id(id, "refcount");
  return refcount_[id];
}

bool BlockAllocator::is_allocated(BlockId id) const {
  check_id(id, "is_allocated");
  return bit(id);
}

}  // namespace pagedllm
