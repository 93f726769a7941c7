// va_verify_metadata: a uniform verify batch's indptrs, lengths, draft slots
// and compact tree mask in one launch (kernels/verify_attn.h states the
// contract). One block per request: it sums the lengths of the requests
// before it (a block reduction, so no second pass and no host sync), then
// writes its own entries. The engine's request-to-slot gather fills the
// prefix entries of kv_indices with kv_indptr as its row starts.
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/core/errors.cuh"
#include "kernels/launch.h"
#include "kernels/status.h"
#include "kernels/verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxDrafts = 1024;

struct MetadataArgs {
  int32_t batch, real_batch, n, pad_slot;
  const void* prefix_len;
  const void* draft_slots;
  const uint8_t* draft_mask;
  int32_t *qo_indptr, *kv_indptr, *kv_len, *kv_indices, *tree_mask, *error_word;
  int64_t capacity;
};

template <typename T>
__device__ __forceinline__ int64_t load_int(const void* p, int64_t i) {
  return static_cast<int64_t>(static_cast<const T*>(p)[i]);
}

// A prefix length as it counts in the row starts: [0, INT32_MAX]. A negative one
// counts as 0 (reported by its own block); a longer one as INT32_MAX, which is
// already past every kv_indices row (its end exceeds 2^31, so it and every later
// request are reported). The clamp keeps the sums below from overflowing
// int64: B <= 2^31 terms of at most 2^31 + 1024 each. Unclamped int64 lengths
// (garbage such as 3 * 2^61) could wrap a later request's start negative, pass
// the capacity check and write far outside kv_indices.
__device__ __forceinline__ int64_t counted_len(int64_t raw) {
  return raw < 0 ? 0 : (raw > INT32_MAX ? static_cast<int64_t>(INT32_MAX) : raw);
}

// Sum over the block; every thread gets the total.
__device__ int64_t block_sum(int64_t v) {
  __shared__ int64_t warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  return total;
}

template <typename LenT, typename SlotT>
__global__ void __launch_bounds__(kThreads) verify_metadata_kernel(MetadataArgs a) {
  const int r = blockIdx.x;
  const int n = a.n;
  if (a.batch == 0) {  // the empty batch: the indptrs' single entry
    if (threadIdx.x == 0) a.qo_indptr[0] = a.kv_indptr[0] = 0;
    return;
  }
  // Every request's start counts the earlier prefixes clamped (counted_len).
  int64_t part = 0;
  for (int i = threadIdx.x; i < r; i += kThreads) part += counted_len(load_int<LenT>(a.prefix_len, i)) + n;
  const int64_t start = block_sum(part);
  const int64_t raw_len = load_int<LenT>(a.prefix_len, r);
  const int64_t len = counted_len(raw_len);
  const int64_t end = start + len + n;
  const bool rows_ok = raw_len >= 0 && end <= a.capacity && end <= INT32_MAX;
  if (threadIdx.x == 0) {
    if (!rows_ok) report_error(a.error_word, kErrMetadata, r, raw_len < 0 ? raw_len : end, -1);
    const int64_t clamp_start = start < INT32_MAX ? start : INT32_MAX;
    const int64_t clamp_len = len + n < INT32_MAX ? len + n : INT32_MAX;
    a.qo_indptr[r] = r * n;
    a.kv_indptr[r] = static_cast<int32_t>(clamp_start);
    a.kv_len[r] = static_cast<int32_t>(clamp_len);
    if (r == a.batch - 1) {
      a.qo_indptr[a.batch] = a.batch * n;
      a.kv_indptr[a.batch] = static_cast<int32_t>(end < INT32_MAX ? end : INT32_MAX);
    }
  }
  const bool real = r < a.real_batch;
  for (int t = threadIdx.x; t < n && rows_ok; t += kThreads) {
    const int64_t slot = real ? load_int<SlotT>(a.draft_slots, static_cast<int64_t>(r) * n + t) : a.pad_slot;
    if (slot < INT32_MIN || slot > INT32_MAX) {
      report_error(a.error_word, kErrMetadata, r, slot, static_cast<int>(len + t));
      continue;
    }
    a.kv_indices[start + len + t] = static_cast<int32_t>(slot);
  }
  if (a.tree_mask == nullptr) return;
  const int words = (n + 31) / 32;
  const uint8_t* rows = real && a.draft_mask != nullptr
                            ? a.draft_mask + static_cast<int64_t>(r) * n * n : nullptr;
  for (int i = threadIdx.x; i < n * words; i += kThreads) {
    const int t = i / words, w = i - t * words;
    const int c0 = w * 32, c1 = c0 + 32 < n ? c0 + 32 : n;
    uint32_t bits = 0;
    if (rows != nullptr) {
      const uint8_t* row = rows + static_cast<int64_t>(t) * n;
      for (int c = c0; c < c1; ++c) bits |= static_cast<uint32_t>(row[c] != 0) << (c - c0);
    } else {
      for (int c = c0; c < c1 && c <= t; ++c) bits |= 1u << (c - c0);
    }
    a.tree_mask[(static_cast<int64_t>(r) * n + t) * words + w] = static_cast<int32_t>(bits);
  }
}

template <typename LenT>
void launch_for_slots(const MetadataArgs& m, bool slots64, int grid, cudaStream_t st) {
  if (slots64) {
    verify_metadata_kernel<LenT, int64_t><<<grid, kThreads, 0, st>>>(m);
  } else {
    verify_metadata_kernel<LenT, int32_t><<<grid, kThreads, 0, st>>>(m);
  }
}

}  // namespace
}  // namespace verify_attn

extern "C" void va_verify_metadata_args_init(va_verify_metadata_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(va_verify_metadata_args);
  a->num_drafts = 1;
}

extern "C" va_status va_verify_metadata(const va_verify_metadata_args* a) {
  using namespace verify_attn;
  if (a == nullptr) return va_fail(VA_ERR_NULL_POINTER, "args: NULL");
  if (a->struct_size != sizeof(va_verify_metadata_args))
    return va_fail(VA_ERR_VERSION, "args.struct_size: %u, this library's is %zu (call va_verify_metadata_args_init)",
                   a->struct_size, sizeof(va_verify_metadata_args));
  if (a->batch < 0) return va_fail(VA_ERR_INVALID_VALUE, "batch: must be >= 0 (got %d)", a->batch);
  if (a->real_batch < 0 || a->real_batch > a->batch)
    return va_fail(VA_ERR_INVALID_VALUE, "real_batch: must be in [0, batch=%d] (got %d)", a->batch, a->real_batch);
  if (a->num_drafts < 1 || a->num_drafts > kMaxDrafts)
    return va_fail(VA_ERR_INVALID_VALUE, "num_drafts: must be in [1, %d] (got %d)", kMaxDrafts, a->num_drafts);
  if (static_cast<int64_t>(a->batch) * a->num_drafts > INT32_MAX)
    return va_fail(VA_ERR_INVALID_VALUE, "batch * num_drafts: %lld rows exceed int32",
                   static_cast<long long>(a->batch) * a->num_drafts);
  if (a->kv_indices_capacity < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "kv_indices_capacity: must be >= 0 (got %lld)",
                   static_cast<long long>(a->kv_indices_capacity));
  if (a->qo_indptr == nullptr) return va_fail(VA_ERR_NULL_POINTER, "qo_indptr: NULL");
  if (a->kv_indptr == nullptr) return va_fail(VA_ERR_NULL_POINTER, "kv_indptr: NULL");
  if (a->batch > 0) {
    if (a->prefix_len == nullptr) return va_fail(VA_ERR_NULL_POINTER, "prefix_len: NULL");
    if (a->kv_len == nullptr) return va_fail(VA_ERR_NULL_POINTER, "kv_len: NULL");
  }
  if (a->kv_indices_capacity > 0 && a->kv_indices == nullptr)
    return va_fail(VA_ERR_NULL_POINTER, "kv_indices: NULL with a capacity of %lld",
                   static_cast<long long>(a->kv_indices_capacity));
  if (a->real_batch > 0 && a->draft_slots == nullptr) return va_fail(VA_ERR_NULL_POINTER, "draft_slots: NULL");
  MetadataArgs m;
  m.batch = a->batch;
  m.real_batch = a->real_batch;
  m.n = a->num_drafts;
  m.pad_slot = a->pad_slot;
  m.prefix_len = a->prefix_len;
  m.draft_slots = a->draft_slots;
  m.draft_mask = a->draft_mask;
  m.qo_indptr = a->qo_indptr;
  m.kv_indptr = a->kv_indptr;
  m.kv_len = a->kv_len;
  m.kv_indices = a->kv_indices;
  m.tree_mask = a->tree_mask;
  m.error_word = a->error_word;
  m.capacity = a->kv_indices_capacity;
  const int grid = a->batch > 0 ? a->batch : 1;
  auto st = static_cast<cudaStream_t>(a->stream);
  if (a->prefix_len_int64) {
    launch_for_slots<int64_t>(m, a->draft_slots_int64 != 0, grid, st);
  } else {
    launch_for_slots<int32_t>(m, a->draft_slots_int64 != 0, grid, st);
  }
  va_status s = va_check_cuda(cudaGetLastError(), "verify_metadata launch");
  if (s != VA_OK) return s;
  return va_ok();
}
