// The portable MLA kernel (576/512) with its work split by warp role, for
// sm_120's 101,376 bytes per block and mma.sync (kernels/plan.h,
// TileShapeSplitMla, says the roles and the shared-memory layout;
// docs/design_portable.md counts why).
//
// Grid and prologue as every kernel (kernels/core/request.cuh): a CTA owns 32
// folded rows (token-major, all heads) of one request and the KV tiles of its
// split. Per KV tile (visit i, stage i % STAGES, P buffer i % 2):
//   load warps  wait until the stage is free, gather its N rows (zero rows
//               past kv_len or at a bad index, which is flagged), and their
//               copies complete on the stage's `full` mbarrier;
//   S warps     wait `full`, S_half = Q_half K_half^T (mma.sync), release
//               the stage for their part, add the partner warp's half
//               (shared memory, pair barrier), scale and mask, fold into the
//               online softmax; once the O warps are done with P of two tiles
//               ago, the dim-0 warp of each pair writes P (bf16) and the rows'
//               rescale factors, and all arrive on FULL_P;
//   O warps     wait FULL_P, rescale O, O += P V (V: the tile's first 512
//               columns), release the stage and P.
// The two S warps of a pair hold identical scores after the exchange (each
// adds the same two halves), so both run the same softmax and either could
// write P. After the loop the rows' running max and sum go to shared memory
// and the O warps normalize and store O (or the split's partial O and lse).
#ifndef VERIFY_ATTN_MLA_SPLIT_KERNEL_CUH_
#define VERIFY_ATTN_MLA_SPLIT_KERNEL_CUH_

#include <stdint.h>

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
#include "kernels/loaders/tile_copy.cuh"
#include "kernels/plan.h"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, 1) mla_split_kernel(const KernelParams p) {
#if VA_ARCH_SPECIFIC_BODY
  using sm90::mbar_arrive;
  using sm90::mbar_wait;
  using sm90::named_barrier_arrive;
  using sm90::named_barrier_sync;
  constexpr int M = Shape::kM, N = Shape::kN, STAGES = Shape::kStages;
  constexpr int DQK = Shape::kDqk, DV = Shape::kDv;
  constexpr int KS = Shape::kKStride, PS = Shape::kPStride;
  constexpr int CT = Shape::kComputeThreads;
  constexpr int kS = Shape::kSWarps, kO = Shape::kOWarps;
  constexpr int NT = N / 8;             // n8 score tiles: every S warp covers the tile's N columns
  constexpr int KT = DQK / 2 / 16;      // k16 steps of a 288-wide half
  constexpr int OC = Shape::kOCols;     // value columns per O warp
  constexpr int NTO = OC / 8;           // n8 output tiles per O warp
  constexpr int XF = Shape::kXFloats;   // partial scores per lane
  static_assert(M == 32 && kS == 4 && kO == 4 && Shape::kLoadWarps == 4 && NT % 2 == 0 && NTO % 2 == 0,
                "the roles below assume this shape");
  // setmaxnreg 56 (load warpgroup) / 216 (S and O warpgroups) below: what the
  // load warps give back must cover what the others take from the 65536 / 384
  // -> 168 registers per thread the CTA enters with, else setmaxnreg.inc waits
  // forever (tools/checks/cubin_archs_test.py checks the 168).
  static_assert(32 * Shape::kLoadWarps * 56 + CT * 216 <= Shape::kThreads * 168, "setmaxnreg budget");
  constexpr int kFullP = 1, kEmptyP = 3, kPair = 5;  // named barriers (0 is __syncthreads): [2], [2], [2]

  extern __shared__ __align__(16) unsigned char smem[];
  DT* sK = reinterpret_cast<DT*>(smem);
  DT* sP = reinterpret_cast<DT*>(smem + Shape::kKBytes);
  float* sAlpha = reinterpret_cast<float*>(smem + Shape::kKBytes + Shape::kPBytes);  // [2][M]
  float* sX = sAlpha + 2 * M;                                                        // [2][kS][XF][32]
  float* sStat = sX + 2 * kS * XF * 32;                                              // [2][M]: max, sum
  uint64_t* full = reinterpret_cast<uint64_t*>(sStat + 2 * M);                        // [STAGES]
  uint64_t* empty = full + STAGES;                                                    // [STAGES]
  __shared__ int s_bad_kv;  // a KV row of this CTA had a bad index: its rows become NaN
  __shared__ RequestTile s_rt;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  if (!role_prologue<Shape, DT, Loader>(p, &s_rt, &s_bad_kv, full, empty, 32 * Shape::kLoadWarps, kS + kO)) return;

  // Each role ends on its own (setmaxnreg gives the roles different register
  // budgets, so no code after the split is shared); the O warps store once the
  // load warps (s_bad_kv) and the S warps (row statistics) arrived on kDone.
  constexpr int kDone = 7;
  if (warp >= kS + kO) {
    // ------------------------------------------------------------ load warps
    sm90::regs_dealloc<56>();
    const RequestTile rt = s_rt;
    const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
    const Loader loader(p, cc.req, cc.hk);
    const int kv_len = rt.kv_len, tile_begin = rt.tile_begin, visits = rt.tile_end - rt.tile_begin;
    const int lt = tid - CT;
    // One row per kTpr threads, its offset looked up a tile ahead
    // (load_role_ring).
    constexpr int kTpr = 32 * Shape::kLoadWarps / N;
    static_assert(kTpr * N == 32 * Shape::kLoadWarps, "one row per kTpr load threads");
    const DT* gk = static_cast<const DT*>(p.k);
    load_role_ring<STAGES>(
        visits, full, empty,
        [&](int i) { return KvTileRows<Loader>{loader, (tile_begin + i) * N, kv_len, &s_bad_kv}; }, lt / kTpr,
        [&](const ResolvedRow& r, int st) {
          DT* dst = sK + st * N * KS;
          copy_rows_async<N, 32 * Shape::kLoadWarps, DQK, KS, 0, 0, false>(dst, dst, gk, gk, r, lt);
        });
    named_barrier_arrive(kDone, Shape::kThreads);
    return;
  }
  if (warp < kS) {
    // ------------------------------------------------------------ S warps
    sm90::regs_alloc<216>();
    const RequestTile rt = s_rt;
    const int hk = cta_coord<Shape::kRowsGrid>(p).hk;
    const int row0 = rt.row0;
    const int tile_begin = rt.tile_begin, visits = rt.tile_end - rt.tile_begin;
    const int rg = warp >> 1, dh = warp & 1;  // rows 16 rg .. 16 rg + 15, dims 288 dh .. 288 dh + 287
    const int dim0 = dh * (DQK / 2);
    // Q fragments (A operand) of rows g and g + 8 of the warp's 16, straight from
    // global memory once: zeros for rows past the request.
    uint32_t q[KT][4];
    RowMask rows[2];
    const DT* gq = static_cast<const DT*>(p.q);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int gr = row0 + rg * 16 + g + 8 * i;
      rows[i] = row_mask(p, rt, gr);
      const DT* qrow = gq + (rows[i].valid ? q_row_offset(p, rt, hk, gr) : 0) + dim0 + 2 * t4;
#pragma unroll
      for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          q[kk][i + 2 * h] = rows[i].valid ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 8 * h) : 0u;
    }
    const RequestMask rmask{rt.kv_len, rt.prefix, p.mask_words, p.causal != 0};
    OnlineSoftmaxRow sm[2];
    sm[0].init();
    sm[1].init();
    const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8 + dim0;
    DT* p_store = sP + (rg * 16 + g) * PS + 2 * t4;
    for (int i = 0; i < visits; ++i) {
      const int st = i % STAGES, b = i & 1;
      mbar_wait(full + st, static_cast<uint32_t>((i / STAGES) & 1));
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
      // The partner's half: written and read lane-major (conflict-free).
      float* mine = sX + ((b * kS + warp) * XF) * 32 + lane;
      const float* theirs = sX + ((b * kS + (warp ^ 1)) * XF) * 32 + lane;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(j * 4 + e) * 32] = s[j][e];
      named_barrier_sync(kPair + rg, 64);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] += theirs[(j * 4 + e) * 32];

      // ---- mask (draft / boundary tiles only), scaled row max ----
      const int j0 = (tile_begin + i) * N;
      float mx[2];
      scale_mask_row_max<NT>(s, rmask, rows, j0, N, 0, t4, p.scale_log2, mx);
      float alpha[2];
      softmax_tile<NT>(s, sm, mx, p.scale_log2, alpha);
      publish_p<NT, PS>(s, alpha, p_store + b * M * PS, sAlpha + b * M + rg * 16, g, t4, dh == 0, b, kFullP,
                        kEmptyP, CT);
    }
    finish_s_role(sm, sStat, M, rg * 16, g, t4, dh == 0, visits, kEmptyP, CT);
    named_barrier_arrive(kDone, Shape::kThreads);
    return;
  }
  // ------------------------------------------------------------ O warps
  sm90::regs_alloc<216>();
  const RequestTile rt = s_rt;
  const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
  const int hk = cc.hk, split = blockIdx.z;  // cc.split, in every grid order
  const int q_start = rt.q_start, R = rt.R, row0 = rt.row0, G = p.group;
  const int visits = rt.tile_end - rt.tile_begin;
  const int col0 = (warp - kS) * OC;
  float o[2][NTO][4];  // rows 0-15 and 16-31 of the CTA x this warp's value columns
  o_role_loop<2, NTO, N, STAGES, KS, PS>(o, sP, sK, sAlpha, full, empty, visits, col0, lane, kFullP, kEmptyP, CT);
  named_barrier_sync(kDone, Shape::kThreads);  // s_bad_kv and the row statistics are visible
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, q_start, R, row0, hk, split, tid - 32 * kS, 32 * kO);
    return;
  }

  // ---- normalize and store ----
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mi * 16 + g + 8 * h;
      const int gr = row0 + r;
      if (gr >= R) continue;
      const float l = sStat[M + r];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      store_out_row<NTO, DV, DT>(p, split, folded_row(q_start, hk, G, gr), col0 + 2 * t4, o[mi], h, inv,
                                 OnlineSoftmaxRow::lse(sStat[r], l), col0 == 0 && t4 == 0);
    }
#else
  // Built for an architecture without setmaxnreg: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_MLA_SPLIT_KERNEL_CUH_
