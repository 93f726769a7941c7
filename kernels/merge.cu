// Split-K merge launch (layout independent): merge_kernel per dtype x Dv.
#include <cuda_runtime.h>

#include "kernels/attention_kernel.cuh"
#include "kernels/launch.h"
#include "kernels/pdl_launch.h"
#include "kernels/status.h"

namespace verify_attn {
namespace {

// pdl: launched as a programmatic dependent of the attention kernel before it
// (sm_90+): its CTAs wait in grid_dependency_wait() for the workspace.
template <typename DT>
va_status launch_merge_t(const KernelParams& kp, int dv, bool pdl, cudaStream_t stream) {
  const int64_t blocks = (kp.ws_rows + 3) / 4;
  if (blocks <= 0) return VA_OK;
  if (blocks > 0x7fffffff)
    return va_fail(VA_ERR_UNSUPPORTED, "total_q: too many output rows for the merge grid");
  const dim3 grid(static_cast<unsigned>(blocks));
  cudaError_t e = cudaSuccess;
  switch (dv) {
    case 64: e = launch_maybe_pdl(pdl, merge_kernel<DT, 64>, grid, 128, 0, stream, dim3(1, 1, 1), kp); break;
    case 128: e = launch_maybe_pdl(pdl, merge_kernel<DT, 128>, grid, 128, 0, stream, dim3(1, 1, 1), kp); break;
    case 256: e = launch_maybe_pdl(pdl, merge_kernel<DT, 256>, grid, 128, 0, stream, dim3(1, 1, 1), kp); break;
    case 512: e = launch_maybe_pdl(pdl, merge_kernel<DT, 512>, grid, 128, 0, stream, dim3(1, 1, 1), kp); break;
    default:
      return va_fail(VA_ERR_UNSUPPORTED, "head_dim_vo: no merge kernel for %d", dv);
  }
  if (e != cudaSuccess) cudaGetLastError();  // not sticky: the check below reports it
  return va_check_cuda(e != cudaSuccess ? e : cudaGetLastError(), "merge_kernel launch");
}

}  // namespace

va_status launch_merge(const KernelParams& kp, const Plan& plan, int dtype, int head_dim_vo,
                       void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool pdl = plan.dev.sm_arch >= 90;
  if (dtype == VA_DTYPE_BF16) return launch_merge_t<__nv_bfloat16>(kp, head_dim_vo, pdl, s);
  return launch_merge_t<half>(kp, head_dim_vo, pdl, s);
}

}  // namespace verify_attn
