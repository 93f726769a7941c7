// C-ABI entry points common to every kernel: struct init, versions.
// The attention entry points are in capi_attention.cc.
#include <cuda_runtime_api.h>

#include <cstring>

#include "kernels/status.h"
#include "kernels/verify_attn.h"

extern "C" void va_params_init(va_params* p) {
  if (p == nullptr) return;
  std::memset(p, 0, sizeof(*p));
  p->struct_size = sizeof(va_params);
  p->abi_version = VA_ABI_VERSION;
  p->dtype = VA_DTYPE_BF16;
  p->kv_layout = VA_KV_FLAT;
  p->mask_mode = VA_MASK_TREE;
  p->num_kv_heads = 1;
  p->num_qo_heads = 1;
  p->page_size = 1;
  p->sm_scale = 1.0f;
  p->kv_dtype = VA_KV_DTYPE_AS_Q;
  p->k_scale = 1.0f;
  p->v_scale = 1.0f;
}

extern "C" int32_t va_abi_version(void) { return VA_ABI_VERSION; }

extern "C" va_status va_cuda_versions(int32_t* runtime_version, int32_t* driver_version) {
  using namespace verify_attn;
  if (runtime_version == nullptr) return va_fail(VA_ERR_NULL_POINTER, "runtime_version: NULL");
  if (driver_version == nullptr) return va_fail(VA_ERR_NULL_POINTER, "driver_version: NULL");
  int rt = 0, drv = 0;
  // cudaRuntimeGetVersion needs no device; cudaDriverGetVersion returns 0
  // when no driver is installed.
  va_status s = va_check_cuda(cudaRuntimeGetVersion(&rt), "cudaRuntimeGetVersion");
  if (s != VA_OK) return s;
  s = va_check_cuda(cudaDriverGetVersion(&drv), "cudaDriverGetVersion");
  if (s != VA_OK) return s;
  *runtime_version = rt;
  *driver_version = drv;
  return va_ok();
}
