// Host-side plan: tile configuration, split-K count and workspace size.
#include "kernels/plan.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "kernels/status.h"

namespace verify_attn {
namespace {

template <int ID>
constexpr ConfigDesc make_desc(const char* tag) {
  using S = typename ConfigShape<ID>::type;
  return ConfigDesc{tag, S::kM, S::kN, S::kWarps, S::kStages, S::kSmemBytes};
}

const ConfigDesc kDescs[kNumConfigs] = {
    make_desc<kCfgMlaM64N32S2>("mla_m64n32_s2"),
    make_desc<kCfgMlaM32N32S2>("mla_m32n32_s2"),
    make_desc<kCfgMlaM32N32S1>("mla_m32n32_s1"),
    make_desc<kCfgGqa64M64N64S2>("gqa_d64_m64n64_s2"),
    make_desc<kCfgGqa128M64N64S2>("gqa_d128_m64n64_s2"),
    make_desc<kCfgGqa256M64N32S2>("gqa_d256_m64n32_s2"),
    make_desc<kCfgGqa256M64N32S1>("gqa_d256_m64n32_s1"),
};

// Split-K rule: only when the unsplit grid is under one wave; then aim at
// about two waves of CTAs, but give every split at least this many KV tiles.
constexpr int kMinTilesPerSplit = 4;
constexpr int kMaxAutoSplits = 128;

}  // namespace

const ConfigDesc& config_desc(ConfigId id) { return kDescs[id]; }

va_status query_device(DeviceInfo* info) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; do not leak it into the caller's next check
    return va_fail(VA_ERR_NO_DEVICE, "device: cudaGetDevice failed (%s: %s)",
                   cudaGetErrorName(e), cudaGetErrorString(e));
  }
  int major = 0, minor = 0, sms = 0, smem = 0;
  va_status st;
  if ((st = va_check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                          "cudaDeviceGetAttribute(ComputeCapabilityMajor)")) != VA_OK)
    return st;
  if ((st = va_check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                          "cudaDeviceGetAttribute(ComputeCapabilityMinor)")) != VA_OK)
    return st;
  if ((st = va_check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                          "cudaDeviceGetAttribute(MultiProcessorCount)")) != VA_OK)
    return st;
  if ((st = va_check_cuda(
           cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
           "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)")) != VA_OK)
    return st;
  info->device = dev;
  info->sm_arch = major * 10 + minor;
  info->num_sms = sms;
  info->max_smem_optin = smem;
  return VA_OK;
}

va_status make_plan(const va_params& p, const DeviceInfo& dev, Plan* plan) {
  const bool mla = p.v_is_k_prefix == 1;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t rows_max = static_cast<int64_t>(std::max(p.max_q_len, 1)) * group;

  // Candidate configurations, best first; the first that fits the device's
  // shared memory wins.
  ConfigId cands[3];
  int n = 0;
  if (mla) {
    if (rows_max > 32) cands[n++] = kCfgMlaM64N32S2;
    cands[n++] = kCfgMlaM32N32S2;
    cands[n++] = kCfgMlaM32N32S1;
  } else if (p.head_dim_qk == 64) {
    cands[n++] = kCfgGqa64M64N64S2;
  } else if (p.head_dim_qk == 128) {
    cands[n++] = kCfgGqa128M64N64S2;
  } else {
    cands[n++] = kCfgGqa256M64N32S2;
    cands[n++] = kCfgGqa256M64N32S1;
  }
  int chosen = -1;
  for (int i = 0; i < n; ++i) {
    if (kDescs[cands[i]].smem_bytes <= dev.max_smem_optin) {
      chosen = cands[i];
      break;
    }
  }
  if (chosen < 0) {
    return va_fail(VA_ERR_UNSUPPORTED,
                   "device: no tile configuration fits %d bytes of shared memory per block "
                   "(sm_%d; smallest needs %d)",
                   dev.max_smem_optin, dev.sm_arch, kDescs[cands[n - 1]].smem_bytes);
  }
  const ConfigDesc& d = kDescs[chosen];

  const int64_t row_tiles = (rows_max + d.m - 1) / d.m;
  const int64_t ctas = static_cast<int64_t>(p.batch_size) * p.num_kv_heads * row_tiles;
  int64_t splits = 1;
  if (p.num_splits > 0) {
    splits = p.num_splits;
  } else if (ctas < dev.num_sms && p.max_kv_len > 0 && ctas > 0) {
    const int64_t kv_tiles = (p.max_kv_len + d.n - 1) / d.n;
    const int64_t want = (2 * static_cast<int64_t>(dev.num_sms) + ctas - 1) / ctas;
    const int64_t cap = std::max<int64_t>(1, kv_tiles / kMinTilesPerSplit);
    splits = std::min<int64_t>(std::min<int64_t>(want, cap), kMaxAutoSplits);
  }
  if (row_tiles > 65535)
    return va_fail(VA_ERR_UNSUPPORTED, "max_q_len: %d rows per KV head need %lld row tiles (> 65535)",
                   p.max_q_len, static_cast<long long>(row_tiles));
  if (splits > 65535)
    return va_fail(VA_ERR_INVALID_VALUE, "num_splits: at most 65535 (got %lld)",
                   static_cast<long long>(splits));
  if (static_cast<int64_t>(p.batch_size) * p.num_kv_heads > 0x7fffffff)
    return va_fail(VA_ERR_INVALID_VALUE, "batch_size: batch_size * num_kv_heads exceeds 2^31-1");

  plan->config = static_cast<ConfigId>(chosen);
  plan->group = group;
  plan->row_tiles = static_cast<int>(row_tiles);
  plan->splits = static_cast<int>(splits);
  plan->ws_rows = static_cast<int64_t>(p.total_q) * p.num_qo_heads;
  if (splits > 1) {
    plan->ws_o_bytes = static_cast<size_t>(splits) * plan->ws_rows * p.head_dim_vo * sizeof(float);
    plan->workspace_bytes =
        plan->ws_o_bytes + static_cast<size_t>(splits) * plan->ws_rows * sizeof(float);
  } else {
    plan->ws_o_bytes = 0;
    plan->workspace_bytes = 0;
  }
  plan->dev = dev;
  std::snprintf(plan->name, sizeof(plan->name), "mma_sync_%s_%s",
                p.dtype == VA_DTYPE_BF16 ? "bf16" : "fp16", d.tag);
  return VA_OK;
}

}  // namespace verify_attn
