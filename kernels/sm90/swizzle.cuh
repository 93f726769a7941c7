// Shared-memory layout of the sm_90a path's operands (Q, K/V tiles): blocks of
// 64 rows x 64 elements (8 KB, 1024-byte aligned), one block per 64 columns;
// inside a block row r is 128 bytes at r * 128 and its 16-byte chunk c sits at
// chunk position c ^ (r % 8). That is the 128-byte swizzle the wgmma
// descriptors of kernels/sm90/wgmma.cuh describe (PTX ISA, "Shared Memory
// Matrix Layout": the XOR of address bits [4:6] with bits [7:9]), and it
// spreads the 8 rows of any 16-byte column over all 32 banks.
#ifndef VERIFY_ATTN_SM90_SWIZZLE_CUH_
#define VERIFY_ATTN_SM90_SWIZZLE_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"

namespace verify_attn {
namespace sm90 {

constexpr int kBlockRows = 64;
constexpr int kBlockCols = 64;                    // elements (16-bit)
constexpr int kBlockBytes = kBlockRows * 128;     // 8192
constexpr int kChunksPerBlockRow = 8;             // 16-byte chunks per 128-byte row

// Byte offset of 16-byte chunk `chunk` (0 .. D/8 - 1 along the full row) of row r.
__device__ __forceinline__ uint32_t swizzled_chunk_offset(int r, int chunk) {
  const int block = chunk / kChunksPerBlockRow;
  const int c = chunk % kChunksPerBlockRow;
  return static_cast<uint32_t>(block * kBlockBytes + r * 128 + ((c ^ (r & 7)) << 4));
}

// The first 1024-byte aligned byte of the dynamic shared memory `raw` (the
// swizzle atom is 1024 bytes in the shared window). Aligned by adding an
// offset to `raw` itself, not by masking its generic address: the compiler
// then still knows every access through it is to shared memory (LDS / STS,
// not generic LD.E / ST.E; a volatile read through the masked generic pointer
// even became LD.E.64.STRONG.SYS).
__device__ __forceinline__ unsigned char* align_smem_1024(unsigned char* raw) {
  return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
}

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_SWIZZLE_CUH_
