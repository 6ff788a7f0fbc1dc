#include "block_sparse.h"

#include <algorithm>

#include "pagedllm/error.h"

namespace pagedllm::kernels {
namespace {

// Checks the CSR arrays' shape: list count, indptr starting at 0, non-decreasing, ending at
// num_indices.
void check_indptr(const AttentionParams& p, const BlockSparseParams& s) {
  const int64_t per_seq = p.num_seqs;
  const int64_t per_head = static_cast<int64_t>(p.num_seqs) * p.cache.num_kv_heads;
  PAGEDLLM_CHECK_ARG(s.num_lists == per_seq || s.num_lists == per_head,
                     "sparse indptr has " << s.num_lists + 1 << " entries: expected num_seqs + 1 = "
                                          << per_seq + 1
                                          << " (one block list per sequence) or num_seqs * "
                                             "num_kv_heads + 1 = "
                                          << per_head + 1 << " (one per KV head)");
  PAGEDLLM_CHECK_ARG(s.num_indices >= 0, "sparse indices: negative length");
  PAGEDLLM_CHECK_ARG(s.indptr != nullptr, "sparse indptr is null");
  PAGEDLLM_CHECK_ARG(s.indices != nullptr || s.num_indices == 0, "sparse indices is null");
  PAGEDLLM_CHECK_ARG(s.indptr[0] == 0, "sparse indptr[0] must be 0, got " << s.indptr[0]);
  for (int32_t l = 0; l < s.num_lists; ++l) {
    PAGEDLLM_CHECK_ARG(s.indptr[l + 1] >= s.indptr[l],
                       "sparse indptr must be non-decreasing: indptr[" << l << "] = " << s.indptr[l]
                                                                       << " > indptr[" << l + 1
                                                                       << "] = " << s.indptr[l + 1]);
  }
  PAGEDLLM_CHECK_ARG(s.indptr[s.num_lists] == s.num_indices,
                     "sparse indptr[-1] = " << s.indptr[s.num_lists]
                                            << " must equal the number of indices ("
                                            << s.num_indices << ")");
}

}  // namespace

SparseView::SparseView(const AttentionParams& p, const BlockSparseParams& s)
    : per_head_(false),
      kv_heads_(p.cache.num_kv_heads),
      block_size_(p.cache.block_size),
      indptr_(s.indptr),
      indices_(s.indices) {
  check_indptr(p, s);
  per_head_ = s.num_lists != p.num_seqs;  // equal counts (one KV head): the same lists
  phys_.resize(static_cast<size_t>(s.num_indices));
  lengths_.resize(static_cast<size_t>(s.num_lists));
  for (int32_t l = 0; l < s.num_lists; ++l) {
    const int32_t seq = per_head_ ? l / kv_heads_ : l;
    const int32_t len = p.context_lens[seq];
    const int64_t used = (int64_t{len} + block_size_ - 1) / block_size_;  // int64: len ~ 2^31
    const int32_t* row = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;
    const int32_t begin = s.indptr[l], end = s.indptr[l + 1];
    for (int32_t j = begin; j < end; ++j) {
      const int32_t b = s.indices[j];
      PAGEDLLM_CHECK_INDEX(b >= 0 && b < used,
                           "sparse indices[" << j << "] = " << b << " (list " << l << ", sequence "
                                             << seq << ") is outside the sequence's blocks [0, "
                                             << used << ") for a context of " << len
                                             << " tokens");
      PAGEDLLM_CHECK_ARG(j == begin || b > s.indices[j - 1],
                         "sparse indices of list " << l << " must be strictly increasing: "
                                                   << s.indices[j - 1] << " then " << b
                                                   << " at indices[" << j << "]");
      PAGEDLLM_CHECK_INDEX(row[b] >= 0 && row[b] < p.cache.num_blocks,
                           "block_tables[" << seq << "][" << b << "] = " << row[b]
                                           << " (listed at sparse indices[" << j
                                           << "]) is outside the pool [0, " << p.cache.num_blocks
                                           << ")");
      phys_[j] = row[b];
    }
    const int32_t n = end - begin;
    lengths_[l] = n == 0 ? 0
                         : (n - 1) * block_size_ +
                               std::min(block_size_, len - s.indices[end - 1] * block_size_);
  }
}

int32_t SparseView::compact_limit(int l, int32_t limit) const {
  // k = listed blocks starting below `limit`; all but the k-th are wholly below it.
  const int32_t* first = indices_ + indptr_[l];
  const int32_t* last = indices_ + indptr_[l + 1];
  const int32_t k = static_cast<int32_t>(
      std::lower_bound(first, last,
                       static_cast<int32_t>((int64_t{limit} + block_size_ - 1) / block_size_)) -
      first);
  if (k == 0) return 0;
  const int32_t top = first[k - 1];
  return std::min(length(l), (k - 1) * block_size_ + std::min(block_size_, limit - top * block_size_));
}

}  // namespace pagedllm::kernels
