// Block store: keys, record verification, crash leftovers, LRU cap, locking, concurrency; every
// case runs for each compiled backend.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <thread>

#include "pagedllm/block_store.h"
#include "pagedllm/error.h"
#ifdef PAGEDLLM_WITH_ROCKSDB
#include <rocksdb/db.h>
#endif

namespace fs = std::filesystem;
using namespace pagedllm;

namespace {

std::vector<uint8_t> payload_of(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

RecordMeta meta_of(int base, int block_size = 16, const std::string& fp = "llama-test|f32|v1") {
  RecordMeta m;
  m.fingerprint = fp;
  m.block_size = block_size;
  for (int i = 0; i < block_size; ++i) m.tokens.push_back(base + i);
  return m;
}

BlockKey key_of(const RecordMeta& m) {
  return block_key(kRootKey, m.tokens.data(), static_cast<int32_t>(m.tokens.size()), 0);
}

std::string record_file(const fs::path& dir, const BlockKey& k) {
  const std::string hex = to_hex(k);
  return (dir / hex.substr(0, 2) / (hex + ".kvb")).string();
}

class BlockStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagedllm_bs_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::unique_ptr<BlockStore> open(uint64_t max_bytes = 0) {
    return open_block_store(GetParam(), (dir_ / "store").string(), max_bytes);
  }
  // Bytes one record of `data` (and meta_of's tokens) takes: written once, measured, erased.
  uint64_t record_size(const std::vector<uint8_t>& data) {
    auto s = open();
    const RecordMeta m = meta_of(0);
    EXPECT_TRUE(s->put(key_of(m), m, data.data(), data.size()));
    const uint64_t size = s->stats().bytes;
    EXPECT_TRUE(s->erase(key_of(m)));
    return size;
  }
  bool is_file() const { return GetParam() == "file"; }
  // The stored bytes of k's record ("" if absent), read behind the (closed) store's back.
  std::string read_raw(const BlockKey& k) {
    if (is_file()) {
      std::ifstream in(record_file(dir_ / "store", k), std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    }
#ifdef PAGEDLLM_WITH_ROCKSDB
    std::unique_ptr<rocksdb::DB> db = raw_db();
    std::string v;
    const auto st = db->Get(rocksdb::ReadOptions(), raw_key(k), &v);
    return st.ok() ? v : std::string();
#else
    return {};
#endif
  }
  // Replaces k's stored record by rec, behind the (closed) store's back.
  void write_raw(const BlockKey& k, const std::string& rec) {
    if (is_file()) {
      std::ofstream(record_file(dir_ / "store", k), std::ios::binary | std::ios::trunc) << rec;
      return;
    }
#ifdef PAGEDLLM_WITH_ROCKSDB
    ASSERT_TRUE(raw_db()->Put(rocksdb::WriteOptions(), raw_key(k), rec).ok());
#endif
  }
#ifdef PAGEDLLM_WITH_ROCKSDB
  std::unique_ptr<rocksdb::DB> raw_db() {
    rocksdb::DB* db = nullptr;
    rocksdb::Options o;
    const rocksdb::Status st = rocksdb::DB::Open(o, (dir_ / "store").string(), &db);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return std::unique_ptr<rocksdb::DB>(db);
  }
  static std::string raw_key(const BlockKey& k) {
    std::string b(16, '\0');
    for (int i = 0; i < 8; ++i) {
      b[static_cast<size_t>(i)] = static_cast<char>(k.hi >> (8 * (7 - i)));
      b[static_cast<size_t>(8 + i)] = static_cast<char>(k.lo >> (8 * (7 - i)));
    }
    return b;
  }
#endif
  fs::path dir_;
};

}  // namespace

TEST(BlockKeyTest, DeterministicAndChained) {
  const std::vector<TokenId> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  const BlockKey k1 = block_key(kRootKey, a.data(), 4, 0);
  EXPECT_EQ(k1, block_key(kRootKey, a.data(), 4, 0));
  EXPECT_NE(k1, block_key(kRootKey, b.data(), 4, 0));
  EXPECT_NE(k1, block_key(kRootKey, a.data(), 4, 7));  // extra key
  EXPECT_NE(k1, block_key(kRootKey, a.data(), 3, 0));  // length
  const BlockKey k2 = block_key(k1, b.data(), 4, 0);
  EXPECT_NE(k2, block_key(kRootKey, b.data(), 4, 0));  // parent
  EXPECT_NE(k1, kRootKey);
  EXPECT_EQ(to_hex(BlockKey{0x0123456789abcdefull, 0xfedcba9876543210ull}),
            "0123456789abcdeffedcba9876543210");
  EXPECT_THROW(block_key(kRootKey, nullptr, 2, 0), Error);
  EXPECT_THROW(block_key(kRootKey, a.data(), -1, 0), Error);
}

// file_digest against XXH3-128 reference values (Python's xxhash 3.x package, xxh3_128) of
// files of bytes i % 251: empty, 1000 bytes, and 10 MiB + 7 (across the 4 MiB read buffer).
TEST(FileDigestTest, MatchesXxh3ReferenceAndSeesEveryByte) {
  const fs::path dir = fs::temp_directory_path() / ("pagedllm_digest_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const struct {
    size_t n;
    uint64_t hi, lo;
  } cases[] = {{0, 0x99aa06d3014798d8ull, 0x6001c324468d497full},
               {1000, 0x18bf41bc8229e277ull, 0x33ef703fb2b20ed1ull},
               {(size_t{10} << 20) + 7, 0xaa61c528d4acad04ull, 0x4d378ff66bd3c49bull}};
  for (const auto& c : cases) {
    std::string bytes(c.n, '\0');
    for (size_t i = 0; i < c.n; ++i) bytes[i] = static_cast<char>(i % 251);
    const fs::path f = dir / ("f" + std::to_string(c.n));
    std::ofstream(f, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(c.n));
    EXPECT_EQ(file_digest(f.string()), (BlockKey{c.hi, c.lo})) << c.n;
    if (c.n > (size_t{8} << 20)) {  // one byte changed far past the first read
      bytes[c.n - 3] ^= 1;
      std::ofstream(f, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(c.n));
      EXPECT_NE(file_digest(f.string()), (BlockKey{c.hi, c.lo}));
    }
  }
  try {
    file_digest((dir / "missing").string());
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(BlockStoreFactory, UnknownBackendAndBadPath) {
  EXPECT_THROW(open_block_store("tape", "/tmp/x"), Error);
  // A path whose parent is a regular file fails even as root.
  char tmpl[] = "/tmp/pagedllm_bsf_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  try {
    open_block_store("file", std::string(tmpl) + "/store");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(tmpl), std::string::npos) << e.what();
  }
  unlink(tmpl);
  const auto backends = compiled_block_store_backends();
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends[0], "file");
}

TEST_P(BlockStoreTest, RoundTrip) {
  auto s = open();
  const RecordMeta m = meta_of(100);
  const BlockKey k = key_of(m);
  const auto data = payload_of(4096, 1);
  EXPECT_FALSE(s->contains(k));
  EXPECT_FALSE(s->get(k, m).has_value());
  ASSERT_TRUE(s->put(k, m, data.data(), data.size()));
  EXPECT_TRUE(s->contains(k));
  auto got = s->get(k, m);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
  std::vector<uint8_t> out(data.size());
  EXPECT_TRUE(s->get_into(k, m, out.data(), out.size()));
  EXPECT_EQ(out, data);
  std::vector<uint8_t> wrong(data.size() + 1);
  EXPECT_FALSE(s->get_into(k, m, wrong.data(), wrong.size()));  // size mismatch: miss, kept
  EXPECT_TRUE(s->contains(k));
  // Overwrite with a new payload.
  const auto data2 = payload_of(4096, 2);
  ASSERT_TRUE(s->put(k, m, data2.data(), data2.size()));
  EXPECT_EQ(*s->get(k, m), data2);
  const StoreStats st = s->stats();
  EXPECT_EQ(st.records, 1u);
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.puts, 2u);
  EXPECT_GT(st.bytes, 4096u);
  EXPECT_GT(st.bytes_written, 8192u);
  EXPECT_GT(st.bytes_read, 4096u * 3);
  EXPECT_EQ(s->keys(), std::vector<BlockKey>{k});
  int scanned = 0;
  s->scan([&](const BlockKey& key, uint64_t bytes) {
    EXPECT_EQ(key, k);
    EXPECT_EQ(bytes, st.bytes);
    ++scanned;
  });
  EXPECT_EQ(scanned, 1);
  EXPECT_TRUE(s->erase(k));
  EXPECT_FALSE(s->erase(k));
  EXPECT_FALSE(s->contains(k));
  EXPECT_FALSE(s->get(k, m).has_value());
  // Empty payload is a valid record.
  ASSERT_TRUE(s->put(k, m, nullptr, 0));
  auto empty = s->get(k, m);
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST_P(BlockStoreTest, HeaderMismatchIsMissAndErased) {
  auto s = open();
  const RecordMeta m = meta_of(7);
  const BlockKey k = key_of(m);
  const auto data = payload_of(1024, 3);
  auto expect_dropped = [&](const RecordMeta& expected) {
    ASSERT_TRUE(s->put(k, m, data.data(), data.size()));
    EXPECT_FALSE(s->get(k, expected).has_value());
    EXPECT_FALSE(s->contains(k));
    EXPECT_FALSE(s->get(k, m).has_value());  // really gone from storage too
  };
  RecordMeta fp = m;
  fp.fingerprint = "another-model|f32|v1";
  expect_dropped(fp);
  RecordMeta bs = m;
  bs.block_size = 32;
  expect_dropped(bs);
  RecordMeta tok = m;
  tok.tokens[5] += 1;
  expect_dropped(tok);
  RecordMeta shorter = m;
  shorter.tokens.pop_back();
  expect_dropped(shorter);
  EXPECT_EQ(s->stats().mismatch_dropped, 4u);
  EXPECT_EQ(s->stats().corrupt_dropped, 0u);
  // A record stored under another key (e.g. a renamed file) is a mismatch as well.
  const BlockKey other{k.hi, k.lo ^ 1};
  ASSERT_TRUE(s->put(other, m, data.data(), data.size()));
  EXPECT_TRUE(s->get(other, m).has_value());
}

TEST_P(BlockStoreTest, CorruptRecordsAreMissesAndErased) {
  const RecordMeta m = meta_of(50);
  const BlockKey k = key_of(m);
  const auto data = payload_of(2048, 4);
  // Each edit damages the stored record of k while the store is closed.
  const std::vector<std::pair<const char*, std::function<void(std::string&)>>> edits = {
      {"flipped payload byte", [](std::string& r) { r[r.size() - 100] ^= 0x10; }},
      {"truncated payload", [](std::string& r) { r.resize(r.size() - 10); }},
      {"flipped header byte (fingerprint)", [](std::string& r) { r[40] = 'X'; }},
      {"flipped checksum", [](std::string& r) { r[r.size() - 2048 - 1] ^= 1; }},
      {"wrong format version", [](std::string& r) { r[8] = 9; }},
      {"truncated header", [](std::string& r) { r.resize(5); }},
      {"empty", [](std::string& r) { r.clear(); }},
      {"padded", [](std::string& r) { r.push_back('\0'); }},
  };
  for (const auto& [what, edit] : edits) {
    SCOPED_TRACE(what);
    {
      auto s = open();
      ASSERT_TRUE(s->put(k, m, data.data(), data.size()));
    }
    std::string rec = read_raw(k);
    ASSERT_FALSE(rec.empty());
    edit(rec);
    write_raw(k, rec);
    auto s = open();
    EXPECT_TRUE(s->contains(k));
    std::vector<uint8_t> out(data.size());
    EXPECT_FALSE(s->get_into(k, m, out.data(), out.size()));
    EXPECT_FALSE(s->contains(k));
    EXPECT_EQ(s->stats().corrupt_dropped, 1u);
    EXPECT_EQ(s->stats().misses, 1u);
    s.reset();
    EXPECT_TRUE(read_raw(k).empty()) << "the corrupt record must be erased from storage";
    s = open();
    EXPECT_FALSE(s->contains(k));
    // The store stays usable.
    ASSERT_TRUE(s->put(k, m, data.data(), data.size()));
    EXPECT_EQ(*s->get(k, m), data);
  }
}

TEST_P(BlockStoreTest, LeftoverTempFilesRemovedAndReopenFindsRecords) {
  const fs::path root = dir_ / "store";
  std::vector<BlockKey> keys;
  {
    auto s = open();
    for (int i = 0; i < 20; ++i) {
      const RecordMeta m = meta_of(i * 16);
      const auto d = payload_of(512, static_cast<uint32_t>(i));
      ASSERT_TRUE(s->put(key_of(m), m, d.data(), d.size()));
      keys.push_back(key_of(m));
    }
  }
  std::string tmp;
  if (is_file()) {
    tmp = record_file(root, keys[0]) + ".tmp.99999.0";
    std::ofstream(tmp) << "partial";
    ASSERT_TRUE(fs::exists(tmp));
  }
  auto s = open();
  if (is_file()) EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(s->stats().records, 20u);
  for (int i = 0; i < 20; ++i) {
    const RecordMeta m = meta_of(i * 16);
    EXPECT_TRUE(s->contains(keys[static_cast<size_t>(i)]));
    auto got = s->get(keys[static_cast<size_t>(i)], m);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, payload_of(512, static_cast<uint32_t>(i)));
  }
}

TEST_P(BlockStoreTest, LruEvictionUnderMaxBytes) {
  const auto data = payload_of(10000, 5);
  const uint64_t rec_size = record_size(data);
  auto s = open(rec_size * 4 + rec_size / 2);  // room for 4 records
  std::vector<RecordMeta> ms;
  for (int i = 0; i < 4; ++i) {
    ms.push_back(meta_of(1000 * (i + 1)));
    ASSERT_TRUE(s->put(key_of(ms.back()), ms.back(), data.data(), data.size()));
  }
  EXPECT_EQ(s->stats().records, 4u);
  // Touch record 0: record 1 becomes the least recently used.
  ASSERT_TRUE(s->get(key_of(ms[0]), ms[0]).has_value());
  ms.push_back(meta_of(9000));
  ASSERT_TRUE(s->put(key_of(ms[4]), ms[4], data.data(), data.size()));
  EXPECT_EQ(s->stats().records, 4u);
  EXPECT_EQ(s->stats().evictions, 1u);
  EXPECT_LE(s->stats().bytes, rec_size * 4 + rec_size / 2);
  EXPECT_TRUE(s->contains(key_of(ms[0])));
  EXPECT_FALSE(s->contains(key_of(ms[1])));
  EXPECT_FALSE(s->get(key_of(ms[1]), ms[1]).has_value());
  EXPECT_TRUE(s->contains(key_of(ms[2])));
  EXPECT_TRUE(s->contains(key_of(ms[4])));
  // A record larger than the cap is refused, nothing evicted for it.
  const auto huge = payload_of(rec_size * 5, 6);
  const RecordMeta mh = meta_of(77777);
  EXPECT_FALSE(s->put(key_of(mh), mh, huge.data(), huge.size()));
  EXPECT_EQ(s->stats().records, 4u);
  EXPECT_EQ(s->stats().write_errors, 1u);
  // A smaller cap at reopen evicts down to it.
  s.reset();
  auto small = open(rec_size * 2);
  EXPECT_EQ(small->stats().records, 2u);
}

TEST_P(BlockStoreTest, TouchOrdersEvictionAndSurvivesReopen) {
  const auto data = payload_of(10000, 5);
  std::vector<RecordMeta> ms;
  std::vector<BlockKey> ks;
  uint64_t rec_size = 0;
  {
    auto s = open();
    for (int i = 0; i < 4; ++i) {  // written root first, as a chain's blocks are
      ms.push_back(meta_of(100 * (i + 1)));
      ks.push_back(key_of(ms.back()));
      ASSERT_TRUE(s->put(ks.back(), ms.back(), data.data(), data.size()));
    }
    rec_size = s->stats().bytes / 4;
    // Tail to root: record 0 becomes the most recently used, record 3 the least.
    s->touch({ks[3], ks[2], ks[1], ks[0], key_of(meta_of(424242))});  // unknown: skipped
  }
  // Reopened with room for 2: the order (from the files' times for "file") keeps 0 and 1.
  auto s = open(rec_size * 2 + rec_size / 2);
  if (GetParam() == "file") {
    EXPECT_TRUE(s->contains(ks[0]));
    EXPECT_TRUE(s->contains(ks[1]));
    EXPECT_FALSE(s->contains(ks[3]));
  }
  EXPECT_EQ(s->stats().records, 2u);
  // In memory: touching the survivors in reverse makes the next put evict the other one.
  const auto kept = s->keys();
  ASSERT_EQ(kept.size(), 2u);
  s->touch({kept[1], kept[0]});
  const RecordMeta m = meta_of(9000);
  ASSERT_TRUE(s->put(key_of(m), m, data.data(), data.size()));
  EXPECT_TRUE(s->contains(kept[0]));
  EXPECT_FALSE(s->contains(kept[1]));
  EXPECT_TRUE(s->contains(key_of(m)));
}

TEST_P(BlockStoreTest, PutWithParentEvictsChainsFromTheTail) {
  const auto data = payload_of(10000, 5);
  const uint64_t rec_size = record_size(data);
  auto s = open(rec_size * 3 + rec_size / 2);  // room for 3
  std::vector<BlockKey> chain;
  for (int j = 0; j < 7; ++j) {  // root first, each with its parent
    const RecordMeta m = meta_of(50 + j);
    chain.push_back(key_of(m));
    ASSERT_TRUE(s->put(chain.back(), m, data.data(), data.size(),
                       j > 0 ? &chain[static_cast<size_t>(j) - 1] : nullptr));
  }
  EXPECT_TRUE(s->contains(chain[0]));  // the root and the blocks after it stay
  EXPECT_TRUE(s->contains(chain[1]));
  EXPECT_TRUE(s->contains(chain[2]));
  EXPECT_EQ(s->stats().records, 3u);
  // A second chain takes the first one's tail before its root.
  const RecordMeta r = meta_of(900);
  ASSERT_TRUE(s->put(key_of(r), r, data.data(), data.size()));
  EXPECT_FALSE(s->contains(chain[2]));
  EXPECT_TRUE(s->contains(chain[0]));
  // A record whose parent is gone is first out.
  const RecordMeta orphan = meta_of(901);
  const BlockKey gone = key_of(meta_of(12345));
  ASSERT_TRUE(s->put(key_of(orphan), orphan, data.data(), data.size(), &gone));
  EXPECT_FALSE(s->contains(key_of(orphan)));
  EXPECT_TRUE(s->contains(chain[0]));
  EXPECT_TRUE(s->contains(key_of(r)));
}

TEST_P(BlockStoreTest, SecondOpenerRefused) {
  auto s = open();
  try {
    auto t = open();
    FAIL() << "a second opener must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("already open"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((dir_ / "store").string()), std::string::npos) << e.what();
  }
  s->close();
  EXPECT_THROW(s->contains(BlockKey{1, 2}), Error);
  s->close();  // idempotent
  auto t = open();  // the lock is released by close
  EXPECT_EQ(t->stats().records, 0u);
}

TEST_P(BlockStoreTest, ConcurrentPutGet) {
  auto s = open();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 40;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Threads share keys (i % 10) so puts, gets and erases of one key race.
        const RecordMeta m = meta_of((i % 10) * 16);
        const BlockKey k = key_of(m);
        const auto d = payload_of(8192, static_cast<uint32_t>(i % 10));
        if (!s->put(k, m, d.data(), d.size())) ++bad;
        auto got = s->get(k, m);
        if (got && *got != d) ++bad;  // a hit must always be the right payload
        (void)s->contains(k);
        if (t == 0 && i % 7 == 0) s->erase(k);
        (void)s->stats();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(s->stats().corrupt_dropped, 0u);
  for (int i = 0; i < 10; ++i) {
    const RecordMeta m = meta_of(i * 16);
    auto got = s->get(key_of(m), m);
    if (got) EXPECT_EQ(*got, payload_of(8192, static_cast<uint32_t>(i)));
  }
}

TEST_P(BlockStoreTest, WriteFailureReturnsFalse) {
  if (!is_file()) GTEST_SKIP() << "write failures are injected by replacing a shard directory";
  auto s = open();
  const RecordMeta m = meta_of(3);
  const BlockKey k = key_of(m);
  const std::string hex = to_hex(k);
  // Replace the record's shard directory by a regular file: the put cannot create its file.
  fs::remove_all(dir_ / "store" / hex.substr(0, 2));
  std::ofstream(dir_ / "store" / hex.substr(0, 2)) << "not a directory";
  const auto d = payload_of(100, 1);
  EXPECT_FALSE(s->put(k, m, d.data(), d.size()));
  EXPECT_EQ(s->stats().write_errors, 1u);
  EXPECT_FALSE(s->contains(k));
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockStoreTest,
                         ::testing::ValuesIn(compiled_block_store_backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST_P(BlockStoreTest, FsyncOptionRoundTrip) {
  BlockStoreOptions opts;
  opts.fsync = true;
  auto s = open_block_store(GetParam(), (dir_ / "synced").string(), 0, opts);
  const RecordMeta m = meta_of(11);
  const auto d = payload_of(3000, 9);
  ASSERT_TRUE(s->put(key_of(m), m, d.data(), d.size()));
  EXPECT_EQ(*s->get(key_of(m), m), d);
  EXPECT_EQ(s->backend(), GetParam());
  EXPECT_EQ(s->path(), (dir_ / "synced").string());
}
