// Split-K merge of partial attention states with natural-log LSEs.
//
// Split s produced, for one output row, a normalized partial O_s (fp32) and
// lse_s = ln(sum over its columns of exp(logit)) (-inf if it saw nothing).
// The exact result is (FlashDecoding / FlashAttention "combine", also
// FlashInfer cascade.cuh merge_state, there in base 2):
//   L = max_s lse_s,  w_s = exp(lse_s - L),
//   O = sum_s w_s O_s / sum_s w_s,  lse = L + ln(sum_s w_s).
// If every split is empty (L = -inf): O = 0, lse = -inf. A NaN lse (request
// with kv_len < q_len, flagged by the main kernel) makes the row NaN.
#ifndef VERIFY_ATTN_CORE_MERGE_CUH_
#define VERIFY_ATTN_CORE_MERGE_CUH_

#include <math.h>
#include <stdint.h>

#include "kernels/core/types.cuh"

namespace verify_attn {

// One warp merges one row of DV columns; lane handles columns 2*lane + 64*i.
//   ws_o:   [splits][rows][DV] fp32, ws_lse: [splits][rows] fp32
template <typename DT, int DV>
__device__ __forceinline__ void merge_row(const float* __restrict__ ws_o,
                                          const float* __restrict__ ws_lse, int64_t row,
                                          int64_t rows, int splits, DT* __restrict__ out_row,
                                          float* lse_out, int lane) {
  static_assert(DV % 64 == 0, "merge: DV must be a multiple of 64");
  constexpr int kIters = DV / 64;
  float L = -INFINITY;
  bool nan = false;
  for (int s = 0; s < splits; ++s) {
    const float v = ws_lse[s * rows + row];
    nan |= isnan(v);
    L = fmaxf(L, v);
  }
  float acc[kIters][2];
#pragma unroll
  for (int i = 0; i < kIters; ++i) acc[i][0] = acc[i][1] = 0.f;
  float wsum = 0.f;
  if (L != -INFINITY && !nan) {
    for (int s = 0; s < splits; ++s) {
      const float v = ws_lse[s * rows + row];
      if (v == -INFINITY) continue;
      const float w = __expf(v - L);
      wsum += w;
      const float* o = ws_o + (s * rows + row) * DV;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const float2 x = *reinterpret_cast<const float2*>(o + 2 * lane + 64 * i);
        acc[i][0] += w * x.x;
        acc[i][1] += w * x.y;
      }
    }
  }
  float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  float lse = wsum > 0.f ? L + logf(wsum) : -INFINITY;
  if (nan) {
    inv = NAN;
    lse = NAN;
  }
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const uint32_t packed = DTypeTraits<DT>::pack(acc[i][0] * inv, acc[i][1] * inv);
    *reinterpret_cast<uint32_t*>(out_row + 2 * lane + 64 * i) = packed;
  }
  if (lse_out != nullptr && lane == 0) *lse_out = lse;
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_MERGE_CUH_
