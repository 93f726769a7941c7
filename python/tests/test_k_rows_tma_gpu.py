"""Paged MLA caches of page_size 1 whose token slots come in runs, on sm_90a.

The ``kv_slot_runs`` hint (a multiple of 64: SGLang's token slots of a
``--page-size 64`` pool) plans the TMA kernel through a map of the cache's rows
(kernels/sm90/tma_host.h encode_k_rows_tmap, configuration
``mla_wgmma_seesaw_tma_rows``): a tile whose rows below kv_len are 64
consecutive cache rows is boxed, any other is gathered by the producer
(kernels/sm90/mla_tma_producer.cuh). Without the hint the cp.async kernel runs.
Checked against the float64 reference on runs of 64, runs broken inside a tile,
runs not aligned to a tile, fully scattered requests, page_size 16 with
consecutive page ids, padded caches, 16 / 64 / 128 heads, a bad slot inside a
run, a CUDA-graph plan, and the fallback when the map is refused
(VERIFY_ATTN_K_ROWS_TMA=0). Flat MLA caches take the TMA kernel with the same
map (and the cp.async kernel when it is refused). Every slot the requests do
not own holds NaN: a tile copied from the wrong rows shows in the output.
Which kernel ran is pinned: VERIFY_ATTN_REQUIRE_K_TMA=1 (set for every test
here) turns the fallback from a planned TMA kernel to the cp.async one into an
error, which the fallback tests expect before they unset it.
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import errors, masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    pytest.mark.usefixtures("sm90_tma_env"),  # conftest.py: sm_90 only, VERIFY_ATTN_REQUIRE_K_TMA=1
]
DEV = "cuda"
GATHER = "mla_wgmma_m64n64_pipe_rows"


def slot_layout(kind, kv_len, rng, free):
    """Token slots of one request taken from the list of free pool pages of 64 slots.

    kind: "runs" (64-slot pool pages, the page-1 view of a page-64 pool), "broken"
    (runs with two slots of one tile swapped), "shifted" (one run of consecutive slots
    starting mid-page: never tile-aligned), "scattered" (one slot per pool page).
    """
    if kind == "scattered":
        return [free.pop() * 64 + rng.randrange(64) for _ in range(kv_len)]
    if kind == "shifted":
        n = (kv_len + 33 + 63) // 64
        base = [free.pop() for _ in range(n)]
        slots = []
        for p in base:  # pages of this request need not be consecutive: runs of 64 shifted by 33
            slots += [p * 64 + s for s in range(64)]
        return slots[33:33 + kv_len]
    slots = []
    for j in range(0, kv_len, 64):
        p = free.pop()
        slots += [p * 64 + s for s in range(min(64, kv_len - j))]
    if kind == "broken" and kv_len >= 128:
        slots[70], slots[90] = slots[90], slots[70]
    return slots


def make(seed, kinds, q_lens, prefixes, heads=16, dtype=torch.bfloat16, width=576):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    kv_lens = [p + q for p, q in zip(prefixes, q_lens)]
    pool_pages = sum(kv_lens) + 8  # enough for the scattered kind (one page per slot)
    free = list(range(pool_pages))
    rng.shuffle(free)
    slots = [slot_layout(kind, n, rng, free) for kind, n in zip(kinds, kv_lens)]
    k = torch.full((pool_pages * 64, 1, width), float("nan"))
    flat = [s for r in slots for s in r]
    k[torch.tensor(flat), :, :576] = torch.randn(len(flat), 1, 576, generator=g)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    parents = [x for ql in q_lens for x in masks.random_parents("random", ql, rng=rng)]
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)
    a = dict(q=torch.randn(int(qo[-1]), heads, 576, generator=g).to(dtype), k=k.to(dtype), qo=qo,
             kv_indptr=torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32),
             kv_indices=torch.tensor(flat, dtype=torch.int32),
             kv_len=torch.tensor(kv_lens, dtype=torch.int32), tree=tree)
    a = {n: t.to(DEV) for n, t in a.items()}
    a["k"] = a["k"][..., :576]  # width > 576: a padded cache (token stride `width`)
    return a, max(q_lens), max(kv_lens)


def run(a, mq, mkv, splits, page_size=1, kv_slot_runs=1):
    out = torch.full((a["q"].shape[0], a["q"].shape[1], 512), float("nan"), dtype=a["q"].dtype, device=DEV)
    lse = torch.full((a["q"].shape[0], a["q"].shape[1]), float("nan"), device=DEV)
    verify_attn.tree_attention_paged(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                     a["kv_len"], page_size=page_size, tree_mask=a["tree"], max_q_len=mq,
                                     max_kv_len=mkv, num_splits=splits, out=out, lse=lse,
                                     kv_slot_runs=kv_slot_runs)
    return out, lse


def ref(a, page_size=1):
    k = torch.nan_to_num(a["k"], nan=0.0)
    return reference.reference_attention_paged(a["q"], k, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                               a["kv_len"], page_size=page_size, tree_mask=a["tree"])


def assert_close(out, lse, ro, rl):
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN leaked: a tile read the wrong rows"
    err = ((out.double() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, err
    assert (lse.double() - rl).abs().max().item() < 1e-2


def check_no_hint(a, mq, mkv, splits, page_size=1):
    """Without the hint: the cp.async kernel, against the reference."""
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 page_size=page_size, tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                 num_splits=splits)["name"]
    assert name.endswith(GATHER), name
    out, lse = run(a, mq, mkv, splits, page_size)
    assert_close(out, lse, *ref(a, page_size))


@pytest.mark.parametrize("splits", [0, 1, 3], ids=["splits0", "splits1", "splits3"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed0", "seed1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_slot_runs_without_the_hint(splits, seed, dtype):
    a, mq, mkv = make(seed, ["runs", "broken", "scattered", "runs", "shifted"], q_lens=[5, 16, 3, 64, 7],
                      prefixes=[40, 700, 129, 1000, 300], dtype=dtype)
    check_no_hint(a, mq, mkv, splits)


@pytest.mark.parametrize("heads", [16, 128], ids=["h16", "h128"])
def test_slot_runs_padded_cache_without_the_hint(heads):
    a, mq, mkv = make(2, ["runs", "runs"], q_lens=[4, 32], prefixes=[500, 260], heads=heads, width=640)
    check_no_hint(a, mq, mkv, 0)


def test_page16_consecutive_pages():
    """page_size 16 (the hint is for page_size 1: the cp.async kernel), pages in runs and two swapped."""
    a, mq, mkv = make(3, ["runs", "runs", "runs"], q_lens=[8, 16, 2], prefixes=[300, 900, 63])
    ind, ptr = a["kv_indices"].cpu(), a["kv_indptr"].cpu().tolist()
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
    a["kv_indices"] = torch.tensor(pages, dtype=torch.int32, device=DEV)
    a["kv_indptr"] = torch.tensor(pptr, dtype=torch.int32, device=DEV)
    check_no_hint(a, mq, mkv, 0, page_size=16)


def test_flat_mla_takes_the_tma_kernel(monkeypatch):
    """A flat MLA cache: every tile is 64 consecutive rows from any first row, so the TMA kernel
    runs with the rows map (kernels/launch_attention.cuh); with the map off
    (VERIFY_ATTN_K_ROWS_TMA=0) it falls back to the cp.async kernel. Both against the reference."""
    g = torch.Generator().manual_seed(9)
    rng = random.Random(9)
    q_lens, kv_lens = [6, 64, 1], [300, 1100, 129]
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    kvp = torch.tensor([0] + torch.tensor(kv_lens).cumsum(0).tolist(), dtype=torch.int32)
    parents = [x for ql in q_lens for x in masks.random_parents("random", ql, rng=rng)]
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo).to(DEV)
    q = torch.randn(int(qo[-1]), 16, 576, generator=g).to(torch.bfloat16).to(DEV)
    k = torch.randn(int(kvp[-1]), 1, 576, generator=g).to(torch.bfloat16).to(DEV)
    qo, kvp = qo.to(DEV), kvp.to(DEV)
    name = verify_attn.plan_info(q, k, None, qo, kvp, tree_mask=tree, max_q_len=64, max_kv_len=1100)["name"]
    assert name.endswith("mla_wgmma_seesaw_tma"), name

    def call(splits):
        out = torch.full((q.shape[0], 16, 512), float("nan"), dtype=q.dtype, device=DEV)
        verify_attn.tree_attention_flat(q, k, None, qo, kvp, tree_mask=tree, max_q_len=64, max_kv_len=1100,
                                        num_splits=splits, out=out)
        return out

    ro, _ = reference.reference_attention_flat(q, k, None, qo, kvp, tree_mask=tree)
    monkeypatch.setenv("VERIFY_ATTN_K_ROWS_TMA", "0")
    with pytest.raises(NotImplementedError, match="VERIFY_ATTN_REQUIRE_K_TMA"):
        call(0)  # the map refused: no silent fallback while the TMA kernel is required
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_K_TMA")
    for knob in ("1", "0"):
        monkeypatch.setenv("VERIFY_ATTN_K_ROWS_TMA", knob)
        monkeypatch.setenv("VERIFY_ATTN_REQUIRE_K_TMA", knob)  # "1": the TMA kernel ran
        for splits in (0, 1, 3):
            out = call(splits)
            assert torch.isfinite(out).all(), (knob, splits)
            err = ((out.double() - ro).norm() / ro.norm()).item()
            assert err < 1e-2, (knob, splits, err)


TMA_ROWS = "mla_wgmma_seesaw_tma_rows"
KINDS = ["runs", "broken", "scattered", "runs", "shifted"]


def test_kv_slot_runs_hint_long_kv():
    """A 9k-row request (tiles of many pairs; split by the plan) next to a short one. (The short
    KV the other tests use takes the rows kernel too since session 20: kernels/plan.cc.)"""
    a, mq, mkv = make(11, ["runs", "shifted"], q_lens=[16, 4], prefixes=[9000, 300])
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, kv_slot_runs=64)["name"]
    assert name.endswith(TMA_ROWS), name
    out, lse = run(a, mq, mkv, 0, kv_slot_runs=64)
    assert_close(out, lse, *ref(a))


@pytest.mark.parametrize("splits", [0, 1, 3], ids=["splits0", "splits1", "splits3"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed0", "seed1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_kv_slot_runs_hint_takes_the_tma_kernel(splits, seed, dtype):
    """kv_slot_runs=64: the TMA kernel with the rows map; tiles of consecutive slots boxed, the
    broken / shifted / scattered ones gathered by its producer; rows past kv_len in a boxed tile
    are the cache's next rows (NaN here), which the consumers must zero."""
    a, mq, mkv = make(seed, KINDS, q_lens=[5, 16, 3, 64, 7], prefixes=[40, 700, 129, 1000, 300], dtype=dtype)
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, num_splits=splits,
                                 kv_slot_runs=64)["name"]
    assert name.endswith(TMA_ROWS), name
    out, lse = run(a, mq, mkv, splits, kv_slot_runs=64)
    assert_close(out, lse, *ref(a))
    out1, _ = run(a, mq, mkv, splits)  # no hint: the cp.async kernel (test_slot_runs_without_the_hint)
    assert ((out.double() - out1.double()).norm() / out1.double().norm()).item() < 1e-2


@pytest.mark.parametrize("knob", ["", "0", "1"], ids=["rule", "off", "on"])
@pytest.mark.parametrize("splits", [0, 3], ids=["splits0", "splits3"])
def test_kv_slot_runs_hint_early_a0_release(knob, splits, monkeypatch):
    """The rows kernel with the early release of stage 0's blocks 0-3 (Plan::early_a0_release:
    the plan's rule where a request's rows fit one row tile, q_len <= 4 at 16 heads;
    VERIFY_ATTN_EARLY_A0=1 / 0 forces it) and without, against the reference: requests of one
    row tile, then of several."""
    monkeypatch.setenv("VERIFY_ATTN_EARLY_A0", knob)
    seed = random.SystemRandom().randrange(2**31)
    print(f"seed {seed}")
    for q_lens in ([4, 3, 1, 4, 2], [5, 16, 3, 64, 7]):
        a, mq, mkv = make(seed, KINDS, q_lens=q_lens, prefixes=[40, 700, 129, 1000, 300])
        name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                     a["kv_len"], tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                     num_splits=splits, kv_slot_runs=64)["name"]
        assert name.endswith(TMA_ROWS), name
        out, lse = run(a, mq, mkv, splits, kv_slot_runs=64)
        assert_close(out, lse, *ref(a))


@pytest.mark.parametrize("heads", [16, 64, 128], ids=["h16", "h64", "h128"])
def test_kv_slot_runs_hint_padded_cache_and_heads(heads):
    a, mq, mkv = make(5, ["runs", "shifted", "runs"], q_lens=[4, 32, 9], prefixes=[500, 260, 2000],
                      heads=heads, width=640)
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, kv_slot_runs=128)["name"]
    assert name.endswith(TMA_ROWS), name
    out, lse = run(a, mq, mkv, 0, kv_slot_runs=128)
    assert_close(out, lse, *ref(a))


def test_kv_slot_runs_hint_without_the_map_falls_back(monkeypatch):
    """VERIFY_ATTN_K_ROWS_TMA=0: the planned TMA kernel cannot get its map; the cp.async kernel runs."""
    a, mq, mkv = make(6, KINDS, q_lens=[5, 16, 3, 64, 7], prefixes=[40, 700, 129, 1000, 300])
    monkeypatch.setenv("VERIFY_ATTN_K_ROWS_TMA", "0")
    with pytest.raises(NotImplementedError, match="VERIFY_ATTN_REQUIRE_K_TMA"):
        run(a, mq, mkv, 0, kv_slot_runs=64)
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_K_TMA")
    out, lse = run(a, mq, mkv, 0, kv_slot_runs=64)
    assert_close(out, lse, *ref(a))


@pytest.mark.parametrize("row,value", [(70, "past"), (64, 2**31 - 1), (127, -3), (0, "past")],
                         ids=["row70_past", "row64_int32max", "row127_negative", "row0_past"])
def test_kv_slot_runs_hint_bad_slot_is_flagged(row, value):
    """A bad slot inside a run (past the cache, INT32_MAX, negative; a tile's first row, whose id
    the box would start from, or another): that tile is gathered, the slot zero-filled and
    flagged, its request's rows NaN, the other requests exact."""
    a, mq, mkv = make(7, ["runs", "runs", "runs"], q_lens=[4, 4, 4], prefixes=[300, 300, 300])
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, kv_slot_runs=64)["name"]
    assert name.endswith(TMA_ROWS), name
    clean, _ = ref(a)
    bad = a["kv_indices"].clone()
    bad[int(a["kv_indptr"][1]) + row] = a["k"].shape[0] + 5 if value == "past" else value  # request 1
    a["kv_indices"] = bad
    out, _ = run(a, mq, mkv, 0, kv_slot_runs=64)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert ei.value.bits & errors.ERR_KV_INDEX and ei.value.request == 1, str(ei.value)
    assert torch.isnan(out[4:8]).all()
    for r in (slice(0, 4), slice(8, 12)):
        err = ((out[r].double() - clean[r]).norm() / clean[r].norm()).item()
        assert torch.isfinite(out[r]).all() and err < 1e-2, err


def test_kv_slot_runs_hint_in_a_cuda_graph_plan():
    """TreeAttentionPlan with the hint: plans the TMA kernel, replays in a CUDA graph with new slots."""
    a, mq, mkv = make(8, ["runs", "scattered"], q_lens=[16, 16], prefixes=[600, 600])
    plan = verify_attn.TreeAttentionPlan(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                         a["kv_len"], tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                         return_lse=True, kv_slot_runs=64)
    assert plan.info["name"].endswith(TMA_ROWS), plan.info
    plan.run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run()
        with torch.cuda.graph(g, stream=s):
            plan.run()
    torch.cuda.current_stream().wait_stream(s)
    b, _, _ = make(9, ["scattered", "runs"], q_lens=[16, 16], prefixes=[600, 600])
    for n in ("q", "k", "kv_indices", "tree"):
        a[n].copy_(b[n])
    plan.out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert_close(plan.out, plan.lse, *ref(a))
