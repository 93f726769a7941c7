// Programmatic dependent launch (PDL), host side: with `pdl`, launches a
// kernel with cudaLaunchAttributeProgrammaticStreamSerialization, so its CTAs
// may be scheduled before the previous kernel of the stream has finished (that
// kernel's tail and this launch's latency overlap); without, an ordinary launch.
// Callers pass `pdl` only for sm_90 and newer devices (the sm_90a kernels; the
// merge when the device is sm_90+). The kernel must call grid_dependency_wait()
// (kernels/core/pdl.cuh) before it reads or writes any global memory.
// CUDA Runtime API, cudaLaunchKernelEx; CUDA C++ Programming Guide,
// "Programmatic Dependent Launch and Synchronization". Under stream capture the
// dependency becomes a programmatic edge of the graph.
#ifndef VERIFY_ATTN_PDL_LAUNCH_H_
#define VERIFY_ATTN_PDL_LAUNCH_H_

#include <cuda_runtime.h>

namespace verify_attn {

// cluster of more than one CTA: thread-block clusters of that shape
// (cudaLaunchAttributeClusterDimension; each grid dimension a multiple of
// the cluster's): the cluster MLA kernel's 2 x 1 x 1
// (kernels/mla_cluster_kernel.cuh) and a pair of splits' 1 x 1 x 2
// (kernels/core/pair_combine.cuh).
template <typename... Args>
cudaError_t launch_maybe_pdl(bool pdl, void (*kernel)(Args...), dim3 grid, unsigned threads,
                             size_t smem_bytes, cudaStream_t stream, dim3 cluster,
                             const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = cluster.x;
    attrs[n].val.clusterDim.y = cluster.y;
    attrs[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_PDL_LAUNCH_H_
