/* C-ABI tests in plain C (so the header is proven usable from C): every bad
 * parameter struct gets the right status and a message that names the field,
 * and nothing is launched. No GPU needed: validation precedes any device use.
 * The valid baseline is only sent to va_workspace_size, never to va_attention
 * (its pointers are fake). */
#include <stdio.h>
#include <string.h>

#include "kernels/verify_attn.h"

static int g_passed = 0, g_failed = 0;

#define FAKE(addr) ((void*)(uintptr_t)(addr))

static void expect(const char* name, va_status got, va_status want, const char* field) {
  const char* msg = va_last_error_message();
  int ok = got == want && (field == NULL || strncmp(msg, field, strlen(field)) == 0);
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    printf("FAIL %s: got %s \"%s\", want %s starting \"%s\"\n", name, va_status_name(got), msg,
           va_status_name(want), field ? field : "");
  }
}

/* A valid MLA paged call: B=2, 16 heads, q_len <= 16, page_size 1. */
static va_params valid_mla(void) {
  va_params p;
  va_params_init(&p);
  p.dtype = VA_DTYPE_BF16;
  p.kv_layout = VA_KV_PAGED;
  p.mask_mode = VA_MASK_TREE;
  p.batch_size = 2;
  p.total_q = 20;
  p.max_q_len = 16;
  p.max_kv_len = 4096;
  p.num_qo_heads = 16;
  p.num_kv_heads = 1;
  p.head_dim_qk = 576;
  p.head_dim_vo = 512;
  p.v_is_k_prefix = 1;
  p.sm_scale = 0.0417f;
  p.q = FAKE(0x10000);
  p.q_stride_token = 16 * 576;
  p.q_stride_head = 576;
  p.k = FAKE(0x20000);
  p.k_stride_page = 576;
  p.k_stride_token = 576;
  p.k_stride_head = 576;
  p.out = FAKE(0x30000);
  p.out_stride_token = 16 * 512;
  p.out_stride_head = 512;
  p.qo_indptr = (const int32_t*)FAKE(0x40000);
  p.kv_indptr = (const int32_t*)FAKE(0x40100);
  p.kv_indices = (const int32_t*)FAKE(0x40200);
  p.kv_len = (const int32_t*)FAKE(0x40300);
  p.page_size = 1;
  p.num_pages = 100000;
  p.tree_mask = (const uint32_t*)FAKE(0x50000);
  p.mask_words = 1;
  return p;
}

int main(void) {
  va_params p;
  size_t bytes = 123;
  va_status s;

  /* The valid struct passes validation; what comes next depends on the device. */
  p = valid_mla();
  s = va_workspace_size(&p, &bytes);
  if (s == VA_OK || s == VA_ERR_NO_DEVICE) {
    ++g_passed;
  } else {
    ++g_failed;
    printf("FAIL valid: %s %s\n", va_status_name(s), va_last_error_message());
  }

#define CASE(label, mutate, want, field) \
  do {                                   \
    p = valid_mla();                     \
    mutate;                              \
    expect(label, va_attention(&p), want, field); \
  } while (0)

  expect("null params", va_attention(NULL), VA_ERR_NULL_POINTER, "params");
  expect("null bytes", va_workspace_size(&p, NULL), VA_ERR_NULL_POINTER, "bytes");
  CASE("struct_size", p.struct_size = 8, VA_ERR_VERSION, "struct_size");
  CASE("abi_version", p.abi_version = 99, VA_ERR_VERSION, "abi_version");
  CASE("dtype", p.dtype = 7, VA_ERR_INVALID_DTYPE, "dtype");
  CASE("kv_layout", p.kv_layout = 3, VA_ERR_INVALID_VALUE, "kv_layout");
  CASE("kv_slot_runs", p.kv_slot_runs = -64, VA_ERR_INVALID_VALUE, "kv_slot_runs");
  CASE("kv_slot_runs flat", (p.kv_layout = VA_KV_FLAT, p.num_kv_rows = 64, p.kv_slot_runs = 64),
       VA_ERR_INVALID_VALUE, "kv_slot_runs");
  CASE("mask_mode", p.mask_mode = -1, VA_ERR_INVALID_VALUE, "mask_mode");
  CASE("batch_size", p.batch_size = -1, VA_ERR_INVALID_VALUE, "batch_size");
  CASE("total_q", p.total_q = -5, VA_ERR_INVALID_VALUE, "total_q");
  CASE("max_q_len 0", p.max_q_len = 0, VA_ERR_INVALID_VALUE, "max_q_len");
  CASE("max_q_len 1025", (p.max_q_len = 1025, p.mask_words = 33), VA_ERR_INVALID_VALUE, "max_q_len");
  CASE("num_qo_heads", p.num_qo_heads = 0, VA_ERR_INVALID_VALUE, "num_qo_heads");
  CASE("mla heads 129", p.num_qo_heads = 129, VA_ERR_UNSUPPORTED, "num_qo_heads");
  CASE("mla dims", p.head_dim_qk = 512, VA_ERR_UNSUPPORTED, "head_dim_qk");
  CASE("mla kv heads", p.num_kv_heads = 2, VA_ERR_UNSUPPORTED, "num_kv_heads");
  CASE("gqa dims", (p.v_is_k_prefix = 0, p.head_dim_qk = 96, p.head_dim_vo = 96),
       VA_ERR_UNSUPPORTED, "head_dim_qk");
  CASE("gqa dv != dqk", (p.v_is_k_prefix = 0, p.head_dim_qk = 128, p.head_dim_vo = 64),
       VA_ERR_UNSUPPORTED, "head_dim_vo");
  CASE("gqa ratio", (p.v_is_k_prefix = 0, p.head_dim_qk = 128, p.head_dim_vo = 128,
                     p.num_qo_heads = 12, p.num_kv_heads = 5),
       VA_ERR_INVALID_VALUE, "num_qo_heads");
  CASE("gqa group 32", (p.v_is_k_prefix = 0, p.head_dim_qk = 128, p.head_dim_vo = 128,
                        p.num_qo_heads = 32, p.num_kv_heads = 1),
       VA_ERR_UNSUPPORTED, "num_qo_heads");
  CASE("sm_scale 0", p.sm_scale = 0.0f, VA_ERR_INVALID_VALUE, "sm_scale");
  CASE("sm_scale nan", p.sm_scale = 0.0f / 0.0f, VA_ERR_INVALID_VALUE, "sm_scale");
  CASE("page_size", p.page_size = 0, VA_ERR_INVALID_VALUE, "page_size");
  CASE("num_pages", p.num_pages = 0, VA_ERR_INVALID_VALUE, "num_pages");
  CASE("mask_words", (p.max_q_len = 64, p.mask_words = 1), VA_ERR_INVALID_VALUE, "mask_words");
  CASE("num_splits", p.num_splits = -2, VA_ERR_INVALID_VALUE, "num_splits");
  CASE("q null", p.q = NULL, VA_ERR_NULL_POINTER, "q");
  CASE("k null", p.k = NULL, VA_ERR_NULL_POINTER, "k");
  CASE("out null", p.out = NULL, VA_ERR_NULL_POINTER, "out");
  CASE("qo_indptr null", p.qo_indptr = NULL, VA_ERR_NULL_POINTER, "qo_indptr");
  CASE("kv_indptr null", p.kv_indptr = NULL, VA_ERR_NULL_POINTER, "kv_indptr");
  CASE("kv_indices null", p.kv_indices = NULL, VA_ERR_NULL_POINTER, "kv_indices");
  CASE("kv_len null", p.kv_len = NULL, VA_ERR_NULL_POINTER, "kv_len");
  CASE("tree_mask null", p.tree_mask = NULL, VA_ERR_NULL_POINTER, "tree_mask");
  CASE("v mismatch", p.v = FAKE(0x60000), VA_ERR_INVALID_VALUE, "v");
  CASE("gqa v null", (p.v_is_k_prefix = 0, p.head_dim_qk = 128, p.head_dim_vo = 128),
       VA_ERR_NULL_POINTER, "v");
  CASE("q misaligned", p.q = FAKE(0x10008), VA_ERR_INVALID_STRIDE, "q");
  CASE("q stride", p.q_stride_token = 577, VA_ERR_INVALID_STRIDE, "q_stride_token");
  CASE("k stride", p.k_stride_token = -8, VA_ERR_INVALID_STRIDE, "k_stride_token");
  CASE("out stride", p.out_stride_head = 4, VA_ERR_INVALID_STRIDE, "out_stride_head");
  /* outputs whose strides map two elements to one address */
  CASE("out rows overlap", p.out_stride_token = 0, VA_ERR_INVALID_STRIDE, "out_stride_token");
  CASE("out heads overlap", p.out_stride_head = 256, VA_ERR_INVALID_STRIDE, "out_stride_head");
  CASE("out token and head strides equal", (p.out_stride_token = 512, p.out_stride_head = 512),
       VA_ERR_INVALID_STRIDE, "out_stride_head");
  CASE("lse rows overlap",
       (p.lse = (float*)FAKE(0x70000), p.lse_stride_token = 0, p.lse_stride_head = 1),
       VA_ERR_INVALID_STRIDE, "lse_stride_token");
  CASE("out strides past int64", p.out_stride_token = (int64_t)1 << 62, VA_ERR_INVALID_STRIDE,
       "out_stride_token");
  CASE("sm_scale overflow", p.sm_scale = 3.0e38f, VA_ERR_INVALID_VALUE, "sm_scale");
  CASE("num_splits 65536", p.num_splits = 65536, VA_ERR_INVALID_VALUE, "num_splits");
  /* fp8 caches: the dtype code, the scales, strides in 16-byte units of 1-byte elements */
  CASE("kv_dtype", p.kv_dtype = 5, VA_ERR_INVALID_DTYPE, "kv_dtype");
  CASE("k_scale without fp8", p.k_scale = 2.0f, VA_ERR_INVALID_VALUE, "k_scale");
  CASE("v_scale without fp8", p.v_scale = 0.5f, VA_ERR_INVALID_VALUE, "v_scale");
  CASE("k_scale 0", (p.kv_dtype = VA_KV_DTYPE_FP8_E4M3, p.k_scale = 0.0f), VA_ERR_INVALID_VALUE, "k_scale");
  CASE("v_scale nan", (p.kv_dtype = VA_KV_DTYPE_FP8_E4M3, p.v_scale = 0.0f / 0.0f), VA_ERR_INVALID_VALUE,
       "v_scale");
  CASE("k_scale overflow", (p.kv_dtype = VA_KV_DTYPE_FP8_E4M3, p.sm_scale = 1.0e3f, p.k_scale = 1.0e36f), VA_ERR_INVALID_VALUE,
       "k_scale");
  CASE("mla v_scale not k_scale", (p.kv_dtype = VA_KV_DTYPE_FP8_E4M3, p.k_scale = 0.5f, p.v_scale = 0.25f),
       VA_ERR_INVALID_VALUE, "v_scale");
  CASE("fp8 k stride", (p.kv_dtype = VA_KV_DTYPE_FP8_E4M3, p.k_stride_token = 584), VA_ERR_INVALID_STRIDE,
       "k_stride_token");
  /* head-major outputs ([H, T, D] in memory) are fine: validation passes,
     then it depends on the device */
  p = valid_mla();
  p.out_stride_head = 20 * 512;
  p.out_stride_token = 512;
  p.lse = (float*)FAKE(0x70000);
  p.lse_stride_head = 20;
  p.lse_stride_token = 1;
  s = va_workspace_size(&p, &bytes);
  if (s == VA_OK || s == VA_ERR_NO_DEVICE) {
    ++g_passed;
  } else {
    ++g_failed;
    printf("FAIL head-major out/lse: %s %s\n", va_status_name(s), va_last_error_message());
  }

  /* Empty work is valid and launches nothing (no device needed). */
  p = valid_mla();
  p.total_q = 0;
  p.q = NULL;
  expect("empty", va_attention(&p), VA_OK, NULL);

  /* Plan handles: NULL arguments, struct sizes, a bad request, bad options
   * (all before any device use), destroy(NULL). */
  {
    va_plan* plan = (va_plan*)FAKE(0x1);
    va_plan_options o;
    va_run_args r;
    va_config_info info;
    p = valid_mla();
    expect("plan_create NULL out", va_plan_create(&p, NULL, NULL), VA_ERR_NULL_POINTER, "plan");
    p.sm_scale = -1.f;
    expect("plan_create bad sm_scale", va_plan_create(&p, NULL, &plan), VA_ERR_INVALID_VALUE,
           "sm_scale");
    expect("plan_create leaves NULL", plan == NULL ? VA_OK : VA_ERR_INVALID_VALUE, VA_OK, NULL);
    p = valid_mla();
    va_plan_options_init(&o);
    o.struct_size = 4;
    expect("plan_create options size", va_plan_create(&p, &o, &plan), VA_ERR_VERSION,
           "options.struct_size");
    va_plan_options_init(&o);
    o.q_tma = 7;
    expect("plan_create bad q_tma", va_plan_create(&p, &o, &plan), VA_ERR_INVALID_VALUE,
           "options.q_tma");
    va_plan_options_init(&o);
    strcpy(o.config, "mla_nope");
    expect("plan_create unknown config", va_plan_create(&p, &o, &plan), VA_ERR_INVALID_VALUE,
           "options.config");
    p = valid_mla();
    p.qo_indptr = NULL;
    expect("plan_create NULL qo_indptr", va_plan_create(&p, NULL, &plan), VA_ERR_NULL_POINTER,
           "qo_indptr");
    p = valid_mla();
    p.q = NULL; /* per-run pointers may be NULL at creation */
    p.k = NULL;
    p.out = NULL;
    {
      const va_status s2 = va_plan_create(&p, NULL, &plan);
      expect("plan_create NULL q/k/out", s2 == VA_OK || s2 == VA_ERR_NO_DEVICE ? VA_OK : s2, VA_OK, NULL);
      if (s2 == VA_OK) va_plan_destroy(plan);
    }
    va_run_args_init(&r);
    expect("plan_run NULL plan", va_plan_run(NULL, &r), VA_ERR_NULL_POINTER, "plan");
    expect("plan_info NULL plan", va_plan_info(NULL, &info), VA_ERR_NULL_POINTER, "plan");
    expect("plan_info NULL info", va_plan_info((va_plan*)FAKE(0x10), NULL), VA_ERR_NULL_POINTER,
           "info");
    va_plan_destroy(NULL);
  }

  /* va_verify_metadata: each bad argument is refused before any launch. */
  {
    va_verify_metadata_args a;
#define META_CASE(label, mutate, want, field)                       \
  do {                                                              \
    va_verify_metadata_args_init(&a);                               \
    a.batch = 2;                                                    \
    a.real_batch = 2;                                               \
    a.num_drafts = 4;                                               \
    a.prefix_len = FAKE(0x1000);                                    \
    a.draft_slots = FAKE(0x2000);                                   \
    a.qo_indptr = (int32_t*)FAKE(0x3000);                           \
    a.kv_indptr = (int32_t*)FAKE(0x4000);                           \
    a.kv_len = (int32_t*)FAKE(0x5000);                              \
    a.kv_indices = (int32_t*)FAKE(0x6000);                          \
    a.kv_indices_capacity = 100;                                    \
    mutate;                                                         \
    expect("verify_metadata " label, va_verify_metadata(&a), want, field); \
  } while (0)
    expect("verify_metadata NULL args", va_verify_metadata(NULL), VA_ERR_NULL_POINTER, "args");
    META_CASE("struct_size", a.struct_size = 8, VA_ERR_VERSION, "args.struct_size");
    META_CASE("batch", a.batch = -1, VA_ERR_INVALID_VALUE, "batch");
    META_CASE("real_batch", a.real_batch = 3, VA_ERR_INVALID_VALUE, "real_batch");
    META_CASE("num_drafts 0", a.num_drafts = 0, VA_ERR_INVALID_VALUE, "num_drafts");
    META_CASE("num_drafts 1025", a.num_drafts = 1025, VA_ERR_INVALID_VALUE, "num_drafts");
    META_CASE("rows", (a.batch = a.real_batch = 1 << 30), VA_ERR_INVALID_VALUE, "batch * num_drafts");
    META_CASE("capacity", a.kv_indices_capacity = -1, VA_ERR_INVALID_VALUE, "kv_indices_capacity");
    META_CASE("qo_indptr", a.qo_indptr = NULL, VA_ERR_NULL_POINTER, "qo_indptr");
    META_CASE("kv_indptr", a.kv_indptr = NULL, VA_ERR_NULL_POINTER, "kv_indptr");
    META_CASE("prefix_len", a.prefix_len = NULL, VA_ERR_NULL_POINTER, "prefix_len");
    META_CASE("kv_len", a.kv_len = NULL, VA_ERR_NULL_POINTER, "kv_len");
    META_CASE("kv_indices", a.kv_indices = NULL, VA_ERR_NULL_POINTER, "kv_indices");
    META_CASE("draft_slots", a.draft_slots = NULL, VA_ERR_NULL_POINTER, "draft_slots");
#undef META_CASE
  }

  /* The configuration tags: comma-separated, the plan's first and last among them. */
  {
    const char* tags = va_config_tags();
    if (tags != NULL && strncmp(tags, "mla_m32n32_s1,", 14) == 0 && strstr(tags, ",mla_wgmma_seesaw_tma") &&
        strstr(tags, ",,") == NULL) {
      ++g_passed;
    } else {
      ++g_failed;
      printf("FAIL va_config_tags: \"%s\"\n", tags ? tags : "(null)");
    }
  }

  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
