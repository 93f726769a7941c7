"""GPU validation of the EXPERIMENTAL 32-rows-per-warp MLA kernel
(kernels/attention_kernel_r32.cuh), reachable only through
VERIFY_ATTN_FORCE_CONFIG. Same float64-reference checks as the main suite on
a covering set of MLA cases (trees, chains, ragged batches, prefix 0, q_len 1,
page sizes, splits, both dtypes, flat and paged). If this passes on a GPU and
the bench shows it faster, the plan can choose it (kernels/plan.cc)."""

import random

import pytest
import torch

import verify_attn
from verify_attn import masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CASES = [
    # (heads, q_lens, prefix, page_size, splits, dtype, tree kind, paged)
    (16, [64], 4000, 1, 0, torch.bfloat16, "ddtree", True),
    (16, [16, 0, 7, 33], 300, 16, 3, torch.float16, "random", True),
    (128, [32], 2000, 64, 1, torch.bfloat16, "chain", False),
    (1, [1, 5, 64], 0, 1, 2, torch.bfloat16, "star", True),
    (64, [257], 100, 16, 0, torch.float16, "deep", False),
    (16, [1024], 40, 1, 3, torch.bfloat16, "eagle", True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_r32_matches_reference(case, monkeypatch):
    H, q_lens, prefix, ps, splits, dt, kind, paged = CASES[case]
    major = torch.cuda.get_device_capability()[0]
    monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", "mla_r32_m32n32_s1" if major >= 12 else "mla_r32_m64n32_s2")
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dev = "cuda"
    B = len(q_lens)
    kv_lens = [prefix + i * 7 + t for i, t in enumerate(q_lens)]
    qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=dev)
    T = int(qo[-1])
    q = torch.randn(T, H, 576, device=dev, dtype=dt)
    parents = []
    for t in q_lens:
        parents += masks.random_parents(kind, t, rng=rng)
    causal = kind == "chain"
    tree = None if causal else masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev), qo)
    kw = dict(tree_mask=tree, causal=causal)
    if paged:
        pages = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages) + 5
        kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32, device=dev)
        kv_indices = torch.randperm(num_pages, device=dev)[: sum(pages)].to(torch.int32)
        kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
        k = torch.randn(num_pages, ps, 1, 576, device=dev, dtype=dt)
        args = (q, k, None, qo, kv_indptr, kv_indices, kv_len)
        info = verify_attn.plan_info(*args, **kw, num_splits=splits)
        out = torch.full((T, H, 512), float("nan"), device=dev, dtype=dt)
        lse = torch.full((T, H), float("nan"), device=dev)
        verify_attn.tree_attention_paged(*args, **kw, num_splits=splits, out=out, lse=lse, return_lse=True)
        ref, ref_lse = reference.reference_attention_paged(*args, **kw)
    else:
        kv_indptr = torch.tensor([0] + list(torch.tensor(kv_lens).cumsum(0)), dtype=torch.int32, device=dev)
        k = torch.randn(int(kv_indptr[-1]), 1, 576, device=dev, dtype=dt)
        args = (q, k, None, qo, kv_indptr)
        info = verify_attn.plan_info(*args, **kw, num_splits=splits)
        out = torch.full((T, H, 512), float("nan"), device=dev, dtype=dt)
        lse = torch.full((T, H), float("nan"), device=dev)
        verify_attn.tree_attention_flat(*args, **kw, num_splits=splits, out=out, lse=lse, return_lse=True)
        ref, ref_lse = reference.reference_attention_flat(*args, **kw)
    torch.cuda.synchronize()
    assert "r32" in info["name"], info
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), (seed, info)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    lerr = (lse.double() - ref_lse).abs().max().item()
    print(f"[r32 case {case} seed={seed}] {info['name']} splits={info['num_splits']}: rel_err={err:.2e} lse_err={lerr:.2e}")
    assert err < 1e-2 and lerr < 1e-2, (seed, err, lerr)
