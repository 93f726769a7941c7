// Synchronisation primitives of the sm_90a path: shared-memory mbarriers
// (producer -> consumer "tile landed", consumer -> producer "buffer free"),
// named barriers between the two consumer warpgroups, the generic -> async
// proxy fence, and warpgroup register reallocation.
//
// PTX ISA 8.x: "mbarrier" (init / arrive / try_wait.parity), "bar.sync",
// "fence.proxy.async", "setmaxnreg".
#ifndef VERIFY_ATTN_SM90_SYNC_CUH_
#define VERIFY_ATTN_SM90_SYNC_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"

// setmaxnreg (and mbarrier.try_wait.parity, fence.mbarrier_init) exist only in
// the arch-specific images (sm_90a, sm_100a, sm_120a): elsewhere (a build for
// sm_80 / sm_86 / sm_89 / sm_90 / sm_120, which the portable kernel supports)
// the warp-role kernels (kernels/mla_split_kernel.cuh, kernels/gqa_roles_kernel.cuh)
// are stubs that trap, and the plan never selects them there (kernels/plan.cc,
// built_arch_specific). Without this guard such a build fails in ptxas.
#if defined(__CUDA_ARCH__) && (defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL) || \
                               defined(__CUDA_ARCH_FEAT_SM120_ALL))
#define VA_ARCH_SPECIFIC_BODY 1
#else
#define VA_ARCH_SPECIFIC_BODY 0
#endif

namespace verify_attn {
namespace sm90 {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes the initialisations visible before any other thread uses the barriers
// (followed by a __syncthreads in the kernel).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                   smem_addr(bar))
               : "memory");
}

// Blocks until the phase with the given parity has completed. kSuspendNs > 0:
// each try suspends the thread until the phase completes or that many
// nanoseconds pass (PTX ISA 7.8, mbarrier.try_wait's suspendTimeHint) instead
// of the hardware's default time limit.
template <uint32_t kSuspendNs = 0>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_addr(bar);
  uint32_t done = 0;
  do {
    if constexpr (kSuspendNs == 0) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(addr), "r"(parity), "r"(kSuspendNs)
          : "memory");
    }
  } while (!done);
}

// This thread's cp.async copies issued so far complete on `bar` as one arrival
// (.noinc: the barrier's expected count includes every copying thread).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// bar.arrive: counts this thread on barrier `id` without waiting (the waiting
// side calls named_barrier_sync with the same total).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes (st.shared, and the
// cp.async copies it has waited for) before later async-proxy reads (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int REGS>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_SYNC_CUH_
