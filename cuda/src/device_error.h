// device_error.h (internal) — how kernels report bad values that live in device memory.
//
// Each device has one DeviceError record in global memory, zero when no error is pending.
// A kernel that meets a bad value (a block id outside the pool, say) skips the offending work
// and calls report_error(); the first report wins (atomicCAS on `code`), later ones are
// dropped. The host reads the record back after the call (Validation::kSync) or in
// check_errors() (kDeferred), clears it and throws pagedllm::Error with a message built from
// the code and its arguments, phrased like the CPU kernels' checks.
// Thread-safety: the record is written by kernels with atomics; the host side serialises
// allocation with a mutex.
#pragma once

#include <cuda_runtime.h>

#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda::detail {

enum ErrorCode : int {
  kErrNone = 0,
  kErrContextLen = 1,   // a = seq, b = context_len, c = capacity
  kErrBlockId = 2,      // a = seq, b = logical block, c = id, d = num_blocks
  kErrSlot = 3,         // a = token, b = slot, c = num_slots
  kErrCuFirst = 4,      // b = cu_seqlens_q[0]
  kErrCuLast = 5,       // a = num_seqs, b = cu_seqlens_q[num_seqs], c = num_tokens
  kErrCuOrder = 6,      // a = seq, b = cu[seq], c = cu[seq + 1]
  kErrQLen = 7,         // a = seq, b = q_len, c = context_len
  kErrPairId = 8,       // a = pair, b = 0 (src) / 1 (dst), c = id, d = num_blocks
  kErrCuRange = 9,      // a = index, b = cu_seqlens_q[index], c = num_tokens
  kErrSparseIndptr = 10,  // a = list, b = indptr[list], c = indptr[list + 1], d = num_indices
  kErrSparseIndex = 11,   // a = position in indices, b = id, c = list, d = blocks the seq uses
  kErrSparseOrder = 12,   // a = position in indices, b = previous id, c = id
  kErrKvRangeOrder = 13,  // a = query token, b = lo, c = hi (lo > hi)
  kErrKvRange = 14,       // a = query token, b = lo, c = hi, d = context_len (outside [0, d])
};

enum KernelId : int {
  kKernelReshapeAndCache = 1,
  kKernelDecode = 2,
  kKernelPrefill = 3,
  kKernelCopyBlocks = 4,
  kKernelCross = 5,
};

struct DeviceError {
  int code;
  int kernel;
  long long a, b, c, d;
};

// Records an error unless one is already pending (first report wins).
__device__ inline void report_error(DeviceError* e, int code, int kernel, long long a,
                                    long long b, long long c, long long d = 0) {
  if (atomicCAS(&e->code, 0, -1) == 0) {  // -1: claimed, fields being written
    e->kernel = kernel;
    e->a = a;
    e->b = b;
    e->c = c;
    e->d = d;
    __threadfence();
    atomicExch(&e->code, code);
  }
}

// The record of the current device (allocated and zeroed on first use).
DeviceError* error_record();

// After a launch on `stream` of the current device: in kSync mode waits for the stream and
// throws the recorded error, if any (clearing it); in kDeferred mode does nothing.
void finish_call(Stream stream);

}  // namespace pagedllm::cuda::detail
