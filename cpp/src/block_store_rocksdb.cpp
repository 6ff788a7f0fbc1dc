// The "rocksdb" block store backend (compiled when CMake finds RocksDB): key = the 16 key bytes
// (hi then lo, big-endian so that keys sort like their hex names), value = the whole record.
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>

#include <cstring>
#include <memory>

#include "block_store_internal.h"
#include "pagedllm/error.h"

namespace pagedllm::detail {

namespace {

void put_be64(char* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<char>(v & 0xFF);
    v >>= 8;
  }
}

uint64_t get_be64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

struct KeyBytes {
  char b[16];
  explicit KeyBytes(const BlockKey& k) {
    put_be64(b, k.hi);
    put_be64(b + 8, k.lo);
  }
  rocksdb::Slice slice() const { return rocksdb::Slice(b, 16); }
};

class RocksDbBlockStore final : public IndexedStore {
 public:
  RocksDbBlockStore(const std::string& path, uint64_t max_bytes, const BlockStoreOptions& options)
      : IndexedStore(path, max_bytes) {
    rocksdb::Options opts;
    opts.create_if_missing = true;
    opts.compression = rocksdb::kNoCompression;  // KV payloads do not compress usefully
    opts.max_open_files = 256;
    write_options_.sync = options.fsync;
    const int e = make_dirs(path);
    PAGEDLLM_CHECK_IO(e == 0, "block store: cannot create directory '" << path << "': " << std::strerror(e));
    rocksdb::DB* db = nullptr;
    const rocksdb::Status st = rocksdb::DB::Open(opts, path, &db);
    if (!st.ok()) {
      const std::string msg = st.ToString();
      const bool locked = msg.find("LOCK") != std::string::npos &&
                          (msg.find("temporarily unavailable") != std::string::npos ||
                           msg.find("lock hold by current process") != std::string::npos ||
                           msg.find("No locks available") != std::string::npos);
      PAGEDLLM_CHECK_IO(!locked,
                        "block store '" << path << "' is already open (by another process or "
                                           "another BlockStore: RocksDB's LOCK is held): " << msg);
      PAGEDLLM_CHECK_IO(false, "block store: cannot open RocksDB at '" << path << "': " << msg);
    }
    db_.reset(db);
    // Index every record (recency starts in key order: RocksDB keeps no access times).
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice k = it->key();
      if (k.size() != 16) continue;
      index_existing(BlockKey{get_be64(k.data()), get_be64(k.data() + 8)}, it->value().size());
    }
    std::lock_guard<std::mutex> g(mu_);
    evict_locked();
  }

  ~RocksDbBlockStore() override { close(); }

  std::string backend() const override { return "rocksdb"; }

 protected:
  bool stage(const BlockKey&, const std::vector<uint8_t>& header, const uint8_t* payload,
             size_t n, Staged* out) override {
    out->value.reserve(header.size() + n);
    out->value.assign(reinterpret_cast<const char*>(header.data()), header.size());
    if (n > 0) out->value.append(reinterpret_cast<const char*>(payload), n);
    return true;
  }

  bool publish(const BlockKey& key, Staged& staged) override {
    if (!db_) return false;
    return db_->Put(write_options_, KeyBytes(key).slice(), staged.value).ok();
  }

  void discard(Staged&) override {}

  bool read_record(const BlockKey& key, std::vector<uint8_t>* out) override {
    rocksdb::DB* db = db_.get();
    if (db == nullptr) return false;
    rocksdb::PinnableSlice value;
    if (!db->Get(rocksdb::ReadOptions(), db->DefaultColumnFamily(), KeyBytes(key).slice(), &value).ok())
      return false;
    out->assign(reinterpret_cast<const uint8_t*>(value.data()),
                reinterpret_cast<const uint8_t*>(value.data()) + value.size());
    return true;
  }

  void remove_record(const BlockKey& key) override {
    if (db_) db_->Delete(write_options_, KeyBytes(key).slice());
  }

  void close_backend() override {
    if (db_) {
      db_->Close();
      db_.reset();
    }
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_options_;
};

}  // namespace

std::unique_ptr<BlockStore> open_rocksdb_block_store(const std::string& path, uint64_t max_bytes,
                                                     const BlockStoreOptions& options) {
  return std::make_unique<RocksDbBlockStore>(path, max_bytes, options);
}

}  // namespace pagedllm::detail
