// mma.cuh (internal) — the tensor-core instructions of the prefill kernel (sm_80+):
// mma.sync m16n8k16 with fp32 accumulation, ldmatrix (transposed) and register packing.
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4:
//   A (16 x 16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..),
//                           a[3] = (g+8, 2t+8..)
//   B (16 x 8, "col"):      b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32):       c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
// The lower 16 bits of a packed register hold the element with the smaller column / k index.
// Thread-safety: warp-synchronous device functions (all 32 lanes must call them together).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace pagedllm::cuda::detail {

// d += a * b for one 16 x 8 x 16 tile; kBf16 selects bfloat16 operands, else float16.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four transposed 8 x 8 b16 matrices: lanes 8i .. 8i+7 give the row addresses of matrix i;
// r[i] receives, for matrix i, the elements (rows 2t and 2t+1, column g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two floats rounded to the operand type, packed (lo in the lower half).
template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// A 32-bit shared-memory load (two packed 16-bit operands).
__device__ __forceinline__ uint32_t ld_shared_u32(const void* p) {
  return *static_cast<const uint32_t*>(p);
}

}  // namespace pagedllm::cuda::detail
