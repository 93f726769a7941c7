"""Plan once, run many times: tree-verify attention for CUDA-graph replay.

:class:`TreeAttentionPlan` follows FlashInfer's plan/run split
(``BatchPrefillWithPagedKVCacheWrapper.plan`` / ``.run``): the plan step runs
on the host from upper bounds of the lengths (``max_q_len``, ``max_kv_len``,
the batch and the device's SM count and shared memory), validates every
argument, picks the kernel configuration and the split-K count, and allocates
the workspace and the output once. The run step only launches, so it can be
captured in a CUDA graph and replayed after the *contents* of the planned
tensors (``q``, the KV cache, ``qo_indptr``, ``kv_indptr``, ``kv_indices``,
``kv_len``, ``tree_mask``) were updated in place with new lengths up to the
planned maxima.

What :meth:`TreeAttentionPlan.run` checks: on the host, that every planned
tensor still has the data pointer, shape, strides and dtype it had at plan time
(a ``resize_``, ``set_`` or ``.data =`` that moved or reshaped one raises
ValueError naming it, instead of a launch that reads freed memory); the C-ABI
re-checks its scalars. No device synchronisation, no allocation, no reading of
the index tensors' contents (device data is checked by the kernel, see
:mod:`verify_attn.errors`).
"""

from typing import Optional

import torch

from . import attention as _attn
from . import errors as _errors
from ._args import as_bool as _as_bool


class TreeAttentionPlan:
    """A planned tree-verify attention call over fixed (static) buffers.

    Args:
      q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len: the tensors every
        :meth:`run` will read, as for :func:`verify_attn.tree_attention_paged`
        (paged layout when ``kv_indices`` or ``kv_len`` is given; then both are
        required) or :func:`verify_attn.tree_attention_flat` (both None); the
        same rule as :func:`verify_attn.plan_info`. Their shapes are
        the capacity: ``q.shape[0]`` rows, ``qo_indptr.shape[0] - 1`` requests.
        At run time ``qo_indptr[0]`` must be 0 (else the kernel flags
        ``QO_INDPTR`` in the error word) and ``qo_indptr[B] <= q.shape[0]``:
        request ``i`` uses rows ``qo_indptr[i]:qo_indptr[i+1]`` of ``q`` and ``out``;
        rows past ``qo_indptr[B]`` are unused capacity: not computed, and their
        ``out``/``lse`` rows are unspecified after :meth:`run` (kept as they
        were with one split; the split-K merge rewrites every row). These
        tensors must keep their storage, shape and strides for the life of the
        plan (update their contents in place, e.g. ``copy_``); :meth:`run`
        raises ValueError otherwise.
      page_size, tree_mask, causal, sm_scale, head_dim_vo, num_splits,
        kv_slot_runs: as for those functions.
      max_q_len (int): host upper bound of every request's draft count (<= 1024);
        required (None raises ValueError naming it).
      max_kv_len (int): host upper bound of every request's KV rows (prefix +
        drafts); required, likewise.
      return_lse (bool): also produce the natural-log lse ``[total_q, H]`` fp32.

    Attributes (read-only properties: the launch is bound to the buffers
    allocated by the plan, so assigning raises AttributeError; copy from them,
    or write into them in place, instead):
      out: ``[total_q, H, D_vo]`` output buffer (q's dtype), written by :meth:`run`.
      lse: ``[total_q, H]`` fp32 buffer, or None without ``return_lse``.
      info: the kernel configuration, the same keys as
        :func:`verify_attn.plan_info` (``name``, tile sizes, warps, stages,
        splits, shared memory, ``workspace_bytes``, ``max_q_len``,
        ``max_kv_len``, ``kv_layout``, ``v_is_k_prefix``); a copy each time.

    Raises:
      TypeError / ValueError: as the functions above, naming the argument
        (``max_q_len`` / ``max_kv_len`` None included).
      NotImplementedError: a configuration this build does not support.
      ImportError: the compiled extension is missing; RuntimeError: CUDA
        errors (no device, from the extension).
    """

    def __init__(self, q, k, v, qo_indptr, kv_indptr, kv_indices=None, kv_len=None, *,
                 page_size: Optional[int] = None, tree_mask=None, causal: bool = False,
                 sm_scale: Optional[float] = None, head_dim_vo: Optional[int] = None,
                 max_q_len: int, max_kv_len: int, return_lse: bool = False,
                 num_splits: int = 0, kv_slot_runs: int = 1):
        return_lse = _as_bool(return_lse, "return_lse")
        for name, bound in (("max_q_len", max_q_len), ("max_kv_len", max_kv_len)):
            if bound is None:
                raise ValueError(f"{name}: a plan needs host upper bounds max_q_len and max_kv_len")
        paged = _attn._is_paged(kv_indices, kv_len)
        ps, d_vo, scale, mq, mkv = _attn._prepare(
            paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
            causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, None, None)
        out = torch.empty((q.shape[0], q.shape[1], d_vo), dtype=q.dtype, device=q.device)
        lse = (torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
               if return_lse else None)
        layout = _attn._layout_code(paged, kv_slot_runs, ps)
        tensors = (q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, out, lse)
        _attn._check_strides(layout, *tensors)
        _attn._check_devices(layout, *tensors)
        self._out = out
        self._lse = lse
        self._C = _attn._load_C()
        self._device = q.device
        nk, nv = _attn._names(layout)
        names = ("q", nk, nv, "qo_indptr", "kv_indptr", "kv_indices", "kv_len", "tree_mask", "out", "lse")
        # What run() compares (and keeps alive): the planned buffers' layout at plan time.
        self._planned = tuple((n, t, _layout(t)) for n, t in zip(names, tensors) if t is not None)
        self._empty = q.shape[0] == 0 or qo_indptr.shape[0] <= 1
        with torch.cuda.device(q.device):
            p = _attn._build_params(
                self._C, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, layout, ps,
                bool(causal), scale, d_vo, mq, mkv, int(num_splits), out, lse)
            ws_bytes = int(self._C.workspace_size(p))
            self._workspace = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=q.device)
            p.workspace = self._workspace.data_ptr() if ws_bytes > 0 else 0
            p.workspace_bytes = ws_bytes
            p.error_word = _errors.error_word_ptr(q.device)
            self._info = _attn._config_info(self._C, p, ws_bytes, mq, mkv)
        self._params = p

    @property
    def out(self) -> torch.Tensor:
        """The output buffer the plan launches into (read-only attribute)."""
        return self._out

    @property
    def lse(self) -> Optional[torch.Tensor]:
        """The lse buffer the plan launches into, or None (read-only attribute)."""
        return self._lse

    @property
    def info(self) -> dict:
        """The kernel configuration, as :func:`verify_attn.plan_info` returns it (a copy)."""
        return dict(self._info)

    def run(self):
        """Launch on the current stream of the plan's device; returns ``out`` or ``(out, lse)``.

        Graph-capturable: no device synchronisation, no allocation. Checks on
        the host that each planned tensor still has its plan-time data
        pointer, shape, strides and dtype (ValueError naming it otherwise) and
        launches under ``torch.cuda.device`` of the plan's tensors, whatever
        the current device. With :func:`verify_attn.set_debug` on, calls
        :func:`verify_attn.check_errors` after the launch (a host sync), except
        while the current stream is capturing a CUDA graph (check after
        replays instead).
        """
        for name, t, planned in self._planned:
            if (t.data_ptr(), t.shape, t.stride(), t.dtype) != planned:
                raise ValueError(
                    f"{name}: storage or shape changed since the plan (data_ptr, shape, strides, dtype "
                    f"{_describe(planned)} at plan time, now {_describe(_layout(t))}); update planned "
                    f"tensors in place (copy_) or make a new TreeAttentionPlan")
        if not self._empty:
            with torch.cuda.device(self._device):
                self._params.stream = torch.cuda.current_stream(self._device).cuda_stream
                self._C.attention(self._params)
            if _errors.debug_enabled() and not _attn._is_compiling() and not _attn._is_capturing():
                _errors.check_errors(self._device)  # debug mode: one host sync per run
        return (self._out, self._lse) if self._lse is not None else self._out


def _layout(t: torch.Tensor):
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _describe(layout) -> str:
    ptr, shape, stride, dtype = layout
    return f"0x{ptr:x}, {list(shape)}, {list(stride)}, {dtype}"
