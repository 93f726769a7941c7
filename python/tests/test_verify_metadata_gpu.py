"""verify_attn.uniform_verify_metadata (va_verify_metadata) against a host loop.

Random batches each run (sizes, prefix lengths including 0, draft counts
across the 32-bit mask words, int32 / int64 inputs, padded requests, random
QLEN_ONLY masks), outputs poisoned before the launch; the prefix entries of
kv_indices stay the caller's (untouched). Bad device data (a negative
prefix, rows past the capacity, a slot outside int32) is flagged in the error
word and writes nothing outside the buffers; bad arguments raise naming them.
"""

import random

import pytest
import torch

import verify_attn
from verify_attn import errors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
]

POISON = -7


def expected(prefix, slots, n, mask, pad_slot):
    """Host loop: (qo_indptr, kv_indptr, kv_len, {kv_indices position: slot}, tree bits rows or None)."""
    B, R = len(prefix), len(slots) // n
    qo, kvp, kvl, idx = [0], [0], [], {}
    for r in range(B):
        qo.append((r + 1) * n)
        kvl.append(prefix[r] + n)
        for t in range(n):
            idx[kvp[r] + prefix[r] + t] = slots[r * n + t] if r < R else pad_slot
        kvp.append(kvp[r] + prefix[r] + n)
    rows = None
    if mask is not None:
        words = (n + 31) // 32
        rows = []
        for r in range(B):
            for t in range(n):
                row = [0] * words
                for c in range(n):
                    vis = mask[(r * n + t) * n + c] if r < R else c <= t
                    if vis:
                        row[c // 32] |= 1 << (c % 32)
                rows.append([w - (1 << 32) if w >= 1 << 31 else w for w in row])
    return qo, kvp, kvl, idx, rows


def _case(rng, n, B, R, with_mask, len_dtype, slot_dtype):
    prefix = [rng.choice([0, 1, rng.randrange(2, 300)]) for _ in range(B)]
    slots = [rng.randrange(0, 1 << 31) for _ in range(R * n)]
    mask = [rng.random() < 0.5 for _ in range(R * n * n)] if with_mask else None
    dev = "cuda"
    t_prefix = torch.tensor(prefix, dtype=len_dtype, device=dev)
    t_slots = torch.tensor(slots, dtype=slot_dtype, device=dev)
    t_mask = torch.tensor(mask, dtype=torch.bool, device=dev) if with_mask else None
    return prefix, slots, mask, t_prefix, t_slots, t_mask


def _poisoned_out(B, n, cap, dev="cuda"):
    words = (n + 31) // 32
    full = lambda *shape: torch.full(shape, POISON, dtype=torch.int32, device=dev)  # noqa: E731
    return verify_attn.VerifyMetadata(full(B + 3), full(B + 2), full(cap), full(B + 1), full(B * n + 2, words))


@pytest.mark.parametrize("n", [1, 4, 16, 31, 32, 33, 64, 100])
def test_random_batches_match_the_host_loop(n):
    rng = random.Random()
    for _ in range(6):
        B = rng.randrange(0, 9)
        R = rng.randrange(0, B + 1) if rng.random() < 0.4 else B
        with_mask = rng.random() < 0.7
        len_dtype, slot_dtype = rng.choice([torch.int32, torch.int64]), rng.choice([torch.int32, torch.int64])
        prefix, slots, mask, tp, ts, tm = _case(rng, n, B, R, with_mask, len_dtype, slot_dtype)
        pad = rng.randrange(0, 100)
        cap = sum(prefix) + B * n + rng.randrange(0, 5)
        out = _poisoned_out(B, n, cap)
        got = verify_attn.uniform_verify_metadata(tp, ts, n, draft_mask=tm, pad_slot=pad, out=out)
        qo, kvp, kvl, idx, rows = expected(prefix, slots, n, mask, pad)
        assert got.qo_indptr.tolist() == qo and got.kv_indptr.tolist() == kvp and got.kv_len.tolist() == kvl
        kvi = got.kv_indices.tolist()
        assert len(kvi) == cap
        for pos, v in enumerate(kvi):  # drafts written, every other entry (the prefix) untouched
            assert v == idx.get(pos, POISON), (pos, v)
        if with_mask:
            assert got.tree_mask.tolist() == rows
            assert out.tree_mask[B * n:].eq(POISON).all()
        else:
            assert got.tree_mask is None and out.tree_mask.eq(POISON).all()
        assert out.qo_indptr[B + 1:].eq(POISON).all() and out.kv_indptr[B + 1:].eq(POISON).all()
        assert out.kv_len[B:].eq(POISON).all()
        errors.check_errors()


# One block per request sums the earlier prefixes over 128 threads (4 warps, a
# strided loop) and writes its drafts in a loop strided by 128: batches of more
# than 128 requests and more than 128 drafts are the only ones that reach every
# warp of the reduction and the second trip of those loops (B <= 8, N <= 100
# above touch threads 0..7 of warp 0 only).
@pytest.mark.parametrize("B,n,with_mask", [(129, 1, True), (300, 4, True), (700, 2, False), (2, 129, True),
                                           (3, 300, True), (2, 1024, False)])
def test_wide_batches_and_many_drafts(B, n, with_mask):
    rng = random.Random(B * 1000 + n)
    R = B - rng.randrange(0, 3)
    prefix, slots, mask, tp, ts, tm = _case(rng, n, B, R, with_mask, torch.int64, torch.int32)
    cap = sum(prefix) + B * n
    out = _poisoned_out(B, n, cap)
    got = verify_attn.uniform_verify_metadata(tp, ts, n, draft_mask=tm, pad_slot=5, out=out)
    qo, kvp, kvl, idx, rows = expected(prefix, slots, n, mask, 5)
    assert got.qo_indptr.tolist() == qo and got.kv_indptr.tolist() == kvp and got.kv_len.tolist() == kvl
    kvi = got.kv_indices.tolist()
    assert all(v == idx.get(pos, POISON) for pos, v in enumerate(kvi))
    if with_mask:
        assert got.tree_mask.tolist() == rows
    errors.check_errors()


def test_allocates_outputs_and_feeds_a_plan():
    """Without ``out``: fresh tensors; the result plans and runs like the host-built batch."""
    rng = random.Random()
    n, B = 8, 3
    prefix, slots, mask, tp, ts, tm = _case(rng, n, B, B, True, torch.int64, torch.int64)
    got = verify_attn.uniform_verify_metadata(tp, ts, n, draft_mask=tm, kv_indices_capacity=sum(prefix) + B * n)
    qo, kvp, kvl, idx, rows = expected(prefix, slots, n, mask, 0)
    assert got.kv_indptr.tolist() == kvp and got.tree_mask.tolist() == rows
    assert all(got.kv_indices[p].item() == v for p, v in idx.items())
    assert all(t.dtype == torch.int32 and t.is_contiguous() for t in got)


def test_device_errors_are_flagged_and_write_nothing_outside():
    n = 4
    dev = "cuda"
    errors.check_errors()
    # A negative prefix: flagged, its drafts not written, counted as 0 in the indptr.
    tp = torch.tensor([3, -2, 1], dtype=torch.int32, device=dev)
    ts = torch.arange(100, 100 + 3 * n, dtype=torch.int32, device=dev)
    out = _poisoned_out(3, n, 64)
    got = verify_attn.uniform_verify_metadata(tp, ts, n, out=out)
    with pytest.raises(verify_attn.KernelInputError) as e:
        errors.check_errors()
    assert e.value.bits == errors.ERR_METADATA and e.value.request == 1 and e.value.value == -2
    assert got.kv_indptr.tolist() == [0, 7, 11, 16]
    assert got.kv_indices[7:11].eq(POISON).all()
    # Rows past the capacity: flagged; the tail of the larger buffer the capacity is cut from stays poisoned.
    big = torch.full((40,), POISON, dtype=torch.int32, device=dev)
    tp = torch.tensor([5, 20], dtype=torch.int64, device=dev)
    out = verify_attn.VerifyMetadata(None, None, big[:20], None, None)
    got = verify_attn.uniform_verify_metadata(tp, ts[: 2 * n], n, out=out)
    with pytest.raises(verify_attn.KernelInputError) as e:
        errors.check_errors()
    assert e.value.bits == errors.ERR_METADATA and e.value.request == 1 and e.value.value == 33
    assert got.kv_indices[5:9].tolist() == ts[:n].tolist()
    assert big[20:].eq(POISON).all() and got.kv_indices[9:].eq(POISON).all()
    # int64 prefixes whose sum wraps int64 (3 * 2^61 twice): every request flagged, nothing
    # written outside the buffer (an unclamped sum made request 2's start negative).
    big = torch.full((40,), POISON, dtype=torch.int32, device=dev)
    tp = torch.tensor([3 << 61, 3 << 61, 5], dtype=torch.int64, device=dev)
    got = verify_attn.uniform_verify_metadata(tp, ts[: 3 * n], n,
                                              out=verify_attn.VerifyMetadata(None, None, big[:20], None, None))
    with pytest.raises(verify_attn.KernelInputError) as e:
        errors.check_errors()
    assert e.value.bits == errors.ERR_METADATA
    assert big.eq(POISON).all()
    assert got.kv_indptr.tolist() == [0] + [2**31 - 1] * 3
    # A draft slot outside int32 (int64 slots).
    ts64 = torch.tensor([1, 2, 1 << 40, 4], dtype=torch.int64, device=dev)
    got = verify_attn.uniform_verify_metadata(torch.tensor([2], device=dev), ts64, n, kv_indices_capacity=6)
    with pytest.raises(verify_attn.KernelInputError) as e:
        errors.check_errors()
    assert e.value.bits == errors.ERR_METADATA and e.value.position == 4
    errors.check_errors()  # reset


def test_bad_arguments_raise_naming_them():
    dev = "cuda"
    tp = torch.tensor([3, 4], dtype=torch.int32, device=dev)
    ts = torch.arange(8, dtype=torch.int32, device=dev)
    f = verify_attn.uniform_verify_metadata
    cases = [
        (ValueError, "prefix_len", lambda: f(tp.cpu(), ts, 4, kv_indices_capacity=20)),
        (TypeError, "prefix_len", lambda: f(tp.float(), ts, 4, kv_indices_capacity=20)),
        (ValueError, "draft_slots", lambda: f(tp, ts.cpu(), 4, kv_indices_capacity=20)),
        (TypeError, "draft_slots", lambda: f(tp, ts.to(torch.int16), 4, kv_indices_capacity=20)),
        (ValueError, "draft_slots", lambda: f(tp, ts[:7], 4, kv_indices_capacity=20)),
        (ValueError, "draft_slots", lambda: f(tp, ts, 2, kv_indices_capacity=20)),  # 4 requests' drafts
        (ValueError, "num_drafts", lambda: f(tp, ts, 0, kv_indices_capacity=20)),
        (ValueError, "num_drafts", lambda: f(tp, ts, 2048, kv_indices_capacity=20)),
        (TypeError, "num_drafts", lambda: f(tp, ts, 4.0, kv_indices_capacity=20)),
        (ValueError, "kv_indices_capacity", lambda: f(tp, ts, 4)),
        (ValueError, "pad_slot", lambda: f(tp, ts, 4, kv_indices_capacity=20, pad_slot=1 << 31)),
        (ValueError, "kv_indices_capacity", lambda: f(tp, ts, 4, kv_indices_capacity=-1)),
        (ValueError, "draft_mask", lambda: f(tp, ts, 4, draft_mask=torch.ones(31, dtype=torch.bool, device=dev),
                                             kv_indices_capacity=20)),
        (TypeError, "draft_mask", lambda: f(tp, ts, 4, draft_mask=torch.ones(32, device=dev),
                                            kv_indices_capacity=20)),
        (ValueError, "draft_mask", lambda: f(tp, ts, 4, draft_mask=torch.ones(64, dtype=torch.bool,
                                                                               device=dev)[::2],
                                             kv_indices_capacity=20)),
        (ValueError, "out.kv_len", lambda: f(tp, ts, 4, kv_indices_capacity=20,
                                             out=verify_attn.VerifyMetadata(
                                                 None, None, None, torch.empty(1, dtype=torch.int32, device=dev),
                                                 None))),
        (ValueError, "out.tree_mask", lambda: f(tp, ts, 4, kv_indices_capacity=20,
                                                draft_mask=torch.ones(32, dtype=torch.bool, device=dev),
                                                out=verify_attn.VerifyMetadata(
                                                    None, None, None, None,
                                                    torch.empty(8, 2, dtype=torch.int32, device=dev)))),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=name):
            call()
