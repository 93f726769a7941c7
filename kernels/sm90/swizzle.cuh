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

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_SWIZZLE_CUH_
