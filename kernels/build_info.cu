// Build facts reported through the C-ABI. Compiled by nvcc via cuda_library,
// which passes the arch list it compiled for as VERIFY_ATTN_CUDA_ARCHS.
#include "kernels/verify_attn.h"

#ifndef VERIFY_ATTN_CUDA_ARCHS
#error "VERIFY_ATTN_CUDA_ARCHS must be set by cuda_library"
#endif

extern "C" const char* va_compiled_archs(void) { return VERIFY_ATTN_CUDA_ARCHS; }
