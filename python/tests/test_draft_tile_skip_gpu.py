"""Trees whose row tiles do not see every draft tile, on the sm_90a TMA kernel.

With more than 256 drafts the plan runs the TMA kernel's instance that does not visit
a draft-only KV tile no row of its CTA sees (kernels/core/request.cuh, ``kv_tile``;
the plan's name ends in ``_skip``); the cp.async kernel visits every tile up to the
last visible one. Masks here leave whole draft tiles invisible in the middle of a row
tile's range (star-like rows: the root and the token itself), see a draft past every
skipped tile (a row that sees the request's last draft), see no draft at all (a row
tile of empty rows), see every draft before them (dense rows), or follow random and
DDTree-like trees; prefixes that end inside a tile (its last draft columns share the
prefix's last tile), on a tile boundary, and empty. Page 64, page 1 with the
kv_slot_runs hint (slots in runs of 64: boxed tiles; scattered: gathered tiles), flat
caches, and page 1 without the hint (the cp.async kernel), auto and forced splits, 16
and 64 heads; every slot the requests do not own holds NaN, outputs are NaN-poisoned,
every case is checked against the float64 reference. That the skipped tiles are not
read at all: their KV rows hold NaN (a visited tile turns its rows' output NaN, as
the cp.async kernel shows on the same inputs).
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
PLAN = {"page64": "mla_wgmma_seesaw_tma_skip", "flat": "mla_wgmma_seesaw_tma_skip",
        "runs": "mla_wgmma_seesaw_tma_rows_skip", "gather": "mla_wgmma_seesaw_tma_rows_skip",
        "page1": "mla_wgmma_m64n64_pipe_rows"}
LAYOUTS = ["page64", "runs", "gather", "flat", "page1"]


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


def make(seed, heads, q_lens, prefixes, dense, nan_rows=()):
    """K rows of the requests (request r's KV row j = prefix_r + draft j) in three caches: a pool of
    64-slot pages holding each request in runs of 64 from page starts (page 64, page 1 with or
    without the hint), the same pool with every row at a random slot (page 1 + hint: gathered
    tiles), and a flat cache; every slot no request owns is NaN. nan_rows: (request, KV row) pairs
    set to NaN in every cache (rows no query row may read); the reference sees them as zeros."""
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    kv_lens = [p + q for p, q in zip(prefixes, q_lens)]
    pages = [(n + 63) // 64 for n in kv_lens]
    pool_pages = sum(pages) + 7
    page_ids = list(range(pool_pages))
    rng.shuffle(page_ids)
    k_flat = torch.randn(sum(kv_lens), 1, 576, generator=g)
    starts = [0] + torch.tensor(kv_lens).cumsum(0).tolist()
    k_ref = k_flat.clone()
    for r, j in nan_rows:
        k_flat[starts[r] + j] = float("nan")
        k_ref[starts[r] + j] = 0.0
    k_pool = torch.full((pool_pages * 64, 1, 576), float("nan"))
    kv_indices_page, slots = [], []
    for r, (n, np_) in enumerate(zip(kv_lens, pages)):
        ids = [page_ids.pop() for _ in range(np_)]
        kv_indices_page += ids
        slots += [ids[j // 64] * 64 + j % 64 for j in range(n)]
    k_pool[torch.tensor(slots)] = k_flat
    scattered = torch.randperm(pool_pages * 64, generator=g)[: len(slots)]
    k_scat = torch.full_like(k_pool, float("nan"))
    k_scat[scattered] = k_flat
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = (torch.randn(int(qo[-1]), heads, 576, generator=g) * 0.5).to(torch.bfloat16)
    a = dict(q=q, qo=qo, tree=masks.from_dense(dense, qo), kv_len=torch.tensor(kv_lens, dtype=torch.int32),
             k_pool=k_pool.to(torch.bfloat16), k_scat=k_scat.to(torch.bfloat16),
             k_flat=k_flat.to(torch.bfloat16), k_ref=k_ref.to(torch.bfloat16),
             kv_indptr_page=torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32),
             kv_indices_page=torch.tensor(kv_indices_page, dtype=torch.int32),
             kv_indptr_rows=torch.tensor(starts, dtype=torch.int32),
             kv_indices_slots=torch.tensor(slots, dtype=torch.int32),
             kv_indices_scat=scattered.to(torch.int32))
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
    elif layout == "gather":
        args = (q, a["k_scat"], None, a["qo"], a["kv_indptr_rows"], a["kv_indices_scat"], a["kv_len"])
        extra = dict(page_size=1, kv_slot_runs=64)  # the hint without runs: every tile gathered
    else:
        args = (q, a["k_pool"], None, a["qo"], a["kv_indptr_rows"], a["kv_indices_slots"], a["kv_len"])
        extra = dict(page_size=1, kv_slot_runs=64 if layout == "runs" else 1)
    if plan_only:
        return verify_attn.plan_info(*args, **common, **extra)["name"]
    verify_attn.tree_attention_paged(*args, out=out, lse=lse, **common, **extra)
    return out, lse


def check(a, out, lse):
    ro, rl = reference.reference_attention_flat(a["q"], a["k_ref"], None, a["qo"], a["kv_indptr_rows"],
                                                tree_mask=a["tree"])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN: a tile read rows it must not"
    s = 0
    for n in a["qo"].diff().tolist():  # per request: a wrong skip in a short one would hide in the norm
        err = ((out[s:s + n].double() - ro[s:s + n]).norm() / ro[s:s + n].norm()).item()
        assert err < 1e-2, (s, err)
        s += n
    assert (lse.double() - rl).abs().max().item() < 1e-2


@pytest.mark.parametrize("splits", [0, 1, 5], ids=["splits0", "splits1", "splits5"])
@pytest.mark.parametrize("heads", [16, 64], ids=["h16", "h64"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_invisible_draft_tiles(layout, heads, splits):
    """Four requests (q_len, prefix): (700, 1000) sparse rows, the prefix ending 40 rows into its
    last tile (24 drafts share it); (300, 0) a random tree, no prefix; (1024, 64) a DDTree-like
    tree, the prefix one whole tile; (130, 5) sparse rows."""
    rng = random.Random(heads + splits)
    dense = [sparse_rows(700), ancestors(masks.random_parents("random", 300, rng=rng)),
             ancestors(masks.random_parents("ddtree", 1024, rng=rng)), sparse_rows(130)]
    a, mq, mkv = make(1000 * heads + splits, heads, [700, 300, 1024, 130], [1000, 0, 64, 5], dense)
    name = call(a, mq, mkv, layout, splits, plan_only=True)
    assert name.endswith(PLAN[layout]), name
    check(a, *call(a, mq, mkv, layout, splits))


@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_skipped_draft_tiles_are_not_read(layout, splits):
    """Draft tiles no token sees hold NaN K rows: (700, 1000) drafts 216..407 (draft-only tiles 3-5:
    the prefix's last tile takes drafts 0..23), (600, 128) drafts 128..255 (tiles 2-3; the prefix
    two whole tiles, so that rows 40..47, which see no draft, still see something). The skipping
    instance never reads them (finite, right output); the cp.async kernel, which visits every tile
    up to the last visible column, turns the rows past them NaN: the test sees a visited tile."""
    dense = [sparse_rows(700, hidden=(216, 408)), sparse_rows(600, hidden=(128, 256))]
    nan_rows = [(0, 1000 + c) for c in range(216, 408)] + [(1, 128 + c) for c in range(128, 256)]
    a, mq, mkv = make(77 + splits, 16, [700, 600], [1000, 128], dense, nan_rows)
    name = call(a, mq, mkv, layout, splits, plan_only=True)
    assert name.endswith(PLAN[layout]), name
    out, lse = call(a, mq, mkv, layout, splits)
    if layout == "page1":
        assert not torch.isfinite(out).all(), "the cp.async kernel should have read the NaN tiles"
        return
    check(a, out, lse)
