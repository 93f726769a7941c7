"""Host checks of the index arrays shared by the API (attention.py) and the
float64 reference (reference.py): one rule and one message each, so a bad
``qo_indptr``, ``kv_indptr`` or ``tree_mask`` reads the same wherever it is
refused. The lists are already on the host (``tolist()``); every error is a
ValueError (TypeError for a wrong type) whose message starts with the
argument's name."""

from typing import Optional, Sequence

import torch

_UINT32 = getattr(torch, "uint32", None)
# The compact tree mask's words: int32 (the bit pattern) or uint32.
MASK_DTYPES = (torch.int32,) + ((_UINT32,) if _UINT32 is not None else ())


def check_qo_indptr(qo: Sequence[int], total_q: int) -> None:
    """``qo_indptr`` starts at 0, does not decrease and ends at ``q.shape[0]``."""
    B = len(qo) - 1
    bad = next((i for i in range(B) if qo[i + 1] < qo[i]), None)
    if qo[0] != 0 or qo[-1] != total_q or bad is not None:
        detail = ""
        if bad is not None:
            detail = f", decreasing at request {bad} (qo_indptr[{bad}] = {qo[bad]} > qo_indptr[{bad + 1}] = {qo[bad + 1]})"
        raise ValueError(
            f"qo_indptr: must start at 0, be non-decreasing and end at q.shape[0] = {total_q}; "
            f"got first {qo[0]}, last {qo[-1]}{detail}"
        )


def check_kv_indptr(kv: Sequence[int], capacity: Optional[int], what: str) -> None:
    """``kv_indptr`` starts at >= 0, does not decrease and (when ``capacity`` is
    known) ends within it; ``what`` names the capacity ("rows of k", ...)."""
    if kv[0] < 0:
        raise ValueError(f"kv_indptr: must start at >= 0, got kv_indptr[0] = {kv[0]}")
    bad = next((i for i in range(len(kv) - 1) if kv[i + 1] < kv[i]), None)
    if bad is not None:
        raise ValueError(
            f"kv_indptr: must be non-decreasing; decreasing at request {bad} "
            f"(kv_indptr[{bad}] = {kv[bad]} > kv_indptr[{bad + 1}] = {kv[bad + 1]})"
        )
    if capacity is not None and kv[-1] > capacity:
        raise ValueError(f"kv_indptr: last value {kv[-1]} exceeds the {capacity} {what}")


def check_tree_mask_shape(tree_mask, total_q: int) -> None:
    """A tree mask is ``[total_q, W >= 1]`` (its words per row are checked against
    the draft counts elsewhere)."""
    if tree_mask.dim() == 2 and tree_mask.shape[1] >= 1 and tree_mask.shape[0] != total_q:
        raise ValueError(f"tree_mask: {tree_mask.shape[0]} rows, but q has {total_q} (q.shape[0]; one mask row "
                         f"per query row: check q and qo_indptr too)")
    if tree_mask.dim() != 2 or tree_mask.shape[0] != total_q or tree_mask.shape[1] < 1:
        raise ValueError(f"tree_mask: expected shape [total_q={total_q}, W >= 1], got {tuple(tree_mask.shape)}")


def check_tensor(x, name: str, optional: bool = False) -> None:
    """``x`` is a torch.Tensor (or None when ``optional``), else TypeError."""
    if x is None and optional:
        return
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def check_int_tensor(x, name: str, what: str = "") -> None:
    """``x`` is a torch.Tensor of an integer dtype (bool excluded), else
    TypeError naming ``name`` (``what``: the expected shape, for the message)."""
    want = f"{name}: expected an integer tensor{' ' + what if what else ''}"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{want}, got {type(x).__name__}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{want}, got {x.dtype}")


def check_tree_mask_dtype(tree_mask) -> None:
    """A tree mask is a tensor of int32 (bit pattern) or uint32 words (TypeError);
    a dense bool / float mask is not one (:mod:`verify_attn.masks` converts)."""
    check_tensor(tree_mask, "tree_mask")
    if tree_mask.dtype not in MASK_DTYPES:
        raise TypeError(
            f"tree_mask: expected dtype torch.int32 (bit pattern) or torch.uint32, got {tree_mask.dtype}"
        )
