// The kernel thread pool: workers wait on a condition variable for a job generation, then take
// indices from a shared atomic counter until none are left.
#include "pagedllm/kernels/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
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

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads) : size_(num_threads) {
    workers_.reserve(static_cast<size_t>(num_threads - 1));
    for (int w = 1; w < num_threads; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return size_; }

  // Runs the job on all threads; the caller is worker 0.
  void run(int64_t n, const ParallelFn& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_work_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void worker_loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      drain(worker);
      bool last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last = --pending_ == 0;
      }
      if (last) cv_done_.notify_one();
    }
  }

  // Takes indices until none are left.
  void drain(int worker) {
    t_inside_job = true;
    for (;;) {
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_) break;
      try {
        (*fn_)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    t_inside_job = false;
  }

  const int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  int pending_ = 0;
  const ParallelFn* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

// One job at a time, process-wide; also held across fork() by the atfork handlers.
std::mutex g_run_mu;
ThreadPool* g_pool = nullptr;  // created lazily; leaked (never joined) in a forked child
int g_requested = 0;           // set_num_threads value, 0 = default

void atfork_prepare() { g_run_mu.lock(); }
void atfork_parent() { g_run_mu.unlock(); }
void atfork_child() {
  // The workers did not survive the fork: forget the pool without joining them (its memory is
  // leaked on purpose), and let the next call build a fresh one.
  g_pool = nullptr;
  g_run_mu.unlock();
}

// The pool, created at first use. Caller holds g_run_mu.
ThreadPool& pool_locked() {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); });
  if (!g_pool) g_pool = new ThreadPool(g_requested > 0 ? g_requested : default_num_threads());
  return *g_pool;
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
  ThreadPool& pool = pool_locked();
  if (pool.size() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  pool.run(n, fn);
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
  return pool_locked().size();
}

}  // namespace pagedllm::kernels
