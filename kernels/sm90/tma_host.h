// Host side of the sm_90a TMA loads: the tensor map of the paged K cache,
// encoded per launch into KernelParams::k_tmap (cuTensorMapEncodeTiled, found
// through cudaGetDriverEntryPointByVersion: no link against libcuda).
//
// Map: 3-D [num_pages][page_size][576 columns] of bf16/fp16 with the caller's
// page and token strides, boxes of 64 columns x 64 slots x 1 page, 128-byte
// swizzle (the shared-memory layout of kernels/sm90/swizzle.cuh), zeros for
// coordinates outside it. Needs page_size a multiple of 64 (a 64-row tile then
// lies in one page) and MLA (one KV head).
#ifndef VERIFY_ATTN_SM90_TMA_HOST_H_
#define VERIFY_ATTN_SM90_TMA_HOST_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "kernels/launch.h"
#include "kernels/status.h"
#include "kernels/verify_attn.h"

namespace verify_attn {

static_assert(sizeof(CUtensorMap) == sizeof(KernelParams::k_tmap), "k_tmap holds one CUtensorMap");

inline va_status encode_k_tmap(KernelParams* kp, int dtype) {
  if (kp->page_size <= 0 || kp->page_size % 64 != 0 || kp->num_pages <= 0)
    return va_fail(VA_ERR_UNSUPPORTED,
                   "page_size: the TMA configuration needs a paged cache with page_size a multiple "
                   "of 64 (got %d)",
                   kp->page_size);
  // Looked up once (a function-local static: thread-safe initialisation).
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr)
    return va_fail(VA_ERR_CUDA, "device: cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(kp->page_size),
                              static_cast<cuuint64_t>(kp->num_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kp->k_stride_token) * 2,
                                 static_cast<cuuint64_t>(kp->k_stride_page) * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode(
      &map, dtype == VA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(kp->k), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return va_fail(VA_ERR_INVALID_STRIDE,
                   "k: cuTensorMapEncodeTiled refused the K cache (CUresult %d; strides %lld / %lld "
                   "elements, page_size %d, %lld pages)",
                   static_cast<int>(r), static_cast<long long>(kp->k_stride_token),
                   static_cast<long long>(kp->k_stride_page), kp->page_size,
                   static_cast<long long>(kp->num_pages));
  std::memcpy(kp->k_tmap, &map, sizeof(map));
  return VA_OK;
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_TMA_HOST_H_
