// EXPERIMENTAL MLA kernel (TileShapeR32, kernels/plan.h): 32 query rows per
// warp and a d-split Q K^T. Same semantics, loaders, mask, online softmax,
// split-K and merge as attention_kernel.cuh; only the warp tiling differs.
// Selected only through VERIFY_ATTN_FORCE_CONFIG=mla_r32_*; not yet run on a GPU.
//
// Warp (wm, wd) of WARPS_M x WARPS_D, per KV tile of N = 8 * WARPS_D rows:
//   partial S = Q[32 wm .., d-slice wd] K[:, d-slice wd]^T   (2 x N/8 m16n8 tiles;
//               every K fragment serves both m16 tiles, every Q fragment N/8 tiles)
//   -> shared memory (fp32), barrier, then warp (wm, wd) sums the WARPS_D
//      partials of its 32 rows x score columns [8 wd, 8 wd + 8), scales, masks,
//      and runs the online softmax (row max / sum across the WARPS_D warps
//      through shared memory, as attention_kernel.cuh does across WARPS_N);
//   O[32 wm.., value cols of wd] += P V   (every V fragment serves both m16 tiles).
#ifndef VERIFY_ATTN_ATTENTION_KERNEL_R32_CUH_
#define VERIFY_ATTN_ATTENTION_KERNEL_R32_CUH_

#include "kernels/attention_kernel.cuh"

namespace verify_attn {

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, 1) attention_kernel_r32(const KernelParams p) {
  constexpr int M = Shape::kM, N = Shape::kN;
  constexpr int WD = Shape::kWarpsN;
  constexpr int DQK = Shape::kDqk, DV = Shape::kDv;
  constexpr int QS = Shape::kQStride, KS = Shape::kKStride, PS = Shape::kPStride;
  constexpr int SS = Shape::kSStride;
  constexpr int DS = DQK / WD;   // reduction columns per warp (576 / 4 = 144)
  constexpr int NT = N / 8;      // n8 score tiles of a partial (4)
  constexpr int DVW = DV / WD;   // value columns per warp (128)
  constexpr int NT_O = DVW / 8;  // n8 output tiles per m16 tile (16)
  constexpr int kThreads = Shape::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  DT* sQ = reinterpret_cast<DT*>(smem);
  DT* sK = reinterpret_cast<DT*>(smem + Shape::kQBytes);
  DT* sP = reinterpret_cast<DT*>(smem + Shape::kQBytes + Shape::kKBytes);
  float* sS = reinterpret_cast<float*>(smem + Shape::kQBytes + Shape::kKBytes + Shape::kPBytes);
  float* red_max = sS + WD * M * SS;  // [WD][M]
  float* red_sum = red_max + WD * M;  // [WD][M]

  __shared__ int s_bad_kv;  // a KV row of this CTA had a bad index (see attention_kernel)
  if (threadIdx.x == 0) s_bad_kv = 0;
  __syncthreads();

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int wm = warp / WD, wd = warp % WD;
  const int g = lane >> 2, t4 = lane & 3;

  const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
  const int hk = cc.hk;
  const int split = blockIdx.z;  // cc.split, in every grid order

  // ---- request bounds and this split's KV tiles (kernels/core/request.cuh) ----
  const Loader loader(p, cc.req, hk);
  RequestTile rt;
  if (!start_request<Shape, DT>(p, loader, hk, &rt)) return;
  const int q_start = rt.q_start, R = rt.R, row0 = rt.row0;
  const int kv_len = rt.kv_len, prefix = rt.prefix;
  const int tile_begin = rt.tile_begin, tile_end = rt.tile_end;
  const int G = p.group;

  const DT* gk = static_cast<const DT*>(p.k);

  copy_q_tile_async<M, kThreads, DQK, QS>(sQ, p, rt, hk, tid);
  cp_async_commit();

  auto load_k = [&](int tile, int buf) {
    const int j0 = tile * N;
    copy_rows_async<N, kThreads, DQK, KS, 0, 0, false>(
        sK + buf * N * KS, sK, gk, gk,
        [&](int r, int64_t* k_off, int64_t* v_off) {
          const int j = j0 + r;
          if (j >= kv_len) return false;
          if (loader.row(j, k_off, v_off)) return true;
          s_bad_kv = 1;
          return false;
        },
        tid);
  };
  if constexpr (Shape::kStages == 2) {
    if (tile_begin < tile_end) load_k(tile_begin, 0);
    cp_async_commit();
  }

  // Fragment rows of this thread: (m16 tile mt, half i) -> row 32 wm + 16 mt + g + 8 i.
  const RequestMask rmask{kv_len, prefix, p.mask_words, p.causal != 0};
  RowMask rows[2][2];
  OnlineSoftmaxRow sm[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int gr = row0 + wm * 32 + mt * 16 + g + 8 * i;
      rows[mt][i].valid = gr < R;
      rows[mt][i].t = rows[mt][i].valid ? gr / G : 0;
      rows[mt][i].words = (!p.causal && rows[mt][i].valid)
                              ? p.tree_mask + static_cast<int64_t>(q_start + rows[mt][i].t) * p.mask_words
                              : nullptr;
      sm[mt][i].init();
    }
  float o[2][NT_O][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NT_O; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;

  // ldmatrix lane addresses (fragment layouts: core/mma.cuh).
  const DT* q_frag = sQ + (wm * 32 + (lane & 15)) * QS + wd * DS + (lane >> 4) * 8;
  // B from K rows (n) x d (k), n16 x k16 per ldmatrix.x4: matrices (n0-7,k0-7),
  // (n0-7,k8-15), (n8-15,k0-7), (n8-15,k8-15) -> b[0],b[1] n-tile 0; b[2],b[3] n-tile 1.
  const int k_frag_off = ((lane & 7) + ((lane >> 4) << 3)) * KS + wd * DS + ((lane >> 3) & 1) * 8;
  const DT* p_frag = sP + (wm * 32 + (lane & 15)) * PS + (lane >> 4) * 8;
  const int v_frag_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * KS + wd * DVW + (lane >> 4) * 8;

  for (int it = tile_begin; it < tile_end; ++it) {
    const int buf = Shape::kStages == 1 ? 0 : ((it - tile_begin) & 1);
    if constexpr (Shape::kStages == 1) {
      __syncthreads();  // previous tile's K (= V) and P fully consumed
      load_k(it, 0);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();  // [A] tile `it` visible; previous tile (K, P, partial S) consumed
    if constexpr (Shape::kStages == 2) {
      if (it + 1 < tile_end) load_k(it + 1, buf ^ 1);
      cp_async_commit();
    }

    // ---- partial S over this warp's d-slice: 2 m16 tiles x NT n8 tiles ----
    float sp[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) sp[mt][j][0] = sp[mt][j][1] = sp[mt][j][2] = sp[mt][j][3] = 0.f;
    const DT* k_frag = sK + buf * N * KS + k_frag_off;
#pragma unroll
    for (int kk = 0; kk < DS / 16; ++kk) {
      uint32_t a[2][4];
      ldmatrix_x4(a[0], q_frag + kk * 16);
      ldmatrix_x4(a[1], q_frag + 16 * QS + kk * 16);
#pragma unroll
      for (int jn = 0; jn < NT / 2; ++jn) {
        uint32_t b[4];
        ldmatrix_x4(b, k_frag + jn * 16 * KS + kk * 16);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_m16n8k16<DT>(sp[mt][2 * jn], a[mt], b[0], b[1]);
          mma_m16n8k16<DT>(sp[mt][2 * jn + 1], a[mt], b[2], b[3]);
        }
      }
    }
    // partials -> shared memory [wd][row][col]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float* dst = sS + (wd * M + wm * 32 + mt * 16 + g + 8 * i) * SS + j * 8 + 2 * t4;
          *reinterpret_cast<float2*>(dst) = make_float2(sp[mt][j][2 * i], sp[mt][j][2 * i + 1]);
        }
    __syncthreads();  // [B] all partials written

    // ---- sum the WD partials of (my 32 rows) x (score cols 8 wd ..), scale, mask ----
    const int j0 = it * N;
    const bool need_mask = rmask.tile_needs_mask(j0, N);
    float s[2][4];
    float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm * 32 + mt * 16 + g + 8 * i;
        float2 acc = make_float2(0.f, 0.f);
#pragma unroll
        for (int w = 0; w < WD; ++w) {
          const float2 v = *reinterpret_cast<const float2*>(sS + (w * M + r) * SS + wd * 8 + 2 * t4);
          acc.x += v.x;
          acc.y += v.y;
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = (e == 0 ? acc.x : acc.y) * p.scale_log2;
          if (need_mask && !rmask.visible(rows[mt][i], j0 + wd * 8 + 2 * t4 + e)) x = -INFINITY;
          s[mt][2 * i + e] = x;
          mx[mt][i] = fmaxf(mx[mt][i], x);
        }
      }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[mt][i] = quad_max(mx[mt][i]);
        if (t4 == 0) red_max[wd * M + wm * 32 + mt * 16 + g + 8 * i] = mx[mt][i];
      }
    __syncthreads();  // [C] row maxima of every d-warp
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm * 32 + mt * 16 + g + 8 * i;
        float m = red_max[r];
#pragma unroll
        for (int w = 1; w < WD; ++w) m = fmaxf(m, red_max[w * M + r]);
        float base;
        const float alpha = sm[mt][i].update(m, &base);
        const float p0 = fast_exp2(s[mt][2 * i] - base);
        const float p1 = fast_exp2(s[mt][2 * i + 1] - base);
        sm[mt][i].l += p0 + p1;
        *reinterpret_cast<uint32_t*>(sP + r * PS + wd * 8 + 2 * t4) = DTypeTraits<DT>::pack(p0, p1);
#pragma unroll
        for (int j = 0; j < NT_O; ++j) {
          o[mt][j][2 * i] *= alpha;
          o[mt][j][2 * i + 1] *= alpha;
        }
      }
    __syncthreads();  // [D] full P rows (written by the WD warps of each row block)

    // ---- O += P V, V = the first DV columns of the K tile ----
    const DT* v_frag = sK + buf * N * KS + v_frag_off;
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) {
      uint32_t a[2][4];
      ldmatrix_x4(a[0], p_frag + ks * 16);
      ldmatrix_x4(a[1], p_frag + 16 * PS + ks * 16);
#pragma unroll
      for (int jj = 0; jj < NT_O / 2; ++jj) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_frag + ks * 16 * KS + jj * 16);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_m16n8k16<DT>(o[mt][2 * jj], a[mt], b[0], b[1]);
          mma_m16n8k16<DT>(o[mt][2 * jj + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, q_start, R, row0, hk, split);
    return;
  }

  // ---- finalize: full row sums across the WD warps, normalize, store ----
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float l = quad_sum(sm[mt][i].l);
      if (t4 == 0) red_sum[wd * M + wm * 32 + mt * 16 + g + 8 * i] = l;
    }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = wm * 32 + mt * 16 + g + 8 * i;
      const int gr = row0 + r;
      if (gr >= R) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < WD; ++w) l += red_sum[w * M + r];
      const FoldedRow fr = folded_row(q_start, hk, G, gr);
      const int64_t token = fr.token;
      const int h = fr.head;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float lse = OnlineSoftmaxRow::lse(sm[mt][i].m, l);
      if (p.num_splits == 1) {
        DT* orow = static_cast<DT*>(p.out) + token * p.out_stride_token + h * p.out_stride_head +
                   wd * DVW + 2 * t4;
#pragma unroll
        for (int j = 0; j < NT_O; ++j)
          *reinterpret_cast<uint32_t*>(orow + j * 8) =
              DTypeTraits<DT>::pack(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
        if (p.lse != nullptr && wd == 0 && t4 == 0)
          p.lse[token * p.lse_stride_token + h * p.lse_stride_head] = lse;
      } else {
        const int64_t wrow = workspace_row(split, p.ws_rows, token, p.num_qo_heads, h);
        float* orow = p.ws_o + wrow * DV + wd * DVW + 2 * t4;
#pragma unroll
        for (int j = 0; j < NT_O; ++j)
          *reinterpret_cast<float2*>(orow + j * 8) =
              make_float2(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
        if (wd == 0 && t4 == 0) p.ws_lse[wrow] = lse;
      }
    }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_ATTENTION_KERNEL_R32_CUH_
