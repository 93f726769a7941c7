"""CPU tests of verify_attn.masks: builders, round trips, SGLang layouts, errors."""

import os
import random
import re

import numpy as np
import pytest
import torch

from verify_attn import masks, testing


def _seed():
    s = os.environ.get("VERIFY_ATTN_TEST_SEED")
    return int(s) if s else random.SystemRandom().randrange(2**31)


# ---------------------------------------------------------------------------
# oracles (plain Python, independent of the library)


def ancestors_dense(parents):
    """bool [n, n]: [t, c] iff c is t or an ancestor of t (walks parent links)."""
    n = len(parents)
    out = np.zeros((n, n), dtype=bool)
    for t in range(n):
        c = t
        steps = 0
        while c >= 0:
            out[t, c] = True
            c = parents[c]
            steps += 1
            assert steps <= n, "cycle in test tree"
    return out


def build_batch(trees):
    parents = [p for tree in trees for p in tree]
    qo = [0]
    for tree in trees:
        qo.append(qo[-1] + len(tree))
    return torch.tensor(parents, dtype=torch.int32), torch.tensor(qo, dtype=torch.int32)


def sglang_full_mask(trees, prefix_lens, prefix_fill=True):
    """SGLang FULL_MASK written the way build_tree_efficient lays it out."""
    flat = []
    for tree, pre in zip(trees, prefix_lens):
        q = len(tree)
        anc = ancestors_dense(tree)
        for t in range(q):
            row = [prefix_fill] * pre + [bool(anc[t, c]) for c in range(q)]
            flat.extend(row)
    return torch.tensor(flat, dtype=torch.bool)


def sglang_qlen_only(trees):
    flat = []
    for tree in trees:
        anc = ancestors_dense(tree)
        flat.extend(anc.reshape(-1).tolist())
    return torch.tensor(flat, dtype=torch.bool)


# ---------------------------------------------------------------------------
# hand-made tree with its expected bits


def test_hand_tree_expected_bits():
    # request 0:      0
    #               /   \
    #              1     2          parents = [-1, 0, 0, 1, 3]
    #              |
    #              3
    #              |
    #              4
    # request 1: a chain of 40 nodes (crosses a word boundary, sets bit 31)
    # request 2: empty
    # request 3: two roots (a forest): parents = [-1, -1, 1]
    trees = [[-1, 0, 0, 1, 3], [-1] + list(range(39)), [], [-1, -1, 1]]
    parents, qo = build_batch(trees)
    bits = masks.from_parents(parents, qo)
    assert bits.dtype == torch.int32
    assert bits.shape == (5 + 40 + 0 + 3, 2)
    expected_r0 = [0b1, 0b11, 0b101, 0b1011, 0b11011]
    assert bits[:5, 0].tolist() == expected_r0
    assert bits[:5, 1].tolist() == [0] * 5
    chain = bits[5:45].to(torch.int64) & 0xFFFFFFFF
    for t in range(40):
        lo = (1 << min(t + 1, 32)) - 1
        hi = (1 << max(t + 1 - 32, 0)) - 1
        assert chain[t, 0].item() == lo, t
        assert chain[t, 1].item() == hi, t
    # bit 31 set -> negative int32 bit pattern
    assert bits[5 + 31, 0].item() == -1
    assert bits[5 + 35, 1].item() == 0b1111
    assert bits[45:, 0].tolist() == [0b1, 0b10, 0b110]
    # uint32 view reads the same bits
    if hasattr(torch, "uint32"):
        u = bits.view(torch.uint32)
        assert masks.to_dense(u, qo)[1].equal(masks.to_dense(bits, qo)[1])


def test_hand_tree_sglang_layouts():
    # Two requests of 4 draft tokens (SGLang's fixed num_draft_tokens), prefixes 3 and 0.
    # tree A: 0 -> {1, 2}, 2 -> 3        tree B: chain 0 -> 1 -> 2 -> 3
    # FULL_MASK rows (prefix cols then tree cols), written out by hand:
    T, F = True, False
    full = [
        # request 0: 4 rows x (3 + 4)
        T, T, T, T, F, F, F,
        T, T, T, T, T, F, F,
        T, T, T, T, F, T, F,
        T, T, T, T, F, T, T,
        # request 1: 4 rows x (0 + 4)
        T, F, F, F,
        T, T, F, F,
        T, T, T, F,
        T, T, T, T,
    ]
    qlen_only = [
        T, F, F, F,
        T, T, F, F,
        T, F, T, F,
        T, F, T, T,
        T, F, F, F,
        T, T, F, F,
        T, T, T, F,
        T, T, T, T,
    ]
    expected = [0b1, 0b11, 0b101, 0b1101, 0b1, 0b11, 0b111, 0b1111]
    qo = torch.tensor([0, 4, 8], dtype=torch.int32)
    pre = torch.tensor([3, 0], dtype=torch.int64)
    got_full = masks.from_sglang_full_mask(torch.tensor(full), qo, pre)
    got_qlen = masks.from_sglang_qlen_only(torch.tensor(qlen_only), qo)
    assert got_full[:, 0].tolist() == expected
    assert got_qlen[:, 0].tolist() == expected
    assert masks.from_parents(torch.tensor([-1, 0, 0, 2, -1, 0, 1, 2]), qo)[:, 0].tolist() == expected
    # the bit-packed layout: one uint8 per row, bit c = column c
    packed = torch.tensor(expected, dtype=torch.uint8)
    assert masks.from_sglang_qlen_bitpacked(packed, qo)[:, 0].tolist() == expected


# ---------------------------------------------------------------------------
# round trips on random trees


SIZES = [1, 2, 31, 32, 33, 64, 100, 257, 1024]


@pytest.mark.parametrize("kind", testing.TREE_KINDS)
@pytest.mark.parametrize("n", SIZES)
def test_from_parents_matches_oracle(kind, n):
    seed = _seed()
    rng = random.Random(seed)
    tree = testing.random_parents(kind, n, rng=rng)
    parents, qo = build_batch([tree])
    bits = masks.from_parents(parents, qo)
    assert bits.shape == (n, max(1, (n + 31) // 32))
    dense = masks.to_dense(bits, qo)[0].numpy()
    np.testing.assert_array_equal(dense, ancestors_dense(tree), err_msg=f"seed={seed}")
    # bits beyond q_len stay zero
    allbits = masks._unpack_words(bits)
    assert not allbits[:, n:].any(), f"seed={seed}"


def test_ragged_batch_round_trip():
    seed = _seed()
    rng = random.Random(seed)
    trees = []
    for _ in range(12):
        kind = rng.choice(testing.TREE_KINDS)
        n = rng.choice([0, 1, 5, 16, 33, 64, 200, 1024])
        trees.append(testing.random_parents(kind, n, rng=rng))
    parents, qo = build_batch(trees)
    bits = masks.from_parents(parents, qo)
    assert bits.shape[1] == max(1, (max(len(t) for t in trees) + 31) // 32)
    for i, (d, tree) in enumerate(zip(masks.to_dense(bits, qo), trees)):
        np.testing.assert_array_equal(d.numpy(), ancestors_dense(tree), err_msg=f"seed={seed} request {i}")
    # from_dense: list and padded forms give the same bits
    dense_list = [torch.from_numpy(ancestors_dense(t)) for t in trees]
    assert masks.from_dense(dense_list, qo).equal(bits)
    maxq = max(len(t) for t in trees)
    padded = torch.zeros((len(trees), maxq, maxq), dtype=torch.bool)
    for i, d in enumerate(dense_list):
        padded[i, : d.shape[0], : d.shape[0]] = d
    # garbage in the padding is ignored
    padded |= torch.rand(padded.shape) < 0.01
    for i, d in enumerate(dense_list):
        padded[i, : d.shape[0], : d.shape[0]] = d
    assert masks.from_dense(padded, qo).equal(bits)
    # validate=False with a given width gives the same result
    wide = masks.from_parents(parents, qo, max_q_len=1024, validate=False)
    assert wide.shape == (bits.shape[0], 32)
    assert wide[:, : bits.shape[1]].equal(bits) and not wide[:, bits.shape[1]:].any(), f"seed={seed}"
    # SGLang layouts of the same trees
    pre = [rng.choice([0, 1, 7, 100]) for _ in trees]
    full = sglang_full_mask(trees, pre, prefix_fill=False)  # prefix columns are not read
    got = masks.from_sglang_full_mask(full, qo, torch.tensor(pre))
    assert got.equal(bits), f"seed={seed}"
    assert masks.from_sglang_qlen_only(sglang_qlen_only(trees), qo).equal(bits), f"seed={seed}"


def test_wider_mask_and_int64_inputs():
    tree = testing.random_parents("random", 40)
    parents, qo = build_batch([tree])
    bits = masks.from_parents(parents.long(), qo.long(), max_q_len=200)
    assert bits.shape == (40, 7)
    assert masks.to_dense(bits, qo)[0].numpy().tolist() == ancestors_dense(tree).tolist()


def test_causal_equals_chain():
    trees = [list(range(-1, n - 1)) for n in (3, 0, 33, 70)]
    parents, qo = build_batch(trees)
    assert masks.causal(qo).equal(masks.from_parents(parents, qo))


def test_sglang_full_mask_uniform_batch_like_sglang():
    """SGLang's own sizing: bs requests of num_draft_tokens, buffer larger than needed."""
    rng = random.Random(_seed())
    q = 8
    trees = [testing.random_parents("eagle", q, rng=rng) for _ in range(5)]
    seq_lens = [rng.randrange(0, 50) for _ in trees]
    full = sglang_full_mask(trees, seq_lens, prefix_fill=True)
    buf = torch.ones(full.numel() + 1000, dtype=torch.bool)  # preallocated, fill(True)
    buf[: full.numel()] = full
    qo = torch.arange(0, (len(trees) + 1) * q, q, dtype=torch.int32)
    seq = torch.tensor(seq_lens)
    mask_indptr = torch.zeros(len(trees) + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(q * (seq + q), 0)
    a = masks.from_sglang_full_mask(buf, qo, seq)
    b = masks.from_sglang_full_mask(buf, qo, seq, mask_indptr=mask_indptr)
    parents, _ = build_batch(trees)
    assert a.equal(masks.from_parents(parents, qo))
    assert b.equal(a)
    # integer (0/1) masks are accepted too
    assert masks.from_sglang_full_mask(buf.to(torch.uint8), qo, seq).equal(a)


def test_bitpacked_wider_dtypes():
    rng = random.Random(_seed())
    trees = [testing.random_parents("random", 20, rng=rng) for _ in range(3)]
    parents, qo = build_batch(trees)
    ref = masks.from_parents(parents, qo)
    packed32 = ref[:, 0].clone()  # int32 per row: bit c = column c
    assert masks.from_sglang_qlen_bitpacked(packed32, qo).equal(ref)
    as_bytes = packed32.view(torch.uint8).reshape(-1, 4)
    assert masks.from_sglang_qlen_bitpacked(as_bytes, qo).equal(ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_builders_on_gpu_match_cpu():
    rng = random.Random(_seed())
    trees = [testing.random_parents(k, n, rng=rng) for k, n in (("ddtree", 1024), ("shuffled", 77), ("star", 5))]
    parents, qo = build_batch(trees)
    cpu = masks.from_parents(parents, qo)
    gpu = masks.from_parents(parents.cuda(), qo.cuda())
    assert gpu.is_cuda and gpu.cpu().equal(cpu)
    gpu_nosync = masks.from_parents(parents.cuda(), qo.cuda(), max_q_len=1024, validate=False)
    assert gpu_nosync.cpu().equal(cpu)
    full = sglang_full_mask(trees, [3, 0, 9])
    assert masks.from_sglang_full_mask(full.cuda(), qo.cuda(), torch.tensor([3, 0, 9]).cuda()).cpu().equal(cpu)


# ---------------------------------------------------------------------------
# bad inputs


def _qo(*lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


BAD_PARENTS = [
    ("out_of_range", [-1, 0, 5], _qo(3), ValueError, "parents: .*outside"),
    ("below_minus_one", [-1, -2, 0], _qo(3), ValueError, "parents: .*outside"),
    ("cross_request", [-1, 0, -1, 2], _qo(2, 2), ValueError, "parents: .*outside"),
    ("self_parent", [-1, 1, 0], _qo(3), ValueError, "parents: .*own parent"),
    ("two_cycle", [-1, 2, 1], _qo(3), ValueError, "parents: .*cycle"),
    ("long_cycle", [-1, 4, 1, 2, 3, 0], _qo(6), ValueError, "parents: .*cycle"),
    ("indptr_total", [-1, 0, 1], _qo(2), ValueError, "qo_indptr: last entry"),
    ("indptr_start", [-1, 0], torch.tensor([1, 2], dtype=torch.int32), ValueError, "qo_indptr: must start at 0"),
    ("indptr_decreasing", [-1, 0], torch.tensor([0, 3, 2], dtype=torch.int32), ValueError, "qo_indptr: must be non-decreasing"),
    ("too_long", [-1] + list(range(1024)), _qo(1025), ValueError, "qo_indptr: .*more than 1024"),
]


@pytest.mark.parametrize("name,parents,qo,exc,match", BAD_PARENTS, ids=[c[0] for c in BAD_PARENTS])
def test_from_parents_rejects(name, parents, qo, exc, match):
    with pytest.raises(exc, match=match):
        masks.from_parents(torch.tensor(parents, dtype=torch.int32), qo)


def test_from_parents_type_and_shape_errors():
    qo = _qo(2)
    with pytest.raises(TypeError, match="parents:"):
        masks.from_parents(torch.tensor([-1.0, 0.0]), qo)
    with pytest.raises(TypeError, match="parents:"):
        masks.from_parents([-1, 0], qo)
    with pytest.raises(ValueError, match="parents:"):
        masks.from_parents(torch.tensor([[-1, 0]]), qo)
    with pytest.raises(TypeError, match="qo_indptr:"):
        masks.from_parents(torch.tensor([-1, 0]), torch.tensor([0.0, 2.0]))
    with pytest.raises(ValueError, match="max_q_len:"):
        masks.from_parents(torch.tensor([-1] + list(range(39))), _qo(40), max_q_len=20)
    with pytest.raises(ValueError, match="max_q_len:"):
        masks.from_parents(torch.tensor([-1, 0]), qo, max_q_len=2000)


def test_dense_and_sglang_errors():
    qo = _qo(2, 3)
    with pytest.raises(ValueError, match="ancestor_bool: element 1"):
        masks.from_dense([torch.eye(2, dtype=torch.bool), torch.eye(2, dtype=torch.bool)], qo)
    with pytest.raises(ValueError, match="ancestor_bool: has 1 requests"):
        masks.from_dense([torch.eye(2, dtype=torch.bool)], qo)
    with pytest.raises(TypeError, match="ancestor_bool:"):
        masks.from_dense(torch.eye(3).expand(2, 3, 3), qo)
    with pytest.raises(ValueError, match="ancestor_bool: padded size"):
        masks.from_dense(torch.ones(2, 2, 2, dtype=torch.bool), qo)
    with pytest.raises(ValueError, match="custom_mask: has"):
        masks.from_sglang_full_mask(torch.ones(10, dtype=torch.bool), qo, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="prefix_lens:"):
        masks.from_sglang_full_mask(torch.ones(100, dtype=torch.bool), qo, torch.tensor([1]))
    with pytest.raises(ValueError, match="prefix_lens: must be >= 0"):
        masks.from_sglang_full_mask(torch.ones(100, dtype=torch.bool), qo, torch.tensor([-1, 1]))
    with pytest.raises(TypeError, match="custom_mask:"):
        masks.from_sglang_full_mask(torch.ones(100), qo, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="mask: has"):
        masks.from_sglang_qlen_only(torch.ones(12, dtype=torch.bool), qo)
    with pytest.raises(ValueError, match="mask: 1 bytes per row cannot hold"):
        masks.from_sglang_qlen_bitpacked(torch.ones(20, dtype=torch.uint8), _qo(20))
    with pytest.raises(ValueError, match="kind:"):
        testing.random_parents("bogus", 4)


# ---------------------------------------------------------------------------
# new-user review: every builder validates its arguments and names them


def test_bitpacked_0d_mask_is_a_named_value_error():
    with pytest.raises(ValueError, match=r"^mask: expected \[total_q=2\] or \[total_q, nbytes\], got \(\)"):
        masks.from_sglang_qlen_bitpacked(torch.tensor(5, dtype=torch.uint8), _qo(2))


CAUSAL_BAD = [
    ("q_len_above_max_q_len", torch.tensor([0, 40]), dict(max_q_len=10), ValueError,
     r"^max_q_len: 10 is smaller than the longest request \(40\)"),
    ("indptr_not_from_0", torch.tensor([3, 1]), {}, ValueError, r"^qo_indptr: must start at 0, got 3"),
    ("indptr_decreasing", torch.tensor([0, 3, 1]), {}, ValueError,
     r"^qo_indptr: must be non-decreasing; decreasing at request 1 \(qo_indptr\[1\] = 3 > qo_indptr\[2\] = 1\)"),
    ("indptr_2d", torch.tensor([[0, 3]]), {}, ValueError, r"^qo_indptr: expected shape \[B \+ 1\]"),
    ("indptr_float", torch.tensor([0.0, 3.0]), {}, TypeError, r"^qo_indptr: expected an int32 or int64 tensor"),
    ("max_q_len_str", torch.tensor([0, 4]), dict(max_q_len="x"), TypeError, r"^max_q_len: expected an integer, got str"),
    ("max_q_len_float", torch.tensor([0, 4]), dict(max_q_len=6.5), TypeError, r"^max_q_len: expected an integer, got float"),
    ("max_q_len_too_big", torch.tensor([0, 4]), dict(max_q_len=5000), ValueError, r"^max_q_len: must be in \[0, 1024\], got 5000"),
    ("q_len_above_1024", torch.tensor([0, 1025]), {}, ValueError, r"^qo_indptr: a request has 1025 draft rows, more than 1024"),
]


@pytest.mark.parametrize("name,qo,kw,exc,match", CAUSAL_BAD, ids=[c[0] for c in CAUSAL_BAD])
def test_causal_validates(name, qo, kw, exc, match):
    with pytest.raises(exc, match=match):
        masks.causal(qo, **kw)


def test_causal_with_a_wide_enough_max_q_len_has_every_column():
    bits = masks.causal(torch.tensor([0, 40]), max_q_len=40)
    assert bits.shape == (40, 2)
    dense = masks.to_dense(bits, torch.tensor([0, 40]))[0]
    assert torch.equal(dense, torch.ones(40, 40, dtype=torch.bool).tril())


def _builders(max_q_len):
    """(name, call) of every builder on the same two requests of 2 and 3 drafts."""
    qo = _qo(2, 3)
    parents = torch.tensor([-1, 0, -1, 0, 1])
    dense = [torch.ones(2, 2, dtype=torch.bool).tril(), torch.ones(3, 3, dtype=torch.bool).tril()]
    full = torch.ones(2 * (1 + 2) + 3 * (2 + 3), dtype=torch.bool)
    return [
        ("from_parents", lambda: masks.from_parents(parents, qo, max_q_len=max_q_len)),
        ("from_dense", lambda: masks.from_dense(dense, qo, max_q_len=max_q_len)),
        ("from_sglang_full_mask",
         lambda: masks.from_sglang_full_mask(full, qo, torch.tensor([1, 2]), max_q_len=max_q_len)),
        ("from_sglang_qlen_only",
         lambda: masks.from_sglang_qlen_only(torch.ones(13, dtype=torch.bool), qo, max_q_len=max_q_len)),
        ("from_sglang_qlen_bitpacked",
         lambda: masks.from_sglang_qlen_bitpacked(torch.full((5,), 7, dtype=torch.uint8), qo, max_q_len=max_q_len)),
        ("causal", lambda: masks.causal(qo, max_q_len=max_q_len)),
    ]


BUILDER_NAMES = [n for n, _ in _builders(None)]
MAX_Q_LEN_BAD = [
    ("str", "64", TypeError, r"^max_q_len: expected an integer, got str '64'"),
    ("float", 6.5, TypeError, r"^max_q_len: expected an integer, got float 6.5"),
    ("bool", True, TypeError, r"^max_q_len: expected an integer, got bool"),
    ("above_1024", 5000, ValueError, r"^max_q_len: must be in \[0, 1024\], got 5000"),
    ("negative", -1, ValueError, r"^max_q_len: must be in \[0, 1024\], got -1"),
    ("below_longest", 2, ValueError, r"^max_q_len: 2 is smaller than the longest request \(3\)"),
]


@pytest.mark.parametrize("builder", BUILDER_NAMES)
@pytest.mark.parametrize("value,exc,match", [c[1:] for c in MAX_Q_LEN_BAD], ids=[c[0] for c in MAX_Q_LEN_BAD])
def test_max_q_len_same_rule_in_every_builder(builder, value, exc, match):
    call = dict(_builders(value))[builder]
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("builder", BUILDER_NAMES)
def test_max_q_len_numpy_int_accepted_in_every_builder(builder):
    call = dict(_builders(np.int64(64)))[builder]
    assert call().shape == (5, 2)


def test_to_dense_validates_its_arguments():
    qo = _qo(1)
    with pytest.raises(TypeError, match=r"^bits: expected a torch.Tensor, got list"):
        masks.to_dense([[1]], qo)
    bits = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^qo_indptr: must be non-decreasing; decreasing at request 1"):
        masks.to_dense(bits, torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match=r"^qo_indptr: must start at 0, got 1"):
        masks.to_dense(bits, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"^bits: has 2 rows, qo_indptr says 1"):
        masks.to_dense(bits, qo)


def test_full_mask_mask_indptr_validated():
    qo = _qo(2)
    buf = torch.ones(100, dtype=torch.bool)
    pre = torch.tensor([3])
    with pytest.raises(ValueError, match=r"^mask_indptr: entry 0 is -100; offsets must be >= 0"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([-100, 60]))
    with pytest.raises(TypeError, match=r"^mask_indptr: expected an integer tensor \[1 \+ 1\], got torch.float32"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([0.0, 10.0]))
    with pytest.raises(TypeError, match=r"^mask_indptr: expected an integer tensor \[1 \+ 1\], got list"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=[0, 10])
    with pytest.raises(ValueError, match=r"^custom_mask: has 100 entries, the layout needs 101"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([91, 101]))
    # a valid offset reads the block there
    buf = torch.zeros(100, dtype=torch.bool)
    buf[50:60] = torch.tensor([1, 1, 1, 1, 0, 1, 1, 1, 1, 1], dtype=torch.bool)  # rows of 5: prefix 3 + 2 drafts
    bits = masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([50, 60]))
    assert bits.tolist() == [[0b01], [0b11]]


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_from_parents_validate_must_be_a_bool(value):
    with pytest.raises(TypeError, match=r"^validate: expected a bool, got "):
        masks.from_parents(torch.tensor([-1, 0]), _qo(2), validate=value)
    assert masks.from_parents(torch.tensor([-1, 0]), _qo(2), validate=np.bool_(False), max_q_len=2).shape == (2, 1)


# ---------------------------------------------------------------------------
# inputs a new user is likely to pass (the random_parents checks: test_testing.py)


@pytest.mark.parametrize("value,exc,match", [
    ("40", TypeError, r"^max_q_len: expected an integer"),
    (2.7, TypeError, r"^max_q_len: expected an integer"),
    (True, TypeError, r"^max_q_len: expected an integer"),
    (None, TypeError, r"^max_q_len: expected an integer"),
    (-100, ValueError, r"^max_q_len: must be >= 0"),
])
def test_mask_words_refuses_non_integers(value, exc, match):
    with pytest.raises(exc, match=match):
        masks.mask_words(value)


def test_mask_words_values():
    assert [masks.mask_words(n) for n in (0, 1, 32, 33, 64, 65, 1024)] == [1, 1, 1, 2, 2, 3, 32]


def test_empty_batch_round_trips():
    """A builder's own [0, W] output used to fail in to_dense (reshape of 0 elements with -1)."""
    qo0 = torch.tensor([0], dtype=torch.int32)
    assert masks.to_dense(torch.zeros(0, 1, dtype=torch.int32), qo0) == []
    qo = torch.tensor([0, 0], dtype=torch.int32)
    bits = masks.from_parents(torch.zeros(0, dtype=torch.int32), qo)
    assert tuple(bits.shape) == (0, 1)
    dense = masks.to_dense(bits, qo)
    assert len(dense) == 1 and tuple(dense[0].shape) == (0, 0)


def test_from_parents_unvalidated_rows_without_requests_do_not_crash():
    """validate=False promises no crash and no out-of-bounds access on bad input."""
    bits = masks.from_parents(torch.tensor([-1, 0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                              validate=False, max_q_len=2)
    assert tuple(bits.shape) == (3, 1)


# ---------------------------------------------------------------------------
# argument checks of from_sglang_full_mask, from_dense and causal


def _full_args():
    """Two requests of 2 and 3 drafts after prefixes of 1 and 2: FULL blocks of
    2 * (1 + 2) = 6 and 3 * (2 + 3) = 15 entries, 21 in all."""
    return torch.ones(100, dtype=torch.bool), _qo(2, 3), torch.tensor([1, 2])


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.complex64])
def test_full_mask_prefix_lens_must_be_an_integer_tensor(dtype):
    buf, qo, _ = _full_args()
    with pytest.raises(TypeError, match=rf"^prefix_lens: expected an integer tensor \[B\], got {dtype}"):
        masks.from_sglang_full_mask(buf, qo, torch.tensor([1, 1], dtype=dtype))
    with pytest.raises(TypeError, match=r"^prefix_lens: expected an integer tensor \[B\], got list"):
        masks.from_sglang_full_mask(buf, qo, [1, 2])


@pytest.mark.parametrize("mask_indptr", [[0, 6], [0, 6, 21, 21], [[0, 6, 21]]], ids=["B", "B+2", "2d"])
def test_full_mask_mask_indptr_needs_b_plus_1_entries(mask_indptr):
    buf, qo, pre = _full_args()
    shape = tuple(torch.tensor(mask_indptr).shape)
    with pytest.raises(ValueError, match=rf"^mask_indptr: expected shape \[2 \+ 1\], got {re.escape(str(shape))}"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor(mask_indptr))


def test_full_mask_mask_indptr_must_match_the_layout():
    """mask_indptr[i + 1] - mask_indptr[i] is request i's FULL block, q_len_i * (prefix_len_i + q_len_i):
    with SGLang's mask_indptr[0] = 0, mask_indptr[B] is the layout's total size (21 here)."""
    buf, qo, pre = _full_args()
    ref = masks.from_sglang_full_mask(buf, qo, pre)
    assert masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([0, 6, 21])).equal(ref)
    # the end too large (e.g. seq_lens that included the drafts) or too small
    for end, span in ((40, 34), (20, 14)):
        with pytest.raises(ValueError, match=rf"^mask_indptr: request 1 spans mask_indptr\[2\] - mask_indptr\[1\] = "
                                             rf"{span} entries; the FULL layout needs q_len \* \(prefix_len \+ q_len\) "
                                             rf"= 15"):
            masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([0, 6, end]))
    # a wrong middle entry
    with pytest.raises(ValueError, match=r"^mask_indptr: request 0 spans .* = 8 entries; .* = 6"):
        masks.from_sglang_full_mask(buf, qo, pre, mask_indptr=torch.tensor([0, 8, 21]))
    # mask_indptr[B] beyond the buffer, with no request to read (B = 0), and a negative end
    empty = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^custom_mask: has 100 entries, the layout needs 200 \(mask_indptr\[0\] = 200\)"):
        masks.from_sglang_full_mask(buf, empty, torch.zeros(0, dtype=torch.int64), mask_indptr=torch.tensor([200]))
    with pytest.raises(ValueError, match=r"^mask_indptr: entry 0 is -1; offsets must be >= 0"):
        masks.from_sglang_full_mask(buf, empty, torch.zeros(0, dtype=torch.int64), mask_indptr=torch.tensor([-1]))
    assert masks.from_sglang_full_mask(buf, empty, torch.zeros(0, dtype=torch.int64),
                                       mask_indptr=torch.tensor([100])).shape == (0, 1)


@pytest.mark.parametrize("value", [2, -1, 255])
def test_from_dense_integer_entries_must_be_0_or_1(value):
    qo = _qo(2, 3)
    dense = [torch.ones(2, 2, dtype=torch.int64).tril(), torch.ones(3, 3, dtype=torch.int64).tril()]
    ref = masks.from_dense(dense, qo)
    assert ref.equal(masks.from_dense([d.bool() for d in dense], qo))
    dense[1][2, 0] = value
    if value == 255:
        dense = [d.to(torch.uint8) for d in dense]
    with pytest.raises(ValueError, match=rf"^ancestor_bool: element 1 holds {value}; an integer mask must hold only 0 and 1"):
        masks.from_dense(dense, qo)
    padded = torch.zeros(2, 3, 3, dtype=dense[1].dtype)
    padded[0, :2, :2] = dense[0]
    padded[1] = dense[1]
    with pytest.raises(ValueError, match=rf"^ancestor_bool: holds {value}; an integer mask must hold only 0 and 1"):
        masks.from_dense(padded, qo)
    padded[1, 2, 0] = 1
    assert masks.from_dense(padded, qo).equal(ref)


@pytest.mark.parametrize("device,exc,match", [
    ("bogus", ValueError, r"^device: 'bogus' is not a device \("),
    ("cuda:x", ValueError, r"^device: 'cuda:x' is not a device \("),
    (-1, ValueError, r"^device: -1 is not a device \("),
    (3.5, TypeError, r"^device: expected a str, int or torch.device, got float 3.5"),
    ([0], TypeError, r"^device: expected a str, int or torch.device, got list \[0\]"),
])
def test_causal_bad_device_is_named(device, exc, match):
    with pytest.raises(exc, match=match):
        masks.causal(_qo(2, 3), device=device)
    assert masks.causal(_qo(2, 3), device="cpu").equal(masks.causal(_qo(2, 3)))
    assert masks.causal(_qo(2, 3), device=torch.device("cpu")).device.type == "cpu"


@pytest.mark.parametrize("value", [2, -1, 255])
def test_sglang_flat_integer_masks_must_be_0_or_1(value):
    """from_sglang_full_mask and from_sglang_qlen_only refuse an integer flat mask holding
    anything but 0 and 1 (it was read as True), naming the argument, like from_dense."""
    buf, qo, pre = _full_args()
    ref_full = masks.from_sglang_full_mask(buf, qo, pre)
    qlen = torch.ones(13, dtype=torch.bool)  # 2 * 2 + 3 * 3 entries
    ref_qlen = masks.from_sglang_qlen_only(qlen, qo)
    dtype = torch.uint8 if value == 255 else torch.int64
    ibuf, iqlen = buf.to(dtype), qlen.to(dtype)
    assert masks.from_sglang_full_mask(ibuf, qo, pre).equal(ref_full)
    assert masks.from_sglang_qlen_only(iqlen, qo).equal(ref_qlen)
    ibuf[7] = value  # request 1, row 0, a draft column
    iqlen[5] = value  # request 1, row 0, column 1
    with pytest.raises(ValueError, match=rf"^custom_mask: holds {value}; an integer mask must hold only 0 and 1"):
        masks.from_sglang_full_mask(ibuf, qo, pre)
    with pytest.raises(ValueError, match=rf"^mask: holds {value}; an integer mask must hold only 0 and 1"):
        masks.from_sglang_qlen_only(iqlen, qo)


def test_sglang_flat_bool_masks_are_not_scanned():
    """A bool FULL / QLEN_ONLY mask (SGLang's, ~1 GiB for a large FULL buffer) pays no pass over
    the buffer for the 0/1 check: the only torch calls that see it are metadata, the flattening
    view and the gather of the rows read."""
    from torch.overrides import TorchFunctionMode

    n = 1 << 16

    class Record(TorchFunctionMode):
        """Names of the torch functions called with a tensor of n entries."""

        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(isinstance(a, torch.Tensor) and a.numel() == n for a in (*args, *kwargs.values())):
                self.names.add(getattr(func, "__name__", str(func)))
            return func(*args, **kwargs)

    buf, qo, pre = torch.ones(n, dtype=torch.bool), _qo(2, 3), torch.tensor([1, 2])
    metadata_view_gather = {"__get__", "is_floating_point", "is_complex", "numel", "reshape", "__getitem__"}
    for build in (lambda m: masks.from_sglang_full_mask(m, qo, pre), lambda m: masks.from_sglang_qlen_only(m, qo)):
        with Record() as rec:
            build(buf)
        assert rec.names <= metadata_view_gather, rec.names - metadata_view_gather
        ibuf = buf.to(torch.uint8)
        with Record() as rec:
            build(ibuf)
        assert "ne" in rec.names  # an integer mask is read (checked and converted) in full


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_causal_cuda_device_without_cuda_is_named(device, monkeypatch):
    """device="cuda" where torch has no CUDA: a ValueError naming device, not torch's
    AssertionError ("Torch not compiled with CUDA enabled") from the copy. (An int
    device there is already refused by torch.device: "is not a device".)"""
    if not torch.cuda.is_available():  # the real CPU-only build, unpatched
        with pytest.raises(ValueError, match=rf"^device: CUDA is not available \({re.escape(repr(device))}; "
                                             r"torch.cuda.is_available\(\) is False\)"):
            masks.causal(_qo(2, 3), device=device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device: CUDA is not available \("):
        masks.causal(_qo(2, 3), device=device)


def test_causal_cuda_ordinal_out_of_range_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for device in ("cuda:2", torch.device("cuda", 5)):
        with pytest.raises(ValueError, match=rf"^device: {re.escape(repr(device))} names CUDA device "
                                             rf"{torch.device(device).index}; torch sees 2"):
            masks.causal(_qo(2, 3), device=device)
