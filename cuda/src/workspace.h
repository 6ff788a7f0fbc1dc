// workspace.h (internal) — scratch device memory for kernels that need it (split-K partials,
// the prefill tile map, uploaded block pairs), one growing buffer per (device, stream).
//
// A buffer is only ever used by work queued on its own stream, so stream order makes reuse
// safe across calls. Growing waits for the stream before freeing the old buffer. Buffers live
// until the process ends (streams are few: the engine's compute stream and the default one).
// Thread-safety: the map is guarded by a mutex; two threads must not queue work on the same
// stream at the same time (as with any CUDA stream).
#pragma once

#include <cstddef>

#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda::detail {

// At least `bytes` of device memory (256-byte aligned) for work on `stream` of the current
// device; valid until the next call for the same stream.
void* workspace(Stream stream, size_t bytes);

// Rounds up to a multiple of 256 bytes (to carve several arrays out of one workspace).
inline size_t align256(size_t n) { return (n + 255) & ~static_cast<size_t>(255); }

}  // namespace pagedllm::cuda::detail
