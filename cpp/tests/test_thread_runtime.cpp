// The kernels' parallel_for on an OpenMP runtime loaded by the process (adopt_loaded_openmp),
// as torch's libgomp is in a Python process: same contract as the built-in pool.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedllm/kernels/thread_pool.h"

namespace pk = pagedllm::kernels;

namespace {

// Every index once, worker ids inside [0, get_num_threads()); returns the workers seen.
std::vector<int> check_every_index_once(int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::vector<std::atomic<int>> by_worker(64);
  pk::parallel_for(n, [&](int64_t i, int w) {
    hits[static_cast<size_t>(i)].fetch_add(1);
    by_worker[static_cast<size_t>(w)].fetch_add(1);
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  std::vector<int> seen;
  for (int w = 0; w < 64; ++w) {
    if (by_worker[static_cast<size_t>(w)].load() > 0) seen.push_back(w);
  }
  EXPECT_LT(seen.back(), pk::get_num_threads());
  return seen;
}

}  // namespace

TEST(KernelThreadRuntime, OpenMpTeamKeepsThePoolContract) {
  const int old_threads = pk::get_num_threads();
  if (dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD) == nullptr) {
    EXPECT_FALSE(pk::adopt_loaded_openmp());  // nothing loaded: nothing changes
    EXPECT_EQ(pk::parallel_runtime(), "builtin");
  }
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (gomp == nullptr) GTEST_SKIP() << "libgomp.so.1 is not installed (GCC's libgomp1)";
  ASSERT_TRUE(pk::adopt_loaded_openmp());
  EXPECT_EQ(pk::parallel_runtime(), "openmp:libgomp.so.1");

  pk::set_num_threads(3);
  EXPECT_EQ(pk::get_num_threads(), 3);
  check_every_index_once(5000);
  EXPECT_THROW(pk::parallel_for(50, [](int64_t i, int) {
                 if (i == 17) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  std::atomic<int> inner{0};
  pk::parallel_for(4, [&](int64_t, int) { pk::parallel_for(3, [&](int64_t, int) { ++inner; }); });
  EXPECT_EQ(inner.load(), 12);  // nested: inline on the calling team thread
  pk::set_num_threads(1);
  EXPECT_EQ(check_every_index_once(100), std::vector<int>{0});

  // A forked child goes back to the built-in pool (the parent's team is gone) and works.
  pk::set_num_threads(2);
  check_every_index_once(100);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::atomic<int> sum{0};
    pk::parallel_for(100, [&](int64_t i, int) { sum += static_cast<int>(i); });
    const bool refused = !pk::adopt_loaded_openmp();  // the parent's team is gone here
    _exit(refused && pk::parallel_runtime() == "builtin" && sum.load() == 4950 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  pk::use_builtin_pool();
  EXPECT_EQ(pk::parallel_runtime(), "builtin");
  check_every_index_once(100);
  pk::set_num_threads(old_threads);
}
