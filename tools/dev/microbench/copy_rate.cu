// How fast can the sm_90 copy engine bring a page_size-1 MLA tile into shared
// memory? A micro-benchmark for issue 8's page-1 target (BENCHMARKS.md): the
// TMA kernel's 64 x 64 boxes need 64 consecutive cache rows, a scattered tile
// falls back to cp.async gathers (15-20% slower), and one 64 x 1 box per row
// and column block (576 copies per tile) runs 4.5x slower. It also measures
// one 1-D bulk copy (cp.async.bulk, no tensor map) per row, 1,152 bytes, 64
// per tile, which no kernel uses. Its rows land unswizzled, so
// a kernel using them would read K / V through ldmatrix (wgmma's A operand
// from registers), not as a wgmma shared-memory descriptor: this only measures
// whether the copies themselves are fast enough to be worth that kernel.
//
// Each CTA (one per SM) streams its tiles (64 rows x 576 bf16 = 73,728 bytes)
// through `stages` shared-memory stages with no compute: a stage is refilled
// as soon as its copies landed. Modes:
//   box64  : 9 boxes of 64 x 64 (128-byte swizzle), 64 consecutive rows (page 64)
//   bulk1d : 64 copies of one whole row (1,152 bytes), scattered rows
//   box1   : 576 boxes of 64 x 1 (128-byte swizzle), scattered rows
//   cpasync: 16-byte cp.async, consecutive threads on consecutive chunks of a row
//   cp_row : 16-byte cp.async, one row per thread (the cp.async kernel's mapping)
//   ldg_sts: 16-byte loads into registers (9 in flight per thread), then stores
//   cp_arrv: cpasync, each thread's copies handed to the stage's mbarrier
//            (cp.async.mbarrier.arrive.noinc) instead of waited for
//   box64pf / box64p128 / box64p0: box64 with a 1-D L2 prefetch of the tile
//            `stages` ahead / through maps with 128-byte / no L2 promotion
// `issuers`: threads that issue a tile's copies (box64 / bulk1d / box1, in a
// CTA of 128), or the CTA's threads (cpasync / cp_row / ldg_sts). Scattered
// rows are a random permutation of the cache's; a CTA's tiles are spread over it.
// Prints the median time of `reps` launches (CUDA events), the bytes per second,
// and the bytes per SM cycle (clock64 per CTA).
//
// Build here (`tools/bazelw build //tools/dev/microbench:copy_rate`,
// the hermetic nvcc), carry the binary, run it on the GPU machine:
// `copy_rate <cache rows> <tiles per CTA> <launches>` (BUILD.bazel has the two
// runs BENCHMARKS.md reports: DRAM-fed and L2-fed).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

// The library's own primitives: shared-memory addresses and cp.async
// (kernels/core/mma.cuh), mbarriers (kernels/sm90/sync.cuh), the bulk tensor
// copy of one block (kernels/sm90/tma.cuh) and the tensor-map encoder
// (kernels/sm90/tma_host.h); only what the kernels do not use is written here.
#include "kernels/core/mma.cuh"
#include "kernels/sm90/sync.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/tma_host.h"

using verify_attn::smem_addr;
using verify_attn::sm90::cp_async_arrive_noinc;
using verify_attn::sm90::mbar_arrive_expect_tx;
using verify_attn::sm90::mbar_init;
using verify_attn::sm90::mbar_init_fence;
using verify_attn::sm90::mbar_wait;
using verify_attn::sm90::tma_load_block;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                   \
                   cudaGetErrorString(e_));                                            \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kRowBytes = 1152;           // 576 bf16
constexpr int kTileBytes = 64 * kRowBytes;  // 73,728
enum Mode {
  kBox64 = 0, kBulk1d = 1, kBox1 = 2, kCpAsync = 3, kCpAsyncRow = 4, kLdgSts = 5, kCpAsyncArrive = 6,
  kBox64Pf = 7,     // box64 + a 1-D L2 prefetch of the tile `stages` ahead (73,728 contiguous bytes)
  kBox64P128 = 8,   // box64 through a map with 128-byte L2 promotion (box64: 256)
  kBox64PNone = 9,  // ... and with none
};

// One block of a map [1][rows][576] (box 64 columns x box_rows rows): row
// `row`, columns c0 .. c0 + 63 (tma_load_block's 3-D copy, page 0).
__device__ __forceinline__ void box(void* dst, const CUtensorMap* m, uint64_t* b, int c0, int row) {
  tma_load_block(dst, m, b, c0, row, 0);
}
// Not in the kernels: a 1-D bulk copy (PTX ISA 8.0, "cp.async.bulk"), a 1-D
// L2 prefetch and a thread's cp.async copies handed to an mbarrier; cp16 is
// the kernels' cp_async_16 with every source valid.
__device__ __forceinline__ void bulk1d(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(b))
      : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  verify_attn::cp_async_16(dst, src, true);
}

struct Args {
  const unsigned char* cache;  // rows x 1152 bytes
  const int* rows;             // scattered modes: the cache row of each tile row
  long long n_tile_slots;      // tiles in `rows` (scattered) / the cache (box64)
  int tiles;                   // per CTA
  int stages;
  int issuers;
  int mode;
  long long* cycles;           // per CTA
  unsigned long long* sink;    // keeps the loads live
};

__global__ void __launch_bounds__(512, 1)
    stream_tiles(const __grid_constant__ CUtensorMap map64, const __grid_constant__ CUtensorMap map1,
                 const __grid_constant__ CUtensorMap map64_p128,
                 const __grid_constant__ CUtensorMap map64_pnone, Args a) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* sm = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t bar[4];
  __shared__ int s_ids[2][64];  // cpasync / cp_arrv / ldg_sts: tile rows, one tile ahead
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid == 0) {
    // The copy-engine modes: one arrival (thread 0's expect_tx); cpasync_arrive:
    // every thread's cp.async.mbarrier.arrive.noinc.
    for (int s = 0; s < a.stages; ++s) mbar_init(&bar[s], a.mode == kCpAsyncArrive ? blockDim.x : 1);
    mbar_init_fence();
  }
  __syncthreads();
  const long long t0 = clock64();
  // Tile i of this CTA: tile slot (CTA * tiles + i) * odd mod slots, a
  // bijection when the slots are a power of two, so no two of the grid's
  // tiles share a slot while the cache has as many (then every byte comes from
  // DRAM once); a smaller cache is read over and over (L2-fed).
  auto slot = [&](int i) -> long long {
    const unsigned long long x =
        (unsigned long long)((long long)blockIdx.x * a.tiles + i) * 2654435761ull;
    return (long long)(x % (unsigned long long)a.n_tile_slots);
  };
  // cpasync / cp_arrv / ldg_sts: a tile's 64 row ids are read into shared
  // memory one tile ahead by threads 0..63 (the cp.async kernel's staged
  // rows), so no id load waits in front of the copies.
  auto ids_first = [&] {
    if (tid < 64) s_ids[0][tid] = __ldg(a.rows + slot(0) * 64 + tid);
    __syncthreads();
  };
  auto ids_load_next = [&](int i) -> int {
    return (tid < 64 && i + 1 < a.tiles) ? __ldg(a.rows + slot(i + 1) * 64 + tid) : 0;
  };
  auto ids_store_next = [&](int i, int v) {
    if (tid < 64 && i + 1 < a.tiles) s_ids[(i + 1) & 1][tid] = v;
    __syncthreads();
  };
  if (a.mode == kCpAsync) {
    // Every thread of the CTA shares each tile's 4,608 chunks of 16 bytes
    // (consecutive threads, consecutive chunks of a row); a commit group per
    // tile, `stages` groups in flight.
    ids_first();
    for (int i = 0; i < a.tiles; ++i) {
      const int s = i % a.stages;
      unsigned char* st = sm + s * kTileBytes;
      const int nxt = ids_load_next(i);
      for (int k = 0; k < 4608 / (int)blockDim.x; ++k) {
        const int c = tid + blockDim.x * k;  // chunk of the tile, row-major
        const int r = c / 72, q = c % 72;
        cp16(st + r * kRowBytes + q * 16, a.cache + (long long)s_ids[i & 1][r] * kRowBytes + q * 16);
      }
      verify_attn::cp_async_commit();
      ids_store_next(i, nxt);
      if (a.stages == 2) verify_attn::cp_async_wait<1>();
      else verify_attn::cp_async_wait<2>();
    }
    verify_attn::cp_async_wait<0>();
    __syncthreads();
  } else if (a.mode == kCpAsyncArrive) {
    // As cpasync, but each thread hands its copies to the stage's mbarrier
    // (cp.async.mbarrier.arrive.noinc: the arrival happens when they land) and
    // a stage is reused after its barrier's phase completed, as a producer
    // that never waits for its own copies would run.
    ids_first();
    for (int i = 0; i < a.tiles; ++i) {
      const int s = i % a.stages;
      if (i >= a.stages) mbar_wait(&bar[s], ((i / a.stages) - 1) & 1);
      unsigned char* st = sm + s * kTileBytes;
      const int nxt = ids_load_next(i);
      for (int k = 0; k < 4608 / (int)blockDim.x; ++k) {
        const int c = tid + blockDim.x * k;
        const int r = c / 72, q = c % 72;
        cp16(st + r * kRowBytes + q * 16, a.cache + (long long)s_ids[i & 1][r] * kRowBytes + q * 16);
      }
      cp_async_arrive_noinc(&bar[s]);
      ids_store_next(i, nxt);
    }
    for (int i = max(0, a.tiles - a.stages); i < a.tiles; ++i)
      mbar_wait(&bar[i % a.stages], (i / a.stages) & 1);
  } else if (a.mode == kCpAsyncRow) {
    // The cp.async kernel's mapping: one tile row per thread, all 72 chunks of
    // it; each 64 threads fill their own stage tile after tile, waiting for
    // their copies before the next (blockDim / 64 tiles in flight).
    const int h = tid / 64, nh = blockDim.x / 64, r = tid % 64;
    unsigned char* st = sm + h * kTileBytes;
    for (int i = h; i < a.tiles; i += nh) {
      const long long row = __ldg(a.rows + slot(i) * 64 + r);
      const unsigned char* src = a.cache + row * kRowBytes;
      for (int q = 0; q < 72; ++q) cp16(st + r * kRowBytes + q * 16, src + q * 16);
      verify_attn::cp_async_commit();
      verify_attn::cp_async_wait<0>();
    }
    __syncthreads();
  } else if (a.mode == kLdgSts) {
    // Through registers: 9 x 16-byte loads in flight per thread, then stores
    // (the CTA's threads share each tile's 4,608 chunks).
    const int nt = blockDim.x;
    ids_first();
    for (int i = 0; i < a.tiles; ++i) {
      const int s = i % a.stages;
      unsigned char* st = sm + s * kTileBytes;
      const int nxt = ids_load_next(i);
      for (int k0 = 0; k0 < 4608 / nt; k0 += 9) {
        uint4 v[9];
#pragma unroll
        for (int u = 0; u < 9; ++u) {
          const int c = tid + nt * (k0 + u);
          const int r = c / 72, q = c % 72;
          v[u] = (k0 + u) < 4608 / nt
                     ? __ldcg(reinterpret_cast<const uint4*>(a.cache + (long long)s_ids[i & 1][r] * kRowBytes + q * 16))
                     : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 9; ++u) {
          const int c = tid + nt * (k0 + u);
          if ((k0 + u) < 4608 / nt) *reinterpret_cast<uint4*>(st + (c / 72) * kRowBytes + (c % 72) * 16) = v[u];
        }
      }
      ids_store_next(i, nxt);
    }
    __syncthreads();
  } else {
    // Copy-engine modes: threads [0, issuers) issue a tile's copies; thread 0
    // arms the stage's barrier first; every thread waits for the stage.
    const bool issuer = tid < a.issuers;
    for (int i = 0; i < a.tiles; ++i) {
      const int s = i % a.stages;
      if (i >= a.stages) mbar_wait(&bar[s], ((i / a.stages) - 1) & 1);
      __syncthreads();
      if (tid == 0) mbar_arrive_expect_tx(&bar[s], kTileBytes);
      __syncthreads();
      unsigned char* st = sm + s * kTileBytes;
      const long long ts = slot(i);
      if (issuer) {
        if (a.mode == kBox64 || a.mode == kBox64Pf || a.mode == kBox64P128 || a.mode == kBox64PNone) {
          const CUtensorMap* m = a.mode == kBox64P128 ? &map64_p128 : a.mode == kBox64PNone ? &map64_pnone : &map64;
          if (a.mode == kBox64Pf && tid == 0 && i + a.stages < a.tiles)
            prefetch_l2(a.cache + slot(i + a.stages) * kTileBytes, kTileBytes);
          for (int b = tid; b < 9; b += a.issuers) box(st + b * 8192, m, &bar[s], b * 64, (int)(ts * 64));
        } else if (a.mode == kBulk1d) {
          for (int r = tid; r < 64; r += a.issuers) {
            const int row = __ldg(a.rows + ts * 64 + r);
            bulk1d(st + r * kRowBytes, a.cache + (long long)row * kRowBytes, kRowBytes, &bar[s]);
          }
        } else {  // kBox1
          for (int c = tid; c < 576; c += a.issuers) {
            const int r = c / 9, b = c % 9;
            const int row = __ldg(a.rows + ts * 64 + r);
            box(st + b * 8192 + r * 128, &map1, &bar[s], b * 64, row);
          }
        }
      }
    }
    for (int i = max(0, a.tiles - a.stages); i < a.tiles; ++i)
      mbar_wait(&bar[i % a.stages], (i / a.stages) & 1);
  }
  const long long t1 = clock64();
  if (tid == 0) {
    a.cycles[blockIdx.x] = t1 - t0;
    atomicAdd(a.sink, (unsigned long long)sm[lane * 64 + 7]);
  }
}

// A [1][rows][576] bf16 map, boxes of 64 columns x box_rows rows, through the
// kernels' encoder (128-byte swizzle; L2 promotion `promo`).
static CUtensorMap make_map(const void* base, long long rows, int box_rows,
                            CUtensorMapL2promotion promo = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = verify_attn::tensor_map_encoder();
  if (encode == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  CUtensorMap m;
  const cuuint64_t dims[3] = {576, static_cast<cuuint64_t>(rows), 1};
  const cuuint64_t strides[2] = {kRowBytes, static_cast<cuuint64_t>(rows) * kRowBytes};
  const cuuint32_t boxdim[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const CUresult r =
      verify_attn::encode_map_3d(encode, &m, base, VA_DTYPE_BF16, dims, strides, boxdim, promo);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", (int)r);
    std::exit(1);
  }
  return m;
}

int main(int argc, char** argv) {
  // Usage: copy_rate <cache_rows> <tiles_per_cta> <reps>; every mode / stage
  // count / issuer count of the list below.
  const long long cache_rows = argc > 1 ? std::atoll(argv[1]) : (1 << 18);
  const int tiles = argc > 2 ? std::atoi(argv[2]) : 64;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  unsigned char* cache;
  CK(cudaMalloc(&cache, cache_rows * kRowBytes));
  CK(cudaMemset(cache, 0x3c, cache_rows * kRowBytes));
  // A random permutation of the cache rows: scattered tiles.
  std::vector<int> perm(cache_rows);
  for (long long i = 0; i < cache_rows; ++i) perm[i] = (int)i;
  std::mt19937_64 rng(12345);
  std::shuffle(perm.begin(), perm.end(), rng);
  int* rows;
  CK(cudaMalloc(&rows, cache_rows * sizeof(int)));
  CK(cudaMemcpy(rows, perm.data(), cache_rows * sizeof(int), cudaMemcpyHostToDevice));
  long long* cycles;
  CK(cudaMalloc(&cycles, sms * sizeof(long long)));
  unsigned long long* sink;
  CK(cudaMalloc(&sink, sizeof(unsigned long long)));
  const CUtensorMap map64 = make_map(cache, cache_rows, 64);
  const CUtensorMap map1 = make_map(cache, cache_rows, 1);
  const CUtensorMap map64_p128 = make_map(cache, cache_rows, 64, CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
  const CUtensorMap map64_pnone = make_map(cache, cache_rows, 64, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  const int smem = 3 * kTileBytes + 1024;
  CK(cudaFuncSetAttribute(stream_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::printf("%s, %d SMs, cache %lld rows (%.1f MB), %d tiles per CTA, median of %d launches\n",
              prop.name, sms, cache_rows, cache_rows * kRowBytes / 1e6, tiles, reps);
  std::printf("%-9s %6s %7s %10s %9s %12s %14s\n", "mode", "stages", "issuers", "us", "TB/s",
              "B/SM-cycle", "cycles/tile");
  struct Case {
    int mode, stages, issuers;
  };
  const char* names[] = {"box64", "bulk1d", "box1", "cpasync", "cp_row",
                         "ldg_sts", "cp_arrv", "box64pf", "box64p128", "box64p0"};
  // {mode, stages, issuers (copy engine) or threads (cpasync / cp_row / ldg_sts)}
  const Case cases[] = {{kBox64, 2, 1},     {kBulk1d, 2, 1},    {kBulk1d, 2, 32},
                        {kBulk1d, 2, 64},   {kBulk1d, 2, 128},  {kBulk1d, 3, 128},
                        {kBox1, 2, 128},    {kCpAsync, 2, 128}, {kCpAsync, 2, 256},
                        {kCpAsync, 2, 512}, {kCpAsyncRow, 2, 128}, {kCpAsyncRow, 2, 192},
                        {kLdgSts, 2, 128},  {kLdgSts, 2, 256},  {kLdgSts, 2, 512},
                        {kCpAsync, 2, 192}, {kCpAsync, 2, 384}, {kCpAsync, 3, 256},
                        {kCpAsyncArrive, 2, 128}, {kCpAsyncArrive, 2, 256}, {kCpAsyncArrive, 2, 384},
                        {kBox64, 3, 1},     {kBox64, 2, 9},     {kBox64Pf, 2, 1},
                        {kBox64P128, 2, 1}, {kBox64PNone, 2, 1}};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const Case& c : cases) {
    Args a{cache, rows, cache_rows / 64, tiles, c.stages, c.issuers, c.mode, cycles, sink};
    std::vector<float> ts;
    std::vector<long long> cyc(sms);
    double cyc_mean = 0;
    for (int r = 0; r < reps + 1; ++r) {
      CK(cudaEventRecord(e0));
      const int threads = c.mode >= kCpAsync ? c.issuers : 128;
      stream_tiles<<<sms, threads, smem>>>(map64, map1, map64_p128, map64_pnone, a);
      CK(cudaGetLastError());
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r > 0) ts.push_back(ms);  // the first launch warms up
    }
    CK(cudaMemcpy(cyc.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost));
    for (long long v : cyc) cyc_mean += (double)v / sms;
    std::sort(ts.begin(), ts.end());
    const double us = ts[ts.size() / 2] * 1e3;
    const double bytes = (double)sms * tiles * kTileBytes;
    std::printf("%-9s %6d %7d %10.1f %9.2f %12.1f %14.0f\n", names[c.mode], c.stages, c.issuers, us,
                bytes / us / 1e6, (double)tiles * kTileBytes / cyc_mean, cyc_mean / tiles);
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
