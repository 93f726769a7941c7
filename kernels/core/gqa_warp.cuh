// The pieces of a GQA / MHA consumer warp that the warp-role kernels share
// (kernels/gqa_roles_kernel.cuh: 16 rows per warp, Q in registers;
// kernels/gqa_roles_r32_kernel.cuh: 32 rows per warp, Q in shared memory), in
// the mma.sync fragment layout of kernels/core/mma.cuh (lane = 4 g + t4):
// a 16-row slice's Q fragments from global memory, the ldmatrix lane offsets
// of K and V tiles, the scores turned into the A operand of P V, and the
// slice's rows normalized and stored.
#ifndef VERIFY_ATTN_CORE_GQA_WARP_CUH_
#define VERIFY_ATTN_CORE_GQA_WARP_CUH_

#include <stdint.h>

#include "kernels/core/epilogue.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"

namespace verify_attn {

// The A-operand fragments of Q for the 16 folded rows from r0, every k16 step
// of the KT x 16 dims: this lane's rows g and g + 8 (rows[0], rows[1]: their
// masks), straight from global memory; zeros for rows past the request.
template <int KT, typename DT>
__device__ __forceinline__ void load_q_fragments(const KernelParams& p, const RequestTile& rt, int hk, int r0,
                                                 int g, int t4, uint32_t (&q)[KT][4], RowMask (&rows)[2]) {
  const DT* gq = static_cast<const DT*>(p.q);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = r0 + g + 8 * h;
    rows[h] = row_mask(p, rt, gr);
    const DT* qrow = gq + (rows[h].valid ? q_row_offset(p, rt, hk, gr) : 0) + 2 * t4;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        q[kk][h + 2 * c] = rows[h].valid ? __ldg(reinterpret_cast<const unsigned int*>(qrow + kk * 16 + 8 * c)) : 0u;
  }
}

// ldmatrix lane offsets (elements) in a tile of rows `stride` elements apart:
// K rows as the B operand of two n8 tiles x one k16 step (ldmatrix.x4), V by
// the transposing load as two n8 value tiles of one k16 step (ldmatrix.x4.trans).
__device__ __forceinline__ int k_fragment_offset(int lane, int stride) {
  return ((lane & 7) + ((lane >> 4) << 3)) * stride + ((lane >> 3) & 1) * 8;
}
__device__ __forceinline__ int v_fragment_offset(int lane, int stride) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * stride + (lane >> 4) * 8;
}

// P as the A operand of m16n8k16: k16 step kk holds score tiles 2 kk
// (registers 0, 1) and 2 kk + 1 (registers 2, 3).
template <int NT, typename DT>
__device__ __forceinline__ void scores_to_a_operand(const float (&s)[NT][4], uint32_t (&pa)[NT / 2][4]) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    pa[j / 2][(j & 1) * 2] = DTypeTraits<DT>::pack(s[j][0], s[j][1]);
    pa[j / 2][(j & 1) * 2 + 1] = DTypeTraits<DT>::pack(s[j][2], s[j][3]);
  }
}

// Fragment row h (0: g, 1: g + 8) of a warp's O (every value column, NTO n8
// tiles of a D-wide row), the request's folded row gr, normalized by its sum
// l (over the whole row) and scaled by v_scale (1 but for an fp8 cache, whose
// V is v_scale x the stored values: one factor per row, as the products are
// linear in V), stored with its lse (m: the row's running max); nothing past
// the request.
template <int NTO, int D, typename DT>
__device__ __forceinline__ void store_warp_row(const KernelParams& p, const RequestTile& rt, int hk, int split,
                                               int gr, int t4, const float (&o)[NTO][4], int h, float m, float l) {
  if (gr >= rt.R) return;
  const float inv = l > 0.f ? p.v_scale / l : 0.f;
  const FoldedRow fr = folded_row(rt.q_start, hk, p.group, gr);
  store_out_row<NTO, D, DT>(p, split, fr, 2 * t4, o, h, inv, OnlineSoftmaxRow::lse(m, l), t4 == 0);
  // Balanced splits: the request's first split marks the row's workspace
  // slots past its splits empty (lse -inf: the merge skips them), which may
  // hold another call's rows.
  if (p.split_units > 0 && split == 0 && t4 == 0)
    for (int s = rt.splits; s < p.num_splits; ++s)
      p.ws_lse[workspace_row(s, p.ws_rows, fr.token, p.num_qo_heads, fr.head)] = -INFINITY;
}

// The 16 folded rows from r0 of a warp's O, store_warp_row's, with their
// sums reduced here from the quad's partial sums in sm (every lane of the
// warp calls it).
template <int NTO, int D, typename DT>
__device__ __forceinline__ void store_warp_rows(const KernelParams& p, const RequestTile& rt, int hk, int split,
                                                int r0, int g, int t4, const float (&o)[NTO][4],
                                                const OnlineSoftmaxRow (&sm)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(sm[h].l);
    store_warp_row<NTO, D, DT>(p, rt, hk, split, r0 + g + 8 * h, t4, o, h, sm[h].m, l);
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_GQA_WARP_CUH_
