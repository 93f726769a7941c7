// Stand-ins for the CUDA launchers (flat.cu, paged.cu, merge.cu) in the C-ABI
// fuzzer: the fuzzer runs on a CPU machine with its pointers fake, so any
// launch is a bug (validation let a call through that should have stopped, or
// a device was found). abort() makes libFuzzer report it as a crash with the
// input that caused it.
#include <cstdio>
#include <cstdlib>

#include "kernels/launch.h"

namespace verify_attn {

[[noreturn]] static void launched(const char* what) {
  std::fprintf(stderr, "capi_fuzz: %s was called: a kernel launch must never happen here\n", what);
  std::abort();
}

va_status launch_flat(const KernelParams&, const Plan&, int, void*) { launched("launch_flat"); }
va_status launch_paged(const KernelParams&, const Plan&, int, void*) { launched("launch_paged"); }
va_status launch_merge(const KernelParams&, const Plan&, int, int, void*) { launched("launch_merge"); }

}  // namespace verify_attn

// build_info.cu (nvcc) is not in the fuzz build: the plan asks it whether an
// sm_90a image exists; answer as the default Bazel build does.
extern "C" const char* va_compiled_archs(void) { return "sm_90a,sm_120a"; }
