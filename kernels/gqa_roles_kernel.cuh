// The portable GQA / MHA kernel (head_dim 64 / 128) with its work split by
// warp role, for mma.sync (sm_120 and the GQA path of every architecture;
// kernels/plan.h, TileShapeRolesGqa, says the shape and the shared-memory
// layout; docs/design_portable.md counts why).
//
// Grid and prologue as every kernel (kernels/core/request.cuh): a CTA owns M
// = 16 x (consumer warps) folded rows (token-major, the group's heads
// fastest) of one (request, KV head) and the KV tiles of its split. Per KV
// tile (visit i, stage i % STAGES):
//   load warps      wait until the stage is free, gather its N rows of K and
//                   V (zero rows past kv_len or at a bad index, which is
//                   flagged) with cp.async, each thread's copies completing on
//                   the stage's `full` mbarrier; from an fp8 cache (KvFp8
//                   shapes) each thread reads its part of the row into
//                   registers before the wait, then converts and stores it
//                   (kernels/loaders/fp8_rows.cuh) and arrives on `full`;
//   consumer warps  each 16 rows x every column of the tile, as
//                   FlashAttention-2 splits a tile between warps: wait `full`,
//                   S = Q K^T with the warp's Q fragments held in registers for
//                   the whole loop (loaded once, from global memory), scale and
//                   mask, the online softmax with the row max and sum reduced
//                   within the quad of lanes that holds a row (no shared memory,
//                   no CTA barrier), P converted in registers from the score
//                   accumulators to the A operand of O += P V, then the stage
//                   released.
// After the loop the consumers normalize and store O (or the split's partial
// O and lse; times v_scale for an fp8 cache) once the load warps are done
// (the bad-index flag); a pair of splits (Plan::pair_splits) combines its two
// partial states in the cluster of its two CTAs and stores the output
// (kernels/core/pair_combine.cuh).
#ifndef VERIFY_ATTN_GQA_ROLES_KERNEL_CUH_
#define VERIFY_ATTN_GQA_ROLES_KERNEL_CUH_

#include <stdint.h>

#include "kernels/core/gqa_warp.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/pair_combine.cuh"
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
__global__ void __launch_bounds__(Shape::kThreads, 1) gqa_roles_kernel(const KernelParams p) {
#if VA_ARCH_SPECIFIC_BODY
  using sm90::mbar_arrive;
  using sm90::mbar_wait;
  constexpr int M = Shape::kM, N = Shape::kN, STAGES = Shape::kStages, D = Shape::kDqk;
  constexpr int KS = Shape::kKStride;   // K and V rows (elements)
  constexpr int CW = Shape::kConsumerWarps, LW = Shape::kLoadWarps;
  constexpr int NT = N / 8;    // n8 score tiles of a warp (every column of the tile)
  constexpr int KT = D / 16;   // k16 steps of Q K^T
  constexpr int NTO = D / 8;   // n8 output tiles of a warp (every value column)
  static_assert(M == 16 * CW && N % 16 == 0 && NT % 2 == 0 && NTO % 2 == 0, "tile shape");
  constexpr int kDone = 1;     // named barrier (0 is __syncthreads)
  constexpr bool kFp8 = IsKvFp8<Shape>::value;  // the cache holds e4m3 (kernels/loaders/fp8_rows.cuh)
  // A pair of splits (p.pair_splits, kernels/core/pair_combine.cuh): not
  // over an fp8 cache, whose load warps have no register to spare.
  constexpr bool kPair = !kFp8;

  extern __shared__ __align__(16) unsigned char smem[];
  DT* sK = reinterpret_cast<DT*>(smem);                                 // [STAGES][N][KS]
  DT* sV = reinterpret_cast<DT*>(smem + Shape::kKBytes);                // [STAGES][N][KS]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Shape::kKBytes + Shape::kVBytes);  // [STAGES]
  uint64_t* empty = full + STAGES;                                      // [STAGES]
  __shared__ int s_bad_kv;  // a KV row of this CTA had a bad index: its rows become NaN

  __shared__ RequestTile s_rt;
  __shared__ uint64_t s_pair[CW / 2];  // a pair of splits: slot w / 2's partner state landed
  static_assert(kPairBufferBytes<NTO, CW> <= Shape::kKBytes + Shape::kVBytes, "pair: receiving area");
  // setmaxnreg 56 (load warpgroup) / 224 (the two consumer warpgroups): what
  // the load warps give back covers what the consumers take from the
  // 65536 / 384 -> 168 registers per thread the CTA enters with, else
  // setmaxnreg.inc waits forever (tools/checks/cubin_archs_test.py checks the 168).
  static_assert(LW == 4 && CW % 4 == 0 && 32 * LW * 56 + 32 * CW * 224 <= Shape::kThreads * 168,
                "setmaxnreg budget");

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  if (!role_prologue<Shape, DT, Loader>(p, &s_rt, &s_bad_kv, full, empty, 32 * LW, CW)) return;
  // Both CTAs of a pair decide alike (same request, row tile and inputs):
  // both return above or neither.
  if (kPair && p.pair_splits && tid == 0) {
    for (int i = 0; i < CW / 2; ++i) sm90::mbar_init(s_pair + i, 1);
    sm90::mbar_init_fence();
  }

  if (warp >= CW) {
    // ------------------------------------------------------------ load warps
    sm90::regs_dealloc<56>();
    const RequestTile rt = s_rt;
    const Loader loader(p, role_request<Shape>(p, rt), cta_coord<Shape::kRowsGrid>(p).hk);
    const int visits = rt.tile_end - rt.tile_begin;
    const int lt = tid - 32 * CW;
    // Each thread copies one row of every tile (32 x LW threads, N rows),
    // its address looked up a tile ahead (load_role_ring).
    static_assert((32 * LW) % N == 0, "one row per load thread and tile");
    constexpr int kTpr = 32 * LW / N;  // threads per row
    if constexpr (kFp8) {
      // Its part of the row's K and V (fp8 bytes) into registers before the
      // wait too, then converted into the free stage.
      const int row = lt / kTpr, sub = lt % kTpr;
      convert_role_ring<STAGES>(
          visits, full, empty,
          [&](int i) {
            Fp8KvRow<D, kTpr> f;
            f.load(KvTileRows<Loader>{loader, (rt.tile_begin + i) * N, rt.kv_len, &s_bad_kv}, row, p.k, p.v, sub);
            return f;
          },
          [&](const Fp8KvRow<D, kTpr>& f, int st) {
            f.store(sK + st * N * KS + row * KS, sV + st * N * KS + row * KS, sub);
          });
      sm90::named_barrier_arrive(kDone, Shape::kThreads);
      return;
    }
    const DT* gk = static_cast<const DT*>(p.k);
    const DT* gv = static_cast<const DT*>(p.v);
    load_role_ring<STAGES>(
        visits, full, empty,
        [&](int i) { return KvTileRows<Loader>{loader, (rt.tile_begin + i) * N, rt.kv_len, &s_bad_kv}; }, lt / kTpr,
        [&](const ResolvedRow& r, int st) {
          copy_resolved_rows_lines<N, 32 * LW, D, KS>(sK + st * N * KS, gk, r.k_off, r.ok, lt);
          copy_resolved_rows_lines<N, 32 * LW, D, KS>(sV + st * N * KS, gv, r.v_off, r.ok, lt);
        });
    sm90::named_barrier_arrive(kDone, Shape::kThreads);
    if (kPair && p.pair_splits) {
      pair_both_done();
      pair_before_exit();
    }
    return;
  }

  // ------------------------------------------------------------ consumer warps
  sm90::regs_alloc<224>();
  const RequestTile rt = s_rt;
  const int hk = cta_coord<Shape::kRowsGrid>(p).hk, split = rt.split;
  const int visits = rt.tile_end - rt.tile_begin;
  const int r0 = rt.row0 + warp * 16;  // the warp's first folded row
  // Q fragments (A operand) of rows g and g + 8, straight from global memory
  // once: zeros for rows past the request.
  uint32_t q[KT][4];
  RowMask rows[2];
  load_q_fragments<KT, DT>(p, rt, hk, r0, g, t4, q, rows);
  const RequestMask rmask{rt.kv_len, rt.prefix, p.mask_words, p.causal != 0};
  OnlineSoftmaxRow sm[2];
  sm[0].init();
  sm[1].init();
  float o[NTO][4];
#pragma unroll
  for (int j = 0; j < NTO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  const int k_frag_off = k_fragment_offset(lane, KS);
  const int v_frag_off = v_fragment_offset(lane, KS);

  // A warp whose 16 rows are all past the request (short requests: q_len x
  // group under M) computes nothing; it still waits for each stage before
  // releasing it, so that its arrivals stay one per visit and phase.
  const bool active = r0 < rt.R;
  for (int i = 0; i < visits; ++i) {
    const int st = i % STAGES;
    mbar_wait(full + st, static_cast<uint32_t>((i / STAGES) & 1));
    if (!active) {
      if (lane == 0) mbar_arrive(empty + st);
      continue;
    }
    const DT* kb = sK + st * N * KS + k_frag_off;
    const DT* vb = sV + st * N * KS + v_frag_off;

    // ---- S = Q K^T over the whole tile ----
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int pp = 0; pp < NT / 2; ++pp) {
        uint32_t b[4];
        ldmatrix_x4(b, kb + pp * 16 * KS + kk * 16);
        mma_m16n8k16<DT>(s[2 * pp], q[kk], b[0], b[1]);
        mma_m16n8k16<DT>(s[2 * pp + 1], q[kk], b[2], b[3]);
      }

    // ---- mask (draft / boundary tiles only), online softmax ----
    float mx[2];
    // A masked tile's visibility as one 64-bit word per row (RequestMask::tile_bits),
    // not a mask-word load per element.
    scale_mask_row_max_bits<NT>(s, rmask, [&](int h) { return rows[h]; }, (rt.tile_begin + i) * N, t4, p.scale_log2,
                                mx);
    float alpha[2];
    softmax_tile<NT>(s, sm, mx, p.scale_log2, alpha);
    uint32_t pa[N / 16][4];
    scores_to_a_operand<NT, DT>(s, pa);
    rescale_rows<NTO>(o, alpha);

    // ---- O += P V ----
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < NTO / 2; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + kk * 16 * KS + jj * 16);
        mma_m16n8k16<DT>(o[2 * jj], pa[kk], b[0], b[1]);
        mma_m16n8k16<DT>(o[2 * jj + 1], pa[kk], b[2], b[3]);
      }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + st);  // this warp's reads of the stage are done
  }

  sm90::named_barrier_sync(kDone, Shape::kThreads);  // the load warps' s_bad_kv is visible
  if (kPair && p.pair_splits) {
    const bool bad = s_bad_kv != 0;
    pair_both_done();
    pair_combine_warp<NTO, D, DT>(p, rt, hk, r0, warp, lane, o, sm, bad, reinterpret_cast<float*>(smem), s_pair);
    pair_before_exit();
    return;
  }
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, rt.q_start, rt.R, rt.row0, hk, split, tid, 32 * CW);
    return;
  }

  store_warp_rows<NTO, D, DT>(p, rt, hk, split, r0, g, t4, o, sm);
#else
  // Built for an architecture without these instructions: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_GQA_ROLES_KERNEL_CUH_
