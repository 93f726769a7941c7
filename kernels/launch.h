// Internal interface between the C-ABI (capi_attention.cc, host C++) and the
// CUDA translation units (flat.cu, paged.cu, merge.cu). No CUDA headers here.
#ifndef VERIFY_ATTN_LAUNCH_H_
#define VERIFY_ATTN_LAUNCH_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/plan.h"
#include "kernels/verify_attn.h"

namespace verify_attn {

// Bits OR-ed into *error_word by the kernels (device data found invalid).
enum ErrorBits : int32_t {
  kErrKvIndex = 1,     // paged page id outside [0, num_pages), page slot past
                       // kv_indptr[i+1], or flat row outside [0, num_kv_rows):
                       // the row was zero-filled instead of read; or a device
                       // kv_len within 2 tiles of 2^31 (rows NaN, position -1)
  kErrKvShort = 2,     // kv_len < q_len: that request's outputs are NaN
  kErrQoIndptr = 4,    // qo_indptr not within [0, total_q] / decreasing, or a
                       // request has more rows than max_q_len: rows skipped
  kErrMetadata = 8,    // va_verify_metadata: a prefix length < 0, a draft slot
                       // outside int32, or a request's kv_indices rows past
                       // the capacity (or 2^31): those rows not written
};

// Everything a kernel needs, by value (kernel parameter). Strides in elements.
struct KernelParams {
  const void* q;
  int64_t q_stride_token, q_stride_head;
  const void* k;
  int64_t k_stride_page, k_stride_token, k_stride_head;
  const void* v;  // == k for MLA
  int64_t v_stride_page, v_stride_token, v_stride_head;
  void* out;
  int64_t out_stride_token, out_stride_head;
  float* lse;  // may be null
  int64_t lse_stride_token, lse_stride_head;

  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* kv_len;
  int32_t page_size;
  int64_t num_pages;
  int64_t num_kv_rows;

  const uint32_t* tree_mask;
  int32_t mask_words;
  int32_t causal;

  int32_t batch_size;
  int32_t total_q;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t group;       // num_qo_heads / num_kv_heads
  float scale_log2;    // sm_scale * log2(e), times k_scale for an fp8 cache
  float v_scale;       // fp8 caches: V = v_scale x the stored value, applied to O before its store

  int32_t num_splits;  // workspace slots per output row (with split_units: a request's most splits)
  // Plan::split_units: 0, or grid z is that many split CTAs per (KV head, row
  // tile) for the whole batch, handed to the requests by their KV lengths
  // (kernels/core/balanced_splits.cuh).
  int32_t split_units;
  // Plan::pair_splits: 1 when the two splits of a row tile run as one cluster
  // and combine their rows themselves (the output written directly, no
  // workspace).
  int32_t pair_splits;
  float* ws_o;         // [splits][total_q * Hq][Dv] fp32 (splits > 1)
  float* ws_lse;       // [splits][total_q * Hq] fp32
  int64_t ws_rows;     // total_q * Hq

  int32_t* error_word;  // may be null
  // The grid's order (kernels/core/request.cuh, cta_coord): 0: (request *
  // Hkv + kv head, row tile, split); 1: (row tile, request * Hkv + kv head,
  // split). Plan::grid_rows_fastest.
  int32_t grid_rows_fastest;
  // sm_90a TMA kernel: 1 releases stage 0's blocks 0-3 right after consumer
  // 0's P_A V_A[:, L]. Plan::early_a0_release.
  int32_t early_a0_release;

  // sm_90a TMA configurations (kSeesawTma): the CUtensorMap of the K cache
  // (kernels/sm90/tma_host.h), read by the kernel through its
  // __grid_constant__ parameter: the paged map (page_size % 64 == 0), or the
  // map of the cache's rows (flat caches; page_size 1 with kRowsGather).
  // Unused (uninitialised) otherwise.
  alignas(64) unsigned char k_tmap[128];
  // Both sm_90a MLA kernels' Q tile by TMA (kernels/sm90/tma_host.h,
  // encode_q_tmap): q_tma = 1 when q_tmap holds the map of q, else 0 (the
  // consumers then copy Q with cp.async; every other kernel ignores both).
  int32_t q_tma;
  alignas(64) unsigned char q_tmap[128];
  // Both sm_90a MLA kernels' unsplit output by TMA stores
  // (kernels/sm90/tma_host.h, encode_o_tmap): o_tma = 1 when o_tmap holds the
  // map of out, else 0 (the consumers then store their rows from registers;
  // every other kernel ignores both).
  int32_t o_tma;
  alignas(64) unsigned char o_tmap[128];
};

// Launch the attention kernel of plan.config on `stream` (+ the merge when
// plan.splits > 1). dtype is va_dtype. Returns VA_OK or a va_fail status.
va_status launch_flat(const KernelParams& kp, const Plan& plan, int dtype, void* stream);
va_status launch_paged(const KernelParams& kp, const Plan& plan, int dtype, void* stream);
// Merge the split partials of kp.ws_* into kp.out / kp.lse (merge.cu).
va_status launch_merge(const KernelParams& kp, const Plan& plan, int dtype, int head_dim_vo,
                       void* stream);

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LAUNCH_H_
