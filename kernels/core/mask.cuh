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

namespace verify_attn {

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
  __device__ __forceinline__ bool tile_needs_mask(int j0, int n) const {
    return j0 + n > prefix;
  }

  // Rows past the request (valid == false) see every existing column: their
  // Q rows are zero-filled and their results are never stored, so this only
  // keeps their arithmetic finite and avoids reading mask words for them.
  __device__ __forceinline__ bool visible(const RowMask& r, int j) const {
    if (j >= kv_len) return false;
    if (j < prefix || !r.valid) return true;
    const int c = j - prefix;
    if (causal) return c <= r.t;
    const int w = c >> 5;
    if (w >= mask_words) return false;  // only for device q_len > max_q_len
    return (__ldg(r.words + w) >> (c & 31)) & 1u;
  }
};

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_MASK_CUH_
