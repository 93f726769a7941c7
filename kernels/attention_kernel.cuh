// The verify-attention kernel, one template for both KV layouts (the Loader
// decides how KV row j of a request is addressed), and the split-K merge
// kernel.
//
// Grid: (request, KV head, row tile, KV split), in kernels/plan.h's grid_coord order.
// A CTA owns M folded query rows of one (request, kv head): row r of the
// request's R = q_len * group rows is token r / group, query head
// hk * group + r % group (MLA: Hkv = 1, group = Hq, all heads). Every KV tile
// is loaded once into shared memory and used by all M rows.
//
// Per KV tile (warp (wm, wn) of WARPS_M x WARPS_N, see plan.h TileShape):
//   S   = Q[16 wm.., :] K[tile cols of wn, :]^T   (mma.sync, fp32)
//   mask only if the tile reaches past the prefix (core/mask.cuh)
//   row max over the whole tile via shared memory when WARPS_N > 1
//   P   = exp2(S - m) -> shared memory (DT), online softmax (core/softmax.cuh)
//   O  += P[16 wm.., :] V[:, value cols of wn]
// An fp8 (e4m3) cache (KvFp8 shapes: head_dim 256) is read by every thread
// into registers, its part of the next tile's rows, and converted into the
// free stage after this tile's P V (kernels/loaders/fp8_rows.cuh); the
// consumers read the same q-dtype stages.
// Split s takes the contiguous KV tiles [s T / S, (s+1) T / S) of the row
// tile's T tiles; with S > 1 the normalized partial O and its natural-log lse
// go to the workspace and merge_kernel combines them (core/merge.cuh).
#ifndef VERIFY_ATTN_ATTENTION_KERNEL_CUH_
#define VERIFY_ATTN_ATTENTION_KERNEL_CUH_

#include <math.h>
#include <stdint.h>

#include "kernels/core/epilogue.cuh"
#include "kernels/core/errors.cuh"
#include "kernels/core/mask.cuh"
#include "kernels/core/merge.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/pdl.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/scores.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/loaders/fp8_rows.cuh"
#include "kernels/loaders/tile_copy.cuh"
#include "kernels/plan.h"

namespace verify_attn {

// sm_120 fits one such CTA per SM by shared memory (about 100 KB per SM), so
// there the register cap of kMinBlocks would only cost spills.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define VA_MIN_BLOCKS(S) 1
#else
#define VA_MIN_BLOCKS(S) (S::kMinBlocks)
#endif

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, VA_MIN_BLOCKS(Shape))
    attention_kernel(const KernelParams p) {
  constexpr int M = Shape::kM, N = Shape::kN;
  constexpr int WN = Shape::kWarpsN;
  constexpr int DQK = Shape::kDqk, DV = Shape::kDv;
  constexpr int QS = Shape::kQStride, KS = Shape::kKStride, VS = Shape::kVStride;
  constexpr int PS = Shape::kPStride;
  constexpr int NW = N / WN;     // score columns per warp
  constexpr int NT_S = NW / 8;   // n8 score tiles per warp
  constexpr int DVW = DV / WN;   // value columns per warp
  constexpr int NT_O = DVW / 8;  // n8 output tiles per warp
  constexpr int kThreads = Shape::kThreads;
  static_assert(NT_O % 2 == 0 && DQK % 32 == 0 && N % 16 == 0, "tile shape");

  extern __shared__ __align__(16) unsigned char smem[];
  DT* sQ = reinterpret_cast<DT*>(smem);
  DT* sK = reinterpret_cast<DT*>(smem + Shape::kQBytes);
  DT* sV = Shape::kVIsK ? sK : reinterpret_cast<DT*>(smem + Shape::kQBytes + Shape::kKBytes);
  DT* sP = reinterpret_cast<DT*>(smem + Shape::kQBytes + Shape::kKBytes + Shape::kVBytes);
  float* red_max = reinterpret_cast<float*>(smem + Shape::kQBytes + Shape::kKBytes +
                                            Shape::kVBytes + Shape::kPBytes);  // [WN][M]
  float* red_sum = red_max + WN * M;                                           // [WN][M]

  // Set when a KV row of this CTA's range had a bad index (it was zero-filled,
  // not read): the CTA's rows are then written as NaN (and lse NaN, so a
  // split-K merge turns the whole row NaN), never a silently wrong value.
  __shared__ int s_bad_kv;
  if (threadIdx.x == 0) s_bad_kv = 0;
  __syncthreads();  // before any load can set it

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, t4 = lane & 3;

  const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);  // (kernels/plan.h, grid_coord)
  const int hk = cc.hk;
  const int split = blockIdx.z;  // cc.split, in every grid order

  // ---- request bounds and this split's KV tiles (kernels/core/request.cuh) ----
  const Loader loader(p, cc.req, hk);
  RequestTile rt;
  if (!start_request<Shape, DT>(p, loader, &rt)) return;
  const int q_start = rt.q_start, R = rt.R, row0 = rt.row0;
  const int kv_len = rt.kv_len, prefix = rt.prefix;
  const int tile_begin = rt.tile_begin, tile_end = rt.tile_end;
  const int G = p.group;

  const DT* gk = static_cast<const DT*>(p.k);
  const DT* gv = static_cast<const DT*>(p.v);

  // ---- Q tile (rows past the request are zero) ----
  copy_q_tile_async<M, kThreads, DQK, QS>(sQ, p, rt, hk, tid);
  cp_async_commit();

  auto load_kv = [&](int tile, int buf) {
    const int j0 = tile * N;
    const KvTileRows<Loader> rows{loader, j0, kv_len, &s_bad_kv};
    if constexpr (!Shape::kVIsK && DQK <= 128 && kThreads % N == 0) {
      // GQA up to head_dim 128: each thread resolves one row, each
      // instruction copies whole rows (copy_resolved_rows_lines: whole
      // 128-byte lines per L2 request). At head_dim 256 copy_rows_async's
      // 8 threads per row already cover a 128-byte line per row and
      // instruction (whole-row copies measured level there).
      const ResolvedRow r = ResolvedRow::of(rows, tid / (kThreads / N));
      copy_resolved_rows_lines<N, kThreads, DQK, KS>(sK + buf * N * KS, gk, r.k_off, r.ok, tid);
      copy_resolved_rows_lines<N, kThreads, DV, VS>(sV + buf * N * VS, gv, r.v_off, r.ok, tid);
    } else {
      copy_rows_async<N, kThreads, DQK, KS, DV, VS, !Shape::kVIsK>(sK + buf * N * KS, sV + buf * N * VS, gk, gv,
                                                                   rows, tid);
    }
  };
  // fp8: thread tid holds chunks of row tid / kFpTpr of a tile's K and V.
  constexpr bool kFp8 = IsKvFp8<Shape>::value;
  constexpr int kFpTpr = kThreads / N;  // threads per row
  static_assert(!kFp8 || (!Shape::kVIsK && kThreads % N == 0 && DQK == DV && (DQK / 16) % kFpTpr == 0),
                "fp8 tile rows");
  const int fp_row = tid / kFpTpr, fp_sub = tid % kFpTpr;
  using Fp8Tile = Fp8KvRow<DQK, kFpTpr>;
  auto fetch_kv = [&](int tile) {
    Fp8Tile f;
    f.load(KvTileRows<Loader>{loader, tile * N, kv_len, &s_bad_kv}, fp_row, p.k, p.v, fp_sub);
    return f;
  };
  auto put_kv = [&](const Fp8Tile& f, int buf) {
    f.store(sK + buf * N * KS + fp_row * KS, sV + buf * N * VS + fp_row * VS, fp_sub);
  };
  if constexpr (Shape::kStages == 2) {
    if (tile_begin < tile_end) {
      if constexpr (kFp8) {
        put_kv(fetch_kv(tile_begin), 0);
      } else {
        load_kv(tile_begin, 0);
      }
    }
    cp_async_commit();
  }

  // ---- per-thread rows: g and g + 8 of the warp's 16-row slice ----
  const RequestMask rmask{kv_len, prefix, p.mask_words, p.causal != 0};
  const RowMask rows[2] = {row_mask(p, rt, row0 + wm * 16 + g), row_mask(p, rt, row0 + wm * 16 + g + 8)};

  OnlineSoftmaxRow sm[2];
  sm[0].init();
  sm[1].init();
  float o[NT_O][4];
#pragma unroll
  for (int j = 0; j < NT_O; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  // ldmatrix lane addresses (see core/mma.cuh for the fragment layouts)
  const DT* q_frag = sQ + (wm * 16 + (lane & 15)) * QS + (lane >> 4) * 8;
  const DT* p_frag = sP + (wm * 16 + (lane & 15)) * PS + (lane >> 4) * 8;
  const int k_frag_off = (wn * NW + (lane & 7)) * KS + (lane >> 3) * 8;
  const int v_frag_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * VS + wn * DVW + (lane >> 4) * 8;
  DT* p_store = sP + (wm * 16 + g) * PS + wn * NW + 2 * t4;

  for (int it = tile_begin; it < tile_end; ++it) {
    const int buf = Shape::kStages == 1 ? 0 : ((it - tile_begin) & 1);
    if constexpr (Shape::kStages == 1) {
      __syncthreads();  // every warp is done with the previous tile's K/V and P
      if constexpr (kFp8) {
        put_kv(fetch_kv(it), 0);
      } else {
        load_kv(it, 0);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();  // [A] tile `it` (and Q) visible; tile it-1 fully consumed
    // fp8, two stages: the next tile's rows read now, stored after this
    // tile's P V (below), so that the reads fly under this tile's work.
    [[maybe_unused]] Fp8Tile next;
    if constexpr (Shape::kStages == 2) {
      if constexpr (kFp8) {
        if (it + 1 < tile_end) next = fetch_kv(it + 1);
      } else {
        if (it + 1 < tile_end) load_kv(it + 1, buf ^ 1);
      }
      cp_async_commit();
    }

    // ---- S = Q K^T, two k16 steps per iteration ----
    float s[NT_S][4];
#pragma unroll
    for (int j = 0; j < NT_S; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const DT* k_frag = sK + buf * N * KS + k_frag_off;
#pragma unroll
    for (int kk = 0; kk < DQK / 32; ++kk) {
      uint32_t a0[4], a1[4];
      ldmatrix_x4(a0, q_frag + kk * 32);
      ldmatrix_x4(a1, q_frag + kk * 32 + 16);
#pragma unroll
      for (int j = 0; j < NT_S; ++j) {
        uint32_t b[4];
        ldmatrix_x4(b, k_frag + j * 8 * KS + kk * 32);
        mma_m16n8k16<DT>(s[j], a0, b[0], b[1]);
        mma_m16n8k16<DT>(s[j], a1, b[2], b[3]);
      }
    }

    // ---- mask (draft / boundary tiles only), scaled row max ----
    const int j0 = it * N;
    float mx[2];
    scale_mask_row_max<NT_S>(s, rmask, rows, j0, N, wn * NW, t4, p.scale_log2, mx);
    if constexpr (WN > 1) {
      if (t4 == 0) {
        red_max[wn * M + wm * 16 + g] = mx[0];
        red_max[wn * M + wm * 16 + g + 8] = mx[1];
      }
      __syncthreads();  // [B]
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float m = red_max[wm * 16 + g + 8 * i];
#pragma unroll
        for (int w = 1; w < WN; ++w) m = fmaxf(m, red_max[w * M + wm * 16 + g + 8 * i]);
        mx[i] = m;
      }
    }

    // ---- online softmax, P -> shared memory ----
    float alpha[2];
    softmax_tile<NT_S>(s, sm, mx, p.scale_log2, alpha);
#pragma unroll
    for (int j = 0; j < NT_S; ++j) {
      *reinterpret_cast<uint32_t*>(p_store + j * 8) = DTypeTraits<DT>::pack(s[j][0], s[j][1]);
      *reinterpret_cast<uint32_t*>(p_store + 8 * PS + j * 8) = DTypeTraits<DT>::pack(s[j][2], s[j][3]);
    }
    rescale_rows<NT_O>(o, alpha);
    if constexpr (WN > 1) {
      __syncthreads();  // [C] full P rows written by the WN warps of each row slice
    } else {
      __syncwarp();  // a warp reads only the P rows it wrote
    }

    // ---- O += P V ----
    const DT* v_frag = sV + buf * N * VS + v_frag_off;
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, p_frag + ks * 16);
#pragma unroll
      for (int jj = 0; jj < NT_O / 2; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_frag + ks * 16 * VS + jj * 16);
        mma_m16n8k16<DT>(o[2 * jj], a, b[0], b[1]);
        mma_m16n8k16<DT>(o[2 * jj + 1], a, b[2], b[3]);
      }
    }
    if constexpr (kFp8 && Shape::kStages == 2) {
      if (it + 1 < tile_end) put_kv(next, buf ^ 1);  // made visible by the next [A]
    }
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA exits
  __syncthreads();     // s_bad_kv of every load is visible
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, q_start, R, row0, hk, split);
    return;
  }

  // ---- finalize: full row sums, normalize, store ----
  float l[2] = {quad_sum(sm[0].l), quad_sum(sm[1].l)};
  if constexpr (WN > 1) {
    if (t4 == 0) {
      red_sum[wn * M + wm * 16 + g] = l[0];
      red_sum[wn * M + wm * 16 + g + 8] = l[1];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int w = 0; w < WN; ++w) acc += red_sum[w * M + wm * 16 + g + 8 * i];
      l[i] = acc;
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int gr = row0 + wm * 16 + g + 8 * i;
    if (gr >= R) continue;
    const float inv = l[i] > 0.f ? p.v_scale / l[i] : 0.f;  // v_scale: 1 but for an fp8 cache
    store_out_row<NT_O, DV, DT>(p, split, folded_row(q_start, hk, G, gr), wn * DVW + 2 * t4, o, i, inv,
                                OnlineSoftmaxRow::lse(sm[i].m, l[i]), wn == 0 && t4 == 0);
  }
}

// One warp per output row (token * Hq + head); 4 rows per 128-thread block.
// Launched as a programmatic dependent on sm_90+ (kernels/merge.cu): nothing
// global is touched before grid_dependency_wait().
template <typename DT, int DV>
__global__ void __launch_bounds__(128) merge_kernel(const KernelParams p) {
  grid_dependency_wait();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= p.ws_rows) return;
  const int64_t token = row / p.num_qo_heads;
  const int h = static_cast<int>(row % p.num_qo_heads);
  DT* out = static_cast<DT*>(p.out) + token * p.out_stride_token + h * p.out_stride_head;
  float* lse = p.lse != nullptr ? p.lse + token * p.lse_stride_token + h * p.lse_stride_head
                                : nullptr;
  // Balanced splits: most rows have the plan's split count (split_units / B).
  const int first = p.split_units > 0 ? p.split_units / p.batch_size : p.num_splits;
  merge_row<DT, DV>(p.ws_o, p.ws_lse, row, p.ws_rows, p.num_splits, first, out, lse, threadIdx.x & 31);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_ATTENTION_KERNEL_CUH_
