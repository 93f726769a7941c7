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
// Latency, not bandwidth, is what a merge of a few hundred rows costs, so the
// loads are scheduled for it: the splits' lse are read 32 at a time (lane l:
// splits l, l + 32, ...) and reduced across the warp; the partial rows of
// kBatch splits are in flight at once, the last batch predicated rather than
// split by split, and the first batch's loads go out before the lse's (they
// do not depend on them): a loop that waits one load latency per split
// costs the split count times that latency, while the kBatch splits in
// flight together share one. The sums run split by split in order whatever
// the batching. A split that saw nothing (lse -inf) is skipped: its O is
// never multiplied in.
template <int DV, int kBatch>
__device__ __forceinline__ void load_partials(float2 (&x)[kBatch][DV / 64], const float* o,
                                              int64_t stride, int n) {
#pragma unroll
  for (int b = 0; b < kBatch; ++b)
#pragma unroll
    for (int i = 0; i < DV / 64; ++i)
      if (b < n) x[b][i] = *reinterpret_cast<const float2*>(o + b * stride + 64 * i);
}

template <typename DT, int DV>
__device__ __forceinline__ void merge_row(const float* __restrict__ ws_o,
                                          const float* __restrict__ ws_lse, int64_t row,
                                          int64_t rows, int splits, int first, DT* __restrict__ out_row,
                                          float* lse_out, int lane) {
  static_assert(DV % 64 == 0, "merge: DV must be a multiple of 64");
  constexpr int kIters = DV / 64;
  constexpr int kBatch = DV >= 256 ? 4 : 8;  // splits whose partial rows are loaded together
  constexpr unsigned kAll = 0xffffffffu;
  const int64_t stride = rows * DV;  // from one split's partial row to the next's
  // This lane's columns of split 0's partial row, and the first batch: of the
  // `first` splits most rows have (balanced splits: a row may have up to
  // `splits`, most have the plan's split count), so that the speculative loads
  // of a batch that cannot gain read no more than the plan's count. A short
  // request's rows may load slots it did not write (another call's rows, or
  // never-written memory: compute-sanitizer's initcheck reports those); only
  // the splits below `used` are summed.
  const float* o0 = ws_o + row * DV + 2 * lane;
  float2 x[kBatch][kIters];
  const int early = min(kBatch, min(first, splits));
  load_partials<DV, kBatch>(x, o0, stride, early);
  float L = -INFINITY;
  float v0 = -INFINITY;  // lane l's lse of split l (read once)
  bool nan = false;
  int used = 0;  // 1 + the last split that saw a column: the later ones are not loaded
  for (int s = lane; s < splits; s += 32) {
    const float v = ws_lse[s * rows + row];
    if (s == lane) v0 = v;
    nan |= isnan(v);
    L = fmaxf(L, v);
    if (v != -INFINITY) used = s + 1;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    L = fmaxf(L, __shfl_xor_sync(kAll, L, off));
    used = max(used, __shfl_xor_sync(kAll, used, off));
  }
  nan = __any_sync(kAll, nan);
  splits = used;
  float acc[kIters][2];
#pragma unroll
  for (int i = 0; i < kIters; ++i) acc[i][0] = acc[i][1] = 0.f;
  float wsum = 0.f;
  if (L != -INFINITY && !nan) {
    for (int s0 = 0; s0 < splits; s0 += 32) {
      // Lane l's weight w = exp(lse - L) of split s0 + l; -1 marks an empty
      // split (skipped below) or none.
      float w_lane = -1.f;
      if (s0 + lane < splits) {
        const float v = s0 == 0 ? v0 : ws_lse[(s0 + lane) * rows + row];
        if (v != -INFINITY) w_lane = __expf(v - L);
      }
      wsum += fmaxf(w_lane, 0.f);
      const int n = min(32, splits - s0);
      for (int j = 0; j < n; j += kBatch) {
        // The first batch is in flight already unless it held fewer splits
        // than this row has (a balanced row past `first`).
        if (s0 + j > 0 || early < min(kBatch, n))
          load_partials<DV, kBatch>(x, o0 + (s0 + j) * stride, stride, n - j);
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          if (j + b >= n) break;  // warp-uniform
          const float w = __shfl_sync(kAll, w_lane, j + b);
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            acc[i][0] += w < 0.f ? 0.f : w * x[b][i].x;
            acc[i][1] += w < 0.f ? 0.f : w * x[b][i].y;
          }
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(kAll, wsum, off);
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
