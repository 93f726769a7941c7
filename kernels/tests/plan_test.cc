// Host plan tests (no GPU): the configuration chosen for each arch fits its
// shared memory (sm_120: 101376 bytes per block; sm_90: 232448), and the
// split-K rule fills the GPU only when the batch alone cannot. Prints the
// resource table (the CI log records what sm_120 would run).
#include <cstdio>
#include <initializer_list>

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
      va_status s = va::make_plan(p, dev, &plan);
      CHECK(s == VA_OK, "make_plan sm_%d: %s", dev.sm_arch, va_last_error_message());
      if (s != VA_OK) continue;
      const va::ConfigDesc& d = va::config_desc(plan.config);
      std::printf("sm_%-3d %-4s %-4d %-4d %-4d %-5d %-7ld | %-32s %-7d %-6d %zu\n", dev.sm_arch,
                  c.mla ? "MLA" : "GQA", c.d, c.hq, c.b, c.q, c.kv, plan.name, d.smem_bytes,
                  plan.splits, plan.workspace_bytes);
      CHECK(d.smem_bytes <= dev.max_smem_optin, "%s needs %d bytes > %d on sm_%d", plan.name,
            d.smem_bytes, dev.max_smem_optin, dev.sm_arch);
      CHECK(plan.splits >= 1, "splits >= 1");
      CHECK((plan.splits > 1) == (plan.workspace_bytes > 0), "workspace iff split");
      // A batch that already fills the SMs is never split.
      const long ctas = static_cast<long>(c.b) * c.hkv * plan.row_tiles;
      if (ctas >= dev.num_sms) CHECK(plan.splits == 1, "%s: %ld CTAs but %d splits", plan.name, ctas, plan.splits);
    }
  }
  // Forced splits are honoured; no device smem small enough fails cleanly.
  {
    va_params p = shape(true, 576, 16, 1, 1, 16, 4096);
    p.num_splits = 3;
    va::Plan plan;
    CHECK(va::make_plan(p, sm90, &plan) == VA_OK && plan.splits == 3, "forced splits");
    const va::DeviceInfo tiny{0, 86, 84, 48 * 1024};
    CHECK(va::make_plan(p, tiny, &plan) == VA_ERR_UNSUPPORTED, "48 KB device must be unsupported");
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
