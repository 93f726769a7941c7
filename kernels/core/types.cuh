// fp16 / bf16 traits and register packing for the mma.sync path.
//
// Both 16-bit types are handled through one trait struct so that the kernel
// template needs a single `DT` parameter. A "packed pair" is one 32-bit
// register holding two consecutive elements, low half = lower column, which is
// the element order of every mma.sync / ldmatrix fragment register (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type").
#ifndef VERIFY_ATTN_CORE_TYPES_CUH_
#define VERIFY_ATTN_CORE_TYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace verify_attn {

template <typename DT>
struct DTypeTraits;

template <>
struct DTypeTraits<half> {
  static constexpr bool kIsBf16 = false;
  // Two fp32 values -> one register of two fp16 (round to nearest).
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ half from_float(float x) {
    return __float2half_rn(x);
  }
};

template <>
struct DTypeTraits<__nv_bfloat16> {
  static constexpr bool kIsBf16 = true;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// Elements per 16-byte chunk (the unit of cp.async and of one ldmatrix row).
constexpr int kChunkElems = 8;

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_TYPES_CUH_
