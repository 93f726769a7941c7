// Balanced splits (Plan::split_units): which request and which of its splits
// a CTA of the pooled grid runs. Grid z holds split_units CTAs per (KV head,
// row tile) for the whole batch; the requests take them in order, request i
// max(1, ceil(t_i / q)) of them (t_i its KV tiles by its device kv_len, q the
// share of kernels/plan.h's balanced_share), so that a long request's splits
// hold no more tiles than a short one's. Every warp of the CTA derives the
// same allocation (one lane per request, batch_size <= kMaxBalancedBatch), so
// no barrier is needed; the kv lengths are read in one round of loads.
#ifndef VERIFY_ATTN_CORE_BALANCED_SPLITS_CUH_
#define VERIFY_ATTN_CORE_BALANCED_SPLITS_CUH_

#include <stdint.h>

#include "kernels/core/request.cuh"
#include "kernels/launch.h"
#include "kernels/plan.h"

namespace verify_attn {

// cc: this CTA's grid coordinates (cta_coord; cc->split is its place in the
// pool). On return cc->req and cc->split are the request and its split, and
// *splits that request's split count (<= p.num_splits, the workspace's slots).
// False: the pool CTA is past every request's splits (nothing to compute).
// kv lengths out of range only move the shares (the request's own CTAs report
// them, kernels/core/request.cuh); a negative one counts as empty. Every lane
// of the warp calls it.
template <class Loader>
__device__ __forceinline__ bool balanced_coord(const KernelParams& p, int N, CtaCoord* cc, int* splits) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int batch = p.batch_size;
  const bool mine = lane < batch;
  // The request's qo_indptr and kv_indptr entries that request_tile and the
  // loader read next, brought into L1 in the same round as the lengths.
  if (lane <= batch) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.qo_indptr + lane));
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p.kv_indptr + lane));
  }
  // Tiles per request: at most 2^26 (request_tile's length bound over N >= 32),
  // so 32 of them and their split counts add up within 32 bits.
  unsigned tiles = 0;
  if (mine) {
    int len = Loader::request_kv_len(p, lane);
    const int cap = kMaxKvLen - 2 * N;  // request_tile's bound
    len = len < 0 ? 0 : (len > cap ? cap : len);
    tiles = static_cast<unsigned>((len + N - 1) / N);
  }
  unsigned total = tiles, most = tiles;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    total += __shfl_xor_sync(kAll, total, off);
    most = max(most, __shfl_xor_sync(kAll, most, off));
  }
  const int share = balanced_share(static_cast<int64_t>(total), static_cast<int>(most), batch, p.split_units,
                                   [&](int q) {
                                     const unsigned uq = static_cast<unsigned>(q);
                                     unsigned n = mine ? (tiles > uq ? (tiles + uq - 1) / uq : 1u) : 0u;
#pragma unroll
                                     for (int off = 16; off > 0; off >>= 1) n += __shfl_xor_sync(kAll, n, off);
                                     return static_cast<int64_t>(n);
                                   });
  const int mine_splits = mine ? balanced_splits_of(static_cast<int>(tiles), share, p.num_splits) : 0;
  int end = mine_splits;  // inclusive prefix sum: request lane's splits end at pool CTA `end`
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kAll, end, off);
    if (lane >= off) end += v;
  }
  const int c = cc->split;
  const unsigned owners = __ballot_sync(kAll, mine && end > c);
  if (owners == 0) return false;
  const int req = __ffs(owners) - 1;
  const int n = __shfl_sync(kAll, mine_splits, req);
  cc->req = req;
  cc->split = c - (__shfl_sync(kAll, end, req) - n);
  *splits = n;
  return true;
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_BALANCED_SPLITS_CUH_
