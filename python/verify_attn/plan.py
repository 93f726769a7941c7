"""Plan once, run many times: tree-verify attention for CUDA-graph replay.

:class:`TreeAttentionPlan` follows FlashInfer's plan/run split
(``BatchPrefillWithPagedKVCacheWrapper.plan`` / ``.run``): the plan step runs
on the host from upper bounds of the lengths (``max_q_len``, ``max_kv_len``,
the batch and the device's SM count and shared memory), validates every
argument, picks the kernel configuration and the split-K count, and allocates
the workspace and the output once. The run step only launches: no host
synchronisation, no allocation, no validation, so it can be captured in a CUDA
graph and replayed after the *contents* of the planned tensors (``q``, the KV
cache, ``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_len``, ``tree_mask``)
were updated in place with new lengths up to the planned maxima.
"""

from typing import Optional

import torch

from . import attention as _attn
from . import errors as _errors


class TreeAttentionPlan:
    """A planned tree-verify attention call over fixed (static) buffers.

    Args:
      q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len: the tensors every
        :meth:`run` will read, as for :func:`verify_attn.tree_attention_paged`
        (paged layout when ``kv_indices`` or ``kv_len`` is given; then both are
        required) or :func:`verify_attn.tree_attention_flat` (both None); the
        same rule as :func:`verify_attn.plan_info`. Their shapes are
        the capacity: ``q.shape[0]`` rows, ``qo_indptr.shape[0] - 1`` requests.
      page_size, tree_mask, causal, sm_scale, head_dim_vo, num_splits: as for
        those functions.
      max_q_len (int): host upper bound of every request's draft count (<= 1024).
      max_kv_len (int): host upper bound of every request's KV rows (prefix + drafts).
      return_lse (bool): also produce the natural-log lse ``[total_q, H]`` fp32.

    Attributes:
      out: ``[total_q, H, D_vo]`` output buffer (q's dtype), written by :meth:`run`.
      lse: ``[total_q, H]`` fp32 buffer or None.
      info: dict of the kernel configuration (name, tile sizes, warps, stages,
        splits, shared memory, workspace bytes).

    Raises:
      TypeError / ValueError: as the functions above, naming the argument.
      NotImplementedError: a configuration this build does not support.
    """

    def __init__(self, q, k, v, qo_indptr, kv_indptr, kv_indices=None, kv_len=None, *,
                 page_size: Optional[int] = None, tree_mask=None, causal: bool = False,
                 sm_scale: Optional[float] = None, head_dim_vo: Optional[int] = None,
                 max_q_len: int, max_kv_len: int, return_lse: bool = False,
                 num_splits: int = 0):
        if max_q_len is None or max_kv_len is None:
            raise ValueError("max_q_len: a plan needs host upper bounds max_q_len and max_kv_len")
        paged = _attn._is_paged(kv_indices, kv_len)
        ps, d_vo, scale, mq, mkv = _attn._prepare(
            paged, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, page_size, tree_mask,
            causal, sm_scale, head_dim_vo, max_q_len, max_kv_len, num_splits, None, None)
        self.out = torch.empty((q.shape[0], q.shape[1], d_vo), dtype=q.dtype, device=q.device)
        self.lse = (torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=q.device)
                    if return_lse else None)
        layout = _attn._KV_PAGED if paged else _attn._KV_FLAT
        tensors = (q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, self.out, self.lse)
        _attn._check_strides(layout, *tensors)
        _attn._check_devices(layout, *tensors)
        self._C = _attn._load_C()
        self._device = q.device
        self._tensors = tensors  # keep the planned buffers alive
        self._empty = q.shape[0] == 0 or qo_indptr.shape[0] <= 1
        with torch.cuda.device(q.device):
            p = _attn._build_params(
                self._C, q, k, v, qo_indptr, kv_indptr, kv_indices, kv_len, tree_mask, layout, ps,
                bool(causal), scale, d_vo, mq, mkv, int(num_splits), self.out, self.lse)
            ws_bytes = int(self._C.workspace_size(p))
            self._workspace = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=q.device)
            p.workspace = self._workspace.data_ptr() if ws_bytes > 0 else 0
            p.workspace_bytes = ws_bytes
            p.error_word = _errors.error_word_ptr(q.device)
            self.info = dict(self._C.query_config(p), workspace_bytes=ws_bytes,
                             max_q_len=mq, max_kv_len=mkv)
        self._params = p

    def run(self):
        """Launch on the current stream (graph-capturable); returns ``out`` or ``(out, lse)``."""
        if not self._empty:
            self._params.stream = torch.cuda.current_stream(self._device).cuda_stream
            self._C.attention(self._params)
        return (self.out, self.lse) if self.lse is not None else self.out
