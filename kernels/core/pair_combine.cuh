// Two splits of a row tile combined by their own CTAs (Plan::pair_splits):
// the two split CTAs run as one thread-block cluster (1 x 1 x 2, rank =
// split), and instead of writing fp32 partial rows for the merge kernel each
// consumer warp's 16-row slice of O is combined in distributed shared memory
// and stored once, as the output.
//
// Both CTAs hold the same rows (same request, KV head and row tile), consumer
// warp w of one CTA the same 16 rows as warp w of the other. Warp w of the
// CTA of rank w % 2 combines them (so both CTAs share the work, also where
// only the first warps have rows): its partner sends the slice's O
// (unnormalized, fp32, in the mma.sync fragment layout: lane l's o[j] as the
// 16 bytes at chunk j, lane l) and each fragment row's (lse, 1 / sum) by
// st.async into the combining CTA's stage memory, free once both CTAs are
// past their KV loops (pair_both_done); the bytes complete on that CTA's
// mbarrier of the slot (one arrival: the combining warp's expect_tx), after
// which the combining warp adds the two states as the merge kernel does
// (kernels/core/merge.cuh: L = max lse, w = exp(lse - L), O = sum w O_s / sum
// w) and stores the rows with the combined lse. A NaN lse (a bad KV index in
// either CTA) makes the row NaN.
//
// Every thread of both CTAs calls pair_both_done after its role's loop and
// pair_before_exit last: no CTA leaves while its partner can still write
// into it. Warps whose rows all lie past the request (the same warps in both
// CTAs) neither send nor receive.
#ifndef VERIFY_ATTN_CORE_PAIR_COMBINE_CUH_
#define VERIFY_ATTN_CORE_PAIR_COMBINE_CUH_

#include <math.h>
#include <stdint.h>

#include "kernels/core/cluster.cuh"
#include "kernels/core/epilogue.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/launch.h"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

// Bytes of the receiving area: slots = consumer warps / 2, each 32 lanes x
// (NTO + 1) chunks of 16 bytes.
template <int NTO, int kConsumerWarps>
inline constexpr int kPairBufferBytes = kConsumerWarps / 2 * (NTO + 1) * 32 * 16;

// Both CTAs' loops are over (their stage reads and copies done) and their
// mbarriers initialised (fence.mbarrier_init before): the release arrive
// orders this thread's earlier shared-memory reads before the partner's
// writes into the same bytes.
__device__ __forceinline__ void pair_both_done() {
  cluster::barrier_arrive();
  cluster::barrier_wait();
}

__device__ __forceinline__ void pair_before_exit() {
  cluster::barrier_arrive_relaxed();
  cluster::barrier_wait();
}

// A consumer warp's part after pair_both_done. o, sm: the warp's 16 rows
// from r0 (rows g and g + 8 of the fragment layout) as the loop left them;
// bad: this CTA met a bad KV index; buf: this CTA's receiving area (stage
// memory, kPairBufferBytes); bars: one mbarrier per slot, initialised with
// one arrival. Every lane of the warp calls it.
template <int NTO, int D, typename DT>
__device__ __forceinline__ void pair_combine_warp(const KernelParams& p, const RequestTile& rt, int hk, int r0,
                                                  int warp, int lane, float (&o)[NTO][4],
                                                  const OnlineSoftmaxRow (&sm)[2], bool bad, float* buf,
                                                  uint64_t* bars) {
  if (r0 >= rt.R) return;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t rank = cluster::cta_rank();
  const int slot = warp >> 1;
  float* mine = buf + (slot * (NTO + 1) * 32 + lane) * 4;  // chunk j at + 128 j floats
  float lse[2], inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(sm[h].l);
    lse[h] = bad ? NAN : OnlineSoftmaxRow::lse(sm[h].m, l);
    inv[h] = l > 0.f ? 1.f / l : 0.f;
  }
  if ((warp & 1) != static_cast<int>(rank)) {
    // The partner combines these rows: send them.
    const uint32_t dst = cluster::map_rank(mine, rank ^ 1u);
    const uint32_t bar = cluster::map_rank(bars + slot, rank ^ 1u);
#pragma unroll
    for (int j = 0; j < NTO; ++j) cluster::st_async_v4(dst + j * 512, o[j], bar);
    const float st[4] = {lse[0], inv[0], lse[1], inv[1]};
    cluster::st_async_v4(dst + NTO * 512, st, bar);
    return;
  }
  if (lane == 0) cluster::mbar_arrive_expect_tx(bars + slot, (NTO + 1) * 32 * 16);
  sm90::mbar_wait(bars + slot, 0u);
  const float4 theirs = *reinterpret_cast<const float4*>(mine + NTO * 128);
  const float lse_p[2] = {theirs.x, theirs.z}, inv_p[2] = {theirs.y, theirs.w};
  float so[2], sp[2], lse_out[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float L = fmaxf(lse[h], lse_p[h]);
    const float wo = lse[h] == -INFINITY ? 0.f : __expf(lse[h] - L);
    const float wp = lse_p[h] == -INFINITY ? 0.f : __expf(lse_p[h] - L);
    const float wsum = wo + wp;
    so[h] = wsum > 0.f ? wo * inv[h] / wsum : 0.f;
    sp[h] = wsum > 0.f ? wp * inv_p[h] / wsum : 0.f;
    lse_out[h] = wsum > 0.f ? L + logf(wsum) : -INFINITY;
    if (isnan(lse[h]) || isnan(lse_p[h])) so[h] = sp[h] = lse_out[h] = NAN;
  }
#pragma unroll
  for (int j = 0; j < NTO; ++j) {
    const float4 x = *reinterpret_cast<const float4*>(mine + j * 128);
    o[j][0] = o[j][0] * so[0] + x.x * sp[0];
    o[j][1] = o[j][1] * so[0] + x.y * sp[0];
    o[j][2] = o[j][2] * so[1] + x.z * sp[1];
    o[j][3] = o[j][3] * so[1] + x.w * sp[1];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int gr = r0 + g + 8 * h;
    if (gr >= rt.R) continue;
    // v_scale: 1 but for an fp8 cache (store_warp_row's factor).
    store_out_row<NTO, D, DT>(p, 0, folded_row(rt.q_start, hk, p.group, gr), 2 * t4, o, h, p.v_scale, lse_out[h],
                              t4 == 0);
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_PAIR_COMBINE_CUH_
