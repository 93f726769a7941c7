// The request prologue every attention kernel runs first: which query rows and
// which KV tiles this CTA (request, KV head, row tile, split) owns, read from
// device index arrays that are never trusted. Errors go to the error word
// (kernels/core/errors.cuh); the caller exits (kSkip) or writes NaN rows
// (kNanRows: kv_len < q_len leaves no defined prefix).
#ifndef VERIFY_ATTN_CORE_REQUEST_CUH_
#define VERIFY_ATTN_CORE_REQUEST_CUH_

#include "kernels/core/errors.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/loaders/tile_copy.cuh"
#include "kernels/plan.h"

namespace verify_attn {

struct RequestTile {
  int req;         // the request
  int split;       // this CTA's split of the row tile's KV tiles (a workspace slot)
  int splits;      // the row tile's splits (p.num_splits, or fewer with balanced splits)
  int q_start;     // first token of the request in q / out
  int q_len;       // its draft tokens
  int R;           // folded rows (q_len * group)
  int row0;        // first folded row of this CTA
  int kv_len;      // KV rows (prefix + q_len)
  int prefix;      // kv_len - q_len
  int tile_begin;  // this split's visits [tile_begin, tile_end): KV tiles of N rows,
  int tile_end;    // visit v is KV tile kv_tile<kSkip>(*this, v)
  int first_draft_tile;  // visits below it are KV tiles v (identity)
  uint64_t draft_tiles;  // then the tiles first_draft_tile + k of its set bits k, in order
};

// The KV tile (of N rows) of visit v: v itself below first_draft_tile, then
// the set bits of draft_tiles; v itself in a kernel that does not skip
// (kSkip = its Shape::kSkipDraftTiles: no lookup compiled there).
template <bool kSkip>
__device__ __forceinline__ int kv_tile(const RequestTile& t, int v) {
  if (!kSkip || v < t.first_draft_tile) return v;
  return t.first_draft_tile + nth_set_bit64(t.draft_tiles, v - t.first_draft_tile);
}

enum RequestStatus { kRequestRun = 0, kRequestSkip = 1, kRequestNanRows = 2 };

constexpr int kMaxKvLen = 0x7fffffff;  // kv lengths are int32 (kernels/verify_attn.h)

// This CTA's grid coordinates (kernels/plan.h, grid_coord: the grid's order
// and why). kRowsGrid: the kernel's Shape::kRowsGrid (false: the request-major
// grid, which the plan then always launches). kClusterX: the kernel's
// Shape::kClusterX, CTAs per cluster along x: the grid's x is that many times
// grid_coord's, x = kClusterX * (request * Hkv + kv head) + rank, and every
// CTA of a cluster has the same coordinates (request-major grid only).
template <bool kRowsGrid, int kClusterX = 1>
__device__ __forceinline__ CtaCoord cta_coord(const KernelParams& p) {
  static_assert(kClusterX == 1 || !kRowsGrid, "clusters split the request-major grid's x");
  return grid_coord(kRowsGrid && p.grid_rows_fastest != 0, p.num_kv_heads, blockIdx.x / kClusterX,
                    blockIdx.y, blockIdx.z, gridDim.x / kClusterX, gridDim.y);
}

// M folded rows per CTA, N KV rows per tile; cc the CTA's request, KV head,
// row tile and split (cta_coord, or balanced_coord's), `splits` the row
// tile's split count; loader the request's. kSkipDraftTiles: the kernel's
// Shape::kSkipDraftTiles (below).
template <bool kSkipDraftTiles, class Loader>
__device__ __forceinline__ int request_tile(const KernelParams& p, const Loader& loader, const CtaCoord& cc,
                                            int splits, int M, int N, RequestTile* t) {
  const int req = cc.req, hk = cc.hk, split = cc.split;
  t->req = req;
  t->split = split;
  t->splits = splits;
  const int row_tile = cc.row_tile;  // the longest first in launch order (grid_coord)
  // Reports request-level errors once: row tile 0 exists whenever q_len > 0.
  const bool first_cta = hk == 0 && row_tile == 0 && split == 0 && threadIdx.x == 0;
  const int q_start = __ldg(p.qo_indptr + req);
  const int q_end = __ldg(p.qo_indptr + req + 1);
  if (q_start < 0 || q_end < q_start || q_end > p.total_q) {
    if (first_cta) report_error(p.error_word, kErrQoIndptr, req, q_end, -1);
    return kRequestSkip;
  }
  // qo_indptr[0] must be 0 (what the host checks when it reads qo_indptr):
  // rows before it belong to no CTA and would be left unwritten. Flagged; the
  // requests themselves run. Rows past qo_indptr[B] are allowed: they are a
  // plan's unused capacity (TreeAttentionPlan, CUDA-graph replay with fewer
  // rows): not computed; their output rows are unspecified (the split-K merge
  // rewrites every row of the workspace).
  if (first_cta && req == 0 && q_start != 0)
    report_error(p.error_word, kErrQoIndptr, 0, q_start, -1);
  t->q_start = q_start;
  t->q_len = q_end - q_start;
  t->R = t->q_len * p.group;
  if (first_cta && t->R > cc.row_tiles * M)  // q_len > max_q_len: rows unwritten
    report_error(p.error_word, kErrQoIndptr, req, t->q_len, -1);
  t->row0 = row_tile * M;
  if (t->row0 >= t->R) return kRequestSkip;
  t->kv_len = loader.kv_len();
  // A device kv_len this close to 2^31 would overflow the int tile arithmetic
  // ((tile + 1) * N, kv_len + N - 1) and come out as zero rows with lse -inf;
  // no cache holds that many rows for one request, so it is a bad KV extent:
  // flagged like an index outside the cache, rows NaN.
  if (t->kv_len > kMaxKvLen - 2 * N) {
    if (first_cta) report_error(p.error_word, kErrKvIndex, req, t->kv_len, -1);
    return kRequestNanRows;
  }
  t->prefix = t->kv_len - t->q_len;
  if (t->prefix < 0) {
    if (first_cta) report_error(p.error_word, kErrKvShort, req, t->kv_len, -1);
    return kRequestNanRows;
  }
  // CAUSAL: no row of the tile sees draft columns past its last token.
  int num_tiles =
      row_tile_kv_tiles(t->row0, M, t->R, p.group, t->kv_len, t->prefix, p.causal != 0, N);
  // Visits are KV tiles 0, 1, ... (kv_tile): every tile of the range unless
  // the kernel skips invisible draft tiles (below).
  t->first_draft_tile = num_tiles;
  t->draft_tiles = 0ull;
  // TREE with more than two tiles of drafts: no row of the tile sees draft
  // columns past its rows' last visible one (what a chain gets from CAUSAL;
  // trees in topological order: the tile's last token). Below that the scan
  // (about one load latency in the prologue) costs more than it can save.
  if (!p.causal && p.tree_mask != nullptr && t->q_len > 2 * N) {
    const int first_draft = (t->prefix + N - 1) / N;  // tiles [0, first_draft) hold prefix rows
    const int off = first_draft * N - t->prefix;
    const TreeDraftScan scan = tree_scan_drafts<kSkipDraftTiles>(
        p.tree_mask, p.mask_words, p.group, t->q_start, t->q_len, t->row0, M, t->R, off, N);
    int kv_end = t->prefix + scan.last + 1;
    if (kv_end < 1) kv_end = 1;  // at least one (masked) tile, as untrimmed: never empty
    if (kv_end > t->kv_len) kv_end = t->kv_len;
    const int trimmed = (kv_end + N - 1) / N;
    if (trimmed < num_tiles) num_tiles = trimmed;
    // kSkipDraftTiles: the draft-only tiles none of the rows sees are not
    // visited either (a tree's row tile sees its tokens' ancestors, not every
    // draft before them: DDTree-like 1024 drafts, about 3% of the KV tiles).
    // Up to 64 draft-only tiles (draft_word_tiles; max_q_len <= 1024 needs 16
    // besides the tile shared with the prefix, a device q_len past it may need
    // more: then every tile); at least one visit. Page ids of a skipped tile
    // are not read, so not checked (as for the tiles past the trimmed range).
    if (kSkipDraftTiles && t->q_len - off <= 64 * N) {
      const uint64_t tiles = scan.tiles & low_bits64(num_tiles - first_draft);
      const int visits = first_draft + __popcll(static_cast<unsigned long long>(tiles));
      if (visits > 0) {
        t->first_draft_tile = first_draft;
        t->draft_tiles = tiles;
        num_tiles = visits;
      }
    }
  }
  split_tile_range(split, splits, num_tiles, &t->tile_begin, &t->tile_end);
  return kRequestRun;
}

// The token and query head of a request's folded row gr (rows are token-major,
// the G query heads of KV head hk fastest): token q_start + gr / G, head
// hk * G + gr % G. Every kernel's Q loads and output / lse / workspace writes.
struct FoldedRow {
  int64_t token;
  int head;
};
__device__ __forceinline__ FoldedRow folded_row(int q_start, int hk, int G, int gr) {
  return {q_start + gr / G, hk * G + gr % G};
}

// A request whose kv_len < q_len has no defined prefix, or a CTA that met a bad
// KV index: its rows become NaN (and lse NaN, so a split-K merge turns the
// whole row NaN). Threads tid = 0 .. nthreads - 1 share the work (by default
// every thread of the CTA).
template <class Shape, typename DT>
__device__ void write_nan_rows(const KernelParams& p, int q_start, int R, int row0, int hk,
                               int split, int tid = threadIdx.x, int nthreads = Shape::kThreads) {
  constexpr int M = Shape::kM, DV = Shape::kDv;
  const int G = p.group;
  // A pair of splits (kernels/core/pair_combine.cuh) writes the output
  // itself: split 0 writes the rows.
  if (p.pair_splits && split != 0) return;
  for (int idx = tid; idx < M * DV; idx += nthreads) {
    const int r = idx / DV, c = idx % DV;
    const int gr = row0 + r;
    if (gr >= R) continue;
    const FoldedRow fr = folded_row(q_start, hk, G, gr);
    const int64_t token = fr.token;
    const int h = fr.head;
    if (p.num_splits > 1 && !p.pair_splits) {
      // The partial row too, though the merge turns the row NaN by its lse
      // alone: merge_row loads the first splits' partial rows before their
      // lse (kernels/core/merge.cuh), and workspace it reads stays defined.
      const int64_t wrow = workspace_row(split, p.ws_rows, token, p.num_qo_heads, h);
      p.ws_o[wrow * DV + c] = NAN;
      if (c == 0) p.ws_lse[wrow] = NAN;
    } else {
      DT* o = static_cast<DT*>(p.out) + token * p.out_stride_token + h * p.out_stride_head;
      o[c] = DTypeTraits<DT>::from_float(NAN);
      if (c == 0 && p.lse != nullptr)
        p.lse[token * p.lse_stride_token + h * p.lse_stride_head] = NAN;
    }
  }
}

// The mask of the request's folded row gr (any int; rows past R are not valid):
// its token's draft index and, for a tree, its mask words.
__device__ __forceinline__ RowMask row_mask(const KernelParams& p, const RequestTile& rt, int gr) {
  RowMask m;
  m.valid = gr < rt.R;
  m.t = m.valid ? gr / p.group : 0;
  m.words = (!p.causal && m.valid) ? p.tree_mask + static_cast<int64_t>(rt.q_start + m.t) * p.mask_words : nullptr;
  return m;
}

// Element offset in q of the request's folded row gr (< R): token
// q_start + gr / group, query head hk * group + gr % group.
__device__ __forceinline__ int64_t q_row_offset(const KernelParams& p, const RequestTile& rt, int hk,
                                                int gr) {
  const FoldedRow fr = folded_row(rt.q_start, hk, p.group, gr);
  return fr.token * p.q_stride_token + static_cast<int64_t>(fr.head) * p.q_stride_head;
}

// The portable kernels' Q tile: M folded rows from row0 into padded shared
// rows of QS elements (kernels/loaders/tile_copy.cuh); rows past the request
// are zero. Issues the copies, does not commit them.
template <int M, int NTHREADS, int DQK, int QS, typename DT>
__device__ __forceinline__ void copy_q_tile_async(DT* sQ, const KernelParams& p, const RequestTile& rt,
                                                  int hk, int tid) {
  const DT* gq = static_cast<const DT*>(p.q);
  copy_rows_async<M, NTHREADS, DQK, QS, 0, 0, false>(
      sQ, sQ, gq, gq,
      [&](int r, int64_t* off, int64_t*) {
        const int gr = rt.row0 + r;
        if (gr >= rt.R) return false;
        *off = q_row_offset(p, rt, hk, gr);
        return true;
      },
      tid);
}

// request_tile and the two early exits every kernel takes: false when this
// CTA has nothing to compute (skipped, or its rows already written as NaN).
// cc and splits as request_tile takes them.
template <class Shape, typename DT, class Loader>
__device__ __forceinline__ bool start_request(const KernelParams& p, const Loader& loader, const CtaCoord& cc,
                                              int splits, RequestTile* rt) {
  const int st = request_tile<Shape::kSkipDraftTiles>(p, loader, cc, splits, Shape::kM, Shape::kN, rt);
  if (st == kRequestNanRows)
    write_nan_rows<Shape, DT>(p, rt->q_start, rt->R, rt->row0, cc.hk, rt->split);
  return st == kRequestRun;
}

// The same for the CTA of grid block blockIdx (cta_coord), split
// p.num_splits ways.
template <class Shape, typename DT, class Loader>
__device__ __forceinline__ bool start_request(const KernelParams& p, const Loader& loader, RequestTile* rt) {
  return start_request<Shape, DT, Loader>(p, loader, cta_coord<Shape::kRowsGrid, Shape::kClusterX>(p),
                                          p.num_splits, rt);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_REQUEST_CUH_
