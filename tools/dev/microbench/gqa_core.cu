// The compute core of candidate GQA tree-verify kernels (head_dim 128, bf16,
// mma.sync): what fraction of the mma.sync ceiling (tools/bench/ceilings/
// mma_peak.cu) each consumer-warp organization reaches when its K / V tiles
// already sit in shared memory, and when a load warpgroup gathers them from
// scattered rows. The design question (docs/design_portable.md, "The warp-role
// GQA kernel"): the warp-role kernel (kernels/gqa_roles_kernel.cuh: 8 consumer
// warps x 16 rows, Q in registers) runs the compute-bound rows at 36-41% of
// the ceiling, latency-bound, while FlashAttention-2 (4 warps x 32 rows, Q
// re-read from shared memory every k-step) reaches about 44%; which
// organization of the consumers gets there.
//
// Per CTA: CW consumer warps of R rows each (M = CW x R query rows), a ring of
// KS stages of one 64-row K tile and one 64-row V tile (128 dims each), and,
// in the `_load` configurations, a load warpgroup:
//   load warps (4, one whole warpgroup: setmaxnreg is per warpgroup), two
//     threads per KV row: each resolves its row's slot in a 33.6 MB pool of
//     K and V rows (65,536 random slots, page_size 1, 256 bytes per K or V
//     row) before it waits, then, once the stage's K is released, copies
//     half of the row's K with 16-byte cp.async completing on the stage's
//     `full_k` mbarrier (cp.async.mbarrier.arrive.noinc), and the same for V
//     on `empty_v` / `full_v`.
//     Without load warps the stages are filled once and their contents stay
//     put (the compute core alone);
//   consumer warps, per KV tile: S = Q K^T (R rows x 64 columns x 128 dims,
//     K fragments by ldmatrix, each feeding the warp's R / 16 m16 tiles), the
//     stage's K released (`empty_k`); the online softmax in registers (scale
//     to base 2, row max over the quad of lanes that holds a row, exp2, the
//     thread's partial row sums, O rescaled) with the kernels' own helpers
//     (kernels/core/scores.cuh, softmax.cuh); P (bf16) from the score
//     accumulators straight into the A operand of O += P V (V by
//     ldmatrix.trans, O = R rows x 128 fp32 in registers); the stage's V
//     released (`empty_v`). K and V have separate barriers, so that a
//     one-stage ring still overlaps the next K with this tile's P V and the
//     next V with the next Q K^T (FlashAttention-2's order).
// Q either stays in registers for the whole loop (loaded once from global
// memory) or sits in shared memory and is re-read at every k-step: by
// ldmatrix from rows padded to 136 bf16 (`_ldsm`), or, by default, stored once
// in fragment order (each lane's four A-operand registers of an m16 tile and
// k16 step as 16 contiguous bytes) and re-read by one 16-byte ld.shared per
// fragment: the same 512 bytes per warp and fragment as ldmatrix.x4, without
// bank conflicts, padding or per-lane swizzle addresses (an XOR-swizzled
// layout needs a dozen per-lane address registers, which spill next to 32
// rows of O and S). Unpadded is what lets 256 rows of Q and a K / V stage fit
// 101,376 bytes. K and V tiles have rows padded to 136 bf16, as in the warp-role
// kernel (ldmatrix free of bank conflicts).
//
// Configurations (FLOPs counted: M x 64 x 128 x 2 x 2 per tile and CTA):
//   w8_r16_qreg        8 warps x 16 rows, Q in registers, 2 stages, 1 CTA per SM
//                      (the warp-role kernel's consumers)
//   w4_r32_qsmem       4 warps x 32 rows (each K / V fragment feeds two m16 tiles), Q in
//                      shared memory, one K and one V buffer, launch bounds for 2 CTAs per
//                      SM (FlashAttention-2's hdim-128 organization; sm_120's 100 KB of
//                      shared memory per SM holds one)
//   w4_r32_qsmem_ldsm  the same with Q read by ldmatrix from padded rows (FlashAttention-2's
//                      instruction; its swizzled layout's address registers aside)
//   w8_r32_qsmem       8 warps x 32 rows (256 rows per CTA), Q in shared memory, 1 stage
//                      (what fits), 1 CTA per SM
//   w8_r16_qreg_2ch    as w8_r16_qreg with the Q K^T k-steps alternating between two score
//                      accumulator sets (16 independent mma chains per warp instead of 8)
//   *_load             the same fed by the load warpgroup. setmaxnreg moves registers from
//                      the load warps to the consumers where the CTA's entry budget is
//                      below what the consumers need: 56 / 224 for 8 warps of 16 rows (the
//                      warp-role kernel's split), 40 / 232 for 8 warps of 32 rows (they
//                      spill at 224), 24 / 232 for 4 warps of 32 rows at 2 CTAs per SM
//                      (128 registers a thread to share: the consumers spill on sm_90a
//                      whatever the split); `_1cta`: 4 warps of 32 rows at 1 CTA per SM,
//                      255 registers a thread, no setmaxnreg
// A configuration gets at most its intended CTAs per SM: the dynamic shared
// memory asked for is raised until one more cannot fit (as mla_core does for
// one CTA per SM); whether that many fit is up to registers and shared memory
// and is reported (cudaOccupancyMaxActiveBlocksPerMultiprocessor). The grid is
// SMs x that many CTAs, every CTA looping over the same number of tiles. A
// configuration whose shared memory exceeds sm_120's 101,376 bytes per block
// prints an error line instead of running.
//
//   tools/bazelw build //tools/dev/microbench:gqa_core   # bazel-bin/tools/dev/microbench/gqa_core
//   gqa_core [tiles per CTA] [launches]   prints one JSON line per configuration
//                                          (best of the launches, after one warm-up)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/core/mma.cuh"
#include "kernels/core/scores.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/sm90/sync.cuh"
#include "tools/dev/microbench/harness.h"

namespace {

using verify_attn::cp_async_16;
using verify_attn::ldmatrix_x4;
using verify_attn::ldmatrix_x4_trans;
using verify_attn::mma_m16n8k16;
using verify_attn::OnlineSoftmaxRow;
using verify_attn::smem_addr;
using verify_attn::sm90::cp_async_arrive_noinc;
using verify_attn::sm90::mbar_arrive;
using verify_attn::sm90::mbar_init;
using verify_attn::sm90::mbar_wait;
using bf16 = __nv_bfloat16;

constexpr int kD = 128;             // head_dim of Q K^T and of V
constexpr int kPoolRows = 65536;    // K and V rows the load warps gather from (2 x 16.8 MB)
constexpr int kMaxQRows = 256;      // rows of the Q the kernels read (the largest M)
constexpr int kSmemLimit = 101376;  // sm_120's shared memory per block

// Where the consumers' Q fragments come from at each k-step.
enum class QSrc {
  kRegs,      // registers, loaded once from global memory
  kSmemFrag,  // shared memory in fragment order, one 16-byte ld.shared per fragment
  kSmemLdsm,  // shared memory, rows padded to 136 bf16, ldmatrix.x4 per fragment
};

// One 16-byte shared-memory load (volatile: it stays in the loop, as ldmatrix does).
__device__ __forceinline__ void lds_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// CW consumer warps of R rows (16 or 32), Q from QS, CH score accumulator sets
// (the Q K^T k-steps round-robin); N KV rows per tile, KS stages, LW load warps
// (0: stages filled once), MINB the CTAs per SM the configuration is built for
// (launch bounds), LREGS the load warps' registers under setmaxnreg (the
// consumers get what that leaves, at most 240).
template <int CW, int R, QSrc QS, int CH, int N_, int KS, int LW, int MINB, int LREGS = 56>
struct Cfg {
  static_assert(LW == 0 || LW == 4, "setmaxnreg needs the load warps to be one whole warpgroup");
  static_assert(R == 16 || R == 32, "16 or 32 rows per consumer warp");
  static_assert(CH >= 1 && (kD / 16) % CH == 0, "k-steps split evenly between the accumulator sets");
  static constexpr int kConsumerWarps = CW;
  static constexpr int kRows = R;
  static constexpr QSrc kQ = QS;
  static constexpr int kChains = CH;
  static constexpr int kN = N_;
  static constexpr int kStages = KS;
  static constexpr int kLoadWarps = LW;
  static constexpr int kMinBlocks = MINB;
  static constexpr int kM = CW * R;
  static constexpr int kThreads = (CW + LW) * 32;
  static constexpr int kStride = kD + 8;               // bf16 per padded row: ldmatrix conflict-free
  static constexpr int kTileBytes = kN * kStride * 2;  // one K or V tile
  static constexpr int kQBytes = QS == QSrc::kSmemFrag ? kM * kD * 2 : QS == QSrc::kSmemLdsm ? kM * kStride * 2 : 0;
  static constexpr int kSmem = kQBytes + 2 * KS * kTileBytes + 4 * KS * 8;
  static constexpr double kFlopPerTile = 4.0 * kM * kN * kD;
  // Registers per thread the CTA enters with (what ptxas allows under the
  // launch bounds), and the load / consumer split of setmaxnreg where that is
  // below what the consumers need: what the load warps give back covers what
  // the consumers take, else setmaxnreg.inc waits forever.
  static constexpr int kEntryRegs = std::min(255, 65536 / (kThreads * MINB) / 8 * 8);
  static constexpr bool kSetmaxnreg = LW > 0 && kEntryRegs < 232;
  static constexpr int kLoadRegs = LREGS;
  static constexpr int kConsumerRegs =
      kSetmaxnreg ? std::min(240, (kEntryRegs * kThreads - 32 * LW * kLoadRegs) / (32 * CW) / 8 * 8) : kEntryRegs;
  static_assert(!kSetmaxnreg || 32 * LW * kLoadRegs + 32 * CW * kConsumerRegs <= kThreads * kEntryRegs,
                "setmaxnreg budget");
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    core_kernel(const bf16* __restrict__ gK, const bf16* __restrict__ gV, const bf16* __restrict__ gQ,
                const bf16* __restrict__ poolK, const bf16* __restrict__ poolV, const int* __restrict__ slots,
                float* out, int tiles) {
  constexpr int N = C::kN, KS = C::kStages, CW = C::kConsumerWarps, LW = C::kLoadWarps, SD = C::kStride;
  constexpr int MT = C::kRows / 16;  // m16 tiles of a consumer warp
  constexpr int KT = kD / 16;        // k16 steps of Q K^T
  constexpr int NT = N / 8;          // n8 score tiles (every column of the tile)
  constexpr int NTO = kD / 8;        // n8 output tiles (every value column)
  constexpr int CH = C::kChains;
  constexpr QSrc QS = C::kQ;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);                                    // Q (QSrc::kSmem*)
  bf16* sK = reinterpret_cast<bf16*>(smem + C::kQBytes);                       // [KS][N][SD]
  bf16* sV = reinterpret_cast<bf16*>(smem + C::kQBytes + KS * C::kTileBytes);  // [KS][N][SD]
  uint64_t* full_k = reinterpret_cast<uint64_t*>(smem + C::kQBytes + 2 * KS * C::kTileBytes);  // [KS]
  uint64_t* full_v = full_k + KS;                                              // [KS]
  uint64_t* empty_k = full_v + KS;                                             // [KS]
  uint64_t* empty_v = empty_k + KS;                                            // [KS]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = warp * C::kRows;  // a consumer warp's first row
  // Element (m16 tile mi, k16 step kk, register r) of this lane's Q fragments:
  // rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9 (kernels/core/mma.cuh).
  auto q_elem = [&](int mi, int kk, int r) {
    return (row0 + mi * 16 + g + (r & 1) * 8) * kD + kk * 16 + 2 * t + (r >> 1) * 8;
  };
  if constexpr (QS == QSrc::kSmemFrag) {
    // [CW][MT][KT][32 lanes][4 registers]: each consumer lane stores its own fragments.
    if (warp < CW) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
          uint4 v;
          v.x = *reinterpret_cast<const uint32_t*>(gQ + q_elem(mi, kk, 0));
          v.y = *reinterpret_cast<const uint32_t*>(gQ + q_elem(mi, kk, 1));
          v.z = *reinterpret_cast<const uint32_t*>(gQ + q_elem(mi, kk, 2));
          v.w = *reinterpret_cast<const uint32_t*>(gQ + q_elem(mi, kk, 3));
          reinterpret_cast<uint4*>(sQ)[((warp * MT + mi) * KT + kk) * 32 + lane] = v;
        }
    }
  } else if constexpr (QS == QSrc::kSmemLdsm) {
    for (int i = threadIdx.x; i < C::kM * kD; i += C::kThreads) sQ[(i / kD) * SD + i % kD] = gQ[i];
  }
  if constexpr (LW == 0) {
    for (int i = threadIdx.x; i < KS * N * kD; i += C::kThreads) {
      const int st = i / (N * kD), row = (i / kD) % N, col = i % kD;
      sK[(st * N + row) * SD + col] = gK[row * kD + col];
      sV[(st * N + row) * SD + col] = gV[row * kD + col];
    }
  } else if (threadIdx.x < KS) {
    mbar_init(full_k + threadIdx.x, LW * 32);
    mbar_init(full_v + threadIdx.x, LW * 32);
    mbar_init(empty_k + threadIdx.x, CW);
    mbar_init(empty_v + threadIdx.x, CW);
  }
  __syncthreads();
  float acc_sum = 0.f;
  // Stage of tile it, and the parity of its fill.
  auto stage = [](int it) { return it % KS; };
  auto phase = [](int it) { return static_cast<uint32_t>((it / KS) & 1); };

  if (warp >= CW) {
    // ---------------- load warps ----------------
    if constexpr (LW > 0) {
      if constexpr (C::kSetmaxnreg) verify_attn::sm90::regs_dealloc<C::kLoadRegs>();
      constexpr int kChunks = kD / 8;    // 16-byte chunks per K or V row
      constexpr int kTpr = LW * 32 / N;  // threads per row
      static_assert(LW * 32 % N == 0 && kChunks % kTpr == 0, "every load thread copies part of one row");
      const int lt = threadIdx.x - CW * 32;
      const int row = lt / kTpr, c0 = lt % kTpr;
      for (int it = 0; it < tiles; ++it) {
        const int st = stage(it);
        // The row's slot resolves before the waits, so that its load overlaps them.
        const int slot = __ldg(slots + (blockIdx.x * 7919 + it * N + row) % kPoolRows);
        const int64_t src = static_cast<int64_t>(slot) * kD;
        if (it >= KS) mbar_wait(empty_k + st, phase(it) ^ 1);
        bf16* dk = sK + (st * N + row) * SD;
#pragma unroll
        for (int k = 0; k < kChunks / kTpr; ++k) {
          const int c = c0 + k * kTpr;
          cp_async_16(dk + c * 8, poolK + src + c * 8, true);
        }
        cp_async_arrive_noinc(full_k + st);
        if (it >= KS) mbar_wait(empty_v + st, phase(it) ^ 1);
        bf16* dv = sV + (st * N + row) * SD;
#pragma unroll
        for (int k = 0; k < kChunks / kTpr; ++k) {
          const int c = c0 + k * kTpr;
          cp_async_16(dv + c * 8, poolV + src + c * 8, true);
        }
        cp_async_arrive_noinc(full_v + st);
      }
      // The copies complete on the mbarriers, never on a commit group: commit
      // them so that the wait covers them before the thread exits.
      verify_attn::cp_async_commit();
      verify_attn::cp_async_wait<0>();
    }
    return;
  }
  if constexpr (C::kSetmaxnreg) verify_attn::sm90::regs_alloc<C::kConsumerRegs>();

  // ---------------- consumer warps ----------------
  // Q fragments (A operand) in registers for the whole loop (QSrc::kRegs),
  // else re-read from shared memory at each k-step.
  constexpr int QMT = QS == QSrc::kRegs ? MT : 1, QKT = QS == QSrc::kRegs ? KT : 1;
  uint32_t q[QMT][QKT][4];
  if constexpr (QS == QSrc::kRegs) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) q[mi][kk][r] = *reinterpret_cast<const uint32_t*>(gQ + q_elem(mi, kk, r));
  }
  OnlineSoftmaxRow sm[MT][2];
  float o[MT][NTO][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    sm[mi][0].init();
    sm[mi][1].init();
#pragma unroll
    for (int j = 0; j < NTO; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.f;
  }
  const float scale_log2 = 0.12752f;  // log2(e) / sqrt(128)
  // ldmatrix lane addresses (kernels/core/mma.cuh): Q rows as the A operand,
  // K rows as the B operand of two n8 tiles x one k16 step, V by the
  // transposing load (two n8 value tiles).
  const bf16* q_ldsm = sQ + (row0 + (lane & 15)) * SD + (lane >> 4) * 8;
  const uint4* q_frag = reinterpret_cast<const uint4*>(sQ) + warp * MT * KT * 32 + lane;
  const int k_frag_off = ((lane & 7) + ((lane >> 4) << 3)) * SD + ((lane >> 3) & 1) * 8;
  const int v_frag_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * SD + (lane >> 4) * 8;

  for (int it = 0; it < tiles; ++it) {
    const int st = stage(it);
    const bf16* kb = sK + st * N * SD + k_frag_off;
    const bf16* vb = sV + st * N * SD + v_frag_off;
    if constexpr (LW > 0) mbar_wait(full_k + st, phase(it));

    // ---- S = Q K^T over the whole tile ----
    float sc[CH][MT][NT][4];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int j = 0; j < NT; ++j) sc[c][mi][j][0] = sc[c][mi][j][1] = sc[c][mi][j][2] = sc[c][mi][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t qs[QS == QSrc::kRegs ? 1 : MT][4];
      if constexpr (QS == QSrc::kSmemFrag) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) lds_x4(qs[mi], q_frag + (mi * KT + kk) * 32);
      } else if constexpr (QS == QSrc::kSmemLdsm) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(qs[mi], q_ldsm + mi * 16 * SD + kk * 16);
      }
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        uint32_t b[4];
        ldmatrix_x4(b, kb + p * 16 * SD + kk * 16);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          if constexpr (QS == QSrc::kRegs) {
            mma_m16n8k16<bf16>(sc[kk % CH][mi][2 * p], q[mi][kk], b[0], b[1]);
            mma_m16n8k16<bf16>(sc[kk % CH][mi][2 * p + 1], q[mi][kk], b[2], b[3]);
          } else {
            mma_m16n8k16<bf16>(sc[kk % CH][mi][2 * p], qs[mi], b[0], b[1]);
            mma_m16n8k16<bf16>(sc[kk % CH][mi][2 * p + 1], qs[mi], b[2], b[3]);
          }
        }
      }
    }
    if constexpr (LW > 0) {  // this warp is done with the stage's K
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_k + st);
    }
#pragma unroll
    for (int c = 1; c < CH; ++c)
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) sc[0][mi][j][r] += sc[c][mi][j][r];

    // ---- online softmax, P into the A operand of P V, O rescaled ----
    // P as the A operand of m16n8k16: k16 step kk holds score tiles 2 kk
    // (registers 0, 1) and 2 kk + 1 (registers 2, 3).
    uint32_t pa[MT][N / 16][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      float(&s)[NT][4] = sc[0][mi];
      float mx[2];
      verify_attn::thread_row_max<NT>(s, mx);  // an unmasked tile
      verify_attn::quad_scaled_max(mx, scale_log2);
      float alpha[2];
      verify_attn::softmax_tile<NT>(s, sm[mi], mx, scale_log2, alpha);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        pa[mi][j / 2][(j & 1) * 2] = verify_attn::DTypeTraits<bf16>::pack(s[j][0], s[j][1]);
        pa[mi][j / 2][(j & 1) * 2 + 1] = verify_attn::DTypeTraits<bf16>::pack(s[j][2], s[j][3]);
      }
      verify_attn::rescale_rows<NTO>(o[mi], alpha);
    }

    // ---- O += P V ----
    if constexpr (LW > 0) mbar_wait(full_v + st, phase(it));
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
      for (int jj = 0; jj < NTO / 2; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vb + kk * 16 * SD + jj * 16);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma_m16n8k16<bf16>(o[mi][2 * jj], pa[mi][kk], b[0], b[1]);
          mma_m16n8k16<bf16>(o[mi][2 * jj + 1], pa[mi][kk], b[2], b[3]);
        }
      }
    if constexpr (LW > 0) {  // this warp is done with the stage's V
      __syncwarp();
      if (lane == 0) mbar_arrive(empty_v + st);
    }
  }
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    acc_sum += sm[mi][0].l + sm[mi][1].l;
#pragma unroll
    for (int j = 0; j < NTO; ++j) acc_sum += o[mi][j][0] + o[mi][j][3];
  }
  if (acc_sum == 12345.678f) out[blockIdx.x * C::kThreads + threadIdx.x] = acc_sum;  // keeps the work alive
}

struct Inputs {
  const bf16* k;       // [64][128]: the stages' K without load warps
  const bf16* v;       // [64][128]: the stages' V
  const bf16* q;       // [kMaxQRows][128]
  const bf16* pool_k;  // [kPoolRows][128]: what the load warps gather
  const bf16* pool_v;  // [kPoolRows][128]
  const int* slots;    // [kPoolRows]: a random permutation (page_size 1, scattered)
  float* out;          // [SMs x 8 x 512]
};

const char* q_name(QSrc q) {
  return q == QSrc::kRegs ? "registers" : q == QSrc::kSmemFrag ? "smem_fragments" : "smem_ldmatrix";
}

template <int CW, int R, QSrc QS, int CH, int N, int KS, int LW, int MINB, int LREGS = 56>
void run(const char* name, int tiles, int launches, const Inputs& in, int sms, int smem_cap) {
  using C = Cfg<CW, R, QS, CH, N, KS, LW, MINB, LREGS>;
  static_assert(C::kM <= kMaxQRows, "Q rows");
  auto kernel = core_kernel<C>;
  // At most MINB CTAs per SM: ask for enough shared memory that one more
  // cannot fit when the configuration itself needs less.
  const int smem = std::max(C::kSmem, smem_cap / (MINB + 1) + 1024);
  if (C::kSmem > kSmemLimit ||
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    std::printf("{\"config\": \"%s\", \"error\": \"shared memory %d (sm_120: %d at most)\"}\n", name, C::kSmem,
                kSmemLimit);
    cudaGetLastError();
    return;
  }
  cudaFuncAttributes attr;
  cudaFuncGetAttributes(&attr, kernel);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, C::kThreads, smem);
  if (per_sm < 1) {
    std::printf("{\"config\": \"%s\", \"error\": \"no CTA fits an SM (%d registers, %d bytes of shared memory)\"}\n",
                name, attr.numRegs, smem);
    cudaGetLastError();
    return;
  }
  const int grid = sms * per_sm;
  const float best = microbench::best_ms(
      [&] { kernel<<<grid, C::kThreads, smem>>>(in.k, in.v, in.q, in.pool_k, in.pool_v, in.slots, in.out, tiles); },
      launches);
  const cudaError_t err = cudaGetLastError();
  const double tflops = C::kFlopPerTile * tiles * grid / (best * 1e-3) / 1e12;
  const double load_tbs = double(N) * kD * 2 * 2 * tiles * grid / (best * 1e-3) / 1e12;  // K and V bytes gathered
  std::printf("{\"config\": \"%s\", \"rows\": %d, \"warps\": %d, \"rows_per_warp\": %d, \"q\": \"%s\", "
              "\"chains\": %d, \"n\": %d, \"stages\": %d, \"load_warps\": %d, \"registers\": %d, "
              "\"consumer_registers\": %d, \"local_bytes\": %zu, \"smem\": %d, \"ctas_per_sm\": %d, "
              "\"ctas_per_sm_built_for\": %d, \"tflops\": %.1f, \"load_tb_per_s\": %.2f, \"ms\": %.3f, "
              "\"status\": \"%s\"}\n",
              name, C::kM, CW, R, q_name(QS), CH, N, KS, LW, attr.numRegs,
              C::kSetmaxnreg ? C::kConsumerRegs : attr.numRegs, attr.localSizeBytes, C::kSmem, per_sm, MINB, tflops,
              LW ? load_tbs : 0.0, best, cudaGetErrorString(err));
}

}  // namespace

int main(int argc, char** argv) {
  const int tiles = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int launches = argc > 2 ? std::atoi(argv[2]) : 5;
  int dev = 0, sms = 0, smem_cap = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem_cap, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  std::vector<bf16> hk(64 * kD), hv(64 * kD), hq(kMaxQRows * kD), hpk(size_t(kPoolRows) * kD),
      hpv(size_t(kPoolRows) * kD);
  microbench::Lcg rng;
  for (auto* h : {&hk, &hv, &hq, &hpk, &hpv}) rng.fill(*h);
  Inputs in{};
  in.k = microbench::upload(hk), in.v = microbench::upload(hv), in.q = microbench::upload(hq);
  in.pool_k = microbench::upload(hpk), in.pool_v = microbench::upload(hpv);
  in.slots = microbench::upload(rng.permutation(kPoolRows));
  cudaMalloc(&in.out, sizeof(float) * sms * 8 * 512);
  constexpr QSrc kReg = QSrc::kRegs, kFrag = QSrc::kSmemFrag, kLdsm = QSrc::kSmemLdsm;
  //  template: consumer warps, rows per warp, Q source, score accumulator sets, KV rows per tile,
  //            stages, load warps, CTAs per SM built for
  // The compute core alone (stages filled once).
  run<8, 16, kReg, 1, 64, 2, 0, 1>("w8_r16_qreg", tiles, launches, in, sms, smem_cap);
  run<4, 32, kFrag, 1, 64, 1, 0, 2>("w4_r32_qsmem", tiles, launches, in, sms, smem_cap);
  run<4, 32, kLdsm, 1, 64, 1, 0, 2>("w4_r32_qsmem_ldsm", tiles, launches, in, sms, smem_cap);
  run<8, 32, kFrag, 1, 64, 1, 0, 1>("w8_r32_qsmem", tiles, launches, in, sms, smem_cap);
  run<8, 16, kReg, 2, 64, 2, 0, 1>("w8_r16_qreg_2ch", tiles, launches, in, sms, smem_cap);
  // With the load warpgroup gathering scattered rows.
  run<8, 16, kReg, 1, 64, 2, 4, 1>("w8_r16_qreg_load", tiles, launches, in, sms, smem_cap);
  run<4, 32, kFrag, 1, 64, 1, 4, 2, 24>("w4_r32_qsmem_load", tiles, launches, in, sms, smem_cap);
  run<4, 32, kFrag, 1, 64, 1, 4, 1>("w4_r32_qsmem_load_1cta", tiles, launches, in, sms, smem_cap);
  run<8, 32, kFrag, 1, 64, 1, 4, 1, 40>("w8_r32_qsmem_load", tiles, launches, in, sms, smem_cap);
  run<8, 16, kReg, 2, 64, 2, 4, 1>("w8_r16_qreg_2ch_load", tiles, launches, in, sms, smem_cap);
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? 0 : 1;
}
