// Internals shared by the block store backends: the record codec and the indexed base class
// that implements put/get/LRU/stats over three raw operations a backend provides.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedllm/block_store.h"

namespace pagedllm::detail {

// Record layout (all integers little-endian):
//   0  char[8]  magic "PLKVBLK1"
//   8  u32      format version (kRecordFormatVersion)
//   12 u32      header length H (bytes from 0 to the end of the checksum field)
//   16 u64      key.hi
//   24 u64      key.lo
//   32 u32      fingerprint length F, then F bytes
//   .. i32      block_size
//   .. u32      token count T, then T x i32 token ids
//   .. u64      payload length P
//   .. u64      xxh3-64 of bytes [0, H - 8) followed by the payload
//   H  P bytes  payload
inline constexpr char kRecordMagic[8] = {'P', 'L', 'K', 'V', 'B', 'L', 'K', '1'};
inline constexpr uint32_t kRecordFormatVersion = 1;
inline constexpr uint32_t kMaxFingerprintBytes = 1u << 16;
inline constexpr uint32_t kMaxRecordTokens = 1u << 20;
inline constexpr uint64_t kMaxPayloadBytes = 1ull << 34;  // 16 GiB: anything larger is corrupt

// The header bytes of a record (checksum included, computed over header and payload).
std::vector<uint8_t> encode_header(const BlockKey& key, const RecordMeta& meta,
                                   const uint8_t* payload, size_t n);

enum class DecodeResult {
  kOk,        // verified and matching: payload at [payload_offset, payload_offset + payload_size)
  kCorrupt,   // does not parse, truncated, wrong magic/version/length, checksum mismatch
  kMismatch,  // verified, but key / fingerprint / block_size / tokens differ from expected
};

// Parses and verifies a whole record (header + payload) against key and expected.
DecodeResult decode_record(const uint8_t* rec, size_t size, const BlockKey& key,
                           const RecordMeta& expected, size_t* payload_offset,
                           size_t* payload_size);

// put/get/erase/LRU/stats over a backend's raw record operations.
class IndexedStore : public BlockStore {
 public:
  IndexedStore(std::string path, uint64_t max_bytes) : path_(std::move(path)), max_bytes_(max_bytes) {}

  bool put(const BlockKey& key, const RecordMeta& meta, const uint8_t* data, size_t n,
           const BlockKey* parent = nullptr) override;
  std::optional<std::vector<uint8_t>> get(const BlockKey& key, const RecordMeta& expected) override;
  bool get_into(const BlockKey& key, const RecordMeta& expected, uint8_t* out, size_t n) override;
  bool contains(const BlockKey& key) const override;
  bool erase(const BlockKey& key) override;
  std::vector<BlockKey> keys() const override;
  void scan(const std::function<void(const BlockKey&, uint64_t)>& fn) const override;
  void touch(const std::vector<BlockKey>& keys) override;
  StoreStats stats() const override;
  std::string path() const override { return path_; }
  void close() override;

 protected:
  // A record written but not yet visible (file: a temporary file; rocksdb: the value bytes).
  struct Staged {
    std::string name;
    std::string value;
    uint64_t size = 0;
  };
  // Writes header + payload somewhere not yet visible; no lock held. False on failure (the
  // backend cleans up what it wrote).
  virtual bool stage(const BlockKey& key, const std::vector<uint8_t>& header,
                     const uint8_t* payload, size_t n, Staged* out) = 0;
  // Makes a staged record visible under key; lock held. False on failure (cleans up).
  virtual bool publish(const BlockKey& key, Staged& staged) = 0;
  // Drops a staged record that will not be published (the store closed meanwhile).
  virtual void discard(Staged& staged) = 0;
  // Reads the whole record under key into out; no lock held. False if absent or unreadable.
  virtual bool read_record(const BlockKey& key, std::vector<uint8_t>* out) = 0;
  // Deletes the record under key from storage; lock held. Best effort.
  virtual void remove_record(const BlockKey& key) = 0;
  // Records on storage that key was used at unix_ns (nanoseconds since the epoch; the next
  // open's LRU order); no lock held. Best effort; the default does nothing (recency then lives
  // in memory only).
  virtual void touch_record(const BlockKey& key, int64_t unix_ns) {
    (void)key;
    (void)unix_ns;
  }
  // Releases the backend's resources; lock held, called once.
  virtual void close_backend() = 0;

  // Adds a record found at open (oldest first); no lock needed before the store is shared.
  void index_existing(const BlockKey& key, uint64_t size);
  // Drops least recently used records until the total fits the cap; lock held.
  void evict_locked();
  // Throws kInvalidState if closed; lock held.
  void check_open_locked() const;

  mutable std::mutex mu_;
  bool closed_ = false;

 private:
  // Checks the store is open and returns the generation of key's index entry (0: none); the
  // generation changes whenever a put replaces the record, so a reader can tell whether what
  // it read is still what the index names. Takes the lock.
  uint64_t begin_read(const BlockKey& key) const;
  // Verifies rec against expected; on success sets offset/size. Erases a bad record unless a
  // put replaced it after it was read (generation changed). No lock held on entry.
  bool verify(const BlockKey& key, uint64_t gen, const RecordMeta& expected,
              const std::vector<uint8_t>& rec, size_t* offset, size_t* size);
  // Counts a finished read and updates recency; forgets an indexed record that was absent from
  // storage (same generation). Takes the lock.
  void end_read(const BlockKey& key, uint64_t gen, bool found, bool hit, size_t bytes_read);
  // Generation of key's entry (0: none); lock held.
  uint64_t gen_locked(const BlockKey& key) const;
  // Removes key from the index (not from storage); lock held.
  void unindex_locked(const BlockKey& key);

  struct Entry {
    uint64_t size;
    uint64_t gen;                       // unique per put (or per record found at open)
    std::list<BlockKey>::iterator lru;  // position in lru_ (front = least recently used)
  };
  std::string path_;
  uint64_t max_bytes_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> index_;
  std::list<BlockKey> lru_;
  uint64_t total_bytes_ = 0;
  uint64_t next_gen_ = 1;
  StoreStats stats_;
};

// mkdir -p (mode 0755); 0 or the errno of the first failure (ENOTDIR if a component is a file).
int make_dirs(const std::string& path);

std::unique_ptr<BlockStore> open_file_block_store(const std::string& path, uint64_t max_bytes,
                                                  const BlockStoreOptions& options);
#ifdef PAGEDLLM_WITH_ROCKSDB
std::unique_ptr<BlockStore> open_rocksdb_block_store(const std::string& path, uint64_t max_bytes,
                                                     const BlockStoreOptions& options);
#endif

}  // namespace pagedllm::detail
