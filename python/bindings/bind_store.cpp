// _core.BlockStore, _core.block_key, _core.ROOT_BLOCK_KEY: the persistent KV block store.
//
// Keys cross as 16-byte `bytes` (key.hi big-endian, then key.lo big-endian: `key.hex()` is the
// record's file name). Payloads cross as any C-contiguous CPU buffer: the buffer protocol first
// (numpy, bytes, bytearray, memoryview), then DLPack (torch tensors), never copied on the way
// in; `get_into` writes straight into a caller's writable buffer. Every call that touches the
// disk releases the GIL. `close()` drops this object's reference: the store (and its lock) is
// released once calls in flight on other threads have returned.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>

#include "bindings.h"
#include "int_arrays.h"
#include "pagedllm/block_store.h"
#include "pagedllm/error.h"
#ifdef PAGEDLLM_WITH_KERNELS
#include "dlpack_tensor.h"
#endif

namespace py = pybind11;

namespace pagedllm::python {

namespace {

BlockKey key_from_bytes(const py::bytes& b, const char* what) {
  char* data = nullptr;
  Py_ssize_t n = 0;
  PyBytes_AsStringAndSize(b.ptr(), &data, &n);
  PAGEDLLM_CHECK_ARG(n == 16, what << " must be 16 bytes, got " << n);
  BlockKey k;
  for (int i = 0; i < 8; ++i) k.hi = (k.hi << 8) | static_cast<uint8_t>(data[i]);
  for (int i = 8; i < 16; ++i) k.lo = (k.lo << 8) | static_cast<uint8_t>(data[i]);
  return k;
}

py::bytes key_to_bytes(const BlockKey& k) {
  char out[16];
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((k.hi >> (8 * (7 - i))) & 0xFF);
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<char>((k.lo >> (8 * (7 - i))) & 0xFF);
  return py::bytes(out, 16);
}

// `obj` as a 1-D int32 array of token ids (int_arrays.h: no float, no id outside int32).
IntArray<TokenId> tokens_array(py::handle obj) {
  auto tokens = int_array<TokenId>(obj, "tokens");
  PAGEDLLM_CHECK_ARG(tokens.ndim() == 1, "tokens must be a 1-D int32 array, got " << tokens.ndim()
                                                                                  << " dims");
  PAGEDLLM_CHECK_ARG(tokens.size() <= INT32_MAX, "tokens has too many elements: " << tokens.size());
  return tokens;
}

std::vector<TokenId> tokens_of(py::handle obj) {
  const auto tokens = tokens_array(obj);
  return std::vector<TokenId>(tokens.data(), tokens.data() + tokens.size());
}

// A contiguous byte range borrowed from a Python object for one call. Create and destroy with
// the GIL held; data()/size() are safe without it.
class ByteView {
 public:
  ByteView(py::handle obj, const char* name, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_CheckBuffer(obj.ptr()) && PyObject_GetBuffer(obj.ptr(), &view_, flags) == 0) {
      has_view_ = true;
      data_ = static_cast<uint8_t*>(view_.buf);
      size_ = static_cast<size_t>(view_.len);
      return;
    }
    PyErr_Clear();
#ifdef PAGEDLLM_WITH_KERNELS
    if (py::hasattr(obj, "__dlpack__")) {
      tensor_.emplace(obj, name);
      tensor_->require_cpu();
      if (tensor_->ndim() > 0) tensor_->require_inner_contiguous(0);
      if (writable) tensor_->require_writable();
      data_ = static_cast<uint8_t*>(tensor_->data());
      size_ = static_cast<size_t>(tensor_->numel()) * static_cast<size_t>(tensor_->itemsize());
      return;
    }
#endif
    PAGEDLLM_CHECK_ARG(false, name << " must be a C-contiguous" << (writable ? " writable" : "")
                                   << " CPU buffer (numpy array, bytes, memoryview or a tensor "
                                      "with __dlpack__), got "
                                   << std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  ~ByteView() {
    if (has_view_) PyBuffer_Release(&view_);
  }
  ByteView(const ByteView&) = delete;
  ByteView& operator=(const ByteView&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Py_buffer view_{};
  bool has_view_ = false;
#ifdef PAGEDLLM_WITH_KERNELS
  std::optional<Tensor> tensor_;
#endif
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The Python object: a shared reference so that close() cannot free a store under a call.
class PyBlockStore {
 public:
  PyBlockStore(const std::string& path, const std::string& backend, uint64_t max_bytes, bool fsync) {
    BlockStoreOptions opts;
    opts.fsync = fsync;
    std::unique_ptr<BlockStore> s;
    {
      py::gil_scoped_release nogil;
      s = open_block_store(backend, path, max_bytes, opts);
    }
    store_ = std::shared_ptr<BlockStore>(std::move(s));
    backend_ = backend;
    path_ = path;
  }

  std::shared_ptr<BlockStore> get() const {
    PAGEDLLM_CHECK_STATE(store_ != nullptr, "BlockStore('" << path_ << "') is closed");
    return store_;
  }

  void close() {
    std::shared_ptr<BlockStore> s = std::move(store_);
    store_.reset();
    if (s) {
      py::gil_scoped_release nogil;
      s.reset();  // closes unless another thread's call still holds it
    }
  }

  bool closed() const { return store_ == nullptr; }
  const std::string& backend() const { return backend_; }
  const std::string& path() const { return path_; }

 private:
  std::shared_ptr<BlockStore> store_;
  std::string backend_;
  std::string path_;
};

RecordMeta make_meta(const std::string& fingerprint, int32_t block_size, py::handle tokens) {
  RecordMeta m;
  m.fingerprint = fingerprint;
  m.block_size = block_size;
  m.tokens = tokens_of(tokens);
  return m;
}

}  // namespace

void bind_store(py::module_& m) {
  m.attr("ROOT_BLOCK_KEY") = key_to_bytes(kRootKey);
  m.def(
      "block_key",
      [](const py::bytes& parent, py::handle tokens_in, uint64_t extra_key) {
        const BlockKey p = key_from_bytes(parent, "parent");
        const auto tokens = tokens_array(tokens_in);
        return key_to_bytes(block_key(p, tokens.data(), static_cast<int32_t>(tokens.size()), extra_key));
      },
      py::arg("parent"), py::arg("tokens"), py::arg("extra_key") = 0,
      "128-bit chained content key (XXH3-128) of a block: parent key (16 bytes; ROOT_BLOCK_KEY "
      "for the first block), the block's token ids, an extra key. Returns 16 bytes.");

  m.def(
      "file_digest",
      [](const std::string& path) {
        BlockKey k;
        {
          py::gil_scoped_release release;
          k = file_digest(path);
        }
        return key_to_bytes(k);
      },
      py::arg("path"),
      "XXH3-128 of every byte of the file at path (16 bytes); reads it front to back without "
      "the GIL. Raises OSError naming the path when it cannot be read.");

  py::class_<PyBlockStore>(m, "BlockStore",
                           "Persistent content-addressed KV block store (file or rocksdb backend). "
                           "Thread-safe; I/O releases the GIL.")
      .def(py::init<const std::string&, const std::string&, uint64_t, bool>(), py::arg("path"),
           py::arg("backend") = "file", py::arg("max_bytes") = 0, py::arg("fsync") = false,
           "Opens (creating) the store at path. max_bytes = 0: unlimited. OSError if the path "
           "cannot be used or another opener holds it; ValueError for an unknown backend.")
      .def(
          "put",
          [](PyBlockStore& self, const py::bytes& key, const std::string& fingerprint,
             int32_t block_size, py::handle tokens, py::handle payload,
             std::optional<py::bytes> parent) {
            auto s = self.get();
            const BlockKey k = key_from_bytes(key, "key");
            const RecordMeta meta = make_meta(fingerprint, block_size, tokens);
            ByteView view(payload, "payload", false);
            const std::optional<BlockKey> p =
                parent ? std::optional<BlockKey>(key_from_bytes(*parent, "parent")) : std::nullopt;
            py::gil_scoped_release nogil;
            return s->put(k, meta, view.data(), view.size(), p ? &*p : nullptr);
          },
          py::arg("key"), py::arg("fingerprint"), py::arg("block_size"), py::arg("tokens"),
          py::arg("payload"), py::arg("parent") = py::none(),
          "Stores the record; True once visible, False on a write failure (disk full, read-only, "
          "no permission) or a record over max_bytes. parent: the chain's previous key (the "
          "record is then evicted before it).")
      .def(
          "get_into",
          [](PyBlockStore& self, const py::bytes& key, const std::string& fingerprint,
             int32_t block_size, py::handle tokens, py::handle out) {
            auto s = self.get();
            const BlockKey k = key_from_bytes(key, "key");
            const RecordMeta meta = make_meta(fingerprint, block_size, tokens);
            ByteView view(out, "out", true);
            py::gil_scoped_release nogil;
            return s->get_into(k, meta, view.data(), view.size());
          },
          py::arg("key"), py::arg("fingerprint"), py::arg("block_size"), py::arg("tokens"),
          py::arg("out"),
          "Writes the verified payload into out (exactly its size) and returns True; False on a "
          "miss (absent, mismatching or corrupt record -- the last two are erased -- or a size "
          "mismatch). out's contents are unspecified after a miss.")
      .def(
          "get",
          [](PyBlockStore& self, const py::bytes& key, const std::string& fingerprint,
             int32_t block_size, py::handle tokens) -> py::object {
            auto s = self.get();
            const BlockKey k = key_from_bytes(key, "key");
            const RecordMeta meta = make_meta(fingerprint, block_size, tokens);
            std::optional<std::vector<uint8_t>> r;
            {
              py::gil_scoped_release nogil;
              r = s->get(k, meta);
            }
            if (!r) return py::none();
            return py::bytes(reinterpret_cast<const char*>(r->data()), r->size());
          },
          py::arg("key"), py::arg("fingerprint"), py::arg("block_size"), py::arg("tokens"),
          "The verified payload as bytes, or None on a miss.")
      .def(
          "contains",
          [](PyBlockStore& self, const py::bytes& key) {
            auto s = self.get();
            const BlockKey k = key_from_bytes(key, "key");
            py::gil_scoped_release nogil;
            return s->contains(k);
          },
          py::arg("key"), "True if a record is indexed under key (no disk access).")
      .def("__contains__",
           [](PyBlockStore& self, const py::bytes& key) {
             auto s = self.get();
             const BlockKey k = key_from_bytes(key, "key");
             py::gil_scoped_release nogil;
             return s->contains(k);
           })
      .def(
          "touch",
          [](PyBlockStore& self, const std::vector<py::bytes>& keys) {
            auto s = self.get();
            std::vector<BlockKey> ks;
            ks.reserve(keys.size());
            for (const auto& k : keys) ks.push_back(key_from_bytes(k, "keys[i]"));
            py::gil_scoped_release release;
            s->touch(ks);
          },
          py::arg("keys"),
          "Marks the indexed records among keys as used now, in order (the last is the most "
          "recently used, evicted last); unknown keys are skipped.")
      .def(
          "erase",
          [](PyBlockStore& self, const py::bytes& key) {
            auto s = self.get();
            const BlockKey k = key_from_bytes(key, "key");
            py::gil_scoped_release nogil;
            return s->erase(k);
          },
          py::arg("key"), "Deletes the record; True if one was indexed.")
      .def(
          "keys",
          [](PyBlockStore& self) {
            auto s = self.get();
            std::vector<BlockKey> ks;
            {
              py::gil_scoped_release nogil;
              ks = s->keys();
            }
            py::list out;
            for (const BlockKey& k : ks) out.append(key_to_bytes(k));
            return out;
          },
          "Keys of all records (16-byte bytes), in no particular order.")
      .def("__len__", [](PyBlockStore& self) { return self.get()->stats().records; })
      .def(
          "stats",
          [](PyBlockStore& self) {
            auto s = self.get();
            const StoreStats st = s->stats();
            py::dict d;
            d["backend"] = s->backend();
            d["path"] = s->path();
            d["records"] = st.records;
            d["bytes"] = st.bytes;
            d["max_bytes"] = st.max_bytes;
            d["hits"] = st.hits;
            d["misses"] = st.misses;
            d["corrupt_dropped"] = st.corrupt_dropped;
            d["mismatch_dropped"] = st.mismatch_dropped;
            d["bytes_read"] = st.bytes_read;
            d["bytes_written"] = st.bytes_written;
            d["puts"] = st.puts;
            d["write_errors"] = st.write_errors;
            d["evictions"] = st.evictions;
            return d;
          },
          "backend, path, records, bytes (on disk), max_bytes, hits, misses, corrupt_dropped, "
          "mismatch_dropped, bytes_read, bytes_written, puts, write_errors, evictions.")
      .def("close", &PyBlockStore::close, "Releases the store and its lock; idempotent.")
      .def_property_readonly("closed", &PyBlockStore::closed)
      .def_property_readonly("backend", &PyBlockStore::backend)
      .def_property_readonly("path", &PyBlockStore::path)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyBlockStore& self, py::args) { self.close(); })
      .def("__repr__", [](const PyBlockStore& self) {
        return "BlockStore(path='" + self.path() + "', backend='" + self.backend() + "'" +
               (self.closed() ? ", closed" : "") + ")";
      });
}

}  // namespace pagedllm::python
