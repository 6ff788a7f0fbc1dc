// host_checks.h (internal) — the checks every CUDA entry point runs on the host before
// launching: sizes, the supported head dims, scales, and 16-byte alignment of cache memory
// (cp.async and vector loads need it). Values that live in device memory are checked by the
// kernels (device_error.h). Each check throws pagedllm::Error naming the argument.
// Thread-safety: stateless.
#pragma once

#include "pagedllm/kernels/params.h"

namespace pagedllm::cuda::detail {

// One layer's caches: sizes, scales, pointers and alignment (head_dim any multiple of 8).
void check_cache(const kernels::KVCacheParams& c);

// Attention: check_cache, a compiled head dim, GQA ratio, scale, decode one query per sequence.
void check_attention(const kernels::AttentionParams& p, bool prefill);

// The number of multiprocessors of the current device (cached per device).
int multiprocessor_count();

}  // namespace pagedllm::cuda::detail
