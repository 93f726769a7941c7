// Internal: the thread-local error message behind va_last_error_message().
// Every C-ABI entry point returns va_fail(...) on a bad argument, so the
// status code and the message always travel together.
#ifndef VERIFY_ATTN_STATUS_H_
#define VERIFY_ATTN_STATUS_H_

#include "kernels/verify_attn.h"

namespace verify_attn {

// Records printf-style `fmt` as this thread's last error and returns `s`.
va_status va_fail(va_status s, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Clears this thread's last error; returns VA_OK.
va_status va_ok();

// Maps a cudaError_t (passed as int so this header needs no CUDA headers)
// to VA_OK or VA_ERR_CUDA with the runtime's message and `what` as context.
va_status va_check_cuda(int cuda_error, const char* what);

}  // namespace verify_attn

#endif  // VERIFY_ATTN_STATUS_H_
