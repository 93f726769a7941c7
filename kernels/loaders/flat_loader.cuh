// Flat KV layout: KV row j of request i is row kv_indptr[i] + j of k / v
// ([num_kv_rows, Hkv, D]); kv_len_i = kv_indptr[i+1] - kv_indptr[i].
// A row outside [0, num_kv_rows) is never read: the caller zero-fills it and
// kErrKvIndex is OR-ed into error_word.
#ifndef VERIFY_ATTN_LOADERS_FLAT_LOADER_CUH_
#define VERIFY_ATTN_LOADERS_FLAT_LOADER_CUH_

#include <stdint.h>

#include "kernels/core/errors.cuh"
#include "kernels/launch.h"

namespace verify_attn {

struct FlatLoader {
  static constexpr bool kPaged = false;
  int64_t base;  // first row of the request
  int kv_len_;
  int64_t num_rows;
  int64_t k_head_off, v_head_off;
  int64_t k_stride, v_stride;
  int32_t* error_word;
  int req_;

  __device__ __forceinline__ FlatLoader(const KernelParams& p, int req, int hk) {
    const int32_t b = __ldg(p.kv_indptr + req);
    const int32_t e = __ldg(p.kv_indptr + req + 1);
    base = b;
    kv_len_ = e - b;  // negative -> caller reports kErrKvShort
    num_rows = p.num_kv_rows;
    k_head_off = hk * p.k_stride_head;
    v_head_off = hk * p.v_stride_head;
    k_stride = p.k_stride_token;
    v_stride = p.v_stride_token;
    error_word = p.error_word;
    req_ = req;
  }

  __device__ __forceinline__ int kv_len() const { return kv_len_; }
  // Request req's kv_len without the rest of a loader (balanced splits).
  static __device__ __forceinline__ int request_kv_len(const KernelParams& p, int req) {
    return __ldg(p.kv_indptr + req + 1) - __ldg(p.kv_indptr + req);
  }

  // PagedLoader's two steps of row(): a flat cache has no lookup.
  __device__ __forceinline__ int32_t entry(int) const { return 0; }
  __device__ __forceinline__ bool row_at(int j, int32_t, int64_t* k_off, int64_t* v_off) const {
    return row(j, k_off, v_off);
  }

  // Offsets of row j (0 <= j < kv_len) or false when it must not be read.
  __device__ __forceinline__ bool row(int j, int64_t* k_off, int64_t* v_off) const {
    const int64_t r = base + j;
    if (r < 0 || r >= num_rows) {  // never dereferenced
      report_error(error_word, kErrKvIndex, req_, r, j);
      return false;
    }
    *k_off = r * k_stride + k_head_off;
    *v_off = r * v_stride + v_head_off;
    return true;
  }

  // The TMA kernel's check of the 64-row tile starting at row j0 (< kv_len):
  // 64 consecutive cache rows, so its first row and its last row below kv_len
  // (a request's rows past the cache; row() flags them).
  __device__ __forceinline__ bool tile_ok(int j0, int kv_len) const {
    int64_t k_off, v_off;
    const int j1 = min(j0 + 64, kv_len) - 1;
    return row(j0, &k_off, &v_off) && (j1 <= j0 || row(j1, &k_off, &v_off));
  }

  // The TMA kernel's box coordinate of row j (kernels/sm90/mla_tma_producer.cuh),
  // in the rows map of kernels/sm90/tma_host.h (encode_k_rows_tmap): page 0,
  // slot = the cache row; a row outside the cache gets a coordinate wholly
  // outside the map (the copy engine fills zeros; row() flags it).
  __device__ __forceinline__ void page_coord(int j, int* page, int* slot) const {
    const int64_t r = base + j;
    *page = 0;
    *slot = (r >= 0 && r < num_rows) ? static_cast<int>(r) : -64;
  }
};

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LOADERS_FLAT_LOADER_CUH_
