// Bindings of the KV-cache core: BlockAllocator, BlockTable (as arrays), PrefixCache hashing
// and KVCacheManager. Token ids and sequence ids come in as anything numpy can turn into an
// integer array, range-checked into int32 / int64 / uint64 (int_arrays.h: a float or an id
// outside the type is a ValueError, never truncated); batch results go out as numpy arrays
// written in place (no copies).
// These calls take well under a microsecond each, so they keep the GIL (releasing it would
// cost more than the work).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "int_arrays.h"
#include "pagedllm/block_allocator.h"
#include "pagedllm/error.h"
#include "pagedllm/kv_cache_manager.h"

namespace py = pybind11;

namespace pagedllm::python {
namespace {

// Checks that `a` is one-dimensional and returns its length.
int32_t length_1d(const py::array& a, const char* name) {
  PAGEDLLM_CHECK_ARG(a.ndim() == 1, name << " must be one-dimensional, got " << a.ndim()
                                         << " dimensions");
  PAGEDLLM_CHECK_ARG(a.shape(0) <= INT32_MAX, name << " has too many elements: " << a.shape(0));
  return static_cast<int32_t>(a.shape(0));
}

// (slots int64 [n], cow int32 [k, 2]) from the results of an append.
py::tuple append_result(py::array_t<int64_t> slots, const std::vector<CowPair>& cow) {
  py::array_t<int32_t> pairs({static_cast<py::ssize_t>(cow.size()), py::ssize_t{2}});
  auto p = pairs.mutable_unchecked<2>();
  for (size_t i = 0; i < cow.size(); ++i) {
    p(static_cast<py::ssize_t>(i), 0) = cow[i].src;
    p(static_cast<py::ssize_t>(i), 1) = cow[i].dst;
  }
  return py::make_tuple(std::move(slots), std::move(pairs));
}

py::dict stats_dict(const KVCacheStats& s) {
  py::dict d;
  d["num_blocks"] = s.num_blocks;
  d["block_size"] = s.block_size;
  d["used_blocks"] = s.used_blocks;
  d["cached_blocks"] = s.cached_blocks;
  d["free_blocks"] = s.free_blocks;
  d["peak_used_blocks"] = s.peak_used_blocks;
  d["cached_entries"] = s.cached_entries;
  d["num_seqs"] = s.num_seqs;
  d["tokens_stored"] = s.tokens_stored;
  d["slots_reserved"] = s.slots_reserved;
  d["slots_empty"] = s.slots_empty;
  d["utilization"] = s.slots_reserved > 0
                         ? static_cast<double>(s.tokens_stored) / static_cast<double>(s.slots_reserved)
                         : 0.0;
  d["prefix_cache_queries"] = s.prefix_cache_queries;
  d["prefix_cache_hits"] = s.prefix_cache_hits;
  d["evictions"] = s.evictions;
  d["cow_copies"] = s.cow_copies;
  return d;
}

void bind_allocator(py::module_& m) {
  py::class_<BlockAllocator>(m, "BlockAllocator",
                             "Bitmap pool of KV blocks with per-block refcounts (not thread-safe).")
      .def(py::init<int32_t>(), py::arg("num_blocks"))
      .def("allocate", &BlockAllocator::allocate, "Lowest free block id (refcount 1), or None.")
      .def(
          "allocate_n",
          [](BlockAllocator& a, int32_t n) -> py::object {
            std::vector<BlockId> out;
            if (!a.allocate_n(n, out)) return py::none();
            return py::cast(out);
          },
          py::arg("n"), "n block ids, or None (taking none) when fewer than n are free.")
      .def("incref", &BlockAllocator::incref, py::arg("block_id"))
      .def("decref", &BlockAllocator::decref, py::arg("block_id"), py::arg("park_at_zero") = false,
           "Drops a reference; True when the refcount reached 0 (block freed or parked).")
      .def("release", &BlockAllocator::release, py::arg("block_id"))
      .def("refcount", &BlockAllocator::refcount, py::arg("block_id"))
      .def("is_allocated", &BlockAllocator::is_allocated, py::arg("block_id"))
      .def("is_parked", &BlockAllocator::is_parked, py::arg("block_id"))
      .def_property_readonly("num_free", &BlockAllocator::num_free)
      .def_property_readonly("capacity", &BlockAllocator::capacity)
      .def(
          "churn",
          [](BlockAllocator& a, int64_t pairs, int32_t batch) {
            // Benchmark helper: `pairs` allocate+free pairs in C++ with the GIL released. With
            // batch > 1, blocks are taken `batch` at a time and freed in a scrambled order.
            PAGEDLLM_CHECK_ARG(batch >= 1 && batch <= a.num_free(),
                               "churn: batch must be in [1, num_free = " << a.num_free()
                                                                       << "], got " << batch);
            py::gil_scoped_release release;
            int64_t checksum = 0;
            if (batch == 1) {
              for (int64_t i = 0; i < pairs; ++i) {
                const BlockId id = *a.allocate();
                checksum += id;
                a.decref(id);
              }
              return checksum;
            }
            std::vector<BlockId> held(static_cast<size_t>(batch));
            uint64_t x = 0x2545F4914F6CDD1Dull;
            for (int64_t done = 0; done < pairs; done += batch) {
              for (auto& id : held) id = *a.allocate();
              for (size_t i = held.size() - 1; i > 0; --i) {  // xorshift Fisher-Yates
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                std::swap(held[i], held[x % (i + 1)]);
              }
              for (BlockId id : held) {
                checksum += id;
                a.decref(id);
              }
            }
            return checksum;
          },
          py::arg("pairs"), py::arg("batch") = 1,
          "Benchmark helper: runs `pairs` allocate+free pairs in C++ (batch > 1: scrambled frees).");
}

void bind_manager(py::module_& m) {
  py::class_<KVCacheManager>(
      m, "KVCacheManager",
      "The scheduler's view of KV memory: admission, slot reservation with copy-on-write, "
      "forking, prefix caching with LRU eviction, stats. Not thread-safe.")
      .def(py::init<int32_t, int32_t, bool, int32_t>(), py::arg("num_blocks"),
           py::arg("block_size"), py::arg("enable_prefix_caching") = true,
           py::arg("watermark_blocks") = 0)
      .def_property_readonly("num_blocks", &KVCacheManager::num_blocks)
      .def_property_readonly("block_size", &KVCacheManager::block_size)
      .def_property_readonly("enable_prefix_caching", &KVCacheManager::prefix_caching_enabled)
      .def_property_readonly("watermark_blocks", &KVCacheManager::watermark_blocks)
      .def_property_readonly("num_available_blocks", &KVCacheManager::num_available_blocks,
                             "Free plus evictable cached blocks.")
      .def_property_readonly("num_free_blocks",
                             [](const KVCacheManager& k) { return k.allocator().num_free(); })
      .def(
          "num_cached_tokens",
          [](const KVCacheManager& k, py::handle prompt_in, uint64_t extra_key) {
            const auto prompt = int_array<int32_t>(prompt_in, "prompt");
            return k.num_cached_tokens(prompt.data(), length_1d(prompt, "prompt"), extra_key);
          },
          py::arg("prompt"), py::arg("extra_key") = 0)
      .def(
          "can_allocate",
          [](const KVCacheManager& k, py::handle prompt_in, uint64_t extra_key,
             int32_t num_new_tokens) {
            const auto prompt = int_array<int32_t>(prompt_in, "prompt");
            return k.can_allocate(prompt.data(), length_1d(prompt, "prompt"), extra_key,
                                  num_new_tokens);
          },
          py::arg("prompt"), py::arg("extra_key") = 0, py::arg("num_new_tokens") = 0)
      .def(
          "allocate",
          [](KVCacheManager& k, SeqId seq, py::handle prompt_in, uint64_t extra_key) {
            const auto prompt = int_array<int32_t>(prompt_in, "prompt");
            return k.allocate(seq, prompt.data(), length_1d(prompt, "prompt"), extra_key);
          },
          py::arg("seq_id"), py::arg("prompt"), py::arg("extra_key") = 0,
          "Admits seq_id with its cached prefix blocks; returns the number of cached tokens.")
      .def(
          "block_hashes",
          [](const KVCacheManager& k, py::handle tokens_in, uint64_t extra_key) {
            const auto tokens = int_array<int32_t>(tokens_in, "tokens");
            std::vector<uint64_t> h;
            k.block_hashes(tokens.data(), length_1d(tokens, "tokens"), extra_key, h);
            py::array_t<uint64_t> out(static_cast<py::ssize_t>(h.size()));
            std::copy(h.begin(), h.end(), out.mutable_data());
            return out;
          },
          py::arg("tokens"), py::arg("extra_key") = 0,
          "Chained hashes (uint64[len(tokens) // block_size]) of the full blocks of `tokens`: "
          "compute once per prompt, pass to query_admission/admit.")
      .def(
          "query_admission",
          [](const KVCacheManager& k, py::handle tokens_in, py::handle hashes_in,
             uint64_t extra_key, int32_t max_cached_tokens, int32_t want_new_tokens) {
            const auto tokens = int_array<int32_t>(tokens_in, "tokens");
            const auto hashes = int_array<uint64_t>(hashes_in, "hashes");
            const auto r = k.query_admission(tokens.data(), length_1d(tokens, "tokens"),
                                             hashes.data(), length_1d(hashes, "hashes"),
                                             extra_key, max_cached_tokens, want_new_tokens);
            return py::make_tuple(r.first, r.second);
          },
          py::arg("tokens"), py::arg("hashes"), py::arg("extra_key"),
          py::arg("max_cached_tokens"), py::arg("want_new_tokens"),
          "The ask: (cached prefix tokens, most new tokens admit() could reserve now keeping "
          "the watermark free). No side effects.")
      .def(
          "admit",
          [](KVCacheManager& k, SeqId seq, py::handle tokens_in, py::handle hashes_in,
             uint64_t extra_key, int32_t max_cached_tokens, int32_t num_new_tokens,
             bool cache_new_blocks) -> py::object {
            const auto tokens = int_array<int32_t>(tokens_in, "tokens");
            const auto hashes = int_array<uint64_t>(hashes_in, "hashes");
            PAGEDLLM_CHECK_ARG(num_new_tokens >= 0, "admit: num_new_tokens must be >= 0, got "
                                                        << num_new_tokens);
            py::array_t<int64_t> slots(num_new_tokens);
            std::vector<CowPair> cow;
            const int32_t cached =
                k.admit(seq, tokens.data(), length_1d(tokens, "tokens"), hashes.data(),
                        length_1d(hashes, "hashes"), extra_key, max_cached_tokens,
                        num_new_tokens, slots.mutable_data(), cow, cache_new_blocks);
            if (cached < 0) return py::none();
            py::tuple r = append_result(std::move(slots), cow);
            return py::make_tuple(cached, r[0], r[1]);
          },
          py::arg("seq_id"), py::arg("tokens"), py::arg("hashes"), py::arg("extra_key"),
          py::arg("max_cached_tokens"), py::arg("num_new_tokens"),
          py::arg("cache_new_blocks") = true,
          "The do: registers seq_id with its cached prefix and reserves slots for the next "
          "num_new_tokens tokens; returns (cached, slots int64[n], cow int32[k, 2]) or None "
          "when out of blocks (nothing changed). cache_new_blocks=False: as after "
          "stop_caching.")
      .def("blocks_needed", &KVCacheManager::blocks_needed, py::arg("seq_id"), py::arg("n"))
      .def("can_append", &KVCacheManager::can_append, py::arg("seq_id"), py::arg("n"))
      .def(
          "append",
          [](KVCacheManager& k, SeqId seq, py::handle tokens_in) -> py::object {
            const auto tokens = int_array<int32_t>(tokens_in, "tokens");
            const int32_t n = length_1d(tokens, "tokens");
            py::array_t<int64_t> slots(n);
            std::vector<CowPair> cow;
            if (!k.append(seq, tokens.data(), n, slots.mutable_data(), cow)) return py::none();
            return append_result(std::move(slots), cow);
          },
          py::arg("seq_id"), py::arg("tokens"),
          "Reserves slots for `tokens`; returns (slots int64[n], cow int32[k, 2]) or None when "
          "out of blocks (nothing changed).")
      .def(
          "append_batch",
          [](KVCacheManager& k, py::handle seq_ids_in, py::handle counts_in,
             py::handle tokens_in) -> py::object {
            const auto seq_ids = int_array<int64_t>(seq_ids_in, "seq_ids");
            const auto counts = int_array<int32_t>(counts_in, "counts");
            const auto tokens = int_array<int32_t>(tokens_in, "tokens");
            const int32_t n = length_1d(seq_ids, "seq_ids");
            PAGEDLLM_CHECK_ARG(length_1d(counts, "counts") == n,
                               "counts has " << counts.shape(0) << " entries, expected " << n
                                             << " (one per sequence)");
            const int32_t total = length_1d(tokens, "tokens");
            int64_t sum = 0;
            const int32_t* c = counts.data();
            for (int32_t i = 0; i < n; ++i) sum += c[i];
            PAGEDLLM_CHECK_ARG(sum == total, "tokens has " << total
                                                           << " entries, expected sum(counts) = "
                                                           << sum);
            py::array_t<int64_t> slots(total);
            std::vector<CowPair> cow;
            if (!k.append_batch(seq_ids.data(), c, n, tokens.data(), slots.mutable_data(), cow)) {
              return py::none();
            }
            return append_result(std::move(slots), cow);
          },
          py::arg("seq_ids"), py::arg("counts"), py::arg("tokens"),
          "append() for many sequences, all or nothing; returns (slots, cow) or None.")
      .def("fork", &KVCacheManager::fork, py::arg("parent_id"), py::arg("child_id"))
      .def("free", &KVCacheManager::free, py::arg("seq_id"))
      .def("drop_blocks", &KVCacheManager::drop_blocks, py::arg("seq_id"), py::arg("begin"),
           py::arg("end"),
           "Drops logical blocks [begin, end) of seq_id (never read again; entries become -1, "
           "positions keep counting); each is freed once no other table holds it. Returns the "
           "blocks newly dropped.")
      .def("stop_caching", &KVCacheManager::stop_caching, py::arg("seq_id"),
           "Registers none of seq_id's blocks that fill from now on in the prefix cache "
           "(block-sparse K/V); its forks inherit this.")
      .def("caching", &KVCacheManager::caching, py::arg("seq_id"),
           "Whether seq_id's blocks are still registered in the prefix cache as they fill.")
      .def("reset_prefix_cache", &KVCacheManager::reset_prefix_cache)
      .def("reset_peak", &KVCacheManager::reset_peak)
      .def("contains", &KVCacheManager::contains, py::arg("seq_id"))
      .def("__contains__", &KVCacheManager::contains, py::arg("seq_id"))
      .def("num_tokens", &KVCacheManager::num_tokens, py::arg("seq_id"))
      .def(
          "block_table",
          [](const KVCacheManager& k, SeqId seq) {
            const auto& blocks = k.block_table(seq).blocks();
            py::array_t<int32_t> out(static_cast<py::ssize_t>(blocks.size()));
            std::copy(blocks.begin(), blocks.end(), out.mutable_data());
            return out;
          },
          py::arg("seq_id"), "Physical block ids of seq_id in logical order (int32).")
      .def(
          "block_tables",
          [](const KVCacheManager& k, py::handle seq_ids_in, int32_t width) {
            const auto seq_ids = int_array<int64_t>(seq_ids_in, "seq_ids");
            const int32_t n = length_1d(seq_ids, "seq_ids");
            if (width < 0) width = k.max_num_blocks(seq_ids.data(), n);
            py::array_t<int32_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(width)});
            k.export_block_tables(seq_ids.data(), n, width, out.mutable_data());
            return out;
          },
          py::arg("seq_ids"), py::arg("width") = -1,
          "Block tables as int32 [len(seq_ids), width], padded with 0 (a dropped block: -1); "
          "width -1 = widest table.")
      .def("refcount", [](const KVCacheManager& k, BlockId b) { return k.allocator().refcount(b); },
           py::arg("block_id"))
      .def("is_cached",
           [](const KVCacheManager& k, BlockId b) { return k.prefix_cache().is_cached(b); },
           py::arg("block_id"), "True if the block is registered in the prefix cache.")
      .def("is_parked", [](const KVCacheManager& k, BlockId b) { return k.allocator().is_parked(b); },
           py::arg("block_id"), "True if the block is cached with no user (evictable).")
      .def("lru_front",
           [](const KVCacheManager& k) -> py::object {
             const BlockId b = k.prefix_cache().lru_front();
             if (b == kNoBlock) return py::none();
             return py::int_(b);
           },
           "The next block eviction would take, or None.")
      .def("stats", [](const KVCacheManager& k) { return stats_dict(k.stats()); },
           "Pool figures as a dict (used/cached/free blocks, tokens, prefix hits, ...).");
}

}  // namespace

void bind_core(py::module_& m) {
  bind_allocator(m);
  bind_manager(m);
}

}  // namespace pagedllm::python
