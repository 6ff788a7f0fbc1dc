// Block keys, the record codec, the indexed base of the backends and the factory.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "block_store_internal.h"
#include "pagedllm/error.h"

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the block store's key and record formats are written for little-endian hosts"
#endif

namespace pagedllm {

namespace {
constexpr char kKeyDomain[16] = {'p', 'a', 'g', 'e', 'd', 'l', 'l', 'm', '-', 'b', 'l', 'k', 'k', 'e', 'y', '1'};
}  // namespace

BlockKey block_key(const BlockKey& parent, const TokenId* tokens, int32_t n, uint64_t extra_key) {
  PAGEDLLM_CHECK_ARG(n >= 0, "block_key: token count must be >= 0, got " << n);
  PAGEDLLM_CHECK_ARG(n == 0 || tokens != nullptr, "block_key: tokens is null with n = " << n);
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const uint32_t count = static_cast<uint32_t>(n);
  XXH3_128bits_update(&state, kKeyDomain, sizeof(kKeyDomain));
  XXH3_128bits_update(&state, &parent.hi, 8);
  XXH3_128bits_update(&state, &parent.lo, 8);
  XXH3_128bits_update(&state, &extra_key, 8);
  XXH3_128bits_update(&state, &count, 4);
  if (n > 0) XXH3_128bits_update(&state, tokens, static_cast<size_t>(n) * sizeof(TokenId));
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockKey{h.high64, h.low64};
}

std::string to_hex(const BlockKey& key) {
  static const char* digits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = digits[(key.hi >> (4 * i)) & 0xF];
    s[31 - i] = digits[(key.lo >> (4 * i)) & 0xF];
  }
  return s;
}

BlockKey file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  PAGEDLLM_CHECK_IO(fd >= 0, "file_digest: cannot open '" << path << "': " << std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  std::vector<unsigned char> buf(size_t{4} << 20);
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int e = errno;
      ::close(fd);
      PAGEDLLM_CHECK_IO(false, "file_digest: cannot read '" << path << "': " << std::strerror(e));
    }
    if (got == 0) break;
    XXH3_128bits_update(&state, buf.data(), static_cast<size_t>(got));
  }
  ::close(fd);
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockKey{h.high64, h.low64};
}

std::vector<std::string> compiled_block_store_backends() {
  std::vector<std::string> v{"file"};
#ifdef PAGEDLLM_WITH_ROCKSDB
  v.emplace_back("rocksdb");
#endif
  return v;
}

std::unique_ptr<BlockStore> open_block_store(const std::string& backend, const std::string& path,
                                             uint64_t max_bytes, const BlockStoreOptions& options) {
  PAGEDLLM_CHECK_ARG(!path.empty(), "block store: the path is empty");
  if (backend == "file") return detail::open_file_block_store(path, max_bytes, options);
  if (backend == "rocksdb") {
#ifdef PAGEDLLM_WITH_ROCKSDB
    return detail::open_rocksdb_block_store(path, max_bytes, options);
#else
    PAGEDLLM_CHECK_ARG(false, "block store backend 'rocksdb' is not compiled into this build "
                                  "(RocksDB was not found when it was built); use 'file'");
#endif
  }
  PAGEDLLM_CHECK_ARG(false, "unknown block store backend '" << backend
                                                              << "' (expected 'file' or 'rocksdb')");
  return nullptr;
}

namespace detail {

namespace {

template <typename T>
void append_le(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// Bounds-checked little-endian reader over a byte range.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  bool read(T* v) {
    if (n_ - pos_ < sizeof(T)) return false;
    std::memcpy(v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool skip(size_t k, const uint8_t** at) {
    if (n_ - pos_ < k) return false;
    *at = p_ + pos_;
    pos_ += k;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

uint64_t record_checksum(const uint8_t* header, size_t header_without_sum, const uint8_t* payload,
                         size_t n) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, header, header_without_sum);
  if (n > 0) XXH3_64bits_update(&state, payload, n);
  return XXH3_64bits_digest(&state);
}

}  // namespace

std::vector<uint8_t> encode_header(const BlockKey& key, const RecordMeta& meta,
                                   const uint8_t* payload, size_t n) {
  PAGEDLLM_CHECK_ARG(meta.fingerprint.size() <= kMaxFingerprintBytes,
                     "block store: fingerprint of " << meta.fingerprint.size()
                                                    << " bytes exceeds " << kMaxFingerprintBytes);
  PAGEDLLM_CHECK_ARG(meta.tokens.size() <= kMaxRecordTokens,
                     "block store: " << meta.tokens.size() << " tokens exceed " << kMaxRecordTokens);
  PAGEDLLM_CHECK_ARG(n <= kMaxPayloadBytes, "block store: payload of " << n << " bytes is too large");
  std::vector<uint8_t> h;
  h.reserve(64 + meta.fingerprint.size() + 4 * meta.tokens.size());
  h.insert(h.end(), kRecordMagic, kRecordMagic + 8);
  append_le<uint32_t>(h, kRecordFormatVersion);
  append_le<uint32_t>(h, 0);  // header length, patched below
  append_le<uint64_t>(h, key.hi);
  append_le<uint64_t>(h, key.lo);
  append_le<uint32_t>(h, static_cast<uint32_t>(meta.fingerprint.size()));
  h.insert(h.end(), meta.fingerprint.begin(), meta.fingerprint.end());
  append_le<int32_t>(h, meta.block_size);
  append_le<uint32_t>(h, static_cast<uint32_t>(meta.tokens.size()));
  for (TokenId t : meta.tokens) append_le<int32_t>(h, t);
  append_le<uint64_t>(h, static_cast<uint64_t>(n));
  const uint32_t header_len = static_cast<uint32_t>(h.size() + 8);
  std::memcpy(h.data() + 12, &header_len, 4);
  const uint64_t sum = record_checksum(h.data(), h.size(), payload, n);
  append_le<uint64_t>(h, sum);
  return h;
}

DecodeResult decode_record(const uint8_t* rec, size_t size, const BlockKey& key,
                           const RecordMeta& expected, size_t* payload_offset,
                           size_t* payload_size) {
  Reader r(rec, size);
  const uint8_t* magic = nullptr;
  uint32_t version = 0, header_len = 0, fp_len = 0, n_tokens = 0;
  uint64_t hi = 0, lo = 0, payload_len = 0, sum = 0;
  int32_t block_size = 0;
  const uint8_t* fp = nullptr;
  const uint8_t* toks = nullptr;
  if (!r.skip(8, &magic) || std::memcmp(magic, kRecordMagic, 8) != 0) return DecodeResult::kCorrupt;
  if (!r.read(&version) || version != kRecordFormatVersion) return DecodeResult::kCorrupt;
  if (!r.read(&header_len) || header_len > size) return DecodeResult::kCorrupt;
  if (!r.read(&hi) || !r.read(&lo)) return DecodeResult::kCorrupt;
  if (!r.read(&fp_len) || fp_len > kMaxFingerprintBytes || !r.skip(fp_len, &fp))
    return DecodeResult::kCorrupt;
  if (!r.read(&block_size) || !r.read(&n_tokens) || n_tokens > kMaxRecordTokens ||
      !r.skip(size_t{n_tokens} * 4, &toks))
    return DecodeResult::kCorrupt;
  if (!r.read(&payload_len)) return DecodeResult::kCorrupt;
  const size_t sum_at = r.pos();
  if (!r.read(&sum) || r.pos() != header_len) return DecodeResult::kCorrupt;
  if (payload_len != size - header_len) return DecodeResult::kCorrupt;  // truncated or padded
  if (record_checksum(rec, sum_at, rec + header_len, payload_len) != sum) return DecodeResult::kCorrupt;
  // Verified: now compare what it claims to be with what the reader expects.
  if (hi != key.hi || lo != key.lo) return DecodeResult::kMismatch;
  if (fp_len != expected.fingerprint.size() ||
      std::memcmp(fp, expected.fingerprint.data(), fp_len) != 0)
    return DecodeResult::kMismatch;
  if (block_size != expected.block_size || n_tokens != expected.tokens.size() ||
      (n_tokens > 0 && std::memcmp(toks, expected.tokens.data(), size_t{n_tokens} * 4) != 0))
    return DecodeResult::kMismatch;
  *payload_offset = header_len;
  *payload_size = payload_len;
  return DecodeResult::kOk;
}

// ---- IndexedStore ------------------------------------------------------------------------

void IndexedStore::check_open_locked() const {
  PAGEDLLM_CHECK_STATE(!closed_, "block store '" << path_ << "' is closed");
}

void IndexedStore::index_existing(const BlockKey& key, uint64_t size) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) {
    total_bytes_ -= it->second.size;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  lru_.push_back(key);
  index_.emplace(key, Entry{size, next_gen_++, std::prev(lru_.end())});
  total_bytes_ += size;
}

uint64_t IndexedStore::gen_locked(const BlockKey& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? 0 : it->second.gen;
}

uint64_t IndexedStore::begin_read(const BlockKey& key) const {
  std::lock_guard<std::mutex> g(mu_);
  check_open_locked();
  return gen_locked(key);
}

void IndexedStore::end_read(const BlockKey& key, uint64_t gen, bool found, bool hit,
                            size_t bytes_read) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_read += bytes_read;
  // Indexed but absent from storage (deleted behind our back): forget it, unless a put
  // published a new record meanwhile.
  if (!found && gen != 0 && gen_locked(key) == gen) unindex_locked(key);
  if (hit) {
    ++stats_.hits;
    auto it = index_.find(key);
    if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
  } else {
    ++stats_.misses;
  }
}

void IndexedStore::unindex_locked(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  total_bytes_ -= it->second.size;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void IndexedStore::evict_locked() {
  if (max_bytes_ == 0) return;
  while (total_bytes_ > max_bytes_ && !lru_.empty()) {
    const BlockKey victim = lru_.front();
    remove_record(victim);
    unindex_locked(victim);
    ++stats_.evictions;
  }
}

bool IndexedStore::put(const BlockKey& key, const RecordMeta& meta, const uint8_t* data, size_t n,
                       const BlockKey* parent) {
  {
    std::lock_guard<std::mutex> g(mu_);
    check_open_locked();
  }
  try {
    if (n > 0 && data == nullptr) throw std::invalid_argument("null payload");
    const std::vector<uint8_t> header = encode_header(key, meta, data, n);
    const uint64_t size = header.size() + n;
    if (max_bytes_ != 0 && size > max_bytes_) {
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.write_errors;
      return false;
    }
    Staged staged;
    staged.size = size;
    if (!stage(key, header, data, n, &staged)) {
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.write_errors;
      return false;
    }
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) discard(staged);
    if (closed_ || !publish(key, staged)) {
      ++stats_.write_errors;
      return false;
    }
    unindex_locked(key);
    // Just before an indexed parent; first out if the parent is gone (no lookup reaches a block
    // past a missing one); the most recently used without a parent.
    std::list<BlockKey>::iterator where = lru_.end();
    if (parent != nullptr) {
      const auto up = index_.find(*parent);
      where = up != index_.end() ? up->second.lru : lru_.begin();
    }
    const auto at = lru_.insert(where, key);
    index_.emplace(key, Entry{size, next_gen_++, at});
    total_bytes_ += size;
    ++stats_.puts;
    stats_.bytes_written += size;
    evict_locked();
    return true;
  } catch (...) {
    // put never throws for I/O or allocation failures: the caller keeps serving from memory.
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.write_errors;
    return false;
  }
}

bool IndexedStore::verify(const BlockKey& key, uint64_t gen, const RecordMeta& expected,
                          const std::vector<uint8_t>& rec, size_t* offset, size_t* size) {
  const DecodeResult r = decode_record(rec.data(), rec.size(), key, expected, offset, size);
  if (r == DecodeResult::kOk) return true;
  std::lock_guard<std::mutex> g(mu_);
  if (closed_) return false;
  if (gen_locked(key) != gen) return false;  // replaced since we read it: not ours to drop
  remove_record(key);
  unindex_locked(key);
  if (r == DecodeResult::kCorrupt) {
    ++stats_.corrupt_dropped;
  } else {
    ++stats_.mismatch_dropped;
  }
  return false;
}

bool IndexedStore::get_into(const BlockKey& key, const RecordMeta& expected, uint8_t* out, size_t n) {
  const uint64_t gen = begin_read(key);
  std::vector<uint8_t> rec;
  bool ok = false;
  bool found = false;
  try {
    found = read_record(key, &rec);
    size_t offset = 0, size = 0;
    if (found && verify(key, gen, expected, rec, &offset, &size) && size == n) {
      if (n > 0) std::memcpy(out, rec.data() + offset, n);
      ok = true;
    }
  } catch (const std::bad_alloc&) {
    ok = false;
  }
  end_read(key, gen, found, ok, rec.size());
  return ok;
}

std::optional<std::vector<uint8_t>> IndexedStore::get(const BlockKey& key, const RecordMeta& expected) {
  const uint64_t gen = begin_read(key);
  std::vector<uint8_t> rec;
  std::optional<std::vector<uint8_t>> result;
  bool found = false;
  try {
    found = read_record(key, &rec);
    size_t offset = 0, size = 0;
    if (found && verify(key, gen, expected, rec, &offset, &size)) {
      result.emplace(rec.begin() + static_cast<std::ptrdiff_t>(offset),
                     rec.begin() + static_cast<std::ptrdiff_t>(offset + size));
    }
  } catch (const std::bad_alloc&) {
    result.reset();
  }
  end_read(key, gen, found, result.has_value(), rec.size());
  return result;
}

bool IndexedStore::contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> g(mu_);
  check_open_locked();
  return index_.count(key) != 0;
}

void IndexedStore::touch(const std::vector<BlockKey>& keys) {
  std::vector<BlockKey> touched;
  {
    std::lock_guard<std::mutex> g(mu_);
    check_open_locked();
    for (const BlockKey& key : keys) {
      auto it = index_.find(key);
      if (it == index_.end()) continue;
      lru_.splice(lru_.end(), lru_, it->second.lru);
      touched.push_back(key);
    }
  }
  // Distinct, increasing times (a microsecond apart), so the order survives a reopen even on
  // file systems whose clock ticks coarsely.
  const int64_t base = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  for (size_t i = 0; i < touched.size(); ++i)
    touch_record(touched[i], base + static_cast<int64_t>(i) * 1000);
}

bool IndexedStore::erase(const BlockKey& key) {
  std::lock_guard<std::mutex> g(mu_);
  check_open_locked();
  const bool had = index_.count(key) != 0;
  remove_record(key);
  unindex_locked(key);
  return had;
}

std::vector<BlockKey> IndexedStore::keys() const {
  std::lock_guard<std::mutex> g(mu_);
  check_open_locked();
  std::vector<BlockKey> v;
  v.reserve(index_.size());
  for (const auto& kv : index_) v.push_back(kv.first);
  return v;
}

void IndexedStore::scan(const std::function<void(const BlockKey&, uint64_t)>& fn) const {
  std::vector<std::pair<BlockKey, uint64_t>> snapshot;
  {
    std::lock_guard<std::mutex> g(mu_);
    check_open_locked();
    snapshot.reserve(index_.size());
    for (const BlockKey& k : lru_) snapshot.emplace_back(k, index_.at(k).size);
  }
  for (const auto& kv : snapshot) fn(kv.first, kv.second);
}

StoreStats IndexedStore::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  check_open_locked();
  StoreStats s = stats_;
  s.records = index_.size();
  s.bytes = total_bytes_;
  s.max_bytes = max_bytes_;
  return s;
}

void IndexedStore::close() {
  std::lock_guard<std::mutex> g(mu_);
  if (closed_) return;
  closed_ = true;
  close_backend();
}

}  // namespace detail

}  // namespace pagedllm
