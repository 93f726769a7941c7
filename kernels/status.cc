#include "kernels/status.h"

#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdio>

namespace verify_attn {
namespace {
thread_local char g_last_error[1024] = "";
}  // namespace

va_status va_fail(va_status s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
  va_end(ap);
  return s;
}

va_status va_ok() {
  g_last_error[0] = '\0';
  return VA_OK;
}

va_status va_check_cuda(int cuda_error, const char* what) {
  if (cuda_error == cudaSuccess) return VA_OK;
  auto err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return va_fail(VA_ERR_NO_DEVICE, "%s: no CUDA device (%s: %s)", what,
                   cudaGetErrorName(err), cudaGetErrorString(err));
  }
  return va_fail(VA_ERR_CUDA, "%s: %s: %s", what, cudaGetErrorName(err),
                 cudaGetErrorString(err));
}

const char* last_error() { return g_last_error; }

}  // namespace verify_attn

extern "C" const char* va_last_error_message(void) {
  return verify_attn::last_error();
}

extern "C" const char* va_status_name(va_status s) {
  switch (s) {
    case VA_OK: return "VA_OK";
    case VA_ERR_NULL_POINTER: return "VA_ERR_NULL_POINTER";
    case VA_ERR_INVALID_VALUE: return "VA_ERR_INVALID_VALUE";
    case VA_ERR_INVALID_DTYPE: return "VA_ERR_INVALID_DTYPE";
    case VA_ERR_INVALID_STRIDE: return "VA_ERR_INVALID_STRIDE";
    case VA_ERR_UNSUPPORTED: return "VA_ERR_UNSUPPORTED";
    case VA_ERR_WORKSPACE: return "VA_ERR_WORKSPACE";
    case VA_ERR_VERSION: return "VA_ERR_VERSION";
    case VA_ERR_NO_DEVICE: return "VA_ERR_NO_DEVICE";
    case VA_ERR_CUDA: return "VA_ERR_CUDA";
  }
  return "VA_ERR_UNKNOWN";
}
