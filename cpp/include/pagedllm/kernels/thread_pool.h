// pagedllm/kernels/thread_pool.h — the small pool of std::threads the CPU kernels run on.
//
// Not OpenMP: an OpenMP region in a forked child hangs. One process-wide pool of
// num_threads - 1 workers; the calling thread is the last worker. The default size is the
// number of CPUs this process may run on (sched_getaffinity), overridden by the environment
// variable PAGEDLLM_NUM_THREADS (an integer >= 1; other values are ignored).
// Fork safety: a pthread_atfork handler keeps fork() from splitting a running job; the child
// drops the parent's (absent) workers and builds a fresh pool on its first call.
// Thread-safety: parallel_for may be called from any thread; calls run one at a time. A
// parallel_for called from inside a job runs inline on the calling worker.
#pragma once

#include <cstdint>
#include <functional>

namespace pagedllm::kernels {

// fn(index, worker): index in [0, n), worker in [0, get_num_threads()) identifies the thread
// (for per-thread scratch). Indices are handed out dynamically, one at a time.
using ParallelFn = std::function<void(int64_t index, int worker)>;

// Runs fn for every index in [0, n) on the pool and returns when all are done. The first
// exception thrown by fn is rethrown here (the other indices still run).
void parallel_for(int64_t n, const ParallelFn& fn);

// Resizes the pool (n >= 1; throws otherwise). Waits for a running job to finish.
void set_num_threads(int n);

// The pool size (worker threads + the caller).
int get_num_threads();

// The default pool size: PAGEDLLM_NUM_THREADS if set and valid, else the CPUs available.
int default_num_threads();

}  // namespace pagedllm::kernels
