// Programmatic dependent launch (PDL), device side: a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization (kernels/pdl_launch.h)
// may start while the previous kernel of the stream is still running; it must
// not touch global memory that kernel could write before grid_dependency_wait()
// returns (which waits for that kernel's completion and its memory). A kernel
// calls allow_dependents() once it no longer needs the SMs to itself: the
// next PDL launch in the stream may then be scheduled (it still waits in its
// own grid_dependency_wait() for this kernel's results).
//
// CUDA C++ Programming Guide, "Programmatic Dependent Launch and
// Synchronization"; PTX ISA 7.8, "griddepcontrol". Both are no-ops without a
// programmatic dependency (an ordinary launch) and on architectures before
// sm_90, which have neither.
#ifndef VERIFY_ATTN_CORE_PDL_CUH_
#define VERIFY_ATTN_CORE_PDL_CUH_

namespace verify_attn {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_PDL_CUH_
