// Thin wrappers over the PTX instructions of the tensor-core path:
//   cp.async.cg.shared.global (16 bytes, with zero fill),
//   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, ld / st.shared.v4.b32,
//   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32.
//
// Fragment layout of mma.m16n8k16 (PTX ISA 8.x, section "Matrix Fragments for
// mma.m16n8k16 with floating point type"), with lane = 4*g + t (g = lane>>2,
// t = lane&3), every register holding two consecutive-column elements:
//   A (16x16, row-major):  a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..)
//                          a2 = (row g,   k 2t+8..)     a3 = (row g+8, k 2t+8..)
//   B (16x8, "col"):       b0 = (k 2t..2t+1, col g)     b1 = (k 2t+8.., col g)
//   C/D (16x8, fp32):      c0,c1 = (row g, col 2t, 2t+1)  c2,c3 = (row g+8, ...)
// ldmatrix.x4: lanes 8i..8i+7 give the 8 row addresses of matrix i; every lane
// receives, for matrix i, register i = (row lane>>2, cols 2*(lane&3), +1) of
// that 8x8 matrix; with .trans it receives (rows 2*(lane&3), +1; col lane>>2).
// So an A fragment is the four 8x8 quadrants (rows 0-7|8-15) x (k 0-7|8-15) in
// the order a0..a3, a B fragment from a [n][k] row-major tile is the two 8x8
// blocks (k 0-7, k 8-15) loaded WITHOUT .trans, and a B fragment from a
// [k][n] row-major tile (V, indexed [kv row][dim]) is loaded WITH .trans.
#ifndef VERIFY_ATTN_CORE_MMA_CUH_
#define VERIFY_ATTN_CORE_MMA_CUH_

#include <stdint.h>

#include "kernels/core/types.cuh"

namespace verify_attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared. When `valid` is false the source is not
// read (src-size 0) and the 16 destination bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// 16 bytes of shared memory into four registers (ld.shared.v4): a fragment
// stored in fragment order, each lane's four registers contiguous. Volatile,
// as ldmatrix is: a loop that re-reads the same fragment every iteration
// keeps the read in the loop instead of one copy held in registers.
__device__ __forceinline__ void lds_128(uint32_t (&r)[4], const void* smem) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// Four registers into 16 bytes of shared memory (st.shared.v4), ordered
// before every later asm statement that reads memory.
__device__ __forceinline__ void sts_128(void* smem, const uint32_t (&r)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(smem)), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// d += a * b for one m16n8k16 tile, fp32 accumulators, DT = half or bf16.
template <typename DT>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
  if constexpr (DTypeTraits<DT>::kIsBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_MMA_CUH_
