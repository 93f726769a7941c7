"""fp8 (e4m3) KV caches on the GPU: every kernel that serves them against the
float64 reference of the dequantized cache (docs/design_fp8.md).

The caches are random e4m3 bytes (every finite code: subnormals, zeros of both
signs, the largest magnitudes; never a NaN code), so the conversion meets each
value it can; the scales keep the scores in a softmax's range. Outputs are
poisoned with NaN before each launch. Paths: the plan's, and each GQA warp-role
kernel forced (16- and 32-row consumer warps), head_dim 256 on the one-tile
kernels (two stages and one), flat and paged caches (page_size
1 scattered, 16), split and unsplit, trees and chains, bf16 and fp16 q; MLA
(576 / 512) on the plan's kernel (sm_90a: the cp.async wgmma kernel) and on the
cluster kernel (sm_120's), from 16 rows per KV head (one draft) up.
"""

import math
import random

import pytest
import torch

import verify_attn as va
from verify_attn import masks, reference, testing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

FP8 = torch.float8_e4m3fn
PATHS = {"auto": None, "roles": testing.ROLES_GQA, "roles_r32": testing.ROLES_R32_GQA}


def _fp8_codes(shape, gen):
    """Random finite e4m3 bytes: every code but the two NaNs (0x7f, 0xff)."""
    b = torch.randint(0, 254, shape, generator=gen, dtype=torch.int32)
    b = b + (b >= 0x7F).to(torch.int32)  # skip 0x7f; 0xff is never drawn
    return b.to(torch.uint8).cuda().view(FP8)


def _case(seed, *, d, layout, dtype, causal, hq=8, hkv=2, q_lens=None):
    """d 576: MLA (one KV head, the value the first 512 columns of k, v None)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    mla = d == 576
    if mla:
        hkv = 1
    batch = 3
    if q_lens is None:
        q_lens = [rng.randint(1, 40) for _ in range(batch)]
        if rng.random() < 0.5:
            q_lens[0] = 64 * 5 // (hq // hkv) + 1  # more than 256 rows per KV head in one request
    batch = len(q_lens)
    prefix = [rng.randint(0, 300) for _ in range(batch)]
    kv_lens = [p + q for p, q in zip(prefix, q_lens)]
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    total_q = int(qo[-1])
    q = torch.randn(total_q, hq, d, generator=gen).to(dtype).cuda()
    parents = []
    for ql in q_lens:
        parents += testing.random_parents("chain" if causal else "random", ql, rng=rng)
    tree = None if causal else masks.from_parents(torch.tensor(parents, dtype=torch.int32, device="cuda"), qo)
    # Scores of a softmax's range from codes up to 448: k_scale * 448 * sqrt(d) stays near 10.
    k_scale = 1.0 / 64 / math.sqrt(d) * rng.uniform(0.5, 2.0)
    v_scale = 1.0 if mla else rng.uniform(0.01, 0.1)  # MLA: the values take k_scale
    c = dict(q=q, qo=qo, tree=tree, causal=causal, q_lens=q_lens, kv_lens=kv_lens, k_scale=k_scale,
             v_scale=v_scale, layout=layout)
    if layout == "flat":
        kv_indptr = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0)), dtype=torch.int32, device="cuda")
        rows = int(kv_indptr[-1])
        c.update(k=_fp8_codes((rows, hkv, d), gen), v=None if mla else _fp8_codes((rows, hkv, d), gen),
                 kv_indptr=kv_indptr)
    else:
        ps = 1 if layout == "page1" else 16
        pages = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages) + 5
        perm = torch.randperm(num_pages, generator=gen)[: sum(pages)].to(torch.int32).cuda()
        c.update(k=_fp8_codes((num_pages, ps, hkv, d), gen),
                 v=None if mla else _fp8_codes((num_pages, ps, hkv, d), gen),
                 kv_indptr=torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32, device="cuda"),
                 kv_indices=perm, kv_len=torch.tensor(kv_lens, dtype=torch.int32, device="cuda"))
    return c


def _run(c, *, splits=0, tuning=None, out=None):
    kw = dict(tree_mask=c["tree"], causal=c["causal"], max_q_len=max(c["q_lens"]), max_kv_len=max(c["kv_lens"]),
              num_splits=splits, return_lse=True, k_scale=c["k_scale"], v_scale=c["v_scale"], tuning=tuning, out=out)
    if c["layout"] == "flat":
        return va.tree_attention_flat(c["q"], c["k"], c["v"], c["qo"], c["kv_indptr"], **kw)
    return va.tree_attention_paged(c["q"], c["k"], c["v"], c["qo"], c["kv_indptr"], c["kv_indices"], c["kv_len"], **kw)


def _reference(c):
    kw = dict(tree_mask=c["tree"], causal=c["causal"], k_scale=c["k_scale"], v_scale=c["v_scale"])
    if c["layout"] == "flat":
        return reference.reference_attention_flat(c["q"], c["k"], c["v"], c["qo"], c["kv_indptr"], **kw)
    return reference.reference_attention_paged(c["q"], c["k"], c["v"], c["qo"], c["kv_indptr"], c["kv_indices"],
                                               c["kv_len"], **kw)


def _check(c, out, lse, label):
    ref_out, ref_lse = _reference(c)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all()), f"{label}: non-finite output"
    qo = c["qo"].tolist()
    errs = [testing.rel_err(out[qo[i]:qo[i + 1]], ref_out[qo[i]:qo[i + 1]]) for i in range(len(qo) - 1)]
    lse_err = float((lse.double() - ref_lse).abs().max())
    print(f"{label}: worst request rel_err {max(errs):.3e}, lse err {lse_err:.3e}")
    assert max(errs) < testing.REL_TOL, (label, errs)
    assert lse_err < testing.LSE_ATOL, (label, lse_err)


@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["flat", "page1", "page16"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("d", [64, 128])
def test_fp8_cache_matches_reference(d, path, layout, dtype, splits):
    _check_on_path(d, layout, dtype, splits, "_e4m3kv_gqa_d%d_roles_" % d,
                   None if PATHS[path] is None else PATHS[path][d])


def _check_on_path(d, layout, dtype, splits, kernel, forced):
    """A fresh random case on the plan's kernel (forced: that configuration's
    tag), whose name must contain `kernel`, run into a NaN-poisoned output and
    checked against the reference of the dequantized cache."""
    seed = testing.new_seed()
    c = _case(seed, d=d, layout=layout, dtype=dtype, causal=seed % 3 == 0)
    tuning = None if forced is None else va.Tuning(config=forced)
    info = va.plan_info(c["q"], c["k"], c["v"], c["qo"], c["kv_indptr"], c.get("kv_indices"), c.get("kv_len"),
                        tree_mask=c["tree"], causal=c["causal"], max_q_len=max(c["q_lens"]),
                        max_kv_len=max(c["kv_lens"]), num_splits=splits, k_scale=c["k_scale"],
                        v_scale=c["v_scale"], tuning=tuning)
    assert kernel in info["name"], info["name"]
    if forced is not None:
        assert info["name"].endswith(forced), info["name"]
    out = torch.full((c["q"].shape[0], c["q"].shape[1], d), float("nan"), dtype=dtype, device="cuda")
    out, lse = _run(c, splits=splits, tuning=tuning, out=out)
    _check(c, out, lse, f"seed {seed} {info['name']} splits {info['num_splits']}")


def test_fp8_error_against_the_unquantized_cache():
    """Reported, not asserted: the quantization's own error (the kernel's error is
    measured against the dequantized cache above)."""
    seed = testing.new_seed()
    c = _case(seed, d=128, layout="page1", dtype=torch.bfloat16, causal=False)
    gen = torch.Generator().manual_seed(seed)
    k_bf16 = torch.randn(c["k"].shape, generator=gen).to(torch.bfloat16).cuda()
    v_bf16 = torch.randn(c["v"].shape, generator=gen).to(torch.bfloat16).cuda()
    k_scale, v_scale = float(k_bf16.abs().max()) / 448, float(v_bf16.abs().max()) / 448
    c.update(k=(k_bf16.float() / k_scale).to(FP8), v=(v_bf16.float() / v_scale).to(FP8), k_scale=k_scale,
             v_scale=v_scale)
    out, lse = _run(c)
    _check(c, out, lse, f"seed {seed} fp8 vs dequantized")
    ref_bf16, _ = reference.reference_attention_paged(c["q"], k_bf16, v_bf16, c["qo"], c["kv_indptr"],
                                                      c["kv_indices"], c["kv_len"], tree_mask=c["tree"])
    print(f"seed {seed}: fp8 output vs the bf16 cache's float64 result: rel_err {testing.rel_err(out, ref_bf16):.3e}")


def test_fp8_plan_runs_and_replays_in_a_graph():
    seed = testing.new_seed()
    c = _case(seed, d=64, layout="page16", dtype=torch.bfloat16, causal=False)
    plan = va.TreeAttentionPlan(c["qo"], c["kv_indptr"], c["kv_indices"], c["kv_len"], num_qo_heads=8, num_kv_heads=2,
                                head_dim_qk=64, tree_mask=c["tree"], max_q_len=max(c["q_lens"]),
                                max_kv_len=max(c["kv_lens"]), kv_dtype=FP8, k_scale=c["k_scale"],
                                v_scale=c["v_scale"])
    out = torch.full((c["q"].shape[0], 8, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((c["q"].shape[0], 8), dtype=torch.float32, device="cuda")
    plan.run(c["q"], c["k"], c["v"], out=out, lse=lse)
    _check(c, out, lse, f"seed {seed} plan")
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(c["q"], c["k"], c["v"], out=out, lse=lse)
    g.replay()
    torch.cuda.synchronize()
    _check(c, out, lse, f"seed {seed} plan, graph replay")
    # A layer's own scales (each layer of a model has its own): the same plan, no new one.
    made = plan.plans_made
    c.update(k_scale=c["k_scale"] * 1.5, v_scale=c["v_scale"] * 0.5)
    out.fill_(float("nan"))
    plan.run(c["q"], c["k"], c["v"], out=out, lse=lse, k_scale=c["k_scale"], v_scale=c["v_scale"])
    _check(c, out, lse, f"seed {seed} plan, a run's own scales")
    assert plan.plans_made == made
    with pytest.raises(TypeError, match=r"^k_cache: dtype torch.bfloat16 differs from the plan's kv_dtype"):
        plan.run(c["q"], c["k"].to(torch.bfloat16), c["v"].to(torch.bfloat16), out=out, lse=lse)


@pytest.mark.parametrize("splits", [0, 2])
def test_fp8_bad_index_flags_and_nans_its_request(splits):
    seed = testing.new_seed()
    c = _case(seed, d=128, layout="page1", dtype=torch.bfloat16, causal=False)
    va.check_errors()
    idx = c["kv_indices"].clone()
    kvp = c["kv_indptr"].tolist()
    idx[kvp[1] + (kvp[2] - kvp[1]) // 2] = c["k"].shape[0] + 3  # request 1: a page past the cache
    c["kv_indices"] = idx
    out, _ = _run(c, splits=splits)
    with pytest.raises(va.KernelInputError) as e:
        va.check_errors()
    assert e.value.request == 1 and e.value.bits & va.errors.ERR_KV_INDEX, str(e.value)
    qo = c["qo"].tolist()
    assert bool(torch.isnan(out[qo[1]:qo[2]]).all())
    assert bool(torch.isfinite(out[qo[0]:qo[1]]).all()) and bool(torch.isfinite(out[qo[2]:]).all())


@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["flat", "page1", "page16"])
@pytest.mark.parametrize("drafts", ["one", "many"])
@pytest.mark.parametrize("path", ["auto", "cluster"])
def test_fp8_mla_cache_matches_reference(path, drafts, layout, dtype, splits):
    """MLA, 16 heads: one draft per request (16 rows per KV head; the cluster kernel's
    CTA then has half its rows empty) or up to 40 (a 640-row request among them). The
    plan's kernel (sm_90a: the cp.async wgmma kernel, converting in its stages; else
    the cluster kernel) and the cluster kernel forced (sm_120's)."""
    seed = testing.new_seed()
    q_lens = [1, 1, 1] if drafts == "one" else None
    c = _case(seed, d=576, layout=layout, dtype=dtype, causal=seed % 3 == 0, hq=16, q_lens=q_lens)
    tuning = va.Tuning(config=testing.CLUSTER_MLA) if path == "cluster" else None
    info = va.plan_info(c["q"], c["k"], None, c["qo"], c["kv_indptr"], c.get("kv_indices"), c.get("kv_len"),
                        tree_mask=c["tree"], causal=c["causal"], max_q_len=max(c["q_lens"]),
                        max_kv_len=max(c["kv_lens"]), num_splits=splits, k_scale=c["k_scale"], tuning=tuning)
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    want = "_e4m3kv_mla_wgmma_m64n64_pipe_rows" if path == "auto" and sm90 else "_e4m3kv_" + testing.CLUSTER_MLA
    assert info["name"].endswith(want), info["name"]
    out = torch.full((c["q"].shape[0], 16, 512), float("nan"), dtype=dtype, device="cuda")
    out, lse = _run(c, splits=splits, out=out, tuning=tuning)
    _check(c, out, lse, f"seed {seed} {info['name']} splits {info['num_splits']}")


def test_fp8_mla_plan_run_scales_and_v_scale_rule():
    """A plan's run with its own k_scale (MLA: it scales the values too); a v_scale
    other than k_scale is refused naming v_scale, one equal to it accepted."""
    seed = testing.new_seed()
    c = _case(seed, d=576, layout="page16", dtype=torch.bfloat16, causal=False, hq=16)
    plan = va.TreeAttentionPlan(c["qo"], c["kv_indptr"], c["kv_indices"], c["kv_len"], num_qo_heads=16,
                                head_dim_qk=576, head_dim_vo=512, tree_mask=c["tree"], max_q_len=max(c["q_lens"]),
                                max_kv_len=max(c["kv_lens"]), kv_dtype=FP8, k_scale=c["k_scale"])
    out = torch.full((c["q"].shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((c["q"].shape[0], 16), dtype=torch.float32, device="cuda")
    plan.run(c["q"], c["k"], out=out, lse=lse)
    _check(c, out, lse, f"seed {seed} MLA plan")
    c["k_scale"] *= 1.5
    out.fill_(float("nan"))
    plan.run(c["q"], c["k"], out=out, lse=lse, k_scale=c["k_scale"], v_scale=c["k_scale"])
    _check(c, out, lse, f"seed {seed} MLA plan, a run's own k_scale")
    with pytest.raises(ValueError, match=r"^v_scale: an MLA cache holds K and V in one tensor"):
        plan.run(c["q"], c["k"], out=out, lse=lse, k_scale=c["k_scale"], v_scale=2 * c["k_scale"])
    with pytest.raises(ValueError, match=r"^v_scale: an MLA cache holds K and V in one tensor"):
        va.tree_attention_paged(c["q"], c["k"], None, c["qo"], c["kv_indptr"], c["kv_indices"], c["kv_len"],
                                tree_mask=c["tree"], max_q_len=max(c["q_lens"]), max_kv_len=max(c["kv_lens"]),
                                k_scale=0.5, v_scale=0.25)


# head_dim 256: the one-tile kernels (the plan's: two stages on sm_90; the
# one-stage one, sm_120's, forced), every thread converting its part of a tile.
D256_PATHS = {"auto": None, "one_stage": "gqa_d256_m64n32_s1"}


@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["flat", "page1", "page16"])
@pytest.mark.parametrize("path", list(D256_PATHS))
def test_fp8_cache_head_dim_256_matches_reference(path, layout, dtype, splits):
    _check_on_path(256, layout, dtype, splits, "_e4m3kv_gqa_d256_m64n32_s", D256_PATHS[path])
