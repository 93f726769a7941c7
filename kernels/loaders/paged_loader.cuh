// Paged KV layout: KV row j of request i lives in page
// kv_indices[kv_indptr[i] + j / page_size], slot j % page_size; kv_len_i is
// kv_len[i]. A page slot past kv_indptr[i+1] or a page id outside
// [0, num_pages) is never dereferenced: the caller zero-fills the row and
// kErrKvIndex is OR-ed into error_word.
#ifndef VERIFY_ATTN_LOADERS_PAGED_LOADER_CUH_
#define VERIFY_ATTN_LOADERS_PAGED_LOADER_CUH_

#include <stdint.h>

#include "kernels/core/errors.cuh"
#include "kernels/launch.h"

namespace verify_attn {

struct PagedLoader {
  static constexpr bool kPaged = true;
  const int32_t* indices;
  int32_t slot_begin, slot_end;  // this request's range of kv_indices
  int kv_len_;
  int32_t page_size;
  int64_t num_pages;
  int64_t k_head_off, v_head_off;
  int64_t k_page, v_page, k_tok, v_tok;
  int32_t* error_word;
  int req_;

  __device__ __forceinline__ PagedLoader(const KernelParams& p, int req, int hk) {
    indices = p.kv_indices;
    slot_begin = __ldg(p.kv_indptr + req);
    slot_end = __ldg(p.kv_indptr + req + 1);
    kv_len_ = request_kv_len(p, req);
    page_size = p.page_size;
    num_pages = p.num_pages;
    k_head_off = hk * p.k_stride_head;
    v_head_off = hk * p.v_stride_head;
    k_page = p.k_stride_page;
    v_page = p.v_stride_page;
    k_tok = p.k_stride_token;
    v_tok = p.v_stride_token;
    error_word = p.error_word;
    req_ = req;
  }

  __device__ __forceinline__ int kv_len() const { return kv_len_; }
  // Request req's kv_len without the rest of a loader (balanced splits).
  static __device__ __forceinline__ int request_kv_len(const KernelParams& p, int req) {
    return __ldg(p.kv_len + req);
  }

  __device__ __forceinline__ bool row(int j, int64_t* k_off, int64_t* v_off) const {
    return row_at(j, entry(j), k_off, v_off);
  }

  // row() in two steps, for a caller that issues the lookup of a later row
  // before it copies this one: entry(j) is row j's page id (page_entry: a
  // plain load whose value is used only in row_at; at page_size 1 without the
  // division), row_at(j, e, ...) row()'s check and offsets from it.
  __device__ __forceinline__ int32_t entry(int j) const {
    return page_entry(page_size == 1 ? j : j / page_size);
  }
  __device__ __forceinline__ bool row_at(int j, int32_t e, int64_t* k_off, int64_t* v_off) const {
    const int slot_in_page = page_size == 1 ? 0 : j % page_size;  // page_size 1: no second division
    const int64_t page = e;
    if (!page_ok(page, j)) return false;  // never dereferenced
    *k_off = page * k_page + slot_in_page * k_tok + k_head_off;
    *v_off = page * v_page + slot_in_page * v_tok + v_head_off;
    return true;
  }

  // The TMA kernel's check of the 64-row tile starting at row j0 (< kv_len):
  // with page_size a multiple of 64 the tile lies in one page, so its first
  // row's checks (row(): flagged when bad) are every row's.
  __device__ __forceinline__ bool tile_ok(int j0, int /*kv_len*/) const {
    int64_t k_off, v_off;
    return row(j0, &k_off, &v_off);
  }

  // Entry `page_in_req` of the request's page table (row j's is j /
  // page_size; at page_size 1 it is j), -1 past the request's pages; not
  // range-checked (page_ok). A plain load whose value the caller may use much
  // later: the rows producer of the TMA kernel
  // (kernels/sm90/mla_tma_producer.cuh) reads a tile ahead.
  __device__ __forceinline__ int32_t page_entry(int page_in_req) const {
    const int64_t s = static_cast<int64_t>(slot_begin) + page_in_req;
    return (s >= 0 && s < slot_end) ? __ldg(indices + s) : -1;
  }

  // row()'s check of row j's page id (from page_entry): false (and flagged,
  // as row() flags it) when the id is outside [0, num_pages).
  __device__ __forceinline__ bool page_ok(int64_t page, int j) const {
    if (page >= 0 && page < num_pages) return true;
    report_error(error_word, kErrKvIndex, req_, page, j);
    return false;
  }

  // TMA coordinates of row j: its page id (or -1 when the slot is outside the
  // request's pages: an out-of-range page is zero-filled by the copy engine and
  // flagged by row()) and its slot in the page.
  __device__ __forceinline__ void page_coord(int j, int* page, int* slot) const {
    const int page_in_req = j / page_size;
    *slot = j - page_in_req * page_size;
    *page = page_entry(page_in_req);
  }
};

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LOADERS_PAGED_LOADER_CUH_
