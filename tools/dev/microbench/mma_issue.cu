// How many warps, and how many independent accumulator chains per warp, the
// tensor pipe needs under mma.sync.m16n8k16 (bf16 -> fp32) to reach the
// ceiling of tools/bench/ceilings/mma_peak.cu, with the B operand in registers
// or loaded by ldmatrix.x4 from shared memory (one per two MMAs, 256 bytes per
// MMA: the portable MLA kernel's S warps) -- the question behind
// docs/design_portable.md's "the pipe idles while the warps of a scheduler are
// in non-MMA phases": what rate do two or three MMA-issuing warps per
// scheduler reach at all.
//
// One CTA per SM (dynamic shared memory sized so a second cannot fit), W warps,
// each running CH chains; every configuration is timed with CUDA events (best
// of 5 after a warm-up).
//
//   mma_issue [iters]   prints one JSON line per configuration:
//   {"cfg": "w8_ch4_ldsm", "warps_per_scheduler": 2, "chains": 4, "ldsm": true, "tflops": x}
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/core/mma.cuh"
#include "tools/dev/microbench/harness.h"

namespace {

using verify_attn::ldmatrix_x4;
using verify_attn::mma_m16n8k16;
using bf16 = __nv_bfloat16;

constexpr int kSmemBytes = 100 * 1024;  // one CTA per SM
constexpr int kRing = 64;               // 512-byte ldmatrix.x4 slots cycled through

template <int CH, bool LDSM, int W>
__global__ void __launch_bounds__(32 * W, 1) mma_issue_kernel(float* out, int iters) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kRing * 128; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ static_cast<uint32_t>(i);
  __syncthreads();
  const uint32_t a[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
  uint32_t b[2][CH / 2][4];
#pragma unroll
  for (int p = 0; p < CH / 2; ++p)
#pragma unroll
    for (int r = 0; r < 4; ++r) b[0][p][r] = b[1][p][r] = threadIdx.x ^ (0x3c00u + 64u * r + p);
  float c[CH][4] = {};
  // Each lane gives one 16-byte row of the x4 load: 512 contiguous bytes, no bank conflict.
  const unsigned char* base = smem + lane * 16;
  if constexpr (LDSM) {
#pragma unroll
    for (int p = 0; p < CH / 2; ++p) ldmatrix_x4(b[0][p], base + (p % kRing) * 512);
  }
  // Two iterations per trip so that the fragment buffers are indexed by constants (registers, not local memory).
  auto step = [&](auto cur_c, int it) {
    constexpr int cur = decltype(cur_c)::value;
    if constexpr (LDSM) {
      // The next iteration's fragments load while this one's MMAs issue.
#pragma unroll
      for (int p = 0; p < CH / 2; ++p) ldmatrix_x4(b[cur ^ 1][p], base + (((it + 1) * (CH / 2) + p) % kRing) * 512);
    }
#pragma unroll
    for (int p = 0; p < CH / 2; ++p) {
      mma_m16n8k16<bf16>(c[2 * p], a, b[LDSM ? cur : 0][p][0], b[LDSM ? cur : 0][p][1]);
      mma_m16n8k16<bf16>(c[2 * p + 1], a, b[LDSM ? cur : 0][p][2], b[LDSM ? cur : 0][p][3]);
    }
  };
  for (int it = 0; it < iters; it += 2) {
    step(std::integral_constant<int, 0>{}, it);
    step(std::integral_constant<int, 1>{}, it + 1);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < CH; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 12345.f) out[threadIdx.x] = s;  // keeps the chains live; never true in practice
}

template <int CH, bool LDSM, int W>
void run(int sms, int iters, float* out) {
  constexpr int warps = W;
  auto kernel = mma_issue_kernel<CH, LDSM, W>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  const float ms = microbench::best_ms([&] { kernel<<<sms, 32 * warps, kSmemBytes>>>(out, iters); }, 5);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "mma_issue: w%d ch%d: %s\n", warps, CH, cudaGetErrorString(e));
    std::exit(1);
  }
  const double flops = 2.0 * 16 * 8 * 16 * CH * double(iters) * sms * warps;  // iters is even
  std::printf("{\"cfg\": \"w%d_ch%d%s\", \"warps_per_scheduler\": %d, \"chains\": %d, \"ldsm\": %s, \"tflops\": %.1f}\n",
              warps, CH, LDSM ? "_ldsm" : "", warps / 4, CH, LDSM ? "true" : "false", flops / (ms * 1e-3) / 1e12);
}

// 32 chains (128 accumulator registers) only up to 8 warps: more would spill.
template <int W>
void run_warps(int sms, int iters, float* out) {
  run<4, false, W>(sms, iters, out);
  run<8, false, W>(sms, iters, out);
  run<16, false, W>(sms, iters, out);
  run<4, true, W>(sms, iters, out);
  run<8, true, W>(sms, iters, out);
  if constexpr (W <= 8) {
    run<32, false, W>(sms, iters, out);
    run<32, true, W>(sms, iters, out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = (argc > 1 ? std::atoi(argv[1]) : 4096) & ~1;  // even: two per trip
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess || iters < 1) {
    std::fprintf(stderr, "mma_issue: no device, or iters < 1\n");
    return 1;
  }
  float* out = nullptr;
  cudaMalloc(&out, 1024 * sizeof(float));
  run_warps<4>(sms, iters, out);
  run_warps<8>(sms, iters, out);
  run_warps<12>(sms, iters, out);
  run_warps<16>(sms, iters, out);
  cudaFree(out);
  return 0;
}
