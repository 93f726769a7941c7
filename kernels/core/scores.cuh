// A warp's score fragments between Q K^T and the online softmax: scaled to
// base-2 logits, masked where the KV tile reaches the drafts or the end of the
// request (kernels/core/mask.cuh; other tiles skip the tests), and each
// fragment row's max over the warp's columns, reduced over the quad of lanes
// that share the row. Fragment layout of kernels/core/mma.cuh: s[j][e] is row
// g (e < 2) or g + 8 (e >= 2), column col0 + 8 j + 2 t4 + (e & 1) of the tile.
#ifndef VERIFY_ATTN_CORE_SCORES_CUH_
#define VERIFY_ATTN_CORE_SCORES_CUH_

#include <math.h>

#include "kernels/core/mask.cuh"
#include "kernels/core/softmax.cuh"

namespace verify_attn {

// j0: the tile's first KV row, tile_n its rows (what tile_needs_mask judges);
// col0: the warp's first column in the tile; rows: the thread's two fragment rows.
template <int NT>
__device__ __forceinline__ void scale_mask_row_max(float (&s)[NT][4], const RequestMask& rmask,
                                                   const RowMask (&rows)[2], int j0, int tile_n, int col0,
                                                   int t4, float scale_log2, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
  if (rmask.tile_needs_mask(j0, tile_n)) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j0 + col0 + j * 8 + 2 * t4 + (e & 1);
        float x = s[j][e] * scale_log2;
        if (!rmask.visible(rows[e >> 1], col)) x = -INFINITY;
        s[j][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
  } else {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] *= scale_log2;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
      }
  }
  mx[0] = quad_max(mx[0]);
  mx[1] = quad_max(mx[1]);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_SCORES_CUH_
