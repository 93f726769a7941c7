// Split-K merge launch (layout independent): merge_kernel per dtype x Dv.
#include <cuda_runtime.h>

#include "kernels/attention_kernel.cuh"
#include "kernels/launch.h"
#include "kernels/status.h"

namespace verify_attn {
namespace {

template <typename DT>
va_status launch_merge_t(const KernelParams& kp, int dv, cudaStream_t stream) {
  const int64_t blocks = (kp.ws_rows + 3) / 4;
  if (blocks <= 0) return VA_OK;
  if (blocks > 0x7fffffff)
    return va_fail(VA_ERR_UNSUPPORTED, "total_q: too many output rows for the merge grid");
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (dv) {
    case 64: merge_kernel<DT, 64><<<grid, 128, 0, stream>>>(kp); break;
    case 128: merge_kernel<DT, 128><<<grid, 128, 0, stream>>>(kp); break;
    case 256: merge_kernel<DT, 256><<<grid, 128, 0, stream>>>(kp); break;
    case 512: merge_kernel<DT, 512><<<grid, 128, 0, stream>>>(kp); break;
    default:
      return va_fail(VA_ERR_UNSUPPORTED, "head_dim_vo: no merge kernel for %d", dv);
  }
  return va_check_cuda(cudaGetLastError(), "merge_kernel launch");
}

}  // namespace

va_status launch_merge(const KernelParams& kp, const Plan& plan, int dtype, int head_dim_vo,
                       void* stream) {
  (void)plan;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == VA_DTYPE_BF16) return launch_merge_t<__nv_bfloat16>(kp, head_dim_vo, s);
  return launch_merge_t<half>(kp, head_dim_vo, s);
}

}  // namespace verify_attn
