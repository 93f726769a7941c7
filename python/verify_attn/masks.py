"""Compact tree masks for verify_attn.

The kernel reads the tree mask as ``uint32 [total_q, W]`` with
``W >= ceil(max_q_len / 32)`` (``va_params.tree_mask`` / ``mask_words`` in
``kernels/verify_attn.h``). Row ``qo_indptr[i] + t`` belongs to query row ``t``
of request ``i``; bit ``c % 32`` (little-endian bit order) of word ``c // 32``
is set iff draft token ``c`` of the same request is visible to ``t`` -- an
ancestor of ``t`` in the draft tree, or ``t`` itself. The committed prefix is
always visible and is never represented in the mask. Bits at ``c >= q_len_i``
are ignored by the kernel; the builders here leave them 0.

**Returned dtype.** Every builder returns a contiguous ``torch.int32`` tensor
holding the bit pattern (bit 31 set means a negative int32). int32 is used
because it is the most portable integer dtype across torch versions and
devices; the kernel reinterprets the memory as uint32. ``bits.view(torch.uint32)``
(torch >= 2.3) gives the unsigned view if one is wanted; the attention API
accepts both.

Builders are vectorized torch code (a loop over ``log2(depth)`` pointer-doubling
steps or over 32-bit words at most, never over nodes) and run on the device of
their inputs, CPU or CUDA. ``from_parents`` can run without any device->host
synchronization (``validate=False`` and ``max_q_len`` given), so it can be
captured in a CUDA graph; the others read ``qo_indptr`` on the host.

``max_q_len`` follows one rule in every builder: an integer in ``[0, 1024]``,
``>=`` every request's ``q_len`` whenever the lengths are read on the host;
otherwise TypeError/ValueError naming ``max_q_len``.

Index naming follows FlashInfer: ``qo_indptr`` is the ``[B + 1]`` exclusive
prefix sum of per-request query (draft) counts.
"""

import math
from typing import List, Optional, Sequence, Union

import torch

from ._args import as_bool, as_int
from ._checks import check_int_tensor

__all__ = [
    "mask_words",
    "from_parents",
    "from_dense",
    "from_sglang_full_mask",
    "from_sglang_qlen_only",
    "from_sglang_qlen_bitpacked",
    "to_dense",
    "causal",
]

MAX_Q_LEN = 1024  # the kernel's bound on q_len (va_params.max_q_len <= 1024)

_SHIFTS_CACHE = {}


def mask_words(max_q_len: int) -> int:
    """Number of uint32 words per mask row for ``max_q_len`` draft tokens.

    Returns ``max(1, ceil(max_q_len / 32))`` (at least one word so that the
    mask tensor is never zero-width).

    Raises:
      TypeError: ``max_q_len`` not an integer (``as_int``: no str, float or bool).
      ValueError: ``max_q_len`` negative.
    """
    max_q_len = as_int(max_q_len, "max_q_len")
    if max_q_len < 0:
        raise ValueError(f"max_q_len: must be >= 0, got {max_q_len}")
    return max(1, (max_q_len + 31) // 32)


# ---------------------------------------------------------------------------
# small helpers


def _shifts(device) -> torch.Tensor:
    key = str(device)
    t = _SHIFTS_CACHE.get(key)
    if t is None:
        t = torch.arange(32, dtype=torch.int64, device=device)
        _SHIFTS_CACHE[key] = t
    return t


def _to_int32_bits(words64: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2**32) -> int32 with the same low 32 bits (wrapping)."""
    wrapped = torch.where(words64 >= 2**31, words64 - 2**32, words64)
    return wrapped.to(torch.int32).contiguous()


def pack_bool_rows(vis: torch.Tensor, num_words: int) -> torch.Tensor:
    """Pack visibility rows into the compact mask's words.

    Args:
      vis: bool ``[N, C]`` with ``C <= 32 * num_words``; ``vis[r, c]``: row ``r``
        sees draft column ``c``.
      num_words: words per row (see :func:`mask_words`).

    Returns:
      ``torch.int32 [N, num_words]`` holding the uint32 bit pattern (bit ``c % 32``
      of word ``c // 32``), on ``vis``'s device.
    """
    n, c = vis.shape
    if c < num_words * 32:
        padded = torch.zeros((n, num_words * 32), dtype=torch.bool, device=vis.device)
        padded[:, :c] = vis
        vis = padded
    v64 = vis.reshape(n, num_words, 32).to(torch.int64)
    words = (v64 << _shifts(vis.device)).sum(dim=-1)
    return _to_int32_bits(words)


def _unpack_words(bits: torch.Tensor) -> torch.Tensor:
    """int32/uint32 [N, W] -> bool [N, 32 * W]."""
    if bits.dtype != torch.int32:
        bits = bits.view(torch.int32) if bits.element_size() == 4 else bits.to(torch.int32)
    w64 = bits.to(torch.int64) & 0xFFFFFFFF
    b = (w64.unsqueeze(-1) >> _shifts(bits.device)) & 1
    return b.reshape(bits.shape[0], 32 * bits.shape[1]).bool()  # explicit: 0 rows is a valid mask


def _check_indptr(qo_indptr: torch.Tensor, name: str = "qo_indptr") -> None:
    if not isinstance(qo_indptr, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(qo_indptr).__name__}")
    if qo_indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected an int32 or int64 tensor, got {qo_indptr.dtype}")
    if qo_indptr.dim() != 1 or qo_indptr.numel() < 1:
        raise ValueError(f"{name}: expected shape [B + 1] with B >= 0, got {tuple(qo_indptr.shape)}")


def _validate_indptr_order(qo_indptr: torch.Tensor, name: str = "qo_indptr") -> None:
    """Host-synchronizing checks: starts at 0, non-decreasing."""
    ind = qo_indptr.to(torch.int64)
    if int(ind[0]) != 0:
        raise ValueError(f"{name}: must start at 0, got {int(ind[0])}")
    if ind.numel() > 1 and bool((ind[1:] < ind[:-1]).any()):
        i = int(torch.nonzero(ind[1:] < ind[:-1])[0, 0])
        raise ValueError(
            f"{name}: must be non-decreasing; decreasing at request {i} "
            f"({name}[{i}] = {int(ind[i])} > {name}[{i + 1}] = {int(ind[i + 1])})"
        )


def _validate_indptr_values(qo_indptr: torch.Tensor, total_q: int, name: str = "qo_indptr") -> None:
    """Host-synchronizing checks of an indptr's values."""
    _validate_indptr_order(qo_indptr, name)
    ind = qo_indptr.to(torch.int64)
    if int(ind[-1]) != total_q:
        raise ValueError(f"{name}: last entry {int(ind[-1])} != number of rows {total_q}")
    q_lens = ind[1:] - ind[:-1]
    if q_lens.numel() and int(q_lens.max()) > MAX_Q_LEN:
        raise ValueError(f"{name}: a request has {int(q_lens.max())} draft rows, more than {MAX_Q_LEN}")


def _row_request_and_local(qo_indptr: torch.Tensor, total_q: int):
    """For every row 0..total_q-1: its request index and its local index.

    Uses searchsorted so that no host sync is needed (total_q comes from a shape).
    """
    ind = qo_indptr.to(torch.int64)
    rows = torch.arange(total_q, dtype=torch.int64, device=ind.device)
    req = torch.searchsorted(ind[1:].contiguous(), rows, right=True)
    # clamp for robustness against malformed indptr (validated elsewhere)
    req = req.clamp_(max=max(ind.numel() - 2, 0))
    local = rows - ind[req]
    return req, local


def _as_device(device, name: str) -> torch.device:
    """``torch.device(device)``, its errors named: TypeError for a type it does
    not take, ValueError for a string or index that is no device, and for a
    CUDA device when torch has no CUDA or not that many CUDA devices (instead
    of torch's AssertionError / invalid-ordinal error at the first copy)."""
    try:
        dev = torch.device(device)
    except TypeError:
        raise TypeError(
            f"{name}: expected a str, int or torch.device, got {type(device).__name__} {device!r}"
        ) from None
    except RuntimeError as e:
        raise ValueError(f"{name}: {device!r} is not a device ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}: CUDA is not available ({device!r}; torch.cuda.is_available() is False)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{name}: {device!r} names CUDA device {dev.index}; torch sees {count}")
    return dev


def _check_max_q_len(max_q_len, real_max: Optional[int] = None) -> int:
    """The ``max_q_len`` rule of every builder: an integer (``as_int``: no str,
    float or bool) in ``[0, MAX_Q_LEN]`` and, when the longest request
    ``real_max`` is known (read on the host), ``>= real_max``. None means
    ``real_max``."""
    if max_q_len is None:
        max_q_len = real_max
    max_q_len = as_int(max_q_len, "max_q_len")
    if max_q_len < 0 or max_q_len > MAX_Q_LEN:
        raise ValueError(f"max_q_len: must be in [0, {MAX_Q_LEN}], got {max_q_len}")
    if real_max is not None and max_q_len < real_max:
        raise ValueError(f"max_q_len: {max_q_len} is smaller than the longest request ({real_max})")
    return max_q_len


def _max_q_len_host(qo_indptr: torch.Tensor) -> int:
    if qo_indptr.numel() < 2:
        return 0
    ind = qo_indptr.to(torch.int64)
    return int((ind[1:] - ind[:-1]).max())


# ---------------------------------------------------------------------------
# builders


def from_parents(
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
    validate: bool = True,
) -> torch.Tensor:
    """Build the compact tree mask from per-node parent indices.

    Args:
      parents: integer tensor ``[total_q]`` (int32 or int64). ``parents[qo_indptr[i] + t]``
        is the LOCAL index (0-based within request ``i``) of the parent of draft
        token ``t``, or ``-1`` for a root, i.e. a node attached directly to the
        committed prefix. Several roots per request are allowed (a forest).
        Topological order is NOT required: a parent may come after its child.
      qo_indptr: ``[B + 1]`` int32/int64, exclusive prefix sum of the number of
        draft tokens per request (FlashInfer naming), on the same device.
      max_q_len: upper bound of any ``q_len_i`` (an int in ``[0, 1024]``, checked
        against the real lengths when they are read); sets the width
        ``W = max(1, ceil(max_q_len / 32))``. Computed from ``qo_indptr`` when
        None (a device->host sync). Every builder follows this rule.
      validate (bool): check the values (range, no self-parent, no cycles). This
        synchronizes with the host; pass False (with ``max_q_len``) to build the
        mask inside a CUDA graph. Invalid input with ``validate=False`` gives an
        unspecified mask (no crash, no out-of-bounds access).

    Returns:
      ``torch.int32 [total_q, W]`` bit pattern, on the device of ``parents``:
      bit ``c % 32`` of word ``c // 32`` in row ``qo_indptr[i] + t`` is set iff
      ``c`` is ``t`` or an ancestor of ``t``.

    Raises:
      TypeError: ``parents``/``qo_indptr`` not integer tensors, ``max_q_len``
        not an integer, ``validate`` not a bool.
      ValueError: ``max_q_len`` outside ``[0, 1024]`` (or, ``validate=True``,
        below a request's ``q_len``). With ``validate=True``: a parent index outside ``[-1, q_len_i)``,
        a node that is its own parent, a cycle, ``qo_indptr`` malformed or
        inconsistent with ``parents.shape[0]``, or ``q_len_i > 1024``.

    Algorithm: pointer doubling over the parent links. Step ``k`` ORs into each
    node's bit row the row of its ``2**k``-th ancestor, so ``ceil(log2(q_len))``
    vectorized steps cover any depth and any node order.
    """
    if not isinstance(parents, torch.Tensor):
        raise TypeError(f"parents: expected a torch.Tensor, got {type(parents).__name__}")
    if parents.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"parents: expected an integer tensor, got {parents.dtype}")
    if parents.dim() != 1:
        raise ValueError(f"parents: expected shape [total_q], got {tuple(parents.shape)}")
    _check_indptr(qo_indptr)
    if qo_indptr.device != parents.device:
        raise ValueError(f"qo_indptr: on {qo_indptr.device}, but parents is on {parents.device}")
    total_q = parents.shape[0]
    device = parents.device
    validate = as_bool(validate, "validate")
    if validate:
        _validate_indptr_values(qo_indptr, total_q)
    # the longest request is read when validating (already a sync) or when needed
    real_max = _max_q_len_host(qo_indptr) if validate or max_q_len is None else None
    max_q_len = _check_max_q_len(max_q_len, real_max)
    num_words = mask_words(max_q_len)
    if total_q == 0:
        return torch.zeros((0, num_words), dtype=torch.int32, device=device)
    if qo_indptr.numel() < 2:  # no request but rows (validate=False): unspecified, here empty rows
        return torch.zeros((total_q, num_words), dtype=torch.int32, device=device)

    par = parents.to(torch.int64)
    req, local = _row_request_and_local(qo_indptr, total_q)
    ind = qo_indptr.to(torch.int64)
    q_len_row = ind[req + 1] - ind[req]
    if validate:
        bad = (par < -1) | (par >= q_len_row)
        if bool(bad.any()):
            r = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"parents: entry {r} (request {int(req[r])}, node {int(local[r])}) is "
                f"{int(par[r])}, outside [-1, {int(q_len_row[r])})"
            )
        selfp = par == local
        if bool(selfp.any()):
            r = int(torch.nonzero(selfp)[0, 0])
            raise ValueError(f"parents: entry {r} (request {int(req[r])}, node {int(local[r])}) is its own parent")
    if validate and int(local.max()) >= 32 * num_words:
        raise ValueError(f"max_q_len: {max_q_len} is smaller than a request's q_len")

    sentinel = total_q  # the "prefix" node: no bits, its own parent
    gpar = torch.where(par < 0, torch.full_like(par, sentinel), ind[req] + par)
    gpar = gpar.clamp_(0, sentinel)  # robustness when validate=False
    gpar = torch.cat([gpar, torch.tensor([sentinel], dtype=torch.int64, device=device)])

    # own bit of every node as int64 words
    words = torch.zeros((total_q + 1, num_words), dtype=torch.int64, device=device)
    lc = local.clamp(0, 32 * num_words - 1)
    words[torch.arange(total_q, device=device), lc // 32] = torch.ones(
        (), dtype=torch.int64, device=device
    ) << (lc % 32)

    # pointer doubling: after step k, words[v] covers v and its ancestors up to 2**(k+1)-1 above.
    steps = max(1, math.ceil(math.log2(max(max_q_len, 2))))
    anc = gpar
    for _ in range(steps):
        words = words | words[anc]
        anc = anc[anc]
    if validate:
        # every chain of length <= q_len ends at the sentinel; otherwise there is a cycle
        if bool((anc[:total_q] != sentinel).any()):
            r = int(torch.nonzero(anc[:total_q] != sentinel)[0, 0])
            raise ValueError(
                f"parents: the parent links of request {int(req[r])} contain a cycle (node {int(local[r])})"
            )
    return _to_int32_bits(words[:total_q])


def _check_01(m: torch.Tensor, what: str) -> None:
    """An integer (not bool) dense mask holds only 0 and 1 (ValueError naming ``what``)."""
    if m.dtype != torch.bool:
        bad = (m != 0) & (m != 1)
        if bool(bad.any()):
            raise ValueError(f"{what} holds {int(m[bad][0])}; an integer mask must hold only 0 and 1")


def _dense_to_padded(ancestor_bool, qo_indptr: torch.Tensor):
    """Accept a list of [q_i, q_i] or a padded [B, max_q, max_q]; return padded bool."""
    B = qo_indptr.numel() - 1
    if isinstance(ancestor_bool, torch.Tensor):
        if ancestor_bool.dim() != 3 or ancestor_bool.shape[1] != ancestor_bool.shape[2]:
            raise ValueError(
                f"ancestor_bool: expected a padded [B, max_q, max_q] tensor or a list of [q_len, q_len], "
                f"got shape {tuple(ancestor_bool.shape)}"
            )
        if ancestor_bool.shape[0] != B:
            raise ValueError(f"ancestor_bool: has {ancestor_bool.shape[0]} requests, qo_indptr has {B}")
        if ancestor_bool.is_floating_point() or ancestor_bool.is_complex():
            raise TypeError(f"ancestor_bool: expected a bool or integer tensor, got {ancestor_bool.dtype}")
        _check_01(ancestor_bool, "ancestor_bool:")
        return ancestor_bool != 0
    if not isinstance(ancestor_bool, (list, tuple)):
        raise TypeError(
            f"ancestor_bool: expected a tensor or a list of tensors, got {type(ancestor_bool).__name__}"
        )
    if len(ancestor_bool) != B:
        raise ValueError(f"ancestor_bool: has {len(ancestor_bool)} requests, qo_indptr has {B}")
    q_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
    max_q = max([0] + [int(x) for x in q_lens])
    out = torch.zeros((B, max_q, max_q), dtype=torch.bool, device=qo_indptr.device)
    for i, (m, q) in enumerate(zip(ancestor_bool, q_lens)):
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"ancestor_bool: element {i} is not a tensor")
        if m.is_floating_point() or m.is_complex():
            raise TypeError(f"ancestor_bool: element {i} has dtype {m.dtype}; expected bool or integer")
        if tuple(m.shape) != (q, q):
            raise ValueError(f"ancestor_bool: element {i} has shape {tuple(m.shape)}, expected ({q}, {q})")
        _check_01(m, f"ancestor_bool: element {i}")
        out[i, :q, :q] = m.to(out.device) != 0
    return out


def from_dense(
    ancestor_bool: Union[torch.Tensor, Sequence[torch.Tensor]],
    qo_indptr: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
) -> torch.Tensor:
    """Pack dense per-request visibility matrices into the compact tree mask.

    Args:
      ancestor_bool: either a list of ``B`` bool (or 0/1 integer) tensors of
        shape ``[q_len_i, q_len_i]``, or one padded ``[B, max_q, max_q]`` tensor
        (entries outside ``[:q_len_i, :q_len_i]`` are ignored). Entry ``[t, c]``
        is True (1) iff draft token ``c`` is visible to draft token ``t``. An
        integer tensor must hold only 0 and 1 (the padding of a padded one
        included); any other value is refused, not read as True.
      qo_indptr: ``[B + 1]`` int32/int64 (FlashInfer naming).
      max_q_len: width bound, as in :func:`from_parents` (default: the real max).

    Returns:
      ``torch.int32 [total_q, W]`` bit pattern on ``qo_indptr``'s device.

    Raises:
      TypeError: float inputs or non-tensors, ``max_q_len`` not an integer.
      ValueError: an integer ``ancestor_bool`` holding a value other than 0 and
      1 (the message names the element), shapes inconsistent with
      ``qo_indptr``, ``q_len_i > 1024``, ``max_q_len`` outside ``[0, 1024]`` or
      below the longest request.

    No check is made that the matrix is a tree (any visibility pattern is
    representable and the kernel applies it as given).
    """
    _check_indptr(qo_indptr)
    total_q = int(qo_indptr[-1])
    _validate_indptr_values(qo_indptr, total_q)
    padded = _dense_to_padded(ancestor_bool, qo_indptr)
    real_max = _max_q_len_host(qo_indptr)
    max_q_len = _check_max_q_len(max_q_len, real_max)
    num_words = mask_words(max_q_len)
    device = padded.device
    qo = qo_indptr.to(device)
    if total_q == 0:
        return torch.zeros((0, num_words), dtype=torch.int32, device=device)
    if padded.shape[1] < real_max:
        raise ValueError(
            f"ancestor_bool: padded size {padded.shape[1]} is smaller than the longest request ({real_max})"
        )
    req, local = _row_request_and_local(qo, total_q)
    rows = padded[req, local]  # [total_q, max_q]
    ind = qo.to(torch.int64)
    q_len_row = (ind[req + 1] - ind[req]).unsqueeze(1)
    cols = torch.arange(rows.shape[1], device=device).unsqueeze(0)
    rows = rows & (cols < q_len_row)
    if rows.shape[1] > 32 * num_words:
        rows = rows[:, : 32 * num_words]
    return pack_bool_rows(rows, num_words)


def _gather_pack_words(flat: torch.Tensor, row_base: torch.Tensor, q_len_row: torch.Tensor, num_words: int):
    """For each row r: bits c in [0, q_len_row[r]) read from flat[row_base[r] + c] (any
    nonzero value is a set bit; reads clamped to flat). Loops over words; no host sync."""
    total_q = row_base.shape[0]
    device = flat.device
    out = torch.empty((total_q, num_words), dtype=torch.int64, device=device)
    sh = _shifts(device)
    n = flat.numel()
    for w in range(num_words):
        cols = (w * 32 + sh).unsqueeze(0)  # [1, 32]
        valid = cols < q_len_row.unsqueeze(1)
        idx = (row_base.unsqueeze(1) + cols).clamp_(0, max(n - 1, 0))
        vals = flat[idx]
        if vals.dtype != torch.bool:
            vals = vals != 0
        vals = vals & valid
        out[:, w] = (vals.to(torch.int64) << sh).sum(dim=1)
    return _to_int32_bits(out)


# SGLang's verify-mask layouts, in one place: the builders below (ragged batches,
# validated, reading the lengths on the host) and the SGLang plugin's converters
# (verify_attn_sglang.metadata: uniform batches, static shapes, no host sync, for
# CUDA-graph replays) both read the masks through these.


def _qlen_only_row_starts(starts, q_len, req, local):
    """QLEN_ONLY: request ``r`` owns the row-major ``[q_len_r, q_len_r]`` block at
    ``starts[r]``; row ``local`` of request ``req`` starts at this flat offset
    (int64 tensors on one device; ``req`` / ``local`` per row)."""
    return starts[req] + local * q_len[req]


def _full_mask_row_starts(starts, prefix, q_len, req, local):
    """FULL_MASK: request ``r`` owns the row-major ``[q_len_r, prefix_r + q_len_r]``
    block at ``starts[r]`` (KV columns: the prefix, then the drafts); the draft
    columns of row ``local`` of request ``req`` start at this flat offset."""
    return starts[req] + local * (prefix[req] + q_len[req]) + prefix[req]


def _sglang_uniform_bits(mask: torch.Tensor, bs: int, n: int, num_words: int,
                         prefix_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SGLang's verify mask of ``bs`` requests of ``n`` drafts each (requests
    concatenated, as SGLang writes it) -> ``torch.int32 [bs * n, num_words]``:
    QLEN_ONLY when ``prefix_lens`` is None, else FULL_MASK over these prefix
    lengths (``[>= bs]`` integer tensor, read on the device, blocks at the
    exclusive cumsum of their sizes). Static shapes, no host synchronization
    (CUDA-graph safe); a bool or integer mask (nonzero: visible), reads clamped
    to its last element: the caller checks the sizes."""
    flat = mask.reshape(-1)
    device = flat.device
    rows = torch.arange(bs * n, device=device, dtype=torch.int64)
    req = rows // n
    local = rows - req * n
    q_len = torch.full((bs,), n, dtype=torch.int64, device=device)
    if prefix_lens is None:
        starts = torch.arange(bs, device=device, dtype=torch.int64) * (n * n)
        base = _qlen_only_row_starts(starts, q_len, req, local)
    else:
        pre = prefix_lens[:bs].to(device=device, dtype=torch.int64)
        sizes = q_len * (pre + q_len)
        starts = torch.cumsum(sizes, 0) - sizes
        base = _full_mask_row_starts(starts, pre, q_len, req, local)
    return _gather_pack_words(flat, base, q_len[req], num_words)


def _as_flat_bool(mask: torch.Tensor, name: str) -> torch.Tensor:
    """A bool or 0/1 integer mask, flattened to bool. A bool mask is only viewed
    (no pass over it); an integer one is checked whole by ``_check_01``."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(mask).__name__}")
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(f"{name}: expected a bool (or 0/1 integer) tensor, got {mask.dtype}")
    if mask.dtype == torch.bool:
        return mask.reshape(-1)
    _check_01(mask, f"{name}:")
    return mask.reshape(-1) != 0


def from_sglang_full_mask(
    custom_mask: torch.Tensor,
    qo_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
    mask_indptr: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Convert SGLang's FULL_MASK tree mask (``TreeMaskMode.FULL_MASK``) to compact bits.

    Layout (confirmed in SGLang's source, see below): a flat bool buffer; request
    ``i`` owns ``q_len_i * (prefix_len_i + q_len_i)`` consecutive entries starting
    at ``mask_indptr[i]`` (the exclusive cumsum of those sizes), stored row-major:
    entry ``mask_indptr[i] + t * (prefix_len_i + q_len_i) + j`` says whether query
    row ``t`` sees KV column ``j``. Columns ``[0, prefix_len_i)`` are the committed
    prefix, ``[prefix_len_i, prefix_len_i + q_len_i)`` are the draft tokens; only
    these last ``q_len_i`` columns are read here (the prefix part is not checked:
    SGLang may skip filling it, ``fill_prefix_mask=False``).

    Sources read (sgl-project/sglang):
      - ``sgl-kernel/csrc/speculative/eagle_utils.cu::build_tree_efficient``: the
        block of request ``bid`` starts at ``sum_{i<bid} seq_len_i * q + bid * q * q``
        and row ``tid`` at ``(seq_len + q) * tid``; the tree cells are written at
        column ``seq_len + c``.
      - ``python/sglang/srt/speculative/eagle_utils.py::build_tree_kernel_efficient``
        allocates ``seq_lens_sum * q + q * q * bs`` bools filled with True.
      - the Triton backend's target-verify metadata: ``seq_mask_len = q * (seq_lens + q)``,
        ``mask_indptr[1:] = cumsum(seq_mask_len)``; and
        ``extend_attention.py::_fwd_kernel`` reads
        ``mask_ptr + mask_indptr[i] + row * cur_seq_len + cur_seq_len_prefix + col``
        for the draft columns (``cur_seq_len = prefix + extend``).
      - ``verify_mask.py`` (``VerifyMask``, ``tree_mask_numel``): FULL_MASK needs
        ``num_draft_tokens * (max_context_len + num_draft_tokens)`` cells per request.

    Args:
      custom_mask: flat bool (or 0/1 integer) tensor with at least
        ``sum_i q_len_i * (prefix_len_i + q_len_i)`` entries (a larger,
        preallocated buffer is accepted; the tail is ignored). An integer
        tensor must hold only 0 and 1 in all its entries (prefix columns and
        tail included); any other value is refused, not read as True. A bool
        one is not scanned.
      qo_indptr: ``[B + 1]`` int32/int64. SGLang's target verify uses
        ``arange(0, (bs + 1) * q, q)``; ragged ``q_len_i`` are accepted.
      prefix_lens: ``[B]`` integer tensor (not bool), the committed prefix length
        of each request (SGLang's ``seq_lens`` during target verify, which
        excludes the drafts).
      max_q_len: width bound (default: the real max, a host sync).
      mask_indptr: optional ``[B + 1]`` integer tensor of the blocks' offsets
        (SGLang's ``mask_indptr``, each ``>= 0``): request ``i``'s block is
        ``[mask_indptr[i], mask_indptr[i + 1])``, so every
        ``mask_indptr[i + 1] - mask_indptr[i]`` must be
        ``q_len_i * (prefix_len_i + q_len_i)`` and ``mask_indptr[B]`` at most
        ``custom_mask.numel()``. SGLang's starts at 0, making ``mask_indptr[B]``
        the sum of those sizes; a later start is accepted. Computed from the
        lengths when None. Read on the host, like ``qo_indptr``.

    Returns:
      ``torch.int32 [total_q, W]`` on ``custom_mask``'s device.

    Raises:
      TypeError: wrong dtypes (``prefix_lens`` or ``mask_indptr`` not an
      integer tensor, bool included), ``max_q_len`` not an integer.
      ValueError: an integer ``custom_mask`` holding a value other than 0 and
      1, shapes inconsistent (``mask_indptr`` not ``[B + 1]``
      included), buffer too small (every request's block must lie in it),
      negative prefix lengths or ``mask_indptr`` offsets, a ``mask_indptr``
      block whose size is not the FULL layout's ``q_len_i * (prefix_len_i +
      q_len_i)``, ``max_q_len`` outside ``[0, 1024]`` or below the longest
      request.
    """
    flat = _as_flat_bool(custom_mask, "custom_mask")
    _check_indptr(qo_indptr)
    check_int_tensor(prefix_lens, "prefix_lens", "[B]")
    B = qo_indptr.numel() - 1
    if prefix_lens.dim() != 1 or prefix_lens.numel() != B:
        raise ValueError(f"prefix_lens: expected shape [{B}], got {tuple(prefix_lens.shape)}")
    device = flat.device
    ind = qo_indptr.to(device=device, dtype=torch.int64)
    pre = prefix_lens.to(device=device, dtype=torch.int64)
    total_q = int(ind[-1])
    _validate_indptr_values(ind, total_q)
    if B and bool((pre < 0).any()):
        raise ValueError("prefix_lens: must be >= 0")
    q_lens = ind[1:] - ind[:-1]
    sizes = q_lens * (pre + q_lens)
    if mask_indptr is None:
        starts = torch.cumsum(sizes, 0) - sizes
        needed = int(sizes.sum())
    else:
        check_int_tensor(mask_indptr, "mask_indptr", f"[{B} + 1]")
        if mask_indptr.dim() != 1 or mask_indptr.numel() != B + 1:
            raise ValueError(f"mask_indptr: expected shape [{B} + 1], got {tuple(mask_indptr.shape)}")
        mi = mask_indptr.to(device=device, dtype=torch.int64)
        if bool((mi < 0).any()):
            i = int(torch.nonzero(mi < 0)[0, 0])
            raise ValueError(f"mask_indptr: entry {i} is {int(mi[i])}; offsets must be >= 0")
        spans = mi[1:] - mi[:-1]
        if B and bool((spans != sizes).any()):
            i = int(torch.nonzero(spans != sizes)[0, 0])
            raise ValueError(
                f"mask_indptr: request {i} spans mask_indptr[{i + 1}] - mask_indptr[{i}] = {int(spans[i])} "
                f"entries; the FULL layout needs q_len * (prefix_len + q_len) = {int(sizes[i])}"
            )
        starts = mi[:B]
        needed = int(mi[B])  # the end of the last block
    if flat.numel() < needed:
        where = "" if mask_indptr is None else f" (mask_indptr[{B}] = {needed})"
        raise ValueError(f"custom_mask: has {flat.numel()} entries, the layout needs {needed}{where}")
    real_max = int(q_lens.max()) if B else 0
    max_q_len = _check_max_q_len(max_q_len, real_max)
    num_words = mask_words(max_q_len)
    if total_q == 0:
        return torch.zeros((0, num_words), dtype=torch.int32, device=device)
    req, local = _row_request_and_local(ind, total_q)
    row_base = _full_mask_row_starts(starts, pre, q_lens, req, local)
    return _gather_pack_words(flat, row_base, q_lens[req], num_words)


def from_sglang_qlen_only(
    mask: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
) -> torch.Tensor:
    """Convert SGLang's QLEN_ONLY tree mask (``TreeMaskMode.QLEN_ONLY``) to compact bits.

    Layout (confirmed in SGLang's source): a flat bool buffer, request ``i`` owns
    ``q_len_i * q_len_i`` consecutive entries (row-major ``[t, c]``: does draft
    row ``t`` see draft column ``c``), requests concatenated in order.
    ``sgl-kernel/csrc/speculative/eagle_utils.cu::build_tree_efficient`` writes row
    ``tid`` of request ``bid`` at ``q * q * bid + q * tid`` (with q the common
    draft count) and ``eagle_utils.py::build_tree_kernel_efficient`` allocates
    ``q * bs * q`` bools; ``verify_mask.py::tree_mask_numel`` sizes it
    ``num_draft_tokens ** 2`` per request. SGLang uses it for its CPU verify
    kernel (``default_tree_mask_mode``). Ragged ``q_len_i`` are accepted here
    (offsets are the exclusive cumsum of ``q_len_i ** 2``).

    Args:
      mask: flat bool (or 0/1 integer) tensor with >= ``sum_i q_len_i ** 2``
        entries. An integer tensor must hold only 0 and 1 in all its entries
        (any tail included); any other value is refused, not read as True. A
        bool one is not scanned.
      qo_indptr: ``[B + 1]`` int32/int64.
      max_q_len: width bound (default: the real max).

    Returns:
      ``torch.int32 [total_q, W]`` on ``mask``'s device.

    Raises:
      TypeError: wrong dtypes, ``max_q_len`` not an integer. ValueError: an
      integer ``mask`` holding a value other than 0 and 1, buffer too small,
      bad ``qo_indptr``, ``max_q_len`` outside ``[0, 1024]`` or below the
      longest request.
    """
    flat = _as_flat_bool(mask, "mask")
    _check_indptr(qo_indptr)
    device = flat.device
    ind = qo_indptr.to(device=device, dtype=torch.int64)
    total_q = int(ind[-1])
    _validate_indptr_values(ind, total_q)
    q_lens = ind[1:] - ind[:-1]
    sizes = q_lens * q_lens
    starts = torch.cumsum(sizes, 0) - sizes
    needed = int(sizes.sum())
    if flat.numel() < needed:
        raise ValueError(f"mask: has {flat.numel()} entries, the QLEN_ONLY layout needs {needed}")
    real_max = int(q_lens.max()) if q_lens.numel() else 0
    max_q_len = _check_max_q_len(max_q_len, real_max)
    num_words = mask_words(max_q_len)
    if total_q == 0:
        return torch.zeros((0, num_words), dtype=torch.int32, device=device)
    req, local = _row_request_and_local(ind, total_q)
    row_base = _qlen_only_row_starts(starts, q_lens, req, local)
    return _gather_pack_words(flat, row_base, q_lens[req], num_words)


def from_sglang_qlen_bitpacked(
    mask: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
) -> torch.Tensor:
    """Convert SGLang's QLEN_ONLY_BITPACKING mask to compact bits.

    Layout (``eagle_utils.cu::build_tree_efficient_partial_packed`` and
    ``eagle_utils.py::build_tree_kernel_efficient``): one packed element per
    draft row, ``[total_q]`` of uint8 (q <= 8), uint16 (q <= 16) or uint32
    (q <= 32); bit ``c % 8`` of byte ``c // 8`` (little-endian) marks draft column
    ``c``. A ``[total_q, nbytes]`` uint8 tensor is accepted too. This equals
    our word layout for the first 32 columns.

    Args:
      mask: the packed rows, ``[total_q]`` uint8 / int16 / uint16 / int32 /
        uint32 or ``[total_q, nbytes]`` uint8.
      qo_indptr: ``[B + 1]`` int32/int64 row offsets (``total_q = qo_indptr[-1]``).
      max_q_len: words per row from this bound; default the longest request.

    Returns ``torch.int32 [total_q, W]`` on ``mask``'s device.

    Raises:
      TypeError: ``mask`` not an integer tensor, bad ``qo_indptr`` type,
      ``max_q_len`` not an integer. ValueError: ``mask`` not ``[total_q]`` /
      ``[total_q, nbytes]`` (a 0-d tensor included) or too narrow, bad
      ``qo_indptr``, ``max_q_len`` outside ``[0, 1024]`` or below the longest
      request.
    """
    if not isinstance(mask, torch.Tensor) or mask.is_floating_point() or mask.dtype == torch.bool:
        raise TypeError("mask: expected an integer tensor (uint8/int16/uint16/int32/uint32)")
    _check_indptr(qo_indptr)
    total_q = int(qo_indptr[-1])
    _validate_indptr_values(qo_indptr, total_q)
    if mask.dim() not in (1, 2) or mask.shape[0] < total_q:
        raise ValueError(f"mask: expected [total_q={total_q}] or [total_q, nbytes], got {tuple(mask.shape)}")
    m = mask[:total_q].contiguous()
    by = m.view(torch.uint8).reshape(total_q, -1).to(torch.int64)
    nbytes = by.shape[1]
    if nbytes > 4:
        raise ValueError(f"mask: {nbytes} bytes per row; at most 4 (32 draft tokens) in this layout")
    real_max = _max_q_len_host(qo_indptr)
    if real_max > 8 * nbytes:
        raise ValueError(f"mask: {nbytes} bytes per row cannot hold {real_max} draft tokens")
    max_q_len = _check_max_q_len(max_q_len, real_max)
    num_words = mask_words(max_q_len)
    word = (by << (8 * torch.arange(nbytes, device=by.device, dtype=torch.int64))).sum(dim=1)
    req, local = _row_request_and_local(qo_indptr.to(by.device), total_q)
    ind = qo_indptr.to(device=by.device, dtype=torch.int64)
    q_len_row = ind[req + 1] - ind[req]
    ones = torch.ones_like(q_len_row)
    keep = torch.bitwise_left_shift(ones, q_len_row.clamp(max=32)) - 1
    out = torch.zeros((total_q, num_words), dtype=torch.int64, device=by.device)
    out[:, 0] = word & keep
    return _to_int32_bits(out)


def to_dense(bits: torch.Tensor, qo_indptr: torch.Tensor) -> List[torch.Tensor]:
    """Inverse of the builders: compact bits -> list of ``B`` bool ``[q_len_i, q_len_i]``.

    Args:
      bits: int32 or uint32 ``[total_q, W]``.
      qo_indptr: ``[B + 1]`` int32/int64.

    Returns: list of bool tensors on ``bits``' device (entry ``[t, c]`` True iff
    draft token ``c`` is visible to draft token ``t``). Bits at ``c >= q_len_i``
    are ignored. Host sync (meant for tests and debugging).

    Raises:
      TypeError: ``bits`` not an int32/uint32 tensor, ``qo_indptr`` not an
      integer tensor. ValueError: ``bits`` not 2-D or too narrow, ``qo_indptr``
      not starting at 0, decreasing, or not ending at ``bits.shape[0]``.
    """
    _check_indptr(qo_indptr)
    if not isinstance(bits, torch.Tensor):
        raise TypeError(f"bits: expected a torch.Tensor, got {type(bits).__name__}")
    if bits.dtype not in (torch.int32, getattr(torch, "uint32", torch.int32)):
        raise TypeError(f"bits: expected dtype torch.int32 or torch.uint32, got {bits.dtype}")
    if bits.dim() != 2:
        raise ValueError(f"bits: expected [total_q, W], got {tuple(bits.shape)}")
    _validate_indptr_order(qo_indptr)
    dense = _unpack_words(bits)
    ind = qo_indptr.tolist()
    if ind[-1] != bits.shape[0]:
        raise ValueError(f"bits: has {bits.shape[0]} rows, qo_indptr says {ind[-1]}")
    out = []
    for i in range(len(ind) - 1):
        s, e = ind[i], ind[i + 1]
        q = e - s
        if q > dense.shape[1]:
            raise ValueError(f"bits: width {bits.shape[1]} words cannot hold q_len {q}")
        out.append(dense[s:e, :q].clone())
    return out


def causal(
    qo_indptr: torch.Tensor,
    *,
    max_q_len: Optional[int] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> torch.Tensor:
    """Compact mask of a chain (draft ``t`` sees drafts ``0..t``) for every request.

    Equivalent to ``mask_mode = VA_MASK_CAUSAL``; useful to exercise the tree path
    with a chain. Returns ``torch.int32 [total_q, W]``. Reads ``qo_indptr`` on
    the host (``total_q = qo_indptr[-1]`` and the checks below), a device->host
    sync even when ``max_q_len`` is given: build it outside CUDA graph capture.

    Args:
      qo_indptr: ``[B + 1]`` int32/int64 row offsets of the requests' drafts.
      max_q_len: words per row from this bound (``mask_words``); default the
        longest request.
      device: where the mask is built and returned (``qo_indptr`` is copied
        there): a ``torch.device``, or a str or int that ``torch.device``
        takes; default ``qo_indptr``'s device.

    Raises:
      TypeError: ``qo_indptr`` not an int32/int64 tensor, ``max_q_len`` not an
      integer, ``device`` of a type ``torch.device`` does not take.
      ValueError: ``qo_indptr`` not 1-D, not starting at 0, decreasing, or a
      ``q_len_i > 1024``; ``max_q_len`` outside ``[0, 1024]`` or below the
      longest request; ``device`` a string or index that names no device, or
      a CUDA device when CUDA is not available (``torch.cuda.is_available()``
      False) or its index is not below ``torch.cuda.device_count()``.
    """
    _check_indptr(qo_indptr)
    device = qo_indptr.device if device is None else _as_device(device, "device")
    ind = qo_indptr.to(device=device, dtype=torch.int64)
    total_q = int(ind[-1])
    _validate_indptr_values(ind, total_q)
    max_q_len = _check_max_q_len(max_q_len, _max_q_len_host(ind))
    num_words = mask_words(max_q_len)
    if total_q == 0:
        return torch.zeros((0, num_words), dtype=torch.int32, device=device)
    _, local = _row_request_and_local(ind, total_q)
    cols = torch.arange(32 * num_words, device=device).unsqueeze(0)
    return pack_bool_rows(cols <= local.unsqueeze(1), num_words)
