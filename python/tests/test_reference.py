"""CPU tests of verify_attn.reference: vectorized reference vs the literal brute-force
loop, on small random trees, flat and paged, MLA-shaped and GQA, tree and causal."""

import math
import os
import random

import pytest
import torch

from verify_attn import masks, testing
from verify_attn.reference import (
    gather_paged_kv,
    reference_attention_bruteforce,
    reference_attention_flat,
    reference_attention_paged,
)


def _seed():
    s = os.environ.get("VERIFY_ATTN_TEST_SEED")
    return int(s) if s else random.SystemRandom().randrange(2**31)


def make_problem(rng, gen, *, B, H, Hkv, d_qk, d_vo, mla, mode, max_q=12, max_prefix=20, q_zero=True):
    q_lens = [rng.randint(1, max_q) for _ in range(B)]
    if q_zero and B > 1:
        q_lens[rng.randrange(B)] = 0
    prefixes = [rng.choice([0, 1, rng.randint(0, max_prefix)]) for _ in range(B)]
    qo = [0]
    for n in q_lens:
        qo.append(qo[-1] + n)
    kv_lens = [p + n for p, n in zip(prefixes, q_lens)]
    kv = [0]
    for n in kv_lens:
        kv.append(kv[-1] + n)
    total_q = qo[-1]
    q = torch.randn(total_q, H, d_qk, generator=gen, dtype=torch.float64)
    k = torch.randn(kv[-1], Hkv, d_qk, generator=gen, dtype=torch.float64)
    v = None if mla else torch.randn(kv[-1], Hkv, d_vo, generator=gen, dtype=torch.float64)
    qo_t = torch.tensor(qo, dtype=torch.int32)
    kv_t = torch.tensor(kv, dtype=torch.int32)
    if mode == "causal":
        tree_mask = None
    else:
        parents = []
        for n in q_lens:
            parents += testing.random_parents(mode, n, rng=rng)
        tree_mask = masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo_t)
    return dict(q=q, k=k, v=v, qo=qo_t, kv=kv_t, tree_mask=tree_mask, causal=mode == "causal",
                kv_lens=kv_lens, q_lens=q_lens)


def to_paged(rng, gen, k, v, kv_indptr, kv_lens, page_size, four_d):
    """Scatter flat per-request KV into a cache with randomly permuted pages."""
    B = len(kv_lens)
    pages_per = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages_per) + 3
    perm = list(range(num_pages))
    rng.shuffle(perm)
    Hkv = k.shape[1]
    kc = torch.randn(num_pages * page_size, Hkv, k.shape[2], generator=gen, dtype=k.dtype)
    vc = None if v is None else torch.randn(num_pages * page_size, Hkv, v.shape[2], generator=gen, dtype=v.dtype)
    indices, ind = [], [0]
    nxt = 0
    for i in range(B):
        ids = perm[nxt : nxt + pages_per[i]]
        nxt += pages_per[i]
        indices += ids
        ind.append(len(indices))
        start = int(kv_indptr[i])
        for j in range(kv_lens[i]):
            slot = ids[j // page_size] * page_size + j % page_size
            kc[slot] = k[start + j]
            if vc is not None:
                vc[slot] = v[start + j]
    if four_d:
        kc = kc.reshape(num_pages, page_size, Hkv, -1)
        vc = None if vc is None else vc.reshape(num_pages, page_size, Hkv, -1)
    return kc, vc, torch.tensor(ind, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32), \
        torch.tensor(kv_lens, dtype=torch.int32)


CONFIGS = [
    # name, H, Hkv, d_qk, d_vo, mla
    ("mla_h1", 1, 1, 24, 16, True),
    ("mla_h5", 5, 1, 24, 16, True),
    ("gqa_g3", 6, 2, 8, 8, False),
    ("gqa_g1", 3, 3, 16, 16, False),
    ("gqa_g4_vdiff", 4, 1, 8, 12, False),
]
MODES = ["causal", "chain", "star", "random", "ddtree", "shuffled"]


def _close(a, b, what, seed):
    assert a.shape == b.shape, what
    fin = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), fin), f"{what}: finiteness differs (seed={seed})"
    assert torch.allclose(a[fin], b[fin], rtol=1e-9, atol=1e-9), f"{what}: max diff {(a - b)[fin].abs().max()} (seed={seed})"
    assert torch.equal(a[~fin], b[~fin]), f"{what} (seed={seed})"


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("mode", MODES)
def test_flat_reference_matches_bruteforce(cfg, mode):
    seed = _seed()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    name, H, Hkv, d_qk, d_vo, mla = cfg
    p = make_problem(rng, gen, B=3, H=H, Hkv=Hkv, d_qk=d_qk, d_vo=d_vo, mla=mla, mode=mode)
    scale = rng.choice([None, 0.3])
    kw = dict(tree_mask=p["tree_mask"], causal=p["causal"], sm_scale=scale, head_dim_vo=d_vo if mla else None)
    out, lse = reference_attention_flat(p["q"], p["k"], p["v"], p["qo"], p["kv"], **kw)
    bo, bl = reference_attention_bruteforce(p["q"], p["k"], p["v"], p["qo"], p["kv"], **kw)
    assert out.dtype == torch.float64 and out.shape == (p["q"].shape[0], H, d_vo)
    assert lse.shape == (p["q"].shape[0], H)
    _close(out, bo, "out", seed)
    _close(lse, bl, "lse", seed)
    assert torch.isfinite(lse).all()  # every row sees itself


@pytest.mark.parametrize("cfg", CONFIGS[:3], ids=[c[0] for c in CONFIGS[:3]])
@pytest.mark.parametrize("page_size,four_d", [(1, False), (3, False), (4, True), (16, True)])
@pytest.mark.parametrize("mode", ["causal", "random", "ddtree"])
def test_paged_reference_matches_bruteforce_and_flat(cfg, page_size, four_d, mode):
    seed = _seed()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    name, H, Hkv, d_qk, d_vo, mla = cfg
    p = make_problem(rng, gen, B=4, H=H, Hkv=Hkv, d_qk=d_qk, d_vo=d_vo, mla=mla, mode=mode, max_prefix=40)
    kc, vc, ind, idx, kvl = to_paged(rng, gen, p["k"], p["v"], p["kv"], p["kv_lens"], page_size, four_d)
    kw = dict(tree_mask=p["tree_mask"], causal=p["causal"], head_dim_vo=d_vo if mla else None)
    ps = None if four_d else page_size
    out, lse = reference_attention_paged(p["q"], kc, vc, p["qo"], ind, idx, kvl, page_size=ps, **kw)
    fo, fl = reference_attention_flat(p["q"], p["k"], p["v"], p["qo"], p["kv"], **kw)
    bo, bl = reference_attention_bruteforce(
        p["q"], kc, vc, p["qo"], ind, kv_indices=idx, kv_len=kvl, page_size=ps, **kw)
    _close(out, fo, "paged vs flat out", seed)
    _close(lse, fl, "paged vs flat lse", seed)
    _close(out, bo, "paged vs brute out", seed)
    _close(lse, bl, "paged vs brute lse", seed)
    # gather reproduces the flat KV exactly
    kf, find = gather_paged_kv(kc, ind, idx, kvl, page_size=ps)
    assert torch.equal(kf, p["k"]) and find.tolist() == p["kv"].tolist()


def test_against_sdpa_with_dense_mask():
    """Independent check: torch SDPA with an explicit [q, kv] boolean mask (tests only)."""
    seed = _seed()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    H, Hkv, D = 4, 2, 16
    tree = testing.random_parents("ddtree", 37, rng=rng)
    prefix = 23
    qo = torch.tensor([0, 37], dtype=torch.int32)
    kv = torch.tensor([0, prefix + 37], dtype=torch.int32)
    bits = masks.from_parents(torch.tensor(tree), qo)
    q = torch.randn(37, H, D, generator=gen, dtype=torch.float64)
    k = torch.randn(prefix + 37, Hkv, D, generator=gen, dtype=torch.float64)
    v = torch.randn(prefix + 37, Hkv, D, generator=gen, dtype=torch.float64)
    out, lse = reference_attention_flat(q, k, v, qo, kv, tree_mask=bits)
    dense = torch.cat([torch.ones(37, prefix, dtype=torch.bool), masks.to_dense(bits, qo)[0]], dim=1)
    kk = k.repeat_interleave(H // Hkv, dim=1).transpose(0, 1)
    vv = v.repeat_interleave(H // Hkv, dim=1).transpose(0, 1)
    sd = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=dense)
    assert torch.allclose(out, sd.transpose(0, 1), atol=1e-10), f"seed={seed}"
    logits = torch.einsum("qhd,hkd->hqk", q, kk) / math.sqrt(D)
    ref_lse = torch.logsumexp(logits.masked_fill(~dense, float("-inf")), -1).transpose(0, 1)
    assert torch.allclose(lse, ref_lse, atol=1e-10), f"seed={seed}"


def test_row_that_sees_nothing():
    q = torch.randn(2, 1, 8, dtype=torch.float64)
    k = torch.randn(2, 1, 8, dtype=torch.float64)
    v = torch.randn(2, 1, 8, dtype=torch.float64)
    qo = torch.tensor([0, 2], dtype=torch.int32)
    kv = torch.tensor([0, 2], dtype=torch.int32)
    bits = torch.tensor([[0], [3]], dtype=torch.int32)  # row 0 sees nothing (no prefix)
    for fn in (reference_attention_flat, reference_attention_bruteforce):
        out, lse = fn(q, k, v, qo, kv, tree_mask=bits)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert lse[0, 0] == float("-inf")
        assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all()


def test_low_precision_inputs_and_float32_compute():
    q = torch.randn(3, 2, 8).to(torch.bfloat16)
    k = torch.randn(5, 1, 8).to(torch.bfloat16)
    qo = torch.tensor([0, 3], dtype=torch.int32)
    kv = torch.tensor([0, 5], dtype=torch.int32)
    o64, l64 = reference_attention_flat(q, k, None, qo, kv, causal=True, head_dim_vo=8)
    o32, l32 = reference_attention_flat(q, k, None, qo, kv, causal=True, head_dim_vo=8,
                                        compute_dtype=torch.float32)
    assert o64.dtype == torch.float64 and o32.dtype == torch.float32
    assert torch.allclose(o64, o32.double(), atol=1e-5)


def test_reference_errors():
    q = torch.randn(3, 2, 8, dtype=torch.float64)
    k = torch.randn(5, 1, 8, dtype=torch.float64)
    qo = torch.tensor([0, 3], dtype=torch.int32)
    kv = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="tree_mask:"):
        reference_attention_flat(q, k, None, qo, kv, head_dim_vo=8)
    with pytest.raises(ValueError, match="tree_mask:"):
        reference_attention_flat(q, k, None, qo, kv, causal=True, tree_mask=masks.causal(qo), head_dim_vo=8)
    with pytest.raises(ValueError, match="head_dim_vo:"):
        reference_attention_flat(q, k, None, qo, kv, causal=True)  # default 512 > 8
    with pytest.raises(ValueError, match="kv_indptr: request 0"):
        reference_attention_flat(q, k, None, qo, torch.tensor([0, 2], dtype=torch.int32), causal=True, head_dim_vo=8)
    kc = torch.randn(4, 2, 1, 8)
    with pytest.raises(ValueError, match="kv_indptr: request 0"):
        gather_paged_kv(kc, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                        torch.tensor([5], dtype=torch.int32))
    with pytest.raises(ValueError, match="kv_indices:"):
        gather_paged_kv(kc, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                        torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="page_size:"):
        gather_paged_kv(kc, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                        torch.tensor([2], dtype=torch.int32), page_size=4)


def test_paged_reference_names_kv_len_when_shorter_than_q_len():
    # request 1: kv_len 2 < q_len 3; the paged API's argument is kv_len, not kv_indptr
    q = torch.randn(5, 2, 8, dtype=torch.float64)
    k = torch.randn(4, 2, 1, 8, dtype=torch.float64)  # 4 pages of 2 slots
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 2, 4], dtype=torch.int32)
    kv_indices = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    kv_len = torch.tensor([4, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv_len: request 1 has kv_len 2 < q_len 3"):
        reference_attention_paged(q, k, k, qo, kv_indptr, kv_indices, kv_len, causal=True)


# ---------------------------------------------------------------------------
# new-user review: the reference's documented ValueErrors, naming the argument


def _paged_case():
    q = torch.randn(6, 2, 8, dtype=torch.float64)
    k = torch.randn(4, 4, 1, 8, dtype=torch.float64)  # 4 pages of 4 slots
    return dict(q=q, k_cache=k, v_cache=k, qo_indptr=torch.tensor([0, 2, 6], dtype=torch.int32),
                kv_indptr=torch.tensor([0, 2, 4], dtype=torch.int32),
                kv_indices=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                kv_len=torch.tensor([5, 8], dtype=torch.int32))


def _paged(a, **kw):
    return reference_attention_paged(a["q"], a["k_cache"], a["v_cache"], a["qo_indptr"], a["kv_indptr"],
                                     a["kv_indices"], a["kv_len"], **kw)


def test_paged_reference_qo_indptr_not_covering_q_is_refused():
    """qo_indptr [0, 4, 5] for 6 rows: row 5 would silently be 0 / -inf."""
    a = _paged_case()
    a["qo_indptr"] = torch.tensor([0, 4, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^qo_indptr: must start at 0, be non-decreasing and end at "
                                         r"q.shape\[0\] = 6; got first 0, last 5"):
        _paged(a, causal=True)
    out, lse = _paged(_paged_case(), causal=True)  # the valid case runs
    assert bool(torch.isfinite(lse).all())


def test_flat_reference_index_errors():
    q = torch.randn(6, 2, 8, dtype=torch.float64)
    k = torch.randn(14, 1, 8, dtype=torch.float64)
    qo = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^qo_indptr: must start at 0.*decreasing at request 1"):
        reference_attention_flat(q, k, k, torch.tensor([0, 7, 6], dtype=torch.int32),
                                 torch.tensor([0, 5, 14], dtype=torch.int32), causal=True)
    with pytest.raises(ValueError, match=r"^kv_indptr: last value 15 exceeds the 14 KV rows"):
        reference_attention_flat(q, k, k, qo, torch.tensor([0, 5, 15], dtype=torch.int32), causal=True)


def test_reference_tree_mask_with_too_few_rows():
    a = _paged_case()
    tm = masks.causal(a["qo_indptr"])[:4]
    with pytest.raises(ValueError, match=r"^tree_mask: 4 rows, but q has 6 \(q.shape\[0\]"):
        _paged(a, tree_mask=tm)


def test_paged_reference_kv_len_of_wrong_length_names_kv_len():
    a = _paged_case()
    a["kv_len"] = torch.tensor([5, 8, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv_len: expected shape \[2\] \(batch size, from qo_indptr\), got \(3,\)"):
        _paged(a, causal=True)
    a = _paged_case()
    a["kv_indptr"] = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv_indptr: expected shape \[3\]"):
        _paged(a, causal=True)


@pytest.mark.parametrize("value,exc,match", [
    ("abc", TypeError, r"^sm_scale: expected a number, got str 'abc'"),
    (10**400, ValueError, r"^sm_scale: int value out of the float range"),
    (float("inf"), ValueError, r"^sm_scale: must be finite"),
], ids=["str", "huge_int", "inf"])
def test_reference_sm_scale_named(value, exc, match):
    with pytest.raises(exc, match=match):
        _paged(_paged_case(), causal=True, sm_scale=value)


# ---------------------------------------------------------------------------
# inputs the reference used to take
# silently (a wrapped-around page list, a dense bool mask read as bit words)
# or refused with another library's error


def _i32(*a):
    return torch.tensor(a, dtype=torch.int32)


def test_gather_negative_kv_indptr_start_is_refused():
    """kv_indptr[0] = -2 used to read kv_indices[-2:] (Python's negative index)."""
    c = torch.arange(96.0).view(12, 1, 8)
    with pytest.raises(ValueError, match=r"^kv_indptr: must start at >= 0, got kv_indptr\[0\] = -2"):
        gather_paged_kv(c, _i32(-2, 0), _i32(1, 3), _i32(5), page_size=3)
    a = _paged_case()
    a["kv_indptr"] = _i32(-1, 2, 4)
    with pytest.raises(ValueError, match=r"^kv_indptr: must start at >= 0"):
        _paged(a, causal=True)
    with pytest.raises(ValueError, match=r"^kv_indptr: must start at >= 0"):
        reference_attention_bruteforce(a["q"], a["k_cache"], a["v_cache"], a["qo_indptr"], a["kv_indptr"],
                                       kv_indices=a["kv_indices"], kv_len=a["kv_len"], causal=True)
    # the valid page list still gathers the right rows: page 1 then page 3 of 3 slots
    flat, ind = gather_paged_kv(c, _i32(0, 2), _i32(1, 3), _i32(5), page_size=3)
    assert ind.tolist() == [0, 5]
    assert [int(x) // 8 for x in flat[:, 0, 0]] == [3, 4, 5, 9, 10]


def test_gather_kv_indptr_past_kv_indices_is_refused():
    c = torch.arange(96.0).view(12, 1, 8)
    with pytest.raises(ValueError, match=r"^kv_indptr: last value 3 exceeds the 2 page ids of kv_indices"):
        gather_paged_kv(c, _i32(0, 3), _i32(1, 3), _i32(5), page_size=3)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_reference_tree_mask_must_be_compact_words(dtype):
    """A dense bool [q, q] mask used to be read as bit words (a silently different mask)."""
    q = torch.randn(3, 4, 64, dtype=torch.float64)
    k = torch.randn(20, 1, 64, dtype=torch.float64)
    dense = torch.ones(3, 3, dtype=torch.bool).tril().to(dtype)
    with pytest.raises(TypeError, match=r"^tree_mask: expected dtype torch.int32 \(bit pattern\) or torch.uint32"):
        reference_attention_flat(q, k, k, _i32(0, 3), _i32(0, 8), tree_mask=dense)
    with pytest.raises(TypeError, match=r"^tree_mask: expected dtype"):
        reference_attention_bruteforce(q, k, k, _i32(0, 3), _i32(0, 8), tree_mask=dense)
    # the compact form of the same mask is what causal=True computes
    a, _ = reference_attention_flat(q, k, k, _i32(0, 3), _i32(0, 8), tree_mask=masks.from_dense(
        [torch.ones(3, 3, dtype=torch.bool).tril()], _i32(0, 3)))
    b, _ = reference_attention_flat(q, k, k, _i32(0, 3), _i32(0, 8), causal=True)
    assert torch.equal(a, b)


def test_negative_kv_len_names_kv_len():
    c = torch.arange(96.0).view(12, 1, 8)
    with pytest.raises(ValueError, match=r"^kv_len: request 0 has kv_len -1 < 0"):
        gather_paged_kv(c, _i32(0, 2), _i32(1, 3), _i32(-1), page_size=3)
    # a request with no drafts and kv_len -1: reported against kv_len, not an internal kv_indptr
    q = torch.randn(2, 2, 8, dtype=torch.float64)
    cache = torch.randn(12, 1, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^kv_len: request 1 has kv_len -1 < 0"):
        reference_attention_paged(q, cache, cache, _i32(0, 2, 2), _i32(0, 1, 1), _i32(1), _i32(3, -1),
                                  page_size=3, tree_mask=masks.from_parents(_i32(-1, 0), _i32(0, 2, 2)))


def test_reference_argument_types_and_shapes_named():
    q = torch.randn(3, 2, 8, dtype=torch.float64)
    k = torch.randn(5, 1, 8, dtype=torch.float64)
    qo, kv = _i32(0, 3), _i32(0, 5)
    with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got list"):
        reference_attention_flat(q.tolist(), k, k, qo, kv, causal=True)
    with pytest.raises(ValueError, match=r"^k: head dim 6 != q's D_qk 8"):
        reference_attention_flat(q, k[..., :6], k[..., :6], qo, kv, causal=True)
    with pytest.raises(ValueError, match=r"^v: shape \(4, 1, 8\) does not match k's rows"):
        reference_attention_flat(q, k, k[:4], qo, kv, causal=True)
    with pytest.raises(TypeError, match=r"^kv_indptr: expected an integer dtype, got torch.float32"):
        reference_attention_flat(q, k, k, qo, kv.float(), causal=True)
    c = torch.arange(96.0).view(12, 1, 8)
    with pytest.raises(ValueError, match=r"^kv_indices: expected 1 dimension\(s\), got shape \(1, 2\)"):
        gather_paged_kv(c, _i32(0, 2), _i32(1, 3).view(1, 2), _i32(5), page_size=3)
    with pytest.raises(TypeError, match=r"^kv_indices: expected an integer dtype, got torch.float32"):
        gather_paged_kv(c, _i32(0, 2), torch.tensor([1.0, 3.0]), _i32(5), page_size=3)
    with pytest.raises(TypeError, match=r"^page_size: expected an integer, got float 2.5"):
        gather_paged_kv(c, _i32(0, 2), _i32(1, 3), _i32(5), page_size=2.5)
    with pytest.raises(TypeError, match=r"^page_size: expected an integer, got float 2.5"):
        _paged(_paged_case(), causal=True, page_size=2.5)
