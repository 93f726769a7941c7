// The producer warpgroup of the sm_90a TMA kernel
// (kernels/sm90/mla_seesaw_kernel.cuh): the K tiles of a CTA's tile pairs into
// the two shared-memory stages by bulk tensor copies, each block group refilled
// as soon as the consumer that reads it last has released it.
//
// Block groups, each refilled as a unit once its last reader released it
// (k_empty[group]): stage 0 (tile A) blocks 0-3 (C0 after P_A V_A[:, L]) and
// 4-8 (C1 after P_A V_A[:, R]); stage 1 (tile B) blocks 0-3 and 8 (C0 after
// P_B V_B[:, L]) and 4-7 (C1 after P_B V_B[:, R]). Producer warp g issues
// group g: it reads the tile's page (kernels/loaders: one page-table read),
// waits on k_empty[g], and its lanes issue the group's copies, one block each (L2
// evict_first for ranges up to kEvictFirstMaxTiles, kernels/sm90/tma.cuh), each block
// completing full_bar[stage][block] by its transaction bytes; lane 0 of warps
// 0 and 2 then checks their stage's tile (a bad KV index sets *s_bad_kv, as
// the other kernels flag it). A bad page is copied from
// coordinate -1: the copy engine fills zeros (and still counts the bytes).
// (kRowsGather: every lane checks its rows' ids before the wait, below.)
//
// Flat caches read through the rows map (kernels/sm90/tma_host.h,
// encode_k_rows_tmap: the page coordinate 0, the slot the cache row; a flat
// tile is always 64 consecutive rows). kRowsGather: page_size 1 caches through
// the same map, each tile boxed or gathered (issue_k_tiles_rows).
#ifndef VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_
#define VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"
#include "kernels/core/request.cuh"
#include "kernels/launch.h"
#include "kernels/sm90/swizzle.cuh"
#include "kernels/sm90/sync.cuh"
#include "kernels/sm90/tma.cuh"

namespace verify_attn {
namespace sm90 {
namespace seesaw {

constexpr int kEvictFirstMaxTiles = 256;
constexpr int kGroupA0 = 0, kGroupA1 = 1, kGroupB0 = 2, kGroupB1 = 3;
__host__ __device__ constexpr int group_stage(int g) { return g >> 1; }
__host__ __device__ constexpr bool group_has_block(int g, int b) {
  return g == kGroupA0   ? b < 4
         : g == kGroupA1 ? b >= 4
         : g == kGroupB0 ? (b < 4 || b == 8)
                         : (b >= 4 && b < 8);
}

// The blocks of group g in a fixed order: k-th (k < group_blocks(g)).
__host__ __device__ constexpr int group_blocks(int g) {
  return g == kGroupA0 || g == kGroupB1 ? 4 : 5;
}
__host__ __device__ constexpr int group_block(int g, int k) {
  return (g & 1) ? 4 + k : (k < 4 ? k : 8);  // A1: 4-8, B1: 4-7; A0: 0-3, B0: 0-3 and 8
}
// group_block lists exactly group_has_block's blocks, each once.
constexpr bool group_blocks_listed() {
  for (int g = 0; g < 4; ++g) {
    int n = 0;
    for (int b = 0; b < 9; ++b) n += group_has_block(g, b) ? 1 : 0;
    if (n != group_blocks(g)) return false;
    for (int k = 0; k < group_blocks(g); ++k) {
      if (!group_has_block(g, group_block(g, k))) return false;
      for (int k2 = 0; k2 < k; ++k2)
        if (group_block(g, k2) == group_block(g, k)) return false;
    }
  }
  return true;
}
static_assert(group_blocks_listed(), "group_block / group_blocks disagree with group_has_block");

// Block b of stage h by one bulk tensor copy of K map coordinates (row
// `row`, page `page`), completing full_bar[h][b] by its transaction bytes; L2
// evict_first when `evict_first`.
template <class Shape>
__device__ __forceinline__ void issue_block_box(const KernelParams& p, int h, int b,
                                                unsigned char* sK,
                                                uint64_t (&full_bar)[2][Shape::kKBlocks], int row,
                                                int page, bool evict_first) {
  mbar_arrive_expect_tx(&full_bar[h][b], kBlockBytes);
  unsigned char* dst = sK + h * Shape::kKTileBytes + b * kBlockBytes;
  if (evict_first)
    tma_load_block</*kEvictFirst=*/true>(dst, p.k_tmap, &full_bar[h][b], b * kBlockCols, row, page);
  else
    tma_load_block</*kEvictFirst=*/false>(dst, p.k_tmap, &full_bar[h][b], b * kBlockCols, row, page);
}

// Lane `lane` of producer warp g: the lane-th block of group g of stage h
// (lanes past the group's blocks issue nothing): the TMA kernel's producer.
template <class Shape>
__device__ __forceinline__ void issue_group_box_lane(const KernelParams& p, int g, int h, int lane,
                                                     unsigned char* sK,
                                                     uint64_t (&full_bar)[2][Shape::kKBlocks],
                                                     int row, int page, bool evict_first) {
  if (lane < group_blocks(g))
    issue_block_box<Shape>(p, h, group_block(g, lane), sK, full_bar, row, page, evict_first);
}

// One thread: every block of group g of stage h (the rows kernel's boxed
// tiles, issue_k_tiles_rows).
template <class Shape>
__device__ __forceinline__ void issue_group_boxes(const KernelParams& p, int g, int h,
                                                  unsigned char* sK,
                                                  uint64_t (&full_bar)[2][Shape::kKBlocks],
                                                  int row, int page, bool evict_first) {
#pragma unroll
  for (int b = 0; b < Shape::kKBlocks; ++b)
    if (group_has_block(g, b)) issue_block_box<Shape>(p, h, b, sK, full_bar, row, page, evict_first);
}

// A tile the copy engine cannot box (kRowsGather, its rows not consecutive in
// the cache): producer warp g gathers its block group with cp.async, 16 bytes
// per copy, 8 lanes per row (lane: chunk c = lane % 8 of rows lane / 8 + 4 k,
// k = 0..15, each row's offset from the lane that resolved it, off[0] for rows
// 0..31, off[1] for 32..63; -1: a zero row, not read), into the 128-byte
// swizzled places the copy engine would write (kernels/sm90/swizzle.cuh);
// then waits for its copies, fences them into the async proxy, and lane 0
// arrives on each block's full barrier (no transaction bytes). A slow path:
// the producer warp waits for its own copies, so a launch whose every tile is
// gathered takes markedly longer than the cp.async kernel
// (kernels/sm90/mla_wgmma_kernel.cuh). Two alternatives are slower still:
// the copies handed to the barriers by cp.async.mbarrier.arrive without
// waiting (the consumers then fence after their waits), and one bulk tensor
// copy per row and block (a 64 x 1 box: 576 per tile; the 128-byte swizzle
// follows the shared-memory address, so the rows land right).
// The fence before lane 0's arrival is also what lets a consumer read the
// other consumer's tile without waiting on its barriers (kBarPA / kBarPB,
// kernels/sm90/mla_seesaw_kernel.cuh): a variant that fences on the waiting
// side instead must bring those waits back.
template <class Shape>
__device__ __forceinline__ void gather_group_tile(const KernelParams& p, int g, int h,
                                                  unsigned char* sK,
                                                  uint64_t (&full_bar)[2][Shape::kKBlocks],
                                                  const int64_t (&off)[2], int lane) {
  constexpr int KB = Shape::kKBlocks;
  const int c = lane & 7, r0 = lane >> 3;
  const unsigned char* gk = static_cast<const unsigned char*>(p.k) + c * 16;
  unsigned char* stage = sK + h * Shape::kKTileBytes;
  // Not unrolled: the producer has 40 registers (unrolled, this spills).
#pragma unroll 1
  for (int k = 0; k < 16; ++k) {
    const int r = r0 + 4 * k;
    const int64_t o = __shfl_sync(0xffffffffu, k < 8 ? off[0] : off[1], r & 31);
    const unsigned char* src = gk + 2 * (o >= 0 ? o : 0);
    unsigned char* dst = stage + swizzled_chunk_offset(r, c);  // block 0's place (c < 8)
#pragma unroll
    for (int b = 0; b < KB; ++b)
      if (group_has_block(g, b)) cp_async_16(dst + b * kBlockBytes, src + b * 128, o >= 0);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();  // this lane's copies -> the consumers' wgmma (async proxy)
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int b = 0; b < KB; ++b)
      if (group_has_block(g, b)) mbar_arrive(&full_bar[h][b]);
  }
}

// kRowsGather (page_size 1, the plan's kv_slot_runs hint; p.k_tmap is the rows
// map, whose row r is page r: one KV head, page stride = token stride,
// kernels/sm90/tma_host.h): the work of issue_k_tiles below, but warp g reads
// the page ids of every row of its stage's tile below kv_len (lanes: rows
// lane, lane + 32), checks them (a bad id is flagged and its row zero-filled)
// and boxes the tile when they are consecutive cache rows (rows past kv_len:
// whatever follows in the cache, zeroed by the consumers as for a page-64
// tile), else gathers it (gather_group_tile). The ids are read one pair ahead
// (their loads are in flight while the warp waits for the stage), and the
// box's row is the first id, and lane 0 alone waits for the stage and issues
// the boxes: between the end of that wait and the copies there is no load, no
// division and no reconvergence of the warp (the wait ends on the consumers'
// critical path; with those three there, this kernel runs markedly slower
// than the page-64 one). (issue_k_tiles below wakes its whole warp and
// issues one block per lane; this kernel keeps the lane-0 scheme, as the
// per-lane one is unmeasured here.)
template <class Shape, class Loader>
__device__ __forceinline__ void issue_k_tiles_rows(const KernelParams& p, const RequestTile& rt,
                                                   const Loader& loader, unsigned char* sK,
                                                   uint64_t (&full_bar)[2][Shape::kKBlocks],
                                                   uint64_t (&k_empty)[4], int* s_bad_kv, int wtid) {
  constexpr int N = Shape::kN;
  constexpr bool kSkip = Shape::kSkipDraftTiles;  // visits -> KV tiles (kv_tile)
  const int n_tiles = rt.tile_end - rt.tile_begin;
  const int n_pairs = (n_tiles + 1) >> 1;
  const int g = wtid >> 5, lane = wtid & 31, h = group_stage(g);
  const bool evict_first = n_tiles <= kEvictFirstMaxTiles;
  const int kv_len = rt.kv_len;
  // Page ids of this warp's rows of tile i (rows at or past kv_len: not read).
  auto read_ids = [&](int i, int32_t (&id)[2]) {
    const int j = kv_tile<kSkip>(rt, rt.tile_begin + i) * N + lane;
    id[0] = j < kv_len ? loader.page_entry(j) : -1;  // page_size 1: row j's entry is j
    id[1] = j + 32 < kv_len ? loader.page_entry(j + 32) : -1;
  };
  int32_t next[2] = {-1, -1};
  if (h < n_tiles) read_ids(h, next);
  for (int u = 0; u < n_pairs; ++u) {
    const int i = 2 * u + h;
    if (i >= n_tiles) break;  // an odd count's last pair has no tile B (warp-uniform)
    const int32_t id[2] = {next[0], next[1]};
    if (i + 2 < n_tiles) read_ids(i + 2, next);  // pair u + 1's, in flight across the wait
    const int j = kv_tile<kSkip>(rt, rt.tile_begin + i) * N + lane;
    const bool ok0 = j >= kv_len || loader.page_ok(id[0], j);
    const bool ok1 = j + 32 >= kv_len || loader.page_ok(id[1], j + 32);
    if (!ok0 || !ok1) *s_bad_kv = 1;  // zero-filled (gathered); the CTA's rows become NaN
    const int32_t first = __shfl_sync(0xffffffffu, id[0], 0);  // row 0 is below kv_len
    const int64_t f = first;  // (an id near INT32_MAX must not overflow)
    const bool mine = ok0 && ok1 && (j >= kv_len || id[0] == f + lane) &&
                      (j + 32 >= kv_len || id[1] == f + lane + 32);
    const bool by_tma = __all_sync(0xffffffffu, mine);
    if (!by_tma) {
      // Pair u - 1's readers are done (suspending wait, as issue_k_tiles):
      // every lane waits, then gathers.
      if (u > 0) mbar_wait<1000000u>(&k_empty[g], (u - 1) & 1);
      const int64_t off[2] = {j < kv_len && ok0 ? id[0] * p.k_stride_page : -1,
                              j + 32 < kv_len && ok1 ? id[1] * p.k_stride_page : -1};
      gather_group_tile<Shape>(p, g, h, sK, full_bar, off, lane);
      continue;
    }
    // Boxed: lane 0 waits for the stage and issues the copies at once (the
    // other lanes are not woken between the two: the wait ends on the
    // consumers' critical path).
    if (lane == 0) {
      if (u > 0) mbar_wait<1000000u>(&k_empty[g], (u - 1) & 1);
      issue_group_boxes<Shape>(p, g, h, sK, full_bar, first, 0, evict_first);
    }
    __syncwarp();
  }
}

// The producer warpgroup's work (wtid = 0..127), for every tile pair of the
// CTA's range rt (an odd count's last pair: tile A only).
template <class Shape, class Loader>
__device__ __forceinline__ void issue_k_tiles(const KernelParams& p, const RequestTile& rt,
                                              const Loader& loader, unsigned char* sK,
                                              uint64_t (&full_bar)[2][Shape::kKBlocks],
                                              uint64_t (&k_empty)[4], int* s_bad_kv, int wtid) {
  if constexpr (Shape::kRowsGather) {
    issue_k_tiles_rows<Shape>(p, rt, loader, sK, full_bar, k_empty, s_bad_kv, wtid);
    return;
  }
  constexpr int N = Shape::kN;
  constexpr bool kSkip = Shape::kSkipDraftTiles;  // visits -> KV tiles (kv_tile)
  const int n_tiles = rt.tile_end - rt.tile_begin;
  const int n_pairs = (n_tiles + 1) >> 1;  // the last one without tile B when n_tiles is odd
  const int g = wtid >> 5, lane = wtid & 31, h = group_stage(g);
  // L2 evict_first on the K copies only for short tile ranges: the CTAs that
  // share a split's tiles (its row tiles) drift apart over a long range, and
  // a line evicted first is then read from DRAM again. So evict_first is
  // faster on short ranges and slower on ranges of 512 or more tiles per CTA;
  // kEvictFirstMaxTiles lies between (BENCHMARKS.md).
  const bool evict_first = n_tiles <= kEvictFirstMaxTiles;
  for (int u = 0; u < n_pairs; ++u) {
    const int i = 2 * u + h;  // this stage's tile of pair u
    // An odd count's last pair has no tile B: the consumers read none
    // (kernels/sm90/mla_seesaw_kernel.cuh), so nothing is copied.
    if (i < n_tiles) {  // warp-uniform
      int page = -1, slot = 0;
      const int j0 = kv_tile<kSkip>(rt, rt.tile_begin + i) * N;  // its first KV row
      // Every lane reads the tile's page (one broadcast load), in flight
      // across the wait, so no shuffle stands between the wait and the copies
      // (the wait ends on the consumers' critical path: lane 0's read and two
      // shuffles after it measurably slow the short-range rows).
      loader.page_coord(j0, &page, &slot);
      // Pair u - 1's readers are done. Suspending up to 1 ms per try instead of
      // polling (mbarrier.try_wait's suspend-time hint; polled, this wait
      // spins through millions of tries per launch): the thread wakes when the
      // phase completes.
      if (u > 0) mbar_wait<1000000u>(&k_empty[g], (u - 1) & 1);
      // One block per lane, not the group's 4-5 from lane 0: the copies go
      // out together, and a tile streams from L2 faster when several threads
      // issue its copies than when one does (tools/dev/microbench/copy_rate).
      issue_group_box_lane<Shape>(p, g, h, lane, sK, full_bar, slot, page, evict_first);
      // (Lane 0:) the tile through the loader's checks (a slot past the request's
      // pages or a page id outside the cache is flagged there): the copy
      // engine reads whatever the page coordinate names, so a bad tile must
      // turn the CTA's rows into NaN. page_size % 64 == 0 puts a tile in one
      // page: its first row's checks are every row's, and that row is below
      // kv_len (a split's tiles end at ceil(kv_end / N), kv_end <= kv_len:
      // kernels/core/request.cuh). After this pair's copies.
      // (A flat tile: its first and last rows, kernels/loaders: tile_ok.)
      if (lane == 0 && (g & 1) == 0 && !loader.tile_ok(j0, rt.kv_len)) *s_bad_kv = 1;
    }
    __syncwarp();
  }
}

}  // namespace seesaw
}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_
