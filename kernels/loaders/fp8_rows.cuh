// fp8 (e4m3) KV rows converted into q's dtype on their way to shared memory.
//
// cp.async copies bytes as they are, so the load warps of an fp8-cache
// kernel (kernels/plan.h, KvFp8) read a row's 16-byte chunks (16 elements
// each) into registers, and after the stage is free convert and store each
// as 32 bytes of q-dtype elements where a q-dtype cache's cp.async copies
// land: the consumers read the same stage layout as for a bf16 / fp16 cache.
// Every e4m3 value (OCP E4M3: bias 7, subnormals down to 2^-9, no infinities)
// is exact in fp16 and in bf16, so the conversion rounds nothing; k_scale and
// v_scale act in the softmax scale and on O, never element by element
// (docs/design_fp8.md).
#ifndef VERIFY_ATTN_LOADERS_FP8_ROWS_CUH_
#define VERIFY_ATTN_LOADERS_FP8_ROWS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/loaders/tile_copy.cuh"

namespace verify_attn {

// Two e4m3 values (the low byte first) as two q-dtype elements (the first in
// the low half), exactly: cvt.rn.f16x2.e4m3x2, then for bf16 through fp32.
template <typename DT>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  if constexpr (std::is_same_v<DT, __nv_bfloat16>) {
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const uint32_t*>(&b);
  } else {
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  }
}

// Eight e4m3 values (8 bytes, the first in the low byte of x) as 16 bytes of
// q-dtype elements.
template <typename DT>
__device__ __forceinline__ uint4 e4m3x8_to(uint2 raw) {
  return make_uint4(e4m3x2_to<DT>(raw.x & 0xffffu), e4m3x2_to<DT>(raw.x >> 16), e4m3x2_to<DT>(raw.y & 0xffffu),
                    e4m3x2_to<DT>(raw.y >> 16));
}

// The CHUNKS 16-byte chunks of one row a thread moves: chunk c is the row's
// chunk sub + TPR x c (TPR threads per row, consecutive threads on
// consecutive chunks, as copy_rows_async spreads them).
template <int CHUNKS, int TPR>
struct Fp8RowChunks {
  uint4 raw[CHUNKS];

  // row: the row's first byte in the cache; !ok: zeros (the row is past
  // kv_len or at a bad index, and `row` is not dereferenced).
  __device__ __forceinline__ void load(const uint8_t* row, bool ok, int sub) {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
      raw[c] = ok ? __ldg(reinterpret_cast<const uint4*>(row) + sub + TPR * c) : make_uint4(0u, 0u, 0u, 0u);
  }

  // srow: the row in shared memory (q-dtype elements). A chunk's eight words
  // are converted before either of its two stores (not through e4m3x8_to with
  // a store after each half: that order put 24 bytes of stack on the 32-row
  // D128 kernel's load warps, which run at 40 registers; cubin_archs_test).
  template <typename DT>
  __device__ __forceinline__ void store(DT* srow, int sub) const {
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const uint32_t w[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
      uint32_t o[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        o[2 * i] = e4m3x2_to<DT>(w[i] & 0xffffu);
        o[2 * i + 1] = e4m3x2_to<DT>(w[i] >> 16);
      }
      uint4* dst = reinterpret_cast<uint4*>(srow + (sub + TPR * c) * 16);
      dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
      dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
  }
};

// One thread's part of a KV row pair from an fp8 cache: its chunks of row
// `row` of a tile's K and of its V (TPR threads per row, head_dim D), read by
// load() before the stage is free and stored by store() into the stage's K / V
// rows. rows is the tile's row function (kernels/loaders/tile_copy.cuh,
// KvTileRows), resolved here (ResolvedRow): element (= byte) offsets from the
// caches, or a zero row.
template <int D, int TPR>
struct Fp8KvRow {
  Fp8RowChunks<D / 16 / TPR, TPR> k, v;

  template <class Rows>
  __device__ __forceinline__ void load(const Rows& rows, int row, const void* gk, const void* gv, int sub) {
    const ResolvedRow r = ResolvedRow::of(rows, row);
    k.load(static_cast<const uint8_t*>(gk) + r.k_off, r.ok, sub);
    v.load(static_cast<const uint8_t*>(gv) + r.v_off, r.ok, sub);
  }

  template <typename DT>
  __device__ __forceinline__ void store(DT* sk_row, DT* sv_row, int sub) const {
    k.template store<DT>(sk_row, sub);
    v.template store<DT>(sv_row, sub);
  }
};

}  // namespace verify_attn

#endif  // VERIFY_ATTN_LOADERS_FP8_ROWS_CUH_
