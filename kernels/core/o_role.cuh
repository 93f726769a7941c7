// The O warps' KV loop of the MLA warp-role kernels (kernels/mla_split_kernel.cuh,
// kernels/mla_cluster_kernel.cuh): a warp owns all MT x 16 rows of the CTA and
// NTO x 8 value columns from col0. Per KV tile (visit i, stage i % STAGES, P
// buffer i % 2): wait until the S warps wrote P (named barrier full_p + b),
// wait on the stage's `full` mbarrier (its copies completed before the S warps
// passed it; waiting makes them visible to these warps too, and the stage cannot
// refill before they release it), rescale O by the rows' factors the S warps
// left in alpha[b], O += P V with V the stage's first columns (the value part of
// the MLA K row), then release the stage and P.
#ifndef VERIFY_ATTN_CORE_O_ROLE_CUH_
#define VERIFY_ATTN_CORE_O_ROLE_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"
#include "kernels/core/scores.cuh"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

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

#endif  // VERIFY_ATTN_CORE_O_ROLE_CUH_
