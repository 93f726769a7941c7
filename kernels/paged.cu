// Attention over the paged KV layout: attention_kernel with PagedLoader.
#include "kernels/launch_attention.cuh"
#include "kernels/loaders/paged_loader.cuh"

namespace verify_attn {

va_status launch_paged(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  return launch_attention<PagedLoader>(kp, plan, dtype, stream);
}

}  // namespace verify_attn
