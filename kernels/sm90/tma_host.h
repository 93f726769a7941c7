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

inline va_status encode_k_tmap(KernelParams* kp, int dtype) {
  if (kp->page_size <= 0 || kp->page_size % 64 != 0 || kp->num_pages <= 0)
    return va_fail(VA_ERR_UNSUPPORTED,
                   "page_size: the TMA configuration needs a paged cache with page_size a multiple "
                   "of 64 (got %d)",
                   kp->page_size);
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr)
    return va_fail(VA_ERR_CUDA, "device: cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(kp->page_size),
                              static_cast<cuuint64_t>(kp->num_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kp->k_stride_token) * 2,
                                 static_cast<cuuint64_t>(kp->k_stride_page) * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  CUtensorMap map;
  const CUresult r = encode_map_3d(encode, &map, kp->k, dtype, dims, strides, box);
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

// The TMA kernel's K map for flat caches and for page_size 1 caches planned
// with the kv_slot_runs hint (kernels/sm90/mla_tma_producer.cuh): the cache's
// rows as one 3-D map [1][rows][576 columns] (token stride of the cache;
// boxes of 64 columns x 64 rows, 128-byte swizzle, zeros past the last row),
// so that a tile of 64 consecutive cache rows (a flat request's; SGLang's
// token slots of a `--page-size 64` pool) is 9 boxes. Rows: num_kv_rows for a
// flat cache, num_pages for page_size 1 (whose page and token strides must
// agree). Returns false when it does not apply (the caller then runs the
// cp.async kernel). VERIFY_ATTN_K_ROWS_TMA=0 refuses it (an A/B and test knob).
inline bool encode_k_rows_tmap(KernelParams* kp, int dtype, bool paged) {
  const char* env = std::getenv("VERIFY_ATTN_K_ROWS_TMA");
  if (env != nullptr && env[0] == '0') return false;
  if (kp->num_kv_heads != 1) return false;
  int64_t rows;
  if (!paged) {
    rows = kp->num_kv_rows;
  } else if (kp->page_size == 1 && kp->k_stride_page == kp->k_stride_token) {
    rows = kp->num_pages;  // a slot's offset is page * k_stride_page
  } else {
    return false;
  }
  if (!rows_map_ok(kp->k, kp->k_stride_token, rows)) return false;  // kernels/plan.h
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kp->k_stride_token) * 2,
                                 static_cast<cuuint64_t>(kp->k_stride_token) * 2 *
                                     static_cast<cuuint64_t>(rows)};
  const cuuint32_t box[3] = {64, 64, 1};
  CUtensorMap map;
  if (encode_map_3d(encode, &map, kp->k, dtype, dims, strides, box) != CUDA_SUCCESS) return false;
  std::memcpy(kp->k_tmap, &map, sizeof(map));
  return true;
}

// VERIFY_ATTN_REQUIRE_K_TMA=1 (tests): a launch of a planned TMA
// configuration whose K tensor map cannot be encoded (encode_k_tmap,
// encode_k_rows_tmap) fails (VA_ERR_UNSUPPORTED) instead of running the
// cp.async kernel, so a test can tell that the planned kernel ran. `map`
// names the map ("page" or "rows"); `why`: the encoder's own message, kept
// in this one (encode_k_tmap's names the driver's CUresult), or null.
inline va_status k_tmap_fallback_status(const KernelParams& kp, const char* map,
                                        const char* why = nullptr) {
  const char* env = std::getenv("VERIFY_ATTN_REQUIRE_K_TMA");
  if (env == nullptr || env[0] != '1') return VA_OK;
  char reason[512] = "";
  if (why != nullptr) std::snprintf(reason, sizeof(reason), ": %s", why);  // va_fail rewrites it
  return va_fail(VA_ERR_UNSUPPORTED,
                 "k: VERIFY_ATTN_REQUIRE_K_TMA=1 but the K %s tensor map cannot be encoded "
                 "(page_size %d, strides %lld / %lld elements)%s",
                 map, kp.page_size, static_cast<long long>(kp.k_stride_token),
                 static_cast<long long>(kp.k_stride_page), reason);
}

// A [total_q tokens][num_qo_heads][width] tensor (bf16 / fp16, element strides
// stride_token / stride_head) as a 3-D map whose box is one CTA's 64 folded
// rows x 64 columns: min(G, 64) heads x max(64 / G, 1) tokens (G = heads per
// KV head; token-major, heads fastest: kernels/core/request.cuh), 128-byte
// swizzled. Needs G dividing 64 or 64 dividing G and 16-byte aligned base and
// strides (the copy engine's rules); false when those fail or the driver
// refuses the map. The Q and output maps below.
inline bool encode_folded_rows_map(const void* base, int dtype, int width, int num_qo_heads,
                                   int64_t total_q, int64_t stride_token, int64_t stride_head,
                                   int G, unsigned char (&dst)[128]) {
  if (G <= 0 || (G % 64 != 0 && 64 % G != 0) || total_q <= 0 ||
      reinterpret_cast<uintptr_t>(base) % 16 != 0 || stride_head < width ||
      (stride_head * 2) % 16 != 0 || (stride_token * 2) % 16 != 0)
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
// 128-byte swizzled layout the consumers' wgmma reads. Needs MLA (one KV head),
// G dividing 64 or 64 dividing G, and 16-byte aligned q and strides (the
// copy engine's rules); returns false otherwise (not an error: the kernel then
// copies Q with cp.async) and sets kp->q_tma. Rows of a box past the request
// are the next request's (zeros past total_q): masked, never written.
// VERIFY_ATTN_Q_TMA=0 turns it off (an A/B and test knob).
inline bool encode_q_tmap(KernelParams* kp, int dtype) {
  kp->q_tma = 0;
  const char* env = std::getenv("VERIFY_ATTN_Q_TMA");
  if (env != nullptr && env[0] == '0') return false;
  if (kp->num_kv_heads != 1) return false;
  if (!encode_folded_rows_map(kp->q, dtype, 576, kp->num_qo_heads, kp->total_q,
                              kp->q_stride_token, kp->q_stride_head, kp->group, kp->q_tmap))
    return false;
  kp->q_tma = 1;
  return true;
}

// Both sm_90a MLA kernels' output tile by TMA stores: out as a 3-D map like q's
// ([token][head][512] -> box of one CTA's 64 folded rows x 64 columns, 128-byte
// swizzle), the same rules (MLA, G dividing 64 or 64 dividing G, 16-byte
// aligned out and strides). Used for unsplit launches and full row tiles
// (kernels/sm90/mla_seesaw_kernel.cuh, mla_wgmma_kernel.cuh; write_rows_tma in
// mla_consumer.cuh): a box always covers 64 folded rows,
// so a partial tile's box would reach the next request's rows. Returns false
// otherwise (not an error: the consumers then store from registers) and sets
// kp->o_tma. VERIFY_ATTN_O_TMA=0 turns it off (an A/B and test knob;
// compute-sanitizer's initcheck does not see the copy engine's stores, so
// tools/gpu_run.sh runs initcheck with it off).
inline bool encode_o_tmap(KernelParams* kp, int dtype) {
  kp->o_tma = 0;
  const char* env = std::getenv("VERIFY_ATTN_O_TMA");
  if (env != nullptr && env[0] == '0') return false;
  if (kp->num_splits != 1 || kp->num_kv_heads != 1) return false;
  if (!encode_folded_rows_map(kp->out, dtype, 512, kp->num_qo_heads, kp->total_q,
                              kp->out_stride_token, kp->out_stride_head, kp->group, kp->o_tmap))
    return false;
  kp->o_tma = 1;
  return true;
}

// VERIFY_ATTN_REQUIRE_Q_TMA=1 (tests): a launch of an sm_90a MLA kernel whose
// q the Q map cannot describe fails (VA_ERR_UNSUPPORTED) instead of copying Q
// with cp.async, so a test can tell that the TMA path ran.
inline va_status encode_q_tmap_checked(KernelParams* kp, int dtype) {
  if (encode_q_tmap(kp, dtype)) return VA_OK;
  const char* env = std::getenv("VERIFY_ATTN_REQUIRE_Q_TMA");
  if (env == nullptr || env[0] != '1') return VA_OK;
  return va_fail(VA_ERR_UNSUPPORTED,
                 "q: VERIFY_ATTN_REQUIRE_Q_TMA=1 but the Q tensor map cannot describe q (%d heads "
                 "per KV head, %d KV heads, strides %lld / %lld elements)",
                 kp->group, kp->num_kv_heads, static_cast<long long>(kp->q_stride_token),
                 static_cast<long long>(kp->q_stride_head));
}

// VERIFY_ATTN_REQUIRE_O_TMA=1 (tests): an unsplit launch of an sm_90a MLA
// kernel whose out the map cannot describe fails (VA_ERR_UNSUPPORTED) instead
// of storing from registers, so a test can tell that the map was encoded (the
// full row tiles of that launch then take the TMA store path).
inline va_status encode_o_tmap_checked(KernelParams* kp, int dtype) {
  if (encode_o_tmap(kp, dtype) || kp->num_splits != 1) return VA_OK;
  const char* env = std::getenv("VERIFY_ATTN_REQUIRE_O_TMA");
  if (env == nullptr || env[0] != '1') return VA_OK;
  return va_fail(VA_ERR_UNSUPPORTED,
                 "out: VERIFY_ATTN_REQUIRE_O_TMA=1 but the output tensor map cannot describe out "
                 "(%d heads per KV head, strides %lld / %lld elements)",
                 kp->group, static_cast<long long>(kp->out_stride_token),
                 static_cast<long long>(kp->out_stride_head));
}

// Both sm_90a MLA kernels: Q by TMA where its map can describe q (else the
// consumers copy it with cp.async), the unsplit output by TMA stores where
// the map can describe out (else from registers); each with its REQUIRE knob.
inline va_status encode_q_o_tmaps_checked(KernelParams* kp, int dtype) {
  const va_status qs = encode_q_tmap_checked(kp, dtype);
  if (qs != VA_OK) return qs;
  return encode_o_tmap_checked(kp, dtype);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_TMA_HOST_H_
