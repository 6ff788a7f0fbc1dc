// The "file" block store backend: one file per record, path/<2 hex>/<32 hex>.kvb, written to a
// temporary name (".tmp.<pid>.<n>" appended) in the same directory and renamed into place.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "block_store_internal.h"
#include "pagedllm/error.h"

namespace pagedllm::detail {

// mkdir -p; returns 0 or the errno of the first failure.
int make_dirs(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    const int e = make_dirs(path.substr(0, slash));
    if (e != 0) return e;
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  return 0;
}

namespace {

constexpr const char* kSuffix = ".kvb";
constexpr const char* kTmpMarker = ".tmp.";

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// Parses 32 hex digits into a key; false if s is not exactly that.
bool parse_hex_key(const std::string& s, BlockKey* key) {
  if (s.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    const char c = s[static_cast<size_t>(i)];
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else return false;
    parts[i / 16] = (parts[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  key->hi = parts[0];
  key->lo = parts[1];
  return true;
}

bool write_all(int fd, const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
  while (na + nb > 0) {
    struct iovec iov[2];
    int cnt = 0;
    if (na > 0) iov[cnt++] = {const_cast<uint8_t*>(a), na};
    if (nb > 0) iov[cnt++] = {const_cast<uint8_t*>(b), nb};
    const ssize_t w = ::writev(fd, iov, cnt);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) return false;
    size_t done = static_cast<size_t>(w);
    const size_t from_a = std::min(done, na);
    a += from_a;
    na -= from_a;
    done -= from_a;
    b += done;
    nb -= done;
  }
  return true;
}

class FileBlockStore final : public IndexedStore {
 public:
  FileBlockStore(const std::string& path, uint64_t max_bytes, const BlockStoreOptions& options)
      : IndexedStore(path, max_bytes), dir_(path), fsync_(options.fsync) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    const int e = make_dirs(dir_);
    PAGEDLLM_CHECK_IO(e == 0, "block store: cannot create directory '" << dir_ << "': " << errno_text(e));
    const std::string lock_path = dir_ + "/LOCK";
    lock_fd_ = ::open(lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);  // flock needs no write access
    PAGEDLLM_CHECK_IO(lock_fd_ >= 0, "block store: cannot open lock file '"
                                         << lock_path << "': " << errno_text(errno));
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(lock_fd_);
      lock_fd_ = -1;
      PAGEDLLM_CHECK_IO(err != EWOULDBLOCK,
                        "block store '" << dir_ << "' is already open (by another process or "
                                        "another BlockStore: '" << lock_path << "' is locked)");
      PAGEDLLM_CHECK_IO(false, "block store: cannot lock '" << lock_path << "': " << errno_text(err));
    }
    try {
      // Prove the directory is writable now rather than at the first put.
      const std::string probe = dir_ + "/.probe" + kTmpMarker + std::to_string(::getpid());
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      PAGEDLLM_CHECK_IO(fd >= 0, "block store: directory '" << dir_ << "' is not writable: "
                                                            << errno_text(errno));
      ::close(fd);
      ::unlink(probe.c_str());
      rebuild_index();
    } catch (...) {
      ::close(lock_fd_);
      lock_fd_ = -1;
      throw;
    }
  }

  ~FileBlockStore() override { close(); }

  std::string backend() const override { return "file"; }

 protected:
  bool stage(const BlockKey& key, const std::vector<uint8_t>& header, const uint8_t* payload,
             size_t n, Staged* out) override {
    const unsigned seq = counter_.fetch_add(1, std::memory_order_relaxed);
    out->name = record_path(key) + kTmpMarker + std::to_string(::getpid()) + "." + std::to_string(seq);
    int fd = ::open(out->name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT) {  // the shard directory was removed behind our back
      ::mkdir(shard_dir(static_cast<unsigned>(key.hi >> 56)).c_str(), 0755);
      fd = ::open(out->name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) return false;
    bool ok = write_all(fd, header.data(), header.size(), payload, n);
    if (ok && fsync_) ok = ::fdatasync(fd) == 0;
    if (::close(fd) != 0) ok = false;
    if (!ok) ::unlink(out->name.c_str());
    return ok;
  }

  bool publish(const BlockKey& key, Staged& staged) override {
    const std::string final_path = record_path(key);
    if (::rename(staged.name.c_str(), final_path.c_str()) != 0) {
      ::unlink(staged.name.c_str());
      return false;
    }
    if (fsync_) {
      const int dfd = ::open(shard_dir(static_cast<unsigned>(key.hi >> 56)).c_str(),
                             O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
      }
    }
    return true;
  }

  void discard(Staged& staged) override { ::unlink(staged.name.c_str()); }

  bool read_record(const BlockKey& key, std::vector<uint8_t>* out) override {
    const std::string p = record_path(key);
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              static_cast<uint64_t>(st.st_size) <= kMaxPayloadBytes + (1u << 24);
    if (ok) {
      out->resize(static_cast<size_t>(st.st_size));
      size_t got = 0;
      while (got < out->size()) {
        const ssize_t r = ::read(fd, out->data() + got, out->size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
      }
      out->resize(got);  // a short read is a truncated record: decode reports it corrupt
      ::futimens(fd, nullptr);  // recency for the next open's LRU order (best effort)
    }
    ::close(fd);
    return ok;
  }

  void remove_record(const BlockKey& key) override { ::unlink(record_path(key).c_str()); }
  void touch_record(const BlockKey& key, int64_t unix_ns) override {
    struct timespec times[2];
    times[0].tv_sec = 0;
    times[0].tv_nsec = UTIME_OMIT;  // atime unchanged
    times[1].tv_sec = static_cast<time_t>(unix_ns / 1000000000);
    times[1].tv_nsec = static_cast<long>(unix_ns % 1000000000);
    ::utimensat(AT_FDCWD, record_path(key).c_str(), times, 0);  // best effort
  }

  void close_backend() override {
    if (lock_fd_ >= 0) {
      ::close(lock_fd_);  // releases the flock
      lock_fd_ = -1;
    }
  }

 private:
  std::string shard_dir(unsigned shard) const {
    static const char* digits = "0123456789abcdef";
    std::string s = dir_ + "/xx";
    s[s.size() - 2] = digits[(shard >> 4) & 0xF];
    s[s.size() - 1] = digits[shard & 0xF];
    return s;
  }

  std::string record_path(const BlockKey& key) const {
    return shard_dir(static_cast<unsigned>(key.hi >> 56)) + "/" + to_hex(key) + kSuffix;
  }

  // Deletes leftover temporary files and indexes every record file, oldest mtime first.
  void rebuild_index() {
    struct Found {
      BlockKey key;
      uint64_t size;
      int64_t mtime_ns;
    };
    std::vector<Found> found;
    if (DIR* top = ::opendir(dir_.c_str())) {  // an open-time probe left by a crash
      while (struct dirent* e = ::readdir(top)) {
        const std::string name = e->d_name;
        if (name.rfind(std::string(".probe") + kTmpMarker, 0) == 0) ::unlink((dir_ + "/" + name).c_str());
      }
      ::closedir(top);
    }
    for (unsigned s = 0; s < 256; ++s) {
      const std::string sub = shard_dir(s);
      DIR* d = ::opendir(sub.c_str());
      if (d == nullptr && errno == ENOENT) continue;  // shard directories are made on first use
      PAGEDLLM_CHECK_IO(d != nullptr, "block store: cannot read directory '" << sub << "': "
                                                                            << errno_text(errno));
      while (struct dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        const std::string full = sub + "/" + name;
        if (name.find(kTmpMarker) != std::string::npos) {
          ::unlink(full.c_str());  // an unfinished write (we hold the lock: nobody else writes)
          continue;
        }
        BlockKey key;
        const size_t sl = std::strlen(kSuffix);
        if (name.size() != 32 + sl || name.compare(32, sl, kSuffix) != 0 ||
            !parse_hex_key(name.substr(0, 32), &key))
          continue;  // not ours: leave it alone
        struct stat st;
        if (::stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        found.push_back({key, static_cast<uint64_t>(st.st_size),
                         static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
      }
      ::closedir(d);
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
    for (const Found& f : found) index_existing(f.key, f.size);
    std::lock_guard<std::mutex> g(mu_);
    evict_locked();  // the cap may have shrunk since the last run
  }

  std::string dir_;
  bool fsync_;
  int lock_fd_ = -1;
  std::atomic<unsigned> counter_{0};
};

}  // namespace

std::unique_ptr<BlockStore> open_file_block_store(const std::string& path, uint64_t max_bytes,
                                                  const BlockStoreOptions& options) {
  return std::make_unique<FileBlockStore>(path, max_bytes, options);
}

}  // namespace pagedllm::detail
