"""Bad device-side indices on the GPU: never dereferenced, reported by check_errors().

A paged batch of 4 requests gets two poisoned page ids in different requests
(request 1: ``num_pages + 5``, request 3: ``-3``), with the host bounds passed
(the host never reads ``kv_indices``). Expected:

* ``verify_attn.check_errors()`` raises ``KernelInputError`` with bit KV_INDEX,
  naming one of the two requests with ITS bad value and position (the first
  error wins: either may be recorded), then the word is reset (a second check
  passes);
* requests 0 and 2 are still exact (vs the float64 reference);
* requests 1 and 3 are NaN -- THIS PART DEPENDS ON THE LEAD'S KERNEL CHANGE
  (``test_poisoned_requests_are_nan``): before it, a bad row was zero-filled
  and the output finite;
* debug mode raises at the call; CUDA-graph replays and torch.compile record
  too; a flat ``kv_indptr`` past the rows, a device-side ``kv_len < q_len`` and
  a device-side ``kv_len`` near 2^31 (int overflow of the tile arithmetic) are
  flagged as well.

memcheck over tools/sanitize_cases.py (its bad-index case) shows that no
out-of-pool read happens.
"""

import pytest
import torch

import verify_attn
from verify_attn import errors, masks, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]

DEV = "cuda"
BAD_REQ = {1: "past_end", 3: "negative"}


def make_paged(*, mla=False, page_size=1, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q_lens = [5, 8, 3, 6]
    prefix = [40, 70, 25, 90]
    kv_lens = [p + q for p, q in zip(prefix, q_lens)]
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages) + 11
    H, Hkv, dqk, dvo = (16, 1, 576, 512) if mla else (8, 2, 128, 128)
    qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    parents = []
    for ql in q_lens:
        parents += [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, ql)]
    tree = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)
    kv_indices = torch.randperm(num_pages, generator=g)[: sum(pages)].to(torch.int32)
    kv_indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    a = dict(
        q=torch.randn(int(qo[-1]), H, dqk, generator=g).to(dtype),
        k_cache=torch.randn(num_pages, page_size, Hkv, dqk, generator=g).to(dtype),
        v_cache=None if mla else torch.randn(num_pages, page_size, Hkv, dvo, generator=g).to(dtype),
        qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices,
        kv_len=torch.tensor(kv_lens, dtype=torch.int32), tree_mask=tree,
    )
    a = {n: (t.to(DEV) if t is not None else None) for n, t in a.items()}
    return a, dict(q_lens=q_lens, kv_lens=kv_lens, num_pages=num_pages, page_size=page_size,
                   max_q_len=max(q_lens), max_kv_len=max(kv_lens))


def poison(a, info):
    """Poison one page id of request 1 (past the end) and one of request 3 (negative).

    Returns {request: (bad value, page position in kv_indices, first KV row j of that page)}."""
    bad = a["kv_indices"].clone()
    kvp = a["kv_indptr"].tolist()
    ps = info["page_size"]
    out = {}
    for req, kind, val in ((1, "past_end", info["num_pages"] + 5), (3, "negative", -3)):
        page_pos = (kvp[req + 1] - kvp[req]) // 2  # a prefix page, mid-request
        bad[kvp[req] + page_pos] = val
        out[req] = (val, page_pos, page_pos * ps)
    return dict(a, kv_indices=bad), out


def run(a, info, **kw):
    return verify_attn.tree_attention_paged(
        a["q"], a["k_cache"], a["v_cache"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
        tree_mask=a["tree_mask"], max_q_len=info["max_q_len"], max_kv_len=info["max_kv_len"], **kw)


def ref(a):
    return reference.reference_attention_paged(
        a["q"], a["k_cache"], a["v_cache"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["kv_len"],
        tree_mask=a["tree_mask"])[0]


def rows(a, req):
    qo = a["qo_indptr"].tolist()
    return slice(qo[req], qo[req + 1])


@pytest.fixture(autouse=True)
def _clean():
    verify_attn.set_debug(False)
    verify_attn.check_errors()  # start clean (raises if an earlier test left an error)
    yield
    verify_attn.set_debug(False)
    try:
        verify_attn.check_errors()
    except verify_attn.KernelInputError:
        pass


def assert_names_a_poisoned_request(e, bad, page_size):
    assert isinstance(e, ValueError)
    assert e.bits & errors.ERR_KV_INDEX, str(e)
    assert "KV_INDEX" in str(e)
    assert e.request in bad, "request %r is not a poisoned one (%s)" % (e.request, e)
    val, page_pos, row = bad[e.request]
    assert e.value == val, str(e)
    # position j: the KV row (== page position for page_size 1); accept the page position too.
    assert e.position in (page_pos, *range(row, row + page_size)), str(e)
    assert ("request: %d" % e.request) in str(e) and str(val) in str(e)


@pytest.mark.parametrize("mla,page_size,splits",
                         [(False, 1, 0), (True, 1, 0), (False, 16, 3), (True, 4, 1), (True, 64, 0), (True, 64, 2)],
                         ids=["gqa-ps1", "mla-ps1", "gqa-ps16-split3", "mla-ps4-unsplit",
                              # sm_90: the TMA kernel, whose producer checks each 64-row tile once
                              "mla-ps64", "mla-ps64-split2"])
def test_bad_index_raises_and_other_requests_are_exact(mla, page_size, splits):
    a, info = make_paged(mla=mla, page_size=page_size)
    clean_ref = ref(a)
    pa, bad = poison(a, info)
    out = run(pa, info, num_splits=splits)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, page_size)
    verify_attn.check_errors()  # reset: clean again
    for req in (0, 2):
        r = rows(a, req)
        err = ((out[r].double() - clean_ref[r]).norm() / clean_ref[r].norm()).item()
        assert torch.isfinite(out[r]).all() and err < 1e-2, "request %d: rel err %.3g" % (req, err)


@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_poisoned_requests_are_nan(mla):
    """DEPENDS ON THE LEAD'S KERNEL CHANGE (NaN output for a request with a
    flagged bad index). Before it, the bad row was zero-filled: finite output."""
    a, info = make_paged(mla=mla, page_size=1)
    pa, bad = poison(a, info)
    out = run(pa, info)
    torch.cuda.synchronize()
    for req in bad:
        assert torch.isnan(out[rows(a, req)]).all(), "request %d: output not NaN" % req


def test_debug_mode_raises_at_the_call():
    a, info = make_paged()
    pa, bad = poison(a, info)
    run(a, info)  # clean call: no raise in debug mode either
    verify_attn.set_debug(True)
    run(a, info)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        run(pa, info)
    assert_names_a_poisoned_request(ei.value, bad, 1)


def test_cuda_graph_replay_records_errors():
    a, info = make_paged()
    pa, bad = poison(a, info)
    verify_attn.ensure_error_buffer()
    out = torch.empty(a["q"].shape[0], a["q"].shape[1], 128, dtype=a["q"].dtype, device=DEV)
    idx = a["kv_indices"].clone()
    args = dict(a, kv_indices=idx)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(args, info, out=out)
    torch.cuda.current_stream().wait_stream(side)
    verify_attn.check_errors()
    g = torch.cuda.CUDAGraph()
    verify_attn.set_debug(True)  # must be skipped during capture
    with torch.cuda.graph(g):
        run(args, info, out=out)
    verify_attn.set_debug(False)
    g.replay()
    verify_attn.check_errors()  # clean indices: clean
    idx.copy_(pa["kv_indices"])  # poison the captured index buffer in place
    g.replay()
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, 1)
    idx.copy_(a["kv_indices"])
    g.replay()
    verify_attn.check_errors()
    del g


def test_torch_compile_records_errors():
    a, info = make_paged()
    pa, bad = poison(a, info)

    def fn(q, k, v, qo, kvp, kvi, kvl, mask):
        return verify_attn.tree_attention_paged(q, k, v, qo, kvp, kvi, kvl, tree_mask=mask,
                                                max_q_len=info["max_q_len"], max_kv_len=info["max_kv_len"]) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    keys = ("q", "k_cache", "v_cache", "qo_indptr", "kv_indptr", "kv_indices", "kv_len", "tree_mask")
    compiled(*[a[k] for k in keys])
    verify_attn.check_errors()
    compiled(*[pa[k] for k in keys])
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, 1)


def test_flat_kv_indptr_past_rows_is_flagged():
    """Flat layout with the bounds passed: kv_indptr[B] beyond k's rows is not read."""
    g = torch.Generator().manual_seed(1)
    q_lens, kv_lens = [4, 4], [20, 30]
    qo = torch.tensor([0, 4, 8], dtype=torch.int32, device=DEV)
    kvp = torch.tensor([0, 20, 50 + 7], dtype=torch.int32, device=DEV)  # request 1 runs 7 rows past the end
    k = torch.randn(50, 2, 64, generator=g).to(torch.bfloat16).to(DEV)
    v = torch.randn(50, 2, 64, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(8, 4, 64, generator=g).to(torch.bfloat16).to(DEV)
    verify_attn.tree_attention_flat(q, k, v, qo, kvp, causal=True, max_q_len=4, max_kv_len=37)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits & errors.ERR_KV_INDEX and e.request == 1, str(e)


@pytest.mark.parametrize("splits", [0, 1, 3])
def test_flat_mla_kv_indptr_past_rows_is_flagged(splits):
    """Flat MLA (the sm_90a TMA kernel's rows map on an H200): request 1's rows run 70 past the
    cache, inside a tile whose first row is in it; flagged, its rows NaN, request 0 exact."""
    g = torch.Generator().manual_seed(2)
    qo = torch.tensor([0, 4, 8], dtype=torch.int32, device=DEV)
    kvp = torch.tensor([0, 200, 330 + 70], dtype=torch.int32, device=DEV)
    k = torch.randn(330, 1, 576, generator=g).to(torch.bfloat16).to(DEV)
    q = torch.randn(8, 16, 576, generator=g).to(torch.bfloat16).to(DEV)
    out = verify_attn.tree_attention_flat(q, k, None, qo, kvp, causal=True, max_q_len=4, max_kv_len=200,
                                          num_splits=splits)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits & errors.ERR_KV_INDEX and e.request == 1, str(e)
    assert torch.isnan(out[4:]).all()
    ro, _ = reference.reference_attention_flat(q[:4], k[:200], None, qo[:2], kvp[:2], causal=True)
    assert torch.isfinite(out[:4]).all()
    assert ((out[:4].double() - ro).norm() / ro.norm()).item() < 1e-2


def test_device_kv_len_short_is_flagged():
    """kv_len < q_len on the device (bounds passed, so the host did not see it)."""
    a, info = make_paged()
    kvl = a["kv_len"].clone()
    kvl[2] = 1  # q_len of request 2 is 3
    run(dict(a, kv_len=kvl), info)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits & errors.ERR_KV_SHORT, str(e)
    assert e.request in (None, 2), str(e)


def test_device_qo_indptr_not_starting_at_zero_is_flagged():
    """Bounds passed (the host does not read qo_indptr): qo_indptr[0] > 0 leaves
    the rows before it to no request: flagged as QO_INDPTR naming request 0 and
    the value. (Rows past qo_indptr[B] are a plan's unused capacity, allowed:
    test_plan_gpu replays with fewer rows than planned.)"""
    a, info = make_paged()
    qo = a["qo_indptr"].clone()
    qo[0] = 1  # row 0 belongs to no request
    run(dict(a, qo_indptr=qo), info)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits == errors.ERR_QO_INDPTR and e.request == 0 and e.value == 1, str(e)


@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_device_kv_len_near_int32_max_is_flagged(mla):
    """A device kv_len of 2^31 - 5 (bounds passed, so the host did not see it)
    would overflow the kernels' int tile arithmetic: flagged as KV_INDEX with
    that value, the request's rows NaN, the other requests exact."""
    a, info = make_paged(mla=mla)
    clean_ref = ref(a)
    kvl = a["kv_len"].clone()
    kvl[2] = 2**31 - 5
    out = run(dict(a, kv_len=kvl), info)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits == errors.ERR_KV_INDEX and e.request == 2 and e.value == 2**31 - 5, str(e)
    assert torch.isnan(out[rows(a, 2)]).all(), "request 2: output not NaN"
    for req in (0, 1, 3):
        r = rows(a, req)
        err = ((out[r].double() - clean_ref[r]).norm() / clean_ref[r].norm()).item()
        assert torch.isfinite(out[r]).all() and err < 1e-2, "request %d: rel err %.3g" % (req, err)


def test_host_validation_when_bounds_are_computed():
    a, info = make_paged()
    kvl = a["kv_len"].clone()
    kvl[2] = 1
    with pytest.raises(ValueError, match=r"^kv_len: request 2 has kv_len 1 < q_len 3"):
        verify_attn.tree_attention_paged(
            a["q"], a["k_cache"], a["v_cache"], a["qo_indptr"], a["kv_indptr"], a["kv_indices"], kvl,
            tree_mask=a["tree_mask"])
