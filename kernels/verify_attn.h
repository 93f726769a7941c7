/*
 * verify_attn C-ABI: attention for the verify step of tree speculative decoding.
 *
 * Plain C (C99) header, usable from C, C++ and ctypes. Every entry point
 * validates what it can without reading device memory and returns a status;
 * on any status other than VA_OK nothing was launched, and
 * va_last_error_message() (thread-local) names the offending field.
 *
 * Semantics (one definition for the flat and the paged KV layouts):
 *   Request i has q_len_i = qo_indptr[i+1] - qo_indptr[i] draft (query) rows and
 *   kv_len_i KV rows. The LAST q_len_i KV rows are the draft tokens themselves,
 *   in query-row order; the first prefix_len_i = kv_len_i - q_len_i are the
 *   committed prefix. Query row t (0-based within the request) sees every
 *   prefix row, and draft row c iff
 *     mask_mode == VA_MASK_TREE:   bit (c % 32) of word (c / 32) of
 *                                  tree_mask[(qo_indptr[i] + t) * mask_words + .]
 *                                  (little-endian bit order inside each uint32);
 *     mask_mode == VA_MASK_CAUSAL: c <= t (a chain; tree_mask unused).
 *   out[t, h, :] = softmax(sm_scale * q[t,h,:D_qk] . k[j,hk,:D_qk]) @ v[j,hk,:D_v]
 *   over visible j, fp32 accumulation; hk = h / (num_qo_heads / num_kv_heads).
 *   lse[t, h] = natural-log log-sum-exp of the scaled logits (FlashAttention and
 *   FlashMLA convention, NOT FlashInfer's base 2). A row that sees nothing
 *   (impossible for valid trees: every row sees itself) gets out = 0, lse = -inf.
 *
 * Layouts:
 *   MLA (absorbed): num_kv_heads = 1, head_dim_qk = 576, head_dim_vo = 512,
 *     v_is_k_prefix = 1: the value is the first head_dim_vo values of the K row
 *     (v must be NULL or equal to k).
 *   MHA/GQA: head_dim_qk == head_dim_vo in {64, 128, 256}, num_qo_heads a multiple
 *     of num_kv_heads (group 1..16), separate K and V.
 *   Flat KV  (VA_KV_FLAT):  KV row j of request i is at element offset
 *     (kv_indptr[i] + j) * k_stride_token + hk * k_stride_head; kv_len_i =
 *     kv_indptr[i+1] - kv_indptr[i].
 *   Paged KV (VA_KV_PAGED): the cache holds num_pages pages of page_size slots;
 *     KV row j of request i lives in page p = kv_indices[kv_indptr[i] + j / page_size]
 *     at slot s = j % page_size: element offset p * k_stride_page +
 *     s * k_stride_token + hk * k_stride_head. kv_len_i = kv_len[i].
 *     Every page named by kv_indices must be whole (page_size slots): with
 *     page_size a multiple of 64 the sm_90 kernel copies 64-slot blocks of a
 *     page, including the slots past kv_len_i in a request's last page (their
 *     values are zeroed in shared memory, never used). Likewise it reads up to
 *     63 rows past a request's last row in a flat cache, and in a page_size 1
 *     cache planned with kv_slot_runs (the rows that follow it in the cache,
 *     never past the cache's end).
 *   All strides are in ELEMENTS; the last dimension of q, k, v, out must be
 *   contiguous (stride 1) and 16-byte aligned.
 *
 * All index arrays (qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask) are
 * DEVICE pointers. Host-side bounds used for planning (max_q_len, max_kv_len)
 * must be upper bounds of the device values.
 */
#ifndef VERIFY_ATTN_H_
#define VERIFY_ATTN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VA_ABI_VERSION 7  /* 3: plan handles (va_plan_*), va_plan_options, va_run_args; 4: va_verify_metadata;
                             5: va_params.kv_dtype, k_scale, v_scale, va_run_args.k_scale, v_scale (fp8 caches);
                             6: va_plan_options.balance_splits, va_config_info.split_units;
                             7: va_plan_options.pair_splits, va_config_info.pair_splits */

typedef enum va_status {
  VA_OK = 0,
  VA_ERR_NULL_POINTER = 1,     /* a required pointer is NULL */
  VA_ERR_INVALID_VALUE = 2,    /* a size/count/flag out of its range */
  VA_ERR_INVALID_DTYPE = 3,    /* dtype not fp16/bf16, kv_dtype not a va_kv_dtype */
  VA_ERR_INVALID_STRIDE = 4,   /* stride/alignment not supported */
  VA_ERR_UNSUPPORTED = 5,      /* valid but not built (head dim, arch, no config fits) */
  VA_ERR_WORKSPACE = 6,        /* workspace NULL or too small */
  VA_ERR_VERSION = 7,          /* struct_size / abi_version mismatch */
  VA_ERR_NO_DEVICE = 8,        /* no CUDA device / driver */
  VA_ERR_CUDA = 9              /* a CUDA runtime call or launch failed */
} va_status;

typedef enum va_dtype { VA_DTYPE_FP16 = 0, VA_DTYPE_BF16 = 1 } va_dtype;
/* Element type of the KV cache: q's dtype, or fp8 e4m3 (1 byte: sign, 4
   exponent bits of bias 7, 3 mantissa bits, no infinities: OCP's E4M3,
   torch.float8_e4m3fn) dequantized inside the kernels with k_scale / v_scale. */
typedef enum va_kv_dtype { VA_KV_DTYPE_AS_Q = 0, VA_KV_DTYPE_FP8_E4M3 = 1 } va_kv_dtype;
typedef enum va_mask_mode { VA_MASK_TREE = 0, VA_MASK_CAUSAL = 1 } va_mask_mode;
typedef enum va_kv_layout { VA_KV_FLAT = 0, VA_KV_PAGED = 1 } va_kv_layout;

/* Parameter struct. Fill with va_params_init() then set fields. */
typedef struct va_params {
  uint32_t struct_size;  /* sizeof(va_params), set by va_params_init */
  uint32_t abi_version;  /* VA_ABI_VERSION, set by va_params_init */

  int32_t dtype;         /* va_dtype of q, k, v, out */
  int32_t kv_layout;     /* va_kv_layout */
  int32_t mask_mode;     /* va_mask_mode */

  int32_t batch_size;    /* B >= 0 requests */
  int32_t total_q;       /* rows of q/out/lse/tree_mask; qo_indptr[0] = 0 and
                            qo_indptr[B] <= total_q (rows past qo_indptr[B]
                            are unused capacity, e.g. a CUDA graph planned for
                            more rows: not computed, their out/lse rows
                            unspecified afterwards) */
  int32_t max_q_len;     /* host upper bound of any q_len_i (<= 1024) */
  int64_t max_kv_len;    /* host upper bound of any kv_len_i (planning) */

  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim_qk;
  int32_t head_dim_vo;
  int32_t v_is_k_prefix; /* 1 = MLA: value = first head_dim_vo of K row */
  float sm_scale;        /* > 0, and sm_scale * log2(e) a finite float */
  int32_t kv_dtype;      /* va_kv_dtype of k and v (VA_KV_DTYPE_AS_Q from
                            va_params_init: dtype). VA_KV_DTYPE_FP8_E4M3: the
                            cache holds K / k_scale and V / v_scale in e4m3,
                            its strides in elements (bytes) a multiple of 16;
                            served for GQA / MHA of head_dim 64 and 128 by the
                            warp-role kernels (sm_90a / sm_120a images), else
                            VA_ERR_UNSUPPORTED */
  float k_scale;         /* fp8 caches: K = k_scale x the stored value; finite,
                            > 0, and sm_scale * k_scale * log2(e) a finite
                            float. 1.0 from va_params_init; other caches: 1.0 */
  float v_scale;         /* the same for V */

  /* q: [total_q, num_qo_heads, head_dim_qk] */
  const void* q;
  int64_t q_stride_token, q_stride_head;
  /* k, v: flat [rows, Hkv, D]; paged [num_pages, page_size, Hkv, D] */
  const void* k;
  int64_t k_stride_page, k_stride_token, k_stride_head;
  const void* v;
  int64_t v_stride_page, v_stride_token, v_stride_head;
  /* out: [total_q, num_qo_heads, head_dim_vo]; strides must give every
     element its own address (checked: VA_ERR_INVALID_STRIDE), as for lse */
  void* out;
  int64_t out_stride_token, out_stride_head;
  /* lse: optional fp32 [total_q, num_qo_heads], natural log */
  float* lse;
  int64_t lse_stride_token, lse_stride_head;

  const int32_t* qo_indptr;  /* [B+1] */
  const int32_t* kv_indptr;  /* [B+1]: flat rows, paged pages */
  const int32_t* kv_indices; /* paged: page ids, [kv_indptr[B]] */
  const int32_t* kv_len;     /* paged: [B] */
  int32_t page_size;         /* paged: >= 1 */
  int64_t num_pages;         /* paged: pages in the cache (bound for indices) */
  int64_t num_kv_rows;       /* flat: rows of k/v (bound for kv_indptr) */
  int32_t kv_slot_runs;      /* paged, page_size 1: a hint, 0 or 1 = none; N > 1
                                (refused for flat caches and page_size > 1):
                                each request's slots mostly come in runs of N
                                consecutive slots from its first KV row (SGLang's
                                token slots of a --page-size N pool). With N a
                                multiple of 64, MLA, and a
                                cache the TMA map can describe (16-byte aligned,
                                page stride == token stride >= 576 elements, a
                                multiple of 16 bytes) the sm_90 plan takes the
                                TMA kernel, which copies each 64-row tile of
                                consecutive slots as bulk tensor copies and
                                gathers the others: any slot layout stays
                                correct, only the speed depends on it */

  const uint32_t* tree_mask; /* VA_MASK_TREE: [total_q, mask_words] */
  int32_t mask_words;        /* >= ceil(max_q_len / 32) */

  int32_t num_splits;        /* 0 = automatic; 1 .. 65535 forces split-K count */
  void* workspace;           /* device scratch, >= va_workspace_size() bytes */
  size_t workspace_bytes;

  int32_t* error_word;       /* optional device int32[4], caller-initialised to
                                {0, -1, 0, 0}; on bad device data the kernels set
                                [0] |= bits (1 bad KV index: the row is never read
                                and the request's rows become NaN -- also a
                                kv_len within 128 of 2^31, position -1; 2 kv_len <
                                q_len: rows NaN; 4 bad qo_indptr / q_len >
                                max_q_len: rows skipped), and the first error
                                wins [1] = request, [2] = the bad value (page id,
                                flat row or kv_len), [3] = KV position j or -1.
                                No host sync: read it when convenient. */

  void* stream;              /* cudaStream_t (NULL = legacy default stream) */
} va_params;

/* Description of the kernel configuration a call would run. */
typedef struct va_config_info {
  char name[64];             /* e.g. "mma_sync_bf16_mla_m32n32_s1", "wgmma_bf16_mla_wgmma_m64n64_pipe_rows" */
  int32_t tile_m;            /* folded query rows per CTA */
  int32_t tile_n;            /* KV rows per tile */
  int32_t num_warps;
  int32_t num_stages;
  int32_t num_splits;        /* split-K count chosen: the most splits of any row (the workspace's) */
  int32_t smem_bytes;        /* dynamic shared memory per block */
  int32_t sm_arch;           /* device major*10+minor */
  size_t workspace_bytes;    /* workspace every run needs (0 when unsplit) */
  int32_t k_tma;             /* 1: K tiles by bulk tensor copies (the sm_90a TMA kernel) */
  int32_t q_tma;             /* 1: Q by a bulk tensor copy (sm_90a MLA kernels) */
  int32_t o_tma;             /* 1: the unsplit output stored by bulk tensor copies */
  int32_t grid_rows_fastest; /* 1: the grid (row tile, request * Hkv + kv head, split) */
  int32_t split_units;       /* 0: every request's row tiles split num_splits ways; else the
                                split CTAs of each (KV head, row tile), shared by the requests
                                in proportion to their KV lengths on the device (balance_splits) */
  int32_t pair_splits;       /* 1: the two splits of each row tile run as one thread-block cluster
                                and combine their rows themselves: no workspace, no merge kernel */
} va_config_info;

void va_params_init(va_params* p);

/* Tuning choices of a plan, for benchmarks, A/B runs and tests: each field at
 * its va_plan_options_init() value leaves the choice to the plan's rules
 * (kernels/plan.cc). The library reads no environment variable to choose a
 * kernel: these are the only overrides. */
typedef enum va_switch { VA_AUTO = 0, VA_ON = 1, VA_OFF = 2 } va_switch;
typedef enum va_grid_order {
  VA_GRID_AUTO = 0,     /* the plan's rule (a request's row tiles adjacent on the sm_90a MLA kernels) */
  VA_GRID_ROWS = 1,     /* (row tile, request * Hkv + kv head, split) where the kernel can run it */
  VA_GRID_REQUESTS = 2  /* (request * Hkv + kv head, row tile, split) everywhere */
} va_grid_order;
typedef struct va_plan_options {
  uint32_t struct_size;  /* sizeof(va_plan_options), set by va_plan_options_init */
  /* "" = the plan's choice; else a tag of va_config_tags(): that configuration
     when it serves the call (its kind, head dims, arch, cache layout and the
     shared memory) and the plan's choice otherwise; a tag that names no
     configuration is VA_ERR_INVALID_VALUE. va_plan_info names what runs. */
  char config[48];
  int32_t grid_order;     /* va_grid_order */
  int32_t early_release;  /* va_switch: the TMA kernel's early refill of stage 0 blocks 0-3 */
  int32_t q_tma;          /* va_switch: VA_OFF = Q by cp.async on the sm_90a MLA kernels */
  int32_t o_tma;          /* va_switch: VA_OFF = the unsplit output stored from registers */
  int32_t max_smem_bytes; /* 0 = the device's; else plan as if the device had at most this
                             much shared memory per block (101376: sm_120's configuration
                             choice, measurable on an sm_90 card) */
  int32_t balance_splits; /* va_switch: how an automatic split-K count is spread over a batch
                             of several requests. VA_ON: where the kernel can (the portable
                             warp-role GQA kernels, 2 to 32 requests), the plan's requests x
                             splits CTAs of each (KV head, row tile) go to the requests by
                             their device KV lengths, each split of a request taking at most
                             the same number of KV tiles (a long request gets more splits, a
                             short one fewer; FlashInfer's split-KV planning does this on the
                             host); VA_AUTO: so where, besides, a split of max_kv_len would
                             hold 8 KV tiles or more (below that the allocation costs more
                             than it can save); VA_OFF: every request splits its KV range
                             num_splits ways. A forced num_splits never balances. */
  int32_t pair_splits;    /* va_switch: VA_AUTO / VA_ON: where a call splits in two (the plan's
                             count or a forced num_splits = 2) on the 16-row GQA warp-role
                             kernels of an sm_90+ device (not over an fp8 cache), the two split
                             CTAs of each row tile run as one thread-block cluster and combine
                             their rows in distributed shared memory (no workspace, no merge
                             kernel), before balanced splits unless balance_splits is VA_ON;
                             VA_OFF: fp32 partial rows and the merge kernel. */
} va_plan_options;

void va_plan_options_init(va_plan_options* o);

/* A plan: everything a call decides on the host (validation, the kernel, the
 * split-K count, the workspace, the tensor-map choices), made once per batch
 * and run once per layer. Create it from a va_params that describes the batch
 * (indices, lengths, mask, heads, dims, dtype, page size, bounds) and the
 * layout every run keeps (the strides of q, k, v, out, lse and the cache's
 * num_pages / num_kv_rows). Its pointers q, k, v, out, lse, workspace and
 * stream may be NULL at creation: each run passes its own (va_run_args). The
 * index pointers (qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask) and
 * error_word are bound at creation: update their contents, not their address.
 * lse: a plan created with lse == NULL never writes one; with a non-NULL lse
 * (any 4-byte aligned address: only its strides are kept) every run may pass
 * an lse or NULL. The handle is the caller's: va_plan_destroy frees it. A plan
 * may be run from several threads at once (va_plan_run reads it only). */
typedef struct va_plan va_plan;

/* Per-layer arguments of va_plan_run: device pointers with the plan's strides
 * (16-byte aligned q, k, v, out; 4-byte aligned lse), the workspace (at least
 * va_config_info.workspace_bytes, 16-byte aligned, NULL when that is 0) and the
 * stream (cudaStream_t, NULL = the legacy default stream). MLA: v NULL or == k. */
typedef struct va_run_args {
  uint32_t struct_size;  /* sizeof(va_run_args), set by va_run_args_init */
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  void* workspace;
  size_t workspace_bytes;
  void* stream;
  /* A plan for an fp8 cache: this run's scales (a model's layers each have
     their own), finite and > 0; 0 (va_run_args_init): the plan's, from
     va_params. Any other plan: both 0. */
  float k_scale;
  float v_scale;
} va_run_args;

void va_run_args_init(va_run_args* r);

/* Validate p (as va_attention does, but its per-run pointers may be NULL),
 * plan it on the current device with `options` (NULL = defaults) and return
 * the handle in *plan (NULL on failure). No device memory is read, nothing is
 * launched; the empty call (batch_size 0 or total_q 0) gives a plan whose runs
 * launch nothing. The plan is for the device current at creation: run it with
 * that device current. */
va_status va_plan_create(const va_params* p, const va_plan_options* options, va_plan** plan);

/* Launch one call of the plan on run->stream: no planning, no allocation, no
 * host synchronization (graph-capturable). Checks only the run's pointers
 * (NULL, alignment, the MLA value rule) and the workspace. */
va_status va_plan_run(const va_plan* plan, const va_run_args* run);

/* NULL is a no-op. */
void va_plan_destroy(va_plan* plan);

/* Bytes of workspace the call described by p needs (0 when unsplit). Like
 * va_query_config, it validates what va_plan_create does (the index and mask
 * pointers, the strides), without the per-run pointers q, k, v, out. */
va_status va_workspace_size(const va_params* p, size_t* bytes);

/* Which configuration va_attention would run for p on the current device. */
va_status va_query_config(const va_params* p, va_config_info* info);

/* What the plan runs (the same fields as va_query_config; num_splits 1 for an
 * empty plan). */
va_status va_plan_info(const va_plan* plan, va_config_info* info);

/* Launch on p->stream. Asynchronous; no host synchronization. On sm_90 the MLA
 * kernels are programmatic dependent launches (CUDA Programming Guide,
 * "Programmatic Dependent Launch"): they may be scheduled before the previous
 * kernel of the stream ends but read and write memory only after it completed,
 * and they let the next programmatic dependent launch of the stream start
 * before their own results are written; such a kernel must, as PDL requires,
 * call cudaGridDependencySynchronize() before reading them. Ordinary launches
 * and host synchronization see the usual stream order. */
va_status va_attention(const va_params* p);

/* The per-batch metadata of a uniform verify batch in one launch: B requests,
 * each with a committed prefix of prefix_len[r] cache rows and N draft tokens
 * whose K/V are already in the cache at draft_slots[r * N + t] (the layout of
 * SGLang's target verify: qo rows request-major, the drafts after the prefix).
 * Writes, on `stream`:
 *   qo_indptr[B + 1]  = r * N;
 *   kv_indptr[B + 1]  = exclusive cumsum of prefix_len[r] + N;
 *   kv_len[B]         = prefix_len[r] + N;
 *   kv_indices[kv_indptr[r] + prefix_len[r] + t] = draft_slots[r * N + t]
 *                       (page_size 1 slots); the prefix entries
 *                       kv_indices[kv_indptr[r] .. + prefix_len[r]) are left to
 *                       the caller (an engine's own request-to-slot gather,
 *                       which takes kv_indptr as its row starts);
 *   tree_mask[B * N, ceil(N / 32)] (when not NULL): bit c % 32 of word c / 32
 *                       of row r * N + t set when draft_mask[(r * N + t) * N + c]
 *                       is nonzero (SGLang's QLEN_ONLY layout, one byte per
 *                       entry); the rows of requests r >= real_batch and all
 *                       rows when draft_mask is NULL are causal (c <= t).
 * Requests r >= real_batch (padding of a captured batch) take pad_slot as
 * every draft slot. Device data is checked as it is read: a negative
 * prefix_len, a draft slot outside int32 or rows past kv_indices_capacity
 * (or past 2^31) set bit 8 of error_word (when not NULL; the layout of
 * va_params.error_word) and leave those kv_indices entries unwritten; the
 * indptr and kv_len then count a negative prefix as 0 and one past 2^31 - 1
 * as 2^31 - 1 (indptr entries past 2^31 - 1 read 2^31 - 1). Which offending
 * request error_word[1] names is the first to report, not necessarily the
 * lowest. No host synchronization. */
typedef struct va_verify_metadata_args {
  uint32_t struct_size;        /* sizeof(va_verify_metadata_args) */
  int32_t batch;               /* B >= 0 */
  int32_t real_batch;          /* requests draft_slots / draft_mask cover, 0 <= real_batch <= B */
  int32_t num_drafts;          /* N, 1 <= N <= 1024 */
  const void* prefix_len;      /* [B], int32 or int64 (prefix_len_int64 = 1) */
  int32_t prefix_len_int64;
  const void* draft_slots;     /* [real_batch * N], int32 or int64 (draft_slots_int64 = 1) */
  int32_t draft_slots_int64;
  int32_t pad_slot;            /* the slot of every padded request's drafts */
  const uint8_t* draft_mask;   /* NULL (causal) or [real_batch * N * N] bytes */
  int32_t* qo_indptr;          /* [B + 1] */
  int32_t* kv_indptr;          /* [B + 1] */
  int32_t* kv_len;             /* [B] */
  int32_t* kv_indices;         /* [kv_indices_capacity] */
  int64_t kv_indices_capacity;
  int32_t* tree_mask;          /* NULL or [B * N, ceil(N / 32)] */
  int32_t* error_word;         /* NULL or int32[4] */
  void* stream;                /* cudaStream_t, NULL = the legacy default stream */
} va_verify_metadata_args;

void va_verify_metadata_args_init(va_verify_metadata_args* a);

/* Launch the metadata kernel described above. VA_ERR_NULL_POINTER for a
 * required pointer that is NULL (draft_slots may be NULL when real_batch is 0),
 * VA_ERR_INVALID_VALUE for B, real_batch, N or the capacity out of range. */
va_status va_verify_metadata(const va_verify_metadata_args* a);

/* Smoke kernel: y[i] = scale * x[i], n elements of dtype (fp16/bf16). */
va_status va_scaled_copy(const void* x, void* y, int64_t n, float scale,
                         int32_t dtype, void* stream);

/* Human-readable text of the last error on this thread ("" after success). */
const char* va_last_error_message(void);
const char* va_status_name(va_status s);

/* CUDA runtime version linked in (e.g. 13000), and driver version (0 if none). */
va_status va_cuda_versions(int32_t* runtime_version, int32_t* driver_version);
/* Comma-separated archs compiled into this library, e.g. "sm_90a,sm_120a". */
const char* va_compiled_archs(void);
/* ABI version of the library (compare with VA_ABI_VERSION). */
int32_t va_abi_version(void);
/* Comma-separated tags of every kernel configuration, in the plan's order,
 * e.g. "mla_m32n32_s1,...,mla_wgmma_seesaw_tma,mla_wgmma_seesaw_tma_rows": the names
 * va_plan_options.config takes (any other is VA_ERR_INVALID_VALUE). */
const char* va_config_tags(void);

#ifdef __cplusplus
}
#endif
#endif /* VERIFY_ATTN_H_ */
