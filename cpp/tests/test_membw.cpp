// The read-bandwidth probe of membw.cpp (what the benchmarks measure the attention kernels
// against): stream_read_sum adds every float it is given, whatever the split over threads.
#include <gtest/gtest.h>

#include <vector>

#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"
#include "pagedllm/kernels/thread_pool.h"

namespace pk = pagedllm::kernels;

TEST(BandwidthProbe, StreamReadSumAddsEveryFloat) {
  std::vector<float> x((1 << 18) * 3 + 7);  // three 1 MiB pieces and a ragged tail
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 5);
  double want = 0.0;
  for (float v : x) want += v;
  const int old_threads = pk::get_num_threads();
  for (int threads : {1, 3}) {
    pk::set_num_threads(threads);
    EXPECT_DOUBLE_EQ(pk::stream_read_sum(x.data(), static_cast<int64_t>(x.size())), want);
    EXPECT_DOUBLE_EQ(pk::stream_read_sum(x.data(), 5), 0.0 + 1 + 2 + 3 + 4);
    EXPECT_DOUBLE_EQ(pk::stream_read_sum(x.data(), 0), 0.0);
  }
  pk::set_num_threads(old_threads);
  EXPECT_THROW(pk::stream_read_sum(x.data(), -1), pagedllm::Error);
}
