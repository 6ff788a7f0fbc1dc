#include "cuda_tensors.h"

#include <limits>

#include "pagedllm/error.h"
#include "pagedllm/kernels/kernels.h"

namespace py = pybind11;
namespace k = pagedllm::kernels;

namespace pagedllm::python::cuda_binding {
namespace {

int32_t to_i32(int64_t v, const char* what) {
  PAGEDLLM_CHECK_ARG(v >= 0 && v <= std::numeric_limits<int32_t>::max(),
                     what << " = " << v << " does not fit in int32");
  return static_cast<int32_t>(v);
}

Placement placement_of(py::handle obj, const char* name) {
  PAGEDLLM_CHECK_ARG(py::hasattr(obj, "__dlpack_device__"),
                     name << " must be a torch.Tensor (an object with __dlpack__), got "
                          << std::string(py::str(py::type::of(obj).attr("__name__"))));
  const py::tuple dev = obj.attr("__dlpack_device__")();
  Placement p;
  p.type = dev[0].cast<int32_t>();
  p.id = dev[1].cast<int32_t>();
  return p;
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

// The storage type of a cache tensor under kv_cache_dtype (the CPU bindings' rules).
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
    return d == DType::kFloat32   ? k::CacheType::kFloat32
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

// A [num_tokens, heads, head_dim] activation with a contiguous last dim (heads < 0: any).
void check_activation(const Tensor& t, int64_t heads, int64_t head_dim) {
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

}  // namespace

std::string placement_name(const Placement& p) {
  switch (p.type) {
    case dlpack::kDLCPU: return "cpu";
    case dlpack::kDLCUDA: return "cuda:" + std::to_string(p.id);
    case dlpack::kDLCUDAHost: return "cuda_host (pinned cpu)";
    default: return "DLPack device type " + std::to_string(p.type);
  }
}

const Tensor& CudaCall::gpu(py::handle obj, const char* name) {
  const Placement p = placement_of(obj, name);
  PAGEDLLM_CHECK_ARG(p.on_gpu(), name << " is on " << placement_name(p)
                                      << "; pagedllm._core.cuda takes CUDA tensors (use "
                                         "pagedllm._core for CPU tensors, or pagedllm.ops to "
                                         "choose by device)");
  if (device_ < 0) device_ = p.id;
  PAGEDLLM_CHECK_ARG(p.id == device_, name << " is on cuda:" << p.id
                                           << " but the call's other tensors are on cuda:"
                                           << device_);
  tensors_.emplace_back(obj, name);
  return tensors_.back();
}

const Tensor& CudaCall::any(py::handle obj, const char* name, Placement* where) {
  const Placement p = placement_of(obj, name);
  PAGEDLLM_CHECK_ARG(p.on_gpu() || p.on_host(),
                     name << " is on " << placement_name(p) << "; expected CUDA or CPU memory");
  if (p.on_gpu()) {
    if (device_ < 0) device_ = p.id;
    PAGEDLLM_CHECK_ARG(p.id == device_, name << " is on cuda:" << p.id
                                             << " but the call's other tensors are on cuda:"
                                             << device_);
  }
  *where = p;
  tensors_.emplace_back(obj, name);
  return tensors_.back();
}

k::KVCacheParams cache_params(const Tensor& kc, const Tensor& vc,
                              const std::string& kv_cache_dtype, double k_scale,
                              double v_scale) {
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

const Tensor& index_1d(CudaCall& call, py::handle obj, const char* name, int64_t n) {
  const Tensor& t = call.gpu(obj, name);
  t.require_ndim(1);
  PAGEDLLM_CHECK_ARG(t.dtype() == DType::kInt32, name << " must be int32, got " << t.describe());
  if (n >= 0) {
    PAGEDLLM_CHECK_ARG(t.size(0) == n, name << " has " << t.size(0) << " elements, expected " << n);
  }
  t.require_inner_contiguous(0);
  return t;
}

k::AttentionParams attention_params(CudaCall& call, py::handle out_obj, py::handle query,
                                    py::handle key_cache, py::handle value_cache,
                                    py::handle block_tables, py::handle context_lens,
                                    double scale, const std::string& kv_cache_dtype,
                                    double k_scale, double v_scale) {
  const Tensor& out = call.gpu(out_obj, "out");
  const Tensor& q = call.gpu(query, "query");
  const Tensor& kc = call.gpu(key_cache, "key_cache");
  const Tensor& vc = call.gpu(value_cache, "value_cache");
  const Tensor& tables = call.gpu(block_tables, "block_tables");
  k::AttentionParams p;
  p.cache = cache_params(kc, vc, kv_cache_dtype, k_scale, v_scale);
  check_activation(q, -1, p.cache.head_dim);
  check_activation(out, q.size(1), p.cache.head_dim);
  out.require_writable();
  PAGEDLLM_CHECK_ARG(out.size(0) == q.size(0), "out has " << out.size(0) << " tokens but query has "
                                                          << q.size(0));
  PAGEDLLM_CHECK_ARG(out.dtype() == q.dtype(), "out is " << dtype_name(out.dtype())
                                                         << " but query is "
                                                         << dtype_name(q.dtype()));
  p.dtype = activation_type(q);
  p.query = q.data();
  p.query_token_stride = q.stride(0);
  p.query_head_stride = q.stride(1);
  p.out = out.data();
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.num_tokens = to_i32(q.size(0), "num_tokens");
  p.num_heads = to_i32(q.size(1), "num_heads");
  tables.require_ndim(2);
  PAGEDLLM_CHECK_ARG(tables.dtype() == DType::kInt32, "block_tables must be int32, got "
                                                          << tables.describe());
  tables.require_inner_contiguous(1);
  p.num_seqs = to_i32(tables.size(0), "num_seqs");
  const Tensor& lens = index_1d(call, context_lens, "context_lens", p.num_seqs);
  p.block_tables = static_cast<const int32_t*>(tables.data());
  p.block_table_stride = tables.stride(0);
  p.max_blocks_per_seq = to_i32(tables.size(1), "max_blocks_per_seq");
  p.context_lens = static_cast<const int32_t*>(lens.data());
  p.scale = static_cast<float>(scale);
  return p;
}

k::BlockPoolParams block_pool(const Tensor& t) {
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

std::vector<int64_t> host_pairs(const Tensor& t) {
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

}  // namespace pagedllm::python::cuda_binding
