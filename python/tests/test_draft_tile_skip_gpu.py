"""Trees whose row tiles do not see every draft tile, on the sm_90a TMA kernel.

The TMA kernel (kernels/sm90/mla_seesaw_kernel.cuh) does not visit a draft-only KV
tile that no row of its CTA sees (kernels/core/request.cuh, ``kSkipDraftTiles``:
visit v of a split is KV tile ``kv_tile(v)``); the cp.async kernel visits every tile
up to the last visible one. Masks here leave whole draft tiles invisible in the
middle of a row tile's range (star-like rows: the root and the token itself), see a
draft past every skipped tile (a row that sees the request's last draft), see no
draft at all (a row tile of empty rows), see every draft before them (dense rows),
or follow random and DDTree-like trees; prefixes that end inside a tile (its draft
columns share the last prefix tile), on a tile boundary, and empty. Page 64, page 1
with the kv_slot_runs hint, flat caches (the three TMA layouts) and page 1 without
the hint (the cp.async kernel, which does not skip), auto and forced splits, 16 and
64 heads; every slot the requests do not own holds NaN, outputs are NaN-poisoned,
and every case is checked against the float64 reference.
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    pytest.mark.usefixtures("sm90_tma_env"),  # conftest.py: sm_90 only, VERIFY_ATTN_REQUIRE_K_TMA=1
]
DEV = "cuda"
PLAN = {"page64": "mla_wgmma_seesaw_tma", "flat": "mla_wgmma_seesaw_tma",
        "runs": "mla_wgmma_seesaw_tma_rows", "page1": "mla_wgmma_m64n64_pipe_rows"}


def ancestors(parents):
    """Dense [n, n] visibility of a tree in topological order: each node sees itself and its ancestors."""
    n = len(parents)
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] = vis[p]
        vis[i, i] = True
    return vis


def sparse_rows(n):
    """Star-like rows (the root and the token itself), with exceptions: token 5 also sees the last
    draft, tokens 40..47 see none, every 97th token (from 3) sees every draft up to itself."""
    vis = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        vis[t, 0] = vis[t, t] = True
        if t % 97 == 3:
            vis[t, : t + 1] = True
    vis[5, n - 1] = True
    vis[40:48] = False
    return vis


def make(seed, heads):
    """Four requests (q_len, prefix): (700, 1000) sparse rows, the prefix ending 24 rows into a tile;
    (300, 0) a random tree, no prefix; (1024, 64) a DDTree-like tree, the prefix a whole tile;
    (130, 5) sparse rows, just past the two draft tiles below which nothing is skipped.
    K rows in runs of 64 slots at shuffled 64-slot pool pages (so page 64, page 1 and the runs
    hint all apply to one cache); every slot no request owns is NaN."""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    q_lens, prefixes = [700, 300, 1024, 130], [1000, 0, 64, 5]
    dense = [sparse_rows(700), ancestors(masks.random_parents("random", 300, rng=rng)),
             ancestors(masks.random_parents("ddtree", 1024, rng=rng)), sparse_rows(130)]
    kv_lens = [p + q for p, q in zip(prefixes, q_lens)]
    pages = [(n + 63) // 64 for n in kv_lens]
    pool_pages = sum(pages) + 7
    page_ids = list(range(pool_pages))
    rng.shuffle(page_ids)
    k_pool = torch.full((pool_pages * 64, 1, 576), float("nan"))
    k_flat = torch.randn(sum(kv_lens), 1, 576, generator=g)
    kv_indices_page, slots, at = [], [], 0
    for n, np_ in zip(kv_lens, pages):
        ids = [page_ids.pop() for _ in range(np_)]
        kv_indices_page += ids
        req_slots = [ids[j // 64] * 64 + j % 64 for j in range(n)]
        slots += req_slots
        k_pool[torch.tensor(req_slots)] = k_flat[at:at + n]
        at += n
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    tree = masks.from_dense(dense, qo)
    q = (torch.randn(int(qo[-1]), heads, 576, generator=g) * 0.5).to(torch.bfloat16)
    a = dict(q=q, qo=qo, tree=tree, kv_len=torch.tensor(kv_lens, dtype=torch.int32),
             k_pool=k_pool.to(torch.bfloat16), k_flat=k_flat.to(torch.bfloat16),
             kv_indptr_page=torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32),
             kv_indices_page=torch.tensor(kv_indices_page, dtype=torch.int32),
             kv_indptr_rows=torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32),
             kv_indices_slots=torch.tensor(slots, dtype=torch.int32))
    return {n: t.to(DEV) for n, t in a.items()}, max(q_lens), max(kv_lens)


def call(a, mq, mkv, layout, splits, plan_only=False):
    """The layout's call: (out, lse), or the plan's name when plan_only."""
    q = a["q"]
    out = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=q.dtype, device=DEV)
    lse = torch.full((q.shape[0], q.shape[1]), float("nan"), device=DEV)
    common = dict(tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, num_splits=splits)
    if layout == "flat":
        args = (q, a["k_flat"], None, a["qo"], a["kv_indptr_rows"])
        if plan_only:
            return verify_attn.plan_info(*args, **common)["name"]
        verify_attn.tree_attention_flat(*args, out=out, lse=lse, **common)
        return out, lse
    if layout == "page64":
        args = (q, a["k_pool"].view(-1, 64, 1, 576), None, a["qo"], a["kv_indptr_page"],
                a["kv_indices_page"], a["kv_len"])
        extra = {}
    else:
        args = (q, a["k_pool"], None, a["qo"], a["kv_indptr_rows"], a["kv_indices_slots"], a["kv_len"])
        extra = dict(page_size=1, kv_slot_runs=64 if layout == "runs" else 1)
    if plan_only:
        return verify_attn.plan_info(*args, **common, **extra)["name"]
    verify_attn.tree_attention_paged(*args, out=out, lse=lse, **common, **extra)
    return out, lse


@pytest.mark.parametrize("splits", [0, 1, 5], ids=["splits0", "splits1", "splits5"])
@pytest.mark.parametrize("heads", [16, 64], ids=["h16", "h64"])
@pytest.mark.parametrize("layout", ["page64", "runs", "flat", "page1"])
def test_invisible_draft_tiles(layout, heads, splits):
    a, mq, mkv = make(1000 * heads + splits, heads)
    name = call(a, mq, mkv, layout, splits, plan_only=True)
    assert name.endswith(PLAN[layout]), name
    out, lse = call(a, mq, mkv, layout, splits)
    ro, rl = reference.reference_attention_flat(a["q"], a["k_flat"], None, a["qo"], a["kv_indptr_rows"],
                                                tree_mask=a["tree"])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN: a tile read rows it does not own"
    s = 0
    for n in a["qo"].diff().tolist():  # per request: a wrong skip in a short one would hide in the norm
        err = ((out[s:s + n].double() - ro[s:s + n]).norm() / ro[s:s + n].norm()).item()
        assert err < 1e-2, (s, err)
        s += n
    assert (lse.double() - rl).abs().max().item() < 1e-2
