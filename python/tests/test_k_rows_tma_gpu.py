"""The sm_90a cp.async kernel's tiles of consecutive cache rows by TMA
(kernels/sm90/mla_wgmma_kernel.cuh, kernels/sm90/tma_host.h encode_k_rows_tmap).

The kernel the plan picks for page_size 1 (and page sizes below 64, and flat
caches) copies a KV tile whose 64 rows sit in 64 consecutive rows of the cache
as 9 bulk tensor copies, and gathers every other tile with cp.async. Checked
here against the float64 reference and, bit for bit, against the same launch
with the map off (VERIFY_ATTN_K_ROWS_TMA=0): page_size 1 caches whose slots
come in runs of 64 (SGLang's token slots of a ``--page-size 64`` pool), runs
broken inside a tile, runs not aligned to a tile, fully scattered requests,
page_size 16 with consecutive page ids, a padded cache (token stride wider than
the row); and flat MLA caches, which now take the TMA kernel with that map (and
the cp.async kernel when the map is off). Every slot the requests
do not own holds NaN: a tile copied from the wrong rows shows in the output.
VERIFY_ATTN_REQUIRE_K_ROWS_TMA=1 pins that the map was encoded (a cache it
cannot describe fails instead).
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import errors, masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]
DEV = "cuda"
GATHER = "mla_wgmma_m64n64_pipe_rows"


@pytest.fixture(autouse=True)
def _sm90(monkeypatch):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a kernels")
    for name in ("VERIFY_ATTN_FORCE_CONFIG", "VERIFY_ATTN_K_ROWS_TMA", "VERIFY_ATTN_REQUIRE_K_ROWS_TMA"):
        monkeypatch.delenv(name, raising=False)
    errors._reset_for_tests()
    yield
    verify_attn.check_errors()


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


def run(a, mq, mkv, splits, page_size=1):
    out = torch.full((a["q"].shape[0], a["q"].shape[1], 512), float("nan"), dtype=a["q"].dtype, device=DEV)
    lse = torch.full((a["q"].shape[0], a["q"].shape[1]), float("nan"), device=DEV)
    verify_attn.tree_attention_paged(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                     a["kv_len"], page_size=page_size, tree_mask=a["tree"], max_q_len=mq,
                                     max_kv_len=mkv, num_splits=splits, out=out, lse=lse)
    return out, lse


def check_both_ways(a, mq, mkv, splits, monkeypatch, page_size=1):
    name = verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 page_size=page_size, tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                 num_splits=splits)["name"]
    assert name.endswith(GATHER), name
    monkeypatch.setenv("VERIFY_ATTN_REQUIRE_K_ROWS_TMA", "1")
    out, lse = run(a, mq, mkv, splits, page_size)
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_K_ROWS_TMA")
    k = torch.nan_to_num(a["k"], nan=0.0)
    ro, rl = reference.reference_attention_paged(a["q"], k, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                                 a["kv_len"], page_size=page_size, tree_mask=a["tree"])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN leaked: a tile read the wrong rows"
    err = ((out.double() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, err
    assert (lse.double() - rl).abs().max().item() < 1e-2
    monkeypatch.setenv("VERIFY_ATTN_K_ROWS_TMA", "0")
    out0, lse0 = run(a, mq, mkv, splits, page_size)
    assert torch.equal(out, out0) and torch.equal(lse, lse0), "TMA tiles and cp.async tiles differ"


@pytest.mark.parametrize("splits", [0, 1, 3], ids=["splits0", "splits1", "splits3"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed0", "seed1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_slot_runs_match_reference(splits, seed, dtype, monkeypatch):
    a, mq, mkv = make(seed, ["runs", "broken", "scattered", "runs", "shifted"], q_lens=[5, 16, 3, 64, 7],
                      prefixes=[40, 700, 129, 1000, 300], dtype=dtype)
    check_both_ways(a, mq, mkv, splits, monkeypatch)


@pytest.mark.parametrize("heads", [16, 128], ids=["h16", "h128"])
def test_slot_runs_padded_cache(heads, monkeypatch):
    a, mq, mkv = make(2, ["runs", "runs"], q_lens=[4, 32], prefixes=[500, 260], heads=heads, width=640)
    check_both_ways(a, mq, mkv, 0, monkeypatch)


def test_page16_consecutive_pages(monkeypatch):
    """page_size 16: pages 4p .. 4p + 3 in order are one 64-row run (the rows map spans pages);
    request 1 has two of its pages swapped (that tile is gathered)."""
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
    check_both_ways(a, mq, mkv, 0, monkeypatch, page_size=16)


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
    for knob in ("1", "0"):
        monkeypatch.setenv("VERIFY_ATTN_K_ROWS_TMA", knob)
        for splits in (0, 1, 3):
            out = call(splits)
            assert torch.isfinite(out).all(), (knob, splits)
            err = ((out.double() - ro).norm() / ro.norm()).item()
            assert err < 1e-2, (knob, splits, err)


def test_require_knob_refuses_a_cache_the_map_cannot_describe(monkeypatch):
    """page_size 16 with pages 17 token strides apart: no rows map; the knob makes that an error."""
    a, mq, mkv = make(4, ["runs"], q_lens=[4], prefixes=[100])
    base = torch.randn(40, 17, 1, 576, device=DEV).to(torch.bfloat16)
    k = base[:, :16]  # [pages, 16, 1, 576], page stride 17 * 576
    ind = torch.arange(8, dtype=torch.int32, device=DEV)
    ptr = torch.tensor([0, 7], dtype=torch.int32, device=DEV)
    kvl = torch.tensor([104], dtype=torch.int32, device=DEV)
    monkeypatch.setenv("VERIFY_ATTN_REQUIRE_K_ROWS_TMA", "1")
    with pytest.raises(NotImplementedError, match="VERIFY_ATTN_REQUIRE_K_ROWS_TMA"):
        verify_attn.tree_attention_paged(a["q"], k, None, a["qo"], ptr, ind, kvl, tree_mask=a["tree"])
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_K_ROWS_TMA")
    out = verify_attn.tree_attention_paged(a["q"], k, None, a["qo"], ptr, ind, kvl, tree_mask=a["tree"])
    ro, _ = reference.reference_attention_paged(a["q"], k, None, a["qo"], ptr, ind, kvl, tree_mask=a["tree"])
    assert ((out.double() - ro).norm() / ro.norm()).item() < 1e-2
