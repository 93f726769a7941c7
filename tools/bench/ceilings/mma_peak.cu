// The mma.sync ceiling of the bench: the rate of register-only warp-level
// mma.sync.m16n8k16 bf16 -> fp32 on this GPU (8 independent accumulator chains
// per warp, no memory traffic). It is the most a kernel built from mma.sync
// alone can reach, and the only tensor-core instruction sm_120 has (no wgmma,
// no tcgen05), so the portable kernels are reported as a fraction of it.
//
//   mma_peak [iters]   prints one JSON line:
//   {"device": ..., "sms": N, "mma_sync_tflops": best, "configs": {"w8_b2": x, ...}}
//
// Each configuration (warps per block x blocks per SM) is timed with CUDA
// events, best of 5 launches after a warm-up; the best configuration is the
// ceiling. FLOPs per mma: 2 * 16 * 8 * 16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kChains = 8;

__global__ void mma_loop(float* out, int iters) {
  // Operands vary per lane so nothing folds; their values do not matter.
  const unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u;
  const unsigned b0 = a0 ^ 0x3c00u, b1 = a0 ^ 0x3e00u;
  float c[kChains][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kChains; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 12345.f) out[threadIdx.x] = s;  // keeps the chains live; never true in practice
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "mma_peak: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 4096;
  if (iters < 1) {
    std::fprintf(stderr, "mma_peak: iters must be >= 1\n");
    return 2;
  }
  int dev = 0, sms = 0;
  cudaDeviceProp prop;
  if (!ok(cudaGetDevice(&dev), "cudaGetDevice") ||
      !ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties") ||
      !ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count"))
    return 1;
  float* out = nullptr;
  if (!ok(cudaMalloc(&out, 4096 * sizeof(float)), "cudaMalloc")) return 1;
  cudaEvent_t e0, e1;
  if (!ok(cudaEventCreate(&e0), "cudaEventCreate") || !ok(cudaEventCreate(&e1), "cudaEventCreate"))
    return 1;
  double best = 0.0;
  char configs[1024];
  int len = 0;
  configs[0] = '\0';
  for (int warps : {4, 8, 16}) {
    for (int per_sm : {1, 2, 4}) {
      const dim3 grid(sms * per_sm), block(32 * warps);
      mma_loop<<<grid, block>>>(out, 64);
      if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "warm-up")) return 1;
      float best_ms = 1e30f;
      for (int r = 0; r < 5; ++r) {
        cudaEventRecord(e0);
        mma_loop<<<grid, block>>>(out, iters);
        cudaEventRecord(e1);
        if (!ok(cudaGetLastError(), "launch") || !ok(cudaEventSynchronize(e1), "run")) return 1;
        float ms = 0.f;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best_ms) best_ms = ms;
      }
      const double flops = 2.0 * 16 * 8 * 16 * kChains * double(iters) * grid.x * warps;
      const double tflops = flops / (best_ms * 1e-3) / 1e12;
      if (tflops > best) best = tflops;
      len += std::snprintf(configs + len, sizeof(configs) - len, "%s\"w%d_b%d\": %.1f",
                           len ? ", " : "", warps, per_sm, tflops);
    }
  }
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"iters\": %d, \"mma_sync_tflops\": %.1f, \"configs\": {%s}}\n",
              prop.name, sms, iters, best, configs);
  cudaFree(out);
  return 0;
}
