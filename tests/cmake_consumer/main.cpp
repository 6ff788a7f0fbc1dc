// Uses the installed pagedllm::core: admits two sequences sharing a prefix, forks one, and
// checks the block accounting. Exits non-zero on any mismatch.
#include <cstdio>
#include <vector>

#include "pagedllm/build_info.h"
#include "pagedllm/kv_cache_manager.h"

#define EXPECT(cond)                                               \
  do {                                                             \
    if (!(cond)) {                                                 \
      std::fprintf(stderr, "consumer: check failed: %s\n", #cond); \
      return 1;                                                    \
    }                                                              \
  } while (0)

int main() {
  using namespace pagedllm;
  KVCacheManager kv(/*num_blocks=*/16, /*block_size=*/4);
  std::vector<TokenId> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<Slot> slots(prompt.size());
  std::vector<CowPair> cow;
  EXPECT(kv.allocate(1, prompt.data(), 9, 0) == 0);
  EXPECT(kv.append(1, prompt.data(), 9, slots.data(), cow));
  kv.free(1);
  // Same prompt again: the first two (full) blocks come from the prefix cache.
  EXPECT(kv.allocate(2, prompt.data(), 9, 0) == 8);
  EXPECT(kv.append(2, prompt.data() + 8, 1, slots.data(), cow));
  kv.fork(2, 3);
  const TokenId next = 42;
  EXPECT(kv.append(3, &next, 1, slots.data(), cow));
  EXPECT(cow.size() == 1);  // the shared partial block was copied on write
  kv.free(2);
  kv.free(3);
  const KVCacheStats s = kv.stats();
  EXPECT(s.used_blocks == 0);
  EXPECT(s.free_blocks + s.cached_blocks == 16);
  EXPECT(s.prefix_cache_hits == 8);
  std::printf("consumer: pagedllm %s OK (prefix hits %lld tokens, %d cached blocks)\n",
              version().c_str(), static_cast<long long>(s.prefix_cache_hits), s.cached_blocks);
  return 0;
}
