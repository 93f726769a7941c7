// The portable GQA / MHA kernel (head_dim 64 / 128) by warp roles with 32
// folded rows per consumer warp, for mma.sync (kernels/plan.h,
// TileShapeRolesGqaR32, says the shape and the shared-memory layout;
// docs/design_portable.md, "The warp-role GQA kernel", the measurement of
// tools/dev/microbench/gqa_core.cu behind it).
//
// Grid and prologue as every kernel (kernels/core/request.cuh): a CTA owns M
// = 32 x (consumer warps) folded rows (token-major, the group's heads
// fastest) of one (request, KV head) and the KV tiles of its split. One K
// buffer and one V buffer, each with a `full` and an `empty` mbarrier; per KV
// tile i (phase parity i & 1):
//   load warps      resolve their row of the tile (zero rows past kv_len or at
//                   a bad index, which is flagged), wait until the K buffer is
//                   released, gather K with cp.async completing on K's `full`,
//                   then the same for V; from an fp8 cache (KvFp8 shapes) each
//                   thread reads its part of the row into registers before
//                   the wait, then converts and stores it
//                   (kernels/loaders/fp8_rows.cuh) and arrives on `full`;
//   consumer warps  each 32 rows x every column of the tile (two m16 tiles,
//                   each K / V fragment feeding both): wait K's `full`, S =
//                   Q K^T with Q re-read from shared memory (fragment order,
//                   one 16-byte ld.shared per m16 tile and k-step), release K
//                   (the next tile's K lands under this tile's softmax and
//                   P V), scale and mask, the online softmax reduced within the
//                   quad of lanes that holds a row (each of the quad's four
//                   rows' running max and sum kept by one of its lanes:
//                   QuadSoftmaxRows), P from the score accumulators to the A
//                   operand of O += P V in registers, wait V's `full`, P V,
//                   release V (the next V lands under the next Q K^T).
// A consumer warp whose rows all lie past the request skips the loop (the
// empty barriers count only the warps with rows). After the loop the
// consumers normalize and store O (or the split's partial O and lse; times
// v_scale for an fp8 cache) once the load warps are done (the bad-index flag).
#ifndef VERIFY_ATTN_GQA_ROLES_R32_KERNEL_CUH_
#define VERIFY_ATTN_GQA_ROLES_R32_KERNEL_CUH_

#include <stdint.h>

#include "kernels/core/gqa_warp.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
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
__global__ void __launch_bounds__(Shape::kThreads, 1) gqa_roles_r32_kernel(const KernelParams p) {
#if VA_ARCH_SPECIFIC_BODY
  using sm90::mbar_arrive;
  using sm90::mbar_wait;
  constexpr int M = Shape::kM, N = Shape::kN, D = Shape::kDqk;
  constexpr int KS = Shape::kKStride;  // K and V rows (elements)
  constexpr int CW = Shape::kConsumerWarps, LW = Shape::kLoadWarps;
  constexpr int MT = Shape::kRowsPerWarp / 16;  // m16 tiles of a consumer warp
  constexpr int NT = N / 8;                     // n8 score tiles of a warp (every column of the tile)
  constexpr int KT = D / 16;                    // k16 steps of Q K^T
  constexpr int NTO = D / 8;                    // n8 output tiles of a warp (every value column)
  static_assert(MT == 2 && M == 16 * MT * CW && N % 16 == 0 && NT % 2 == 0 && NTO % 2 == 0, "tile shape");
  constexpr int kDone = 1;  // named barrier (0 is __syncthreads)
  constexpr int kK = 0, kV = 1;  // the buffers' barriers: full[kK], empty[kK], full[kV], empty[kV]
  constexpr bool kFp8 = IsKvFp8<Shape>::value;  // the cache holds e4m3 (kernels/loaders/fp8_rows.cuh)

  extern __shared__ __align__(16) unsigned char smem[];
  uint4* sQ = reinterpret_cast<uint4*>(smem);                              // [CW][MT][KT][32 lanes] fragments
  DT* sK = reinterpret_cast<DT*>(smem + Shape::kQBytes);                   // [N][KS]
  DT* sV = reinterpret_cast<DT*>(smem + Shape::kQBytes + Shape::kKBytes);  // [N][KS]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Shape::kQBytes + Shape::kKBytes + Shape::kVBytes);  // [2]
  uint64_t* empty = full + 2;                                              // [2]
  __shared__ int s_bad_kv;  // a KV row of this CTA had a bad index: its rows become NaN

  __shared__ RequestTile s_rt;
  // setmaxnreg: what the load warpgroup gives back covers what the consumers
  // take from the 65536 / 384 -> 168 registers per thread the CTA enters with,
  // else setmaxnreg.inc waits forever (tools/checks/cubin_archs_test.py checks
  // the 168). 32 rows of O and S per warp need more than 224.
  static_assert(Shape::kThreads == 384 && LW == 4 && CW % 4 == 0 &&
                    32 * LW * Shape::kLoadRegs + 32 * CW * Shape::kConsumerRegs <= Shape::kThreads * 168,
                "setmaxnreg budget");

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  if (!role_prologue<Shape, DT, Loader, 2, 16 * MT>(p, &s_rt, &s_bad_kv, full, empty, 32 * LW, CW)) return;

  if (warp >= CW) {
    // ------------------------------------------------------------ load warps
    sm90::regs_dealloc<Shape::kLoadRegs>();
    const RequestTile rt = s_rt;
    const Loader loader(p, role_request<Shape>(p, rt), cta_coord<Shape::kRowsGrid>(p).hk);
    const int visits = rt.tile_end - rt.tile_begin;
    const int lt = tid - 32 * CW;
    // Each thread copies its part of one row of every tile (32 x LW threads,
    // N rows): it resolves the row's address (for a paged cache, a kv_indices
    // load) before waiting for the K buffer (an fp8 cache's), or a tile ahead
    // (a q-dtype cache's), so that the load's latency overlaps the wait.
    static_assert((32 * LW) % N == 0, "one row per load thread and tile");
    constexpr int kTpr = 32 * LW / N;  // threads per row
    const int row = lt / kTpr;
    if constexpr (kFp8) {
      // fp8: a thread holds at most two 16-byte chunks of a row (the load
      // warpgroup's 40 registers; a D128 share of four spills beside the
      // paged loader's state), so the tile's rows go in kPasses passes of
      // kRows rows, kTprP threads per row. The first pass's chunks are read
      // before the buffer's wait (the read overlaps it), converted into the
      // free buffer after it; then the other passes; then the same for V.
      const uint8_t* gk = static_cast<const uint8_t*>(p.k);
      const uint8_t* gv = static_cast<const uint8_t*>(p.v);
      constexpr int kShare = D / 16 / kTpr;                  // chunks of a row per thread in one pass
      constexpr int kPasses = kShare > 2 ? kShare / 2 : 1;
      constexpr int kRows = N / kPasses;
      constexpr int kTprP = 32 * LW / kRows;
      static_assert(N % kPasses == 0 && (32 * LW) % kRows == 0 && D / 16 / kTprP <= 2, "fp8 passes");
      const int prow = lt / kTprP, psub = lt % kTprP;
      for (int i = 0; i < visits; ++i) {
        const uint32_t released = static_cast<uint32_t>(i & 1) ^ 1u;  // parity of tile i - 1's release
        const KvTileRows<Loader> rows_of{loader, (rt.tile_begin + i) * N, rt.kv_len, &s_bad_kv};
        int64_t k_off = 0, v_off = 0;
        const bool ok = rows_of(prow, &k_off, &v_off);
        // One buffer (kK or kV) of tile i: the first pass's row read before the
        // buffer's wait, the later passes' rows read and stored one at a time,
        // then the release arrive on its `full` (the stores before the consumers' reads).
        // The later passes' rows are resolved again for V: keeping their
        // offsets from K's passes would take registers these warps lack.
        auto convert = [&](int buf, const uint8_t* g, DT* s, int64_t first_off) {
          Fp8RowChunks<D / 16 / kTprP, kTprP> c;
          c.load(g + first_off, ok, psub);
          if (i > 0) mbar_wait(empty + buf, released);
          c.store(s + prow * KS, psub);
#pragma unroll
          for (int pass = 1; pass < kPasses; ++pass) {
            int64_t ko = 0, vo = 0;
            const bool okp = rows_of(prow + pass * kRows, &ko, &vo);
            c.load(g + (buf == kK ? ko : vo), okp, psub);
            c.store(s + (prow + pass * kRows) * KS, psub);
          }
          mbar_arrive(full + buf);
        };
        convert(kK, gk, sK, k_off);
        convert(kV, gv, sV, v_off);
      }
      sm90::named_barrier_arrive(kDone, Shape::kThreads);
      return;
    }
    const DT* gk = static_cast<const DT*>(p.k);
    const DT* gv = static_cast<const DT*>(p.v);
    auto rows_of = [&](int i) { return KvTileRows<Loader>{loader, (rt.tile_begin + i) * N, rt.kv_len, &s_bad_kv}; };
    RowsAhead<decltype(rows_of)> ahead(rows_of, row, visits);  // the row's lookup a tile ahead
    for (int i = 0; i < visits; ++i) {
      const uint32_t released = static_cast<uint32_t>(i & 1) ^ 1u;  // parity of tile i - 1's release
      const ResolvedRow r = ahead.take(i);
      if (i > 0) mbar_wait(empty + kK, released);
      copy_resolved_rows_lines<N, 32 * LW, D, KS>(sK, gk, r.k_off, r.ok, lt);
      sm90::cp_async_arrive_noinc(full + kK);
      if (i > 0) mbar_wait(empty + kV, released);
      copy_resolved_rows_lines<N, 32 * LW, D, KS>(sV, gv, r.v_off, r.ok, lt);
      sm90::cp_async_arrive_noinc(full + kV);
    }
    // These copies complete on `full`, never on a commit group: commit them so
    // that cp.async.wait_group waits for them before the thread exits.
    cp_async_commit();
    cp_async_wait<0>();
    sm90::named_barrier_arrive(kDone, Shape::kThreads);
    return;
  }

  // ------------------------------------------------------------ consumer warps
  sm90::regs_alloc<Shape::kConsumerRegs>();
  // 32 rows of S and O leave no register to spare: the request tile's fields
  // are read from s_rt where they are used (the loop bound, each tile's mask
  // bounds, the rows' masks of a masked tile, the epilogue), not held in
  // registers across the loop (the mbarrier waits and arrivals clobber
  // memory, so each use reloads them).
  const int wr0 = warp * 16 * MT;  // the warp's first row in the CTA's; m16 tile mi from wr0 + 16 mi
  // The warp's KV tiles: none for a warp whose 32 rows are all past the
  // request (short requests: q_len x group under M). Such a warp never
  // touches the ring (the empty barriers count only the warps with rows:
  // role_prologue's kReaderRows) and goes through the rest with nothing to
  // compute or store, without a branch of its own (an early exit, or a
  // per-tile skip in the loop, costs the compute loop registers).
  auto warp_tiles = [&] { return s_rt.row0 + wr0 < s_rt.R ? s_rt.tile_end - s_rt.tile_begin : 0; };

  // This lane's Q fragments (A operand, zeros for rows past the request),
  // from global memory once, into the warp's part of sQ in fragment order:
  // fragment (mi, kk) at q_frag[(mi * KT + kk) * 32]. Only this lane reads
  // what it writes there.
  uint4* q_frag = sQ + warp * MT * KT * 32 + lane;
  {
    const RequestTile rt = s_rt;
    const int hk = cta_coord<Shape::kRowsGrid>(p).hk;
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      uint32_t q[KT][4];
      RowMask rows[2];
      load_q_fragments<KT, DT>(p, rt, hk, rt.row0 + wr0 + 16 * mi, g, t4, q, rows);
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) sts_128(q_frag + (mi * KT + kk) * 32, q[kk]);
    }
  }
  QuadSoftmaxRows sm;  // rows r = 2 mi + h of the quad, row t4 in this lane
  sm.init();
  float o[MT][NTO][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int j = 0; j < NTO; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.f;
  const DT* kb = sK + k_fragment_offset(lane, KS);
  const DT* vb = sV + v_fragment_offset(lane, KS);

  for (int i = 0; i < warp_tiles(); ++i) {
    const uint32_t parity = static_cast<uint32_t>(i & 1);
    mbar_wait(full + kK, parity);

    // ---- S = Q K^T over the whole tile, both m16 tiles per K fragment ----
    float s[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int j = 0; j < NT; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) lds_128(qa[mi], q_frag + (mi * KT + kk) * 32);
#pragma unroll
      for (int pp = 0; pp < NT / 2; ++pp) {
        uint32_t b[4];
        ldmatrix_x4(b, kb + pp * 16 * KS + kk * 16);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_m16n8k16<DT>(s[mi][2 * pp], qa[mi], b[0], b[1]);
          mma_m16n8k16<DT>(s[mi][2 * pp + 1], qa[mi], b[2], b[3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + kK);  // this warp's reads of K are done: the next K may land

    // ---- mask (draft / boundary tiles only), online softmax ----
    const int j0 = (s_rt.tile_begin + i) * N;
    const RequestMask rmask{s_rt.kv_len, s_rt.prefix, p.mask_words, p.causal != 0};
    uint32_t pa[MT][N / 16][4];
    float alpha[MT][2], rowsum[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      float mx[2];
      scale_mask_row_max_bits<NT>(
          s[mi], rmask, [&](int h) { return row_mask(p, s_rt, s_rt.row0 + wr0 + 16 * mi + g + 8 * h); }, j0, t4,
          p.scale_log2, mx);
      softmax_tile_quad<NT>(s[mi], sm, mi, t4, mx, p.scale_log2, alpha[mi], rowsum[mi]);
      scores_to_a_operand<NT, DT>(s[mi], pa[mi]);
      rescale_rows<NTO>(o[mi], alpha[mi]);
    }
    quad_fold_sums(sm, t4, {alpha[0][0], alpha[0][1], alpha[1][0], alpha[1][1]},
                   {rowsum[0][0], rowsum[0][1], rowsum[1][0], rowsum[1][1]});

    // ---- O += P V, both m16 tiles per V fragment ----
    mbar_wait(full + kV, parity);
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < NTO / 2; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + kk * 16 * KS + jj * 16);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_m16n8k16<DT>(o[mi][2 * jj], pa[mi][kk], b[0], b[1]);
          mma_m16n8k16<DT>(o[mi][2 * jj + 1], pa[mi][kk], b[2], b[3]);
        }
      }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + kV);  // this warp's reads of V are done: the next V may land
  }

  sm90::named_barrier_sync(kDone, Shape::kThreads);  // the load warps' s_bad_kv is visible
  const RequestTile rt = s_rt;
  const int hk = cta_coord<Shape::kRowsGrid>(p).hk, split = rt.split;
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, rt.q_start, rt.R, rt.row0, hk, split, tid, 32 * CW);
    return;
  }
  // ---- normalize and store ----
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      store_warp_row<NTO, D, DT>(p, rt, hk, split, rt.row0 + wr0 + 16 * mi + g + 8 * h, t4, o[mi], h,
                                 sm.max_of(2 * mi + h), sm.sum_of(2 * mi + h));
#else
  // Built for an architecture without these instructions: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_GQA_ROLES_R32_KERNEL_CUH_
