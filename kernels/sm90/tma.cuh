// Bulk tensor copies (TMA) of the sm_90a path: one 64 x 64 block of the paged
// K cache (128-byte swizzled, the layout of kernels/sm90/swizzle.cuh) per copy,
// completing on an mbarrier by transaction bytes; and the output tile's blocks
// back to global memory (tma_store_block).
//
// Device side here; the tensor map itself is encoded on the host
// (kernels/sm90/tma_host.h) into KernelParams::k_tmap, which the kernel reads
// through its __grid_constant__ parameter. PTX ISA 8.0: "cp.async.bulk.tensor",
// "mbarrier.arrive.expect_tx". Coordinates outside the tensor (a bad or absent
// page) are filled with zeros by the copy engine and still count their bytes.
#ifndef VERIFY_ATTN_SM90_TMA_CUH_
#define VERIFY_ATTN_SM90_TMA_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"

namespace verify_attn {
namespace sm90 {

// One arrival on `bar` that also expects `bytes` more transaction bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// Box {c0 .. c0 + 63 (columns), c1 .. c1 + 63 (slots of a page), page c2} of
// the 3-D map [page][slot][column] into `dst` (1024-byte aligned).
// kEvictFirst: with an L2 evict_first cache policy ("createpolicy",
// ".L2::cache_hint"; PTX ISA 8.0), as FlashMLA's sm_90 kernel copies its K
// tiles (CacheHintSm90::EVICT_FIRST); the K copies of CTAs with at most
// kEvictFirstMaxTiles tiles use it (kernels/sm90/mla_tma_producer.cuh says
// why only those), the Q tile's copies do not.
template <bool kEvictFirst = false>
__device__ __forceinline__ void tma_load_block(void* dst, const void* tmap, uint64_t* bar, int c0,
                                               int c1, int c2) {
  if constexpr (kEvictFirst) {
    asm volatile(
        "{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], pol;\n}\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
        : "memory");
  }
}

// The 64 x 64 block at `src` (1024-byte aligned, in the map's swizzle) to box
// {c0, c1, c2} of the map, in this thread's bulk async-group (PTX ISA 8.0,
// "cp.async.bulk.tensor", shared::cta -> global). The caller fences its
// shared-memory writes for the async proxy first (fence_proxy_async).
__device__ __forceinline__ void tma_store_block(const void* tmap, const void* src, int c0, int c1,
                                                int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Closes this thread's bulk async-group ("cp.async.bulk.commit_group").
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until this thread's bulk async-groups have read their shared-memory
// sources ("cp.async.bulk.wait_group.read"), so the CTA may exit (its shared
// memory goes) or overwrite them; the global writes complete by the grid's end.
__device__ __forceinline__ void bulk_wait_group_read0() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// The tensor map's descriptor into the constant cache ahead of its first copy
// (PTX ISA 8.0, "prefetch.tensormap"); a kernel parameter, so no global read.
__device__ __forceinline__ void tma_prefetch_map(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_TMA_CUH_
