// A finished row of O leaving a kernel: one thread's columns of one folded
// row, normalized, to the output (bf16 / fp16) when the row tile is unsplit,
// else to its split's fp32 workspace row for merge_kernel
// (kernels/core/merge.cuh); the natural-log lse beside it. A pair of splits
// (kernels/core/pair_combine.cuh) stores its combined rows to the output. Shared by the
// portable kernels (mma.sync fragment layout, kernels/core/mma.cuh).
#ifndef VERIFY_ATTN_CORE_EPILOGUE_CUH_
#define VERIFY_ATTN_CORE_EPILOGUE_CUH_

#include <stdint.h>

#include "kernels/core/request.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/plan.h"

namespace verify_attn {

// o[j][2 h], o[j][2 h + 1]: the thread's values of fragment row h (0: g,
// 1: g + 8) in n8 tile j, at value columns col + 8 j and col + 8 j + 1 of the
// DV-wide row fr; times inv (1 / row sum). write_lse: this thread writes the
// row's lse (one thread per row).
template <int NTO, int DV, typename DT>
__device__ __forceinline__ void store_out_row(const KernelParams& p, int split, const FoldedRow& fr, int col,
                                              const float (&o)[NTO][4], int h, float inv, float lse,
                                              bool write_lse) {
  if (p.num_splits == 1 || p.pair_splits) {
    DT* orow = static_cast<DT*>(p.out) + fr.token * p.out_stride_token + fr.head * p.out_stride_head + col;
#pragma unroll
    for (int j = 0; j < NTO; ++j)
      *reinterpret_cast<uint32_t*>(orow + j * 8) = DTypeTraits<DT>::pack(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    if (p.lse != nullptr && write_lse) p.lse[fr.token * p.lse_stride_token + fr.head * p.lse_stride_head] = lse;
  } else {
    const int64_t wrow = workspace_row(split, p.ws_rows, fr.token, p.num_qo_heads, fr.head);
    float* orow = p.ws_o + wrow * DV + col;
#pragma unroll
    for (int j = 0; j < NTO; ++j)
      *reinterpret_cast<float2*>(orow + j * 8) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    if (write_lse) p.ws_lse[wrow] = lse;
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_EPILOGUE_CUH_
