// Host side of the sm_90a TMA loads: the tensor maps of the paged K cache and
// of q, encoded per launch into KernelParams::k_tmap / q_tmap
// (cuTensorMapEncodeTiled, found through cudaGetDriverEntryPointByVersion: no
// link against libcuda).
//
// K map (encode_k_tmap):
// 3-D [num_pages][page_size][576 columns] of bf16/fp16 with the caller's
// page and token strides, boxes of 64 columns x 64 slots x 1 page, 128-byte
// swizzle (the shared-memory layout of kernels/sm90/swizzle.cuh), zeros for
// coordinates outside it. Needs page_size a multiple of 64 (a 64-row tile then
// lies in one page) and MLA (one KV head).
#ifndef VERIFY_ATTN_SM90_TMA_HOST_H_
#define VERIFY_ATTN_SM90_TMA_HOST_H_

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/launch.h"
#include "kernels/status.h"
#include "kernels/verify_attn.h"

namespace verify_attn {

static_assert(sizeof(CUtensorMap) == sizeof(KernelParams::k_tmap), "k_tmap holds one CUtensorMap");
static_assert(sizeof(CUtensorMap) == sizeof(KernelParams::q_tmap), "q_tmap holds one CUtensorMap");

// cuTensorMapEncodeTiled of the driver, looked up once (a function-local
// static: thread-safe initialisation); null when the driver lacks it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
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
  return encode;
}

// A 3-D map of 16-bit elements (dims and byte strides of dims 1, 2 as the
// driver takes them) with the layout both maps share: 128-byte swizzle (the
// shared-memory layout of kernels/sm90/swizzle.cuh), L2 promotion of 256
// bytes (`promotion`: tools/dev/microbench/copy_rate compares others), zeros
// outside the tensor. `encode` from tensor_map_encoder().
inline CUresult encode_map_3d(
    PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap* map, const void* base, int dtype,
    const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2], const cuuint32_t (&box)[3],
    CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(map,
                dtype == VA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                3, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// Encodes the K map of the TMA kernel (dims and byte strides as the driver
// takes them; boxes of 64 columns x 64 rows) into kp->k_tmap. The plan chose
// the map by its rules (kernels/plan.cc), so a refusal is the driver's: an
// error naming `what`, never a change of kernel.
inline va_status encode_k_map(KernelParams* kp, int dtype, const cuuint64_t (&dims)[3],
                              const cuuint64_t (&strides)[2], const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr)
    return va_fail(VA_ERR_CUDA, "device: cuTensorMapEncodeTiled not found in the driver");
  const cuuint32_t box[3] = {64, 64, 1};
  CUtensorMap map;
  const CUresult r = encode_map_3d(encode, &map, kp->k, dtype, dims, strides, box);
  if (r != CUDA_SUCCESS)
    return va_fail(VA_ERR_CUDA,
                   "k: cuTensorMapEncodeTiled refused the K %s map (CUresult %d; strides %llu / %llu "
                   "bytes, dims %llu x %llu x %llu)",
                   what, static_cast<int>(r), static_cast<unsigned long long>(strides[0]),
                   static_cast<unsigned long long>(strides[1]), static_cast<unsigned long long>(dims[0]),
                   static_cast<unsigned long long>(dims[1]), static_cast<unsigned long long>(dims[2]));
  std::memcpy(kp->k_tmap, &map, sizeof(map));
  return VA_OK;
}

inline va_status encode_k_tmap(KernelParams* kp, int dtype) {
  if (kp->page_size <= 0 || kp->page_size % 64 != 0 || kp->num_pages <= 0)
    return va_fail(VA_ERR_UNSUPPORTED,
                   "page_size: the TMA configuration needs a paged cache with page_size a multiple "
                   "of 64 (got %d)",
                   kp->page_size);
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(kp->page_size),
                              static_cast<cuuint64_t>(kp->num_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kp->k_stride_token) * 2,
                                 static_cast<cuuint64_t>(kp->k_stride_page) * 2};
  return encode_k_map(kp, dtype, dims, strides, "page");
}

// The TMA kernel's K map for flat caches and for page_size 1 caches planned
// with the kv_slot_runs hint (kernels/sm90/mla_tma_producer.cuh): the cache's
// rows as one 3-D map [1][rows][576 columns] (token stride of the cache;
// boxes of 64 columns x 64 rows, 128-byte swizzle, zeros past the last row),
// so that a tile of 64 consecutive cache rows (a flat request's; SGLang's
// token slots of a `--page-size 64` pool) is 9 boxes. Rows: num_kv_rows for a
// flat cache, num_pages for page_size 1 (whose page and token strides must
// agree). The plan took this configuration only where rows_map_ok holds
// (kernels/plan.cc), so a refusal here is the driver's: an error.
inline va_status encode_k_rows_tmap(KernelParams* kp, int dtype, bool paged) {
  const int64_t rows = paged ? kp->num_pages : kp->num_kv_rows;
  if (kp->num_kv_heads != 1 || (paged && (kp->page_size != 1 || kp->k_stride_page != kp->k_stride_token)) ||
      !rows_map_ok(kp->k, kp->k_stride_token, rows))  // kernels/plan.h
    return va_fail(VA_ERR_INVALID_STRIDE,
                   "k: the planned rows map cannot describe the K cache (strides %lld / %lld "
                   "elements, %lld rows)",
                   static_cast<long long>(kp->k_stride_token),
                   static_cast<long long>(kp->k_stride_page), static_cast<long long>(rows));
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kp->k_stride_token) * 2,
                                 static_cast<cuuint64_t>(kp->k_stride_token) * 2 *
                                     static_cast<cuuint64_t>(rows)};
  return encode_k_map(kp, dtype, dims, strides, "rows");
}

// A [total_q tokens][num_qo_heads][width] tensor (bf16 / fp16, element strides
// stride_token / stride_head) as a 3-D map whose box is one CTA's 64 folded
// rows x 64 columns: min(G, 64) heads x max(64 / G, 1) tokens (G = heads per
// KV head; token-major, heads fastest: kernels/core/request.cuh), 128-byte
// swizzled. Needs folded_rows_map_ok (the copy engine's rules); false when
// that fails or the driver refuses the map. The Q and output maps below.
inline bool encode_folded_rows_map(const void* base, int dtype, int width, int num_qo_heads,
                                   int64_t total_q, int64_t stride_token, int64_t stride_head,
                                   int G, unsigned char (&dst)[128]) {
  if (!folded_rows_map_ok(base, width, total_q, stride_token, stride_head, G))  // kernels/plan.h
    return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(width), static_cast<cuuint64_t>(num_qo_heads),
                              static_cast<cuuint64_t>(total_q)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_head) * 2,
                                 static_cast<cuuint64_t>(stride_token) * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(G < 64 ? G : 64),
                             static_cast<cuuint32_t>(G < 64 ? 64 / G : 1)};
  CUtensorMap map;
  if (encode_map_3d(encode, &map, base, dtype, dims, strides, box) != CUDA_SUCCESS) return false;
  static_assert(sizeof(map) == sizeof(dst), "CUtensorMap is 128 bytes");
  std::memcpy(dst, &map, sizeof(map));
  return true;
}

// The CTA's Q tile (64 folded rows x 576 columns) by TMA: q as a 3-D map
// [total_q tokens][num_qo_heads][576 columns] with the caller's head and token
// strides, boxes of 64 columns x min(G, 64) heads x max(64 / G, 1) tokens
// (G = heads per KV head), so that a box is one CTA's 64 folded rows
// (token-major, heads fastest: kernels/core/request.cuh, q_row_offset) in the
// 128-byte swizzled layout the consumers' wgmma reads. Rows of a box past the
// request are the next request's (zeros past total_q): masked, never written.
// The output tile likewise ([token][head][512], box of one CTA's 64 folded
// rows x 64 columns): used for unsplit launches and full row tiles
// (write_rows_tma in kernels/sm90/mla_consumer.cuh), since a box always
// covers 64 folded rows and a partial tile's box would reach the next
// request's rows. The plan decides both (Plan::q_tma / o_tma, from
// folded_rows_map_ok); the run encodes them for its own q / out, and a
// refusal there is the driver's: an error. Without them the consumers copy Q
// with cp.async and store their rows from registers.
inline va_status encode_q_o_tmaps(KernelParams* kp, const Plan& plan, int dtype) {
  // One map of the two: `name` for the error, width 576 (Q) or 512 (output).
  auto encode = [&](bool planned, const char* name, const void* base, int width, int64_t s_tok,
                    int64_t s_head, unsigned char (&dst)[128], int32_t* flag) -> va_status {
    *flag = 0;
    if (!planned) return VA_OK;
    if (!encode_folded_rows_map(base, dtype, width, kp->num_qo_heads, kp->total_q, s_tok, s_head,
                                kp->group, dst))
      return va_fail(VA_ERR_CUDA,
                     "%s: cuTensorMapEncodeTiled refused the planned map (%d heads per KV head, "
                     "strides %lld / %lld elements)",
                     name, kp->group, static_cast<long long>(s_tok), static_cast<long long>(s_head));
    *flag = 1;
    return VA_OK;
  };
  const va_status st = encode(plan.q_tma, "q", kp->q, 576, kp->q_stride_token, kp->q_stride_head,
                              kp->q_tmap, &kp->q_tma);
  if (st != VA_OK) return st;
  return encode(plan.o_tma, "out", kp->out, 512, kp->out_stride_token, kp->out_stride_head,
                kp->o_tmap, &kp->o_tma);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_TMA_HOST_H_
