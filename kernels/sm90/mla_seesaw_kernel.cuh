// MLA tree verify on sm_90a with TMA refills and the "seesaw" schedule: the
// two consumer warpgroups take turns on the tensor cores instead of doing their
// softmax at the same time, and each K stage is refilled in two parts, each by
// the bulk tensor copy engine as soon as its last reader is done.
// Paged caches with page_size a multiple of 64 (a 64-row tile lies in one
// page) and flat caches (the map of the cache's rows); with kRowsGather,
// page_size 1 caches planned with the kv_slot_runs hint (the rows map, tiles
// of non-consecutive slots gathered by the producer). The plan picks this
// kernel there (kernels/plan.cc), and kernels/sm90/mla_wgmma_kernel.cuh
// (cp.async gathers, any page size) elsewhere.
//
// One CTA = 64 folded query rows (token, head) of one request x the KV tiles
// of its split, 64 KV rows per tile, tiles in pairs (A = tile 2p in stage 0,
// B = tile 2p + 1 in stage 1), 384 threads:
//
//   WG 0 (producer, 40 registers): issues the Q tile's copies first where
//       q's tensor map allows it (kernels/sm90/mla_consumer.cuh, issue_q_tile;
//       else the consumers copy Q with cp.async), then the K copies
//       (kernels/sm90/mla_tma_producer.cuh). Each of its 4 warps owns one
//       block group of every tile of one stage: it reads the tile's page,
//       waits until the consumer that reads the group last has released it
//       (one mbarrier arrival, k_empty), and issues the group's copies; lane
//       0 of warps 0 and 2 then checks its stage's tile (it lies in one
//       page; a flat tile's first and last rows; kRowsGather: every row, by
//       every warp, before the wait), which flags a bad KV index exactly as
//       the other kernels do (the CTA's rows then become NaN).
//   WG 1 = consumer 0: scores S_A = Q K_A^T, output columns 0..255 (O_L).
//   WG 2 = consumer 1: scores S_B = Q K_B^T, output columns 256..511 (O_R).
//
// K tiles arrive by bulk tensor copies (kernels/sm90/tma.cuh), one 64 x 64
// block per copy into its 128-byte swizzled place, each block with a "full"
// mbarrier that completes on its transaction bytes, so scores start on a block
// as soon as it lands. The tensor maps are encoded per launch on the host
// (kernels/sm90/tma_host.h) and read through the __grid_constant__ parameter.
// Shared-memory bandwidth limits this kernel (S's m64n64 wgmmas read both
// operands from it while the copies write it, so a read saved is time
// saved): each consumer keeps Q's block 8 in registers (its scores' A operand
// there) and stores P by stmatrix (kernels/sm90/mla_consumer.cuh).
//
// Per pair, with m the running row max shared in shared memory (sM):
//   C0: S_A -> m0 = max(m, rowmax S_A), P_A = exp2(S_A - m0), O_L *= 2^(m - m0),
//       publishes m0 [barrier SCALE0]; O_L += P_A V_A[:, L] (P from registers);
//       with the plan's early_a0_release (a request's rows in one row tile,
//       the bandwidth-bound regime) releases stage 0 blocks 0-3 here.
//   C1: waits SCALE0; m1 = max(m0, rowmax S_B), P_B = exp2(S_B - m1),
//       O_R *= 2^(m - m1), publishes m1 [SCALE1]; stores P_B (shared memory,
//       over K_B's no longer needed rope block 8) [PB]; issues
//       O_R += P_B V_B[:, R] (registers), waits PA, issues O_R += P_A V_A[:, R]
//       [ISSUED]; releases stage 1 blocks 4-7 and stage 0 blocks 4-8 for
//       refill as each of the two completes.
//   C0: waits SCALE1; stores P_A 2^(m0 - m1) over K_A's block 8 [PA];
//       releases stage 0 blocks 0-3 unless released above (free since its
//       P V; releasing them there on every launch is not uniformly faster,
//       so the plan decides: Plan::early_a0_release);
//       O_L *= 2^(m0 - m1); waits
//       PB and ISSUED (so C1's P_A V_A[:, R], whose completion frees what
//       C0's next scores wait for last, runs first);
//       O_L += P_B V_B[:, L]; next scores on blocks 0-3; releases stage 1
//       blocks 0-3 and 8; next scores on blocks 4-8.
// So while one consumer does its softmax the other's P V runs, and the max
// chain m -> m0 -> m1 replaces an exchange of maxima. With an even tile
// count C0 ends after C1 (it still runs its last P V and the last pair's
// discarded scores pass), so it publishes its row sums in the last pair, and
// C1 writes its output columns meanwhile instead of after C0's end: the
// CTA's tail is shorter, which counts most in short split-K ranges; an odd
// count's last pair is tile A alone (below), where C1's P_A V_A[:, R] ends
// last. O is rescaled only when a row max of the warp moved. A release is one
// mbarrier arrival by the consumer's thread 0; the producer warp owning the
// group issues the copies (issued by the consumer, they would cost it several
// hundred cycles per group on its critical path).
//
// Epilogue: split launches write fp32 partial rows from registers; unsplit
// launches stage each full row tile's output in the free half of stage 1 and
// store it by TMA (write_rows_tma, kernels/sm90/mla_consumer.cuh, which says
// why), partial tiles from registers.
//
// Same semantics and outputs as attention_kernel (kernels/attention_kernel.cuh):
// request prologue (kernels/core/request.cuh), tree mask (kernels/core/mask.cuh),
// base-2 online softmax (FlashAttention-2), split-K workspace rows merged by
// merge_kernel, NaN rows for kv_len < q_len or a bad KV index. The schedule
// and the order of the refills follow the idea of FlashMLA's sm_90 decode
// kernel ("seesaw" scheduling, DeepSeek's FlashMLA deep-dive write-up); the
// code is our own.
#ifndef VERIFY_ATTN_SM90_MLA_SEESAW_KERNEL_CUH_
#define VERIFY_ATTN_SM90_MLA_SEESAW_KERNEL_CUH_

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/core/mask.cuh"
#include "kernels/core/mma.cuh"
#include "kernels/core/pdl.cuh"
#include "kernels/core/request.cuh"
#include "kernels/core/softmax.cuh"
#include "kernels/core/types.cuh"
#include "kernels/launch.h"
#include "kernels/plan.h"
#include "kernels/sm90/mla_consumer.cuh"
#include "kernels/sm90/mla_tma_producer.cuh"
#include "kernels/sm90/swizzle.cuh"
#include "kernels/sm90/sync.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VA_SM90A_SEESAW_BODY 1
#else
#define VA_SM90A_SEESAW_BODY 0
#endif

namespace verify_attn {
namespace sm90 {
namespace seesaw {

constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
// The CTA enters with 65536 / 384 -> 168 registers per thread: what the
// producer gives back must cover what the consumers take.
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "setmaxnreg budget");
// Named barriers (0 is __syncthreads).
constexpr int kBarScale0 = 1;   // C0 published m0 (sM, sScale0)
constexpr int kBarScale1 = 2;   // C1 published m1 (sM, sScale1)
// PA and PB also hand over the other consumer's tile: its waiter saw every
// block of it land (full_bar, before its scores), and the named barrier
// orders this consumer's reads after that wait, so the P V on the other
// consumer's tile waits on no full barrier (such a wait costs on the order
// of a hundred cycles per block even on a block that has landed; FlashMLA's
// sm_90 kernel does not wait there either). This needs every write of a
// block ordered before its barrier's completion: the copy engine's are; the
// kRowsGather gathers fence their cp.async copies into the async proxy before
// lane 0 arrives (kernels/sm90/mla_tma_producer.cuh, gather_group_tile). The
// producer's s_bad_kv flags reach the consumers through done_bar, not these.
// (The cp.async kernel, kernels/sm90/mla_wgmma_kernel.cuh, still waits: its
// flags travel with the full barriers.)
constexpr int kBarPA = 3;       // C0 stored P_A
constexpr int kBarPB = 4;       // C1 stored P_B
constexpr int kBarConsumers = 5;
constexpr int kBarZero = 6;     // 6, 7: one consumer's own (tail rows zeroed)
constexpr int kBarIssued = 8;   // C1 issued P_A V_A[:, R]
constexpr int kBarSum0 = 9;     // C0's row sums final (sSum[0])
constexpr int kBarSum1 = 10;    // C1's row sums final (sSum[1])

// P = exp2(S * scale_log2 - base) in place (one FFMA per exponent), the
// bf16/fp16 pairs in the wgmma A-register layout (pa[2 k] = columns 8 k + 2 t4,
// + 1 of row g, pa[2 k + 1] the same of row g + 8: k16 step kk uses
// pa[4 kk .. 4 kk + 3]), and this thread's partial row sums l = l * f + the
// tile's sums (f: the rescale factor of the rows' running max).
template <typename DT>
__device__ __forceinline__ void exp_scores(float (&s)[32], float scale_log2, const float (&base)[2],
                                           uint32_t (&pa)[16], float (&l)[2], const float (&f)[2]) {
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int h = i & 1;
    s[2 * i] = fast_exp2(fmaf(s[2 * i], scale_log2, -base[h]));
    s[2 * i + 1] = fast_exp2(fmaf(s[2 * i + 1], scale_log2, -base[h]));
    sum[h] += s[2 * i] + s[2 * i + 1];
    pa[i] = DTypeTraits<DT>::pack(s[2 * i], s[2 * i + 1]);
  }
  l[0] = l[0] * f[0] + sum[0];
  l[1] = l[1] * f[1] + sum[1];
}

// The rows' running max and rescale factor, for the other consumer (lanes
// t4 == 0 of each quad), then an arrival at named barrier `bar`.
__device__ __forceinline__ void publish_max(float* sM, float* sScale, const int (&my_row)[2], int t4,
                                            const float (&m)[2], const float (&scale)[2], int bar) {
  if (t4 == 0) {
    sM[my_row[0]] = m[0];
    sM[my_row[1]] = m[1];
    sScale[my_row[0]] = scale[0];
    sScale[my_row[1]] = scale[1];
  }
  named_barrier_arrive(bar, 256);
}

// A tile copied by TMA brings whole page rows, also the rows past
// the request's kv_len (whatever the cache holds there). Their scores are
// masked (P = 0), but 0 x NaN is NaN: zero rows [rows_valid, 64) of the value
// blocks b0 .. b0 + 3 before a P V reads them (128 threads of one consumer).
__device__ __forceinline__ void zero_tail_rows(unsigned char* stage, int b0, int rows_valid,
                                               int wtid) {
  const int n = (64 - rows_valid) * 32;  // 16-byte chunks: rows x 4 blocks x 8
  for (int idx = wtid; idx < n; idx += 128) {
    const int r = rows_valid + idx / 32;
    const int b = b0 + (idx % 32) / 8;
    const int c = idx % 8;
    *reinterpret_cast<uint4*>(stage + b * kBlockBytes + r * 128 + c * 16) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace seesaw
}  // namespace sm90

template <class Shape, typename DT, class Loader>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    mla_seesaw_kernel(const __grid_constant__ KernelParams p) {
#if VA_SM90A_SEESAW_BODY
  using namespace sm90;
  using namespace sm90::seesaw;
  constexpr int M = Shape::kM, N = Shape::kN, DQK = Shape::kDqk, DV = Shape::kDv;
  constexpr bool kSkip = Shape::kSkipDraftTiles;  // visits -> KV tiles (kv_tile)
  constexpr int KB = Shape::kKBlocks;
  constexpr int kPBlock = 8;
  static_assert(M == 64 && N == 64 && DQK == 576 && DV == 512 && KB == 9, "shape");
  static_assert(Shape::kThreads == 384, "one producer and two consumer warpgroups");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = align_smem_1024(smem_raw);
  unsigned char* sQ = smem;
  unsigned char* sK = smem + Shape::kQBytes;                     // [2 stages][9 blocks]
  float* sM = reinterpret_cast<float*>(sK + Shape::kKBytes);     // [64] running max
  float* sScale0 = sM + M;                                       // [64]
  float* sScale1 = sScale0 + M;                                  // [64]
  float* sSum = sScale1 + M;                                     // [2][64]
  __shared__ __align__(8) uint64_t full_bar[2][KB];  // [stage][block]: landed (transaction bytes)
  __shared__ __align__(8) uint64_t k_empty[4];        // [block group]: released by its last reader
  __shared__ __align__(8) uint64_t q_full;            // p.q_tma: Q landed (transaction bytes)
  __shared__ __align__(8) uint64_t done_bar;         // the producer's flags are final
  __shared__ int s_bad_kv;
  __shared__ RequestTile s_rt;

  // Shared memory only until grid_dependency_wait(): this kernel is a
  // programmatic dependent launch (kernels/pdl_launch.h).
  if (threadIdx.x == 0) {
    tma_prefetch_map(p.k_tmap);
    if (p.q_tma) tma_prefetch_map(p.q_tmap);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int c = 0; c < KB; ++c) mbar_init(&full_bar[s][c], 1);  // the issuing producer lane
    }
#pragma unroll
    for (int g = 0; g < 4; ++g) mbar_init(&k_empty[g], 1);  // the releasing consumer's thread 0
    mbar_init(&q_full, 1);  // the producer lane issuing Q
    mbar_init(&done_bar, 128);
    s_bad_kv = 0;
    mbar_init_fence();
  }
  grid_dependency_wait();
  // Nothing computed here stays in registers past the role split (a value
  // live across setmaxnreg costs a local-memory spill, ptxas): each role
  // re-derives what it needs from blockIdx, the parameters and s_rt.
  {
    const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
    const int hk = cc.hk;
    const Loader loader(p, cc.req, hk);
    RequestTile rt;
    if (!start_request<Shape, DT>(p, loader, &rt)) return;
    if (threadIdx.x == 0) s_rt = rt;
  }
  __syncthreads();

  const int wg = threadIdx.x / 128, wtid = threadIdx.x % 128;
  if (wg == 0) {
    // ------------------------------------------------------------ producer
    regs_dealloc<kProducerRegs>();
    const RequestTile rt = s_rt;
    const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
    const Loader loader(p, cc.req, cc.hk);
    if (p.q_tma && wtid == 0) issue_q_tile(p, rt, sQ, &q_full);  // before the first page read
    issue_k_tiles<Shape>(p, rt, loader, sK, full_bar, k_empty, &s_bad_kv, wtid);
    mbar_arrive(&done_bar);  // s_bad_kv stores above -> the consumers' epilogue
    return;
  }

  // -------------------------------------------------------------- consumers
  regs_alloc<kConsumerRegs>();
  // From shared memory, not from the registers of the prologue: a value live
  // across setmaxnreg costs a local-memory spill (ptxas).
  const RequestTile rc = s_rt;
  const CtaCoord cc = cta_coord<Shape::kRowsGrid>(p);
  const int hk = cc.hk;
  const int split = blockIdx.z;  // cc.split, in every grid order
  const int n_tiles = rc.tile_end - rc.tile_begin;
  // Warp-uniform by construction (lane 0's value): ptxas keeps the descriptor
  // bases in uniform registers.
  const int w = __shfl_sync(0xffffffffu, wg, 0) - 1;
  const int ct = threadIdx.x - 128;  // 0..255 over both consumers
  const int warp = wtid >> 5, lane = wtid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  acquire_q_tile<DT>(sQ, p, rc, hk, ct, kBarConsumers, &q_full);
  uint32_t q_rope[16];  // Q's block 8, the scores' A operand there
  load_q_rope(sQ, warp, g, t4, q_rope);

  const RequestMask rmask{rc.kv_len, rc.prefix, p.mask_words, p.causal != 0};
  const int my_row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const uint32_t q_addr = smem_addr(sQ);
  const uint32_t kA = smem_addr(sK), kB = kA + Shape::kKTileBytes;
  unsigned char* pA = sK + kPBlock * kBlockBytes;                       // P_A over K_A's block 8
  unsigned char* pB = sK + Shape::kKTileBytes + kPBlock * kBlockBytes;  // P_B over K_B's block 8
  const int n_pairs = (n_tiles + 1) >> 1;

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float l[2] = {0.f, 0.f};   // this thread's partial row sums, relative to m
  float m_run[2] = {-INFINITY, -INFINITY};  // running max m (C0 also keeps it in sM for C1)
  float s[32];
  uint32_t pa[16];

  // This consumer read block group `group` for the last time (its wgmma
  // completed): the producer warp owning the group may refill it.
  auto release = [&](int group) {
    if (wtid == 0) mbar_arrive(&k_empty[group]);
  };
  // Rows past kv_len came with the page: zero their values (blocks b0 ..
  // b0 + 3 of the stage) before a P V reads them; this consumer's 128 threads.
  // `may` (std::bool_constant): false on prefix-only tiles, whose rows all exist.
  auto zero_tail = [&](auto may, int stage, int tile, int b0) {
    if (!decltype(may)::value || tile >= n_tiles) return;
    const int rows_valid = rc.kv_len - kv_tile<kSkip>(rc, rc.tile_begin + tile) * N;
    if (rows_valid < N) {
      zero_tail_rows(sK + stage * Shape::kKTileBytes, b0, rows_valid, wtid);
      fence_proxy_async();
      named_barrier_sync(kBarZero + w, 128);
    }
  };
  // An odd tile count leaves the last pair without a tile B. That pair runs
  // after the loop (n_full whole pairs): tile A's softmax and P V halves only,
  // no tile B scores or P V and no discarded scores pass, so the odd tile
  // costs about half a pair (a zero-filled phantom tile B would cost a whole
  // pair's time). The terms dropped would add exact zeros (P = 0 over a
  // zero-filled tile), so the sums are the same.
  const bool odd = (n_tiles & 1) != 0;
  const int n_full = n_pairs - (odd ? 1 : 0);
  // Pairs [0, n_clean) have both tiles in the prefix (no mask, no rows past
  // kv_len): they run a copy of the pair loop without the mask and tail code,
  // so the loop's hot instructions lie together: with the mask path inline
  // they are split into many short runs over thousands of instructions, and
  // the warps stall on instruction fetch (ncu's "no instruction" stalls).
  // The remaining pairs run the general copy.
  const int clean_tiles = rmask.prefix / N - rc.tile_begin;  // tiles ending at or before prefix
  const int n_clean = clean_tiles <= 0 ? 0 : min(clean_tiles >> 1, n_full);
  if (w == 0) {
    // ---------------------------------------------------------- consumer 0
    constexpr int kOrder[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    float scale1[2];
    // Tile A of `pair` (its scores in s): m0, P_A, O_L += P_A V_A[:, L]; then
    // C1's max m1: l and m to m1's base, P_A stored at m1's base for C1 [PA]
    // (O_L is rescaled by scale1 afterwards). `last`: C0's row sums are final
    // (P_B's are C1's): published now, so C1 writes its output columns while
    // C0 finishes; and nothing refills stage 0 (no early release).
    auto tile_a = [&](auto may, int pair, bool last) {
      float mx[2];
      mask_scores<N, decltype(may)::value, kSkip>(s, p, rc, rmask, my_row, t4, 2 * pair, mx);
      float base[2], scale0[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) scale0[h] = fold_max(m_run[h], mx[h], &m_run[h], &base[h]);  // m0
      publish_max(sM, sScale0, my_row, t4, m_run, scale0, kBarScale0);
      exp_scores<DT>(s, p.scale_log2, base, pa, l, scale0);
      scale_o(o, scale0);

      // O_L += P_A V_A[:, L] (P from registers); then blocks 0-3 of K_A are free.
      zero_tail(may, 0, 2 * pair, 0);
      fence_regs(pa);
      fence_regs(o);
      wgmma_fence();
      issue_pv_regs<DT>(o, pa, kA, 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      // Blocks 0-3 of K_A are free now; the plan's early release
      // (Plan::early_a0_release: a request's rows in one row tile, the
      // bandwidth-bound regime) hands them to the producer here, else after
      // P_A's store below (releasing here on every launch is not uniformly
      // faster, so the plan decides).
      if (p.early_a0_release && !last) release(kGroupA0);

      // C1's max m1: P_A to m1's base for C1, O_L and l as well.
      named_barrier_sync(kBarScale1, 256);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        scale1[h] = sScale1[my_row[h]];
        m_run[h] = sM[my_row[h]];
        l[h] *= scale1[h];
      }
      if (last) publish_row_sums<M>(l, sSum, 0, my_row, t4, kBarSum0);
      store_p<DT>(pA, s, scale1, warp, lane);
      fence_proxy_async();  // P_A stores -> C1's wgmma
      named_barrier_arrive(kBarPA, 256);
    };
    // The loop is rotated: the scores of pair + 1 are issued at the end of
    // pair (their blocks 0-3 under this pair's last P V, as those were
    // released after P_A V_A[:, L] or the P_A store), so nothing is in
    // flight across the back edge (else ptxas serializes every wgmma, C7514).
    if (n_pairs > 0) {
      issue_scores<DT, 0, 9, true>(s, full_bar[0], 0, true, q_addr, q_rope, kA, kOrder);
      wgmma_wait<0>();
      fence_regs(s);
    }
    auto pair_c0 = [&](auto may, int pair) {
      const uint32_t par = pair & 1;
      // Last pair of an even count: the next scores are a discarded pass over
      // stage 0 (no barrier waits; nothing refills it), so the wgmma sequence
      // is the same in every iteration. (With an odd count the loop's last
      // pair scores the odd pair's tile A, and tile B's groups are released
      // although nothing refills them: arrivals nobody waits for.)
      const bool more = pair + 1 < n_pairs;
      tile_a(may, pair, !more);
      // Blocks 0-3 of K_A are free since P_A V_A[:, L]; released only now
      // unless the plan released them there (early_a0_release, above).
      if (more && !p.early_a0_release) release(kGroupA0);
      scale_o(o, scale1);

      // O_L += P_B V_B[:, L]: C1 stored P_B and queued its P_A V_A[:, R] (its
      // completion frees the blocks 4-8 the next scores wait for last, so it
      // goes first). K_B has landed: C1 waited for all its blocks before its
      // scores, and PB orders this consumer after that (no wait on K_B's
      // barriers here: see kBarPB).
      named_barrier_sync(kBarPB, 256);
      named_barrier_sync(kBarIssued, 256);
      zero_tail(may, 1, 2 * pair + 1, 0);
      fence_regs(o);
      wgmma_fence();
      issue_pv_smem<DT>(o, kB, kPBlock * kBlockBytes, kB, 0);
      wgmma_commit();
      // Next scores, blocks 0-3, while P_B V_B[:, L] runs; then K_B's blocks
      // 0-3 and 8 are free; then blocks 4-8 (released by C1 after its P V).
      issue_scores<DT, 0, 4, true>(s, full_bar[0], par ^ 1, more, q_addr, q_rope, kA, kOrder);
      wgmma_wait<4>();
      if (more) release(kGroupB0);
      issue_scores<DT, 4, 9, true>(s, full_bar[0], par ^ 1, more, q_addr, q_rope, kA, kOrder);
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(o);
    };
    int pair = 0;
    for (; pair < n_clean; ++pair) pair_c0(std::false_type{}, pair);
    for (; pair < n_full; ++pair) pair_c0(std::true_type{}, pair);
    if (odd) {
      // The last pair's tile A alone (its scores issued above or by the
      // loop's last iteration); C1 reads its P_A; nothing is refilled.
      tile_a(std::true_type{}, n_full, true);
      scale_o(o, scale1);
    }
  } else {
    // ---------------------------------------------------------- consumer 1
    // The blocks it released first (4-7) land first, blocks 0-3 and 8 after C0's
    // P_B V_B[:, L].
    constexpr int kOrder[9] = {4, 5, 6, 7, 0, 1, 2, 3, 8};
    // m1 from C0's m0 [SCALE0] and this consumer's tile maxima mx (-inf: no
    // tile B), published for C0 [SCALE1]; base: tile B's exponent base; f:
    // the factor of O_R and l (m -> m1).
    auto fold_m1 = [&](float (&mx)[2], float (&base)[2], float (&f)[2]) {
      named_barrier_sync(kBarScale0, 256);  // C0's m0 and its factor
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float scale1 = fold_max(sM[my_row[h]], mx[h], &m_run[h], &base[h]);  // m0 -> m1
        f[h] = sScale0[my_row[h]] * scale1;
        mx[h] = scale1;
      }
      __syncwarp();  // every lane read sM above before lanes t4 == 0 overwrite it
      publish_max(sM, sScale1, my_row, t4, m_run, mx, kBarScale1);
    };
    // O_R += P_A V_A[:, R] (C0's P_A [PA], K_A's blocks 4-8) queued on O_R.
    // K_A has landed: C0 waited for all its blocks before its scores (kBarPA).
    auto issue_pv_a = [&](auto may, int pair) {
      named_barrier_sync(kBarPA, 256);
      zero_tail(may, 0, 2 * pair, 4);
      wgmma_fence();
      issue_pv_smem<DT>(o, kA, kPBlock * kBlockBytes, kA, 4 * kBlockBytes);
      wgmma_commit();
    };
    auto pair_c1 = [&](auto may, int pair) {
      const uint32_t par = pair & 1;
      issue_scores<DT, 0, 9, true>(s, full_bar[1], par, true, q_addr, q_rope, kB, kOrder);
      wgmma_wait<0>();
      fence_regs(s);
      fence_regs(o);

      float mx[2];
      mask_scores<N, decltype(may)::value, kSkip>(s, p, rc, rmask, my_row, t4, 2 * pair + 1, mx);
      float base[2], f[2];
      fold_m1(mx, base, f);
      exp_scores<DT>(s, p.scale_log2, base, pa, l, f);
      const float one[2] = {1.f, 1.f};
      store_p<DT>(pB, s, one, warp, lane);
      fence_proxy_async();  // P_B stores -> C0's wgmma
      named_barrier_arrive(kBarPB, 256);
      scale_o(o, f);

      // O_R += P_B V_B[:, R] (registers) and O_R += P_A V_A[:, R] (C0's P_A)
      // issued back to back; C0 is told once both are queued; each block
      // group is released as soon as the P V reading it completes.
      zero_tail(may, 1, 2 * pair + 1, 4);
      fence_regs(pa);
      fence_regs(o);
      wgmma_fence();
      issue_pv_regs<DT>(o, pa, kB, 4 * kBlockBytes);
      wgmma_commit();
      issue_pv_a(may, pair);
      named_barrier_arrive(kBarIssued, 256);
      wgmma_wait<1>();
      if (pair + 1 < n_pairs) release(kGroupB1);
      wgmma_wait<0>();
      fence_regs(o);
      if (pair + 1 < n_pairs) release(kGroupA1);
    };
    int pair = 0;
    for (; pair < n_clean; ++pair) pair_c1(std::false_type{}, pair);
    for (; pair < n_full; ++pair) pair_c1(std::true_type{}, pair);
    if (odd) {
      // The last pair's tile A alone: m1 = m0 (no tile B), O_R and l to it,
      // O_R += P_A V_A[:, R]; nothing is refilled.
      float mx[2] = {-INFINITY, -INFINITY};
      float base[2], f[2];
      fold_m1(mx, base, f);
      l[0] *= f[0];
      l[1] *= f[1];
      scale_o(o, f);
      fence_regs(o);
      issue_pv_a(std::true_type{}, n_full);
      wgmma_wait<0>();
      fence_regs(o);
    }
  }
  wgmma_wait<0>();
  fence_regs(o);
  // Only the epilogue is left: the next programmatic dependent launch of the
  // stream (the split-K merge) may be scheduled; it waits for our results.
  allow_dependents();

  // Row sums: C1 publishes its own here; C0 published its own in the last
  // pair (before its last P V and the discarded scores pass), so C1 writes
  // its output columns about a microsecond before C0 is done.
  if (w == 1) {
    publish_row_sums<M>(l, sSum, 1, my_row, t4, kBarSum1);
  } else if (n_pairs == 0) {
    publish_row_sums<M>(l, sSum, 0, my_row, t4, kBarSum0);
  }
  float lsum[2];
  gather_row_sums<M>(sSum, my_row, w == 0 ? kBarSum1 : kBarSum0, lsum);
  mbar_wait(&done_bar, 0);  // the producer's s_bad_kv stores
  if (s_bad_kv) {
    write_nan_rows<Shape, DT>(p, rc.q_start, rc.R, rc.row0, hk, split, ct, 256);
    return;
  }
  if (p.o_tma && p.num_splits == 1 && rc.row0 + M <= rc.R) {
    // Through shared memory, by TMA: C1 stages into stage 1's blocks 4-7 (it
    // read them last, in its last P_B V_B[:, R], and nothing refills them
    // after the last pair) while C0 may still read stage 0 and stage 1's
    // blocks 0-3 and 8; C0 stages into stage 1's blocks 0-3 once it is done.
    write_rows_tma<Shape, DT>(p, rc, hk, w, o, lsum, m_run, my_row, t4,
                              sK + Shape::kKTileBytes + 4 * w * kBlockBytes, warp, lane, wtid,
                              kBarZero + w);
  } else {
    write_rows<Shape, DT>(p, rc, hk, split, w, o, lsum, m_run, my_row, t4);
  }
#else
  // Built for another architecture: the plan never selects this kernel there.
  __trap();
#endif
}

}  // namespace verify_attn

#endif  // VERIFY_ATTN_SM90_MLA_SEESAW_KERNEL_CUH_
