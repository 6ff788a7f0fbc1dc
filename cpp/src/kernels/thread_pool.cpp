// The kernel thread pool. Two runtimes behind one parallel_for:
// - the built-in pool: workers spin briefly, then wait on a condition variable, for the next job
//   generation, then take indices from a shared atomic counter until none are left;
// - an OpenMP runtime already loaded in the process (adopt_loaded_openmp): the same index loop
//   runs on that runtime's team through its GOMP_parallel entry point (the one the compiler
//   emits for `#pragma omp parallel`), found with dlopen(RTLD_NOLOAD) + dlsym, so this library
//   neither links nor loads an OpenMP runtime itself.
#include "pagedllm/kernels/thread_pool.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagedllm/error.h"

namespace pagedllm::kernels {
namespace {

thread_local bool t_inside_job = false;  // true on a worker (or caller) while it runs a job

// One parallel_for call: indices handed out from `next`, counted in `done` once run, the first
// exception kept.
struct Job {
  int64_t n = 0;
  const ParallelFn* fn = nullptr;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex error_mu;
  std::exception_ptr error;

  // Takes indices until none are left, as `worker`; returns whether it ran the job's last one
  // to finish.
  bool drain(int worker) {
    t_inside_job = true;
    bool last = false;
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) break;
      try {
        (*fn)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
      last = done.fetch_add(1, std::memory_order_acq_rel) + 1 == n;
    }
    t_inside_job = false;
    return last;
  }
};

// Busy-waits one short step (a pause hint where the CPU has one).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

// How long a worker (or the caller, for the workers' last indices) spins on the next job before
// it sleeps on the condition variable. Kernel calls come in bursts (a decode step's layers call
// parallel_for back to back, microseconds apart); waking a sleeping thread through the futex
// costs 10-30 us on the machines measured (docs/BENCHMARKS.md, twenty-first session), more than
// a small GEMV. Short enough that an idle pool gives its cores back almost at once. The spin
// never yields: a thread that calls sched_yield while it waits gets no sleeper's credit from the
// scheduler, and beside a process whose threads spin (an OpenMP program) such a pool lost its
// share of the cores, 3-4.5x slower (2-core Zen 4, docs/BENCHMARKS.md, twenty-second session).
constexpr auto kSpin = std::chrono::microseconds(100);

// The job's state lives in the pool (open_), not on the caller's stack, so the caller waits
// only for the indices workers took, never for a worker that has not come to the job yet: under
// load (other processes' threads on the cores) a worker that is descheduled would otherwise
// cost every call a scheduling delay, even when the caller ran every index itself. A worker
// that comes late finds the indices gone and leaves; the next job waits only for such a worker
// to have left, a window of a few instructions.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads) : size_(num_threads) {
    workers_.reserve(static_cast<size_t>(num_threads - 1));
    for (int w = 1; w < num_threads; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true, std::memory_order_release);
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return size_; }

  // Runs the job on all threads; the caller is worker 0. One caller at a time (g_run_mu).
  void run(Job* job) {
    // Close the last job: from the odd generation on no worker enters it, and the seq_cst pair
    // (this store, then active_'s load; a worker's increment, then its generation load) means a
    // worker either is counted here or sees the odd value and backs out.
    const uint64_t g = generation_.load(std::memory_order_relaxed);  // only callers write it
    generation_.store(g + 1, std::memory_order_seq_cst);
    if (!spin_until([this] { return active_.load(std::memory_order_seq_cst) == 0; })) {
      while (active_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    }
    open_.n = job->n;
    open_.fn = job->fn;
    open_.error = nullptr;
    open_.next.store(0, std::memory_order_relaxed);
    open_.done.store(0, std::memory_order_relaxed);
    bool wake;
    {
      // Under the lock, so that a worker about to sleep sees the new generation in its wait's
      // predicate, or is counted in sleepers_ and notified.
      std::lock_guard<std::mutex> lock(mu_);
      generation_.store(g + 2, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) cv_work_.notify_all();
    open_.drain(0);
    // Every index is handed out: wait for those still running on workers (spin briefly, then
    // sleep until the last one is done).
    const auto all_done = [this] { return open_.done.load(std::memory_order_acquire) == open_.n; };
    if (!spin_until(all_done)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_done_.wait(lock, all_done);
    }
    job->error = open_.error;
  }

 private:
  // Spins until done() or kSpin has passed; returns done().
  template <typename Done>
  static bool spin_until(Done done) {
    if (done()) return true;
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 1;; ++i) {
      cpu_relax();
      if (done()) return true;
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return done();
    }
  }

  void worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      const auto fresh = [&] {
        if (stop_.load(std::memory_order_acquire)) return true;
        const uint64_t g = generation_.load(std::memory_order_acquire);
        return g % 2 == 0 && g != seen;
      };
      if (!spin_until(fresh)) {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        cv_work_.wait(lock, fresh);
        --sleepers_;
      }
      if (stop_.load(std::memory_order_acquire)) return;
      const uint64_t g = generation_.load(std::memory_order_acquire);
      if (g % 2 != 0 || g == seen) continue;
      active_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == g) {  // still open: open_ is g's
        seen = g;
        if (open_.drain(worker)) {
          // The caller may have gone to sleep: the lock orders this notify after its wait began.
          std::lock_guard<std::mutex> lock(mu_);
          cv_done_.notify_one();
        }
      }
      active_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  // Even: job generation_ / 2 is open (0: none yet); odd: the caller is replacing it. The even
  // values are stored under mu_.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};  // workers inside the open job (past its generation check)
  Job open_;                    // the open job: its n and fn written only while the generation
                                // is odd and no worker is active
  int sleepers_ = 0;            // workers waiting on cv_work_ (under mu_)
};

// An OpenMP runtime's entry points (libgomp's ABI; Intel's and LLVM's runtimes export it too).
struct OpenMpRuntime {
  void (*parallel)(void (*body)(void*), void* data, unsigned num_threads, unsigned flags) =
      nullptr;
  int (*thread_num)() = nullptr;
  std::string library;
};

// One job at a time, process-wide; also held across fork() by the atfork handlers.
std::mutex g_run_mu;
ThreadPool* g_pool = nullptr;     // created lazily; leaked (never joined) in a forked child
OpenMpRuntime g_omp_rt;           // found by adopt_loaded_openmp (kept once found)
bool g_use_omp = false;           // parallel_for runs on g_omp_rt; false in a forked child
bool g_team_ran = false;          // a job ran on the OpenMP team in this process
bool g_team_lost = false;         // this process was forked after its parent's team ran
int g_requested = 0;              // set_num_threads value, 0 = default

void atfork_prepare() { g_run_mu.lock(); }
void atfork_parent() { g_run_mu.unlock(); }
void atfork_child() {
  // The workers did not survive the fork: forget the pool without joining them (its memory is
  // leaked on purpose), and let the next call build a fresh one. An OpenMP runtime whose team
  // the parent used would wait for those threads too, so the child is back on the built-in pool.
  g_pool = nullptr;
  g_use_omp = false;
  g_team_lost = g_team_lost || g_team_ran;
  g_run_mu.unlock();
}

void register_atfork() {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
}

int pool_size_locked() { return g_requested > 0 ? g_requested : default_num_threads(); }

// The pool, created at first use. Caller holds g_run_mu.
ThreadPool& pool_locked() {
  register_atfork();
  if (!g_pool) g_pool = new ThreadPool(pool_size_locked());
  return *g_pool;
}

// GOMP_parallel's body: each thread of the team drains the job under its team index.
struct TeamJob {
  Job* job;
  int (*thread_num)();
};

void team_body(void* data) {
  const TeamJob* t = static_cast<const TeamJob*>(data);
  t->job->drain(t->thread_num());
}

}  // namespace

int default_num_threads() {
  if (const char* env = std::getenv("PAGEDLLM_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t n, const ParallelFn& fn) {
  if (n <= 0) return;
  if (t_inside_job || n == 1) {
    // Nested call, or nothing to share: run inline. Worker 0 is only safe for scratch when not
    // nested; nested callers must not rely on the worker index.
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::lock_guard<std::mutex> lock(g_run_mu);
  Job job;
  job.n = n;
  job.fn = &fn;
  if (g_use_omp) {
    const int size = pool_size_locked();
    if (size == 1) {
      job.drain(0);
    } else {
      TeamJob team{&job, g_omp_rt.thread_num};
      g_team_ran = true;
      g_omp_rt.parallel(&team_body, &team, static_cast<unsigned>(size), 0);
    }
  } else {
    ThreadPool& pool = pool_locked();
    if (pool.size() == 1) {
      job.drain(0);
    } else {
      pool.run(&job);
    }
  }
  if (job.error) std::rethrow_exception(job.error);
}

void set_num_threads(int n) {
  PAGEDLLM_CHECK_ARG(n >= 1 && n <= 1024, "num_threads must be in [1, 1024], got " << n);
  std::lock_guard<std::mutex> lock(g_run_mu);
  g_requested = n;
  if (g_pool && g_pool->size() != n) {
    delete g_pool;
    g_pool = nullptr;
  }
}

int get_num_threads() {
  std::lock_guard<std::mutex> lock(g_run_mu);
  if (g_use_omp) return pool_size_locked();
  return pool_locked().size();
}

bool adopt_loaded_openmp() {
  static const char* const kLibraries[] = {"libgomp.so.1", "libiomp5.so", "libomp.so"};
  std::lock_guard<std::mutex> lock(g_run_mu);
  if (g_team_lost) return false;  // the runtime still counts the parent's team threads
  for (const char* lib : kLibraries) {
    if (g_omp_rt.parallel != nullptr) break;
    // Only a library that is already loaded; the handle (never closed) keeps it loaded.
    void* handle = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    OpenMpRuntime rt;
    rt.parallel = reinterpret_cast<decltype(rt.parallel)>(dlsym(handle, "GOMP_parallel"));
    rt.thread_num = reinterpret_cast<decltype(rt.thread_num)>(dlsym(handle, "omp_get_thread_num"));
    rt.library = lib;
    if (rt.parallel != nullptr && rt.thread_num != nullptr) g_omp_rt = rt;
  }
  if (g_omp_rt.parallel == nullptr) return false;
  register_atfork();
  delete g_pool;  // its workers would only sleep beside the OpenMP team
  g_pool = nullptr;
  g_use_omp = true;
  return true;
}

void use_builtin_pool() {
  std::lock_guard<std::mutex> lock(g_run_mu);
  g_use_omp = false;
}

std::string parallel_runtime() {
  std::lock_guard<std::mutex> lock(g_run_mu);
  return g_use_omp ? "openmp:" + g_omp_rt.library : std::string("builtin");
}

}  // namespace pagedllm::kernels
