#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "device_error.h"

namespace pagedllm::cuda {
namespace {

std::atomic<Validation> g_validation{Validation::kSync};
std::mutex g_records_mutex;
std::vector<detail::DeviceError*> g_records;  // per device, never freed (process lifetime)

const char* kernel_name(int id) {
  switch (id) {
    case detail::kKernelReshapeAndCache: return "reshape_and_cache";
    case detail::kKernelDecode: return "paged_attention_decode";
    case detail::kKernelPrefill: return "paged_attention_prefill";
    case detail::kKernelCopyBlocks: return "copy_blocks";
    case detail::kKernelCross: return "paged_cross_attention";
    default: return "a pagedllm CUDA kernel";
  }
}

// Throws the error described by a record copied back from the device.
[[noreturn]] void raise(const detail::DeviceError& e) {
  const char* k = kernel_name(e.kernel);
  switch (e.code) {
    case detail::kErrContextLen:
      PAGEDLLM_CHECK_ARG(false, k << ": context_lens[" << e.a << "] = " << e.b
                                  << " is outside [0, " << e.c
                                  << "] (max_blocks_per_seq * block_size)");
    case detail::kErrBlockId:
      PAGEDLLM_CHECK_INDEX(false, k << ": block_tables[" << e.a << "][" << e.b << "] = " << e.c
                                    << " is outside the pool [0, " << e.d << ")");
    case detail::kErrSlot:
      PAGEDLLM_CHECK_INDEX(false, k << ": slot_mapping[" << e.a << "] = " << e.b
                                    << " is outside [0, " << e.c
                                    << ") (num_blocks * block_size; -1 skips a token)");
    case detail::kErrCuFirst:
      PAGEDLLM_CHECK_ARG(false, k << ": cu_seqlens_q[0] must be 0, got " << e.b);
    case detail::kErrCuLast:
      PAGEDLLM_CHECK_ARG(false, k << ": cu_seqlens_q[-1] must equal the number of query tokens ("
                                  << e.c << "), got cu_seqlens_q[" << e.a << "] = " << e.b);
    case detail::kErrCuOrder:
      PAGEDLLM_CHECK_ARG(false, k << ": cu_seqlens_q must be non-decreasing (cu_seqlens_q["
                                  << e.a << "] = " << e.b << ", cu_seqlens_q[" << e.a + 1
                                  << "] = " << e.c << ")");
    case detail::kErrQLen:
      PAGEDLLM_CHECK_ARG(false, k << ": sequence " << e.a << " has " << e.b
                                  << " query tokens but a context of only " << e.c
                                  << " (new tokens must be cached first)");
    case detail::kErrCuRange:
      PAGEDLLM_CHECK_ARG(false, k << ": cu_seqlens_q[" << e.a << "] = " << e.b
                                  << " is outside [0, " << e.c << "] (the number of query tokens)");
    case detail::kErrPairId:
      PAGEDLLM_CHECK_INDEX(false, k << ": block_mapping[" << e.a << "][" << e.b << "] = " << e.c
                                    << " is outside the cache's blocks [0, " << e.d << ")");
    case detail::kErrSparseIndptr:
      PAGEDLLM_CHECK_ARG(false, k << ": sparse indptr[" << e.a << "] = " << e.b << ", indptr["
                                  << e.a + 1 << "] = " << e.c
                                  << ": expected 0 first, non-decreasing, ending at the number "
                                     "of indices ("
                                  << e.d << ")");
    case detail::kErrSparseIndex:
      PAGEDLLM_CHECK_INDEX(false, k << ": sparse indices[" << e.a << "] = " << e.b << " (list "
                                    << e.c << ") is outside the sequence's blocks [0, " << e.d
                                    << ")");
    case detail::kErrSparseOrder:
      PAGEDLLM_CHECK_ARG(false, k << ": sparse indices must be strictly increasing per list: "
                                  << e.b << " then " << e.c << " at indices[" << e.a << "]");
    case detail::kErrKvRangeOrder:
      PAGEDLLM_CHECK_ARG(false, k << ": kv_ranges[" << e.a << "] = (" << e.b << ", " << e.c
                                  << "): lo must be <= hi");
    case detail::kErrKvRange:
      PAGEDLLM_CHECK_INDEX(false, k << ": kv_ranges[" << e.a << "] = (" << e.b << ", " << e.c
                                    << ") is outside [0, " << e.d
                                    << "] (the context length of query token " << e.a
                                    << "'s sequence)");
    default:
      PAGEDLLM_CHECK_STATE(false, k << ": unknown device error code " << e.code);
  }
}

// Copies the record of the current device back on `stream`, waits, and throws if it is set.
void read_and_raise(detail::DeviceError* rec, Stream stream) {
  detail::DeviceError host{};
  PAGEDLLM_CUDA_CHECK(
      cudaMemcpyAsync(&host, rec, sizeof host, cudaMemcpyDeviceToHost, stream));
  PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host.code == 0) return;
  PAGEDLLM_CUDA_CHECK(cudaMemsetAsync(rec, 0, sizeof host, stream));
  PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  raise(host);
}

}  // namespace

void set_validation(Validation mode) { g_validation.store(mode); }
Validation validation() { return g_validation.load(); }

void check_errors(int device) {
  int previous = 0;
  PAGEDLLM_CUDA_CHECK(cudaGetDevice(&previous));
  PAGEDLLM_CUDA_CHECK(cudaSetDevice(device));
  try {
    PAGEDLLM_CUDA_CHECK(cudaDeviceSynchronize());
    read_and_raise(detail::error_record(), nullptr);
  } catch (...) {
    cudaSetDevice(previous);
    throw;
  }
  PAGEDLLM_CUDA_CHECK(cudaSetDevice(previous));
}

namespace detail {

DeviceError* error_record() {
  int device = 0;
  PAGEDLLM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_records_mutex);
  if (static_cast<int>(g_records.size()) <= device) g_records.resize(device + 1, nullptr);
  if (g_records[device] == nullptr) {
    DeviceError* rec = nullptr;
    PAGEDLLM_CUDA_CHECK(cudaMalloc(&rec, sizeof(DeviceError)));
    PAGEDLLM_CUDA_CHECK(cudaMemset(rec, 0, sizeof(DeviceError)));
    PAGEDLLM_CUDA_CHECK(cudaDeviceSynchronize());
    g_records[device] = rec;
  }
  return g_records[device];
}

void finish_call(Stream stream) {
  if (validation() != Validation::kSync) return;
  read_and_raise(error_record(), stream);
}

}  // namespace detail
}  // namespace pagedllm::cuda
