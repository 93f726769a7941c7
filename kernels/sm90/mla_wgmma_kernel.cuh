// MLA tree verify on sm_90a: warpgroup MMA (wgmma) with a producer warpgroup.
//
// One CTA = 64 folded query rows (token, head) of one request x the KV tiles
// of its split, 64 KV rows per tile, 384 threads in three warpgroups:
//
//   WG 0 (producer, 40 registers): gathers each K tile (64 rows x 576, the
//       value is the first 512 columns of the same rows) into one of two
//       shared-memory stages with cp.async (16 bytes per copy, any page size,
//       scattered slots; warps 0-1 fill stage 0, warps 2-3 stage 1, one tile
//       row per thread), 64-column block by block; after each block it waits
//       for its own copies, fences them into the async proxy and arrives on
//       that block's mbarrier, so the consumers start on block 0 while the
//       rest is in flight. One of its threads first issues the Q tile by
//       TMA where q's tensor map allows it (kernels/sm90/mla_consumer.cuh,
//       issue_q_tile; else the consumers copy Q with cp.async). An fp8 cache
//       (KvFp8): each tile's bytes copied into the stage's upper half and
//       converted in place block by block (kernels/sm90/mla_fp8_producer.cuh).
//   WG 1, WG 2 (consumers w = 0, 1; 232 registers): KV tiles go in pairs
//       (tile 2i in stage 0, tile 2i + 1 in stage 1). Consumer w computes the
//       64 x 64 scores of the pair's tile w, S = Q K^T (36 wgmma m64n64k16,
//       K from shared memory, Q too but for its block 8, which each consumer
//       holds in registers: kernels/sm90/mla_consumer.cuh, load_q_rope), masks
//       the draft columns from the compact tree bits (kernels/core/mask.cuh),
//       and the two exchange their row maxima (shared memory, named barrier)
//       so both use one running max. Each writes its P (bf16/fp16, by
//       stmatrix) over the no longer needed columns 512..575 of its own
//       tile, and each accumulates its half of the output, O[:, 256 w ..
//       256 w + 256) += P_even V_even + P_odd V_odd (wgmma m64n256k16, V read
//       transposed from the K tile). A stage is handed back to the producer
//       as soon as both consumers' MMAs on it have completed. An unsplit
//       launch's full row tile is staged in the then free stages and stored
//       by TMA (write_rows_tma, kernels/sm90/mla_consumer.cuh).
//
// Same semantics and outputs as attention_kernel (kernels/attention_kernel.cuh):
// same request prologue, mask, online softmax (base 2, FlashAttention-2), the
// same split-K ranges and workspace rows merged by merge_kernel, NaN rows for
// kv_len < q_len or a bad KV index. The schedule of the two consumers follows
// the idea of FlashMLA's sm_90 kernel (two warpgroups splitting the 512 output
// columns and alternating KV tiles); the code is our own.
#ifndef VERIFY_ATTN_SM90_MLA_WGMMA_KERNEL_CUH_
#define VERIFY_ATTN_SM90_MLA_WGMMA_KERNEL_CUH_

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/pdl.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/plan.h"
#include "kernels/sm90/mla_consumer.cuh"
#include "kernels/sm90/mla_fp8_producer.cuh"
#include "kernels/sm90/swizzle.cuh"
#include "kernels/sm90/sync.cuh"
#include "kernels/sm90/wgmma.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VA_SM90A_BODY 1
#else
#define VA_SM90A_BODY 0
#endif

namespace verify_attn {
namespace sm90 {

constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// The CTA enters with 65536 / 384 -> 168 registers per thread (ptxas rounds
// down to a multiple of 8; //tools/checks:cubin_archs_test checks it): what the
// producer gives back must cover what the consumers take, else setmaxnreg.inc
// waits forever.
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "setmaxnreg budget");
constexpr int kBarPairMax = 1;  // named barrier ids (0 is __syncthreads)
constexpr int kBarPairP = 2;
constexpr int kBarConsumers = 3;
constexpr int kBarProducer = 4;  // 4, 5: the two producer halves (their row-offset tables)
constexpr int kBarStage = 6;     // 6, 7: one consumer's own (its output tile staged)

// Producer: wait for the copies of blocks <= c (N = groups still allowed in
// flight), publish block c.
template <int N>
__device__ __forceinline__ void publish_block(uint64_t* bar) {
  cp_async_wait<N>();
  fence_proxy_async();
  mbar_arrive(bar);
}

// Producer, after committing a tile as 18 groups (2 passes x 9 blocks, pass 1
// last): block b is complete once group (1, b) is, i.e. when at most 8 - b
// groups are still in flight; publish the blocks in order.
__device__ __forceinline__ void publish_tile(uint64_t (&bars)[9]) {
  publish_block<8>(&bars[0]);
  publish_block<7>(&bars[1]);
  publish_block<6>(&bars[2]);
  publish_block<5>(&bars[3]);
  publish_block<4>(&bars[4]);
  publish_block<3>(&bars[5]);
  publish_block<2>(&bars[6]);
  publish_block<1>(&bars[7]);
  publish_block<0>(&bars[8]);
}

}  // namespace sm90

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    mla_wgmma_kernel(const __grid_constant__ KernelParams p) {
#if VA_SM90A_BODY
  using namespace sm90;
  constexpr int M = Shape::kM, N = Shape::kN, DQK = Shape::kDqk, DV = Shape::kDv;
  constexpr int KB = Shape::kKBlocks;        // 9 column blocks of a K tile
  constexpr int kPBlock = 8;                 // the block P is written over (see below)
  static_assert(M == 64 && N == 64 && DQK == 576 && DV == 512 && KB == 9, "shape");
  static_assert(Shape::kThreads == 384, "one producer and two consumer warpgroups");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  unsigned char* sQ = smem;
  unsigned char* sK = smem + Shape::kQBytes;  // [2][9 blocks]
  float* sMax = reinterpret_cast<float*>(sK + Shape::kKBytes);  // [2][64]
  float* sSum = sMax + 2 * M;                                                    // [2][64]
  int64_t* s_rows = reinterpret_cast<int64_t*>(sSum + 2 * M);  // [2 halves][2][64]
  __shared__ __align__(8) uint64_t full_bar[2][KB];
  __shared__ __align__(8) uint64_t empty_bar[2];
  __shared__ __align__(8) uint64_t q_full;  // p.q_tma: Q landed (transaction bytes)
  __shared__ int s_bad_kv;
  __shared__ RequestTile s_rt;  // re-read by the consumers after the role split

  // A programmatic dependent launch (kernels/pdl_launch.h): no global memory
  // before this returns.
  grid_dependency_wait();
  const int tid = threadIdx.x;
  const int wg = tid / 128, wtid = tid % 128;
  const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
  const int hk = cc.hk;
  const int split = blockIdx.z;  // cc.split, in every grid order
  const Loader loader(p, cc.req, hk);
  RequestTile rt;
  if (!start_request<Shape, DT>(p, loader, &rt)) return;
  const int n_tiles = rt.tile_end - rt.tile_begin;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int c = 0; c < KB; ++c) mbar_init(&full_bar[s][c], 64);  // the stage's producer half
      mbar_init(&empty_bar[s], 8);  // lane 0 of the 8 consumer warps
    }
    mbar_init(&q_full, 1);  // the producer thread issuing Q
    s_bad_kv = 0;
    s_rt = rt;
    mbar_init_fence();
  }
  __syncthreads();

  const DT* gk = static_cast<const DT*>(p.k);

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    regs_dealloc<kProducerRegs>();
    // Two halves, one per stage: warps 0-1 load the even tiles (stage 0),
    // warps 2-3 the odd ones (stage 1), so a freed stage refills at once
    // instead of after the other stage's copies. Coalesced: 8 consecutive
    // lanes copy the 8 chunks (128 bytes) of one row of a block, so every
    // 32-byte sector is read once; thread (c = t % 8, g = t / 8) copies chunk c
    // of rows g, g + 8, ..., g + 56, whose swizzled position is c ^ g for all
    // of them (row % 8 == g).
    const int half = wtid >> 6;
    const int c = wtid & 7;
    const int rg = (wtid & 63) >> 3;
    const int n_loads = n_tiles;  // an odd count's last pair has no tile B
    unsigned char* dst0 = sK + half * Shape::kKTileBytes + rg * 128 + ((c ^ rg) << 4);
    // Rows g + 8 k are copied in two passes of four (k = 4 hh .. 4 hh + 3) to
    // stay within the producer's 40 registers: each pass gets its four row
    // addresses, then copies them block by block, one commit group per (pass,
    // block); block b is complete once group (1, b) is (publish_tile).
    //
    // Row addresses: each thread of the half resolves ONE row of the next tile
    // (one page-table lookup and division, coalesced over the half) into a
    // shared-memory table of element offsets, one tile ahead, so the copies of
    // a tile never wait on page-table loads (page_size 1 runs as fast as
    // larger pages this way; four dependent lookups per thread per pass did not).
    int64_t* s_off = s_rows + half * 2 * N;  // [2 buffers][64 rows], -1 = zero row
    auto row_offset = [&](int i, int r, int64_t* off) -> bool {
      const int j = (rt.tile_begin + i) * N + r;
      int64_t v_off = 0;
      bool ok = false;
      if (i < n_tiles && j < rt.kv_len) {
        ok = loader.row(j, off, &v_off);
        if (!ok) s_bad_kv = 1;  // zero-filled; the CTA's rows become NaN
      }
      return ok;
    };
    auto stage_rows = [&](int i, int buf) {
      int64_t off = 0;
      s_off[buf * N + (wtid & 63)] = row_offset(i, wtid & 63, &off) ? off : -1;
    };
    if (p.q_tma && wtid == 0) issue_q_tile(p, rt, sQ, &q_full);  // before the first page reads
    if (half < n_loads) stage_rows(half, 0);
    named_barrier_sync(kBarProducer + half, 64);
    for (int i = half; i < n_loads; i += 2) {
      const int use = i >> 1;
      const int buf = use & 1;
      if (use >= 1) mbar_wait(&empty_bar[half], (use - 1) & 1);
      if constexpr (IsKvFp8<Shape>::value) {
        // An fp8 cache: copied into the stage's upper half, converted in place
        // block by block (kernels/sm90/mla_fp8_producer.cuh).
        produce_fp8_tile<DT>(wtid & 63, s_off + buf * N, static_cast<const uint8_t*>(p.k),
                             sK + half * Shape::kKTileBytes, full_bar[half], kBarProducer + half);
      } else {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const DT* src[4];
          uint32_t ok_bits = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int r = rg + 8 * (4 * hh + k);
            const int64_t off = s_off[buf * N + r];
            const bool ok = off >= 0;
            ok_bits |= static_cast<uint32_t>(ok) << k;
            src[k] = gk + (ok ? off : 0) + c * kChunkElems;
          }
#pragma unroll
          for (int b = 0; b < KB; ++b) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
              cp_async_16(dst0 + b * kBlockBytes + (4 * hh + k) * 8 * 128, src[k] + b * kBlockCols,
                          (ok_bits >> k) & 1u);
            cp_async_commit();
          }
        }
        publish_tile(full_bar[half]);
      }
      // after publishing: its page-table load must not delay this tile
      if (i + 2 < n_loads) stage_rows(i + 2, buf ^ 1);
      // the next tile's offsets are in; this tile's table is read
      named_barrier_sync(kBarProducer + half, 64);
    }
  } else {
    // ------------------------------------------------------------ consumers
    regs_alloc<kConsumerRegs>();
    // From shared memory, not from the registers of the prologue: a value
    // live across setmaxnreg costs a local-memory spill (ptxas).
    const RequestTile rc = s_rt;
    // Warp-uniform by construction (lane 0's value): lets ptxas keep the
    // per-consumer descriptor bases in uniform registers.
    const int w = __shfl_sync(0xffffffffu, wg, 0) - 1;
    const int ct = tid - 128;  // 0..255 over both consumers
    const int warp = wtid >> 5, lane = wtid & 31;
    const int g = lane >> 2, t4 = lane & 3;

    acquire_q_tile<DT>(sQ, p, rc, hk, ct, kBarConsumers, &q_full);
    uint32_t q_rope[16];  // Q's block 8, the scores' A operand there
    load_q_rope(sQ, warp, g, t4, q_rope);

    const RequestMask rmask{rc.kv_len, rc.prefix, p.mask_words, p.causal != 0};
    const int my_row[2] = {warp * 16 + g, warp * 16 + g + 8};

    OnlineSoftmaxRow sm[2];
    sm[0].init();
    sm[1].init();
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;

    const uint32_t q_addr = smem_addr(sQ);
    const uint32_t k_addr0 = smem_addr(sK), k_addr1 = k_addr0 + Shape::kKTileBytes;
    const int n_pairs = (n_tiles + 1) >> 1;

    // An odd tile count's last pair is tile A alone and runs after the loop
    // (kTileB false): consumer 1 has no scores of its own (its maxima -inf)
    // and stores no P, both consumers' P V covers tile A only, and the
    // producer copies no phantom tile B (a zero-filled one would cost a whole
    // pair). The dropped terms would add exact zeros.
    const bool odd = (n_tiles & 1) != 0;
    const int n_full = n_pairs - (odd ? 1 : 0);
    auto run_pair = [&](int pair, auto tile_b) {
      constexpr bool kTileB = decltype(tile_b)::value;
      const uint32_t parity = pair & 1;
      // Warp-uniform: whether this consumer has a tile in this pair.
      const bool own = kTileB || w == 0;

      // ---- S = Q K^T of this consumer's tile ----
      float s[32];
      float mx[2] = {-INFINITY, -INFINITY};
      if (own) {
        const uint32_t kt = k_addr0 + static_cast<uint32_t>(w) * Shape::kKTileBytes;
        // Block by block as they land (kernels/sm90/mla_consumer.cuh).
        constexpr int kOrder[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
        issue_scores<DT, 0, KB>(s, full_bar[w], parity, true, q_addr, q_rope, kt, kOrder);
        wgmma_wait<0>();
        fence_regs(s);
        mask_scores<N>(s, p, rc, rmask, my_row, t4, 2 * pair + w, mx);
      }

      // ---- one running max for both consumers ----
      if (t4 == 0) {
        sMax[w * M + my_row[0]] = mx[0];
        sMax[w * M + my_row[1]] = mx[1];
      }
      named_barrier_sync(kBarPairMax, 256);
      float base[2], alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float tile_max = fmaxf(mx[h], sMax[(1 - w) * M + my_row[h]]);
        alpha[h] = sm[h].update(tile_max, &base[h]);
      }

      // ---- P of this consumer's tile -> shared memory, as a K-major
      // swizzled A operand (64 rows x 64 KV columns), written over block 8
      // (K columns 512..575) of its own tile: the scores were its last use,
      // the value reads only blocks 0..7, and the producer refills the stage
      // only after both consumers' P V on it ----
      if (own) {
        unsigned char* my_p = sK + w * Shape::kKTileBytes + kPBlock * kBlockBytes;
#pragma unroll
        for (int i = 0; i < 32; i += 2) {  // s[i], s[i + 1]: row my_row[(i / 2) % 2]
          const int h = (i >> 1) & 1;
          s[i] = fast_exp2(fmaf(s[i], p.scale_log2, -base[h]));
          s[i + 1] = fast_exp2(fmaf(s[i + 1], p.scale_log2, -base[h]));
          sm[h].l += s[i] + s[i + 1];
        }
        const float one[2] = {1.f, 1.f};
        store_p<DT>(my_p, s, one, warp, lane);
      }
      scale_o(o, alpha);  // skipped by warps whose row maxima did not move
      fence_proxy_async();  // P stores -> the wgmma reads of both consumers
      named_barrier_sync(kBarPairP, 256);
      // The other consumer waited for its tile; wait here as well so this
      // thread's own acquire orders the producer's copies before its wgmma.
      // REQUIRED, not redundant with the named barrier: it is also this
      // thread's acquire of s_bad_kv for the other consumer's tiles (read after
      // the loop without a CTA-wide barrier). Tile A alone: consumer 0 has no
      // other tile.
      if (kTileB || w == 1) mbar_wait(&full_bar[1 - w][kPBlock - 1], parity);

      // ---- O[:, 256 w ..] += P_even V_even (+ P_odd V_odd) ----
      const uint32_t v_off = w * 4 * kBlockBytes;  // value columns 256 w .. 256 w + 255
      fence_regs(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        mma_m64n256k16_ss_tb<DT>(o, desc_kmajor(k_addr0, kPBlock * kBlockBytes, kk),
                                 desc_mnmajor(k_addr0 + v_off, 0, kk));
      wgmma_commit();
      if constexpr (kTileB) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          mma_m64n256k16_ss_tb<DT>(o, desc_kmajor(k_addr1, kPBlock * kBlockBytes, kk),
                                   desc_mnmajor(k_addr1 + v_off, 0, kk));
        wgmma_commit();
        wgmma_wait<1>();
        if (lane == 0) mbar_arrive(&empty_bar[0]);
        wgmma_wait<0>();
        fence_regs(o);
        if (lane == 0) mbar_arrive(&empty_bar[1]);
      } else {
        wgmma_wait<0>();
        fence_regs(o);
      }
    };
    for (int pair = 0; pair < n_full; ++pair) run_pair(pair, std::true_type{});
    if (odd) run_pair(n_full, std::false_type{});

    // Only the epilogue is left: the next programmatic dependent launch of
    // the stream (the split-K merge) may be scheduled; it waits for results.
    allow_dependents();
    const float l_part[2] = {sm[0].l, sm[1].l};
    float lsum[2];
    reduce_row_sums<M>(l_part, sSum, w, my_row, t4, kBarConsumers, lsum);

    // No CTA-wide barrier with the producer (the warpgroups leave their roles
    // at different points): s_bad_kv is final here, as the producer sets it
    // before publishing a tile and this thread acquired every tile's barrier
    // (its own tiles' blocks, the other consumer's block 7).
    if (s_bad_kv) {
      write_nan_rows<Shape, DT>(p, rc.q_start, rc.R, rc.row0, hk, split, ct, 256);
      return;
    }
    const float m_row[2] = {sm[0].m, sm[1].m};
    if (p.o_tma && p.num_splits == 1 && rc.row0 + M <= rc.R) {
      // Unsplit, a full row tile: staged in shared memory and stored by TMA
      // (kernels/sm90/mla_consumer.cuh, write_rows_tma). Both stages are free:
      // reduce_row_sums above met both consumers after their last P V, and
      // the producer copies nothing after the last pair's tiles.
      write_rows_tma<Shape, DT>(p, rc, hk, w, o, lsum, m_row, my_row, t4,
                                sK + w * Shape::kKTileBytes, warp, lane, wtid, kBarStage + w);
    } else {
      write_rows<Shape, DT>(p, rc, hk, split, w, o, lsum, m_row, my_row, t4);
    }
    return;
  }
  // producer: every copy of this thread landed (publish_block<0>); leave.
#else
  // Built for another architecture: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_WGMMA_KERNEL_CUH_
