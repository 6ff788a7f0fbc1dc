// cuda_check.h (internal) — CUDA call and launch checks that throw pagedllm::Error with the
// failing expression, the CUDA error's name and text, and the file and line.
// A failed CUDA call is an environment or state problem, not a bad argument: it maps to
// ErrorKind::kInvalidState (RuntimeError in Python). Note that some CUDA errors (an illegal
// address) are sticky and leave the context unusable; the kernels guard every index so that
// bad input is reported through the device error record (device_error.h) instead.
// Thread-safety: stateless.
#pragma once

#include <cuda_runtime.h>

#include "pagedllm/error.h"

// Evaluates a cudaError_t expression once; throws when it is not cudaSuccess.
#define PAGEDLLM_CUDA_CHECK(expr)                                                              \
  do {                                                                                         \
    const cudaError_t pagedllm_err_ = (expr);                                                  \
    if (pagedllm_err_ != cudaSuccess) {                                                        \
      cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed */         \
      PAGEDLLM_CHECK_STATE(false, "CUDA call " #expr " failed: "                               \
                                      << cudaGetErrorName(pagedllm_err_) << " ("               \
                                      << cudaGetErrorString(pagedllm_err_) << ")");            \
    }                                                                                          \
  } while (0)

// Checks the launch that was just made (bad configuration, too much shared memory, no
// kernel image for this GPU). Kernel faults surface at the next synchronizing call.
#define PAGEDLLM_CUDA_CHECK_LAUNCH(kernel_name) \
  PAGEDLLM_CUDA_CHECK_NAMED(cudaGetLastError(), kernel_name)

#define PAGEDLLM_CUDA_CHECK_NAMED(expr, what)                                                  \
  do {                                                                                         \
    const cudaError_t pagedllm_err_ = (expr);                                                  \
    if (pagedllm_err_ != cudaSuccess) {                                                        \
      PAGEDLLM_CHECK_STATE(false, "CUDA launch of " << (what) << " failed: "                   \
                                                    << cudaGetErrorName(pagedllm_err_) << " (" \
                                                    << cudaGetErrorString(pagedllm_err_) << ")"); \
    }                                                                                          \
  } while (0)
