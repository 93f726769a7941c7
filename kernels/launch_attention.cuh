// Host-side launch of attention_kernel for one Loader: dispatch plan.config x
// dtype (x the cache's fp8-ness) to a template instance, set its shared-memory attribute once per
// device, launch on the caller's stream, then the merge when split.
// Included by flat.cu and paged.cu only (each instantiates its own Loader).
#ifndef VERIFY_ATTN_LAUNCH_ATTENTION_CUH_
#define VERIFY_ATTN_LAUNCH_ATTENTION_CUH_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/attention_kernel.cuh"
#include "kernels/gqa_roles_kernel.cuh"
#include "kernels/gqa_roles_r32_kernel.cuh"
#include "kernels/launch.h"
#include "kernels/mla_cluster_kernel.cuh"
#include "kernels/mla_split_kernel.cuh"
#include "kernels/pdl_launch.h"
#include "kernels/plan.h"
#include "kernels/sm90/mla_seesaw_kernel.cuh"
#include "kernels/sm90/mla_wgmma_kernel.cuh"
#include "kernels/sm90/tma_host.h"
#include "kernels/status.h"

namespace verify_attn {

// The kernel template a tile shape runs.
template <class Shape, typename DT, class Loader>
constexpr auto kernel_for() {
  if constexpr (Shape::kWgmma) {
    if constexpr (Shape::kSeesawTma) {
      return mla_seesaw_kernel<Shape, DT, Loader>;
    } else {
      return mla_wgmma_kernel<Shape, DT, Loader>;
    }
  } else if constexpr (Shape::kSplitRoles && Shape::kVIsK && Shape::kClusterX > 1) {
    return mla_cluster_kernel<Shape, DT, Loader>;
  } else if constexpr (Shape::kSplitRoles && Shape::kVIsK) {
    return mla_split_kernel<Shape, DT, Loader>;
  } else if constexpr (Shape::kSplitRoles && Shape::kRowsPerWarp == 32) {
    return gqa_roles_r32_kernel<Shape, DT, Loader>;
  } else if constexpr (Shape::kSplitRoles) {
    return gqa_roles_kernel<Shape, DT, Loader>;
  } else {
    return attention_kernel<Shape, DT, Loader>;
  }
}

// Once per (kernel, device): check that an image for this device exists and
// raise the dynamic shared-memory limit when above the 48 KB default.
template <class Shape, typename DT, class Loader>
va_status prepare_kernel(int device, int sm_arch) {
  static std::atomic<uint64_t> ready{0};
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (ready.load(std::memory_order_acquire) & bit)) return VA_OK;
  auto kernel = kernel_for<Shape, DT, Loader>();
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorInvalidDeviceFunction || e == cudaErrorNoKernelImageForDevice)
      return va_fail(VA_ERR_UNSUPPORTED,
                     "device: this library has no kernel image for sm_%d (%s)", sm_arch,
                     cudaGetErrorName(e));
    return va_check_cuda(e, "cudaFuncGetAttributes(attention_kernel)");
  }
  if (Shape::kSmemBytes > 48 * 1024) {
    va_status st = va_check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Shape::kSmemBytes),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    if (st != VA_OK) return st;
  }
  if (bit != 0) ready.fetch_or(bit, std::memory_order_acq_rel);
  return VA_OK;
}


template <int ID, class Loader>
va_status launch_config(const KernelParams& kp, const Plan& plan, int dtype, void* stream);

// The kernel of a tile shape on `kp` (+ the merge when split).
template <class Shape, typename DT, class Loader>
va_status launch_kernel(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  va_status st = prepare_kernel<Shape, DT, Loader>(plan.dev.device, plan.dev.sm_arch);
  if (st != VA_OK) return st;
  // In grid_coord's order (kernels/plan.h), as the kernel decodes it
  // (cta_coord: Shape::kRowsGrid && kp.grid_rows_fastest, kp from this plan).
  dim3 grid;
  launch_grid(plan, Shape::kRowsGrid && plan.grid_rows_fastest, kp.batch_size, kp.num_kv_heads,
              &grid.x, &grid.y, &grid.z);
  grid.x *= Shape::kClusterX;  // a cluster's CTAs side by side along x (cta_coord)
  // A pair of splits (grid z = 2) as one cluster: kernels/core/pair_combine.cuh.
  const dim3 cluster(Shape::kClusterX, 1, plan.pair_splits ? 2 : 1);
  cudaGetLastError();  // drop a stale, non-sticky error so the check below is ours
  // The sm_90a kernels are programmatic dependents of whatever ran before
  // them in the stream (kernels/pdl_launch.h): their launch and set-up
  // overlap that kernel's tail; they wait (grid_dependency_wait) before
  // touching global memory.
  const cudaError_t e = launch_maybe_pdl(Shape::kWgmma, kernel_for<Shape, DT, Loader>(), grid,
                                         Shape::kThreads, Shape::kSmemBytes,
                                         static_cast<cudaStream_t>(stream), cluster, kp);
  if (e != cudaSuccess) cudaGetLastError();
  st = va_check_cuda(e != cudaSuccess ? e : cudaGetLastError(), "attention_kernel launch");
  if (st != VA_OK) return st;
  if (plan.splits > 1 && !plan.pair_splits) return launch_merge(kp, plan, dtype, Shape::kDv, stream);
  return VA_OK;
}

template <class Shape, typename DT, class Loader>
va_status launch_one(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  if constexpr (!Shape::kWgmma) {
    return launch_kernel<Shape, DT, Loader>(kp, plan, dtype, stream);
  } else if constexpr (Shape::kRowsGather && !Loader::kPaged) {
    // Never planned (kernels/plan.cc: page_size 1 only); not compiled for flat caches.
    return va_fail(VA_ERR_UNSUPPORTED, "kv_layout: the rows-map TMA configuration needs a paged cache");
  } else {
    // The tensor maps go into a copy of the parameters (the caller's stay as
    // they are). K, for the TMA kernel: flat caches (each tile 64 consecutive
    // rows) and kRowsGather (page_size 1 planned for a kv_slot_runs hint: each
    // tile boxed when its slots are consecutive, else gathered) through the
    // map of the cache's rows, paged caches (page_size % 64 == 0) through the
    // page map. Q and the unsplit output where the plan took their maps
    // (Plan::q_tma / o_tma). The plan chose all of them by the maps' own rules
    // (kernels/plan.cc), so an encoding the driver refuses is an error, never a
    // silent change of kernel.
    KernelParams kp_tma = kp;
    if constexpr (k_by_tma<Shape>()) {
      constexpr bool kRowsMap = !Loader::kPaged || Shape::kRowsGather;
      const va_status ks = kRowsMap ? encode_k_rows_tmap(&kp_tma, dtype, /*paged=*/Loader::kPaged)
                                    : encode_k_tmap(&kp_tma, dtype);
      if (ks != VA_OK) return ks;
    }
    const va_status st = encode_q_o_tmaps(&kp_tma, plan, dtype);
    if (st != VA_OK) return st;
    return launch_kernel<Shape, DT, Loader>(kp_tma, plan, dtype, stream);
  }
}

template <class Shape, class Loader>
va_status launch_shape(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  if (dtype == VA_DTYPE_BF16)
    return launch_one<Shape, __nv_bfloat16, Loader>(kp, plan, dtype, stream);
  return launch_one<Shape, half, Loader>(kp, plan, dtype, stream);
}

template <int ID, class Loader>
va_status launch_config(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  using Shape = typename ConfigShape<ID>::type;
  if (plan.kv_fp8) {  // the instance whose load warps convert an e4m3 cache (kernels/plan.h, KvFp8)
    if constexpr (kv_fp8_ok<Shape>()) {
      return launch_shape<KvFp8<Shape>, Loader>(kp, plan, dtype, stream);
    } else {
      return va_fail(VA_ERR_UNSUPPORTED, "kv_dtype: configuration %s has no fp8-cache instance", plan.name);
    }
  }
  if constexpr (k_by_tma<Shape>()) {
    if constexpr (!(Shape::kRowsGather && !Loader::kPaged)) {  // (rows map: paged only)
      // The instance that skips invisible draft tiles (Plan::skip_draft_tiles).
      using Skip = TileShapeWgmmaMla<true, Shape::kRowsGather, true>;
      if (plan.skip_draft_tiles) return launch_shape<Skip, Loader>(kp, plan, dtype, stream);
    }
  }
  return launch_shape<Shape, Loader>(kp, plan, dtype, stream);
}

template <class Loader>
va_status launch_attention(const KernelParams& kp, const Plan& plan, int dtype, void* stream) {
  switch (plan.config) {
    case kCfgMlaM32N32S1: return launch_config<kCfgMlaM32N32S1, Loader>(kp, plan, dtype, stream);
    case kCfgGqa64M64N64S2: return launch_config<kCfgGqa64M64N64S2, Loader>(kp, plan, dtype, stream);
    case kCfgGqa128M64N64S2: return launch_config<kCfgGqa128M64N64S2, Loader>(kp, plan, dtype, stream);
    case kCfgGqa256M64N32S2: return launch_config<kCfgGqa256M64N32S2, Loader>(kp, plan, dtype, stream);
    case kCfgGqa256M64N32S1: return launch_config<kCfgGqa256M64N32S1, Loader>(kp, plan, dtype, stream);
    case kCfgMlaWgmmaM64N64PR: return launch_config<kCfgMlaWgmmaM64N64PR, Loader>(kp, plan, dtype, stream);
    case kCfgMlaWgmmaSeesawTma: return launch_config<kCfgMlaWgmmaSeesawTma, Loader>(kp, plan, dtype, stream);
    case kCfgMlaWgmmaSeesawRows: return launch_config<kCfgMlaWgmmaSeesawRows, Loader>(kp, plan, dtype, stream);
    case kCfgMlaSplitM32N32: return launch_config<kCfgMlaSplitM32N32, Loader>(kp, plan, dtype, stream);
    case kCfgGqa64Roles: return launch_config<kCfgGqa64Roles, Loader>(kp, plan, dtype, stream);
    case kCfgGqa128Roles: return launch_config<kCfgGqa128Roles, Loader>(kp, plan, dtype, stream);
    case kCfgGqa128RolesS3: return launch_config<kCfgGqa128RolesS3, Loader>(kp, plan, dtype, stream);
    case kCfgMlaClusterM64N32: return launch_config<kCfgMlaClusterM64N32, Loader>(kp, plan, dtype, stream);
    case kCfgGqa64RolesM256: return launch_config<kCfgGqa64RolesM256, Loader>(kp, plan, dtype, stream);
    case kCfgGqa128RolesM256: return launch_config<kCfgGqa128RolesM256, Loader>(kp, plan, dtype, stream);
    default: break;
  }
  return va_fail(VA_ERR_UNSUPPORTED, "config: unknown configuration id %d",
                 static_cast<int>(plan.config));
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LAUNCH_ATTENTION_CUH_
