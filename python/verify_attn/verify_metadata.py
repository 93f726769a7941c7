"""A uniform verify batch's metadata in one launch (``va_verify_metadata``).

A serving engine's target verify step gives every request the same number
``N`` of draft tokens, whose K/V it has already written to its cache; the
attention of every layer then needs the batch's ``qo_indptr``, ``kv_indptr``,
``kv_len``, ``kv_indices`` (the prefix slots, then the drafts' slots) and the
compact tree mask. :func:`uniform_verify_metadata` makes all of them in one
kernel instead of a few dozen small torch operations (their host cost, about
1-2 ms per step, exceeds the attention of a small batch). The prefix entries of
``kv_indices`` stay the engine's: its request-to-slot gather writes them with
the returned ``kv_indptr`` as its row starts (SGLang:
``create_flashinfer_kv_indices_triton``).

The layout follows SGLang 0.5.23's target verify (``eagle_info.py``,
``triton_backend.py``): query rows request-major (``qo_indptr = r * N``), the
drafts' slots ``draft_slots[r * N + t]``, the QLEN_ONLY mask
``draft_mask[(r * N + t) * N + c]`` (draft ``t`` sees draft ``c``).
"""

from typing import NamedTuple, Optional

import torch

from . import errors as _errors
from ._args import as_int

__all__ = ["VerifyMetadata", "uniform_verify_metadata"]

_MAX_DRAFTS = 1024
_INT_DTYPES = (torch.int32, torch.int64)
_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8)


class VerifyMetadata(NamedTuple):
    """The per-batch arguments of :class:`verify_attn.TreeAttentionPlan` (page_size 1)."""

    qo_indptr: torch.Tensor  #: int32 [B + 1]
    kv_indptr: torch.Tensor  #: int32 [B + 1]
    kv_indices: torch.Tensor  #: int32 [capacity]
    kv_len: torch.Tensor  #: int32 [B]
    tree_mask: Optional[torch.Tensor]  #: int32 [B * N, ceil(N / 32)], None when causal


def _int_tensor(t, name, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INT_DTYPES:
        raise TypeError(f"{name}: expected dtype torch.int32 or torch.int64, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: must be on prefix_len's device {device}, got {t.device}")
    if t.dim() != 1 or not t.is_contiguous():
        raise ValueError(f"{name}: must be a contiguous 1-D tensor, got shape {tuple(t.shape)} "
                         f"stride {tuple(t.stride())}")


def _out_view(buf, need, name, device, rows=None):
    """``buf[:need]`` (rows ``[:need]`` of a 2-D buffer), checked, or a new int32 tensor."""
    if buf is None:
        shape = (need,) if rows is None else (need, rows)
        return torch.empty(shape, dtype=torch.int32, device=device)
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"out.{name}: expected a torch.Tensor, got {type(buf).__name__}")
    if buf.dtype != torch.int32 or buf.device != device or not buf.is_contiguous():
        raise ValueError(f"out.{name}: must be a contiguous int32 tensor on {device}, got {buf.dtype} on "
                         f"{buf.device}")
    if rows is not None and (buf.dim() != 2 or buf.shape[1] != rows):
        raise ValueError(f"out.{name}: must be [rows, {rows}], got {tuple(buf.shape)}")
    if buf.shape[0] < need:
        raise ValueError(f"out.{name}: needs at least {need} rows, has {buf.shape[0]}")
    return buf if buf.shape[0] == need else buf[:need]


def uniform_verify_metadata(
    prefix_len: torch.Tensor,
    draft_slots: torch.Tensor,
    num_drafts: int,
    *,
    draft_mask: Optional[torch.Tensor] = None,
    kv_indices_capacity: Optional[int] = None,
    pad_slot: int = 0,
    out: Optional[VerifyMetadata] = None,
) -> VerifyMetadata:
    """Indptrs, lengths, draft slots and tree mask of a verify batch, one launch.

    Args:
      prefix_len: int32 / int64 CUDA ``[B]``: each request's committed prefix
        (cache rows before its drafts).
      draft_slots: int32 / int64 ``[R * N]`` on the same device: the cache slots
        (page_size 1) of the drafts of the first ``R <= B`` requests, request-major.
        Requests ``R..B-1`` (the padding of a captured batch) get ``pad_slot``.
      num_drafts: ``N``, draft tokens per request, 1..1024.
      draft_mask: None (causal chains: no tree mask is made) or bool / uint8 /
        int8, contiguous, at least ``R * N * N`` elements: entry
        ``(r * N + t) * N + c`` nonzero when draft ``t`` of request ``r`` sees
        draft ``c`` (SGLang's QLEN_ONLY layout). Padded requests' rows are causal.
      kv_indices_capacity: entries of the ``kv_indices`` made when ``out`` does
        not give one: at least ``sum(prefix_len) + B * N`` (not checked on the
        host: rows past it are not written and flag the error word, see
        :func:`verify_attn.check_errors`).
      pad_slot: the slot of a padded request's drafts (any valid slot).
      out: buffers to write (CUDA graphs): a :class:`VerifyMetadata` of int32
        contiguous tensors with at least ``B + 1``, ``B + 1``, any, ``B`` rows
        (``tree_mask``: ``[>= B * N, ceil(N / 32)]``, or None to allocate);
        the result is views of them.

    Returns:
      :class:`VerifyMetadata`; ``kv_indices`` holds the drafts' slots at
      ``kv_indptr[r] + prefix_len[r] + t``: the prefix entries before them are
      the caller's to write. ``tree_mask`` is None when ``draft_mask`` is.

    Raises:
      TypeError: a tensor argument of another type or dtype, a non-integer count.
      ValueError: CPU tensors or tensors on different devices, a non-contiguous
        or wrongly shaped tensor, ``num_drafts`` out of range, ``draft_slots``
        not a whole number of requests or more than ``B``, a ``draft_mask``
        too small, an ``out`` buffer too small, no capacity, ``pad_slot`` outside int32.

    No host synchronization; capturable when ``out`` gives every buffer.
    """
    if not isinstance(prefix_len, torch.Tensor):
        raise TypeError(f"prefix_len: expected a torch.Tensor, got {type(prefix_len).__name__}")
    device = prefix_len.device
    if device.type != "cuda":
        raise ValueError(f"prefix_len: must be a CUDA tensor, got device {device}")
    _int_tensor(prefix_len, "prefix_len", device)
    _int_tensor(draft_slots, "draft_slots", device)
    n = as_int(num_drafts, "num_drafts")
    if not 1 <= n <= _MAX_DRAFTS:
        raise ValueError(f"num_drafts: must be in [1, {_MAX_DRAFTS}], got {n}")
    B = prefix_len.shape[0]
    if draft_slots.numel() % n:
        raise ValueError(f"draft_slots: {draft_slots.numel()} slots are not a whole number of requests of "
                         f"{n} drafts")
    R = draft_slots.numel() // n
    if R > B:
        raise ValueError(f"draft_slots: {R} requests' drafts for a batch of {B} (prefix_len)")
    pad_slot = as_int(pad_slot, "pad_slot")
    if not -(1 << 31) <= pad_slot < 1 << 31:  # else pybind11's int32_t conversion fails without naming it
        raise ValueError(f"pad_slot: must fit int32, got {pad_slot}")
    mask_ptr = 0
    if draft_mask is not None:
        if not isinstance(draft_mask, torch.Tensor):
            raise TypeError(f"draft_mask: expected a torch.Tensor, got {type(draft_mask).__name__}")
        if draft_mask.dtype not in _MASK_DTYPES:
            raise TypeError(f"draft_mask: expected dtype torch.bool, torch.uint8 or torch.int8, got "
                            f"{draft_mask.dtype}")
        if draft_mask.device != device:
            raise ValueError(f"draft_mask: must be on prefix_len's device {device}, got {draft_mask.device}")
        if not draft_mask.is_contiguous():
            raise ValueError("draft_mask: must be contiguous")
        if draft_mask.numel() < R * n * n:
            raise ValueError(f"draft_mask: {R} requests x {n} x {n} drafts need {R * n * n} entries, has "
                             f"{draft_mask.numel()}")
        mask_ptr = draft_mask.data_ptr()
    o = out if out is not None else VerifyMetadata(None, None, None, None, None)
    if o.kv_indices is None:
        if kv_indices_capacity is None:
            raise ValueError("kv_indices_capacity: required when out does not give kv_indices")
        cap = as_int(kv_indices_capacity, "kv_indices_capacity")
        if cap < 0:
            raise ValueError(f"kv_indices_capacity: must be >= 0, got {cap}")
        kv_indices = torch.empty(cap, dtype=torch.int32, device=device)
    else:
        _out_view(o.kv_indices, 0, "kv_indices", device)  # its type, dtype, device and layout
        kv_indices = o.kv_indices  # the whole buffer: its size is the capacity
        cap = kv_indices.numel()
    words = (n + 31) // 32
    qo = _out_view(o.qo_indptr, B + 1, "qo_indptr", device)
    kvp = _out_view(o.kv_indptr, B + 1, "kv_indptr", device)
    kvl = _out_view(o.kv_len, B, "kv_len", device)
    tree = None if draft_mask is None else _out_view(o.tree_mask, B * n, "tree_mask", device, rows=words)
    index = device.index if device.index is not None else torch.cuda.current_device()
    from .attention import _load_C  # noqa: PLC0415 (the extension loads on first use)

    args = (B, R, n, prefix_len.data_ptr(), prefix_len.dtype == torch.int64,
            draft_slots.data_ptr() if R else 0, draft_slots.dtype == torch.int64, pad_slot, mask_ptr,
            qo.data_ptr(), kvp.data_ptr(), kvl.data_ptr() if B else 0, kv_indices.data_ptr() if cap else 0,
            cap, 0 if tree is None else tree.data_ptr(), _errors.error_word_ptr(device),
            torch.cuda.current_stream(index).cuda_stream)
    if torch.cuda.current_device() == index:
        _load_C().verify_metadata(*args)
    else:
        with torch.cuda.device(index):
            _load_C().verify_metadata(*args)
    return VerifyMetadata(qo, kvp, kv_indices, kvl, tree)
