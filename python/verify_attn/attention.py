"""Public attention API of verify_attn (torch tensors in, torch tensors out).

Semantics are exactly those of ``kernels/verify_attn.h``: request ``i`` has
``q_len_i = qo_indptr[i+1] - qo_indptr[i]`` draft (query) rows and ``kv_len_i``
KV rows; the LAST ``q_len_i`` KV rows are the draft tokens themselves, in query
row order, the first ``kv_len_i - q_len_i`` the committed prefix. Query row
``t`` sees every prefix row and the draft rows allowed by ``tree_mask`` (see
:mod:`verify_attn.masks`), or ``c <= t`` with ``causal=True``::

    out[t, h] = softmax(sm_scale * q[t, h] . k[j, hk]) @ v[j, hk]   over visible j
    lse[t, h] = natural-log log-sum-exp of the scaled logits (fp32)

with ``hk = h // (H / Hkv)``. The LSE is the natural log (FlashAttention and
FlashMLA convention), NOT FlashInfer's base 2: to merge with FlashInfer states
multiply by ``1 / ln 2``.

Index tensors follow FlashInfer's naming: ``qo_indptr`` ``[B+1]``; flat layout
``kv_indptr`` ``[B+1]`` (row offsets into ``k``/``v``); paged layout
``kv_indptr`` ``[B+1]`` (offsets into ``kv_indices``, in pages), ``kv_indices``
(page ids) and ``kv_len`` ``[B]`` (KV rows of each request, drafts included).

MLA (absorbed, DeepSeek-V3 / GLM style): pass ``v=None`` (``v_cache=None``); the
value is the first ``head_dim_vo`` (default 512) values of each K row, e.g. ``q``
``[T, H, 576]``, ``k`` ``[rows, 1, 576]``. A ``v`` that is a view of the first
columns of ``k`` (``k[..., :512]``, same storage and strides) is detected and
treated the same way. Default ``sm_scale`` is ``1 / sqrt(head_dim_qk)``
(``1/24`` for 576): DeepSeek models use ``1 / sqrt(192)`` times a YaRN factor,
so pass the model's own scale.

Host synchronization: ``max_q_len`` / ``max_kv_len`` (host upper bounds used to
plan the launch) are computed from the index tensors when not given, which
reads device memory (a device->host sync). Pass them explicitly for CUDA graph
capture and ``torch.compile(fullgraph=True)``; the launch itself never syncs.

Bad index data: when the bounds are computed on the host, the index arrays are
validated there too (``qo_indptr``/``kv_indptr`` non-decreasing and in range,
``kv_len_i >= q_len_i``, enough pages per request): ValueError naming the
argument and the request. Device-side data the host never reads (page ids in
``kv_indices``; all of it when the bounds are passed) is checked by the kernel:
an out-of-range index is never dereferenced, the request's output is invalid
(NaN), and the device's error word records it (page ids of KV tiles the kernel
does not read are not checked: draft tiles past every column a query-row tile
sees, and with more than 256 drafts on the sm_90a TMA kernel the ones in between
that it does not see); :func:`verify_attn.check_errors`
raises :class:`verify_attn.KernelInputError` naming the request and the index
(``verify_attn.set_debug(True)`` / ``VERIFY_ATTN_DEBUG=1``: after every call
and every ``TreeAttentionPlan.run()``, except while the current stream is
capturing a CUDA graph or ``torch.compile`` traces).
See :mod:`verify_attn.errors`.

Each launch goes through the torch custom ops ``verify_attn::tree_attention``
(functional, allocates ``out``/``lse``) and ``verify_attn::tree_attention_out``
(writes caller-provided ``out``/``lse``), both with fake (meta) implementations,
so ``torch.compile`` traces them and CUDA graphs capture them.

The compiled extension ``verify_attn._C`` is imported lazily, at the first
launch: importing this module, and all argument validation, work without it.
"""

import collections
import math
import threading
from typing import List, Optional, Tuple, Union

import torch

from . import errors as _errors
from ._args import as_bool, as_float, as_int
from ._checks import (
    check_kv_indptr,
    check_qo_indptr,
    check_tensor,
    check_tree_mask_dtype,
    check_tree_mask_shape,
)

__all__ = [
    "tree_attention_flat",
    "tree_attention_paged",
    "plan_info",
    "MAX_Q_LEN",
]

MAX_Q_LEN = 1024
MAX_NUM_SPLITS = 65535  # the C-ABI's bound on a forced split count (kernels/plan.cc)
_INT32_MAX = 2**31 - 1  # page_size, max_kv_len: int32 in the C-ABI (va_params)
_FLOAT32_MAX = 3.4028234663852886e38  # sm_scale: a float in the C-ABI
# ... and the kernels scale by sm_scale * log2(e), which must stay a finite float
# (the C-ABI refuses more: kernels/capi_attention.cc)
_SM_SCALE_MAX = _FLOAT32_MAX / math.log2(math.e)
_KV_FLAT = 0
_KV_PAGED = 1
# Paged, page_size 1, with the kv_slot_runs hint (a multiple of 64): the C-ABI's
# VA_KV_PAGED with va_params.kv_slot_runs set. A layout code of this module's
# custom ops only (their schema stays as it is).
_KV_PAGED_RUNS = 2


def _layout_code(paged: bool, kv_slot_runs, page_size: int) -> int:
    """The custom ops' layout code; checks ``kv_slot_runs`` (int >= 1; > 1 only with a
    paged cache of page_size 1)."""
    runs = as_int(kv_slot_runs, "kv_slot_runs")
    if runs < 1 or runs > _INT32_MAX:
        raise ValueError(f"kv_slot_runs: must be in [1, 2^31-1], got {runs}")
    if runs > 1 and (not paged or page_size != 1):
        raise ValueError(f"kv_slot_runs: only for a paged cache with page_size 1 (got "
                         f"{'page_size ' + str(page_size) if paged else 'a flat cache'})")
    if not paged:
        return _KV_FLAT
    return _KV_PAGED_RUNS if runs % 64 == 0 else _KV_PAGED

_FLOAT_DTYPES = (torch.float16, torch.bfloat16)
# The fp8 cache the kernels convert (OCP E4M3, C-ABI VA_KV_DTYPE_FP8_E4M3).
KV_FP8 = torch.float8_e4m3fn
_OTHER_FP8 = tuple(getattr(torch, n) for n in ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
                   if hasattr(torch, n))

TensorOrPair = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def _tuning_options(tuning):
    from .plan import tuning_options  # noqa: PLC0415 (plan imports this module)

    return tuning_options(tuning)


def _load_C():
    from . import _ext  # noqa: PLC0415

    return _ext.load()


def _is_paged(kv_indices, kv_len) -> bool:
    """The layout rule of :func:`plan_info` and :class:`verify_attn.TreeAttentionPlan`:
    paged when ``kv_indices`` or ``kv_len`` is given (then both are required), flat
    when both are None."""
    return kv_indices is not None or kv_len is not None


def _is_compiling() -> bool:
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if fn is None:  # torch < 2.3
        fn = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    return bool(fn()) if fn is not None else False


def _is_capturing() -> bool:
    # torch.cuda.is_available() reads the environment on every call (a few us
    # of a plan's run); once CUDA is initialized the capture query alone answers.
    try:
        if not torch.cuda.is_initialized() and not torch.cuda.is_available():
            return False
        return torch.cuda.is_current_stream_capturing()
    except Exception:  # pragma: no cover
        return False


# ---------------------------------------------------------------------------
# validation, part 1 (trace-safe: dtypes and shapes only; runs in the public
# functions, also under torch.compile)


def _check_dtypes(names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse):
    nk, nv = names
    check_tensor(q, "q")
    check_tensor(k, nk)
    check_tensor(v, nv, optional=True)
    check_tensor(qo_indptr, "qo_indptr")
    check_tensor(kv_indptr, "kv_indptr")
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q: expected dtype torch.float16 or torch.bfloat16, got {q.dtype}")
    if k.dtype in _OTHER_FP8:
        raise TypeError(f"{nk}: dtype {k.dtype} is not served; an fp8 cache must be torch.float8_e4m3fn")
    if k.dtype != q.dtype and k.dtype != KV_FP8:
        raise TypeError(f"{nk}: dtype {k.dtype} differs from q's {q.dtype} (the cache is q's dtype or "
                        f"torch.float8_e4m3fn)")
    if v is not None and v.dtype != k.dtype:
        raise TypeError(f"{nv}: dtype {v.dtype} differs from {nk}'s {k.dtype}")
    for t, n in ((qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"), (kv_len, "kv_len")):
        if t is None:
            continue
        check_tensor(t, n)
        if t.dtype != torch.int32:
            raise TypeError(f"{n}: expected dtype torch.int32, got {t.dtype}")
    if tree_mask is not None:
        check_tree_mask_dtype(tree_mask)
    if out is not None:
        check_tensor(out, "out")
        if out.dtype != q.dtype:
            raise TypeError(f"out: dtype {out.dtype} differs from q's {q.dtype}")
    if lse is not None:
        check_tensor(lse, "lse")
        if lse.dtype != torch.float32:
            raise TypeError(f"lse: expected dtype torch.float32, got {lse.dtype}")


def _check_kv_scales(k_name, kv_dtype, k_scale, v_scale):
    """k_scale / v_scale: Python numbers, finite and > 0; other than 1 only for an fp8 cache."""
    fp8 = kv_dtype == KV_FP8
    for x, n in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"{n}: expected a Python float, got {type(x).__name__}")
        if not math.isfinite(x) or not x > 0:
            raise ValueError(f"{n}: must be finite and > 0, got {x}")
        if not fp8 and x != 1:
            raise ValueError(f"{n}: only an fp8 cache (torch.float8_e4m3fn) takes a scale; {k_name} is {kv_dtype}")


def _check_mla_v_scale(k_scale, v_scale, unset=1.0):
    """MLA's cache holds K and V in one tensor (V its first columns), which
    k_scale scales: a v_scale other than ``unset`` must equal it."""
    if v_scale != unset and v_scale != k_scale:
        raise ValueError(f"v_scale: an MLA cache holds K and V in one tensor, which k_scale scales; v_scale "
                         f"must be left unset or equal k_scale (got v_scale {v_scale}, k_scale {k_scale})")


def _check_shapes(
    paged, names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size,
    tree_mask, causal, sm_scale, head_dim_vo, num_splits, out, lse,
):
    """Returns (page_size, head_dim_vo, sm_scale)."""
    nk, nv = names
    if q.dim() != 3:
        raise ValueError(f"q: expected shape [total_q, num_qo_heads, head_dim_qk], got {tuple(q.shape)}")
    total_q, H, d_qk = q.shape
    if H < 1:
        raise ValueError("q: num_qo_heads must be >= 1")
    if d_qk < 1:
        raise ValueError("q: head_dim_qk must be >= 1")
    if page_size is not None:
        page_size = as_int(page_size, "page_size")
        if page_size > _INT32_MAX:
            raise ValueError(f"page_size: must be <= 2^31-1 (an int32 in the C-ABI), got {page_size}")
    if paged:
        if k.dim() == 4:
            ps = k.shape[1]
            if page_size is not None and int(page_size) != ps:
                raise ValueError(f"page_size: {page_size} does not match {nk}.shape[1] = {ps}")
            if ps < 1:
                raise ValueError(f"{nk}: page_size (shape[1]) must be >= 1")
        elif k.dim() == 3:
            ps = 1 if page_size is None else int(page_size)
            if ps < 1:
                raise ValueError(f"page_size: must be >= 1, got {ps}")
            if k.shape[0] % ps != 0:  # the kernels see whole pages of ps consecutive slots
                raise ValueError(f"{nk}: {k.shape[0]} slots are not a whole number of pages of "
                                 f"page_size = {ps}")
        else:
            raise ValueError(
                f"{nk}: expected [num_pages, page_size, num_kv_heads, head_dim] or "
                f"[slots, num_kv_heads, head_dim], got {tuple(k.shape)}"
            )
    else:
        if page_size is not None:
            raise ValueError("page_size: only meaningful for the paged layout")
        if k.dim() != 3:
            raise ValueError(f"{nk}: expected shape [rows, num_kv_heads, head_dim_qk], got {tuple(k.shape)}")
        ps = 1
    Hkv = k.shape[-2]
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"{nk}: num_kv_heads {Hkv} must be >= 1 and divide num_qo_heads {H}")
    if k.shape[-1] != d_qk:
        raise ValueError(f"{nk}: head_dim {k.shape[-1]} differs from q's head_dim_qk {d_qk}")
    if v is None:
        if head_dim_vo is None and d_qk < 512:
            raise ValueError(
                f"{nv}: None selects MLA (the value is the first head_dim_vo = 512 values of the "
                f"K row), but head_dim_qk is {d_qk}; pass {nv} for MHA/GQA"
            )
        d_vo = 512 if head_dim_vo is None else as_int(head_dim_vo, "head_dim_vo")
        if d_vo < 1 or d_vo > d_qk:
            raise ValueError(
                f"head_dim_vo: {d_vo} must be in [1, head_dim_qk={d_qk}] when {nv} is None "
                f"(MLA: the value is the first head_dim_vo values of the K row)"
            )
        if d_vo % 8 != 0:
            raise ValueError(
                f"head_dim_vo: {d_vo} must be a multiple of 8 (the value and output rows are 16-byte vectors)"
            )
    else:
        if v.dim() != k.dim() or tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
            raise ValueError(
                f"{nv}: shape {tuple(v.shape)} must match {nk}'s {tuple(k.shape)} in every dim but the last"
            )
        d_vo = v.shape[-1]
        if head_dim_vo is not None and as_int(head_dim_vo, "head_dim_vo") != d_vo:
            raise ValueError(f"head_dim_vo: {head_dim_vo} differs from {nv}.shape[-1] = {d_vo}")
        if d_vo < 1:
            raise ValueError(f"{nv}: head_dim must be >= 1")
    if qo_indptr.dim() != 1 or qo_indptr.shape[0] < 1:
        raise ValueError(f"qo_indptr: expected shape [batch_size + 1], got {tuple(qo_indptr.shape)}")
    B = qo_indptr.shape[0] - 1
    if B == 0 and total_q > 0:
        # Known from the shapes alone (no host read): q's rows must be qo_indptr[-1],
        # and a batch of 0 requests has 0 rows.
        raise ValueError(
            f"qo_indptr: shape [1] means 0 requests, but q has {total_q} rows; the rows of q must "
            f"equal qo_indptr[-1] (0 requests need q.shape[0] == 0)"
        )
    if kv_indptr.dim() != 1 or kv_indptr.shape[0] != B + 1:
        raise ValueError(
            f"kv_indptr: expected shape [{B + 1}] (batch_size + 1, like qo_indptr), got {tuple(kv_indptr.shape)}"
        )
    if paged:
        if kv_indices is None:
            raise ValueError("kv_indices: required for the paged layout")
        if kv_len is None:
            raise ValueError("kv_len: required for the paged layout")
        if kv_indices.dim() != 1:
            raise ValueError(f"kv_indices: expected a 1-D tensor of page ids, got {tuple(kv_indices.shape)}")
        if kv_len.dim() != 1 or kv_len.shape[0] != B:
            raise ValueError(f"kv_len: expected shape [{B}] (batch_size), got {tuple(kv_len.shape)}")
    if (tree_mask is None) == (not causal):
        raise ValueError(
            "tree_mask: pass exactly one of tree_mask (a [total_q, W] bit mask) and causal=True"
            + (" (both were given)" if causal else " (neither was given)")
        )
    if tree_mask is not None:
        check_tree_mask_shape(tree_mask, total_q)
    if sm_scale is None:
        scale = 1.0 / math.sqrt(d_qk)
    else:
        scale = as_float(sm_scale, "sm_scale")
        if not (math.isfinite(scale) and scale > 0.0):
            raise ValueError(f"sm_scale: must be finite and > 0, got {sm_scale}")
        if scale > _SM_SCALE_MAX:
            raise ValueError(
                f"sm_scale: {sm_scale} is beyond the float32 range once scaled by log2(e) "
                f"(at most {_SM_SCALE_MAX:.6g}: the kernels use sm_scale * log2(e) as a float)")
    splits = as_int(num_splits, "num_splits")
    if splits < 0:
        raise ValueError(f"num_splits: must be >= 0 (0 = automatic), got {num_splits}")
    if splits > MAX_NUM_SPLITS:
        raise ValueError(f"num_splits: at most {MAX_NUM_SPLITS} (a forced split-K count), got {num_splits}")
    if out is not None and tuple(out.shape) != (total_q, H, d_vo):
        raise ValueError(f"out: expected shape {(total_q, H, d_vo)}, got {tuple(out.shape)}")
    if lse is not None and tuple(lse.shape) != (total_q, H):
        raise ValueError(f"lse: expected shape {(total_q, H)}, got {tuple(lse.shape)}")
    return ps, d_vo, scale


def _check_same_device(names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse):
    """Every tensor on q's device, checked before the custom op is dispatched.

    torch dispatches on the devices of all tensor arguments: one meta tensor among
    CPU/CUDA ones would route the call to the ops' fake implementations, which
    return uninitialised outputs without running any check. Devices only (trace
    safe): under torch.compile every argument is a FakeTensor on the traced
    device, so this passes there.
    """
    nk, nv = names
    cuda = q.device.type == "cuda"
    for t, n in ((k, nk), (v, nv), (qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"),
                 (kv_indices, "kv_indices"), (kv_len, "kv_len"), (tree_mask, "tree_mask"),
                 (out, "out"), (lse, "lse")):
        if t is None or t.device == q.device:
            continue
        if cuda and t.device.type != "cuda":
            raise ValueError(f"{n}: must be a CUDA tensor, got device {t.device}")
        raise ValueError(f"{n}: must be on q's device {q.device}, got {t.device}")


def _host_lists(tensors):
    """``tolist()`` of several small int32 tensors with one device->host copy when
    they share a device (else one each: the device check reports the mix later)."""
    live = [t for t in tensors if t is not None]
    if live and all(t.device == live[0].device for t in live) and all(t.dim() == 1 for t in live):
        flat = torch.cat([t.reshape(-1) for t in live]).tolist()
        out, i = [], 0
        for t in tensors:
            if t is None:
                out.append(None)
            else:
                n = t.shape[0]
                out.append(flat[i:i + n])
                i += n
        return out
    return [None if t is None else t.tolist() for t in tensors]


def _validate_host_lengths(paged, q, qo, kv, kvl, kv_capacity, page_size):
    """Host-side validation of the index arrays (already on the host).

    qo_indptr: starts at 0, non-decreasing, ends at q.shape[0]; kv_indptr:
    starts >= 0, non-decreasing, ends within the KV rows (flat) or kv_indices
    (paged); kv_len_i >= q_len_i, and (paged) kv_len_i >= 0 fits the request's
    pages. Raises ValueError naming the argument and the request.
    """
    B = len(qo) - 1
    check_qo_indptr(qo, q.shape[0])
    check_kv_indptr(kv, kv_capacity, "entries of kv_indices" if paged else "rows of k")
    for i in range(B):
        q_len = qo[i + 1] - qo[i]
        if paged:
            n = kvl[i]
            if n < q_len:
                raise ValueError(
                    f"kv_len: request {i} has kv_len {n} < q_len {q_len} "
                    f"(kv_len counts the prefix and the draft tokens)"
                )
            pages = kv[i + 1] - kv[i]
            if (n + page_size - 1) // page_size > pages:
                raise ValueError(
                    f"kv_len: request {i} has kv_len {n}, which needs {(n + page_size - 1) // page_size} "
                    f"pages of {page_size}, but kv_indptr gives it {pages}"
                )
        else:
            n = kv[i + 1] - kv[i]
            if n < q_len:
                raise ValueError(
                    f"kv_indptr: request {i} has {n} KV rows (kv_indptr[{i + 1}] - kv_indptr[{i}]) "
                    f"< q_len {q_len} (the KV rows include the draft tokens)"
                )


def _resolve_bounds(paged, q, qo_indptr, kv_indptr, kv_len, max_q_len, max_kv_len, tree_mask,
                    kv_capacity=None, page_size=1):
    """Host bounds max_q_len / max_kv_len (computed with a host sync when None).

    When either is computed, the index arrays are read to the host anyway (one
    copy) and also validated there (:func:`_validate_host_lengths`); when both
    are passed nothing is read and the kernels flag bad device data instead
    (:func:`verify_attn.check_errors`).
    """
    need_q = max_q_len is None
    need_kv = max_kv_len is None
    if need_q or need_kv:
        # _is_compiling() first: dynamo cannot trace is_current_stream_capturing.
        if _is_compiling() or _is_capturing():
            missing = "max_q_len" if need_q else "max_kv_len"
            raise ValueError(
                f"{missing}: must be passed explicitly during CUDA graph capture and under torch.compile "
                "(computing it reads the index tensors on the host)"
            )
        qo, kv, kvl = _host_lists([qo_indptr, kv_indptr, kv_len if paged else None])
        _validate_host_lengths(paged, q, qo, kv, kvl, kv_capacity, page_size)
    if need_q:
        max_q_len = max([0] + [qo[i + 1] - qo[i] for i in range(len(qo) - 1)])
    if need_kv:
        if paged:
            max_kv_len = max([0] + [int(x) for x in kvl])
        else:
            max_kv_len = max([0] + [kv[i + 1] - kv[i] for i in range(len(kv) - 1)])
    max_q_len = as_int(max_q_len, "max_q_len")
    max_kv_len = as_int(max_kv_len, "max_kv_len")
    if need_q and max_q_len > MAX_Q_LEN:  # computed from qo_indptr: name what the caller passed
        worst = max(range(len(qo) - 1), key=lambda i: qo[i + 1] - qo[i])
        raise ValueError(f"qo_indptr: request {worst} has {max_q_len} draft rows, more than {MAX_Q_LEN}")
    if max_q_len < 0 or max_q_len > MAX_Q_LEN:
        raise ValueError(f"max_q_len: must be in [0, {MAX_Q_LEN}], got {max_q_len}")
    if max_q_len < 1 and q.shape[0] > 0:
        raise ValueError(f"max_q_len: must be >= 1 when there are query rows (q.shape[0] = {q.shape[0]})")
    if need_kv and not need_q:
        # The lists are on the host anyway: a passed max_q_len below a request's
        # q_len (whose extra rows the launch would skip, flagging QO_INDPTR on
        # the device) is refused here instead.
        q_lens = [qo[i + 1] - qo[i] for i in range(len(qo) - 1)]
        worst = max(range(len(q_lens)), key=q_lens.__getitem__, default=None)
        if worst is not None and q_lens[worst] > max_q_len:
            raise ValueError(
                f"max_q_len: {max_q_len} is below request {worst}'s q_len {q_lens[worst]} (from qo_indptr)"
            )
    if max_kv_len < 0:
        raise ValueError(f"max_kv_len: must be >= 0, got {max_kv_len}")
    if need_q and not need_kv:
        # The lists are on the host anyway: a passed max_kv_len below a
        # request's KV length (an upper bound the split-K plan relies on) is
        # refused here, as max_q_len is above.
        kv_lens = [int(x) for x in kvl] if paged else [kv[i + 1] - kv[i] for i in range(len(kv) - 1)]
        worst = max(range(len(kv_lens)), key=kv_lens.__getitem__, default=None)
        if worst is not None and kv_lens[worst] > max_kv_len:
            src = "kv_len" if paged else "kv_indptr"
            raise ValueError(
                f"max_kv_len: {max_kv_len} is below request {worst}'s KV length {kv_lens[worst]} (from {src})"
            )
    if max_kv_len > _INT32_MAX:
        raise ValueError(f"max_kv_len: must be <= 2^31-1 (KV lengths are int32), got {max_kv_len}")
    if tree_mask is not None and tree_mask.shape[1] * 32 < max_q_len:
        raise ValueError(
            f"tree_mask: {tree_mask.shape[1]} words per row hold {tree_mask.shape[1] * 32} draft tokens, "
            f"but max_q_len is {max_q_len} (needs >= {(max_q_len + 31) // 32} words)"
        )
    return max_q_len, max_kv_len


# ---------------------------------------------------------------------------
# validation, part 2 (needs real tensors: strides, alignment, devices; runs
# inside the custom op's implementation)


def _names(kv_layout: int):
    return ("k_cache", "v_cache") if kv_layout != _KV_FLAT else ("k", "v")


def _v_is_k_prefix_view(k: torch.Tensor, v: torch.Tensor) -> bool:
    return (
        v.data_ptr() == k.data_ptr()
        and v.device == k.device
        and v.shape[-1] < k.shape[-1]
        and tuple(v.shape[:-1]) == tuple(k.shape[:-1])
        and all(v.stride(d) == k.stride(d) for d in range(k.dim() - 1) if k.shape[d] > 1)
    )


def _check_rows(t: torch.Tensor, name: str) -> None:
    """Last dim contiguous, row strides multiples of 16 bytes (8 elements; 16 for an fp8 cache), 16-byte aligned."""
    per16 = 16 // t.element_size()
    if t.shape[-1] % per16 != 0:
        raise ValueError(
            f"{name}: head_dim {t.shape[-1]} must be a multiple of {per16} (rows of 16-byte vectors)"
        )
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")
    for d in range(t.dim() - 1):
        if t.shape[d] > 1 and t.stride(d) % per16 != 0:
            raise ValueError(
                f"{name}: stride {t.stride(d)} of dim {d} must be a multiple of {per16} elements (16 bytes); "
                f"strides {tuple(t.stride())}"
            )
    if t.numel() and t.data_ptr() % 16 != 0:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned (got address % 16 = {t.data_ptr() % 16})")


def _check_no_overlap(t: torch.Tensor, name: str) -> None:
    """An output written by the kernel must not map two of its elements to one
    address (an ``expand``-ed or ``as_strided`` view with stride 0, or a stride
    smaller than the extent of the dims inside it)."""
    extent = 0  # largest offset reached by the dims with smaller strides
    for st, n in sorted((t.stride(d), t.shape[d]) for d in range(t.dim()) if t.shape[d] > 1):
        if st <= extent:
            raise ValueError(
                f"{name}: strides {tuple(t.stride())} of shape {tuple(t.shape)} overlap in memory "
                f"(each stride, in increasing order, must exceed the extent of the smaller ones); "
                f"an output needs one address per element"
            )
        extent += st * (n - 1)


def _check_contig(t: Optional[torch.Tensor], name: str) -> None:
    if t is not None and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


def _check_strides(kv_layout, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse):
    nk, nv = _names(kv_layout)
    _check_rows(q, "q")
    _check_rows(k, nk)
    if v is not None and not _v_is_k_prefix_view(k, v):
        _check_rows(v, nv)
    if out is not None:
        _check_rows(out, "out")
        _check_no_overlap(out, "out")
    if lse is not None:
        _check_no_overlap(lse, "lse")
    for t, n in ((qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"),
                 (kv_len, "kv_len"), (tree_mask, "tree_mask")):
        _check_contig(t, n)


def _check_devices(kv_layout, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse):
    nk, nv = _names(kv_layout)
    if q.device.type != "cuda":
        raise ValueError(f"q: must be a CUDA tensor, got device {q.device}")
    for t, n in ((k, nk), (v, nv), (qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"),
                 (kv_indices, "kv_indices"), (kv_len, "kv_len"), (tree_mask, "tree_mask"),
                 (out, "out"), (lse, "lse")):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"{n}: must be a CUDA tensor, got device {t.device}")
        if t.device != q.device:
            raise ValueError(f"{n}: must be on q's device {q.device}, got {t.device}")


# ---------------------------------------------------------------------------
# params and launch


def _st(t: torch.Tensor, d: int) -> int:
    """Stride of dim d; for a size-1 dim (stride irrelevant) the contiguous stride."""
    if t.shape[d] > 1:
        return int(t.stride(d))
    s = 1
    for e in range(d + 1, t.dim()):
        s *= int(t.shape[e])
    return s


def _build_params(
    _C, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
    causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse, overrides=None,
    k_scale=1.0, v_scale=1.0,
):
    """The call's ``va_params`` (``_C.Params``), set in one ``Params.set`` call
    (one binding crossing instead of one per field); ``overrides``: a dict of
    fields to set instead of the computed ones."""
    f = {}
    f["dtype"] = _C.DTYPE_BF16 if q.dtype == torch.bfloat16 else _C.DTYPE_FP16
    paged = kv_layout != _KV_FLAT
    f["kv_layout"] = _C.KV_PAGED if paged else _C.KV_FLAT
    f["kv_slot_runs"] = 64 if kv_layout == _KV_PAGED_RUNS else 0
    f["mask_mode"] = _C.MASK_CAUSAL if causal else _C.MASK_TREE
    f["batch_size"] = qo_indptr.shape[0] - 1
    f["total_q"] = q.shape[0]
    f["max_q_len"] = int(max_q_len)
    f["max_kv_len"] = int(max_kv_len)
    f["num_qo_heads"] = q.shape[1]
    f["head_dim_qk"] = q.shape[2]
    f["head_dim_vo"] = int(head_dim_vo)
    f["sm_scale"] = float(sm_scale)
    if k.dtype == KV_FP8:  # else the defaults: the cache in q's dtype, scales 1
        f["kv_dtype"] = _C.KV_DTYPE_FP8_E4M3
        f["k_scale"] = float(k_scale)
        f["v_scale"] = float(v_scale)

    f["q"] = q.data_ptr()
    f["q_stride_token"] = _st(q, 0)
    f["q_stride_head"] = _st(q, 1)

    mla = v is None or _v_is_k_prefix_view(k, v)
    vv = k if mla else v
    f["v_is_k_prefix"] = 1 if mla else 0
    if paged:
        if k.dim() == 4:
            f["num_kv_heads"] = k.shape[2]
            f["page_size"] = k.shape[1]
            f["num_pages"] = k.shape[0]
            f["k_stride_page"], f["k_stride_token"], f["k_stride_head"] = _st(k, 0), _st(k, 1), _st(k, 2)
            f["v_stride_page"], f["v_stride_token"], f["v_stride_head"] = _st(vv, 0), _st(vv, 1), _st(vv, 2)
        else:  # [slots, Hkv, D] viewed as pages of page_size consecutive slots
            ps = int(page_size)
            f["num_kv_heads"] = k.shape[1]
            f["page_size"] = ps
            f["num_pages"] = k.shape[0] // ps
            f["k_stride_page"], f["k_stride_token"], f["k_stride_head"] = ps * _st(k, 0), _st(k, 0), _st(k, 1)
            f["v_stride_page"], f["v_stride_token"], f["v_stride_head"] = ps * _st(vv, 0), _st(vv, 0), _st(vv, 1)
        f["kv_indices"] = kv_indices.data_ptr()
        f["kv_len"] = kv_len.data_ptr()
    else:
        f["num_kv_heads"] = k.shape[1]
        f["num_kv_rows"] = k.shape[0]
        f["k_stride_page"], f["k_stride_token"], f["k_stride_head"] = 0, _st(k, 0), _st(k, 1)
        f["v_stride_page"], f["v_stride_token"], f["v_stride_head"] = 0, _st(vv, 0), _st(vv, 1)
    f["k"] = k.data_ptr()
    f["v"] = vv.data_ptr()

    f["out"] = out.data_ptr()
    f["out_stride_token"] = _st(out, 0)
    f["out_stride_head"] = _st(out, 1)
    if lse is not None and lse.numel() > 0:
        f["lse"] = lse.data_ptr()
        f["lse_stride_token"] = _st(lse, 0)
        f["lse_stride_head"] = _st(lse, 1)
    else:
        f["lse"] = 0

    f["qo_indptr"] = qo_indptr.data_ptr()
    f["kv_indptr"] = kv_indptr.data_ptr()
    if tree_mask is not None and not causal:
        f["tree_mask"] = tree_mask.data_ptr()
        f["mask_words"] = tree_mask.shape[1]
    else:
        f["tree_mask"] = 0
        f["mask_words"] = 0
    f["num_splits"] = int(num_splits)
    f["error_word"] = 0  # set by _launch (the device's error buffer, see errors.py)
    if overrides is None or "stream" not in overrides:
        f["stream"] = torch.cuda.current_stream(q.device).cuda_stream
    if overrides:
        f.update(overrides)
    p = _C.Params()
    p.set(**f)
    return p


def _launch(
    q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
    causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse, options,
    k_scale=1.0, v_scale=1.0,
) -> None:
    tensors = (q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse)
    _check_strides(kv_layout, *tensors)
    _check_devices(kv_layout, *tensors)
    if q.shape[0] == 0 or qo_indptr.shape[0] <= 1:
        return  # nothing to compute
    _C = _load_C()
    with torch.cuda.device(q.device):
        p = _build_params(
            _C, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
            causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse,
            k_scale=k_scale, v_scale=v_scale,
        )
        # The device's error buffer (allocated once, outside graph capture):
        # the kernel records bad device-side indices/lengths there, no host sync.
        p.error_word = _errors.error_word_ptr(q.device)
        plan = _C.Plan(p, *options)  # one plan: validation, kernel, splits, workspace
        ws_bytes = int(plan.info()["workspace_bytes"])
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=q.device) if ws_bytes > 0 else None
        plan.run(p.q, p.k, p.v, p.out, p.lse, 0 if ws is None else ws.data_ptr(), ws_bytes, p.stream)
        # ws is released to the caching allocator after the launch was enqueued on
        # the current stream; stream-ordered reuse keeps this safe.
    if _errors.debug_enabled() and not _is_compiling() and not _is_capturing():
        _errors.check_errors(q.device)  # debug mode: one host sync per call


# ---------------------------------------------------------------------------
# custom ops


@torch.library.custom_op("verify_attn::tree_attention", mutates_args=())
def _tree_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: Optional[torch.Tensor],
    kv_len: Optional[torch.Tensor],
    tree_mask: Optional[torch.Tensor],
    kv_layout: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    head_dim_vo: int,
    max_q_len: int,
    max_kv_len: int,
    num_splits: int,
    return_lse: bool,
    tuning_config: str,
    tuning_flags: List[int],
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    total_q, H = q.shape[0], q.shape[1]
    out = torch.empty((total_q, H, head_dim_vo), dtype=q.dtype, device=q.device)
    lse = torch.empty((total_q, H) if return_lse else (0,), dtype=torch.float32, device=q.device)
    _launch(
        q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
        causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out,
        lse if return_lse else None, (tuning_config, *tuning_flags), k_scale, v_scale,
    )
    return out, lse


@_tree_attention_op.register_fake
def _tree_attention_fake(
    q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
    causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, return_lse,
    tuning_config, tuning_flags, k_scale=1.0, v_scale=1.0,
):
    total_q, H = q.shape[0], q.shape[1]
    out = q.new_empty((total_q, H, head_dim_vo))
    lse = q.new_empty((total_q, H) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("verify_attn::tree_attention_out", mutates_args=("out", "lse"))
def _tree_attention_out_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: Optional[torch.Tensor],
    kv_len: Optional[torch.Tensor],
    tree_mask: Optional[torch.Tensor],
    kv_layout: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    head_dim_vo: int,
    max_q_len: int,
    max_kv_len: int,
    num_splits: int,
    out: torch.Tensor,
    lse: torch.Tensor,
    tuning_config: str,
    tuning_flags: List[int],
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """``lse`` with zero elements means: do not write an LSE."""
    _launch(
        q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
        causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out,
        lse if lse.numel() > 0 else None, (tuning_config, *tuning_flags), k_scale, v_scale,
    )


@_tree_attention_out_op.register_fake
def _tree_attention_out_fake(
    q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, kv_layout, page_size,
    causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse,
    tuning_config, tuning_flags, k_scale=1.0, v_scale=1.0,
):
    return None


# ---------------------------------------------------------------------------
# public API


def _prepare(paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
             causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse, k_scale=1.0, v_scale=1.0):
    names = ("k_cache", "v_cache") if paged else ("k", "v")
    causal = as_bool(causal, "causal")
    _check_dtypes(names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse)
    _check_kv_scales(names[0], k.dtype, k_scale, v_scale)
    ps, d_vo, scale = _check_shapes(
        paged, names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size,
        tree_mask, causal, sm_scale, head_dim_vo, num_splits, out, lse,
    )
    if d_vo != k.shape[-1]:  # MLA: the value is a prefix of the key
        _check_mla_v_scale(k_scale, v_scale)
    _check_same_device(names, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse)
    cap = (kv_indices.shape[0] if kv_indices is not None and kv_indices.dim() == 1 else None) if paged \
        else k.shape[0]
    mq, mkv = _resolve_bounds(paged, q, qo_indptr, kv_indptr, kv_len, max_q_len, max_kv_len, tree_mask,
                              kv_capacity=cap, page_size=ps)
    return ps, d_vo, scale, mq, mkv


# Eager one-shot calls reuse a TreeAttentionPlan per batch (verify_attn.plan): a
# model that calls the one-shot function once per layer with one batch's tensors
# plans once, as it would with a plan of its own. The key is everything a plan
# and its validation depend on: the exact scalar arguments (with their types,
# so that a call a check would refuse never hits), the batch tensors' addresses
# and layouts (a plan binds their addresses), the per-layer tensors' layouts and
# 16-byte alignment. A miss validates in full first. Least recently used first
# out; each entry holds its batch tensors and its workspace.
_ONESHOT_PLANS: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_ONESHOT_PLANS_MAX = 16
_ONESHOT_LOCK = threading.Lock()


def _tkey(t, bound: bool):
    if not isinstance(t, torch.Tensor):
        return (type(t), t) if t is None else (type(t), id(t))
    if bound:
        return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)
    return (t.data_ptr() % 16, t.shape, t.stride(), t.dtype, t.device)


def _oneshot_key(paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask, causal,
                 sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse, num_splits, out, lse,
                 kv_slot_runs, tuning, k_scale=1.0, v_scale=1.0):
    scalars = (page_size, causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse, num_splits,
               kv_slot_runs, k_scale, v_scale)
    if any(isinstance(x, torch.Tensor) for x in scalars) or not isinstance(k, torch.Tensor):
        return None  # a tensor's value can change in place: validate every call
    # The tuning's validated fields (Tuning compares 1 equal to True).
    return (paged, tuple((type(x), x) for x in scalars), _tuning_options(tuning),
            _tkey(q, False), _tkey(k, False), _tkey(v, False), _tkey(out, False), _tkey(lse, False),
            isinstance(v, torch.Tensor) and v.data_ptr() == k.data_ptr(),
            _tkey(qo_indptr, True), _tkey(kv_indptr, True), _tkey(kv_indices, True), _tkey(kv_len, True),
            _tkey(tree_mask, True))


def _run_planned(plan, q, k, v, out, lse, return_lse):
    got = plan.run(q, k, v, out=out, lse=lse, return_lse=return_lse)
    if lse is not None and not return_lse:
        return got[0]
    return got


def _run(paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask, causal,
         sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse, num_splits, out, lse,
         kv_slot_runs=1, tuning=None, k_scale=1.0, v_scale=1.0):
    key = None
    if (max_q_len is not None and max_kv_len is not None and isinstance(q, torch.Tensor)
            and q.is_cuda and not _is_compiling()):
        try:
            key = _oneshot_key(paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
                               causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse, num_splits,
                               out, lse, kv_slot_runs, tuning, k_scale, v_scale)
            with _ONESHOT_LOCK:
                plan = None if key is None else _ONESHOT_PLANS.get(key)
                if plan is not None:
                    _ONESHOT_PLANS.move_to_end(key)
        except (TypeError, ValueError):  # an unhashable or bad argument: the checks below name it
            key = plan = None
        if plan is not None:
            return _run_planned(plan, q, k, v, out, lse, return_lse)
    ps, d_vo, scale, mq, mkv = _prepare(
        paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
        causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, out, lse, k_scale, v_scale,
    )
    layout = _layout_code(paged, kv_slot_runs, ps)
    causal = bool(causal)  # checked by _prepare
    k_scale, v_scale = float(k_scale), float(v_scale)
    return_lse = as_bool(return_lse, "return_lse")
    config, *flags = _tuning_options(tuning)
    if key is not None and q.shape[0] > 0 and qo_indptr.shape[0] > 1:
        # The plan's first run checks strides and devices (_check_strides,
        # _check_devices, with these same tensors and messages).
        from .plan import TreeAttentionPlan  # noqa: PLC0415 (plan imports this module)

        mla = v is None or _v_is_k_prefix_view(k, v)
        plan = TreeAttentionPlan(
            qo_indptr, kv_indptr, kv_indices, kv_len, num_qo_heads=q.shape[1], num_kv_heads=k.shape[-2],
            head_dim_qk=q.shape[-1], head_dim_vo=d_vo if mla else None, page_size=page_size if paged else None,
            tree_mask=tree_mask, causal=causal, sm_scale=scale, dtype=q.dtype, max_q_len=mq, max_kv_len=mkv,
            num_splits=num_splits, kv_slot_runs=kv_slot_runs, tuning=tuning, kv_dtype=k.dtype,
            k_scale=k_scale, v_scale=v_scale)
        got = _run_planned(plan, q, k, v, out, lse, return_lse)
        if _is_capturing():
            return got  # planned inside a capture (no error buffer may exist yet): not kept
        with _ONESHOT_LOCK:
            _ONESHOT_PLANS[key] = plan
            while len(_ONESHOT_PLANS) > _ONESHOT_PLANS_MAX:
                _ONESHOT_PLANS.popitem(last=False)
        return got
    if out is None and lse is None:
        o, l = torch.ops.verify_attn.tree_attention(
            q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, layout, ps,
            causal, scale, d_vo, mq, mkv, int(num_splits), bool(return_lse), config, flags, k_scale, v_scale,
        )
        return (o, l) if return_lse else o
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1], d_vo), dtype=q.dtype, device=q.device)
    if lse is None and return_lse:
        lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
    lse_arg = lse if lse is not None else torch.empty((0,), dtype=torch.float32, device=q.device)
    torch.ops.verify_attn.tree_attention_out(
        q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, layout, ps,
        causal, scale, d_vo, mq, mkv, int(num_splits), out, lse_arg, config, flags, k_scale, v_scale,
    )
    return (out, lse) if return_lse else out


def tree_attention_flat(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    tree_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    sm_scale: Optional[float] = None,
    head_dim_vo: Optional[int] = None,
    max_q_len: Optional[int] = None,
    max_kv_len: Optional[int] = None,
    return_lse: bool = False,
    num_splits: int = 0,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    tuning=None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> TensorOrPair:
    """Tree-verify attention over a flat (request-contiguous) KV layout.

    Args:
      q: ``[total_q, H, D_qk]`` fp16/bf16 CUDA tensor; rows ``qo_indptr[i] ..
        qo_indptr[i+1]`` are request ``i``'s draft tokens.
      k: ``[rows, Hkv, D_qk]``, q's dtype or ``torch.float8_e4m3fn`` (an fp8
        cache holding ``K / k_scale``: GQA / MHA with ``D`` 64 or 128, and MLA,
        docs/design_fp8.md); KV row ``j`` of request ``i`` is
        ``k[kv_indptr[i] + j]``; the last ``q_len_i`` rows of each request are its
        drafts (in query order). ``H % Hkv == 0``.
      v: ``[rows, Hkv, D_vo]`` of k's dtype (fp8: holding ``V / v_scale``), or
        None for MLA (value = ``k[..., :head_dim_vo]``).
      qo_indptr: ``[B + 1]`` int32 (``total_q = qo_indptr[B] = q.shape[0]``).
      kv_indptr: ``[B + 1]`` int32 row offsets into ``k``/``v``;
        ``kv_len_i = kv_indptr[i+1] - kv_indptr[i] >= q_len_i``.
      tree_mask: int32 (bit pattern) or uint32 ``[total_q, W]``, contiguous,
        ``W >= ceil(max_q_len / 32)``; see :mod:`verify_attn.masks`.
      causal: chain mode instead of ``tree_mask`` (exactly one of the two).
      sm_scale: logit scale; default ``1 / sqrt(D_qk)``.
      head_dim_vo: MLA value width (default 512 when ``v`` is None; the
        kernels run MLA with ``D_qk`` 576 and ``head_dim_vo`` 512, 1..128 heads and
        one KV head, NotImplementedError otherwise); must equal ``v.shape[-1]``
        otherwise (GQA/MHA: ``D`` 64, 128 or 256, ``H / Hkv`` <= 16).
      max_q_len: host upper bound of every ``q_len_i`` (<= 1024). Computed from
        ``qo_indptr`` when None: a device->host sync; required under CUDA graph
        capture and ``torch.compile``.
      max_kv_len: host upper bound of every ``kv_len_i`` (planning of the split
        count). Same rules as ``max_q_len``.
      return_lse: also return the fp32 ``[total_q, H]`` LSE, ``log(sum_j exp(sm_scale *
        q[t, h] . k[j, hk]))`` over the visible ``j`` (natural log; module docstring).
      num_splits: 0 = automatic; 1 .. 65535 forces the split-K count.
      out: optional preallocated ``[total_q, H, D_vo]`` (q's dtype) to write;
        its elements must not overlap in memory (no ``expand``-ed views).
      lse: optional preallocated fp32 ``[total_q, H]`` to write (any strides
        that do not overlap).
      tuning: optional :class:`verify_attn.Tuning`, explicit kernel choices
        (benchmarks, tests); None = the plan's rules.
      k_scale, v_scale: an fp8 cache's per-tensor scales (Python floats,
        finite, > 0; SGLang's ``layer.k_scale_float`` / ``v_scale_float``):
        the scores use ``k_scale * k`` and the output ``v_scale * v``, folded
        into the softmax scale and the output's normalization, never applied
        element by element. 1.0 (the only value other caches take). MLA: the
        value is a prefix of the key and takes ``k_scale``; ``v_scale`` stays
        1.0 or equals ``k_scale``.

    Returns:
      ``out`` ``[total_q, H, D_vo]`` in q's dtype, or ``(out, lse)`` when
      ``return_lse``.

    A one-shot call plans and runs (``va_plan_create`` + ``va_plan_run``). With
    both host bounds given, an eager call keeps the plan of its batch (the
    index tensors' addresses and layouts, the scalars, the layouts of ``q``,
    the caches, ``out`` and ``lse``; the 16 most recent batches), so the
    next call of the same batch (the next layer) only runs it. A model can
    also plan once per batch itself with :class:`verify_attn.TreeAttentionPlan`.

    Raises:
      TypeError: a dtype is wrong (q not fp16/bf16, k/v neither q's dtype nor
        torch.float8_e4m3fn (another fp8 variant is named as such), v not k's,
        an index tensor not int32, tree_mask not int32/uint32, out/lse dtype),
        a tensor argument is not a tensor, or a scalar is not an int / bool /
        float (e.g. ``page_size=1.0``, ``causal=1``, ``k_scale=None``); the
        message starts with the argument's name.
      ValueError: a shape, stride, alignment (last dim contiguous, other strides
        multiples of 8 elements, data 16-byte aligned, index tensors and
        tree_mask contiguous, out/lse not overlapping) or device (all CUDA, all
        on q's device, checked before the op is dispatched, so a meta tensor
        among them is refused too) problem, both/neither of tree_mask/causal, a
        too narrow tree_mask, bad bounds, a scalar out of the C-ABI's range
        (``num_splits`` > 65535, ``page_size``/``max_kv_len`` > 2^31-1,
        ``sm_scale`` beyond float32), ``qo_indptr`` of 0 requests with rows in
        ``q``, a scale not finite or not > 0 or other than 1 for a cache that
        is not fp8, an MLA ``v_scale`` other than 1 and ``k_scale``; message starts with the argument's name.
      NotImplementedError: a valid configuration the kernels do not support
        (head dims, head counts, arch, an fp8 cache where no kernel of this build converts it;
        the message then starts with the C function's name, e.g.
        ``va_workspace_size: VA_ERR_UNSUPPORTED: num_qo_heads: ...``); ImportError: the compiled extension is missing;
        RuntimeError: CUDA errors (from the extension); KernelInputError: in
        debug mode (:func:`verify_attn.set_debug`), bad device data the kernel
        flagged.
    """
    return _run(False, q, k, v, qo_indptr, kv_indptr, None, None, None, tree_mask, causal,
                sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse, num_splits, out, lse,
                tuning=tuning, k_scale=k_scale, v_scale=v_scale)


def tree_attention_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    *,
    page_size: Optional[int] = None,
    tree_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    sm_scale: Optional[float] = None,
    head_dim_vo: Optional[int] = None,
    max_q_len: Optional[int] = None,
    max_kv_len: Optional[int] = None,
    return_lse: bool = False,
    num_splits: int = 0,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    kv_slot_runs: int = 1,
    tuning=None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> TensorOrPair:
    """Tree-verify attention over a paged KV cache.

    KV row ``j`` of request ``i`` lives in page ``kv_indices[kv_indptr[i] + j // page_size]``
    at slot ``j % page_size``; the last ``q_len_i`` rows of each request are its
    drafts (already written to the cache), in query order. Every page named by
    ``kv_indices`` must be whole (``page_size`` slots): the sm_90 MLA kernel may
    read the slots past ``kv_len_i`` in a request's last page (page_size a
    multiple of 64), or up to 63 cache rows past a request's last row
    (page_size 1 with ``kv_slot_runs``; never past the cache's end), and never
    uses their values.

    Args:
      q: ``[total_q, H, D_qk]`` fp16/bf16 CUDA tensor; rows ``qo_indptr[i] ..
        qo_indptr[i+1]`` are request ``i``'s draft tokens.
      k_cache: q's dtype or ``torch.float8_e4m3fn`` (as ``k`` of
        :func:`tree_attention_flat`, with ``k_scale`` / ``v_scale``);
        ``[num_pages, page_size, Hkv, D_qk]`` (page size
        inferred from ``shape[1]``), or ``[slots, Hkv, D_qk]`` (page size =
        ``page_size`` or 1; page ``p`` is slots ``p * page_size ..``; SGLang's
        token pool with page size 1). ``H % Hkv == 0``.
      v_cache: the same layout with ``D_vo``, or None for MLA (value = first
        ``head_dim_vo`` values of the K row; a ``k_cache[..., :512]`` view is
        detected as MLA too).
      qo_indptr: ``[B + 1]`` int32 (``total_q = qo_indptr[B] = q.shape[0]``).
      kv_indptr: ``[B + 1]`` int32 offsets into ``kv_indices``, in pages:
        request ``i``'s pages are ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``.
      kv_indices: 1-D int32 page ids in ``[0, num_pages)``, at least
        ``kv_indptr[B]`` entries.
      kv_len: ``[B]`` int32 KV rows per request (prefix + drafts),
        ``q_len_i <= kv_len_i <= (kv_indptr[i+1] - kv_indptr[i]) * page_size``.
      page_size: slots (KV rows) per page, 1 .. 2^31-1; must match
        ``k_cache.shape[1]`` for a 4-D cache; default 1 for a 3-D one.
      tree_mask: int32 (bit pattern) or uint32 ``[total_q, W]``, contiguous,
        ``W >= ceil(max_q_len / 32)``; see :mod:`verify_attn.masks`.
      causal: chain mode instead of ``tree_mask`` (exactly one of the two).
      sm_scale: logit scale, finite and > 0; default ``1 / sqrt(D_qk)``.
      head_dim_vo: MLA value width (default 512 when ``v_cache`` is None; the
        kernels run MLA with ``D_qk`` 576 and ``head_dim_vo`` 512, 1..128 heads
        and one KV head, NotImplementedError otherwise); must equal
        ``v_cache.shape[-1]`` otherwise (GQA/MHA: ``D`` 64, 128 or 256,
        ``H / Hkv`` <= 16).
      max_q_len: host upper bound of every ``q_len_i`` (<= 1024). Computed from
        ``qo_indptr`` when None: a device->host sync; required under CUDA graph
        capture and ``torch.compile``.
      max_kv_len: host upper bound of every ``kv_len_i``, in KV rows (<= 2^31-1;
        plans the split count). Computed from ``kv_len`` when None (host sync);
        same rules as ``max_q_len``.
      return_lse: also return the fp32 ``[total_q, H]`` LSE, natural log, as in
        :func:`tree_attention_flat`.
      num_splits: 0 = automatic; 1 .. 65535 forces the split-K count.
      out: optional preallocated ``[total_q, H, D_vo]`` (q's dtype) to write;
        its elements must not overlap in memory (no ``expand``-ed views).
      lse: optional preallocated fp32 ``[total_q, H]`` to write (any strides
        that do not overlap).
      kv_slot_runs: page_size 1 only, a hint in slots (int >= 1, default 1 =
        none): the slots of each request mostly come in runs of this many
        consecutive slots from its first KV row, as SGLang's token slots of a
        ``--page-size kv_slot_runs`` pool do. With a multiple of 64, MLA on
        sm_90 takes the TMA kernel
        (kernels/sm90/mla_seesaw_kernel.cuh, config ``mla_wgmma_seesaw_tma_rows``),
        which copies each 64-row tile whose slots are consecutive by bulk
        tensor copies and gathers the others; otherwise the cp.async kernel.
        Any slot layout gives correct results either way; only the speed
        depends on the hint. A hint that holds brings a page_size 1 cache
        close to a page_size 64 one; a hint that does not hold is slower than
        none, because the producer warps then gather the tiles themselves and
        wait for their own copies (BENCHMARKS.md).

    Returns:
      ``out`` ``[total_q, H, D_vo]`` in q's dtype, or ``(out, lse)`` when
      ``return_lse``.

    Raises:
      As :func:`tree_attention_flat`; names are ``k_cache``/``v_cache``/
      ``kv_indices``/``kv_len``/``page_size`` for the paged arguments (e.g.
      ValueError when the host reads the index arrays and finds a request
      whose ``kv_len`` is below its ``q_len`` or needs more pages than
      ``kv_indptr`` gives it); ``kv_slot_runs``: TypeError for a non-integer,
      ValueError outside [1, 2^31-1] or above 1 with a page_size other than 1.
    """
    return _run(True, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_len, page_size,
                tree_mask, causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, return_lse,
                num_splits, out, lse, kv_slot_runs, tuning, k_scale, v_scale)


def plan_info(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: Optional[torch.Tensor] = None,
    kv_len: Optional[torch.Tensor] = None,
    *,
    page_size: Optional[int] = None,
    tree_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    sm_scale: Optional[float] = None,
    head_dim_vo: Optional[int] = None,
    max_q_len: Optional[int] = None,
    max_kv_len: Optional[int] = None,
    return_lse: bool = False,
    num_splits: int = 0,
    kv_slot_runs: int = 1,
    tuning=None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> dict:
    """Which kernel configuration a call with these arguments would run (nothing is launched).

    The tensors must be CUDA tensors on the device the call would run on: the
    choice depends on that device (arch, SM count, shared memory), and ``out``
    / ``lse`` of the planned shapes are allocated there (no kernel runs, no
    host sync when the bounds are given).

    Paged layout when ``kv_indices`` or ``kv_len`` is given (then ``k``/``v`` are
    the caches and both are required: the missing one raises ValueError naming
    it), flat when both are None -- the same rule as
    :class:`verify_attn.TreeAttentionPlan`. Arguments and validation as in
    :func:`tree_attention_flat` / :func:`tree_attention_paged`; ``kv_slot_runs``
    (int >= 1, default 1) is :func:`tree_attention_paged`'s hint (paged caches
    of page_size 1 only; a multiple of 64 can change the configuration, see
    ``name`` below); ``tuning`` (:class:`verify_attn.Tuning`) the explicit
    choices the call would run with.

    Returns:
      dict of the plan (``va_plan_info``): ``name``, ``tile_m``, ``tile_n``,
      ``num_warps``, ``num_stages``, ``num_splits``, ``smem_bytes``, ``sm_arch``,
      ``workspace_bytes``, ``k_tma`` / ``q_tma`` / ``o_tma`` (K tiles, the Q tile,
      the unsplit output by bulk tensor copies), ``grid_rows_fastest``,
      ``split_units`` (0, or the split CTAs per KV head and row tile that a
      batch's requests share by their KV lengths: ``Tuning.balance_splits``;
      ``num_splits`` is then a request's most splits), ``pair_splits`` (True:
      the two splits of each row tile combine their rows as one cluster, with
      no workspace and no merge kernel: ``Tuning.pair_splits``); plus
      ``max_q_len``, ``max_kv_len``, ``kv_layout`` ("flat"/"paged"),
      ``v_is_k_prefix``. What it names is what the launch runs (no fallback
      happens at launch time). ``name`` is
      ``<path>_<dtype>[_e4m3kv]_<config>`` (``_e4m3kv``: an fp8 cache): path ``wgmma`` (the sm_90a MLA kernels, chosen
      for MLA on sm_90: kernels/sm90/mla_seesaw_kernel.cuh, config
      ``mla_wgmma_seesaw_tma``, for flat caches and paged caches with page_size a
      multiple of 64, ``mla_wgmma_seesaw_tma_rows`` for page_size 1 with the
      ``kv_slot_runs`` hint (a multiple of 64),
      kernels/sm90/mla_wgmma_kernel.cuh, ``mla_wgmma_m64n64_pipe_rows``, otherwise;
      a ``_skip`` suffix on the TMA configurations: tree masks with ``max_q_len > 256``,
      the instance that does not visit the draft KV tiles none of a CTA's rows sees)
      or ``mma_sync`` (the portable kernel, every other case), e.g.
      ``wgmma_bf16_mla_wgmma_seesaw_tma`` or ``mma_sync_fp16_gqa_d128_m64n64_s2``.

    Raises:
      As :func:`tree_attention_flat` / :func:`tree_attention_paged` (TypeError /
      ValueError naming the argument; ``kv_indices: required`` or ``kv_len:
      required`` when only one of the two is given); ImportError without the
      compiled extension; NotImplementedError for an unsupported configuration.
    """
    return_lse = as_bool(return_lse, "return_lse")
    paged = _is_paged(kv_indices, kv_len)
    ps, d_vo, scale, mq, mkv = _prepare(
        paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
        causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, None, None, k_scale, v_scale,
    )
    layout = _layout_code(paged, kv_slot_runs, ps)
    out = torch.empty((q.shape[0], q.shape[1], d_vo), dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device) if return_lse else None
    tensors = (q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse)
    _check_strides(layout, *tensors)
    _check_devices(layout, *tensors)
    _C = _load_C()
    options = _tuning_options(tuning)
    with torch.cuda.device(q.device):
        p = _build_params(
            _C, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, layout, ps,
            bool(causal), scale, d_vo, mq, mkv, int(num_splits), out, lse, k_scale=k_scale, v_scale=v_scale,
        )
        info = dict(_C.Plan(p, *options).info())
    info["max_q_len"] = int(mq)
    info["max_kv_len"] = int(mkv)
    info["kv_layout"] = "paged" if int(p.kv_layout) == int(_C.KV_PAGED) else "flat"
    info["v_is_k_prefix"] = int(p.v_is_k_prefix)
    return info
