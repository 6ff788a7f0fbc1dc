// pagedllm/cuda/streams.h — the engine's compute stream and copy stream, and the events that
// order them, so that block transfers (swap-in / swap-out, later the SSD tier's loads) run on
// the copy stream while the previous step computes: "load block N / compute N-1 / store N-2".
//
// Ordering is by tickets: record_compute() / record_copy() mark the current end of a stream and
// return a ticket (an event); compute_wait(t) / copy_wait(t) make the other stream wait for it
// on the device (the host does not block); done(t) polls, synchronize(t) blocks the host.
// A typical step k:
//   t_in  = swap_blocks_async(host -> device pairs for step k + 1)      (copy stream)
//   t_out = swap_blocks_async(device -> host pairs preempted at step k - 1,
//                             after = t_compute of step k - 1)           (copy stream)
//   compute_wait(t_in of step k - 1); run step k; t_compute = record_compute()
// and a device block that was swapped out is reused only after compute_wait(t_out).
// The compute stream is created here, or borrowed (torch's current stream, say) and then never
// destroyed here. The copy stream is non-blocking, so it also overlaps the legacy default
// stream. Completed events are recycled; a ticket whose event was recycled counts as done.
// Thread-safety: all members lock an internal mutex; work on the streams follows CUDA's rules.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "pagedllm/cuda/kernels.h"

struct CUevent_st;

namespace pagedllm::cuda {

class Streams {
 public:
  // Streams on `device` with a compute stream created (and owned) here. Throws
  // pagedllm::Error (kInvalidState) without a usable device.
  explicit Streams(int device);
  // Streams on `device` that borrow `compute` as the compute stream (nullptr: the legacy
  // default stream, which is torch's current stream unless set otherwise); never destroyed here.
  Streams(int device, Stream compute);
  // Waits for both streams, then releases what this object created.
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;

  int device() const { return device_; }
  Stream compute() const { return compute_; }
  Stream copy() const { return copy_; }
  bool owns_compute() const { return owns_compute_; }

  // A ticket for the work queued so far on the compute / copy stream.
  uint64_t record_compute();
  uint64_t record_copy();
  // The compute / copy stream waits (on the device) for the work of `ticket`; 0 is a no-op.
  void compute_wait(uint64_t ticket);
  void copy_wait(uint64_t ticket);
  // Whether the work of `ticket` has finished (never blocks).
  bool done(uint64_t ticket);
  // Blocks the calling thread until the work of `ticket` has finished.
  void synchronize(uint64_t ticket);
  // Blocks until both streams are idle.
  void synchronize_all();

  // Queues swap_blocks (see kernels.h) on the copy stream, after the work of `after` (0: right
  // away); returns the ticket of its completion. The memory of both pools must stay valid until
  // then; host memory should be pinned, or the copies block the host.
  uint64_t swap_blocks_async(const kernels::SwapBlocksParams& p, uint64_t after);

  // Events alive (for tests: completed ones are recycled).
  int live_events();

 private:
  Streams(int device, Stream compute, bool create);  // the two constructors' common part
  uint64_t record(Stream s);
  void wait(Stream s, uint64_t ticket);
  void recycle_completed();

  int device_;
  Stream compute_ = nullptr;
  Stream copy_ = nullptr;
  bool owns_compute_ = false;
  std::mutex mutex_;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, CUevent_st*> events_;  // ticket -> event, until known complete
  std::vector<CUevent_st*> spare_;
};

}  // namespace pagedllm::cuda
