"""The sm_90a TMA kernel (kernels/sm90/mla_seesaw_kernel.cuh), which the plan picks
for paged MLA caches with page_size a multiple of 64, against the float64 reference.

MLA paged caches with page_size 64 and 128, ragged kv_len (the last tile of a
request is partial: the copy engine brings the page's rows past kv_len too), a
random tree per request, scattered pages, and every slot the requests do not
own filled with NaN (the kernel must zero the values of rows past kv_len before
its P V; a NaN that leaks shows in the output). Outputs poisoned before the
launch. Also: the plan's choice is pinned (page_size 16 takes the cp.async
kernel), a page id out of range is flagged (KV_INDEX) and never read, and a
padded cache (token stride wider than the row) is read through the tensor
map's strides; the Q tile by TMA and by cp.async (VERIFY_ATTN_Q_TMA=0, or a head
count the Q map cannot box) over several q layouts, in both sm_90a kernels; the
unsplit output tile by TMA stores and from registers (VERIFY_ATTN_O_TMA=0), bit for bit.
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
TMA = "mla_wgmma_seesaw_tma"
GATHER = "mla_wgmma_m64n64_pipe_rows"


def make(seed, page_size, q_lens, prefixes, heads=16, dtype=torch.bfloat16, width=576):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    kv_lens = [p + q for p, q in zip(prefixes, q_lens)]
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages) + 5
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    parents = [x for ql in q_lens for x in masks.random_parents("random", ql, rng=rng)]
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)
    kv_indices = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    k = torch.full((num_pages, page_size, 1, width), float("nan"))
    ind = kv_indices.tolist()
    for r in range(len(q_lens)):
        for pi in range(pages[r]):
            rows = min(page_size, kv_lens[r] - pi * page_size)
            k[ind[kv_indptr[r] + pi], :rows, :, :576] = torch.randn(rows, 1, 576, generator=g)
    a = dict(q=torch.randn(int(qo[-1]), heads, 576, generator=g).to(dtype), k=k.to(dtype),
             qo=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
             kv_len=torch.tensor(kv_lens, dtype=torch.int32), tree=tree)
    a = {n: t.to(DEV) for n, t in a.items()}
    a["k"] = a["k"][..., :576]  # width > 576: a padded cache (a view, token stride `width`)
    return a, max(q_lens), max(kv_lens)


def plan_name(a, mq, mkv, splits=0):
    return verify_attn.plan_info(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
                                 tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv, num_splits=splits)["name"]


def run(a, mq, mkv, splits):
    out = torch.full((a["q"].shape[0], a["q"].shape[1], 512), float("nan"), dtype=a["q"].dtype, device=DEV)
    lse = torch.full((a["q"].shape[0], a["q"].shape[1]), float("nan"), device=DEV)
    verify_attn.tree_attention_paged(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                     a["kv_len"], tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                     num_splits=splits, out=out, lse=lse)
    return out, lse


def ref(a):
    k = torch.nan_to_num(a["k"], nan=0.0)  # the reference reads only owned rows; keep it NaN-free anyway
    return reference.reference_attention_paged(a["q"], k, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                               a["kv_len"], tree_mask=a["tree"])


@pytest.mark.parametrize("page_size", [64, 128], ids=["page64", "page128"])
@pytest.mark.parametrize("splits", [0, 1, 3], ids=["splits0", "splits1", "splits3"])
@pytest.mark.parametrize("seed", [0, 1], ids=["seed0", "seed1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_tma_matches_reference(page_size, splits, seed, dtype):
    a, mq, mkv = make(seed, page_size, q_lens=[5, 16, 3, 64], prefixes=[40, 700, 129, 1000], dtype=dtype)
    assert plan_name(a, mq, mkv, splits).endswith(TMA)
    out, lse = run(a, mq, mkv, splits)
    ro, rl = ref(a)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN leaked (rows past kv_len?)"
    err = ((out.double() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, err
    assert (lse.double() - rl).abs().max().item() < 1e-2


def test_tma_causal_chain_matches_reference():
    a, mq, mkv = make(5, 64, q_lens=[8, 33], prefixes=[200, 61])
    out = torch.full((a["q"].shape[0], 16, 512), float("nan"), dtype=a["q"].dtype, device=DEV)
    verify_attn.tree_attention_paged(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                     a["kv_len"], causal=True, max_q_len=mq, max_kv_len=mkv, out=out)
    k = torch.nan_to_num(a["k"], nan=0.0)
    ro, _ = reference.reference_attention_paged(a["q"], k, None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                                a["kv_len"], causal=True)
    assert torch.isfinite(out).all()
    assert ((out.double() - ro).norm() / ro.norm()).item() < 1e-2


def test_tma_bad_page_is_flagged_and_not_read():
    a, mq, mkv = make(3, 64, q_lens=[4, 4], prefixes=[300, 300])
    clean, _ = ref(a)
    bad = a["kv_indices"].clone()
    bad[int(a["kv_indptr"][1]) + 1] = 10**6  # request 1, its second page
    a["kv_indices"] = bad
    out, _ = run(a, mq, mkv, 0)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert ei.value.bits & errors.ERR_KV_INDEX and ei.value.request == 1, str(ei.value)
    assert torch.isnan(out[4:8]).all()
    err0 = ((out[:4].double() - clean[:4]).norm() / clean[:4].norm()).item()
    assert torch.isfinite(out[:4]).all() and err0 < 1e-2, err0  # request 0 unaffected


def test_small_pages_take_the_gather_kernel():
    """page_size 16: a tile spans four pages, no tensor-map box fits; the cp.async kernel runs."""
    a, mq, mkv = make(4, 16, q_lens=[4, 9], prefixes=[100, 37])
    assert plan_name(a, mq, mkv).endswith(GATHER)
    out, lse = run(a, mq, mkv, 0)
    ro, _ = ref(a)
    assert torch.isfinite(out).all()
    assert ((out.double() - ro).norm() / ro.norm()).item() < 1e-2


def test_tma_padded_cache_strides():
    """A cache whose token rows are 640 wide (a view of the first 576): the map's strides, not 576."""
    a, mq, mkv = make(6, 64, q_lens=[7, 20], prefixes=[150, 64], width=640)
    assert a["k"].stride(1) == 640
    assert plan_name(a, mq, mkv).endswith(TMA)
    out, lse = run(a, mq, mkv, 0)
    ro, rl = ref(a)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert ((out.double() - ro).norm() / ro.norm()).item() < 1e-2
    assert (lse.double() - rl).abs().max().item() < 1e-2


@pytest.mark.parametrize("q_tma", ["1", "0"], ids=["q_by_tma", "q_by_cp_async"])
@pytest.mark.parametrize("layout", ["contiguous", "padded", "head_major"])
@pytest.mark.parametrize("heads", [1, 16, 24, 128])
@pytest.mark.parametrize("page_size", [64, 1], ids=["page64", "page1"])
def test_q_tile_layouts(page_size, heads, layout, q_tma, monkeypatch):
    """Both sm_90a kernels (TMA K at page 64, cp.async K at page 1) take Q by TMA (a map of q
    whose box is a CTA's 64 folded rows) where the map can describe q -- heads dividing 64 or a
    multiple of 64 --, else (24 heads, or VERIFY_ATTN_Q_TMA=0) by cp.async: the same results;
    which path ran is pinned with VERIFY_ATTN_REQUIRE_Q_TMA=1.
    q contiguous, a view of a wider row (head stride 640), or head-major (token stride 576,
    head stride total_q * 576); ragged requests whose last row tile is partial (the map's box
    then holds the next request's rows, or zeros past total_q)."""
    monkeypatch.setenv("VERIFY_ATTN_Q_TMA", q_tma)
    a, mq, mkv = make(11 + heads, page_size, q_lens=[5, 16, 3, 64], prefixes=[40, 700, 129, 1000],
                      heads=heads)
    q = a["q"]
    if layout == "padded":
        wide = torch.randn(q.shape[0], heads, 640, device=DEV).to(q.dtype)
        wide[..., :576] = q
        q = wide[..., :576]
        assert q.stride(1) == 640
    elif layout == "head_major":
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
        assert q.stride(0) == 576
    a["q"] = q
    assert plan_name(a, mq, mkv).endswith(TMA if page_size == 64 else GATHER)
    # Which Q path runs: VERIFY_ATTN_REQUIRE_Q_TMA=1 makes a launch whose q the map cannot
    # describe fail instead of falling back to cp.async.
    monkeypatch.setenv("VERIFY_ATTN_REQUIRE_Q_TMA", "1")
    if q_tma == "1" and heads != 24:
        run(a, mq, mkv, 0)  # the Q map was encoded: the TMA path ran
    else:
        with pytest.raises(NotImplementedError, match="VERIFY_ATTN_REQUIRE_Q_TMA"):
            run(a, mq, mkv, 0)
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_Q_TMA")
    out, lse = run(a, mq, mkv, 0)
    ro, rl = ref(a)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    err = ((out.double() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, err
    assert (lse.double() - rl).abs().max().item() < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["contiguous", "padded", "head_major"])
@pytest.mark.parametrize("heads", [16, 64, 128, 24])
@pytest.mark.parametrize("page_size", [64, 1], ids=["page64", "page1"])
def test_output_tile_by_tma(page_size, heads, layout, dtype, monkeypatch):
    """Both sm_90a kernels' (TMA K at page 64, cp.async K at page 1) unsplit output: full row
    tiles staged in shared memory and stored by TMA (a map of out whose box is a CTA's 64
    folded rows), partial row tiles (request 0's second, request 2's only) from registers;
    with VERIFY_ATTN_O_TMA=0 every tile from registers. Both write the same bits (the same
    o / l rounding), match the float64 reference, and leave no poisoned row. out contiguous, a
    view of a wider row (head stride 640), or head-major; 24 heads (the map cannot box them)
    always store from registers. VERIFY_ATTN_REQUIRE_O_TMA=1 pins that the out map was
    encoded (so the full tiles took the TMA store)."""
    a, mq, mkv = make(31 + heads, page_size, q_lens=[5, 16, 3, 64], prefixes=[40, 700, 129, 1000],
                      heads=heads, dtype=dtype)
    assert plan_name(a, mq, mkv, 1).endswith(TMA if page_size == 64 else GATHER)
    total_q = a["q"].shape[0]

    def fresh_out():
        if layout == "padded":
            out = torch.full((total_q, heads, 640), float("nan"), dtype=dtype, device=DEV)[..., :512]
            assert out.stride(1) == 640
        elif layout == "head_major":
            out = torch.full((heads, total_q, 512), float("nan"), dtype=dtype, device=DEV).transpose(0, 1)
            assert out.stride(0) == 512
        else:
            out = torch.full((total_q, heads, 512), float("nan"), dtype=dtype, device=DEV)
        lse = torch.full((total_q, heads), float("nan"), device=DEV)
        return out, lse

    def call(out, lse):
        verify_attn.tree_attention_paged(a["q"], a["k"], None, a["qo"], a["kv_indptr"], a["kv_indices"],
                                         a["kv_len"], tree_mask=a["tree"], max_q_len=mq, max_kv_len=mkv,
                                         num_splits=1, out=out, lse=lse)

    monkeypatch.setenv("VERIFY_ATTN_REQUIRE_O_TMA", "1")
    if heads != 24:
        call(*fresh_out())  # the out map was encoded: the TMA store path ran
    else:
        with pytest.raises(NotImplementedError, match="VERIFY_ATTN_REQUIRE_O_TMA"):
            call(*fresh_out())
    monkeypatch.delenv("VERIFY_ATTN_REQUIRE_O_TMA")
    out, lse = fresh_out()
    call(out, lse)
    monkeypatch.setenv("VERIFY_ATTN_O_TMA", "0")
    out0, lse0 = fresh_out()
    call(out0, lse0)
    ro, rl = ref(a)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "a row was left unwritten"
    assert torch.equal(out, out0) and torch.equal(lse, lse0), "the TMA store wrote other bits"
    err = ((out.double() - ro).norm() / ro.norm()).item()
    assert err < 1e-2, err
    assert (lse.double() - rl).abs().max().item() < 1e-2


def test_forcing_tma_on_small_pages_keeps_the_plan(monkeypatch):
    """The tuning knob cannot put the TMA kernel on a cache it cannot read."""
    a, mq, mkv = make(7, 16, q_lens=[3], prefixes=[50])
    monkeypatch.setenv("VERIFY_ATTN_FORCE_CONFIG", TMA)
    assert plan_name(a, mq, mkv).endswith(GATHER)
