// paged_attention_decode / paged_attention_prefill on the GPU: host checks, the split-K plan,
// the dispatch over (head dim, storage type), the merge kernel and the prefill tile planner.
#include <algorithm>
#include <cmath>

#include "../cuda_check.h"
#include "../device_error.h"
#include "../workspace.h"
#include "attention_launch.h"
#include "dtypes.cuh"
#include "host_checks.h"
#include "pagedllm/cuda/kernels.h"

namespace pagedllm::cuda {
namespace detail {
namespace {

// out = sum_j acc_j e^(m_j - m) / sum_j l_j e^(m_j - m) over the partitions j with l_j > 0;
// a NaN sum marks a partition whose sequence had a bad value: the output is NaN.
__global__ void merge_kernel(const DecodeArgs a, int head_dim) {
  __shared__ float weight[kMaxParts];
  __shared__ float total;
  const int token = blockIdx.x;
  const int head = blockIdx.y;
  const int64_t slot0 = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_parts;
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    bool failed = false;
    for (int j = 0; j < a.num_parts; ++j) {
      const float l = a.part_stats[2 * (slot0 + j) + 1];
      failed |= isnan(l);
      if (l > 0.0f) m = fmaxf(m, a.part_stats[2 * (slot0 + j)]);
    }
    float sum = 0.0f;
    for (int j = 0; j < a.num_parts; ++j) {
      const float l = a.part_stats[2 * (slot0 + j) + 1];
      const float w = l > 0.0f ? expf(a.part_stats[2 * (slot0 + j)] - m) : 0.0f;
      weight[j] = w;
      sum += l > 0.0f ? l * w : 0.0f;
    }
    total = failed ? NAN : sum;
  }
  __syncthreads();
  const float l = total;
  const float mul = isnan(l) ? NAN : (l > 0.0f ? a.v_mul / l : 0.0f);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < a.num_parts; ++j) {
      if (weight[j] != 0.0f) acc += a.part_acc[(slot0 + j) * head_dim + d] * weight[j];
    }
    store_act(a.out, a.act, token * a.out_token_stride + head * a.out_head_stride + d, acc * mul);
  }
}

// Cuts each sequence's new tokens into tiles of tokens_per_tile and writes (sequence, first
// token) per tile, checking cu_seqlens_q and context_lens; sequences with a bad value get no
// tile (and an error is recorded). One block of kPlanThreads threads.
constexpr int kPlanThreads = 256;
__global__ void prefill_plan_kernel(const PrefillArgs a, int2* tiles, int* num_tiles,
                                    int max_tiles) {
  __shared__ int scan[kPlanThreads];
  __shared__ int carry;
  const int tid = threadIdx.x;
  const int* cu = a.cu_seqlens_q;
  const int capacity = a.max_blocks * a.block_size;
  const int kernel = a.kv_ranges != nullptr ? kKernelCross : kKernelPrefill;
  if (tid == 0) {
    carry = 0;
    if (cu[0] != 0) report_error(a.err, kErrCuFirst, kernel, 0, cu[0], 0);
    if (cu[a.num_seqs] != a.num_tokens)
      report_error(a.err, kErrCuLast, kernel, a.num_seqs, cu[a.num_seqs], a.num_tokens);
  }
  __syncthreads();
  for (int base = 0; base < a.num_seqs; base += kPlanThreads) {
    const int s = base + tid;
    int n = 0;
    if (s < a.num_seqs) {
      const int q0 = cu[s], q1 = cu[s + 1];
      const int len = a.context_lens[s];
      if (q0 < 0 || q0 > a.num_tokens) {
        report_error(a.err, kErrCuRange, kernel, s, q0, a.num_tokens);
      } else if (q1 < 0 || q1 > a.num_tokens) {
        report_error(a.err, kErrCuRange, kernel, s + 1, q1, a.num_tokens);
      } else if (q1 < q0) {
        report_error(a.err, kErrCuOrder, kernel, s, q0, q1);
      } else if (len < 0 || len > capacity) {
        report_error(a.err, kErrContextLen, kernel, s, len, capacity);
      } else if (a.kv_ranges == nullptr && q1 - q0 > len) {  // cross: q_len is unbounded
        report_error(a.err, kErrQLen, kernel, s, q1 - q0, len);
      } else {
        n = (q1 - q0 + a.tokens_per_tile - 1) / a.tokens_per_tile;
      }
    }
    scan[tid] = n;
    __syncthreads();
    for (int off = 1; off < kPlanThreads; off <<= 1) {  // inclusive Hillis-Steele scan
      const int add = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += add;
      __syncthreads();
    }
    const int start = carry + scan[tid] - n;
    for (int k = 0; k < n && start + k < max_tiles; ++k) {
      tiles[start + k] = make_int2(s, k * a.tokens_per_tile);
    }
    __syncthreads();  // everyone has read carry
    if (tid == kPlanThreads - 1) carry += scan[tid];
    __syncthreads();
  }
  if (tid == 0) *num_tiles = min(carry, max_tiles);
}

#define PAGEDLLM_DISPATCH_HEAD_DIM(hd, HD, ...)                                       \
  switch (hd) {                                                                       \
    case 64: { constexpr int HD = 64; __VA_ARGS__; break; }                           \
    case 80: { constexpr int HD = 80; __VA_ARGS__; break; }                           \
    case 96: { constexpr int HD = 96; __VA_ARGS__; break; }                           \
    case 128: { constexpr int HD = 128; __VA_ARGS__; break; }                         \
    case 256: { constexpr int HD = 256; __VA_ARGS__; break; }                         \
    default: PAGEDLLM_CHECK_ARG(false, "head_dim " << (hd) << " is not compiled in"); \
  }

template <int HD>
void dispatch_decode(CacheType ct, const DecodeArgs& a, cudaStream_t stream) {
  switch (ct) {
    case CacheType::kFloat32: launch_decode<CacheType::kFloat32, HD>(a, stream); return;
    case CacheType::kFloat16: launch_decode<CacheType::kFloat16, HD>(a, stream); return;
    case CacheType::kBFloat16: launch_decode<CacheType::kBFloat16, HD>(a, stream); return;
    case CacheType::kFp8E4M3: launch_decode<CacheType::kFp8E4M3, HD>(a, stream); return;
    case CacheType::kFp8E5M2: launch_decode<CacheType::kFp8E5M2, HD>(a, stream); return;
  }
}

template <int HD>
void dispatch_prefill(CacheType ct, const PrefillArgs& a, int max_tiles, cudaStream_t stream) {
  switch (ct) {
    case CacheType::kFloat16: launch_prefill<CacheType::kFloat16, HD>(a, max_tiles, stream); return;
    case CacheType::kBFloat16:
      launch_prefill<CacheType::kBFloat16, HD>(a, max_tiles, stream);
      return;
    case CacheType::kFp8E4M3: launch_prefill<CacheType::kFp8E4M3, HD>(a, max_tiles, stream); return;
    case CacheType::kFp8E5M2: launch_prefill<CacheType::kFp8E5M2, HD>(a, max_tiles, stream); return;
    case CacheType::kFloat32: break;
  }
  PAGEDLLM_CHECK_STATE(false, "no tensor-core prefill for float32 caches");
}

bool is_fp8(CacheType t) { return t == CacheType::kFp8E4M3 || t == CacheType::kFp8E5M2; }

// The fields shared by both kernels' argument structs.
template <typename Args>
void fill_common(const kernels::AttentionParams& p, Args* a) {
  const int es = cache_bytes(p.cache.dtype);
  a->q = p.query;
  a->q_token_stride = p.query_token_stride;
  a->q_head_stride = p.query_head_stride;
  a->out = p.out;
  a->out_token_stride = p.out_token_stride;
  a->out_head_stride = p.out_head_stride;
  a->act = p.dtype;
  a->key_cache = static_cast<const uint8_t*>(p.cache.key_cache);
  a->value_cache = static_cast<const uint8_t*>(p.cache.value_cache);
  a->key_block_stride = p.cache.key_block_stride * es;
  a->value_block_stride = p.cache.value_block_stride * es;
  a->num_blocks = p.cache.num_blocks;
  a->num_kv_heads = p.cache.num_kv_heads;
  a->block_size = p.cache.block_size;
  a->num_heads = p.num_heads;
  a->group = p.num_heads / p.cache.num_kv_heads;
  a->block_tables = p.block_tables;
  a->block_table_stride = p.block_table_stride;
  a->max_blocks = p.max_blocks_per_seq;
  a->context_lens = p.context_lens;
  a->cu_seqlens_q = p.cu_seqlens_q;
  a->num_seqs = p.num_seqs;
  a->num_tokens = p.num_tokens;
  a->q_mul = p.scale * (is_fp8(p.cache.dtype) ? p.cache.k_scale : 1.0f);
  a->v_mul = is_fp8(p.cache.dtype) ? p.cache.v_scale : 1.0f;
  a->err = error_record();
}

// Runs the split-K kernel (decode, or SIMT prefill when p.cu_seqlens_q is set, cross-attention
// when kv_ranges is also set) and the merge; over the blocks of `sparse` only when it is set
// (its compacted tables built first, in the front of the workspace).
void run_split_k(const kernels::AttentionParams& p, cudaStream_t stream, int kernel_id,
                 const kernels::BlockSparseParams* sparse = nullptr,
                 const int32_t* kv_ranges = nullptr) {
  DecodeArgs a{};
  fill_common(p, &a);
  a.kernel_id = kernel_id;
  a.kv_ranges = kv_ranges;
  const size_t sparse_bytes =
      sparse ? align256(static_cast<size_t>(sparse->num_indices) * sizeof(int32_t)) +
                   align256(static_cast<size_t>(sparse->num_lists) * sizeof(int32_t))
             : 0;
  a.block_heads = decode_heads_per_block(a.group);
  a.head_chunks = (a.group + a.block_heads - 1) / a.block_heads;
  // Enough thread blocks for ~4 per multiprocessor; split contexts when there are fewer.
  const int64_t blocks = static_cast<int64_t>(p.num_tokens) * a.num_kv_heads * a.head_chunks;
  const int64_t wanted = 4LL * multiprocessor_count();
  const int capacity = p.max_blocks_per_seq * p.cache.block_size;
  int parts = 1;
  if (blocks < wanted && capacity > 2 * kMinPartition) {
    const int64_t by_blocks = (wanted + blocks - 1) / blocks;
    const int64_t by_length = (capacity + kMinPartition - 1) / kMinPartition;
    parts = static_cast<int>(std::min<int64_t>({by_blocks, by_length, kMaxParts}));
  }
  a.part_len = parts == 1 ? std::max(capacity, 1) : (capacity + parts - 1) / parts;
  a.num_parts = parts == 1 ? 1 : (capacity + a.part_len - 1) / a.part_len;
  const int hd = p.cache.head_dim;
  const size_t slots =
      a.num_parts > 1 ? static_cast<size_t>(p.num_tokens) * p.num_heads * a.num_parts : 0;
  const size_t acc_bytes = align256(slots * hd * sizeof(float));
  const size_t ws_bytes = sparse_bytes + (slots ? acc_bytes + slots * 2 * sizeof(float) : 0);
  auto* ws = ws_bytes ? static_cast<uint8_t*>(workspace(stream, ws_bytes)) : nullptr;
  if (sparse) {
    a.sparse_indptr = sparse->indptr;
    a.sparse_indices = sparse->indices;
    a.sparse_tables = reinterpret_cast<int32_t*>(ws);
    a.sparse_lens = reinterpret_cast<int32_t*>(
        ws + align256(static_cast<size_t>(sparse->num_indices) * sizeof(int32_t)));
    a.sparse_per_head = sparse->num_lists != p.num_seqs;
    launch_sparse_compact(a, sparse->num_lists, sparse->num_indices, stream);
  }
  if (slots) {
    a.part_acc = reinterpret_cast<float*>(ws + sparse_bytes);
    a.part_stats = reinterpret_cast<float*>(ws + sparse_bytes + acc_bytes);
  }
  PAGEDLLM_DISPATCH_HEAD_DIM(hd, HD, dispatch_decode<HD>(p.cache.dtype, a, stream));
  if (a.num_parts > 1) {
    merge_kernel<<<dim3(p.num_tokens, p.num_heads), 128, 0, stream>>>(a, hd);
    PAGEDLLM_CUDA_CHECK_LAUNCH("split-K merge kernel");
  }
}

// Prefill (causal, kv_ranges null) or cross-attention (kv_ranges set) on validated host params:
// the tensor-core kernel over planned tiles, or the split-K SIMT rows for float32 caches, GQA
// groups wider than a tile, and cross-attention calls of one query token per sequence (decode
// steps: split-K spreads their long cross contexts over the GPU).
void run_prefill(const kernels::AttentionParams& p, const int32_t* kv_ranges,
                 cudaStream_t stream) {
  if (p.num_seqs == 0) return;
  const int kernel_id = kv_ranges != nullptr ? kKernelCross : kKernelPrefill;
  const int group = p.num_heads / p.cache.num_kv_heads;
  if (p.cache.dtype == CacheType::kFloat32 || group > kPrefillRows ||
      (kv_ranges != nullptr && p.num_tokens <= p.num_seqs)) {
    if (p.num_tokens > 0) run_split_k(p, stream, kernel_id, nullptr, kv_ranges);
    return;
  }
  PrefillArgs a{};
  fill_common(p, &a);
  a.kv_ranges = kv_ranges;
  a.tokens_per_tile = kPrefillRows / group;
  const int64_t max_tiles64 =
      (static_cast<int64_t>(p.num_tokens) + a.tokens_per_tile - 1) / a.tokens_per_tile +
      p.num_seqs;
  PAGEDLLM_CHECK_ARG(max_tiles64 < (1LL << 31), "too many query tokens for one prefill call");
  const int max_tiles = static_cast<int>(max_tiles64);
  const size_t tile_bytes = align256(static_cast<size_t>(max_tiles) * sizeof(int2));
  auto* ws = static_cast<uint8_t*>(workspace(stream, tile_bytes + sizeof(int)));
  auto* tiles = reinterpret_cast<int2*>(ws);
  auto* num_tiles = reinterpret_cast<int*>(ws + tile_bytes);
  a.tiles = tiles;
  a.num_tiles = num_tiles;
  prefill_plan_kernel<<<1, kPlanThreads, 0, stream>>>(a, tiles, num_tiles, max_tiles);
  PAGEDLLM_CUDA_CHECK_LAUNCH("prefill tile planner");
  if (p.num_tokens > 0) {
    PAGEDLLM_DISPATCH_HEAD_DIM(p.cache.head_dim, HD,
                               dispatch_prefill<HD>(p.cache.dtype, a, max_tiles, stream));
  }
}

}  // namespace
}  // namespace detail

void paged_attention_decode(const kernels::AttentionParams& p, Stream stream) {
  detail::check_attention(p, /*prefill=*/false);
  if (p.num_seqs == 0) return;
  detail::run_split_k(p, stream, detail::kKernelDecode);
  detail::finish_call(stream);
}

namespace {
// The host checks of a block-sparse call: the list count (indptr's length) for p.
void check_sparse_lists(const kernels::AttentionParams& p, const kernels::BlockSparseParams& s) {
  const int64_t per_head = static_cast<int64_t>(p.num_seqs) * p.cache.num_kv_heads;
  PAGEDLLM_CHECK_ARG(s.num_lists == p.num_seqs || s.num_lists == per_head,
                     "sparse indptr has " << s.num_lists + 1 << " entries: expected num_seqs + 1 = "
                                          << p.num_seqs + 1
                                          << " (one block list per sequence) or num_seqs * "
                                             "num_kv_heads + 1 = "
                                          << per_head + 1 << " (one per KV head)");
  PAGEDLLM_CHECK_ARG(s.num_indices >= 0, "sparse indices: negative length");
}
}  // namespace

void paged_attention_decode_sparse(const kernels::AttentionParams& p,
                                   const kernels::BlockSparseParams& sparse, Stream stream) {
  detail::check_attention(p, /*prefill=*/false);
  check_sparse_lists(p, sparse);
  if (p.num_seqs == 0) return;
  detail::run_split_k(p, stream, detail::kKernelDecode, &sparse);
  detail::finish_call(stream);
}

void paged_attention_prefill_sparse(const kernels::AttentionParams& p,
                                    const kernels::BlockSparseParams& sparse, Stream stream) {
  detail::check_attention(p, /*prefill=*/true);
  check_sparse_lists(p, sparse);
  if (p.num_seqs == 0 || p.num_tokens == 0) return;
  detail::run_split_k(p, stream, detail::kKernelPrefill, &sparse);  // SIMT rows, causal limits
  detail::finish_call(stream);
}

void paged_attention_prefill(const kernels::AttentionParams& p, Stream stream) {
  detail::check_attention(p, /*prefill=*/true);
  detail::run_prefill(p, nullptr, stream);
  detail::finish_call(stream);
}

void paged_cross_attention(const kernels::AttentionParams& p, const int32_t* kv_ranges,
                           Stream stream) {
  detail::check_attention(p, /*prefill=*/true);
  PAGEDLLM_CHECK_ARG(p.num_tokens == 0 || kv_ranges != nullptr, "kv_ranges is null");
  detail::run_prefill(p, kv_ranges, stream);
  detail::finish_call(stream);
}

}  // namespace pagedllm::cuda
