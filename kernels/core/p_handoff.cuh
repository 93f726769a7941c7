// The hand-off of P from the S warps to the O warps of the MLA warp-role
// kernels (kernels/mla_split_kernel.cuh, kernels/mla_cluster_kernel.cuh): two
// P buffers in shared memory (bf16, with the rows' rescale factors beside),
// buffer b = visit % 2, each guarded by two named barriers: full_p + b (the S
// warps wrote it) and empty_p + b (the O warps are done with it).
//
// publish_p: an S warp's 16 rows of P for visit i, written once the O warps
// released buffer b (its last use). finish_s_role: after the loop, an S warp
// of a kernel whose S warps publish every visit waits for the O warps' last
// two releases and leaves its rows' running max and sum for the epilogue
// (write_row_stats; the cluster kernel's two S groups each drain their own
// buffer and the group of the last visit writes).
//
// o_role_loop: the O warps' KV loop. A warp owns all MT x 16 rows of the CTA
// and NTO x 8 value columns from col0. Per KV tile (visit i, stage i % STAGES,
// P buffer b): wait until the S warps wrote P (named barrier full_p + b),
// wait on the stage's `full` mbarrier (its copies completed before the S warps
// passed it; waiting makes them visible to these warps too, and the stage cannot
// refill before they release it), rescale O by the rows' factors the S warps
// left in alpha[b], O += P V with V the stage's first columns (the value part of
// the MLA K row), then release the stage and P.
#ifndef VERIFY_ATTN_CORE_P_HANDOFF_CUH_
#define VERIFY_ATTN_CORE_P_HANDOFF_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"
#include "kernels/core/scores.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

// p_rows: row g of the warp's 16 rows in buffer b (row stride PS); alpha_rows:
// the warp's 16 factors in buffer b. writer: whether this warp writes (of two
// warps holding the same scores, one does); every S warp arrives on full_p + b.
// s: the thread's P fragments (rows g, g + 8), stored as DT pairs.
template <int NT, int PS, typename DT>
__device__ __forceinline__ void publish_p(const float (&s)[NT][4], const float (&alpha)[2], DT* p_rows,
                                          float* alpha_rows, int g, int t4, bool writer, int b, int full_p,
                                          int empty_p, int threads) {
  sm90::named_barrier_sync(empty_p + b, threads);  // the O warps are done with P[b]'s last use
  if (writer) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      *reinterpret_cast<uint32_t*>(p_rows + j * 8) = DTypeTraits<DT>::pack(s[j][0], s[j][1]);
      *reinterpret_cast<uint32_t*>(p_rows + 8 * PS + j * 8) = DTypeTraits<DT>::pack(s[j][2], s[j][3]);
    }
    if (t4 == 0) {
      alpha_rows[g] = alpha[0];
      alpha_rows[g + 8] = alpha[1];
    }
  }
  sm90::named_barrier_arrive(full_p + b, threads);
}

// stat: [2][M] (the rows' running max, then their sums); r16: the warp's
// first row; the quad's partial sums reduced here (every lane calls it).
__device__ __forceinline__ void write_row_stats(const OnlineSoftmaxRow (&sm)[2], float* stat, int M, int r16, int g,
                                                int t4, bool writer) {
  const float l0 = quad_sum(sm[0].l), l1 = quad_sum(sm[1].l);
  if (writer && t4 == 0) {
    stat[r16 + g] = sm[0].m;
    stat[r16 + g + 8] = sm[1].m;
    stat[M + r16 + g] = l0;
    stat[M + r16 + g + 8] = l1;
  }
}

// After the loop of S warps that publish every visit: wait for the O warps'
// last two releases (visits + 2 in all, two at the start) and leave the rows'
// running max and sum for the epilogue.
__device__ __forceinline__ void finish_s_role(const OnlineSoftmaxRow (&sm)[2], float* stat, int M, int r16, int g,
                                              int t4, bool writer, int visits, int empty_p, int threads) {
  sm90::named_barrier_sync(empty_p + (visits & 1), threads);
  sm90::named_barrier_sync(empty_p + ((visits + 1) & 1), threads);
  write_row_stats(sm, stat, M, r16, g, t4, writer);
}

// Shapes: sP [2][MT x 16][PS], sK [STAGES][N][KS], alpha [2][MT x 16]; o
// zeroed here. Both P buffers start free (this arrives on empty_p + 0 / 1 once);
// threads: the named barriers' count (S and O warps).
template <int MT, int NTO, int N, int STAGES, int KS, int PS, typename DT>
__device__ __forceinline__ void o_role_loop(float (&o)[MT][NTO][4], const DT* sP, const DT* sK, const float* alpha,
                                            uint64_t* full, uint64_t* empty, int visits, int col0, int lane,
                                            int full_p, int empty_p, int threads) {
  constexpr int M = MT * 16;
  const int g = lane >> 2;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int j = 0; j < NTO; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.f;
  sm90::named_barrier_arrive(empty_p, threads);
  sm90::named_barrier_arrive(empty_p + 1, threads);
  const DT* p_frag = sP + (lane & 15) * PS + (lane >> 4) * 8;
  const int v_frag_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * KS + col0 + (lane >> 4) * 8;
  for (int i = 0; i < visits; ++i) {
    const int st = i % STAGES, b = i & 1;
    sm90::named_barrier_sync(full_p + b, threads);
    sm90::mbar_wait(full + st, static_cast<uint32_t>((i / STAGES) & 1));
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const float a2[2] = {alpha[b * M + mi * 16 + g], alpha[b * M + mi * 16 + g + 8]};
      rescale_rows<NTO>(o[mi], a2);
    }
    const DT* pb = p_frag + b * M * PS;
    const DT* vb = sK + st * N * KS + v_frag_off;
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], pb + mi * 16 * PS + kk * 16);
#pragma unroll
      for (int jj = 0; jj < NTO / 2; ++jj) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vb + kk * 16 * KS + jj * 16);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_m16n8k16<DT>(o[mi][2 * jj], a[mi], bv[0], bv[1]);
          mma_m16n8k16<DT>(o[mi][2 * jj + 1], a[mi], bv[2], bv[3]);
        }
      }
    }
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(empty + st);
    sm90::named_barrier_arrive(empty_p + b, threads);
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_P_HANDOFF_CUH_
