// What the compute-core microbenchmarks (mla_core.cu, gqa_core.cu) share
// around their kernels: deterministic random inputs on the device and the
// timing of a launch (one warm-up, then the best of N, by CUDA events).
#ifndef VERIFY_ATTN_TOOLS_DEV_MICROBENCH_HARNESS_H_
#define VERIFY_ATTN_TOOLS_DEV_MICROBENCH_HARNESS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <utility>
#include <vector>

namespace microbench {

// A linear congruential generator: the same inputs on every run.
struct Lcg {
  unsigned x = 12345u;
  unsigned next() { return x = x * 1664525u + 1013904223u; }
  // bf16 values in [-0.5, 0.5) in steps of 1 / 1024.
  void fill(std::vector<__nv_bfloat16>& v) {
    for (auto& e : v) e = __float2bfloat16(((next() >> 9) & 1023) / 1024.f - 0.5f);
  }
  // 0 .. n - 1 shuffled: the scattered slots of a page_size 1 pool.
  std::vector<int> permutation(int n) {
    std::vector<int> p(n);
    for (int i = 0; i < n; ++i) p[i] = i;
    for (int i = n - 1; i > 0; --i) std::swap(p[i], p[next() % (i + 1)]);
    return p;
  }
};

// A device copy of h (cudaMalloc + cudaMemcpy; kept for the process).
template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

// Milliseconds of the fastest of `launches` calls of launch() after one
// warm-up call, each timed by a pair of events on the default stream.
template <class F>
float best_ms(F&& launch, int launches) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launch();
  float best = 1e30f;
  for (int i = 0; i < launches; ++i) {
    cudaEventRecord(e0);
    launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ms < best) best = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

}  // namespace microbench

#endif  // VERIFY_ATTN_TOOLS_DEV_MICROBENCH_HARNESS_H_
