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
// waits on k_empty[g], and its lane 0 issues the group's copies (L2
// evict_first for ranges up to kEvictFirstMaxTiles, kernels/sm90/tma.cuh), each block
// completing full_bar[stage][block] by its transaction bytes; lane 0 of warps
// 0 and 2 then checks their stage's tile (a bad KV index sets *s_bad_kv, as
// the other kernels flag it). A bad page is copied from
// coordinate -1: the copy engine fills zeros (and still counts the bytes).
#ifndef VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_
#define VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_

#include <stdint.h>

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

// The producer warpgroup's work (wtid = 0..127), for every tile pair of the
// CTA's range rt (an odd count's last pair: tile A only).
template <class Shape, class Loader>
__device__ __forceinline__ void issue_k_tiles(const KernelParams& p, const RequestTile& rt,
                                              const Loader& loader, unsigned char* sK,
                                              uint64_t (&full_bar)[2][Shape::kKBlocks],
                                              uint64_t (&k_empty)[4], int* s_bad_kv, int wtid) {
  constexpr int N = Shape::kN, KB = Shape::kKBlocks;
  const int n_tiles = rt.tile_end - rt.tile_begin;
  const int n_pairs = (n_tiles + 1) >> 1;  // the last one without tile B when n_tiles is odd
  const int g = wtid >> 5, lane = wtid & 31, h = group_stage(g);
  // L2 evict_first on the K copies only for short tile ranges: the CTAs that
  // share a split's tiles (its row tiles) drift apart over a long range, and
  // a line evicted first is then read from DRAM again (H200, BENCHMARKS
  // session 16: evict_first everywhere cost B16 H16 T64 L32k, 512 tiles per
  // CTA, and B4 H16 T64 L128k, 1,024, 1-2%; ranges of <= 64 tiles gained 3-6%).
  const bool evict_first = n_tiles <= kEvictFirstMaxTiles;
  for (int u = 0; u < n_pairs; ++u) {
    const int i = 2 * u + h;  // this stage's tile of pair u
    // An odd count's last pair has no tile B: the consumers read none
    // (kernels/sm90/mla_seesaw_kernel.cuh), so nothing is copied.
    if (lane == 0 && i < n_tiles) {
      int page = -1, slot = 0;
      loader.page_coord((rt.tile_begin + i) * N, &page, &slot);
      // Pair u - 1's readers are done. Suspending up to 1 ms per try instead of
      // polling (mbarrier.try_wait's suspend-time hint; ncu counted 4.1 M polls
      // of this wait per launch): the thread wakes when the phase completes.
      if (u > 0) mbar_wait<1000000u>(&k_empty[g], (u - 1) & 1);
#pragma unroll
      for (int b = 0; b < KB; ++b) {
        if (group_has_block(g, b)) {
          mbar_arrive_expect_tx(&full_bar[h][b], kBlockBytes);
          unsigned char* dst = sK + h * Shape::kKTileBytes + b * kBlockBytes;
          if (evict_first)
            tma_load_block</*kEvictFirst=*/true>(dst, p.k_tmap, &full_bar[h][b], b * kBlockCols,
                                                 slot, page);
          else
            tma_load_block</*kEvictFirst=*/false>(dst, p.k_tmap, &full_bar[h][b], b * kBlockCols,
                                                  slot, page);
        }
      }
      // The tile through the loader's checks (a slot past the request's
      // pages or a page id outside the cache is flagged there): the copy
      // engine reads whatever the page coordinate names, so a bad tile must
      // turn the CTA's rows into NaN. page_size % 64 == 0 puts a tile in one
      // page: its first row's checks are every row's, and that row is below
      // kv_len (a split's tiles end at ceil(kv_end / N), kv_end <= kv_len:
      // kernels/core/request.cuh). After this pair's copies.
      if ((g & 1) == 0) {
        int64_t k_off, v_off;
        const int j0 = (rt.tile_begin + i) * N;
        if (!loader.row(j0, &k_off, &v_off)) *s_bad_kv = 1;
        // A flat tile is 64 consecutive cache rows from its first: its last
        // row below kv_len is checked too (a request's rows past the cache).
        if constexpr (!Loader::kPaged) {
          const int j1 = min(j0 + N, rt.kv_len) - 1;
          if (j1 > j0 && !loader.row(j1, &k_off, &v_off)) *s_bad_kv = 1;
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace seesaw
}  // namespace sm90
}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_TMA_PRODUCER_CUH_
