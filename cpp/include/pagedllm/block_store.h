// pagedllm/block_store.h — a persistent, content-addressed store of KV blocks (issue 13).
//
// A record is one full KV block: a header (magic, format version, the key, an opaque
// fingerprint naming model + KV dtype + layout, block_size, the block's token ids, the payload
// length, an xxh3-64 checksum of header and payload) followed by the payload bytes. A reader
// gets the payload only when the header matches what it expects and the checksum verifies; any
// other record under the key is a miss and is erased. Keys are 128-bit chained content hashes
// (`block_key`) that outlive the process.
//
// Backends (`open_block_store`):
//   "file"    (always compiled) one file per record, `path/<2 hex>/<32 hex>.kvb`, written to a
//             temporary name in the same directory and renamed over the final name, so a
//             reader sees either the whole old record, the whole new one or none (a kill -9
//             leaves at most a temporary file, deleted at the next open). fsync is optional
//             (`BlockStoreOptions::fsync`): without it a power loss can leave a torn record,
//             which the checksum turns into a miss. `path/LOCK` is held with flock(LOCK_EX) for
//             the store's lifetime: a second opener (another process or another BlockStore in
//             this one) is refused with a pagedllm::Error naming the path.
//   "rocksdb" (when built with RocksDB, see `compiled_block_store_backends()`) the same record
//             as the value of a 16-byte key; RocksDB's own LOCK refuses a second opener.
//
// Size cap: with `max_bytes` > 0 the least recently used records (by last get hit or put) are
// deleted while the bytes on disk exceed the cap; a record larger than the cap is refused.
// Recency is kept in memory; at open it is rebuilt from file modification times (file, which
// also touches a record's mtime on each hit) or key order (rocksdb).
//
// Limits: fingerprint <= 64 KiB, <= 2^20 tokens and <= 16 GiB of payload per record (a put
// beyond them returns false); one opener per directory at a time, across processes; the index
// costs ~100 bytes of memory per record; record files are little-endian (the library refuses to build on
// big-endian hosts).
//
// Errors: opening an unusable path (not creatable, not a directory, no permission, locked) throws
// pagedllm::Error(kIo) naming the path. After a successful open no call throws for I/O
// reasons: put returns false (and counts a write error) on disk full / EROFS / EACCES, get
// returns nullopt. Only calls on a closed store throw (kInvalidState).
//
// Thread-safety: every member function is safe to call concurrently from any number of threads
// (e.g. the engine's transfer thread writing while the scheduler asks `contains`). The index
// and the counters are guarded by one mutex; file reads and the writing of temporary files run
// outside it, publication (rename / RocksDB Put) and deletion inside it. `contains` never touches
// the disk. A concurrent put and erase of one key may end either way; never with a torn record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedllm/types.h"

namespace pagedllm {

// A 128-bit content key. Equal keys name the same (parent chain, tokens, extra key).
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  // Field-wise equality.
  bool operator==(const BlockKey& o) const { return hi == o.hi && lo == o.lo; }
  // Field-wise inequality.
  bool operator!=(const BlockKey& o) const { return !(*this == o); }
};

// Hash functor for unordered containers of BlockKey.
struct BlockKeyHash {
  // Mixes both halves (the key is already a uniform hash).
  size_t operator()(const BlockKey& k) const { return static_cast<size_t>(k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull)); }
};

// The parent key of a sequence's first block.
inline constexpr BlockKey kRootKey{0, 0};

// Key of a block: XXH3-128 over (a domain tag, parent.hi, parent.lo, extra_key, n, tokens[0..n)),
// all little-endian. Deterministic across processes, machines and versions of this library
// (changing it is a format change). Throws kInvalidArgument if n < 0 or (n > 0 and !tokens).
BlockKey block_key(const BlockKey& parent, const TokenId* tokens, int32_t n, uint64_t extra_key);

// 32 lowercase hex digits, hi first (used as the file name).
std::string to_hex(const BlockKey& key);

// XXH3-128 of every byte of the file at `path`, read front to back (what a persistent tier
// fingerprints a checkpoint's weights by: a change anywhere changes it). Throws kIo naming the
// path if it cannot be opened or read.
BlockKey file_digest(const std::string& path);

// What a record claims to be; a get must name the same to receive the payload.
struct RecordMeta {
  std::string fingerprint;      // model fingerprint + KV dtype + layout; opaque to the store
  int32_t block_size = 0;       // tokens per block
  std::vector<TokenId> tokens;  // the block's token ids (compared on load)
};

// Counters since open, plus the current size on disk.
struct StoreStats {
  uint64_t records = 0;           // records indexed now
  uint64_t bytes = 0;             // their bytes on disk (header + payload)
  uint64_t max_bytes = 0;         // the cap (0 = unlimited)
  uint64_t hits = 0;              // gets that returned a payload
  uint64_t misses = 0;            // gets that did not (absent, mismatching, corrupt, wrong size)
  uint64_t corrupt_dropped = 0;   // records erased because they failed to parse or verify
  uint64_t mismatch_dropped = 0;  // verified records erased because their header mismatched
  uint64_t bytes_read = 0;        // record bytes read from storage
  uint64_t bytes_written = 0;     // record bytes written by successful puts
  uint64_t puts = 0;              // successful puts
  uint64_t write_errors = 0;      // puts that failed (I/O error or a record over the cap)
  uint64_t evictions = 0;         // records deleted by the size cap
};

// Open-time settings beyond the factory's positional arguments.
struct BlockStoreOptions {
  bool fsync = false;  // file: fdatasync each record and fsync its directory before returning
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;

  // Stores (meta, data[0..n)) under key, replacing any record there. True once the record is
  // published (visible to get); false on any write failure or a record over max_bytes (counted
  // in write_errors); never throws for I/O. May evict least recently used records. `parent`
  // (optional): the previous block of key's chain; the new record is placed just before it in
  // the eviction order, so a chain written root first loses its tail, never the root that
  // lookups start from; with the parent not indexed it is placed first out (no lookup reaches
  // it). Without a parent it is the most recently used.
  virtual bool put(const BlockKey& key, const RecordMeta& meta, const uint8_t* data, size_t n,
                   const BlockKey* parent = nullptr) = 0;

  // The payload under key if the record parses, its checksum verifies and its header (format
  // version, key, fingerprint, block_size, tokens) equals `expected`; otherwise nullopt (a
  // miss) and a present-but-bad record is erased.
  virtual std::optional<std::vector<uint8_t>> get(const BlockKey& key, const RecordMeta& expected) = 0;

  // As get, but writes the payload into out[0..n) and returns true only when the verified
  // payload is exactly n bytes (a size mismatch is a miss; that record is kept). On a miss
  // out's contents are unspecified.
  virtual bool get_into(const BlockKey& key, const RecordMeta& expected, uint8_t* out, size_t n) = 0;

  // True if a record is indexed under key (no disk access; a later get may still miss).
  virtual bool contains(const BlockKey& key) const = 0;

  // Deletes the record under key; true if one was indexed.
  virtual bool erase(const BlockKey& key) = 0;

  // Marks the indexed records among keys as used now, in order: the last is the most recently
  // used, so the size cap evicts it last (a chain touched tail to root loses its tail first,
  // keeping the prefix that lookups walk from the root). Unknown keys are skipped. Recency on
  // disk (for the next open) is best effort; never throws for I/O.
  virtual void touch(const std::vector<BlockKey>& keys) = 0;

  // Keys of all indexed records (a snapshot, in no particular order).
  virtual std::vector<BlockKey> keys() const = 0;

  // Calls fn(key, record_bytes) for each record of a snapshot, without holding the lock (fn
  // may call back into the store).
  virtual void scan(const std::function<void(const BlockKey&, uint64_t)>& fn) const = 0;

  // Counters and current size.
  virtual StoreStats stats() const = 0;

  // "file" or "rocksdb".
  virtual std::string backend() const = 0;

  // The directory given at open.
  virtual std::string path() const = 0;

  // Releases the lock and the backend; later calls throw kInvalidState. Idempotent. Must not
  // race with other calls on this object (the destructor closes too).
  virtual void close() = 0;
};

// Opens (creating the directory if missing) a store of the given backend ("file" | "rocksdb").
// max_bytes = 0 means unlimited. Throws pagedllm::Error: kInvalidArgument for an unknown or
// not-compiled backend, kIo for a path that cannot be used or is locked by another opener.
std::unique_ptr<BlockStore> open_block_store(const std::string& backend, const std::string& path,
                                             uint64_t max_bytes = 0,
                                             const BlockStoreOptions& options = {});

// Backends compiled into this build, e.g. {"file", "rocksdb"}.
std::vector<std::string> compiled_block_store_backends();

}  // namespace pagedllm
