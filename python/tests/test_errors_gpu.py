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
  flagged as well;
* on the sm_90a TMA kernels (sm_90 only): a page id out of range is flagged
  (KV_INDEX) and never read; a bad slot inside a run of the rows map (past the
  cache, INT32_MAX, negative; a tile's first row or another) is zero-filled and
  flagged, its request's rows NaN, the other requests exact.

Problems, calls and the reference: verify_attn.testing.

memcheck over tools/checks/sanitize_cases.py (its bad-index case) shows that no
out-of-pool read happens.
"""

import pytest
import torch

import verify_attn
from verify_attn import errors, testing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]

DEV = "cuda"
BAD_REQ = {1: "past_end", 3: "negative"}
GQA = testing.Model(mla=False, heads=8, kv_heads=2, d_qk=128, d_vo=128)


def make_paged(*, mla=False, page_size=1, seed=0, dtype=torch.bfloat16, q_lens=(5, 8, 3, 6)):
    """Four requests (q_lens drafts each) with random trees, random pages of a cache with 11 spare
    pages, the host bounds passed (testing.make_problem, bounds="exact")."""
    return testing.make_problem(list(q_lens), [40, 70, 25, 90], model="mla_h16" if mla else GQA, dtype=dtype,
                                layout="paged", page_size=page_size, spare_pages=11, poison=False, seed=seed,
                                device=DEV)


def poison(p):
    """Poison one page id of request 1 (past the end) and one of request 3 (negative).

    Returns (the problem with them, {request: (bad value, page position in kv_indices, first KV
    row j of that page)})."""
    bad = p.kv_indices.clone()
    kvp = p.kv_indptr.tolist()
    num_pages, ps = p.k.shape[0], p.k.shape[1]
    out = {}
    for req, kind, val in ((1, "past_end", num_pages + 5), (3, "negative", -3)):
        page_pos = (kvp[req + 1] - kvp[req]) // 2  # a prefix page, mid-request
        bad[kvp[req] + page_pos] = val
        out[req] = (val, page_pos, page_pos * ps)
    return p.replace(kv_indices=bad), out


def run(p, **kw):
    return testing.call(p, **kw)


def ref(p):
    return testing.reference(p)[0]


def rows(p, req):
    return slice(sum(p.q_lens[:req]), sum(p.q_lens[:req + 1]))


def assert_exact(out, clean_ref, p, requests):
    for req in requests:
        r = rows(p, req)
        err = testing.rel_err(out[r], clean_ref[r])
        assert torch.isfinite(out[r]).all() and err < testing.REL_TOL, "request %d: rel err %.3g" % (req, err)


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
    a = make_paged(mla=mla, page_size=page_size)
    clean_ref = ref(a)
    pa, bad = poison(a)
    out = run(pa, num_splits=splits)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, page_size)
    verify_attn.check_errors()  # reset: clean again
    assert_exact(out, clean_ref, a, (0, 2))


@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_poisoned_requests_are_nan(mla):
    """DEPENDS ON THE LEAD'S KERNEL CHANGE (NaN output for a request with a
    flagged bad index). Before it, the bad row was zero-filled: finite output."""
    a = make_paged(mla=mla, page_size=1)
    pa, bad = poison(a)
    out = run(pa)
    torch.cuda.synchronize()
    for req in bad:
        assert torch.isnan(out[rows(a, req)]).all(), "request %d: output not NaN" % req


@pytest.mark.parametrize("splits", [0, 2], ids=["unsplit", "split2"])
@pytest.mark.parametrize("path", ["mma_split", "mla_cluster"])
def test_warp_role_mla_bad_index(path, splits):
    """The sm_120 MLA kernels (warp roles: one CTA of 32 rows, or a 2-CTA cluster of 64 rows
    whose CTAs gather the two halves of every K row), forced: a bad page id is flagged, its
    request's rows are NaN (a cluster's CTAs both meet the row and share the NaN rows), the
    other requests exact."""
    a = make_paged(mla=True, page_size=1)
    clean_ref = ref(a)
    pa, bad = poison(a)
    with testing.kernel_path(path):
        want = testing.PATHS[path].config
        assert testing.plan_info(pa, num_splits=splits)["name"].endswith(want)
        out = run(pa, num_splits=splits)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, 1)
    verify_attn.check_errors()
    for req in bad:
        assert torch.isnan(out[rows(a, req)]).all(), "request %d: output not NaN" % req
    assert_exact(out, clean_ref, a, (0, 2))


@pytest.mark.parametrize("splits", [0, 2], ids=["unsplit", "split2"])
@pytest.mark.parametrize("q_lens", [(5, 8, 3, 6), (70, 5, 90, 40)], ids=["short", "long"])
@pytest.mark.parametrize("config", [testing.ROLES_GQA[128], testing.ROLES_S3_GQA[128], testing.ROLES_R32_GQA[128]],
                         ids=["roles_m128", "roles_m128_s3", "roles_m256"])
def test_warp_role_gqa_bad_index(config, q_lens, splits):
    """The GQA kernels by warp roles (16 rows per consumer warp, 128 per CTA, two or three stages;
    32 rows per warp, 256 per CTA), forced: a bad page id is flagged, its request's rows are NaN,
    the other requests exact. Short requests (4 heads x at most 8 drafts) leave most consumer warps
    without rows; long ones (up to 360 rows per KV head) take two or three row tiles, the last
    partly empty. Skipped where the configuration does not fit the device (three stages on sm_120)."""
    a = make_paged(page_size=1, q_lens=q_lens)
    clean_ref = ref(a)
    pa, bad = poison(a)
    with testing.kernel_path(testing.KernelPath(config=config)):
        if not testing.plan_info(pa, num_splits=splits)["name"].endswith(config):
            assert config == testing.ROLES_S3_GQA[128]
            pytest.skip(f"{config} does not fit this device's shared memory")
        out = run(pa, num_splits=splits)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, 1)
    verify_attn.check_errors()
    for req in bad:
        assert torch.isnan(out[rows(a, req)]).all(), "request %d: output not NaN" % req
    assert_exact(out, clean_ref, a, (0, 2))


def test_debug_mode_raises_at_the_call():
    a = make_paged()
    pa, bad = poison(a)
    run(a)  # clean call: no raise in debug mode either
    verify_attn.set_debug(True)
    run(a)
    with pytest.raises(verify_attn.KernelInputError) as ei:
        run(pa)
    assert_names_a_poisoned_request(ei.value, bad, 1)


def test_cuda_graph_replay_records_errors():
    a = make_paged()
    pa, bad = poison(a)
    verify_attn.ensure_error_buffer()
    out = torch.empty(a.q.shape[0], a.q.shape[1], 128, dtype=a.q.dtype, device=DEV)
    idx = a.kv_indices.clone()
    args = a.replace(kv_indices=idx)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(args, out=out)
    torch.cuda.current_stream().wait_stream(side)
    verify_attn.check_errors()
    g = torch.cuda.CUDAGraph()
    verify_attn.set_debug(True)  # must be skipped during capture
    with torch.cuda.graph(g):
        run(args, out=out)
    verify_attn.set_debug(False)
    g.replay()
    verify_attn.check_errors()  # clean indices: clean
    idx.copy_(pa.kv_indices)  # poison the captured index buffer in place
    g.replay()
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert_names_a_poisoned_request(ei.value, bad, 1)
    idx.copy_(a.kv_indices)
    g.replay()
    verify_attn.check_errors()
    del g


def test_torch_compile_records_errors():
    a = make_paged()
    pa, bad = poison(a)

    def fn(q, k, v, qo, kvp, kvi, kvl, mask):
        return verify_attn.tree_attention_paged(q, k, v, qo, kvp, kvi, kvl, tree_mask=mask,
                                                max_q_len=a.max_q_len, max_kv_len=a.max_kv_len) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    keys = ("q", "k", "v", "qo_indptr", "kv_indptr", "kv_indices", "kv_len", "tree_mask")
    compiled(*[getattr(a, k) for k in keys])
    verify_attn.check_errors()
    compiled(*[getattr(pa, k) for k in keys])
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
    ro, _ = verify_attn.reference_attention_flat(q[:4], k[:200], None, qo[:2], kvp[:2], causal=True)
    assert torch.isfinite(out[:4]).all()
    assert testing.rel_err(out[:4], ro) < testing.REL_TOL


def test_device_kv_len_short_is_flagged():
    """kv_len < q_len on the device (bounds passed, so the host did not see it)."""
    a = make_paged()
    kvl = a.kv_len.clone()
    kvl[2] = 1  # q_len of request 2 is 3
    run(a.replace(kv_len=kvl))
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits & errors.ERR_KV_SHORT, str(e)
    assert e.request in (None, 2), str(e)


def test_device_qo_indptr_not_starting_at_zero_is_flagged():
    """Bounds passed (the host does not read qo_indptr): qo_indptr[0] > 0 leaves
    the rows before it to no request: flagged as QO_INDPTR naming request 0 and
    the value. (Rows past qo_indptr[B] are a plan's unused capacity, allowed:
    test_launch_modes_gpu replays a plan with fewer rows than planned.)"""
    a = make_paged()
    qo = a.qo_indptr.clone()
    qo[0] = 1  # row 0 belongs to no request
    run(a.replace(qo_indptr=qo))
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits == errors.ERR_QO_INDPTR and e.request == 0 and e.value == 1, str(e)


@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_device_kv_len_near_int32_max_is_flagged(mla):
    """A device kv_len of 2^31 - 5 (bounds passed, so the host did not see it)
    would overflow the kernels' int tile arithmetic: flagged as KV_INDEX with
    that value, the request's rows NaN, the other requests exact."""
    a = make_paged(mla=mla)
    clean_ref = ref(a)
    kvl = a.kv_len.clone()
    kvl[2] = 2**31 - 5
    out = run(a.replace(kv_len=kvl))
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    e = ei.value
    assert e.bits == errors.ERR_KV_INDEX and e.request == 2 and e.value == 2**31 - 5, str(e)
    assert torch.isnan(out[rows(a, 2)]).all(), "request 2: output not NaN"
    assert_exact(out, clean_ref, a, (0, 1, 3))


def test_host_validation_when_bounds_are_computed():
    a = make_paged()
    kvl = a.kv_len.clone()
    kvl[2] = 1
    with pytest.raises(ValueError, match=r"^kv_len: request 2 has kv_len 1 < q_len 3"):
        run(a.replace(kv_len=kvl, max_q_len=None, max_kv_len=None))  # bounds computed: the host reads


# ---------------------------------------------------------------------------
# the sm_90a TMA kernels (conftest.py's sm90_tma_env: sm_90 only, the plan's own kernel path)


@pytest.mark.usefixtures("sm90_tma_env")
def test_tma_bad_page_is_flagged_and_not_read():
    """Page size 64 (the TMA kernel): request 1's second page id out of range."""
    a = testing.make_problem([4, 4], [300, 300], model="mla_h16", layout="paged", page_size=64, seed=3,
                             device=DEV)
    assert testing.plan_info(a)["name"].endswith(testing.TMA_MLA)
    clean, _ = testing.reference(a)
    bad = a.kv_indices.clone()
    bad[int(a.kv_indptr[1]) + 1] = 10**6  # request 1, its second page
    out, _ = testing.run(a.replace(kv_indices=bad))
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert ei.value.bits & errors.ERR_KV_INDEX and ei.value.request == 1, str(ei.value)
    assert torch.isnan(out[4:8]).all()
    assert_exact(out, clean, a, (0,))  # request 0 unaffected


@pytest.mark.usefixtures("sm90_tma_env")
@pytest.mark.parametrize("row,value", [(70, "past"), (64, 2**31 - 1), (127, -3), (0, "past")],
                         ids=["row70_past", "row64_int32max", "row127_negative", "row0_past"])
def test_kv_slot_runs_hint_bad_slot_is_flagged(row, value):
    """A bad slot inside a run (past the cache, INT32_MAX, negative; a tile's first row, whose id
    the box would start from, or another): that tile is gathered, the slot zero-filled and
    flagged, its request's rows NaN, the other requests exact."""
    a = testing.make_problem([4, 4, 4], [300, 300, 300], model="mla_h16", layout="paged", page_size=1,
                             slots="runs", cache_3d=True, kv_slot_runs=64, seed=7, device=DEV)
    name = testing.plan_info(a)["name"]
    assert name.endswith(testing.TMA_ROWS_MLA), name
    clean, _ = testing.reference(a)
    bad = a.kv_indices.clone()
    bad[int(a.kv_indptr[1]) + row] = a.k.shape[0] + 5 if value == "past" else value  # request 1
    out, _ = testing.run(a.replace(kv_indices=bad))
    with pytest.raises(verify_attn.KernelInputError) as ei:
        verify_attn.check_errors()
    assert ei.value.bits & errors.ERR_KV_INDEX and ei.value.request == 1, str(ei.value)
    assert torch.isnan(out[4:8]).all()
    assert_exact(out, clean, a, (0, 2))
