// pagedllm/kernels/thread_pool.h — the threads the CPU kernels run on.
//
// Two runtimes behind parallel_for. By default a built-in process-wide pool of num_threads - 1
// std::thread workers (the calling thread is the last worker). After adopt_loaded_openmp(), the
// team of an OpenMP runtime the process has already loaded (torch's libgomp, which oneDNN's
// matmuls run on): one set of threads for the matmuls and the kernels, where two pools would
// fight over the cores (on 2 cores a decode step's attention ran 3-4x slower beside torch's
// spinning OpenMP threads). This library never links or loads an OpenMP runtime itself.
// The default size is the number of CPUs this process may run on (sched_getaffinity),
// overridden by the environment variable PAGEDLLM_NUM_THREADS (an integer >= 1; other values
// are ignored).
// Fork safety: a pthread_atfork handler keeps fork() from splitting a running job; the child
// drops the parent's (absent) workers and builds a fresh pool on its first call, and goes back
// to the built-in pool (an OpenMP region in a forked child whose parent used the team hangs).
// Thread-safety: parallel_for may be called from any thread; calls run one at a time. A
// parallel_for called from inside a job runs inline on the calling worker.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

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

// Runs later parallel_for calls on the team of an OpenMP runtime already loaded in this process
// (libgomp.so.1, libiomp5.so or libomp.so, through their GOMP_parallel entry point), with
// get_num_threads() threads. Returns false, changing nothing, when none is loaded, and in a
// process forked after its parent ran a job on the team (that team's threads are gone).
bool adopt_loaded_openmp();

// Runs later parallel_for calls on the built-in pool again.
void use_builtin_pool();

// "builtin", or "openmp:<library>" after adopt_loaded_openmp().
std::string parallel_runtime();

}  // namespace pagedllm::kernels
