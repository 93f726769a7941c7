// Warpgroup MMA (wgmma.mma_async, sm_90a) for the MLA tree-verify path:
// shared-memory matrix descriptors and the shapes the kernels issue.
//
// PTX ISA 8.x, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"
// (wgmma): the accumulator of m64nNk16 (fp32) gives thread t of the warpgroup
// (warp w = t / 32, lane = 4 g + q) rows 16 w + g and 16 w + g + 8; register
// 4 i + {0,1} holds (row 16 w + g, cols 8 i + 2 q + {0,1}) and 4 i + {2,3} the
// same columns of row + 8 -- per n8 block the mma.m16n8k16 C layout
// (kernels/core/mma.cuh).
//
// Shared-memory operands use the 128-byte swizzle (descriptor layout type 1):
// the operand is stored in blocks of 64 rows x 64 elements (8 KB, 1024-byte
// aligned), row r of a block at r * 128 bytes, its 16-byte chunk c at chunk
// position c ^ (r % 8) (kernels/sm90/swizzle.cuh). Descriptors (PTX ISA,
// "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading
// byte offset >> 4, 32-45 stride byte offset >> 4, 62-63 swizzle mode.
//   K-major (Q, K for S = Q K^T): 8-row groups 1024 bytes apart (SBO); one
//     k16 step is 32 bytes further along the row (start address + 32 k).
//   MN-major (V for O += P V, transposed B): 16 KV rows = 2048 bytes per k16
//     step, 8-row groups 1024 bytes apart (SBO), the next 64 value columns one
//     block (8 KB) further (LBO).
#ifndef VERIFY_ATTN_SM90_WGMMA_CUH_
#define VERIFY_ATTN_SM90_WGMMA_CUH_

#include <stdint.h>

#include "kernels/core/types.cuh"

namespace verify_attn {
namespace sm90 {

__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_byte_addr, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_byte_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return d;
}

// Advances a descriptor's start address by `bytes` (a multiple of 16): one
// 32-bit add on the low word. The 14-bit start field cannot carry: every
// operand lies in the CTA's shared-memory window (below 256 KB).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(d) + (bytes >> 4);
  const uint32_t hi = static_cast<uint32_t>(d >> 32);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// K-major operand block (rows x 64 elements, 128-byte rows) at `base` +
// `off` bytes, k16 step `k`. With `off` and `k` compile-time constants the
// descriptor of `base` is computed once and each call is one add (built
// from scratch per wgmma, the descriptor costs 12 uniform instructions).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t base, uint32_t off, int k) {
  return desc_add(smem_desc(base, 16u, 1024u), off + 32u * k);
}

// MN-major B operand: V rows [16 k, 16 k + 16) of a tile whose value columns
// start at `base` + `off` bytes (64 per 8 KB block, consecutive blocks).
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t base, uint32_t off, int k) {
  return desc_add(smem_desc(base, 8192u, 1024u), off + 2048u * k);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across the async
// MMA boundaries (the registers are written by the tensor core).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N, int K>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][K]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_regs(r[i]);
}

// The accumulator operands of a wgmma, written once: VA_WGMMA_D32 / _D128 are
// the "+f" constraints of d[0 .. N), VA_WGMMA_R32 / _R128 the matching
// register list "{%0, ..., %N-1}" (the other operands follow from %N on).
#define VA_WGMMA_D32(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define VA_WGMMA_D128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
  "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
  "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
  "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), \
  "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
  "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), \
  "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
  "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
  "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
  "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), \
  "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define VA_WGMMA_R32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define VA_WGMMA_R128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
  "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
  "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, " \
  "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// One asm statement per shape, T the A/B type ("bf16" or "f16"); each wrapper
// below expands it for its DT. scale_d = 0 overwrites the accumulator.
#define VA_WGMMA_M64N64K16_SS(T)                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " VA_WGMMA_R32       \
               ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                            \
               : VA_WGMMA_D32(d)                                                          \
               : "l"(da), "l"(db), "r"(scale_d))
#define VA_WGMMA_M64N64K16_RS(T)                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " VA_WGMMA_R32       \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                              \
               : VA_WGMMA_D32(d)                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
#define VA_WGMMA_M64N256K16_SS_TB(T)                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                              \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " " VA_WGMMA_R128     \
               ", %128, %129, p, 1, 1, 0, 1;\n}\n"                                          \
               : VA_WGMMA_D128(d)                                                         \
               : "l"(da), "l"(db), "r"(scale_d))
#define VA_WGMMA_M64N256K16_RS_TB(T)                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                              \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " " VA_WGMMA_R128     \
               ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                         \
               : VA_WGMMA_D128(d)                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

// d (64 x 64 fp32) (+)= A (smem, K-major) * B (smem, K-major)^T; scale_d = 0 overwrites.
template <typename DT>
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db,
                                                 int scale_d) {
  if constexpr (DTypeTraits<DT>::kIsBf16) {
    VA_WGMMA_M64N64K16_SS("bf16");
  } else {
    VA_WGMMA_M64N64K16_SS("f16");
  }
}

// d (64 x 64 fp32) (+)= A (registers: this thread's 4 x 2 16-bit values of a
// 64 x 16 slice, a[0] row g cols 2 q, + 1; a[1] the same of row g + 8; a[2],
// a[3] those 8 columns further) * B (smem, K-major)^T; scale_d = 0 overwrites.
template <typename DT>
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t db, int scale_d) {
  if constexpr (DTypeTraits<DT>::kIsBf16) {
    VA_WGMMA_M64N64K16_RS("bf16");
  } else {
    VA_WGMMA_M64N64K16_RS("f16");
  }
}

// d (64 x 256 fp32) += A (smem, K-major) * B (smem, MN-major: V rows x value columns).
template <typename DT>
__device__ __forceinline__ void mma_m64n256k16_ss_tb(float (&d)[128], uint64_t da, uint64_t db) {
  const int scale_d = 1;
  if constexpr (DTypeTraits<DT>::kIsBf16) {
    VA_WGMMA_M64N256K16_SS_TB("bf16");
  } else {
    VA_WGMMA_M64N256K16_SS_TB("f16");
  }
}

// d (64 x 256 fp32) += A (registers: this thread's 4 x 2 16-bit values of a
// 64 x 16 slice of P, the m64nNk16 accumulator layout above packed in pairs)
// * B (smem, MN-major: V rows x value columns).
template <typename DT>
__device__ __forceinline__ void mma_m64n256k16_rs_tb(float (&d)[128], const uint32_t (&a)[4],
                                                     uint64_t db) {
  const int scale_d = 1;
  if constexpr (DTypeTraits<DT>::kIsBf16) {
    VA_WGMMA_M64N256K16_RS_TB("bf16");
  } else {
    VA_WGMMA_M64N256K16_RS_TB("f16");
  }
}

#undef VA_WGMMA_M64N64K16_SS
#undef VA_WGMMA_M64N64K16_RS
#undef VA_WGMMA_M64N256K16_SS_TB
#undef VA_WGMMA_M64N256K16_RS_TB
#undef VA_WGMMA_R32
#undef VA_WGMMA_R128
#undef VA_WGMMA_D32
#undef VA_WGMMA_D128

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_WGMMA_CUH_
