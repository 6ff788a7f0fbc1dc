// decode_kernel.cuh (internal) — the split-K paged-attention decode kernel, templated on the
// storage type and the head dim. Included only by the decode_hd*.cu instantiation files.
//
// One thread block (128 threads) serves one (query token: grid x, KV head and <= HEADS query
// heads of its GQA group: grid y, partition of the context: grid z): K/V are read once for all
// those heads. HEADS (1, 4 or 8: decode_heads_per_block) is the smallest that holds the group
// (or 8): the query and accumulator registers scale with it, so an MHA or GQA-4 model's blocks
// are not sized, nor their occupancy limited, for 8 heads.
//   * K/V tiles of kTile tokens are gathered from the paged cache into shared memory with
//     16-byte cp.async copies (consecutive threads take consecutive 16 bytes of a row, so loads
//     are coalesced whatever the block size), double buffered: tile i + 1 is in flight while
//     tile i is computed.
//   * Scores: a group of kLanes threads per token, each holding 8 columns of every query head
//     in registers; partial dot products are summed with xor shuffles inside the group.
//   * Online softmax per head with warp-level max / sum reductions.
//   * Values: each thread accumulates its 8 columns of every head over the tokens of its
//     group; the groups' accumulators are summed through shared memory at the end.
// With num_parts > 1 the (max, sum, unnormalised output) of each partition go to a workspace
// and merge_kernel (attention.cu) combines them.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "../cuda_check.h"
#include "attention_launch.h"
#include "common.cuh"
#include "dtypes.cuh"

namespace pagedllm::cuda::detail {

template <CacheType CT, int HD, int HEADS>
struct DecodeShape {
  static constexpr int kThreads = kDecodeThreads;
  static constexpr int kHeads = HEADS;
  static constexpr int kRowBytes = HD * CacheTraits<CT>::kBytes;
  static constexpr int kUsedLanes = HD / 8;  // lanes holding 8 columns each
  static constexpr int kLanes = kUsedLanes <= 8 ? 8 : (kUsedLanes <= 16 ? 16 : 32);
  static constexpr int kGroups = kThreads / kLanes;  // tokens processed side by side
  // ~8 KB of K (and of V) per tile, a multiple of kGroups, at most 64 tokens.
  static constexpr int kTileWanted = 8192 / kRowBytes;
  static constexpr int kTileClamped = kTileWanted > 64 ? 64 : kTileWanted;
  static constexpr int kTile =
      kTileClamped < kGroups ? kGroups : kTileClamped / kGroups * kGroups;
  static constexpr int kStageBytes = kTile * kRowBytes;
  static constexpr int kReduceBytes = kGroups * kHeads * HD * 4;
  static constexpr int kBufferBytes =
      4 * kStageBytes > kReduceBytes ? 4 * kStageBytes : kReduceBytes;
  static_assert(HD % 8 == 0 && kRowBytes % 16 == 0, "rows must be whole 16-byte chunks");
  static_assert(kTile <= 64, "the softmax covers at most 64 tokens per tile (2 per lane)");
};

// Selected tokens at positions < limit of a sorted block list ids[0, n) (all but the last
// listed block below `limit` are wholly below it), capped at the list's n_sel tokens.
__device__ __forceinline__ int sparse_compact_limit(const int32_t* ids, int n, int block_size,
                                                    int limit, int n_sel) {
  const int first_out = (limit + block_size - 1) / block_size;  // blocks < this start below
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (ids[mid] < first_out) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return 0;
  const int top = ids[lo - 1];
  return min(n_sel, (lo - 1) * block_size + min(block_size, limit - top * block_size));
}

template <CacheType CT, int HD, int HEADS>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_kernel(const DecodeArgs a) {
  using S = DecodeShape<CT, HD, HEADS>;
  // K stage 0 | K stage 1 | V stage 0 | V stage 1, reused at the end for the group reduction.
  __shared__ __align__(16) uint8_t buffer[S::kBufferBytes];
  __shared__ float scores[S::kHeads][S::kTile];  // scores, then probabilities
  __shared__ float row_max[S::kHeads], row_sum[S::kHeads], rescale[S::kHeads];
  __shared__ int bad;

  const int tid = threadIdx.x;
  const int token = blockIdx.x;  // x: up to 2^31 - 1 query tokens
  const int kvh = blockIdx.y / a.head_chunks;
  const int h0 = (blockIdx.y % a.head_chunks) * S::kHeads;
  const int heads = min(S::kHeads, a.group - h0);
  const int head_base = kvh * a.group + h0;
  const int part = blockIdx.z;

  // --- which sequence, and how many of its keys this query sees --------------------------
  int seq = token;
  int first = 0;  // keys [first, limit) of the sequence are visible
  int limit = 0;
  bool ok = true;
  const int capacity = a.max_blocks * a.block_size;
  if (a.cu_seqlens_q == nullptr) {
    const int len = a.context_lens[seq];
    if (len < 0 || len > capacity) {
      if (tid == 0) report_error(a.err, kErrContextLen, a.kernel_id, seq, len, capacity);
      ok = false;
    }
    limit = len;
  } else {
    // SIMT prefill: the sequence s with cu[s] <= token < cu[s + 1] (binary search).
    const int* cu = a.cu_seqlens_q;
    int lo = 0, hi = a.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (cu[mid + 1] > token) hi = mid; else lo = mid + 1;
    }
    seq = lo;
    const int q0 = cu[seq], q1 = cu[seq + 1];
    const int len = a.context_lens[seq];
    if (token == 0 && tid == 0 && cu[0] != 0) report_error(a.err, kErrCuFirst, a.kernel_id, 0, cu[0], 0);
    if (token == 0 && tid == 0 && cu[a.num_seqs] != a.num_tokens)
      report_error(a.err, kErrCuLast, a.kernel_id, a.num_seqs, cu[a.num_seqs], a.num_tokens);
    if (!(q0 <= token && token < q1)) {
      if (tid == 0) report_error(a.err, kErrCuOrder, a.kernel_id, seq, q0, q1);
      ok = false;
    } else if (len < 0 || len > capacity) {
      if (tid == 0) report_error(a.err, kErrContextLen, a.kernel_id, seq, len, capacity);
      ok = false;
    } else if (a.kv_ranges == nullptr && q1 - q0 > len) {
      if (tid == 0) report_error(a.err, kErrQLen, a.kernel_id, seq, q1 - q0, len);
      ok = false;
    }
    if (a.kv_ranges != nullptr) {  // cross-attention: keys [first, limit), non-causal
      if (ok) ok = read_kv_range(a.kv_ranges, token, len, &first, &limit, a.err, tid == 0);
    } else {
      limit = ok ? len - (q1 - q0) + (token - q0) + 1 : 0;
    }
  }
  if (!ok) first = limit = 0;
  // Block-sparse: the list's compacted table, and the limit counted in selected tokens.
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  if (a.sparse_tables != nullptr) {
    const int l = a.sparse_per_head ? seq * a.num_kv_heads + kvh : seq;
    const int n_sel = a.sparse_lens[l];
    table = a.sparse_tables + a.sparse_indptr[l];
    if (n_sel < 0) {  // a bad list (reported by the compaction kernel)
      ok = false;
      limit = 0;
    } else if (a.cu_seqlens_q == nullptr) {
      limit = n_sel;
    } else {
      limit = sparse_compact_limit(a.sparse_indices + a.sparse_indptr[l],
                                   a.sparse_indptr[l + 1] - a.sparse_indptr[l], a.block_size,
                                   limit, n_sel);
    }
  }
  const int begin = max(first, part * a.part_len);
  const int end = min(limit, part * a.part_len + a.part_len);
  const int num_tiles = end > begin ? (end - begin + S::kTile - 1) / S::kTile : 0;

  if (tid < S::kHeads) {
    row_max[tid] = -INFINITY;
    row_sum[tid] = 0.0f;
  }
  if (tid == 0) bad = ok ? 0 : 1;
  __syncthreads();  // before any gather may set `bad`

  // --- this thread's 8 columns of every head's query, scaled ------------------------------
  const int lane = tid % S::kLanes;
  const int grp = tid / S::kLanes;
  const bool col_active = lane < S::kUsedLanes;
  const int col = lane * 8;
  float q[S::kHeads][8];
  float acc[S::kHeads][8];
#pragma unroll
  for (int g = 0; g < S::kHeads; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      acc[g][e] = 0.0f;
      q[g][e] = 0.0f;
      if (g < heads && col_active) {
        const int64_t off = token * a.q_token_stride + (head_base + g) * a.q_head_stride + col + e;
        q[g][e] = load_act(a.q, a.act, off) * a.q_mul;
      }
    }
  }

  PagedHead ph;
  const int64_t head_offset = static_cast<int64_t>(kvh) * a.block_size * S::kRowBytes;
  ph.key = a.key_cache + head_offset;
  ph.value = a.value_cache + head_offset;
  ph.key_block_stride = a.key_block_stride;
  ph.value_block_stride = a.value_block_stride;
  ph.table = table;
  ph.block_size = a.block_size;
  ph.num_blocks = a.num_blocks;
  ph.seq = seq;
  // Stage st of K at buffer + st * kStageBytes, of V at buffer + (2 + st) * kStageBytes.
  auto k_stage = [&](int st) { return buffer + st * S::kStageBytes; };
  auto v_stage = [&](int st) { return buffer + (2 + st) * S::kStageBytes; };

  if (num_tiles > 0) {
    gather_kv_rows<S::kRowBytes, S::kThreads>(ph, begin, S::kTile, end, k_stage(0), v_stage(0),
                                               S::kRowBytes, a.err, a.kernel_id, &bad);
  }
  cp_async_commit();

  for (int i = 0; i < num_tiles; ++i) {
    const int pos0 = begin + i * S::kTile;
    if (i + 1 < num_tiles) {
      gather_kv_rows<S::kRowBytes, S::kThreads>(ph, pos0 + S::kTile, S::kTile, end,
                                                 k_stage((i + 1) & 1), v_stage((i + 1) & 1),
                                                 S::kRowBytes, a.err, a.kernel_id, &bad);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile i is in shared memory for every thread
    const uint8_t* ks = k_stage(i & 1);
    const uint8_t* vs = v_stage(i & 1);

    // Scores of every head against the tile's tokens.
    for (int t = grp; t < S::kTile; t += S::kGroups) {
      float kf[8];
      if (col_active) {
        load8<CT>(ks + t * S::kRowBytes + col * CacheTraits<CT>::kBytes, kf);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kf[e] = 0.0f;
      }
      const bool visible = pos0 + t < end;
#pragma unroll
      for (int g = 0; g < S::kHeads; ++g) {
        if (g < heads) {  // the same for the whole block: no lane skips a shuffle
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
          d = group_sum<S::kLanes>(d);
          if (lane == 0) scores[g][t] = visible ? d : -INFINITY;
        }
      }
    }
    __syncthreads();

    // Online softmax: warp w takes heads w, w + 4.
    const int warp = tid / 32, wl = tid % 32;
    for (int g = warp; g < heads; g += S::kThreads / 32) {
      const float s0 = wl < S::kTile ? scores[g][wl] : -INFINITY;
      const float s1 = wl + 32 < S::kTile ? scores[g][wl + 32] : -INFINITY;
      const float m_old = row_max[g];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s0, s1)));
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float p0 = __expf(s0 - m_use);
      const float p1 = __expf(s1 - m_use);
      if (wl < S::kTile) scores[g][wl] = p0;
      if (wl + 32 < S::kTile) scores[g][wl + 32] = p1;
      const float sum = group_sum<32>(p0 + p1);
      __syncwarp();  // every lane has read row_max[g] before lane 0 writes it (racecheck)
      if (wl == 0) {
        const float alpha = __expf(m_old - m_use);
        row_sum[g] = row_sum[g] * alpha + sum;
        row_max[g] = m_new;
        rescale[g] = alpha;
      }
    }
    __syncthreads();

    // Values: rescale, then accumulate this thread's columns over its group's tokens.
#pragma unroll
    for (int g = 0; g < S::kHeads; ++g) {
      if (g < heads) {
        const float alpha = rescale[g];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
      }
    }
    if (col_active) {
      for (int t = grp; t < S::kTile; t += S::kGroups) {
        float vf[8];
        load8<CT>(vs + t * S::kRowBytes + col * CacheTraits<CT>::kBytes, vf);
#pragma unroll
        for (int g = 0; g < S::kHeads; ++g) {
          if (g < heads) {
            const float p = scores[g][t];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
          }
        }
      }
    }
    __syncthreads();  // the stage and the scores are free for the next tile
  }

  // --- sum the groups' accumulators, normalise, write ---------------------------------------
  float* red = reinterpret_cast<float*>(buffer);  // [kGroups][kHeads][HD]
  if (col_active) {
#pragma unroll
    for (int g = 0; g < S::kHeads; ++g) {
      if (g < heads) {
#pragma unroll
        for (int e = 0; e < 8; ++e) red[(grp * S::kHeads + g) * HD + col + e] = acc[g][e];
      }
    }
  }
  __syncthreads();
  const bool failed = bad != 0;
  for (int idx = tid; idx < heads * HD; idx += S::kThreads) {
    const int g = idx / HD;
    const int d = idx - g * HD;
    float sum = 0.0f;
#pragma unroll 4
    for (int k = 0; k < S::kGroups; ++k) sum += red[(k * S::kHeads + g) * HD + d];
    const int head = head_base + g;
    if (a.num_parts == 1) {
      const float l = row_sum[g];
      const float v = failed ? NAN : (l > 0.0f ? sum * (a.v_mul / l) : 0.0f);
      store_act(a.out, a.act, token * a.out_token_stride + head * a.out_head_stride + d, v);
    } else {
      const int64_t slot = (static_cast<int64_t>(token) * a.num_heads + head) * a.num_parts + part;
      a.part_acc[slot * HD + d] = sum;
      if (d == 0) {
        a.part_stats[2 * slot] = row_max[g];
        a.part_stats[2 * slot + 1] = failed ? NAN : row_sum[g];
      }
    }
  }
}

template <CacheType CT, int HD>
void launch_decode(const DecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.num_tokens, a.num_kv_heads * a.head_chunks, a.num_parts);
  switch (a.block_heads) {  // decode_heads_per_block(group)
    case 1: decode_kernel<CT, HD, 1><<<grid, kDecodeThreads, 0, stream>>>(a); break;
    case 4: decode_kernel<CT, HD, 4><<<grid, kDecodeThreads, 0, stream>>>(a); break;
    default: decode_kernel<CT, HD, kDecodeMaxHeads><<<grid, kDecodeThreads, 0, stream>>>(a); break;
  }
  PAGEDLLM_CUDA_CHECK_LAUNCH("paged attention decode kernel");
}

#define PAGEDLLM_INSTANTIATE_DECODE(HD)                                                     \
  template void launch_decode<CacheType::kFloat32, HD>(const DecodeArgs&, cudaStream_t);  \
  template void launch_decode<CacheType::kFloat16, HD>(const DecodeArgs&, cudaStream_t);  \
  template void launch_decode<CacheType::kBFloat16, HD>(const DecodeArgs&, cudaStream_t); \
  template void launch_decode<CacheType::kFp8E4M3, HD>(const DecodeArgs&, cudaStream_t);  \
  template void launch_decode<CacheType::kFp8E5M2, HD>(const DecodeArgs&, cudaStream_t);

}  // namespace pagedllm::cuda::detail
