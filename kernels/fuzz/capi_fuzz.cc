// libFuzzer harness over the C-ABI's parameter struct (kernels/verify_attn.h).
//
// Every input becomes a va_params (either the raw bytes of the struct, garbage
// struct_size/abi_version included, or fields drawn one by one with a bias to
// the valid ranges), then va_workspace_size, va_query_config and va_attention
// are called on it in an input-chosen order (also with NULL arguments). Pointer
// fields are only ever NULL or small FAKE addresses (aligned or misaligned,
// in [0x10000000, 0x11000000)): the C-ABI must never dereference them on the
// host, and ASan would report it if it did.
//
// Properties checked (a violation aborts = a crash libFuzzer reports):
//   * every return is a valid va_status, with a non-empty NUL-terminated
//     message on failure;
//   * no launch happens: the fuzzer runs without a device (run_fuzz.sh sets
//     CUDA_VISIBLE_DEVICES=""), and the launchers are stubs that abort
//     (launch_stub.cc); va_attention may return VA_OK only for an empty batch;
//   * the host planner (make_plan), reached when the scalar validation passed,
//     is also run against fuzzed but realistic device descriptions (sm_75 ..
//     sm_121, 1..256 SMs, 48 KB..227 KB shared memory): a returned plan has
//     1..65535 splits, a config that fits the device's shared memory, and a
//     workspace size that did not overflow.
// Built with -fsanitize=fuzzer,address,undefined (kernels/fuzz/run_fuzz.sh).
//
// -write_seeds=<dir>: write the seed corpus (valid structs for MLA/GQA,
// flat/paged, split/unsplit, empty) into <dir> and exit.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/launch.h"
#include "kernels/plan.h"
#include "kernels/verify_attn.h"

namespace {

constexpr uintptr_t kFakeBase = 0x10000000u;
constexpr uintptr_t kFakeSpan = 0x01000000u;

#define FUZZ_CHECK(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "capi_fuzz: check failed: %s: ", #cond);       \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fprintf(stderr, "\n");                                         \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

// A fake device address from raw bits: NULL, or kFakeBase + low bits (the low
// bits keep the raw value's alignment, so misaligned fakes occur too).
uintptr_t fake_addr(uint64_t raw) {
  if (raw == 0) return 0;
  return kFakeBase + static_cast<uintptr_t>(raw % kFakeSpan);
}

template <typename T>
T* fake_ptr(uint64_t raw) {
  return reinterpret_cast<T*>(fake_addr(raw));
}

// Map every pointer field of p to NULL or a fake address.
void sanitize_pointers(va_params* p) {
  p->q = fake_ptr<const void>(reinterpret_cast<uintptr_t>(p->q));
  p->k = fake_ptr<const void>(reinterpret_cast<uintptr_t>(p->k));
  // keep v == k (MLA) when the raw bits said so
  p->v = fake_ptr<const void>(reinterpret_cast<uintptr_t>(p->v));
  p->out = fake_ptr<void>(reinterpret_cast<uintptr_t>(p->out));
  p->lse = fake_ptr<float>(reinterpret_cast<uintptr_t>(p->lse));
  p->qo_indptr = fake_ptr<const int32_t>(reinterpret_cast<uintptr_t>(p->qo_indptr));
  p->kv_indptr = fake_ptr<const int32_t>(reinterpret_cast<uintptr_t>(p->kv_indptr));
  p->kv_indices = fake_ptr<const int32_t>(reinterpret_cast<uintptr_t>(p->kv_indices));
  p->kv_len = fake_ptr<const int32_t>(reinterpret_cast<uintptr_t>(p->kv_len));
  p->tree_mask = fake_ptr<const uint32_t>(reinterpret_cast<uintptr_t>(p->tree_mask));
  p->workspace = fake_ptr<void>(reinterpret_cast<uintptr_t>(p->workspace));
  p->error_word = fake_ptr<int32_t>(reinterpret_cast<uintptr_t>(p->error_word));
  p->stream = fake_ptr<void>(reinterpret_cast<uintptr_t>(p->stream));
}

// A pointer-ish raw value: mostly 16-aligned, sometimes NULL / 4- / 2- / 1-aligned.
uint64_t pick_ptr_raw(FuzzedDataProvider& f) {
  const uint64_t slot = f.ConsumeIntegralInRange<uint64_t>(1, 0xFFFF) * 16;
  switch (f.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return 0;
    case 1: return slot + 4;
    case 2: return slot + 2;
    case 3: return slot + 1;
    case 4: return f.ConsumeIntegral<uint64_t>();
    default: return slot;
  }
}

int32_t pick_i32(FuzzedDataProvider& f, int32_t lo, int32_t hi) {
  switch (f.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return f.ConsumeIntegral<int32_t>();
    case 1: return f.PickValueInArray<int32_t>({0, -1, 1, INT32_MIN, INT32_MAX, 1024, 1025, 65535, 65536});
    default: return f.ConsumeIntegralInRange<int32_t>(lo, hi);
  }
}

int64_t pick_i64(FuzzedDataProvider& f, int64_t lo, int64_t hi) {
  switch (f.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return f.ConsumeIntegral<int64_t>();
    case 1: return f.PickValueInArray<int64_t>({0, -1, 1, INT64_MIN, INT64_MAX, INT32_MAX,
                                               int64_t{1} << 40});
    default: return f.ConsumeIntegralInRange<int64_t>(lo, hi);
  }
}

// Element stride: mostly a multiple of 8, sometimes not / negative / huge.
int64_t pick_stride(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return f.ConsumeIntegral<int64_t>();
    case 1: return f.ConsumeIntegralInRange<int64_t>(-16, 16);
    default: return 8 * f.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
  }
}

float pick_scale(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return f.PickValueInArray<float>({0.f, -0.f, -1.f, __builtin_nanf(""), __builtin_inff(),
                                              -__builtin_inff(), 1e-45f, 3.4e38f});
    case 1: {
      uint32_t bits = f.ConsumeIntegral<uint32_t>();
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    }
    default: return f.ConsumeFloatingPointInRange<float>(1e-4f, 4.f);
  }
}

// Fields drawn one by one, biased to valid values.
void structured_params(FuzzedDataProvider& f, va_params* p) {
  va_params_init(p);
  if (f.ConsumeIntegralInRange<int>(0, 15) == 0) p->struct_size = f.ConsumeIntegral<uint32_t>();
  if (f.ConsumeIntegralInRange<int>(0, 15) == 0) p->abi_version = f.ConsumeIntegral<uint32_t>();
  p->dtype = pick_i32(f, 0, 1);
  p->kv_layout = pick_i32(f, 0, 1);
  p->mask_mode = pick_i32(f, 0, 1);
  p->batch_size = pick_i32(f, 0, 64);
  p->total_q = pick_i32(f, 0, 4096);
  p->max_q_len = pick_i32(f, 0, 1024);
  p->max_kv_len = pick_i64(f, 0, 1 << 20);
  const bool mla = f.ConsumeBool();
  if (mla) {
    p->v_is_k_prefix = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 2) : 1;
    p->num_kv_heads = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 4) : 1;
    p->num_qo_heads = pick_i32(f, 1, 128);
    p->head_dim_qk = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 1024) : 576;
    p->head_dim_vo = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 1024) : 512;
  } else {
    p->v_is_k_prefix = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 2) : 0;
    p->num_kv_heads = pick_i32(f, 1, 16);
    const int64_t heads = static_cast<int64_t>(p->num_kv_heads) * f.ConsumeIntegralInRange<int32_t>(0, 20);
    p->num_qo_heads = heads > INT32_MAX || heads < INT32_MIN ? INT32_MAX : static_cast<int32_t>(heads);
    if (f.ConsumeIntegralInRange<int>(0, 9) == 0) p->num_qo_heads = pick_i32(f, 0, 256);
    const int32_t d = f.PickValueInArray<int32_t>({64, 128, 256, 64, 128, 256, 32, 96, 512, 576});
    p->head_dim_qk = d;
    p->head_dim_vo = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_i32(f, 0, 1024) : d;
  }
  p->sm_scale = pick_scale(f);
  p->q = fake_ptr<const void>(pick_ptr_raw(f));
  p->q_stride_token = pick_stride(f);
  p->q_stride_head = pick_stride(f);
  p->k = fake_ptr<const void>(pick_ptr_raw(f));
  p->k_stride_page = pick_stride(f);
  p->k_stride_token = pick_stride(f);
  p->k_stride_head = pick_stride(f);
  switch (f.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: p->v = nullptr; break;
    case 1: p->v = p->k; break;
    default: p->v = fake_ptr<const void>(pick_ptr_raw(f)); break;
  }
  p->v_stride_page = pick_stride(f);
  p->v_stride_token = pick_stride(f);
  p->v_stride_head = pick_stride(f);
  p->out = fake_ptr<void>(pick_ptr_raw(f));
  p->out_stride_token = pick_stride(f);
  p->out_stride_head = pick_stride(f);
  p->lse = f.ConsumeBool() ? nullptr : fake_ptr<float>(pick_ptr_raw(f));
  p->lse_stride_token = pick_i64(f, 0, 1 << 16);
  p->lse_stride_head = pick_i64(f, 0, 1 << 16);
  p->qo_indptr = fake_ptr<const int32_t>(pick_ptr_raw(f));
  p->kv_indptr = fake_ptr<const int32_t>(pick_ptr_raw(f));
  p->kv_indices = fake_ptr<const int32_t>(pick_ptr_raw(f));
  p->kv_len = fake_ptr<const int32_t>(pick_ptr_raw(f));
  p->page_size = pick_i32(f, 1, 256);
  p->num_pages = pick_i64(f, 1, 1 << 24);
  p->num_kv_rows = pick_i64(f, 0, 1 << 24);
  p->kv_slot_runs = f.ConsumeBool() ? 0 : pick_i32(f, -1, 256);
  p->tree_mask = fake_ptr<const uint32_t>(pick_ptr_raw(f));
  p->mask_words = pick_i32(f, 0, 40);
  p->num_splits = pick_i32(f, 0, 8);
  p->workspace = f.ConsumeBool() ? nullptr : fake_ptr<void>(pick_ptr_raw(f));
  p->workspace_bytes = static_cast<size_t>(pick_i64(f, 0, int64_t{1} << 32));
  p->error_word = f.ConsumeBool() ? nullptr : fake_ptr<int32_t>(pick_ptr_raw(f));
  p->stream = f.ConsumeBool() ? nullptr : fake_ptr<void>(pick_ptr_raw(f));
}

void check_status(va_status s, const char* call) {
  const int v = static_cast<int>(s);
  FUZZ_CHECK(v >= VA_OK && v <= VA_ERR_CUDA, "%s returned %d", call, v);
  FUZZ_CHECK(std::strcmp(va_status_name(s), "VA_ERR_UNKNOWN") != 0, "%s: %d", call, v);
  const char* msg = va_last_error_message();
  FUZZ_CHECK(msg != nullptr, "%s: NULL message", call);
  const size_t n = strnlen(msg, 1024);
  FUZZ_CHECK(n < 1024, "%s: message not NUL-terminated", call);
  if (s != VA_OK) FUZZ_CHECK(n > 0, "%s returned %s with an empty message", call, va_status_name(s));
  else FUZZ_CHECK(n == 0, "%s returned VA_OK with message '%s'", call, msg);
}

bool is_empty(const va_params& p) { return p.batch_size == 0 || p.total_q == 0; }

// Plan options: mostly valid (a known tag or none, in-range switches), sometimes not.
va_plan_options fuzz_options(FuzzedDataProvider& f) {
  va_plan_options o;
  va_plan_options_init(&o);
  if (f.ConsumeIntegralInRange<int>(0, 15) == 0) o.struct_size = f.ConsumeIntegral<uint32_t>();
  switch (f.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      break;  // the plan's choice
    case 1: {
      const std::string tags = va_config_tags();
      std::vector<std::string> list;
      size_t a = 0;
      while (a <= tags.size()) {
        const size_t b = std::min(tags.find(',', a), tags.size());
        list.push_back(tags.substr(a, b - a));
        a = b + 1;
      }
      const std::string& t = list[f.ConsumeIntegralInRange<size_t>(0, list.size() - 1)];
      std::snprintf(o.config, sizeof(o.config), "%s", t.c_str());
      break;
    }
    case 2: {
      const std::string t = f.ConsumeRandomLengthString(sizeof(o.config) - 1);
      std::snprintf(o.config, sizeof(o.config), "%s", t.c_str());
      break;
    }
    default:
      std::memset(o.config, 'x', sizeof(o.config));  // not NUL-terminated
  }
  const bool wild = f.ConsumeIntegralInRange<int>(0, 7) == 0;
  o.grid_order = wild ? f.ConsumeIntegral<int32_t>() : f.ConsumeIntegralInRange<int32_t>(0, 2);
  o.early_release = wild ? f.ConsumeIntegral<int32_t>() : f.ConsumeIntegralInRange<int32_t>(0, 2);
  o.q_tma = f.ConsumeIntegralInRange<int32_t>(0, wild ? 9 : 2);
  o.o_tma = f.ConsumeIntegralInRange<int32_t>(0, wild ? 9 : 2);
  o.max_smem_bytes = f.ConsumeBool() ? 0
                                     : (wild ? f.ConsumeIntegral<int32_t>()
                                             : f.PickValueInArray<int32_t>({101376, 232448, 65536, 1}));
  return o;
}

// The planner with a fuzzed, realistic device (p passed the scalar validation).
void fuzz_plan(FuzzedDataProvider& f, const va_params& p) {
  using namespace verify_attn;
  DeviceInfo dev{};
  dev.device = 0;
  dev.sm_arch = f.PickValueInArray<int>({90, 120, 75, 80, 86, 89, 100, 103, 121});
  dev.num_sms = f.ConsumeIntegralInRange<int>(1, 256);
  dev.max_smem_optin = f.ConsumeBool() ? f.PickValueInArray<int>({232448, 101376, 166912, 99328, 65536, 49152})
                                       : f.ConsumeIntegralInRange<int>(48 * 1024, 232448);
  const va_plan_options opt = fuzz_options(f);
  int forced = -1;
  const va_status os = check_plan_options(opt, &forced);
  Plan plan;
  std::memset(&plan, 0xA5, sizeof(plan));
  const va_status s = make_plan(p, dev, opt, &plan);
  FUZZ_CHECK(os == VA_OK || s == os, "make_plan %d with options that fail %d", static_cast<int>(s),
             static_cast<int>(os));
  const int v = static_cast<int>(s);
  FUZZ_CHECK(v >= VA_OK && v <= VA_ERR_CUDA, "make_plan returned %d", v);
  if (s != VA_OK) return;
  FUZZ_CHECK(plan.config >= 0 && plan.config < kNumConfigs, "config %d", static_cast<int>(plan.config));
  FUZZ_CHECK(config_desc(plan.config).smem_bytes <= dev.max_smem_optin, "config %s needs %d > %d bytes",
             config_desc(plan.config).tag, config_desc(plan.config).smem_bytes, dev.max_smem_optin);
  FUZZ_CHECK(opt.max_smem_bytes <= 0 || config_desc(plan.config).smem_bytes <= opt.max_smem_bytes,
             "config %s needs %d > the options' %d bytes", config_desc(plan.config).tag,
             config_desc(plan.config).smem_bytes, opt.max_smem_bytes);
  FUZZ_CHECK(!plan.q_tma || config_desc(plan.config).wgmma, "q_tma on %s", config_desc(plan.config).tag);
  FUZZ_CHECK(!plan.o_tma || (config_desc(plan.config).wgmma && plan.splits == 1), "o_tma on %s, %d splits",
             config_desc(plan.config).tag, plan.splits);
  FUZZ_CHECK(opt.q_tma != VA_OFF || !plan.q_tma, "q_tma off but planned");
  FUZZ_CHECK(opt.o_tma != VA_OFF || !plan.o_tma, "o_tma off but planned");
  FUZZ_CHECK(plan.splits >= 1 && plan.splits <= 65535, "splits %d", plan.splits);
  FUZZ_CHECK(p.num_splits == 0 || plan.splits == p.num_splits, "forced splits %d -> %d", p.num_splits,
             plan.splits);
  FUZZ_CHECK(plan.row_tiles >= 1, "row_tiles %d", plan.row_tiles);
  FUZZ_CHECK(strnlen(plan.name, sizeof(plan.name)) < sizeof(plan.name), "name not terminated");
  if (plan.splits > 1 && !plan.pair_splits) {
    // The workspace the caller allocates must cover splits x rows x (Dv + 1) fp32
    // (a pair of splits combines its rows in a cluster and needs none).
    const unsigned __int128 need =
        static_cast<unsigned __int128>(plan.splits) * static_cast<unsigned __int128>(plan.ws_rows) *
        static_cast<unsigned __int128>(p.head_dim_vo + 1) * 4u;
    FUZZ_CHECK(need == static_cast<unsigned __int128>(plan.workspace_bytes),
               "workspace_bytes %zu wrapped (splits %d, rows %lld, Dv %d)", plan.workspace_bytes,
               plan.splits, static_cast<long long>(plan.ws_rows), p.head_dim_vo);
  } else {
    FUZZ_CHECK(plan.workspace_bytes == 0, "workspace %zu without merged splits", plan.workspace_bytes);
  }
}

void run_one(FuzzedDataProvider& f, va_params* p) {
  // A plan handle: without a device no plan is ever made (*plan stays NULL),
  // and the run / info / destroy calls take NULL and bad arguments cleanly.
  {
    const va_plan_options opt = fuzz_options(f);
    va_plan* plan = reinterpret_cast<va_plan*>(0x1);
    const bool null_opt = f.ConsumeIntegralInRange<int>(0, 7) == 0;
    const va_status s = va_plan_create(p, null_opt ? nullptr : &opt, &plan);
    check_status(s, "va_plan_create");
    FUZZ_CHECK(s != VA_OK && plan == nullptr, "va_plan_create %d without a device, plan %p",
               static_cast<int>(s), static_cast<void*>(plan));
    va_run_args r;
    va_run_args_init(&r);
    r.q = p->q;
    r.k = p->k;
    r.out = p->out;
    check_status(va_plan_run(nullptr, &r), "va_plan_run");
    va_config_info info;
    check_status(va_plan_info(nullptr, &info), "va_plan_info");
    va_plan_destroy(plan);
  }
  // The three calls, in an input-chosen order, once or twice each.
  const int order = f.ConsumeIntegralInRange<int>(0, 5);
  static const int kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  const bool null_params = f.ConsumeIntegralInRange<int>(0, 31) == 0;
  const bool null_out = f.ConsumeIntegralInRange<int>(0, 31) == 0;
  const va_params* pp = null_params ? nullptr : p;
  bool passed_config = false;
  for (int i = 0; i < 3; ++i) {
    switch (kOrders[order][i]) {
      case 0: {
        size_t bytes = 12345;
        const va_status s = va_workspace_size(pp, null_out ? nullptr : &bytes);
        check_status(s, "va_workspace_size");
        if (!null_out) FUZZ_CHECK(s != VA_OK || bytes == 0, "workspace %zu without a device", bytes);
        FUZZ_CHECK(s != VA_OK || (pp != nullptr && is_empty(*pp)), "va_workspace_size OK without a device");
        if (s == VA_ERR_NO_DEVICE && pp != nullptr && !null_out) passed_config = true;
        break;
      }
      case 1: {
        va_config_info info;
        std::memset(&info, 0x5A, sizeof(info));
        const va_status s = va_query_config(pp, null_out ? nullptr : &info);
        check_status(s, "va_query_config");
        FUZZ_CHECK(s != VA_OK, "va_query_config OK without a device");
        break;
      }
      default: {
        const va_status s = va_attention(pp);
        check_status(s, "va_attention");
        FUZZ_CHECK(s != VA_OK || (pp != nullptr && is_empty(*pp)),
                   "va_attention returned VA_OK for a non-empty call without a device");
        break;
      }
    }
  }
  if (passed_config && !is_empty(*p) && f.remaining_bytes() > 0) fuzz_plan(f, *p);
}

// ---- seeds ---------------------------------------------------------------

void fill_common(va_params* p) {
  p->q = reinterpret_cast<const void*>(0x1000);
  p->k = reinterpret_cast<const void*>(0x2000);
  p->out = reinterpret_cast<void*>(0x4000);
  p->lse = reinterpret_cast<float*>(0x5000);
  p->qo_indptr = reinterpret_cast<const int32_t*>(0x6000);
  p->kv_indptr = reinterpret_cast<const int32_t*>(0x7000);
  p->tree_mask = reinterpret_cast<const uint32_t*>(0x8000);
  p->error_word = reinterpret_cast<int32_t*>(0x9000);
}

std::vector<va_params> seed_structs() {
  std::vector<va_params> v;
  va_params p;
  // MLA paged, page size 1, tree, 2 requests of 8 drafts, H 16.
  va_params_init(&p);
  fill_common(&p);
  p.kv_layout = VA_KV_PAGED;
  p.batch_size = 2; p.total_q = 16; p.max_q_len = 8; p.max_kv_len = 4096;
  p.num_qo_heads = 16; p.num_kv_heads = 1; p.head_dim_qk = 576; p.head_dim_vo = 512;
  p.v_is_k_prefix = 1; p.sm_scale = 1.f / 24.f;
  p.q_stride_token = 16 * 576; p.q_stride_head = 576;
  p.k_stride_page = 576; p.k_stride_token = 576; p.k_stride_head = 576;
  p.out_stride_token = 16 * 512; p.out_stride_head = 512;
  p.lse_stride_token = 16; p.lse_stride_head = 1;
  p.kv_indices = reinterpret_cast<const int32_t*>(0xA000);
  p.kv_len = reinterpret_cast<const int32_t*>(0xB000);
  p.page_size = 1; p.num_pages = 10000; p.mask_words = 1;
  v.push_back(p);
  // same, split 3 with a workspace, fp16, causal
  p.dtype = VA_DTYPE_FP16; p.mask_mode = VA_MASK_CAUSAL; p.num_splits = 3;
  p.workspace = reinterpret_cast<void*>(0xC000); p.workspace_bytes = 1 << 20;
  v.push_back(p);
  // GQA flat D128, H 8 / Hkv 2, tree, 3 requests
  va_params_init(&p);
  fill_common(&p);
  p.v = reinterpret_cast<const void*>(0x3000);
  p.batch_size = 3; p.total_q = 40; p.max_q_len = 16; p.max_kv_len = 700;
  p.num_qo_heads = 8; p.num_kv_heads = 2; p.head_dim_qk = 128; p.head_dim_vo = 128;
  p.sm_scale = 0.088f;
  p.q_stride_token = 8 * 128; p.q_stride_head = 128;
  p.k_stride_token = 2 * 128; p.k_stride_head = 128;
  p.v_stride_token = 2 * 128; p.v_stride_head = 128;
  p.out_stride_token = 8 * 128; p.out_stride_head = 128;
  p.lse = nullptr;
  p.num_kv_rows = 2000; p.mask_words = 1;
  v.push_back(p);
  // GQA paged D64, page 16
  p.kv_layout = VA_KV_PAGED; p.head_dim_qk = p.head_dim_vo = 64;
  p.q_stride_token = 8 * 64; p.q_stride_head = 64;
  p.k_stride_page = 16 * 2 * 64; p.k_stride_token = 2 * 64; p.k_stride_head = 64;
  p.v_stride_page = 16 * 2 * 64; p.v_stride_token = 2 * 64; p.v_stride_head = 64;
  p.out_stride_token = 8 * 64; p.out_stride_head = 64;
  p.kv_indices = reinterpret_cast<const int32_t*>(0xA000);
  p.kv_len = reinterpret_cast<const int32_t*>(0xB000);
  p.page_size = 16; p.num_pages = 512;
  v.push_back(p);
  // GQA paged D256, 64 drafts (2 mask words), bf16
  p.head_dim_qk = p.head_dim_vo = 256; p.max_q_len = 64; p.mask_words = 2; p.total_q = 100;
  p.q_stride_token = 8 * 256; p.q_stride_head = 256;
  p.k_stride_page = 16 * 2 * 256; p.k_stride_token = 2 * 256; p.k_stride_head = 256;
  p.v_stride_page = 16 * 2 * 256; p.v_stride_token = 2 * 256; p.v_stride_head = 256;
  p.out_stride_token = 8 * 256; p.out_stride_head = 256;
  v.push_back(p);
  // empty batch
  p.batch_size = 0; p.total_q = 0;
  v.push_back(p);
  return v;
}

void write_seeds(const char* dir) {
  int n = 0;
  for (const va_params& p : seed_structs()) {
    for (int tail = 0; tail < 3; ++tail) {
      std::vector<uint8_t> bytes(1 + sizeof(va_params) + 16, 0);
      bytes[0] = 0;  // raw-struct mode
      std::memcpy(bytes.data() + 1, &p, sizeof(p));
      for (int i = 0; i < 16; ++i) bytes[1 + sizeof(p) + i] = static_cast<uint8_t>(tail * 37 + i * 11);
      const std::string path = std::string(dir) + "/seed_" + std::to_string(n++);
      FILE* fp = std::fopen(path.c_str(), "wb");
      if (fp == nullptr) {
        std::perror(path.c_str());
        std::exit(1);
      }
      std::fwrite(bytes.data(), 1, bytes.size(), fp);
      std::fclose(fp);
    }
  }
  std::printf("capi_fuzz: wrote %d seeds to %s\n", n, dir);
}

}  // namespace

// `capi_fuzz -write_seeds=DIR` (kernels/fuzz/run_fuzz.sh): write the seed
// corpus into DIR and exit (libFuzzer ignores the flag it does not know).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static const char kFlag[] = "-write_seeds=";
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp((*argv)[i], kFlag, sizeof(kFlag) - 1) == 0) {
      write_seeds((*argv)[i] + sizeof(kFlag) - 1);
      std::exit(0);
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  va_params p;
  if ((data[0] & 1) == 0) {
    // raw struct: the bytes as they come (garbage struct_size/abi_version
    // included), pointers mapped to NULL / fake addresses
    std::memset(&p, 0, sizeof(p));
    const size_t n = std::min(size - 1, sizeof(p));
    std::memcpy(&p, data + 1, n);
    sanitize_pointers(&p);
    FuzzedDataProvider f(data + 1 + n, size - 1 - n);
    run_one(f, &p);
  } else {
    FuzzedDataProvider f(data + 1, size - 1);
    structured_params(f, &p);
    run_one(f, &p);
  }
  return 0;
}
