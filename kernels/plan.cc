// Host-side plan: tile configuration, split-K count and workspace size.
#include "kernels/plan.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <string>
#include <cstdio>

#include "kernels/status.h"

namespace verify_attn {
namespace {

// The sm_90a MLA kernels work in tile pairs and run an odd count's last pair
// as tile A alone, about half a pair: a split's share is counted in pairs. The
// portable kernels go tile by tile.
template <class S>
constexpr int tile_granule() {
  return S::kWgmma ? 2 : 1;
}

template <int ID>
constexpr ConfigDesc make_desc(const char* tag) {
  using S = typename ConfigShape<ID>::type;
  return ConfigDesc{tag,          S::kVIsK,      S::kDqk,   S::kDv,
                    S::kM,        S::kN,         S::kWarps, S::kStages,
                    S::kSmemBytes, S::kMinBlocks, S::kWgmma ? 90 : 0, S::kWgmma,
                    tile_granule<S>(), S::kRowsGrid, k_by_tma<S>(), S::kSplitRoles,
                    S::kClusterX, kv_fp8_ok<S>(), kBalancesSplits<S>, kPairsSplits<S>};
}

const ConfigDesc kDescs[kNumConfigs] = {
    make_desc<kCfgMlaM32N32S1>("mla_m32n32_s1"),
    make_desc<kCfgGqa64M64N64S2>("gqa_d64_m64n64_s2"),
    make_desc<kCfgGqa128M64N64S2>("gqa_d128_m64n64_s2"),
    make_desc<kCfgGqa256M64N32S2>("gqa_d256_m64n32_s2"),
    make_desc<kCfgGqa256M64N32S1>("gqa_d256_m64n32_s1"),
    make_desc<kCfgMlaWgmmaM64N64PR>("mla_wgmma_m64n64_pipe_rows"),
    make_desc<kCfgMlaWgmmaSeesawTma>("mla_wgmma_seesaw_tma"),
    make_desc<kCfgMlaWgmmaSeesawRows>("mla_wgmma_seesaw_tma_rows"),
    make_desc<kCfgMlaSplitM32N32>("mla_split_m32n32"),
    make_desc<kCfgGqa64Roles>("gqa_d64_roles_m128n64"),
    make_desc<kCfgGqa128Roles>("gqa_d128_roles_m128n64"),
    make_desc<kCfgMlaClusterM64N32>("mla_cluster_m64n32"),
    make_desc<kCfgGqa64RolesM256>("gqa_d64_roles_m256n64"),
    make_desc<kCfgGqa128RolesM256>("gqa_d128_roles_m256n64"),
    make_desc<kCfgGqa128RolesS3>("gqa_d128_roles_m128n64_s3"),
};

// Split-K rule: only when the unsplit grid is under one wave; then aim at
// about two waves of CTAs, but give every split about this many KV tiles or
// more (choose_splits: the sm_90a kernels' pairs / the portable kernels).
constexpr int kMinTilesPerSplit = 4;
constexpr int kMinPortableTilesPerSplit = 3;
constexpr int kMaxAutoSplits = 128;
// The 32-row GQA kernel only where each CTA keeps at least this many KV tiles
// (make_plan).
constexpr int kMinR32Tiles = 16;
// Balanced splits by the plan's rule (VA_AUTO) only where a split of the
// longest request holds at least this many KV tiles: the device-side
// allocation costs a few dependent loads before a CTA's first tile, which
// only a balance that takes tiles off the longest request's splits repays
// (BENCHMARKS.md table 5).
constexpr int kMinBalancedSplitTiles = 8;

// The wgmma kernel has a body only in an sm_90a image (a plain sm_90 or
// compute_90 image gets a stub that traps): never plan it without one.
bool built_sm90a() {
  static const bool built = [] {
    const char* archs = va_compiled_archs();
    return archs != nullptr && std::strstr(archs, "sm_90a") != nullptr;
  }();
  return built;
}

// Whether the K cache can be read by bulk tensor copies (the tensor maps of
// kernels/sm90/tma_host.h): a flat MLA cache (one KV head; the rows map, a
// tile is 64 consecutive rows from any first row) with a 16-byte aligned base
// and a token stride >= 576 elements, a multiple of 16 bytes, the whole cache
// below 2^40 bytes; or a paged MLA cache (one KV head) with page_size a
// multiple of 64 (a 64-row tile lies in one page), a 16-byte aligned base,
// token / page strides that are multiples of 16 bytes below 2^40, and a
// page-major layout whose rows do not overlap (token stride >= 576, page
// stride >= page_size x token stride): cuTensorMapEncodeTiled's rules
// (cuda.h) for the map of kernels/sm90/tma_host.h. A cache outside them takes
// the cp.async kernel, which reads any layout the C-ABI accepts.
bool tma_k_cache_ok(const va_params& p) {
  if (p.v_is_k_prefix != 1 || p.num_kv_heads != 1) return false;
  const int64_t lim = int64_t{1} << 39;  // elements: 2 bytes each, below 2^40 bytes
  auto stride_ok = [&](int64_t e) { return e > 0 && e < lim && (e * 2) % 16 == 0; };
  if (p.kv_layout == VA_KV_FLAT)  // the rows map: one 64-row box per tile, any first row
    return rows_map_ok(p.k, p.k_stride_token, p.num_kv_rows);
  if (p.kv_layout != VA_KV_PAGED) return false;
  if (p.page_size <= 0 || p.page_size % 64 != 0 || p.num_pages < 1 || p.num_pages > 0x7fffffff)
    return false;
  return reinterpret_cast<uintptr_t>(p.k) % 16 == 0 && stride_ok(p.k_stride_token) &&
         stride_ok(p.k_stride_page) && p.k_stride_token >= 576 &&
         p.k_stride_page / p.page_size >= p.k_stride_token;  // page >= page_size rows, no overflow
}

// The rows-map configuration (kCfgMlaWgmmaSeesawRows): a paged MLA cache of
// page_size 1 whose slots the caller says come in runs of a multiple of 64
// (va_params.kv_slot_runs), under the rows map's rules (rows_map_ok,
// kernels/plan.h) with page stride = token stride.
bool rows_hint_ok(const va_params& p) {
  if (p.kv_layout != VA_KV_PAGED || p.v_is_k_prefix != 1 || p.num_kv_heads != 1) return false;
  if (p.page_size != 1 || p.kv_slot_runs <= 0 || p.kv_slot_runs % 64 != 0) return false;
  // The map's row stride is the token stride; a page_size 1 slot sits at
  // page * k_stride_page, so the two must agree (a 3-D [slots, 1, 576] cache).
  return p.k_stride_page == p.k_stride_token && rows_map_ok(p.k, p.k_stride_token, p.num_pages);
}

// The warp-role kernels (mbarriers, setmaxnreg) have a body only in arch-specific
// images (kernels/sm90/sync.cuh, VA_ARCH_SPECIFIC_BODY): planned only where
// this build carries the device's sm_XYa image (a plain sm_80 / sm_90 / sm_120
// image gets a stub that traps). The compiled list is read once.
bool built_arch_specific(int sm_arch) {
  static const std::string list = [] {
    const char* archs = va_compiled_archs();
    return std::string(",") + (archs != nullptr ? archs : "") + ",";
  }();
  char want[24];
  std::snprintf(want, sizeof(want), ",sm_%da,", sm_arch);
  return list.find(want) != std::string::npos;
}

bool image_ok(int id, const DeviceInfo& dev) {
  return !kDescs[id].arch_specific || built_arch_specific(dev.sm_arch);
}

// A cluster kernel's grid x is cluster_x times request x KV head
// (launch_grid's x; kernels/core/request.cuh, cta_coord): at most 2^31 - 1.
bool cluster_grid_ok(int id, const va_params& p) {
  return static_cast<int64_t>(p.batch_size) * p.num_kv_heads * kDescs[id].cluster_x <= 0x7fffffff;
}

bool layout_ok(int id, const va_params& p) {
  if (id == kCfgMlaWgmmaSeesawTma) return tma_k_cache_ok(p);
  if (id == kCfgMlaWgmmaSeesawRows) return rows_hint_ok(p);
  return true;
}

}  // namespace

const ConfigDesc& config_desc(ConfigId id) { return kDescs[id]; }

extern "C" const char* va_config_tags(void) {
  static const std::string tags = [] {
    std::string t;
    for (int id = 0; id < kNumConfigs; ++id) t += (id ? "," : "") + std::string(kDescs[id].tag);
    return t;
  }();
  return tags.c_str();
}

va_status query_device(DeviceInfo* info) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky; do not leak it into the caller's next check
    return va_fail(VA_ERR_NO_DEVICE, "device: cudaGetDevice failed (%s: %s)",
                   cudaGetErrorName(e), cudaGetErrorString(e));
  }
  // The attributes never change for a device: read them once (every launch
  // plans twice, for the workspace size and for the launch itself).
  constexpr int kCachedDevices = 64;
  static std::atomic<bool> cached[kCachedDevices];
  static DeviceInfo cache[kCachedDevices];
  if (dev >= 0 && dev < kCachedDevices && cached[dev].load(std::memory_order_acquire)) {
    *info = cache[dev];
    return VA_OK;
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
  if (dev >= 0 && dev < kCachedDevices) {
    // Written once under the lock, read only after the flag: no data race.
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (!cached[dev].load(std::memory_order_relaxed)) {
      cache[dev] = *info;
      cached[dev].store(true, std::memory_order_release);
    }
  }
  return VA_OK;
}

int choose_splits(int64_t base_ctas, int64_t kv_tiles, int num_sms, int ctas_per_sm,
                  int tile_granule) {
  // Cost of one CTA in KV tiles: its share of the tiles, rounded up to the
  // kernel's granule (the sm_90a kernels work in tile pairs: an odd share's
  // last pair costs a whole one), plus a fixed part (Q tile load, prologue,
  // epilogue) of about 6 tiles. Each split adds its partial rows to write and
  // merge: a third of a tile per split on the portable kernels, a quarter on
  // the sm_90a kernels (fit to forced split counts on the H200's bench rows).
  // The portable kernels take up to ceil(kv_tiles / 3) splits (a few
  // request-heads over a short KV range: the real-input ddtree16, 29 tiles
  // over 9 request-heads, ran fastest at 10 splits of 3 tiles, BENCHMARKS.md
  // table 5). The sm_90a kernels take up to ceil(kv_tiles / kMinTilesPerSplit)
  // splits (shares of 3 and 4 tiles), and count a split grid's waves over 97% of the
  // SMs: the SM clock falls as more SMs are busy, so a grid that fills every
  // SM with fewer tiles each runs slower than one that leaves a few idle
  // (FlashMLA's single-request grids also use 128 of the H200's 132 SMs).
  constexpr double kFixedTiles = 6.0;
  const bool pairs = tile_granule > 1;
  const double merge_tiles_per_split = pairs ? 0.25 : 1.0 / 3.0;
  const int split_sms = pairs ? std::max(1, num_sms * 97 / 100) : num_sms;
  const int64_t slots = static_cast<int64_t>(num_sms) * std::max(1, ctas_per_sm);
  const int64_t split_slots = static_cast<int64_t>(split_sms) * std::max(1, ctas_per_sm);
  const int64_t granule = std::max(1, tile_granule);
  // A batch that already fills every CTA slot is never split (and this keeps
  // base_ctas * s below far from overflowing).
  if (base_ctas <= 0 || kv_tiles <= 0 || base_ctas >= slots) return 1;
  const int64_t cap = std::min<int64_t>(
      kMaxAutoSplits,
      std::max<int64_t>(1, pairs ? (kv_tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit
                                 : (kv_tiles + kMinPortableTilesPerSplit - 1) / kMinPortableTilesPerSplit));
  int best = 1;
  double best_cost = 0;
  for (int64_t s = 1; s <= cap; ++s) {
    const int64_t share = ((kv_tiles + s - 1) / s + granule - 1) / granule * granule;
    const int64_t waves = s == 1 ? (base_ctas + slots - 1) / slots
                                 : (base_ctas * s + split_slots - 1) / split_slots;
    const double per_cta = static_cast<double>(share) + kFixedTiles;
    const double cost = static_cast<double>(waves) * per_cta +
                        merge_tiles_per_split * static_cast<double>(s);
    if (s == 1 || cost < best_cost * 0.98) {  // a split must win by 2% to be taken
      best = static_cast<int>(s);
      best_cost = cost;
    }
  }
  return best;
}

va_status check_plan_options(const va_plan_options& opt, int* forced_config) {
  if (opt.struct_size != sizeof(va_plan_options))
    return va_fail(VA_ERR_VERSION, "options.struct_size: expected %u (sizeof(va_plan_options)) (got %u)",
                   static_cast<unsigned>(sizeof(va_plan_options)), opt.struct_size);
  if (opt.grid_order < VA_GRID_AUTO || opt.grid_order > VA_GRID_REQUESTS)
    return va_fail(VA_ERR_INVALID_VALUE,
                   "options.grid_order: must be VA_GRID_AUTO, VA_GRID_ROWS or VA_GRID_REQUESTS (got %d)",
                   opt.grid_order);
  const struct { int32_t v; const char* name; } switches[] = {
      {opt.early_release, "options.early_release"}, {opt.q_tma, "options.q_tma"}, {opt.o_tma, "options.o_tma"},
      {opt.balance_splits, "options.balance_splits"}, {opt.pair_splits, "options.pair_splits"}};
  for (const auto& sw : switches)
    if (sw.v < VA_AUTO || sw.v > VA_OFF)
      return va_fail(VA_ERR_INVALID_VALUE, "%s: must be VA_AUTO, VA_ON or VA_OFF (got %d)", sw.name, sw.v);
  if (opt.max_smem_bytes < 0)
    return va_fail(VA_ERR_INVALID_VALUE, "options.max_smem_bytes: must be >= 0 (got %d)",
                   opt.max_smem_bytes);
  const size_t tag_len = strnlen(opt.config, sizeof(opt.config));
  if (tag_len == sizeof(opt.config))
    return va_fail(VA_ERR_INVALID_VALUE, "options.config: not NUL-terminated within %zu bytes",
                   sizeof(opt.config));
  *forced_config = -1;
  if (tag_len > 0) {
    for (int id = 0; id < kNumConfigs; ++id)
      if (std::strcmp(kDescs[id].tag, opt.config) == 0) *forced_config = id;
    if (*forced_config < 0)
      return va_fail(VA_ERR_INVALID_VALUE,
                     "options.config: unknown configuration tag '%.48s' (name one of: %s)",
                     opt.config, va_config_tags());
  }
  return VA_OK;
}

va_status make_plan(const va_params& p, const DeviceInfo& dev, const va_plan_options& opt,
                    Plan* plan) {
  // The options first: a bad one fails before anything is planned.
  int forced = -1;
  {
    const va_status ost = check_plan_options(opt, &forced);
    if (ost != VA_OK) return ost;
  }
  // Shared memory per block the plan may use: the device's, or less when the
  // options plan for a smaller device (sm_120's 101,376 bytes on an sm_90 card).
  const int smem_cap = opt.max_smem_bytes > 0 ? std::min(dev.max_smem_optin, opt.max_smem_bytes)
                                              : dev.max_smem_optin;
  const bool mla = p.v_is_k_prefix == 1;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int64_t rows_max = static_cast<int64_t>(std::max(p.max_q_len, 1)) * group;
  // (requests x KV heads x 8 <= num_sms, without the product's overflow)
  const bool few_request_heads = static_cast<int64_t>(p.batch_size) * p.num_kv_heads <= dev.num_sms / 8;
  const bool kv_fp8 = p.kv_dtype == VA_KV_DTYPE_FP8_E4M3;

  // Candidate configurations, best first; the first that fits the device's
  // shared memory wins.
  ConfigId cands[8];
  int n = 0;
  if (mla) {
    // sm_90a: warpgroup MMA. The TMA kernel where the copy engine can read the
    // cache (flat caches, pages of a multiple of 64 rows, page_size 1 with the
    // kv_slot_runs hint through the rows map); it overlaps the copies with both
    // consumers' MMAs and leaves the producer's registers free. Every other
    // layout takes the cp.async kernel, which reads any layout the C-ABI
    // accepts. The mma.sync kernels are the portable MLA path (sm_120, whose
    // 101,376 bytes per block hold two stages of a 32-row tile without Q): the
    // warp-role kernels first, the one-stage kernel with Q in shared memory
    // behind them. Of the warp-role kernels the 2-CTA cluster one (64 rows
    // per K tile read, half of every K row per CTA) above 32 rows per KV
    // head; at 32 rows or fewer half of its rows would be empty, and the
    // one-CTA kernel (32 rows) does the same useful work on one SM instead of
    // two.
    const bool sm90a = dev.sm_arch == 90 && built_sm90a();
    if (sm90a && tma_k_cache_ok(p)) cands[n++] = kCfgMlaWgmmaSeesawTma;
    if (sm90a && rows_hint_ok(p)) cands[n++] = kCfgMlaWgmmaSeesawRows;
    if (sm90a) cands[n++] = kCfgMlaWgmmaM64N64PR;
    // An fp8 cache: the sm_90a cp.async kernel at every layout (the TMA
    // kernels copy without converting), else the cluster kernel at every row
    // count (the only portable MLA kernel that converts it); kv_fp8_ok.
    if ((rows_max > 32 || kv_fp8) && cluster_grid_ok(kCfgMlaClusterM64N32, p) &&
        image_ok(kCfgMlaClusterM64N32, dev))
      cands[n++] = kCfgMlaClusterM64N32;
    if (image_ok(kCfgMlaSplitM32N32, dev)) cands[n++] = kCfgMlaSplitM32N32;
    cands[n++] = kCfgMlaM32N32S1;
  } else if (p.head_dim_qk == 64) {
    // The warp-role kernel (128 rows per CTA, one CTA per SM) where this build
    // has the device's arch-specific image and a KV head has more than 64
    // rows; the one-tile kernel (64 rows, two CTAs per SM) otherwise, where
    // most of a 128-row CTA's consumers would idle and one CTA per SM leaves
    // the SM waiting through each short CTA's prologue (BENCHMARKS.md table 4,
    // B64 T4 L1k).
    // From 256 rows per KV head the 32-row consumer warps (256 rows per
    // CTA): each K / V fragment feeds two m16 tiles and Q is re-read from
    // shared memory (faster on the compute-bound rows, BENCHMARKS.md table
    // 4). Below 256 rows a CTA of it would hold fewer rows than two 16-row
    // kernel CTAs on two SMs, which the short real-input calls (192-207
    // rows) run faster (BENCHMARKS.md table 5); above it, where its splits
    // would keep fewer than kMinR32Tiles KV tiles per CTA, the 16-row kernel
    // too (after the split count, below).
    // At 64 rows or fewer the warp-role kernel still wins where the requests x
    // KV heads number at most an eighth of the SMs: split-K then fills the
    // machine with a few rows' long KV ranges, and its 16-row warps pipeline
    // the tiles the one-tile kernel walks one round trip at a time (BENCHMARKS.md
    // table 5: the real-input calls; from 64 request-heads on 132 SMs the
    // one-tile kernel's two CTAs per SM win again).
    // An fp8 cache takes the warp-role kernels at any row count (the only ones
    // that convert it).
    const bool roles = rows_max > 64 || few_request_heads || kv_fp8;
    if (rows_max >= 256 && image_ok(kCfgGqa64RolesM256, dev)) cands[n++] = kCfgGqa64RolesM256;
    if (roles && image_ok(kCfgGqa64Roles, dev)) cands[n++] = kCfgGqa64Roles;
    cands[n++] = kCfgGqa64M64N64S2;
  } else if (p.head_dim_qk == 128) {
    const bool roles = rows_max > 64 || few_request_heads || kv_fp8;  // as for head_dim 64
    // Where three stages of the 16-row kernel fit (sm_90), they run every
    // call, the 32-row kernel's and the one-tile kernel's included: at 64 rows
    // or fewer too, its three tiles in flight per SM outrun the one-tile
    // kernel's two CTAs of two stages each once a request has a few KV tiles
    // (BENCHMARKS.md table 4; docs/design_portable.md). Within sm_120's
    // 101,376 bytes the rules above, with two stages. Not for an fp8 cache:
    // its load warps convert each row through registers, and the 32-row
    // kernel runs those compute rows faster (BENCHMARKS.md table 8).
    const bool s3 =
        !kv_fp8 && kDescs[kCfgGqa128RolesS3].smem_bytes <= smem_cap && image_ok(kCfgGqa128RolesS3, dev);
    if (rows_max >= 256 && !s3 && image_ok(kCfgGqa128RolesM256, dev)) cands[n++] = kCfgGqa128RolesM256;
    if (s3) cands[n++] = kCfgGqa128RolesS3;
    if (roles && image_ok(kCfgGqa128Roles, dev)) cands[n++] = kCfgGqa128Roles;
    cands[n++] = kCfgGqa128M64N64S2;
  } else {
    cands[n++] = kCfgGqa256M64N32S2;
    cands[n++] = kCfgGqa256M64N32S1;
  }
  if (kv_fp8) {  // only the configurations with fp8-cache instances
    int kept = 0;
    for (int i = 0; i < n; ++i)
      if (kDescs[cands[i]].kv_fp8) cands[kept++] = cands[i];
    n = kept;
    if (n == 0)
      return va_fail(VA_ERR_UNSUPPORTED,
                     "kv_dtype: fp8 (e4m3) caches are served for GQA / MHA of head_dim 64 and 128 and for "
                     "MLA by the warp-role kernels (sm_90a / sm_120a images), and at head_dim 256; not for this "
                     "call on sm_%d (this build: %s)",
                     dev.sm_arch, va_compiled_archs());
  }
  int chosen = -1;
  // options.config: that configuration when it serves this call (else the
  // rules below choose).
  if (forced >= 0) {
    const ConfigDesc& fd = kDescs[forced];
    const bool serves = fd.mla == mla && (mla || fd.head_dim_qk == p.head_dim_qk) && (!kv_fp8 || fd.kv_fp8);
    const bool arch_ok =
        fd.only_arch == 0 || (fd.only_arch == dev.sm_arch && (!fd.wgmma || built_sm90a()));
    if (serves && arch_ok && image_ok(forced, dev) && layout_ok(forced, p) && cluster_grid_ok(forced, p) &&
        fd.smem_bytes <= smem_cap)
      chosen = forced;
  }
  for (int i = 0; i < n && chosen < 0; ++i) {
    if (kDescs[cands[i]].smem_bytes <= smem_cap) {
      chosen = cands[i];
      break;
    }
  }
  if (chosen < 0) {
    return va_fail(VA_ERR_UNSUPPORTED,
                   "device: no tile configuration fits %d bytes of shared memory per block "
                   "(sm_%d; smallest needs %d)",
                   smem_cap, dev.sm_arch, kDescs[cands[n - 1]].smem_bytes);
  }
  if (static_cast<int64_t>(p.batch_size) * p.num_kv_heads > 0x7fffffff)
    return va_fail(VA_ERR_INVALID_VALUE, "batch_size: batch_size * num_kv_heads exceeds 2^31-1");
  // Row tiles, CTAs and split count of configuration `id`.
  int64_t row_tiles = 0, splits = 1, kv_tiles = 0;
  auto size_grid = [&](int id) -> va_status {
    const ConfigDesc& d = kDescs[id];
    row_tiles = (rows_max + d.m - 1) / d.m;
    if (row_tiles > 65535)
      return va_fail(VA_ERR_UNSUPPORTED, "max_q_len: %d rows per KV head need %lld row tiles (> 65535)",
                     p.max_q_len, static_cast<long long>(row_tiles));
    const int64_t ctas = static_cast<int64_t>(p.batch_size) * p.num_kv_heads * row_tiles;
    kv_tiles = (p.max_kv_len + d.n - 1) / d.n;
    splits = 1;
    if (p.num_splits > 0) {
      splits = p.num_splits;
    } else if (p.max_kv_len > 0 && ctas > 0) {
      // Resident CTAs per SM: what the kernel is compiled to fit (registers,
      // __launch_bounds__ min blocks), bounded by shared memory (the per-SM
      // pool is about the per-block opt-in limit + 1 KB).
      const int by_smem = (smem_cap + 1024) / (d.smem_bytes + 1024);
      const int per_sm = std::max(1, std::min(by_smem, d.min_blocks));
      // A cluster's CTAs each hold an SM slot (the two CTAs of the cluster
      // kernel share a row tile's work per KV tile): counted as CTAs.
      splits = choose_splits(ctas * d.cluster_x, kv_tiles, dev.num_sms, per_sm, d.tile_granule);
    }
    return VA_OK;
  };
  {
    const va_status st = size_grid(chosen);
    if (st != VA_OK) return st;
  }
  // The 32-row GQA kernel's CTA (256 rows, Q staged in shared memory) starts
  // slower than the 16-row kernel's: it pays where each CTA walks a long KV
  // range. Where its splits leave a CTA fewer than kMinR32Tiles KV tiles the
  // 16-row kernel, with twice the CTAs and fewer splits, runs faster
  // (BENCHMARKS.md table 5: real-input ddtree256, 3 requests of 768 rows per
  // KV head and 1.9k KV rows).
  const bool r32 = chosen == kCfgGqa64RolesM256 || chosen == kCfgGqa128RolesM256;
  if (r32 && chosen != forced && p.num_splits == 0 && kv_tiles > 0 &&
      (kv_tiles + splits - 1) / splits < kMinR32Tiles) {
    const int alt = chosen == kCfgGqa64RolesM256 ? kCfgGqa64Roles : kCfgGqa128Roles;
    if (image_ok(alt, dev) && kDescs[alt].smem_bytes <= smem_cap && (!kv_fp8 || kDescs[alt].kv_fp8)) {
      chosen = alt;
      const va_status st = size_grid(chosen);
      if (st != VA_OK) return st;
    }
  }
  const ConfigDesc& d = kDescs[chosen];
  if (splits > 65535)
    return va_fail(VA_ERR_INVALID_VALUE, "num_splits: at most 65535 (got %lld)",
                   static_cast<long long>(splits));

  plan->config = static_cast<ConfigId>(chosen);
  plan->group = group;
  plan->row_tiles = static_cast<int>(row_tiles);
  plan->splits = static_cast<int>(splits);
  plan->kv_fp8 = kv_fp8;
  // Trees of more than 4 tiles of drafts skip the draft-only tiles no row of
  // a CTA sees (kernels/core/request.cuh). On shorter trees the per-visit tile
  // lookup costs more than the few tiles it skips.
  const bool seesaw = chosen == kCfgMlaWgmmaSeesawTma || chosen == kCfgMlaWgmmaSeesawRows;
  plan->skip_draft_tiles = seesaw && p.mask_mode == VA_MASK_TREE && p.max_q_len > 4 * d.n;
  // Stage 0's blocks 0-3 released for refill as soon as consumer 0's P_A
  // V_A[:, L] completes, not after consumer 1's max of tile B, where one row
  // tile covers a request's rows: that CTA alone reads the request's KV, from
  // DRAM (the bandwidth-bound regime), and the next tile A's first blocks are
  // then in flight while tile B lands. Where several row tiles share a
  // request's KV the tiles mostly come from L2 and the early release does not
  // pay (mixed measurements, BENCHMARKS.md).
  plan->early_a0_release =
      seesaw && (opt.early_release == VA_AUTO ? row_tiles == 1 : opt.early_release == VA_ON);
  // On the sm_90a MLA kernels a request's row tiles are adjacent in launch
  // order (grid_coord, kernels/plan.h) whenever grid y can hold the requests:
  // the CTAs that read the same KV tiles then run in the same wave, and the
  // tiles come from L2 for all but the first of them. The portable kernels keep
  // the request-major grid (no gain measured on GQA).
  plan->grid_rows_fastest = opt.grid_order != VA_GRID_REQUESTS && d.rows_grid &&
                            static_cast<int64_t>(p.batch_size) * p.num_kv_heads <= 65535;
  // Q and the unsplit output through tensor maps on the sm_90a MLA kernels
  // where the maps can describe q / out: one bulk copy per 8 KB block instead
  // of 16-byte copies by every consumer thread.
  plan->q_tma = d.wgmma && opt.q_tma != VA_OFF &&
                folded_rows_map_ok(p.q, 576, p.total_q, p.q_stride_token, p.q_stride_head, group);
  plan->o_tma = d.wgmma && splits == 1 && opt.o_tma != VA_OFF &&
                folded_rows_map_ok(p.out, 512, p.total_q, p.out_stride_token, p.out_stride_head,
                                   group);
  // Balanced splits: the batch's requests x splits CTAs per (KV head, row
  // tile) follow the device KV lengths; a request takes at most
  // units - (B - 1) of them (every other request at least one) and never more
  // splits than the host bound's tiles (kernels/core/balanced_splits.cuh
  // clamps at the slots, so a device length past max_kv_len stays in the
  // workspace). VA_AUTO: only where the longest request's splits would hold
  // kMinBalancedSplitTiles tiles each; VA_ON: wherever the kernel can.
  plan->split_units = 0;
  // Two splits: the row tile's two CTAs as one cluster combine their rows in
  // distributed shared memory (kernels/core/pair_combine.cuh), where a split
  // call would otherwise write fp32 partial rows and launch the merge kernel;
  // clusters need sm_90 or newer. Before balanced splits, unless the options
  // ask for those (or turn the pair off).
  plan->pair_splits = d.pair && !kv_fp8 && dev.sm_arch >= 90 && splits == 2 && opt.pair_splits != VA_OFF &&
                      opt.balance_splits != VA_ON;
  if (!plan->pair_splits && d.balance && !kv_fp8 && p.num_splits == 0 && opt.balance_splits != VA_OFF && splits > 1 &&
      p.batch_size >= 2 && p.batch_size <= kMaxBalancedBatch &&
      (opt.balance_splits == VA_ON || (kv_tiles + splits - 1) / splits >= kMinBalancedSplitTiles)) {
    const int64_t units = static_cast<int64_t>(p.batch_size) * splits;
    plan->split_units = static_cast<int>(units);
    splits = std::max<int64_t>(2, std::min<int64_t>(units - p.batch_size + 1, kv_tiles));
    plan->splits = static_cast<int>(splits);
  }
  plan->ws_rows = static_cast<int64_t>(p.total_q) * p.num_qo_heads;
  if (splits > 1 && !plan->pair_splits) {
    plan->ws_o_bytes = static_cast<size_t>(splits) * plan->ws_rows * p.head_dim_vo * sizeof(float);
    plan->workspace_bytes =
        plan->ws_o_bytes + static_cast<size_t>(splits) * plan->ws_rows * sizeof(float);
  } else {
    plan->ws_o_bytes = 0;
    plan->workspace_bytes = 0;
  }
  plan->dev = dev;
  // "_skip": the TMA kernel's instance that skips invisible draft tiles.
  // "_e4m3kv": the instance for an fp8 cache.
  std::snprintf(plan->name, sizeof(plan->name), "%s_%s%s_%s%s", d.wgmma ? "wgmma" : "mma_sync",
                p.dtype == VA_DTYPE_BF16 ? "bf16" : "fp16", kv_fp8 ? "_e4m3kv" : "", d.tag,
                plan->skip_draft_tiles ? "_skip" : "");
  return VA_OK;
}

}  // namespace verify_attn
