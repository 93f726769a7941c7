// Smoke kernel: y = scale * x over n fp16/bf16 elements. It exists to prove the
// toolchain end to end (nvcc -> C-ABI -> pybind11 -> Python -> GPU); the
// attention kernels are in flat.cu / paged.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/status.h"
#include "kernels/verify_attn.h"

namespace verify_attn {
namespace {

template <typename T>
__global__ void scaled_copy_kernel(const T* __restrict__ x, T* __restrict__ y,
                                   int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = static_cast<T>(static_cast<float>(x[i]) * scale);
  }
}

}  // namespace
}  // namespace verify_attn

extern "C" va_status va_scaled_copy(const void* x, void* y, int64_t n,
                                    float scale, int32_t dtype, void* stream) {
  using namespace verify_attn;
  if (n < 0) return va_fail(VA_ERR_INVALID_VALUE, "n: must be >= 0 (got %lld)", (long long)n);
  if (dtype != VA_DTYPE_FP16 && dtype != VA_DTYPE_BF16)
    return va_fail(VA_ERR_INVALID_DTYPE, "dtype: must be VA_DTYPE_FP16 or VA_DTYPE_BF16 (got %d)", dtype);
  if (n > 0 && x == nullptr) return va_fail(VA_ERR_NULL_POINTER, "x: NULL");
  if (n > 0 && y == nullptr) return va_fail(VA_ERR_NULL_POINTER, "y: NULL");
  int device = 0;
  va_status s = va_check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (s != VA_OK) return s;
  if (n == 0) return va_ok();
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  auto st = static_cast<cudaStream_t>(stream);
  if (dtype == VA_DTYPE_FP16) {
    scaled_copy_kernel<<<blocks, threads, 0, st>>>(static_cast<const __half*>(x),
                                                  static_cast<__half*>(y), n, scale);
  } else {
    scaled_copy_kernel<<<blocks, threads, 0, st>>>(
        static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), n, scale);
  }
  s = va_check_cuda(cudaGetLastError(), "scaled_copy launch");
  if (s != VA_OK) return s;
  return va_ok();
}
