// Device-side error reporting without any host synchronization.
//
// error_word (optional, device int32[4], caller-initialised to {0, -1, 0, 0}):
//   [0] OR of ErrorBits (kernels/launch.h),
//   [1] the first offending request (-1 while none),
//   [2] the offending value (bad page id / flat row, or kv_len),
//   [3] the KV position j in that request (-1 when not about a row).
// The first error wins [1..3] through atomicCAS on [1]; [0] collects every bit.
// The host reads it only when asked (verify_attn.check_errors()).
#ifndef VERIFY_ATTN_CORE_ERRORS_CUH_
#define VERIFY_ATTN_CORE_ERRORS_CUH_

#include <stdint.h>

namespace verify_attn {

__device__ __forceinline__ void report_error(int32_t* error_word, int32_t bits, int req,
                                             int64_t value, int pos) {
  if (error_word == nullptr) return;
  atomicOr(error_word, bits);
  if (atomicCAS(error_word + 1, -1, req) == -1) {
    const int64_t clamped = value > INT32_MAX ? INT32_MAX : (value < INT32_MIN ? INT32_MIN : value);
    error_word[2] = static_cast<int32_t>(clamped);
    error_word[3] = pos;
  }
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_CORE_ERRORS_CUH_
