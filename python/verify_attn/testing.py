"""Helpers for checking verify_attn against its float64 reference.

``from verify_attn import testing`` -- a submodule that ``import verify_attn``
does not import and whose names are not in the top-level namespace. The test
suite (``python/tests``), the tools (``tools/checks``) and anyone writing their
own checks share it, as FlashAttention's ``tests/test_util.py`` and FlashMLA's
``tests/lib.py`` are shared by their tests:

* problems: :func:`make_problem` builds one verify batch as a :class:`Problem`:
  random draft trees (:func:`random_parents`, ``TREE_KINDS``) or given parents
  or dense visibility, ragged q / KV lengths (:func:`ragged_lengths`), MLA or
  GQA (:data:`MODELS`), a flat cache or a paged one with scattered pages or
  token slots (runs of 64, broken runs, shifted runs, scattered slots), NaN in
  every cache slot no request owns;
* launching: :func:`call` (the API call of a problem), :func:`run` (the call
  with ``out`` / ``lse`` NaN-poisoned before the launch,
  :func:`poisoned_outputs`), :func:`plan_info`, :func:`plan`;
  :func:`kernel_path` selects a kernel path (:data:`PATHS`) -- the one place
  that knows how;
* checking: :func:`reference` (the float64 reference of a problem),
  :func:`check` (relative error ``< 1e-2`` for the batch and for every request,
  LSE within ``1e-2`` natural log, NaN or inf never passes), :func:`rel_err`,
  :func:`nan_outside_view`, :func:`new_seed`;
* :func:`scaled_copy`: the toolchain's smoke kernel.

Example::

    from verify_attn import testing

    p = testing.make_problem([5, 16], [100, 700], model="mla_h16", layout="paged",
                             page_size=64, seed=1, device="cuda")
    out, lse = testing.run(p)     # out and lse NaN-filled before the launch
    testing.check(p, out, lse)    # AssertionError naming the errors when out of tolerance
"""

import contextlib
import dataclasses
import heapq
import math
import os
import random
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch

import verify_attn as _va

from . import _ext, masks
from ._args import as_int
from .reference import reference_attention_flat, reference_attention_paged

__all__ = [
    "TREE_KINDS",
    "random_parents",
    "Model",
    "MODELS",
    "ragged_lengths",
    "Problem",
    "make_problem",
    "call",
    "run",
    "poisoned_outputs",
    "nan_outside_view",
    "plan_info",
    "plan",
    "captured",
    "write_batch",
    "replayed",
    "KernelPath",
    "PATHS",
    "kernel_path",
    "PORTABLE_MLA",
    "SPLIT_MLA",
    "CLUSTER_MLA",
    "CP_ASYNC_MLA",
    "TMA_MLA",
    "TMA_ROWS_MLA",
    "ROLES_GQA",
    "ROLES_R32_GQA",
    "ONE_TILE_GQA",
    "reference",
    "rel_err",
    "check",
    "bad_request",
    "check_bad_request",
    "new_seed",
    "REL_TOL",
    "LSE_ATOL",
    "LSE_RTOL",
    "scaled_copy",
]

REL_TOL = 1e-2   # ||out - ref|| / ||ref||, for the batch and for every request
LSE_ATOL = 1e-2  # |lse - ref_lse| (natural log) ...
LSE_RTOL = 1e-3  # ... plus this times |ref_lse| where a check asks for it (check(lse_rtol=))


def new_seed() -> int:
    """A fresh random seed, or ``$VERIFY_ATTN_TEST_SEED`` to replay one (print it on failure)."""
    s = os.environ.get("VERIFY_ATTN_TEST_SEED")
    return int(s) if s else random.SystemRandom().randrange(2**31)


# ---------------------------------------------------------------------------
# draft trees

TREE_KINDS = ("chain", "star", "deep", "random", "ddtree", "eagle", "shuffled")


def random_parents(kind: str, n: int, *, rng: Optional[random.Random] = None, topk: int = 4) -> List[int]:
    """Random draft tree of ``n`` nodes as a list of local parent indices (``-1`` = root).

    kinds:
      ``chain``   0 <- 1 <- 2 ... (a causal chain);
      ``star``    node 0 is the root, every other node its child;
      ``deep``    mostly a chain (parent = previous node with prob. 0.85);
      ``random``  random recursive tree (parent uniform among earlier nodes; a few extra roots);
      ``ddtree``  best-first expansion (DDTree-like): a heap of candidate children
                  scored by cumulative log-probabilities, popped ``n`` times;
      ``eagle``   EAGLE-2-like: a root and levels of ``topk`` children of the best nodes;
      ``shuffled`` a ``random`` tree with the node labels permuted (NOT topological).
    All kinds except ``shuffled`` are in topological order (parent < child).
    ``verify_attn.masks.from_parents`` turns the lists into the compact mask.

    Args:
      kind: one of ``TREE_KINDS`` (above).
      n: number of nodes (``<= 0``: an empty list).
      rng: a ``random.Random`` (default: a fresh one).
      topk: ``ddtree``: children scored per expanded node; ``eagle``: children
        per node and nodes expanded per level; >= 1 (ignored by the other kinds).

    Raises:
      TypeError: ``n`` or ``topk`` not an integer. ValueError: an unknown
      ``kind``, ``topk < 1``.
    """
    n = as_int(n, "n")
    topk = as_int(topk, "topk")
    if kind not in TREE_KINDS:
        raise ValueError(f"kind: unknown tree kind {kind!r}; expected one of {TREE_KINDS}")
    if topk < 1:
        raise ValueError(f"topk: must be >= 1, got {topk}")
    rng = rng or random.Random()
    if n <= 0:
        return []
    if kind == "chain":
        return [-1] + list(range(n - 1))
    if kind == "star":
        return [-1] + [0] * (n - 1)
    if kind == "deep":
        return [-1] + [i - 1 if rng.random() < 0.85 else rng.randrange(i) for i in range(1, n)]
    if kind == "random":
        return [-1] + [rng.randrange(-1, i) if rng.random() < 0.03 else rng.randrange(i) for i in range(1, n)]
    if kind == "shuffled":
        par = random_parents("random", n, rng=rng)
        perm = list(range(n))
        rng.shuffle(perm)  # old label -> new label
        new = [0] * n
        for old, p in enumerate(par):
            new[perm[old]] = -1 if p < 0 else perm[p]
        return new
    if kind == "ddtree":
        parents = [-1]
        heap = []
        counter = 0

        def push_children(node, score):
            nonlocal counter
            probs = sorted((rng.random() for _ in range(topk)), reverse=True)
            tot = sum(probs)
            for p in probs:
                counter += 1
                heapq.heappush(heap, (-(score + math.log(p / tot)), counter, node))

        push_children(0, 0.0)
        scores = [0.0]
        while len(parents) < n:
            negs, _, par = heapq.heappop(heap)
            parents.append(par)
            scores.append(-negs)
            push_children(len(parents) - 1, -negs)
        return parents
    if kind == "eagle":
        parents = [-1]
        frontier = [0]
        while len(parents) < n:
            nxt = []
            for node in frontier[: max(1, topk)]:
                for _ in range(topk):
                    if len(parents) >= n:
                        break
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            rng.shuffle(nxt)
            frontier = nxt
        return parents
    raise ValueError(f"kind: unknown tree kind {kind!r}; expected one of {TREE_KINDS}")


# ---------------------------------------------------------------------------
# problems


class Model(NamedTuple):
    """Attention shape of a model: MLA (``v`` is ``k[..., :d_vo]``, one KV head) or GQA."""

    mla: bool
    heads: int
    kv_heads: int
    d_qk: int
    d_vo: int


MODELS: Dict[str, Model] = {
    "mla_h1": Model(True, 1, 1, 576, 512),
    "mla_h16": Model(True, 16, 1, 576, 512),
    "mla_h128": Model(True, 128, 1, 576, 512),
    "gqa_d64_g1": Model(False, 4, 4, 64, 64),
    "gqa_d64_g8": Model(False, 16, 2, 64, 64),
    "gqa_d128_g3": Model(False, 6, 2, 128, 128),
    "gqa_d128_g4": Model(False, 16, 4, 128, 128),
    "gqa_d128_g8": Model(False, 8, 1, 128, 128),
    "gqa_d256_g1": Model(False, 2, 2, 256, 256),
    "gqa_d256_g4": Model(False, 4, 1, 256, 256),
}

SLOT_KINDS = ("pages", "runs", "broken", "shifted", "scattered", "shuffled")
_RUN = 64  # token slots per pool page of the slot kinds (SGLang's --page-size 64 pool)


def ragged_lengths(rng: random.Random, batch: int, q_len: int, prefix: int, *,
                   empty_request: bool = True) -> Tuple[List[int], List[int]]:
    """Ragged lengths of a batch whose longest request has ``q_len`` drafts and the
    longest prefix ``prefix``: the others draw theirs from ``[1, q_len]`` and
    ``[0, prefix]``; one of them (``batch > 1``, ``empty_request``) has no draft
    at all; the requests in random order. Returns ``(q_lens, prefixes)``."""
    q_lens = [q_len] + [rng.randint(1, q_len) for _ in range(batch - 1)]
    prefixes = [prefix] + [rng.randint(0, prefix) for _ in range(batch - 1)]
    if empty_request and batch > 1:
        q_lens[rng.randrange(1, batch)] = 0
    order = list(range(batch))
    rng.shuffle(order)
    return [q_lens[i] for i in order], [prefixes[i] for i in order]


@dataclasses.dataclass
class Problem:
    """One verify batch: the API's arguments (``q`` ... ``kv_slot_runs``) and the
    host facts the checks use. Flat when ``kv_indices`` is None. Mutable: a test
    may write new data into its tensors or :meth:`replace` fields (the reference
    reads whatever the fields hold when it runs).

    ``ref_k`` / ``ref_v``: what the reference reads instead of ``k`` / ``v``
    (None: ``k`` / ``v``), for rows the kernel must never read that hold NaN
    in ``k`` and zeros here (``make_problem(nan_rows=)``).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: Optional[torch.Tensor]
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: Optional[torch.Tensor] = None
    kv_len: Optional[torch.Tensor] = None
    page_size: Optional[int] = None
    tree_mask: Optional[torch.Tensor] = None
    causal: bool = False
    max_q_len: Optional[int] = None
    max_kv_len: Optional[int] = None
    sm_scale: Optional[float] = None
    kv_slot_runs: int = 1
    q_lens: List[int] = dataclasses.field(default_factory=list)
    kv_lens: List[int] = dataclasses.field(default_factory=list)
    mla: bool = False
    d_vo: int = 0
    seed: Optional[int] = None
    ref_k: Optional[torch.Tensor] = None
    ref_v: Optional[torch.Tensor] = None

    @property
    def paged(self) -> bool:
        return self.kv_indices is not None

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def total_q(self) -> int:
        return self.q.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def device(self) -> torch.device:
        return self.q.device

    def request_rows(self) -> Iterator[Tuple[int, slice]]:
        """``(request, rows)`` of every request with at least one draft row."""
        s = 0
        for i, n in enumerate(self.q_lens):
            if n:
                yield i, slice(s, s + n)
            s += n

    def replace(self, **fields) -> "Problem":
        """A copy with these fields replaced (the tensors are shared, not copied)."""
        return dataclasses.replace(self, **fields)


def _cumsum(xs: Sequence[int], start: int = 0) -> List[int]:
    out = [start]
    for x in xs:
        out.append(out[-1] + x)
    return out


def make_problem(
    q_lens: Sequence[int],
    prefixes: Sequence[int],
    *,
    model: Union[str, Model] = "mla_h16",
    heads: Optional[int] = None,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "paged",
    page_size: int = 1,
    slots: Union[str, Sequence[str]] = "pages",
    spare_pages: int = 5,
    unused_indices: int = 0,
    cache_3d: bool = False,
    cache_width: Optional[int] = None,
    kv_offset: int = 0,
    flat_spare_rows: int = 0,
    tree="random",
    mask_width: Optional[int] = None,
    mask_uint32: bool = False,
    bounds: str = "exact",
    q_layout: str = "contiguous",
    q_scale: float = 1.0,
    kv_scale: float = 1.0,
    poison: bool = True,
    nan_rows: Sequence[Tuple[int, int]] = (),
    v_view: bool = False,
    sm_scale: Optional[float] = None,
    kv_slot_runs: int = 1,
    seed: int = 0,
    device="cuda",
) -> Problem:
    """Random inputs of one verify batch.

    Request ``i`` has ``q_lens[i]`` draft rows and ``prefixes[i] + q_lens[i]``
    KV rows (its committed prefix, then its drafts). The KV rows are drawn once
    per (seed, lengths, model, dtype) and then laid out in the cache the
    arguments describe, so two layouts of one seed describe the same attention.

    Args:
      model: a :data:`MODELS` name or a :class:`Model`; ``heads`` overrides its
        query heads.
      layout: ``"flat"`` (request ``i``'s rows at ``kv_indptr[i]``, after
        ``kv_offset`` rows no request owns, followed by ``flat_spare_rows``) or
        ``"paged"``.
      page_size: the paged cache's page size.
      slots: where a paged request's rows live, one kind for the batch or one
        per request: ``"pages"`` (whole pages of ``page_size``, page ids a
        random permutation of a pool with ``spare_pages`` more); with
        ``page_size`` 1 also the token-slot layouts of a pool of 64-slot pages
        (SGLang's ``--page-size 64`` pool seen through its page-1 slots):
        ``"runs"`` (each request in runs of 64 from pool-page starts),
        ``"broken"`` (runs, slots 70 and 90 swapped when there are 128 rows),
        ``"shifted"`` (runs starting 33 slots into a pool page: never aligned
        to a tile), ``"scattered"`` (every slot in a pool page of its own),
        ``"shuffled"`` (the batch only: every row at a random slot of a pool of
        64-slot pages).
      unused_indices: trailing ``kv_indices`` entries no request uses.
      cache_3d: a ``[slots, Hkv, D]`` cache with ``page_size`` passed, instead
        of ``[num_pages, page_size, Hkv, D]``.
      cache_width: row width of the K cache, ``> d_qk`` for a padded cache (``k``
        is then a view of the first ``d_qk`` values of each row).
      tree: a ``TREE_KINDS`` name (a random tree per request), ``"causal"`` (no
        mask: causal mode), or one entry per request: a kind, a parents list, or
        a dense ``[q_len, q_len]`` bool visibility (all requests dense).
      mask_width: the mask's ``max_q_len`` (words per row); default from ``bounds``.
      mask_uint32: the mask viewed as ``torch.uint32`` (where torch has it).
      bounds: the host bounds passed: ``"exact"``, ``"loose"`` (larger than
        needed) or ``"computed"`` (None: the call reads the lengths).
      q_layout: ``"contiguous"``, ``"padded"`` (a view of 64 more values per
        head) or ``"head_major"`` (token stride ``d_qk``).
      q_scale, kv_scale: multipliers of the standard normal q / KV values.
      poison: NaN in every cache row no request owns (else random values).
      nan_rows: ``(request, KV row)`` pairs whose K (and V) hold NaN in the
        cache -- rows no query row may see -- and zeros in what the reference
        reads (``Problem.ref_k``).
      v_view: MLA: pass ``v = k[..., :d_vo]`` (SGLang's value view) instead of None.
      sm_scale, kv_slot_runs: passed to the call as they are.
      seed: seeds every random draw. device: where the tensors live (``"cpu"``
        builds problems for the reference alone).
    """
    m = MODELS[model] if isinstance(model, str) else Model(*model)
    if heads is not None:
        m = m._replace(heads=heads)
    mla, H, Hkv, d_qk, d_vo = m
    q_lens = [as_int(x, "q_lens") for x in q_lens]
    prefixes = [as_int(x, "prefixes") for x in prefixes]
    if len(q_lens) != len(prefixes):
        raise ValueError(f"prefixes: {len(prefixes)} entries for {len(q_lens)} requests")
    B = len(q_lens)
    kv_lens = [p + n for p, n in zip(prefixes, q_lens)]
    device = torch.device(device)
    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    nan = float("nan")

    def randn(*shape, scale=1.0):
        x = torch.randn(*shape, generator=gen, device=device)
        return (x * scale if scale != 1.0 else x).to(dtype)

    # bounds and the mask's width
    exact_q, exact_kv = max(q_lens, default=0), max(kv_lens, default=0)
    if bounds == "computed":
        max_q_len = max_kv_len = None
        width_q = exact_q
    elif bounds == "exact":
        max_q_len, max_kv_len = exact_q, exact_kv
        width_q = exact_q
    elif bounds == "loose":
        max_q_len = min(1024, 32 * ((exact_q + 31) // 32) + 5)
        max_kv_len = 2 * exact_kv + 7
        width_q = max_q_len
    else:
        raise ValueError(f"bounds: 'exact', 'loose' or 'computed', got {bounds!r}")
    if mask_width is not None:
        width_q = mask_width

    qo = torch.tensor(_cumsum(q_lens), dtype=torch.int32, device=device)

    # the mask
    causal = isinstance(tree, str) and tree == "causal"
    tree_mask = None
    if not causal:
        per = [tree] * B if isinstance(tree, str) else list(tree)
        if len(per) != B:
            raise ValueError(f"tree: {len(per)} entries for {B} requests")
        if per and all(isinstance(t, torch.Tensor) for t in per):
            tree_mask = masks.from_dense([t.to(device) for t in per], qo, max_q_len=width_q)
        else:
            parents = []
            for t, n in zip(per, q_lens):
                if isinstance(t, str):
                    parents += random_parents(t, n, rng=rng)
                elif isinstance(t, torch.Tensor):
                    raise ValueError("tree: dense visibility for every request or for none")
                else:
                    if len(t) != n:
                        raise ValueError(f"tree: a parents list of {len(t)} nodes for a request of {n}")
                    parents += list(t)
            tree_mask = masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=device), qo,
                                           max_q_len=width_q)
        if mask_uint32 and hasattr(torch, "uint32"):
            tree_mask = tree_mask.view(torch.uint32)

    # q
    total_q = sum(q_lens)
    if q_layout == "contiguous":
        q = randn(total_q, H, d_qk, scale=q_scale)
    elif q_layout == "padded":
        q = randn(total_q, H, d_qk + 64, scale=q_scale)[..., :d_qk]
    elif q_layout == "head_major":
        q = randn(H, total_q, d_qk, scale=q_scale).transpose(0, 1)
    else:
        raise ValueError(f"q_layout: 'contiguous', 'padded' or 'head_major', got {q_layout!r}")

    # the requests' KV rows, request after request
    starts = _cumsum(kv_lens)
    total_kv = starts[-1]
    k_rows = randn(total_kv, Hkv, d_qk, scale=kv_scale)
    v_rows = None if mla else randn(total_kv, Hkv, d_vo, scale=kv_scale)
    nan_idx = []
    for r, j in nan_rows:
        if not 0 <= j < kv_lens[r]:
            raise ValueError(f"nan_rows: request {r} has {kv_lens[r]} KV rows, not a row {j}")
        nan_idx.append(starts[r] + j)

    # where they live: `owned[i]` is the cache row of KV row i
    width_k = d_qk if cache_width is None else cache_width
    kv_indices = kv_len = None
    api_page_size = None
    if layout == "flat":
        num_rows = kv_offset + total_kv + flat_spare_rows
        owned = torch.arange(kv_offset, kv_offset + total_kv, dtype=torch.long)
        kv_indptr = torch.tensor(_cumsum(kv_lens, kv_offset), dtype=torch.int32, device=device)
        pool_page = None
    elif layout == "paged":
        kinds = [slots] * B if isinstance(slots, str) else list(slots)
        if len(kinds) != B:
            raise ValueError(f"slots: {len(kinds)} kinds for {B} requests")
        for kind in kinds:
            if kind not in SLOT_KINDS:
                raise ValueError(f"slots: unknown kind {kind!r}; expected one of {SLOT_KINDS}")
        by_pages = all(kind == "pages" for kind in kinds)
        if not by_pages and page_size != 1:
            raise ValueError(f"slots: the token-slot kinds are page_size 1 layouts, got page_size {page_size}")
        if "shuffled" in kinds and any(kind != "shuffled" for kind in kinds):
            raise ValueError("slots: 'shuffled' lays out the whole batch")
        pool_page = page_size if by_pages else _RUN

        def pages_needed(kind, n):
            if kind == "pages":
                return -(-n // page_size)
            if kind == "shifted":
                return -(-(n + 33) // _RUN)
            if kind == "scattered":
                return n
            return -(-n // _RUN)  # runs, broken, shuffled

        num_pages = sum(pages_needed(kind, n) for kind, n in zip(kinds, kv_lens)) + spare_pages
        free = list(range(num_pages))
        rng.shuffle(free)
        page_lists, slot_lists = [], []
        for kind, n in zip(kinds, kv_lens):
            j = torch.arange(n)
            if kind == "scattered":
                slot_lists.append(torch.tensor([free.pop() * _RUN + rng.randrange(_RUN) for _ in range(n)],
                                               dtype=torch.long))
                continue
            ids = torch.tensor([free.pop() for _ in range(pages_needed(kind, n))], dtype=torch.long)
            page_lists.append(ids)
            if kind == "shifted":
                j = j + 33
            s = ids[j // pool_page] * pool_page + j % pool_page if n else j
            if kind == "broken" and n >= 128:
                s[70], s[90] = s[90].clone(), s[70].clone()
            slot_lists.append(s)
        if kinds and kinds[0] == "shuffled":
            owned = torch.randperm(num_pages * _RUN, generator=cpu_gen)[:total_kv]
        else:
            owned = torch.cat(slot_lists) if slot_lists else torch.zeros(0, dtype=torch.long)
        filler = free[0] if free else 0  # a spare page (slot) for the unused entries
        if by_pages:
            pages = [ids.tolist() for ids in page_lists]
            ind = [x for ids in pages for x in ids] + [filler] * unused_indices
            kv_indptr = torch.tensor(_cumsum([len(ids) for ids in pages]), dtype=torch.int32, device=device)
        else:
            ind = owned.tolist() + [filler * _RUN] * unused_indices
            kv_indptr = torch.tensor(starts, dtype=torch.int32, device=device)
        kv_indices = torch.tensor(ind, dtype=torch.int32, device=device)
        kv_len = torch.tensor(kv_lens, dtype=torch.int32, device=device)
        num_rows = num_pages * pool_page
        api_page_size = page_size if cache_3d else None
    else:
        raise ValueError(f"layout: 'flat' or 'paged', got {layout!r}")

    owned = owned.to(device)

    def place(rows, width, d):
        """The cache holding `rows` at `owned` (the other rows NaN or random), shaped and viewed."""
        if rows is None:
            return None, None
        base = (torch.full((num_rows, rows.shape[1], width), nan, dtype=dtype, device=device) if poison
                else randn(num_rows, rows.shape[1], width))
        base[owned, :, :d] = rows
        ref = None
        if nan_idx:
            ref = base.clone()
            ref[owned[nan_idx], :, :d] = 0
            base[owned[nan_idx], :, :d] = nan

        def shaped(t):
            if t is not None and layout == "paged" and not cache_3d:
                t = t.view(num_rows // page_size, page_size, t.shape[1], width)
            return None if t is None else t[..., :d]

        return shaped(base), shaped(ref)

    k, ref_k = place(k_rows, width_k, d_qk)
    v, ref_v = place(v_rows, d_vo, d_vo)
    if mla and v_view:
        v = k[..., :d_vo]
        ref_v = None if ref_k is None else ref_k[..., :d_vo]
    return Problem(
        q=q, k=k, v=v, qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len,
        page_size=api_page_size, tree_mask=tree_mask, causal=causal, max_q_len=max_q_len,
        max_kv_len=max_kv_len, sm_scale=sm_scale, kv_slot_runs=kv_slot_runs, q_lens=q_lens,
        kv_lens=kv_lens, mla=mla, d_vo=d_vo, seed=seed, ref_k=ref_k, ref_v=ref_v,
    )


# ---------------------------------------------------------------------------
# kernel paths

# Configuration tags (kernels/plan.cc) that tests name.
PORTABLE_MLA = "mla_m32n32_s1"                # MLA on mma.sync, Q in shared memory: any arch
SPLIT_MLA = "mla_split_m32n32"                # MLA on mma.sync by warp roles, one CTA: sm_120 up to 32 rows
CLUSTER_MLA = "mla_cluster_m64n32"            # the same over a 2-CTA cluster: sm_120 above 32 rows per KV head
CP_ASYNC_MLA = "mla_wgmma_m64n64_pipe_rows"   # sm_90a: K by cp.async through a staged row table
TMA_MLA = "mla_wgmma_seesaw_tma"              # sm_90a: K by TMA, page_size % 64 == 0 or flat
TMA_ROWS_MLA = "mla_wgmma_seesaw_tma_rows"    # sm_90a: K by TMA through the rows map (kv_slot_runs)
# GQA / MHA by head_dim: the warp-role kernel (the plan's choice where the
# wheel has the device's arch-specific image) and the one-tile kernel behind it.
ROLES_GQA = {64: "gqa_d64_roles_m128n64", 128: "gqa_d128_roles_m128n64"}
# The warp-role kernel with 32 rows per consumer warp (256 per CTA): the plan's
# choice from 256 rows per KV head where its splits keep 16 KV tiles per CTA.
ROLES_R32_GQA = {64: "gqa_d64_roles_m256n64", 128: "gqa_d128_roles_m256n64"}
ONE_TILE_GQA = {64: "gqa_d64_m64n64_s2", 128: "gqa_d128_m64n64_s2"}
# The 16-row warp-role kernel with three K / V stages: the plan's choice for
# every warp-role call at head_dim 128 where its 104,496 bytes of shared memory
# fit (sm_90; ROLES_GQA's two stages and ROLES_R32_GQA on sm_120).
ROLES_S3_GQA = {128: "gqa_d128_roles_m128n64_s3"}


@dataclasses.dataclass(frozen=True)
class KernelPath:
    """A kernel path: None leaves a choice to the plan.

    config: the configuration to run (where it serves the call; the plan's
      choice otherwise: ``plan_info`` says which ran).
    q_tma / o_tma: False: the sm_90a kernels copy Q by cp.async / store the
      output from registers instead of by TMA.
    early_a0: the TMA kernel's early release of stage 0's blocks 0-3 on / off.
    grid_order: ``"rows"`` or ``"requests"``: the launch grid's order.
    balance_splits: True: the batch's split CTAs shared by KV length wherever
      the kernel can; False: every request split ``num_splits`` ways
      (``Tuning.balance_splits``).
    pair_splits: False: two splits write fp32 partial rows for the merge
      kernel instead of combining in a cluster (``Tuning.pair_splits``).
    """

    config: Optional[str] = None
    q_tma: Optional[bool] = None
    o_tma: Optional[bool] = None
    early_a0: Optional[bool] = None
    grid_order: Optional[str] = None
    balance_splits: Optional[bool] = None
    pair_splits: Optional[bool] = None

    def tuning(self) -> "_va.Tuning":
        """The :class:`verify_attn.Tuning` of this path."""
        return _va.Tuning(config=self.config or "", grid_order=self.grid_order or "auto",
                          early_release=self.early_a0,
                          q_tma=True if self.q_tma is None else self.q_tma,
                          o_tma=True if self.o_tma is None else self.o_tma,
                          balance_splits=self.balance_splits, pair_splits=self.pair_splits)


PATHS: Dict[str, KernelPath] = {
    "auto": KernelPath(),                     # the plan's choice
    "mma_sync": KernelPath(config=PORTABLE_MLA),
    "mma_split": KernelPath(config=SPLIT_MLA),
    "mla_cluster": KernelPath(config=CLUSTER_MLA),
    "cp_async": KernelPath(config=CP_ASYNC_MLA),
    "tma": KernelPath(config=TMA_MLA),
    "tma_rows": KernelPath(config=TMA_ROWS_MLA),
    "balanced": KernelPath(balance_splits=True),     # split CTAs by KV length wherever the kernel can
    "unbalanced": KernelPath(balance_splits=False),  # every request split num_splits ways
}

_ACTIVE: List[KernelPath] = []


def current_tuning() -> "_va.Tuning":
    """The :class:`verify_attn.Tuning` of the innermost :func:`kernel_path` (the defaults outside any)."""
    return (_ACTIVE[-1] if _ACTIVE else PATHS["auto"]).tuning()


@contextlib.contextmanager
def kernel_path(path: Union[None, str, KernelPath] = None, **fields) -> Iterator[KernelPath]:
    """Run the calls inside on a kernel path: the ONE place that selects one.

    ``path``: a :data:`PATHS` name or a :class:`KernelPath`; None: the path of
    the enclosing ``kernel_path`` (``"auto"`` outside any). ``fields`` replace
    fields of it (``kernel_path("mma_sync", grid_order="rows")``,
    ``kernel_path(q_tma=False)`` inside another). The helpers below
    (:func:`call`, :func:`run`, :func:`plan_info`, :func:`plan`) pass the
    path's :class:`verify_attn.Tuning` as their ``tuning`` argument.
    Yields the :class:`KernelPath`.
    """
    if path is None:
        base = _ACTIVE[-1] if _ACTIVE else PATHS["auto"]
    elif isinstance(path, KernelPath):
        base = path
    elif path in PATHS:
        base = PATHS[path]
    else:
        raise ValueError(f"path: unknown kernel path {path!r}; expected a KernelPath or one of {sorted(PATHS)}")
    spec = dataclasses.replace(base, **fields)
    spec.tuning().options()  # a bad field fails here, naming it
    _ACTIVE.append(spec)
    try:
        yield spec
    finally:
        _ACTIVE.pop()


# ---------------------------------------------------------------------------
# launching


def call(p: Problem, *, out=None, lse=None, return_lse: bool = False, num_splits: int = 0,
         head_dim_vo: Optional[int] = None, **kwargs):
    """``verify_attn.tree_attention_flat`` / ``tree_attention_paged`` on problem
    ``p`` (its tensors, mask, bounds, scale, page size and slot-runs hint; any
    ``kwargs`` replace them); returns what the call returns."""
    kw = dict(tree_mask=p.tree_mask, causal=p.causal, sm_scale=p.sm_scale, max_q_len=p.max_q_len,
              max_kv_len=p.max_kv_len, return_lse=return_lse, num_splits=num_splits, out=out, lse=lse,
              head_dim_vo=head_dim_vo, tuning=current_tuning())
    if p.paged:
        kw.update(page_size=p.page_size, kv_slot_runs=p.kv_slot_runs)
        kw.update(kwargs)
        return _va.tree_attention_paged(p.q, p.k, p.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len, **kw)
    kw.update(kwargs)
    return _va.tree_attention_flat(p.q, p.k, p.v, p.qo_indptr, p.kv_indptr, **kw)


def poisoned_outputs(p: Problem, *, layout: str = "contiguous", pad: int = 8,
                     return_lse: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """NaN-filled ``out [total_q, H, d_vo]`` (q's dtype) and ``lse [total_q, H]``
    (float32; None unless ``return_lse``) for problem ``p``: a row the kernel
    leaves unwritten stays NaN, which no check passes.

    layout: ``"contiguous"``; ``"padded"`` (views of wider tensors: ``pad``
    more values per head of ``out``, 3 more heads per row of ``lse``; see
    :func:`nan_outside_view`); ``"head_major"`` (``out``'s token stride d_vo).
    """
    T, H, D = p.total_q, p.heads, p.d_vo
    nan = float("nan")
    if layout == "contiguous":
        out = torch.full((T, H, D), nan, dtype=p.dtype, device=p.device)
    elif layout == "padded":
        out = torch.full((T, H, D + pad), nan, dtype=p.dtype, device=p.device)[..., :D]
    elif layout == "head_major":
        out = torch.full((H, T, D), nan, dtype=p.dtype, device=p.device).transpose(0, 1)
    else:
        raise ValueError(f"layout: 'contiguous', 'padded' or 'head_major', got {layout!r}")
    lse = None
    if return_lse:
        if layout == "padded":
            lse = torch.full((T, H + 3), nan, dtype=torch.float32, device=p.device)[:, :H]
        else:
            lse = torch.full((T, H), nan, dtype=torch.float32, device=p.device)
    return out, lse


def nan_outside_view(view: torch.Tensor) -> bool:
    """Every element of ``view``'s (contiguous) base tensor outside ``view`` is NaN:
    a kernel wrote nothing outside a view of a :func:`poisoned_outputs` tensor."""
    base = view._base
    if base is None:
        return True
    if not base.is_contiguous():
        raise ValueError("view: its base tensor must be contiguous")
    outside = torch.ones(base.shape, dtype=torch.bool, device=base.device)
    outside.as_strided(view.shape, view.stride(), view.storage_offset() - base.storage_offset()).fill_(False)
    return bool(torch.isnan(base[outside]).all())


def run(p: Problem, *, num_splits: int = 0, return_lse: bool = True, out_layout: str = "contiguous",
        pad: int = 8, **kwargs) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`call` with ``out`` and ``lse`` preallocated and NaN-poisoned
    (:func:`poisoned_outputs`); returns them."""
    out, lse = poisoned_outputs(p, layout=out_layout, pad=pad, return_lse=return_lse)
    call(p, out=out, lse=lse, return_lse=return_lse, num_splits=num_splits, **kwargs)
    return out, lse


def plan_info(p: Problem, **kwargs) -> dict:
    """``verify_attn.plan_info`` of problem ``p`` (its layout, mask and host
    bounds); ``kwargs`` add to or replace its arguments."""
    kw = dict(tree_mask=p.tree_mask, causal=p.causal, sm_scale=p.sm_scale, max_q_len=p.max_q_len,
              max_kv_len=p.max_kv_len, tuning=current_tuning())
    if p.paged:
        kw.update(page_size=p.page_size, kv_slot_runs=p.kv_slot_runs)
    kw.update(kwargs)
    return _va.plan_info(p.q, p.k, p.v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len, **kw)


def plan(p: Problem, **kwargs):
    """A ``verify_attn.TreeAttentionPlan`` of problem ``p``'s batch (its indices,
    mask, heads, dims, dtype, host bounds, or the exact ones where it has none,
    and the current :func:`kernel_path`'s tuning); ``kwargs`` add to or replace
    its arguments. Run it with ``plan.run(p.q, p.k, p.v if not p.mla else None, ...)``
    (:func:`run_plan`)."""
    kw = dict(tree_mask=p.tree_mask, causal=p.causal, sm_scale=p.sm_scale,
              num_qo_heads=p.heads, num_kv_heads=p.k.shape[-2], head_dim_qk=p.q.shape[-1],
              head_dim_vo=p.d_vo, dtype=p.dtype,
              max_q_len=max(p.q_lens, default=0) if p.max_q_len is None else p.max_q_len,
              max_kv_len=max(p.kv_lens, default=0) if p.max_kv_len is None else p.max_kv_len,
              tuning=current_tuning())
    if p.paged:
        kw.update(page_size=p.page_size, kv_slot_runs=p.kv_slot_runs)
    kw.update(kwargs)
    return _va.TreeAttentionPlan(p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len, **kw)


def run_plan(pl, p: Problem, **kwargs):
    """``pl.run`` on problem ``p``'s q and caches (``v`` None for MLA); ``kwargs``
    as :meth:`verify_attn.TreeAttentionPlan.run` takes them."""
    return pl.run(p.q, p.k, None if p.mla else p.v, **kwargs)


def write_batch(q_lens: Sequence[int], kv_lens: Sequence[int], *, qo_indptr: torch.Tensor,
                kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_len: torch.Tensor,
                tree_mask: torch.Tensor, page_size: int, num_pages: int, max_q_len: int,
                rng: random.Random) -> None:
    """Write a batch's indices in place into buffers planned at capacity (a CUDA
    graph's): ``qo_indptr`` / ``kv_indptr`` / ``kv_len`` of these lengths, the
    requests' pages drawn at random from ``num_pages`` into ``kv_indices``, and
    a random tree (ddtree, random or chain) per request into ``tree_mask``
    (zeros past the batch's rows)."""
    total = sum(q_lens)
    qo_h, ind_h = [0], [0]
    for t, n in zip(q_lens, kv_lens):
        qo_h.append(qo_h[-1] + t)
        ind_h.append(ind_h[-1] + (n + page_size - 1) // page_size)
    dev = qo_indptr.device
    qo_indptr.copy_(torch.tensor(qo_h, dtype=torch.int32))
    kv_indptr.copy_(torch.tensor(ind_h, dtype=torch.int32))
    kv_indices[: ind_h[-1]].copy_(torch.randperm(num_pages, device=dev)[: ind_h[-1]].to(torch.int32))
    kv_len.copy_(torch.tensor(list(kv_lens), dtype=torch.int32))
    parents = []
    for t in q_lens:
        parents += random_parents(rng.choice(["ddtree", "random", "chain"]), t, rng=rng)
    tree_mask.zero_()
    tree_mask[:total].copy_(masks.from_parents(torch.tensor(parents, dtype=torch.int32, device=dev), qo_indptr,
                                               max_q_len=max_q_len))


def captured(fn) -> "torch.cuda.CUDAGraph":
    """``fn()`` run once on a side stream (its warm-up: a plan's first run of a
    layout plans it, which a capture must not), then captured there into a CUDA
    graph, which is returned; the current stream waits for the side stream."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return g


def replayed(g: "torch.cuda.CUDAGraph", out: torch.Tensor, lse: torch.Tensor, rows: int):
    """Replay graph ``g`` (which writes ``out`` / ``lse``) into NaN-poisoned
    buffers, synchronize, and return copies of their first ``rows`` rows."""
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return out[:rows].clone(), lse[:rows].clone()


# ---------------------------------------------------------------------------
# checking


def reference(p: Problem) -> Tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference (``verify_attn.reference``) of problem ``p``, on its
    device: ``(out [total_q, H, d_vo], lse [total_q, H])``."""
    k = p.k if p.ref_k is None else p.ref_k
    v = p.v if p.ref_v is None else p.ref_v
    kw = dict(tree_mask=p.tree_mask, causal=p.causal, sm_scale=p.sm_scale,
              head_dim_vo=p.d_vo if p.mla else None)
    if p.paged:
        return reference_attention_paged(p.q, k, v, p.qo_indptr, p.kv_indptr, p.kv_indices, p.kv_len,
                                         page_size=p.page_size, **kw)
    return reference_attention_flat(p.q, k, v, p.qo_indptr, p.kv_indptr, **kw)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` (Frobenius, float64; ``||x - ref||`` when ref is 0)."""
    x, ref = x.double(), ref.double()
    den = ref.norm()
    if den == 0:
        return float((x - ref).norm())
    return float((x - ref).norm() / den)


def bad_request(p: Problem, kind: str, *, req: int = 1, kv_row: int = 0) -> Tuple[Problem, int]:
    """Problem ``p`` with request ``req`` made bad, and the error bit
    (``verify_attn.errors``) ``check_errors`` must then raise.

    kind: ``"page_id"``, the page id of the request's KV row ``kv_row`` (a
    paged ``p`` of page_size 1: the entry ``kv_indptr[req] + kv_row``) set past
    the cache (``ERR_KV_INDEX``); ``"kv_short"``, its device kv_len set one
    below its q_len (``ERR_KV_SHORT``). Raises ValueError for another kind.
    """
    from . import errors

    if kind == "page_id":
        ind = p.kv_indices.clone()
        ind[int(p.kv_indptr[req]) + kv_row] = p.k.shape[0] + 7
        return p.replace(kv_indices=ind), errors.ERR_KV_INDEX
    if kind == "kv_short":
        kvl = p.kv_len.clone()
        kvl[req] = p.q_lens[req] - 1
        return p.replace(kv_len=kvl), errors.ERR_KV_SHORT
    raise ValueError(f"kind: 'page_id' or 'kv_short', got {kind!r}")


def check_bad_request(p: Problem, out: torch.Tensor, ref_out: torch.Tensor, bit: int, *, req: int = 1,
                      label: str = "") -> None:
    """After a run of ``bad_request(p, ...)``'s problem: ``check_errors`` raises
    ``KernelInputError`` with ``bit`` set, naming request ``req`` (or none);
    that request's rows of ``out`` are NaN; every other request's rows are
    finite and within ``REL_TOL`` of ``ref_out`` (``reference(p)[0]`` of the
    good problem). Raises AssertionError (with ``label``) otherwise."""
    try:
        _va.check_errors()
    except _va.KernelInputError as e:
        assert e.bits & bit and e.request in (None, req), f"{label} {e}"
    else:
        raise AssertionError(f"{label} check_errors raised nothing")
    for r, rows in p.request_rows():
        if r == req:
            assert torch.isnan(out[rows]).all(), f"{label} request {r}: not all NaN"
        else:
            err = rel_err(out[rows], ref_out[rows])
            assert torch.isfinite(out[rows]).all() and err < REL_TOL, f"{label} request {r}: rel err {err}"


def check(p: Problem, out: torch.Tensor, lse: Optional[torch.Tensor] = None, *, label: str = "",
          ref: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, lse_rtol: float = 0.0,
          verbose: bool = True) -> Tuple[float, float, float]:
    """Assert that ``out`` (and ``lse``) of problem ``p`` match the float64 reference.

    Pass: ``out`` of shape ``[total_q, H, d_vo]`` and q's dtype, ``lse`` float32
    ``[total_q, H]``; every value finite (NaN or inf -- a row left unwritten, a
    NaN-poisoned cache row read -- never passes); ``rel_err < REL_TOL`` for the
    batch and for every request; ``|lse - ref_lse| <= LSE_ATOL + lse_rtol *
    |ref_lse|`` everywhere. ``ref``: the reference, when already computed.
    Prints a line of errors (``verbose``; pytest shows it with ``-s``).
    Returns ``(batch rel_err, worst request's rel_err, max |lse - ref_lse|)``.
    """
    ref_out, ref_lse = reference(p) if ref is None else ref
    T, H = p.total_q, p.heads
    assert tuple(out.shape) == (T, H, p.d_vo) and out.dtype == p.dtype, \
        f"{label}: out is {tuple(out.shape)} {out.dtype}, expected {(T, H, p.d_vo)} {p.dtype}"
    finite = bool(torch.isfinite(out).all())
    err = rel_err(out, ref_out)
    worst = 0.0
    for _, rows in p.request_rows():
        worst = max(worst, rel_err(out[rows], ref_out[rows]))
    lse_err, lse_ok = 0.0, True
    if lse is not None:
        assert tuple(lse.shape) == (T, H) and lse.dtype == torch.float32, \
            f"{label}: lse is {tuple(lse.shape)} {lse.dtype}, expected {(T, H)} torch.float32"
        finite = finite and bool(torch.isfinite(lse).all())
        d = (lse.double() - ref_lse).abs()
        lse_err = float(d.max()) if d.numel() else 0.0
        lse_ok = bool((d <= LSE_ATOL + lse_rtol * ref_lse.abs()).all())
    msg = f"{label}: rel_err={err:.3e} worst_request={worst:.3e} lse_err={lse_err:.3e} finite={finite}"
    if verbose:
        print(msg)
    assert finite, "non-finite output (unwritten or NaN-poisoned memory read): " + msg
    assert err < REL_TOL and worst < REL_TOL, msg
    assert lse_ok, "lse out of tolerance: " + msg
    return err, worst, lse_err


# ---------------------------------------------------------------------------
# the toolchain's smoke kernel


def scaled_copy(x, scale):
    """Toolchain smoke kernel: return ``scale * x`` computed by a CUDA kernel.

    Args:
      x: CUDA tensor, dtype torch.float16 or torch.bfloat16, any shape,
        contiguous.
      scale (float): multiplier.

    Returns:
      A new tensor like ``x``.

    Raises:
      TypeError: ``x`` is not a tensor or not fp16/bf16.
      ValueError: ``x`` is not a contiguous CUDA tensor.
      RuntimeError: no CUDA device, or the launch failed.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError("x: expected a torch.Tensor, got %s" % type(x).__name__)
    dtypes = {torch.float16: "DTYPE_FP16", torch.bfloat16: "DTYPE_BF16"}
    if x.dtype not in dtypes:
        raise TypeError("x: dtype must be torch.float16 or torch.bfloat16, got %s" % x.dtype)
    if not x.is_contiguous():
        raise ValueError("x: must be contiguous")
    if x.device.type != "cuda":
        raise ValueError("x: must be a CUDA tensor, got device %s" % x.device)
    C = _ext.load()
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    with torch.cuda.device(x.device):
        C.scaled_copy(x.data_ptr(), y.data_ptr(), x.numel(), float(scale),
                      getattr(C, dtypes[x.dtype]), stream)
    return y
