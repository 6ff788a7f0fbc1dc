// prefill_kernel.cuh (internal) — the tensor-core prefill kernel over paged K/V, templated on
// the storage type (fp16, bf16, fp8 e4m3 / e5m2) and the head dim. Included only by the
// prefill_hd*.cu instantiation files.
//
// One thread block (4 warps) takes one tile of 64 query rows of one sequence and one KV head.
// Rows pack (token, query head of the GQA group) pairs, row = token * group + head, so K/V are
// read once for the whole group (FlashAttention-2 loop with GQA packing):
//   Q tile (scaled, in the operand type)       -> shared memory, once
//   for each tile of kBN keys (0 .. the tile's last causal position):
//     K/V rows gathered from the paged cache with 16-byte cp.async, double buffered
//     (fp8: raw bytes staged, then converted to fp16 in shared memory: fp8 -> fp16 is exact)
//     S = Q K^T with mma.sync m16n8k16 (fp32 accumulate); causal mask; online softmax per row
//     O += P V   (P rounded to the operand type, V fragments by ldmatrix.trans)
// Operand type: bf16 for bf16 caches, fp16 otherwise. Rows are padded by 16 bytes in shared
// memory so fragment loads and ldmatrix are free of bank conflicts.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "../cuda_check.h"
#include "attention_launch.h"
#include "common.cuh"
#include "dtypes.cuh"
#include "mma.cuh"

namespace pagedllm::cuda::detail {

template <CacheType CT, int HD>
struct PrefillShape {
  static constexpr bool kBf16 = CT == CacheType::kBFloat16;
  static constexpr bool kFp8 = CacheTraits<CT>::kFp8;
  static constexpr int kBM = kPrefillRows;
  static constexpr int kBN = HD <= 128 ? 64 : 32;     // keys per tile
  static constexpr int kPitch = HD + 8;               // operand elements per shared row
  static constexpr int kPitchBytes = kPitch * 2;
  static constexpr int kRawRowBytes = HD * CacheTraits<CT>::kBytes;
  static constexpr int kOperandStages = kFp8 ? 1 : 2;  // fp8 converts into one buffer
  static constexpr int kQBytes = kBM * kPitchBytes;
  static constexpr int kTileBytes = kBN * kPitchBytes;  // one K or V tile of operands
  static constexpr int kRawBytes = kFp8 ? kBN * kRawRowBytes : 0;
  static constexpr int kSmemBytes = kQBytes + 2 * kOperandStages * kTileBytes + 4 * kRawBytes;
  static_assert(HD % 16 == 0 && (HD / 8) % 2 == 0, "head dim must be a multiple of 16");
  static_assert(kBM == 16 * (kPrefillThreads / 32), "one warp per 16 rows");
};

// Converts one raw fp8 tile [kBN][HD] into operand rows [kBN][kPitch] (fp16, exact).
template <CacheType CT, int HD>
__device__ __forceinline__ void convert_fp8_tile(const uint8_t* raw, __half* dst) {
  using S = PrefillShape<CT, HD>;
  for (int idx = threadIdx.x; idx < S::kBN * HD / 8; idx += kPrefillThreads) {
    const int r = idx / (HD / 8);
    const int c = (idx - r * (HD / 8)) * 8;
    const uint2 v = *reinterpret_cast<const uint2*>(raw + r * HD + c);
    const uint32_t w[2] = {v.x, v.y};
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const __half2 lo = fp8x2_to_half2<CT>(static_cast<uint16_t>(w[i] & 0xFFFFu));
      const __half2 hi = fp8x2_to_half2<CT>(static_cast<uint16_t>(w[i] >> 16));
      packed[2 * i] = *reinterpret_cast<const uint32_t*>(&lo);
      packed[2 * i + 1] = *reinterpret_cast<const uint32_t*>(&hi);
    }
    *reinterpret_cast<uint4*>(dst + r * S::kPitch + c) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

template <CacheType CT, int HD>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(const PrefillArgs a) {
  using S = PrefillShape<CT, HD>;
  constexpr bool kBf16 = S::kBf16;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int bad;

  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int2 tm = a.tiles[tile];
  const int seq = tm.x;
  const int first = tm.y;  // first query token of the tile, within its sequence
  const int kvh = blockIdx.y;
  const int q0 = a.cu_seqlens_q[seq];
  const int q_len = a.cu_seqlens_q[seq + 1] - q0;
  const int len = a.context_lens[seq];
  const int tokens = min(a.tokens_per_tile, q_len - first);
  const int rows = tokens * a.group;
  const int ctx0 = len - q_len;              // position of the sequence's first new token
  const int tid = threadIdx.x;
  const int kernel_id = a.kv_ranges != nullptr ? kKernelCross : kKernelPrefill;
  if (tid == 0) bad = 0;
  // Keys [kv_begin, kv_end) are what any row of the tile sees: causal, 0 .. its last token;
  // cross-attention, the union of its tokens' valid ranges.
  int kv_begin = 0, kv_end = ctx0 + first + tokens;
  bool bad_range = false;  // a token of the tile has a bad range: the tile's rows become NaN
  if (a.kv_ranges != nullptr) {
    kv_begin = len;
    kv_end = 0;
    for (int k = 0; k < tokens; ++k) {
      int lo, hi;
      // bad ranges are reported once (KV head 0's block, thread 0) and left out of the union
      if (!read_kv_range(a.kv_ranges, q0 + first + k, len, &lo, &hi, a.err,
                         blockIdx.y == 0 && tid == 0)) {
        bad_range = true;
      } else if (lo < hi) {
        kv_begin = min(kv_begin, lo);
        kv_end = max(kv_end, hi);
      }
    }
  }
  const int tile0 = kv_begin < kv_end ? kv_begin / S::kBN : 0;  // first key tile
  const int num_kv_tiles = kv_begin < kv_end ? (kv_end + S::kBN - 1) / S::kBN - tile0 : 0;

  uint8_t* q_smem = smem;
  uint8_t* operands = smem + S::kQBytes;
  uint8_t* raw = operands + 2 * S::kOperandStages * S::kTileBytes;
  auto k_tile = [&](int stage) { return operands + stage * S::kTileBytes; };
  auto v_tile = [&](int stage) { return operands + (S::kOperandStages + stage) * S::kTileBytes; };

  // Q tile: row r = token (first + r / group) x head (kvh * group + r % group), times q_mul.
  for (int idx = tid; idx < S::kBM * HD / 8; idx += kPrefillThreads) {
    const int r = idx / (HD / 8);
    const int c = (idx - r * (HD / 8)) * 8;
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    if (r < rows) {
      const int64_t token = q0 + first + r / a.group;
      const int head = kvh * a.group + r % a.group;
      const int64_t off = token * a.q_token_stride + head * a.q_head_stride + c;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = load_act(a.q, a.act, off + e) * a.q_mul;
    }
    *reinterpret_cast<uint4*>(q_smem + r * S::kPitchBytes + c * 2) =
        make_uint4(pack2<kBf16>(v[0], v[1]), pack2<kBf16>(v[2], v[3]),
                   pack2<kBf16>(v[4], v[5]), pack2<kBf16>(v[6], v[7]));
  }

  PagedHead ph;
  const int64_t head_offset = static_cast<int64_t>(kvh) * a.block_size * S::kRawRowBytes;
  ph.key = a.key_cache + head_offset;
  ph.value = a.value_cache + head_offset;
  ph.key_block_stride = a.key_block_stride;
  ph.value_block_stride = a.value_block_stride;
  ph.table = a.block_tables + static_cast<int64_t>(seq) * a.block_table_stride;
  ph.block_size = a.block_size;
  ph.num_blocks = a.num_blocks;
  ph.seq = seq;
  __syncthreads();  // `bad` initialised before any gather may set it

  auto load_tile = [&](int j, int stage) {
    if constexpr (S::kFp8) {
      gather_kv_rows<S::kRawRowBytes, kPrefillThreads>(
          ph, j * S::kBN, S::kBN, kv_end, raw + (2 * stage) * S::kRawBytes,
          raw + (2 * stage + 1) * S::kRawBytes, S::kRawRowBytes, a.err, kernel_id, &bad);
    } else {
      gather_kv_rows<S::kRawRowBytes, kPrefillThreads>(ph, j * S::kBN, S::kBN, kv_end,
                                                       k_tile(stage), v_tile(stage),
                                                       S::kPitchBytes, a.err, kernel_id,
                                                       &bad);
    }
  };

  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  // Visible keys [lo, end) of each of this thread's two rows; padding rows take the last real
  // row's. Causal: lo = 0 and end = the row's position + 1, so every row sees key 0 and nothing
  // divides by zero; cross-attention: the token's range (a bad or empty one: nothing, l = 0).
  const int last_row = max(rows - 1, 0);
  const int tok_a = first + min(row_a, last_row) / a.group;
  const int tok_b = first + min(row_b, last_row) / a.group;
  int lo_a = 0, lo_b = 0, end_a = ctx0 + tok_a + 1, end_b = ctx0 + tok_b + 1;
  if (a.kv_ranges != nullptr) {
    read_kv_range(a.kv_ranges, q0 + tok_a, len, &lo_a, &end_a, a.err, false);
    read_kv_range(a.kv_ranges, q0 + tok_b, len, &lo_b, &end_b, a.err, false);
  }

  float o[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

  if (num_kv_tiles > 0) load_tile(tile0, 0);
  cp_async_commit();
  for (int jj = 0; jj < num_kv_tiles; ++jj) {
    const int j = tile0 + jj;  // the key tile
    if (jj + 1 < num_kv_tiles) {
      load_tile(j + 1, (jj + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile j (and, the first time, Q) visible to every thread
    int stage = jj & 1;
    if constexpr (S::kFp8) {
      convert_fp8_tile<CT, HD>(raw + (2 * stage) * S::kRawBytes,
                               reinterpret_cast<__half*>(k_tile(0)));
      convert_fp8_tile<CT, HD>(raw + (2 * stage + 1) * S::kRawBytes,
                               reinterpret_cast<__half*>(v_tile(0)));
      stage = 0;
      __syncthreads();
    }
    const uint8_t* ks = k_tile(stage);
    const uint8_t* vs = v_tile(stage);

    // S = Q K^T for this warp's 16 rows and the tile's kBN keys.
    float s[S::kBN / 8][4];
#pragma unroll
    for (int nt = 0; nt < S::kBN / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c = kk * 16 + 2 * t;
      uint32_t af[4];
      af[0] = ld_shared_u32(q_smem + row_a * S::kPitchBytes + c * 2);
      af[1] = ld_shared_u32(q_smem + row_b * S::kPitchBytes + c * 2);
      af[2] = ld_shared_u32(q_smem + row_a * S::kPitchBytes + (c + 8) * 2);
      af[3] = ld_shared_u32(q_smem + row_b * S::kPitchBytes + (c + 8) * 2);
#pragma unroll
      for (int nt = 0; nt < S::kBN / 8; ++nt) {
        const uint8_t* krow = ks + (nt * 8 + g) * S::kPitchBytes;
        mma_16816<kBf16>(s[nt], af, ld_shared_u32(krow + c * 2), ld_shared_u32(krow + (c + 8) * 2));
      }
    }

    // Mask (keys outside a row's [lo, end)), then the online softmax of rows a (s[.][0..1])
    // and b (s[.][2..3]); the four lanes of a quad share a row.
    const int key0 = j * S::kBN + 2 * t;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < S::kBN / 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = key0 + nt * 8 + (c & 1);
        if (key < (c < 2 ? lo_a : lo_b) || key >= (c < 2 ? end_a : end_b)) s[nt][c] = -INFINITY;
      }
      mx_a = fmaxf(mx_a, fmaxf(s[nt][0], s[nt][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
    const float use_a = new_a == -INFINITY ? 0.0f : new_a;
    const float use_b = new_b == -INFINITY ? 0.0f : new_b;
    const float alpha_a = __expf(m_a - use_a), alpha_b = __expf(m_b - use_b);
    m_a = new_a;
    m_b = new_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int nt = 0; nt < S::kBN / 8; ++nt) {
      s[nt][0] = __expf(s[nt][0] - use_a);
      s[nt][1] = __expf(s[nt][1] - use_a);
      s[nt][2] = __expf(s[nt][2] - use_b);
      s[nt][3] = __expf(s[nt][3] - use_b);
      sum_a += s[nt][0] + s[nt][1];
      sum_b += s[nt][2] + s[nt][3];
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][0] *= alpha_a;
      o[dt][1] *= alpha_a;
      o[dt][2] *= alpha_b;
      o[dt][3] *= alpha_b;
    }

    // O += P V: P's A fragments come straight from the S accumulators.
    const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
    for (int kk = 0; kk < S::kBN / 16; ++kk) {
      uint32_t pf[4];
      pf[0] = pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]);
      pf[1] = pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]);
      pf[2] = pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[3] = pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      const uint8_t* vrow = vs + (kk * 16 + (mi & 1) * 8 + ri) * S::kPitchBytes;
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt += 2) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, vrow + (dt + (mi >> 1)) * 16);
        mma_16816<kBf16>(o[dt], pf, vf[0], vf[1]);
        mma_16816<kBf16>(o[dt + 1], pf, vf[2], vf[3]);
      }
    }
    __syncthreads();  // this tile's buffers may be refilled
  }

  // Normalise and write the real rows.
  const bool failed = bad != 0 || bad_range;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? row_b : row_a;
    if (r >= rows) continue;
    const float l = half ? l_b : l_a;
    const float inv = failed ? NAN : (l > 0.0f ? a.v_mul / l : 0.0f);
    const int64_t token = q0 + first + r / a.group;
    const int head = kvh * a.group + r % a.group;
    const int64_t base = token * a.out_token_stride + head * a.out_head_stride + 2 * t;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      store_act(a.out, a.act, base + dt * 8, o[dt][2 * half] * inv);
      store_act(a.out, a.act, base + dt * 8 + 1, o[dt][2 * half + 1] * inv);
    }
  }
}

template <CacheType CT, int HD>
void launch_prefill(const PrefillArgs& a, int max_tiles, cudaStream_t stream) {
  using S = PrefillShape<CT, HD>;
  PAGEDLLM_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<CT, HD>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           S::kSmemBytes));
  const dim3 grid(max_tiles, a.num_kv_heads);
  prefill_kernel<CT, HD><<<grid, kPrefillThreads, S::kSmemBytes, stream>>>(a);
  PAGEDLLM_CUDA_CHECK_LAUNCH("paged attention prefill kernel");
}

#define PAGEDLLM_INSTANTIATE_PREFILL(HD)                                                        \
  template void launch_prefill<CacheType::kFloat16, HD>(const PrefillArgs&, int, cudaStream_t); \
  template void launch_prefill<CacheType::kBFloat16, HD>(const PrefillArgs&, int,              \
                                                         cudaStream_t);                        \
  template void launch_prefill<CacheType::kFp8E4M3, HD>(const PrefillArgs&, int, cudaStream_t); \
  template void launch_prefill<CacheType::kFp8E5M2, HD>(const PrefillArgs&, int, cudaStream_t);

}  // namespace pagedllm::cuda::detail
