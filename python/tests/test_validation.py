"""Argument validation of the public API: every error names its argument.

Runs on CPU (dtype, shape, stride and alignment errors are reported before the
device check, so every message is reachable without a GPU; a fully valid CPU
call fails with "q: must be a CUDA tensor"), and, when a GPU is present, the
same cases again on CUDA tensors.
"""

import pytest
import torch

import verify_attn
from verify_attn import masks

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a GPU")]),
]

H, HKV, D = 4, 2, 64
Q_LENS = [2, 4]
PREFIX = [3, 5]


def _qo():
    return torch.tensor([0, 2, 6], dtype=torch.int32)


def flat_args(device):
    total_q = sum(Q_LENS)
    kv_rows = total_q + sum(PREFIX)
    qo = _qo()
    kv = torch.tensor([0, 5, 14], dtype=torch.int32)
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    a = dict(
        q=torch.randn(total_q, H, D).to(torch.bfloat16),
        k=torch.randn(kv_rows, HKV, D).to(torch.bfloat16),
        v=torch.randn(kv_rows, HKV, D).to(torch.bfloat16),
        qo_indptr=qo,
        kv_indptr=kv,
        tree_mask=masks.from_parents(parents, qo),
    )
    return {n: t.to(device) for n, t in a.items()}


def paged_args(device):
    total_q = sum(Q_LENS)
    qo = _qo()
    parents = torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32)
    a = dict(
        q=torch.randn(total_q, H, D).to(torch.bfloat16),
        k_cache=torch.randn(6, 4, HKV, D).to(torch.bfloat16),
        v_cache=torch.randn(6, 4, HKV, D).to(torch.bfloat16),
        qo_indptr=qo,
        kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32),
        kv_indices=torch.tensor([4, 0, 2, 5, 1], dtype=torch.int32),
        kv_len=torch.tensor([5, 9], dtype=torch.int32),
        tree_mask=masks.from_parents(parents, qo),
    )
    return {n: t.to(device) for n, t in a.items()}


def mla_args(device):
    total_q = sum(Q_LENS)
    qo = _qo()
    a = dict(
        q=torch.randn(total_q, 16, 576).to(torch.bfloat16),
        k=torch.randn(14, 1, 576).to(torch.bfloat16),
        qo_indptr=qo,
        kv_indptr=torch.tensor([0, 5, 14], dtype=torch.int32),
    )
    a = {n: t.to(device) for n, t in a.items()}
    a["v"] = None
    a["causal"] = True
    return a


def misaligned(t):
    """Same shape, contiguous strides, data pointer off by one element (2 bytes)."""
    buf = torch.zeros(t.numel() + 8, dtype=t.dtype, device=t.device)
    return buf[1 : 1 + t.numel()].view(t.shape)


def row_stride(t, extra):
    """Same values, token stride increased by `extra` elements."""
    n = t.shape[0]
    inner = t[0].numel()
    buf = torch.zeros(n * (inner + extra), dtype=t.dtype, device=t.device)
    strides = (inner + extra,) + tuple(t.stride()[1:])
    out = buf.as_strided(t.shape, strides)
    out.copy_(t)
    return out


def set_(**kw):
    def f(a):
        a.update(kw)
    return f


def mut(name, fn):
    def f(a):
        a[name] = fn(a[name])
    return f


def both(*fs):
    def f(a):
        for g in fs:
            g(a)
    return f


def _fp8(a):
    """The layout's caches quantized to fp8 (e4m3)."""
    for n in ("k", "v", "k_cache", "v_cache"):
        if a.get(n) is not None:
            a[n] = a[n].to(torch.float8_e4m3fn)


# (id, layout, mutation, exception, message regex)
CASES = [
    # ---- dtypes -> TypeError
    ("q_float32", "flat", mut("q", lambda t: t.float()), TypeError, r"^q: expected dtype"),
    ("q_not_tensor", "flat", set_(q=[1, 2]), TypeError, r"^q: expected a torch.Tensor"),
    ("k_dtype", "flat", mut("k", lambda t: t.half()), TypeError, r"^k: dtype"),
    ("v_dtype", "flat", mut("v", lambda t: t.half()), TypeError, r"^v: dtype"),
    ("qo_indptr_int64", "flat", mut("qo_indptr", lambda t: t.long()), TypeError, r"^qo_indptr: expected dtype torch.int32"),
    ("kv_indptr_int64", "flat", mut("kv_indptr", lambda t: t.long()), TypeError, r"^kv_indptr: expected dtype torch.int32"),
    ("tree_mask_int64", "flat", mut("tree_mask", lambda t: t.long()), TypeError, r"^tree_mask: expected dtype"),
    ("tree_mask_bool", "flat", mut("tree_mask", lambda t: t.bool()), TypeError, r"^tree_mask: expected dtype"),
    ("out_dtype", "flat", lambda a: a.update(out=torch.empty(6, H, D, dtype=torch.float16, device=a["q"].device)),
     TypeError, r"^out: dtype"),
    ("lse_dtype", "flat", lambda a: a.update(lse=torch.empty(6, H, dtype=torch.float16, device=a["q"].device)),
     TypeError, r"^lse: expected dtype torch.float32"),
    ("k_cache_dtype", "paged", mut("k_cache", lambda t: t.half()), TypeError, r"^k_cache: dtype"),
    # ---- fp8 caches: the variant, the pair, the scales
    ("k_e5m2", "flat", both(mut("k", lambda t: t.to(torch.float8_e5m2)), mut("v", lambda t: t.to(torch.float8_e5m2))),
     TypeError, r"^k: dtype torch.float8_e5m2 is not served"),
    ("v_not_fp8", "flat", mut("k", lambda t: t.to(torch.float8_e4m3fn)), TypeError, r"^v: dtype torch.bfloat16 differs"),
    ("k_scale_bf16_cache", "flat", set_(k_scale=0.5), ValueError, r"^k_scale: only an fp8 cache"),
    ("v_scale_bf16_cache", "paged", set_(v_scale=2.0), ValueError, r"^v_scale: only an fp8 cache"),
    ("k_scale_nan", "flat", both(_fp8, set_(k_scale=float("nan"))), ValueError, r"^k_scale: must be finite and > 0"),
    ("v_scale_zero", "paged", both(_fp8, set_(v_scale=0.0)), ValueError, r"^v_scale: must be finite and > 0"),
    ("mla_v_scale_not_k_scale", "mla", both(_fp8, set_(k_scale=0.5, v_scale=0.25)), ValueError,
     r"^v_scale: an MLA cache holds K and V in one tensor"),
    ("k_scale_tensor", "flat", both(_fp8, set_(k_scale=torch.tensor(1.0))), TypeError, r"^k_scale: expected a Python float"),
    ("v_cache_dtype", "paged", mut("v_cache", lambda t: t.float()), TypeError, r"^v_cache: dtype"),
    ("kv_indices_int64", "paged", mut("kv_indices", lambda t: t.long()), TypeError, r"^kv_indices: expected dtype"),
    ("kv_len_int64", "paged", mut("kv_len", lambda t: t.long()), TypeError, r"^kv_len: expected dtype"),
    # ---- shapes -> ValueError
    ("q_2d", "flat", mut("q", lambda t: t.reshape(6, -1)), ValueError, r"^q: expected shape"),
    ("k_2d", "flat", mut("k", lambda t: t.reshape(14, -1)), ValueError, r"^k: expected shape"),
    ("k_heads_not_dividing", "flat", both(mut("k", lambda t: t[:, :1].expand(14, 3, D).contiguous()),
                                          mut("v", lambda t: t[:, :1].expand(14, 3, D).contiguous())),
     ValueError, r"^k: num_kv_heads 3 must be >= 1 and divide"),
    ("k_head_dim", "flat", mut("k", lambda t: t[..., :32].contiguous()), ValueError, r"^k: head_dim 32 differs"),
    ("v_rows", "flat", mut("v", lambda t: t[:10]), ValueError, r"^v: shape"),
    ("head_dim_vo_mismatch", "flat", set_(head_dim_vo=32), ValueError, r"^head_dim_vo: 32 differs"),
    ("mla_head_dim_vo_too_big", "mla", set_(head_dim_vo=640), ValueError, r"^head_dim_vo: 640 must be in"),
    ("mla_default_vo_on_small_head", "flat", set_(v=None), ValueError, r"^v: None selects MLA"),
    ("qo_indptr_2d", "flat", mut("qo_indptr", lambda t: t.reshape(1, -1)), ValueError, r"^qo_indptr: expected shape"),
    ("kv_indptr_len", "flat", mut("kv_indptr", lambda t: t[:2]), ValueError, r"^kv_indptr: expected shape \[3\]"),
    ("qo_indptr_total", "flat", mut("qo_indptr", lambda t: torch.tensor([0, 2, 5], dtype=torch.int32, device=t.device)),
     ValueError, r"^qo_indptr: must start at 0.*end at q.shape\[0\] = 6"),
    ("tree_mask_and_causal", "flat", set_(causal=True), ValueError, r"^tree_mask: pass exactly one.*both"),
    ("neither_mask_nor_causal", "flat", set_(tree_mask=None), ValueError, r"^tree_mask: pass exactly one.*neither"),
    ("tree_mask_rows", "flat", mut("tree_mask", lambda t: t[:5]), ValueError, r"^tree_mask: 5 rows, but q has 6 \(q.shape\[0\]"),
    ("tree_mask_1d", "flat", mut("tree_mask", lambda t: t.reshape(-1)), ValueError, r"^tree_mask: expected shape"),
    ("tree_mask_too_narrow", "flat", set_(max_q_len=40), ValueError, r"^tree_mask: 1 words per row hold 32"),
    ("max_q_len_too_big", "mla", set_(max_q_len=1025), ValueError, r"^max_q_len: must be in \[0, 1024\]"),
    ("max_q_len_negative", "mla", set_(max_q_len=-1), ValueError, r"^max_q_len: must be in"),
    ("max_kv_len_negative", "flat", set_(max_kv_len=-5), ValueError, r"^max_kv_len: must be >= 0"),
    ("num_splits_negative", "flat", set_(num_splits=-1), ValueError, r"^num_splits: must be >= 0"),
    ("sm_scale_nan", "flat", set_(sm_scale=float("nan")), ValueError, r"^sm_scale: must be finite and > 0"),
    # ---- scalar arguments of the wrong kind -> TypeError naming them
    ("sm_scale_str", "flat", set_(sm_scale="abc"), TypeError, r"^sm_scale: expected a number, got str"),
    ("sm_scale_list", "flat", set_(sm_scale=[0.1]), TypeError, r"^sm_scale: expected a number, got list"),
    ("num_splits_str", "flat", set_(num_splits="x"), TypeError, r"^num_splits: expected an integer, got str"),
    ("num_splits_none", "flat", set_(num_splits=None), TypeError, r"^num_splits: expected an integer, got NoneType"),
    ("num_splits_fraction", "flat", set_(num_splits=2.7), TypeError, r"^num_splits: expected an integer, got float"),
    ("max_q_len_fraction", "flat", set_(max_q_len=6.9), TypeError, r"^max_q_len: expected an integer, got float"),
    ("max_kv_len_str", "flat", set_(max_kv_len="9"), TypeError, r"^max_kv_len: expected an integer, got str"),
    ("head_dim_vo_str", "mla", set_(head_dim_vo="512"), TypeError, r"^head_dim_vo: expected an integer, got str"),
    ("causal_str", "flat", both(set_(tree_mask=None), set_(causal="yes")), TypeError, r"^causal: expected a bool, got str"),
    ("return_lse_int", "flat", set_(return_lse=1), TypeError, r"^return_lse: expected a bool, got int"),
    ("sm_scale_negative", "flat", set_(sm_scale=-0.1), ValueError, r"^sm_scale: must be finite and > 0"),
    ("max_q_len_zero", "flat", set_(max_q_len=0), ValueError, r"^max_q_len: must be >= 1 when there are query rows"),
    ("out_shape", "flat", lambda a: a.update(out=torch.empty(6, H, 32, dtype=torch.bfloat16, device=a["q"].device)),
     ValueError, r"^out: expected shape"),
    ("lse_shape", "flat", lambda a: a.update(lse=torch.empty(6, H + 1, dtype=torch.float32, device=a["q"].device)),
     ValueError, r"^lse: expected shape"),
    ("page_size_mismatch", "paged", set_(page_size=8), ValueError, r"^page_size: 8 does not match k_cache.shape\[1\] = 4"),
    ("page_size_zero_3d", "paged", both(mut("k_cache", lambda t: t.reshape(24, HKV, D)),
                                        mut("v_cache", lambda t: t.reshape(24, HKV, D)), set_(page_size=0)),
     ValueError, r"^page_size: must be >= 1"),
    ("page_size_float", "paged", set_(page_size=1.5), TypeError, r"^page_size: expected an integer, got float"),
    ("kv_slot_runs_page_size_4", "paged", set_(kv_slot_runs=64), ValueError,
     r"^kv_slot_runs: only for a paged cache with page_size 1 \(got page_size 4\)"),
    ("kv_slot_runs_zero", "paged", set_(kv_slot_runs=0), ValueError, r"^kv_slot_runs: must be in \[1, 2\^31-1\]"),
    ("kv_slot_runs_float", "paged", set_(kv_slot_runs=64.0), TypeError, r"^kv_slot_runs: expected an integer, got float"),
    ("page_size_beyond_int32", "paged", both(mut("k_cache", lambda t: t.reshape(24, HKV, D)),
                                             mut("v_cache", lambda t: t.reshape(24, HKV, D)), set_(page_size=2**40)),
     ValueError, r"^page_size: must be <= 2\^31-1"),
    # ---- scalars the C-ABI cannot hold -> ValueError naming them (not pybind's
    # "incompatible function arguments" or a bare OverflowError)
    ("sm_scale_huge_int", "flat", set_(sm_scale=10**400), ValueError, r"^sm_scale: int value out of the float range"),
    ("sm_scale_beyond_float32", "flat", set_(sm_scale=1e39), ValueError, r"^sm_scale: 1e\+39 is beyond the float32 range"),
    ("sm_scale_times_log2e_overflows", "flat", set_(sm_scale=3.0e38), ValueError, r"^sm_scale: 3e\+38 is beyond the float32 range"),
    ("num_splits_huge", "flat", set_(num_splits=2**40), ValueError, r"^num_splits: at most 65535"),
    ("num_splits_65536", "flat", set_(num_splits=65536), ValueError, r"^num_splits: at most 65535"),
    ("max_kv_len_beyond_int32", "flat", set_(max_q_len=4, max_kv_len=2**31), ValueError,
     r"^max_kv_len: must be <= 2\^31-1"),
    # ---- MLA value width: named head_dim_vo (no `out` was passed)
    ("mla_head_dim_vo_not_multiple_of_8", "mla", set_(head_dim_vo=100), ValueError,
     r"^head_dim_vo: 100 must be a multiple of 8"),
    # ---- 0 requests but rows in q (bounds passed: nothing is read on the host)
    ("qo_indptr_no_requests_with_rows", "flat",
     lambda a: a.update(qo_indptr=a["qo_indptr"][:1], kv_indptr=a["kv_indptr"][:1], max_q_len=4, max_kv_len=9),
     ValueError, r"^qo_indptr: shape \[1\] means 0 requests, but q has 6 rows"),
    # ---- outputs whose elements share memory
    ("out_expanded", "flat", lambda a: a.update(out=torch.empty(1, H, D, dtype=torch.bfloat16, device=a["q"].device)
                                                .expand(6, H, D)),
     ValueError, r"^out: strides \(0, 64, 1\) of shape \(6, 4, 64\) overlap in memory"),
    ("out_token_stride_inside_row", "flat",
     lambda a: a.update(out=torch.empty(6 * 128 + 256, dtype=torch.bfloat16, device=a["q"].device)
                        .as_strided((6, H, D), (128, D, 1))),
     ValueError, r"^out: strides \(128, 64, 1\) of shape \(6, 4, 64\) overlap"),
    ("lse_expanded", "flat", lambda a: a.update(lse=torch.empty(1, H, dtype=torch.float32, device=a["q"].device)
                                                .expand(6, H), return_lse=True),
     ValueError, r"^lse: strides \(0, 1\) of shape \(6, 4\) overlap in memory"),
    ("v_cache_none_small_head", "paged", set_(v_cache=None), ValueError, r"^v_cache: None selects MLA"),
    ("k_cache_5d", "paged", mut("k_cache", lambda t: t.unsqueeze(0)), ValueError, r"^k_cache: expected \[num_pages"),
    ("v_cache_pages", "paged", mut("v_cache", lambda t: t[:5]), ValueError, r"^v_cache: shape"),
    ("kv_indices_2d", "paged", mut("kv_indices", lambda t: t.reshape(1, -1)), ValueError, r"^kv_indices: expected a 1-D"),
    ("kv_indices_missing", "paged", set_(kv_indices=None), ValueError, r"^kv_indices: required"),
    ("kv_len_shape", "paged", mut("kv_len", lambda t: t[:1]), ValueError, r"^kv_len: expected shape \[2\]"),
    # ---- strides and alignment -> ValueError
    ("q_last_dim_strided", "flat", mut("q", lambda t: torch.cat([t, t], -1)[..., ::2]), ValueError,
     r"^q: the last dimension must be contiguous"),
    ("q_row_stride", "flat", mut("q", lambda t: row_stride(t, 4)), ValueError, r"^q: stride 260 of dim 0 must be a multiple of 8"),
    ("q_misaligned", "flat", mut("q", misaligned), ValueError, r"^q: data pointer must be 16-byte aligned"),
    ("k_misaligned", "flat", mut("k", misaligned), ValueError, r"^k: data pointer must be 16-byte aligned"),
    ("v_misaligned", "flat", mut("v", misaligned), ValueError, r"^v: data pointer must be 16-byte aligned"),
    ("k_cache_misaligned", "paged", mut("k_cache", misaligned), ValueError, r"^k_cache: data pointer"),
    ("out_row_stride", "flat", lambda a: a.update(out=row_stride(torch.zeros(6, H, D, dtype=torch.bfloat16, device=a["q"].device), 2)),
     ValueError, r"^out: stride 258 of dim 0"),
    ("head_dim_60", "flat", both(*(mut(n, lambda t: t[..., :60].contiguous()) for n in ("q", "k", "v"))),
     ValueError, r"^q: head_dim 60 must be a multiple of 8"),
    ("tree_mask_noncontig", "flat", mut("tree_mask", lambda t: torch.cat([t, t], 1)[:, ::2]), ValueError,
     r"^tree_mask: must be contiguous"),
    ("qo_indptr_noncontig", "flat", mut("qo_indptr", lambda t: torch.stack([t, t], 1)[:, 0]), ValueError,
     r"^qo_indptr: must be contiguous"),
    ("kv_indices_noncontig", "paged", mut("kv_indices", lambda t: torch.stack([t, t], 1)[:, 0]), ValueError,
     r"^kv_indices: must be contiguous"),
]

GPU_ONLY_CASES = [
    ("kv_indptr_on_cpu", "flat", mut("kv_indptr", lambda t: t.cpu()), ValueError, r"^kv_indptr: must be a CUDA tensor"),
    ("tree_mask_on_cpu", "flat", mut("tree_mask", lambda t: t.cpu()), ValueError, r"^tree_mask: must be a CUDA tensor"),
    ("k_cache_on_cpu", "paged", mut("k_cache", lambda t: t.cpu()), ValueError, r"^k_cache: must be a CUDA tensor"),
    ("out_on_cpu", "flat", lambda a: a.update(out=torch.empty(6, H, D, dtype=torch.bfloat16)), ValueError,
     r"^out: must be a CUDA tensor"),
]


def _call(layout, a):
    a = dict(a)
    if layout == "paged":
        return verify_attn.tree_attention_paged(
            a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), a.pop("qo_indptr"), a.pop("kv_indptr"),
            a.pop("kv_indices"), a.pop("kv_len"), **a)
    return verify_attn.tree_attention_flat(
        a.pop("q"), a.pop("k"), a.pop("v"), a.pop("qo_indptr"), a.pop("kv_indptr"), **a)


def _args(layout, device):
    return {"flat": flat_args, "paged": paged_args, "mla": mla_args}[layout](device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_validation_error(case, device):
    name, layout, mutate, exc, match = case
    a = _args(layout, device)
    mutate(a)
    with pytest.raises(exc, match=match):
        _call("flat" if layout == "mla" else layout, a)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", GPU_ONLY_CASES, ids=[c[0] for c in GPU_ONLY_CASES])
def test_validation_error_mixed_devices(case):
    name, layout, mutate, exc, match = case
    a = _args(layout, "cuda")
    mutate(a)
    with pytest.raises(exc, match=match):
        _call(layout, a)


@pytest.mark.parametrize("layout", ["flat", "paged", "mla"])
def test_valid_cpu_call_says_cuda_required(layout):
    """Valid in every other respect: the device check is the one that fires."""
    a = _args(layout, "cpu")
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor, got device cpu"):
        _call("flat" if layout == "mla" else layout, a)


@pytest.mark.parametrize("layout", ["flat", "paged"])
def test_valid_fp8_cpu_call_says_cuda_required(layout):
    """An fp8 cache with its scales passes every host check but the device's."""
    a = _args(layout, "cpu")
    _fp8(a)
    a.update(k_scale=0.25, v_scale=4.0)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor, got device cpu"):
        _call(layout, a)


def test_valid_cpu_call_with_out_and_lse_says_cuda_required():
    a = flat_args("cpu")
    a["out"] = torch.empty(6, H, D, dtype=torch.bfloat16)
    a["lse"] = torch.empty(6, H, dtype=torch.float32)
    a["return_lse"] = True
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_mla_prefix_view_of_k_accepted_as_value():
    """v = k[..., :512] (SGLang's MLA value view) passes validation like v=None."""
    a = mla_args("cpu")
    a["v"] = a["k"][..., :512]
    a["causal"] = True
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_numpy_and_tensor_scalars_accepted():
    """Integer-like (numpy ints, 0-d int tensors) and numpy floats/bools pass the scalar checks."""
    import numpy as np

    a = flat_args("cpu")
    a.update(max_q_len=np.int64(4), max_kv_len=torch.tensor(9), num_splits=np.int32(0),
             sm_scale=np.float32(0.125), return_lse=np.bool_(False))
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_max_q_len_below_a_request_is_refused_when_lengths_are_read():
    """max_kv_len omitted -> the index arrays are read on the host; a passed
    max_q_len smaller than a real q_len (4 here) is refused there."""
    a = flat_args("cpu")
    a.update(max_q_len=3)
    with pytest.raises(ValueError, match=r"^max_q_len: 3 is below request 1's q_len 4"):
        _call("flat", a)


def test_max_kv_len_below_a_request_is_refused_when_lengths_are_read():
    """max_q_len omitted -> the index arrays are read on the host; a passed
    max_kv_len smaller than a request's KV length (9 here) is refused there."""
    a = flat_args("cpu")
    a.update(max_kv_len=8)
    with pytest.raises(ValueError, match=r"^max_kv_len: 8 is below request 1's KV length 9 \(from kv_indptr\)"):
        _call("flat", a)
    p = paged_args("cpu")
    p.update(max_kv_len=3)
    with pytest.raises(ValueError, match=r"^max_kv_len: 3 is below request \d's KV length \d+ \(from kv_len\)"):
        _call("paged", p)


def test_a_slot_pool_of_partial_pages_is_refused():
    p = paged_args("cpu")
    slots = p["k_cache"].reshape(-1, HKV, D)  # 24 slots
    p.update(k_cache=slots[:23], v_cache=p["v_cache"].reshape(-1, HKV, D)[:23], page_size=4)
    with pytest.raises(ValueError, match=r"^k_cache: 23 slots are not a whole number of pages of page_size = 4"):
        _call("paged", p)


def test_a_request_past_1024_drafts_names_qo_indptr_when_max_q_len_is_not_passed():
    q = torch.randn(1100, H, D).to(torch.bfloat16)
    k = torch.randn(1200, HKV, D).to(torch.bfloat16)
    qo = torch.tensor([0, 1100], dtype=torch.int32)
    kv = torch.tensor([0, 1200], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^qo_indptr: request 0 has 1100 draft rows, more than 1024"):
        verify_attn.tree_attention_flat(q, k, k.clone(), qo, kv, causal=True)


def test_to_dense_rejects_non_int32_bits():
    qo = _qo()
    bits = masks.from_parents(torch.tensor([-1, 0, -1, 0, 1, 1], dtype=torch.int32), qo)
    with pytest.raises(TypeError, match=r"^bits: expected dtype torch.int32 or torch.uint32, got torch.float32"):
        masks.to_dense(bits.float(), qo)
    with pytest.raises(TypeError, match=r"^bits: expected dtype"):
        masks.to_dense(bits.long(), qo)
    assert [d.shape for d in masks.to_dense(bits, qo)] == [(2, 2), (4, 4)]


def test_from_parents_max_q_len_must_be_an_integer():
    with pytest.raises(TypeError, match=r"^max_q_len: expected an integer, got float"):
        masks.from_parents(torch.tensor([-1, 0], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32),
                           max_q_len=2.5)


def test_uint32_mask_accepted():
    if not hasattr(torch, "uint32"):
        pytest.skip("torch without uint32")
    a = flat_args("cpu")
    a["tree_mask"] = a["tree_mask"].view(torch.uint32)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_fake_tensor_shapes():
    """The ops' fake implementations give the right output shapes (what torch.compile sees)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = flat_args("cpu")
    with FakeTensorMode() as mode:
        fa = {n: mode.from_tensor(t) for n, t in a.items()}
        out, lse = verify_attn.tree_attention_flat(
            fa["q"], fa["k"], fa["v"], fa["qo_indptr"], fa["kv_indptr"], tree_mask=fa["tree_mask"],
            max_q_len=4, max_kv_len=9, return_lse=True)
        assert out.shape == (6, H, D) and out.dtype == torch.bfloat16
        assert lse.shape == (6, H) and lse.dtype == torch.float32
        m = mla_args("cpu")
        fm = {n: (mode.from_tensor(t) if isinstance(t, torch.Tensor) else t) for n, t in m.items()}
        out = verify_attn.tree_attention_flat(
            fm["q"], fm["k"], None, fm["qo_indptr"], fm["kv_indptr"], causal=True, max_q_len=4, max_kv_len=9)
        assert out.shape == (6, 16, 512)


def test_compile_fullgraph_traces_on_cpu():
    """torch.compile(fullgraph=True) traces the API (no graph break); the CPU run then
    reaches the op and fails with the device error."""
    a = flat_args("cpu")

    def fn(q, k, v, qo, kv, mask):
        out, lse = verify_attn.tree_attention_flat(
            q, k, v, qo, kv, tree_mask=mask, max_q_len=4, max_kv_len=9, return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"q: must be a CUDA tensor"):
        compiled(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["tree_mask"])


def test_compile_without_bounds_is_a_clear_error():
    a = flat_args("cpu")

    def fn(q, k, v, qo, kv, mask):
        return verify_attn.tree_attention_flat(q, k, v, qo, kv, tree_mask=mask)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"max_q_len: must be passed explicitly"):
        compiled(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], a["tree_mask"])


def test_plan_info_validates_like_the_launch():
    a = flat_args("cpu")
    with pytest.raises(ValueError, match=r"^page_size: only meaningful for the paged layout"):
        verify_attn.plan_info(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"],
                              tree_mask=a["tree_mask"], page_size=4)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        verify_attn.plan_info(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], tree_mask=a["tree_mask"])
    p = paged_args("cpu")
    with pytest.raises(TypeError, match=r"^kv_len: expected dtype"):
        verify_attn.plan_info(p["q"], p["k_cache"], p["v_cache"], p["qo_indptr"], p["kv_indptr"],
                              p["kv_indices"], p["kv_len"].long(), tree_mask=p["tree_mask"])


# ---------------------------------------------------------------------------
# new-user review: devices before dispatch, scalar kinds, the layout rule


@pytest.mark.parametrize("layout,name", [("flat", "tree_mask"), ("flat", "v"), ("flat", "kv_indptr"),
                                         ("paged", "kv_len"), ("paged", "kv_indices"), ("paged", "k_cache")])
def test_meta_tensor_among_cpu_tensors_is_refused_before_dispatch(layout, name):
    """One meta tensor would send the call to the ops' fake implementations
    (uninitialised out/lse, no error); the device check runs before dispatch."""
    a = _args(layout, "cpu")
    a[name] = a[name].to("meta")
    a.update(max_q_len=4, max_kv_len=9)
    with pytest.raises(ValueError, match=rf"^{name}: must be on q's device cpu, got meta"):
        _call(layout, a)


@pytest.mark.parametrize("name", ["out", "lse"])
def test_meta_out_or_lse_is_refused_before_dispatch(name):
    a = flat_args("cpu")
    a.update(max_q_len=4, max_kv_len=9, return_lse=True)
    a[name] = (torch.empty(6, H, D, dtype=torch.bfloat16) if name == "out"
               else torch.empty(6, H, dtype=torch.float32)).to("meta")
    with pytest.raises(ValueError, match=rf"^{name}: must be on q's device cpu, got meta"):
        _call("flat", a)


def test_empty_batch_without_rows_still_passes_validation():
    """0 requests and 0 rows is legitimate (nothing to compute): validation passes
    and the CPU call stops at the device check, as before."""
    a = flat_args("cpu")
    a.update(q=a["q"][:0], tree_mask=a["tree_mask"][:0], qo_indptr=a["qo_indptr"][:1],
             kv_indptr=a["kv_indptr"][:1], max_q_len=4, max_kv_len=9)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)
    a.update(max_q_len=None, max_kv_len=None)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_limits_of_scalars_are_accepted():
    a = flat_args("cpu")
    a.update(num_splits=65535, sm_scale=2.3e38, max_q_len=4, max_kv_len=2**31 - 1)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_non_overlapping_strided_out_accepted():
    """A head-major buffer viewed token-major (strides (D, T*D, 1)) does not overlap."""
    a = flat_args("cpu")
    a["out"] = torch.empty(H, 6, D, dtype=torch.bfloat16).transpose(0, 1)
    a["lse"] = torch.empty(H, 6, dtype=torch.float32).t()
    a["return_lse"] = True
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("flat", a)


def test_numpy_page_size_accepted():
    import numpy as np

    a = paged_args("cpu")
    a["page_size"] = np.int64(4)
    with pytest.raises(ValueError, match=r"^q: must be a CUDA tensor"):
        _call("paged", a)
    a = paged_args("cpu")
    a["page_size"] = np.int64(8)
    with pytest.raises(ValueError, match=r"^page_size: 8 does not match k_cache.shape\[1\] = 4"):
        _call("paged", a)


def _plan_info(a, kv_indices, kv_len):
    return verify_attn.plan_info(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"], kv_indices, kv_len,
                                 tree_mask=a["tree_mask"], max_q_len=4, max_kv_len=9)


def _plan(a, kv_indices, kv_len):
    return verify_attn.TreeAttentionPlan(a["qo_indptr"], a["kv_indptr"], kv_indices, kv_len,
                                         num_qo_heads=a["q"].shape[1], num_kv_heads=a["k"].shape[-2],
                                         head_dim_qk=a["q"].shape[-1], tree_mask=a["tree_mask"], max_q_len=4,
                                         max_kv_len=9)


@pytest.mark.parametrize("entry", [_plan_info, _plan], ids=["plan_info", "TreeAttentionPlan"])
def test_plan_info_and_plan_decide_paged_alike(entry):
    """kv_len without kv_indices selects the paged layout in both (then kv_indices
    is required) instead of plan_info silently planning a flat call."""
    a = flat_args("cpu")
    kv_len = torch.tensor([5, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^kv_indices: required for the paged layout"):
        entry(a, None, kv_len)
    with pytest.raises(ValueError, match=r"^kv_len: required for the paged layout"):
        entry(a, torch.arange(14, dtype=torch.int32), None)
    # Flat: the plan_info call names q, the plan (which takes no q) its first tensor.
    first = "q" if entry is _plan_info else "qo_indptr"
    with pytest.raises(ValueError, match=rf"^{first}: must be a CUDA tensor"):
        entry(a, None, None)
