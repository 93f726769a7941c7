// Host plan tests (no GPU): the configuration chosen for each arch fits its
// shared memory (sm_120: 101376 bytes per block; sm_90: 232448), and the
// split-K rule fills the GPU only when the batch alone cannot. Prints the
// resource table (the CI log records what sm_120 would run).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <cstdlib>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/plan.h"

namespace va = verify_attn;

static int g_passed = 0, g_failed = 0;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (cond) {                           \
      ++g_passed;                         \
    } else {                              \
      ++g_failed;                         \
      std::printf("FAIL: " __VA_ARGS__);  \
      std::printf("\n");                  \
    }                                     \
  } while (0)

// make_plan failed as a bad option must: VA_ERR_INVALID_VALUE, the message
// naming the option.
static bool fails_naming_option(va_status st, const char* option) {
  return st == VA_ERR_INVALID_VALUE &&
         std::string(va_last_error_message()).find(option) != std::string::npos;
}

// The plan options every make_plan below runs with (the plan's rules unless a
// test sets one), and make_plan with them.
static va_plan_options g_opt = [] {
  va_plan_options o;
  va_plan_options_init(&o);
  return o;
}();
static void set_config(const char* tag) {
  std::snprintf(g_opt.config, sizeof(g_opt.config), "%s", tag);
}
static va_status make_plan(const va_params& p, const va::DeviceInfo& dev, va::Plan* plan) {
  return va::make_plan(p, dev, g_opt, plan);
}

static va_params shape(bool mla, int d, int hq, int hkv, int b, int q_len, long kv_len) {
  va_params p;
  va_params_init(&p);
  p.batch_size = b;
  p.total_q = b * q_len;
  p.max_q_len = q_len;
  p.max_kv_len = kv_len;
  p.num_qo_heads = hq;
  p.num_kv_heads = hkv;
  p.v_is_k_prefix = mla ? 1 : 0;
  p.head_dim_qk = mla ? 576 : d;
  p.head_dim_vo = mla ? 512 : d;
  p.mask_words = (q_len + 31) / 32;
  return p;
}

// Balanced splits (kernels/plan.h): the split count the kernel's warp gives
// each request of these KV lengths (kernels/core/balanced_splits.cuh, the
// same rule with a loop for its warp reduction).
static std::vector<int> balanced_counts(const std::vector<int>& kv_len, int n, int units, int slots) {
  std::vector<int> tiles;
  int64_t total = 0;
  int most = 0;
  for (int len : kv_len) {
    const int t = (std::max(len, 0) + n - 1) / n;
    tiles.push_back(t);
    total += t;
    most = std::max(most, t);
  }
  const int share = va::balanced_share(total, most, static_cast<int>(kv_len.size()), units, [&](int q) {
    int64_t sum = 0;
    for (int t : tiles) sum += t > q ? (t + q - 1) / q : 1;
    return sum;
  });
  std::vector<int> out;
  for (int t : tiles) out.push_back(va::balanced_splits_of(t, share, slots));
  return out;
}

int main() {
  const va::DeviceInfo sm120{0, 120, 188, 101376};  // RTX PRO 6000 Blackwell
  const va::DeviceInfo sm90{0, 90, 132, 232448};    // H100/H200
  struct Case { bool mla; int d, hq, hkv, b, q; long kv; };
  const Case cases[] = {
      {true, 576, 16, 1, 1, 16, 4096},    {true, 576, 16, 1, 1, 64, 32768},
      {true, 576, 128, 1, 1, 32, 8192},   {true, 576, 1, 1, 32, 1, 4096},
      {true, 576, 16, 1, 64, 16, 4096},   {false, 64, 8, 8, 4, 16, 4096},
      {false, 128, 32, 4, 16, 16, 8192},  {false, 256, 16, 2, 1, 64, 65536},
      {false, 128, 48, 16, 2, 1024, 1024},
  };
  std::printf("%-5s %-4s %-4s %-4s %-4s %-5s %-7s | %-32s %-7s %-6s %s\n", "arch", "kind", "D",
              "Hq", "B", "q", "kv", "config", "smem", "splits", "workspace");
  for (const va::DeviceInfo& dev : {sm120, sm90}) {
    for (const Case& c : cases) {
      va_params p = shape(c.mla, c.d, c.hq, c.hkv, c.b, c.q, c.kv);
      va::Plan plan;
      va_status s = make_plan(p, dev, &plan);
      CHECK(s == VA_OK, "make_plan sm_%d: %s", dev.sm_arch, va_last_error_message());
      if (s != VA_OK) continue;
      const va::ConfigDesc& d = va::config_desc(plan.config);
      std::printf("sm_%-3d %-4s %-4d %-4d %-4d %-5d %-7ld | %-32s %-7d %-6d %zu\n", dev.sm_arch,
                  c.mla ? "MLA" : "GQA", c.d, c.hq, c.b, c.q, c.kv, plan.name, d.smem_bytes,
                  plan.splits, plan.workspace_bytes);
      CHECK(d.smem_bytes <= dev.max_smem_optin, "%s needs %d bytes > %d on sm_%d", plan.name,
            d.smem_bytes, dev.max_smem_optin, dev.sm_arch);
      CHECK(plan.splits >= 1, "splits >= 1");
      CHECK((plan.splits > 1 && !plan.pair_splits) == (plan.workspace_bytes > 0),
            "workspace iff split, but for a pair of splits");
      // A batch that already fills the SMs is never split.
      const long ctas = static_cast<long>(c.b) * c.hkv * plan.row_tiles;
      if (ctas >= dev.num_sms) CHECK(plan.splits == 1, "%s: %ld CTAs but %d splits", plan.name, ctas, plan.splits);
    }
  }
  // Kernel path: MLA on sm_90 takes the wgmma configuration (when this build has
  // an sm_90a image), every other arch and GQA the portable mma.sync one; the
  // tuning knob cannot force wgmma onto another arch, and can force mma.sync on sm_90.
  {
    const va::DeviceInfo sm100{0, 100, 148, 232448};  // B200: no wgmma (sm_90a only)
    const va_params mla = shape(true, 576, 16, 1, 1, 64, 32768);
    const va_params gqa = shape(false, 128, 32, 4, 16, 16, 8192);
    va::Plan plan;
    auto path = [&](const va_params& p, const va::DeviceInfo& dev) -> std::string {
      if (make_plan(p, dev, &plan) != VA_OK) return "error";
      return std::string(plan.name);
    };
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    if (sm90a) {
      CHECK(path(mla, sm90).rfind("wgmma_", 0) == 0, "MLA on sm_90: %s", plan.name);
      CHECK(va::config_desc(plan.config).wgmma && va::config_desc(plan.config).only_arch == 90,
            "wgmma config is sm_90 only");
    } else {  // e.g. --config=sm120: no sm_90a image, so never the wgmma kernel
      CHECK(path(mla, sm90).rfind("mma_sync_", 0) == 0, "MLA on sm_90 without sm_90a: %s", plan.name);
    }
    CHECK(path(mla, sm120).rfind("mma_sync_", 0) == 0, "MLA on sm_120: %s", plan.name);
    CHECK(path(mla, sm100).rfind("mma_sync_", 0) == 0, "MLA on sm_100: %s", plan.name);
    CHECK(path(gqa, sm90).rfind("mma_sync_", 0) == 0, "GQA on sm_90: %s", plan.name);
    set_config("mla_wgmma_m64n64_pipe_rows");
    CHECK(path(mla, sm120).rfind("mma_sync_", 0) == 0, "forced wgmma on sm_120: %s", plan.name);
    set_config("mla_m32n32_s1");
    CHECK(path(mla, sm90) == "mma_sync_fp16_mla_m32n32_s1" ||
              path(mla, sm90) == "mma_sync_bf16_mla_m32n32_s1",
          "forced mma.sync on sm_90: %s", plan.name);
    set_config("gqa_d128_m64n64_s2");
    CHECK(path(mla, sm90).rfind("wgmma_", 0) == 0 || !sm90a,
          "a GQA tag does not serve MLA: %s", plan.name);
    set_config("gqa_d256_m64n32_s1");
    CHECK(path(gqa, sm90).find("gqa_d128_") != std::string::npos,
          "a D256 tag does not serve D128: %s", plan.name);
    set_config("");
  }
  // MLA on sm_90: paged caches the copy engine can read (page_size % 64 == 0,
  // 16-byte aligned base and strides) take the TMA kernel, every other cache
  // the cp.async one; the tuning knob cannot force TMA onto the others.
  {
    va_params p = shape(true, 576, 16, 1, 1, 64, 32768);
    p.dtype = VA_DTYPE_BF16;
    p.kv_layout = VA_KV_PAGED;
    p.page_size = 64;
    p.num_pages = 1000;
    p.k = reinterpret_cast<const void*>(uintptr_t{1} << 20);
    p.k_stride_token = 576;
    p.k_stride_page = 64 * 576;
    va::Plan plan;
    auto name = [&](const va_params& q, const va::DeviceInfo& dev) -> std::string {
      if (make_plan(q, dev, &plan) != VA_OK) return "error";
      return std::string(plan.name);
    };
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    const std::string tma = "wgmma_bf16_mla_wgmma_seesaw_tma";
    const std::string gather = "wgmma_bf16_mla_wgmma_m64n64_pipe_rows";
    const std::string tma_rows = "wgmma_bf16_mla_wgmma_seesaw_tma_rows";
    if (sm90a) {
      CHECK(name(p, sm90) == tma, "page_size 64 on sm_90: %s", plan.name);
      // The TMA kernel's instance that skips invisible draft tiles: trees of
      // more than four tiles of drafts only (kernels/plan.cc).
      {
        va_params t = p;
        for (int q_len : {16, 128, 129, 256, 257, 512, 1024}) {
          t.max_q_len = q_len;
          t.total_q = q_len;
          t.mask_words = (q_len + 31) / 32;
          for (int causal = 0; causal < 2; ++causal) {
            t.mask_mode = causal ? VA_MASK_CAUSAL : VA_MASK_TREE;
            const bool want = !causal && q_len > 256;
            CHECK(name(t, sm90) == (want ? tma + "_skip" : tma) && plan.skip_draft_tiles == want,
                  "skip_draft_tiles, q_len %d, causal %d: %s %d", q_len, causal, plan.name,
                  plan.skip_draft_tiles);
          }
        }
        t.mask_mode = VA_MASK_TREE;
        va_params r = t;  // page_size 1 with the kv_slot_runs hint: the rows map's instance
        r.page_size = 1;
        r.k_stride_page = 576;
        r.num_pages = 64000;
        r.kv_slot_runs = 64;
        CHECK(name(r, sm90) == tma_rows + "_skip" && plan.skip_draft_tiles,
              "skip_draft_tiles, rows map: %s", plan.name);
        r.kv_layout = VA_KV_FLAT;
        r.kv_slot_runs = 0;
        r.num_kv_rows = 70000;
        CHECK(name(r, sm90) == tma + "_skip" && plan.skip_draft_tiles, "skip_draft_tiles, flat: %s",
              plan.name);
        CHECK(name(t, sm120).rfind("mma_sync_", 0) == 0 && !plan.skip_draft_tiles,
              "skip_draft_tiles on sm_120: %s", plan.name);
        t.page_size = 16;
        CHECK(name(t, sm90) == gather && !plan.skip_draft_tiles,
              "skip_draft_tiles on the cp.async kernel: %s", plan.name);
      }
      va_params q = p;
      q.page_size = 128;
      q.k_stride_page = 128 * 576;
      CHECK(name(q, sm90) == tma, "page_size 128 on sm_90: %s", plan.name);
      q = p;
      q.page_size = 16;
      CHECK(name(q, sm90) == gather, "page_size 16 on sm_90: %s", plan.name);
      q.page_size = 1;
      CHECK(name(q, sm90) == gather, "page_size 1 on sm_90: %s", plan.name);
      // The kv_slot_runs hint (slots in runs of a multiple of 64): the TMA
      // kernel through the rows map; other run lengths keep the cp.async one.
      q.k_stride_page = 576;
      q.num_pages = 64000;
      q.kv_slot_runs = 64;
      CHECK(name(q, sm90) == tma_rows, "page_size 1, kv_slot_runs 64: %s", plan.name);
      q.max_kv_len = 100;  // short KV too
      CHECK(name(q, sm90) == tma_rows, "page_size 1, kv_slot_runs 64, max_kv_len 100: %s", plan.name);
      q.max_kv_len = p.max_kv_len;
      q.kv_slot_runs = 128;
      CHECK(name(q, sm90) == tma_rows, "page_size 1, kv_slot_runs 128: %s", plan.name);
      q.kv_slot_runs = 32;
      CHECK(name(q, sm90) == gather, "page_size 1, kv_slot_runs 32: %s", plan.name);
      q.kv_slot_runs = 64;
      q.k_stride_token = 580;  // 1160 bytes: no rows map
      q.k_stride_page = 580;
      CHECK(name(q, sm90) == gather, "kv_slot_runs 64, token stride 1160 bytes: %s", plan.name);
      q.k_stride_token = q.k_stride_page = 640;  // a padded cache
      CHECK(name(q, sm90) == tma_rows, "kv_slot_runs 64, padded cache: %s", plan.name);
      q.k_stride_page = 1280;  // a slot at page * 1280 elements: not the map's row stride
      CHECK(name(q, sm90) == gather, "kv_slot_runs 64, page stride != token stride: %s", plan.name);
      q = p;
      q.page_size = 16;
      q.kv_slot_runs = 64;  // page_size 16: the hint is for page_size 1
      CHECK(name(q, sm90) == gather, "page_size 16, kv_slot_runs 64: %s", plan.name);
      q.page_size = 1;
      q.kv_slot_runs = 0;
      set_config("mla_wgmma_seesaw_tma_rows");
      CHECK(name(q, sm90) == gather, "forced rows map without the hint: %s", plan.name);
      set_config("");
      q = p;
      q.kv_layout = VA_KV_FLAT;
      q.num_kv_rows = 70000;
      CHECK(name(q, sm90) == tma, "flat on sm_90: %s", plan.name);
      q.k_stride_token = 580;  // 1160 bytes: not a multiple of 16
      CHECK(name(q, sm90) == gather, "flat, token stride 1160 bytes: %s", plan.name);
      q.k_stride_token = 576;
      q.k = reinterpret_cast<const void*>((uintptr_t{1} << 20) + 8);
      CHECK(name(q, sm90) == gather, "flat, 8-byte aligned K base: %s", plan.name);
      q.k = p.k;
      q.num_kv_rows = int64_t{1} << 31;  // past the map's int32 row coordinates
      CHECK(name(q, sm90) == gather, "flat, 2^31 rows: %s", plan.name);
      q = p;
      q.k = reinterpret_cast<const void*>((uintptr_t{1} << 20) + 8);
      CHECK(name(q, sm90) == gather, "8-byte aligned K base: %s", plan.name);
      q = p;
      q.k_stride_token = 580;  // 1160 bytes: not a multiple of 16
      CHECK(name(q, sm90) == gather, "token stride 1160 bytes: %s", plan.name);
      q = p;
      q.k_stride_token = 512;  // overlapping rows: the C-ABI accepts it, the tensor map does not
      q.k_stride_page = 64 * 512;
      CHECK(name(q, sm90) == gather, "overlapping rows: %s", plan.name);
      q = p;
      q.k_stride_token = 1000 * 576;  // slot-major: [page_size][num_pages] pages interleaved
      q.k_stride_page = 576;
      CHECK(name(q, sm90) == gather, "interleaved pages: %s", plan.name);
      q = p;
      q.k_stride_token = 640;  // a padded cache: 1280 bytes
      q.k_stride_page = 64 * 640;
      CHECK(name(q, sm90) == tma, "padded cache: %s", plan.name);
      q = p;
      q.page_size = 16;
      set_config("mla_wgmma_seesaw_tma");
      CHECK(name(q, sm90) == gather, "forced TMA on page_size 16: %s", plan.name);
      CHECK(name(p, sm90) == tma, "forced TMA on page_size 64: %s", plan.name);
      set_config("");
    } else {
      CHECK(name(p, sm90).rfind("mma_sync_", 0) == 0, "no sm_90a image: %s", plan.name);
    }
    CHECK(name(p, sm120).rfind("mma_sync_", 0) == 0, "page_size 64 on sm_120: %s", plan.name);
  }
  // At 64 rows or fewer per KV head (4 drafts x group 8) the warp-role GQA
  // kernel where requests x KV heads are at most an eighth of the SMs (4
  // requests x 4 KV heads on 132 SMs), the one-tile kernel from there on; at
  // head_dim 128 on sm_90 the three-stage warp-role kernel at every count.
  {
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    for (int d : {64, 128}) {
      const std::string roles = "mma_sync_bf16_gqa_d" + std::to_string(d) + "_roles_m128n64";
      const std::string tile = "mma_sync_bf16_gqa_d" + std::to_string(d) + "_m64n64_s2";
      for (int b : {1, 4, 5, 16}) {
        va_params p = shape(false, d, 32, 4, b, 4, 8192);
        p.dtype = VA_DTYPE_BF16;
        va::Plan plan;
        CHECK(make_plan(p, sm90, &plan) == VA_OK, "B%d D%d: %s", b, d, va_last_error_message());
        // Head_dim 128 on sm_90: the three-stage form (kCfgGqa128RolesS3) at every row count.
        const std::string want = sm90a && d == 128            ? roles + "_s3"
                                 : sm90a && b * 4 * 8 <= sm90.num_sms ? roles
                                                                      : tile;
        CHECK(want == plan.name, "B%d x 4 KV heads, 32 rows, D%d on sm_90: %s, want %s", b, d, plan.name,
              want.c_str());
      }
    }
  }
  // Every compiled configuration is planned by some (arch, layout, shape)
  // rule: walk the plan over both target archs, every KV layout class and
  // every head-dim family, and require each configuration to come up (the
  // sm_90a ones only in a build with an sm_90a image). Prints the rules.
  {
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    struct Layout { const char* name; int kv_layout, page_size, slot_runs; };
    const Layout layouts[] = {{"flat", VA_KV_FLAT, 0, 0},         {"page 1", VA_KV_PAGED, 1, 0},
                              {"page 1 runs 64", VA_KV_PAGED, 1, 64}, {"page 16", VA_KV_PAGED, 16, 0},
                              {"page 64", VA_KV_PAGED, 64, 0}};
    struct Kind { bool mla; int d, hq, hkv; };
    // 16 drafts: 16 rows per KV head at group 1, 128 at group 8 (kernels/plan.cc
    // plans the warp-role GQA kernels above 64).
    const Kind kinds[] = {{true, 576, 16, 1}, {false, 64, 8, 8}, {false, 64, 32, 4}, {false, 128, 32, 4},
                          {false, 128, 16, 16}, {false, 256, 16, 2}};
    std::set<int> planned;
    std::printf("%-6s %-15s %-5s | %s\n", "arch", "layout", "D", "plan");
    // sm_100: no arch-specific image in this build, so the one-tile GQA
    // kernels (behind the warp-role ones where an sm_XYa image exists).
    const va::DeviceInfo sm100{0, 100, 148, 232448};
    for (const va::DeviceInfo& dev : {sm90, sm120, sm100}) {
      for (const Layout& l : layouts) {
        for (const Kind& k : kinds) {
          va_params p = shape(k.mla, k.d, k.hq, k.hkv, 2, 16, 4096);
          const int64_t row = k.mla ? 576 : int64_t{k.hkv} * k.d;
          p.kv_layout = l.kv_layout;
          p.k = reinterpret_cast<const void*>(uintptr_t{1} << 20);
          p.k_stride_token = row;
          if (l.kv_layout == VA_KV_FLAT) {
            p.num_kv_rows = 70000;
          } else {
            p.page_size = l.page_size;
            p.num_pages = 70000 / l.page_size;
            p.k_stride_page = l.page_size * row;
            p.kv_slot_runs = l.slot_runs;
          }
          va::Plan plan;
          const va_status st = make_plan(p, dev, &plan);
          CHECK(st == VA_OK, "walk sm_%d %s D%d: %s", dev.sm_arch, l.name, k.d, va_last_error_message());
          if (st != VA_OK) continue;
          planned.insert(plan.config);
          std::printf("sm_%-3d %-15s %-5d | %s\n", dev.sm_arch, l.name, k.mla ? 576 : k.d, plan.name);
        }
      }
    }
    for (int id = 0; id < va::kNumConfigs; ++id) {
      const va::ConfigDesc& d = va::config_desc(static_cast<va::ConfigId>(id));
      if (d.wgmma && !sm90a) continue;  // no sm_90a image: its kernels are stubs, never planned
      // The warp-role MLA kernels run only from an arch-specific image: the
      // walk (256 rows per KV head) plans the cluster one on sm_120 when this
      // build has sm_120a (kernels/plan.cc); the one-CTA kernel, planned up to
      // 32 rows, is checked below.
      if (id == va::kCfgMlaSplitM32N32) continue;
      // Planned from 256 rows per KV head (the walk has 128): checked below.
      if (id == va::kCfgGqa64RolesM256 || id == va::kCfgGqa128RolesM256) {
        CHECK(planned.count(id) == 0, "configuration %s planned at 128 rows per KV head", d.tag);
        continue;
      }
      if (id == va::kCfgMlaClusterM64N32 && std::string(va_compiled_archs()).find("sm_120a") == std::string::npos)
        continue;
      // The three-stage GQA kernel fits sm_90 only: planned where the build has
      // sm_90a; the two-stage one there only over fp8 caches (the walk's are bf16).
      if (id == va::kCfgGqa128RolesS3 && !sm90a) continue;
      if (id == va::kCfgGqa128Roles && std::string(va_compiled_archs()).find("sm_120a") == std::string::npos)
        continue;
      CHECK(planned.count(id) == 1, "configuration %s is compiled but no rule plans it", d.tag);
    }
  }
  // The sm_120 MLA kernels by warp roles (where the build has the device's
  // arch-specific image): the 2-CTA cluster kernel above 32 rows per KV head,
  // the one-CTA kernel up to 32; each reachable by forcing its tag; both fit
  // sm_120's 101,376 bytes; an sm_90 planned for sm_120's shared memory (bench
  // --sm120) runs the cluster kernel too. A cluster's CTAs count as CTAs for
  // the split rule.
  {
    const bool sm120a = std::string(va_compiled_archs()).find("sm_120a") != std::string::npos;
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    const char* cluster = "mma_sync_bf16_mla_cluster_m64n32";
    const char* split = "mma_sync_bf16_mla_split_m32n32";
    auto name = [&](const va_params& p, const va::DeviceInfo& dev) -> std::string {
      va::Plan plan;
      if (make_plan(p, dev, &plan) != VA_OK) return std::string("error: ") + va_last_error_message();
      return plan.name;
    };
    for (int id : {va::kCfgMlaClusterM64N32, va::kCfgMlaSplitM32N32}) {
      const va::ConfigDesc& d = va::config_desc(static_cast<va::ConfigId>(id));
      CHECK(d.smem_bytes <= 101376 && d.arch_specific && d.mla, "%s: %d bytes", d.tag, d.smem_bytes);
    }
    CHECK(va::config_desc(va::kCfgMlaClusterM64N32).cluster_x == 2 &&
              va::config_desc(va::kCfgMlaClusterM64N32).m == 64,
          "the cluster kernel: 2 CTAs per 64 rows");
    va_params many = shape(true, 576, 16, 1, 1, 3, 4096);  // 48 rows per KV head
    va_params few = shape(true, 576, 16, 1, 1, 2, 4096);   // 32
    many.dtype = few.dtype = VA_DTYPE_BF16;
    if (sm120a) {
      CHECK(name(many, sm120) == cluster, "MLA 48 rows on sm_120: %s", name(many, sm120).c_str());
      CHECK(name(few, sm120) == split, "MLA 32 rows on sm_120: %s", name(few, sm120).c_str());
      set_config("mla_split_m32n32");
      CHECK(name(many, sm120) == split, "forced split on sm_120: %s", name(many, sm120).c_str());
      set_config("mla_cluster_m64n32");
      CHECK(name(few, sm120) == cluster, "forced cluster on sm_120: %s", name(few, sm120).c_str());
      set_config("");
      // Splits: the same batch as split / cluster CTAs; the cluster's row tile
      // is one CTA of each of two SMs.
      va_params b = shape(true, 576, 16, 1, 40, 8, 32768);  // 128 rows: 2 row tiles x 2 CTAs x 40
      b.dtype = VA_DTYPE_BF16;
      va::Plan plan;
      CHECK(make_plan(b, sm120, &plan) == VA_OK && plan.config == va::kCfgMlaClusterM64N32 && plan.row_tiles == 2,
            "B40 T8 on sm_120: %s", plan.name);
      CHECK(plan.splits == va::choose_splits(40 * 2 * 2, 1024, sm120.num_sms, 1, 1),
            "cluster CTAs counted for the split rule: %d splits", plan.splits);
    } else {
      CHECK(name(many, sm120).find("mla_cluster") == std::string::npos, "no sm_120a image: %s",
            name(many, sm120).c_str());
    }
    if (sm90a) {
      set_config("mla_cluster_m64n32");
      CHECK(name(many, sm90) == cluster, "forced cluster on sm_90: %s", name(many, sm90).c_str());
      set_config("");
      g_opt.max_smem_bytes = 101376;
      CHECK(name(many, sm90) == cluster, "sm_90 planned as sm_120: %s", name(many, sm90).c_str());
      CHECK(name(few, sm90) == split, "sm_90 planned as sm_120, 32 rows: %s", name(few, sm90).c_str());
      g_opt.max_smem_bytes = 0;
    }
  }
  // The warp-role GQA kernels with 32 rows per consumer warp (256 rows per
  // CTA): within sm_120's 101,376 bytes, the plan's choice from 256 rows per
  // KV head where the build has the device's arch-specific image (the 16-row
  // kernel below), served when forced, and only for their head_dim.
  {
    const bool sm120a = std::string(va_compiled_archs()).find("sm_120a") != std::string::npos;
    const bool sm90a = std::string(va_compiled_archs()).find("sm_90a") != std::string::npos;
    auto name = [&](const va_params& p, const va::DeviceInfo& dev) -> std::string {
      va::Plan plan;
      if (make_plan(p, dev, &plan) != VA_OK) return std::string("error: ") + va_last_error_message();
      return plan.name;
    };
    struct R32 { int id, d; const char* tag; int smem; };
    const R32 r32s[] = {{va::kCfgGqa64RolesM256, 64, "gqa_d64_roles_m256n64", 51232},
                        {va::kCfgGqa128RolesM256, 128, "gqa_d128_roles_m256n64", 100384}};
    for (const R32& r : r32s) {
      const va::ConfigDesc& d = va::config_desc(static_cast<va::ConfigId>(r.id));
      CHECK(std::string(d.tag) == r.tag && d.head_dim_qk == r.d && !d.mla && d.arch_specific && d.m == 256 &&
                d.n == 64 && d.warps == 12 && d.stages == 1 && d.smem_bytes == r.smem && d.smem_bytes <= 101376,
            "%s: m %d, n %d, %d warps, %d stages, %d bytes", d.tag, d.m, d.n, d.warps, d.stages, d.smem_bytes);
      // 64 drafts x group 8: 512 rows per KV head, two row tiles; KV ranges
      // long enough that every split keeps 16 tiles or more (kMinR32Tiles).
      va_params p = shape(false, r.d, 32, 4, 2, 64, 32768);
      p.dtype = VA_DTYPE_BF16;
      const std::string forced = std::string("mma_sync_bf16_") + r.tag;
      const std::string m128 = std::string("mma_sync_bf16_gqa_d") + std::to_string(r.d) + "_roles_m128n64";
      va_params p248 = shape(false, r.d, 32, 4, 2, 31, 32768);  // 248 rows per KV head
      va_params p256 = shape(false, r.d, 32, 4, 2, 32, 32768);  // 256
      // The real-input ddtree256 (3 requests x 3 KV heads, 768 rows per KV
      // head, 1,856 KV rows): 32-row splits would keep 8 tiles each, so the
      // 16-row kernel (2 splits) instead.
      va_params shortkv = shape(false, r.d, 9, 3, 3, 256, 1856);
      p248.dtype = p256.dtype = VA_DTYPE_BF16;
      for (const va::DeviceInfo& dev : {sm90, sm120}) {
        const bool image = dev.sm_arch == 90 ? sm90a : sm120a;
        if (!image) continue;
        // Head_dim 128 on sm_90: the 16-row kernel's three-stage form at every row count.
        const bool s3 = r.d == 128 && dev.sm_arch == 90;
        const std::string big = s3 ? m128 + "_s3" : forced, small = s3 ? m128 + "_s3" : m128;
        CHECK(name(p, dev) == big, "512 rows on sm_%d: %s", dev.sm_arch, name(p, dev).c_str());
        CHECK(name(p256, dev) == big, "256 rows on sm_%d: %s", dev.sm_arch, name(p256, dev).c_str());
        CHECK(name(p248, dev) == small, "248 rows on sm_%d: %s", dev.sm_arch, name(p248, dev).c_str());
        CHECK(name(shortkv, dev) == small, "768 rows, 1,856 KV rows on sm_%d: %s", dev.sm_arch,
              name(shortkv, dev).c_str());
      }
      set_config(r.tag);
      if (sm120a) {
        va::Plan plan;
        CHECK(make_plan(p, sm120, &plan) == VA_OK && plan.name == forced && plan.row_tiles == 2,
              "forced %s on sm_120: %s", r.tag, plan.name);
      } else {
        CHECK(name(p, sm120) != forced, "forced %s without an sm_120a image: %s", r.tag, name(p, sm120).c_str());
      }
      if (sm90a) CHECK(name(p, sm90) == forced, "forced %s on sm_90: %s", r.tag, name(p, sm90).c_str());
      va_params other = shape(false, r.d == 64 ? 128 : 64, 32, 4, 2, 64, 8192);
      CHECK(name(other, sm90).find(r.tag) == std::string::npos, "%s serves D%d: %s", r.tag, other.head_dim_qk,
            name(other, sm90).c_str());
      set_config("");
    }
  }
  // The 16-row GQA kernel's three-stage form: over sm_120's 101,376 bytes,
  // so sm_120 plans two stages even when it is forced; sm_90 takes it.
  {
    const va::ConfigDesc& d = va::config_desc(va::kCfgGqa128RolesS3);
    CHECK(std::string(d.tag) == "gqa_d128_roles_m128n64_s3" && d.head_dim_qk == 128 && d.m == 128 && d.n == 64 &&
              d.stages == 3 && d.smem_bytes == 104496 && d.smem_bytes > 101376 && d.arch_specific,
          "%s: m %d, n %d, %d stages, %d bytes", d.tag, d.m, d.n, d.stages, d.smem_bytes);
    const bool sm120a = std::string(va_compiled_archs()).find("sm_120a") != std::string::npos;
    va_params p = shape(false, 128, 32, 4, 16, 16, 8192);  // 128 rows per KV head
    p.dtype = VA_DTYPE_BF16;
    set_config("gqa_d128_roles_m128n64_s3");
    va::Plan plan;
    CHECK(make_plan(p, sm120, &plan) == VA_OK && std::string(plan.name).find("_s3") == std::string::npos &&
              (!sm120a || std::string(plan.name) == "mma_sync_bf16_gqa_d128_roles_m128n64"),
          "forced three stages on sm_120: %s", plan.name);
    set_config("");
  }
  // Forced splits are honoured; no device smem small enough fails cleanly.
  {
    va_params p = shape(true, 576, 16, 1, 1, 16, 4096);
    p.num_splits = 3;
    va::Plan plan;
    CHECK(make_plan(p, sm90, &plan) == VA_OK && plan.splits == 3, "forced splits");
    const va::DeviceInfo tiny{0, 86, 84, 48 * 1024};
    CHECK(make_plan(p, tiny, &plan) == VA_ERR_UNSUPPORTED, "48 KB device must be unsupported");
  }
  // The tuning knob: a tag that names no configuration is an error naming the
  // variable and the known tags; an empty value is unset.
  {
    va_params p = shape(true, 576, 16, 1, 1, 16, 4096);
    va::Plan plan;
    set_config("mla_m32n32_s3");
    CHECK(make_plan(p, sm90, &plan) == VA_ERR_INVALID_VALUE, "unknown forced tag must fail");
    const std::string msg = va_last_error_message();
    CHECK(msg.find("options.config") != std::string::npos &&
              msg.find("'mla_m32n32_s3'") != std::string::npos &&
              msg.find("mla_m32n32_s1") != std::string::npos,
          "unknown forced tag message: %s", msg.c_str());
    set_config("");
    CHECK(make_plan(p, sm90, &plan) == VA_OK, "empty forced tag: %s", va_last_error_message());
    set_config("");
  }
  // The grid's order (kernels/plan.h, grid_coord): on the kernels that can
  // run it (the sm_90a MLA ones) a request's row tiles adjacent by default
  // (grid y holds the requests while batch_size * Hkv <= 65535), the other
  // order above that, with options.grid_order VA_GRID_REQUESTS and on the portable
  // kernels (GQA, sm_120); either way the launch grid's blocks are every
  // (request, KV head, row tile, split) exactly once, row tiles the longest
  // first along their dimension.
  {
    const std::vector<std::pair<const char*, int>> orders = {
        {"", VA_GRID_AUTO}, {"rows", VA_GRID_ROWS}, {"requests", VA_GRID_REQUESTS}, {"bogus", 7}};
    for (const auto& ord : orders) {
      const char* order = ord.first;
      for (const auto& c : std::vector<std::tuple<int, int, int, int>>{
               {1, 1, 16, 64}, {16, 1, 16, 64}, {5, 4, 32, 16}, {3, 2, 48, 100}, {65535, 1, 16, 4},
               {65536, 1, 16, 4}, {20000, 4, 32, 1}}) {
      for (const va::DeviceInfo* dev : {&sm90, &sm120}) {
        const int b = std::get<0>(c), hkv = std::get<1>(c), hq = std::get<2>(c), q = std::get<3>(c);
        va_params p = shape(hkv == 1, hkv == 1 ? 576 : 128, hq, hkv, b, q, 4096);
        g_opt.grid_order = ord.second;
        va::Plan plan;
        const va_status st = make_plan(p, *dev, &plan);
        if (std::string(order) == "bogus") {
          CHECK(fails_naming_option(st, "options.grid_order"),
                "bogus grid order must fail naming the option: %s", va_last_error_message());
          continue;
        }
        if (st != VA_OK) {
          CHECK(false, "make_plan B%d: %s", b, va_last_error_message());
          continue;
        }
        const bool fits = static_cast<int64_t>(b) * hkv <= 65535;
        const bool rows_kernel = va::config_desc(plan.config).rows_grid;
        CHECK(rows_kernel == va::config_desc(plan.config).wgmma, "rows_grid: the sm_90a kernels");
        const bool want = fits && rows_kernel && std::string(order) != "requests";
        CHECK(plan.grid_rows_fastest == want, "grid order '%s' B%d Hkv%d: %d", order, b, hkv,
              plan.grid_rows_fastest);
        unsigned gx, gy, gz;
        va::launch_grid(plan, plan.grid_rows_fastest, b, hkv, &gx, &gy, &gz);
        CHECK(gy <= 65535 && gz <= 65535, "grid y / z limits: %u %u", gy, gz);
        if (static_cast<int64_t>(gx) * gy * gz > 4000000) continue;  // the limits only
        std::set<std::tuple<int, int, int, int>> seen;
        bool ok = true;
        int prev_row_tile = -1;
        for (unsigned z = 0; z < gz; ++z)
          for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
              const va::CtaCoord cc = va::grid_coord(plan.grid_rows_fastest, hkv, x, y, z, gx, gy);
              // Balanced splits: x holds the KV heads only, z the pool (request 0 here;
              // kernels/core/balanced_splits.cuh decodes the request from z).
              ok &= cc.row_tiles == plan.row_tiles && cc.req >= 0 &&
                    cc.req < (plan.split_units > 0 ? 1 : b) && cc.hk >= 0 &&
                    cc.hk < hkv && cc.row_tile >= 0 && cc.row_tile < plan.row_tiles &&
                    cc.split == static_cast<int>(z);
              ok &= seen.insert({cc.req, cc.hk, cc.row_tile, cc.split}).second;
              // Launch order: the row tiles of a request adjacent and the
              // longest (last) first when rows are fastest.
              if (plan.grid_rows_fastest && plan.row_tiles > 1) {
                ok &= x == 0 ? cc.row_tile == plan.row_tiles - 1 : cc.row_tile == prev_row_tile - 1;
                prev_row_tile = cc.row_tile;
              }
            }
        ok &= static_cast<int64_t>(seen.size()) ==
              (plan.split_units > 0 ? static_cast<int64_t>(hkv) * plan.row_tiles * plan.split_units
                                    : static_cast<int64_t>(b) * hkv * plan.row_tiles * plan.splits);
        CHECK(ok, "grid blocks = work list, order '%s', B%d Hkv%d Hq%d q%d (grid %u x %u x %u)",
              order, b, hkv, hq, q, gx, gy, gz);
      }
      }
    }
    g_opt.grid_order = VA_GRID_AUTO;
    // Early release of the TMA kernel's stage 0 blocks 0-3: the seesaw (TMA)
    // configurations when a request's rows fit one row tile (B128 H16 T4),
    // not with several (B1 H16 T64) nor on the other kernels;
    // options.early_release VA_ON / VA_OFF forces it on the seesaw ones, a bad value fails.
    if (std::string(va_compiled_archs()).find("sm_90a") != std::string::npos) {
      // A bf16 MLA cache of `page` slots per page (1: slots in runs of 64, the
      // kv_slot_runs hint), laid out as the TMA kernels need.
      auto mla_cache = [&](int b, int hq, int q, int page) {
        va_params p = shape(true, 576, hq, 1, b, q, 4096);
        p.dtype = VA_DTYPE_BF16;
        p.kv_layout = VA_KV_PAGED;
        p.page_size = page;
        p.num_pages = 100000;
        p.k = reinterpret_cast<const void*>(uintptr_t{1} << 20);
        p.k_stride_token = 576;
        p.k_stride_page = static_cast<int64_t>(page) * 576;
        if (page == 1) p.kv_slot_runs = 64;
        return p;
      };
      const std::vector<std::pair<const char*, int>> knobs = {
          {"", VA_AUTO}, {"1", VA_ON}, {"0", VA_OFF}, {"yes", 9}};
      for (const auto& kv : knobs) {
        const char* knob = kv.first;
        g_opt.early_release = kv.second;
        // {batch, heads, q_len, page_size, one row tile per request}
        for (const auto& c : std::vector<std::tuple<int, int, int, int, bool>>{
                 {128, 16, 4, 64, true}, {1, 16, 64, 64, false}, {4, 16, 4, 1, true},
                 {4, 16, 64, 1, false}, {4, 16, 4, 16, true}}) {
          const int b = std::get<0>(c), hq = std::get<1>(c), q = std::get<2>(c);
          const int page = std::get<3>(c);
          va_params p = mla_cache(b, hq, q, page);
          va::Plan plan;
          const va_status st = make_plan(p, sm90, &plan);
          if (std::string(knob) == "yes") {
            CHECK(fails_naming_option(st, "options.early_release"),
                  "bad options.early_release must fail naming it: %s", va_last_error_message());
            continue;
          }
          CHECK(st == VA_OK, "make_plan B%d q%d: %s", b, q, va_last_error_message());
          const bool seesaw = plan.config == va::kCfgMlaWgmmaSeesawTma ||
                              plan.config == va::kCfgMlaWgmmaSeesawRows;
          CHECK(seesaw == (page != 16), "page %d: the TMA kernels at page 64 and hinted page 1 (%s)",
                page, plan.name);
          const bool want = seesaw && (*knob ? std::string(knob) == "1" : std::get<4>(c));
          CHECK(plan.early_a0_release == want, "early_a0 '%s' B%d H%d q%d page %d (%s): %d", knob,
                b, hq, q, page, plan.name, plan.early_a0_release);
        }
      }
      g_opt.early_release = VA_AUTO;
    }
    // The sm_90a MLA kernel on sm_90 takes the rows-first grid by default.
    if (std::string(va_compiled_archs()).find("sm_90a") != std::string::npos) {
      va::Plan plan;
      va_params p = shape(true, 576, 16, 1, 16, 64, 32768);
      CHECK(make_plan(p, sm90, &plan) == VA_OK && plan.grid_rows_fastest,
            "MLA B16 on sm_90: rows-first grid (%s; %s)", plan.name, va_last_error_message());
      CHECK(make_plan(p, sm120, &plan) == VA_OK && !plan.grid_rows_fastest,
            "MLA B16 on sm_120: request-major grid (%s; %s)", plan.name, va_last_error_message());
    }
  }
  // The work list the launch grid stands for covers every (request, row tile,
  // KV tile) exactly once, every output row once, and stays inside the
  // workspace: random ragged length mixes, tree and causal, both archs.
  {
    std::mt19937 rng(12345);
    int mixes = 0, balanced = 0;
    bool ok_pool = true;
    for (int trial = 0; trial < 200; ++trial) {
      const bool mla = trial % 2 == 0;
      const bool causal = trial % 3 == 0;
      const int hkv = mla ? 1 : 1 << (rng() % 3);
      const int group = mla ? (trial % 10 == 0 ? 128 : 1 + rng() % 24) : 1 + rng() % 16;
      const int hq = hkv * group;
      const int b = 1 + rng() % 8;
      std::vector<int> q_len(b), kv_len(b);
      int max_q = 1, total_q = 0;
      long max_kv = 1;
      for (int i = 0; i < b; ++i) {
        q_len[i] = rng() % 5 == 0 ? 0 : 1 + rng() % (rng() % 4 ? 16 : 160);
        kv_len[i] = q_len[i] + (rng() % 3 == 0 ? 0 : rng() % 50000);
        max_q = std::max(max_q, q_len[i]);
        max_kv = std::max<long>(max_kv, kv_len[i]);
        total_q += q_len[i];
      }
      va_params p = shape(mla, mla ? 576 : 128, hq, hkv, b, max_q, max_kv);
      p.total_q = total_q;
      p.mask_mode = causal ? VA_MASK_CAUSAL : VA_MASK_TREE;
      p.num_splits = trial % 4 == 1 ? 1 + rng() % 40 : 0;
      const va::DeviceInfo& dev = trial % 5 == 0 ? sm120 : sm90;
      // Half of the GQA mixes balanced wherever the kernel can, the others by the plan's rule.
      g_opt.balance_splits = (trial / 2) % 2 ? VA_ON : VA_AUTO;
      va::Plan plan;
      const va_status st = make_plan(p, dev, &plan);
      g_opt.balance_splits = VA_AUTO;
      if (st != VA_OK) {
        CHECK(false, "make_plan: %s", va_last_error_message());
        continue;
      }
      const va::ConfigDesc& d = va::config_desc(plan.config);
      const bool ws = plan.workspace_bytes > 0;  // a pair of splits combines its rows without one
      const int64_t ws_rows_cap = ws
          ? static_cast<int64_t>(plan.ws_o_bytes / (sizeof(float) * p.head_dim_vo)) : 0;
      // Each request's split count: plan.splits, or with balanced splits the
      // kernel's allocation of the pool by these lengths.
      std::vector<int> req_splits(b, plan.splits);
      if (plan.split_units > 0) {
        req_splits = balanced_counts(kv_len, d.n, plan.split_units, plan.splits);
        int64_t used = 0;
        for (int s : req_splits) used += s;
        ok_pool &= used <= plan.split_units && b >= 2 && b <= va::kMaxBalancedBatch;
        ++balanced;
      }
      std::set<std::tuple<int, int, int>> kv_seen;     // (request, row tile, KV tile)
      std::set<std::pair<int64_t, int>> rows_seen;     // (token, head)
      std::set<int64_t> ws_seen;
      bool ok = true;
      int q_start = 0;
      for (int i = 0; i < b; ++i) {
        const int R = q_len[i] * plan.group;
        const int prefix = kv_len[i] - q_len[i];
        for (int hk = 0; hk < hkv; ++hk)
          for (int y = 0; y < plan.row_tiles; ++y) {
            const int row0 = y * d.m;
            if (row0 >= R) continue;  // the kernel's CTA exits
            const int tiles = va::row_tile_kv_tiles(row0, d.m, R, plan.group, kv_len[i], prefix,
                                                    causal, d.n);
            for (int z = 0; z < req_splits[i]; ++z) {
              int t0, t1;
              va::split_tile_range(z, req_splits[i], tiles, &t0, &t1);
              ok &= 0 <= t0 && t0 <= t1 && t1 <= tiles;
              for (int t = t0; t < t1; ++t) ok &= kv_seen.insert({i, y * hkv + hk, t}).second;
              for (int r = row0; r < std::min(row0 + d.m, R); ++r) {
                const int64_t token = q_start + r / plan.group;
                const int head = hk * plan.group + r % plan.group;
                if (z == 0) ok &= rows_seen.insert({token, head}).second;
                if (ws) {
                  const int64_t w = va::workspace_row(z, plan.ws_rows, token, hq, head);
                  ok &= w >= 0 && w < plan.splits * ws_rows_cap && ws_seen.insert(w).second;
                }
              }
            }
            // every KV tile of this row tile visited exactly once
            for (int t = 0; t < tiles; ++t) ok &= kv_seen.count({i, y * hkv + hk, t}) == 1;
          }
        q_start += q_len[i];
      }
      ok &= static_cast<int64_t>(rows_seen.size()) == static_cast<int64_t>(total_q) * hq;
      CHECK(ok, "work list coverage, trial %d (B=%d Hq=%d splits=%d causal=%d)", trial, b, hq,
            plan.splits, causal);
      ++mixes;
    }
    CHECK(ok_pool, "balanced splits: a pool's CTAs cover every request's splits");
    CHECK(balanced > 0, "some random mixes plan balanced splits");
    std::printf("work list checked on %d random length mixes (%d balanced)\n", mixes, balanced);
  }
  // fp8 (e4m3) caches: the GQA warp-role kernels at every row count (the only
  // configurations with fp8 instances; here also where a q-dtype cache takes
  // the one-tile kernel), "_e4m3kv" in the name, a forced configuration
  // without fp8 instances left to the rules; MLA on the sm_90a cp.async
  // kernel at every layout on sm_90, on the cluster kernel at every row count
  // on sm_120 (16 rows included, where a q-dtype cache takes the split
  // kernel); head_dim 256 on its one-tile kernels (two stages where they fit,
  // sm_90; one on sm_120), with or without an arch-specific image.
  {
    const std::string archs = va_compiled_archs();
    struct F { int d, hq, hkv, b, q; long kv; };
    const F fs[] = {{64, 8, 8, 64, 4, 4096},     // 32 rows per KV head, 512 request-heads
                    {128, 32, 4, 16, 16, 8192},  // 128 rows
                    {128, 32, 4, 1, 64, 32768},  // 512 rows: 32-row warps
                    {64, 9, 3, 3, 256, 1856}};
    // Without the arch-specific image (no kernel with an fp8 instance): refused naming kv_dtype.
    auto refused_kv_dtype = [](va_status st) {
      return st == VA_ERR_UNSUPPORTED && std::string(va_last_error_message()).find("kv_dtype") == 0;
    };
    for (const va::DeviceInfo& dev : {sm120, sm90}) {
      const bool roles = archs.find(dev.sm_arch == 90 ? "sm_90a" : "sm_120a") != std::string::npos;
      for (const F& f : fs) {
        va_params p = shape(false, f.d, f.hq, f.hkv, f.b, f.q, f.kv);
        p.kv_dtype = VA_KV_DTYPE_FP8_E4M3;
        for (const char* forced : {"", f.d == 64 ? "gqa_d64_m64n64_s2" : "gqa_d128_m64n64_s2"}) {
          set_config(forced);
          va::Plan plan;
          const va_status st = make_plan(p, dev, &plan);
          if (!roles) {
            CHECK(refused_kv_dtype(st), "fp8 without a warp-role image on sm_%d: %s", dev.sm_arch,
                  va_last_error_message());
            continue;
          }
          CHECK(st == VA_OK, "fp8 D%d on sm_%d: %s", f.d, dev.sm_arch, va_last_error_message());
          if (st != VA_OK) continue;
          CHECK(plan.kv_fp8 && va::config_desc(plan.config).kv_fp8 && va::config_desc(plan.config).arch_specific,
                "fp8 D%d q%d on sm_%d planned %s", f.d, f.q, dev.sm_arch, plan.name);
          CHECK(std::string(plan.name).find("_e4m3kv_gqa_") != std::string::npos, "fp8 plan name %s", plan.name);
          // No three-stage form for an fp8 cache (kernels/plan.cc): the 32-row kernel from 256 rows.
          CHECK(std::string(plan.name).find("_s3") == std::string::npos, "fp8 D%d q%d on sm_%d planned %s", f.d,
                f.q, dev.sm_arch, plan.name);
        }
        set_config("");
      }
      for (const int q : {1, 4, 64}) {
        va_params p = shape(true, 576, 16, 1, 2, q, 4096);
        p.kv_dtype = VA_KV_DTYPE_FP8_E4M3;
        va::Plan plan;
        const va_status st = make_plan(p, dev, &plan);
        if (!roles) {
          CHECK(refused_kv_dtype(st), "fp8 MLA without a warp-role image on sm_%d: %s", dev.sm_arch,
                va_last_error_message());
          continue;
        }
        // sm_90a: the cp.async wgmma kernel (its producer converts in place); else the cluster kernel.
        const bool wgmma = dev.sm_arch == 90;
        CHECK(st == VA_OK && plan.kv_fp8 &&
                  plan.config == (wgmma ? va::kCfgMlaWgmmaM64N64PR : va::kCfgMlaClusterM64N32) &&
                  std::string(plan.name).find(wgmma ? "_e4m3kv_mla_wgmma_m64n64_pipe_rows" : "_e4m3kv_mla_cluster_m64n32") !=
                      std::string::npos,
              "fp8 MLA T%d on sm_%d: %d %s %s", q, dev.sm_arch, st, st == VA_OK ? plan.name : "",
              va_last_error_message());
      }
      {
        va_params p = shape(false, 256, 16, 2, 1, 16, 4096);
        p.kv_dtype = VA_KV_DTYPE_FP8_E4M3;
        va::Plan plan;
        const va_status st = make_plan(p, dev, &plan);
        const char* want = dev.sm_arch == 90 ? "_e4m3kv_gqa_d256_m64n32_s2" : "_e4m3kv_gqa_d256_m64n32_s1";
        CHECK(st == VA_OK && plan.kv_fp8 && std::string(plan.name).find(want) != std::string::npos,
              "fp8 D256 on sm_%d: %d %s %s", dev.sm_arch, st, st == VA_OK ? plan.name : "", va_last_error_message());
      }
    }
  }
  // Balanced splits: the share rule (the real-input ddtree256 and ddtree16
  // batches, in 64-row KV tiles) and when the plan takes it.
  {
    using V = std::vector<int>;
    CHECK(balanced_counts({576, 1056, 1856}, 64, 6, 4) == (V{1, 2, 3}), "ddtree256, 6 units: 1, 2, 3 splits");
    CHECK(balanced_counts({336, 816, 1616}, 64, 30, 26) == (V{3, 7, 13}), "ddtree16, 30 units: 3, 7, 13");
    CHECK(balanced_counts({1664, 1664, 1664}, 64, 30, 26) == (V{9, 9, 9}), "equal lengths: equal splits");
    CHECK(balanced_counts({0, -5, 64}, 64, 6, 4) == (V{1, 1, 1}), "empty and bad lengths: one split each");
    CHECK(balanced_counts({64000, 64}, 64, 8, 7) == (V{7, 1}), "a request's splits stop at the slots");
    // A ragged GQA batch on the warp-role kernel (sm_90 and as on sm_120):
    // the plan's split count times the batch, pooled; the workspace holds a
    // request's most splits. VA_ON balances wherever the kernel can, VA_AUTO
    // only where a split of max_kv_len holds 8 KV tiles or more (4k rows:
    // 64 tiles in more than 8 splits; 64k rows: 1,024 tiles).
    for (const va::DeviceInfo* dev : {&sm90, &sm120}) {
      va_params p = shape(false, 128, 16, 2, 3, 16, 4096);
      g_opt.balance_splits = VA_OFF;
      va::Plan off;
      CHECK(make_plan(p, *dev, &off) == VA_OK && off.split_units == 0 && off.splits > 8, "balance off: %d splits",
            off.splits);
      g_opt.balance_splits = VA_AUTO;
      va::Plan automatic;
      CHECK(make_plan(p, *dev, &automatic) == VA_OK && automatic.split_units == 0 &&
                automatic.splits == off.splits,
            "auto, %d tiles per split: not balanced (%d units)", (64 + off.splits - 1) / off.splits,
            automatic.split_units);
      g_opt.balance_splits = VA_ON;
      va::Plan on;
      CHECK(make_plan(p, *dev, &on) == VA_OK, "%s", va_last_error_message());
      va_params longer = shape(false, 128, 16, 2, 3, 16, 65536);
      g_opt.balance_splits = VA_AUTO;
      va::Plan long_auto;
      CHECK(make_plan(longer, *dev, &long_auto) == VA_OK, "%s", va_last_error_message());
      // The warp-role kernel where the build has the device's arch-specific
      // image; the one-tile kernel (no balanced splits) otherwise.
      if (va::config_desc(on.config).balance) {
        CHECK(on.split_units == 3 * off.splits && on.splits == std::min(on.split_units - 2, 64) &&
                  on.workspace_bytes > off.workspace_bytes,
              "balanced: %d units, %d slots (unbalanced %d splits)", on.split_units, on.splits, off.splits);
        unsigned gx, gy, gz;
        va::launch_grid(on, false, 3, 2, &gx, &gy, &gz);
        CHECK(gx == 2 && gz == static_cast<unsigned>(on.split_units), "balanced grid %u x %u x %u", gx, gy, gz);
        CHECK(long_auto.split_units > 0 && long_auto.split_units % 3 == 0 &&
                  1024 / (long_auto.split_units / 3) >= 8,
              "auto, 64k rows: balanced (%d units, %s)", long_auto.split_units, long_auto.name);
      } else {
        CHECK(on.split_units == 0 && on.splits == off.splits, "%s: no balanced splits", on.name);
        CHECK(long_auto.split_units == 0, "%s: no balanced splits", long_auto.name);
      }
      // Where even VA_ON does not balance.
      g_opt.balance_splits = VA_ON;
      va::Plan other;
      p.num_splits = 4;
      CHECK(make_plan(p, *dev, &other) == VA_OK && other.split_units == 0 && other.splits == 4, "forced splits");
      p.num_splits = 0;
      p.kv_dtype = VA_KV_DTYPE_FP8_E4M3;
      // (no fp8 instance of the one-tile D128 kernel: such a build plans none)
      if (make_plan(p, *dev, &other) == VA_OK)
        CHECK(other.kv_fp8 && other.split_units == 0, "fp8 cache: per-request splits (%s)", other.name);
      p.kv_dtype = VA_KV_DTYPE_AS_Q;
      va_params one = shape(false, 128, 16, 2, 1, 16, 4096);
      CHECK(make_plan(one, *dev, &other) == VA_OK && other.split_units == 0 && other.splits > 1, "one request");
      va_params many = shape(false, 128, 16, 2, 33, 16, 4096);
      CHECK(make_plan(many, *dev, &other) == VA_OK && other.split_units == 0, "33 requests");
      va_params mla = shape(true, 576, 16, 1, 3, 16, 4096);
      CHECK(make_plan(mla, *dev, &other) == VA_OK && other.split_units == 0, "MLA: %s", other.name);
    }
    g_opt.balance_splits = 9;
    va::Plan bad;
    CHECK(fails_naming_option(make_plan(shape(false, 128, 16, 2, 3, 16, 4096), sm90, &bad), "options.balance_splits"),
          "a bad switch fails naming it: %s", va_last_error_message());
    g_opt.balance_splits = VA_AUTO;
  }
  // A pair of splits (kernels/core/pair_combine.cuh): two splits on a 16-row
  // GQA warp-role kernel run as one cluster and need no workspace, the plan's
  // own two splits too (before balanced splits); three splits, an fp8 cache
  // and the other kernels keep the workspace and the merge.
  for (const va::DeviceInfo* dev : {&sm90, &sm120}) {
    // B16 H32/4 T16 L8k: the plan's own 2 splits on 132 SMs (5 on sm_120's 188), forced on sm_120.
    va_params p = shape(false, 128, 32, 4, 16, 16, 8192);
    if (dev->sm_arch != 90) p.num_splits = 2;
    va::Plan automatic, three, fp8, one_tile;
    CHECK(make_plan(p, *dev, &automatic) == VA_OK, "%s", va_last_error_message());
    p.num_splits = 3;
    CHECK(make_plan(p, *dev, &three) == VA_OK && !three.pair_splits && three.workspace_bytes > 0, "3 splits: %s",
          three.name);
    set_config("gqa_d128_m64n64_s2");
    p.num_splits = 2;
    CHECK(make_plan(p, *dev, &one_tile) == VA_OK && !one_tile.pair_splits && one_tile.workspace_bytes > 0,
          "the one-tile kernel: %s", one_tile.name);
    set_config("");
    if (va::config_desc(automatic.config).pair) {
      CHECK(automatic.splits == 2 && automatic.pair_splits && automatic.split_units == 0 &&
                automatic.workspace_bytes == 0,
            "%s sm_%d: a pair (%d splits, %d units)", automatic.name, dev->sm_arch, automatic.splits,
            automatic.split_units);
      g_opt.pair_splits = VA_OFF;
      va::Plan off;
      CHECK(make_plan(p, *dev, &off) == VA_OK && !off.pair_splits && off.splits == 2 && off.workspace_bytes > 0,
            "pair off: %s", off.name);
      g_opt.pair_splits = VA_AUTO;
      p.kv_dtype = VA_KV_DTYPE_FP8_E4M3;
      CHECK(make_plan(p, *dev, &fp8) == VA_OK && !fp8.pair_splits && fp8.workspace_bytes > 0, "fp8: %s",
            fp8.name);
    } else {
      CHECK(!automatic.pair_splits, "%s: no pair", automatic.name);
    }
  }
  {
    g_opt.pair_splits = 5;
    va::Plan bad;
    CHECK(fails_naming_option(make_plan(shape(false, 128, 16, 2, 3, 16, 4096), sm90, &bad), "options.pair_splits"),
          "a bad switch fails naming it: %s", va_last_error_message());
    g_opt.pair_splits = VA_AUTO;
  }
  // Split choice avoids a partial last wave.
  CHECK(va::choose_splits(16, 1026, 132, 1) == 8, "B1 H16 T64 L32k: 8 splits (one wave)");
  CHECK(va::choose_splits(128, 129, 132, 1) == 1, "128 CTAs already fill the GPU");
  CHECK(va::choose_splits(1, 3, 132, 1) == 1, "too few tiles to split");
  // The sm_90a kernels' tile pairs (granule 2) and their cost model
  // (kernels/plan.cc): an odd share costs its whole last pair, and a split grid
  // counts its waves over 97% of the SMs (these counts ran fastest among the
  // forced ones on the H200).
  CHECK(va::choose_splits(4, 65, 132, 1, 2) == 17, "B1 H16 T16 L4k: 17 splits of 2 pairs");
  CHECK(va::choose_splits(4, 513, 132, 1, 2) == 29,
        "B1 H16 T16 L32k: 29 splits (116 CTAs), not 33 (132: every SM)");
  CHECK(va::choose_splits(4, 65, 132, 1, 1) == 13,
        "B1 H16 T16 L4k on a portable kernel (granule 1, its own model): 13 splits");
  CHECK(va::choose_splits(8, 65, 132, 1, 2) == 11, "B1 H16 T32 L4k: 11 splits");
  CHECK(va::choose_splits(16, 513, 132, 1, 2) == 8, "B1 H16 T64 L32k on the TMA kernel: 8 splits");
  CHECK(va::choose_splits(64, 129, 132, 1, 2) == 2, "B1 H128 T32 L8k: 2 splits");
  CHECK(va::choose_splits(16, 65, 132, 1, 2) <= 8, "B1 H64 T16 L4k: one wave");
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
