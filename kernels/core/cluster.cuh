// Thread-block cluster primitives (sm_90 and newer; the arch-specific images
// of the cluster kernel, kernels/mla_cluster_kernel.cuh, and of the GQA
// warp-role kernel's pair of splits, kernels/core/pair_combine.cuh): this CTA's rank, the
// partner CTA's shared-memory address of a local variable (mapa), 16-byte
// stores into a partner's shared memory whose completion counts bytes on the
// partner's mbarrier (st.async ... mbarrier::complete_tx), the receiving
// side's arrive.expect_tx, and the cluster-wide barrier.
//
// A st.async signals through the mbarrier's transaction count: the phase
// completes only once its bytes are in the receiving CTA's shared memory, so
// a thread that observed the phase (sm90::mbar_wait, as for bulk copies)
// reads them. The wait stays at CTA scope: .acquire.cluster adds an L1
// invalidation (CCTL.IVALL) per wait, which only global memory would need.
// No mbarrier.arrive.release.cluster either: with the pinned ptxas it adds a
// MEMBAR.ALL.GPU (docs/design_portable.md, "the cluster operations on
// sm_120a").
//
// PTX ISA 8.x: "mapa", "st.async", "mbarrier.arrive" (.expect_tx),
// "barrier.cluster", special register %cluster_ctarank.
#ifndef VERIFY_ATTN_CORE_CLUSTER_CUH_
#define VERIFY_ATTN_CORE_CLUSTER_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"

namespace verify_attn {
namespace cluster {

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of the variable at `p` (this CTA's shared
// memory) in CTA `rank` of the cluster: the same offset in that CTA's window.
__device__ __forceinline__ uint32_t map_rank(const void* p, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr(p)), "r"(rank));
  return out;
}

// 16 bytes (v) to shared::cluster address `dst` (map_rank), their arrival
// counted as 16 transaction bytes on the mbarrier at shared::cluster address
// `bar` (in the same CTA as dst).
__device__ __forceinline__ void st_async_v4(uint32_t dst, const float (&v)[4], uint32_t bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(dst),
      "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(bar)
      : "memory");
}

// 4 bytes (v) to shared::cluster address `dst`, counted as 4 transaction
// bytes on the mbarrier at `bar` (same CTA as dst).
__device__ __forceinline__ void st_async_b32(uint32_t dst, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(dst), "r"(v),
               "r"(bar)
               : "memory");
}

// One arrival on the local mbarrier `bar` that also expects `bytes` more
// transaction bytes in the current phase (they may have landed already: the
// count goes negative until this arrival; the phase completes when both the
// arrivals and the bytes are in).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// barrier.cluster: every thread of the cluster arrives, then waits for all of
// them (wait has acquire semantics). The arrive is relaxed: a release arrive
// costs a MEMBAR.ALL.GPU, and what must be visible across the barrier is
// published by a release fence before it (fence.mbarrier_init for the
// mbarriers, kernels/sm90/sync.cuh) or by nothing at all (a barrier that only
// keeps both CTAs resident until neither writes into the other).
__device__ __forceinline__ void barrier_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
// The release arrive: this thread's earlier memory accesses are ordered
// before what the cluster's threads do after their wait (a pair of splits
// hands its stage memory to the partner's writes: kernels/core/pair_combine.cuh).
__device__ __forceinline__ void barrier_arrive() {
  asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void barrier_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

}  // namespace cluster
}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_CLUSTER_CUH_
