"""Target-verify metadata for the verify_attn SGLang backend (torch only, CPU-testable).

Everything here is plain vectorized torch with static shapes and no
device->host synchronization, so the same functions run on CPU tensors (the CI
tests) and on the GPU, eagerly or while SGLang prepares CUDA-graph replays.
Nothing imports SGLang.

SGLang 0.5.23's target verify (read from its ``triton_backend.py``):
``qo_indptr = arange(0, (bs + 1) * N, N)`` (N draft tokens per request),
``kv_indptr = cumsum(seq_lens)`` over the committed prefix only (``seq_lens``
excludes the drafts), ``kv_indices`` are token slots, and the drafts' K/V are
written to the cache at ``out_cache_loc[i * N : (i + 1) * N]`` before attention.

verify_attn's paged kernel wants, per request, ``kv_len = prefix + N`` rows
``kv_indices[kv_indptr[i] : kv_indptr[i] + kv_len[i]]``: the prefix slots, then
the draft slots in query order. We treat SGLang's pool ``[slots, H, D]`` as
pages of one slot (``page_size=1``), which is right for every ``--page-size``
(a slot id addresses one token whatever the page size) and for any slot layout
(shuffled pages, non-monotonic draft slots).

Padded CUDA-graph replays (``decode_cuda_graph_runner.build_replay_fb_view``):
a batch of ``raw_bs`` requests replays a graph captured for ``bs > raw_bs``;
the view's ``req_pool_indices`` / ``seq_lens`` / ``seq_lens_cpu`` are the padded
capture buffers (``bs`` entries; padded lanes hold ``seq_len_fill_value`` and a
stale or zero pool row), ``num_padding = bs - raw_bs``, while ``out_cache_loc``
and ``spec_info`` (its ``custom_mask`` included) are the real batch's (``raw_bs``
requests). The kernel runs all ``bs`` requests (its launch is captured); the
padded requests' rows are discarded, so they get any in-range metadata: their
draft slots point at ``pad_slot`` (0, SGLang's reserved padding slot) and
their tree rows are causal.

Layouts of the verify mask (``TreeMaskMode``, ``sglang/srt/speculative/eagle_utils.py``):
QLEN_ONLY: ``bs * N * N`` bools, request ``r`` row ``t`` column ``c`` at
``r*N*N + t*N + c``; FULL_MASK: request ``r`` owns ``N * (seq_len_r + N)``
bools from ``mask_indptr[r]`` (exclusive cumsum), row-major, draft columns at
``seq_len_r + c``. Both convert to verify_attn's compact bits
``int32 [bs * N, ceil(N / 32)]`` (bit ``c % 32`` of word ``c // 32``) through
``verify_attn.masks``, the one home of these layouts (its ``from_sglang_*``
builders read the same layouts for ragged batches, on the host).
"""

from typing import Optional

import torch

from verify_attn import masks as _masks
from verify_attn._args import as_int

__all__ = [
    "mask_words",
    "uniform_qo_indptr",
    "verify_kv_indptr",
    "verify_kv_len",
    "scatter_draft_slots",
    "pack_prefix_slots",
    "build_verify_kv",
    "pack_bool_rows",
    "qlen_only_to_bits",
    "full_mask_to_bits",
    "is_qlen_only_layout",
    "causal_rows",
    "tree_mask_bits",
    "real_batch_size",
    "full_mask_bytes",
    "compact_mask_bytes",
    "qlen_only_mask_bytes",
]


def _check_out(out: torch.Tensor, need: int, name: str = "out") -> None:
    if out.shape[0] < need:
        raise ValueError(f"{name}: needs at least {need} rows, has {out.shape[0]}")


def _check_n(n) -> int:
    n = as_int(n, "n")  # TypeError for a non-integer
    if n < 1:
        raise ValueError(f"n: the draft tokens per request must be >= 1, got {n}")
    return n


def real_batch_size(bs: int, num_padding) -> int:
    """Requests of a (possibly padded) verify batch that are real: ``bs - num_padding``.

    ``num_padding`` is the replay view's field (``None`` / absent: 0).

    Raises:
      TypeError: ``num_padding`` not an integer.
      ValueError: ``num_padding`` outside ``[0, bs]``.
    """
    num_padding = 0 if num_padding is None else as_int(num_padding, "num_padding")
    if not 0 <= num_padding <= bs:
        raise ValueError(f"num_padding: must be in [0, {bs}] (the batch's padded lanes), got {num_padding}")
    return bs - num_padding


def mask_words(n: int) -> int:
    """uint32 words per compact-mask row for ``n`` draft tokens (at least 1)."""
    return _masks.mask_words(n)


def uniform_qo_indptr(bs: int, n: int, *, device=None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``arange(0, (bs + 1) * n, n)`` as int32 (written into ``out[: bs + 1]`` when given).

    Raises:
      ValueError: ``n < 1``, ``bs < 0``, or ``out`` shorter than ``bs + 1``.
    """
    _check_n(n)
    if bs < 0:
        raise ValueError(f"bs: must be >= 0, got {bs}")
    if out is None:
        return torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=device)
    _check_out(out, bs + 1)
    v = out[: bs + 1]
    torch.arange(0, (bs + 1) * n, n, dtype=torch.int32, device=out.device, out=v)
    return v


def verify_kv_indptr(seq_lens: torch.Tensor, n: int, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int32 ``[bs + 1]``: exclusive cumsum of ``seq_lens + n`` (prefix + drafts per request).

    Raises:
      ValueError: ``n < 1`` or ``out`` shorter than ``bs + 1``.
    """
    _check_n(n)
    bs = seq_lens.shape[0]
    if out is None:
        out = torch.zeros(bs + 1, dtype=torch.int32, device=seq_lens.device)
    _check_out(out, bs + 1)
    v = out[: bs + 1]
    v[:1].zero_()
    v[1:].copy_(torch.cumsum(seq_lens.to(torch.int64) + n, dim=0))
    return v


def verify_kv_len(seq_lens: torch.Tensor, n: int, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int32 ``[bs]``: ``seq_lens + n``.

    Raises:
      ValueError: ``n < 1`` or ``out`` shorter than ``bs``.
    """
    _check_n(n)
    bs = seq_lens.shape[0]
    if out is None:
        return (seq_lens.to(torch.int32) + n).contiguous()
    _check_out(out, bs)
    v = out[:bs]
    v.copy_(seq_lens.to(torch.int32) + n)
    return v


def pack_prefix_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Torch stand-in of SGLang's read-stream pack (``create_flashinfer_kv_indices_triton``):
    ``out[kv_indptr[r] + j] = req_to_token[req_pool_indices[r], j]`` for ``j < seq_lens[r]``.

    Rows may leave gaps (``kv_indptr`` need not be the cumsum of ``seq_lens``):
    the backend passes the verify indptr, so each request's prefix lands at the
    start of its row and its ``n`` draft slots fill the gap after it. O(bs *
    req_to_token.shape[1]) work; the GPU backend uses SGLang's own Triton pack
    instead (same result, O(total) work). No host sync.
    """
    bs = seq_lens.shape[0]
    if bs == 0:
        return
    width = req_to_token.shape[1]
    cols = torch.arange(width, device=out.device, dtype=torch.int64).unsqueeze(0)
    rows = req_to_token[req_pool_indices[:bs].to(torch.int64)].to(out.device)  # [bs, width]
    valid = cols < seq_lens[:bs].to(torch.int64).unsqueeze(1)
    dest = kv_indptr[:bs].to(torch.int64).unsqueeze(1) + cols
    trash = out.numel() - 1  # the caller reserves one trailing slot
    dest = torch.where(valid, dest, torch.full_like(dest, trash))
    out.scatter_(0, dest.reshape(-1), rows.to(out.dtype).reshape(-1))


def scatter_draft_slots(
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    n: int,
    *,
    pad_slot: int = 0,
) -> None:
    """Append the drafts' cache slots after each request's prefix, in query order:
    ``kv_indices[kv_indptr[r] + seq_lens[r] + t] = out_cache_loc[r * n + t]``.

    ``out_cache_loc`` may cover fewer requests than ``seq_lens`` (a padded
    CUDA-graph replay hands the real batch's ``raw_bs * n`` slots with the
    padded ``bs`` lengths): the requests it does not cover get ``pad_slot``.
    Static shapes (``bs * n`` elements), no host sync.

    Raises:
      ValueError: ``n < 1``, or ``out_cache_loc`` not 1-D or not a whole number
        of requests (``numel % n != 0``).
    """
    _check_n(n)
    bs = seq_lens.shape[0]
    if out_cache_loc.dim() != 1 or out_cache_loc.numel() % n:
        raise ValueError(f"out_cache_loc: must be 1-D with a multiple of n={n} slots, "
                         f"got shape {tuple(out_cache_loc.shape)}")
    if bs == 0:
        return
    src = out_cache_loc[: bs * n].to(device=kv_indices.device, dtype=kv_indices.dtype)
    if src.numel() < bs * n:
        src = torch.cat([src, src.new_full((bs * n - src.numel(),), pad_slot)])
    t = torch.arange(bs * n, device=kv_indices.device, dtype=torch.int64)
    r = t // n
    dest = kv_indptr[:bs].to(torch.int64)[r] + seq_lens[:bs].to(torch.int64)[r] + (t - r * n)
    kv_indices.scatter_(0, dest, src)


def build_verify_kv(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    n: int,
    *,
    capacity: Optional[int] = None,
):
    """All KV metadata of one target-verify batch, on torch alone (the CPU path
    and the reference the GPU path is checked against).

    Returns ``(kv_indptr int32 [bs+1], kv_indices int32 [capacity], kv_len int32 [bs])``.
    ``capacity`` defaults to ``bs * (req_to_token.shape[1] + n) + 1``.
    """
    bs = seq_lens.shape[0]
    device = seq_lens.device
    if capacity is None:
        capacity = bs * (req_to_token.shape[1] + n) + 1
    kv_indptr = verify_kv_indptr(seq_lens, n)
    kv_indices = torch.zeros(capacity, dtype=torch.int64, device=device)
    pack_prefix_slots(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices)
    scatter_draft_slots(kv_indices, kv_indptr, seq_lens, out_cache_loc, n)
    return kv_indptr, kv_indices.to(torch.int32), verify_kv_len(seq_lens, n)


# ---------------------------------------------------------------------------
# masks

# The layouts' arithmetic and the packing live in verify_attn.masks (its
# from_sglang_qlen_only / from_sglang_full_mask read the same layouts for ragged
# batches, with host-side checks); here: uniform batches, static shapes, no host
# sync, results written into the backend's CUDA-graph buffers.


def _into(bits: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    """``bits`` itself, or copied into ``out[: bits.shape[0]]`` (returned) when given."""
    if out is None:
        return bits
    v = out[: bits.shape[0]]
    v.copy_(bits)
    return v


def pack_bool_rows(vis: torch.Tensor, words: int, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """bool ``[rows, c]`` (``c <= 32 * words``) -> int32 bit pattern ``[rows, words]``
    (:func:`verify_attn.masks.pack_bool_rows`), written into ``out[:rows]`` when given."""
    return _into(_masks.pack_bool_rows(vis, words), out)


def qlen_only_to_bits(
    mask: torch.Tensor, bs: int, n: int, *, words: Optional[int] = None, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """SGLang's QLEN_ONLY verify mask (``bs * n * n`` bools, a larger buffer is
    fine) -> compact bits ``int32 [bs * n, words]``.

    Raises:
      ValueError: ``mask`` holds fewer than ``bs * n * n`` elements, or ``out``
        fewer than ``bs * n`` rows.
    """
    _check_n(n)
    words = mask_words(n) if words is None else words
    if mask.numel() < bs * n * n:
        raise ValueError(f"mask: a QLEN_ONLY mask of {bs} requests x {n} drafts needs {bs * n * n} "
                         f"elements, has {mask.numel()}")
    if out is not None:
        _check_out(out, bs * n)
    return _into(_masks._sglang_uniform_bits(mask, bs, n, words), out)


def full_mask_to_bits(
    mask: torch.Tensor,
    seq_lens: torch.Tensor,
    n: int,
    *,
    words: Optional[int] = None,
    out: Optional[torch.Tensor] = None,
    seq_lens_cpu: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SGLang's FULL_MASK verify mask -> compact bits ``int32 [bs * n, words]``.

    Only the ``n`` draft columns of every row are read (the prefix columns are
    all-visible by construction). Offsets are computed on the device from
    ``seq_lens`` (no host sync). The mask's size can only be checked against
    the lengths on the host: pass ``seq_lens_cpu`` (the same lengths, a CPU
    tensor) to have it checked; without it a too-short mask's reads are
    clamped to its last element.

    Raises:
      ValueError: ``seq_lens_cpu`` given and ``mask`` holds fewer than
        ``n * sum(seq_lens + n)`` elements; ``out`` fewer than ``bs * n`` rows.
    """
    _check_n(n)
    words = mask_words(n) if words is None else words
    bs = seq_lens.shape[0]
    if seq_lens_cpu is not None:
        need = n * (int(seq_lens_cpu[:bs].to(torch.int64).sum()) + bs * n)
        if mask.numel() < need:
            raise ValueError(f"mask: a FULL mask of {bs} requests x {n} drafts over these seq_lens needs "
                             f"{need} elements, has {mask.numel()}")
    if out is not None:
        _check_out(out, bs * n)
    return _into(_masks._sglang_uniform_bits(mask, bs, n, words, prefix_lens=seq_lens), out)


def is_qlen_only_layout(mask: torch.Tensor, bs: int, n: int, own_buffer: Optional[torch.Tensor] = None) -> bool:
    """Which layout ``spec_info.custom_mask`` has, from host-side facts only.

    Our backend hands SGLang a QLEN_ONLY ``VerifyMask`` buffer, so a mask that
    lives in that buffer is QLEN_ONLY. Otherwise (a producer that allocated its
    own mask, e.g. NGRAM): exactly ``bs * n * n`` elements is QLEN_ONLY;
    FULL_MASK always has more (every request has a prefix of at least one
    token), and when every prefix were empty both layouts coincide anyway.
    ``bs`` is the number of requests the mask was built for: in a padded
    CUDA-graph replay the real ones (:func:`real_batch_size`), not the padded
    batch (a ``raw_bs * n * n`` QLEN_ONLY mask would otherwise read as FULL).
    """
    if own_buffer is not None and mask.device == own_buffer.device:
        lo = own_buffer.data_ptr()
        hi = lo + own_buffer.numel() * own_buffer.element_size()
        if lo <= mask.data_ptr() < hi:
            return True
    return mask.numel() == bs * n * n


def causal_rows(n: int, *, device=None) -> torch.Tensor:
    """Compact bits of one request's chain (draft ``t`` sees drafts ``0..t``):
    ``int32 [n, mask_words(n)]`` on ``device``, the rows :func:`tree_mask_bits`
    gives every padded request. Build it once per ``n`` and pass it as
    ``pad_rows`` (the backend's CUDA-graph buffers keep one).

    Raises:
      TypeError: ``n`` not an integer. ValueError: ``n < 1``.
    """
    n = _check_n(n)
    return pack_bool_rows(torch.tril(torch.ones(n, n, dtype=torch.bool, device=device)), mask_words(n))


def tree_mask_bits(
    mask: torch.Tensor,
    seq_lens: torch.Tensor,
    n: int,
    real_bs: Optional[int] = None,
    *,
    own_buffer: Optional[torch.Tensor] = None,
    seq_lens_cpu: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    pad_rows: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``spec_info.custom_mask`` (QLEN_ONLY or FULL, told apart by
    :func:`is_qlen_only_layout`) -> compact bits ``int32 [bs * n, words]`` for
    a batch of ``bs = seq_lens.shape[0]`` requests of which the first
    ``real_bs`` (default all) are real: their rows come from ``mask``, the
    padded requests' rows are causal (any in-range mask would do; their output
    is discarded).

    Args:
      mask: the verify mask of the ``real_bs`` real requests (bool/int, any shape).
      seq_lens: int ``[bs]`` prefix lengths (padded lanes included), any device.
      n: draft tokens per request.
      real_bs: requests ``mask`` covers, ``0 <= real_bs <= bs``.
      own_buffer: the backend's QLEN_ONLY ``VerifyMask`` buffer.
      seq_lens_cpu: the same lengths on the host, to check a FULL mask's size.
      out: int32 ``[>= bs * n, words]`` written in place (CUDA-graph buffers).
      pad_rows: int32 ``[n, words]``, :func:`causal_rows` ``(n)`` on ``out``'s
        device, copied into every padded request's rows; built here on each
        call that has padded requests when None.

    Raises:
      ValueError: ``real_bs`` outside ``[0, bs]``, a mask too small for its
        layout (see :func:`qlen_only_to_bits`, :func:`full_mask_to_bits`),
        ``out`` too small, ``pad_rows`` not ``[n, words]``.
    """
    _check_n(n)
    bs = seq_lens.shape[0]
    real_bs = bs if real_bs is None else real_bs
    if not 0 <= real_bs <= bs:
        raise ValueError(f"real_bs: must be in [0, {bs}], got {real_bs}")
    words = mask_words(n)
    if out is None:
        out = torch.empty(bs * n, words, dtype=torch.int32, device=seq_lens.device)
    _check_out(out, bs * n)
    if pad_rows is not None and tuple(pad_rows.shape) != (n, words):
        raise ValueError(f"pad_rows: expected the causal rows [{n}, {words}], got {tuple(pad_rows.shape)}")
    if is_qlen_only_layout(mask, real_bs, n, own_buffer):
        qlen_only_to_bits(mask, real_bs, n, words=words, out=out)
    else:
        cpu = None if seq_lens_cpu is None else seq_lens_cpu[:real_bs]
        full_mask_to_bits(mask, seq_lens[:real_bs], n, words=words, out=out, seq_lens_cpu=cpu)
    if real_bs < bs:
        chain = causal_rows(n, device=out.device) if pad_rows is None else pad_rows
        out[real_bs * n : bs * n].view(bs - real_bs, n, words).copy_(chain.unsqueeze(0).expand(bs - real_bs, n, words))
    return out[: bs * n]


# ---------------------------------------------------------------------------
# memory arithmetic (README)


def full_mask_bytes(bs: int, n: int, ctx: int) -> int:
    """Bytes of SGLang's preallocated FULL_MASK verify buffer (1-byte bools):
    ``bs * n * (ctx + n)`` (``verify_mask.py::tree_mask_numel``)."""
    return bs * n * (ctx + n)


def qlen_only_mask_bytes(bs: int, n: int) -> int:
    """Bytes of the QLEN_ONLY buffer our backend gives SGLang: ``bs * n * n``."""
    return bs * n * n


def compact_mask_bytes(bs: int, n: int) -> int:
    """Bytes of verify_attn's compact bits: ``bs * n * ceil(n / 32) * 4``."""
    return bs * n * mask_words(n) * 4
