// Attention over the flat KV layout: attention_kernel with FlatLoader.
#include "kernels/launch_attention.cuh"
#include "kernels/loaders/flat_loader.cuh"

namespace verify_attn {

va_status launch_flat(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  return launch_attention<FlatLoader>(kp, plan, dtype, stream);
}

}  // namespace verify_attn
