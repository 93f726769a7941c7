"""CPU tests of verify_attn.testing, the helpers every GPU test (and tools/checks)
builds on: a problem is what its arguments say (every layout of a seed describes
the same attention; unowned cache rows NaN; the slot layouts as documented),
the check passes the reference and nothing else (NaN never), outputs start
poisoned, a kernel path is selected in one place and undone on the way out,
and the random trees are valid."""

import os
import random

import pytest
import torch

import verify_attn
import verify_attn as va
from verify_attn import masks, testing

CPU = "cpu"


def _ref_equal(a, b):
    (oa, la), (ob, lb) = testing.reference(a), testing.reference(b)
    assert torch.allclose(oa, ob, rtol=0, atol=1e-12) and torch.allclose(la, lb, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# problems

LAYOUTS = [
    dict(layout="flat"),
    dict(layout="flat", kv_offset=9, flat_spare_rows=7),
    dict(page_size=1),
    dict(page_size=16, cache_3d=True, unused_indices=3),
    dict(page_size=64, cache_width=640),
    dict(page_size=1, slots="runs", cache_3d=True),
    dict(page_size=1, slots=["runs", "broken", "scattered", "shifted"]),
    dict(page_size=1, slots="shuffled", cache_3d=True),
]


@pytest.mark.parametrize("model", ["mla_h16", "gqa_d64_g8"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_every_layout_of_a_seed_is_the_same_attention(layout, model):
    """One seed, one set of KV rows: laid out flat, in pages, in token slots, padded or
    offset, the float64 reference gives the same output."""
    q_lens, prefixes = [5, 16, 0, 70], [40, 130, 3, 0]
    flat = testing.make_problem(q_lens, prefixes, model=model, layout="flat", seed=4, device=CPU)
    args = dict(layout="paged")
    args.update(layout)
    p = testing.make_problem(q_lens, prefixes, model=model, seed=4, device=CPU, **args)
    assert p.paged == (args["layout"] == "paged")
    assert torch.isfinite(testing.reference(p)[0]).all()
    _ref_equal(p, flat)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}={v}" for k, v in d.items()))
def test_rows_no_request_owns_are_nan(layout):
    args = dict(layout="paged")
    args.update(layout)
    p = testing.make_problem([3, 9, 1, 30], [60, 0, 200, 7], model="gqa_d128_g4", seed=1, device=CPU, **args)
    rows = (p.k if p.k.dim() == 3 else p.k.reshape(-1, *p.k.shape[2:]))
    owned = torch.zeros(rows.shape[0], dtype=torch.bool)
    if p.paged:
        ps = p.k.shape[1] if p.k.dim() == 4 else p.page_size
        ind, ptr = p.kv_indices.tolist(), p.kv_indptr.tolist()
        for i, n in enumerate(p.kv_lens):
            for j in range(n):
                owned[ind[ptr[i] + j // ps] * ps + j % ps] = True
    else:
        start = int(p.kv_indptr[0])
        owned[start:start + sum(p.kv_lens)] = True
    assert int(owned.sum()) == sum(p.kv_lens)  # distinct rows
    assert torch.isfinite(rows[owned]).all() and torch.isnan(rows[~owned]).all()
    assert torch.isnan(p.v.reshape(-1, *p.v.shape[-2:])[~owned]).all()
    if layout.get("cache_width"):  # a padded cache: the values past the row are not the row's
        assert p.k.stride(-2) == layout["cache_width"] and torch.isnan(p.k._base[..., p.k.shape[-1]:]).all()
    unpoisoned = testing.make_problem([3, 9, 1, 30], [60, 0, 200, 7], model="gqa_d128_g4", seed=1, device=CPU,
                                      poison=False, **args)
    assert torch.isfinite(unpoisoned.k).all() and torch.isfinite(unpoisoned.v).all()


def test_token_slot_kinds():
    """runs: 64-aligned runs of pool pages; broken: two slots of a run swapped; shifted: runs
    starting 33 slots into a pool page; scattered: every slot in its own pool page."""
    kinds = ["runs", "broken", "shifted", "scattered"]
    p = testing.make_problem([4] * 4, [296] * 4, slots=kinds, seed=2, device=CPU)
    assert p.page_size is None and p.k.dim() == 4 and p.k.shape[1] == 1
    ind, ptr = p.kv_indices.tolist(), p.kv_indptr.tolist()
    s = {k: ind[ptr[i]:ptr[i + 1]] for i, k in enumerate(kinds)}
    assert all(len(x) == 300 for x in s.values())
    runs = s["runs"]
    assert all(x % 64 == j % 64 for j, x in enumerate(runs)) and all(runs[j + 1] == runs[j] + 1
                                                                       for j in range(299) if (j + 1) % 64)
    b = s["broken"]
    assert b[70] % 64 == 90 % 64 and b[90] % 64 == 70 % 64
    assert [x % 64 for j, x in enumerate(b) if j not in (70, 90)] == [j % 64 for j in range(300) if j not in (70, 90)]
    assert all(x % 64 == (j + 33) % 64 for j, x in enumerate(s["shifted"]))
    assert len({x // 64 for x in s["scattered"]}) == 300
    assert len(set(ind)) == len(ind)


def test_trees_masks_and_bounds():
    qo_lens = [33, 5, 0, 2]
    p = testing.make_problem(qo_lens, [1, 2, 3, 4], tree="chain", bounds="loose", device=CPU)
    assert p.max_q_len == 32 * 2 + 5 and p.max_kv_len == 2 * 34 + 7
    assert p.tree_mask.shape == (40, masks.mask_words(p.max_q_len))
    assert masks.to_dense(p.tree_mask, p.qo_indptr)[0].equal(torch.ones(33, 33, dtype=torch.bool).tril())
    p = testing.make_problem(qo_lens, [1, 2, 3, 4], tree="causal", bounds="computed", device=CPU)
    assert p.causal and p.tree_mask is None and p.max_q_len is None and p.max_kv_len is None
    dense = [torch.rand(n, n) < 0.5 for n in qo_lens]
    p = testing.make_problem(qo_lens, [1, 2, 3, 4], tree=dense, device=CPU)
    assert all(a.equal(b) for a, b in zip(masks.to_dense(p.tree_mask, p.qo_indptr), dense))
    parents = [testing.random_parents("shuffled", n, rng=random.Random(n)) for n in qo_lens]
    p = testing.make_problem(qo_lens, [1, 2, 3, 4], tree=parents, mask_width=100, device=CPU)
    assert p.tree_mask.shape == (40, 4)
    assert p.tree_mask.equal(masks.from_parents(torch.tensor(sum(parents, []), dtype=torch.int32), p.qo_indptr,
                                                max_q_len=100))
    with pytest.raises(ValueError, match="tree:"):
        testing.make_problem(qo_lens, [1, 2, 3, 4], tree=["chain"], device=CPU)


def test_views_and_nan_rows():
    p = testing.make_problem([7, 3], [20, 5], q_layout="padded", v_view=True, mask_uint32=True, device=CPU)
    assert p.q.stride(1) == 576 + 64 and p.v.data_ptr() == p.k.data_ptr() and p.v.shape[-1] == 512
    if hasattr(torch, "uint32"):
        assert p.tree_mask.dtype == torch.uint32
    p = testing.make_problem([7, 3], [20, 5], q_layout="head_major", device=CPU)
    assert p.q.stride(0) == 576
    # rows no query row may see: NaN in the cache, zeros in what the reference reads
    p = testing.make_problem([7, 3], [20, 5], layout="paged", page_size=16, tree="causal", nan_rows=[(0, 26)],
                             device=CPU)
    assert torch.isnan(p.k).any() and p.ref_k is not None and torch.isfinite(testing.reference(p)[0]).all()


def test_ragged_lengths():
    for seed in range(20):
        q_lens, prefixes = testing.ragged_lengths(random.Random(seed), 8, 64, 1000)
        assert max(q_lens) == 64 and max(prefixes) == 1000 and q_lens.count(0) >= 1
        assert all(0 <= x <= 64 for x in q_lens) and all(0 <= x <= 1000 for x in prefixes)
        assert q_lens[prefixes.index(1000)] == 64 or q_lens.count(64) > 1 or prefixes.count(1000) > 1
    assert testing.ragged_lengths(random.Random(0), 1, 5, 9) == ([5], [9])


# ---------------------------------------------------------------------------
# the check and the poisoned outputs


def test_check_passes_the_reference_and_never_nan():
    p = testing.make_problem([5, 16, 0, 3], [40, 70, 5, 0], model="gqa_d128_g4", device=CPU)
    ro, rl = testing.reference(p)
    out, lse = ro.to(p.dtype), rl.float()
    err, worst, lse_err = testing.check(p, out, lse, label="[reference]")
    assert err < 5e-3 and worst < 5e-3 and lse_err < 1e-6
    bad = out.clone()
    bad[3, 1, 7] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        testing.check(p, bad, lse)
    bad_lse = lse.clone()
    bad_lse[0, 0] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        testing.check(p, out, bad_lse)
    with pytest.raises(AssertionError, match="rel_err"):
        testing.check(p, out * 1.05, lse)
    with pytest.raises(AssertionError, match="lse out of tolerance"):
        testing.check(p, out, lse + 0.02)
    over = (testing.LSE_ATOL + 0.5 * testing.LSE_RTOL * rl.abs()).float()  # past 1e-2, within 1e-2 + 1e-3 |lse|
    with pytest.raises(AssertionError, match="lse out of tolerance"):
        testing.check(p, out, lse + over)
    testing.check(p, out, lse + over, lse_rtol=testing.LSE_RTOL)
    with pytest.raises(AssertionError, match="out is"):
        testing.check(p, out.float(), lse)
    assert testing.rel_err(torch.zeros(3), torch.zeros(3)) == 0.0


def test_check_is_per_request():
    """A request of one row 5% off hides in the batch's norm, not in its own."""
    p = testing.make_problem([60, 1], [100, 100], model="gqa_d128_g4", device=CPU)
    ro, rl = testing.reference(p)
    out = ro.to(p.dtype)
    out[-1:] *= 1.05
    assert testing.rel_err(out, ro) < testing.REL_TOL
    with pytest.raises(AssertionError, match=r"worst_request=[45]\."):
        testing.check(p, out, rl.float())


@pytest.mark.parametrize("layout", ["contiguous", "padded", "head_major"])
def test_poisoned_outputs(layout):
    p = testing.make_problem([5, 3], [4, 4], device=CPU)
    out, lse = testing.poisoned_outputs(p, layout=layout, pad=128)
    assert out.shape == (8, 16, 512) and lse.shape == (8, 16) and lse.dtype == torch.float32
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    if layout == "padded":
        assert out.stride(1) == 640 and lse.stride(0) == 19
    if layout == "head_major":
        assert out.stride(0) == 512
    assert testing.nan_outside_view(out) and testing.nan_outside_view(lse)
    out.fill_(1.0)
    assert testing.nan_outside_view(out)
    if layout == "padded":
        out._base[0, 0, 600] = 2.0
        assert not testing.nan_outside_view(out)
    assert testing.poisoned_outputs(p, return_lse=False)[1] is None


def test_bad_request_changes_one_request():
    """bad_request: a page id past the cache at the named KV row of the named
    request, or its kv_len one below its q_len; the problem itself untouched;
    the bit check_errors must raise; another kind a ValueError."""
    from verify_attn import errors

    p = testing.make_problem([4, 6, 3], [50, 90, 20], model="gqa_d128_g4", page_size=1, seed=3, device=CPU)
    q, bit = testing.bad_request(p, "page_id", kv_row=40)
    at = int(p.kv_indptr[1]) + 40
    assert bit == errors.ERR_KV_INDEX and int(q.kv_indices[at]) >= p.k.shape[0]
    changed = (q.kv_indices != p.kv_indices).nonzero().flatten().tolist()
    assert changed == [at]
    q, bit = testing.bad_request(p, "kv_short", req=2)
    assert bit == errors.ERR_KV_SHORT and q.kv_len.tolist() == [54, 96, 2] and p.kv_len.tolist() == [54, 96, 23]
    with pytest.raises(ValueError, match="kind"):
        testing.bad_request(p, "nan")


# ---------------------------------------------------------------------------
# kernel paths: one place, undone on the way out

def _tuning():
    return testing.current_tuning()


def test_kernel_path_sets_and_restores_the_tuning():
    before = _tuning()
    assert before == va.Tuning()
    with testing.kernel_path("mma_sync", grid_order="rows") as spec:
        assert spec.config == testing.PORTABLE_MLA
        assert _tuning() == va.Tuning(config="mla_m32n32_s1", grid_order="rows")
        with testing.kernel_path(q_tma=False, early_a0=True):  # refines the enclosing path
            assert _tuning() == va.Tuning(config="mla_m32n32_s1", grid_order="rows", q_tma=False,
                                          early_release=True)
        with testing.kernel_path("auto"):
            assert _tuning() == va.Tuning()
        assert _tuning() == va.Tuning(config="mla_m32n32_s1", grid_order="rows")
    assert _tuning() == before
    with pytest.raises(RuntimeError):
        with testing.kernel_path(testing.KernelPath(o_tma=False)):
            assert _tuning() == va.Tuning(o_tma=False)
            raise RuntimeError
    assert _tuning() == before
    with pytest.raises(ValueError, match="unknown kernel path"):
        with testing.kernel_path("no_such_path"):
            pass
    with pytest.raises(TypeError, match="tuning.early_release"):
        with testing.kernel_path(early_a0="yes"):
            pass
    assert _tuning() == before
    assert set(testing.PATHS) >= {"auto", "mma_sync", "cp_async", "tma", "tma_rows"}
    assert va.Tuning(config="mla_m32n32_s1", grid_order="requests", early_release=False, q_tma=False, o_tma=False,
                     max_smem_bytes=101376, balance_splits=False,
                     pair_splits=False).options() == ("mla_m32n32_s1", 2, 2, 2, 2, 101376, 2, 2)
    assert va.Tuning(pair_splits=True).options()[-1] == 1 and va.Tuning().options()[-1] == 0
    with pytest.raises(TypeError, match="tuning.pair_splits"):
        va.Tuning(pair_splits="no")


def test_kernel_path_fixture(kernel_path):
    kernel_path("cp_async")
    assert _tuning().config == testing.CP_ASYNC_MLA
    kernel_path(o_tma=False)
    assert _tuning() == va.Tuning(config=testing.CP_ASYNC_MLA, o_tma=False)


def test_kernel_path_fixture_undone():
    assert _tuning() == va.Tuning()


def test_configurations_named_exist():
    """The tags the tests force or expect are the plan's (when the extension is built)."""
    from verify_attn import _ext

    if not _ext.available():
        pytest.skip("the compiled extension")
    tags = verify_attn.runtime_info()["config_tags"]
    for tag in (testing.PORTABLE_MLA, testing.SPLIT_MLA, testing.CLUSTER_MLA, testing.CP_ASYNC_MLA, testing.TMA_MLA,
                testing.TMA_ROWS_MLA, *testing.ROLES_GQA.values(), *testing.ROLES_R32_GQA.values(),
                *testing.ONE_TILE_GQA.values()):
        assert tag in tags, (tag, tags)


# ---------------------------------------------------------------------------
# test helpers stay out of the top-level namespace


def test_helpers_are_not_the_api():
    for name in ("scaled_copy", "random_parents", "testing"):
        assert name not in verify_attn.__all__
    assert not hasattr(verify_attn, "scaled_copy") and not hasattr(masks, "random_parents")
    assert "random_parents" not in masks.__all__


# ---------------------------------------------------------------------------
# random trees (the builders' checks on random_parents)


@pytest.mark.parametrize("kind", testing.TREE_KINDS)
@pytest.mark.parametrize("n", [0, 1, 2, 33, 300])
def test_random_parents_are_trees(kind, n):
    parents = testing.random_parents(kind, n, rng=random.Random(n))
    assert len(parents) == n and all(-1 <= x < n for x in parents) and (n == 0 or -1 in parents)
    if kind != "shuffled":
        assert all(x < i for i, x in enumerate(parents))
    masks.from_parents(torch.tensor(parents, dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32))  # no cycle


@pytest.mark.parametrize("kind", ["eagle", "ddtree"])
@pytest.mark.parametrize("topk", [0, -2])
def test_random_parents_topk_below_one_is_refused(kind, topk):
    """eagle with topk 0 used to loop forever; ddtree raised a bare IndexError."""
    with pytest.raises(ValueError, match=r"^topk: must be >= 1"):
        testing.random_parents(kind, 5, topk=topk)


def test_random_parents_argument_types_and_unknown_kind():
    with pytest.raises(ValueError, match=r"^kind: unknown tree kind 'bogus'"):
        testing.random_parents("bogus", 0)  # also for an empty tree
    with pytest.raises(TypeError, match=r"^n: expected an integer"):
        testing.random_parents("chain", 2.5)
    with pytest.raises(TypeError, match=r"^topk: expected an integer"):
        testing.random_parents("eagle", 4, topk="2")
    assert testing.random_parents("chain", 3) == [-1, 0, 1]
    assert testing.random_parents("eagle", 1, topk=1) == [-1]
