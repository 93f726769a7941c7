// Online softmax state (FlashAttention-2, Dao 2023, Algorithm 1) for the two
// fragment rows a thread owns (rows g and g+8 of its warp's 16-row slice).
//
// Logits are kept in base 2: s2 = sm_scale * log2(e) * (q . k), so
// exp(sm_scale * x - m) == exp2(s2 - m2). The returned lse is converted back
// to the natural log: lse = ln(2) * (m2 + log2(l)).
//
// Guard for fully masked rows: while a row has seen nothing its running max is
// -inf; the exponent base is then taken as 0 instead of -inf, so that
// exp2(-inf - 0) = 0 and never exp2(-inf - -inf) = NaN.
#ifndef VERIFY_ATTN_CORE_SOFTMAX_CUH_
#define VERIFY_ATTN_CORE_SOFTMAX_CUH_

#include <math.h>

namespace verify_attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Max over the 4 lanes of a quad (the lanes sharing fragment row g).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// The running max m folded with a tile's row max: sets the new max (*m_new)
// and the exponent base of the tile's probabilities (*base: 0 while the row
// has seen nothing, so exp2(-inf - base) = 0, never NaN), and returns the
// factor the sums and accumulators relative to m must be multiplied by:
// exactly 1 when the max did not move (callers may then skip the rescale), 0
// from m = -inf.
__device__ __forceinline__ float fold_max(float m, float tile_max, float* m_new, float* base) {
  const float mn = fmaxf(m, tile_max);
  const float b = (mn == -INFINITY) ? 0.f : mn;
  *m_new = mn;
  *base = b;
  return mn == m ? 1.f : fast_exp2(m - b);
}

struct OnlineSoftmaxRow {
  float m;  // running max of base-2 logits (-inf while nothing seen)
  float l;  // THIS thread's partial sum of exp2(s2 - m) over its own columns;
            // rows' full sums are reduced once at the end (sum is linear and
            // every partial is rescaled by the same factors).

  __device__ __forceinline__ void init() {
    m = -INFINITY;
    l = 0.f;
  }

  // Folds in a tile whose row max (over the whole tile, all warps) is
  // tile_max. Returns the factor the accumulators must be multiplied by, and
  // sets *base to the exponent base for this tile's probabilities.
  // (fold_max's rule: exactly 1 when the max did not move.)
  __device__ __forceinline__ float update(float tile_max, float* base) {
    const float alpha = fold_max(m, tile_max, &m, base);
    l *= alpha;
    return alpha;
  }

  // Natural-log lse of the row given its full (reduced) sum; -inf if empty.
  static __device__ __forceinline__ float lse(float m2, float l_total) {
    return l_total > 0.f ? kLn2 * (m2 + log2f(l_total)) : -INFINITY;
  }
};

// The running state of the four fragment rows a thread holds in a warp of two
// m16 tiles (row r = 2 mi + h: m16 tile mi, fragment row g (h = 0) or g + 8),
// kept by the quad of lanes that share those rows: lane t4 of the quad holds
// row t4's running max and its whole sum (the quad's columns together), two
// registers per thread instead of OnlineSoftmaxRow's eight, for a warp whose
// scores and output leave no more. Every lane of the warp calls the members
// (shuffles within the quad).
struct QuadSoftmaxRows {
  float m;  // row t4's running max of base-2 logits (-inf while it has seen nothing)
  float l;  // row t4's sum of exp2(s2 - m) over every column seen

  __device__ __forceinline__ void init() {
    m = -INFINITY;
    l = 0.f;
  }
  // Row r's running max / sum (0 <= r < 4), from the lane of the quad that holds it.
  __device__ __forceinline__ float max_of(int r) const { return __shfl_sync(0xffffffffu, m, r, 4); }
  __device__ __forceinline__ float sum_of(int r) const { return __shfl_sync(0xffffffffu, l, r, 4); }
};

// v[r]: this lane's partial sums of the quad's rows r = 0..3; returns row t4's
// total over the quad's four lanes (a reduce-scatter: three shuffles).
__device__ __forceinline__ float quad_reduce_scatter4(const float (&v)[4], int t4) {
  const bool hi = (t4 & 2) != 0, odd = (t4 & 1) != 0;
  // Rows (t4 & 2) and (t4 & 2) + 1 stay, the other two go to lane t4 ^ 2.
  const float a0 = (hi ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 2);
  const float a1 = (hi ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 2);
  // Row t4 stays, row t4 ^ 1 goes to lane t4 ^ 1.
  return (odd ? a1 : a0) + __shfl_xor_sync(0xffffffffu, odd ? a0 : a1, 1);
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_SOFTMAX_CUH_
