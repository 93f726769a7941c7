// RequestMask::tile_bits (kernels/core/mask.cuh) against RequestMask::visible,
// column by column, on random requests: prefix lengths, q_len up to 100 (one to
// four mask words, and fewer words than q_len needs), causal and tree masks,
// rows past the request, tile starts at multiples of 64 and anywhere else; and
// draft_word_tiles / nth_set_bit64 (the TMA kernel's skipped draft tiles).
// Host-compiled: mask.cuh's RowMask / RequestMask are host+device code.
#include <stdint.h>
#include <stdio.h>

#include <random>
#include <vector>

#include "kernels/core/mask.cuh"

namespace {

int failures = 0;

void expect_eq(uint64_t got, uint64_t want, const char* what, int case_id, int j0) {
  if (got != want && failures++ < 10) {
    fprintf(stderr, "FAIL %s case %d j0 %d: got %016llx want %016llx\n", what, case_id, j0,
            static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
  }
}

}  // namespace

int main() {
  using verify_attn::low_bits64;
  using verify_attn::RequestMask;
  using verify_attn::RowMask;
  expect_eq(low_bits64(-5), 0ull, "low_bits64(-5)", 0, 0);
  expect_eq(low_bits64(0), 0ull, "low_bits64(0)", 0, 0);
  expect_eq(low_bits64(1), 1ull, "low_bits64(1)", 0, 0);
  expect_eq(low_bits64(63), ~0ull >> 1, "low_bits64(63)", 0, 0);
  expect_eq(low_bits64(64), ~0ull, "low_bits64(64)", 0, 0);
  expect_eq(low_bits64(1000), ~0ull, "low_bits64(1000)", 0, 0);

  std::mt19937 rng(std::random_device{}());
  long columns = 0, visible_cols = 0, masked_cols = 0;
  for (int c = 0; c < 20000; ++c) {
    const int q_len = 1 + static_cast<int>(rng() % 100);
    const int prefix = static_cast<int>(rng() % 3 == 0 ? rng() % 8 : rng() % 300);
    const int q_words = (q_len + 31) / 32;
    // mostly the words q_len needs, sometimes more (a wider mask), sometimes fewer
    // (device q_len past max_q_len: visible() treats the missing words as zero)
    int words = q_words;
    if (rng() % 5 == 0) words = q_words + 1 + static_cast<int>(rng() % 2);
    if (rng() % 7 == 0 && q_words > 1) words = 1 + static_cast<int>(rng() % (q_words - 1));
    std::vector<uint32_t> row_words(words);
    const int density = static_cast<int>(rng() % 4);  // sparse .. dense trees
    for (auto& w : row_words) {
      uint32_t x = rng();
      for (int k = 0; k < density; ++k) x &= rng();
      w = (rng() % 9 == 0) ? 0xffffffffu : x;
    }
    RequestMask rm;
    rm.kv_len = prefix + q_len;
    rm.prefix = prefix;
    rm.mask_words = words;
    rm.causal = rng() % 4 == 0;
    RowMask r;
    r.valid = rng() % 6 != 0;
    r.t = r.valid ? static_cast<int>(rng() % q_len) : 0;
    r.words = (!rm.causal && r.valid) ? row_words.data() : nullptr;
    std::vector<int> starts;
    for (int j0 = 0; j0 < rm.kv_len + 64; j0 += 64) starts.push_back(j0);
    for (int k = 0; k < 6; ++k) starts.push_back(static_cast<int>(rng() % (rm.kv_len + 70)));
    for (int j0 : starts) {
      uint64_t want = 0;
      for (int k = 0; k < 64; ++k) {
        if (rm.visible(r, j0 + k)) want |= 1ull << k;
      }
      const uint64_t got = rm.tile_bits(r, j0);
      expect_eq(got, want, rm.causal ? "causal" : (r.valid ? "tree" : "tree, row past the request"), c, j0);
      columns += 64;
      for (int k = 0; k < 64; ++k) ((want >> k) & 1) ? ++visible_cols : ++masked_cols;
    }
  }
  // draft_word_tiles against the tile of every set bit (draft-only tiles
  // first_draft + k, k < 64), and nth_set_bit64 against a scan of the bits.
  long word_tiles = 0, skipped_bits = 0;
  for (int c = 0; c < 200000; ++c) {
    const int N = rng() % 2 == 0 ? 64 : 32;
    const int prefix = static_cast<int>(rng() % 5 == 0 ? rng() % 3 : rng() % 5000);
    const int first_draft = (prefix + N - 1) / N;
    const int off = first_draft * N - prefix;
    const int w = static_cast<int>(rng() % (rng() % 4 == 0 ? 140 : 4));  // tiles past 63 too
    uint32_t x = rng();
    for (int k = static_cast<int>(rng() % 5); k > 0; --k) x &= rng();
    uint64_t want = 0;
    for (int b = 0; b < 32; ++b) {
      if (!((x >> b) & 1u)) continue;
      const int col = prefix + 32 * w + b;  // KV row of draft column 32 w + b
      const int k = col / N - first_draft;
      if (k < 0 || k >= 64) {
        ++skipped_bits;
        continue;
      }
      want |= 1ull << k;
    }
    expect_eq(verify_attn::draft_word_tiles(x, w, off, N), want, "draft_word_tiles", c, w);
    word_tiles += want != 0;
    const uint64_t m = (static_cast<uint64_t>(rng()) << 32) | rng();
    const int n = static_cast<int>(rng() % 66);
    int want_bit = -1;
    for (int b = 0, seen = 0; b < 64; ++b) {
      if ((m >> b) & 1ull) {
        if (seen++ == n) {
          want_bit = b;
          break;
        }
      }
    }
    expect_eq(static_cast<uint64_t>(verify_attn::nth_set_bit64(m, n)),
              static_cast<uint64_t>(want_bit), "nth_set_bit64", c, n);
  }
  using verify_attn::nth_set_bit64;
  expect_eq(static_cast<uint64_t>(nth_set_bit64(0ull, 0)), ~0ull, "nth_set_bit64(0, 0)", 0, 0);
  expect_eq(static_cast<uint64_t>(nth_set_bit64(~0ull, 63)), 63ull, "nth_set_bit64(~0, 63)", 0, 0);
  if (word_tiles < 100000 || skipped_bits < 1000) {
    fprintf(stderr, "FAIL: degenerate draft_word_tiles cases (%ld, %ld)\n", word_tiles,
            skipped_bits);
    return 1;
  }
  printf("mask_test: %ld columns (%ld visible, %ld masked), %ld draft words, %d mismatches\n",
         columns, visible_cols, masked_cols, word_tiles, failures);
  // the random cases must exercise both outcomes heavily
  if (visible_cols < columns / 10 || masked_cols < columns / 10) {
    fprintf(stderr, "FAIL: degenerate random cases\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
