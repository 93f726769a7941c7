"""GPU tests: the kernels against the float64 PyTorch reference.

A pairwise covering set (every pair of values of the dimensions below appears in
at least one case) of about 70 cases over: model (MLA with H 1/16/128; GQA with
head_dim 64/128/256 and groups 1/3/4/8), longest q_len (1, 16, 64, 257, 1024),
longest prefix (0, 1, 100, 4096, 40000), KV layout (flat, paged with page
size 1/16/64 and randomly permuted pages), batch (1, 3, 8, 32; ragged, with a
q_len-0 request when B > 1), mask (chain, star, deep, random, DDTree-like
best-first, non-topological, causal mode), dtype (bf16, fp16), num_splits
(auto, 1, 3). Cases whose reference would be too large are excluded (big
prefixes only at small batch / few heads). Each case further varies, by its
index: NaN-poisoned preallocated out/lse, strided views (q, out, lse, MLA v as
k[..., :512], uint32 mask), NaN in KV slots that must not be read, host bounds
given exactly / loosely / computed, a kv_indptr starting at an offset, 3-D
caches, logit scale.

Inputs are random with a fresh seed per case, printed on failure (set
VERIFY_ATTN_TEST_SEED to replay one). Pass: ||out - ref|| / ||ref|| < 1e-2 for
the case and for each request, all outputs finite, LSE within 1e-2 (natural log).
Run with ``-s`` to see each case's error and the worst relative error per layout.
"""

import itertools
import math
import os
import random

import pytest
import torch

import verify_attn as va
from verify_attn import masks
from verify_attn.reference import reference_attention_flat, reference_attention_paged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REL_TOL = 1e-2
LSE_ATOL = 1e-2
LSE_RTOL = 1e-3


def new_seed():
    s = os.environ.get("VERIFY_ATTN_TEST_SEED")
    return int(s) if s else random.SystemRandom().randrange(2**31)


# ---------------------------------------------------------------------------
# the covering set of cases

MODELS = {
    # name: (mla, H, Hkv, d_qk, d_vo)
    "mla_h1": (True, 1, 1, 576, 512),
    "mla_h16": (True, 16, 1, 576, 512),
    "mla_h128": (True, 128, 1, 576, 512),
    "gqa_d64_g1": (False, 4, 4, 64, 64),
    "gqa_d64_g8": (False, 16, 2, 64, 64),
    "gqa_d128_g3": (False, 6, 2, 128, 128),
    "gqa_d128_g4": (False, 16, 4, 128, 128),
    "gqa_d128_g8": (False, 8, 1, 128, 128),
    "gqa_d256_g1": (False, 2, 2, 256, 256),
    "gqa_d256_g4": (False, 4, 1, 256, 256),
}
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
    return MODELS[c["model"]][1] * c["batch"] * c["q_len"] * (c["prefix"] + c["q_len"])


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


# ---------------------------------------------------------------------------
# building one problem


def build_problem(c, seed, device):
    """Random inputs for case c. Returns a dict with the API call's arguments and the reference's."""
    rng = random.Random(seed)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dgen = torch.Generator(device=device).manual_seed(seed)
    mla, H, Hkv, d_qk, d_vo = MODELS[c["model"]]
    dtype = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    B, qmax, P = c["batch"], c["q_len"], c["prefix"]

    def randn(*shape):
        return torch.randn(*shape, generator=dgen, device=device).to(dtype)

    q_lens = [qmax] + [rng.randint(1, qmax) for _ in range(B - 1)]
    prefixes = [P] + [rng.randint(0, P) for _ in range(B - 1)]
    if B > 1:
        q_lens[rng.randrange(1, B)] = 0
    order = list(range(B))
    rng.shuffle(order)
    q_lens = [q_lens[i] for i in order]
    prefixes = [prefixes[i] for i in order]
    kv_lens = [p + n for p, n in zip(prefixes, q_lens)]
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    total_q = qo[-1]
    qo_t = torch.tensor(qo, dtype=torch.int32, device=device)

    # bounds
    exact_q, exact_kv = max(q_lens), max(kv_lens)
    if c["bounds"] == "computed":
        max_q_len = max_kv_len = None
        width_q = exact_q
    elif c["bounds"] == "exact":
        max_q_len, max_kv_len = exact_q, exact_kv
        width_q = exact_q
    else:
        max_q_len = min(1024, 32 * ((exact_q + 31) // 32) + 5)
        max_kv_len = 2 * exact_kv + 7
        width_q = max_q_len

    # mask
    causal = c["mask"] == "causal"
    tree_mask = None
    if not causal:
        parents = []
        for n in q_lens:
            parents += masks.random_parents(c["mask"], n, rng=rng)
        tree_mask = masks.from_parents(
            torch.tensor(parents, dtype=torch.int32, device=device), qo_t, max_q_len=width_q)
        if c["views"] and hasattr(torch, "uint32"):
            tree_mask = tree_mask.view(torch.uint32)

    # q (optionally a strided view)
    if c["views"]:
        big = randn(total_q, H, d_qk + 64) * c["q_scale"]
        q = big[..., :d_qk]
    else:
        q = randn(total_q, H, d_qk) * c["q_scale"]
    q = q.to(dtype)

    nan = float("nan")
    layout = c["layout"]
    a = dict(q=q, qo_indptr=qo_t, tree_mask=tree_mask, causal=causal, max_q_len=max_q_len,
             max_kv_len=max_kv_len, sm_scale=c["sm_scale"], q_lens=q_lens, kv_lens=kv_lens,
             layout=layout, mla=mla, H=H, d_vo=d_vo, dtype=dtype)
    if layout == "flat":
        off = rng.randint(1, 50) if c["kv_offset"] else 0
        extra = 7
        rows = off + sum(kv_lens) + extra
        k = randn(rows, Hkv, d_qk)
        v = None if mla else randn(rows, Hkv, d_vo)
        if c["poison_kv"]:
            for t in (k, v):
                if t is not None:
                    t[:off] = nan
                    t[rows - extra:] = nan
        kv = [off]
        for n in kv_lens:
            kv.append(kv[-1] + n)
        a.update(k=k, v=v, kv_indptr=torch.tensor(kv, dtype=torch.int32, device=device))
    else:
        ps = int(layout[len("paged"):])
        pages_per = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages_per) + 5
        perm = torch.randperm(num_pages, generator=gen).tolist()
        fill = (lambda *s: torch.full(s, nan, dtype=dtype, device=device)) if c["poison_kv"] else randn
        kc = fill(num_pages * ps, Hkv, d_qk)
        vc = None if mla else fill(num_pages * ps, Hkv, d_vo)
        indices, ind, slots = [], [0], []
        nxt = 0
        for i in range(B):
            ids = perm[nxt: nxt + pages_per[i]]
            nxt += pages_per[i]
            indices += ids
            ind.append(len(indices))
            if kv_lens[i]:
                j = torch.arange(kv_lens[i])
                slots.append(torch.tensor(ids, dtype=torch.long)[j // ps] * ps + j % ps)
        indices += [perm[-1]] * 3  # trailing, unused entries
        if slots:
            s = torch.cat(slots).to(device)
            kc[s] = randn(s.numel(), Hkv, d_qk)
            if vc is not None:
                vc[s] = randn(s.numel(), Hkv, d_vo)
        page_size = None
        if c["cache3d"]:
            page_size = ps
        else:
            kc = kc.reshape(num_pages, ps, Hkv, d_qk)
            vc = None if vc is None else vc.reshape(num_pages, ps, Hkv, d_vo)
        a.update(k=kc, v=vc, page_size=page_size,
                 kv_indptr=torch.tensor(ind, dtype=torch.int32, device=device),
                 kv_indices=torch.tensor(indices, dtype=torch.int32, device=device),
                 kv_len=torch.tensor(kv_lens, dtype=torch.int32, device=device))
    if mla and c["views"]:
        a["v"] = a["k"][..., :d_vo]  # SGLang's MLA value view
    return a


def call_api(a, *, out=None, lse=None, return_lse=True, num_splits=0, head_dim_vo=None):
    kw = dict(tree_mask=a["tree_mask"], causal=a["causal"], sm_scale=a["sm_scale"],
              max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"], return_lse=return_lse,
              num_splits=num_splits, out=out, lse=lse, head_dim_vo=head_dim_vo)
    if a["layout"] == "flat":
        return va.tree_attention_flat(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], **kw)
    return va.tree_attention_paged(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"],
                                   a["kv_indices"], a["kv_len"], page_size=a["page_size"], **kw)


def plan_info_for(a, **kw):
    """verify_attn.plan_info for problem `a` (its layout, mask and host bounds) plus kw."""
    return va.plan_info(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a.get("kv_indices"),
                        a.get("kv_len"), page_size=a.get("page_size"), tree_mask=a["tree_mask"],
                        causal=a["causal"], max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"], **kw)


def call_reference(a):
    kw = dict(tree_mask=a["tree_mask"], causal=a["causal"], sm_scale=a["sm_scale"],
              head_dim_vo=a["d_vo"] if a["mla"] else None)
    if a["layout"] == "flat":
        return reference_attention_flat(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], **kw)
    return reference_attention_paged(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"],
                                     a["kv_indices"], a["kv_len"], page_size=a["page_size"], **kw)


def rel_err(x, ref):
    x = x.double()
    den = ref.norm()
    if den == 0:
        return float((x - ref).norm())
    return float((x - ref).norm() / den)


def check_against_reference(a, out, lse, label):
    """Returns (case rel err, worst per-request rel err, lse max abs err); asserts the tolerances."""
    ref_out, ref_lse = call_reference(a)
    total_q, H = a["q"].shape[0], a["H"]
    assert out.shape == (total_q, H, a["d_vo"]) and out.dtype == a["dtype"], label
    finite = bool(torch.isfinite(out).all())
    err = rel_err(out, ref_out)
    worst_req = 0.0
    s = 0
    for n in a["q_lens"]:
        if n:
            worst_req = max(worst_req, rel_err(out[s:s + n], ref_out[s:s + n]))
        s += n
    lse_err = 0.0
    if lse is not None:
        assert lse.shape == (total_q, H) and lse.dtype == torch.float32, label
        finite = finite and bool(torch.isfinite(lse).all())
        d = (lse.double() - ref_lse).abs()
        lse_err = float(d.max()) if d.numel() else 0.0
        tol_ok = bool((d <= LSE_ATOL + LSE_RTOL * ref_lse.abs()).all())
    else:
        tol_ok = True
    msg = f"{label}: rel_err={err:.3e} worst_request={worst_req:.3e} lse_err={lse_err:.3e} finite={finite}"
    print(msg)
    assert finite, "non-finite output (unwritten or NaN-poisoned memory read): " + msg
    assert err < REL_TOL and worst_req < REL_TOL, msg
    assert tol_ok, "lse out of tolerance: " + msg
    return err, worst_req, lse_err


# ---------------------------------------------------------------------------
# the matrix

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
    a = build_problem(c, seed, device)
    label = f"[{case_id(c)} seed={seed}]"
    total_q, H, d_vo = a["q"].shape[0], a["H"], a["d_vo"]
    return_lse = c["return_lse"]
    out = lse = None
    out_big = lse_big = None
    if c["prealloc"]:
        nan = float("nan")
        if c["views"]:
            out_big = torch.full((total_q, H, d_vo + 8), nan, dtype=a["dtype"], device=device)
            out = out_big[..., :d_vo]
            lse_big = torch.full((total_q, H + 3), nan, dtype=torch.float32, device=device)
            lse = lse_big[:, :H] if return_lse else None
        else:
            out = torch.full((total_q, H, d_vo), nan, dtype=a["dtype"], device=device)
            lse = torch.full((total_q, H), nan, dtype=torch.float32, device=device) if return_lse else None
    head_dim_vo = d_vo if (a["mla"] and c["idx"] % 2 == 0) else None  # MLA default is 512
    res = call_api(a, out=out, lse=lse, return_lse=return_lse, num_splits=c["splits"], head_dim_vo=head_dim_vo)
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
    err, worst_req, _ = check_against_reference(a, o, l, label)
    if out_big is not None:
        assert torch.isnan(out_big[..., d_vo:]).all(), label + " wrote outside out's view"
        if lse is not None:
            assert torch.isnan(lse_big[:, H:]).all(), label + " wrote outside lse's view"
    return max(err, worst_req)


# MLA runs on two kernel paths on sm_90: the wgmma path the plan picks there
# (kernels/sm90/mla_wgmma_kernel.cuh) and the portable mma.sync path (the one
# sm_120 runs), forced through the plan's tuning knob. Every MLA case runs on
# both; test_mla_path_pinned checks which one ran.
MMA_SYNC_MLA = "mla_m64n32_w8_s2"
# The wgmma kernel's other producer (per-thread page lookups instead of the
# staged row table; opt-in config, never chosen by the plan) on every MLA case.
WGMMA_LOOKUP_MLA = "mla_wgmma_m64n64_pipe"
CASE_PATHS = ([(c, "auto") for c in CASES] + [(c, "mma_sync") for c in CASES if MODELS[c["model"]][0]]
              + [(c, "wgmma_lookup") for c in CASES if MODELS[c["model"]][0]])


def expected_path(mla, forced_mma_sync=False):
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    return "wgmma_" if (mla and sm90 and not forced_mma_sync) else "mma_sync_"


@pytest.mark.parametrize("case,path", CASE_PATHS, ids=[f"{case_id(c)}-{p}" for c, p in CASE_PATHS])
def test_kernel_matches_reference(case, path, monkeypatch):
    if path == "mma_sync":
        monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", MMA_SYNC_MLA)
    if path == "wgmma_lookup":
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("the wgmma path is sm_90 only")
        monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", WGMMA_LOOKUP_MLA)
        a = build_problem(case, 0, "cuda")
        info = plan_info_for(a)
        assert info["name"].endswith(WGMMA_LOOKUP_MLA), info
    seed = new_seed()
    err = run_case(case, seed)
    key = case["layout"] + {"auto": "", "mma_sync": " (mla on mma.sync)",
                            "wgmma_lookup": " (mla on wgmma, page lookups)"}[path]
    if MODELS[case["model"]][0] and path == "auto":
        key += f" (mla on {expected_path(True).rstrip('_')})"
    if err >= WORST.get(key, (-1.0, ""))[0]:
        WORST[key] = (err, f"{case_id(case)} seed={seed}")


@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("layout", ["flat", "paged1", "paged16", "paged64"])
def test_mla_path_pinned(forced, layout, monkeypatch):
    """Which MLA kernel runs: wgmma on sm_90 unless forced (the TMA kernel on page_size 64 and
    flat caches, the cp.async one otherwise), mma.sync elsewhere; all correct."""
    if forced:
        monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", MMA_SYNC_MLA)
    c = _small_case(layout=layout, q_len=70, prefix=1000, batch=2)
    seed = new_seed()
    a = build_problem(c, seed, "cuda")
    info = plan_info_for(a, return_lse=True)
    print(f"[path {layout} forced={forced}] {info['name']} splits={info['num_splits']}")
    assert info["name"].startswith(expected_path(True, forced)), info
    if expected_path(True, forced) == "wgmma_":
        tma = layout in ("paged64", "flat")
        assert info["name"].endswith("mla_wgmma_seesaw_tma" if tma else "mla_wgmma_m64n64_pipe_rows"), info
    err = run_case(c, seed)
    assert err < 1e-2


# The launch grid's two orders (kernels/plan.h, grid_coord): the sm_90a MLA
# kernels run a request's row tiles adjacent (the plan's choice there whenever
# batch_size x KV heads <= 65535, so the other sm_90 MLA tests run it too) or
# request-major (past that, or with VERIFY_ATTN_GRID_ORDER=requests); the
# portable kernels (GQA, forced mma.sync MLA, sm_120) run request-major
# whatever the knob says. Here both orders on each sm_90a MLA kernel (the TMA
# kernel paged and flat, split and unsplit; the cp.async one), the portable
# ones once with the knob set (it must not move them). Which order a plan takes
# is pinned on the host (kernels/tests/plan_test.cc: the sm_90a configurations
# take the rows first); here, that the MLA cases planned an sm_90a kernel.
GRID_CASES = [("mla_h16", "paged64", 0, None, o) for o in ("requests", "rows")] + [
    ("mla_h16", "paged64", 3, None, o) for o in ("requests", "rows")] + [
    ("mla_h128", "paged1", 0, None, o) for o in ("requests", "rows")] + [
    ("mla_h16", "flat", 0, None, o) for o in ("requests", "rows")] + [
    ("mla_h16", "paged16", 0, MMA_SYNC_MLA, "rows"), ("gqa_d128_g4", "paged16", 0, None, "rows"),
    ("gqa_d64_g8", "flat", 3, None, "requests")]


@pytest.mark.parametrize("model,layout,splits,force,order", GRID_CASES,
                         ids=["-".join(str(x) for x in c) for c in GRID_CASES])
def test_grid_orders(model, layout, splits, force, order, monkeypatch):
    monkeypatch.setenv("VERIFY_ATTN_GRID_ORDER", order)
    if force:
        monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", force)
    c = _small_case(model=model, layout=layout, splits=splits, batch=5, q_len=70, prefix=700,
                    prealloc=True)
    seed = new_seed()
    a = build_problem(c, seed, "cuda")
    info = plan_info_for(a, num_splits=splits)
    assert info["name"].startswith(expected_path(MODELS[model][0], force is not None)), info
    assert run_case(c, seed) < REL_TOL


# The TMA kernel's early release of stage 0's blocks 0-3 (Plan::early_a0_release,
# kernels/plan.cc): the plan's rule turns it on where a request's rows fit one
# row tile (q_len 4 at 16 heads), VERIFY_ATTN_EARLY_A0=1 / 0 forces it on / off;
# every combination against the reference, paged (split and unsplit) and flat.
# Which plans take it is pinned on the host (kernels/tests/plan_test.cc).
EARLY_CASES = [(layout, splits, q_len, knob) for layout, splits in (("paged64", 0), ("paged64", 3),
                                                                     ("flat", 0))
               for q_len in (4, 70) for knob in ("", "0", "1")]


@pytest.mark.parametrize("layout,splits,q_len,knob", EARLY_CASES,
                         ids=["-".join(str(x) for x in c) for c in EARLY_CASES])
def test_early_a0_release(layout, splits, q_len, knob, monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the TMA kernel (the flag's only reader) is sm_90a only")
    monkeypatch.setenv("VERIFY_ATTN_EARLY_A0", knob)
    # NaN in the cache slots no request owns: a page-64 tile brings the rows
    # past kv_len with it, which the consumers zero (zero_tail) before the P V
    # that precedes the early release.
    c = _small_case(model="mla_h16", layout=layout, splits=splits, batch=5, q_len=q_len, prefix=700,
                    prealloc=True, poison_kv=True)
    seed = new_seed()
    a = build_problem(c, seed, "cuda")
    info = plan_info_for(a, num_splits=splits)
    assert info["name"].endswith("mla_wgmma_seesaw_tma"), info
    assert run_case(c, seed) < REL_TOL


def test_early_a0_knob_rejects_unknown(monkeypatch):
    monkeypatch.setenv("VERIFY_ATTN_EARLY_A0", "yes")
    a = build_problem(_small_case(), 1, "cuda")
    with pytest.raises(ValueError, match="VERIFY_ATTN_EARLY_A0"):
        call_api(a)


def test_grid_order_knob_rejects_unknown(monkeypatch):
    monkeypatch.setenv("VERIFY_ATTN_GRID_ORDER", "columns")
    a = build_problem(_small_case(), 1, "cuda")
    with pytest.raises(ValueError, match="VERIFY_ATTN_GRID_ORDER"):
        call_api(a)


# ---------------------------------------------------------------------------
# edge cases, planning, torch.compile, CUDA graphs


def _small_case(**over):
    c = dict(model="mla_h16", q_len=40, prefix=300, layout="paged16", batch=3, mask="ddtree",
             dtype="bf16", splits=0, idx=0, prealloc=False, return_lse=True, bounds="exact",
             views=False, poison_kv=False, kv_offset=False, cache3d=False, q_scale=1.0, sm_scale=None)
    c.update(over)
    return c


def _mask_words(rows, q_len, device):
    """[len(rows), ceil(q_len / 32)] int32 tree-mask words from per-row sets of draft indices."""
    words = (q_len + 31) // 32
    w = torch.zeros(len(rows), words, dtype=torch.int64)
    for r, cols in enumerate(rows):
        for c in cols:
            w[r, c // 32] |= 1 << (c % 32)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).to(device)


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
    auto and 5 splits, NaN-filled outputs, against the float64 reference."""
    dev = "cuda"
    g = torch.Generator().manual_seed(new_seed())
    H, d_qk, d_vo = 16, 576, 512
    q_lens, prefixes = [300, 200], [70, 0]
    B, T = len(q_lens), max(q_lens)
    rows = []
    for n in q_lens:
        for t in range(n):
            cols = set() if (n == 300 and 20 <= t <= 23) else {t}
            if t == 0:
                cols.add(n - 1)
            if t % 7 == 3:
                cols.update(range(t))
            if t == 150:
                cols.update(range(180, n))
            rows.append(cols)
    mask = _mask_words(rows, T, dev)
    kv_lens = [p + n for p, n in zip(prefixes, q_lens)]
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages) + 5
    perm = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
    k_cache = (torch.randn(num_pages, page_size, 1, d_qk, generator=g) * 0.5).to(torch.bfloat16).to(dev)
    total_q = sum(q_lens)
    q = torch.randn(total_q, H, d_qk, generator=g).to(torch.bfloat16).to(dev)
    qo = torch.tensor([0, q_lens[0], total_q], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, pages[0], pages[0] + pages[1]], dtype=torch.int32, device=dev)
    kv_indices = perm.to(dev)
    kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    out = torch.full((total_q, H, d_vo), float("nan"), dtype=torch.bfloat16, device=dev)
    lse = torch.full((total_q, H), float("nan"), dtype=torch.float32, device=dev)
    va.tree_attention_paged(q, k_cache, None, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask,
                            max_q_len=T, max_kv_len=max(kv_lens), out=out, lse=lse, return_lse=True,
                            num_splits=num_splits)
    ref_out, ref_lse = reference_attention_paged(q, k_cache, None, qo, kv_indptr, kv_indices, kv_len,
                                                 tree_mask=mask)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    s = 0
    for n in q_lens:
        err = rel_err(out[s:s + n], ref_out[s:s + n])
        assert err < REL_TOL, (s, err)
        s += n
    d = (lse.double() - ref_lse).abs()
    assert bool((d <= LSE_ATOL + LSE_RTOL * ref_lse.abs()).all()), float(d.max())


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
    a = build_problem(_small_case(), new_seed(), "cuda")
    info = va.plan_info(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                        tree_mask=a["tree_mask"], max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"],
                        return_lse=True, num_splits=splits)
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
    a = build_problem(_small_case(layout="flat"), seed, "cuda")
    o1, l1 = call_api(a)
    a2 = dict(a, v=a["k"][..., :512])
    o2, l2 = call_api(a2)
    torch.cuda.synchronize()
    assert torch.equal(o1, o2) and torch.equal(l1, l2), f"seed={seed}"


def test_torch_compile_fullgraph():
    seed = new_seed()
    a = build_problem(_small_case(layout="paged64", model="gqa_d128_g4", mask="random"), seed, "cuda")
    H, d_vo = a["H"], a["d_vo"]

    def fn(q, k, v, qo, kv_indptr, kv_indices, kv_len, mask):
        out, lse = va.tree_attention_paged(
            q * 1.0, k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask,
            max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"], return_lse=True)
        out2 = torch.full((q.shape[0], H, d_vo), float("nan"), dtype=q.dtype, device=q.device)
        va.tree_attention_paged(q, k, v, qo, kv_indptr, kv_indices, kv_len, tree_mask=mask,
                                max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"], out=out2, num_splits=3)
        return out, lse * 2.0, out2, out.float().sum()

    args = (a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"], a["tree_mask"])
    eager = fn(*args)
    compiled = torch.compile(fn, fullgraph=True)(*args)
    torch.cuda.synchronize()
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0, msg=f"seed={seed}")
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=0, msg=f"seed={seed}")
    torch.testing.assert_close(compiled[2], eager[2], rtol=0, atol=0, msg=f"seed={seed}")
    check_against_reference(a, compiled[0], compiled[1] / 2.0, f"[compile seed={seed}]")
    check_against_reference(a, compiled[2], None, f"[compile out= seed={seed}]")


@pytest.mark.parametrize("splits", [0, 3])
def test_cuda_graph_capture_and_replay(splits):
    seed = new_seed()
    rng = random.Random(seed)
    c = _small_case(layout="paged1", cache3d=True, splits=splits, mask="random")
    a = build_problem(c, seed, "cuda")

    def step():
        return call_api(a, num_splits=splits)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out, static_lse = step()
    g.replay()
    torch.cuda.synchronize()
    check_against_reference(a, static_out, static_lse, f"[graph replay 1 seed={seed}]")

    # New device data in the same buffers -- values, page order, tree bits and KV lengths
    # (within the bounds): the replay must follow them, nothing but the host bounds is baked in.
    a["q"].copy_(torch.randn(a["q"].shape, device="cuda").to(a["q"].dtype))
    a["k"].copy_(torch.randn(a["k"].shape, device="cuda").to(a["k"].dtype))
    a["kv_indices"].copy_(a["kv_indices"][torch.randperm(a["kv_indices"].numel(), device="cuda")])
    new_kv = [rng.randint(n, kv) for n, kv in zip(a["q_lens"], a["kv_lens"])]
    a["kv_len"].copy_(torch.tensor(new_kv, dtype=torch.int32))
    a["kv_lens"] = new_kv
    parents = []
    for n in a["q_lens"]:
        parents += masks.random_parents("deep", n, rng=rng)
    new_mask = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device="cuda"), a["qo_indptr"],
                                  max_q_len=a["tree_mask"].shape[1] * 32)
    a["tree_mask"].copy_(new_mask)
    g.replay()
    torch.cuda.synchronize()
    check_against_reference(a, static_out, static_lse, f"[graph replay 2 seed={seed}]")
    eager_out, eager_lse = step()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, eager_out, rtol=0, atol=0)
    torch.testing.assert_close(static_lse, eager_lse, rtol=0, atol=0)


def test_cuda_graph_capture_needs_bounds():
    a = build_problem(_small_case(layout="flat"), new_seed(), "cuda")
    a["max_q_len"] = None
    g = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"^max_q_len: must be passed explicitly"):
        with torch.cuda.graph(g):
            call_api(a)


def test_opcheck():
    a = build_problem(_small_case(layout="paged16", model="gqa_d64_g8", q_len=20, prefix=50), new_seed(), "cuda")
    args = (a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"], a["tree_mask"],
            1, 16, False, 1.0 / math.sqrt(a["q"].shape[-1]), a["d_vo"], a["max_q_len"], a["max_kv_len"], 0, True)
    torch.library.opcheck(torch.ops.verify_attn.tree_attention.default, args)
