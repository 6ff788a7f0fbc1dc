// Uses the installed pagedllm::core: admits two sequences sharing a prefix, forks one, and
// checks the block accounting; then round-trips one block through the persistent block store
// (every compiled backend) in a temporary directory. Exits non-zero on any mismatch.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "pagedllm/block_store.h"
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
  char tmpl[] = "/tmp/pagedllm_consumer_XXXXXX";
  EXPECT(mkdtemp(tmpl) != nullptr);
  std::string backends;
  for (const std::string& backend : compiled_block_store_backends()) {
    auto store = open_block_store(backend, std::string(tmpl) + "/" + backend);
    RecordMeta meta{"consumer-model|f32", 4, {1, 2, 3, 4}};
    const BlockKey key = block_key(kRootKey, meta.tokens.data(), 4, 0);
    const std::vector<uint8_t> payload(1024, 7);
    EXPECT(store->put(key, meta, payload.data(), payload.size()));
    const auto got = store->get(key, meta);
    EXPECT(got.has_value() && *got == payload);
    backends += (backends.empty() ? "" : ", ") + backend;
  }
  std::filesystem::remove_all(tmpl);
  std::printf("consumer: pagedllm %s OK (prefix hits %lld tokens, %d cached blocks; block store: %s)\n",
              version().c_str(), static_cast<long long>(s.prefix_cache_hits), s.cached_blocks,
              backends.c_str());
  return 0;
}
