// Visibility of KV column j for one query row, from the compact tree mask.
//
// Request layout (kernels/verify_attn.h): KV rows [0, prefix) are the committed
// prefix and are visible to every query row; KV row prefix + c (c < q_len) is
// draft token c, visible to query token t iff
//   TREE:   bit (c % 32) of word (c / 32) of the row's mask words,
//   CAUSAL: c <= t.
// Columns j >= kv_len do not exist. Only tiles that reach past `prefix` call
// into this file (tile_needs_mask); prefix-only tiles are unmasked.
#ifndef VERIFY_ATTN_CORE_MASK_CUH_
#define VERIFY_ATTN_CORE_MASK_CUH_

#include <stdint.h>

// RowMask / RequestMask are plain code, compiled for the device and, for the
// host test kernels/tests/mask_test.cc, by the host compiler.
#ifdef __CUDACC__
#define VA_MASK_HD __host__ __device__ __forceinline__
#else
#define VA_MASK_HD inline
#endif

namespace verify_attn {

// The mask words are read-only for the kernel's lifetime: the read-only path
// on the device, a plain load in the host test.
VA_MASK_HD uint32_t load_mask_word(const uint32_t* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}

// Bits [0, n) set, n clamped to [0, 64].
VA_MASK_HD uint64_t low_bits64(int n) {
  return n <= 0 ? 0ull : (n >= 64 ? ~0ull : (1ull << n) - 1ull);
}

// Per query row (per thread, for each of its fragment rows).
struct RowMask {
  const uint32_t* words;  // TREE: this row's mask words; nullptr otherwise
  int t;                  // draft index of the row's token within its request
  bool valid;             // row exists (row tile may run past the request)
};

struct RequestMask {
  int kv_len;      // KV rows of the request
  int prefix;      // kv_len - q_len (>= 0 here)
  int mask_words;  // words per tree-mask row
  bool causal;

  // A KV tile [j0, j0 + n) needs per-element masking iff it reaches a draft
  // column or the kv_len boundary; both lie at or past `prefix`.
  VA_MASK_HD bool tile_needs_mask(int j0, int n) const {
    return j0 + n > prefix;
  }

  // Rows past the request (valid == false) see every existing column: their
  // Q rows are zero-filled (or, Q by TMA, the next request's rows) and their
  // results are never stored, so this only avoids reading mask words for them.
  VA_MASK_HD bool visible(const RowMask& r, int j) const {
    if (j >= kv_len) return false;
    if (j < prefix || !r.valid) return true;
    const int c = j - prefix;
    if (causal) return c <= r.t;
    const int w = c >> 5;
    if (w >= mask_words) return false;  // only for device q_len > max_q_len
    return (load_mask_word(r.words + w) >> (c & 31)) & 1u;
  }

  // visible(r, j0 + k) as bit k, for the 64 columns [j0, j0 + 64) of a tile:
  // one row's visibility from at most three mask-word loads instead of one
  // test per column (the masked tiles' scores test a bit each).
  VA_MASK_HD uint64_t tile_bits(const RowMask& r, int j0) const {
    const uint64_t exist = low_bits64(kv_len - j0);
    if (!r.valid) return exist;
    uint64_t vis = low_bits64(prefix - j0);
    if (causal) {
      vis = low_bits64(prefix + r.t + 1 - j0);  // prefix and drafts c <= t
    } else {
      const int d = j0 - prefix;        // draft column at tile bit 0 (may be < 0)
      if (d > -64) {
        const int c0 = d > 0 ? d : 0;   // first draft column in the tile
        const int w = c0 >> 5, sh = c0 & 31;
        const uint32_t x0 = w < mask_words ? load_mask_word(r.words + w) : 0u;
        const uint32_t x1 = w + 1 < mask_words ? load_mask_word(r.words + w + 1) : 0u;
        const uint32_t x2 = (sh != 0 && w + 2 < mask_words) ? load_mask_word(r.words + w + 2) : 0u;
        uint64_t drafts = ((static_cast<uint64_t>(x1) << 32) | x0) >> sh;  // columns c0 ..
        if (sh != 0) drafts |= static_cast<uint64_t>(x2) << (64 - sh);
        vis |= drafts << (c0 - d);  // column c0 sits at tile bit c0 - d (< 64)
      }
    }
    return vis & exist;
  }
};

// TREE, the KV tiles a row tile visits: bit k of the result is set when a set
// bit of x, mask word w (draft columns 32 w .. 32 w + 31), lies in the
// draft-only tile first_draft + k, where first_draft = ceil(prefix / N) is the
// first tile without a prefix column and off = first_draft * N - prefix the
// draft columns that share the last prefix tile (always visited, so not
// represented here).
// N >= 32: a word's columns lie in at most two tiles. Tiles k >= 64 are not
// represented (kernels/core/request.cuh visits every tile then).
VA_MASK_HD uint64_t draft_word_tiles(uint32_t x, int w, int off, int N) {
  if (x == 0u) return 0ull;
  const int s = 32 * w - off;          // draft-only column of bit 0 (> -N)
  const int k = s < 0 ? -1 : s / N;    // tile of bit 0 (-1: the last prefix tile)
  const int b = (k + 1) * N - s;       // first bit in tile k + 1, in (0, N]
  const uint32_t lo = b >= 32 ? x : x & ((1u << b) - 1u);
  const uint32_t hi = b >= 32 ? 0u : x >> b;
  uint64_t out = 0ull;
  if (lo != 0u && k >= 0 && k < 64) out |= 1ull << k;
  if (hi != 0u && k + 1 < 64) out |= 1ull << (k + 1);
  return out;
}

VA_MASK_HD int popc32(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// The n-th (from 0) set bit of m, -1 if m has n or fewer set bits (or n < 0):
// straight-line, narrowing to the half that holds it by bit counts.
VA_MASK_HD int nth_set_bit64(uint64_t m, int n) {
  if (n < 0) return -1;
  int b = 0;
  uint32_t x = static_cast<uint32_t>(m);
  int c = popc32(x);
  if (n >= c) {
    n -= c;
    x = static_cast<uint32_t>(m >> 32);
    b = 32;
  }
#pragma unroll
  for (int w = 16; w > 0; w >>= 1) {
    c = popc32(x & ((1u << w) - 1u));
    if (n >= c) {
      n -= c;
      x >>= w;
      b += w;
    }
  }
  return (n == 0 && (x & 1u) != 0u) ? b : -1;
}

#ifdef __CUDACC__
// TREE, over the folded rows [row0, min(row0 + M, R)) (`group` folded rows
// per token; token t's mask words start at tree_mask + (q_start + t) *
// mask_words): `last`, the highest draft column c (< q_len) that a row sees
// (-1 if none): the tile's KV range can end at prefix + c + 1 (past it every
// score of the tile is masked, so the tiles there would add exact zeros;
// kernels/core/request.cuh); and `tiles`, the draft-only KV tiles with a
// visible column (draft_word_tiles' bits, for `off` and N).
// Warp-cooperative (every lane of the warp calls it, all warps alike; the
// result is warp-uniform): the rows' tokens x mask words are spread over the
// lanes, four loads in flight per lane.
// kTiles = false: `tiles` is 0 (not computed).
struct TreeDraftScan {
  int last;
  uint64_t tiles;
};
template <bool kTiles>
__device__ __forceinline__ TreeDraftScan tree_scan_drafts(const uint32_t* tree_mask, int mask_words,
                                                          int group, int q_start, int q_len,
                                                          int row0, int M, int R, int off, int N) {
  const int t0 = row0 / group;
  const int t1 = ((row0 + M < R ? row0 + M : R) - 1) / group;
  const int q_words = (q_len + 31) >> 5;
  const int words = q_words < mask_words ? q_words : mask_words;  // visible(): w < mask_words
  const int n = (t1 - t0 + 1) * words;
  const int lane = threadIdx.x & 31;
  int best = -1;
  uint64_t tiles = 0ull;
#pragma unroll 4
  for (int i = lane; i < n; i += 32) {
    const int tok = t0 + i / words, w = i - (i / words) * words;
    uint32_t x = __ldg(tree_mask + static_cast<int64_t>(q_start + tok) * mask_words + w);
    if (w == q_words - 1 && (q_len & 31) != 0) x &= (1u << (q_len & 31)) - 1u;  // c < q_len only
    if (x != 0u) best = max(best, 32 * w + 31 - __clz(x));
    if (kTiles) tiles |= draft_word_tiles(x, w, off, N);
  }
  uint32_t lo = static_cast<uint32_t>(tiles), hi = static_cast<uint32_t>(tiles >> 32);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if (kTiles) {
      lo |= __shfl_xor_sync(0xffffffffu, lo, o);
      hi |= __shfl_xor_sync(0xffffffffu, hi, o);
    }
  }
  return {best, (static_cast<uint64_t>(hi) << 32) | lo};
}
#endif  // __CUDACC__

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_MASK_CUH_
