// Host-side plan: which tile configuration and how many KV splits a call runs,
// and how much workspace it needs. Pure C++ (no CUDA headers) so that the
// tile shapes below are shared by the host (shared-memory sizes) and the
// device code (kernels/attention_kernel.cuh instantiates them).
#ifndef VERIFY_ATTN_PLAN_H_
#define VERIFY_ATTN_PLAN_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels/verify_attn.h"

namespace verify_attn {

// One CTA: M = 16 * WARPS_M folded query rows x all KV tiles of its split,
// N KV rows per tile, WARPS_M x WARPS_N warps. Warp (wm, wn) computes the
// scores of rows [16 wm, 16 wm + 16) x KV columns [wn N/WN, (wn+1) N/WN) and the
// output of the same rows x value columns [wn DV/WN, (wn+1) DV/WN).
// Shared memory (bf16/fp16 = 2 bytes; +8 elements = +16 bytes per row so that
// the 8 rows of an ldmatrix hit 8 distinct 16-byte bank groups: the row pitch
// is an odd number of 16-byte chunks):
//   Q [M][DQK+8], K [STAGES][N][DQK+8], V [STAGES][N][DV+8] (none when the
//   value is the K row's prefix, MLA), P [M][N+8], row max / row sum [2][WN][M] fp32.
// MIN_BLOCKS_: CTAs per SM the kernel is compiled to fit (the second
// __launch_bounds__ argument caps registers at 65536 / (MIN_BLOCKS_ * threads));
// the plan counts on exactly this many resident CTAs per SM.
template <int DQK_, int DV_, bool V_IS_K_, int WARPS_M_, int WARPS_N_, int N_, int STAGES_,
          int MIN_BLOCKS_ = 1>
struct TileShape {
  static constexpr bool kWgmma = false;
  static constexpr bool kSplitRoles = false;
  // Runs the request-major grid whatever Plan::grid_rows_fastest says
  // (grid_coord): the rows-first order was measured on the sm_90a kernels
  // only, and keeps these kernels' registers as they were on sm_120.
  static constexpr bool kRowsGrid = false;
  // Visits every KV tile of its range (kernels/core/request.cuh, kv_tile).
  static constexpr bool kSkipDraftTiles = false;
  static constexpr int kClusterX = 1;  // CTAs per cluster (cta_coord)
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int kDqk = DQK_;
  static constexpr int kDv = DV_;
  static constexpr bool kVIsK = V_IS_K_;
  static constexpr int kWarpsM = WARPS_M_;
  static constexpr int kWarpsN = WARPS_N_;
  static constexpr int kWarps = WARPS_M_ * WARPS_N_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kM = 16 * WARPS_M_;
  static constexpr int kN = N_;
  static constexpr int kStages = STAGES_;
  static constexpr int kQStride = DQK_ + 8;  // elements
  static constexpr int kKStride = DQK_ + 8;
  static constexpr int kVStride = V_IS_K_ ? kKStride : DV_ + 8;
  static constexpr int kPStride = N_ + 8;
  static constexpr int kQBytes = kM * kQStride * 2;
  static constexpr int kKBytes = kStages * kN * kKStride * 2;
  static constexpr int kVBytes = V_IS_K_ ? 0 : kStages * kN * kVStride * 2;
  static constexpr int kPBytes = kM * kPStride * 2;
  static constexpr int kRedBytes = 2 * kWarpsN * kM * 4;
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kPBytes + kRedBytes;

  static_assert(DQK_ % 32 == 0 && DV_ % (16 * WARPS_N_) == 0, "head dims");
  static_assert(N_ % (8 * WARPS_N_) == 0 && N_ % 16 == 0, "tile N");
  static_assert(DV_ <= DQK_, "value columns come from a DQK-wide tile when V_IS_K");
};

// sm_90a only: MLA (576/512) on warpgroup MMA, one producer warpgroup and two
// consumer warpgroups sharing 64 folded query rows; each consumer computes the
// scores of alternate KV tiles and half of the 512 output columns.
// SEESAW_TMA false: kernels/sm90/mla_wgmma_kernel.cuh, the producer gathers
// 64-row K tiles with cp.async (any page size, any layout the C-ABI accepts),
// each thread first resolving one row of the next tile into a shared-memory
// table of offsets (kRowBytes), and the consumers start a tile's scores block
// by block as its 64-column blocks land.
// SEESAW_TMA true: kernels/sm90/mla_seesaw_kernel.cuh, K tiles by bulk tensor
// copies (paged caches with page_size % 64 == 0, and flat caches), the
// consumers taking turns on the tensor cores; its row max, two rescale factors
// and row sums take [5][64] fp32.
// ROWS_GATHER (with SEESAW_TMA): page_size 1 caches through the rows map, tiles
// of consecutive slots boxed and the others gathered by the producer
// (kernels/sm90/mla_tma_producer.cuh), for the kv_slot_runs hint; a separate
// instantiation, so that the page-size-64 kernel does not carry the gather code.
// SKIP_DRAFT_TILES (with SEESAW_TMA): the instance that does not visit a tree's
// draft-only KV tiles no row of the CTA sees (kernels/core/request.cuh,
// kv_tile); the plan picks it for trees of more than four tiles of drafts
// (Plan::skip_draft_tiles), where the skipped tiles outweigh its per-visit
// tile lookup.
// Shared memory, in 8 KB swizzled blocks of 64 rows x 64 columns
// (kernels/sm90/swizzle.cuh): Q (9 blocks), K [2 stages][9 blocks] (the
// consumers write P over a tile's block 8 once its scores are done), the row
// statistics, the cp.async kernel's row-offset table, and 1 KB to align the
// dynamic base to the 1024-byte swizzle atom.
template <bool SEESAW_TMA, bool ROWS_GATHER = false, bool SKIP_DRAFT_TILES = false>
struct TileShapeWgmmaMla {
  static constexpr bool kWgmma = true;
  static constexpr bool kSplitRoles = false;
  static constexpr bool kRowsGrid = true;  // reads Plan::grid_rows_fastest (grid_coord)
  static constexpr bool kSeesawTma = SEESAW_TMA;
  static constexpr bool kRowsGather = ROWS_GATHER;
  static_assert(!ROWS_GATHER || SEESAW_TMA, "the rows-map gathers are the TMA kernel's");
  static_assert(!SKIP_DRAFT_TILES || SEESAW_TMA, "only the TMA kernel skips draft tiles");
  static constexpr bool kSkipDraftTiles = SKIP_DRAFT_TILES;
  static constexpr int kClusterX = 1;  // CTAs per cluster (cta_coord)
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kMinBlocks = 1;
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr bool kVIsK = true;
  static constexpr int kWarpsM = 4;
  static constexpr int kWarpsN = 2;
  static constexpr int kWarps = 12;
  static constexpr int kThreads = 384;
  static constexpr int kM = 64;
  static constexpr int kN = 64;
  static constexpr int kStages = 2;
  static constexpr int kBlockBytes = 64 * 128;
  static constexpr int kKBlocks = 9;
  static constexpr int kQBytes = kKBlocks * kBlockBytes;      // 73,728
  static constexpr int kKTileBytes = kKBlocks * kBlockBytes;  // 73,728
  static constexpr int kKBytes = kStages * kKTileBytes;       // 147,456
  static constexpr int kRedBytes = SEESAW_TMA ? 5 * 64 * 4 : 2 * 2 * 64 * 4;  // 1,280 / 1,024
  static constexpr int kRowBytes = SEESAW_TMA ? 0 : 2 * 2 * 64 * 8;  // 2,048: [2 halves][2][64]
  static constexpr int kSmemBytes = kQBytes + kKBytes + kRedBytes + kRowBytes + 1024;  // 225,280 / 223,488
};

// Portable MLA (576/512) with its work split by warp role
// (kernels/mla_split_kernel.cuh): 32 folded query rows per CTA, KV tiles of N
// rows in a ring of STAGES shared-memory stages.
//   4 load warps gather each tile's rows with cp.async, every thread's copies
//     completing on the stage's "full" mbarrier;
//   4 S warps (2 row groups of 16 x 2 halves of the 576 dims) keep their Q
//     fragments in registers for the whole loop, compute a half-width
//     partial S = Q K^T, add the partner warp's half through shared memory
//     (so every K fragment an ldmatrix brings feeds 16 rows and half the
//     reduction: 128 instead of 256 bytes per mma of a 16-row warp over the
//     full width), mask, run the online softmax and write P (bf16) and the
//     rows' rescale factors;
//   4 O warps (32 rows x 128 value columns each) keep O in registers and add
//     P V from the same K tile's first 512 columns.
// setmaxnreg gives the S / O warps 216 registers and the load warps 56.
// Shared memory: K [STAGES][N][576 + 8], P [2][32][N + 8], rescale [2][32],
// partial scores [2][4 warps][N / 8 * 4][32 lanes] fp32, final row max / sum
// [2][32] fp32, 2 x STAGES mbarriers: 96,800 bytes at N = 32, 2 stages, within
// sm_120's 101,376.
template <int N_, int STAGES_>
struct TileShapeSplitMla {
  static constexpr bool kWgmma = false;
  static constexpr bool kSplitRoles = true;
  static constexpr bool kRowsGrid = false;
  static constexpr bool kSkipDraftTiles = false;
  static constexpr int kClusterX = 1;  // CTAs per cluster (cta_coord)
  static constexpr int kMinBlocks = 1;
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr bool kVIsK = true;
  static constexpr int kM = 32;
  static constexpr int kN = N_;
  static constexpr int kStages = STAGES_;
  static constexpr int kSWarps = 4;
  static constexpr int kOWarps = 4;
  static constexpr int kLoadWarps = 4;
  static constexpr int kWarps = kSWarps + kOWarps + kLoadWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kComputeThreads = 32 * (kSWarps + kOWarps);
  static constexpr int kOCols = kDv / kOWarps;  // value columns per O warp
  static constexpr int kKStride = kDqk + 8;     // elements: odd 16-byte chunks per row (ldmatrix)
  static constexpr int kPStride = kN + 8;
  static constexpr int kXFloats = (kN / 8) * 4;  // partial scores per lane
  static constexpr int kKBytes = kStages * kN * kKStride * 2;
  static constexpr int kPBytes = 2 * kM * kPStride * 2;
  static constexpr int kAlphaBytes = 2 * kM * 4;
  static constexpr int kXBytes = 2 * kSWarps * kXFloats * 32 * 4;
  static constexpr int kStatBytes = 2 * kM * 4;
  static constexpr int kBarBytes = 2 * kStages * 8;
  static constexpr int kSmemBytes = kKBytes + kPBytes + kAlphaBytes + kXBytes + kStatBytes + kBarBytes;
  static_assert(kN % 16 == 0 && kStages >= 2, "tile");
};

// Portable MLA (576/512) by warp roles across a cluster of two CTAs
// (kernels/mla_cluster_kernel.cuh): the cluster owns 64 folded query rows, and
// CTA rank c owns half of every K row, value columns [256 c, 256 c + 256) and
// rope dims [512 + 32 c, 512 + 32 c + 32): the 288 dims of its Q K^T hold
// exactly the value columns of its P V, so no V crosses CTAs; only the
// partial scores do. Per CTA:
//   4 load warps gather the CTA's 288 dims of each N-row tile with cp.async
//     into a ring of STAGES stages ("full" / "empty" mbarriers);
//   2 groups of 4 S warps (16 rows x 288 dims each, Q in registers) take
//     alternate KV tiles: a group computes the partial S, sends it into the
//     partner CTA's exchange buffer (st.async, counted in bytes on the
//     partner's mbarrier), adds the partner's half (both CTAs add the same two
//     halves, so both hold the same scores), masks, continues the rows'
//     online softmax from the other group's last tile and writes P (bf16) and
//     the rows' rescale factors for the O warps, while the other group's
//     Q K^T runs on the same schedulers;
//   4 O warps (64 rows x 64 of the CTA's 256 value columns) keep O in
//     registers and add P V from the stage's value part.
// Each K byte an SM reads feeds 64 rows (mla_split_m32n32: 32), and a CTA
// holds half of 64 rows' Q and O in registers. 16 warps: the CTA enters with
// 128 registers per thread and setmaxnreg gives the load warpgroup 48, the S
// groups 144 and the O warps 176.
// A stage is read by one S group at visit u and by the O warps after that
// group's softmax, while the other group runs visit u + 1: four stages leave
// one to the load warps.
// Shared memory: K [STAGES][N][288 + 8], P [2][64][N + 8], rescale [2][64],
// received partial scores [4 slots][N / 8][32 lanes][4] fp32 (one buffer per
// 16-row slot, the groups' halves arriving in turn), final row max / sum
// [2][64], the softmax state between the groups [4 slots][32 lanes][4], the
// partner's acknowledgements [2][4], mbarriers (2 x STAGES + 2 x 2 x 4):
// 97,504 bytes at N = 32, 4 stages, within sm_120's 101,376.
template <int N_, int STAGES_>
struct TileShapeClusterMla {
  static constexpr bool kWgmma = false;
  static constexpr bool kSplitRoles = true;
  static constexpr bool kRowsGrid = false;
  static constexpr bool kSkipDraftTiles = false;
  static constexpr int kClusterX = 2;  // CTAs per cluster (cta_coord): rank c owns half of every K row
  static constexpr int kMinBlocks = 1;
  static constexpr int kDqk = 576;
  static constexpr int kDv = 512;
  static constexpr bool kVIsK = true;
  static constexpr int kDqkHalf = kDqk / 2;      // 288 dims of Q K^T per CTA
  static constexpr int kDvHalf = kDv / 2;        // 256 value columns per CTA
  static constexpr int kRopeHalf = kDqkHalf - kDvHalf;  // 32 rope dims per CTA
  static constexpr int kM = 64;
  static constexpr int kN = N_;
  static constexpr int kStages = STAGES_;
  static constexpr int kSWarps = 4;             // per S warp group: 16 rows each
  static constexpr int kSGroups = 2;            // S warp groups taking alternate visits
  static constexpr int kOWarps = 4;
  static constexpr int kLoadWarps = 4;
  static constexpr int kWarps = kSWarps * kSGroups + kOWarps + kLoadWarps;
  static constexpr int kThreads = 32 * kWarps;
  // setmaxnreg budgets (a warpgroup each): load, S, O.
  static constexpr int kLoadRegs = 48;
  static constexpr int kSRegs = 144;
  static constexpr int kORegs = 176;
  static constexpr int kComputeThreads = 32 * (kSWarps + kOWarps);  // one S group and the O warps: P's barriers
  static constexpr int kOCols = kDvHalf / kOWarps;  // value columns per O warp
  static constexpr int kKStride = kDqkHalf + 8;     // elements: odd 16-byte chunks per row (ldmatrix)
  static constexpr int kPStride = kN + 8;
  static constexpr int kXFloats = (kN / 8) * 4;     // partial scores per lane
  static constexpr int kXWarpBytes = kXFloats * 32 * 4;  // one warp's partial S: the bytes its mbarrier expects
  static constexpr int kKBytes = kStages * kN * kKStride * 2;
  static constexpr int kPBytes = 2 * kM * kPStride * 2;
  static constexpr int kAlphaBytes = 2 * kM * 4;
  static constexpr int kXBytes = kSWarps * kXWarpBytes;
  static constexpr int kStatBytes = 2 * kM * 4;
  static constexpr int kChainBytes = kSWarps * 32 * 16;  // a lane's softmax state, group to group
  static constexpr int kAckBytes = 4 * kSWarps * kSGroups;  // a word per S warp: where the partner's acknowledgements land
  static constexpr int kBarBytes = (2 * kStages + 2 * kSWarps * kSGroups) * 8;
  static constexpr int kSmemBytes =
      kKBytes + kPBytes + kAlphaBytes + kXBytes + kStatBytes + kChainBytes + kAckBytes + kBarBytes;
  static_assert(kN % 16 == 0 && kStages >= 4, "tile; a stage free while the S and O warps hold three");
  static_assert(kM == 16 * kSWarps, "an S warp per 16 rows");
  static_assert((kKBytes + kPBytes + kAlphaBytes) % 16 == 0, "the exchange buffers take 16-byte stores");
};

// Portable GQA / MHA (head_dim D for Q, K and V) with its work split by warp
// role (kernels/gqa_roles_kernel.cuh): M = 16 x CW folded query rows per CTA,
// KV tiles of N rows in a ring of STAGES shared-memory stages.
//   LW load warps gather each tile's K and V rows with cp.async, every
//     thread's copies completing on the stage's "full" mbarrier;
//   CW consumer warps of 16 rows each keep their Q fragments (D / 4
//     registers), the tile's scores (N / 2) and their O (D / 2) in registers,
//     reduce the softmax within a quad of lanes and feed P to P V from
//     registers: no shared memory besides K and V, no CTA barrier in the loop.
// Every K / V fragment an ldmatrix brings feeds one m16 tile: 256 bytes of
// shared memory per mma in both products (the one-tile kernel's D128
// configuration reads 384 and 320).
// Shared memory: K and V [STAGES][N][D + 8] each, 2 x STAGES mbarriers.
// The CTA enters with 168 registers per thread (65536 / 384); setmaxnreg
// gives the consumers 224 and the load warpgroup 56.
template <int D_, int CW_, int N_, int STAGES_, int LW_>
struct TileShapeRolesGqa {
  static constexpr bool kWgmma = false;
  static constexpr bool kSplitRoles = true;  // kernels/launch_attention.cuh, kernel_for: V_IS_K picks the MLA one
  static constexpr bool kRowsGrid = false;
  static constexpr bool kSkipDraftTiles = false;
  static constexpr int kClusterX = 1;  // CTAs per cluster (cta_coord)
  static constexpr int kMinBlocks = 1;
  static constexpr int kDqk = D_;
  static constexpr int kDv = D_;
  static constexpr bool kVIsK = false;
  static constexpr int kRowsPerWarp = 16;  // kernel_for: 32 picks TileShapeRolesGqaR32's kernel
  static constexpr int kConsumerWarps = CW_;
  static constexpr int kLoadWarps = LW_;
  static constexpr int kWarps = CW_ + LW_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kM = 16 * CW_;
  static constexpr int kN = N_;
  static constexpr int kStages = STAGES_;
  static constexpr int kKStride = D_ + 8;  // elements: odd 16-byte chunks per row (ldmatrix)
  static constexpr int kKBytes = kStages * kN * kKStride * 2;
  static constexpr int kVBytes = kKBytes;
  static constexpr int kBarBytes = 2 * kStages * 8;
  static constexpr int kSmemBytes = kKBytes + kVBytes + kBarBytes;
  static_assert(D_ % 16 == 0 && kN % 16 == 0 && kStages >= 2, "tile");
};

// Portable GQA / MHA by warp roles with 32 folded rows per consumer warp
// (kernels/gqa_roles_r32_kernel.cuh): M = 32 x CW rows per CTA (256 at CW 8),
// KV tiles of N rows in ONE K buffer and ONE V buffer, each with its own
// full / empty mbarrier pair, so that the next tile's K lands while the
// consumers run this tile's P V and the next V while they run the next Q K^T.
//   LW load warps gather each tile's K rows, then its V rows, with cp.async,
//     every thread's copies completing on the buffer's "full" mbarrier;
//   CW consumer warps of 32 rows each (two m16 tiles: every K / V fragment an
//     ldmatrix brings feeds both, 128 bytes of shared memory per mma) keep the
//     tile's scores (N registers) and their O (D) in registers, and each
//     row's softmax state in one lane of the quad that holds the row; their
//     Q sits in shared memory in fragment order (each lane's four A-operand
//     registers of an m16 tile and k16 step as 16 contiguous bytes, written
//     once by the lane that reads it) and is re-read by one 16-byte ld.shared
//     per fragment and k-step: 32 rows of Q in registers would not fit beside
//     S and O.
// Shared memory: Q [M][D] (unpadded, fragment order), K and V [N][D + 8] each,
// 4 mbarriers: 100,384 bytes at D128 (within sm_120's 101,376), 51,232 at D64.
// The CTA enters with 168 registers per thread (65536 / 384); setmaxnreg
// gives the consumers 232 and the load warpgroup 40.
template <int D_, int CW_, int N_, int LW_>
struct TileShapeRolesGqaR32 {
  static constexpr bool kWgmma = false;
  static constexpr bool kSplitRoles = true;  // kernels/launch_attention.cuh, kernel_for
  static constexpr bool kRowsGrid = false;
  static constexpr bool kSkipDraftTiles = false;
  static constexpr int kClusterX = 1;  // CTAs per cluster (cta_coord)
  static constexpr int kMinBlocks = 1;
  static constexpr int kDqk = D_;
  static constexpr int kDv = D_;
  static constexpr bool kVIsK = false;
  static constexpr int kRowsPerWarp = 32;
  static constexpr int kConsumerWarps = CW_;
  static constexpr int kLoadWarps = LW_;
  static constexpr int kWarps = CW_ + LW_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLoadRegs = 40;       // setmaxnreg of the load warpgroup
  static constexpr int kConsumerRegs = 232;  // and of the consumer warpgroups
  static constexpr int kM = kRowsPerWarp * CW_;
  static constexpr int kN = N_;
  static constexpr int kStages = 1;        // one K and one V buffer
  static constexpr int kKStride = D_ + 8;  // elements: odd 16-byte chunks per row (ldmatrix)
  static constexpr int kQBytes = kM * D_ * 2;
  static constexpr int kKBytes = kN * kKStride * 2;
  static constexpr int kVBytes = kKBytes;
  static constexpr int kBarBytes = 4 * 8;  // full / empty of K, full / empty of V
  static constexpr int kSmemBytes = kQBytes + kKBytes + kVBytes + kBarBytes;
  static_assert(D_ % 16 == 0 && kN % 16 == 0, "tile");
};

// The rules of the TMA kernel's map of a K cache's rows (kernels/sm90/tma_host.h,
// encode_k_rows_tmap; flat caches, and page_size 1 caches with the kv_slot_runs
// hint): `rows` rows `stride` elements apart from a 16-byte aligned `k`, the
// stride >= 576 elements and a multiple of 16 bytes, the rows addressable by
// the map's int32 coordinates and the whole map below 2^40 bytes. The plan
// (kernels/plan.cc) and the encoder both ask this.
inline bool rows_map_ok(const void* k, int64_t stride, int64_t rows) {
  const int64_t lim = int64_t{1} << 39;  // elements: 2 bytes each, below 2^40 bytes
  return reinterpret_cast<uintptr_t>(k) % 16 == 0 && stride >= 576 && stride < lim &&
         (stride * 2) % 16 == 0 && rows >= 1 && rows <= 0x7fffffff && rows < lim / stride;
}

// The rules of the sm_90a MLA kernels' Q and output maps (kernels/sm90/tma_host.h,
// encode_folded_rows_map): a [total_q][heads][width] tensor whose box is one
// CTA's 64 folded rows, so G (heads per KV head) divides 64 or 64 divides G,
// and a 16-byte aligned base and strides (the copy engine's rules). The plan
// asks it with a NULL base (every run's pointers are 16-byte aligned).
inline bool folded_rows_map_ok(const void* base, int width, int64_t total_q, int64_t stride_token,
                               int64_t stride_head, int G) {
  return G > 0 && (G % 64 == 0 || 64 % G == 0) && total_q > 0 &&
         reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride_head >= width &&
         stride_head % 8 == 0 && stride_token % 8 == 0;  // 16-byte strides of 2-byte elements
}

// Every configuration below is planned by some (arch, layout, shape) rule of
// make_plan (kernels/plan.cc; kernels/tests/plan_test.cc walks them); any of
// them runs when options.config names it and it serves the call.
enum ConfigId : int {
  kCfgMlaM32N32S1 = 0,    // portable MLA: sm_120 (fits its 101,376 bytes per block)
  kCfgGqa64M64N64S2,      // GQA / MHA head_dim 64, any arch
  kCfgGqa128M64N64S2,     // head_dim 128, any arch
  kCfgGqa256M64N32S2,     // head_dim 256 where 107,520 bytes fit (sm_90)
  kCfgGqa256M64N32S1,     // head_dim 256, one stage (sm_120)
  kCfgMlaWgmmaM64N64PR,   // sm_90a MLA, cp.async producer: page_size 1 and any other layout
  kCfgMlaWgmmaSeesawTma,  // sm_90a MLA, TMA refills + seesaw: paged page_size % 64 == 0; flat
  kCfgMlaWgmmaSeesawRows, // the same through the rows map + gathers: page_size 1, kv_slot_runs hint
  kCfgMlaSplitM32N32,     // portable MLA by warp roles: sm_120 (and sm_90 planned as sm_120)
  kCfgGqa64Roles,         // GQA / MHA head_dim 64 by warp roles: arch-specific images
  kCfgGqa128Roles,        // head_dim 128 by warp roles: arch-specific images
  kCfgMlaClusterM64N32,   // portable MLA by warp roles over a 2-CTA cluster: arch-specific images
  kCfgGqa64RolesM256,     // head_dim 64 by warp roles, 32 rows per consumer warp, >= 256 rows
  kCfgGqa128RolesM256,    // head_dim 128 by warp roles, 32 rows per consumer warp, >= 256 rows
  kCfgGqa128RolesS3,      // head_dim 128 by warp roles, three stages: where 104,496 bytes fit (sm_90)
  kNumConfigs
};

template <int ID>
struct ConfigShape;
template <> struct ConfigShape<kCfgMlaM32N32S1> { using type = TileShape<576, 512, true, 2, 4, 32, 1>; };
// GQA D64 / D128: two CTAs per SM (2 x 56 KB / 2 x 97 KB of shared memory),
// which caps registers at 65536 / (2 x threads): D128 fits at 124 registers,
// and one CTA per SM leaves the SM idle through each CTA's prologue and
// epilogue on the many-request, short-KV shapes.
template <> struct ConfigShape<kCfgGqa64M64N64S2> { using type = TileShape<64, 64, false, 4, 1, 64, 2, 2>; };
template <> struct ConfigShape<kCfgGqa128M64N64S2> { using type = TileShape<128, 128, false, 4, 2, 64, 2, 2>; };
template <> struct ConfigShape<kCfgGqa256M64N32S2> { using type = TileShape<256, 256, false, 4, 2, 32, 2>; };
template <> struct ConfigShape<kCfgGqa256M64N32S1> { using type = TileShape<256, 256, false, 4, 2, 32, 1>; };
template <> struct ConfigShape<kCfgMlaWgmmaM64N64PR> { using type = TileShapeWgmmaMla<false>; };
template <> struct ConfigShape<kCfgMlaWgmmaSeesawTma> { using type = TileShapeWgmmaMla<true>; };
template <> struct ConfigShape<kCfgMlaWgmmaSeesawRows> { using type = TileShapeWgmmaMla<true, true>; };
template <> struct ConfigShape<kCfgMlaSplitM32N32> { using type = TileShapeSplitMla<32, 2>; };
// 8 consumer warps (two per scheduler: one's softmax under the other's MMAs)
// and a load warpgroup, 384 threads. Two stages of 64-row K and V tiles:
// 69,664 bytes at D128 (sm_120: one CTA per SM), 36,896 at D64.
template <> struct ConfigShape<kCfgGqa64Roles> { using type = TileShapeRolesGqa<64, 8, 64, 2, 4>; };
template <> struct ConfigShape<kCfgGqa128Roles> { using type = TileShapeRolesGqa<128, 8, 64, 2, 4>; };
// Three stages where 104,496 bytes fit (sm_90, not sm_120): a third K / V
// tile in flight while the consumers read one, faster than two stages on the
// bandwidth-bound rows, than the 32-row kernel on the compute-bound ones and
// than the one-tile kernel at 64 rows or fewer (BENCHMARKS.md table 4); not
// over an fp8 cache (kernels/plan.cc).
template <> struct ConfigShape<kCfgGqa128RolesS3> { using type = TileShapeRolesGqa<128, 8, 64, 3, 4>; };
// Four stages of the CTA's 288-dim half of 32-row K tiles: 97,504 bytes.
template <> struct ConfigShape<kCfgMlaClusterM64N32> { using type = TileShapeClusterMla<32, 4>; };
// 8 consumer warps of 32 rows (256 folded rows per CTA) and a load warpgroup,
// one K and one V buffer of 64 rows: 100,384 bytes at D128, 51,232 at D64.
// Planned from 256 rows per KV head where its splits keep kMinR32Tiles KV tiles
// per CTA (kernels/plan.cc).
template <> struct ConfigShape<kCfgGqa64RolesM256> { using type = TileShapeRolesGqaR32<64, 8, 64, 4>; };
template <> struct ConfigShape<kCfgGqa128RolesM256> { using type = TileShapeRolesGqaR32<128, 8, 64, 4>; };

// Whether a tile shape loads K by TMA (its tensor map encoded per launch).
template <class S>
constexpr bool k_by_tma() {
  if constexpr (S::kWgmma) {
    return S::kSeesawTma;
  } else {
    return false;
  }
}

// Whether a tile shape has instances for fp8 (e4m3) caches: the GQA warp-role
// kernels and the 2-CTA cluster MLA kernel, whose load warps convert each row
// into q's dtype on its way to shared memory (kernels/loaders/fp8_rows.cuh),
// and the sm_90a cp.async MLA kernel, whose producer converts each tile in its
// stage (kernels/sm90/mla_fp8_producer.cuh); the consumers read the same
// stages as for a q-dtype cache. Not the one-CTA MLA split kernel: a load
// thread's share of a 576-wide row (144 bytes) does not fit its 56 registers;
// the plan takes the cluster kernel at every row count for an fp8 MLA cache
// where no sm_90a image runs. Not the sm_90a TMA kernels: the plan takes the
// cp.async one for an fp8 cache at every layout. Of the one-tile kernels, the
// head_dim 256 ones (every thread reads its part of a tile into registers and
// converts it into the free stage); at head_dim 64 / 128 the plan takes the
// warp-role kernels for an fp8 cache at every row count.
template <class S>
constexpr bool kv_fp8_ok() {
  if constexpr (S::kSplitRoles && !S::kVIsK) {
    return true;
  } else if constexpr (S::kSplitRoles) {
    return S::kClusterX == 2;
  } else if constexpr (S::kWgmma) {
    return !S::kSeesawTma;
  } else {
    // The one-tile kernels at head_dim 256 (no warp-role kernel serves it):
    // every thread converts its part of a tile (kernels/attention_kernel.cuh).
    return !S::kVIsK && S::kDqk == 256;
  }
}

// A tile shape run on an fp8 (e4m3) cache: Base's shape and shared memory,
// the load warps converting (kernels/launch_attention.cuh instantiates it for
// Plan::kv_fp8).
template <class Base>
struct KvFp8 : Base {
  static_assert(kv_fp8_ok<Base>(), "no fp8-cache instance of this shape");
  static constexpr bool kKvFp8 = true;
};

// Shape::kKvFp8 where the shape declares it (KvFp8), else false.
template <class S, class = void>
struct IsKvFp8 {
  static constexpr bool value = false;
};
template <class S>
struct IsKvFp8<S, decltype(void(S::kKvFp8))> {
  static constexpr bool value = S::kKvFp8;
};

// Whether a tile shape's kernel can run balanced splits (Plan::split_units,
// kernels/core/balanced_splits.cuh): the GQA warp-role kernels, whose
// prologue (kernels/core/roles.cuh) decodes a pooled grid z and whose
// epilogue (kernels/core/gqa_warp.cuh) marks a row's unused workspace slots;
// not their fp8-cache instances, whose load warps (56 registers, converting
// rows) spill with the request's index in a vector register.
template <class S>
inline constexpr bool kBalancesSplits = S::kSplitRoles && !S::kVIsK && !IsKvFp8<S>::value;
// Whether a tile shape's kernel can combine two splits itself (Plan::pair_splits,
// kernels/core/pair_combine.cuh): the 16-row GQA warp-role kernel, whose
// consumer warps hold a whole 16-row slice of O to the end; not its
// fp8-cache instances (their load warps have no register to spare).
template <class S>
constexpr bool pairs_splits() {
  if constexpr (S::kSplitRoles && !S::kVIsK) {
    return S::kRowsPerWarp == 16 && !IsKvFp8<S>::value;
  } else {
    return false;
  }
}
template <class S>
inline constexpr bool kPairsSplits = pairs_splits<S>();
// Balanced splits take one lane per request: batches of 2 to this many.
constexpr int kMaxBalancedBatch = 32;

struct ConfigDesc {
  const char* tag;  // e.g. "mla_m32n32_s1"
  bool mla;         // serves MLA (v_is_k_prefix, 576 / 512); else GQA / MHA of head_dim_qk
  int head_dim_qk, head_dim_vo;
  int m, n, warps, stages, smem_bytes;
  int min_blocks;  // CTAs per SM the kernel is compiled to fit (TileShape::kMinBlocks)
  int only_arch;   // 0: any built arch; else the one sm_XY (XY) it runs on (wgmma: 90)
  bool wgmma;      // the sm_90a warpgroup-MMA path (plan name "wgmma_..." instead of "mma_sync_...")
  int tile_granule;  // KV tiles a CTA takes at a time, for choose_splits (2: sm_90a tile pairs)
  bool rows_grid;    // the kernel can run the rows-first grid (TileShape*::kRowsGrid)
  bool k_tma;        // K tiles by bulk tensor copies (the sm_90a TMA kernel)
  bool arch_specific;  // a body only in sm_XYa images (the warp-role kernels, TileShape*::kSplitRoles)
  int cluster_x;       // CTAs per cluster along x (TileShape*::kClusterX): grid x = cluster_x x launch_grid's
  bool kv_fp8;         // has fp8-cache instances (kv_fp8_ok)
  bool balance;        // can run balanced splits (kBalancesSplits)
  bool pair;           // can combine two splits in a cluster (kPairsSplits)
};
const ConfigDesc& config_desc(ConfigId id);

struct DeviceInfo {
  int device;
  int sm_arch;         // major * 10 + minor
  int num_sms;
  int max_smem_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// Current device and its attributes. VA_ERR_NO_DEVICE if there is none.
va_status query_device(DeviceInfo* info);

#if defined(__CUDACC__)
#define VA_HOST_DEVICE __host__ __device__
#else
#define VA_HOST_DEVICE
#endif

// The KV tiles [*begin, *end) that split `split` of `num_splits` takes of a
// row tile's `num_tiles` tiles: contiguous, disjoint, and together covering
// [0, num_tiles) (possibly empty when num_splits > num_tiles). Shared by the
// kernel (device) and the plan tests (host), so what is tested is what runs.
VA_HOST_DEVICE inline void split_tile_range(int split, int num_splits, int num_tiles, int* begin,
                                            int* end) {
  *begin = static_cast<int>(static_cast<int64_t>(split) * num_tiles / num_splits);
  *end = static_cast<int>(static_cast<int64_t>(split + 1) * num_tiles / num_splits);
}

// Balanced splits (Plan::split_units): request i of a batch of `batch`
// requests, t_i KV tiles, takes balanced_splits_of(t_i, q, slots) splits of at
// most q tiles each, q the smallest share whose splits, max(1, ceil(t_i / q))
// summed over the requests (splits_at(q): a warp's reduction on the device, a
// loop in the plan tests), number at most `units` CTAs: a long request gets more
// splits and a short one fewer, so that no CTA holds more tiles than it must
// (FlashInfer plans its split-KV chunks so on the host, from host copies of the
// lengths). The sum is at most total / q + batch, so q lies in
// [ceil(total / units), ceil(total / (units - batch))], and at most the
// longest request's tiles (one split each; units >= batch): a search of a few
// steps where units is a few times the batch.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class SplitsAt>
VA_HOST_DEVICE inline int balanced_share(int64_t total_tiles, int max_tiles, int batch, int units,
                                         SplitsAt splits_at) {
  int64_t high = max_tiles > 1 ? max_tiles : 1;
  if (units > batch) {
    const int64_t enough = (total_tiles + (units - batch) - 1) / (units - batch);
    if (enough < high) high = enough < 1 ? 1 : enough;
  }
  const int64_t low = (total_tiles + units - 1) / units;
  int hi = static_cast<int>(high);
  int lo = low < 1 ? 1 : (low > hi ? hi : static_cast<int>(low));
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (splits_at(mid) <= static_cast<int64_t>(units)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Splits of a request of `tiles` KV tiles at `share` tiles per split: at least
// one (an empty request's CTA still reports its errors and writes its rows),
// at most max_splits (the workspace's slots per row).
VA_HOST_DEVICE inline int balanced_splits_of(int tiles, int share, int max_splits) {
  const int s = tiles > share ? (tiles + share - 1) / share : 1;
  return s < max_splits ? s : max_splits;
}

// KV tiles (of N rows) the row tile starting at folded row `row0` (M rows,
// R rows in the request, G rows per token) visits: all `kv_len` rows, or under
// CAUSAL only up to the last token's own draft row (prefix + t_last).
VA_HOST_DEVICE inline int row_tile_kv_tiles(int row0, int M, int R, int G, int kv_len,
                                            int prefix, bool causal, int N) {
  const int last = (row0 + M < R ? row0 + M : R) - 1;
  const int t_last = last / G;
  const int kv_end = causal ? (kv_len < prefix + t_last + 1 ? kv_len : prefix + t_last + 1)
                            : kv_len;
  return (kv_end + N - 1) / N;
}

// What grid block (bx, by, bz) of a (gx, gy, *) grid is: request, KV head,
// row tile (of row_tiles; folded rows [r M, (r+1) M) for row tile r) and
// split. With rows_fastest (Plan::grid_rows_fastest, the sm_90a MLA kernels'
// default) the grid is (row tile, request * Hkv + kv head, split): a
// request's row tiles, which read the same KV tiles, are adjacent in launch
// order (a grid of more than one wave keeps each request's readers in one
// wave; FlashMLA's grid (m block, head, part) is ordered so too); else
// (request * Hkv + kv head, row tile, split). Row tiles go longest first in
// both: index i of the row tiles' dimension is row tile row_tiles - 1 - i
// (under CAUSAL or a tree the last row tiles see the most KV tiles, and the
// block scheduler starts CTAs in launch order: longest-processing-time-first,
// as FlashAttention-3's LPT scheduler orders causal blocks). With the rows
// first that order holds within each request only (a multi-request grid of
// more than one wave launches the last requests' long row tiles after the
// first requests' short ones); keeping a request's readers of a KV tile
// together still wins on multi-request trees of many waves (BENCHMARKS.md).
// The kernels' cta_coord (kernels/core/request.cuh); launch_grid below is its
// grid.
struct CtaCoord {
  int req, hk, row_tile, row_tiles, split;
};
VA_HOST_DEVICE inline CtaCoord grid_coord(bool rows_fastest, int num_kv_heads, unsigned bx,
                                          unsigned by, unsigned bz, unsigned gx, unsigned gy) {
  // Unsigned division: the signed one costs more instructions (and, in a
  // kernel at its register cap, a stack slot).
  const unsigned heads_idx = rows_fastest ? by : bx;
  const unsigned hkv = static_cast<unsigned>(num_kv_heads);
  const int row_tiles = static_cast<int>(rows_fastest ? gx : gy);
  return {static_cast<int>(heads_idx / hkv), static_cast<int>(heads_idx % hkv),
          row_tiles - 1 - static_cast<int>(rows_fastest ? bx : by), row_tiles, static_cast<int>(bz)};
}

// Partial results of split z
// for output row (token, head) live at workspace row z * ws_rows + token * Hq + head.
VA_HOST_DEVICE inline int64_t workspace_row(int split, int64_t ws_rows, int64_t token,
                                            int num_qo_heads, int head) {
  return split * ws_rows + token * num_qo_heads + head;
}

struct Plan {
  ConfigId config;
  int group;             // query rows folded per KV head and token (Hq / Hkv)
  int row_tiles;         // ceil(max_q_len * group / M)
  int splits;            // KV splits (grid z)
  // splits == 2 combined by the row tile's two split CTAs, launched as one
  // thread-block cluster (1 x 1 x 2), in distributed shared memory: no
  // workspace, no merge kernel (kernels/core/pair_combine.cuh).
  bool pair_splits;
  bool kv_fp8;           // the cache is fp8 e4m3 (va_params.kv_dtype): the KvFp8 instance runs
  // The TMA kernel's instance that skips invisible draft tiles
  // (TileShapeWgmmaMla's SKIP_DRAFT_TILES): TREE masks with max_q_len > 4 N on
  // the TMA configurations (kernels/plan.cc; the plan's name ends in "_skip").
  // Chains and shorter trees run the kernel without the per-visit tile lookup.
  bool skip_draft_tiles;
  // Grid (row tile, request * Hkv + kv head, split) instead of (request *
  // Hkv + kv head, row tile, split): a request's row tiles adjacent in launch
  // order (grid_coord). For the configurations that can run it
  // (ConfigDesc::rows_grid: the sm_90a MLA kernels) whenever batch_size * Hkv
  // <= 65535 (grid y's limit), unless the options ask for VA_GRID_REQUESTS.
  bool grid_rows_fastest;
  // The sm_90a TMA kernel releases stage 0's blocks 0-3 for refill right after
  // consumer 0's P_A V_A[:, L] (kernels/sm90/mla_seesaw_kernel.cuh): when a
  // request's rows fit one row tile (plan.cc), or as the options say.
  bool early_a0_release;
  // The sm_90a MLA kernels' Q tile by a bulk tensor copy and their unsplit
  // output by bulk tensor stores (kernels/sm90/tma_host.h), where the maps can
  // describe q / out (folded_rows_map_ok) and the options do not turn them off.
  bool q_tma;
  bool o_tma;
  // Balanced splits (balanced_share): 0, or the split CTAs of each (KV head,
  // row tile), batch_size x the split count, which the kernel hands to the
  // requests by their device KV lengths; `splits` is then the workspace's
  // slots per row (a request's most splits). Grid z holds these CTAs and x
  // the KV heads only (launch_grid). Where the kernel can
  // (ConfigDesc::balance), for an automatic split count above 1 over 2 to
  // kMaxBalancedBatch requests: with VA_ON always, with VA_AUTO where a split
  // of max_kv_len holds kMinBalancedSplitTiles KV tiles (plan.cc).
  int split_units;
  int64_t ws_rows;       // total_q * num_qo_heads (rows of the partial arrays)
  size_t ws_o_bytes;     // splits * ws_rows * Dv * 4 (0 when splits == 1)
  size_t workspace_bytes;
  DeviceInfo dev;
  char name[64];
};

// The launch grid of `plan` for batch_size x num_kv_heads in grid_coord's
// order (rows_fastest: Plan::grid_rows_fastest and the launched shape's
// kRowsGrid, the order the kernel decodes): x, y, z.
inline void launch_grid(const Plan& plan, bool rows_fastest, int batch_size, int num_kv_heads,
                        unsigned* x, unsigned* y, unsigned* z) {
  // Balanced splits: the requests come from z (kernels/core/balanced_splits.cuh).
  const unsigned requests = plan.split_units > 0 ? 1u : static_cast<unsigned>(batch_size);
  const unsigned heads = requests * static_cast<unsigned>(num_kv_heads);
  const unsigned rows = static_cast<unsigned>(plan.row_tiles);
  *x = rows_fastest ? rows : heads;
  *y = rows_fastest ? heads : rows;
  *z = static_cast<unsigned>(plan.split_units > 0 ? plan.split_units : plan.splits);
}

// `p` must have passed the scalar validation of capi_attention.cc (dims,
// heads, max_q_len, ...); its pointers may be NULL (a plan's runs pass their
// own, 16-byte aligned). `opt` as va_plan_options_init leaves it: the plan's
// rules. Fails with VA_ERR_UNSUPPORTED when no config fits the device or the
// device arch is not built, VA_ERR_INVALID_VALUE for a bad option.
va_status make_plan(const va_params& p, const DeviceInfo& dev, const va_plan_options& opt,
                    Plan* plan);

// The options' own checks (make_plan runs them first; the C-ABI runs them
// before asking for the device): VA_ERR_VERSION / VA_ERR_INVALID_VALUE naming
// the field. *forced_config: the configuration options.config names, or -1.
va_status check_plan_options(const va_plan_options& opt, int* forced_config);

// Split-K count for `base_ctas` CTAs (requests x KV heads x row tiles) over a
// row tile's `kv_tiles` KV tiles, `ctas_per_sm` resident per SM, the kernel
// taking its tiles `tile_granule` at a time (2: the sm_90a kernels' tile pairs):
// the count that minimises (waves of CTAs) x (tiles per CTA, rounded up to the
// granule, + fixed cost per CTA) + a merge cost per split, so a split that
// leaves a partial last wave is not taken (wave quantisation). The sm_90a
// kernels (granule 2) have their own merge cost, split cap and share of the
// SMs (plan.cc, H200 fit).
int choose_splits(int64_t base_ctas, int64_t kv_tiles, int num_sms, int ctas_per_sm,
                  int tile_granule = 1);

}  // namespace verify_attn

#endif  // VERIFY_ATTN_PLAN_H_
