// Does compute-sanitizer racecheck model the two hand-offs of the warp-role
// kernels (kernels/mla_split_kernel.cuh, kernels/gqa_roles_kernel.cuh)? Each
// kernel below is one of them in isolation, correct by construction, and the
// program checks its results:
//   named: a producer warpgroup writes a double-buffered shared array after
//          bar.sync on the buffer's EMPTY barrier and signals FULL with
//          bar.arrive; the consumer warpgroup bar.syncs on FULL, reads, and
//          bar.arrives on EMPTY (the P buffers of mla_split_kernel);
//   mbar:  load threads fill a 2-stage ring with 16-byte cp.async, each
//          thread's copies completing on the stage's `full` mbarrier
//          (cp.async.mbarrier.arrive.noinc); consumer warps wait on `full`,
//          read, and arrive on `empty`, which the load threads wait on before
//          the refill (the K / V stages of both warp-role kernels).
// Hazards that racecheck reports here are its model's, not the kernels'.
// Build here (`tools/bazelw build //tools/dev/microbench:racecheck_probe`),
// carry the binary, run it on the GPU machine:
//   compute-sanitizer --tool racecheck racecheck_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/core/mma.cuh"
#include "kernels/sm90/sync.cuh"

namespace {

constexpr int kIters = 64;
constexpr int kWidth = 128;  // threads per role, elements per buffer

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      return 2;                                                                        \
    }                                                                                  \
  } while (0)

// 256 threads: warps 0-3 produce, 4-7 consume. Barriers 1 + b: FULL of buffer
// b, 3 + b: EMPTY of buffer b.
__global__ void __launch_bounds__(256) named_handoff(float* out) {
  __shared__ float buf[2][kWidth];
  const int tid = threadIdx.x % kWidth;
  if (threadIdx.x < kWidth) {
    for (int i = 0; i < kIters; ++i) {
      const int b = i & 1;
      verify_attn::sm90::named_barrier_sync(3 + b, 2 * kWidth);
      buf[b][tid] = static_cast<float>(i * kWidth + tid);
      verify_attn::sm90::named_barrier_arrive(1 + b, 2 * kWidth);
    }
  } else {
    verify_attn::sm90::named_barrier_arrive(3, 2 * kWidth);  // both buffers start free
    verify_attn::sm90::named_barrier_arrive(4, 2 * kWidth);
    float acc = 0.f;
    for (int i = 0; i < kIters; ++i) {
      const int b = i & 1;
      verify_attn::sm90::named_barrier_sync(1 + b, 2 * kWidth);
      acc += buf[b][(tid + 1) % kWidth];
      if (i + 2 < kIters) verify_attn::sm90::named_barrier_arrive(3 + b, 2 * kWidth);
    }
    out[tid] = acc;
  }
}

// 256 threads: warps 0-3 load, 4-7 consume; stage s holds kWidth float4.
__global__ void __launch_bounds__(256) mbar_handoff(const float4* in, float* out) {
  __shared__ __align__(16) float4 stage[2][kWidth];
  __shared__ __align__(8) uint64_t full[2], empty[2];
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      verify_attn::sm90::mbar_init(full + s, kWidth);  // one cp.async arrival per load thread
      verify_attn::sm90::mbar_init(empty + s, 4);      // one arrival per consumer warp
    }
    verify_attn::sm90::mbar_init_fence();
  }
  __syncthreads();
  const int tid = threadIdx.x % kWidth, lane = threadIdx.x & 31;
  if (threadIdx.x < kWidth) {
    for (int i = 0; i < kIters; ++i) {
      const int s = i & 1;
      if (i >= 2) verify_attn::sm90::mbar_wait(empty + s, static_cast<uint32_t>((i / 2) & 1) ^ 1u);
      verify_attn::cp_async_16(&stage[s][tid], in + i * kWidth + tid, true);
      verify_attn::sm90::cp_async_arrive_noinc(full + s);
    }
    verify_attn::cp_async_commit();
    verify_attn::cp_async_wait<0>();
  } else {
    float acc = 0.f;
    for (int i = 0; i < kIters; ++i) {
      const int s = i & 1;
      verify_attn::sm90::mbar_wait(full + s, static_cast<uint32_t>((i / 2) & 1));
      acc += stage[s][(tid + 1) % kWidth].x;
      __syncwarp();
      if (lane == 0) verify_attn::sm90::mbar_arrive(empty + s);
    }
    out[tid] = acc;
  }
}

}  // namespace

int main() {
  std::vector<float4> h_in(kIters * kWidth);
  for (int i = 0; i < kIters * kWidth; ++i) h_in[i] = make_float4(static_cast<float>(i), 0.f, 0.f, 0.f);
  float4* d_in = nullptr;
  float* d_out = nullptr;
  CHECK_CUDA(cudaMalloc(&d_in, h_in.size() * sizeof(float4)));
  CHECK_CUDA(cudaMalloc(&d_out, 2 * kWidth * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(d_in, h_in.data(), h_in.size() * sizeof(float4), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d_out, 0xff, 2 * kWidth * sizeof(float)));  // NaN until written
  named_handoff<<<1, 256>>>(d_out);
  CHECK_CUDA(cudaGetLastError());
  mbar_handoff<<<1, 256>>>(d_in, d_out + kWidth);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> h_out(2 * kWidth);
  CHECK_CUDA(cudaMemcpy(h_out.data(), d_out, h_out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int t = 0; t < kWidth; ++t) {
    double want = 0.0;  // sum over i of i * kWidth + (t + 1) % kWidth, in both kernels
    for (int i = 0; i < kIters; ++i) want += i * kWidth + (t + 1) % kWidth;
    for (int k = 0; k < 2; ++k)
      if (h_out[k * kWidth + t] != static_cast<float>(want)) ++bad;
  }
  std::printf("racecheck_probe: %s (%d wrong values of %d)\n", bad ? "FAILED" : "ok", bad, 2 * kWidth);
  CHECK_CUDA(cudaFree(d_in));
  CHECK_CUDA(cudaFree(d_out));
  return bad ? 1 : 0;
}
