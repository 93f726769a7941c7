// The prologue of the warp-role kernels (kernels/mla_split_kernel.cuh,
// kernels/gqa_roles_kernel.cuh): the request tile (kernels/core/request.cuh)
// into shared memory, the bad-index flag cleared and the stages' mbarriers
// initialised, before the roles split.
#ifndef VERIFY_ATTN_CORE_ROLES_CUH_
#define VERIFY_ATTN_CORE_ROLES_CUH_

#include <stdint.h>

#include "kernels/core/balanced_splits.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/request.cuh"
#include "kernels/launch.h"
#include "kernels/loaders/tile_copy.cuh"
#include "kernels/sm90/sync.cuh"

namespace verify_attn {

// Every thread calls it; false when the CTA has nothing to compute (every
// thread then returns). Nothing computed here stays in registers past the role
// split (a value live across setmaxnreg costs a local-memory spill, ptxas):
// each role re-derives what it needs from blockIdx, the parameters and *s_rt
// (the request and split from *s_rt: balanced splits decode them from a pool).
// full[b] completes after full_arrivals arrivals (the load threads' cp.async
// arrivals), empty[b] after empty_arrivals (the warps that read a buffer), for
// b < kBarriers: one pair per stage, or per buffer where a kernel keeps K and
// V apart (kernels/gqa_roles_r32_kernel.cuh). kReaderRows > 0: the readers
// own kReaderRows folded rows each, in order from the tile's first, and
// those whose rows all lie past the request never touch the ring: empty[b]
// then counts only the readers with rows, min(empty_arrivals,
// ceil((R - row0) / kReaderRows)).
template <class Shape, typename DT, class Loader, int kBarriers = Shape::kStages, int kReaderRows = 0>
__device__ __forceinline__ bool role_prologue(const KernelParams& p, RequestTile* s_rt, int* s_bad_kv,
                                              uint64_t* full, uint64_t* empty, uint32_t full_arrivals,
                                              uint32_t empty_arrivals) {
  {
    CtaCoord cc = cta_coord<Shape::kRowsGrid, Shape::kClusterX>(p);
    int splits = p.num_splits;
    if constexpr (kBalancesSplits<Shape>) {
      // Balanced splits: the request and split come from the pool (grid z).
      if (p.split_units > 0 && !balanced_coord<Loader>(p, Shape::kN, &cc, &splits)) return false;
    }
    const Loader loader(p, cc.req, cc.hk);
    RequestTile rt;
    if (!start_request<Shape, DT, Loader>(p, loader, cc, splits, &rt)) return false;
    if (threadIdx.x == 0) {
      *s_rt = rt;
      *s_bad_kv = 0;
      if constexpr (kReaderRows > 0) {
        const uint32_t readers = static_cast<uint32_t>((rt.R - rt.row0 + kReaderRows - 1) / kReaderRows);
        if (readers < empty_arrivals) empty_arrivals = readers;
      }
      for (int b = 0; b < kBarriers; ++b) {
        sm90::mbar_init(full + b, full_arrivals);
        sm90::mbar_init(empty + b, empty_arrivals);
      }
      sm90::mbar_init_fence();
    }
  }
  __syncthreads();
  return true;
}

// The CTA's request in a role's code after the split: *s_rt's where the
// kernel runs balanced splits (decoded from the pool), else from blockIdx, a
// uniform register: the fp8-cache instances' load warps have none to spare.
template <class Shape>
__device__ __forceinline__ int role_request(const KernelParams& p, const RequestTile& rt) {
  if constexpr (kBalancesSplits<Shape>) {
    return rt.req;
  } else {
    return cta_coord<Shape::kRowsGrid, Shape::kClusterX>(p).req;
  }
}

// A load warp's ring over the CTA's `visits` KV tiles: tile i goes to stage
// i % STAGES once the readers released its previous use (`empty`), and the
// thread's copies of it (cp.async) complete on the stage's `full` mbarrier
// (cp.async.mbarrier.arrive.noinc). The thread copies row `row` of every
// tile (rows_of(i): tile i's KvTileRows); its lookup (a paged cache's
// kv_indices load) is issued a tile ahead, before the stage's wait and the
// copies of the tile before, so that the load warps do not wait for one
// lookup round trip per tile; copy(resolved row, stage) issues the copies.
// The copies are never committed as a group, so cp.async.wait_group would
// not wait for them: they are committed and waited for at the end, so that
// nothing of the thread is in flight when it exits.
template <int STAGES, class RowsOf, class Copy>
__device__ __forceinline__ void load_role_ring(int visits, uint64_t* full, uint64_t* empty, RowsOf rows_of, int row,
                                               Copy copy) {
  RowsAhead<RowsOf> ahead(rows_of, row, visits);
  for (int i = 0; i < visits; ++i) {
    const int st = i % STAGES;
    const ResolvedRow resolved = ahead.take(i);
    if (i >= STAGES) sm90::mbar_wait(empty + st, static_cast<uint32_t>((i / STAGES) & 1) ^ 1u);
    copy(resolved, st);
    sm90::cp_async_arrive_noinc(full + st);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// load_role_ring for a cache converted on its way to shared memory (fp8,
// kernels/loaders/fp8_rows.cuh): fetch(i) reads the thread's part of tile i
// into registers before the stage's wait, so that the read's latency overlaps
// it; put(fetched, stage) converts and stores it, and the thread's ordinary
// (release) arrive on `full` orders those stores before the readers' loads.
template <int STAGES, class Fetch, class Put>
__device__ __forceinline__ void convert_role_ring(int visits, uint64_t* full, uint64_t* empty, Fetch fetch,
                                                  Put put) {
  for (int i = 0; i < visits; ++i) {
    const int st = i % STAGES;
    const auto fetched = fetch(i);
    if (i >= STAGES) sm90::mbar_wait(empty + st, static_cast<uint32_t>((i / STAGES) & 1) ^ 1u);
    put(fetched, st);
    sm90::mbar_arrive(full + st);
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_ROLES_CUH_
