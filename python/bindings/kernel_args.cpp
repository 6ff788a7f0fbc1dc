#include "kernel_args.h"

#include <limits>

#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"

namespace k = pagedllm::kernels;

namespace pagedllm::python {

int32_t to_i32(int64_t v, const char* what) {
  PAGEDLLM_CHECK_ARG(v >= 0 && v <= std::numeric_limits<int32_t>::max(),
                     what << " = " << v << " does not fit in int32");
  return static_cast<int32_t>(v);
}

k::ScalarType activation_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kFloat32: return k::ScalarType::kFloat32;
    case DType::kFloat16: return k::ScalarType::kFloat16;
    case DType::kBFloat16: return k::ScalarType::kBFloat16;
    default:
      PAGEDLLM_CHECK_ARG(false, t.name() << " must be float32, float16 or bfloat16, got "
                                         << t.describe());
  }
  return k::ScalarType::kFloat32;
}

namespace {

// The storage type of a cache tensor under kv_cache_dtype.
k::CacheType cache_type(const Tensor& t, const std::string& kv_cache_dtype) {
  k::CacheType want;
  const bool explicit_type = k::parse_kv_cache_dtype(kv_cache_dtype, &want);
  const DType d = t.dtype();
  if (!explicit_type) {
    PAGEDLLM_CHECK_ARG(d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16,
                       t.name() << " must be float32, float16 or bfloat16 with kv_cache_dtype "
                                   "'auto' (fp8 caches need kv_cache_dtype 'fp8' or "
                                   "'fp8_e5m2'), got "
                                << t.describe());
    return d == DType::kFloat32 ? k::CacheType::kFloat32
           : d == DType::kFloat16 ? k::CacheType::kFloat16
                                  : k::CacheType::kBFloat16;
  }
  bool ok = false;
  const char* expected = "";
  switch (want) {
    case k::CacheType::kFloat32: ok = d == DType::kFloat32; expected = "float32"; break;
    case k::CacheType::kFloat16: ok = d == DType::kFloat16; expected = "float16"; break;
    case k::CacheType::kBFloat16: ok = d == DType::kBFloat16; expected = "bfloat16"; break;
    case k::CacheType::kFp8E4M3:
      ok = d == DType::kUInt8 || d == DType::kFloat8E4M3FN;
      expected = "uint8 (or float8_e4m3fn)";
      break;
    case k::CacheType::kFp8E5M2:
      ok = d == DType::kUInt8 || d == DType::kFloat8E5M2;
      expected = "uint8 (or float8_e5m2)";
      break;
  }
  PAGEDLLM_CHECK_ARG(ok, t.name() << " must be " << expected << " for kv_cache_dtype '"
                                  << kv_cache_dtype << "', got " << t.describe());
  return want;
}

}  // namespace

// One layer's caches: [num_blocks, num_kv_heads, block_size, head_dim], inner dims contiguous.
k::KVCacheParams cache_params(const Tensor& kc, const Tensor& vc, const std::string& kv_cache_dtype,
                              double k_scale, double v_scale, bool on_cpu) {
  if (on_cpu) {
    kc.require_cpu();
    vc.require_cpu();
  }
  kc.require_ndim(4);
  vc.require_ndim(4);
  for (int i = 0; i < 4; ++i) {
    PAGEDLLM_CHECK_ARG(kc.size(i) == vc.size(i), "key_cache " << kc.describe()
                                                              << " and value_cache "
                                                              << vc.describe()
                                                              << " must have the same shape");
  }
  PAGEDLLM_CHECK_ARG(kc.dtype() == vc.dtype(), "key_cache is " << dtype_name(kc.dtype())
                                                               << " but value_cache is "
                                                               << dtype_name(vc.dtype()));
  kc.require_inner_contiguous(1);
  vc.require_inner_contiguous(1);
  k::KVCacheParams c;
  c.dtype = cache_type(kc, kv_cache_dtype);
  c.key_cache = kc.data();
  c.value_cache = vc.data();
  c.key_block_stride = kc.stride(0);
  c.value_block_stride = vc.stride(0);
  c.num_blocks = to_i32(kc.size(0), "num_blocks");
  c.num_kv_heads = to_i32(kc.size(1), "num_kv_heads");
  c.block_size = to_i32(kc.size(2), "block_size");
  c.head_dim = to_i32(kc.size(3), "head_dim");
  c.k_scale = static_cast<float>(k_scale);
  c.v_scale = static_cast<float>(v_scale);
  return c;
}

// A [num_tokens, num_heads, head_dim] activation with a contiguous last dim.
void check_activation(const Tensor& t, int64_t heads, int64_t head_dim, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_ndim(3);
  PAGEDLLM_CHECK_ARG(t.size(2) == head_dim, t.name() << " has head_dim " << t.size(2)
                                                     << " but the cache has " << head_dim);
  if (heads >= 0) {
    PAGEDLLM_CHECK_ARG(t.size(1) == heads, t.name() << " has " << t.size(1)
                                                    << " heads, expected " << heads);
  }
  PAGEDLLM_CHECK_ARG(t.size(2) == 1 || t.stride(2) == 1,
                     t.name() << " must be contiguous in its last dim (stride " << t.stride(2)
                              << ")");
}

// A 1-D contiguous int32 array of `n` elements (n < 0: any length).
void check_index_1d(const Tensor& t, int64_t n, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_ndim(1);
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kInt32, t.name() << " must be int32, got "
                                                          << t.describe());
  if (n >= 0) {
    PAGEDLLM_CHECK_ARG(t.size(0) == n, t.name() << " has " << t.size(0) << " elements, expected "
                                                << n);
  }
  t.require_inner_contiguous(0);
}

// [num_tokens, 2] int32 cross-attention key ranges (see kernel_args.h).
void check_kv_ranges(const Tensor& t, int64_t num_tokens, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_ndim(2);
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kInt32, "kv_ranges must be int32, got " << t.describe());
  PAGEDLLM_CHECK_ARG(t.size(0) == num_tokens && t.size(1) == 2,
                     "kv_ranges must be [num_tokens, 2] = [" << num_tokens << ", 2], got "
                                                             << t.describe());
  t.require_inner_contiguous(0);
}

// reshape_and_cache's params (see kernel_args.h).
k::ReshapeAndCacheParams reshape_and_cache_params(const Tensor& kt, const Tensor& vt,
                                                  const Tensor& kc, const Tensor& vc,
                                                  const Tensor& slots,
                                                  const std::string& kv_cache_dtype,
                                                  double k_scale, double v_scale, bool on_cpu) {
  k::ReshapeAndCacheParams p;
  p.cache = cache_params(kc, vc, kv_cache_dtype, k_scale, v_scale, on_cpu);
  kc.require_writable();
  vc.require_writable();
  check_activation(kt, p.cache.num_kv_heads, p.cache.head_dim, on_cpu);
  check_activation(vt, p.cache.num_kv_heads, p.cache.head_dim, on_cpu);
  PAGEDLLM_CHECK_ARG(kt.size(0) == vt.size(0), "key has " << kt.size(0)
                                                          << " tokens but value has "
                                                          << vt.size(0));
  p.dtype = activation_type(kt);
  PAGEDLLM_CHECK_ARG(kt.dtype() == vt.dtype(), "key is " << dtype_name(kt.dtype())
                                                         << " but value is "
                                                         << dtype_name(vt.dtype()));
  p.key = kt.data();
  p.value = vt.data();
  p.key_token_stride = kt.stride(0);
  p.key_head_stride = kt.stride(1);
  p.value_token_stride = vt.stride(0);
  p.value_head_stride = vt.stride(1);
  p.num_tokens = to_i32(kt.size(0), "num_tokens");
  if (on_cpu) slots.require_cpu();
  slots.require_ndim(1);
  PAGEDLLM_CHECK_ARG(slots.dtype() == DType::kInt32 || slots.dtype() == DType::kInt64,
                     "slot_mapping must be int32 or int64, got " << slots.describe());
  PAGEDLLM_CHECK_ARG(slots.size(0) == kt.size(0), "slot_mapping has " << slots.size(0)
                                                                      << " entries for "
                                                                      << kt.size(0) << " tokens");
  slots.require_inner_contiguous(0);
  p.slot_mapping = slots.data();
  p.slot_mapping_int64 = slots.dtype() == DType::kInt64;
  return p;
}

int32_t check_block_tables(const Tensor& t, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_ndim(2);
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kInt32, "block_tables must be int32, got "
                                                     << t.describe());
  t.require_inner_contiguous(1);
  return to_i32(t.size(0), "num_seqs");
}

k::AttentionParams attention_params(const Tensor& out, const Tensor& q, const Tensor& kc,
                                    const Tensor& vc, const Tensor& tables, const Tensor& lens,
                                    double scale, const std::string& kv_cache_dtype,
                                    double k_scale, double v_scale, bool on_cpu) {
  k::AttentionParams p;
  p.cache = cache_params(kc, vc, kv_cache_dtype, k_scale, v_scale, on_cpu);
  check_activation(q, -1, p.cache.head_dim, on_cpu);
  check_activation(out, q.size(1), p.cache.head_dim, on_cpu);
  out.require_writable();
  PAGEDLLM_CHECK_ARG(out.size(0) == q.size(0), "out has " << out.size(0) << " tokens but query has "
                                                          << q.size(0));
  p.dtype = activation_type(q);
  PAGEDLLM_CHECK_ARG(out.dtype() == q.dtype(), "out is " << dtype_name(out.dtype())
                                                         << " but query is "
                                                         << dtype_name(q.dtype()));
  p.query = q.data();
  p.query_token_stride = q.stride(0);
  p.query_head_stride = q.stride(1);
  p.out = out.data();
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_tokens = to_i32(q.size(0), "num_tokens");
  p.num_heads = to_i32(q.size(1), "num_heads");

  p.num_seqs = check_block_tables(tables, on_cpu);
  check_index_1d(lens, p.num_seqs, on_cpu);
  p.block_tables = static_cast<const int32_t*>(tables.data());
  p.block_table_stride = tables.stride(0);
  p.max_blocks_per_seq = to_i32(tables.size(1), "max_blocks_per_seq");
  p.context_lens = static_cast<const int32_t*>(lens.data());
  p.scale = static_cast<float>(scale);
  return p;
}

// [k, 2] int32 or int64 (src, dst) pairs as int64.
std::vector<int64_t> block_pairs(const Tensor& t, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_ndim(2);
  PAGEDLLM_CHECK_ARG(t.size(1) == 2, "block_mapping must be [num_pairs, 2], got " << t.describe());
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64,
                     "block_mapping must be int32 or int64, got " << t.describe());
  to_i32(t.size(0), "num_pairs");
  std::vector<int64_t> pairs(static_cast<size_t>(t.size(0) * 2));
  for (int64_t i = 0; i < t.size(0); ++i) {
    for (int j = 0; j < 2; ++j) {
      const int64_t off = i * t.stride(0) + j * t.stride(1);
      pairs[2 * i + j] = t.dtype() == DType::kInt32 ? static_cast<const int32_t*>(t.data())[off]
                                                    : static_cast<const int64_t*>(t.data())[off];
    }
  }
  return pairs;
}

// A cache tensor whose first dim is blocks and whose other dims are contiguous.
k::BlockPoolParams block_pool(const Tensor& t, bool on_cpu) {
  if (on_cpu) t.require_cpu();
  t.require_writable();
  PAGEDLLM_CHECK_ARG(t.ndim() >= 1, t.name() << " must have a block dimension");
  PAGEDLLM_CHECK_ARG(t.dtype() != DType::kOther, t.name() << " has an unsupported dtype");
  t.require_inner_contiguous(1);
  k::BlockPoolParams b;
  b.data = t.data();
  b.num_blocks = to_i32(t.size(0), "num_blocks");
  b.block_stride_bytes = t.stride(0) * t.itemsize();
  b.block_bytes = t.itemsize();
  for (int i = 1; i < t.ndim(); ++i) b.block_bytes *= t.size(i);
  return b;
}

void check_decode_rows(int64_t query_tokens, int64_t table_rows) {
  PAGEDLLM_CHECK_ARG(query_tokens == table_rows,
                     "query has " << query_tokens << " tokens but block_tables has "
                                  << table_rows << " rows (decode: one per sequence)");
}

}  // namespace pagedllm::python
