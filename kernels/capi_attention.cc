// C-ABI entry points of the attention op: the plan handle (va_plan_create /
// va_plan_run / va_plan_info / va_plan_destroy) and the one-shot calls on the
// same path (va_workspace_size, va_query_config, va_attention). Everything checkable without reading device memory is
// validated here, each failure naming the field first; nothing is launched on
// bad input. No host synchronization and no allocation (graph-capturable).
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <new>

#include "kernels/launch.h"
#include "kernels/plan.h"
#include "kernels/status.h"
#include "kernels/verify_attn.h"

namespace verify_attn {
namespace {

bool aligned(const void* ptr, uintptr_t a) { return (reinterpret_cast<uintptr_t>(ptr) % a) == 0; }

// The scores' factor to base-2 logits: sm_scale x log2(e), times k_scale (an
// fp8 cache holds K / k_scale: q . K = k_scale (q . stored), so the factor
// takes it and the kernels never touch the stored values but to convert them).
float kernel_scale_log2(float sm_scale, float k_scale) {
  return static_cast<float>(static_cast<double>(sm_scale) * static_cast<double>(k_scale) * 1.4426950408889634);
}
float kernel_scale_log2(const va_params* p) { return kernel_scale_log2(p->sm_scale, p->k_scale); }

// KV scales, va_params' or a run's (`prefix` "" or "run."; `unset` the value
// that leaves a scale as it is: 1 in va_params, 0 in a run): another value
// only for an fp8 cache, finite and > 0, with sm_scale * k_scale * log2(e) a
// finite float.
va_status check_kv_scales(bool fp8, float k_scale, float v_scale, float sm_scale, float unset, const char* prefix) {
  const struct {
    float v;
    const char* name;
  } scales[2] = {{k_scale, "k_scale"}, {v_scale, "v_scale"}};
  for (const auto& sc : scales) {
    if (sc.v == unset) continue;
    if (!fp8)
      return va_fail(VA_ERR_INVALID_VALUE, "%s%s: only an fp8 cache (kv_dtype VA_KV_DTYPE_FP8_E4M3) takes a scale (got %g)",
                     prefix, sc.name, static_cast<double>(sc.v));
    if (!std::isfinite(sc.v) || !(sc.v > 0.f))
      return va_fail(VA_ERR_INVALID_VALUE, "%s%s: must be finite and > 0 (got %g)", prefix, sc.name,
                     static_cast<double>(sc.v));
  }
  if (k_scale != unset && !std::isfinite(kernel_scale_log2(sm_scale, k_scale)))
    return va_fail(VA_ERR_INVALID_VALUE, "%sk_scale: sm_scale * k_scale * log2(e) overflows a float (k_scale %g, sm_scale %g)",
                   prefix, static_cast<double>(k_scale), static_cast<double>(sm_scale));
  return VA_OK;
}

// An MLA cache holds K and V in one tensor (V its first columns): k_scale
// scales both products, and a v_scale (other than `unset`) must equal it.
va_status check_mla_v_scale(float v_scale, float unset, float k_scale, const char* prefix) {
  if (v_scale == unset || v_scale == k_scale) return VA_OK;
  return va_fail(VA_ERR_INVALID_VALUE,
                 "%sv_scale: an MLA cache holds K and V in one tensor, which k_scale scales; v_scale must be "
                 "left unset or equal k_scale (got v_scale %g, k_scale %g)",
                 prefix, static_cast<double>(v_scale), static_cast<double>(k_scale));
}

// Scalar configuration: everything but buffers. Shared by all three calls.
va_status validate_config(const va_params* p) {
  if (p == nullptr) return va_fail(VA_ERR_NULL_POINTER, "params: NULL");
  if (p->struct_size != sizeof(va_params))
    return va_fail(VA_ERR_VERSION, "struct_size: expected %u (sizeof(va_params)) (got %u)",
                   static_cast<unsigned>(sizeof(va_params)), p->struct_size);
  if (p->abi_version != VA_ABI_VERSION)
    return va_fail(VA_ERR_VERSION, "abi_version: expected %d (got %u)", VA_ABI_VERSION,
                   p->abi_version);
  if (p->dtype != VA_DTYPE_FP16 && p->dtype != VA_DTYPE_BF16)
    return va_fail(VA_ERR_INVALID_DTYPE, "dtype: must be VA_DTYPE_FP16 or VA_DTYPE_BF16 (got %d)",
                   p->dtype);
  if (p->kv_layout != VA_KV_FLAT && p->kv_layout != VA_KV_PAGED)
    return va_fail(VA_ERR_INVALID_VALUE, "kv_layout: must be VA_KV_FLAT or VA_KV_PAGED (got %d)",
                   p->kv_layout);
  if (p->mask_mode != VA_MASK_TREE && p->mask_mode != VA_MASK_CAUSAL)
    return va_fail(VA_ERR_INVALID_VALUE,
                   "mask_mode: must be VA_MASK_TREE or VA_MASK_CAUSAL (got %d)", p->mask_mode);
  if (p->batch_size < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "batch_size: must be >= 0 (got %d)", p->batch_size);
  if (p->total_q < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "total_q: must be >= 0 (got %d)", p->total_q);
  if (p->total_q > 0 && (p->max_q_len < 1 || p->max_q_len > 1024))
    return va_fail(VA_ERR_INVALID_VALUE, "max_q_len: must be in [1, 1024] (got %d)",
                   p->max_q_len);
  if (p->max_kv_len < 0 || p->max_kv_len > INT32_MAX)
    return va_fail(VA_ERR_INVALID_VALUE,
                   "max_kv_len: must be in [0, 2^31-1] (kv lengths are int32) (got %lld)",
                   static_cast<long long>(p->max_kv_len));
  if (p->num_qo_heads < 1)
    return va_fail(VA_ERR_INVALID_VALUE, "num_qo_heads: must be >= 1 (got %d)", p->num_qo_heads);
  if (p->num_kv_heads < 1)
    return va_fail(VA_ERR_INVALID_VALUE, "num_kv_heads: must be >= 1 (got %d)", p->num_kv_heads);
  if (p->v_is_k_prefix != 0 && p->v_is_k_prefix != 1)
    return va_fail(VA_ERR_INVALID_VALUE, "v_is_k_prefix: must be 0 or 1 (got %d)",
                   p->v_is_k_prefix);
  if (p->v_is_k_prefix == 1) {
    if (p->head_dim_qk != 576 || p->head_dim_vo != 512)
      return va_fail(VA_ERR_UNSUPPORTED,
                     "head_dim_qk: MLA (v_is_k_prefix=1) supports head_dim_qk=576, head_dim_vo=512 "
                     "(got %d, %d)",
                     p->head_dim_qk, p->head_dim_vo);
    if (p->num_kv_heads != 1)
      return va_fail(VA_ERR_UNSUPPORTED, "num_kv_heads: MLA needs num_kv_heads = 1 (got %d)",
                     p->num_kv_heads);
    if (p->num_qo_heads > 128)
      return va_fail(VA_ERR_UNSUPPORTED, "num_qo_heads: MLA supports 1..128 heads (got %d)",
                     p->num_qo_heads);
  } else {
    if (p->head_dim_qk != p->head_dim_vo)
      return va_fail(VA_ERR_UNSUPPORTED,
                     "head_dim_vo: must equal head_dim_qk without v_is_k_prefix (got %d vs %d)",
                     p->head_dim_vo, p->head_dim_qk);
    if (p->head_dim_qk != 64 && p->head_dim_qk != 128 && p->head_dim_qk != 256)
      return va_fail(VA_ERR_UNSUPPORTED, "head_dim_qk: must be 64, 128 or 256 (got %d)",
                     p->head_dim_qk);
    if (p->num_qo_heads % p->num_kv_heads != 0)
      return va_fail(VA_ERR_INVALID_VALUE,
                     "num_qo_heads: must be a multiple of num_kv_heads (got %d, %d)",
                     p->num_qo_heads, p->num_kv_heads);
    if (p->num_qo_heads / p->num_kv_heads > 16)
      return va_fail(VA_ERR_UNSUPPORTED,
                     "num_qo_heads: group num_qo_heads/num_kv_heads must be <= 16 (got %d)",
                     p->num_qo_heads / p->num_kv_heads);
  }
  if (static_cast<int64_t>(p->total_q) * p->num_qo_heads > INT32_MAX)
    return va_fail(VA_ERR_INVALID_VALUE,
                   "total_q: total_q * num_qo_heads must be <= 2^31-1 (got %d * %d)", p->total_q,
                   p->num_qo_heads);
  if (!std::isfinite(p->sm_scale) || !(p->sm_scale > 0.f))
    return va_fail(VA_ERR_INVALID_VALUE, "sm_scale: must be finite and > 0 (got %g)",
                   static_cast<double>(p->sm_scale));
  // The kernels scale by sm_scale * log2(e) (base-2 softmax): that must stay finite.
  if (p->sm_scale > FLT_MAX / 1.4426950408889634f)
    return va_fail(VA_ERR_INVALID_VALUE, "sm_scale: must be <= %g (sm_scale * log2(e) overflows) (got %g)",
                   static_cast<double>(FLT_MAX / 1.4426950408889634f), static_cast<double>(p->sm_scale));
  if (p->kv_dtype != VA_KV_DTYPE_AS_Q && p->kv_dtype != VA_KV_DTYPE_FP8_E4M3)
    return va_fail(VA_ERR_INVALID_DTYPE,
                   "kv_dtype: must be VA_KV_DTYPE_AS_Q or VA_KV_DTYPE_FP8_E4M3 (got %d)", p->kv_dtype);
  {
    const va_status st =
        check_kv_scales(p->kv_dtype == VA_KV_DTYPE_FP8_E4M3, p->k_scale, p->v_scale, p->sm_scale, 1.f, "");
    if (st != VA_OK) return st;
    if (p->v_is_k_prefix == 1) {
      const va_status mst = check_mla_v_scale(p->v_scale, 1.f, p->k_scale, "");
      if (mst != VA_OK) return mst;
    }
  }
  if (p->num_splits < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "num_splits: must be >= 0 (got %d)", p->num_splits);
  if (p->num_splits > 65535)  // before planning: no device needed to refuse it
    return va_fail(VA_ERR_INVALID_VALUE, "num_splits: at most 65535 (got %d)", p->num_splits);
  if (p->kv_layout == VA_KV_PAGED) {
    if (p->page_size < 1)
      return va_fail(VA_ERR_INVALID_VALUE, "page_size: must be >= 1 (got %d)", p->page_size);
    if (p->num_pages < 1)
      return va_fail(VA_ERR_INVALID_VALUE, "num_pages: must be >= 1 (got %lld)",
                     static_cast<long long>(p->num_pages));
  } else if (p->num_kv_rows < 0) {
    return va_fail(VA_ERR_INVALID_VALUE, "num_kv_rows: must be >= 0 (got %lld)",
                   static_cast<long long>(p->num_kv_rows));
  }
  if (p->kv_slot_runs < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "kv_slot_runs: must be >= 0 (got %d)", p->kv_slot_runs);
  if (p->kv_slot_runs > 1 && (p->kv_layout != VA_KV_PAGED || p->page_size != 1))
    return va_fail(VA_ERR_INVALID_VALUE,
                   "kv_slot_runs: a hint for paged caches with page_size 1 only (got %d with %s)",
                   p->kv_slot_runs, p->kv_layout == VA_KV_PAGED ? "page_size > 1" : "a flat cache");
  if (p->mask_mode == VA_MASK_TREE && p->total_q > 0) {
    const int need = (p->max_q_len + 31) / 32;
    if (p->mask_words < need)
      return va_fail(VA_ERR_INVALID_VALUE,
                     "mask_words: must be >= ceil(max_q_len / 32) = %d (got %d)", need,
                     p->mask_words);
  }
  return VA_OK;
}

va_status check_ptr16(const void* ptr, const char* name) {
  if (ptr == nullptr) return va_fail(VA_ERR_NULL_POINTER, "%s: NULL", name);
  if (!aligned(ptr, 16))
    return va_fail(VA_ERR_INVALID_STRIDE, "%s: must be 16-byte aligned (got %p)", name, ptr);
  return VA_OK;
}

va_status check_ptr4(const void* ptr, const char* name) {
  if (ptr == nullptr) return va_fail(VA_ERR_NULL_POINTER, "%s: NULL", name);
  if (!aligned(ptr, 4))
    return va_fail(VA_ERR_INVALID_STRIDE, "%s: must be 4-byte aligned (got %p)", name, ptr);
  return VA_OK;
}

// Element stride of a tensor of elem_bytes-byte elements: >= 0 and a
// multiple of 16 bytes (16-byte row chunks).
va_status check_stride(int64_t s, const char* name, int elem_bytes = 2) {
  const int per16 = 16 / elem_bytes;
  if (s < 0 || s % per16 != 0)
    return va_fail(VA_ERR_INVALID_STRIDE,
                   "%s: must be >= 0 and a multiple of %d elements (16 bytes) (got %lld)", name, per16,
                   static_cast<long long>(s));
  return VA_OK;
}

#define VA_RETURN_IF(expr)          \
  do {                              \
    const va_status st_ = (expr);   \
    if (st_ != VA_OK) return st_;   \
  } while (0)

// An output [n_tok, n_head, inner] (inner elements contiguous) whose strides
// give every element its own address: taken in increasing order, each stride
// must exceed the largest offset the smaller dimensions reach. The kernels
// write every element; overlapping rows would race.
va_status check_no_overlap(int64_t s_tok, const char* tok_name, int64_t s_head, const char* head_name,
                           int64_t n_tok, int64_t n_head, int64_t inner) {
  struct Dim {
    int64_t stride, n;
    const char* name;
  } d[2] = {{s_tok, n_tok, tok_name}, {s_head, n_head, head_name}};
  if (d[1].stride < d[0].stride) {
    const Dim t = d[0];
    d[0] = d[1];
    d[1] = t;
  }
  // 128-bit: strides are caller input, whose products can overflow 64 bits.
  __int128 extent = inner - 1;  // offsets reached inside one row
  for (const Dim& x : d) {
    if (x.n <= 1) continue;
    if (x.stride <= extent)
      return va_fail(VA_ERR_INVALID_STRIDE,
                     "%s: %lld makes elements overlap (strides %lld, %lld over [%lld, %lld, %lld]: "
                     "an output needs one address per element)",
                     x.name, static_cast<long long>(x.stride), static_cast<long long>(s_tok),
                     static_cast<long long>(s_head), static_cast<long long>(n_tok),
                     static_cast<long long>(n_head), static_cast<long long>(inner));
    extent += static_cast<__int128>(x.stride) * (x.n - 1);
    if (extent > INT64_MAX)
      return va_fail(VA_ERR_INVALID_STRIDE, "%s: %lld x %lld elements go past the 64-bit address range",
                     x.name, static_cast<long long>(x.stride), static_cast<long long>(x.n));
  }
  return VA_OK;
}

// The per-run pointers (va_run_args, or va_attention's own): q, k, out 16-byte
// aligned, v too for MHA/GQA (MLA: NULL or k), lse 4-byte aligned or NULL.
va_status validate_run_ptrs(bool mla, const void* q, const void* k, const void* v, const void* out,
                            const float* lse) {
  VA_RETURN_IF(check_ptr16(q, "q"));
  VA_RETURN_IF(check_ptr16(k, "k"));
  if (mla) {
    if (v != nullptr && v != k)
      return va_fail(VA_ERR_INVALID_VALUE,
                     "v: must be NULL or equal to k when v_is_k_prefix = 1 (got %p, k = %p)", v, k);
  } else {
    VA_RETURN_IF(check_ptr16(v, "v"));
  }
  VA_RETURN_IF(check_ptr16(out, "out"));
  if (lse != nullptr && !aligned(lse, 4))
    return va_fail(VA_ERR_INVALID_STRIDE, "lse: must be 4-byte aligned (got %p)",
                   static_cast<const void*>(lse));
  return VA_OK;
}

// The pointers a plan binds for all its runs: indices, lengths, mask, error word.
va_status validate_batch_ptrs(const va_params* p) {
  VA_RETURN_IF(check_ptr4(p->qo_indptr, "qo_indptr"));
  VA_RETURN_IF(check_ptr4(p->kv_indptr, "kv_indptr"));
  if (p->kv_layout == VA_KV_PAGED) {
    VA_RETURN_IF(check_ptr4(p->kv_indices, "kv_indices"));
    VA_RETURN_IF(check_ptr4(p->kv_len, "kv_len"));
  }
  if (p->mask_mode == VA_MASK_TREE) VA_RETURN_IF(check_ptr4(p->tree_mask, "tree_mask"));
  if (p->error_word != nullptr && !aligned(p->error_word, 4))
    return va_fail(VA_ERR_INVALID_STRIDE, "error_word: must be 4-byte aligned (got %p)",
                   static_cast<void*>(p->error_word));
  return VA_OK;
}

// Strides (only when there is work to do).
va_status validate_strides(const va_params* p) {
  const bool mla = p->v_is_k_prefix == 1;
  const bool paged = p->kv_layout == VA_KV_PAGED;
  VA_RETURN_IF(check_stride(p->q_stride_token, "q_stride_token"));
  VA_RETURN_IF(check_stride(p->q_stride_head, "q_stride_head"));
  const int kv_bytes = p->kv_dtype == VA_KV_DTYPE_FP8_E4M3 ? 1 : 2;
  VA_RETURN_IF(check_stride(p->k_stride_token, "k_stride_token", kv_bytes));
  VA_RETURN_IF(check_stride(p->k_stride_head, "k_stride_head", kv_bytes));
  if (paged) VA_RETURN_IF(check_stride(p->k_stride_page, "k_stride_page", kv_bytes));
  if (!mla) {
    VA_RETURN_IF(check_stride(p->v_stride_token, "v_stride_token", kv_bytes));
    VA_RETURN_IF(check_stride(p->v_stride_head, "v_stride_head", kv_bytes));
    if (paged) VA_RETURN_IF(check_stride(p->v_stride_page, "v_stride_page", kv_bytes));
  }
  VA_RETURN_IF(check_stride(p->out_stride_token, "out_stride_token"));
  VA_RETURN_IF(check_stride(p->out_stride_head, "out_stride_head"));
  VA_RETURN_IF(check_no_overlap(p->out_stride_token, "out_stride_token", p->out_stride_head,
                                "out_stride_head", p->total_q, p->num_qo_heads, p->head_dim_vo));
  if (p->lse != nullptr) {
    if (p->lse_stride_token < 0)
      return va_fail(VA_ERR_INVALID_STRIDE, "lse_stride_token: must be >= 0 (got %lld)",
                     static_cast<long long>(p->lse_stride_token));
    if (p->lse_stride_head < 0)
      return va_fail(VA_ERR_INVALID_STRIDE, "lse_stride_head: must be >= 0 (got %lld)",
                     static_cast<long long>(p->lse_stride_head));
    VA_RETURN_IF(check_no_overlap(p->lse_stride_token, "lse_stride_token", p->lse_stride_head,
                                  "lse_stride_head", p->total_q, p->num_qo_heads, 1));
  }
  return VA_OK;
}

bool is_empty(const va_params* p) { return p->batch_size == 0 || p->total_q == 0; }

// The plan of p's layout: its per-run pointers play no part (every run's are
// aligned as validate_run_ptrs requires), so the decisions hold for any run.
va_status plan_for(const va_params* p, const va_plan_options& opt, Plan* plan) {
  DeviceInfo dev;
  VA_RETURN_IF(query_device(&dev));
  va_params layout = *p;
  layout.q = layout.k = layout.v = nullptr;
  layout.out = nullptr;
  return make_plan(layout, dev, opt, plan);
}

va_plan_options default_options() {
  va_plan_options o;
  va_plan_options_init(&o);
  return o;
}

KernelParams make_kernel_params(const va_params* p, const Plan& plan) {
  const bool mla = p->v_is_k_prefix == 1;
  KernelParams kp;
  std::memset(&kp, 0, sizeof(kp));
  kp.q = p->q;
  kp.q_stride_token = p->q_stride_token;
  kp.q_stride_head = p->q_stride_head;
  kp.k = p->k;
  kp.k_stride_page = p->k_stride_page;
  kp.k_stride_token = p->k_stride_token;
  kp.k_stride_head = p->k_stride_head;
  kp.v = mla ? p->k : p->v;
  kp.v_stride_page = mla ? p->k_stride_page : p->v_stride_page;
  kp.v_stride_token = mla ? p->k_stride_token : p->v_stride_token;
  kp.v_stride_head = mla ? p->k_stride_head : p->v_stride_head;
  kp.out = p->out;
  kp.out_stride_token = p->out_stride_token;
  kp.out_stride_head = p->out_stride_head;
  kp.lse = p->lse;
  kp.lse_stride_token = p->lse_stride_token;
  kp.lse_stride_head = p->lse_stride_head;
  kp.qo_indptr = p->qo_indptr;
  kp.kv_indptr = p->kv_indptr;
  kp.kv_indices = p->kv_indices;
  kp.kv_len = p->kv_len;
  kp.page_size = p->page_size;
  kp.num_pages = p->num_pages;
  kp.num_kv_rows = p->num_kv_rows;
  kp.tree_mask = p->mask_mode == VA_MASK_TREE ? p->tree_mask : nullptr;
  kp.mask_words = p->mask_mode == VA_MASK_TREE ? p->mask_words : 0;
  kp.causal = p->mask_mode == VA_MASK_CAUSAL ? 1 : 0;
  kp.batch_size = p->batch_size;
  kp.total_q = p->total_q;
  kp.num_qo_heads = p->num_qo_heads;
  kp.num_kv_heads = p->num_kv_heads;
  kp.group = plan.group;
  kp.scale_log2 = kernel_scale_log2(p);
  kp.v_scale = p->v_is_k_prefix == 1 ? p->k_scale : p->v_scale;  // MLA: V is K's first columns
  kp.num_splits = plan.splits;
  kp.split_units = plan.split_units;
  kp.pair_splits = plan.pair_splits ? 1 : 0;
  kp.ws_rows = plan.ws_rows;
  kp.grid_rows_fastest = plan.grid_rows_fastest ? 1 : 0;
  kp.early_a0_release = plan.early_a0_release ? 1 : 0;
  if (plan.workspace_bytes > 0) {
    kp.ws_o = static_cast<float*>(p->workspace);
    kp.ws_lse = reinterpret_cast<float*>(static_cast<char*>(p->workspace) + plan.ws_o_bytes);
  }
  kp.error_word = p->error_word;
  return kp;
}

// Fills `pl` (not yet a handle: va_attention keeps one on its stack) from p:
// validation of everything but the per-run pointers, the plan, the kernel
// parameters' template.
va_status build_plan(const va_params* p, const va_plan_options& opt, bool plan_empty, va_plan* pl);

}  // namespace
}  // namespace verify_attn

// A plan: the request (for the run's checks), the plan, the kernel parameters
// of every run but its own pointers and tensor maps.
struct va_plan {
  verify_attn::Plan plan;
  verify_attn::KernelParams kp;
  int32_t dtype;
  int32_t kv_layout;
  float sm_scale;  // the scores' scale without k_scale (a run's k_scale replaces the plan's)
  bool mla;
  bool has_lse;
  bool empty;
};

namespace verify_attn {
namespace {

// plan_empty: an empty call (nothing to launch) still plans its shape, to
// report the configuration it would use; else it needs no device at all.
va_status build_plan(const va_params* p, const va_plan_options& opt, bool plan_empty, va_plan* pl) {
  VA_RETURN_IF(validate_config(p));
  int forced = -1;
  VA_RETURN_IF(check_plan_options(opt, &forced));
  std::memset(pl, 0, sizeof(*pl));
  pl->dtype = p->dtype;
  pl->kv_layout = p->kv_layout;
  pl->sm_scale = p->sm_scale;
  pl->mla = p->v_is_k_prefix == 1;
  pl->empty = is_empty(p);
  if (pl->empty) {
    if (!plan_empty) return VA_OK;
    // No launch; the plan still checks the options and reports the
    // configuration this shape would use (at least one draft row).
    va_params shape = *p;
    if (shape.max_q_len < 1) shape.max_q_len = 1;
    VA_RETURN_IF(plan_for(&shape, opt, &pl->plan));
    pl->plan.splits = 1;
    pl->plan.split_units = 0;
    pl->plan.pair_splits = false;
    pl->plan.workspace_bytes = 0;
    pl->plan.ws_o_bytes = 0;
    return VA_OK;
  }
  VA_RETURN_IF(validate_batch_ptrs(p));
  if (p->lse != nullptr && !aligned(p->lse, 4))
    return va_fail(VA_ERR_INVALID_STRIDE, "lse: must be 4-byte aligned (got %p)",
                   static_cast<void*>(p->lse));
  VA_RETURN_IF(validate_strides(p));
  VA_RETURN_IF(plan_for(p, opt, &pl->plan));
  pl->has_lse = p->lse != nullptr;
  va_params tmpl = *p;
  tmpl.q = tmpl.k = tmpl.v = nullptr;
  tmpl.out = nullptr;
  tmpl.lse = nullptr;
  tmpl.workspace = nullptr;
  pl->kp = make_kernel_params(&tmpl, pl->plan);
  pl->kp.lse_stride_token = p->lse_stride_token;
  pl->kp.lse_stride_head = p->lse_stride_head;
  return VA_OK;
}

// A run's own KV scales (va_run_args.k_scale / v_scale; 0 keeps the plan's):
// an fp8 plan's scale_log2 and v_scale for this run.
va_status apply_run_scales(const va_plan& pl, const va_run_args* r, KernelParams* kp) {
  if (r->k_scale == 0.f && r->v_scale == 0.f) return VA_OK;
  const va_status st = check_kv_scales(pl.plan.kv_fp8, r->k_scale, r->v_scale, pl.sm_scale, 0.f, "run.");
  if (st != VA_OK) return st;
  if (pl.mla) {  // kp->v_scale holds the plan's k_scale (make_kernel_params)
    const float k_scale = r->k_scale != 0.f ? r->k_scale : kp->v_scale;
    VA_RETURN_IF(check_mla_v_scale(r->v_scale, 0.f, k_scale, "run."));
    kp->scale_log2 = kernel_scale_log2(pl.sm_scale, k_scale);
    kp->v_scale = k_scale;
    return VA_OK;
  }
  if (r->k_scale != 0.f) kp->scale_log2 = kernel_scale_log2(pl.sm_scale, r->k_scale);
  if (r->v_scale != 0.f) kp->v_scale = r->v_scale;
  return VA_OK;
}

va_status run_plan(const va_plan* pl, const va_run_args* r) {
  if (pl->empty) return va_ok();
  VA_RETURN_IF(validate_run_ptrs(pl->mla, r->q, r->k, r->v, r->out, r->lse));
  if (r->lse != nullptr && !pl->has_lse)
    return va_fail(VA_ERR_INVALID_VALUE,
                   "lse: the plan was made without lse (create it with an lse to get one)");
  const Plan& plan = pl->plan;
  if (plan.workspace_bytes > 0) {
    if (r->workspace == nullptr)
      return va_fail(VA_ERR_WORKSPACE, "workspace: NULL but %zu bytes are needed (%d splits)",
                     plan.workspace_bytes, plan.splits);
    if (!aligned(r->workspace, 16))
      return va_fail(VA_ERR_WORKSPACE, "workspace: must be 16-byte aligned (got %p)",
                     r->workspace);
    if (r->workspace_bytes < plan.workspace_bytes)
      return va_fail(VA_ERR_WORKSPACE, "workspace_bytes: %zu needed (got %zu)",
                     plan.workspace_bytes, r->workspace_bytes);
  }
  KernelParams kp = pl->kp;
  VA_RETURN_IF(apply_run_scales(*pl, r, &kp));
  kp.q = r->q;
  kp.k = r->k;
  kp.v = pl->mla ? r->k : r->v;
  kp.out = r->out;
  kp.lse = r->lse;
  if (plan.workspace_bytes > 0) {
    kp.ws_o = static_cast<float*>(r->workspace);
    kp.ws_lse = reinterpret_cast<float*>(static_cast<char*>(r->workspace) + plan.ws_o_bytes);
  }
  const va_status st = pl->kv_layout == VA_KV_PAGED
                           ? launch_paged(kp, plan, pl->dtype, r->stream)
                           : launch_flat(kp, plan, pl->dtype, r->stream);
  if (st != VA_OK) return st;
  return va_ok();
}

void fill_info(const va_plan& pl, va_config_info* info) {
  const Plan& plan = pl.plan;
  const ConfigDesc& d = config_desc(plan.config);
  std::snprintf(info->name, sizeof(info->name), "%s", plan.name);
  info->tile_m = d.m;
  info->tile_n = d.n;
  info->num_warps = d.warps;
  info->num_stages = d.stages;
  info->num_splits = plan.splits;
  info->smem_bytes = d.smem_bytes;
  info->sm_arch = plan.dev.sm_arch;
  info->workspace_bytes = plan.workspace_bytes;
  info->k_tma = d.k_tma ? 1 : 0;
  info->q_tma = plan.q_tma ? 1 : 0;
  info->o_tma = plan.o_tma ? 1 : 0;
  info->grid_rows_fastest = plan.grid_rows_fastest ? 1 : 0;
  info->split_units = plan.split_units;
  info->pair_splits = plan.pair_splits ? 1 : 0;
}

}  // namespace
}  // namespace verify_attn

using namespace verify_attn;

extern "C" void va_plan_options_init(va_plan_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(va_plan_options);
}

extern "C" void va_run_args_init(va_run_args* r) {
  if (r == nullptr) return;
  std::memset(r, 0, sizeof(*r));
  r->struct_size = sizeof(va_run_args);
}

extern "C" va_status va_plan_create(const va_params* p, const va_plan_options* options,
                                    va_plan** plan) {
  if (plan == nullptr) return va_fail(VA_ERR_NULL_POINTER, "plan: NULL");
  *plan = nullptr;
  // The size first: a caller's smaller struct must not be read past its end.
  if (options != nullptr && options->struct_size != sizeof(va_plan_options))
    return va_fail(VA_ERR_VERSION, "options.struct_size: expected %u (sizeof(va_plan_options)) (got %u)",
                   static_cast<unsigned>(sizeof(va_plan_options)), options->struct_size);
  const va_plan_options opt = options != nullptr ? *options : default_options();
  va_plan* pl = new (std::nothrow) va_plan;
  if (pl == nullptr) return va_fail(VA_ERR_INVALID_VALUE, "plan: out of host memory");
  const va_status st = build_plan(p, opt, /*plan_empty=*/true, pl);
  if (st != VA_OK) {
    delete pl;
    return st;
  }
  *plan = pl;
  return va_ok();
}

extern "C" va_status va_plan_run(const va_plan* plan, const va_run_args* run) {
  if (plan == nullptr) return va_fail(VA_ERR_NULL_POINTER, "plan: NULL");
  if (run == nullptr) return va_fail(VA_ERR_NULL_POINTER, "run: NULL");
  if (run->struct_size != sizeof(va_run_args))
    return va_fail(VA_ERR_VERSION, "run.struct_size: expected %u (sizeof(va_run_args)) (got %u)",
                   static_cast<unsigned>(sizeof(va_run_args)), run->struct_size);
  return run_plan(plan, run);
}

extern "C" void va_plan_destroy(va_plan* plan) { delete plan; }

extern "C" va_status va_plan_info(const va_plan* plan, va_config_info* info) {
  if (info == nullptr) return va_fail(VA_ERR_NULL_POINTER, "info: NULL");
  std::memset(info, 0, sizeof(*info));
  if (plan == nullptr) return va_fail(VA_ERR_NULL_POINTER, "plan: NULL");
  fill_info(*plan, info);
  return va_ok();
}

extern "C" va_status va_workspace_size(const va_params* p, size_t* bytes) {
  if (bytes == nullptr) return va_fail(VA_ERR_NULL_POINTER, "bytes: NULL");
  *bytes = 0;
  va_plan pl;
  VA_RETURN_IF(build_plan(p, default_options(), /*plan_empty=*/false, &pl));
  *bytes = pl.plan.workspace_bytes;
  return va_ok();
}

extern "C" va_status va_query_config(const va_params* p, va_config_info* info) {
  if (info == nullptr) return va_fail(VA_ERR_NULL_POINTER, "info: NULL");
  std::memset(info, 0, sizeof(*info));
  va_plan pl;
  VA_RETURN_IF(build_plan(p, default_options(), /*plan_empty=*/true, &pl));
  fill_info(pl, info);
  return va_ok();
}

extern "C" va_status va_attention(const va_params* p) {
  // The call's own pointers first: a bad one fails before the device is asked.
  VA_RETURN_IF(validate_config(p));
  if (!is_empty(p))
    VA_RETURN_IF(validate_run_ptrs(p->v_is_k_prefix == 1, p->q, p->k, p->v, p->out, p->lse));
  va_plan pl;
  VA_RETURN_IF(build_plan(p, default_options(), /*plan_empty=*/false, &pl));
  va_run_args r;
  va_run_args_init(&r);
  r.q = p->q;
  r.k = p->k;
  r.v = p->v;
  r.out = p->out;
  r.lse = p->lse;
  r.workspace = p->workspace;
  r.workspace_bytes = p->workspace_bytes;
  r.stream = p->stream;
  return run_plan(&pl, &r);
}
