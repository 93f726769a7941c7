// Shared by both loaders and by the Q tile: issue the cp.async copies that
// bring ROWS rows (K and optionally V) into padded shared-memory rows, 16 bytes
// per instruction, zero-filling every row the row function declines.
//
// Threads are spread TPR = NTHREADS / ROWS per row so that the row address
// (for paged KV: one kv_indices read and a division) is computed once per row
// and thread, and consecutive threads copy consecutive 16-byte chunks.
#ifndef VERIFY_ATTN_LOADERS_TILE_COPY_CUH_
#define VERIFY_ATTN_LOADERS_TILE_COPY_CUH_

#include <stdint.h>

#include "kernels/core/mma.cuh"
#include "kernels/core/types.cuh"

namespace verify_attn {

// row_fn(r, &k_off, &v_off) -> bool: element offsets of row r's K / V from
// gk / gv, or false to zero-fill the row (past kv_len, bad index, ...).
template <int ROWS, int NTHREADS, int DK, int KSTRIDE, int DV, int VSTRIDE, bool HAS_V,
          typename DT, typename RowFn>
__device__ __forceinline__ void copy_rows_async(DT* sk, DT* sv, const DT* gk, const DT* gv,
                                                RowFn row_fn, int tid) {
  constexpr int kTpr = NTHREADS >= ROWS ? NTHREADS / ROWS : 1;
  constexpr int kRowStep = NTHREADS / kTpr;
  constexpr int kKChunks = DK / kChunkElems;
  constexpr int kVChunks = DV / kChunkElems;
  for (int r = tid / kTpr; r < ROWS; r += kRowStep) {
    int64_t k_off = 0, v_off = 0;
    const bool ok = row_fn(r, &k_off, &v_off);
    const DT* ks = ok ? gk + k_off : gk;  // not dereferenced when !ok
#pragma unroll 4
    for (int c = tid % kTpr; c < kKChunks; c += kTpr) {
      cp_async_16(sk + r * KSTRIDE + c * kChunkElems, ks + c * kChunkElems, ok);
    }
    if constexpr (HAS_V) {
      const DT* vs = ok ? gv + v_off : gv;
#pragma unroll 4
      for (int c = tid % kTpr; c < kVChunks; c += kTpr) {
        cp_async_16(sv + r * VSTRIDE + c * kChunkElems, vs + c * kChunkElems, ok);
      }
    }
  }
}

// copy_rows_async for rows whose shared-memory copy is two column ranges of
// the global row: elements [a0, a0 + DA) then [b0, b0 + DB), side by side in a
// padded row of KSTRIDE (the cluster MLA kernel's half of a K row: 256 value
// columns and 32 rope dims). Same threads per row, row function and zero fill.
template <int ROWS, int NTHREADS, int DA, int DB, int KSTRIDE, typename DT, typename RowFn>
__device__ __forceinline__ void copy_rows_2range_async(DT* sk, const DT* gk, int a0, int b0, RowFn row_fn,
                                                       int tid) {
  constexpr int kTpr = NTHREADS >= ROWS ? NTHREADS / ROWS : 1;
  constexpr int kRowStep = NTHREADS / kTpr;
  constexpr int kAChunks = DA / kChunkElems;
  constexpr int kChunks = (DA + DB) / kChunkElems;
  static_assert(DA % kChunkElems == 0 && DB % kChunkElems == 0, "16-byte ranges");
  static_assert(kChunks % kTpr == 0, "every thread of a row copies the same number of chunks");
  for (int r = tid / kTpr; r < ROWS; r += kRowStep) {
    int64_t k_off = 0, v_off = 0;
    const bool ok = row_fn(r, &k_off, &v_off);
    const DT* ks = ok ? gk + k_off : gk;  // not dereferenced when !ok
#pragma unroll
    for (int k = 0; k < kChunks / kTpr; ++k) {
      const int c = tid % kTpr + k * kTpr;
      const int src = c < kAChunks ? a0 + c * kChunkElems : b0 + (c - kAChunks) * kChunkElems;
      cp_async_16(sk + r * KSTRIDE + c * kChunkElems, ks + src, ok);
    }
  }
}

// copy_rows_async's row function for the KV tile whose first row is j0: rows
// past kv_len are zero-filled (masked, and 0 * V stays finite); a row at a bad
// index (Loader::row flags it in the error word) is zero-filled and sets *bad,
// so that the CTA writes its rows as NaN.
template <class Loader>
struct KvTileRows {
  const Loader& loader;
  int j0, kv_len;
  int* bad;  // shared memory
  __device__ __forceinline__ bool operator()(int r, int64_t* k_off, int64_t* v_off) const {
    return at(r, entry(r), k_off, v_off);
  }
  // The same in two steps (Loader::entry / row_at): entry(r) issues row r's
  // lookup (a paged cache's kv_indices load; none past kv_len), at(r, e, ...)
  // checks and resolves the row from it.
  __device__ __forceinline__ int32_t entry(int r) const { return j0 + r < kv_len ? loader.entry(j0 + r) : -1; }
  __device__ __forceinline__ bool at(int r, int32_t e, int64_t* k_off, int64_t* v_off) const {
    const int j = j0 + r;
    if (j >= kv_len) return false;
    if (loader.row_at(j, e, k_off, v_off)) return true;
    *bad = 1;
    return false;
  }
};

// One row of a tile resolved ahead of its copies (load_role_ring,
// kernels/core/roles.cuh: before the stage's wait), as copy_rows_async's row
// function for a thread that copies that row only.
struct ResolvedRow {
  int64_t k_off, v_off;
  bool ok;
  template <class RowFn>
  static __device__ __forceinline__ ResolvedRow of(const RowFn& row_fn, int r) {
    ResolvedRow rr{0, 0, false};
    rr.ok = row_fn(r, &rr.k_off, &rr.v_off);
    return rr;
  }
  // From row r's lookup e, issued earlier (KvTileRows::entry).
  template <class Rows>
  static __device__ __forceinline__ ResolvedRow at(const Rows& rows, int r, int32_t e) {
    ResolvedRow rr{0, 0, false};
    rr.ok = rows.at(r, e, &rr.k_off, &rr.v_off);
    return rr;
  }
  __device__ __forceinline__ bool operator()(int, int64_t* k_off, int64_t* v_off) const {
    *k_off = this->k_off;
    *v_off = this->v_off;
    return ok;
  }
};

// A load thread's row of each of a CTA's `visits` KV tiles, looked up a tile
// ahead: take(i) resolves tile i's row (rows_of(i): its KvTileRows) from the
// lookup issued before, then issues tile i + 1's, so that the caller's stage
// wait and copies of tile i overlap that round trip (load_role_ring, the
// 32-row GQA kernel's K / V loop).
template <class RowsOf>
struct RowsAhead {
  const RowsOf& rows_of;
  int row, visits;
  int32_t e;  // tile i's lookup
  __device__ __forceinline__ RowsAhead(const RowsOf& rows_of_, int row_, int visits_)
      : rows_of(rows_of_), row(row_), visits(visits_), e(visits_ > 0 ? rows_of_(0).entry(row_) : 0) {}
  __device__ __forceinline__ ResolvedRow take(int i) {
    const ResolvedRow r = ResolvedRow::at(rows_of(i), row, e);
    if (i + 1 < visits) e = rows_of(i + 1).entry(row);
    return r;
  }
};

// The copies of threads that each hold one resolved row of a GQA tile (the
// warp-role kernels' load threads, the one-tile kernel's threads up to head_dim
// 128; ResolvedRow: thread t resolved row t / (NTHREADS / ROWS), so a warp's
// lanes hold 32 / (NTHREADS / ROWS) consecutive rows), issued so that each
// instruction's lanes cover whole rows: kLpr consecutive lanes copy one row's
// consecutive 16-byte chunks (16 lanes: a 256-byte D128 row, 8: a 128-byte
// D64 one), the row's offset and verdict shuffled from a lane that resolved
// it. An instruction then asks L2 for whole 128-byte lines; copy_rows_async's
// two lanes per row (the warp-role kernels) ask for one 32-byte sector of
// each of 16 rows, and L2, which fills from DRAM in 64-byte pieces, sees
// twice the requests (half of them hits) for the same bytes
// (docs/design_portable.md, "Load warps: whole rows per instruction"). off:
// the K or the V offset of the thread's row. Four rows' shuffles at a time:
// the 32-row kernel's load warps (40 registers) spill on sm_120a with all of
// them hoisted.
template <int ROWS, int NTHREADS, int D, int STRIDE, typename DT>
__device__ __forceinline__ void copy_resolved_rows_lines(DT* s, const DT* g, int64_t off, bool ok, int tid) {
  constexpr int kTpr = NTHREADS / ROWS;  // threads that resolved each row
  constexpr int kWarpRows = 32 / kTpr;   // rows a warp's lanes resolved
  constexpr int kChunks = D / kChunkElems;
  constexpr int kLpr = kChunks < 32 ? kChunks : 32;  // lanes per row in one instruction
  constexpr int kRpi = 32 / kLpr;                     // rows per instruction
  static_assert(NTHREADS % ROWS == 0 && 32 % kTpr == 0 && 32 % kLpr == 0 && kChunks % kLpr == 0 &&
                    kWarpRows % kRpi == 0,
                "whole rows per warp and instruction");
  const int lane = tid & 31, wrow0 = (tid >> 5) * kWarpRows;
  const int sub = lane % kLpr, rsub = lane / kLpr;
  const int okw = ok ? 1 : 0;
#pragma unroll 4
  for (int k = 0; k < kWarpRows / kRpi; ++k) {
    const int rr = k * kRpi + rsub;  // the row in the warp's, resolved by lane rr * kTpr
    const int64_t o = __shfl_sync(0xffffffffu, off, rr * kTpr);
    const bool okr = __shfl_sync(0xffffffffu, okw, rr * kTpr) != 0;
    const DT* gs = okr ? g + o : g;  // not dereferenced when !okr
#pragma unroll
    for (int c = sub; c < kChunks; c += kLpr)
      cp_async_16(s + (wrow0 + rr) * STRIDE + c * kChunkElems, gs + c * kChunkElems, okr);
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LOADERS_TILE_COPY_CUH_
