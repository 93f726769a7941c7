// A warp's score fragments between Q K^T and the online softmax: masked where
// the KV tile reaches the drafts or the end of the request
// (kernels/core/mask.cuh; other tiles skip the tests), and each fragment
// row's max over the warp's columns, reduced over the quad of lanes that share
// the row and scaled to base-2 logits. The scores themselves stay unscaled:
// exp2_rows takes each to P = exp2(s * scale_log2 - base) in one FFMA, as
// FlashAttention-2 does (its scale_apply_exp2), instead of a multiply here and
// a subtraction there. Fragment layout of kernels/core/mma.cuh: s[j][e] is row
// g (e < 2) or g + 8 (e >= 2), column col0 + 8 j + 2 t4 + (e & 1) of the tile.
#ifndef VERIFY_ATTN_CORE_SCORES_CUH_
#define VERIFY_ATTN_CORE_SCORES_CUH_

#include <math.h>
#include <stdint.h>

#include "kernels/core/mask.cuh"
#include "kernels/core/softmax.cuh"

namespace verify_attn {

// A tile no mask reaches: the thread's maxima of its two fragment rows
// (unscaled, before the quad's reduction).
template <int NT>
__device__ __forceinline__ void thread_row_max(const float (&s)[NT][4], float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
}

// The rows' maxima over the quad, in base-2 logits: scale_log2 > 0 keeps the
// order, so the scaled max is the max of the scaled scores (-inf stays -inf).
__device__ __forceinline__ void quad_scaled_max(float (&mx)[2], float scale_log2) {
  mx[0] = quad_max(mx[0]) * scale_log2;
  mx[1] = quad_max(mx[1]) * scale_log2;
}

// j0: the tile's first KV row, tile_n its rows (what tile_needs_mask judges);
// col0: the warp's first column in the tile; rows: the thread's two fragment rows.
template <int NT>
__device__ __forceinline__ void scale_mask_row_max(float (&s)[NT][4], const RequestMask& rmask,
                                                   const RowMask (&rows)[2], int j0, int tile_n, int col0,
                                                   int t4, float scale_log2, float (&mx)[2]) {
  if (rmask.tile_needs_mask(j0, tile_n)) {
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j0 + col0 + j * 8 + 2 * t4 + (e & 1);
        if (!rmask.visible(rows[e >> 1], col)) s[j][e] = -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
      }
  } else {
    thread_row_max<NT>(s, mx);
  }
  quad_scaled_max(mx, scale_log2);
}

// scale_mask_row_max for 64-column tiles (NT = 8) with the masked tiles'
// visibility from RequestMask::tile_bits: one 64-bit word per row, the two
// rows one after the other, instead of a mask-word load per element; row_fn(h)
// gives fragment row h's RowMask (0: g, 1: g + 8) and is called on masked
// tiles only, so that a warp holding more scores keeps no row masks in
// registers across the tiles that need none.
template <int NT, class RowFn>
__device__ __forceinline__ void scale_mask_row_max_bits(float (&s)[NT][4], const RequestMask& rmask, RowFn row_fn,
                                                        int j0, int t4, float scale_log2, float (&mx)[2]) {
  static_assert(NT == 8, "tile_bits covers 64 columns");
  mx[0] = mx[1] = -INFINITY;
  if (rmask.tile_needs_mask(j0, 8 * NT)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Bit 8 j + (e & 1) of `bits`: column j0 + 8 j + 2 t4 + (e & 1), element e of tile j.
      const uint64_t bits = rmask.tile_bits(row_fn(h), j0) >> (2 * t4);
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          if (!((bits >> (8 * j + (e & 1))) & 1ull)) s[j][e] = -INFINITY;
          mx[h] = fmaxf(mx[h], s[j][e]);
        }
    }
  } else {
    thread_row_max<NT>(s, mx);
  }
  quad_scaled_max(mx, scale_log2);
}

// The (unscaled) scores of a thread's two fragment rows become
// P = exp2(s * scale_log2 - base[h]) in place, one FFMA each; each row's part
// of the tile's sum is added to sum0 / sum1.
template <int NT>
__device__ __forceinline__ void exp2_rows(float (&s)[NT][4], const float (&base)[2], float scale_log2, float& sum0,
                                          float& sum1) {
  const float nb0 = -base[0], nb1 = -base[1];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    s[j][0] = fast_exp2(fmaf(s[j][0], scale_log2, nb0));
    s[j][1] = fast_exp2(fmaf(s[j][1], scale_log2, nb0));
    s[j][2] = fast_exp2(fmaf(s[j][2], scale_log2, nb1));
    s[j][3] = fast_exp2(fmaf(s[j][3], scale_log2, nb1));
    sum0 += s[j][0] + s[j][1];
    sum1 += s[j][2] + s[j][3];
  }
}

// The tile's online-softmax step on a warp's score fragments (masked,
// unscaled; mx the rows' scaled tile max over every warp that shares the
// rows): each row's running max and sum fold the tile in (OnlineSoftmaxRow),
// the scores become P = exp2(s * scale_log2 - base) in place and add to the
// thread's partial row sums. alpha: the rows' rescale factors for O
// (rescale_rows).
template <int NT>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], OnlineSoftmaxRow (&sm)[2], const float (&mx)[2],
                                             float scale_log2, float (&alpha)[2]) {
  float base[2];
  alpha[0] = sm[0].update(mx[0], &base[0]);
  alpha[1] = sm[1].update(mx[1], &base[1]);
  exp2_rows(s, base, scale_log2, sm[0].l, sm[1].l);
}

// softmax_tile for m16 tile mi of a warp of two whose rows' state the quad
// holds (QuadSoftmaxRows, rows 2 mi and 2 mi + 1): the running maxima come
// from their lanes and move there; the scores become
// P = exp2(s * scale_log2 - base) in place, and rowsum[h] gets this thread's
// part of row 2 mi + h's tile sum (quad_fold_sums adds the quad's parts to
// the state once per tile).
template <int NT>
__device__ __forceinline__ void softmax_tile_quad(float (&s)[NT][4], QuadSoftmaxRows& st, int mi, int t4,
                                                  const float (&mx)[2], float scale_log2, float (&alpha)[2],
                                                  float (&rowsum)[2]) {
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_new;
    alpha[h] = fold_max(st.max_of(2 * mi + h), mx[h], &m_new, &base[h]);
    if (t4 == 2 * mi + h) st.m = m_new;
  }
  rowsum[0] = rowsum[1] = 0.f;
  exp2_rows(s, base, scale_log2, rowsum[0], rowsum[1]);
}

// The tile's sums into the quad's state: rowsum[r] is this thread's part of
// row r's tile sum, alpha[r] row r's rescale factor (softmax_tile_quad of
// both m16 tiles); lane t4 folds in row t4's.
__device__ __forceinline__ void quad_fold_sums(QuadSoftmaxRows& st, int t4, const float (&alpha)[4],
                                               const float (&rowsum)[4]) {
  const float a = t4 == 0 ? alpha[0] : t4 == 1 ? alpha[1] : t4 == 2 ? alpha[2] : alpha[3];
  st.l = st.l * a + quad_reduce_scatter4(rowsum, t4);
}

// O fragments (same layout: row g for e < 2, g + 8 for e >= 2) times the
// rows' rescale factors. Skipped when every factor of the warp is exactly 1
// (fold_max: no row's max moved), as it is on most tiles past the first few
// of a long KV range: one vote instead of a multiply per accumulator. Every
// lane of the warp calls it (the vote).
template <int NTO>
__device__ __forceinline__ void rescale_rows(float (&o)[NTO][4], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < NTO; ++j) {
    o[j][0] *= alpha[0];
    o[j][1] *= alpha[0];
    o[j][2] *= alpha[1];
    o[j][3] *= alpha[1];
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_SCORES_CUH_
