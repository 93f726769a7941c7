#include "kernels/status.h"
extern "C" va_status va_workspace_size(const va_params*, size_t* b) { if (b) *b = 0; return verify_attn::va_fail(VA_ERR_UNSUPPORTED, "stub"); }
extern "C" va_status va_query_config(const va_params*, va_config_info*) { return verify_attn::va_fail(VA_ERR_UNSUPPORTED, "stub"); }
extern "C" va_status va_attention(const va_params*) { return verify_attn::va_fail(VA_ERR_UNSUPPORTED, "stub"); }
