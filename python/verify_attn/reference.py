"""PyTorch reference of the verify_attn semantics (``kernels/verify_attn.h``).

Computes, in float64 by default, on CPU or GPU::

    out[t, h, :] = softmax_j(sm_scale * q[t, h, :D_qk] . k[j, hk, :D_qk]) @ v[j, hk, :D_vo]
    lse[t, h]    = log(sum_j exp(sm_scale * q[t, h] . k[j, hk]))      (natural log)

over the visible KV rows ``j`` of the request: every prefix row, and the draft
rows allowed by the tree mask (or ``c <= t`` in causal mode). ``hk = h // (H / Hkv)``.
MLA (``v is None``): the value is the first ``head_dim_vo`` values of the K row.
A row that sees nothing gets ``out = 0``, ``lse = -inf``.

Layout naming follows FlashInfer (``qo_indptr``, ``kv_indptr``, ``kv_indices``);
the LSE convention follows FlashAttention/FlashMLA (natural log), not
FlashInfer's base 2.

The vectorized reference forms the logits ``[H, q_len, kv_len]`` of one request
at a time, but never a ``q_len x kv_len`` mask: only the last ``q_len`` columns
are masked, with the ``[q_len, q_len]`` ancestor matrix.
"""

import math
from typing import Optional, Tuple

import torch

from . import masks as _masks
from ._args import as_float, as_int
from ._checks import (
    check_kv_indptr,
    check_qo_indptr,
    check_tensor,
    check_tree_mask_dtype,
    check_tree_mask_shape,
)

__all__ = [
    "gather_paged_kv",
    "reference_attention_flat",
    "reference_attention_paged",
    "reference_attention_bruteforce",
]


def _tensor(x, name: str, dim: Optional[int] = None) -> torch.Tensor:
    """``x`` if it is a tensor (else TypeError) of ``dim`` dimensions (else ValueError)."""
    check_tensor(x, name)
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dimension(s), got shape {tuple(x.shape)}")
    return x


def _index_tensor(x, name: str) -> torch.Tensor:
    """A 1-D integer tensor (any integer dtype: the reference is not the C-ABI)."""
    _tensor(x, name, dim=1)
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer dtype, got {x.dtype}")
    return x


def _check_kv_len_nonnegative(lens) -> None:
    """``kv_len [B]`` (host list) has no negative entry."""
    bad = next((i for i, x in enumerate(lens) if x < 0), None)
    if bad is not None:
        raise ValueError(f"kv_len: request {bad} has kv_len {lens[bad]} < 0")


def _page_view(cache: torch.Tensor, page_size: Optional[int], name: str) -> Tuple[torch.Tensor, int]:
    """[num_pages, page_size, Hkv, D] or [slots, Hkv, D] -> ([num_pages*page_size, Hkv, D], page_size)."""
    _tensor(cache, name)
    if page_size is not None:
        page_size = as_int(page_size, "page_size")
    if cache.dim() == 4:
        ps = cache.shape[1]
        if page_size is not None and page_size != ps:
            raise ValueError(f"page_size: {page_size} does not match {name}.shape[1] = {ps}")
        return cache.reshape(-1, cache.shape[2], cache.shape[3]), ps
    if cache.dim() == 3:
        ps = 1 if page_size is None else page_size
        if ps < 1:
            raise ValueError(f"page_size: must be >= 1, got {ps}")
        usable = (cache.shape[0] // ps) * ps
        return cache[:usable], ps
    raise ValueError(f"{name}: expected [num_pages, page_size, Hkv, D] or [slots, Hkv, D], got {tuple(cache.shape)}")


def gather_paged_kv(
    cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    *,
    page_size: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gather a paged KV cache into a flat, request-contiguous one.

    KV row ``j`` of request ``i`` lives in page ``kv_indices[kv_indptr[i] + j // page_size]``
    at slot ``j % page_size`` (the header's VA_KV_PAGED definition).

    Args:
      cache: ``[num_pages, page_size, Hkv, D]`` or ``[slots, Hkv, D]`` (then
        ``page_size`` given or 1; slot ``s`` of page ``p`` is row ``p * page_size + s``).
      kv_indptr: ``[B + 1]`` int, offsets into ``kv_indices`` (in pages).
      kv_indices: ``[>= kv_indptr[B]]`` int page ids.
      kv_len: ``[B]`` int, KV rows per request (prefix + drafts).
      page_size: see ``cache``.

    Returns:
      ``(flat [sum(kv_len), Hkv, D], flat_kv_indptr [B + 1] int64)``, on ``cache``'s
      device, same dtype as ``cache``.

    Raises:
      TypeError: an argument not a tensor, an index array not of an integer
      dtype, ``page_size`` not an integer.
      ValueError: an index array not 1-D, ``kv_indptr`` not ``[B + 1]``,
      starting below 0, decreasing or past ``kv_indices``, a negative
      ``kv_len``, a request needing more pages than ``kv_indptr`` gives it, or
      a page id out of range; each message starts with the argument's name.
      Host sync.
    """
    rows, ps = _page_view(cache, page_size, "cache")
    device = cache.device
    for t, n in ((kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"), (kv_len, "kv_len")):
        _index_tensor(t, n)
    B = kv_len.numel()
    if kv_indptr.numel() != B + 1:
        raise ValueError(f"kv_indptr: expected shape [{B + 1}], got {tuple(kv_indptr.shape)}")
    _check_kv_len_nonnegative(kv_len.tolist())
    check_kv_indptr(kv_indptr.tolist(), kv_indices.numel(), "page ids of kv_indices")
    ind = kv_indptr.to(device=device, dtype=torch.int64)
    idx = kv_indices.to(device=device, dtype=torch.int64)
    lens = kv_len.to(device=device, dtype=torch.int64)
    flat_indptr = torch.zeros(B + 1, dtype=torch.int64, device=device)
    flat_indptr[1:] = torch.cumsum(lens, 0)
    total = int(flat_indptr[-1])
    if B:
        pages_needed = (lens + ps - 1) // ps
        have = ind[1:] - ind[:-1]
        if bool((pages_needed > have).any()):
            i = int(torch.nonzero(pages_needed > have)[0, 0])
            raise ValueError(
                f"kv_indptr: request {i} has kv_len {int(lens[i])} = {int(pages_needed[i])} pages, "
                f"but only {int(have[i])} page ids"
            )
    if total == 0:
        return rows.new_empty((0,) + tuple(rows.shape[1:])), flat_indptr
    r = torch.arange(total, device=device)
    req = torch.searchsorted(flat_indptr[1:].contiguous(), r, right=True)
    j = r - flat_indptr[req]
    page = idx[ind[req] + j // ps]
    num_pages = rows.shape[0] // ps
    if bool(((page < 0) | (page >= num_pages)).any()):
        raise ValueError(f"kv_indices: a page id is outside [0, {num_pages})")
    return rows[page * ps + j % ps], flat_indptr


def _visibility(tree_mask, causal: bool, q_start: int, q_len: int, device) -> torch.Tensor:
    """[q_len, q_len] bool visibility among the drafts of one request."""
    if causal:
        return torch.ones((q_len, q_len), dtype=torch.bool, device=device).tril_()
    rows = tree_mask[q_start : q_start + q_len]
    dense = _masks._unpack_words(rows.to(device))
    if dense.shape[1] < q_len:
        raise ValueError(f"tree_mask: width {rows.shape[1]} words cannot hold q_len {q_len}")
    return dense[:, :q_len]


def _check_mask_mode(tree_mask, causal):
    if (tree_mask is None) == (not causal):
        raise ValueError("tree_mask: pass exactly one of tree_mask and causal=True")


def _check_index_lists(qo, kvp, total_q, kv_rows):
    """qo_indptr covers q exactly; kv_indptr is in range and non-decreasing (host lists)."""
    if len(qo) < 1:
        raise ValueError("qo_indptr: expected shape [B + 1] with B >= 0, got an empty tensor")
    if len(qo) != len(kvp):
        raise ValueError(f"kv_indptr: length {len(kvp)} != qo_indptr length {len(qo)}")
    check_qo_indptr(qo, total_q)
    check_kv_indptr(kvp, kv_rows, "KV rows")


def _check_tree_mask(tree_mask, total_q):
    if tree_mask is None:
        return
    check_tree_mask_dtype(tree_mask)
    check_tree_mask_shape(tree_mask, total_q)


def reference_attention_flat(
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
    compute_dtype: torch.dtype = torch.float64,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference attention over a flat (request-contiguous) KV layout.

    Args:
      q: ``[total_q, H, D_qk]`` any float dtype.
      k: ``[rows, Hkv, D_qk]``; rows ``kv_indptr[i] .. kv_indptr[i+1]`` are request
        ``i``'s KV, the last ``q_len_i`` of them its draft tokens.
      v: ``[rows, Hkv, D_vo]`` or None for MLA (value = ``k[..., :head_dim_vo]``).
      qo_indptr, kv_indptr: ``[B + 1]`` int.
      tree_mask: int32/uint32 ``[total_q, W]`` compact mask (see :mod:`verify_attn.masks`),
        or None with ``causal=True``.
      causal: chain mode (draft ``t`` sees drafts ``0..t``).
      sm_scale: logit scale, default ``1 / sqrt(D_qk)``.
      head_dim_vo: MLA value width (default 512 when ``v is None``, else ``v.shape[-1]``).
      compute_dtype: float64 by default.
      k_scale, v_scale: a quantized cache's scales: the keys are ``k_scale * k``
        and the values ``v_scale * v`` (dequantized in ``compute_dtype`` before
        anything else; MLA's value, a prefix of the key, takes ``k_scale``).

    Returns:
      ``(out [total_q, H, D_vo], lse [total_q, H])`` in ``compute_dtype``; ``lse``
      natural log.

    Raises:
      TypeError: ``sm_scale`` not a number, ``head_dim_vo`` not an integer,
      ``q`` / ``k`` / ``v`` / an index array not a tensor, an index array not
      of an integer dtype, ``tree_mask`` not an int32 / uint32 tensor (a dense
      bool mask is not a compact one: :func:`verify_attn.masks.from_dense`).
      ValueError: inconsistent shapes (``k``'s head dim not ``q``'s, ``v``'s
      rows or heads not ``k``'s, ``qo_indptr`` not starting at 0,
      decreasing or not ending at ``q.shape[0]``; ``kv_indptr`` of another
      length, decreasing or past the KV rows; ``tree_mask`` not
      ``[total_q, W]``), ``kv_len_i < q_len_i``, both/neither of
      ``tree_mask``/``causal``, a non-finite ``sm_scale``, a scale not finite
      or not > 0; each message starts with the argument's name.
    """
    _check_mask_mode(tree_mask, causal)
    for x, n in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if not math.isfinite(as_float(x, n)) or not x > 0:
            raise ValueError(f"{n}: must be finite and > 0, got {x}")
    _tensor(q, "q")
    if q.dim() != 3:
        raise ValueError(f"q: expected shape [total_q, H, D_qk], got {tuple(q.shape)}")
    total_q, H, d_qk = q.shape
    _check_tree_mask(tree_mask, total_q)
    _tensor(k, "k", dim=3)
    Hkv = k.shape[1]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"k: {Hkv} KV heads do not divide {H} query heads")
    if k.shape[2] != d_qk:
        raise ValueError(f"k: head dim {k.shape[2]} != q's D_qk {d_qk}")
    G = H // Hkv
    if v is not None:
        _tensor(v, "v", dim=3)
        if v.shape[0] != k.shape[0] or v.shape[1] != Hkv:
            raise ValueError(f"v: shape {tuple(v.shape)} does not match k's rows and KV heads {tuple(k.shape[:2])}")
    _index_tensor(qo_indptr, "qo_indptr")
    _index_tensor(kv_indptr, "kv_indptr")
    if v is None:
        d_vo = 512 if head_dim_vo is None else as_int(head_dim_vo, "head_dim_vo")
        if d_vo > k.shape[2]:
            raise ValueError(f"head_dim_vo: {d_vo} > head_dim_qk {k.shape[2]} (MLA value is a prefix of K)")
    else:
        d_vo = v.shape[2]
        if head_dim_vo is not None and as_int(head_dim_vo, "head_dim_vo") != d_vo:
            raise ValueError(f"head_dim_vo: {head_dim_vo} != v.shape[-1] = {d_vo}")
    scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else as_float(sm_scale, "sm_scale")
    if not math.isfinite(scale):
        raise ValueError(f"sm_scale: must be finite, got {sm_scale}")
    device = q.device
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    _check_index_lists(qo, kvp, total_q, k.shape[0])
    out = torch.zeros((total_q, H, d_vo), dtype=compute_dtype, device=device)
    lse = torch.full((total_q, H), float("-inf"), dtype=compute_dtype, device=device)
    for i in range(len(qo) - 1):
        qs, qe = qo[i], qo[i + 1]
        ql = qe - qs
        ks, ke = kvp[i], kvp[i + 1]
        kl = ke - ks
        if ql == 0:
            continue
        if kl < ql:
            raise ValueError(f"kv_indptr: request {i} has kv_len {kl} < q_len {ql}")
        prefix = kl - ql
        qi = q[qs:qe].to(compute_dtype).reshape(ql, Hkv, G, d_qk).permute(1, 2, 0, 3)  # [Hkv,G,q,D]
        ki = (k[ks:ke].to(compute_dtype) * k_scale).permute(1, 0, 2)  # [Hkv, kv, D]
        if v is None:
            vi = ki[..., :d_vo]
        else:
            vi = (v[ks:ke].to(compute_dtype) * v_scale).permute(1, 0, 2)
        logits = torch.einsum("hgqd,hkd->hgqk", qi, ki) * scale  # [Hkv,G,q,kv]
        vis = _visibility(tree_mask, causal, qs, ql, device)  # [q, q]
        tail = logits[..., prefix:]
        tail.masked_fill_(~vis, float("-inf"))
        l = torch.logsumexp(logits, dim=-1)  # [Hkv,G,q]
        p = torch.exp(logits - l.unsqueeze(-1))
        p = torch.nan_to_num(p, nan=0.0)  # rows that see nothing
        o = torch.einsum("hgqk,hkd->hgqd", p, vi)  # [Hkv,G,q,Dv]
        out[qs:qe] = o.permute(2, 0, 1, 3).reshape(ql, H, d_vo)
        lse[qs:qe] = l.permute(2, 0, 1).reshape(ql, H)
    return out, lse


def reference_attention_paged(
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
    compute_dtype: torch.dtype = torch.float64,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference attention over a paged KV cache: :func:`gather_paged_kv` then
    :func:`reference_attention_flat`. Arguments as in those two functions
    (``kv_indptr`` indexes ``kv_indices`` in pages; ``kv_len [B]`` is each
    request's KV length including its drafts). Returns ``(out, lse)`` in
    ``compute_dtype``.

    Raises:
      TypeError / ValueError: as :func:`gather_paged_kv` and
      :func:`reference_attention_flat` (a ``qo_indptr`` that does not cover
      ``q`` included); ``kv_len`` not ``[B]``, negative, or ``kv_len_i <
      q_len_i`` are reported against ``kv_len``, ``kv_indptr`` not ``[B + 1]`` against
      ``kv_indptr`` (``B`` from ``qo_indptr``).
    """
    _tensor(q, "q")
    for t, n in ((qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"), (kv_len, "kv_len")):
        _index_tensor(t, n)
    B = qo_indptr.numel() - 1
    if kv_len.dim() != 1 or kv_len.numel() != B:
        raise ValueError(f"kv_len: expected shape [{B}] (batch size, from qo_indptr), got {tuple(kv_len.shape)}")
    if kv_indptr.dim() != 1 or kv_indptr.numel() != B + 1:
        raise ValueError(f"kv_indptr: expected shape [{B + 1}] (like qo_indptr), got {tuple(kv_indptr.shape)}")
    _check_kv_len_nonnegative(kv_len.tolist())
    ql = (qo_indptr[1:] - qo_indptr[:-1]).to("cpu", torch.int64)
    kl = kv_len.to("cpu", torch.int64)
    if ql.numel() == kl.numel():
        short = torch.nonzero((ql > 0) & (kl < ql)).flatten()
        if short.numel():
            i = int(short[0])
            raise ValueError(f"kv_len: request {i} has kv_len {int(kl[i])} < q_len {int(ql[i])}")
    kf, flat_indptr = _gather_any(k_cache, kv_indptr, kv_indices, kv_len, page_size)
    vf = None
    if v_cache is not None:
        vf, _ = _gather_any(v_cache, kv_indptr, kv_indices, kv_len, page_size)
    return reference_attention_flat(
        q, kf, vf, qo_indptr, flat_indptr,
        tree_mask=tree_mask, causal=causal, sm_scale=sm_scale,
        head_dim_vo=head_dim_vo, compute_dtype=compute_dtype, k_scale=k_scale, v_scale=v_scale,
    )


def _gather_any(cache, kv_indptr, kv_indices, kv_len, page_size):
    """gather_paged_kv of any cache dtype: an fp8 cache's bytes gathered as
    uint8 (torch's indexing does not cover every fp8 dtype on every device)."""
    if isinstance(cache, torch.Tensor) and cache.is_floating_point() and cache.element_size() == 1:
        rows, indptr = gather_paged_kv(cache.view(torch.uint8), kv_indptr, kv_indices, kv_len, page_size=page_size)
        return rows.view(cache.dtype), indptr
    return gather_paged_kv(cache, kv_indptr, kv_indices, kv_len, page_size=page_size)


def reference_attention_bruteforce(
    q: torch.Tensor,
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    *,
    kv_indices: Optional[torch.Tensor] = None,
    kv_len: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    tree_mask: Optional[torch.Tensor] = None,
    causal: bool = False,
    sm_scale: Optional[float] = None,
    head_dim_vo: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Slow, literal per-(row, head) implementation of the header's definition (tests only).

    Flat layout when ``kv_indices`` is None (``k``/``v`` as in
    :func:`reference_attention_flat`), else paged (``k``/``v`` as the caches of
    :func:`reference_attention_paged`). Reads the mask bits one at a time with
    Python integer arithmetic and addresses every KV row with the header's
    formulas. float64. Returns ``(out, lse)``.
    """
    _check_mask_mode(tree_mask, causal)
    _tensor(q, "q", dim=3)
    total_q, H, d_qk = q.shape
    _check_tree_mask(tree_mask, total_q)
    paged = kv_indices is not None
    if paged:
        if k.dim() == 4:
            ps = k.shape[1]
            kk = k.reshape(-1, k.shape[2], k.shape[3])
            vv = None if v is None else v.reshape(-1, v.shape[2], v.shape[3])
        else:
            ps = 1 if page_size is None else as_int(page_size, "page_size")
            kk, vv = k, v
    else:
        kk, vv = k, v
    Hkv = kk.shape[1]
    G = H // Hkv
    d_vo = (512 if head_dim_vo is None else as_int(head_dim_vo, "head_dim_vo")) if v is None else vv.shape[2]
    scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else as_float(sm_scale, "sm_scale")
    qo = [int(x) for x in qo_indptr.tolist()]
    kvp = [int(x) for x in kv_indptr.tolist()]
    idx = [int(x) for x in kv_indices.tolist()] if paged else None
    lens = [int(x) for x in kv_len.tolist()] if paged else None
    if paged:
        if len(qo) != len(kvp):
            raise ValueError(f"kv_indptr: length {len(kvp)} != qo_indptr length {len(qo)}")
        check_qo_indptr(qo, total_q)
        check_kv_indptr(kvp, len(idx), "page ids of kv_indices")
        _check_kv_len_nonnegative(lens)
    else:
        _check_index_lists(qo, kvp, total_q, kk.shape[0])
    words = None
    if tree_mask is not None:
        words = [[int(w) & 0xFFFFFFFF for w in row] for row in tree_mask.to(torch.int64).tolist()]
    qd = q.double().cpu()
    kd = kk.double().cpu()
    vd = None if vv is None else vv.double().cpu()
    out = torch.zeros((total_q, H, d_vo), dtype=torch.float64)
    lse = torch.full((total_q, H), float("-inf"), dtype=torch.float64)
    for i in range(len(qo) - 1):
        ql = qo[i + 1] - qo[i]
        kl = lens[i] if paged else kvp[i + 1] - kvp[i]
        prefix = kl - ql

        def row_of(j):
            if paged:
                return idx[kvp[i] + j // ps] * ps + j % ps
            return kvp[i] + j

        for t in range(ql):
            r = qo[i] + t
            visible = []
            for j in range(kl):
                if j < prefix:
                    visible.append(j)
                    continue
                c = j - prefix
                if causal:
                    ok = c <= t
                else:
                    ok = (words[r][c // 32] >> (c % 32)) & 1 == 1
                if ok:
                    visible.append(j)
            if not visible:
                continue
            rows = torch.tensor([row_of(j) for j in visible], dtype=torch.long)
            for h in range(H):
                hk = h // G
                s = (kd[rows, hk, :d_qk] @ qd[r, h, :d_qk]) * scale
                m = s.max()
                e = torch.exp(s - m)
                denom = e.sum()
                val = kd[rows, hk, :d_vo] if vd is None else vd[rows, hk, :d_vo]
                out[r, h] = (e[:, None] * val).sum(0) / denom
                lse[r, h] = m + torch.log(denom)
    return out.to(q.device), lse.to(q.device)
