"""Plan once per batch, run once per layer.

:class:`TreeAttentionPlan` follows FlashInfer's plan/run split
(``BatchPrefillWithPagedKVCacheWrapper.plan`` / ``.run``) and FlashMLA's
(``get_mla_metadata`` once, ``flash_mla_with_kvcache`` per layer): the plan
takes what every layer of a verify step shares (the index tensors, the tree
mask, head counts and dims, the dtype, host bounds of the lengths) and
:meth:`TreeAttentionPlan.run` takes one layer's ``q`` and KV cache. A run does
no host synchronisation and no planning once its layout (the shapes and strides
of ``q``, the caches, ``out``, ``lse``) has been seen; the first run of a new
layout plans it once on the host (validation, the kernel, the split-K count,
the tensor maps' choices: ``kernels/verify_attn.h``, ``va_plan_create``) and
every later run of that layout reuses it (``va_plan_run``). The layers of one
model share one layout, so a verify step plans once.

:class:`Tuning` holds the explicit kernel choices of benchmarks, A/B runs and
tests (``va_plan_options``); the library reads no environment variable to pick
a kernel.
"""

import dataclasses
from typing import Optional, Tuple

import torch

from . import _ext
from . import attention as _attn
from . import errors as _errors
from ._args import as_bool as _as_bool
from ._args import as_int as _as_int

_GRID_ORDERS = {"auto": 0, "rows": 1, "requests": 2}

# Workspaces a captured CUDA graph launches into: kept for the life of the
# process, whatever happens to the plan that allocated them (a plan dropped or
# evicted, a workspace outgrown), since a replay writes into them.
_GRAPH_WORKSPACES = {}


def _keep_for_graphs(ws: torch.Tensor) -> None:
    _GRAPH_WORKSPACES.setdefault(ws.data_ptr(), ws)


# A run's per-call queries, straight to torch's bindings where they exist: CUDA
# is initialized once a plan holds CUDA tensors, so torch.cuda's Python
# wrappers (lazy init, argument handling) only add host time per layer.
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or _attn._is_capturing


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Kernel choices that override the plan's rules (``va_plan_options``).

    Every field at its default leaves the choice to the plan
    (``kernels/plan.cc``); :func:`verify_attn.plan_info` and
    :meth:`TreeAttentionPlan.info` say what runs.

    Attributes:
      config: ``""`` (the plan's choice) or a configuration tag of
        ``verify_attn.runtime_info()["config_tags"]`` (e.g. ``"mla_m32n32_s1"``,
        the sm_120 MLA configuration): used when it serves the call (its kind,
        head dims, arch, cache layout and shared memory), else the plan's
        choice. An unknown tag raises ValueError.
      grid_order: ``"auto"``, ``"rows"`` (a request's row tiles adjacent in
        launch order, on the kernels that can run it) or ``"requests"``.
      early_release: None (the plan's rule), True or False: the sm_90a TMA
        kernel's early refill of stage 0's blocks 0-3.
      q_tma: False copies Q with cp.async on the sm_90a MLA kernels instead of
        a bulk tensor copy.
      o_tma: False stores the unsplit output from registers instead of bulk
        tensor stores (compute-sanitizer's initcheck does not see those).
      max_smem_bytes: 0 (the device's) or plan as if a block had at most this
        much shared memory (101376: the configurations sm_120 runs, measurable
        on an sm_90 card).
      balance_splits: True: where the kernel can (the portable warp-role GQA
        kernels, 2 to 32 requests, an automatic split count), a batch's split
        CTAs go to its requests by their device KV lengths, a long request
        taking more splits than a short one; None (the plan's rule): so where,
        besides, a split of ``max_kv_len`` would hold 8 KV tiles or more;
        False: every request splits its KV range ``num_splits`` ways.
      pair_splits: None / True (the plan's rule): where a call splits in two
        (the plan's count or ``num_splits=2``) on the 16-row GQA warp-role
        kernels of an sm_90+ device (not over an fp8 cache), the two split
        CTAs of each row tile run as one thread-block cluster and combine
        their rows in distributed shared memory: no workspace and no merge
        kernel (``plan_info()["pair_splits"]``); taken before balanced splits
        unless ``balance_splits=True``. False: fp32 partial rows and the merge
        kernel.

    Raises:
      TypeError / ValueError naming the field (``tuning.<field>``) at
      construction: a value of the wrong type, a ``grid_order`` or a ``config``
      tag that does not exist, ``max_smem_bytes`` outside [0, 2^31-1].
    """

    config: str = ""
    grid_order: str = "auto"
    early_release: Optional[bool] = None
    q_tma: bool = True
    o_tma: bool = True
    max_smem_bytes: int = 0
    balance_splits: Optional[bool] = None
    pair_splits: Optional[bool] = None

    def __post_init__(self):
        self.options()
        if self.config:
            tags = _ext.load().config_tags().split(",")
            if self.config not in tags:
                raise ValueError(f"tuning.config: unknown configuration tag {self.config!r} (name one of: "
                                 f"{', '.join(tags)})")

    def options(self) -> Tuple[str, int, int, int, int, int, int, int]:
        """The ``va_plan_options`` fields (config, grid_order, early_release,
        q_tma, o_tma, max_smem_bytes, balance_splits, pair_splits); raises
        TypeError / ValueError naming the field."""
        if not isinstance(self.config, str):
            raise TypeError(f"tuning.config: expected a str, got {type(self.config).__name__}")
        if not isinstance(self.grid_order, str):
            raise TypeError(f"tuning.grid_order: expected a str, got {type(self.grid_order).__name__}")
        if self.grid_order not in _GRID_ORDERS:
            raise ValueError(f"tuning.grid_order: one of {sorted(_GRID_ORDERS)}, got {self.grid_order!r}")
        early = 0 if self.early_release is None else (1 if _as_bool(self.early_release, "tuning.early_release") else 2)
        q_tma = 0 if _as_bool(self.q_tma, "tuning.q_tma") else 2
        o_tma = 0 if _as_bool(self.o_tma, "tuning.o_tma") else 2
        smem = _as_int(self.max_smem_bytes, "tuning.max_smem_bytes")
        if smem < 0 or smem > 2**31 - 1:
            raise ValueError(f"tuning.max_smem_bytes: must be in [0, 2^31-1], got {smem}")
        balance = 0 if self.balance_splits is None else (1 if _as_bool(self.balance_splits, "tuning.balance_splits")
                                                         else 2)
        pair = 0 if self.pair_splits is None else (1 if _as_bool(self.pair_splits, "tuning.pair_splits") else 2)
        return (self.config, _GRID_ORDERS[self.grid_order], early, q_tma, o_tma, smem, balance, pair)


DEFAULT_OPTIONS = Tuning().options()


def tuning_options(tuning: Optional[Tuning]) -> Tuple[str, int, int, int, int, int, int, int]:
    """``Tuning.options()`` of ``tuning`` (None: the defaults); TypeError for another type."""
    if tuning is None:
        return DEFAULT_OPTIONS
    if not isinstance(tuning, Tuning):
        raise TypeError(f"tuning: expected a verify_attn.Tuning or None, got {type(tuning).__name__}")
    return tuning.options()


class TreeAttentionPlan:
    """Tree-verify attention planned once per batch and run once per layer.

    Args:
      qo_indptr: ``[B + 1]`` int32 CUDA tensor; request ``i`` owns rows
        ``qo_indptr[i]:qo_indptr[i+1]`` of each run's ``q`` (``qo_indptr[0] = 0``,
        ``qo_indptr[B] <= q.shape[0]``; rows past ``qo_indptr[B]`` are unused
        capacity: not computed, their ``out`` / ``lse`` rows unspecified).
      kv_indptr: ``[B + 1]`` int32: offsets into ``kv_indices`` in pages (paged
        layout), or row offsets into ``k`` / ``v`` (flat layout: ``kv_indices``
        and ``kv_len`` None).
      kv_indices: 1-D int32 page ids (paged layout), or None.
      kv_len: ``[B]`` int32 KV rows per request, prefix and drafts (paged), or None.
      num_qo_heads (int): query heads ``H`` of every run's ``q``.
      num_kv_heads (int): KV heads of the caches (MLA: 1).
      head_dim_qk (int): ``q`` / K width (MLA 576; GQA 64, 128 or 256).
      head_dim_vo (int): value / output width; None = ``head_dim_qk``. A value
        other than ``head_dim_qk`` selects MLA (the value is the first
        ``head_dim_vo`` values of the K row: runs pass ``v_cache=None``).
      page_size (int): slots per page; None = the cache's (``shape[1]`` of a 4-D
        cache, 1 for a 3-D ``[slots, Hkv, D]`` pool). Paged layout only.
      tree_mask: int32 / uint32 ``[total_q, W]`` bit rows (see
        :mod:`verify_attn.masks`; one row per row of every run's ``q``, so
        ``total_q = q.shape[0]``, and ``W * 32 >= max_q_len``), or None with
        ``causal=True``.
      causal (bool): chain mode instead of ``tree_mask`` (exactly one of the two).
      sm_scale (float): logit scale, finite and > 0; default ``1 / sqrt(head_dim_qk)``.
      dtype: ``torch.bfloat16`` or ``torch.float16``: every run's ``q`` and ``out``
        (and caches, unless ``kv_dtype`` says otherwise).
      kv_dtype: the caches' dtype: None (= ``dtype``) or ``torch.float8_e4m3fn``
        (an fp8 cache, GQA / MHA of head_dim 64 or 128 and MLA: docs/design_fp8.md).
      k_scale, v_scale (float): an fp8 cache's per-tensor scales (the cache
        holds ``K / k_scale``, ``V / v_scale``), finite and > 0; 1.0 (the
        only value other caches take). MLA: the value, a prefix of the key,
        takes ``k_scale``; ``v_scale`` stays 1.0 or equals ``k_scale``.
      max_q_len (int): host upper bound of every request's draft count (1..1024).
      max_kv_len (int): host upper bound of every request's KV rows (< 2^31).
      num_splits (int): 0 = automatic; 1..65535 forces the split-K count.
      kv_slot_runs (int): :func:`verify_attn.tree_attention_paged`'s hint
        (page_size 1 only; a multiple of 64 lets MLA on sm_90a take the TMA kernel).
      tuning (:class:`Tuning`): explicit kernel choices (benchmarks, tests).

    The index tensors, ``tree_mask`` and the device's error word are bound to the
    plan: update their contents in place between runs (``copy_``), not their
    storage. Nothing is read from the device; bad device data is flagged by the
    kernel (:func:`verify_attn.check_errors`).

    Raises:
      TypeError / ValueError naming the argument: dtypes (int32 indices,
        int32/uint32 mask), devices (every tensor on one CUDA device),
        a ``kv_dtype`` other than ``dtype`` / ``torch.float8_e4m3fn``, bad
        scales (as :func:`verify_attn.tree_attention_flat`),
        non-contiguous or not 1-D index tensors, both or neither of
        ``tree_mask`` and ``causal``, a mask narrower than ``max_q_len``, bounds
        out of range (``max_q_len``, ``max_kv_len``, ``num_splits``,
        ``head_dim_vo``), a ``tuning`` that is not a :class:`Tuning`. The checks that need
        a layer's tensors (shapes against ``q`` and the caches, strides,
        ``page_size``, ``sm_scale``, ``kv_slot_runs``) run at the first
        :meth:`run` or :meth:`info` of each layout, with the same errors as
        :func:`verify_attn.tree_attention_paged`.
    """

    def __init__(self, qo_indptr, kv_indptr, kv_indices=None, kv_len=None, *,
                 num_qo_heads: int, num_kv_heads: int = 1, head_dim_qk: int,
                 head_dim_vo: Optional[int] = None, page_size: Optional[int] = None,
                 tree_mask=None, causal: bool = False, sm_scale: Optional[float] = None,
                 dtype: torch.dtype = torch.bfloat16, max_q_len: int, max_kv_len: int,
                 num_splits: int = 0, kv_slot_runs: int = 1, tuning: Optional[Tuning] = None,
                 kv_dtype: Optional[torch.dtype] = None, k_scale: float = 1.0, v_scale: float = 1.0):
        self._paged = _attn._is_paged(kv_indices, kv_len)
        if self._paged and kv_indices is None:
            raise ValueError("kv_indices: required for the paged layout")
        if self._paged and kv_len is None:
            raise ValueError("kv_len: required for the paged layout")
        self._names = ("k_cache", "v_cache") if self._paged else ("k", "v")
        if dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"dtype: torch.float16 or torch.bfloat16, got {dtype}")
        self._kv_dtype = dtype if kv_dtype is None else kv_dtype
        if self._kv_dtype not in (dtype, _attn.KV_FP8):
            raise TypeError(f"kv_dtype: None (= dtype), {dtype} or torch.float8_e4m3fn, got {kv_dtype}")
        _attn._check_kv_scales(self._names[0], self._kv_dtype, k_scale, v_scale)
        self._k_scale, self._v_scale = float(k_scale), float(v_scale)
        for name, x in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim_qk", head_dim_qk)):
            if _as_int(x, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {x}")
        self._H, self._Hkv, self._d_qk = int(num_qo_heads), int(num_kv_heads), int(head_dim_qk)
        if self._H % self._Hkv != 0:
            raise ValueError(f"num_kv_heads: {self._Hkv} must divide num_qo_heads {self._H}")
        self._d_vo = self._d_qk if head_dim_vo is None else _as_int(head_dim_vo, "head_dim_vo")
        if self._d_vo < 1:
            raise ValueError(f"head_dim_vo: must be >= 1, got {head_dim_vo}")
        self._mla = self._d_vo != self._d_qk
        if self._mla:
            _attn._check_mla_v_scale(self._k_scale, self._v_scale)
        self._page_size = None if page_size is None else _as_int(page_size, "page_size")
        self._dtype = dtype
        self._causal = _as_bool(causal, "causal")
        self._num_splits = _as_int(num_splits, "num_splits")
        if not 0 <= self._num_splits <= _attn.MAX_NUM_SPLITS:
            raise ValueError(f"num_splits: must be in [0, {_attn.MAX_NUM_SPLITS}] (0 = automatic), got {num_splits}")
        self._kv_slot_runs = kv_slot_runs
        self._options = tuning_options(tuning)
        for name, bound in (("max_q_len", max_q_len), ("max_kv_len", max_kv_len)):
            if bound is None:
                raise ValueError(f"{name}: a plan needs host upper bounds max_q_len and max_kv_len")
        self._max_q_len = _as_int(max_q_len, "max_q_len")
        self._max_kv_len = _as_int(max_kv_len, "max_kv_len")
        if not 1 <= self._max_q_len <= _attn.MAX_Q_LEN:
            raise ValueError(f"max_q_len: must be in [1, {_attn.MAX_Q_LEN}], got {max_q_len}")
        if not 0 <= self._max_kv_len <= _attn._INT32_MAX:
            raise ValueError(f"max_kv_len: must be in [0, 2^31-1], got {max_kv_len}")
        self._sm_scale = sm_scale
        self._qo_indptr, self._kv_indptr = qo_indptr, kv_indptr
        self._kv_indices, self._kv_len, self._tree_mask = kv_indices, kv_len, tree_mask
        # The batch tensors' own checks (dtypes, devices, contiguity): the rest of
        # the validation runs with the first run's tensors (shapes against q and
        # the caches), once per layout.
        for t, n in ((qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"),
                     (kv_len, "kv_len")):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{n}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dtype != torch.int32:
                raise TypeError(f"{n}: expected dtype torch.int32, got {t.dtype}")
        if tree_mask is not None and not isinstance(tree_mask, torch.Tensor):
            raise TypeError(f"tree_mask: expected a torch.Tensor, got {type(tree_mask).__name__}")
        if tree_mask is not None and tree_mask.dtype not in (torch.int32, torch.uint32):
            raise TypeError(f"tree_mask: expected dtype torch.int32 or torch.uint32, got {tree_mask.dtype}")
        if not isinstance(qo_indptr, torch.Tensor):
            raise TypeError(f"qo_indptr: expected a torch.Tensor, got {type(qo_indptr).__name__}")
        for t, n in ((qo_indptr, "qo_indptr"), (kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"),
                     (kv_len, "kv_len")):
            if t is not None and t.dim() != 1:
                raise ValueError(f"{n}: expected a 1-D tensor, got shape {tuple(t.shape)}")
        if tree_mask is not None and (tree_mask.dim() != 2 or tree_mask.shape[1] * 32 < self._max_q_len):
            raise ValueError(f"tree_mask: expected [total_q, W] with W * 32 >= max_q_len = {self._max_q_len} "
                             f"(one bit per draft), got shape {tuple(tree_mask.shape)}")
        self._check_batch_device(qo_indptr)
        self._device = qo_indptr.device
        self._index = qo_indptr.device.index
        for t, n in ((kv_indptr, "kv_indptr"), (kv_indices, "kv_indices"), (kv_len, "kv_len"),
                     (tree_mask, "tree_mask")):
            if t is not None and t.device != self._device:
                raise ValueError(f"{n}: must be on qo_indptr's device {self._device}, got {t.device}")
            _attn._check_contig(t, n)
        if (tree_mask is None) == (not self._causal):
            raise ValueError("tree_mask: pass exactly one of tree_mask and causal=True"
                             + (" (both were given)" if self._causal else " (neither was given)"))
        self._empty = qo_indptr.shape[0] <= 1
        self._C = _attn._load_C()
        # The device's error buffer: allocated here (outside any capture).
        self._error_word = _errors.error_word_ptr(self._device)
        self._plans = {}  # layout signature -> (_C.Plan, workspace bytes, info)
        self._workspace = None
        self._stream_of = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.plans_made = 0  # C plans created (one per layout seen)

    def _run_scales(self, k_scale, v_scale):
        """A run's (k_scale, v_scale) for the handle (0.0: the plan's), validated."""
        if self._kv_dtype != _attn.KV_FP8:
            name = "k_scale" if k_scale is not None else "v_scale"
            raise ValueError(f"{name}: only a plan for an fp8 cache (kv_dtype=torch.float8_e4m3fn) takes a run's "
                             f"scale; this plan's caches are {self._kv_dtype}")
        _attn._check_kv_scales(self._names[0], self._kv_dtype, 1.0 if k_scale is None else k_scale,
                               1.0 if v_scale is None else v_scale)
        if self._mla:  # the values take the run's k_scale (or the plan's)
            _attn._check_mla_v_scale(self._k_scale if k_scale is None else k_scale, v_scale, unset=None)
        return (0.0 if k_scale is None else float(k_scale), 0.0 if v_scale is None else float(v_scale))

    @staticmethod
    def _check_batch_device(qo_indptr) -> None:
        if qo_indptr.device.type != "cuda":
            raise ValueError(f"qo_indptr: must be a CUDA tensor, got device {qo_indptr.device}")

    # -- per layout ---------------------------------------------------------

    def _check_tensor_args(self, q, k, v, out, lse) -> None:
        """TypeError naming the first of a run's arguments that is not a tensor."""
        for t, n, optional in ((q, "q", False), (k, self._names[0], False), (v, self._names[1], True),
                               (out, "out", True), (lse, "lse", True)):
            if not isinstance(t, torch.Tensor) and not (optional and t is None):
                raise TypeError(f"{n}: expected a torch.Tensor{' or None' if optional else ''}, "
                                f"got {type(t).__name__}")

    def _signature(self, q, k, v, out, lse):
        """The layout key of a run's tensors; TypeError naming one that is not a tensor."""
        try:
            return (q.shape, q.stride(), q.dtype, q.device,
                    k.shape, k.stride(), k.dtype, k.device,
                    None if v is None else (v.shape, v.stride(), v.dtype, v.device, v.data_ptr() == k.data_ptr()),
                    None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                    None if lse is None else (lse.shape, lse.stride(), lse.dtype, lse.device))
        except AttributeError:
            self._check_tensor_args(q, k, v, out, lse)
            raise

    def _plan_layout(self, sig, q, k, v, out, lse):
        """Validate one layout with real tensors and create its C plan."""
        if q.dtype != self._dtype:
            raise TypeError(f"q: dtype {q.dtype} differs from the plan's {self._dtype}")
        if q.dim() != 3 or q.shape[1] != self._H or q.shape[2] != self._d_qk:
            raise ValueError(f"q: expected shape [total_q, {self._H}, {self._d_qk}] (the plan's heads and "
                             f"head_dim_qk), got {tuple(q.shape)}")
        if q.device != self._device:
            raise ValueError(f"q: must be on the plan's device {self._device}, got {q.device}")
        if self._mla and v is not None and not _attn._v_is_k_prefix_view(k, v):
            raise ValueError(f"{self._names[1]}: the plan is MLA (head_dim_vo {self._d_vo} != head_dim_qk "
                             f"{self._d_qk}): pass None (the value is the first head_dim_vo values of the K row)")
        if not self._mla and v is None:
            raise ValueError(f"{self._names[1]}: required (the plan is MHA/GQA: head_dim_vo == head_dim_qk)")
        if isinstance(k, torch.Tensor) and k.dtype != self._kv_dtype:
            raise TypeError(f"{self._names[0]}: dtype {k.dtype} differs from the plan's kv_dtype {self._kv_dtype}")
        if k.shape[-2] != self._Hkv:
            raise ValueError(f"{self._names[0]}: {k.shape[-2]} KV heads, the plan has num_kv_heads {self._Hkv}")
        ps, d_vo, scale, mq, mkv = _attn._prepare(
            self._paged, q, k, v, self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_len,
            self._page_size, self._tree_mask, self._causal, self._sm_scale,
            self._d_vo if v is None else None, self._max_q_len, self._max_kv_len, self._num_splits,
            out, lse, self._k_scale, self._v_scale)
        layout = _attn._layout_code(self._paged, self._kv_slot_runs, ps)
        tensors = (q, k, v, self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_len,
                   self._tree_mask, out if out is not None else None, lse)
        _attn._check_strides(layout, *tensors)
        _attn._check_devices(layout, *tensors)
        with torch.cuda.device(self._device):
            # The plan binds the batch tensors; q, k, v, out come with each run.
            fixed = dict(q=0, k=0, v=0, out=0, error_word=self._error_word, stream=0)
            if out is None:  # the run allocates it contiguous
                fixed.update(out_stride_token=q.shape[1] * d_vo, out_stride_head=d_vo)
            if lse is None:
                # A run may still ask for an lse (return_lse): plan its contiguous strides.
                fixed.update(lse=16, lse_stride_token=q.shape[1], lse_stride_head=1)
            p = _attn._build_params(
                self._C, q, k, v, self._qo_indptr, self._kv_indptr, self._kv_indices, self._kv_len,
                self._tree_mask, layout, ps, self._causal, scale, d_vo, mq, mkv, self._num_splits,
                q if out is None else out, lse, overrides=fixed, k_scale=self._k_scale, v_scale=self._v_scale)
            handle = self._C.Plan(p, *self._options)
            self.plans_made += 1
            info = dict(handle.info())
        info.update(max_q_len=mq, max_kv_len=mkv, kv_layout="paged" if self._paged else "flat",
                    v_is_k_prefix=int(v is None or self._mla))
        entry = (handle, int(info["workspace_bytes"]), info, d_vo, v is None or self._mla)
        self._plans[sig] = entry
        return entry

    def info(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor] = None, *,
             out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None) -> dict:
        """What :meth:`run` launches for this layout (a dict as :func:`verify_attn.plan_info`:
        ``name``, tile sizes, ``num_splits``, ``workspace_bytes``, ``k_tma`` / ``q_tma`` /
        ``o_tma``, ...). Plans the layout if it is new; launches nothing."""
        sig = self._signature(q, k_cache, v_cache, out, lse)
        entry = self._plans.get(sig) or self._plan_layout(sig, q, k_cache, v_cache, out, lse)
        return dict(entry[2])

    # -- per layer ----------------------------------------------------------

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor] = None, *,
            out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None,
            return_lse: bool = False, k_scale: Optional[float] = None, v_scale: Optional[float] = None):
        """One layer: launch on the current stream of the plan's device.

        Args:
          q: ``[total_q, H, head_dim_qk]`` in the plan's dtype, on its device.
          k_cache, v_cache: the layer's caches, as for :func:`verify_attn.tree_attention_paged`
            (flat plans: ``k`` / ``v`` as for :func:`verify_attn.tree_attention_flat`);
            ``v_cache`` None for MLA.
          out: optional ``[total_q, H, head_dim_vo]`` to write (else allocated).
          lse: optional fp32 ``[total_q, H]`` to write (natural log); with
            ``return_lse`` and no ``lse`` one is allocated.
          k_scale, v_scale: a plan for an fp8 cache: this layer's scales
            (Python floats, finite, > 0; each layer of a model has its own),
            None: the plan's. No other plan takes them.

        Returns ``out``, or ``(out, lse)`` when ``return_lse`` or ``lse`` is given.

        Raises:
          TypeError: ``q`` or a cache not a tensor, a dtype other than the
            plan's, ``return_lse`` not a bool, a scale not a Python float.
          ValueError: at the first run of a layout, a shape, stride, device or
            alignment that does not fit the plan (named as by
            :func:`verify_attn.tree_attention_paged`); a scale not finite or
            not > 0, or given to a plan that is not for an fp8 cache.
          NotImplementedError: a layout no kernel of this build serves on the
            device (the message names the C-ABI status).
          RuntimeError: a CUDA error of the launch.

        No host synchronisation; capturable in a CUDA graph. The first run of
        a layout (shapes, strides, dtypes of the tensors) validates and plans it
        (ValueError / TypeError naming the argument) and, for a split-K plan,
        allocates the plan's workspace (a later layout needing more grows it);
        later runs of it only launch. A workspace a captured run uses is kept
        for the life of the process. The plan's runs share its workspace: run one
        plan on one stream at a time. With :func:`verify_attn.set_debug` on,
        checks the device's error word after the launch (a host sync), except
        during capture.
        """
        if return_lse is not False and return_lse is not True:
            _as_bool(return_lse, "return_lse")  # raises TypeError naming it for a non-bool
        scales = ()  # the handle's run-scale arguments, given only when the run has its own
        if k_scale is not None or v_scale is not None:
            scales = self._run_scales(k_scale, v_scale)
        if lse is None and return_lse:
            if not isinstance(q, torch.Tensor):
                self._check_tensor_args(q, k_cache, v_cache, out, lse)
            lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
        sig = self._signature(q, k_cache, v_cache, out, lse)
        entry = self._plans.get(sig)
        if entry is None:
            entry = self._plan_layout(sig, q, k_cache, v_cache, out, lse)
        handle, ws_bytes, _, d_vo, mla = entry
        if out is None:
            out = torch.empty((q.shape[0], q.shape[1], d_vo), dtype=q.dtype, device=q.device)
        if self._empty or q.shape[0] == 0:
            return (out, lse) if lse is not None else out
        ws = 0
        if ws_bytes:
            if self._workspace is None or self._workspace.numel() < ws_bytes:
                self._workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=self._device)
            ws = self._workspace.data_ptr()
            if _stream_capturing():
                _keep_for_graphs(self._workspace)
        index = self._index
        stream = (self._stream_of(index) if self._stream_of is not None and index is not None
                  else torch.cuda.current_stream(self._device).cuda_stream)
        v_ptr = 0 if mla else v_cache.data_ptr()
        lse_ptr = 0 if lse is None else lse.data_ptr()
        if index is not None and _current_device() == index:
            handle.run(q.data_ptr(), k_cache.data_ptr(), v_ptr, out.data_ptr(), lse_ptr, ws, ws_bytes, stream,
                       *scales)
        else:
            with torch.cuda.device(self._device):
                handle.run(q.data_ptr(), k_cache.data_ptr(), v_ptr, out.data_ptr(), lse_ptr, ws, ws_bytes,
                           stream, *scales)
        if _errors.debug_enabled() and not _attn._is_compiling() and not _attn._is_capturing():
            _errors.check_errors(self._device)  # debug mode: one host sync per run
        return (out, lse) if lse is not None else out
