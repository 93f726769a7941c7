// The portable MLA kernel (576/512) by warp roles over a cluster of two CTAs,
// for sm_120's 101,376 bytes per block and mma.sync (kernels/plan.h,
// TileShapeClusterMla, says the roles and the shared-memory layout;
// docs/design_portable.md counts why).
//
// Grid: x = 2 x (request x Hkv) + rank, clusters of 2 along x; both CTAs of a
// cluster take the same 64 folded rows (token-major, all heads) of one
// request and the same KV tiles of its split (kernels/core/request.cuh,
// cta_coord), so they start, loop and exit together. CTA rank c owns half of
// every K row: value columns [256 c, 256 c + 256) and rope dims
// [512 + 32 c, 512 + 32 c + 32), which is exactly the part of Q K^T whose
// value columns its P V needs: only the partial scores cross CTAs.
//
// Per KV tile (visit u, stage u % STAGES, S group and P buffer b = u % 2):
//   load warps  resolve their row of the tile (a paged cache's kv_indices
//               load), wait until the stage is free, gather the CTA's 288
//               dims of its N rows (zero rows past kv_len or at a bad index,
//               which is flagged), their copies completing on the stage's
//               `full`; an fp8 cache's rows read into registers before the
//               wait and converted into the stage (KvFp8, kernels/plan.h);
//   S group b   (4 warps, 16 rows each; the two groups take alternate
//               visits, so one group's exchange and softmax issue while the
//               other's Q K^T runs on the same schedulers) waits `full`,
//               S_c = Q_c K_c^T (Q_c in registers), releases the stage, sends
//               this half into the partner CTA's exchange buffer (st.async,
//               whose bytes complete the partner's xfull[b][warp]) once the
//               partner acknowledged the visit before, receives the
//               partner's half, adds it (fp32 addition commutes: both CTAs
//               hold the same scores and run the same softmax) and
//               acknowledges it, takes the rows' running max and sums from
//               the other group's visit u - 1 (named barrier per 16-row
//               slot), masks, runs the online softmax, leaves the state for
//               visit u + 1 and writes P and the rows' rescale factors into
//               P buffer b once the O warps are done with its last use;
//   O warps     wait FULL_P, rescale O, O += P V (V: the stage's 256 value
//               columns), release the stage and P.
// A stage is read by S group b at visit u and by the O warps after group b's
// softmax, while the other group works on visit u + 1: four stages keep one
// free for the load warps' next tile.
// The exchange buffer of slot w is one for both groups: the partner writes
// visit u + 1's half only after this CTA acknowledged visit u's (a 4-byte
// st.async onto the partner's xack[(u + 1) % 2][w], whose value comes from
// what was read, so it issues after the reads), so the halves arrive in visit
// order, alternating groups; each group has its own xfull (phase u / 2) and
// xack (phase (u - 1) / 2) per slot, so every barrier's phases follow one
// warp's program order.
// After the loop the group of the last visit leaves the rows' running max and
// sum in shared memory and the O warps normalize and store the CTA's 256
// value columns of O (or the split's partial O; rank 0 writes the lse). Every
// thread arrives on a cluster barrier when its part is done and waits on it
// before exiting, so no CTA leaves while its partner can still write into it.
#ifndef VERIFY_ATTN_MLA_CLUSTER_KERNEL_CUH_
#define VERIFY_ATTN_MLA_CLUSTER_KERNEL_CUH_

#include <stdint.h>

#include "kernels/core/cluster.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/p_handoff.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/roles.cuh"
#include "kernels/core/scores.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/loaders/fp8_rows.cuh"
#include "kernels/loaders/tile_copy.cuh"
#include "kernels/plan.h"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, 1) mla_cluster_kernel(const KernelParams p) {
#if VA_ARCH_SPECIFIC_BODY
  using sm90::mbar_arrive;
  using sm90::mbar_wait;
  using sm90::named_barrier_arrive;
  using sm90::named_barrier_sync;
  constexpr int M = Shape::kM, N = Shape::kN, STAGES = Shape::kStages;
  constexpr int DV = Shape::kDv, DH = Shape::kDqkHalf, DVH = Shape::kDvHalf, DR = Shape::kRopeHalf;
  constexpr int KS = Shape::kKStride, PS = Shape::kPStride;
  constexpr int CT = Shape::kComputeThreads;
  constexpr int kS = Shape::kSWarps, kO = Shape::kOWarps, kG = Shape::kSGroups;
  constexpr int kSAll = kS * kG;  // S warps of both groups: warps [0, kSAll)
  constexpr int CX = Shape::kClusterX;
  constexpr int NT = N / 8;         // n8 score tiles: every S warp covers the tile's N columns
  constexpr int KT = DH / 16;       // k16 steps of the CTA's 288 dims
  constexpr int KTV = DVH / 16;     // of which the value columns' (then the rope dims')
  constexpr int OC = Shape::kOCols; // value columns per O warp
  constexpr int NTO = OC / 8;       // n8 output tiles per O warp
  constexpr int MT = M / 16;        // m16 row tiles per O warp
  constexpr int XB = kS * NT * 32 * 4;  // floats of the exchange buffers
  static_assert(M == 64 && kS == 4 && kG == 2 && kO == 4 && Shape::kLoadWarps == 4 && CX == 2 && NT % 2 == 0 &&
                    NTO % 2 == 0 && Shape::kXFloats == NT * 4,
                "the roles below assume this shape");
  // setmaxnreg (Shape::kLoadRegs / kSRegs / kORegs, a warpgroup each) below:
  // what the load warps give back must cover what the others take from the
  // 65536 / 512 = 128 registers per thread the CTA enters with, else
  // setmaxnreg.inc waits forever (tools/checks/cubin_archs_test.py checks the 128).
  static_assert(32 * (Shape::kLoadWarps * Shape::kLoadRegs + kSAll * Shape::kSRegs + kO * Shape::kORegs) <=
                    (65536 / Shape::kThreads & ~7) * Shape::kThreads,
                "setmaxnreg budget");
  // Named barriers (0 is __syncthreads): full_p [2] and empty_p [2] (S group
  // b and the O warps), done [1], and the rows' softmax state from group b to
  // group 1 - b, per 16-row slot: chain [2][kS] (two warps each).
  constexpr int kFullP = 1, kEmptyP = 3, kDone = 5, kChain = 6;
  static_assert(kChain + kG * kS <= 16, "named barrier ids");

  extern __shared__ __align__(16) unsigned char smem[];
  DT* sK = reinterpret_cast<DT*>(smem);
  DT* sP = reinterpret_cast<DT*>(smem + Shape::kKBytes);
  float* sAlpha = reinterpret_cast<float*>(smem + Shape::kKBytes + Shape::kPBytes);  // [2][M]
  float* sX = sAlpha + 2 * M;                       // [kS][NT][32 lanes][4]: the partner's partial S
  float* sStat = sX + XB;                           // [2][M]: max, sum
  float4* sChain = reinterpret_cast<float4*>(sStat + 2 * M);  // [kS][32 lanes]: a lane's softmax state
  uint32_t* sAck = reinterpret_cast<uint32_t*>(sChain + kS * 32);  // [kG][kS]: where the partner's acknowledgements land
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Shape::kSmemBytes - Shape::kBarBytes);  // [STAGES]
  uint64_t* empty = full + STAGES;                                // [STAGES]
  uint64_t* xfull = empty + STAGES;                               // [kG][kS]: the partner's half landed
  uint64_t* xack = xfull + kG * kS;                               // [kG][kS]: the partner read the half before
  __shared__ int s_bad_kv;  // a KV row of this CTA had a bad index: its rows become NaN
  __shared__ RequestTile s_rt;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // Both CTAs decide alike (same coordinates, same inputs): both return here or neither.
  if (!role_prologue<Shape, DT, Loader>(p, &s_rt, &s_bad_kv, full, empty, 32 * Shape::kLoadWarps, kS + kO)) return;
  if (tid == 0) {
    // xfull and xack: one arrival (the local warp's expect_tx) and the partner's bytes per phase.
    for (int i = 0; i < 2 * kG * kS; ++i) sm90::mbar_init(xfull + i, 1);
    sm90::mbar_init_fence();
  }
  // Every mbarrier of both CTAs is initialised (fence.mbarrier_init.release.cluster
  // above and in role_prologue) before either CTA sends.
  cluster::barrier_arrive_relaxed();
  cluster::barrier_wait();

  // Each role ends on its own (setmaxnreg gives the roles different register
  // budgets, so no code after the split is shared); the O warps store once the
  // load warps (s_bad_kv) and the S warps (row statistics) arrived on kDone.
  if (warp >= kSAll + kO) {
    // ------------------------------------------------------------ load warps
    sm90::regs_dealloc<Shape::kLoadRegs>();
    const int c = static_cast<int>(cluster::cta_rank());
    const RequestTile rt = s_rt;
    const CtaCoord cc = cta_coord<Shape::kRowsGrid, CX>(p);
    const Loader loader(p, cc.req, cc.hk);
    const int kv_len = rt.kv_len, tile_begin = rt.tile_begin, visits = rt.tile_end - rt.tile_begin;
    const int lt = tid - 32 * (kSAll + kO);  // of the load warpgroup
    // One row per kTpr threads: its offset resolved before the stage's wait
    // (a q-dtype cache's looked up a tile ahead: load_role_ring).
    constexpr int kTpr = 32 * Shape::kLoadWarps / N;
    static_assert(kTpr * N == 32 * Shape::kLoadWarps, "one row per kTpr load threads");
    if constexpr (IsKvFp8<Shape>::value) {
      // An fp8 cache (kernels/loaders/fp8_rows.cuh): each of a row's kTpr
      // threads reads 16-byte chunks of the CTA's 256 value columns and 8
      // bytes of its 32 rope dims before the stage's wait and converts them
      // into the stage where the cp.async copies of a q-dtype cache land.
      static_assert(DVH % (16 * kTpr) == 0 && DR == 8 * kTpr, "value chunks of 16 bytes and a rope piece of 8 each");
      const uint8_t* g8 = static_cast<const uint8_t*>(p.k);
      const int row = lt / kTpr, sub = lt % kTpr;
      struct Fetched {
        Fp8RowChunks<DVH / 16 / kTpr, kTpr> vals;
        uint2 rope;
      };
      convert_role_ring<STAGES>(
          visits, full, empty,
          [&](int i) {
            const ResolvedRow r =
                ResolvedRow::of(KvTileRows<Loader>{loader, (tile_begin + i) * N, kv_len, &s_bad_kv}, row);
            Fetched f;
            f.vals.load(g8 + r.k_off + DVH * c, r.ok, sub);
            f.rope =
                r.ok ? __ldg(reinterpret_cast<const uint2*>(g8 + r.k_off + DV + DR * c) + sub) : make_uint2(0u, 0u);
            return f;
          },
          [&](const Fetched& f, int st) {
            DT* srow = sK + (st * N + row) * KS;
            f.vals.store(srow, sub);
            *reinterpret_cast<uint4*>(srow + DVH + 8 * sub) = e4m3x8_to<DT>(f.rope);
          });
    } else {
      const DT* gk = static_cast<const DT*>(p.k);
      load_role_ring<STAGES>(
          visits, full, empty,
          [&](int i) { return KvTileRows<Loader>{loader, (tile_begin + i) * N, kv_len, &s_bad_kv}; }, lt / kTpr,
          [&](const ResolvedRow& r, int st) {
            copy_rows_2range_async<N, 32 * Shape::kLoadWarps, DVH, DR, KS>(sK + st * N * KS, gk, DVH * c,
                                                                          DV + DR * c, r, lt);
          });
    }
    named_barrier_arrive(kDone, Shape::kThreads);
    cluster::barrier_arrive_relaxed();
    cluster::barrier_wait();
    return;
  }
  if (warp < kSAll) {
    // ------------------------------------------------------------ S warps
    sm90::regs_alloc<Shape::kSRegs>();
    const uint32_t c = cluster::cta_rank();
    const RequestTile rt = s_rt;
    const int hk = cta_coord<Shape::kRowsGrid, CX>(p).hk;
    const int grp = warp / kS, w = warp % kS, other = grp ^ 1;
    const int tile_begin = rt.tile_begin, visits = rt.tile_end - rt.tile_begin;
    // Q fragments (A operand) of rows g and g + 8 of slot w's 16 over the
    // CTA's 288 dims (k-steps 0-15: value columns 256 c.., 16-17: rope dims
    // 512 + 32 c..), straight from global memory once: zeros for rows past
    // the request.
    uint32_t q[KT][4];
    RowMask rows[2];
    const DT* gq = static_cast<const DT*>(p.q);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int gr = rt.row0 + w * 16 + g + 8 * i;
      rows[i] = row_mask(p, rt, gr);
      const DT* qrow = gq + (rows[i].valid ? q_row_offset(p, rt, hk, gr) : 0) + 2 * t4;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        const int dim = kk < KTV ? DVH * static_cast<int>(c) + kk * 16
                                 : DV + DR * static_cast<int>(c) + (kk - KTV) * 16;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          q[kk][i + 2 * h] = rows[i].valid ? *reinterpret_cast<const uint32_t*>(qrow + dim + 8 * h) : 0u;
      }
    }
    const RequestMask rmask{rt.kv_len, rt.prefix, p.mask_words, p.causal != 0};
    OnlineSoftmaxRow sm[2];
    sm[0].init();
    sm[1].init();
    const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8;
    DT* p_store = sP + grp * M * PS + (w * 16 + g) * PS + 2 * t4;
    // This lane's 16-byte slots of slot w's exchange buffer (n8 tile j at
    // + j * 128 floats): read here, written by the partner at the same offsets
    // of its own shared memory.
    float* x_mine = sX + (w * NT * 32 + lane) * 4;
    const uint32_t x_theirs = cluster::map_rank(x_mine, c ^ 1u);
    uint64_t* my_xfull = xfull + grp * kS + w;
    uint64_t* my_xack = xack + grp * kS + w;
    const uint32_t xfull_theirs = cluster::map_rank(my_xfull, c ^ 1u);
    // Visit u's acknowledgement goes to the partner's sender of visit u + 1: the other group.
    const uint32_t ack_theirs = cluster::map_rank(sAck + other * kS + w, c ^ 1u);
    const uint32_t xack_theirs = cluster::map_rank(xack + other * kS + w, c ^ 1u);
    float4* chain = sChain + w * 32 + lane;
    for (int u = grp; u < visits; u += 2) {
      const int st = u % STAGES;
      mbar_wait(full + st, static_cast<uint32_t>((u / STAGES) & 1));
      const DT* K = sK + st * N * KS;
      float s[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
      // The next k-step's K fragments load while this one's MMAs issue.
      uint32_t kf[2][NT / 2][4];
#pragma unroll
      for (int pp = 0; pp < NT / 2; ++pp) ldmatrix_x4(kf[0][pp], K + (pp * 16 + krow) * KS + kcol);
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        if (kk + 1 < KT) {
#pragma unroll
          for (int pp = 0; pp < NT / 2; ++pp)
            ldmatrix_x4(kf[(kk + 1) & 1][pp], K + (pp * 16 + krow) * KS + kcol + (kk + 1) * 16);
        }
#pragma unroll
        for (int pp = 0; pp < NT / 2; ++pp) {
          mma_m16n8k16<DT>(s[2 * pp], q[kk], kf[kk & 1][pp][0], kf[kk & 1][pp][1]);
          mma_m16n8k16<DT>(s[2 * pp + 1], q[kk], kf[kk & 1][pp][2], kf[kk & 1][pp][3]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + st);  // this warp's reads of the stage are done
      if (u >= 1) {
        if (lane == 0) cluster::mbar_arrive_expect_tx(my_xack, 4);
        mbar_wait(my_xack, static_cast<uint32_t>(((u - 1) >> 1) & 1));  // the partner read visit u - 1's half
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
        cluster::st_async_v4(x_theirs + static_cast<uint32_t>(j * 128 * 4), s[j], xfull_theirs);
      if (lane == 0) cluster::mbar_arrive_expect_tx(my_xfull, Shape::kXWarpBytes);
      mbar_wait(my_xfull, static_cast<uint32_t>((u >> 1) & 1));
      uint32_t dep = 0;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float4 x = *reinterpret_cast<const float4*>(x_mine + j * 128);
        s[j][0] += x.x;
        s[j][1] += x.y;
        s[j][2] += x.z;
        s[j][3] += x.w;
        dep ^= __float_as_uint(x.w);
      }
      // The acknowledgement carries a value of what was read, so it issues
      // only after the reads: the partner's next half cannot overwrite them.
      if (u + 1 < visits && lane == 0) cluster::st_async_b32(ack_theirs, dep, xack_theirs);
      if (u >= 1) {
        named_barrier_sync(kChain + other * kS + w, 64);  // the other group's visit u - 1 left the rows' state
        const float4 prev = *chain;
        sm[0].m = prev.x;
        sm[0].l = prev.y;
        sm[1].m = prev.z;
        sm[1].l = prev.w;
      }
      float mx[2];
      scale_mask_row_max<NT>(s, rmask, rows, (tile_begin + u) * N, N, 0, t4, p.scale_log2, mx);
      float alpha[2];
      softmax_tile<NT>(s, sm, mx, p.scale_log2, alpha);
      if (u + 1 < visits) {
        *chain = make_float4(sm[0].m, sm[0].l, sm[1].m, sm[1].l);
        named_barrier_arrive(kChain + grp * kS + w, 64);
      }
      publish_p<NT, PS>(s, alpha, p_store, sAlpha + grp * M + w * 16, g, t4, true, grp, kFullP, kEmptyP, CT);
    }
    // The O warps released P buffer grp once more than this group published (at the start).
    named_barrier_sync(kEmptyP + grp, CT);
    // The partner's last half has landed: nothing more is written into this
    // CTA's shared memory from outside.
    cluster::barrier_arrive_relaxed();
    // The group of the last visit (group 0 when there is none) holds the rows' final state.
    const bool last = visits == 0 ? grp == 0 : ((visits - 1) & 1) == grp;
    write_row_stats(sm, sStat, M, w * 16, g, t4, last);
    named_barrier_arrive(kDone, Shape::kThreads);
    cluster::barrier_wait();
    return;
  }
  // ------------------------------------------------------------ O warps
  sm90::regs_alloc<Shape::kORegs>();
  const RequestTile rt = s_rt;
  const CtaCoord cc = cta_coord<Shape::kRowsGrid, CX>(p);
  const int hk = cc.hk, split = blockIdx.z;  // cc.split, in every grid order
  const int q_start = rt.q_start, R = rt.R, row0 = rt.row0, G = p.group;
  const int visits = rt.tile_end - rt.tile_begin;
  const int col0 = (warp - kSAll) * OC;  // of the CTA's 256 value columns
  float o[MT][NTO][4];                // the CTA's 64 rows x this warp's value columns
  o_role_loop<MT, NTO, N, STAGES, KS, PS>(o, sP, sK, sAlpha, full, empty, visits, col0, lane, kFullP, kEmptyP, CT);
  cluster::barrier_arrive_relaxed();
  const int c = static_cast<int>(cluster::cta_rank());
  named_barrier_sync(kDone, Shape::kThreads);  // s_bad_kv and the row statistics are visible
  if (s_bad_kv) {
    // Both CTAs met the same rows (same indices): their O warps share the NaN rows.
    write_nan_rows<Shape, DT>(p, q_start, R, row0, hk, split, c * 32 * kO + tid - 32 * kSAll, CX * 32 * kO);
    cluster::barrier_wait();
    return;
  }

  // ---- normalize and store the CTA's value columns ----
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mi * 16 + g + 8 * h;
      const int gr = row0 + r;
      if (gr >= R) continue;
      const float l = sStat[M + r];
      const float inv = l > 0.f ? p.v_scale / l : 0.f;  // v_scale: 1 but for an fp8 cache
      store_out_row<NTO, DV, DT>(p, split, folded_row(q_start, hk, G, gr), DVH * c + col0 + 2 * t4, o[mi], h,
                                 inv, OnlineSoftmaxRow::lse(sStat[r], l), c == 0 && col0 == 0 && t4 == 0);
    }
  cluster::barrier_wait();
#else
  // Built for an architecture without clusters and setmaxnreg: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_MLA_CLUSTER_KERNEL_CUH_
