// The pieces both sm_90a MLA kernels' consumer warpgroups share
// (kernels/sm90/mla_wgmma_kernel.cuh, kernels/sm90/mla_seesaw_kernel.cuh):
// the Q tile into shared memory (by TMA or cp.async), the scores' wgmmas block
// by block as the blocks land, the mask and row maxima, the O rescale, and the
// epilogue (row sums over both consumers, output rows or split-K workspace
// rows).
//
// Fragment layout (kernels/sm90/wgmma.cuh): thread (warp, g = lane / 4,
// t4 = lane % 4) of a consumer holds rows my_row = {16 warp + g, + 8} of the
// CTA's 64 folded rows; of a 64-column score tile, s[4 i + e] is row
// my_row[e / 2], column 8 i + 2 t4 + e % 2; of its 256 output columns,
// o[4 i + e] the same rows, columns 8 i + 2 t4 + e % 2.
#ifndef VERIFY_ATTN_SM90_MLA_CONSUMER_CUH_
#define VERIFY_ATTN_SM90_MLA_CONSUMER_CUH_

#include <math.h>
#include <stdint.h>

#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/sm90/swizzle.cuh"
#include "kernels/sm90/sync.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace verify_attn {
namespace sm90 {

// Coordinates {head, token} of the box holding a CTA's 64 folded rows in the
// q and out maps (kernels/sm90/tma_host.h, encode_folded_rows_map: boxes of
// min(G, 64) heads x max(64 / G, 1) tokens). KV head 0's heads only: the host
// encodes those maps for num_kv_heads == 1 (MLA).
struct FoldedRowsBox {
  int head0;
  int token0;
};
__device__ __forceinline__ FoldedRowsBox folded_rows_box(const RequestTile& rt, int G) {
  return {G >= 64 ? rt.row0 % G : 0, rt.q_start + rt.row0 / G};
}

// The CTA's Q tile (64 folded rows x 9 column blocks) by TMA, completing
// q_full by its transaction bytes; one thread of the producer warpgroup, first
// thing (p.q_tma: the map of kernels/sm90/tma_host.h, encode_q_tmap, whose box
// is the 64 rows in the layout load_q_tile writes). Rows past the request are
// the next request's (zeros past total_q): masked, never written.
__device__ __forceinline__ void issue_q_tile(const KernelParams& p, const RequestTile& rt,
                                             unsigned char* sQ, uint64_t* q_full) {
  const FoldedRowsBox box = folded_rows_box(rt, p.group);
  mbar_arrive_expect_tx(q_full, 9 * kBlockBytes);
#pragma unroll
  for (int b = 0; b < 9; ++b)
    tma_load_block(sQ + b * kBlockBytes, p.q_tmap, q_full, b * kBlockCols, box.head0, box.token0);
}

// Q (the CTA's 64 folded rows x 576) into shared memory as 9 swizzled blocks
// (K-major wgmma A operand); rows past the request are zero. ct = 0..255 over
// both consumers, which then meet at named barrier `bar`.
template <typename DT>
__device__ __forceinline__ void load_q_tile(unsigned char* sQ, const KernelParams& p,
                                            const RequestTile& rc, int hk, int ct, int bar) {
  const int r = ct >> 2;
  const int gr = rc.row0 + r;
  const bool ok = gr < rc.R;
  const DT* src = static_cast<const DT*>(p.q);
  if (ok) src += q_row_offset(p, rc, hk, gr);
#pragma unroll
  for (int q = 0; q < 18; ++q) {
    const int chunk = (ct & 3) * 18 + q;  // 0..71
    cp_async_16(sQ + swizzled_chunk_offset(r, chunk), src + chunk * kChunkElems, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  named_barrier_sync(bar, 256);  // all of Q in shared memory
}

// The consumers' Q tile: landed by TMA (issue_q_tile) when p.q_tma, else
// copied by them (load_q_tile).
template <typename DT>
__device__ __forceinline__ void acquire_q_tile(unsigned char* sQ, const KernelParams& p,
                                               const RequestTile& rc, int hk, int ct, int bar,
                                               uint64_t* q_full) {
  if (p.q_tma) {
    mbar_wait(q_full, 0);
  } else {
    load_q_tile<DT>(sQ, p, rc, hk, ct, bar);
  }
}

// Scores of KV tile `tile` of the split (64 columns): masked only on draft /
// boundary tiles; returns this thread's two rows' maxima,
// quad-reduced and scaled to base 2 (scale_log2 > 0, the C-ABI checks it, so
// max and scaling commute). The scores stay unscaled: each exponent is one
// FFMA, s * scale_log2 - base. kMayMask = false: the caller knows the tile is
// prefix-only (no mask code is emitted, so a loop over such tiles stays
// compact: the pair loops' mask-free copy, kernels/sm90/mla_seesaw_kernel.cuh).
// kSkipTiles: the kernel's Shape::kSkipDraftTiles (visit `tile` -> KV tile, kv_tile).
template <int N, bool kMayMask = true, bool kSkipTiles = false>
__device__ __forceinline__ void mask_scores(float (&s)[32], const KernelParams& p,
                                            const RequestTile& rc, const RequestMask& rmask,
                                            const int (&my_row)[2], int t4, int tile, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
  // (The tile's KV row only where the mask may apply: none of this in a
  // prefix-only loop.)
  const int j0 = kMayMask ? kv_tile<kSkipTiles>(rc, rc.tile_begin + tile) * N : 0;
  if (kMayMask && rmask.tile_needs_mask(j0, N)) {
    static_assert(N == 64, "tile_bits covers 64 columns");
    // One row at a time (fragment elements 2h, 2h + 1 of each 8-column block
    // are row h's): one 64-bit visibility word live, not two.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      RowMask row;
      const int gr = rc.row0 + my_row[h];
      row.valid = gr < rc.R;
      row.t = row.valid ? gr / p.group : 0;
      row.words = (!p.causal && row.valid)
                      ? p.tree_mask + static_cast<int64_t>(rc.q_start + row.t) * p.mask_words
                      : nullptr;
      const uint64_t bits = rmask.tile_bits(row, j0) >> (2 * t4);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          float x = s[i * 4 + e];
          if (!((bits >> (i * 8 + (e & 1))) & 1ull)) x = -INFINITY;
          s[i * 4 + e] = x;
          mx[h] = fmaxf(mx[h], x);
        }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  }
  mx[0] = quad_max(mx[0]) * p.scale_log2;
  mx[1] = quad_max(mx[1]) * p.scale_log2;
}

// The column block of Q and K holding the rope dimensions 512..575.
constexpr int kRopeBlock = 8;

// Q's block 8 (the rope columns 512..575 of the CTA's 64 rows) as wgmma A
// fragments, for the scores' last block: with A from registers the tensor
// cores read only K from shared memory there, which takes load off the
// shared memory the copies write at the same time (what FlashMLA's sm_90
// kernel does with the same block; faster on the compute-bound MLA rows,
// BENCHMARKS.md). q_rope[4 kk + e] for k16 step kk: row 16 warp + g (e even)
// or + 8 (e odd), columns 16 kk + 8 (e / 2) + 2 t4, + 1 (wgmma's A layout).
__device__ __forceinline__ void load_q_rope(const unsigned char* sQ, int warp, int g, int t4,
                                            uint32_t (&q_rope)[16]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = warp * 16 + g + 8 * (e & 1);
      const int chunk = kRopeBlock * kChunksPerBlockRow + 2 * kk + (e >> 1);
      q_rope[4 * kk + e] =
          *reinterpret_cast<const uint32_t*>(sQ + swizzled_chunk_offset(row, chunk) + 4 * t4);
    }
}

// The 4 wgmmas (k16 steps) of the scores over K block b (step 0 zeroes the
// accumulators when `first`): Q from shared memory, block 8's from q_rope.
template <typename DT>
__device__ __forceinline__ void issue_scores_block(float (&s)[32], uint32_t q_addr,
                                                   const uint32_t (&q_rope)[16], uint32_t k_addr,
                                                   int b, bool first) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t dk = desc_kmajor(k_addr, b * kBlockBytes, kk);
    const int acc = (!first || kk != 0) ? 1 : 0;
    if (b == kRopeBlock) {
      const uint32_t a[4] = {q_rope[4 * kk], q_rope[4 * kk + 1], q_rope[4 * kk + 2],
                             q_rope[4 * kk + 3]};
      mma_m64n64k16_rs<DT>(s, a, dk, acc);
    } else {
      mma_m64n64k16_ss<DT>(s, desc_kmajor(q_addr, b * kBlockBytes, kk), dk, acc);
    }
  }
}

// Scores of this consumer's tile, blocks order[B0 .. B1) (one wgmma group per
// block, each issued as soon as its block has landed; `wait` = false skips the
// barrier waits, for a discarded pass over blocks nobody refills). Leaves them
// in flight; block order[0] step 0 zeroes the accumulators. Each group is
// opened by an explicit fence after its wait (else ptxas inserts one in the
// wait loop and serializes every wgmma, C7520). The blocks must be in the
// async proxy when their barrier completes: TMA writes are; cp.async copies
// are fenced by the producer before it arrives. kSuspend: each wait's try
// suspends the threads up to 20 us (mbar_wait<20000>) instead of the hardware's
// default limit; a suspended thread still wakes as soon as the phase
// completes, and retries less often (the TMA kernel; slightly faster on its
// large-batch rows, neutral elsewhere).
template <typename DT, int B0, int B1, bool kSuspend = false>
__device__ __forceinline__ void issue_scores(float (&s)[32], uint64_t (&full)[9], uint32_t parity,
                                             bool wait, uint32_t q_addr,
                                             const uint32_t (&q_rope)[16], uint32_t k_addr,
                                             const int (&order)[9]) {
#pragma unroll
  for (int n = B0; n < B1; ++n) {
    const int b = order[n];
    if (wait) {
      if constexpr (kSuspend) {
        mbar_wait<20000u>(&full[b], parity);
      } else {
        mbar_wait(&full[b], parity);
      }
    }
    fence_regs(s);
    wgmma_fence();
    issue_scores_block<DT>(s, q_addr, q_rope, k_addr, b, n == 0);
    wgmma_commit();
  }
}

// stmatrix.sync.aligned.m8n8.x4: four 8 x 8 16-bit matrices, lane L giving
// the address of row L % 8 of matrix L / 8; register i of every lane holds
// its fragment of matrix i (row lane / 4, columns 2 (lane % 4), + 1).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Stores P (fragment s, the m64n64 accumulator layout, scaled by `scale` per
// row) as a K-major swizzled 64 x 64 A operand at `dst` (a tile's block 8),
// by stmatrix_x4: its four matrices are rows 0-7 / 8-15 of the warp's 16 x
// chunks i, i + 1 (an 8 x 8 matrix's fragment is the mma C layout): 4
// instructions instead of 16 32-bit stores.
template <typename DT>
__device__ __forceinline__ void store_p(unsigned char* dst, const float (&s)[32],
                                        const float (&scale)[2], int warp, int lane) {
  const int j = lane >> 3;
  const int row = warp * 16 + (j & 1) * 8 + (lane & 7);
  const uint32_t base = smem_addr(dst);
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    stmatrix_x4(base + swizzled_chunk_offset(row, i + (j >> 1)),
                DTypeTraits<DT>::pack(s[4 * i] * scale[0], s[4 * i + 1] * scale[0]),
                DTypeTraits<DT>::pack(s[4 * i + 2] * scale[1], s[4 * i + 3] * scale[1]),
                DTypeTraits<DT>::pack(s[4 * i + 4] * scale[0], s[4 * i + 5] * scale[0]),
                DTypeTraits<DT>::pack(s[4 * i + 6] * scale[1], s[4 * i + 7] * scale[1]));
  }
}

// O (64 x 256 fp32) += P V over one 64-row KV tile, the 4 wgmmas (k16 steps)
// only: the caller fences, commits and waits. V: the 4 column blocks at
// v_base + v_off (MN-major, the tile's value columns of this consumer).
// issue_pv_regs: P from registers in the wgmma A layout (exp_scores' pa).
template <typename DT>
__device__ __forceinline__ void issue_pv_regs(float (&o)[128], const uint32_t (&pa)[16],
                                              uint32_t v_base, uint32_t v_off) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
    mma_m64n256k16_rs_tb<DT>(o, a, desc_mnmajor(v_base, v_off, kk));
  }
}

// issue_pv_smem: P from shared memory, the K-major swizzled 64 x 64 block at
// p_base + p_off (what store_p writes).
template <typename DT>
__device__ __forceinline__ void issue_pv_smem(float (&o)[128], uint32_t p_base, uint32_t p_off,
                                              uint32_t v_base, uint32_t v_off) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    mma_m64n256k16_ss_tb<DT>(o, desc_kmajor(p_base, p_off, kk), desc_mnmajor(v_base, v_off, kk));
}

// O *= f per row. Skipped by the whole warp when all its factors are exactly
// 1 (no row max of the warp moved: the factors are then set to 1, not
// computed; OnlineSoftmaxRow::update does the same): once the running max
// settles, most tiles skip these 128 multiplies.
__device__ __forceinline__ void scale_o(float (&o)[128], const float (&f)[2]) {
  if (!__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) return;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[i * 4 + 0] *= f[0];
    o[i * 4 + 1] *= f[0];
    o[i * 4 + 2] *= f[1];
    o[i * 4 + 3] *= f[1];
  }
}

// Row sums over both consumers' columns, sSum = [2][64] fp32: each consumer
// w stores its quad-reduced partial sums (l: this thread's columns of its two
// rows) in sSum[w] (store_row_sums), and after a named barrier both read the
// two halves' total (read_row_sums).
// (q: the quad-reduced sums, scratch for the caller.)
template <int M>
__device__ __forceinline__ void store_row_sums(const float (&l)[2], float* sSum, int w,
                                               const int (&my_row)[2], int t4, float (&q)[2]) {
  q[0] = quad_sum(l[0]);
  q[1] = quad_sum(l[1]);
  if (t4 == 0) {
    sSum[w * M + my_row[0]] = q[0];
    sSum[w * M + my_row[1]] = q[1];
  }
}

template <int M>
__device__ __forceinline__ void read_row_sums(const float* sSum, const int (&my_row)[2],
                                              float (&lsum)[2]) {
  lsum[0] = sSum[my_row[0]] + sSum[M + my_row[0]];
  lsum[1] = sSum[my_row[1]] + sSum[M + my_row[1]];
}

// Both consumers at once: they meet at named barrier `bar`.
template <int M>
__device__ __forceinline__ void reduce_row_sums(const float (&l)[2], float* sSum, int w,
                                                const int (&my_row)[2], int t4, int bar,
                                                float (&lsum)[2]) {
  store_row_sums<M>(l, sSum, w, my_row, t4, lsum);
  named_barrier_sync(bar, 256);
  read_row_sums<M>(sSum, my_row, lsum);
}

// In two halves, for consumers that finish at different times: each publishes
// its sums once they are final (an arrival at its own named barrier) and
// gathers both once the other's are there (a sync on the other's barrier).
template <int M>
__device__ __forceinline__ void publish_row_sums(const float (&l)[2], float* sSum, int w,
                                                 const int (&my_row)[2], int t4, int bar) {
  float q[2];
  store_row_sums<M>(l, sSum, w, my_row, t4, q);
  named_barrier_arrive(bar, 256);
}

template <int M>
__device__ __forceinline__ void gather_row_sums(const float* sSum, const int (&my_row)[2], int bar,
                                                float (&lsum)[2]) {
  named_barrier_sync(bar, 256);
  read_row_sums<M>(sSum, my_row, lsum);
}

// Consumer w's 256 output columns of its two rows, normalised by the row
// sums, and the rows' lse (base-2 max m): into out / lse with one split, else
// into the split's workspace rows (merged by merge_kernel).
template <class Shape, typename DT>
__device__ __forceinline__ void write_rows(const KernelParams& p, const RequestTile& rc, int hk,
                                           int split, int w, const float (&o)[128],
                                           const float (&lsum)[2], const float (&m)[2],
                                           const int (&my_row)[2], int t4) {
  const int G = p.group;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = rc.row0 + my_row[h];
    if (gr >= rc.R) continue;
    const FoldedRow fr = folded_row(rc.q_start, hk, G, gr);
    const int64_t token = fr.token;
    const int head = fr.head;
    const float inv = lsum[h] > 0.f ? p.v_scale / lsum[h] : 0.f;  // v_scale: 1 but for an fp8 cache
    const float lse = OnlineSoftmaxRow::lse(m[h], lsum[h]);
    if (p.num_splits == 1) {
      DT* orow = static_cast<DT*>(p.out) + token * p.out_stride_token + head * p.out_stride_head +
                 w * 256 + 2 * t4;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        *reinterpret_cast<uint32_t*>(orow + i * 8) =
            DTypeTraits<DT>::pack(o[i * 4 + 2 * h] * inv, o[i * 4 + 2 * h + 1] * inv);
      if (p.lse != nullptr && w == 0 && t4 == 0)
        p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse;
    } else {
      const int64_t wrow = workspace_row(split, p.ws_rows, token, p.num_qo_heads, head);
      float* orow = p.ws_o + wrow * Shape::kDv + w * 256 + 2 * t4;
#pragma unroll
      for (int i = 0; i < 32; ++i)
        *reinterpret_cast<float2*>(orow + i * 8) =
            make_float2(o[i * 4 + 2 * h] * inv, o[i * 4 + 2 * h + 1] * inv);
      if (w == 0 && t4 == 0) p.ws_lse[wrow] = lse;
    }
  }
}

// write_rows for an unsplit launch and a full row tile (rc.row0 + 64 <= rc.R)
// when p.o_tma: consumer w stages its 64 x 256 half of the normalised output
// in `stage` (4 blocks of 64 x 64, 128-byte swizzled: store_p's layout, which
// is the out map's box), meets its 128 threads at named barrier `bar`, and its
// thread 0 stores the 4 blocks by TMA (p.o_tmap, kernels/sm90/tma_host.h) and
// waits until they have been read. The values and their rounding are
// write_rows' (o / l packed to DT), so the two paths write the same bits.
// Why: from registers a warp stores 8 rows x 16 bytes at a time, and when
// every CTA of a large unsplit launch stores its output at once, that store
// phase is a visible part of the kernel's time (the large-batch MLA rows,
// BENCHMARKS.md); by TMA one thread hands each 64 x 64 block to the copy
// engine. FlashMLA's sm_90 kernel also writes its unsplit output tile by TMA.
template <class Shape, typename DT>
__device__ __forceinline__ void write_rows_tma(const KernelParams& p, const RequestTile& rc, int hk,
                                               int w, const float (&o)[128],
                                               const float (&lsum)[2], const float (&m)[2],
                                               const int (&my_row)[2], int t4, unsigned char* stage,
                                               int warp, int lane, int wtid, int bar) {
  const int G = p.group;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) inv[h] = lsum[h] > 0.f ? p.v_scale / lsum[h] : 0.f;  // v_scale: as write_rows
#pragma unroll
  for (int j = 0; j < 4; ++j)  // columns 64 j .. 64 j + 63 of this consumer's half
    store_p<DT>(stage + j * kBlockBytes, *reinterpret_cast<const float(*)[32]>(&o[32 * j]), inv,
                warp, lane);
  fence_proxy_async();  // the staged blocks -> the copy engine
  named_barrier_sync(bar, 128);
  if (wtid == 0) {
    const FoldedRowsBox box = folded_rows_box(rc, G);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      tma_store_block(p.o_tmap, stage + j * kBlockBytes, w * 256 + 64 * j, box.head0, box.token0);
    bulk_commit_group();
  }
  if (p.lse != nullptr && w == 0 && t4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const FoldedRow fr = folded_row(rc.q_start, hk, G, rc.row0 + my_row[h]);
      p.lse[fr.token * p.lse_stride_token + fr.head * p.lse_stride_head] =
          OnlineSoftmaxRow::lse(m[h], lsum[h]);
    }
  }
  if (wtid == 0) bulk_wait_group_read0();  // before the CTA's shared memory goes
}

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_CONSUMER_CUH_
