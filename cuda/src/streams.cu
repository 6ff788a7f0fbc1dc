#include <cuda_runtime.h>

#include "cuda_check.h"
#include "device_guard.h"
#include "pagedllm/cuda/runtime.h"
#include "pagedllm/cuda/streams.h"

namespace pagedllm::cuda {

Streams::Streams(int device) : Streams(device, nullptr, /*create=*/true) {}

Streams::Streams(int device, Stream compute) : Streams(device, compute, /*create=*/false) {}

Streams::Streams(int device, Stream compute, bool create) : device_(device) {
  const int n = device_count();
  PAGEDLLM_CHECK_STATE(n > 0, "no CUDA device is available (no driver or no GPU): the CUDA "
                              "streams need one");
  PAGEDLLM_CHECK_ARG(device >= 0 && device < n,
                     "device " << device << " does not exist (" << n << " CUDA devices)");
  detail::DeviceGuard guard(device);
  if (create) {
    PAGEDLLM_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    owns_compute_ = true;
  } else {
    compute_ = compute;  // nullptr: the legacy default stream, borrowed like any other
  }
  // Copies get the higher priority, so a swap-in is not starved by long kernels.
  int least = 0, greatest = 0;
  PAGEDLLM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  PAGEDLLM_CUDA_CHECK(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, greatest));
}

Streams::~Streams() {
  detail::DeviceGuard guard(device_);
  cudaStreamSynchronize(copy_);
  cudaStreamSynchronize(compute_);
  for (auto& [ticket, ev] : events_) cudaEventDestroy(ev);
  for (CUevent_st* ev : spare_) cudaEventDestroy(ev);
  cudaStreamDestroy(copy_);
  if (owns_compute_) cudaStreamDestroy(compute_);
}

void Streams::recycle_completed() {
  for (auto it = events_.begin(); it != events_.end();) {
    if (cudaEventQuery(it->second) == cudaSuccess) {
      spare_.push_back(it->second);
      it = events_.erase(it);
    } else {
      cudaGetLastError();  // cudaErrorNotReady is not an error
      ++it;
    }
  }
}

uint64_t Streams::record(Stream s) {
  detail::DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.size() >= 64) recycle_completed();
  cudaEvent_t ev = nullptr;
  if (!spare_.empty()) {
    ev = spare_.back();
    spare_.pop_back();
  } else {
    PAGEDLLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  const cudaError_t rc = cudaEventRecord(ev, s);
  if (rc != cudaSuccess) {
    spare_.push_back(ev);
    PAGEDLLM_CUDA_CHECK(rc);
  }
  const uint64_t ticket = next_ticket_++;
  events_[ticket] = ev;
  return ticket;
}

void Streams::wait(Stream s, uint64_t ticket) {
  if (ticket == 0) return;
  detail::DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  PAGEDLLM_CHECK_ARG(ticket < next_ticket_, "ticket " << ticket << " was never issued");
  const auto it = events_.find(ticket);
  if (it == events_.end()) return;  // recycled: already complete
  PAGEDLLM_CUDA_CHECK(cudaStreamWaitEvent(s, it->second, 0));
}

uint64_t Streams::record_compute() { return record(compute_); }
uint64_t Streams::record_copy() { return record(copy_); }
void Streams::compute_wait(uint64_t ticket) { wait(compute_, ticket); }
void Streams::copy_wait(uint64_t ticket) { wait(copy_, ticket); }

bool Streams::done(uint64_t ticket) {
  if (ticket == 0) return true;
  detail::DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(mutex_);
  PAGEDLLM_CHECK_ARG(ticket < next_ticket_, "ticket " << ticket << " was never issued");
  const auto it = events_.find(ticket);
  if (it == events_.end()) return true;
  const cudaError_t rc = cudaEventQuery(it->second);
  if (rc == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  PAGEDLLM_CUDA_CHECK(rc);
  return true;
}

void Streams::synchronize(uint64_t ticket) {
  if (ticket == 0) return;
  detail::DeviceGuard guard(device_);
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PAGEDLLM_CHECK_ARG(ticket < next_ticket_, "ticket " << ticket << " was never issued");
    const auto it = events_.find(ticket);
    if (it == events_.end()) return;
    ev = it->second;
  }
  // Another thread could recycle `ev` meanwhile only after it completed: a late wait on a
  // re-recorded event would then wait for newer work, never for less.
  PAGEDLLM_CUDA_CHECK(cudaEventSynchronize(ev));
}

void Streams::synchronize_all() {
  detail::DeviceGuard guard(device_);
  PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(copy_));
  PAGEDLLM_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

uint64_t Streams::swap_blocks_async(const kernels::SwapBlocksParams& p, uint64_t after) {
  copy_wait(after);
  {
    detail::DeviceGuard guard(device_);
    swap_blocks(p, copy_);
  }
  return record_copy();
}

int Streams::live_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(events_.size());
}

}  // namespace pagedllm::cuda
