// The compute core of candidate sm_120 MLA kernels, without the loads: what
// fraction of the mma.sync ceiling (tools/bench/ceilings/mma_peak.cu) each
// warp organization reaches when its KV tiles already sit in shared memory.
// A design step of issue 40 (docs/design_portable.md, "The budget of one
// sm_120 CTA for MLA"): it decides between one CTA per row tile and the
// cluster split before either kernel is written.
//
// One CTA per SM (the dynamic shared memory is sized so that a second cannot
// fit, as on sm_120), a ring of KS KV-tile stages of N rows, and two (three)
// roles in producer / consumer order:
//   load warps (the `_load` configurations): gather each tile's rows from a
//     global pool at random slots (page_size 1) with 16-byte cp.async, each
//     thread's copies completing on the stage's "full" mbarrier
//     (cp.async.mbarrier.arrive.noinc); a stage is refilled once the S and O
//     warps released it. Without load warps the stages are filled once and
//     their contents stay put (the compute core alone);
//   S warps: Q fragments in registers for the whole loop, S = Q K^T over the
//     warp's dims (K fragments by ldmatrix), with the dims split between two
//     warps when `pairs` = 2 (the partial scores then cross through shared
//     memory, as they would cross through distributed shared memory between
//     the two CTAs of a cluster), online softmax, P (bf16) and the rows'
//     rescale factors into shared memory;
//   O warps: O += P V for their rows x value columns, P by ldmatrix from shared
//     memory, V by ldmatrix.trans from the same K tile; O stays in registers.
// Configurations (FLOPs counted: the CTA's rows x 32 KV rows x (its Q K^T
// dims + its value columns) x 2 per tile):
//   m32_full   32 rows, 2 S warps x 16 rows x 576 dims, 4 O warps x 32 rows x 128 cols
//   m32_pair   32 rows, 4 S warps (2 row groups x 2 dim halves), 4 O warps x 32 x 128
//   m64_half   one CTA of a 2-CTA cluster splitting the dims: 64 rows, 288 dims, 256 value
//              columns; 2 S warps x 32 rows x 288 dims, 4 O warps x 64 rows x 64 cols; the
//              partial scores written and read back through local shared memory (the
//              traffic of the exchange, not the latency of distributed shared memory)
//   m64_half4  the same with 4 S warps x 16 rows x 288 dims
//   m64_half4_2ch  the same with the S warps' even and odd k-steps in separate
//              accumulators (8 independent mma chains per warp instead of 4)
//   m64_half8  64 rows, 288 dims: 8 S warps as 4 row groups x 2 halves of the tile's
//              32 columns (16 x 16 x 288 each; the two warps of a row group trade
//              their row maxima through shared memory), 4 O warps x 64 x 64
//   *_oload    fed by the 4 O warps instead of a load warpgroup (12 warps, 170
//              registers each without setmaxnreg; 16 warps would cap every thread
//              at 128, below an O warp's 64 x 64 accumulators): tile it + KS into
//              tile it's stage once every O warp is done with its V
//   m64_q32pair  64 rows, 288 dims: 4 S warps as 2 row groups of 32 x 2 halves of
//              144 dims (each K fragment feeds two m16 tiles: 128 B per mma in
//              Q K^T instead of 256), the pair's partial scores crossing through
//              shared memory; both warps of a pair run the softmax of its 32 rows
//   m128_q4    one CTA of a 4-CTA cluster splitting the dims: 128 rows, 144 dims (128
//              value columns and 16 rope dims), 128 value columns; 4 S warps x 32 rows x
//              144 dims (Q in 72 registers, each K fragment feeding two m16 tiles: 128 B
//              per mma, 8 independent chains), 4 O warps x 64 rows x 64 cols; the same
//              FLOPs per tile as m64_half. The exchange stands in for a reduce-scatter
//              of the four CTAs' partial scores (each warp writes and reads its 4 KB)
//   m64_half_bal  m64_half's 2 S warps of 32 rows alone on schedulers 0 and 1, the O
//              warps two each on schedulers 2 and 3 (kBal)
//   *_look2 / *_look3  the S warps' K fragments 2 / 3 k-steps ahead of their MMAs
//   *_g2       two S warp groups taking alternate tiles, the rows' softmax state
//              handed between them in tile order (the cluster kernel's form, kG2):
//              m64_half4_g2 is that kernel's core; m64_half_bal_g2 its 32-row S
//              warps (each K fragment feeding two m16 tiles: 128 B of K per mma
//              instead of 256), one of each group on schedulers 0 and 1, the O warps
//              two each on schedulers 2 and 3
//   m64_fused  the same CTA's work without the S / O split (FlashAttention-2's warp:
//              8 warps of 16 rows, each Q K^T, softmax and P V with P in registers,
//              2 groups taking alternate tiles; fused_kernel); _load: fed by 4 load
//              warps; _self: the compute warps gather their group's tiles
//   *_prof     the same with the S and O warps' cycles per tile by phase (kProf)
//   *_load     the same fed by 4 load warps (a whole warpgroup: setmaxnreg is per warpgroup) from a
//              37.7 MB pool of 576-wide rows at random slots: 32-row tiles in 2 or 3
//              stages, or 16-row tiles in 4 (what fits 101,376 bytes)
//
// In the `_load` configurations setmaxnreg moves registers from the load warps
// (56) to the S and O warps (216), as a warp-specialized kernel does.
//
//   mla_core [tiles per CTA] [launches]   prints one JSON line per configuration
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/core/mma.cuh"
#include "kernels/core/types.cuh"
#include "kernels/sm90/sync.cuh"
#include "tools/dev/microbench/harness.h"

namespace {

using verify_attn::ldmatrix_x4;
using verify_attn::ldmatrix_x4_trans;
using verify_attn::mma_m16n8k16;
using verify_attn::cp_async_16;
using verify_attn::smem_addr;
using verify_attn::sm90::cp_async_arrive_noinc;
using verify_attn::sm90::mbar_arrive;
using verify_attn::sm90::mbar_init;
using verify_attn::sm90::mbar_wait;
using verify_attn::sm90::named_barrier_arrive;
using verify_attn::sm90::named_barrier_sync;
using bf16 = __nv_bfloat16;

constexpr int kPoolRows = 32768;  // the global KV pool the load warps gather from (37.7 MB at 576 dims)

// M rows, DQK dims of Q K^T, DV value columns (all this CTA's); S warps of QR
// rows x QD dims (pairs = DQK / QD warps share rows); O warps of PR rows x PC cols.
// N KV rows per tile, KS stages, LW load warps (0: stages filled once).
// FL: kBal (1) places 2 S warps alone on schedulers 0 and 1 (warps 0, 1) and
// the 4 O warps two each on schedulers 2 and 3 (warps 2, 3, 6, 7; 4 and 5
// idle): each scheduler then issues about the same number of mma per tile
// (144 vs 128) where 32-row S warps on warps 0, 1 beside O warps would load
// two schedulers with 208. kProf (2) counts the S and O warps' cycles per tile
// by phase (clock(); issue times, so an mma's latency shows in the phase that
// first reads its result).
// kLook2 / kLook3 (4 / 8): the S warps load K fragments 2 / 3 k-steps ahead
// of the MMAs that use them (1 without).
// kG2 (16): two S warp groups taking alternate tiles, the rows' softmax state
// handed from group to group in tile order (the cluster kernel's form): with
// kBal the groups' 32-row S warps share schedulers 0 and 1 (warps 0, 1 and
// 4, 5), else the groups are warps 0-3 and 4-7 and the O warps 8-11.
constexpr int kBal = 1, kProf = 2, kLook2 = 4, kLook3 = 8, kG2 = 16;

template <int M, int DQK, int DV, int QR, int QD, int PR, int PC, bool XCH, int N_, int KS, int LW, int CH = 1,
          int NS = 1, bool OL = false, int FL = 0>
struct Cfg {
  static_assert(LW == 0 || LW == 4, "setmaxnreg needs the load warps to be one whole warpgroup");
  static_assert(NS == 1 || (NS == 2 && DQK == QD), "column halves only without a dim split");
  static_assert(!(OL && LW), "the O warps load, or the load warps do");
  static constexpr int kN = N_;
  static constexpr int kStages = KS;
  static constexpr int kLoadWarps = LW;
  static constexpr bool kExchange = XCH;
  static constexpr int kColSplit = NS;  // S warps per row group splitting the tile's columns
  static constexpr bool kOLoad = OL;   // the O warps gather the tiles (no load warpgroup)
  static constexpr int kChains = CH;  // S accumulator sets (k-steps round-robin): CH x MT x N / 8 independent mma chains
  static constexpr int kPairs = DQK / QD;
  static constexpr int kSWarps = (M / QR) * kPairs * NS;
  static constexpr int kOWarps = (M / PR) * (DV / PC);
  static constexpr bool kBalanced = (FL & kBal) != 0;
  static constexpr bool kProfiled = (FL & kProf) != 0;
  static constexpr int kLook = 1 + ((FL >> 2) & 3);  // K fragment lookahead of the S warps, in k-steps
  static constexpr int kGroups = (FL & kG2) ? 2 : 1;  // S warp groups (kSWarps each) taking alternate tiles
  static_assert(!kBalanced || (kSWarps == 2 && kOWarps == 4), "the balanced placement is for 2 S + 4 O warps");
  static_assert(kGroups == 1 || (kPairs == 1 && NS == 1 && (kBalanced || (kSWarps == 4 && kOWarps == 4))),
                "two groups: one S warp per row group, the cluster kernel's 4 + 4 + 4 or the balanced placement");
  static constexpr int kComputeThreads = (kSWarps + kOWarps) * 32;  // the named barriers' count: one group + O
  static constexpr int kComputeWarps = kBalanced ? 8 : kGroups * kSWarps + kOWarps;  // warps before the load warps
  static constexpr int kThreads = kComputeWarps * 32 + LW * 32;
  // setmaxnreg per compute warpgroup (the load warps give back down to kRegsLoad).
  static constexpr int kRegsWg0 = kGroups == 2 ? (kBalanced ? 224 : 144) : kBalanced ? 240 : 216;
  static constexpr int kRegsWg1 = kGroups == 2 ? (kBalanced ? 224 : 144) : kBalanced ? 200 : 216;
  static constexpr int kRegsWg2 = kComputeWarps > 8 ? 176 : 0;
  static constexpr int kRegsLoad = kComputeWarps > 8 ? 48 : 56;
  static_assert(LW == 0 || 128 * (kRegsWg0 + kRegsWg1 + kRegsWg2 + kRegsLoad) <= kThreads * (65536 / kThreads / 8 * 8),
                "setmaxnreg budget");
  // S warp index of warp w within its group (-1: not an S warp), its group, O warp index likewise.
  __device__ static int s_index(int w) {
    if (kBalanced) return kGroups == 2 ? ((w & 3) < 2 ? (w & 3) : -1) : (w < 2 ? w : -1);
    return w < kGroups * kSWarps ? w % kSWarps : -1;
  }
  __device__ static int s_group(int w) { return kGroups == 1 ? 0 : kBalanced ? w / 4 : w / kSWarps; }
  __device__ static int o_index(int w) {
    if (kBalanced) return (w == 2 || w == 3) ? w - 2 : (w == 6 || w == 7) ? w - 4 : -1;
    return (w >= kGroups * kSWarps && w < kGroups * kSWarps + kOWarps) ? w - kGroups * kSWarps : -1;
  }
  static constexpr int kKStride = DQK + 8;  // bf16 per K row: 16 B of padding keeps ldmatrix conflict-free
  static constexpr int kPStride = kN + 8;
  static constexpr int kKBytes = kN * kKStride * 2;
  static constexpr int kPBytes = M * kPStride * 2;
  static constexpr int kXFloats = (QR / 16) * (kN / 8 / NS) * 4;  // partial scores per lane
  static constexpr int kChainFloats = kGroups == 2 ? (M / QR) * 32 * 4 * (QR / 16) : 0;  // a lane's m, l per row group
  static constexpr int kSmem =
      KS * kKBytes + 2 * kPBytes + 2 * M * 4 + 2 * kSWarps * kXFloats * 32 * 4 + 2 * kSWarps * 2 * 2 * 8 * 4 +
      kChainFloats * 4 + 2 * KS * 8;
  static constexpr double kFlopPerTile = 2.0 * M * kN * (DQK + DV);
};

template <class C, int M, int DQK, int DV, int QR, int QD, int PR, int PC>
__global__ void __launch_bounds__(C::kThreads, 1)
    core_kernel(const bf16* __restrict__ gK, const bf16* __restrict__ gQ, const bf16* __restrict__ pool,
                const int* __restrict__ slots, float* out, unsigned long long* prof, int tiles) {
  constexpr int N = C::kN, KS = C::kStages, CT = C::kComputeThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);                                          // [KS][N][kKStride]
  bf16* sP = reinterpret_cast<bf16*>(smem + KS * C::kKBytes);                        // [2][M][kPStride]
  float* sA = reinterpret_cast<float*>(smem + KS * C::kKBytes + 2 * C::kPBytes);     // [2][M]
  float* sX = sA + 2 * M;                                                            // [2][S warps][kXFloats][32]
  float* sMx = sX + 2 * C::kSWarps * C::kXFloats * 32;                               // [2][S warps][2][2][8]: row maxima
  float* sChain = sMx + 2 * C::kSWarps * 2 * 2 * 8;                                 // [row groups][32][4 MT] (kG2)
  uint64_t* full = reinterpret_cast<uint64_t*>(sChain + C::kChainFloats);            // [KS]
  uint64_t* empty = full + KS;                                                       // [KS]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (C::kLoadWarps == 0 && !C::kOLoad) {
    for (int i = threadIdx.x; i < KS * N * C::kKStride; i += C::kThreads) {
      const int col = i % C::kKStride, row = (i / C::kKStride) % N;
      sK[i] = col < DQK ? gK[(row % 32) * DQK + col] : __float2bfloat16(0.f);
    }
  } else if (threadIdx.x < KS) {
    mbar_init(full + threadIdx.x, C::kOLoad ? C::kOWarps * 32 : C::kLoadWarps * 32);
    mbar_init(empty + threadIdx.x, C::kSWarps + C::kOWarps);
  }
  __syncthreads();
  // Named barriers (0 is __syncthreads). kG2's chain (no pairs, no O loads
  // there): kChain + g x row groups + rg, arrived by group g, synced by the other.
  constexpr int kFull = 1, kEmpty = 3, kPair = 5, kOSync = 10, kChain = 5;
  static_assert(C::kGroups == 1 || kChain + 2 * (M / QR) <= 16, "named barrier ids");
  constexpr bool kFed = C::kLoadWarps > 0 || C::kOLoad;  // stages refilled per tile
  float acc_sum = 0.f;
  // Stage of tile it, and the parity of its fill.
  auto stage = [](int it) { return it % KS; };
  auto phase = [](int it) { return static_cast<uint32_t>((it / KS) & 1); };

  // Tile it's rows into its stage by threads lt of nthr, each thread's copies
  // completing on the stage's `full` (a CTA of a cluster splitting the dims
  // reads its part of every row: block x's part x % (576 / DQK)).
  auto fill = [&](int it, int lt, int nthr) {
    constexpr int kChunks = DQK * 2 / 16;  // 16-byte chunks per row of this CTA's dims
    const int dim_off = (blockIdx.x % (576 / DQK)) * DQK;
    const int st = stage(it);
    bf16* dst = sK + st * N * C::kKStride;
    const int base = (blockIdx.x * 7919 + it * N) % kPoolRows;
    for (int i = lt; i < N * kChunks; i += nthr) {
      const int row = i / kChunks, c = i - row * kChunks;
      const int slot = __ldg(slots + (base + row) % kPoolRows);
      cp_async_16(dst + row * C::kKStride + c * 8, pool + static_cast<int64_t>(slot) * 576 + dim_off + c * 8, true);
    }
    cp_async_arrive_noinc(full + st);
  };
  if (warp >= C::kComputeWarps) {
    // ---------------- load warps ----------------
    if constexpr (C::kLoadWarps > 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kRegsLoad));
      for (int it = 0; it < tiles; ++it) {
        if (it >= KS) mbar_wait(empty + stage(it), phase(it) ^ 1);
        fill(it, threadIdx.x - C::kComputeWarps * 32, C::kLoadWarps * 32);
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    }
    return;
  }
  // Role-pure warpgroups (two groups of 4 S warps, then the O warps) take
  // their registers inside their role's branch, so that each role's code is
  // allocated under its own budget; the other placements share one join.
  constexpr bool kRoleRegs = C::kGroups == 2 && !C::kBalanced;
  auto regs_s = [&] {
    if (warp < 4) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kRegsWg0));
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kRegsWg1));
    }
  };
  if constexpr (C::kLoadWarps > 0 && !kRoleRegs) regs_s();
  const int si = C::s_index(warp), oi = C::o_index(warp);
  if (si < 0 && oi < 0) return;  // an idle warp of the balanced placement
  // Phase cycles (kProfiled): S warps 0 wait full, 1 Q K^T issue, 2 exchange,
  // 3 softmax, 4 wait for a free P buffer, 5 P store; O warps 6 wait for P,
  // 7 rescale and P V; 8 / 9 the S / O warp-tiles counted.
  uint32_t ph[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t t_last = 0;
  auto mark = [&](int k) {
    if constexpr (C::kProfiled) {
      const uint32_t now = static_cast<uint32_t>(clock());
      ph[k] += now - t_last;
      t_last = now;
    }
  };

  if (si >= 0) {
    // ---------------- S warps ----------------
    if constexpr (C::kLoadWarps > 0 && kRoleRegs) regs_s();
    constexpr int MT = QR / 16, KT = QD / 16, NS = C::kColSplit, NT = N / 8 / NS;
    const int cs = si % NS, wp = si / NS;  // column half, then row group / dim half
    const int rg = wp / C::kPairs, dh = wp % C::kPairs;
    const int row0 = rg * QR, dim0 = dh * QD, col0 = cs * (N / NS);
    uint32_t q[MT][KT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = row0 + mi * 16 + g + (r & 1) * 8, col = dim0 + kk * 16 + 2 * t + (r >> 1) * 8;
          q[mi][kk][r] = verify_attn::DTypeTraits<bf16>::pack(__bfloat162float(gQ[row * DQK + col]), __bfloat162float(gQ[row * DQK + col + 1]));
        }
    float m_run[MT][2], l_run[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) m_run[mi][0] = m_run[mi][1] = -1e30f, l_run[mi][0] = l_run[mi][1] = 0.f;
    const float scale = 0.0601f;  // log2(e) / sqrt(576)
    if constexpr (C::kProfiled) t_last = static_cast<uint32_t>(clock());
    const int grp = C::s_group(warp);
    float* chain = sChain + (rg * 32 + lane) * 4 * MT;  // kG2: this lane's rows' m, l between the groups
    for (int it = grp; it < tiles; it += C::kGroups) {
      const int b = it & 1, st = stage(it);
      if constexpr (kFed) mbar_wait(full + st, phase(it));
      mark(0);
      const bf16* K = sK + (st * N + col0) * C::kKStride;
      constexpr int CHN = C::kChains;
      float sc[CHN][MT][NT][4];
#pragma unroll
      for (int c = 0; c < CHN; ++c)
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) sc[c][mi][nj][0] = sc[c][mi][nj][1] = sc[c][mi][nj][2] = sc[c][mi][nj][3] = 0.f;
      float(&s)[MT][NT][4] = sc[0];
      // Fragments of k-step kk + LK load while k-step kk's MMAs issue.
      constexpr int LK = C::kLook, KB = LK + 1;
      uint32_t kf[KB][NT / 2][4];
      const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8 + dim0;
#pragma unroll
      for (int k0 = 0; k0 < LK; ++k0)
#pragma unroll
        for (int p = 0; p < NT / 2; ++p)
          ldmatrix_x4(kf[k0][p], K + (p * 16 + krow) * C::kKStride + kcol + k0 * 16);
#pragma unroll
      for (int kk = 0; kk < KT; ++kk) {
        if (kk + LK < KT) {
#pragma unroll
          for (int p = 0; p < NT / 2; ++p)
            ldmatrix_x4(kf[(kk + LK) % KB][p], K + (p * 16 + krow) * C::kKStride + kcol + (kk + LK) * 16);
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int p = 0; p < NT / 2; ++p) {
            mma_m16n8k16<bf16>(sc[kk % CHN][mi][2 * p], q[mi][kk], kf[kk % KB][p][0], kf[kk % KB][p][1]);
            mma_m16n8k16<bf16>(sc[kk % CHN][mi][2 * p + 1], q[mi][kk], kf[kk % KB][p][2], kf[kk % KB][p][3]);
          }
      }
#pragma unroll
      for (int c = 1; c < CHN; ++c)
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int nj = 0; nj < NT; ++nj)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[mi][nj][r] += sc[c][mi][nj][r];
      mark(1);
      if constexpr (C::kLoadWarps > 0) {  // the S warps are done with this stage's K
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + st);
      }
      if constexpr (C::kExchange) {
        // Partial scores to the partner, the partner's back: the other warp of
        // the pair, or (pairs = 1) this warp itself, standing in for the
        // other CTA of a cluster that splits the dims.
        float* mine = sX + ((b * C::kSWarps + si) * C::kXFloats) * 32;
        const float* theirs = sX + ((b * C::kSWarps + (C::kPairs == 2 ? si ^ 1 : si)) * C::kXFloats) * 32;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int nj = 0; nj < NT; ++nj)
#pragma unroll
            for (int r = 0; r < 4; ++r) mine[((mi * NT + nj) * 4 + r) * 32 + lane] = s[mi][nj][r];
        if constexpr (C::kPairs == 2) {
          named_barrier_sync(kPair + rg, 64);
        } else {
          __syncwarp();
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int nj = 0; nj < NT; ++nj)
#pragma unroll
            for (int r = 0; r < 4; ++r) s[mi][nj][r] += theirs[((mi * NT + nj) * 4 + r) * 32 + lane];
        if constexpr (C::kPairs == 1) {
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int nj = 0; nj < NT; ++nj)
#pragma unroll
              for (int r = 0; r < 4; ++r) s[mi][nj][r] *= 0.5f;  // own partial read back: keep the scale
        }
      }
      mark(2);
      if constexpr (C::kGroups == 2) {
        if (it >= 1) {  // the other group's tile it - 1 left the rows' state
          named_barrier_sync(kChain + (grp ^ 1) * (M / QR) + rg, 64);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) m_run[mi][h] = chain[4 * mi + h], l_run[mi][h] = chain[4 * mi + 2 + h];
        }
      }
      // Online softmax of rows g and g + 8 of each m16 tile: the row maxima
      // over this warp's columns (the quad of lanes of a row), then, with the
      // columns split, over the other half's too (shared memory, one barrier
      // of the two warps; buffer b, rewritten two tiles later only after this
      // warp's next arrival).
      float alpha[MT][2], rmax[MT][2];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = m_run[mi][h];
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) mx = fmaxf(mx, fmaxf(s[mi][nj][2 * h], s[mi][nj][2 * h + 1]) * scale);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          rmax[mi][h] = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        }
      if constexpr (NS == 2) {
        float* mine = sMx + (b * C::kSWarps + si) * 32;
        const float* theirs = sMx + (b * C::kSWarps + (si ^ 1)) * 32;
        if (t == 0) {
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) mine[(mi * 2 + h) * 8 + g] = rmax[mi][h];
        }
        named_barrier_sync(kPair + rg, 64);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) rmax[mi][h] = fmaxf(rmax[mi][h], theirs[(mi * 2 + h) * 8 + g]);
      }
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float mx = rmax[mi][h];
          alpha[mi][h] = exp2f(m_run[mi][h] - mx);
          m_run[mi][h] = mx;
          float sum = 0.f;
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) {
            s[mi][nj][2 * h] = exp2f(s[mi][nj][2 * h] * scale - mx);
            s[mi][nj][2 * h + 1] = exp2f(s[mi][nj][2 * h + 1] * scale - mx);
            sum += s[mi][nj][2 * h] + s[mi][nj][2 * h + 1];
          }
          l_run[mi][h] = l_run[mi][h] * alpha[mi][h] + sum;
        }
      if constexpr (C::kGroups == 2) {
        if (it + 1 < tiles) {  // for the other group's tile it + 1
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) chain[4 * mi + h] = m_run[mi][h], chain[4 * mi + 2 + h] = l_run[mi][h];
          named_barrier_arrive(kChain + grp * (M / QR) + rg, 64);
        }
      }
      mark(3);
      named_barrier_sync(kEmpty + b, CT);  // the O warps are done with P[b] of tile it - 2
      mark(4);
      if (dh == 0) {
        bf16* P = sP + b * M * C::kPStride;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          const int r0 = row0 + mi * 16 + g;
#pragma unroll
          for (int nj = 0; nj < NT; ++nj) {
            *reinterpret_cast<uint32_t*>(P + r0 * C::kPStride + col0 + nj * 8 + 2 * t) = verify_attn::DTypeTraits<bf16>::pack(s[mi][nj][0], s[mi][nj][1]);
            *reinterpret_cast<uint32_t*>(P + (r0 + 8) * C::kPStride + col0 + nj * 8 + 2 * t) =
                verify_attn::DTypeTraits<bf16>::pack(s[mi][nj][2], s[mi][nj][3]);
          }
          if (t == 0 && cs == 0) {
            sA[b * M + r0] = alpha[mi][0];
            sA[b * M + r0 + 8] = alpha[mi][1];
          }
        }
      }
      named_barrier_arrive(kFull + b, CT);
      mark(5);
    }
    if constexpr (C::kGroups == 2) {
      named_barrier_sync(kEmpty + grp, CT);  // the O warps' last release of this group's buffer
    } else {
      named_barrier_sync(kEmpty + (tiles & 1), CT);  // the O warps' last two releases
      named_barrier_sync(kEmpty + ((tiles + 1) & 1), CT);
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) acc_sum += l_run[mi][0] + l_run[mi][1];
  } else {
    // ---------------- O warps ----------------
    if constexpr (C::kLoadWarps > 0 && kRoleRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kRegsWg2));
    constexpr int MT = PR / 16, NT = PC / 8;
    const int v = oi;
    const int rg = v / (DV / PC), cg = v % (DV / PC);
    const int row0 = rg * PR, col0 = cg * PC;
    float o[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj) o[mi][nj][0] = o[mi][nj][1] = o[mi][nj][2] = o[mi][nj][3] = 0.f;
    // With `OL` the O warps gather the tiles: the first KS now, tile it + KS
    // into tile it's stage once every O warp is done with its V (the S warps
    // were done with its K before they published P of tile it).
    const int olt = v * 32 + lane;
    if constexpr (C::kOLoad) {
      for (int it = 0; it < KS && it < tiles; ++it) fill(it, olt, C::kOWarps * 32);
    }
    named_barrier_arrive(kEmpty, CT);  // both P buffers start free
    named_barrier_arrive(kEmpty + 1, CT);
    if constexpr (C::kProfiled) t_last = static_cast<uint32_t>(clock());
    for (int it = 0; it < tiles; ++it) {
      const int b = it & 1, st = stage(it);
      named_barrier_sync(kFull + b, CT);  // P[b] written; the S warps saw stage st full
      if constexpr (kFed) mbar_wait(full + st, phase(it));  // the stage's copies, visible here too
      mark(6);
      const bf16* P = sP + b * M * C::kPStride;
      const bf16* V = sK + st * N * C::kKStride;
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        const float a0 = sA[b * M + row0 + mi * 16 + g], a1 = sA[b * M + row0 + mi * 16 + g + 8];
#pragma unroll
        for (int nj = 0; nj < NT; ++nj) o[mi][nj][0] *= a0, o[mi][nj][1] *= a0, o[mi][nj][2] *= a1, o[mi][nj][3] *= a1;
      }
#pragma unroll
      for (int kk = 0; kk < N / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
          ldmatrix_x4(pa[mi], P + (row0 + mi * 16 + (lane & 15)) * C::kPStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < NT / 2; ++p) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, V + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::kKStride + col0 + p * 16 +
                                    (lane >> 4) * 8);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            mma_m16n8k16<bf16>(o[mi][2 * p], pa[mi], vb[0], vb[1]);
            mma_m16n8k16<bf16>(o[mi][2 * p + 1], pa[mi], vb[2], vb[3]);
          }
        }
      }
      if constexpr (C::kLoadWarps > 0) {  // the O warps are done with this stage's V
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + st);
      }
      if constexpr (C::kOLoad) {
        named_barrier_sync(kOSync, C::kOWarps * 32);
        if (it + KS < tiles) fill(it + KS, olt, C::kOWarps * 32);
      }
      named_barrier_arrive(kEmpty + b, CT);
      mark(7);
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int nj = 0; nj < NT; ++nj) acc_sum += o[mi][nj][0] + o[mi][nj][3];
  }
  if constexpr (C::kProfiled) {
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < 8; ++k) atomicAdd(prof + k, static_cast<unsigned long long>(ph[k]));
      atomicAdd(prof + (si >= 0 ? 8 : 9), static_cast<unsigned long long>(tiles));
    }
  }
  if (acc_sum == 12345.678f) out[blockIdx.x * C::kThreads + threadIdx.x] = acc_sum;  // keeps the work alive
}

// m64_fused: the same CTA's work (64 rows, 288 dims of Q K^T, 256 value
// columns) with no S / O split: FlashAttention-2's warp, P kept in registers
// as the A operand of P V. 8 compute warps as 2 groups x 4 warps of 16 rows,
// the groups taking alternate tiles; each warp holds Q (72 registers) and its
// 16 rows' O over all 256 value columns (128), and its own online softmax, so
// no warp waits for another but at a stage's release (the group's 4 warps) and
// the exchange stand-in (a warp's partial scores written to shared memory and
// read back, as in the other configurations with pairs = 1). Each group keeps
// its own O and row state; combining the two at the end is not timed (one
// merge per CTA). KS stages of 32 rows; LW load warps (setmaxnreg: RC
// registers for the compute warps, 40 for the load warps), or with SELF the
// compute warps gather (each group refills its own KS / 2 stages once its 4
// warps are done with one; 255 registers), or neither (stages filled once).
template <int KS, int LW, int RC, bool SELF = false>
struct FusedCfg {
  static_assert(!SELF || (LW == 0 && KS % 2 == 0), "self-fed: each group owns KS / 2 stages");
  static constexpr bool kSelf = SELF;  // the compute warps gather (no load warps)
  static constexpr int kN = 32, kStages = KS, kLoadWarps = LW;
  static constexpr int kComputeWarps = 8;
  static constexpr int kThreads = (kComputeWarps + LW) * 32;
  static constexpr int kRegsCompute = RC, kRegsLoad = 40;
  static_assert(LW == 0 || 32 * (kComputeWarps * RC + LW * kRegsLoad) <= 65536, "setmaxnreg budget");
  static_assert(LW > 0 || RC == 255, "without load warps every thread has 255 registers");
  static constexpr int kKStride = 288 + 8;
  static constexpr int kKBytes = kN * kKStride * 2;
  static constexpr int kXFloats = 16;  // a lane's partial scores
  static constexpr int kSmem = KS * kKBytes + kComputeWarps * kXFloats * 32 * 4 + 2 * KS * 8;
  static constexpr double kFlopPerTile = 2.0 * 64 * kN * (288 + 256);
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    fused_kernel(const bf16* __restrict__ gK, const bf16* __restrict__ gQ, const bf16* __restrict__ pool,
                 const int* __restrict__ slots, float* out, int tiles) {
  constexpr int N = C::kN, KS = C::kStages, KST = C::kKStride;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);                              // [KS][N][KST]
  float* sX = reinterpret_cast<float*>(smem + KS * C::kKBytes);          // [8 warps][16][32]
  uint64_t* full = reinterpret_cast<uint64_t*>(sX + C::kComputeWarps * C::kXFloats * 32);
  uint64_t* empty = full + KS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  auto stage = [](int it) { return it % KS; };
  auto phase = [](int it) { return static_cast<uint32_t>((it / KS) & 1); };
  // Tile it's rows into its stage by threads lt of nthr (the self-fed form's group).
  auto gather = [&](int it, int lt, int nthr) {
    constexpr int kChunks = 288 * 2 / 16;
    bf16* dst = sK + stage(it) * N * KST;
    const int base = (blockIdx.x * 7919 + it * N) % kPoolRows;
    for (int i = lt; i < N * kChunks; i += nthr) {
      const int row = i / kChunks, c = i - row * kChunks;
      const int slot = __ldg(slots + (base + row) % kPoolRows);
      cp_async_16(dst + row * KST + c * 8, pool + static_cast<int64_t>(slot) * 576 + c * 8, true);
    }
    cp_async_arrive_noinc(full + stage(it));
  };
  if constexpr (C::kLoadWarps == 0 && !C::kSelf) {
    for (int i = threadIdx.x; i < KS * N * KST; i += C::kThreads) {
      const int col = i % KST, row = (i / KST) % N;
      sK[i] = col < 288 ? gK[(row % 32) * 576 + col] : __float2bfloat16(0.f);
    }
  } else if (threadIdx.x < KS) {
    mbar_init(full + threadIdx.x, C::kSelf ? 128 : C::kLoadWarps * 32);
    mbar_init(empty + threadIdx.x, 4);  // the 4 warps of the group that reads the stage
  }
  __syncthreads();
  if constexpr (C::kSelf) {
    // Each group fills its first KS / 2 tiles (its stages: it % KS with it of its parity).
    const int grp0 = (threadIdx.x >> 5) >> 2;
    for (int it = grp0; it < KS && it < tiles; it += 2) gather(it, threadIdx.x & 127, 128);
  }
  if (warp >= C::kComputeWarps) {
    if constexpr (C::kLoadWarps > 0) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kRegsLoad));
      const int lt = threadIdx.x - C::kComputeWarps * 32;
      constexpr int kChunks = 288 * 2 / 16;
      for (int it = 0; it < tiles; ++it) {
        const int st = stage(it);
        if (it >= KS) mbar_wait(empty + st, phase(it) ^ 1);
        bf16* dst = sK + st * N * KST;
        const int base = (blockIdx.x * 7919 + it * N) % kPoolRows;
        for (int i = lt; i < N * kChunks; i += C::kLoadWarps * 32) {
          const int row = i / kChunks, c = i - row * kChunks;
          const int slot = __ldg(slots + (base + row) % kPoolRows);
          cp_async_16(dst + row * KST + c * 8, pool + static_cast<int64_t>(slot) * 576 + c * 8, true);
        }
        cp_async_arrive_noinc(full + st);
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    }
    return;
  }
  if constexpr (C::kLoadWarps > 0) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kRegsCompute));
  const int grp = warp >> 2, w = warp & 3, row0 = w * 16;
  uint32_t q[18][4];
#pragma unroll
  for (int kk = 0; kk < 18; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = row0 + g + (r & 1) * 8, col = kk * 16 + 2 * t + (r >> 1) * 8;
      q[kk][r] = verify_attn::DTypeTraits<bf16>::pack(__bfloat162float(gQ[row * 576 + col]),
                                                      __bfloat162float(gQ[row * 576 + col + 1]));
    }
  float o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-1e30f, -1e30f}, l_run[2] = {0.f, 0.f};
  const float scale = 0.0601f;  // log2(e) / sqrt(576)
  const int krow = (lane & 7) + ((lane >> 4) << 3), kcol = ((lane >> 3) & 1) * 8;
  const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;
  float* x_mine = sX + warp * C::kXFloats * 32 + lane;
  for (int it = grp; it < tiles; it += 2) {
    const int st = stage(it);
    if constexpr (C::kLoadWarps > 0 || C::kSelf) mbar_wait(full + st, phase(it));
    const bf16* K = sK + st * N * KST;
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    uint32_t kf[2][2][4];
#pragma unroll
    for (int pp = 0; pp < 2; ++pp) ldmatrix_x4(kf[0][pp], K + (pp * 16 + krow) * KST + kcol);
#pragma unroll
    for (int kk = 0; kk < 18; ++kk) {
      if (kk + 1 < 18) {
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) ldmatrix_x4(kf[(kk + 1) & 1][pp], K + (pp * 16 + krow) * KST + kcol + (kk + 1) * 16);
      }
#pragma unroll
      for (int pp = 0; pp < 2; ++pp) {
        mma_m16n8k16<bf16>(s[2 * pp], q[kk], kf[kk & 1][pp][0], kf[kk & 1][pp][1]);
        mma_m16n8k16<bf16>(s[2 * pp + 1], q[kk], kf[kk & 1][pp][2], kf[kk & 1][pp][3]);
      }
    }
    // The exchange stand-in: this warp's partial scores out and back in.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) x_mine[(j * 4 + r) * 32] = s[j][r];
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) s[j][r] = (s[j][r] + x_mine[(j * 4 + r) * 32]) * 0.5f;
    // Online softmax of rows g and g + 8.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m_run[h];
#pragma unroll
      for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]) * scale);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      alpha[h] = exp2f(m_run[h] - mx);
      m_run[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[j][2 * h] = exp2f(s[j][2 * h] * scale - mx);
        s[j][2 * h + 1] = exp2f(s[j][2 * h + 1] * scale - mx);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      l_run[h] = l_run[h] * alpha[h] + sum;
    }
    // P as the A operand of P V (k-step kk: score tiles 2 kk and 2 kk + 1).
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      pa[kk][0] = verify_attn::DTypeTraits<bf16>::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = verify_attn::DTypeTraits<bf16>::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = verify_attn::DTypeTraits<bf16>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = verify_attn::DTypeTraits<bf16>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) o[j][0] *= alpha[0], o[j][1] *= alpha[0], o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int p = 0; p < 16; ++p) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, K + (kk * 16 + vrow) * KST + p * 16 + vcol);
        mma_m16n8k16<bf16>(o[2 * p], pa[kk], vb[0], vb[1]);
        mma_m16n8k16<bf16>(o[2 * p + 1], pa[kk], vb[2], vb[3]);
      }
    if constexpr (C::kLoadWarps > 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + st);
    }
    if constexpr (C::kSelf) {
      // The group's 4 warps are done with the stage: refill it with the group's tile it + KS.
      named_barrier_sync(1 + grp, 128);
      if (it + KS < tiles) gather(it + KS, threadIdx.x & 127, 128);
    }
  }
  if constexpr (C::kSelf) asm volatile("cp.async.wait_all;\n" ::: "memory");
  float acc_sum = l_run[0] + l_run[1];
#pragma unroll
  for (int j = 0; j < 32; ++j) acc_sum += o[j][0] + o[j][3];
  if (acc_sum == 12345.678f) out[blockIdx.x * C::kThreads + threadIdx.x] = acc_sum;  // keeps the work alive
}

struct Inputs {
  const bf16* k;      // [32][576]: the stages' contents without load warps
  const bf16* q;      // [64][576]
  const bf16* pool;   // [kPoolRows][576]: what the load warps gather
  const int* slots;   // [kPoolRows]: a random permutation (page_size 1, scattered)
  float* out;
  unsigned long long* prof;  // [10]: kProfiled's phase cycles and warp-tile counts
};

template <int M, int DQK, int DV, int QR, int QD, int PR, int PC, bool XCH, int N, int KS, int LW, int CH = 1,
          int NS = 1, bool OL = false, int FL = 0>
void run(const char* name, int tiles, int launches, const Inputs& in, int sms, int smem_cap) {
  using C = Cfg<M, DQK, DV, QR, QD, PR, PC, XCH, N, KS, LW, CH, NS, OL, FL>;
  auto kernel = core_kernel<C, M, DQK, DV, QR, QD, PR, PC>;
  // One CTA per SM: ask for more than half of the SM's shared memory when the
  // configuration itself needs less (sm_120 fits one such CTA per SM anyway).
  int smem = C::kSmem;
  if (smem * 2 <= smem_cap) smem = smem_cap / 2 + 1024;
  // kG2: the exchange stand-in keeps a slot per S warp of both groups, where
  // the cluster kernel's groups share one per row group (their halves land in
  // turn): that second set is not counted against sm_120's cap.
  constexpr int kStandIn = C::kGroups == 2 ? C::kSWarps * C::kXFloats * 32 * 4 : 0;
  if (C::kSmem - kStandIn > 101376 ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    std::printf("{\"config\": \"%s\", \"error\": \"shared memory %d (sm_120: 101376 at most)\"}\n", name,
                C::kSmem - kStandIn);
    return;
  }
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, kernel);
  cudaMemset(in.prof, 0, 10 * sizeof(unsigned long long));
  const float best = microbench::best_ms(
      [&] { kernel<<<sms, C::kThreads, smem>>>(in.k, in.q, in.pool, in.slots, in.out, in.prof, tiles); }, launches);
  const cudaError_t err = cudaGetLastError();
  const double tflops = C::kFlopPerTile * tiles * sms / (best * 1e-3) / 1e12;
  const double l2_tbs = double(N) * DQK * 2 * tiles * sms / (best * 1e-3) / 1e12;  // bytes the load warps bring
  std::printf("{\"config\": \"%s\", \"rows\": %d, \"n\": %d, \"stages\": %d, \"s_warps\": %d, \"o_warps\": %d, "
              "\"load_warps\": %d, \"registers\": %d, \"local_bytes\": %zu, \"smem\": %d, \"tflops\": %.1f, "
              "\"load_tb_per_s\": %.2f, \"ms\": %.3f, \"status\": \"%s\"",
              name, M, N, KS, C::kSWarps, C::kOWarps, LW, attr.numRegs, attr.localSizeBytes, C::kSmem, tflops,
              (LW || OL) ? l2_tbs : 0.0, best, cudaGetErrorString(err));
  if (C::kProfiled) {
    unsigned long long h[10];
    cudaMemcpy(h, in.prof, sizeof(h), cudaMemcpyDeviceToHost);
    const char* names[8] = {"s_wait_full", "s_qk", "s_exchange", "s_softmax", "s_wait_p_free", "s_p_store",
                            "o_wait_p", "o_pv"};
    std::printf(", \"cycles_per_tile\": {");
    for (int k = 0; k < 8; ++k)
      std::printf("%s\"%s\": %.0f", k ? ", " : "", names[k],
                  double(h[k]) / double(h[k < 6 ? 8 : 9] ? h[k < 6 ? 8 : 9] : 1));
    std::printf("}");
  }
  std::printf("}\n");
}

template <int KS, int LW, int RC, bool SELF = false>
void run_fused(const char* name, int tiles, int launches, const Inputs& in, int sms, int smem_cap) {
  using C = FusedCfg<KS, LW, RC, SELF>;
  auto kernel = fused_kernel<C>;
  int smem = C::kSmem;
  if (smem * 2 <= smem_cap) smem = smem_cap / 2 + 1024;
  if (C::kSmem > 101376 ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    std::printf("{\"config\": \"%s\", \"error\": \"shared memory %d (sm_120: 101376 at most)\"}\n", name, C::kSmem);
    return;
  }
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, kernel);
  const float best = microbench::best_ms(
      [&] { kernel<<<sms, C::kThreads, smem>>>(in.k, in.q, in.pool, in.slots, in.out, tiles); }, launches);
  const cudaError_t err = cudaGetLastError();
  const double tflops = C::kFlopPerTile * tiles * sms / (best * 1e-3) / 1e12;
  std::printf("{\"config\": \"%s\", \"rows\": 64, \"n\": %d, \"stages\": %d, \"compute_warps\": 8, \"load_warps\": %d, "
              "\"compute_registers\": %d, \"registers\": %d, \"local_bytes\": %zu, \"smem\": %d, \"tflops\": %.1f, "
              "\"ms\": %.3f, \"status\": \"%s\"}\n",
              name, C::kN, KS, LW, C::kRegsCompute, attr.numRegs, attr.localSizeBytes, C::kSmem, tflops, best,
              cudaGetErrorString(err));
}

}  // namespace

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int launches = argc > 2 ? std::atoi(argv[2]) : 5;
  int dev = 0, sms = 0, smem_cap = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem_cap, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  std::vector<bf16> hk(32 * 576), hq(64 * 576), hpool(size_t(kPoolRows) * 576);
  microbench::Lcg rng;
  for (auto* h : {&hk, &hq, &hpool}) rng.fill(*h);
  Inputs in{};
  in.k = microbench::upload(hk), in.q = microbench::upload(hq), in.pool = microbench::upload(hpool);
  in.slots = microbench::upload(rng.permutation(kPoolRows));
  cudaMalloc(&in.out, sizeof(float) * sms * 1024);
  cudaMalloc(&in.prof, 10 * sizeof(unsigned long long));
  // The compute core alone (stages filled once).
  run<32, 576, 512, 16, 576, 32, 128, false, 32, 2, 0>("m32_full", tiles, launches, in, sms, smem_cap);
  run<32, 576, 512, 16, 288, 32, 128, true, 32, 2, 0>("m32_pair", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 2, 0>("m64_half", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 2, 0>("m64_half4", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 2, 0, 2>("m64_half4_2ch", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 32, 144, 64, 64, true, 32, 2, 0>("m64_q32pair", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 2, 0, 1, 2>("m64_half8", tiles, launches, in, sms, smem_cap);
  run<128, 144, 128, 32, 144, 64, 64, true, 32, 4, 0>("m128_q4", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 2, 0, 1, 1, false, kBal>("m64_half_bal", tiles, launches, in, sms,
                                                                       smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 2, 0, 1, 1, false, kProf>("m64_half4_prof", tiles, launches, in, sms,
                                                                        smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 2, 0, 1, 1, false, kBal | kProf>("m64_half_bal_prof", tiles,
                                                                               launches, in, sms, smem_cap);
  run_fused<2, 0, 255>("m64_fused", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 2, 0, 1, 1, false, kG2>("m64_half4_g2", tiles, launches, in, sms,
                                                                      smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 2, 0, 1, 1, false, kBal | kG2>("m64_half_bal_g2", tiles, launches, in,
                                                                             sms, smem_cap);
  // With load warps gathering scattered rows.
  run<32, 576, 512, 16, 288, 32, 128, true, 32, 2, 4>("m32_pair_load", tiles, launches, in, sms, smem_cap);
  run<32, 576, 512, 16, 288, 32, 128, true, 16, 4, 4>("m32_pair_load_n16", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4>("m64_half4_load", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 2>("m64_half4_2ch_load", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 32, 144, 64, 64, true, 32, 3, 4>("m64_q32pair_load", tiles, launches, in, sms, smem_cap);
  run<128, 144, 128, 32, 144, 64, 64, true, 32, 4, 4>("m128_q4_load", tiles, launches, in, sms, smem_cap);
  run<128, 144, 128, 32, 144, 64, 64, true, 32, 4, 4, 1, 1, false, kProf>("m128_q4_load_prof", tiles, launches, in,
                                                                         sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 0, 1, 1, true>("m64_half4_oload", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 0, 1, 2, true>("m64_half8_oload", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 16, 4, 4>("m64_half4_load_n16", tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 3, 4, 1, 1, false, kBal>("m64_half_bal_load", tiles, launches, in,
                                                                       sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 1, 1, false, kLook2>("m64_half4_look2_load", tiles, launches, in,
                                                                         sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 1, 1, false, kLook3>("m64_half4_look3_load", tiles, launches, in,
                                                                         sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 2, 1, false, kLook2>("m64_half4_2ch_look2_load", tiles, launches,
                                                                         in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 2, 1, false, kLook3>("m64_half4_2ch_look3_load", tiles, launches,
                                                                         in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 2, 1, false, kLook3 | kProf>("m64_half4_2ch_look3_load_prof",
                                                                                 tiles, launches, in, sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 3, 4, 1, 1, false, kProf>("m64_half4_load_prof", tiles, launches, in,
                                                                        sms, smem_cap);
  run<64, 288, 256, 16, 288, 64, 64, true, 32, 4, 4, 1, 1, false, kG2>("m64_half4_g2_load", tiles, launches, in, sms,
                                                                      smem_cap);
  run<64, 288, 256, 32, 288, 64, 64, true, 32, 4, 4, 1, 1, false, kBal | kG2>("m64_half_bal_g2_load", tiles, launches,
                                                                             in, sms, smem_cap);
  run_fused<4, 4, 232>("m64_fused_load", tiles, launches, in, sms, smem_cap);
  run_fused<3, 4, 232>("m64_fused_load_s3", tiles, launches, in, sms, smem_cap);
  run_fused<4, 0, 255, true>("m64_fused_self", tiles, launches, in, sms, smem_cap);
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? 0 : 1;
}
