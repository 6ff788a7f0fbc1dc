// common.cuh (internal) — device helpers shared by the attention kernels: cp.async copies,
// warp reductions, and the paged K/V tile gather (token positions -> block table -> rows).
// Thread-safety: device functions; the gather is called by every thread of a block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../device_error.h"

namespace pagedllm::cuda::detail {

// 16-byte asynchronous global -> shared copy; when !valid, writes 16 zero bytes instead (the
// source is not read, but must still be a valid address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kWidth / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Where one (sequence, KV head) lives in one layer's paged caches.
struct PagedHead {
  const uint8_t* key;       // key_cache + kv_head * block_size * head_dim elements
  const uint8_t* value;
  int64_t key_block_stride;   // bytes between blocks
  int64_t value_block_stride;
  const int32_t* table;     // the sequence's block table row
  int block_size;
  int num_blocks;
  int seq;                  // for error messages
};

// Cross-attention: the key range [*lo, *hi) of query token `token` from kv_ranges
// [num_tokens, 2], for a sequence with `len` cross tokens. A bad range (lo > hi, or outside
// [0, len]) is reported when `report` is set and comes back empty with false.
__device__ __forceinline__ bool read_kv_range(const int32_t* ranges, int token, int len, int* lo,
                                              int* hi, DeviceError* err, bool report) {
  const int l = ranges[2 * static_cast<int64_t>(token)];
  const int h = ranges[2 * static_cast<int64_t>(token) + 1];
  *lo = *hi = 0;
  if (l > h) {
    if (report) report_error(err, kErrKvRangeOrder, kKernelCross, token, l, h);
    return false;
  }
  if (l < 0 || h > len) {
    if (report) report_error(err, kErrKvRange, kKernelCross, token, l, h, len);
    return false;
  }
  *lo = l;
  *hi = h;
  return true;
}

// Queues cp.async copies of the K and V rows of token positions [pos0, pos0 + rows) into shared
// memory (row r at k_dst / v_dst + r * pitch bytes). Positions >= end, and rows whose block id
// is outside the pool (reported, and *bad set), are zero-filled. kRowBytes = head_dim * element
// size, a multiple of 16. Does not commit the group.
template <int kRowBytes, int kThreads>
__device__ __forceinline__ void gather_kv_rows(const PagedHead& h, int pos0, int rows, int end,
                                               uint8_t* k_dst, uint8_t* v_dst, int pitch,
                                               DeviceError* err, int kernel, int* bad) {
  constexpr int kChunks = kRowBytes / 16;
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int j = c - r * kChunks;
    const int pos = pos0 + r;
    const uint8_t* ks = h.key;
    const uint8_t* vs = h.value;
    bool ok = false;
    if (pos < end) {
      const int b = pos / h.block_size;
      const int off = pos - b * h.block_size;
      const int id = h.table[b];
      if (id >= 0 && id < h.num_blocks) {
        const int64_t row = static_cast<int64_t>(off) * kRowBytes + j * 16;
        ks = h.key + id * h.key_block_stride + row;
        vs = h.value + id * h.value_block_stride + row;
        ok = true;
      } else {
        report_error(err, kErrBlockId, kernel, h.seq, b, id, h.num_blocks);
        *bad = 1;
      }
    }
    cp_async16(k_dst + r * pitch + j * 16, ks, ok);
    cp_async16(v_dst + r * pitch + j * 16, vs, ok);
  }
}

}  // namespace pagedllm::cuda::detail
