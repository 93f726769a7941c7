"""Random verify problems: trees, scattered paged KV caches, every layout the
implementations need, and SGLang's FULL tree mask.

A :class:`Case` holds the index structure of one shape (shared by all input
sets); an :class:`InputSet` holds random values (queries, caches). Several
input sets of one case differ only in values (for L2 rotation, see
:mod:`benchlib.timing`).

Layouts of one input set (same values everywhere):

- paged cache (this project's paged kernel, FlashInfer): ``page_size`` slots
  per page (1 like SGLang's token pool by default, 64 with ``--page_size=64``),
  the pages of every request scattered at random over a pool about 5% larger
  than needed; ``k_cache`` is ``[slots, Hkv, D]`` for page size 1 and
  ``[pages, page_size, Hkv, D]`` otherwise; MLA has one ``[.., 1, 576]`` cache
  and the value is its first 512 columns;
- token slots (SGLang): the same cache viewed as ``[slots, Hkv, D]`` with
  ``prefix_slots`` (int64 token slot ids of every prefix token, SGLang's
  ``kv_indices``; ``prefix_indptr`` is its ``kv_indptr`` over the committed
  prefix only) and the draft K/V passed contiguously (``k_ext``/``v_ext``), as
  SGLang's Triton backend does in target verify; the drafts are also in the cache;
- flat (this project's flat kernel, FlexAttention, the reference): every
  request's KV rows gathered contiguously, drafts last.

Values are ``randn`` (never zeros), in the shape's dtype.
"""

import dataclasses
import math
import random
from typing import List, Optional

import torch

from verify_attn import masks as va_masks
from verify_attn import testing as va_testing

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
POOL_SLACK = 0.05


@dataclasses.dataclass
class Case:
    shape: object
    device: torch.device
    dtype: torch.dtype
    page_size: int
    seed: int
    q_lens: List[int]
    prefix_lens: List[int]
    kv_lens: List[int]
    parents: List[List[int]]
    sm_scale: float
    max_q_len: int
    max_kv_len: int
    total_q: int
    total_kv: int
    qo_indptr: torch.Tensor        # int32 [B+1]
    tree_mask: torch.Tensor        # int32 [total_q, W] (compact bits)
    kv_indptr_flat: torch.Tensor   # int32 [B+1] row offsets of the flat layout
    num_pages: int
    kv_indptr_pages: torch.Tensor  # int32 [B+1] offsets into kv_indices (pages)
    kv_indices: torch.Tensor       # int32 page ids
    kv_len: torch.Tensor           # int32 [B]
    token_slots: torch.Tensor      # int64 [total_kv]: slot of every flat row
    draft_slots: torch.Tensor      # int64 [total_q]
    prefix_indptr: torch.Tensor    # int32 [B+1] (SGLang kv_indptr: prefix only)
    prefix_slots: torch.Tensor     # int64 (SGLang kv_indices: token slots)
    prefix_lens_t: torch.Tensor    # int32 [B]
    kv_slot_runs: int = 1          # verify_attn's kv_slot_runs hint (build_case's slot_runs when hinted)
    _full_mask: Optional[tuple] = None

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def uniform_q(self) -> bool:
        return len(set(self.q_lens)) <= 1

    def full_mask(self):
        """SGLang's FULL tree mask ``(custom_mask bool, mask_indptr int64)`` (built once)."""
        if self._full_mask is None:
            self._full_mask = sglang_full_mask(self.tree_mask, self.qo_indptr, self.prefix_lens_t)
        return self._full_mask


@dataclasses.dataclass
class InputSet:
    q: torch.Tensor                 # [total_q, H, Dqk]
    k_cache: torch.Tensor           # [slots, Hkv, Dqk] or [pages, ps, Hkv, Dqk]
    v_cache: Optional[torch.Tensor]  # same with Dvo; None for MLA
    k_slots: torch.Tensor           # [slots, Hkv, Dqk] view of k_cache
    v_slots: torch.Tensor           # [slots, Hkv, Dvo] view (MLA: k_slots[..., :Dvo])
    k_flat: torch.Tensor            # [total_kv, Hkv, Dqk]
    v_flat: Optional[torch.Tensor]  # [total_kv, Hkv, Dvo]; None for MLA
    k_ext: torch.Tensor             # [total_q, Hkv, Dqk] contiguous drafts
    v_ext: torch.Tensor             # [total_q, Hkv, Dvo] contiguous drafts

    def nbytes(self) -> int:
        n = 0
        for t in (self.q, self.k_cache, self.v_cache, self.k_flat, self.v_flat, self.k_ext, self.v_ext):
            if t is not None:
                n += t.numel() * t.element_size()
        return n


def _indptr(lens: List[int], device, dtype=torch.int32) -> torch.Tensor:
    out = [0]
    for x in lens:
        out.append(out[-1] + int(x))
    return torch.tensor(out, dtype=dtype, device=device)


def row_request_and_local(indptr: torch.Tensor, total: int):
    """Request index and local index of every row ``0..total-1`` of an indptr."""
    ind = indptr.to(torch.int64)
    rows = torch.arange(total, dtype=torch.int64, device=ind.device)
    req = torch.searchsorted(ind[1:].contiguous(), rows, right=True)
    return req, rows - ind[req]


def sglang_full_mask(tree_mask: torch.Tensor, qo_indptr: torch.Tensor, prefix_lens: torch.Tensor):
    """SGLang's FULL_MASK layout from compact tree bits.

    Request ``i`` owns ``q_len_i * (prefix_len_i + q_len_i)`` bools starting at
    ``mask_indptr[i]``, row-major: entry ``t * (prefix_len_i + q_len_i) + j`` is
    whether draft ``t`` sees KV column ``j`` (prefix columns all True, as SGLang
    fills them; the draft columns hold the ancestor matrix). The inverse of
    :func:`verify_attn.masks.from_sglang_full_mask`. FlashInfer's ``custom_mask``
    (``[q_len, kv_len]`` per request, row-major, kv_len including the drafts) is
    the same layout.

    Returns ``(custom_mask bool [sum sizes], mask_indptr int64 [B + 1])`` on the
    mask's device.
    """
    device = tree_mask.device
    ind = qo_indptr.to(device=device, dtype=torch.int64)
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    q_lens = ind[1:] - ind[:-1]
    sizes = q_lens * (pre + q_lens)
    mask_indptr = torch.zeros(q_lens.numel() + 1, dtype=torch.int64, device=device)
    mask_indptr[1:] = torch.cumsum(sizes, 0)
    total = int(mask_indptr[-1])
    flat = torch.ones(total, dtype=torch.bool, device=device)
    total_q = int(ind[-1])
    if total_q == 0:
        return flat, mask_indptr
    max_q = int(q_lens.max())
    req, local = row_request_and_local(ind, total_q)
    row_base = mask_indptr[req] + local * (pre[req] + q_lens[req]) + pre[req]
    dense = va_masks._unpack_words(tree_mask)[:, :max_q]
    cols = torch.arange(max_q, device=device, dtype=torch.int64)
    valid = cols.unsqueeze(0) < q_lens[req].unsqueeze(1)
    idx = (row_base.unsqueeze(1) + cols.unsqueeze(0))[valid]
    flat[idx] = dense[valid]
    return flat, mask_indptr


def build_case(shape, device, *, page_size: int = 1, seed: int = 0, slot_runs: int = 1,
               kv_slot_runs_hint: Optional[int] = None) -> Case:
    """Random trees and a scattered page table for ``shape`` (no values yet).

    ``slot_runs`` (page_size 1 only): the token slots of a request come in runs
    of that many consecutive slots (the pool's pages of ``slot_runs`` slots
    scattered at random, as SGLang's token slots of a ``--page-size`` pool);
    1 scatters every slot. ``kv_slot_runs_hint``: the ``kv_slot_runs`` hint
    verify_attn is given (``Case.kv_slot_runs``); None: ``slot_runs``, as the
    SGLang plugin passes its page size; 1: none; any other value whether or not
    the slots hold it (tuning).
    """
    device = torch.device(device)
    if page_size < 1:
        raise ValueError(f"page_size: must be >= 1, got {page_size}")
    if slot_runs < 1 or (slot_runs > 1 and page_size != 1):
        raise ValueError(f"slot_runs: must be >= 1, and 1 unless page_size is 1 (got {slot_runs})")
    rng = random.Random(seed)
    q_lens = shape.request_q_lens()
    prefix_lens = shape.request_prefix_lens()
    if len(q_lens) != len(prefix_lens):
        raise ValueError("shape: q_lens and prefix_lens differ in length")
    B = len(q_lens)
    kv_lens = [l + t for l, t in zip(prefix_lens, q_lens)]
    if shape.parents is not None:
        parents = [list(p) for p in shape.parents]
        if [len(p) for p in parents] != list(q_lens):
            raise ValueError("shape.parents: one parent list of q_len entries per request expected")
    else:
        parents = [va_testing.random_parents(shape.tree, t, rng=rng) for t in q_lens]
    max_q = max(q_lens) if q_lens else 0
    qo_indptr = _indptr(q_lens, device)
    flat_par = torch.tensor([p for ps in parents for p in ps], dtype=torch.int32, device=device)
    tree_mask = va_masks.from_parents(flat_par, qo_indptr, max_q_len=max(max_q, 1))

    pool_page = page_size * slot_runs  # slots per page of the pool (page_size unless slot_runs)
    pages_per = [(n + pool_page - 1) // pool_page for n in kv_lens]
    need = sum(pages_per)
    num_pages = need + max(1, int(math.ceil(need * POOL_SLACK)))
    g = torch.Generator().manual_seed(seed + 7919)
    page_ids = torch.randperm(num_pages, generator=g)[:need].to(torch.int32).to(device)
    kv_indptr_pages = _indptr(pages_per, device)
    kv_indptr_flat = _indptr(kv_lens, device)
    total_kv = sum(kv_lens)
    req, j = row_request_and_local(kv_indptr_flat, total_kv)
    ptr = kv_indptr_pages.to(torch.int64)
    token_slots = page_ids.to(torch.int64)[ptr[req] + j // pool_page] * pool_page + j % pool_page
    if slot_runs > 1:  # the kernels see page_size 1: one slot per row
        num_pages *= slot_runs
        page_ids = token_slots.to(torch.int32)
        kv_indptr_pages = kv_indptr_flat
    pre_t = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
    is_prefix = j < pre_t[req]
    prefix_slots = token_slots[is_prefix].contiguous()
    draft_slots = token_slots[~is_prefix].contiguous()
    return Case(
        shape=shape, device=device, dtype=_DTYPES[shape.dtype], page_size=page_size, seed=seed,
        q_lens=q_lens, prefix_lens=prefix_lens, kv_lens=kv_lens, parents=parents,
        sm_scale=1.0 / math.sqrt(shape.d_qk), max_q_len=max_q, max_kv_len=max(kv_lens) if kv_lens else 0,
        total_q=sum(q_lens), total_kv=total_kv, qo_indptr=qo_indptr, tree_mask=tree_mask,
        kv_indptr_flat=kv_indptr_flat, num_pages=num_pages, kv_indptr_pages=kv_indptr_pages,
        kv_indices=page_ids.contiguous(), kv_len=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        token_slots=token_slots, draft_slots=draft_slots,
        prefix_indptr=_indptr(prefix_lens, device), prefix_slots=prefix_slots,
        prefix_lens_t=torch.tensor(prefix_lens, dtype=torch.int32, device=device),
        kv_slot_runs=slot_runs if kv_slot_runs_hint is None else kv_slot_runs_hint,
    )


def make_inputs(case: Case, index: int = 0) -> InputSet:
    """Random values for ``case`` (set ``index`` of the rotation)."""
    s = case.shape
    dev, dt = case.device, case.dtype
    g = torch.Generator(device=dev).manual_seed(case.seed * 1000003 + 17 * index + 1)
    q = torch.randn((case.total_q, s.heads, s.d_qk), generator=g, dtype=dt, device=dev)
    ps = case.page_size
    lead = (case.num_slots,) if ps == 1 else (case.num_pages, ps)
    k_cache = torch.randn(lead + (s.kv_heads, s.d_qk), generator=g, dtype=dt, device=dev)
    k_slots = k_cache.view(case.num_slots, s.kv_heads, s.d_qk)
    if s.mla:
        v_cache = None
        v_slots = k_slots[..., : s.d_vo]
    else:
        v_cache = torch.randn(lead + (s.kv_heads, s.d_vo), generator=g, dtype=dt, device=dev)
        v_slots = v_cache.view(case.num_slots, s.kv_heads, s.d_vo)
    k_flat = k_slots[case.token_slots]
    v_flat = None if s.mla else v_slots[case.token_slots]
    k_ext = k_slots[case.draft_slots].contiguous()
    v_ext = v_slots[case.draft_slots].contiguous()
    return InputSet(q=q, k_cache=k_cache, v_cache=v_cache, k_slots=k_slots, v_slots=v_slots,
                    k_flat=k_flat, v_flat=v_flat, k_ext=k_ext, v_ext=v_ext)


def call_bytes(shape) -> int:
    """Bytes one call touches (KV + queries + output): decides L2 rotation."""
    from . import floor

    e = 2
    q = sum(shape.request_q_lens()) * shape.heads * (shape.d_qk + shape.d_vo) * e
    return floor.kv_bytes(shape) + q


def set_bytes_estimate(shape, page_size: int = 1) -> int:
    """Device bytes of one :class:`InputSet` (cache with slack, flat copy, drafts, q)."""
    e = 2
    kv_tokens = sum(shape.request_prefix_lens()) + sum(shape.request_q_lens())
    row = shape.kv_heads * (shape.d_qk + (0 if shape.mla else shape.d_vo)) * e
    cache = int(kv_tokens * (1 + POOL_SLACK) + page_size * shape.batch) * row
    return 2 * cache + sum(shape.request_q_lens()) * shape.heads * (shape.d_qk + shape.d_vo) * e * 2
