"""GPU tests of one contract: attention equals the float64 PyTorch reference, on
every kernel path.

The problems, the run (outputs NaN-poisoned before the launch), the reference
call, the tolerance check and the kernel-path selection are verify_attn.testing's
(make_problem, run, reference, check, kernel_path). Pass: ||out - ref|| / ||ref||
< 1e-2 for the batch and for each request, all outputs finite, LSE within 1e-2
(natural log). Run with ``-s`` to see each case's error and the worst relative
error per layout.

The covering set: a pairwise covering set (every pair of values of the
dimensions below appears in at least one case) of about 70 cases over: model
(MLA with H 1/16/128; GQA with head_dim 64/128/256 and groups 1/3/4/8), longest
q_len (1, 16, 64, 257, 1024), longest prefix (0, 1, 100, 4096, 40000), KV layout
(flat, paged with page size 1/16/64 and randomly permuted pages), batch (1, 3,
8, 32; ragged, with a q_len-0 request when B > 1), mask (chain, star, deep,
random, DDTree-like best-first, non-topological, causal mode), dtype (bf16,
fp16), num_splits (auto, 1, 3). Cases whose reference would be too large are
excluded (big prefixes only at small batch / few heads). Each case further
varies, by its index: NaN-poisoned preallocated out/lse, strided views (q, out,
lse, MLA v as k[..., :512], uint32 mask), NaN in KV slots that must not be read,
host bounds given exactly / loosely / computed, a kv_indptr starting at an
offset, 3-D caches, logit scale. Every MLA case runs on three kernel paths: the
plan's choice, the portable mma.sync kernel (sm_120's configuration, forced) and,
on sm_90, the wgmma kernel whose producer copies K by cp.async (forced on every
layout, TMA ones included). Inputs are random with a fresh seed per case,
printed on failure (set VERIFY_ATTN_TEST_SEED to replay one).

The sm_90a MLA kernel paths (tests marked SM90A: sm_90 only, a planned TMA
kernel must run as planned, nothing may be left in the device error word), each
selected by its cache layout (MLA_LAYOUTS):

* the TMA kernel (kernels/sm90/mla_seesaw_kernel.cuh), which the plan picks for
  paged caches with page_size a multiple of 64 and for flat caches: ragged
  kv_len (a request's last tile is partial: the copy engine brings the page's
  rows past kv_len too, which the consumers zero before their P V), random
  trees, scattered pages, every slot the requests do not own NaN; a padded
  cache (token stride wider than the row) read through the tensor map's
  strides; the Q tile by TMA and by cp.async (Tuning(q_tma=False), or a head
  count the Q map cannot box) over several q layouts; the unsplit output tile by
  TMA stores and from registers (Tuning(o_tma=False)), bit for bit;
* the rows map (kernels/sm90/tma_host.h encode_k_rows_tmap, configuration
  mla_wgmma_seesaw_tma_rows): page_size 1 caches whose token slots come in runs,
  with the ``kv_slot_runs`` hint (a multiple of 64: SGLang's token slots of a
  ``--page-size 64`` pool): a tile whose rows below kv_len are 64 consecutive
  cache rows is boxed, any other gathered by the producer
  (kernels/sm90/mla_tma_producer.cuh); runs of 64, runs broken inside a tile,
  runs not aligned to a tile, scattered slots, padded caches, 16 / 64 / 128
  heads; flat MLA caches take the TMA kernel with the same map (and the
  cp.async kernel when a tuning forces it);
* the cp.async kernel (mla_wgmma_m64n64_pipe_rows): page sizes below 64, and
  page_size 1 without the hint;
* the instances that skip invisible draft tiles (plan names ending in ``_skip``,
  more than 256 drafts; kernels/core/request.cuh ``kv_tile``): masks that leave
  whole draft tiles invisible in the middle of a row tile's range, see a draft
  past every skipped tile, see no draft at all, see every draft before them, or
  follow random and DDTree-like trees; prefixes ending inside a tile, on a tile
  boundary, and empty; page 64, runs and gathered slots with the hint, flat, and
  page 1 without the hint (the cp.async kernel, which visits every tile up to
  the last visible one); that the skipped tiles are not read at all: their KV
  rows hold NaN;
* the early release of stage 0's blocks 0-3 (Tuning(early_release=...)) and the
  launch grid's two orders (Tuning(grid_order=...)).

Which kernel, which K / Q / output path ran is what plan_info says: the plan
decides all of it and the launch never falls back to another.

Launches captured in CUDA graphs, compiled by torch.compile or chained under
programmatic dependent launch: test_launch_modes_gpu.py. Bad device inputs:
test_errors_gpu.py.
"""

import itertools
import random

import pytest
import torch

import verify_attn as va
from verify_attn import masks, testing
from verify_attn.testing import CP_ASYNC_MLA, MODELS, REL_TOL, TMA_MLA, TMA_ROWS_MLA, new_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
# conftest.py: sm_90 only, the plan's own kernel path, a clean device error word afterwards
SM90A = pytest.mark.usefixtures("sm90_tma_env")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _sm90():
    return torch.cuda.get_device_capability() == (9, 0)


# ---------------------------------------------------------------------------
# the covering set of cases

DIMS = [
    ("model", list(MODELS)),
    ("q_len", [1, 16, 64, 257, 1024]),
    ("prefix", [0, 1, 100, 4096, 40000]),
    ("layout", ["flat", "paged1", "paged16", "paged64"]),
    ("batch", [1, 3, 8, 32]),
    ("mask", ["chain", "star", "deep", "random", "ddtree", "shuffled", "causal"]),
    ("dtype", ["bf16", "fp16"]),
    ("splits", [0, 1, 3]),
]
WORK_CAP = 4e8  # H * B * q_len * (prefix + q_len): bounds the float64 reference's size


def _work(c):
    return MODELS[c["model"]].heads * c["batch"] * c["q_len"] * (c["prefix"] + c["q_len"])


def _pairwise_cases(seed=20240601, max_cases=100, ncand=20):
    """Greedy (AETG-style) pairwise covering set, deterministic for stable test ids."""
    rng = random.Random(seed)
    names = [d for d, _ in DIMS]
    uncovered = set()
    for (d1, v1s), (d2, v2s) in itertools.combinations(DIMS, 2):
        for a in v1s:
            for b in v2s:
                uncovered.add((d1, a, d2, b))

    def pairs(c):
        return {(d1, c[d1], d2, c[d2]) for d1, d2 in itertools.combinations(names, 2)}

    cases = []
    while uncovered and len(cases) < max_cases:
        ul = sorted(uncovered, key=repr)
        best, best_score = None, -1
        for _ in range(ncand):
            d1, a, d2, b = rng.choice(ul)
            c = {d: rng.choice(v) for d, v in DIMS}
            c[d1], c[d2] = a, b
            for d, vals in rng.sample(DIMS, len(DIMS)):
                if d in (d1, d2):
                    continue
                bv, bs = c[d], -1
                for v in rng.sample(vals, len(vals)):  # random order: ties broken at random
                    c2 = dict(c, **{d: v})
                    if _work(c2) > WORK_CAP:
                        continue
                    s = len(pairs(c2) & uncovered)
                    if s > bs:
                        bs, bv = s, v
                c[d] = bv
            if _work(c) > WORK_CAP:
                continue
            s = len(pairs(c) & uncovered)
            if s > best_score:
                best_score, best = s, c
        if best is None:
            break
        cases.append(best)
        uncovered -= pairs(best)
    return cases


def _add_knobs(cases):
    out = []
    for i, c in enumerate(cases):
        c = dict(c)
        c["idx"] = i
        c["prealloc"] = i % 2 == 0          # NaN-filled out/lse passed in
        c["return_lse"] = i % 5 != 4
        c["bounds"] = ("computed", "exact", "loose")[i % 3]
        c["views"] = i % 4 == 1             # strided q/out/lse, MLA v view, uint32 mask
        c["poison_kv"] = i % 2 == 1         # NaN in KV slots that must not be read
        c["kv_offset"] = i % 3 == 2         # flat: kv_indptr[0] > 0
        c["cache3d"] = i % 4 in (0, 3)      # paged: [slots, Hkv, D] + page_size
        c["q_scale"] = 4.0 if i % 7 == 3 else 1.0
        c["sm_scale"] = 0.05 if i % 6 == 5 else None
        out.append(c)
    return out


CASES = _add_knobs(_pairwise_cases())


def case_id(c):
    return (f"{c['idx']:02d}-{c['model']}-q{c['q_len']}-p{c['prefix']}-{c['layout']}-b{c['batch']}-"
            f"{c['mask']}-{c['dtype']}-s{c['splits']}" + ("-views" if c["views"] else "")
            + ("-poisonkv" if c["poison_kv"] else "") + ("-prealloc" if c["prealloc"] else ""))


def build_problem(c, seed, device="cuda"):
    """Case c's problem (verify_attn.testing.make_problem): ragged lengths, its layout, mask and knobs."""
    rng = random.Random(seed)
    q_lens, prefixes = testing.ragged_lengths(rng, c["batch"], c["q_len"], c["prefix"])
    flat = c["layout"] == "flat"
    return testing.make_problem(
        q_lens, prefixes, model=c["model"], dtype=DTYPES[c["dtype"]],
        layout="flat" if flat else "paged", page_size=1 if flat else int(c["layout"][len("paged"):]),
        spare_pages=5, unused_indices=3, cache_3d=c["cache3d"],
        kv_offset=rng.randint(1, 50) if (flat and c["kv_offset"]) else 0, flat_spare_rows=7,
        tree="causal" if c["mask"] == "causal" else c["mask"], mask_uint32=c["views"], bounds=c["bounds"],
        q_layout="padded" if c["views"] else "contiguous", q_scale=c["q_scale"], poison=c["poison_kv"],
        v_view=c["views"], sm_scale=c["sm_scale"], seed=seed, device=device)


def _small_case(**over):
    c = dict(model="mla_h16", q_len=40, prefix=300, layout="paged16", batch=3, mask="ddtree",
             dtype="bf16", splits=0, idx=0, prealloc=False, return_lse=True, bounds="exact",
             views=False, poison_kv=False, kv_offset=False, cache3d=False, q_scale=1.0, sm_scale=None)
    c.update(over)
    return c


WORST = {}


@pytest.fixture(scope="module", autouse=True)
def _report_worst():
    yield
    if WORST:
        print("\nverify_attn worst relative error per layout:")
        for layout in sorted(WORST):
            err, cid = WORST[layout]
            print(f"  {layout:8s} {err:.3e}  ({cid})")


def run_case(c, seed, device="cuda"):
    """Case c on the kernel path in force, checked (testing.check); the larger of its errors."""
    p = build_problem(c, seed, device)
    label = f"[{case_id(c)} seed={seed}]"
    return_lse = c["return_lse"]
    out = lse = None
    if c["prealloc"]:
        out, lse = testing.poisoned_outputs(p, layout="padded" if c["views"] else "contiguous",
                                            return_lse=return_lse)
    head_dim_vo = p.d_vo if (p.mla and c["idx"] % 2 == 0) else None  # MLA default is 512
    res = testing.call(p, out=out, lse=lse, return_lse=return_lse, num_splits=c["splits"],
                       head_dim_vo=head_dim_vo)
    if return_lse:
        o, l = res
    else:
        o, l = res, None
        assert isinstance(res, torch.Tensor), label
    if out is not None:
        assert o.data_ptr() == out.data_ptr(), label + " out= was not used"
    if lse is not None:
        assert l.data_ptr() == lse.data_ptr(), label + " lse= was not used"
    if device == "cuda":
        torch.cuda.synchronize()
    err, worst_req, _ = testing.check(p, o, l, label=label, lse_rtol=testing.LSE_RTOL)
    if out is not None and c["views"]:
        assert testing.nan_outside_view(out), label + " wrote outside out's view"
        if lse is not None:
            assert testing.nan_outside_view(lse), label + " wrote outside lse's view"
    return max(err, worst_req)


# MLA runs on three kernel paths on sm_90 (testing.PATHS): the one the plan picks
# there (the wgmma kernels, kernels/sm90/), the portable mma.sync path (the one
# sm_120 runs; "mma_sync"), forced through the plan's tuning knob, and the wgmma
# kernel whose producer copies K by cp.async through a staged row table
# ("cp_async", mla_wgmma_m64n64_pipe_rows, which the plan picks for page sizes
# below 64), forced onto every layout; and the warp-role mma.sync kernel
# ("mma_split", mla_split_m32n32: what the plan picks on sm_120 up to 32 rows
# per KV head) and its 2-CTA cluster form ("mla_cluster", mla_cluster_m64n32:
# what sm_120 picks above 32 rows), forced.
# test_mla_path_pinned checks which one ran. GQA / MHA at head_dim 64 / 128
# runs the plan's choice (the warp-role kernel above 64 rows per KV head or for
# few request-heads, the one-tile kernel otherwise), and each of the three forced: the warp-role
# kernel ("gqa_roles", testing.ROLES_GQA, also where most of its warps idle),
# its form with 32 rows per consumer warp and 256 per CTA ("gqa_roles_r32",
# testing.ROLES_R32_GQA, the plan's from 256 rows per KV head where the
# three-stage form does not fit) and the one-tile kernel ("gqa_tile",
# testing.ONE_TILE_GQA); at head_dim 128 the plan's kernel is the three-stage
# warp-role form at every row count where it fits (testing.ROLES_S3_GQA, sm_90).
CASE_PATHS = ([(c, "auto") for c in CASES] + [(c, "mma_sync") for c in CASES if MODELS[c["model"]].mla]
              + [(c, "mma_split") for c in CASES if MODELS[c["model"]].mla]
              + [(c, "mla_cluster") for c in CASES if MODELS[c["model"]].mla]
              + [(c, "cp_async") for c in CASES if MODELS[c["model"]].mla]
              + [(c, "gqa_tile") for c in CASES if MODELS[c["model"]].d_qk in testing.ONE_TILE_GQA]
              + [(c, "gqa_roles") for c in CASES if MODELS[c["model"]].d_qk in testing.ROLES_GQA]
              + [(c, "gqa_roles_r32") for c in CASES if MODELS[c["model"]].d_qk in testing.ROLES_R32_GQA])


def expected_path(mla, forced_mma_sync=False):
    return "wgmma_" if (mla and _sm90() and not forced_mma_sync) else "mma_sync_"


@pytest.mark.parametrize("case,path", CASE_PATHS, ids=[f"{case_id(c)}-{p}" for c, p in CASE_PATHS])
def test_kernel_matches_reference(case, path, kernel_path):
    if path == "cp_async" and not _sm90():
        pytest.skip("the wgmma path is sm_90 only")
    d = MODELS[case["model"]].d_qk
    if path == "gqa_tile":
        kernel_path(testing.KernelPath(config=testing.ONE_TILE_GQA[d]))
    elif path == "gqa_roles":
        kernel_path(testing.KernelPath(config=testing.ROLES_GQA[d]))
    elif path == "gqa_roles_r32":
        kernel_path(testing.KernelPath(config=testing.ROLES_R32_GQA[d]))
    else:
        kernel_path(path)
    want = {"cp_async": CP_ASYNC_MLA, "mma_split": testing.SPLIT_MLA, "mla_cluster": testing.CLUSTER_MLA,
            "gqa_tile": testing.ONE_TILE_GQA.get(d), "gqa_roles": testing.ROLES_GQA.get(d),
            "gqa_roles_r32": testing.ROLES_R32_GQA.get(d)}.get(path)
    if want is not None or (path == "auto" and d in testing.ROLES_GQA):
        prob = build_problem(case, 0, "cuda")
        if want is None:  # the plan's rule (kernels/plan.cc): warp roles above 64 rows per KV head
            m = MODELS[case["model"]]  # or for at most num_sms / 8 request-heads, 32-row consumer warps from 256
            rows = (prob.max_q_len or max(prob.q_lens)) * (m.heads // m.kv_heads)
            few = len(prob.q_lens) * m.kv_heads * 8 <= torch.cuda.get_device_properties(0).multi_processor_count
            s3 = d in testing.ROLES_S3_GQA  # three stages where they fit this device (sm_90), every call
            if s3:
                with testing.kernel_path(testing.KernelPath(config=testing.ROLES_S3_GQA[d])):
                    s3 = testing.plan_info(prob)["name"].endswith(testing.ROLES_S3_GQA[d])
            r32 = rows >= 256 and not s3  # and where its splits keep 16 KV tiles or more per CTA (kMinR32Tiles)
            if r32:
                with testing.kernel_path(testing.KernelPath(config=testing.ROLES_R32_GQA[d])):
                    forced = testing.plan_info(prob)
                r32 = -(-(-(-forced["max_kv_len"] // 64)) // forced["num_splits"]) >= 16
            want = (testing.ROLES_R32_GQA if r32 else testing.ROLES_S3_GQA if s3
                    else testing.ROLES_GQA if rows > 64 or few else testing.ONE_TILE_GQA)[d]
        info = testing.plan_info(prob)
        assert info["name"].endswith(want), info
    seed = new_seed()
    err = run_case(case, seed)
    key = case["layout"] + {"auto": "", "mma_sync": " (mla on mma.sync)", "mma_split": " (mla on mma.sync roles)",
                            "mla_cluster": " (mla on mma.sync roles, 2-CTA cluster)",
                            "cp_async": " (mla on wgmma, cp.async)", "gqa_tile": " (gqa one-tile)",
                            "gqa_roles": " (gqa roles)", "gqa_roles_r32": " (gqa roles, 32 rows per warp)"}[path]
    if MODELS[case["model"]].mla and path == "auto":
        key += f" (mla on {expected_path(True).rstrip('_')})"
    if err >= WORST.get(key, (-1.0, ""))[0]:
        WORST[key] = (err, f"{case_id(case)} seed={seed}")


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("layout", ["flat", "paged1", "paged16", "paged64"])
def test_mla_path_pinned(forced, layout, kernel_path):
    """Which MLA kernel runs: wgmma on sm_90 unless forced (the TMA kernel on page_size 64 and
    flat caches, the cp.async one otherwise), mma.sync elsewhere; all correct."""
    if forced:
        kernel_path("mma_sync")
    c = _small_case(layout=layout, q_len=70, prefix=1000, batch=2)
    seed = new_seed()
    p = build_problem(c, seed, "cuda")
    info = testing.plan_info(p, return_lse=True)
    print(f"[path {layout} forced={forced}] {info['name']} splits={info['num_splits']}")
    assert info["name"].startswith(expected_path(True, forced)), info
    if expected_path(True, forced) == "wgmma_":
        tma = layout in ("paged64", "flat")
        assert info["name"].endswith(TMA_MLA if tma else CP_ASYNC_MLA), info
    err = run_case(c, seed)
    assert err < REL_TOL


# ---------------------------------------------------------------------------
# the sm_90a MLA kernel paths, by the cache layout that selects them

KINDS = ["runs", "broken", "scattered", "runs", "shifted"]  # token-slot layouts of five requests
MLA_LAYOUTS = {
    # name: (testing.make_problem arguments, the configuration the plan picks on sm_90a)
    "page64": (dict(page_size=64), TMA_MLA),
    "page128": (dict(page_size=128), TMA_MLA),
    "flat": (dict(layout="flat"), TMA_MLA),
    "runs": (dict(page_size=1, slots="runs", cache_3d=True, kv_slot_runs=64), TMA_ROWS_MLA),
    "slots": (dict(page_size=1, slots=KINDS, cache_3d=True, kv_slot_runs=64), TMA_ROWS_MLA),
    "gather": (dict(page_size=1, slots="shuffled", cache_3d=True, kv_slot_runs=64), TMA_ROWS_MLA),
    "page1": (dict(page_size=1), CP_ASYNC_MLA),
    "page16": (dict(page_size=16), CP_ASYNC_MLA),
    "runs_no_hint": (dict(page_size=1, slots="runs", cache_3d=True), CP_ASYNC_MLA),
    "slots_no_hint": (dict(page_size=1, slots=KINDS, cache_3d=True), CP_ASYNC_MLA),
}
Q_LENS, PREFIXES = [5, 16, 3, 64, 7], [40, 700, 129, 1000, 300]


def mla_problem(layout, q_lens, prefixes, *, seed, **kw):
    """An MLA problem (16 heads, random trees, every unowned cache slot NaN) in layout
    MLA_LAYOUTS[layout]; kw replace make_problem's arguments."""
    args = dict(model="mla_h16", layout="paged", seed=seed)
    args.update(MLA_LAYOUTS[layout][0])
    args.update(kw)
    return testing.make_problem(q_lens, prefixes, **args)


def assert_plan(p, layout, suffix="", **kw):
    name = testing.plan_info(p, **kw)["name"]
    assert name.endswith(MLA_LAYOUTS[layout][1] + suffix), name
    return name


@SM90A
@pytest.mark.parametrize("splits", [0, 1, 3], ids=["splits0", "splits1", "splits3"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed0", "seed1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["page64", "page128", "slots", "slots_no_hint"])
def test_mla_kernel_paths_match_reference(layout, dtype, seed, splits):
    """Five ragged requests with random trees, every slot they do not own NaN, NaN-poisoned
    outputs: the TMA kernel (page_size 64 and 128; the copy engine brings a page's rows past
    kv_len, which the consumers must zero), the rows map (token slots in runs, broken runs,
    scattered slots and shifted runs with kv_slot_runs=64: tiles of consecutive slots boxed,
    the others gathered by its producer; rows past kv_len in a boxed tile are the cache's next
    rows, NaN here) and the cp.async kernel (the same slots without the hint); the plan's
    choice pinned. The rows map's output also matches the cp.async kernel's on the same slots."""
    p = mla_problem(layout, Q_LENS, PREFIXES, seed=seed, dtype=dtype)
    assert_plan(p, layout, num_splits=splits)
    out, lse = testing.run(p, num_splits=splits)
    testing.check(p, out, lse, label=f"[{layout} seed={seed} splits={splits}]")
    if layout == "slots":
        out1, _ = testing.run(p, num_splits=splits, kv_slot_runs=1)  # no hint: the cp.async kernel
        assert testing.rel_err(out, out1) < REL_TOL


@SM90A
def test_tma_causal_chain_matches_reference():
    p = mla_problem("page64", [8, 33], [200, 61], seed=5, tree="causal")
    assert_plan(p, "page64")
    out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
def test_small_pages_take_the_gather_kernel():
    """page_size 16: a tile spans four pages, no tensor-map box fits; the cp.async kernel runs."""
    p = mla_problem("page16", [4, 9], [100, 37], seed=4)
    assert_plan(p, "page16")
    out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
def test_forcing_tma_on_small_pages_keeps_the_plan():
    """The tuning knob cannot put the TMA kernel on a cache it cannot read."""
    p = mla_problem("page16", [3], [50], seed=7)
    with testing.kernel_path(config=TMA_MLA):
        assert_plan(p, "page16")


@SM90A
def test_tma_padded_cache_strides():
    """A cache whose token rows are 640 wide (a view of the first 576): the map's strides, not 576."""
    p = mla_problem("page64", [7, 20], [150, 64], seed=6, cache_width=640)
    assert p.k.stride(1) == 640
    assert_plan(p, "page64")
    out, lse = testing.run(p)
    testing.check(p, out, lse)


def check_no_hint(p, splits=0):
    """Without the hint: the cp.async kernel, against the reference."""
    name = testing.plan_info(p, num_splits=splits, kv_slot_runs=1)["name"]
    assert name.endswith(CP_ASYNC_MLA), name
    out, lse = testing.run(p, num_splits=splits, kv_slot_runs=1)
    testing.check(p, out, lse)


@SM90A
@pytest.mark.parametrize("heads", [16, 128], ids=["h16", "h128"])
def test_slot_runs_padded_cache_without_the_hint(heads):
    p = mla_problem("slots_no_hint", [4, 32], [500, 260], slots=["runs", "runs"], heads=heads,
                    cache_width=640, seed=2)
    check_no_hint(p)


@SM90A
def test_page16_consecutive_pages():
    """page_size 16 (the hint is for page_size 1: the cp.async kernel), pages in runs and two swapped."""
    p = mla_problem("runs_no_hint", [8, 16, 2], [300, 900, 63], seed=3)
    ind, ptr = p.kv_indices.cpu(), p.kv_indptr.cpu().tolist()
    pages, pptr = [], [0]
    for r in range(3):
        s = ind[ptr[r]:ptr[r + 1]].to(torch.int64)
        firsts = s[::16]
        assert torch.equal(s, (firsts.repeat_interleave(16) + torch.arange(16).repeat(len(firsts)))[:len(s)])
        pr = (firsts // 16).tolist()
        if r == 1:
            pr[5], pr[6] = pr[6], pr[5]
        pages += pr
        pptr.append(len(pages))
    p = p.replace(kv_indices=torch.tensor(pages, dtype=torch.int32, device="cuda"),
                  kv_indptr=torch.tensor(pptr, dtype=torch.int32, device="cuda"), page_size=16)
    check_no_hint(p)


@SM90A
def test_flat_mla_takes_the_tma_kernel():
    """A flat MLA cache: every tile is 64 consecutive rows from any first row, so the TMA kernel
    runs with the rows map (kernels/launch_attention.cuh); forced to the cp.async kernel
    (Tuning(config=...)) the plan says so. Both against the reference."""
    p = mla_problem("flat", [6, 64, 1], [294, 1036, 128], seed=9, poison=False)
    assert (p.max_q_len, p.max_kv_len) == (64, 1100)
    assert_plan(p, "flat")
    assert testing.plan_info(p)["k_tma"]
    ref = testing.reference(p)
    for path in ("auto", "cp_async"):
        with testing.kernel_path(path):
            info = testing.plan_info(p)
            assert info["k_tma"] == (path == "auto") and info["name"].endswith(
                TMA_MLA if path == "auto" else CP_ASYNC_MLA), info
            for splits in (0, 1, 3):
                out, lse = testing.run(p, num_splits=splits)
                testing.check(p, out, lse, ref=ref, label=f"[{path} splits={splits}]")


@SM90A
def test_kv_slot_runs_hint_long_kv():
    """A 9k-row request (tiles of many pairs; split by the plan) next to a short one. (The short
    KV the other tests use takes the rows kernel too: kernels/plan.cc.)"""
    p = mla_problem("slots", [16, 4], [9000, 300], slots=["runs", "shifted"], seed=11)
    assert_plan(p, "slots")
    out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
@pytest.mark.parametrize("heads", [16, 64, 128], ids=["h16", "h64", "h128"])
def test_kv_slot_runs_hint_padded_cache_and_heads(heads):
    p = mla_problem("slots", [4, 32, 9], [500, 260, 2000], slots=["runs", "shifted", "runs"], heads=heads,
                    cache_width=640, kv_slot_runs=128, seed=5)
    assert_plan(p, "slots")
    out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
def test_kv_slot_runs_hint_forced_to_cp_async():
    """The hinted cache forced to the cp.async kernel (Tuning(config=...)): the plan names it,
    says no K map, and the result matches the reference."""
    p = mla_problem("slots", Q_LENS, PREFIXES, seed=6)
    with testing.kernel_path("cp_async"):
        info = testing.plan_info(p)
        assert info["name"].endswith(CP_ASYNC_MLA) and not info["k_tma"], info
        out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
@pytest.mark.parametrize("knob", [None, False, True], ids=["rule", "off", "on"])
@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
def test_kv_slot_runs_hint_early_a0_release(knob, splits):
    """The rows kernel with the early release of stage 0's blocks 0-3 (Plan::early_a0_release:
    the plan's rule where a request's rows fit one row tile, q_len <= 4 at 16 heads;
    Tuning(early_release=True / False) forces it) and without, against the reference: requests
    of one row tile, then of several."""
    seed = new_seed()
    print(f"seed {seed}")
    with testing.kernel_path(early_a0=knob):
        for q_lens in ([4, 3, 1, 4, 2], Q_LENS):
            p = mla_problem("slots", q_lens, PREFIXES, seed=seed)
            assert_plan(p, "slots", num_splits=splits)
            out, lse = testing.run(p, num_splits=splits)
            testing.check(p, out, lse, label=f"[seed {seed}]")


@SM90A
@pytest.mark.parametrize("q_tma", [True, False], ids=["q_by_tma", "q_by_cp_async"])
@pytest.mark.parametrize("q_layout", ["contiguous", "padded", "head_major"])
@pytest.mark.parametrize("heads", [1, 16, 24, 128])
@pytest.mark.parametrize("layout", ["page64", "page1"])
def test_q_tile_layouts(layout, heads, q_layout, q_tma):
    """Both sm_90a kernels (TMA K at page 64, cp.async K at page 1) take Q by TMA (a map of q
    whose box is a CTA's 64 folded rows) where the map can describe q -- heads dividing 64 or a
    multiple of 64 --, else (24 heads, or Tuning(q_tma=False)) by cp.async: the same results;
    which path ran is what the plan says (q_tma).
    q contiguous, a view of a wider row (head stride 640), or head-major (token stride 576,
    head stride total_q * 576); ragged requests whose last row tile is partial (the map's box
    then holds the next request's rows, or zeros past total_q)."""
    p = mla_problem(layout, Q_LENS[:4], PREFIXES[:4], heads=heads, q_layout=q_layout, seed=11 + heads)
    if q_layout == "padded":
        assert p.q.stride(1) == 640
    elif q_layout == "head_major":
        assert p.q.stride(0) == 576
    with testing.kernel_path(q_tma=q_tma):
        assert_plan(p, layout)
        # Which Q path runs: the plan decides it (the launch encodes exactly that map).
        assert testing.plan_info(p)["q_tma"] == (q_tma and heads != 24)
        out, lse = testing.run(p)
    testing.check(p, out, lse)


@SM90A
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("out_layout", ["contiguous", "padded", "head_major"])
@pytest.mark.parametrize("heads", [16, 64, 128, 24])
@pytest.mark.parametrize("layout", ["page64", "page1"])
def test_output_tile_by_tma(layout, heads, out_layout, dtype):
    """Both sm_90a kernels' (TMA K at page 64, cp.async K at page 1) unsplit output: full row
    tiles staged in shared memory and stored by TMA (a map of out whose box is a CTA's 64
    folded rows), partial row tiles (request 0's second, request 2's only) from registers;
    with Tuning(o_tma=False) every tile from registers. Both write the same bits (the same
    o / l rounding), match the float64 reference, and leave no poisoned row. out contiguous, a
    view of a wider row (head stride 640), or head-major; 24 heads (the map cannot box them)
    always store from registers. The plan says which (o_tma)."""
    p = mla_problem(layout, Q_LENS[:4], PREFIXES[:4], heads=heads, dtype=dtype, seed=31 + heads)
    assert_plan(p, layout, num_splits=1)

    def fresh_out():
        out, lse = testing.poisoned_outputs(p, layout=out_layout, pad=128)
        if out_layout == "padded":
            assert out.stride(1) == 640
        elif out_layout == "head_major":
            assert out.stride(0) == 512
        return out, lse

    def call(out, lse):
        testing.call(p, out=out, lse=lse, num_splits=1)

    o_probe, _ = fresh_out()
    assert testing.plan_info(p, num_splits=1)["o_tma"] == (heads != 24)
    with testing.kernel_path(o_tma=False):
        assert not testing.plan_info(p, num_splits=1)["o_tma"]
    del o_probe
    out, lse = fresh_out()
    call(out, lse)
    with testing.kernel_path(o_tma=False):
        out0, lse0 = fresh_out()
        call(out0, lse0)
    assert torch.equal(out, out0) and torch.equal(lse, lse0), "the TMA store wrote other bits"
    testing.check(p, out, lse)  # finite (no row left unwritten), against the reference


# The instances that skip invisible draft tiles: more than 256 drafts.
SKIP_LAYOUTS = {"page64": "page64", "runs": "runs", "gather": "gather", "flat": "flat", "page1": "runs_no_hint"}


def ancestors(parents):
    """Dense [n, n] bool visibility of a tree (each node sees itself and its ancestors), through
    the library's own builders (masks.from_parents, masks.to_dense)."""
    qo = torch.tensor([0, len(parents)], dtype=torch.int32)
    return masks.to_dense(masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo), qo)[0].bool()


def sparse_rows(n, hidden=None):
    """Star-like rows (the root and the token itself), with exceptions: token 5 also sees the last
    draft, tokens 40..47 see none, every 97th token (from 3) sees every draft up to itself.
    hidden = (lo, hi): no token sees drafts lo..hi-1 (their own rows see only the root)."""
    vis = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        vis[t, 0] = vis[t, t] = True
        if t % 97 == 3:
            vis[t, : t + 1] = True
    vis[5, n - 1] = True
    vis[40:48] = False
    if hidden is not None:
        vis[:, hidden[0]:hidden[1]] = False
    return vis


def skip_problem(layout, seed, heads, q_lens, prefixes, dense, nan_rows=()):
    """The requests' K rows (q scaled by 0.5) in one of SKIP_LAYOUTS; every slot no request
    owns is NaN. nan_rows: (request, KV row) pairs set to NaN in the cache (rows no query row
    may read); the reference sees them as zeros."""
    return mla_problem(SKIP_LAYOUTS[layout], q_lens, prefixes, heads=heads, tree=dense, nan_rows=nan_rows,
                       q_scale=0.5, spare_pages=7, seed=seed)


def assert_skip_plan(p, layout, splits):
    name = SKIP_LAYOUTS[layout]
    return assert_plan(p, name, "" if MLA_LAYOUTS[name][1] == CP_ASYNC_MLA else "_skip", num_splits=splits)


@SM90A
@pytest.mark.parametrize("splits", [0, 1, 5], ids=["splits0", "splits1", "splits5"])
@pytest.mark.parametrize("heads", [16, 64], ids=["h16", "h64"])
@pytest.mark.parametrize("layout", list(SKIP_LAYOUTS))
def test_invisible_draft_tiles(layout, heads, splits):
    """Four requests (q_len, prefix): (700, 1000) sparse rows, the prefix ending 40 rows into its
    last tile (24 drafts share it); (300, 0) a random tree, no prefix; (1024, 64) a DDTree-like
    tree, the prefix one whole tile; (130, 5) sparse rows. Checked per request (a wrong skip in
    a short one would hide in the batch's norm)."""
    rng = random.Random(heads + splits)
    dense = [sparse_rows(700), ancestors(testing.random_parents("random", 300, rng=rng)),
             ancestors(testing.random_parents("ddtree", 1024, rng=rng)), sparse_rows(130)]
    p = skip_problem(layout, 1000 * heads + splits, heads, [700, 300, 1024, 130], [1000, 0, 64, 5], dense)
    assert_skip_plan(p, layout, splits)
    out, lse = testing.run(p, num_splits=splits)
    testing.check(p, out, lse)


@SM90A
@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
@pytest.mark.parametrize("layout", list(SKIP_LAYOUTS))
def test_skipped_draft_tiles_are_not_read(layout, splits):
    """Draft tiles no token sees hold NaN K rows: (700, 1000) drafts 216..407 (draft-only tiles 3-5:
    the prefix's last tile takes drafts 0..23), (600, 128) drafts 128..255 (tiles 2-3; the prefix
    two whole tiles, so that rows 40..47, which see no draft, still see something). The skipping
    instance never reads them (finite, right output); the cp.async kernel, which visits every tile
    up to the last visible column, turns the rows past them NaN: the test sees a visited tile."""
    dense = [sparse_rows(700, hidden=(216, 408)), sparse_rows(600, hidden=(128, 256))]
    nan_rows = [(0, 1000 + c) for c in range(216, 408)] + [(1, 128 + c) for c in range(128, 256)]
    p = skip_problem(layout, 77 + splits, 16, [700, 600], [1000, 128], dense, nan_rows)
    assert_skip_plan(p, layout, splits)
    out, lse = testing.run(p, num_splits=splits)
    if layout == "page1":
        assert not torch.isfinite(out).all(), "the cp.async kernel should have read the NaN tiles"
        return
    testing.check(p, out, lse)


# The launch grid's two orders (kernels/plan.h, grid_coord): the sm_90a MLA
# kernels run a request's row tiles adjacent (the plan's choice there whenever
# batch_size x KV heads <= 65535, so the other sm_90 MLA tests run it too) or
# request-major (past that, or with Tuning(grid_order="requests")); the
# portable kernels (GQA, forced mma.sync MLA, sm_120) run request-major
# whatever the knob says. Here both orders on each sm_90a MLA kernel (the TMA
# kernel paged and flat, split and unsplit; the cp.async one), the portable
# ones once with the knob set (it must not move them). Which order a plan takes
# is pinned on the host (kernels/tests/plan_test.cc: the sm_90a configurations
# take the rows first); here, that the MLA cases planned an sm_90a kernel.
GRID_CASES = [("mla_h16", "paged64", 0, "auto", o) for o in ("requests", "rows")] + [
    ("mla_h16", "paged64", 3, "auto", o) for o in ("requests", "rows")] + [
    ("mla_h128", "paged1", 0, "auto", o) for o in ("requests", "rows")] + [
    ("mla_h16", "flat", 0, "auto", o) for o in ("requests", "rows")] + [
    ("mla_h16", "paged16", 0, "mma_sync", "rows"), ("gqa_d128_g4", "paged16", 0, "auto", "rows"),
    ("gqa_d64_g8", "flat", 3, "auto", "requests")]


@pytest.mark.parametrize("model,layout,splits,path,order", GRID_CASES,
                         ids=["-".join(str(x) for x in c) for c in GRID_CASES])
def test_grid_orders(model, layout, splits, path, order, kernel_path):
    kernel_path(path, grid_order=order)
    c = _small_case(model=model, layout=layout, splits=splits, batch=5, q_len=70, prefix=700,
                    prealloc=True)
    seed = new_seed()
    p = build_problem(c, seed, "cuda")
    info = testing.plan_info(p, num_splits=splits)
    assert info["name"].startswith(expected_path(MODELS[model].mla, path == "mma_sync")), info
    assert info["grid_rows_fastest"] == (order == "rows" and info["name"].startswith("wgmma")), info
    assert run_case(c, seed) < REL_TOL


# The TMA kernel's early release of stage 0's blocks 0-3 (Plan::early_a0_release,
# kernels/plan.cc): the plan's rule turns it on where a request's rows fit one
# row tile (q_len 4 at 16 heads), Tuning(early_release=True / False) forces it on / off;
# every combination against the reference, paged (split and unsplit) and flat.
# Which plans take it is pinned on the host (kernels/tests/plan_test.cc).
EARLY_CASES = [(layout, splits, q_len, knob) for layout, splits in (("paged64", 0), ("paged64", 3),
                                                                     ("flat", 0))
               for q_len in (4, 70) for knob in (None, False, True)]


@pytest.mark.parametrize("layout,splits,q_len,knob", EARLY_CASES,
                         ids=["-".join(str(x) for x in c) for c in EARLY_CASES])
def test_early_a0_release(layout, splits, q_len, knob, kernel_path):
    if not _sm90():
        pytest.skip("the TMA kernel (the flag's only reader) is sm_90a only")
    kernel_path(early_a0=knob)
    # NaN in the cache slots no request owns: a page-64 tile brings the rows
    # past kv_len with it, which the consumers zero (zero_tail) before the P V
    # that precedes the early release.
    c = _small_case(model="mla_h16", layout=layout, splits=splits, batch=5, q_len=q_len, prefix=700,
                    prealloc=True, poison_kv=True)
    seed = new_seed()
    p = build_problem(c, seed, "cuda")
    info = testing.plan_info(p, num_splits=splits)
    assert info["name"].endswith(TMA_MLA), info
    assert run_case(c, seed) < REL_TOL


def test_tuning_rejects_unknown_values():
    p = build_problem(_small_case(), 1, "cuda")
    with pytest.raises(TypeError, match="tuning.early_release"):
        testing.call(p, return_lse=True, tuning=va.Tuning(early_release="yes"))
    with pytest.raises(ValueError, match="tuning.grid_order"):
        testing.call(p, return_lse=True, tuning=va.Tuning(grid_order="columns"))
    with pytest.raises(ValueError, match="config: unknown configuration tag 'mla_nope'"):
        testing.call(p, return_lse=True, tuning=va.Tuning(config="mla_nope"))


# ---------------------------------------------------------------------------
# edge cases and planning


@pytest.mark.parametrize("splits", [37, 70])
@pytest.mark.parametrize("model,layout", [("mla_h16", "paged64"), ("mla_h16", "paged1"),
                                          ("gqa_d64_g8", "paged16"), ("gqa_d128_g4", "flat"),
                                          ("gqa_d256_g4", "paged16")])
def test_many_splits_merge(model, layout, splits):
    """The split-K merge (kernels/core/merge.cuh) beyond one warp's lanes: it reads the splits'
    lse 32 at a time and loads the partial rows of 4 or 8 splits at once, so 37 splits take a
    second pass and a remainder; at 70 splits, more than the shorter requests' KV tiles (the
    first request's prefix is 3000, the others' are drawn from 0..3000), some splits see
    nothing (lse -inf) and are skipped. Every merge width (512, 64, 128, 256 value columns),
    NaN-filled outputs, against the float64 reference (run_case asserts output and lse)."""
    c = _small_case(model=model, layout=layout, splits=splits, q_len=16, prefix=3000, batch=3,
                    prealloc=True)
    err = run_case(c, new_seed())
    assert err < REL_TOL, err


@pytest.mark.parametrize("num_splits", [0, 5])
@pytest.mark.parametrize("page_size", [1, 64])
def test_tree_tile_trim_keeps_every_visible_draft(page_size, num_splits):
    """More than 128 drafts: each row tile's KV range ends after the last draft column any of
    its rows sees (kernels/core/request.cuh, with kernels/core/mask.cuh tree_scan_drafts). Masks that are not in
    topological order must keep every visible column: token 0 also sees its request's LAST
    draft (request 0: bit 11 of the last, partial word), tokens 7k + 3 see every draft up to
    themselves, token 150 sees drafts 180..q_len-1, request 0's tokens 20-23 (one row tile)
    see no draft at all, the others only themselves. Request 1 has an empty prefix and 200
    drafts under 10 mask words (7 cover it). Page 1 (cp.async kernel) and 64 (TMA kernel),
    auto and 5 splits, NaN-filled outputs, against the float64 reference (per request)."""
    q_lens, prefixes = [300, 200], [70, 0]
    dense = []
    for n in q_lens:
        vis = torch.zeros(n, n, dtype=torch.bool)
        for t in range(n):
            cols = set() if (n == 300 and 20 <= t <= 23) else {t}
            if t == 0:
                cols.add(n - 1)
            if t % 7 == 3:
                cols.update(range(t))
            if t == 150:
                cols.update(range(180, n))
            vis[t, sorted(cols)] = True
        dense.append(vis)
    p = testing.make_problem(q_lens, prefixes, model="mla_h16", layout="paged", page_size=page_size,
                             tree=dense, kv_scale=0.5, poison=False, seed=new_seed())
    assert p.tree_mask.shape == (sum(q_lens), 10)
    out, lse = testing.run(p, num_splits=num_splits)
    testing.check(p, out, lse, label=f"[seed {p.seed}]", lse_rtol=testing.LSE_RTOL)


@pytest.mark.parametrize("layout", ["flat", "paged1"])
def test_empty_batches(layout):
    dev = "cuda"
    mla, H, Hkv, d_qk, d_vo = MODELS["gqa_d128_g4"]
    q = torch.empty(0, H, d_qk, dtype=torch.bfloat16, device=dev)
    for B in (0, 2):
        qo = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        kv_rows = torch.tensor([0] + [5] * B, dtype=torch.int32).cumsum(0).to(torch.int32).to(dev)
        k = torch.randn(16, Hkv, d_qk, device=dev).to(torch.bfloat16)
        mask = torch.zeros(0, 1, dtype=torch.int32, device=dev)
        if layout == "flat":
            out, lse = va.tree_attention_flat(q, k, k, qo, kv_rows, tree_mask=mask, return_lse=True)
        else:
            out, lse = va.tree_attention_paged(
                q, k, k, qo, torch.arange(B + 1, dtype=torch.int32, device=dev),
                torch.arange(B, dtype=torch.int32, device=dev), torch.full((B,), 1, dtype=torch.int32, device=dev),
                tree_mask=mask, return_lse=True)
        assert out.shape == (0, H, d_vo) and lse.shape == (0, H)


@pytest.mark.parametrize("splits", [0, 1, 3])
def test_plan_info(splits):
    p = build_problem(_small_case(), new_seed(), "cuda")
    info = testing.plan_info(p, return_lse=True, num_splits=splits)
    print("plan_info:", info)
    for key in ("name", "tile_m", "tile_n", "num_warps", "num_stages", "num_splits", "smem_bytes",
                "sm_arch", "workspace_bytes"):
        assert key in info, key
    assert isinstance(info["name"], str) and info["name"]
    assert info["num_splits"] >= 1
    if splits:
        assert info["num_splits"] == splits
    if info["num_splits"] == 1:
        assert info["workspace_bytes"] == 0  # header: "0 when unsplit"
    else:
        assert info["workspace_bytes"] > 0
    assert info["kv_layout"] == "paged" and info["v_is_k_prefix"] == 1
    assert info["sm_arch"] == torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]


def test_mla_value_view_same_as_none():
    seed = new_seed()
    p = build_problem(_small_case(layout="flat"), seed, "cuda")
    o1, l1 = testing.call(p, return_lse=True)
    o2, l2 = testing.call(p.replace(v=p.k[..., :512]), return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(l1, l2), f"seed={seed}"
