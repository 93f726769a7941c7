// One K tile of an fp8 (e4m3) latent cache into a stage of the sm_90a cp.async
// MLA kernel (kernels/sm90/mla_wgmma_kernel.cuh, KvFp8), converted in place.
//
// The consumers read a stage as 9 swizzled blocks of 64 rows x 64 q-dtype
// columns (8 KB each, kernels/sm90/swizzle.cuh); the stage has no room beside
// it for a staging copy (Q and two stages take the block's shared memory). So
// the producer half copies the tile's fp8 bytes (64 rows x 576) by cp.async into
// the stage's upper half, block-major (fp8 block b, 64 rows x 64 bytes, at
// kStagingOffset + 4 KB x b), and converts the blocks in order, each into its
// place in the stage (bf16 / fp16 block b at 8 KB x b). Block b's destination
// covers fp8 blocks 2b - 9 and 2b - 8 at most (from b = 4 on), none past b: the
// half meets at a named barrier before it writes block b >= 4 (every read of
// the blocks before it is done). Each thread converts its four rows one at a
// time (its producer's 40 registers hold no more): rows 0-31 of block b land
// over fp8 block 2b - 9 only, rows 32-63 over 2b - 8, which is block 8 itself
// for b = 8 (dest row r over its fp8 rows 2r - 64 and 2r - 63), so there the
// half meets again after reading each of rows 32-63 and before writing them.
// Each block is then fenced into the async proxy (the consumers read it by
// wgmma) and its mbarrier arrived on, as the bf16 producer does once a block's
// copies landed.
//
// Thread t of the half (64 threads) owns 16-byte fp8 chunk f = t % 4 of every
// block's rows t / 4 + 16 k (k < 4): it copies them and later reads back only
// what it copied itself (its cp.async.wait_group makes them visible to it), and
// eight consecutive threads read or write two whole rows, without bank
// conflicts. Rows past kv_len or at a bad index (offset -1) are zero-filled.
// Every e4m3 value is exact in bf16 and fp16 (kernels/loaders/fp8_rows.cuh).
#ifndef VERIFY_ATTN_SM90_MLA_FP8_PRODUCER_CUH_
#define VERIFY_ATTN_SM90_MLA_FP8_PRODUCER_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"
#include "kernels/loaders/fp8_rows.cuh"
#include "kernels/sm90/swizzle.cuh"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {
namespace sm90 {

constexpr int kFp8BlockBytes = kBlockRows * kBlockCols;  // 4 KB: 64 rows x 64 e4m3 bytes
constexpr int kFp8TileBlocks = 9;                         // 576 columns
constexpr int kStagingOffset = kFp8TileBlocks * kBlockBytes - kFp8TileBlocks * kFp8BlockBytes;  // 36 KB

// t: the thread's index in its producer half (0..63); s_off: the tile's 64 row
// offsets (elements = bytes of an fp8 cache; -1: a zero row); g8: the cache;
// stage: the stage's first byte; full: its 9 block mbarriers; bar: the half's
// named barrier (64 threads).
template <typename DT>
__device__ __forceinline__ void produce_fp8_tile(int t, const int64_t* s_off, const uint8_t* g8,
                                                 unsigned char* stage, uint64_t (&full)[kFp8TileBlocks], int bar) {
  const int f = t & 3;
  const int r0 = t >> 2;
  unsigned char* staging = stage + kStagingOffset;
  // Rows r0 + 16 k share r0's swizzle (16 k % 8 == 0): chunk 2f at sw, 2f + 1 at sw ^ 16.
  const int sw = ((2 * f) ^ (r0 & 7)) << 4;
  const unsigned char* rd = staging + r0 * 64 + 16 * f;  // + block x 4 KB + k x 1 KB
  unsigned char* wr = stage + r0 * 128;                    // + block x 8 KB + k x 2 KB
#pragma unroll 1
  for (int k = 0; k < 4; ++k) {  // one row's address live at a time (the producer's 40 registers)
    const int r = r0 + 16 * k;
    const int64_t off = s_off[r];
    const bool ok = off >= 0;
    const uint8_t* src = g8 + (ok ? off : 0) + 16 * f;
#pragma unroll
    for (int b = 0; b < kFp8TileBlocks; ++b)
      cp_async_16(staging + b * kFp8BlockBytes + r * 64 + 16 * f, src + 64 * b, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  static_assert(kStagingOffset == 4 * kBlockBytes + kFp8BlockBytes, "the overlap rule above: staging at 36 KB");
#pragma unroll 1
  for (int b = 0; b < kFp8TileBlocks; ++b) {
    if (b >= 4) named_barrier_sync(bar, 64);  // every read of fp8 blocks < b is done
#pragma unroll 1
    for (int k = 0; k < 4; ++k) {
      const uint4 raw = *reinterpret_cast<const uint4*>(rd + b * kFp8BlockBytes + k * 1024);
      if (b == kFp8TileBlocks - 1 && k >= 2) named_barrier_sync(bar, 64);  // rows 32-63 land on block 8 itself
      unsigned char* row = wr + b * kBlockBytes + k * 2048;
      *reinterpret_cast<uint4*>(row + sw) = e4m3x8_to<DT>(make_uint2(raw.x, raw.y));
      *reinterpret_cast<uint4*>(row + (sw ^ 16)) = e4m3x8_to<DT>(make_uint2(raw.z, raw.w));
    }
    fence_proxy_async();  // these stores -> the consumers' wgmma reads
    mbar_arrive(&full[b]);
  }
}

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_FP8_PRODUCER_CUH_
